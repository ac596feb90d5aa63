/**
 * Rules: what a route limits, in the gateway's rule model (a limiter of
 * kind bucket, window, quota or lease, a cost, a unit, what a refusal
 * answers, what happens when Redis fails), checked at start with the
 * option named, and turned into one rl command per rule and request.
 */
import { validateHeaderName, validateHeaderValue } from "node:http";

import { int, RlConfigError, seconds as durationArg } from "./args.js";
import {
  buildQuota, buildTake, buildWindow, type Built, type QuotaPeriod, type WindowMode,
} from "./commands.js";
import type { RuleView } from "./responses.js";

/** Penalty box options of a bucket, window or quota limiter. */
export interface PenaltyConfig {
  /** With `every`, every refusal is a strike, early or not (a lockout). */
  strikes?: { threshold: number; window: number; every?: boolean };
  box?: [number, number, number];
  offensesTtl?: number;
  jitter?: number;
}
/** One more bucket/window/quota charged all-or-nothing with the first (ALSO). */
export interface AlsoConfig<Req> {
  name: string;
  /** More of its key after the hash tag (e.g. nothing for a tenant-wide bucket). */
  scope?: (req: Req) => string | undefined;
  rate?: number;
  burst?: number;
  period?: number | QuotaPeriodName;
  limit?: number;
  window?: number;
}
type QuotaPeriodName = "DAY" | "WEEK" | "MONTH";
/** `rate` points per `period` seconds, bursts of `burst` (RL.TAKE). */
export interface BucketLimiter<Req> extends PenaltyConfig {
  kind: "bucket"; rate: number; burst: number; period?: number; also?: AlsoConfig<Req>[];
}
/** `limit` points per `window` seconds (RL.WINDOW). */
export interface WindowLimiter<Req> extends PenaltyConfig {
  kind: "window"; limit: number; window: number; mode?: WindowMode; also?: AlsoConfig<Req>[];
}
/** `limit` points per UTC calendar day, ISO week or month (RL.QUOTA). */
export interface QuotaLimiter<Req> extends PenaltyConfig {
  kind: "quota"; limit: number; period: QuotaPeriodName; also?: AlsoConfig<Req>[];
}
/** At most `max` requests at once, each holding a lease for at most `ttl` seconds (RL.LEASE). */
export interface LeaseLimiter {
  kind: "lease"; max: number; ttl?: number;
  /** Seconds a holder usually takes: a refusal's Retry-After (at least 1 s). */
  expected?: number;
}
export type Limiter<Req> = BucketLimiter<Req> | WindowLimiter<Req> | QuotaLimiter<Req> | LeaseLimiter;

/** What Redis failing (an error or no answer within the timeout) does to a rule. */
export type OnRedisFailure = "closed" | "local" | "open";

/** One rule of a route. */
export interface RuleConfig<Req> {
  /** The policy name (headers, bodies) and part of the Redis key. */
  name: string;
  limiter: Limiter<Req>;
  /**
   * The value the counter is kept per, and the hash tag of its keys (a
   * client IP, a tenant, a ledger id); undefined: the rule does not apply
   * to the request. Default: the client IP.
   */
  key?: (req: Req) => string | undefined;
  /** More of the first key after the hash tag (an API key within its tenant); undefined: none. */
  scope?: (req: Req) => string | undefined;
  /** Points the request costs: a number, or a function of the request (default 1). */
  cost?: number | ((req: Req) => number);
  /** RateLimit-Policy `qu` (default requests; concurrent-requests for a lease). */
  unit?: string;
  onRefusal?: {
    status?: number; type?: string; message?: string; upgradeUrl?: string; blockType?: string;
    headers?: Record<string, string>; fields?: Record<string, unknown>;
  };
  /** Default: "closed" (503). */
  onRedisFailure?: OnRedisFailure;
}

const MODES = new Set(["sliding", "exact", "fixed"]);
/** The largest limit of an exact (sliding log) window: rl answers an error above it. */
export const MAX_EXACT_LIMIT = 10_000;
const PERIOD_NAMES = new Set(["DAY", "WEEK", "MONTH"]);

function check(ok: unknown, where: string, msg: string): void {
  if (!ok) throw new RlConfigError(`${where}: ${msg}`);
}
const posInt = (v: unknown) => typeof v === "number" && Number.isSafeInteger(v) && v >= 1;
/** Whether `f` returns without throwing. */
function passes(f: () => unknown): boolean {
  try {
    f();
    return true;
  } catch {
    return false;
  }
}
const secs = (v: unknown) => passes(() => durationArg("", v));
const headerNameOk = (name: string) => passes(() => validateHeaderName(name));
const headerValueOk = (value: string) => passes(() => validateHeaderValue("x", value));

/** Checks a rule (and fills its defaults); errors name the rule and the option. */
export function checkRule<Req>(r: RuleConfig<Req>, where: string): void {
  check(typeof r === "object" && r !== null, where, "must be an object");
  check(typeof r.name === "string" && r.name.length > 0, where, "name must be a non-empty string");
  where = `${where} (${r.name})`;
  const l = r.limiter;
  check(typeof l === "object" && l !== null, where, "limiter is required");
  check(["bucket", "window", "quota", "lease"].includes(l.kind), where,
    "limiter.kind must be bucket, window, quota or lease");
  if (l.kind === "bucket") {
    check(posInt(l.rate), where, "limiter.rate must be an integer >= 1");
    check(posInt(l.burst), where, "limiter.burst must be an integer >= 1");
    check(l.period === undefined || secs(l.period), where, "limiter.period must be seconds > 0 with at most 3 decimals");
  } else if (l.kind === "window") {
    check(posInt(l.limit), where, "limiter.limit must be an integer >= 1");
    check(secs(l.window), where, "limiter.window must be seconds > 0 with at most 3 decimals");
    check(l.mode === undefined || MODES.has(l.mode), where, "limiter.mode must be sliding, exact or fixed");
    check(l.mode !== "exact" || l.limit <= MAX_EXACT_LIMIT, where,
      `limiter.limit must be at most ${MAX_EXACT_LIMIT} with mode exact (a sliding log)`);
  } else if (l.kind === "quota") {
    check(posInt(l.limit), where, "limiter.limit must be an integer >= 1");
    check(PERIOD_NAMES.has(l.period), where, "limiter.period must be DAY, WEEK or MONTH");
  } else {
    check(posInt(l.max) && l.max <= 1000, where, "limiter.max must be an integer from 1 to 1000");
    check(l.ttl === undefined || secs(l.ttl), where, "limiter.ttl must be seconds > 0 with at most 3 decimals");
    check(l.expected === undefined || (typeof l.expected === "number" && l.expected > 0), where,
      "limiter.expected must be seconds > 0");
  }
  if (l.kind !== "lease") {
    check(l.strikes === undefined || (posInt(l.strikes.threshold) && secs(l.strikes.window) &&
      (l.strikes.every === undefined || typeof l.strikes.every === "boolean")), where,
      "limiter.strikes must be {threshold: integer >= 1, window: seconds, every?: boolean}");
    check(l.box === undefined || (Array.isArray(l.box) && l.box.length === 3), where,
      "limiter.box must be three durations in seconds");
    check(l.box === undefined || l.strikes !== undefined, where, "limiter.box needs limiter.strikes");
    (l.also ?? []).forEach((a, i) => {
      check(typeof a.name === "string" && a.name.length > 0, where, `limiter.also[${i}].name is required`);
      if (l.kind === "bucket") {
        check(posInt(a.rate) && posInt(a.burst), where, `limiter.also[${i}]: rate and burst must be integers >= 1`);
      } else {
        check(posInt(a.limit), where, `limiter.also[${i}].limit must be an integer >= 1`);
        check(l.kind !== "window" || l.mode !== "exact" || a.limit! <= MAX_EXACT_LIMIT, where,
          `limiter.also[${i}].limit must be at most ${MAX_EXACT_LIMIT} with mode exact (a sliding log)`);
      }
    });
  }
  check(r.key === undefined || typeof r.key === "function", where, "key must be a function of the request");
  check(r.scope === undefined || typeof r.scope === "function", where, "scope must be a function of the request");
  check(r.cost === undefined || typeof r.cost === "function" || (Number.isSafeInteger(r.cost) && r.cost >= 0),
    where, "cost must be an integer >= 0 or a function of the request");
  check(r.onRedisFailure === undefined || ["closed", "local", "open"].includes(r.onRedisFailure), where,
    "onRedisFailure must be closed, local or open");
  // what a response's headers carry is checked here: a value Node refuses would throw at the refusal
  check(headerValueOk(r.name), where, "name must be usable in a header value (Latin-1 text, no control characters)");
  check(r.unit === undefined || (typeof r.unit === "string" && headerValueOk(r.unit)), where,
    "unit must be a string usable in a header value (Latin-1 text, no control characters)");
  const hs = r.onRefusal?.headers;
  check(hs === undefined || (typeof hs === "object" && hs !== null), where, "onRefusal.headers must be an object");
  for (const h in hs ?? {}) {
    check(headerNameOk(h), where, `onRefusal.headers: ${JSON.stringify(h)} is not a valid header name`);
    check(typeof hs![h] === "string" && headerValueOk(hs![h]!), where,
      `onRefusal.headers[${JSON.stringify(h)}] must be a string usable in a header value (Latin-1 text, no control characters)`);
  }
  const st = r.onRefusal?.status;
  check(st === undefined || (posInt(st) && st >= 400 && st <= 599), where,
    "onRefusal.status must be an HTTP error status");
}

const DAY = 86400;
const MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
/** A calendar period's length in seconds (a month's: the current one's, UTC). */
export function periodSeconds(p: QuotaPeriodName, nowMs = Date.now()): number {
  if (p === "DAY") return DAY;
  if (p === "WEEK") return 7 * DAY;
  const d = new Date(nowMs);
  const y = d.getUTCFullYear();
  const m = d.getUTCMonth();
  const leap = y % 4 === 0 && (y % 100 !== 0 || y % 400 === 0);
  return (m === 1 && leap ? 29 : MONTH_DAYS[m]!) * DAY;
}

function windowOf<Req>(l: Limiter<Req>, a?: AlsoConfig<Req>): number | undefined {
  if (l.kind === "bucket") return (a ? a.period as number : l.period) ?? 60;
  if (l.kind === "window") return a ? a.window ?? l.window : l.window;
  if (l.kind === "quota") return periodSeconds(l.period);
  return undefined;
}

/** The response view of a rule (its policies, its refusal). */
export function ruleView<Req>(r: RuleConfig<Req>): RuleView {
  const l = r.limiter;
  const onR = r.onRefusal ?? {};
  const quotaAction = l.kind === "quota";
  const view: RuleView = {
    name: r.name, kind: l.kind,
    unit: r.unit ?? (typeof r.cost === "function" ? "points" : l.kind === "lease" ? "concurrent-requests" : "requests"),
    quota: l.kind === "bucket" ? l.rate : l.kind === "lease" ? l.max : l.limit,
    status: onR.status ?? (quotaAction ? 403 : 429),
    type: onR.type ?? (quotaAction ? "quota-exceeded" : "rate-limit-exceeded"),
  };
  const w = windowOf(l);
  if (w !== undefined) view.window = w;
  if (l.kind !== "lease") {
    if (l.also) {
      view.also = l.also.map((a) => ({ name: a.name, quota: (l.kind === "bucket" ? a.rate : a.limit)!,
        window: windowOf(l, a)! }));
    }
    if (l.strikes) {
      view.strikesThreshold = l.strikes.threshold;
      view.box = l.box ?? [300, 3600, 86400];
    }
  }
  if (onR.message) view.message = onR.message;
  if (onR.upgradeUrl) view.upgradeUrl = onR.upgradeUrl;
  if (onR.blockType) view.blockType = onR.blockType;
  if (onR.headers) view.headers = onR.headers;
  if (onR.fields) view.fields = onR.fields;
  return view;
}

/** `s` without braces (a key's hash tag is the one its rule puts there). */
function clean(s: string): string {
  return s.indexOf("{") === -1 && s.indexOf("}") === -1 ? s : s.replace(/[{}]/g, "");
}

/** The Redis key of `name` for scope value `value`: one hash tag per value, so a rule's ALSO keys share its slot. */
export function ruleKey(prefix: string, value: string, name: string, sub?: string): string {
  return `${prefix}:{${clean(value)}}:${clean(name)}${sub !== undefined ? `:${clean(sub)}` : ""}`;
}

/** The rate command of a rule (not a lease) on its keys (`k`, then one per `also`) charging `cost`. */
function rateOnKeys<Req>(r: RuleConfig<Req>, k: string, alsoKeys: string[], cost: number, refund: boolean): Built {
  const l = r.limiter;
  const pen = l.kind === "lease" ? {} : {
    ...(l.strikes ? { strikes: l.strikes } : {}), ...(l.box ? { box: l.box } : {}),
    ...(l.offensesTtl ? { offenses: l.offensesTtl } : {}), ...(l.jitter ? { jitter: l.jitter } : {}),
  };
  const charge = refund ? { refund: cost } : { cost };
  if (l.kind === "bucket") {
    return buildTake(k, { capacity: l.burst, tokens: l.rate, period: l.period ?? 60, ...charge, ...(refund ? {} : pen),
      also: (l.also ?? []).map((a, i) => ({ key: alsoKeys[i]!, capacity: a.burst!, tokens: a.rate!,
        period: (a.period as number | undefined) ?? 60 })) });
  }
  if (l.kind === "window") {
    return buildWindow(k, { limit: l.limit, window: l.window, mode: l.mode ?? "sliding", ...charge,
      ...(refund ? {} : pen),
      also: (l.also ?? []).map((a, i) => ({ key: alsoKeys[i]!, limit: a.limit!, window: a.window ?? l.window })) });
  }
  if (l.kind === "quota") {
    const p = (x: string) => x.toLowerCase() as QuotaPeriod;
    return buildQuota(k, { limit: l.limit, period: p(l.period), ...charge, ...(refund ? {} : pen),
      also: (l.also ?? []).map((a, i) => ({ key: alsoKeys[i]!, limit: a.limit!,
        period: p((a.period as string | undefined) ?? l.period) })) });
  }
  throw new RlConfigError(`${r.name}: a lease has no rate command`);
}

/** The ALSO keys of a rule for scope value `value`. */
function alsoKeysOf<Req>(prefix: string, r: RuleConfig<Req>, req: Req, value: string): string[] {
  const l = r.limiter;
  return l.kind === "lease" ? [] : (l.also ?? []).map((a) => ruleKey(prefix, value, a.name, a.scope?.(req)));
}

/** The rate command of a rule (not a lease) for scope value `value` charging `cost`. */
export function rateCommand<Req>(prefix: string, r: RuleConfig<Req>, req: Req, value: string, cost: number,
  refund = false): Built {
  return rateOnKeys(r, ruleKey(prefix, value, r.name, r.scope?.(req)), alsoKeysOf(prefix, r, req, value), cost, refund);
}

/** A rule's rate command made once: `(req, k, value, cost)` gives {@link rateCommand}'s, `k` its first key. */
export type PreparedRate<Req> = (req: Req, k: string, value: string, cost: number) => Built;

/**
 * Prepares a rule's (not a lease's) rate command: its arguments are
 * checked and formatted once, with stand-ins for the keys; a request
 * copies them, puts its keys in, and COST when it is not 1.
 */
export function prepareRate<Req>(prefix: string, r: RuleConfig<Req>): PreparedRate<Req> {
  const l = r.limiter;
  const n = l.kind === "lease" ? 0 : (l.also ?? []).length;
  // a NUL never reaches Redis: every one of them is replaced
  const stand = Array.from({ length: n }, (_, i) => `\0also${i}`);
  const one = rateOnKeys(r, "\0key", stand, 1, false).args;
  const two = rateOnKeys(r, "\0key", stand, 2, false).args;
  let at = 0;
  while (one[at] === two[at]) at++; // where COST goes
  const keyAt = one.indexOf("\0key");
  const alsoAt = stand.map((x) => one.indexOf(x));
  return (req, k, value, cost) => {
    const args = one.slice();
    args[keyAt] = k;
    const keys = [k];
    for (let i = 0; i < n; i++) {
      const a = (l as { also: AlsoConfig<Req>[] }).also[i]!;
      const ak = ruleKey(prefix, value, a.name, a.scope?.(req));
      args[alsoAt[i]!] = ak;
      keys.push(ak);
    }
    if (cost !== 1) args.splice(at, 0, "COST", int("cost", cost));
    return { args, keys, cost, readonly: false };
  };
}
