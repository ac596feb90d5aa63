/** Errors the SDK throws when it gives a throttled request back to the caller. */
import type { RateLimitInfo } from "./headers.js";

/** Why the SDK stopped retrying. */
export type GiveUpReason =
  /** not idempotent and no Idempotency-Key */
  | "not_retryable"
  /** maxAttempts (or the token endpoint's 2 retries) used */
  | "attempts_exhausted"
  /** the next wait would pass the caller's deadline */
  | "deadline"
  /** `X-Penalty-Box-Status: Active-Lockout` */
  | "lockout"
  /** the `Retry-After` (or the pacer's delay) is above `maxRetryAfterSeconds`, or not finite */
  | "retry_after_too_long";

/** What a {@link RateLimitError} carries. */
export interface RateLimitErrorDetails {
  status: number | null;
  /** The problem body's `request_id`, else the `X-Request-Id` header. */
  requestId: string | null;
  /** Seconds, or null. */
  retryAfter: number | null;
  /** The `application/problem+json` body, or null. */
  problem: Record<string, unknown> | null;
  rateLimit: RateLimitInfo | null;
  /** Requests sent for this call. */
  attempts: number;
  /** The last attempt's response (its body is unread, but may be read once). */
  response: Response | null;
}

/**
 * A throttled answer (429, or another status of `RetryPolicy.retryStatuses`
 * such as the gateway's fail-closed 503) that the SDK did not retry, or no
 * longer retries.
 */
export class RateLimitError extends Error implements RateLimitErrorDetails {
  status: number | null;
  requestId: string | null;
  retryAfter: number | null;
  problem: Record<string, unknown> | null;
  rateLimit: RateLimitInfo | null;
  attempts: number;
  response: Response | null;

  constructor(
    readonly reason: GiveUpReason,
    d: RateLimitErrorDetails,
  ) {
    const wait = d.retryAfter !== null ? `, retry after ${d.retryAfter} s` : "";
    super(`${reason}: HTTP ${d.status} after ${d.attempts} attempt(s)${wait} (request_id ${d.requestId})`);
    this.name = new.target.name;
    this.status = d.status;
    this.requestId = d.requestId;
    this.retryAfter = d.retryAfter;
    this.problem = d.problem;
    this.rateLimit = d.rateLimit;
    this.attempts = d.attempts;
    this.response = d.response;
  }
}

/**
 * The API key is in the penalty box (`X-Penalty-Box-Status: Active-Lockout`).
 * Thrown on the boxed answer itself, then before any request with the same
 * key is sent until its `Retry-After` has passed (those have `attempts` 0,
 * the boxed answer's details, and `retryAfter` = the time left).
 */
export class LockoutError extends RateLimitError {}
