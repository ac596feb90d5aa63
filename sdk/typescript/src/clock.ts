/** The time and randomness the retry logic uses, injectable for tests. */

/** Where the SDK reads time (in seconds) and how it waits. */
export interface Clock {
  /** Seconds on a clock that never goes back (deadlines, lockouts, pacing). */
  monotonic(): number;
  /** Unix time in seconds; used only for an HTTP-date `Retry-After` on a response without `Date`. */
  wall(): number;
  /** Resolves after `seconds`; rejects with `signal.reason` when `signal` is (or gets) aborted first. */
  sleep(seconds: number, signal?: AbortSignal): Promise<void>;
}

/** A number in [0, 1), as `Math.random`. */
export type RandomSource = () => number;

/** The longest delay `setTimeout` keeps (a longer one fires after 1 ms). */
const MAX_TIMEOUT_MS = 2 ** 31 - 1;

/** Sleeps in `setTimeout` chunks of at most {@link MAX_TIMEOUT_MS}, so long waits are not cut short. */
function sleepFor(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    if (!(seconds > 0)) {
      resolve();
      return;
    }
    let left = seconds * 1000;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const step = (): void => {
      if (left <= 0) {
        signal?.removeEventListener("abort", onAbort);
        resolve();
        return;
      }
      const chunk = Math.min(left, MAX_TIMEOUT_MS);
      left -= chunk;
      timer = setTimeout(step, chunk);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    step();
  });
}

/** The real clock: `performance.now()`, `Date.now()` and `setTimeout` (in chunks, abortable). */
export const systemClock: Clock = {
  monotonic: () => performance.now() / 1000,
  wall: () => Date.now() / 1000,
  sleep: sleepFor,
};

/** `uniform(a, b)` from a random source. */
export function uniform(random: RandomSource, a: number, b: number): number {
  return a + random() * (b - a);
}
