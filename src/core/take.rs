//! `RL.TAKE`: several buckets charged all-or-nothing, behind the penalty
//! box of the first key.

use super::bucket::{self, Bucket, Rate};
use super::limits::MAX_BUCKETS;
use super::penalty::{ActiveBox, Penalty, PenaltyPolicy, Strike};
use super::reply::{boxed_reply, jittered, Reply, Status};
use super::time::Millis;

/// One `RL.TAKE` call, parsed: the buckets' rates (first key first, then
/// each `ALSO` in order), the cost and the options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakeRequest {
    /// One rate per key, at most [`MAX_BUCKETS`].
    pub rates: Vec<Rate>,
    /// Points the request spends; 0 is a probe.
    pub cost: u64,
    /// `STRIKES` and its companions, when given.
    pub penalty: Option<PenaltyPolicy>,
    /// `JITTER` percent, 0 to 100.
    pub jitter_percent: u8,
}

impl TakeRequest {
    /// A call of `cost` on buckets of these rates, with no options.
    pub fn new(rates: &[Rate], cost: u64) -> TakeRequest {
        TakeRequest {
            rates: rates.to_vec(),
            cost,
            penalty: None,
            jitter_percent: 0,
        }
    }
}

/// What a call changed, for the adapter to store and replicate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Bit `i` is set when bucket `i` changed: every bucket when the call
    /// was allowed with a cost > 0; on a throttled call, only a bucket
    /// that [`bucket::needs_rewrite`], rewritten with the same points spent
    /// at the new rate (so that it refills at that rate from now on).
    pub buckets_changed: u32,
    /// The first key's penalty state changed (a strike or a trip).
    pub penalty_changed: bool,
    /// The box this call tripped.
    pub tripped: Option<ActiveBox>,
}

/// Decide a call at `now` and apply it to `buckets` (one per rate, `None`
/// for a key that holds no bucket yet) and to the first key's `penalty`.
/// Nothing is changed unless [`Effects`] says so. `random` is a uniformly
/// random number, used only for `JITTER`.
pub fn take(
    buckets: &mut [Option<Bucket>],
    penalty: &mut Penalty,
    req: &TakeRequest,
    now: Millis,
    random: u64,
) -> (Reply, Effects) {
    let first_capacity = req.rates.first().map_or(0, |r| r.capacity);
    if let Some(active) = penalty.active_box(now) {
        return (
            boxed_reply(first_capacity, &active, now),
            Effects::default(),
        );
    }
    let n = req.rates.len().min(buckets.len()).min(MAX_BUCKETS);
    let mut debts = [0i128; MAX_BUCKETS];
    for ((debt, stored), rate) in debts.iter_mut().zip(buckets.iter()).zip(&req.rates) {
        *debt = bucket::debt(stored.as_ref(), rate, now);
    }
    let strikes_left = |p: &Penalty| {
        req.penalty
            .as_ref()
            .map_or(-1, |pol| to_i64(p.strikes_remaining(pol, now)))
    };

    // Throttled: the bucket that needs the longest wait binds.
    let mut binding = None;
    let mut longest = 0;
    for (i, (&debt, rate)) in debts[..n].iter().zip(&req.rates).enumerate() {
        let wait = if bucket::fits(debt, req.cost, rate) {
            0
        } else {
            bucket::wait_ms(debt, req.cost, rate).max(1)
        };
        if wait > longest {
            longest = wait;
            binding = Some(i);
        }
    }
    if let Some(i) = binding {
        let rate = &req.rates[i];
        let mut effects = Effects::default();
        if req.cost > 0 {
            effects.buckets_changed = rescale(buckets, &debts, req, now);
        }
        if let (Some(policy), true) = (req.penalty.as_ref(), req.cost > 0) {
            effects.penalty_changed = true;
            if let Strike::Tripped(active) = penalty.strike(policy, now) {
                effects.tripped = Some(active);
                return (boxed_reply(first_capacity, &active, now), effects);
            }
        }
        let reply = Reply {
            status: Status::Throttled,
            limit: to_i64(rate.capacity),
            remaining: bucket::remaining(debts[i], rate),
            reset_ms: reset_ms(buckets.get(i), now),
            retry_after_ms: jittered(longest, req.jitter_percent, random),
            box_level: 0,
            strikes_remaining: strikes_left(penalty),
            binding: i as i64,
        };
        return (reply, effects);
    }

    // Allowed: charge every bucket; the one with the fewest points left binds.
    let mut effects = Effects::default();
    if req.cost > 0 {
        for ((slot, debt), rate) in buckets.iter_mut().zip(&mut debts[..n]).zip(&req.rates) {
            let (charged, after) = bucket::charge(*debt, req.cost, rate, now);
            *slot = Some(charged);
            *debt = after;
        }
        effects.buckets_changed = (1u32 << n) - 1;
    }
    let mut binding = 0;
    let mut fewest = i64::MAX;
    for (i, (&debt, rate)) in debts[..n].iter().zip(&req.rates).enumerate() {
        let left = bucket::remaining(debt, rate);
        if left < fewest {
            fewest = left;
            binding = i;
        }
    }
    let reply = Reply {
        status: Status::Allowed,
        limit: to_i64(req.rates.get(binding).map_or(0, |r| r.capacity)),
        remaining: fewest.max(0),
        reset_ms: reset_ms(buckets.get(binding), now),
        retry_after_ms: 0,
        box_level: 0,
        strikes_remaining: strikes_left(penalty),
        binding: binding as i64,
    };
    (reply, effects)
}

/// Rewrite every stored bucket that [`bucket::needs_rewrite`] (changed
/// parameters, or more debt than an empty bucket), keeping its points
/// spent; returns the bit set of rewritten buckets.
fn rescale(buckets: &mut [Option<Bucket>], debts: &[i128], req: &TakeRequest, now: Millis) -> u32 {
    let mut changed = 0;
    let n = MAX_BUCKETS.min(debts.len());
    for (i, (slot, rate)) in buckets.iter_mut().zip(&req.rates).take(n).enumerate() {
        if let Some(b) = slot {
            if bucket::needs_rewrite(b, rate, now) {
                *slot = Some(bucket::charge(debts[i], 0, rate, now).0);
                changed |= 1 << i;
            }
        }
    }
    changed
}

/// Milliseconds until `bucket`, as stored after the call, is full again.
/// Read from the stored state rather than from the debt at this call's
/// rate: a probe writes nothing, so a bucket last written at other
/// parameters refills at those until a call rewrites it.
fn reset_ms(bucket: Option<&Option<Bucket>>, now: Millis) -> i64 {
    bucket
        .copied()
        .flatten()
        .map_or(0, |b| b.full_at_ms().saturating_sub(now).max(0))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::penalty::MANUAL;

    const NOW: Millis = 1_700_000_000_000;

    fn rate(capacity: u64, tokens: u64, period_ms: u64) -> Rate {
        Rate {
            capacity,
            tokens,
            period_ms,
        }
    }

    fn req(rates: &[Rate], cost: u64) -> TakeRequest {
        TakeRequest::new(rates, cost)
    }

    fn strikes(threshold: u64) -> Option<PenaltyPolicy> {
        Some(PenaltyPolicy {
            threshold,
            window_ms: 60_000,
            box_ms: [300_000, 3_600_000, 0],
            offenses_ttl_ms: 86_400_000,
        })
    }

    #[test]
    fn table_of_single_bucket_calls() {
        // (ms after start, cost, expected reply)
        let r = rate(10, 1, 1000);
        let rows: &[(i64, u64, [i64; 8])] = &[
            (0, 4, [1, 10, 6, 4000, 0, 0, -1, 0]),
            (0, 6, [1, 10, 0, 10000, 0, 0, -1, 0]),
            (0, 1, [0, 10, 0, 10000, 1000, 0, -1, 0]),
            (999, 1, [0, 10, 0, 9001, 1, 0, -1, 0]),
            (1000, 1, [1, 10, 0, 10000, 0, 0, -1, 0]),
            (1000, 0, [1, 10, 0, 10000, 0, 0, -1, 0]),
            (4000, 3, [1, 10, 0, 10000, 0, 0, -1, 0]),
            (24000, 0, [1, 10, 10, 0, 0, 0, -1, 0]),
        ];
        let mut buckets = [None];
        let mut penalty = Penalty::default();
        for (at, cost, expected) in rows {
            let (reply, _) = take(&mut buckets, &mut penalty, &req(&[r], *cost), NOW + at, 0);
            assert_eq!(reply.to_array(), *expected, "at +{at} ms, cost {cost}");
        }
    }

    #[test]
    fn all_or_nothing_across_buckets_and_the_stricter_binds() {
        let key = rate(100, 100, 60_000);
        let tenant = rate(10, 10, 60_000);
        let mut buckets = [None, None];
        let mut penalty = Penalty::default();
        let r = req(&[key, tenant], 6);
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        assert_eq!(reply.to_array(), [1, 10, 4, 36000, 0, 0, -1, 1]);
        assert_eq!(fx.buckets_changed, 0b11);
        let before = buckets;
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        assert_eq!(reply.to_array(), [0, 10, 4, 36000, 12000, 0, -1, 1]);
        assert_eq!(fx, Effects::default());
        assert_eq!(
            buckets, before,
            "a throttled call takes nothing from any bucket"
        );
    }

    #[test]
    fn strikes_then_box_then_status_minus_one() {
        let mut buckets = [None];
        let mut penalty = Penalty::default();
        let mut r = req(&[rate(1, 1, 60_000)], 1);
        r.penalty = strikes(2);
        let (reply, _) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        assert_eq!(reply.to_array(), [1, 1, 0, 60000, 0, 0, 2, 0]);
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 1, 0);
        assert_eq!(reply.to_array(), [0, 1, 0, 59999, 59999, 0, 1, 0]);
        assert!(fx.penalty_changed && fx.tripped.is_none());
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 2, 0);
        assert_eq!(reply.to_array(), [-1, 1, 0, 300000, 300000, 1, 0, 0]);
        assert_eq!(fx.tripped.map(|b| b.level), Some(1));
        // Boxed: nothing is read or charged, even when the bucket is full.
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 120_000, 0);
        assert_eq!(reply.to_array(), [-1, 1, 0, 180002, 180002, 1, 0, 0]);
        assert_eq!(fx, Effects::default());
    }

    #[test]
    fn a_manual_box_answers_minus_one() {
        let mut penalty = Penalty::default();
        penalty.trip(3, 0, NOW);
        assert_eq!(penalty.box_until, MANUAL);
        let (reply, _) = take(
            &mut [None],
            &mut penalty,
            &req(&[rate(5, 5, 1000)], 1),
            NOW,
            0,
        );
        assert_eq!(reply.to_array(), [-1, 5, 0, -1, -1, 3, 0, 0]);
    }

    #[test]
    fn a_probe_writes_nothing_and_counts_no_strike() {
        let mut buckets = [None];
        let mut penalty = Penalty::default();
        let mut r = req(&[rate(2, 1, 1000)], 2);
        r.penalty = strikes(1);
        take(&mut buckets, &mut penalty, &r, NOW, 0);
        r.cost = 0;
        let before = (buckets, penalty);
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        assert_eq!(reply.to_array(), [1, 2, 0, 2000, 0, 0, 1, 0]);
        assert_eq!(fx, Effects::default());
        assert_eq!((buckets, penalty), before);
    }

    #[test]
    fn jitter_stretches_the_wait_within_its_bound() {
        let mut buckets = [None];
        let mut penalty = Penalty::default();
        let mut r = req(&[rate(1, 1, 10_000)], 1);
        take(&mut buckets, &mut penalty, &r, NOW, 0);
        r.jitter_percent = 50;
        let (low, _) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        let (high, _) = take(&mut buckets, &mut penalty, &r, NOW, u64::MAX);
        assert_eq!(low.retry_after_ms, 10_000);
        assert_eq!(high.retry_after_ms, 15_000);
    }
}

#[cfg(test)]
mod clock_step_tests {
    use super::*;

    #[test]
    fn a_backward_step_caps_the_bucket_at_empty_and_it_refills_from_there() {
        let now = 1_700_000_000_000;
        let rate = Rate {
            capacity: 5,
            tokens: 5,
            period_ms: 10_000,
        };
        let mut buckets = [None];
        let mut penalty = Penalty::default();
        let mut req = TakeRequest {
            rates: vec![rate],
            cost: 5,
            penalty: None,
            jitter_percent: 0,
        };
        take(&mut buckets, &mut penalty, &req, now, 0);
        req.cost = 1;
        let back = now - 3_600_000;
        let (reply, fx) = take(&mut buckets, &mut penalty, &req, back, 0);
        assert_eq!(reply.to_array(), [0, 5, 0, 10_000, 2_000, 0, -1, 0]);
        assert_eq!(fx.buckets_changed, 1);
        req.cost = 5;
        let (reply, _) = take(&mut buckets, &mut penalty, &req, back + 10_000, 0);
        assert_eq!(reply.status, Status::Allowed);
    }
}
