//! The decision shared by the limiter commands: several keys charged
//! all-or-nothing, behind the penalty box of the first key. `RL.TAKE` is
//! this decision on token buckets.

use arrayvec::ArrayVec;

use super::bucket::{Bucket, Rate};
use super::limiter::Limiter;
use super::limits::MAX_BUCKETS;
use super::penalty::{ActiveBox, Penalty, PenaltyPolicy, Strike};
use super::reply::{boxed_reply, jittered, Reply, Status};
use super::time::Millis;

/// One call of a limiter command, parsed: one limiter per key (first key
/// first, then each `ALSO` in order), the cost and the options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request<L> {
    /// One limiter per key, at most [`MAX_BUCKETS`] (a fixed array: a
    /// call allocates nothing).
    pub limits: Limits<L>,
    /// Points the request spends; 0 is a probe.
    pub cost: u64,
    /// `STRIKES` and its companions, when given.
    pub penalty: Option<PenaltyPolicy>,
    /// `JITTER` percent, 0 to 100.
    pub jitter_percent: u8,
    /// `DELAY max_wait` in ms (`RL.TAKE` only): a request that would fit
    /// within this wait is admitted later instead of throttled, its points
    /// reserved now (the keys go into debt beyond their limit).
    pub delay_ms: Option<u64>,
}

/// The limiters of one call, first key first.
pub type Limits<L> = ArrayVec<L, MAX_BUCKETS>;

/// An `RL.TAKE` call: buckets.
pub type TakeRequest = Request<Rate>;

impl<L: Clone> Request<L> {
    /// A call of `cost` on keys with these limiters (the first
    /// [`MAX_BUCKETS`]), with no options.
    pub fn new(limits: &[L], cost: u64) -> Request<L> {
        Request {
            limits: limits.iter().take(MAX_BUCKETS).cloned().collect(),
            cost,
            penalty: None,
            jitter_percent: 0,
            delay_ms: None,
        }
    }
}

/// What a call changed, for the adapter to store and replicate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Bit `i` is set when key `i`'s limiter state changed: every key when
    /// the call was allowed with a cost > 0; on a throttled call, only a
    /// state that needed a [`Limiter::rewrite`] (a bucket rewritten with
    /// the same points spent at its new rate, say).
    pub states_changed: u32,
    /// The first key's penalty state changed (a strike or a trip).
    pub penalty_changed: bool,
    /// The box this call tripped.
    pub tripped: Option<ActiveBox>,
}

/// `RL.TAKE`: [`decide`] on buckets.
pub fn take(
    buckets: &mut [Option<Bucket>],
    penalty: &mut Penalty,
    req: &TakeRequest,
    now: Millis,
    random: u64,
) -> (Reply, Effects) {
    decide(buckets, penalty, req, now, random)
}

/// Decide a call at `now` and apply it to `states` (one per limiter,
/// `None` for a key that holds none yet) and to the first key's `penalty`:
/// the call is allowed only if every key admits `cost`, and then `cost` is
/// taken from every key; otherwise nothing is taken, and with `STRIKES` a
/// strike is counted. An active box on the first key answers at once.
/// Nothing is changed unless [`Effects`] says so. `random` is a uniformly
/// random number, used only for `JITTER`.
pub fn decide<L: Limiter>(
    states: &mut [Option<L::State>],
    penalty: &mut Penalty,
    req: &Request<L>,
    now: Millis,
    random: u64,
) -> (Reply, Effects) {
    let first_limit = req.limits.first().map_or(0, |l| l.limit());
    if let Some(active) = penalty.active_box(now) {
        return (boxed_reply(first_limit, &active, now), Effects::default());
    }
    let n = req.limits.len().min(states.len()).min(MAX_BUCKETS);
    let limits = &req.limits[..n];
    let mut seen = [L::Seen::default(); MAX_BUCKETS];
    for ((slot, state), limit) in seen.iter_mut().zip(states.iter()).zip(limits) {
        *slot = limit.see(state.as_ref(), now);
    }
    let strikes_left = |p: &Penalty| {
        req.penalty
            .as_ref()
            .map_or(-1, |pol| to_i64(p.strikes_remaining(pol, now)))
    };

    // Throttled: the key that needs the longest wait binds.
    let mut binding = None;
    let mut longest = 0;
    for (i, ((seen, state), limit)) in seen.iter().zip(states.iter()).zip(limits).enumerate() {
        let wait = if limit.fits(seen, req.cost) {
            0
        } else {
            limit.wait_ms(state.as_ref(), seen, req.cost, now).max(1)
        };
        if wait > longest {
            longest = wait;
            binding = Some(i);
        }
    }
    if let Some(i) = binding {
        if req.cost > 0 && req.delay_ms.is_some_and(|max| longest <= to_i64(max)) {
            return reserve(
                states,
                &mut seen,
                req,
                i,
                longest,
                now,
                strikes_left(penalty),
            );
        }
        let mut effects = Effects::default();
        if req.cost > 0 {
            effects.states_changed = rewrite(&mut states[..n], &seen, limits, now);
        }
        if let (Some(policy), true) = (req.penalty.as_ref(), req.cost > 0) {
            effects.penalty_changed = true;
            if let Strike::Tripped(active) = penalty.strike(policy, now) {
                effects.tripped = Some(active);
                return (boxed_reply(first_limit, &active, now), effects);
            }
        }
        let limit = &limits[i];
        let reply = Reply {
            status: Status::Throttled,
            limit: to_i64(limit.limit()),
            remaining: limit.remaining(&seen[i]),
            reset_ms: limit.reset_ms(states[i].as_ref(), now),
            retry_after_ms: jittered(longest, req.jitter_percent, random),
            box_level: 0,
            strikes_remaining: strikes_left(penalty),
            binding: i as i64,
        };
        return (reply, effects);
    }

    // Allowed: charge every key; the one with the fewest points left binds.
    let mut effects = Effects::default();
    if req.cost > 0 {
        for ((state, seen), limit) in states.iter_mut().zip(&mut seen[..n]).zip(limits) {
            let (charged, after) = limit.charge(state.as_ref(), seen, req.cost, now);
            *state = Some(charged);
            *seen = after;
        }
        effects.states_changed = (1u32 << n) - 1;
    }
    let mut binding = 0;
    let mut fewest = i64::MAX;
    for (i, (seen, limit)) in seen.iter().zip(limits).enumerate() {
        let left = limit.remaining(seen);
        if left < fewest {
            fewest = left;
            binding = i;
        }
    }
    let reply = Reply {
        status: Status::Allowed,
        limit: to_i64(limits.get(binding).map_or(0, |l| l.limit())),
        remaining: fewest.max(0),
        reset_ms: limits.get(binding).map_or(0, |l| {
            l.reset_ms(states.get(binding).and_then(Option::as_ref), now)
        }),
        retry_after_ms: 0,
        box_level: 0,
        strikes_remaining: strikes_left(penalty),
        binding: binding as i64,
    };
    (reply, effects)
}

/// `DELAY`: take `cost` from every key although key `binding` only admits
/// it in `wait` ms: the caller proceeds then, and later calls see the
/// debt. No strike is counted; `JITTER` does not apply.
fn reserve<L: Limiter>(
    states: &mut [Option<L::State>],
    seen: &mut [L::Seen],
    req: &Request<L>,
    binding: usize,
    wait: i64,
    now: Millis,
    strikes_remaining: i64,
) -> (Reply, Effects) {
    let n = req.limits.len().min(states.len()).min(seen.len());
    for ((state, seen), limit) in states.iter_mut().zip(seen.iter_mut()).zip(&req.limits[..n]) {
        let (charged, after) = limit.charge(state.as_ref(), seen, req.cost, now);
        *state = Some(charged);
        *seen = after;
    }
    let limit = &req.limits[binding];
    let reply = Reply {
        status: Status::Delayed,
        limit: to_i64(limit.limit()),
        remaining: limit.remaining(&seen[binding]),
        reset_ms: limit.reset_ms(states[binding].as_ref(), now),
        retry_after_ms: wait,
        box_level: 0,
        strikes_remaining,
        binding: binding as i64,
    };
    let effects = Effects {
        states_changed: (1u32 << n) - 1,
        ..Effects::default()
    };
    (reply, effects)
}

/// Apply [`Limiter::rewrite`] to every stored state; returns the bit set
/// of rewritten ones.
fn rewrite<L: Limiter>(
    states: &mut [Option<L::State>],
    seen: &[L::Seen],
    limits: &[L],
    now: Millis,
) -> u32 {
    let mut changed = 0;
    for (i, ((slot, seen), limit)) in states.iter_mut().zip(seen).zip(limits).enumerate() {
        if let Some(new) = slot
            .as_ref()
            .and_then(|state| limit.rewrite(state, seen, now))
        {
            *slot = Some(new);
            changed |= 1 << i;
        }
    }
    changed
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
        assert_eq!(fx.states_changed, 0b11);
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
    fn a_backward_step_grants_nothing_until_the_clock_passes_again() {
        let now = 1_700_000_000_000;
        let rate = Rate {
            capacity: 5,
            tokens: 5,
            period_ms: 10_000,
        };
        let mut buckets = [None];
        let mut penalty = Penalty::default();
        let mut req = TakeRequest::new(&[rate], 5);
        take(&mut buckets, &mut penalty, &req, now, 0);
        req.cost = 1;
        let back = now - 3_600_000;
        let (reply, fx) = take(&mut buckets, &mut penalty, &req, back, 0);
        assert_eq!(reply.to_array(), [0, 5, 0, 3_610_000, 3_602_000, 0, -1, 0]);
        assert_eq!(fx, Effects::default(), "a throttled call writes nothing");
        req.cost = 5;
        let (reply, _) = take(&mut buckets, &mut penalty, &req, back + 10_000, 0);
        assert_eq!(reply.status, Status::Throttled, "the hour is not refilled");
        let (reply, _) = take(&mut buckets, &mut penalty, &req, now + 10_000, 0);
        assert_eq!(reply.status, Status::Allowed);
    }
}

#[cfg(test)]
mod delay_tests {
    use super::*;
    use crate::core::bucket;

    #[test]
    fn delay_reserves_within_max_wait_and_throttles_beyond() {
        let now = 1_700_000_000_000;
        let rate = Rate {
            capacity: 1,
            tokens: 1,
            period_ms: 100,
        };
        let mut buckets = [None];
        let mut penalty = Penalty::default();
        let mut req = TakeRequest::new(&[rate], 1);
        req.delay_ms = Some(1000);
        let (first, _) = take(&mut buckets, &mut penalty, &req, now, 0);
        assert_eq!(first.to_array(), [1, 1, 0, 100, 0, 0, -1, 0]);
        for k in 1..=10 {
            let (reply, fx) = take(&mut buckets, &mut penalty, &req, now, 0);
            assert_eq!(
                reply.to_array(),
                [2, 1, 0, 100 * (k + 1), 100 * k, 0, -1, 0],
                "call {k}"
            );
            assert_eq!(fx.states_changed, 1);
        }
        let before = buckets;
        let (reply, fx) = take(&mut buckets, &mut penalty, &req, now, 0);
        assert_eq!(
            reply.to_array(),
            [0, 1, 0, 1100, 1100, 0, -1, 0],
            "beyond max_wait"
        );
        assert_eq!(
            (fx, buckets),
            (Effects::default(), before),
            "throttled: nothing reserved"
        );
        // Without DELAY the reservations are debt: nothing fits for 1.1 s.
        req.delay_ms = None;
        let (reply, _) = take(&mut buckets, &mut penalty, &req, now + 1099, 0);
        assert_eq!((reply.status, reply.retry_after_ms), (Status::Throttled, 1));
        let debt = bucket::debt(buckets[0].as_ref(), &rate, now);
        assert_eq!(
            debt, 1100,
            "one point plus max_wait worth of points, in ticks"
        );
    }
}
