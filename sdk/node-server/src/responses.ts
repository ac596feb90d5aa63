/**
 * The rate-limit response fields and problem bodies, exactly as the rl
 * gateway writes them (the draft-ietf-httpapi-ratelimit-headers fields
 * RateLimit-Policy and RateLimit, Retry-After, X-Penalty-Box-Status, and
 * RFC 9457 application/problem+json bodies). `sdk/responses.json` holds
 * the test vectors every front end (this package, the Python one, the
 * gateway itself) is checked against.
 */
import type { Decision, Lease } from "./commands.js";

/** Response options shared by every route. */
export interface ResponseConf {
  /** Base of the problem `type` URIs. */
  problemBase: string;
  /** Also send RateLimit-Limit / -Remaining / -Reset. */
  legacyHeaders: boolean;
  /** Boxes configured to last at least this many seconds get an HTTP-date Retry-After. */
  httpDateAfter: number;
  /** Status of a manual box (no time to come back). */
  manualBoxStatus: number;
  /** Retry-After (seconds) of a fail-closed 503. */
  failClosedRetryAfter: number;
}

export const DEFAULT_RESPONSE_CONF: ResponseConf = {
  problemBase: "https://api.example.com/problems",
  legacyHeaders: false,
  httpDateAfter: 3600,
  manualBoxStatus: 403,
  failClosedRetryAfter: 15,
};

export const PROBLEM_CONTENT_TYPE = "application/problem+json";
export const RECOMMENDED_BACKOFF = "exponential_with_full_jitter";
/** The field (and value) marking an answer decided without Redis. */
export const DEGRADED_HEADER = "X-RateLimit-Degraded";
export const DEGRADED_VALUE = "fallback";

const TITLES: Record<string, string> = {
  "rate-limit-exceeded": "Rate limit exceeded",
  "penalty-box-active": "Penalty box active",
  "concurrency-limit-exceeded": "Concurrency limit exceeded",
  "rate-limiter-unavailable": "Rate limiter unavailable",
  "unauthenticated": "Unknown or missing API key",
  "ambiguous-argument": "Ambiguous request argument",
  "quota-exceeded": "Quota exceeded",
  "challenge-required": "Re-authentication required",
  // the application layer's own (the gateway does not check it)
  "idempotency-key-required": "Idempotency-Key required",
};

/** Whole seconds from milliseconds, rounded up (clients are never early). */
export function seconds(ms: number | null | undefined): number {
  return !ms || ms <= 0 ? 0 : Math.ceil(ms / 1000);
}

// structured-field strings of the names seen (rule and unit names: a few, from configuration)
const sfStrings = new Map<string, string>();

/** A structured-field String item. */
function sfString(s: string): string {
  let v = sfStrings.get(s);
  if (v === undefined) {
    v = `"${s.replace(/[\\"]/g, (c) => `\\${c}`)}"`;
    if (sfStrings.size < 1000) sfStrings.set(s, v);
  }
  return v;
}

/** One RateLimit-Policy item. */
export interface PolicyItem { name: string; quota: number; unit?: string; window?: number }

/** `"name";q=quota[;qu="unit"][;w=window]`: no `qu` for requests, no `w` for a concurrency limit. */
export function policyItem(p: PolicyItem): string {
  let s = `${sfString(p.name)};q=${p.quota}`;
  if (p.unit && p.unit !== "requests") s += `;qu=${sfString(p.unit)}`;
  if (p.window !== undefined) s += `;w=${p.window}`;
  return s;
}

/** The RateLimit-Policy value of several policies. */
export function policyField(items: PolicyItem[]): string {
  return items.map(policyItem).join(", ");
}

/** The policy a RateLimit field describes. */
export interface Binding {
  name: string;
  limit: number;
  remaining: number;
  /** Ms until whole again; null/undefined: none to give. */
  resetMs?: number | null;
  /** The policy's window in seconds (a bucket's period). */
  window?: number;
  /** A window or quota: `t` is at most the window. */
  clamp?: boolean;
  /** A box: no `t` (Retry-After says when it ends). */
  boxed?: boolean;
}

/** Sets RateLimit (and the legacy triple) for `b` into `out`. */
export function setRateLimit(out: Record<string, string>, conf: ResponseConf, b: Binding): void {
  let t: number | undefined = !b.boxed && b.resetMs != null ? seconds(b.resetMs) : undefined;
  if (t !== undefined && b.clamp && b.window !== undefined) t = Math.min(t, Math.ceil(b.window));
  const r = Math.max(b.remaining, 0);
  out["RateLimit"] = t !== undefined ? `${sfString(b.name)};r=${r};t=${t}` : `${sfString(b.name)};r=${r}`;
  if (conf.legacyHeaders) {
    out["RateLimit-Limit"] = String(b.limit);
    out["RateLimit-Remaining"] = String(r);
    if (t !== undefined) out["RateLimit-Reset"] = String(t);
  }
}

/** Sets Retry-After: delta-seconds, or an HTTP-date `ms` from `nowMs` when `asDate`; nothing for a negative or missing wait. */
export function setRetryAfter(out: Record<string, string>, ms: number | null | undefined, asDate: boolean,
  nowMs: number): void {
  if (ms == null || ms < 0) return;
  out["Retry-After"] = asDate ? new Date(Math.ceil((nowMs + ms) / 1000) * 1000).toUTCString()
    : String(seconds(ms));
}

/** The ISO 8601 UTC form (whole seconds) of a Unix time in seconds. */
export function timestamp(unixSeconds: number): string {
  return new Date(Math.floor(unixSeconds) * 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
}

/** The variables of a problem body. */
export interface ProblemVars {
  status: number;
  type: string;
  message: string;
  instance: string;
  requestId: string;
  retryAfter?: number | null;
  policy?: string | null;
  tier?: string | null;
  strikes?: number | null;
  level?: number | null;
  endsAt?: string | null;
  blockType?: string | null;
  upgradeUrl?: string | null;
  challenge?: string | null;
  concurrencyLimit?: number | null;
  degraded?: string | null;
  /** A 503's vars have no retry_after/policy members at all (undefined), not null ones. */
}

/** A problem body (RFC 9457) with the gateway's members. */
export function problemBody(conf: ResponseConf, v: ProblemVars, boxed: boolean,
  fields?: Record<string, unknown>): Record<string, unknown> {
  const body: Record<string, unknown> = {
    type: `${conf.problemBase}/${v.type}`, title: TITLES[v.type] ?? v.type, status: v.status,
    detail: v.message, instance: v.instance, request_id: v.requestId,
  };
  const s = v.status;
  if (s === 429 || s === 403 || s === 409 || (s === 401 && v.type === "challenge-required") || s === 503) {
    if (v.retryAfter !== undefined) body["retry_after_seconds"] = v.retryAfter;
    body["recommended_backoff"] = v.retryAfter == null ? "none" : RECOMMENDED_BACKOFF;
    body["quota_tier"] = v.tier ?? null;
    if (v.policy !== undefined) body["policy"] = v.policy;
  }
  if (v.strikes != null) body["penalty_strikes_remaining"] = v.strikes;
  if (boxed) {
    body["penalty_level"] = v.level ?? null;
    body["lockout_ends_at"] = v.endsAt ?? null;
  }
  const extra: [string, unknown][] = [["block_type", v.blockType], ["upgrade_url", v.upgradeUrl],
    ["challenge", v.challenge], ["concurrency_limit", v.concurrencyLimit], ["degraded", v.degraded]];
  for (const [k, x] of extra) if (x != null) body[k] = x;
  for (const [k, x] of Object.entries(fields ?? {})) body[k] = x;
  return body;
}

// ---------------------------------------------------------------------------
// From limiter replies to a response: the gateway's rule engine.

/** What a rule is, as far as its response is concerned. */
export interface RuleView {
  name: string;
  kind: "bucket" | "window" | "quota" | "lease";
  /** RateLimit-Policy `qu` (requests, points, cents, concurrent-requests...). */
  unit: string;
  /** The `q` of the first limiter (a bucket's rate, a window's or quota's limit, a lease's max). */
  quota: number;
  /** The `w` in seconds (a bucket's period, a window, a quota's current period); none for a lease. */
  window?: number;
  /** Further buckets/windows/quotas of the same command, in order. */
  also?: { name: string; quota: number; window: number }[];
  /** The configured box lengths (levels 1..3), for the HTTP-date choice. */
  box?: [number, number, number];
  /** The strike threshold (a warning once strikes count). */
  strikesThreshold?: number;
  /** The refusal: status and problem type (defaults: 429 rate-limit-exceeded; 403 quota-exceeded for a quota). */
  status: number;
  type: string;
  /** Action "quota" or "reject" ... (for logs only). */
  message?: string;
  upgradeUrl?: string;
  blockType?: string;
  headers?: Record<string, string>;
  fields?: Record<string, unknown>;
}

/** One rule's outcome. */
export interface Outcome {
  state: "allowed" | "refused" | "boxed" | "delayed";
  retryMs: number | null;
  binding: Binding & { unit?: string };
  strikes: number | null;
  level: number;
  concurrency?: number;
  /** Points charged (the cost; a lease: 1). */
  cost: number;
}

/** The outcome of a rate rule's reply (RL.TAKE, RL.WINDOW, RL.QUOTA). */
export function rateOutcome(rule: RuleView, d: Decision, cost: number): Outcome {
  const also = d.binding > 0 ? rule.also?.[d.binding - 1] : undefined;
  const binding: Outcome["binding"] = {
    name: also ? also.name : rule.name, limit: d.limit, remaining: d.remaining, resetMs: d.resetMs,
    window: also ? also.window : rule.window, unit: rule.unit, clamp: rule.kind !== "bucket",
  };
  const o: Outcome = { state: "allowed", retryMs: null, binding, strikes: d.strikesRemaining,
    level: d.penaltyLevel, cost };
  if (d.status === "delayed") {
    o.state = "delayed";
    o.retryMs = d.retryAfterMs;
  } else if (d.status === "throttled") {
    o.state = "refused";
    o.retryMs = d.retryAfterMs;
  } else if (d.status === "boxed") {
    o.state = "boxed";
    o.retryMs = d.retryAfterMs;
    binding.remaining = 0;
    binding.boxed = true;
  }
  return o;
}

/** The Retry-After (ms) of a full lease: the earliest holder's expected end (`expected` s after it started), at least 1 s, at most its expiry. */
export function leaseRetryMs(ttl: number, expected: number, earliestLeftMs: number): number {
  const elapsed = ttl * 1000 - earliestLeftMs;
  const retry = Math.max(expected * 1000 - elapsed, 1000);
  return Math.min(retry, Math.max(earliestLeftMs, 1000));
}

/** The outcome of a lease rule's RL.LEASE ACQUIRE. */
export function leaseOutcome(rule: RuleView, l: Lease, ttl: number, expected: number): Outcome {
  const binding = { name: rule.name, limit: l.max, remaining: l.max - l.inUse, unit: rule.unit };
  if (l.granted) return { state: "allowed", retryMs: null, binding, strikes: null, level: 0, concurrency: l.max, cost: 1 };
  return { state: "refused", retryMs: leaseRetryMs(ttl, expected, l.retryAfterMs), binding: { ...binding, remaining: 0 },
    strikes: null, level: 0, concurrency: l.max, cost: 1 };
}

/** The RateLimit-Policy items of a rule. */
export function rulePolicies(r: RuleView): PolicyItem[] {
  if (r.kind === "lease") return [{ name: r.name, quota: r.quota, unit: r.unit }];
  const items: PolicyItem[] = [{ name: r.name, quota: r.quota, window: r.window!, unit: r.unit }];
  for (const a of r.also ?? []) items.push({ name: a.name, quota: a.quota, window: a.window, unit: r.unit });
  return items;
}

// RateLimit-Policy values by rule view (a route's views live as long as the route)
const policyFields = new WeakMap<RuleView, string>();

/** The RateLimit-Policy value of a rule, made once per rule view. */
export function rulePolicyField(r: RuleView): string {
  let v = policyFields.get(r);
  if (v === undefined) {
    v = policyField(rulePolicies(r));
    policyFields.set(r, v);
  }
  return v;
}

/** A refusal wins by: a box without end first, then the longest wait; ties to the earlier rule. */
export function strictest(entries: { rule: RuleView; outcome: Outcome }[]): number | null {
  let best: number | null = null;
  const severity = (o: Outcome) => o.retryMs ?? Infinity;
  entries.forEach((e, i) => {
    const o = e.outcome;
    if ((o.state === "refused" || o.state === "boxed")
        && (best === null || severity(o) > severity(entries[best]!.outcome))) best = i;
  });
  return best;
}

/** The RateLimit binding of an admitted request: the rate rule with the smallest share of its limit left. */
export function tightest(entries: { rule: RuleView; outcome: Outcome }[]): number | null {
  let best: number | null = null;
  let share = Infinity;
  entries.forEach((e, i) => {
    if (e.rule.kind === "lease") return;
    const b = e.outcome.binding;
    const s = b.remaining / Math.max(b.limit, 1);
    if (s < share) {
      best = i;
      share = s;
    }
  });
  return best;
}

/** The request a response is for. */
export interface RequestView { path: string; requestId: string; tier?: string | null; nowMs: number; degraded?: boolean }

/** A response: status null when the request is admitted (only headers to add). */
export interface Answer {
  status: number | null;
  headers: Record<string, string>;
  contentType?: string;
  body?: Record<string, unknown>;
  /** The refusing rule's index. */
  refusedBy?: number;
}

/** The `detail` of a refusal by `name`, the policy that refused (an ALSO bucket is named as itself). */
function detail(r: RuleView, o: Outcome, secs: number | null, name: string): string {
  if (r.message) return r.message;
  const retry = secs !== null ? `retry in ${secs} s` : null;
  if (o.state === "boxed") {
    return `${name}: locked (level ${o.level}) after repeated refusals; ${retry ?? "until a manual review"}.`;
  }
  if (r.kind === "lease") return `${name}: at most ${r.quota} concurrent request(s); retry in ${secs ?? 1} s.`;
  return `${name}: ${o.binding.limit} ${r.unit} per ${o.binding.window} s exhausted `
    + `(this request: ${o.cost}); ${retry ?? "it never fits"}.`;
}

/** The response of a request decided by `entries` (its rules and their outcomes, in order). */
export function respond(conf: ResponseConf, entries: { rule: RuleView; outcome: Outcome }[],
  req: RequestView): Answer {
  const headers: Record<string, string> = {};
  const policy = entries.length === 1 ? rulePolicyField(entries[0]!.rule)
    : entries.map((e) => rulePolicyField(e.rule)).filter((f) => f !== "").join(", ");
  if (policy !== "") headers["RateLimit-Policy"] = policy;
  if (req.degraded) headers[DEGRADED_HEADER] = DEGRADED_VALUE;
  const win = strictest(entries);
  const bind = win ?? tightest(entries);
  if (bind !== null) setRateLimit(headers, conf, entries[bind]!.outcome.binding);
  if (win === null) return { status: null, headers };
  const { rule: r, outcome: o } = entries[win]!;
  const secs = o.retryMs != null ? seconds(o.retryMs) : null;
  let type = r.type;
  if (o.state === "boxed") {
    type = "penalty-box-active";
    headers["X-Penalty-Box-Status"] = "Active-Lockout";
    const len = r.box?.[o.level - 1] ?? 0;
    setRetryAfter(headers, o.retryMs, len >= conf.httpDateAfter, req.nowMs);
  } else {
    if (r.kind === "lease") type = "concurrency-limit-exceeded";
    if (o.strikes !== null && r.strikesThreshold !== undefined && o.strikes < r.strikesThreshold) {
      headers["X-Penalty-Box-Status"] = "Warning";
    }
    setRetryAfter(headers, o.retryMs, false, req.nowMs);
  }
  Object.assign(headers, r.headers ?? {});
  const status = o.state === "boxed" && o.retryMs === null ? conf.manualBoxStatus : r.status;
  const name = o.binding.name ?? r.name;
  const body = problemBody(conf, {
    status, type, message: detail(r, o, secs, name), retryAfter: secs, policy: name, tier: req.tier ?? null,
    strikes: o.strikes, level: o.level !== 0 ? o.level : null, blockType: r.blockType ?? null,
    upgradeUrl: r.upgradeUrl ?? null, concurrencyLimit: o.concurrency ?? null, instance: req.path,
    requestId: req.requestId, degraded: req.degraded ? DEGRADED_VALUE : null,
    endsAt: o.state === "boxed" && o.retryMs !== null ? timestamp(Math.ceil((req.nowMs + o.retryMs) / 1000)) : null,
  }, o.state === "boxed", r.fields);
  return { status, headers, contentType: PROBLEM_CONTENT_TYPE, body, refusedBy: win };
}

/** The 400 of a route that requires an Idempotency-Key when the request has none. */
export function idempotencyKeyRequired(conf: ResponseConf, req: RequestView, header = "Idempotency-Key"): Answer {
  const body = problemBody(conf, { status: 400, type: "idempotency-key-required", instance: req.path,
    requestId: req.requestId, message: `This route requires an ${header} header (a unique value per operation).` }, false);
  return { status: 400, headers: {}, contentType: PROBLEM_CONTENT_TYPE, body };
}

/** The 503 of a route that fails closed when Redis is slow or down. */
export function failClosed(conf: ResponseConf, req: RequestView): Answer {
  const wait = conf.failClosedRetryAfter;
  const body = problemBody(conf, { status: 503, type: "rate-limiter-unavailable", instance: req.path,
    requestId: req.requestId, tier: req.tier ?? null,
    message: `The rate limiter is unavailable and this route fails closed; retry in ${wait} s.` }, false);
  return { status: 503, headers: { "Retry-After": String(wait) }, contentType: PROBLEM_CONTENT_TYPE, body };
}
