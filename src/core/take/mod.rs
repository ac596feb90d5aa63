//! The decision shared by the limiter commands: several keys charged
//! all-or-nothing, behind the penalty box of the first key. `RL.TAKE` is
//! this decision on token buckets.

use std::borrow::BorrowMut;

use arrayvec::ArrayVec;

use crate::core::bucket::{Bucket, Rate};
use crate::core::decision::{boxed, jittered, Decision, Span, Status};
use crate::core::limiter::Limiter;
use crate::core::limits::MAX_BUCKETS;
use crate::core::penalty::{ActiveBox, Penalty, PenaltyPolicy, Strike};
use crate::core::time::Millis;

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
    /// `RESERVE index percent`, in points per key: key `i` admits a call
    /// only if at least `reserve[i]` points stay in it after the call.
    pub reserve: [u64; MAX_BUCKETS],
    /// `PARTIAL [MIN minimum]`: grant as many points as every key can give
    /// now, up to `cost` and at least this minimum, the same from each.
    pub partial_min: Option<u64>,
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

impl<L> Request<L> {
    /// A call of one point on no key yet, with no options: what a parser
    /// fills in place (a request is large enough that moving it shows in
    /// a call's cost).
    #[inline]
    pub fn empty() -> Request<L> {
        Request {
            limits: Limits::new(),
            cost: 1,
            penalty: None,
            jitter_percent: 0,
            delay_ms: None,
            settle: Settle::Charge,
            reserve: [0; MAX_BUCKETS],
            partial_min: None,
        }
    }
}

impl<L> Request<L> {
    /// The same call with each key's limiter mapped by `f` (the options
    /// kept).
    pub fn map_limits<M>(&self, mut f: impl FnMut(&L) -> M) -> Request<M> {
        let mut limits = Limits::new();
        for limit in &self.limits {
            limits.push(f(limit));
        }
        Request {
            limits,
            cost: self.cost,
            penalty: self.penalty,
            jitter_percent: self.jitter_percent,
            delay_ms: self.delay_ms,
            settle: self.settle,
            reserve: self.reserve,
            partial_min: self.partial_min,
        }
    }
}

impl<L: Clone> Request<L> {
    /// A call of `cost` on keys with these limiters (the first
    /// [`MAX_BUCKETS`]), with no options.
    pub fn new(limits: &[L], cost: u64) -> Request<L> {
        let mut req = Request::empty();
        for limit in limits.iter().take(MAX_BUCKETS) {
            req.limits.push(limit.clone());
        }
        req.cost = cost;
        req
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
    /// The call was refused only because of a `RESERVE`: it would have fit
    /// the binding key without it.
    pub reserve_refused: bool,
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
    // One reading per key (as many as keys: a reading can be large),
    // pushed where it lives (a collected array is copied whole).
    let mut seen: ArrayVec<L::Seen, MAX_BUCKETS> = ArrayVec::new();
    for (state, limit) in states.iter().zip(limits) {
        seen.push(limit.see(state.borrow().as_ref(), now));
    }
    let strikes_left = |p: &Penalty| {
        req.penalty
            .as_ref()
            .map(|pol| p.strikes_remaining(pol, now))
    };
    if req.settle != Settle::Charge {
        return settle(states, &mut seen, penalty, req, now, strikes_left(penalty));
    }

    // PARTIAL: what every key can give now above its reserve, up to cost;
    // below the minimum the call is decided (and refused) for the minimum.
    let cost = match req.partial_min {
        None => req.cost,
        Some(min) => {
            let available = (0..n)
                .map(|i| {
                    let reserve = i64::try_from(req.reserve[i]).unwrap_or(i64::MAX);
                    limits[i].remaining(&seen[i]).saturating_sub(reserve)
                })
                .min()
                .unwrap_or(0);
            let grant = u64::try_from(available.max(0)).unwrap_or(0).min(req.cost);
            grant.max(min)
        }
    };

    // Refused when a key does not admit what the call needs there: a key
    // with a reserve must keep it (`cost + reserve`).
    let mut short = KeySet::default();
    for (i, (seen, limit)) in seen.iter().zip(limits).enumerate() {
        if !limit.fits(seen, cost.saturating_add(req.reserve[i])) {
            short.insert(i);
        }
    }
    if short.is_empty() {
        // Allowed: charge every key; the one with the fewest points left binds.
        let mut effects = Effects::default();
        if cost > 0 {
            charge_all(states, &mut seen, limits, cost, now);
            effects.states = KeySet::first(n);
            effects.penalty = penalty.admit(now);
        }
        let mut binding = 0;
        let mut fewest = i64::MAX;
        for (i, (seen, limit)) in seen.iter().zip(limits).enumerate() {
            let left = limit.balance(seen);
            if left < fewest {
                fewest = left;
                binding = i;
            }
        }
        let decision = Decision {
            status: Status::Allowed,
            granted: req.partial_min.map(|_| cost),
            ..about(binding, states, &seen, limits, now, strikes_left(penalty))
        };
        return (decision, effects);
    }

    // A refused call with a cost above 0 (throttled or delayed) leaves
    // every key at this call's parameters, so its waits are read from the
    // keys rewritten; a probe writes nothing, and its waits are read from
    // the keys as they stay.
    let rewritten = if cost > 0 {
        rewrite(states, &seen, limits, now)
    } else {
        KeySet::default()
    };

    // Throttled: the key that needs the longest wait binds.
    let mut binding = 0;
    let mut longest = 0;
    for (i, ((seen, state), limit)) in seen.iter().zip(states.iter()).zip(limits).enumerate() {
        if !short.contains(i) {
            continue;
        }
        let need = cost.saturating_add(req.reserve[i]);
        let wait = if need > limit.limit() {
            // Never above the reserve: until nothing limits.
            limit.reset_ms(state.borrow().as_ref(), seen, now).max(1)
        } else {
            limit
                .wait_ms(state.borrow().as_ref(), seen, need, now)
                .max(1)
        };
        if wait > longest {
            longest = wait;
            binding = i;
        }
    }
    let longest = u64::try_from(longest).unwrap_or(0);
    if cost > 0 && req.delay_ms.is_some_and(|max| longest <= max) {
        charge_all(states, &mut seen, limits, cost, now);
        let admitted = penalty.admit(now);
        let decision = Decision {
            status: Status::Delayed,
            retry_after: Span::Ms(longest),
            ..about(binding, states, &seen, limits, now, strikes_left(penalty))
        };
        let effects = Effects {
            states: KeySet::first(n),
            penalty: admitted,
            ..Effects::default()
        };
        return (decision, effects);
    }
    let mut effects = Effects {
        states: rewritten,
        reserve_refused: req.reserve[binding] > 0 && limits[binding].fits(&seen[binding], cost),
        ..Effects::default()
    };
    let retry_after = jittered(longest, req.jitter_percent, random);
    if let (Some(policy), true) = (req.penalty.as_ref(), cost > 0) {
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
        ..about(binding, states, &seen, limits, now, strikes_left(penalty))
    };
    (decision, effects)
}

/// `DEBT` and `REFUND`: applied to every key (a refund only where a state
/// is stored), always allowed; the key with the fewest points left binds.
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
    let decision = about(binding, states, seen, limits, now, strikes_remaining);
    (decision, effects)
}

/// A decision about key `i` (allowed, retry now); the caller sets what
/// differs. Its `remaining` is the key's balance: negative by the excess
/// when the key holds more than it may admit (a debt, a lowered limit).
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
            granted: None,
        };
    };
    Decision {
        status: Status::Allowed,
        limit: limit.limit(),
        remaining: limit.balance(seen),
        reset: Span::ms(limit.reset_ms(state.borrow().as_ref(), seen, now)),
        retry_after: Span::Ms(0),
        box_level: 0,
        strikes_remaining,
        binding: i,
        granted: None,
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
mod tests;
