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

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const MONTH = "(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)";
const TIME = "(\\d{2}):(\\d{2}):(\\d{2})";
const IMF_FIXDATE = new RegExp(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\\d{2}) ${MONTH} (\\d{4}) ${TIME} GMT$`);
const RFC850 = new RegExp(
  `^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (\\d{2})-${MONTH}-(\\d{2}) ${TIME} GMT$`,
);
const ASCTIME = new RegExp(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ${MONTH} ( \\d|\\d{2}) ${TIME} (\\d{4})$`);

/** Unix seconds of a UTC date, or null when a field is out of range. */
function utc(year: number, month: string, day: string, h: string, m: string, s: string): number | null {
  const [d, hh, mm, ss] = [Number(day), Number(h), Number(m), Number(s)];
  if (d < 1 || d > 31 || hh > 23 || mm > 59 || ss > 60) return null;
  return Date.UTC(year, MONTHS.indexOf(month), d, hh, mm, ss) / 1000;
}

/**
 * An HTTP-date as Unix seconds, or null. Only the three forms of RFC 9110
 * are read, exactly: IMF-fixdate, RFC 850 (a two-digit year more than 50
 * years ahead of the time `now` is taken in the previous century) and
 * asctime (no zone: UTC, as every HTTP-date).
 */
function httpDate(value: string, now: number): number | null {
  const v = value.trim();
  let m = IMF_FIXDATE.exec(v);
  if (m !== null) return utc(Number(m[3]), m[2]!, m[1]!, m[4]!, m[5]!, m[6]!);
  m = RFC850.exec(v);
  if (m !== null) {
    let year = 2000 + Number(m[3]);
    if (year > new Date(now * 1000).getUTCFullYear() + 50) year -= 100;
    return utc(year, m[2]!, m[1]!, m[4]!, m[5]!, m[6]!);
  }
  m = ASCTIME.exec(v);
  if (m !== null) return utc(Number(m[6]), m[1]!, m[2]!.trim(), m[3]!, m[4]!, m[5]!);
  return null;
}

/**
 * The wait a response's `Retry-After` asks for, in seconds (>= 0), or null.
 * Delta-seconds (digits only) are taken as they are; a value too large for a
 * number is `Infinity` (the engine refuses to wait for it). Several values
 * (a repeated header, joined with ", ") give the largest when every one is
 * delta-seconds, else null. An HTTP-date is taken relative to the response's
 * own `Date` header (the server's clock), never the local clock; only a
 * response without a readable `Date` falls back to `wallNow()`.
 */
export function retryAfterSeconds(get: HeaderGetter, wallNow: () => number): number | null {
  const raw = get("Retry-After")?.trim();
  if (raw === undefined) return null;
  if (/^[0-9]+(\s*,\s*[0-9]+)*$/.test(raw)) {
    return raw.split(",").reduce((most, part) => Math.max(most, Number(part.trim())), 0);
  }
  const dateHeader = get("Date");
  const reference = (dateHeader !== null ? httpDate(dateHeader, wallNow()) : null) ?? wallNow();
  const target = httpDate(raw, reference);
  if (target === null) return null;
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

/** A non-negative integer field of at most 18 digits, else null. */
function intHeader(get: HeaderGetter, name: string): number | null {
  const raw = get(name)?.trim();
  return raw !== undefined && /^[0-9]{1,18}$/.test(raw) ? Number(raw) : null;
}

function legacyItem(get: HeaderGetter): RateLimitItem | null {
  const remaining = intHeader(get, "RateLimit-Remaining");
  if (remaining === null) return null;
  return { name: "", remaining, reset: intHeader(get, "RateLimit-Reset"), params: new Map() };
}
