//! The decision shared by the limiter commands: several keys charged
//! all-or-nothing, behind the penalty box of the first key. `RL.TAKE` is
//! this decision on token buckets.

use std::borrow::BorrowMut;

use arrayvec::ArrayVec;

use super::bucket::{Bucket, Rate};
use super::decision::{boxed, jittered, Decision, Span, Status};
use super::limiter::Limiter;
use super::limits::MAX_BUCKETS;
use super::penalty::{ActiveBox, Penalty, PenaltyPolicy, Strike};
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
    /// How `cost` is settled: charged if it fits (the default), charged
    /// whatever (`DEBT`), or given back (`REFUND`).
    pub settle: Settle,
}

/// How a call settles its `cost`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Settle {
    /// Taken from every key if it fits in every key, else nothing.
    #[default]
    Charge,
    /// `COST cost DEBT`: a price known after the fact, taken from every key
    /// whether or not it fits (a key may go into debt): never throttled,
    /// never a strike.
    Debt,
    /// `REFUND points`: `cost` points given back to every key that holds a
    /// state, never beyond empty.
    Refund,
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
            settle: Settle::Charge,
        }
    }
}

/// A set of the keys of one call, by index (0 = the first key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeySet(u32);

impl KeySet {
    /// Keys `0..n`.
    pub fn first(n: usize) -> KeySet {
        KeySet(if n >= 32 { u32::MAX } else { (1u32 << n) - 1 })
    }

    /// Add key `i`.
    pub fn insert(&mut self, i: usize) {
        if i < 32 {
            self.0 |= 1 << i;
        }
    }

    /// Whether key `i` is in the set.
    pub fn contains(self, i: usize) -> bool {
        i < 32 && self.0 & (1 << i) != 0
    }

    /// The keys in either set.
    pub fn union(self, other: KeySet) -> KeySet {
        KeySet(self.0 | other.0)
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// What a call changed, for the adapter to store, replicate and announce.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// The keys whose limiter state changed: every key when the call was
    /// allowed with a cost > 0; on a throttled call, only a state that
    /// needed a [`Limiter::rewrite`] (a bucket rewritten with the same
    /// points spent at its new rate, say).
    pub states: KeySet,
    /// The first key's penalty state changed (a strike or a trip).
    pub penalty: bool,
    /// The box this call tripped.
    pub tripped: Option<ActiveBox>,
}

impl Effects {
    /// The keys to write: those whose state changed, and the first key
    /// when its penalty did.
    pub fn written(&self) -> KeySet {
        let mut keys = self.states;
        if self.penalty {
            keys.insert(0);
        }
        keys
    }
}

/// `RL.TAKE`: [`decide`] on buckets.
pub fn take(
    buckets: &mut [impl BorrowMut<Option<Bucket>>],
    penalty: &mut Penalty,
    req: &TakeRequest,
    now: Millis,
    random: u64,
) -> (Decision, Effects) {
    decide(buckets, penalty, req, now, random)
}

/// Decide a call at `now` and apply it to `states` (one per limiter,
/// `None` for a key that holds none yet; owned or borrowed where they are
/// stored) and to the first key's `penalty`: the call is allowed only if
/// every key admits `cost`, and then `cost` is taken from every key;
/// otherwise nothing is taken, and with `STRIKES` a strike is counted. An
/// active box on the first key answers at once. Nothing is changed unless
/// [`Effects`] says so. `random` is a uniformly random number, used only
/// for `JITTER`.
pub fn decide<L: Limiter>(
    states: &mut [impl BorrowMut<Option<L::State>>],
    penalty: &mut Penalty,
    req: &Request<L>,
    now: Millis,
    random: u64,
) -> (Decision, Effects) {
    let first_limit = req.limits.first().map_or(0, |l| l.limit());
    if let Some(active) = penalty.active_box(now) {
        return (boxed(first_limit, &active, now), Effects::default());
    }
    let n = req.limits.len().min(states.len()).min(MAX_BUCKETS);
    let limits = &req.limits[..n];
    let states = &mut states[..n];
    let mut seen = [L::Seen::default(); MAX_BUCKETS];
    for ((slot, state), limit) in seen.iter_mut().zip(states.iter()).zip(limits) {
        *slot = limit.see(state.borrow().as_ref(), now);
    }
    let strikes_left = |p: &Penalty| {
        req.penalty
            .as_ref()
            .map(|pol| p.strikes_remaining(pol, now))
    };
    if req.settle != Settle::Charge {
        return settle(states, &mut seen, penalty, req, now, strikes_left(penalty));
    }

    // Throttled: the key that needs the longest wait binds.
    let mut binding = None;
    let mut longest = 0;
    for (i, ((seen, state), limit)) in seen.iter().zip(states.iter()).zip(limits).enumerate() {
        let wait = if limit.fits(seen, req.cost) {
            0
        } else {
            limit
                .wait_ms(state.borrow().as_ref(), seen, req.cost, now)
                .max(1)
        };
        if wait > longest {
            longest = wait;
            binding = Some(i);
        }
    }
    let longest = u64::try_from(longest).unwrap_or(0);
    if let Some(i) = binding {
        if req.cost > 0 && req.delay_ms.is_some_and(|max| longest <= max) {
            charge_all(states, &mut seen, limits, req.cost, now);
            let admitted = penalty.admit(now);
            let decision = Decision {
                status: Status::Delayed,
                retry_after: Span::Ms(longest),
                ..about(i, states, &seen, limits, now, strikes_left(penalty))
            };
            let effects = Effects {
                states: KeySet::first(n),
                penalty: admitted,
                ..Effects::default()
            };
            return (decision, effects);
        }
        let mut effects = Effects::default();
        if req.cost > 0 {
            effects.states = rewrite(states, &seen, limits, now);
        }
        let retry_after = jittered(longest, req.jitter_percent, random);
        if let (Some(policy), true) = (req.penalty.as_ref(), req.cost > 0) {
            // The refusal records the retry it announces; only an early
            // retry (before the previous refusal's) is a strike.
            effects.penalty = true;
            if let Some(Strike::Tripped(active)) = penalty.refuse(policy, retry_after, now) {
                effects.tripped = Some(active);
                return (boxed(first_limit, &active, now), effects);
            }
        }
        let decision = Decision {
            status: Status::Throttled,
            retry_after: Span::Ms(retry_after),
            ..about(i, states, &seen, limits, now, strikes_left(penalty))
        };
        return (decision, effects);
    }

    // Allowed: charge every key; the one with the fewest points left binds.
    let mut effects = Effects::default();
    if req.cost > 0 {
        charge_all(states, &mut seen, limits, req.cost, now);
        effects.states = KeySet::first(n);
        effects.penalty = penalty.admit(now);
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
    let decision = Decision {
        status: Status::Allowed,
        ..about(binding, states, &seen, limits, now, strikes_left(penalty))
    };
    (decision, effects)
}

/// `DEBT` and `REFUND`: applied to every key (a refund only where a state
/// is stored), always allowed; the key with the fewest points left binds,
/// its balance negative when in debt.
fn settle<L: Limiter>(
    states: &mut [impl BorrowMut<Option<L::State>>],
    seen: &mut [L::Seen],
    penalty: &mut Penalty,
    req: &Request<L>,
    now: Millis,
    strikes_remaining: Option<u64>,
) -> (Decision, Effects) {
    let n = states.len().min(seen.len()).min(req.limits.len());
    let limits = &req.limits[..n];
    let mut effects = Effects::default();
    if req.cost > 0 {
        for (i, ((state, seen), limit)) in states
            .iter_mut()
            .zip(seen.iter_mut())
            .zip(limits)
            .enumerate()
        {
            let slot = state.borrow_mut();
            match (req.settle, slot.as_mut()) {
                (Settle::Refund, Some(stored)) => {
                    *seen = limit.refund(stored, seen, req.cost, now);
                    effects.states.insert(i);
                }
                (Settle::Refund, None) => {}
                _ => {
                    *seen = limit.charge(slot, seen, req.cost, now);
                    effects.states.insert(i);
                }
            }
        }
        effects.penalty = penalty.admit(now);
    }
    let binding = (0..n)
        .min_by_key(|&i| limits[i].balance(&seen[i]))
        .unwrap_or(0);
    let decision = Decision {
        remaining: limits.get(binding).map_or(0, |l| l.balance(&seen[binding])),
        ..about(binding, states, seen, limits, now, strikes_remaining)
    };
    (decision, effects)
}

/// A decision about key `i` (allowed, retry now); the caller sets what
/// differs.
fn about<L: Limiter>(
    i: usize,
    states: &[impl BorrowMut<Option<L::State>>],
    seen: &[L::Seen],
    limits: &[L],
    now: Millis,
    strikes_remaining: Option<u64>,
) -> Decision {
    let (Some(limit), Some(seen), Some(state)) = (limits.get(i), seen.get(i), states.get(i)) else {
        return Decision {
            status: Status::Allowed,
            limit: 0,
            remaining: 0,
            reset: Span::Ms(0),
            retry_after: Span::Ms(0),
            box_level: 0,
            strikes_remaining,
            binding: 0,
        };
    };
    Decision {
        status: Status::Allowed,
        limit: limit.limit(),
        remaining: limit.remaining(seen),
        reset: Span::ms(limit.reset_ms(state.borrow().as_ref(), now)),
        retry_after: Span::Ms(0),
        box_level: 0,
        strikes_remaining,
        binding: i,
    }
}

/// Take `cost` from every key, in place (`DELAY` may take it although it
/// does not fit yet: later calls see the debt).
fn charge_all<L: Limiter>(
    states: &mut [impl BorrowMut<Option<L::State>>],
    seen: &mut [L::Seen],
    limits: &[L],
    cost: u64,
    now: Millis,
) {
    for ((state, seen), limit) in states.iter_mut().zip(seen.iter_mut()).zip(limits) {
        *seen = limit.charge(state.borrow_mut(), seen, cost, now);
    }
}

/// Apply [`Limiter::rewrite`] to every stored state; returns the keys
/// rewritten.
fn rewrite<L: Limiter>(
    states: &mut [impl BorrowMut<Option<L::State>>],
    seen: &[L::Seen],
    limits: &[L],
    now: Millis,
) -> KeySet {
    let mut changed = KeySet::default();
    for (i, ((slot, seen), limit)) in states.iter_mut().zip(seen).zip(limits).enumerate() {
        if let Some(state) = slot.borrow_mut().as_mut() {
            if limit.rewrite(state, seen, now) {
                changed.insert(i);
            }
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::bucket;
    use crate::core::penalty::MANUAL;
    use crate::core::testkit::{rate_of as rate, req, ToWire, T0 as NOW};

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
            assert_eq!(reply.wire(), *expected, "at +{at} ms, cost {cost}");
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
        assert_eq!(reply.wire(), [1, 10, 4, 36000, 0, 0, -1, 1]);
        assert_eq!(fx.states, KeySet::first(2));
        let before = buckets;
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        assert_eq!(reply.wire(), [0, 10, 4, 36000, 12000, 0, -1, 1]);
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
        assert_eq!(reply.wire(), [1, 1, 0, 60000, 0, 0, 2, 0]);
        // The first refusal announces a retry at NOW + 60000: no strike.
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 1, 0);
        assert_eq!(reply.wire(), [0, 1, 0, 59999, 59999, 0, 2, 0]);
        assert!(fx.penalty && fx.tripped.is_none());
        assert_eq!(penalty.retry_at, NOW + 60_000);
        // Retrying before it is a strike, each time.
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 2, 0);
        assert_eq!(reply.wire(), [0, 1, 0, 59998, 59998, 0, 1, 0]);
        assert!(fx.penalty && fx.tripped.is_none());
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 2, 0);
        assert_eq!(reply.wire(), [-1, 1, 0, 300000, 300000, 1, 0, 0]);
        assert_eq!(fx.tripped.map(|b| b.level), Some(1));
        // Boxed: nothing is read or charged, even when the bucket is full.
        let (reply, fx) = take(&mut buckets, &mut penalty, &r, NOW + 120_000, 0);
        assert_eq!(reply.wire(), [-1, 1, 0, 180002, 180002, 1, 0, 0]);
        assert_eq!(fx, Effects::default());
    }

    #[test]
    fn debt_charges_past_empty_and_refund_gives_back_up_to_full() {
        let mut buckets = [None, None];
        let mut penalty = Penalty::default();
        let rates = [rate(10, 1, 1000), rate(100, 10, 1000)];
        let mut r = req(&rates, 25);
        r.settle = Settle::Debt;
        // 25 points on a bucket of 10: allowed, 15 in debt.
        let (d, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        assert_eq!(d.wire(), [1, 10, -15, 25_000, 0, 0, -1, 0]);
        assert_eq!(fx.states, KeySet::first(2));
        // Throttled until the debt is repaid at the refill rate.
        let one = req(&rates, 1);
        let (d, _) = take(&mut buckets, &mut penalty, &one, NOW, 0);
        assert_eq!(
            (d.status, d.retry_after),
            (Status::Throttled, Span::Ms(16_000))
        );
        let (d, _) = take(&mut buckets, &mut penalty, &one, NOW + 16_000, 0);
        assert_eq!(d.status, Status::Allowed);
        // A refund gives back, never beyond full.
        let mut back = req(&rates, 1000);
        back.settle = Settle::Refund;
        let (d, fx) = take(&mut buckets, &mut penalty, &back, NOW + 16_000, 0);
        assert_eq!(d.wire(), [1, 10, 10, 0, 0, 0, -1, 0]);
        assert_eq!(fx.states, KeySet::first(2));
        // A refund to keys that hold nothing changes nothing.
        let mut empty = [None];
        let (d, fx) = take(&mut empty, &mut penalty, &req(&rates[..1], 5), NOW, 0);
        assert_eq!(d.status, Status::Allowed);
        let mut nothing = [None];
        let (_, fx2) = take(
            &mut nothing,
            &mut penalty,
            &{
                let mut b = req(&rates[..1], 5);
                b.settle = Settle::Refund;
                b
            },
            NOW,
            0,
        );
        assert!(fx.states.contains(0) && fx2.states.is_empty() && nothing[0].is_none());
    }

    #[test]
    fn debt_and_refund_never_strike_and_a_box_still_answers() {
        let mut buckets = [None];
        let mut penalty = Penalty::default();
        penalty.trip(1, 60_000, NOW);
        let mut r = req(&[rate(1, 1, 1000)], 5);
        r.penalty = strikes(1);
        r.settle = Settle::Debt;
        let (d, fx) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        assert_eq!((d.status, fx), (Status::Boxed, Effects::default()));
        penalty.release(true, NOW);
        let (d, _) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        assert_eq!((d.status, d.strikes_remaining), (Status::Allowed, Some(1)));
        let (d, _) = take(&mut buckets, &mut penalty, &r, NOW, 0);
        assert_eq!((d.status, d.remaining), (Status::Allowed, -9));
    }

    #[test]
    fn a_client_that_waits_as_told_is_never_struck() {
        let mut buckets = [None];
        let mut penalty = Penalty::default();
        let mut r = req(&[rate(2, 1, 1000)], 1);
        r.penalty = strikes(1);
        let mut now = NOW;
        for _ in 0..50 {
            let (reply, _) = take(&mut buckets, &mut penalty, &r, now, 0);
            assert_ne!(reply.status, Status::Boxed);
            assert_eq!(reply.strikes_remaining, Some(1));
            now += i64::try_from(reply.retry_after.as_ms().unwrap_or(0)).unwrap_or(0);
        }
        // One early retry with a threshold of 1 trips the box.
        let (refused, _) = take(&mut buckets, &mut penalty, &r, now, 0);
        let (refused, _) = match refused.status {
            Status::Allowed => take(&mut buckets, &mut penalty, &r, now, 0),
            _ => (refused, Effects::default()),
        };
        assert_eq!(refused.status, Status::Throttled);
        let (early, _) = take(&mut buckets, &mut penalty, &r, now, 0);
        assert_eq!(early.status, Status::Boxed);
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
        assert_eq!(reply.wire(), [-1, 5, 0, -1, -1, 3, 0, 0]);
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
        assert_eq!(reply.wire(), [1, 2, 0, 2000, 0, 0, 1, 0]);
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
        assert_eq!(low.retry_after, Span::Ms(10_000));
        assert_eq!(high.retry_after, Span::Ms(15_000));
    }

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
        assert_eq!(reply.wire(), [0, 5, 0, 3_610_000, 3_602_000, 0, -1, 0]);
        assert_eq!(fx, Effects::default(), "a throttled call writes nothing");
        req.cost = 5;
        let (reply, _) = take(&mut buckets, &mut penalty, &req, back + 10_000, 0);
        assert_eq!(reply.status, Status::Throttled, "the hour is not refilled");
        let (reply, _) = take(&mut buckets, &mut penalty, &req, now + 10_000, 0);
        assert_eq!(reply.status, Status::Allowed);
    }

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
        assert_eq!(first.wire(), [1, 1, 0, 100, 0, 0, -1, 0]);
        for k in 1..=10 {
            let (reply, fx) = take(&mut buckets, &mut penalty, &req, now, 0);
            assert_eq!(
                reply.wire(),
                [2, 1, 0, 100 * (k + 1), 100 * k, 0, -1, 0],
                "call {k}"
            );
            assert_eq!(fx.states, KeySet::first(1));
        }
        let before = buckets;
        let (reply, fx) = take(&mut buckets, &mut penalty, &req, now, 0);
        assert_eq!(
            reply.wire(),
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
        assert_eq!(
            (reply.status, reply.retry_after),
            (Status::Throttled, Span::Ms(1))
        );
        let debt = bucket::debt(buckets[0].as_ref(), &rate, now);
        assert_eq!(
            debt, 1100,
            "one point plus max_wait worth of points, in ticks"
        );
    }
}
