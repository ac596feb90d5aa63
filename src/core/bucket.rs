//! A cost-weighted token bucket as a GCRA (generic cell rate algorithm),
//! exact in integers.
//!
//! Time inside a bucket is counted in *ticks* of `1/tokens` millisecond, so
//! one point refills in exactly `period_ms` ticks and the burst tolerance is
//! `capacity * period_ms` ticks: no division, no rounding, no drift. The
//! state is the theoretical arrival time (TAT): the instant at which the
//! bucket is full again. The *debt* of a bucket at `now` is `TAT - now` in
//! ticks (never below zero); a request of `cost` points fits when
//! `debt + cost * period_ms <= capacity * period_ms`.
//!
//! With every input inside [`crate::core::limits`], the largest product is
//! below 10^34, far inside `i128`; arithmetic is saturating anyway so that
//! corrupt stored bytes can never overflow.

use std::num::NonZeroU64;

use serde::{Deserialize, Serialize};

use super::limiter::Limiter;
use super::limits::MAX_DURATION_MS;
use super::part::{within_reach, Part};
use super::time::{ceil_div, clamp_i64, div_floor, rem_floor, Millis};

/// The stored state of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// Whole milliseconds of the TAT (the instant the bucket is full again).
    pub tat_ms: i64,
    /// Remainder of the TAT in ticks; invariant: `tat_frac < tokens`.
    pub tat_frac: u64,
    /// The `tokens` of the rate that last charged the bucket (the tick
    /// scale). Never zero, which also lets `Option<Bucket>` be as small as
    /// a bucket.
    pub tokens: NonZeroU64,
    /// The `period` in ms of the rate that last charged the bucket.
    pub period_ms: u64,
}

/// The parameters of one bucket in a call: `capacity` points, refilled at
/// `tokens` points per `period_ms` milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Burst size in points (>= 1).
    pub capacity: u64,
    /// Points refilled per period (>= 1).
    pub tokens: u64,
    /// Refill period in milliseconds (>= 1).
    pub period_ms: u64,
}

impl Rate {
    /// The burst tolerance in ticks.
    fn tolerance(&self) -> i128 {
        i128::from(self.capacity).saturating_mul(i128::from(self.period_ms))
    }

    /// Ticks that `cost` points take to refill.
    fn cost_ticks(&self, cost: u64) -> i128 {
        i128::from(cost).saturating_mul(i128::from(self.period_ms))
    }

    /// Milliseconds a bucket takes to refill from empty to full (rounded
    /// up, saturating): the longest a bucket's state can matter.
    pub fn fill_ms(&self) -> u64 {
        let ms = ceil_div(self.tolerance(), self.ticks_per_ms());
        u64::try_from(ms).unwrap_or(u64::MAX)
    }

    /// Ticks per millisecond.
    fn ticks_per_ms(&self) -> i128 {
        i128::from(self.tokens.max(1))
    }
}

impl Bucket {
    /// Whether `tat_frac < tokens` and the scale is non-zero: what a decoded
    /// bucket must satisfy.
    pub fn is_valid(&self) -> bool {
        self.period_ms >= 1 && self.tat_frac < self.tokens.get()
    }

    /// The first millisecond at which the bucket is full again.
    pub fn full_at_ms(&self) -> i64 {
        if self.tat_frac > 0 {
            self.tat_ms.saturating_add(1)
        } else {
            self.tat_ms
        }
    }
}

/// A bucket matters until it is full again.
impl Part for Bucket {
    fn is_valid(&self) -> bool {
        Bucket::is_valid(self)
    }

    fn retain(&mut self, now: Millis) -> Option<Millis> {
        (self.full_at_ms() > now).then(|| self.full_at_ms())
    }

    fn is_plausible(&self, now: Millis) -> bool {
        within_reach(self.full_at_ms(), now)
    }
}

/// The debt of `bucket` at `now`, in ticks of `rate` (0 for a missing or
/// full bucket). When the stored scale differs from `rate` (the caller
/// changed the parameters), the points already spent are kept and the
/// result is rounded up, so a change never grants a fraction of a point
/// (the converted debt is capped at an empty bucket plus the longest
/// duration, [`MAX_DURATION_MS`], of refill). A debt can exceed an empty
/// bucket: after a lowered capacity, a `DELAY` reservation, or a backward
/// step of the clock (the bucket then refills only as the clock passes
/// again the time it had reached: a step back never grants points).
pub fn debt(bucket: Option<&Bucket>, rate: &Rate, now: i64) -> i128 {
    let Some(b) = bucket else { return 0 };
    let stored = stored_ticks(b, now);
    if stored <= 0 {
        return 0;
    }
    if b.period_ms == rate.period_ms {
        // One point is `period_ms` ticks whatever the tick size: spent
        // points are the same number of ticks.
        return stored;
    }
    let cap = max_debt(rate);
    mul_div_ceil(
        stored,
        i128::from(rate.period_ms),
        i128::from(b.period_ms.max(1)),
    )
    .min(cap)
}

/// Whether the stored `bucket` was written with another tokens/period than
/// `rate`: its ticks are converted on every read, and a call that charges
/// nothing (a throttled one) must rewrite it so that it refills at the new
/// rate from then on and `retry_after_ms` stays true.
pub fn needs_rewrite(bucket: &Bucket, rate: &Rate) -> bool {
    bucket.tokens.get() != rate.tokens || bucket.period_ms != rate.period_ms
}

/// `TAT - now` of `b` in its own ticks (negative once it is full).
fn stored_ticks(b: &Bucket, now: i64) -> i128 {
    (i128::from(b.tat_ms) - i128::from(now))
        .saturating_mul(i128::from(b.tokens.get()))
        .saturating_add(i128::from(b.tat_frac))
}

/// Milliseconds until `cost` points fit at `rate` in bucket `b` stored at
/// other parameters, if it keeps refilling at its stored speed (no call
/// rewrites it): until its debt, converted as [`debt`] does, leaves room
/// for `cost` (0 when it does now, or when `cost` is above the capacity).
fn stored_wait_ms(b: &Bucket, cost: u64, rate: &Rate, now: i64) -> i64 {
    let stored = stored_ticks(b, now);
    let room = rate.tolerance().saturating_sub(rate.cost_ticks(cost));
    if room < 0 {
        return 0;
    }
    // The most stored ticks that convert to at most `room`: `ceil(x * m /
    // d) <= room` exactly when `x * m <= room * d`.
    let most = div_floor(
        room.saturating_mul(i128::from(b.period_ms.max(1))),
        i128::from(rate.period_ms.max(1)),
    );
    if stored <= most {
        0
    } else {
        clamp_i64(ceil_div(stored - most, i128::from(b.tokens.get())))
    }
}

/// `ceil(a * m / d)` for `a >= 0`, `m >= 0`, `d >= 1`, saturating.
fn mul_div_ceil(a: i128, m: i128, d: i128) -> i128 {
    let whole = div_floor(a, d).saturating_mul(m);
    let part = ceil_div(rem_floor(a, d).saturating_mul(m), d);
    whole.saturating_add(part)
}

/// Whether `cost` points fit in a bucket with this `debt`.
pub fn fits(debt: i128, cost: u64, rate: &Rate) -> bool {
    debt.saturating_add(rate.cost_ticks(cost)) <= rate.tolerance()
}

/// Milliseconds until `cost` points fit (0 when they fit now). Exact: at
/// `now + wait` they fit, at `now + wait - 1` they do not.
pub fn wait_ms(debt: i128, cost: u64, rate: &Rate) -> i64 {
    let excess = debt
        .saturating_add(rate.cost_ticks(cost))
        .saturating_sub(rate.tolerance());
    if excess <= 0 {
        0
    } else {
        clamp_i64(ceil_div(excess, rate.ticks_per_ms()))
    }
}

/// Whole points left in a bucket with this `debt`.
pub fn remaining(debt: i128, rate: &Rate) -> i64 {
    balance(debt, rate).max(0)
}

/// Whole points left in a bucket with this `debt`, negative (rounded
/// towards more debt) beyond empty.
pub fn balance(debt: i128, rate: &Rate) -> i64 {
    let room = rate.tolerance().saturating_sub(debt);
    clamp_i64(div_floor(room, i128::from(rate.period_ms.max(1))))
}

/// The largest debt a bucket holds: empty plus [`MAX_DURATION_MS`] of
/// refill (a `DEBT` charge beyond it is capped there).
pub fn max_debt(rate: &Rate) -> i128 {
    rate.tolerance()
        .saturating_add(i128::from(MAX_DURATION_MS).saturating_mul(rate.ticks_per_ms()))
}

/// Milliseconds until a bucket with this `debt` is full.
pub fn reset_ms(debt: i128, rate: &Rate) -> i64 {
    clamp_i64(ceil_div(debt.max(0), rate.ticks_per_ms()))
}

/// The tick scale of a rate of `tokens` points per period (at least 1).
pub fn tick_scale(tokens: u64) -> NonZeroU64 {
    NonZeroU64::new(tokens).unwrap_or(NonZeroU64::MIN)
}

/// The bucket of a redis-cell value: its theoretical arrival time in
/// nanoseconds since the epoch, rounded up to a tick of `rate` (so the
/// conversion never grants a fraction of a point).
pub fn from_tat_ns(tat_ns: i64, rate: &Rate) -> Bucket {
    let ticks = ceil_div(
        i128::from(tat_ns).saturating_mul(rate.ticks_per_ms()),
        1_000_000,
    );
    let per_ms = rate.ticks_per_ms();
    Bucket {
        tat_ms: clamp_i64(div_floor(ticks, per_ms)),
        tat_frac: u64::try_from(rem_floor(ticks, per_ms)).unwrap_or(0),
        tokens: tick_scale(rate.tokens),
        period_ms: rate.period_ms.max(1),
    }
}

/// A bucket is a [`Limiter`] whose reading at `now` is its debt in ticks.
impl Limiter for Rate {
    type State = Bucket;
    type Seen = i128;

    fn limit(&self) -> u64 {
        self.capacity
    }

    fn see(&self, state: Option<&Bucket>, now: Millis) -> i128 {
        debt(state, self, now)
    }

    fn fits(&self, debt: &i128, cost: u64) -> bool {
        fits(*debt, cost, self)
    }

    /// A bucket stored at another rate is left so only by a probe (a call
    /// with a cost above 0 rewrites it first): it refills at its stored
    /// speed until a call rewrites it, and at this rate after. The wait is
    /// the later of the two, so it is never early either way.
    fn wait_ms(&self, state: Option<&Bucket>, debt: &i128, cost: u64, now: Millis) -> i64 {
        let wait = wait_ms(*debt, cost, self);
        match state {
            Some(b) if needs_rewrite(b, self) => wait.max(stored_wait_ms(b, cost, self, now)),
            _ => wait,
        }
    }

    fn balance(&self, debt: &i128) -> i64 {
        balance(*debt, self)
    }

    fn refund(&self, state: &mut Bucket, debt: &i128, points: u64, now: Millis) -> i128 {
        let left = debt.saturating_sub(self.cost_ticks(points)).max(0);
        let (bucket, left) = charge(left, 0, self, now);
        *state = bucket;
        left
    }

    /// Read from the stored state. One stored at other parameters (left
    /// so by a probe) refills at its stored speed until a call rewrites it,
    /// and at this rate after: the later of the two, as for the wait.
    fn reset_ms(&self, state: Option<&Bucket>, debt: &i128, now: Millis) -> i64 {
        let Some(b) = state else { return 0 };
        let stored = b.full_at_ms().saturating_sub(now).max(0);
        if needs_rewrite(b, self) {
            stored.max(reset_ms(*debt, self))
        } else {
            stored
        }
    }

    /// A charge beyond empty (`DELAY`, `DEBT`) is capped at [`max_debt`].
    fn charge(&self, state: &mut Option<Bucket>, debt: &i128, cost: u64, now: Millis) -> i128 {
        let capped = debt
            .min(&max_debt(self))
            .saturating_add(self.cost_ticks(cost));
        let (bucket, debt) = charge(capped.min(max_debt(self)), 0, self, now);
        *state = Some(bucket);
        debt
    }

    fn rewrite(&self, state: &mut Bucket, debt: &i128, now: Millis) -> bool {
        let stale = needs_rewrite(state, self);
        if stale {
            *state = charge(*debt, 0, self, now).0;
        }
        stale
    }
}

/// The state after charging `cost` points to a bucket with this `debt` at
/// `now`, and the new debt.
pub fn charge(debt: i128, cost: u64, rate: &Rate, now: i64) -> (Bucket, i128) {
    let new_debt = debt.saturating_add(rate.cost_ticks(cost));
    let ticks = rate.ticks_per_ms();
    let tat = i128::from(now)
        .saturating_mul(ticks)
        .saturating_add(new_debt);
    let bucket = Bucket {
        tat_ms: clamp_i64(div_floor(tat, ticks)),
        // Below `tokens`, which is a u64.
        tat_frac: u64::try_from(rem_floor(tat, ticks)).unwrap_or(0),
        tokens: tick_scale(rate.tokens),
        period_ms: rate.period_ms.max(1),
    };
    (bucket, new_debt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testkit::{rate_of as rate, T0 as NOW};

    #[test]
    fn a_new_bucket_is_full() {
        let r = rate(10, 10, 1000);
        let d = debt(None, &r, NOW);
        assert_eq!(d, 0);
        assert_eq!(remaining(d, &r), 10);
        assert_eq!(reset_ms(d, &r), 0);
        assert!(fits(d, 10, &r));
        assert!(!fits(d, 11, &r));
    }

    #[test]
    fn three_per_second_refills_exactly_after_one_second() {
        let r = rate(3, 3, 1000);
        let (b, d) = charge(0, 3, &r, NOW);
        assert_eq!(remaining(d, &r), 0);
        assert_eq!(reset_ms(d, &r), 1000);
        assert_eq!(wait_ms(d, 1, &r), 334); // one point every 333.33 ms
        let d = debt(Some(&b), &r, NOW + 333);
        assert!(!fits(d, 1, &r));
        let d = debt(Some(&b), &r, NOW + 334);
        assert!(fits(d, 1, &r));
        let d = debt(Some(&b), &r, NOW + 1000);
        assert_eq!(d, 0);
        assert_eq!(remaining(d, &r), 3);
    }

    #[test]
    fn growth_tier_cost_ten() {
        let r = rate(3000, 3000, 60_000);
        let (b, d) = charge(0, 10, &r, NOW);
        assert_eq!(remaining(d, &r), 2990);
        assert_eq!(reset_ms(d, &r), 200);
        assert_eq!(b.full_at_ms(), NOW + 200);
    }

    #[test]
    fn a_backward_clock_step_grants_nothing() {
        let r = rate(5, 1, 1000);
        let (b, _) = charge(0, 5, &r, NOW);
        let later = debt(Some(&b), &r, NOW + 500);
        let earlier = debt(Some(&b), &r, NOW - 3_600_000);
        assert!(earlier > later);
        assert_eq!(remaining(earlier, &r), 0);
    }

    #[test]
    fn a_tier_upgrade_keeps_the_points_spent() {
        let growth = rate(3000, 3000, 60_000);
        let (b, _) = charge(0, 100, &growth, NOW);
        let enterprise = rate(6000, 6000, 60_000);
        let d = debt(Some(&b), &enterprise, NOW);
        assert_eq!(remaining(d, &enterprise), 5900);
        // Same budget expressed per second instead of per minute.
        let per_second = rate(3000, 50, 1000);
        let d = debt(Some(&b), &per_second, NOW);
        assert_eq!(remaining(d, &per_second), 2900);
        assert_eq!(reset_ms(d, &per_second), 2000);
    }

    #[test]
    fn a_redis_cell_tat_converts_without_granting_a_fraction() {
        let r = rate(16, 30, 60_000); // one point every 2 s
        let b = from_tat_ns(1_700_000_001_500_000_001, &r);
        assert!(b.is_valid());
        assert_eq!(
            b.full_at_ms(),
            1_700_000_001_501,
            "rounded up, never earlier"
        );
        let d = debt(Some(&b), &r, 1_700_000_000_000);
        assert_eq!(remaining(d, &r), 15, "1.5 s of debt: one point spent");
        assert_eq!(from_tat_ns(0, &r).tat_ms, 0);
    }

    #[test]
    fn extreme_inputs_do_not_overflow() {
        use crate::core::limits::{MAX_DURATION_MS, MAX_POINTS};
        let r = rate(MAX_POINTS, 1, MAX_DURATION_MS);
        let (b, d) = charge(0, MAX_POINTS, &r, i64::MAX - 1);
        assert!(fits(0, MAX_POINTS, &r));
        assert_eq!(remaining(d, &r), 0);
        assert!(wait_ms(d, MAX_POINTS, &r) > 0);
        let _ = debt(Some(&b), &rate(1, MAX_POINTS, 1), i64::MIN);
    }
}
