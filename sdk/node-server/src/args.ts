/**
 * Argument formatting shared by every command: rl's integer and duration
 * grammars (plain digits; seconds with at most 3 decimals), checked here
 * so that a bad option fails in the application with its name, before any
 * round trip.
 */

/** A bad option or argument, named in the message. */
export class RlConfigError extends Error {
  override name = "RlConfigError";
}

/** An integer argument in `[min, max]`, as digits. */
export function int(name: string, v: unknown, min = 0, max = 1e15): string {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max) {
    throw new RlConfigError(`${name} must be an integer from ${min} to ${max}, got ${String(v)}`);
  }
  return String(v);
}

/** A duration in seconds (> 0, or >= 0 with `zero`), at most 3 decimals. */
export function seconds(name: string, v: unknown, zero = false): string {
  const ms = typeof v === "number" ? Math.round(v * 1000) : NaN;
  if (typeof v !== "number" || !Number.isFinite(v) || Math.abs(v * 1000 - ms) > 1e-6
      || ms < (zero ? 0 : 1) || ms > 3153600000 * 1000) {
    throw new RlConfigError(
      `${name} must be seconds ${zero ? ">= 0" : "> 0"} up to 3153600000 with at most 3 decimals, got ${String(v)}`);
  }
  const whole = Math.floor(ms / 1000);
  const frac = ms % 1000;
  return frac === 0 ? String(whole) : `${whole}.${String(frac).padStart(3, "0")}`;
}

/** A key: a non-empty string. */
export function key(name: string, v: unknown): string {
  if (typeof v !== "string" || v.length === 0) {
    throw new RlConfigError(`${name} must be a non-empty string, got ${String(v)}`);
  }
  return v;
}
