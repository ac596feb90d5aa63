/**
 * Parsing of the rate-limit response fields: `Retry-After` and the
 * `RateLimit` / `RateLimit-Policy` structured fields
 * (draft-ietf-httpapi-ratelimit-headers, parsed with `structured-headers`),
 * with the older `RateLimit-Limit` / `-Remaining` / `-Reset` triple as a
 * fallback. Nothing here throws on a malformed header: an unreadable field
 * is absent.
 */
import { parseList, Token, type BareItem, type List, type Parameters } from "structured-headers";

/** Reads one response header by name (case-insensitive), `null` if absent. */
export type HeaderGetter = (name: string) => string | null;

/** An HTTP-date (IMF-fixdate, RFC 850 or asctime) as Unix seconds, or null. HTTP-dates are UTC: one without a zone (asctime) is read as UTC, not local time. */
function httpDate(value: string): number | null {
  const v = value.trim();
  const ms = Date.parse(/(GMT|UTC|Z|[+-]\d{4})$/i.test(v) ? v : `${v} GMT`);
  return Number.isNaN(ms) ? null : ms / 1000;
}

/**
 * The wait a response's `Retry-After` asks for, in seconds (>= 0), or null.
 * Delta-seconds are taken as they are. An HTTP-date is taken relative to the
 * response's own `Date` header (the server's clock), never the local clock;
 * only a response without a readable `Date` falls back to `wallNow()`.
 */
export function retryAfterSeconds(get: HeaderGetter, wallNow: () => number): number | null {
  const raw = get("Retry-After")?.trim();
  if (raw === undefined) return null;
  if (/^[0-9]+$/.test(raw)) return Number(raw);
  // a bare number that is not delta-seconds (negative, decimal) is no date either
  if (/^[-+0-9.]+$/.test(raw)) return null;
  const target = httpDate(raw);
  if (target === null) return null;
  const dateHeader = get("Date");
  const reference = (dateHeader !== null ? httpDate(dateHeader) : null) ?? wallNow();
  return Math.max(0, target - reference);
}

/** One item of `RateLimit-Policy`: `"name";q=quota;w=window`. */
export interface QuotaPolicy {
  name: string;
  /** Quota units (the gateway's points) per `window`. */
  quota: number | null;
  /** Seconds. */
  window: number | null;
  /** Every parameter as sent. */
  params: ReadonlyMap<string, BareItem>;
}

/** One item of `RateLimit`: `"name";r=remaining;t=reset`. */
export interface RateLimitItem {
  name: string;
  /** Quota left, in whole units. */
  remaining: number | null;
  /** Seconds until the quota is full again; null when not sent. */
  reset: number | null;
  params: ReadonlyMap<string, BareItem>;
}

/** Quota units per second of a policy, or null when unknown. */
export function policyRate(p: QuotaPolicy): number | null {
  return p.quota !== null && p.window !== null && p.window > 0 ? p.quota / p.window : null;
}

/**
 * The rate-limit state one response announced: the `RateLimit-Policy` items
 * by name (in order) and the `RateLimit` items; the first `RateLimit` item
 * is the binding one (the rl gateway sends exactly one).
 */
export class RateLimitInfo {
  constructor(
    readonly policies: ReadonlyMap<string, QuotaPolicy>,
    readonly limits: readonly RateLimitItem[],
  ) {}

  /** The binding `RateLimit` item, or null. */
  get binding(): RateLimitItem | null {
    return this.limits[0] ?? null;
  }

  /** `r` of the binding item: what is left before the bucket is empty. */
  get remaining(): number | null {
    return this.binding?.remaining ?? null;
  }

  /** `t` of the binding item: seconds until the bucket is full again. */
  get reset(): number | null {
    return this.binding?.reset ?? null;
  }

  /** The policy an item names; an unnamed item (the older draft's form) takes the only policy. */
  policyOf(item: RateLimitItem): QuotaPolicy | null {
    const found = this.policies.get(item.name);
    if (found === undefined && item.name === "" && this.policies.size === 1) {
      return [...this.policies.values()][0] ?? null;
    }
    return found ?? null;
  }

  /** Parses a response's fields; null when it carries none. */
  static fromHeaders(get: HeaderGetter): RateLimitInfo | null {
    const policies = parsePolicies(get("RateLimit-Policy"));
    let limits = parseLimits(get("RateLimit"));
    if (limits.length === 0) {
      const legacy = legacyItem(get);
      if (legacy !== null) limits = [legacy];
    }
    if (policies.size === 0 && limits.length === 0) return null;
    return new RateLimitInfo(policies, limits);
  }
}

function sfList(raw: string | null): List {
  if (raw === null) return [];
  try {
    return parseList(raw);
  } catch {
    return [];
  }
}

function num(v: BareItem | undefined): number | null {
  return typeof v === "number" ? v : null;
}

/** [name, params, bare value] of each member that is an Item (inner lists are skipped). */
function items(raw: string | null): Array<[string, Parameters, BareItem | null]> {
  const out: Array<[string, Parameters, BareItem | null]> = [];
  for (const [value, params] of sfList(raw)) {
    if (Array.isArray(value)) continue;
    if (typeof value === "string" || value instanceof Token) {
      out.push([value.toString(), params, null]);
    } else {
      out.push(["", params, value]); // the older draft's `3000;w=60`
    }
  }
  return out;
}

function parsePolicies(raw: string | null): Map<string, QuotaPolicy> {
  const out = new Map<string, QuotaPolicy>();
  for (const [name, params, bare] of items(raw)) {
    if (out.has(name)) continue;
    const quota = num(params.get("q")) ?? (bare !== null ? num(bare) : null);
    out.set(name, { name, quota, window: num(params.get("w")), params });
  }
  return out;
}

function parseLimits(raw: string | null): RateLimitItem[] {
  return items(raw).map(([name, params]) => ({
    name,
    remaining: num(params.get("r")),
    reset: num(params.get("t")),
    params,
  }));
}

function intHeader(get: HeaderGetter, name: string): number | null {
  const raw = get(name)?.trim();
  return raw !== undefined && /^[0-9]+$/.test(raw) ? Number(raw) : null;
}

function legacyItem(get: HeaderGetter): RateLimitItem | null {
  const remaining = intHeader(get, "RateLimit-Remaining");
  if (remaining === null) return null;
  return { name: "", remaining, reset: intHeader(get, "RateLimit-Reset"), params: new Map() };
}
