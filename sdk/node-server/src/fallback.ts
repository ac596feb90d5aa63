/**
 * The local limiter used while Redis fails on rules that say `local`: a
 * token bucket per key in this process (GCRA, as rl's own), at a fraction
 * of the rule's budget (every process has its own: N processes admit up
 * to N times it). Bounded: past `maxEntries` keys the oldest is dropped.
 */
export class LocalLimiter {
  private readonly tat = new Map<string, number>();

  constructor(readonly maxEntries = 10000, private readonly now: () => number = Date.now) {}

  /** Takes `cost` from the bucket `key` (`burst` points, `rate` per `periodMs`): allowed, remaining, ms to wait, ms to full. */
  take(key: string, rate: number, burst: number, periodMs: number, cost: number):
    { allowed: boolean; remaining: number; retryMs: number; resetMs: number } {
    const now = this.now();
    const interval = periodMs / rate;
    const tat = Math.max(this.tat.get(key) ?? now, now);
    const newTat = tat + cost * interval;
    const allowAt = newTat - burst * interval;
    if (allowAt > now) {
      return { allowed: false, remaining: Math.max(0, Math.floor((burst * interval - (tat - now)) / interval)),
        retryMs: Math.ceil(allowAt - now), resetMs: Math.ceil(tat - now) };
    }
    this.tat.delete(key);
    this.tat.set(key, newTat);
    if (this.tat.size > this.maxEntries) this.tat.delete(this.tat.keys().next().value!);
    return { allowed: true, remaining: Math.floor((burst * interval - (newTat - now)) / interval),
      retryMs: 0, resetMs: Math.ceil(newTat - now) };
  }
}
