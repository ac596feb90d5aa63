/**
 * Time budgets of Redis calls without a timer per call. The calls given
 * the same budget (the same number of ms) reach their deadlines in the
 * order they started, so one queue and one timer, armed for the oldest
 * call still pending, serve them all: a call costs a queue entry instead
 * of a timer set and cleared, and a promise instead of a race of three.
 * The timer is kept when no call is pending (then it does not keep the
 * process alive), so that a server answering one request at a time does
 * not set and clear a timer per request either.
 */

/** Raised when Redis does not answer within the budget. */
export class RlUnavailableError extends Error {
  override name = "RlUnavailableError";
}

interface Pending {
  /** performance.now() at which the call fails (a monotonic clock: a step of the wall clock moves no deadline). */
  end: number;
  /** Fails the call; let go once it has settled (it holds the caller's state). */
  reject: ((e: Error) => void) | undefined;
  /** Settled (answered, failed or timed out): nothing left to do. */
  done: boolean;
}

/** The calls of one budget, oldest first. */
export class Budget {
  private readonly queue: Pending[] = [];
  /** Index of the oldest entry still in `queue` (the ones before it are gone). */
  private first = 0;
  private timer: ReturnType<typeof setTimeout> | undefined;
  /** The timer keeps the process alive (a call is pending). */
  private held = false;

  constructor(readonly ms: number) {}

  /**
   * `then` of what `p` gives (a throw of `then` rejects), `p`'s error, or
   * an RlUnavailableError once `ms` ms have passed, whichever comes first.
   */
  run<T, R>(p: Promise<T>, then: (value: T) => R): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      const entry: Pending = { end: performance.now() + this.ms, reject, done: false };
      this.queue.push(entry);
      if (this.timer === undefined) {
        this.timer = setTimeout(this.expire, this.ms);
        this.held = true;
      } else if (!this.held) {
        this.timer.ref();
        this.held = true;
      }
      p.then((value) => {
        if (entry.done) return;
        entry.done = true;
        entry.reject = undefined;
        this.drop();
        try {
          resolve(then(value));
        } catch (e) {
          reject(e);
        }
      }, (e: unknown) => {
        if (entry.done) return;
        entry.done = true;
        entry.reject = undefined;
        this.drop();
        reject(e);
      });
    });
  }

  /** Removes the settled calls at the front; once none is pending, the timer no longer keeps the process alive. */
  private drop(): void {
    const q = this.queue;
    while (this.first < q.length && q[this.first]!.done) this.first++;
    if (this.first === q.length) {
      q.length = 0;
      this.first = 0;
      if (this.held) {
        this.timer?.unref();
        this.held = false;
      }
    } else if (this.first >= 64 && this.first * 2 >= q.length) {
      // the pending calls (the fewer half) move to the front
      q.splice(0, this.first);
      this.first = 0;
    }
  }

  /** The timer: fails the calls past their deadline, then waits for the next one's (none pending: no timer). */
  private readonly expire = (): void => {
    this.timer = undefined;
    this.held = false;
    const now = performance.now();
    const q = this.queue;
    while (this.first < q.length && (q[this.first]!.done || q[this.first]!.end <= now)) {
      const e = q[this.first++]!;
      if (!e.done) {
        const reject = e.reject!;
        e.done = true;
        e.reject = undefined;
        reject(new RlUnavailableError(`Redis did not answer within ${this.ms} ms`));
      }
    }
    this.drop();
    if (this.first < q.length) {
      this.timer = setTimeout(this.expire, Math.max(q[this.first]!.end - now, 1));
      this.held = true;
    }
  };
}

// one budget per number of ms: the values come from configuration (a few)
const budgets = new Map<number, Budget>();

/** The shared budget of `ms` ms. */
export function budget(ms: number): Budget {
  let b = budgets.get(ms);
  if (b === undefined) {
    b = new Budget(ms);
    budgets.set(ms, b);
  }
  return b;
}

const same = <T>(v: T): T => v;

/** `p`, or an RlUnavailableError after `ms` ms. */
export function withTimeout<T>(p: Promise<T>, ms: number): Promise<T> {
  return budget(ms).run(p, same);
}
