/** The time and randomness the retry logic uses, injectable for tests. */

/** Where the SDK reads time (in seconds) and how it waits. */
export interface Clock {
  /** Seconds on a clock that never goes back (deadlines, lockouts, pacing). */
  monotonic(): number;
  /** Unix time in seconds; used only for an HTTP-date `Retry-After` on a response without `Date`. */
  wall(): number;
  /** Resolves after `seconds`. */
  sleep(seconds: number): Promise<void>;
}

/** A number in [0, 1), as `Math.random`. */
export type RandomSource = () => number;

/** The real clock: `performance.now()`, `Date.now()` and `setTimeout`. */
export const systemClock: Clock = {
  monotonic: () => performance.now() / 1000,
  wall: () => Date.now() / 1000,
  sleep: (seconds) =>
    seconds > 0 ? new Promise((resolve) => setTimeout(resolve, seconds * 1000)) : Promise.resolve(),
};

/** `uniform(a, b)` from a random source. */
export function uniform(random: RandomSource, a: number, b: number): number {
  return a + random() * (b - a);
}
