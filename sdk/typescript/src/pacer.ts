/**
 * Proactive pacing: slow a batch down before the bucket is empty, from the
 * `RateLimit` / `RateLimit-Policy` fields, instead of reacting to 429s.
 */
import { systemClock, type Clock } from "./clock.js";
import { policyRate, type RateLimitInfo } from "./headers.js";

/** Options of a {@link Pacer}. */
export interface PacerOptions {
  /** Share of the bucket's size kept in reserve (default 0.1). */
  reserveRatio?: number;
  /** The reserve's floor, in points (default 1). */
  minReserve?: number;
  clock?: Clock;
}

/**
 * Spaces requests once the binding bucket runs low. While the binding
 * `RateLimit` item's `r` stays above a reserve, requests go at once; below
 * it, the pacer waits until the refill (`q / w` of the binding policy) has
 * brought the bucket back to `reserve + cost`, counting the time since that
 * answer. The reserve is `reserveRatio` of the bucket's size (estimated as
 * `r + t * q / w`, or `q` without `t`), at least `minReserve`. Without a
 * policy rate it never waits. The client calls `observe` on each response;
 * `delay(cost)` is the wait before the next request.
 */
export class Pacer {
  readonly reserveRatio: number;
  readonly minReserve: number;
  private readonly clock: Clock;
  private info: RateLimitInfo | null = null;
  private seenAt = 0;

  constructor(options: PacerOptions = {}) {
    this.reserveRatio = options.reserveRatio ?? 0.1;
    this.minReserve = options.minReserve ?? 1;
    if (this.reserveRatio < 0 || this.minReserve < 0) {
      throw new RangeError("reserveRatio and minReserve must be >= 0");
    }
    this.clock = options.clock ?? systemClock;
  }

  /** Records the latest fields (null, or fields without a binding item, are ignored). */
  observe(info: RateLimitInfo | null): void {
    if (info === null || info.binding === null) return;
    this.info = info;
    this.seenAt = this.clock.monotonic();
  }

  /** Seconds to wait before a request costing `cost` points. */
  delay(cost = 1): number {
    const info = this.info;
    const item = info?.binding ?? null;
    if (info === null || item === null || item.remaining === null) return 0;
    const policy = info.policyOf(item);
    const rate = policy !== null ? policyRate(policy) : null;
    if (policy === null || rate === null || rate <= 0 || policy.quota === null) return 0;
    const size = item.reset !== null ? item.remaining + item.reset * rate : policy.quota;
    const reserve = Math.max(this.minReserve, this.reserveRatio * size);
    const short = reserve + cost - item.remaining;
    if (short <= 0) return 0;
    return Math.max(0, short / rate - (this.clock.monotonic() - this.seenAt));
  }

  /** Sleeps {@link delay}. */
  wait(cost = 1): Promise<void> {
    return this.clock.sleep(this.delay(cost));
  }
}
