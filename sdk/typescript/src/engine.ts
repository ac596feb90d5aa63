/**
 * The retry decisions, independent of how requests are sent: the policy,
 * the penalty-box lockouts, and one {@link Call} per request that the fetch
 * wrapper drives (`beforeAttempt` before each send, `afterResponse` after).
 */
import { systemClock, uniform, type Clock, type RandomSource } from "./clock.js";
import { LockoutError, RateLimitError, type GiveUpReason } from "./errors.js";
import { RateLimitInfo, retryAfterSeconds, type HeaderGetter } from "./headers.js";
import type { Pacer } from "./pacer.js";

/** RFC 9110's idempotent methods. */
export const IDEMPOTENT_METHODS: readonly string[] = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"];

/** When and how long the SDK waits before sending a request again. */
export interface RetryPolicy {
  /** Seconds (default 0.5). Retry number n (0 first) backs off `uniform(0, min(cap, base * 2^n))`. */
  baseSeconds: number;
  /** Seconds (default 30). */
  capSeconds: number;
  /** Requests in all, the first included (default 5). */
  maxAttempts: number;
  /** The wait, `max(Retry-After, backoff)`, is stretched by `uniform(0, jitterRatio)` of itself (default 0.1). */
  jitterRatio: number;
  /** Statuses retried (default 429 and the gateway's fail-closed 503). */
  retryStatuses: readonly number[];
  /** Token endpoint paths (default `/v1/auth/token`): retried at most `tokenMaxRetries` times, same credentials. */
  tokenPaths: readonly string[];
  /** Default 2. */
  tokenMaxRetries: number;
  /** Retried as they are; other methods only with an Idempotency-Key. */
  idempotentMethods: readonly string[];
  /** Default `Idempotency-Key`. */
  idempotencyHeader: string;
  /** Give every non-idempotent request without a key a generated one (default false). */
  autoIdempotencyKey: boolean;
  /** Default time budget of a call in seconds (null: none). */
  deadlineSeconds: number | null;
  /** Request headers whose first present value identifies the API key for lockouts. */
  lockoutKeyHeaders: readonly string[];
  /** Longest wait (seconds, default 300) for one `Retry-After` or pacer delay; a longer one throws `retry_after_too_long`. */
  maxRetryAfterSeconds: number;
  /** Longest lockout recorded (seconds, default 86400), whatever the boxed answer's `Retry-After`. */
  maxLockoutSeconds: number;
}

/** The defaults of the design's SDK guidelines. */
export const DEFAULT_POLICY: Readonly<RetryPolicy> = Object.freeze({
  baseSeconds: 0.5,
  capSeconds: 30,
  maxAttempts: 5,
  jitterRatio: 0.1,
  retryStatuses: [429, 503],
  tokenPaths: ["/v1/auth/token"],
  tokenMaxRetries: 2,
  idempotentMethods: IDEMPOTENT_METHODS,
  idempotencyHeader: "Idempotency-Key",
  autoIdempotencyKey: false,
  deadlineSeconds: null,
  lockoutKeyHeaders: ["X-Api-Key", "Authorization"],
  maxRetryAfterSeconds: 300,
  maxLockoutSeconds: 86400,
});

/** A full policy from the defaults and `changes`; throws on nonsense values. */
export function retryPolicy(changes: Partial<RetryPolicy> = {}): RetryPolicy {
  const p = { ...DEFAULT_POLICY, ...changes };
  if (!Number.isInteger(p.maxAttempts) || p.maxAttempts < 1) {
    throw new RangeError("maxAttempts must be an integer >= 1");
  }
  if (p.baseSeconds < 0 || p.capSeconds < 0 || p.jitterRatio < 0 || p.tokenMaxRetries < 0) {
    throw new RangeError("baseSeconds, capSeconds, jitterRatio and tokenMaxRetries must be >= 0");
  }
  if (!(p.maxRetryAfterSeconds >= 0) || !(p.maxLockoutSeconds >= 0)) {
    throw new RangeError("maxRetryAfterSeconds and maxLockoutSeconds must be >= 0");
  }
  return p;
}

/** API keys in the penalty box, until when (monotonic clock). Share one between clients of the same keys. */
export class LockoutRegistry {
  private readonly locked = new Map<string, { until: number; error: LockoutError }>();

  constructor(private readonly clock: Clock = systemClock) {}

  /** Locks `key` for `seconds` from now (a longer lock already held stays). */
  lock(key: string, seconds: number, error: LockoutError): void {
    const until = this.clock.monotonic() + seconds;
    const held = this.locked.get(key);
    if (held === undefined || held.until < until) this.locked.set(key, { until, error });
  }

  /** [seconds left, the boxed answer's error] while `key` is locked, else null. */
  remaining(key: string): [number, LockoutError] | null {
    const held = this.locked.get(key);
    if (held === undefined) return null;
    const left = held.until - this.clock.monotonic();
    if (left <= 0) {
      this.locked.delete(key);
      return null;
    }
    return [left, held.error];
  }
}

/** What the engine reads of a response. */
export interface ResponseView {
  status: number;
  header: HeaderGetter;
  /** The JSON body as an object, or null. */
  problem(): Promise<Record<string, unknown> | null>;
  /** False when the response came from another origin than the request's (a followed redirect); default true. */
  sameOrigin?: boolean;
}

/** What follows a response: return it, hand it to the 409 hook, or wait and send again. */
export type Step = { action: "done" } | { action: "conflict" } | { action: "wait"; seconds: number };

/** Shared state of one client. */
export interface EngineState {
  policy: RetryPolicy;
  clock: Clock;
  random: RandomSource;
  lockouts: LockoutRegistry;
  pacer: Pacer | null;
  newIdempotencyKey: () => string;
  /** Called with each response's parsed fields. */
  observe(info: RateLimitInfo | null): void;
}

/** Per-call options. */
export interface CallOptions {
  /** Seconds this call may take in all (else the policy's). */
  deadlineSeconds?: number | null;
  /** A key, or true to generate one. */
  idempotencyKey?: string | boolean;
  hasConflictHook: boolean;
  /** Points of the request, for the pacer (default 1). */
  cost?: number;
  /** Origin of the request URL: lockouts are kept per origin and API key (default ""). */
  origin?: string;
}

/** One request through the engine, over all its attempts. */
export class Call {
  attempts = 0;
  readonly retryable: boolean;
  readonly maxRetries: number;
  /** Origin and API key the lockouts of this call are kept under; null without an API key (never locked). */
  readonly lockoutKey: string | null;
  private readonly deadlineAt: number | null;

  /** Sets the Idempotency-Key in `headers` when asked for or generated. */
  constructor(
    private readonly engine: EngineState,
    method: string,
    path: string,
    headers: Headers,
    private readonly options: CallOptions,
  ) {
    const policy = engine.policy;
    const budget = options.deadlineSeconds ?? policy.deadlineSeconds;
    this.deadlineAt = budget === null ? null : engine.clock.monotonic() + budget;
    const apiKey = policy.lockoutKeyHeaders.map((h) => headers.get(h)).find((v) => v);
    this.lockoutKey = apiKey ? `${options.origin ?? ""} ${apiKey}` : null;
    const upper = method.toUpperCase();
    const mutating = !policy.idempotentMethods.includes(upper);
    const key = options.idempotencyKey;
    if (typeof key === "string") {
      headers.set(policy.idempotencyHeader, key);
    } else if ((key === true || (key === undefined && policy.autoIdempotencyKey)) && mutating &&
               !headers.get(policy.idempotencyHeader)) {
      headers.set(policy.idempotencyHeader, engine.newIdempotencyKey());
    }
    const isToken = policy.tokenPaths.includes(path);
    this.retryable = !mutating || isToken || Boolean(headers.get(policy.idempotencyHeader));
    this.maxRetries = isToken
      ? Math.min(policy.maxAttempts - 1, policy.tokenMaxRetries)
      : policy.maxAttempts - 1;
  }

  /** Seconds left before the deadline, or null without one. */
  remainingSeconds(): number | null {
    return this.deadlineAt === null ? null : this.deadlineAt - this.engine.clock.monotonic();
  }

  /**
   * Throws {@link LockoutError} while the key is boxed; else the seconds the
   * pacer asks to wait first. Throws {@link RateLimitError} instead of
   * waiting when that wait is above `maxRetryAfterSeconds` (or not finite:
   * `retry_after_too_long`) or would pass the deadline (`deadline`).
   */
  beforeAttempt(): number {
    const held = this.lockoutKey === null ? null : this.engine.lockouts.remaining(this.lockoutKey);
    if (held !== null) {
      const [left, boxed] = held;
      throw new LockoutError("lockout", { ...boxed, retryAfter: left, attempts: 0 });
    }
    const delay = this.engine.pacer?.delay(this.options.cost ?? 1) ?? 0;
    if (!(delay > 0)) return 0;
    const { policy, clock } = this.engine;
    const refuse = (reason: GiveUpReason): RateLimitError =>
      new RateLimitError(reason, {
        status: null, requestId: null, retryAfter: delay, problem: null, rateLimit: null,
        attempts: this.attempts, response: null,
      });
    if (!Number.isFinite(delay) || delay > policy.maxRetryAfterSeconds) throw refuse("retry_after_too_long");
    if (this.deadlineAt !== null && clock.monotonic() + delay > this.deadlineAt) throw refuse("deadline");
    return delay;
  }

  /** Decides what follows a response; throws {@link RateLimitError} when it goes back to the caller. */
  async afterResponse(resp: ResponseView, raw: Response | null): Promise<Step> {
    const { policy, clock, random } = this.engine;
    this.attempts += 1;
    const info = RateLimitInfo.fromHeaders(resp.header);
    this.engine.observe(info);
    const boxed = (resp.header("X-Penalty-Box-Status") ?? "").trim().toLowerCase() === "active-lockout";
    if (resp.status < 400 || (!policy.retryStatuses.includes(resp.status) && !boxed)) {
      return resp.status === 409 && this.options.hasConflictHook ? { action: "conflict" } : { action: "done" };
    }
    const retryAfter = retryAfterSeconds(resp.header, () => clock.wall());
    const fail = async (reason: GiveUpReason): Promise<RateLimitError> => {
      const problem = await resp.problem();
      const id = problem?.["request_id"];
      const details = {
        status: resp.status,
        requestId: typeof id === "string" ? id : resp.header("X-Request-Id"),
        retryAfter,
        problem,
        rateLimit: info,
        attempts: this.attempts,
        response: raw,
      };
      return reason === "lockout" ? new LockoutError(reason, details) : new RateLimitError(reason, details);
    };
    if (boxed) {
      const err = (await fail("lockout")) as LockoutError;
      if (retryAfter !== null && this.lockoutKey !== null && resp.sameOrigin !== false) {
        this.engine.lockouts.lock(this.lockoutKey, Math.min(retryAfter, policy.maxLockoutSeconds), err);
      }
      throw err;
    }
    if (!this.retryable) throw await fail("not_retryable");
    const retry = this.attempts - 1;
    if (retry >= this.maxRetries) throw await fail("attempts_exhausted");
    if (retryAfter !== null && !(retryAfter <= policy.maxRetryAfterSeconds)) throw await fail("retry_after_too_long");
    const backoff = uniform(random, 0, Math.min(policy.capSeconds, policy.baseSeconds * 2 ** Math.min(retry, 64)));
    let wait = Math.max(retryAfter ?? 0, backoff);
    wait += uniform(random, 0, policy.jitterRatio * wait);
    if (this.deadlineAt !== null && clock.monotonic() + wait > this.deadlineAt) throw await fail("deadline");
    return { action: "wait", seconds: wait };
  }
}
