/**
 * Stores for the rate limiters applications already use, each backed by
 * one RL.WINDOW call per request (atomic in Redis: exact however many
 * clients call at once, unlike a get-then-set):
 *
 * - {@link RlExpressStore} for express-rate-limit (`store: new RlExpressStore({ client })`);
 * - {@link rlFastifyStore} for @fastify/rate-limit (`store: rlFastifyStore({ client })`).
 *
 * A refused request is not counted by rl (its window stays at the limit):
 * the stores report it as one hit above the limit, which both libraries
 * read as "refused", with the time until a request fits again (and the
 * express-rate-limit store remembers it, so that a decrement of it gives
 * back nothing Redis counted).
 */
import { key, RlConfigError } from "./args.js";
import { buildWindow, decisionOf, type Decision, type RlCommands, type Transport, type WindowMode } from "./commands.js";
import { budget, type Budget } from "./deadline.js";
import { MAX_EXACT_LIMIT } from "./rules.js";

/** Options of both stores. */
export interface RlStoreOptions {
  /** rl's typed commands over your Redis client (`forRedis(client)` or `forIoredis(client)`). */
  rl: RlCommands;
  /** Prefix of every key (default `rl:erl:` / `rl:frl:`). */
  prefix?: string;
  /** `fixed` windows (the libraries' own behaviour, the default), a `sliding` window counter, or an `exact` sliding log. */
  mode?: WindowMode;
  /**
   * Ms Redis has to answer (default 1000); then the call fails, and the
   * host library's own setting decides (express-rate-limit's
   * `passOnStoreError`, @fastify/rate-limit's `skipOnError`).
   */
  timeoutMs?: number;
}

function checkTimeout(ms: unknown): number {
  if (ms === undefined) return 1000;
  if (typeof ms !== "number" || !(ms > 0)) throw new RlConfigError(`timeoutMs must be a number of ms > 0, got ${String(ms)}`);
  return ms;
}

function checkMode(mode: unknown): WindowMode {
  if (mode === undefined) return "fixed";
  if (mode !== "fixed" && mode !== "sliding" && mode !== "exact") {
    throw new RlConfigError(`mode must be "fixed", "sliding" or "exact", got ${String(mode)}`);
  }
  return mode;
}

function checkRl(rl: unknown): RlCommands {
  if (!rl || typeof (rl as RlCommands).window !== "function") {
    throw new RlConfigError("rl must be rl's typed commands: forRedis(client) or forIoredis(client)");
  }
  return rl as RlCommands;
}

/** Window length in seconds from milliseconds (rl takes at most 3 decimals: whole ms). */
function windowSeconds(name: string, ms: unknown): number {
  if (typeof ms !== "number" || !Number.isSafeInteger(ms) || ms < 1) {
    throw new RlConfigError(`${name} must be a whole number of milliseconds >= 1, got ${String(ms)}`);
  }
  return ms / 1000;
}

/** Hits counted (one above the limit when refused) from a window decision. */
function hitsOf(d: Decision): number {
  return d.allowed ? d.limit - d.remaining : d.limit + 1;
}

/** Ms until the count is lower (refused: until a request fits; else until it counts nothing). */
function waitOf(d: Decision): number {
  return d.allowed ? d.resetMs ?? 0 : d.retryAfterMs ?? 0;
}

/** Sends a store's command within its budget; `then` reads the reply. */
function send<R>(transport: Transport, b: Budget, keys: readonly string[], args: readonly string[],
  then: (reply: unknown) => R): Promise<R> {
  let p: Promise<unknown>;
  try {
    p = transport.send(keys, args, false);
  } catch (e) {
    return Promise.reject(e);
  }
  return b.run(p, then);
}

const nothing = (): void => {};

/**
 * The limit rl enforces for a host library's `limit` / `max`: both refuse
 * once the hits are above it (`hits > max`), so a fraction counts as its
 * floor, and below 1 every request is refused (without calling Redis).
 */
function limitOf(name: string, v: unknown, mode: WindowMode): number {
  if (typeof v !== "number" || Number.isNaN(v)) {
    throw new RlConfigError(`${name} must be a number, got ${typeof v === "function" ? "a function" : String(v)}`);
  }
  const limit = Math.max(0, Math.floor(v));
  if (!Number.isSafeInteger(limit)) throw new RlConfigError(`${name} must be a finite number, got ${v}`);
  if (mode === "exact" && limit > MAX_EXACT_LIMIT) {
    throw new RlConfigError(`${name} must be at most ${MAX_EXACT_LIMIT} with mode "exact" (a sliding log), got ${v}`);
  }
  return limit;
}

const warned = new Set<string>();
/** A process warning, once per message (at most 100 kept). */
function warnOnce(message: string): void {
  if (warned.has(message) || warned.size >= 100) return;
  warned.add(message);
  process.emitWarning(`rl store: ${message}`, "RlConfigWarning");
}

/** What a store answers when its configuration is wrong: a refusal (never a pass, which an outage setting would allow). */
const REFUSE_ALL_HITS = Number.MAX_SAFE_INTEGER;

/** Most keys with refusals not yet given back that an {@link RlExpressStore} remembers (the oldest is forgotten first). */
const MAX_REFUSED_KEYS = 10_000;

/**
 * An express-rate-limit store (its `Store` interface: `init`, `get`,
 * `increment`, `decrement`, `resetKey`): one RL.WINDOW per request, with
 * the middleware's `limit` and `windowMs`. The limit must be a number
 * (the store is not given the request).
 */
export class RlExpressStore {
  /** Keys live in Redis: shared by every instance. */
  readonly localKeys = false;
  readonly prefix: string;
  private readonly rl: RlCommands;
  private readonly mode: WindowMode;
  private readonly budget: Budget;
  /** RL.WINDOW's arguments of a hit, a read (COST 0) and a refund, key left empty: made by `init`. */
  private hitArgs: string[] = [];
  private readArgs: string[] = [];
  private refundArgs: string[] = [];
  private error: Error | undefined = new RlConfigError("RlExpressStore: init was not called (pass it as `store`)");
  private limit = 0;
  private windowMs = 0;
  /**
   * Per key, this process's refused hits not yet given back, and until when
   * (the time the refusal said a request fits again). express-rate-limit
   * counts a refused hit and, with skipFailedRequests, decrements it (its
   * own 429 is a failed request); rl never counted it, so such a decrement
   * is taken from here instead of refunding a hit Redis did count.
   */
  private readonly refused = new Map<string, { n: number; until: number }>();
  // the reply readers, made once (a request allocates no closure for them)
  private readonly counted = (reply: unknown) => this.info(decisionOf(reply, 1, "RL.WINDOW"));
  private readonly read = (reply: unknown) => {
    const d = decisionOf(reply, 0, "RL.WINDOW");
    return d.remaining === d.limit ? undefined : this.info(d);
  };

  constructor(options: RlStoreOptions) {
    this.rl = checkRl(options?.rl);
    this.mode = checkMode(options.mode);
    this.budget = budget(checkTimeout(options.timeoutMs));
    this.prefix = options.prefix ?? "rl:erl:";
  }

  /**
   * Reads the middleware's `limit` and `windowMs`. A bad one is thrown here
   * (express-rate-limit logs it), and then every request is refused: a
   * configuration error never lets requests through, whatever
   * `passOnStoreError` says. A limit below 1 refuses every request (as
   * express-rate-limit does), without calling Redis; a fraction counts as
   * its floor.
   */
  init(options: { limit?: unknown; max?: unknown; windowMs?: unknown }): void {
    try {
      const given = options.limit ?? options.max ?? 5;
      if (typeof given === "function") {
        throw new RlConfigError("limit must be a number with RlExpressStore, got a function (the store is not given the request)");
      }
      const limit = limitOf("limit", given, this.mode);
      const window = windowSeconds("windowMs", options.windowMs);
      this.windowMs = options.windowMs as number;
      this.limit = limit;
      this.error = undefined;
      if (limit === 0) return;
      // the arguments every call shares, checked and formatted once
      const shared = buildWindow("k", { limit, window, mode: this.mode }).args.slice(2);
      this.hitArgs = ["RL.WINDOW", "", ...shared];
      this.readArgs = [...this.hitArgs, "COST", "0"];
      this.refundArgs = [...this.hitArgs, "REFUND", "1"];
    } catch (e) {
      this.error = e as Error;
      throw e;
    }
  }

  /** A refusal without Redis (no limit, or a limit below 1): whether one is due, and its hit. */
  private refusedHere(): { totalHits: number; resetTime: Date } | undefined {
    if (this.error instanceof RlConfigError) return { totalHits: REFUSE_ALL_HITS, resetTime: new Date(Date.now() + 60_000) };
    if (this.limit === 0 && !this.error) return { totalHits: 1, resetTime: new Date(Date.now() + this.windowMs) };
    return undefined;
  }

  /** RL.WINDOW on the client's key with `template`'s arguments. */
  private call<R>(clientKey: string, template: readonly string[], then: (reply: unknown) => R): Promise<R> {
    if (this.error) return Promise.reject(this.error);
    const k = key("key", this.prefix + clientKey);
    const args = template.slice();
    args[1] = k;
    return send(this.rl.transport, this.budget, [k], args, then);
  }

  private info(d: Decision): { totalHits: number; resetTime: Date } {
    return { totalHits: hitsOf(d), resetTime: new Date(Date.now() + waitOf(d)) };
  }

  /**
   * Counts a hit: one RL.WINDOW (cost 1, rl's default). A refused hit is
   * not counted by rl: it is remembered (see `decrement`) and reported as
   * one above the limit.
   */
  increment(key: string): Promise<{ totalHits: number; resetTime: Date }> {
    const refused = this.refusedHere();
    if (refused) return Promise.resolve(refused);
    return this.call(key, this.hitArgs, this.counted).then((info) => {
      if (info.totalHits > this.limit) this.noteRefused(key, info.resetTime.getTime());
      return info;
    });
  }

  private noteRefused(key: string, until: number): void {
    const r = this.refused.get(key);
    if (r && r.until > Date.now()) {
      r.n++;
      r.until = Math.max(r.until, until);
      return;
    }
    if (r) this.refused.delete(key);
    // full: the key remembered first goes (a Map keeps insertion order), so
    // a refusal costs the same however many keys are remembered
    if (this.refused.size >= MAX_REFUSED_KEYS) this.refused.delete(this.refused.keys().next().value!);
    this.refused.set(key, { n: 1, until });
  }

  /** The count without counting (COST 0: writes nothing). */
  get(key: string): Promise<{ totalHits: number; resetTime: Date } | undefined> {
    if (this.refusedHere()) return Promise.resolve(undefined);
    return this.call(key, this.readArgs, this.read);
  }

  /**
   * Gives one hit back, for skipSuccessfulRequests / skipFailedRequests:
   * first one of the key's refused hits (rl never counted it: nothing to
   * send), else one counted hit (RL.WINDOW ... REFUND 1). Hits, refused
   * ones included, then go up and down as with express-rate-limit's
   * MemoryStore, which counts refused hits.
   */
  decrement(key: string): Promise<void> {
    if (this.refusedHere()) return Promise.resolve();
    const r = this.refused.get(key);
    if (r) {
      if (r.until > Date.now()) {
        if (--r.n === 0) this.refused.delete(key);
        return Promise.resolve();
      }
      this.refused.delete(key);
    }
    return this.call(key, this.refundArgs, nothing);
  }

  /** Forgets a client's count. */
  resetKey(key: string): Promise<void> {
    this.refused.delete(key);
    const k = this.prefix + key;
    return send(this.rl.transport, this.budget, [k], ["DEL", k], nothing);
  }
}

type Callback = (err: Error | null, res?: { current: number; ttl: number }) => void;

/** The custom-store interface of @fastify/rate-limit. */
export interface FastifyStore {
  incr(key: string, cb: Callback, timeWindow: number, max: number): void;
  read(key: string, cb: Callback, timeWindow: number, max: number): void;
  child(routeOptions: object): FastifyStore;
}

/**
 * A @fastify/rate-limit custom store class (`store: rlFastifyStore({ rl })`):
 * `incr` and `read` per its documentation, `child` per route (its own
 * counters, keyed by method and URL, as the plugin's Redis store does),
 * one RL.WINDOW per request with the route's `max` and `timeWindow`.
 * `ban`, `continueExceeding` and `exponentialBackoff` count refused
 * requests, which rl does not: they are refused at registration.
 */
export function rlFastifyStore(options: RlStoreOptions): new (params: object) => FastifyStore {
  const rl = checkRl(options?.rl);
  const mode = checkMode(options.mode);
  const wait = budget(checkTimeout(options.timeoutMs));
  const base = options.prefix ?? "rl:frl:";

  class RlFastifyStore {
    constructor(options: object, readonly prefix = base) {
      const params = options as Record<string, unknown>;
      for (const opt of ["continueExceeding", "exponentialBackoff"]) {
        if (params?.[opt] === true) throw new RlConfigError(`${opt} is not supported by the rl store (rl does not count refused requests)`);
      }
      if (typeof params?.["ban"] === "number" && params["ban"] >= 0) {
        throw new RlConfigError("ban is not supported by the rl store (rl does not count refused requests)");
      }
      // a number max is known now (a function's value only per request)
      if (typeof params?.["max"] === "number") limitOf("max", params["max"], mode);
    }

    private call(key: string, cb: Callback, timeWindow: number, max: number, cost: number): void {
      let b;
      try {
        const limit = limitOf("max", max, mode);
        if (limit === 0) {
          // the plugin refuses every request (current > max), as it does with its own store
          cb(null, { current: cost, ttl: timeWindow });
          return;
        }
        b = buildWindow(this.prefix + key, { limit, window: windowSeconds("timeWindow", timeWindow), mode, cost });
      } catch (e) {
        // a max that is no number compares false with every count: only an error can refuse (unless skipOnError)
        if (typeof max !== "number" || Number.isNaN(max)) {
          cb(e as Error);
          return;
        }
        // any other configuration error refuses (never an error, which skipOnError would let through), said once
        warnOnce((e as Error).message);
        cb(null, { current: REFUSE_ALL_HITS, ttl: typeof timeWindow === "number" && timeWindow > 0 ? timeWindow : 60_000 });
        return;
      }
      send(rl.transport, wait, b.keys, b.args, (reply) => decisionOf(reply, cost, "RL.WINDOW")).then((d) => {
        cb(null, { current: hitsOf(d), ttl: waitOf(d) });
      }, (e: Error) => cb(e));
    }

    /** Counts a hit (not counted when it does not fit): `{current, ttl}`. */
    incr(key: string, cb: Callback, timeWindow: number, max: number): void {
      this.call(key, cb, timeWindow, max, 1);
    }

    /** The count without counting (COST 0), for `{ increment: false }`. */
    read(key: string, cb: Callback, timeWindow: number, max: number): void {
      this.call(key, cb, timeWindow, max, 0);
    }

    /** A route's own store. */
    child(routeOptions: object): RlFastifyStore {
      const info = ((routeOptions as Record<string, unknown>)["routeInfo"] ?? {}) as { method?: string; url?: string };
      return new RlFastifyStore(routeOptions, `${this.prefix}${info.method ?? ""}${info.url ?? ""}-`);
    }
  }
  return RlFastifyStore;
}
