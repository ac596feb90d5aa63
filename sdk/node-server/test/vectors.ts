/**
 * The shared test vectors of response fields and problem bodies
 * (sdk/responses.json), and how to compare a real response with one: the
 * values that depend on the time (a box's end, an HTTP-date, a quota's
 * time to midnight) were written for the case's `now_ms` and are compared
 * against the actual time, within 2 s.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";

import type { Decision, Limiter, RuleConfig } from "../src/index.js";
import { REPO } from "./servers.js";

export interface VectorRule {
  name: string;
  limiter: Record<string, unknown> & { kind: "bucket" | "window" | "quota" | "lease" };
  cost?: number;
  unit?: string;
  on_refusal?: { status?: number; upgrade_url?: string; message?: string; block_type?: string };
  on_redis_failure?: string;
}
export interface Vector {
  name: string;
  about: string;
  rules: VectorRule[];
  replies: Record<string, unknown>[];
  request: { path: string; request_id: string; tier: string | null; now_ms: number };
  gateway: { before?: number; hold?: number; trip?: { level: number; duration: number } } | null;
  expect: { status: number; headers: Record<string, string>; content_type?: string; body?: Record<string, unknown> };
}
export interface Vectors {
  conf: { problem_base: string; legacy_headers: boolean; http_date_after: number; manual_box_status: number;
    fail_closed_retry_after: number };
  cases: Vector[];
}

export const VECTORS: Vectors = JSON.parse(readFileSync(join(REPO, "sdk/responses.json"), "utf8")) as Vectors;

const DATE_RE = /^(\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$/;
const DAY_MS = 86_400_000;
const toMidnight = (ms: number) => Math.ceil((DAY_MS - (ms % DAY_MS)) / 1000);

/** When a response was asked for and seen, and when its case began (its first request). */
export interface Times { startMs: number; sentMs: number; seenMs: number }

const TIME_TOKEN = /(t=|retry in )(\d+)/g;
const TIME_FIELDS = new Set(["Retry-After", "retry_after_seconds"]);

/**
 * Whether `actual` matches `expected` (written for `nowMs`, as if every
 * request of the case came at that instant): equal; or a date at the same
 * offset from the time (within 2 s); or equal but for its waits (a
 * Retry-After, `t=`, `retry in N s`), which may be shorter by the seconds
 * the case took (or, for a daily quota, are the time to midnight).
 */
export function sameValue(field: string, expected: unknown, actual: unknown, nowMs: number, t: Times,
  dailyQuota: boolean): boolean {
  if (expected === actual) return true;
  if (typeof expected === "string" && typeof actual === "string" && DATE_RE.test(expected) && DATE_RE.test(actual)) {
    const offset = Date.parse(expected) - nowMs;
    const a = Date.parse(actual);
    return a >= t.startMs + offset - 2000 && a <= t.seenMs + offset + 2000;
  }
  if (typeof expected !== typeof actual || (typeof expected !== "string" && typeof expected !== "number")) return false;
  const slack = Math.floor((t.seenMs - t.startMs) / 1000);
  const wait = (e: number, a: number) => (dailyQuota && e === toMidnight(nowMs)
    ? a >= toMidnight(t.seenMs) - 2 && a <= toMidnight(t.startMs) + 2
    : a <= e && a >= e - slack);
  if (TIME_FIELDS.has(field)) return wait(Number(expected), Number(actual));
  if (typeof expected !== "string") return false;
  const shape = (x: string) => x.replace(TIME_TOKEN, "$1#");
  if (shape(expected) !== shape(actual as string)) return false;
  const e = [...expected.matchAll(TIME_TOKEN)].map((m) => Number(m[2]));
  const a = [...(actual as string).matchAll(TIME_TOKEN)].map((m) => Number(m[2]));
  return e.every((x, i) => wait(x, a[i]!));
}

/** The differences between an expected response and an actual one (empty: the same). */
export function differences(v: Vector, status: number, headers: Record<string, string | null>, body: unknown,
  times: Times, ignore: string[] = []): string[] {
  const out: string[] = [];
  const daily = v.rules.some((r) => r.limiter.kind === "quota" && r.limiter["period"] === "DAY");
  const same = (f: string, e: unknown, a: unknown) => sameValue(f, e, a, v.request.now_ms, times, daily);
  if (status !== v.expect.status) out.push(`status ${status}, expected ${v.expect.status}`);
  for (const [name, value] of Object.entries(v.expect.headers)) {
    if (!same(name, value, headers[name.toLowerCase()])) out.push(`${name}: ${headers[name.toLowerCase()]}, expected ${value}`);
  }
  for (const name of ["ratelimit-policy", "ratelimit", "retry-after", "x-penalty-box-status", "x-ratelimit-degraded"]) {
    const known = Object.keys(v.expect.headers).some((k) => k.toLowerCase() === name);
    if (!known && headers[name] != null) out.push(`${name}: ${headers[name]}, expected none`);
  }
  if (v.expect.body) {
    if (!headers["content-type"]?.startsWith(v.expect.content_type!)) {
      out.push(`content-type ${headers["content-type"]}, expected ${v.expect.content_type}`);
    }
    const b = (body ?? {}) as Record<string, unknown>;
    const keys = new Set([...Object.keys(v.expect.body), ...Object.keys(b)]);
    for (const k of keys) {
      if (ignore.includes(k)) continue;
      if (!(k in b)) out.push(`body.${k} missing`);
      else if (!(k in v.expect.body)) out.push(`body.${k} = ${JSON.stringify(b[k])} not expected`);
      else if (!same(k, v.expect.body[k], b[k])) {
        out.push(`body.${k} = ${JSON.stringify(b[k])}, expected ${JSON.stringify(v.expect.body[k])}`);
      }
    }
  }
  return out;
}

/** A vector's rule as this package's rule configuration. */
export function ruleConfig(r: VectorRule): RuleConfig<unknown> {
  const o = r.on_refusal ?? {};
  const onRefusal: NonNullable<RuleConfig<unknown>["onRefusal"]> = {};
  if (o.status !== undefined) onRefusal.status = o.status;
  if (o.upgrade_url !== undefined) onRefusal.upgradeUrl = o.upgrade_url;
  if (o.message !== undefined) onRefusal.message = o.message;
  if (o.block_type !== undefined) onRefusal.blockType = o.block_type;
  const l = { ...r.limiter } as Record<string, unknown>;
  if (l["offenses_ttl"] !== undefined) {
    l["offensesTtl"] = l["offenses_ttl"];
    delete l["offenses_ttl"];
  }
  return { name: r.name, limiter: l as unknown as Limiter<unknown>, onRefusal,
    ...(r.cost !== undefined ? { cost: r.cost } : {}), ...(r.unit !== undefined ? { unit: r.unit } : {}) };
}

/** A vector's rate reply as a typed decision. */
export function decisionOfReply(d: Record<string, unknown>): Decision {
  const status = d["status"] as Decision["status"];
  const n = (k: string) => d[k] as number;
  return { status, allowed: status === "allowed" || status === "delayed", limit: n("limit"), remaining: n("remaining"),
    resetMs: n("reset_ms") === -1 ? null : n("reset_ms"), retryAfterMs: n("retry_after_ms") === -1 ? null : n("retry_after_ms"),
    penaltyLevel: n("box_level"), strikesRemaining: d["strikes_remaining"] as number | null, binding: n("binding"), granted: 0 };
}
