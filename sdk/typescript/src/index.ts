/**
 * @rl/client: a `fetch` wrapper for APIs behind the rl gateway. Full-jitter
 * exponential backoff with `Retry-After` as a hard floor, penalty-box
 * lockouts, the token endpoint's retry limit, retries only for idempotent
 * requests or requests with an `Idempotency-Key`, a 409 hook, deadlines,
 * and the `RateLimit` / `RateLimit-Policy` fields with a pacer.
 */
export { systemClock, type Clock, type RandomSource } from "./clock.js";
export { RetryingFetch, type ConflictHook, type RetryingFetchOptions, type RetryingInit } from "./client.js";
export {
  Call,
  DEFAULT_POLICY,
  IDEMPOTENT_METHODS,
  LockoutRegistry,
  retryPolicy,
  type CallOptions,
  type EngineState,
  type ResponseView,
  type RetryPolicy,
  type Step,
} from "./engine.js";
export { LockoutError, RateLimitError, type GiveUpReason, type RateLimitErrorDetails } from "./errors.js";
export {
  policyRate,
  RateLimitInfo,
  retryAfterSeconds,
  type HeaderGetter,
  type QuotaPolicy,
  type RateLimitItem,
} from "./headers.js";
export { Pacer, type PacerOptions } from "./pacer.js";
