/**
 * Typed rl commands: each builds its argument list (keys declared as keys,
 * so a cluster client routes it), sends it through a {@link Transport}
 * (see clients.ts for `redis` and `ioredis`) and turns the reply into a
 * typed decision instead of an array of integers.
 */
import { int, key, RlConfigError, seconds } from "./args.js";

/** Sends one command: `keys` are the command's keys (all in one slot); `args` stay as they are (a client may read them when it writes). */
export interface Transport {
  send(keys: readonly string[], args: readonly string[], readonly: boolean): Promise<unknown>;
}

/** How a limiter call ended. */
export type Status = "allowed" | "throttled" | "boxed" | "delayed";

/** The reply of RL.TAKE, RL.WINDOW, RL.QUOTA and RL.DISTINCT. */
export interface Decision {
  status: Status;
  /** `status` is "allowed" or "delayed" (proceed, after `retryAfterMs` when delayed). */
  allowed: boolean;
  /** Capacity (limit) of the binding bucket, window or quota. */
  limit: number;
  /** Whole points left in the binding one (negative: a debt). */
  remaining: number;
  /** Ms until the binding one is full (counts nothing) again; null: a manual box. */
  resetMs: number | null;
  /** 0 when allowed; the wait before `cost` fits, the delay, or the box's time; null: a manual box. */
  retryAfterMs: number | null;
  /** 0, or the level (1..3) of the active penalty box. */
  penaltyLevel: number;
  /** Strikes left before the box trips; null without STRIKES. */
  strikesRemaining: number | null;
  /** Which bucket the reply describes: 0 the first key, i the i-th ALSO. */
  binding: number;
  /** Points granted by a PARTIAL call (else the cost when allowed, 0 when refused). */
  granted: number;
}

/** Penalty box options (RL.TAKE, RL.WINDOW, RL.QUOTA). */
export interface PenaltyOptions {
  /**
   * `threshold` early retries within `window` seconds trip the box; with
   * `every`, every refusal is a strike, early or not (a lockout).
   */
  strikes?: { threshold: number; window: number; every?: boolean };
  /** Box lengths in seconds for levels 1, 2, 3 (0: manual box). */
  box?: [number, number, number];
  /** Seconds offenses are remembered after the latest trip. */
  offenses?: number;
  /** Stretch a refusal's wait by a random 0..percent %. */
  jitter?: number;
}

/** One token bucket: `tokens` per `period` seconds, bursts of `capacity`. */
export interface BucketSpec { key: string; capacity: number; tokens: number; period: number }
/** RL.TAKE options. */
export interface TakeOptions extends Omit<BucketSpec, "key">, PenaltyOptions {
  cost?: number;
  also?: BucketSpec[];
  delay?: number;
  debt?: boolean;
  refund?: number;
  partial?: boolean | { min: number };
  reserve?: { index: number; percent: number }[];
}

/** One window: `limit` points per `window` seconds. */
export interface WindowSpec { key: string; limit: number; window: number }
/** Window counting: sliding counter (default), exact log or fixed windows. */
export type WindowMode = "sliding" | "exact" | "fixed";
/** RL.WINDOW options. */
export interface WindowOptions extends Omit<WindowSpec, "key">, PenaltyOptions {
  cost?: number;
  also?: WindowSpec[];
  mode?: WindowMode;
  refund?: number;
}

/** A calendar period in UTC. */
export type QuotaPeriod = "day" | "week" | "month";
/** One quota: `limit` points per calendar `period`. */
export interface QuotaSpec { key: string; limit: number; period: QuotaPeriod }
/** RL.QUOTA options. */
export interface QuotaOptions extends Omit<QuotaSpec, "key">, PenaltyOptions {
  cost?: number;
  also?: QuotaSpec[];
  peek?: boolean;
  refund?: number;
}

/** RL.DISTINCT options. */
export interface DistinctOptions {
  limit: number;
  window: number;
  peek?: boolean;
  trip?: { level: number; duration: number };
}

/** RL.LEASE ACQUIRE's answer. */
export interface Lease {
  granted: boolean;
  /** The lease id (to release or renew); null when not granted. */
  id: string | null;
  inUse: number;
  max: number;
  /** 0 when granted; else ms until the earliest live lease expires. */
  retryAfterMs: number;
}

/** RL.BOX STATUS / TRIP's answer. */
export interface BoxStatus {
  /** 0: no active box. */
  level: number;
  /** Ms until the box ends; null: a manual box; 0: none active. */
  ttlMs: number | null;
  offenses: number;
  strikes: number;
}

/** CL.THROTTLE's answer (redis-cell's reply, named). */
export interface Throttle {
  allowed: boolean;
  limit: number;
  remaining: number;
  /** Seconds until the call would be allowed; null when allowed or never. */
  retryAfterS: number | null;
  resetAfterS: number;
}

/** The unexpected shape of a reply. */
export class RlReplyError extends Error {
  override name = "RlReplyError";
}

function ints(reply: unknown, n: number, what: string): number[] {
  if (!Array.isArray(reply) || reply.length < n) {
    throw new RlReplyError(`${what}: expected ${n} integers, got ${JSON.stringify(reply)}`);
  }
  // the usual reply (integers as numbers) is read in place; bigints (a client's option) are converted
  let out: unknown[] = reply;
  for (let i = 0; i < reply.length; i++) {
    const v: unknown = reply[i];
    if (typeof v === "number" && Number.isInteger(v)) continue;
    if (typeof v === "bigint") {
      if (out === reply) out = reply.slice();
      out[i] = Number(v);
      continue;
    }
    throw new RlReplyError(`${what}: reply item ${i + 1} is not an integer`);
  }
  return out as number[];
}

const STATUS: readonly (Status | undefined)[] = ["throttled", "allowed", "delayed"];

/** The decision of an 8 (or 9, with PARTIAL) integer reply charging `cost`. */
export function decisionOf(reply: unknown, cost: number, what = "RL.TAKE"): Decision {
  const r = ints(reply, 8, what);
  const status = r[0] === -1 ? "boxed" : STATUS[r[0]!];
  if (!status) {
    throw new RlReplyError(`${what}: unknown status ${r[0]}`);
  }
  const allowed = status === "allowed" || status === "delayed";
  return {
    status, allowed, limit: r[1]!, remaining: r[2]!,
    resetMs: r[3] === -1 ? null : r[3]!, retryAfterMs: r[4] === -1 ? null : r[4]!,
    penaltyLevel: r[5]!, strikesRemaining: r[6] === -1 ? null : r[6]!, binding: r[7]!,
    granted: r.length > 8 ? r[8]! : allowed ? cost : 0,
  };
}

function penalty(args: string[], o: PenaltyOptions): void {
  if (o.strikes) {
    args.push("STRIKES", int("strikes.threshold", o.strikes.threshold, 1, 1e9),
      seconds("strikes.window", o.strikes.window));
    if (o.strikes.every !== undefined && typeof o.strikes.every !== "boolean") {
      throw new RlConfigError("strikes.every must be a boolean");
    }
    if (o.strikes.every) args.push("EVERY");
  } else if (o.box || o.offenses !== undefined) {
    throw new RlConfigError("box and offenses need strikes");
  }
  if (o.box) {
    if (!Array.isArray(o.box) || o.box.length !== 3) {
      throw new RlConfigError("box must be three durations [level1, level2, level3] in seconds");
    }
    args.push("BOX", ...o.box.map((d, i) => seconds(`box[${i}]`, d, true)));
  }
  if (o.offenses !== undefined) {
    args.push("OFFENSES", seconds("offenses", o.offenses));
  }
  if (o.jitter) {
    args.push("JITTER", int("jitter", o.jitter, 0, 100));
  }
}

function costOrRefund(args: string[], o: { cost?: number; refund?: number }): number {
  if (o.refund !== undefined) {
    if (o.cost !== undefined) {
      throw new RlConfigError("cost and refund are exclusive");
    }
    args.push("REFUND", int("refund", o.refund, 1));
    return 0;
  }
  const cost = o.cost ?? 1;
  // 1 is rl's default: the common call sends two arguments fewer for Redis to parse
  if (cost !== 1) args.push("COST", int("cost", cost));
  return cost;
}

const PERIODS: Record<QuotaPeriod, string> = { day: "DAY", week: "WEEK", month: "MONTH" };
function period(name: string, p: unknown): string {
  const v = PERIODS[p as QuotaPeriod];
  if (!v) {
    throw new RlConfigError(`${name} must be "day", "week" or "month", got ${String(p)}`);
  }
  return v;
}

/** A command ready to send: its arguments, its keys, the cost it charges. */
export interface Built { args: string[]; keys: string[]; cost: number; readonly: boolean }

/**
 * A rate command (RL.TAKE, RL.WINDOW, RL.QUOTA): `head` (the command, its
 * key and first limiter), COST or REFUND, one ALSO clause per `also` item
 * (`limits` gives the item's limiter arguments), then the penalty options
 * and `extra` (options may come in any order).
 */
function buildRate<A extends { key: string }>(head: string[], o: PenaltyOptions & { cost?: number; refund?: number },
  also: A[] | undefined, limits: (a: A, at: string) => string[], extra: string[]): Built {
  const keys = [key("key", head[1])];
  const args = [...head];
  const cost = costOrRefund(args, o);
  (also ?? []).forEach((a, i) => {
    keys.push(key(`also[${i}].key`, a.key));
    args.push("ALSO", a.key, ...limits(a, `also[${i}]`));
  });
  penalty(args, o);
  args.push(...extra);
  return { args, keys, cost, readonly: false };
}

/** RL.TAKE's arguments. */
export function buildTake(k: string, o: TakeOptions): Built {
  const extra: string[] = [];
  for (const r of o.reserve ?? []) {
    extra.push("RESERVE", int("reserve.index", r.index, 0, 15), int("reserve.percent", r.percent, 0, 100));
  }
  if (o.delay !== undefined) extra.push("DELAY", seconds("delay", o.delay));
  if (o.debt) extra.push("DEBT");
  if (o.partial) {
    extra.push("PARTIAL");
    if (typeof o.partial === "object") extra.push("MIN", int("partial.min", o.partial.min, 1));
  }
  return buildRate(["RL.TAKE", k, int("capacity", o.capacity, 1), int("tokens", o.tokens, 1), seconds("period", o.period)],
    o, o.also, (a, at) => [int(`${at}.capacity`, a.capacity, 1), int(`${at}.tokens`, a.tokens, 1),
      seconds(`${at}.period`, a.period)], extra);
}

const MODE_ARGS: Record<WindowMode, string[]> = { sliding: [], exact: ["EXACT"], fixed: ["FIXED"] };

/** RL.WINDOW's arguments. */
export function buildWindow(k: string, o: WindowOptions): Built {
  const mode = Object.hasOwn(MODE_ARGS, o.mode ?? "sliding") ? MODE_ARGS[o.mode ?? "sliding"] : undefined;
  if (!mode) throw new RlConfigError(`mode must be "sliding", "exact" or "fixed", got ${String(o.mode)}`);
  return buildRate(["RL.WINDOW", k, int("limit", o.limit, 1), seconds("window", o.window)], o, o.also,
    (a, at) => [int(`${at}.limit`, a.limit, 1), seconds(`${at}.window`, a.window)], mode);
}

/** RL.QUOTA's arguments. */
export function buildQuota(k: string, o: QuotaOptions): Built {
  return buildRate(["RL.QUOTA", k, int("limit", o.limit, 1), period("period", o.period)], o, o.also,
    (a, at) => [int(`${at}.limit`, a.limit, 1), period(`${at}.period`, a.period)], o.peek ? ["PEEK"] : []);
}

/** RL.DISTINCT's arguments. */
export function buildDistinct(k: string, member: string, o: DistinctOptions): Built {
  const args = ["RL.DISTINCT", key("key", k), String(member), int("limit", o.limit, 1, 10000),
    seconds("window", o.window)];
  if (o.peek) args.push("PEEK");
  if (o.trip) {
    args.push("TRIP", int("trip.level", o.trip.level, 1, 3), seconds("trip.duration", o.trip.duration, true));
  }
  return { args, keys: [k], cost: 1, readonly: false };
}

/**
 * The typed rl commands over one transport (see `forRedis` and
 * `forIoredis` in clients.ts).
 */
export class RlCommands {
  constructor(readonly transport: Transport) {}

  private send(b: Built): Promise<unknown> {
    return this.transport.send(b.keys, b.args, b.readonly);
  }

  /** RL.TAKE: token buckets (all-or-nothing with `also`), penalty box, DELAY, PARTIAL... */
  async take(k: string, o: TakeOptions): Promise<Decision> {
    const b = buildTake(k, o);
    return decisionOf(await this.send(b), b.cost, "RL.TAKE");
  }

  /** RL.WINDOW: sliding, exact or fixed windows (all-or-nothing with `also`). */
  async window(k: string, o: WindowOptions): Promise<Decision> {
    const b = buildWindow(k, o);
    return decisionOf(await this.send(b), b.cost, "RL.WINDOW");
  }

  /** RL.QUOTA: calendar quotas (UTC day, ISO week, month). */
  async quota(k: string, o: QuotaOptions): Promise<Decision> {
    const b = buildQuota(k, o);
    return decisionOf(await this.send(b), b.cost, "RL.QUOTA");
  }

  /** RL.DISTINCT: distinct members seen on `k` in a sliding window. */
  async distinct(k: string, member: string, o: DistinctOptions): Promise<Decision> {
    const b = buildDistinct(k, member, o);
    return decisionOf(await this.send(b), 1, "RL.DISTINCT");
  }

  /** CL.THROTTLE (redis-cell's command and reply). */
  async throttle(k: string, o: { maxBurst: number; count: number; period: number; quantity?: number }): Promise<Throttle> {
    const args = ["CL.THROTTLE", key("key", k), int("maxBurst", o.maxBurst, 0, 1e15 - 1),
      int("count", o.count, 1), seconds("period", o.period), int("quantity", o.quantity ?? 1)];
    const r = ints(await this.transport.send([k], args, false), 5, "CL.THROTTLE");
    return { allowed: r[0] === 0, limit: r[1]!, remaining: r[2]!,
      retryAfterS: r[3] === -1 ? null : r[3]!, resetAfterS: r[4]! };
  }

  /** The lease commands (RL.LEASE ACQUIRE / RELEASE / RENEW / LIST). */
  readonly lease = {
    /** Takes one of `max` slots of `k` for `ttl` seconds. */
    acquire: async (k: string, o: { max: number; ttl: number; id?: string }): Promise<Lease> => {
      const args = ["RL.LEASE", "ACQUIRE", key("key", k), int("max", o.max, 1, 1000), seconds("ttl", o.ttl)];
      if (o.id !== undefined) args.push("ID", key("id", o.id));
      const r = await this.transport.send([k], args, false);
      if (!Array.isArray(r) || r.length < 5) {
        throw new RlReplyError(`RL.LEASE ACQUIRE: unexpected reply ${JSON.stringify(r)}`);
      }
      const n = ints([r[0], r[2], r[3], r[4]], 4, "RL.LEASE ACQUIRE");
      return { granted: n[0] === 1, id: r[1] == null ? null : String(r[1]), inUse: n[1]!, max: n[2]!,
        retryAfterMs: n[3]! };
    },
    /** Gives a lease back: true when a live lease was removed. */
    release: async (k: string, id: string): Promise<boolean> =>
      Number(await this.transport.send([k], ["RL.LEASE", "RELEASE", key("key", k), key("id", id)], false)) === 1,
    /** Extends a live lease to `ttl` seconds from now: false when it was not live. */
    renew: async (k: string, id: string, ttl: number): Promise<boolean> =>
      Number(await this.transport.send([k], ["RL.LEASE", "RENEW", key("key", k), key("id", id),
        seconds("ttl", ttl)], false)) === 1,
    /** The live leases of `k` with their ms left. */
    list: async (k: string): Promise<{ id: string; msLeft: number }[]> => {
      const r = await this.transport.send([k], ["RL.LEASE", "LIST", key("key", k)], true);
      if (!Array.isArray(r)) throw new RlReplyError("RL.LEASE LIST: expected an array");
      return r.map((p) => ({ id: String((p as unknown[])[0]), msLeft: Number((p as unknown[])[1]) }));
    },
  };

  /** The penalty box commands (RL.BOX STATUS / TRIP / RELEASE). */
  readonly box = {
    /** The box state of `k` (read-only: works on replicas). */
    status: async (k: string): Promise<BoxStatus> =>
      boxOf(await this.transport.send([k], ["RL.BOX", "STATUS", key("key", k)], true)),
    /** Boxes `k` at `level` for `duration` seconds (0: until released). */
    trip: async (k: string, level: number, duration: number): Promise<BoxStatus> =>
      boxOf(await this.transport.send([k], ["RL.BOX", "TRIP", key("key", k), int("level", level, 1, 3),
        seconds("duration", duration, true)], false)),
    /** Lifts the box (and with `forget` its offenses and strikes): true when one was active. */
    release: async (k: string, forget = false): Promise<boolean> =>
      Number(await this.transport.send([k], ["RL.BOX", "RELEASE", key("key", k), ...(forget ? ["FORGET"] : [])],
        false)) === 1,
  };
}

function boxOf(reply: unknown): BoxStatus {
  const r = ints(reply, 4, "RL.BOX");
  return { level: r[0]!, ttlMs: r[1] === -1 ? null : r[1]!, offenses: r[2]!, strikes: r[3]! };
}
