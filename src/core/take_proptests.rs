//! Property tests of the shared decision on buckets (`take`): never over-admits,
//! a throttled call changes nothing, `retry_after_ms` and `reset_ms` are
//! exact, and nothing overflows or panics within or beyond the limits.
//!
//! Driven through the shared kit (`testkit`) with random rates, costs,
//! clocks and stored states, and checked against invariants derived from
//! the module docs rather than against the implementation.

use proptest::prelude::*;

use super::bucket::Rate;
use super::decision::Status;
use super::limits::MAX_BUCKETS;
use super::penalty::Penalty;
use super::take::{take, KeySet, TakeRequest};
use super::testkit::*;
use super::time::Millis;

// ---------------------------------------------------------------------------
// 1. Never over-admits.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    /// One bucket, clock going forward: the points admitted from the start
    /// to any call at `t` are at most
    /// `capacity + floor((t - t0) * tokens / period_ms)` (and the same for
    /// every window that starts at an admitted call).
    #[test]
    fn never_over_admits_one_bucket((rates, calls) in run(1..=1, 200)) {
        check_never_over_admits(&rates, &times(&calls))?;
    }

    /// Two or three buckets (`ALSO`): every bucket's own rate bounds the
    /// points admitted, as for one bucket.
    #[test]
    fn never_over_admits_also_buckets((rates, calls) in run(2..=3, 200)) {
        check_never_over_admits(&rates, &times(&calls))?;
    }
}

// ---------------------------------------------------------------------------
// 2. A throttled call changes nothing.
// ---------------------------------------------------------------------------

/// Drive `calls` (a step of any sign, the index of the rate set to use,
/// a cost) and check after each one that nothing changed that `Effects`
/// does not report, that a throttled or boxed call takes and grants no
/// point, that a boxed call or a `COST 0` probe changes nothing at all and
/// that an allowed call never touches the penalty. With `same_bytes`, a
/// throttled call must leave every bucket byte for byte as it was.
fn check_calls_change_only_what_they_report(
    rate_sets: &[Vec<Rate>],
    calls: &[(i64, usize, u64)],
    policy: Option<PenaltyPolicy>,
    same_bytes: bool,
) -> Result<(), TestCaseError> {
    let n = rate_sets[0].len();
    let mut state = State::new(n);
    let mut now = T0;
    for &(step, set, cost) in calls {
        now += step;
        let rates = &rate_sets[set];
        let r = TakeRequest {
            penalty: policy,
            ..req(rates, cost)
        };
        let before = state.clone();
        let (reply, fx) = state.call(&r, now);
        check_reply_ranges(&reply, rates, n)?;
        for k in 0..n {
            if !fx.states.contains(k) {
                prop_assert_eq!(
                    state.buckets[k],
                    before.buckets[k],
                    "bucket {} changed unreported",
                    k
                );
            }
        }
        prop_assert!(
            (n..32).all(|k| !fx.states.contains(k)),
            "keys beyond {} buckets: {:?}",
            n,
            fx
        );
        if !fx.penalty {
            let pending = Penalty {
                retry_at: state.penalty.retry_at,
                ..before.penalty
            };
            prop_assert_eq!(
                state.penalty,
                pending,
                "only a retry no longer pending may change unreported"
            );
        }
        if cost == 0 {
            prop_assert_eq!(&state, &before, "a probe changed the state: {:?}", reply);
            prop_assert_eq!(fx, Effects::default());
        }
        if reply.status == Status::Allowed {
            // An admission clears the retry a refusal announced, nothing else.
            prop_assert_eq!(
                state.penalty,
                Penalty {
                    retry_at: state.penalty.retry_at,
                    ..before.penalty
                },
                "an allowed call touched the penalty"
            );
            prop_assert!(
                cost == 0
                    || state.penalty.retry_at == 0
                    || before.penalty.retry_at == state.penalty.retry_at
            );
            // Reported exactly when a retry was still pending.
            prop_assert_eq!(fx.penalty, cost > 0 && now < before.penalty.retry_at);
            let all = if cost > 0 {
                KeySet::first(n)
            } else {
                KeySet::default()
            };
            prop_assert_eq!(fx.states, all);
            prop_assert!(fx.tripped.is_none());
            continue;
        }
        // Throttled, or boxed: no point taken or granted in any bucket.
        for (k, rate) in rates.iter().enumerate() {
            let was = bucket::debt(before.buckets[k].as_ref(), rate, now);
            let is = bucket::debt(state.buckets[k].as_ref(), rate, now);
            prop_assert_eq!(
                was,
                is,
                "bucket {} went from {:?} to {:?}",
                k,
                before.buckets[k],
                state.buckets[k]
            );
            if fx.states.contains(k) {
                // Rewritten at the scale of the rate it is read with.
                let b = state.buckets[k];
                prop_assert_eq!(
                    b.map(|b| (b.tokens.get(), b.period_ms)),
                    Some((rate.tokens, rate.period_ms))
                );
            }
        }
        if same_bytes {
            prop_assert_eq!(
                &state.buckets,
                &before.buckets,
                "a throttled call rewrote a bucket"
            );
            prop_assert_eq!(fx.states, KeySet::default());
        }
        match reply.status {
            Status::Throttled => {
                prop_assert!(fx.tripped.is_none());
                if policy.is_none() {
                    prop_assert_eq!(state.penalty, before.penalty);
                    prop_assert!(!fx.penalty);
                }
            }
            _ => {
                prop_assert!(policy.is_some(), "boxed without STRIKES");
                if fx.tripped.is_none() {
                    // Met an active box: nothing at all changes.
                    prop_assert_eq!(&state, &before);
                    prop_assert_eq!(fx, Effects::default());
                } else {
                    prop_assert!(cost > 0, "a probe tripped the box");
                    prop_assert!(fx.penalty);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    /// Fixed rates and a clock going forward: a throttled call (status 0)
    /// leaves the bucket array byte for byte as it was; without `STRIKES`
    /// it also leaves the penalty alone and reports no effects. With
    /// `STRIKES`, a throttled call (status 0, or -1 when it trips the box)
    /// still leaves every bucket alone. Also: nothing changes that
    /// `Effects` does not report, a boxed call and a `COST 0` probe change
    /// nothing, an allowed call never touches the penalty.
    #[test]
    fn a_throttled_call_changes_no_bucket(
        (rates, calls) in prop::collection::vec(rate(), 1..=3).prop_flat_map(|rates| {
            let cap = max_capacity(&rates);
            let step = step_for_any(&rates).prop_map(|s| s as i64);
            let cost = prop_oneof![1 => Just(0u64), 4 => 0..=2 * cap];
            let calls = prop::collection::vec((step, Just(0usize), cost), 0..=100);
            (Just(rates), calls)
        }),
        policy in prop::option::of(small_policy()),
    ) {
        check_calls_change_only_what_they_report(&[rates], &calls, policy, true)?;
    }

    /// The same with backward clock steps (-1 hour) and each call using one
    /// of two rate sets (tier changes): a throttled call may rewrite a
    /// bucket (reported in `Effects`, at the scale of its new rate), but
    /// the points spent as read under the call's rate at `now` are the same
    /// before and after, so it takes and grants nothing.
    #[test]
    fn a_throttled_call_keeps_the_points_spent(
        (rate_sets, calls) in (1usize..=3).prop_flat_map(|n| {
            prop::collection::vec(prop::collection::vec(rate(), n), 2)
        }).prop_flat_map(|rate_sets| {
            let cap = max_capacity(&rate_sets[0]).max(max_capacity(&rate_sets[1]));
            let step = prop_oneof![
                12 => step_for_any(&rate_sets[0]).prop_map(|s| s as i64),
                6 => step_for_any(&rate_sets[1]).prop_map(|s| s as i64),
                1 => Just(-HOUR_MS),
            ];
            let set = prop_oneof![3 => Just(0usize), 1 => Just(1usize)];
            let cost = prop_oneof![1 => Just(0u64), 4 => 0..=2 * cap];
            let calls = prop::collection::vec((step, set, cost), 0..=100);
            (Just(rate_sets), calls)
        }),
        policy in prop::option::of(small_policy()),
    ) {
        check_calls_change_only_what_they_report(&rate_sets, &calls, policy, false)?;
    }
}

// ---------------------------------------------------------------------------
// 3. retry_after_ms is exact.
// ---------------------------------------------------------------------------

/// A state reached by a random history, then a call repeated at one
/// instant until it is throttled. Returns the state, the instant and the
/// throttled reply.
fn throttle(
    rates: &[Rate],
    history: &[(u64, u64)],
    step: u64,
    cost: u64,
) -> Result<(State, Millis, Wire), TestCaseError> {
    let mut state = State::new(rates.len());
    let mut now = T0;
    for &(s, c) in history {
        now += s as i64;
        state.call(&req(rates, c), now);
    }
    now += step as i64;
    // Each admitted call spends `cost >= 1` points at one instant, so the
    // call is throttled after at most `capacity + 1` tries.
    for _ in 0..=min_capacity(rates) + 1 {
        let (reply, _) = state.call(&req(rates, cost), now);
        if reply.status == Status::Throttled {
            return Ok((state, now, reply));
        }
        prop_assert_eq!(reply.status, Status::Allowed);
    }
    Err(TestCaseError::fail("the call was never throttled"))
}

/// A history, a step and a cost `1..=min capacity` for 1 to `n` buckets.
fn throttle_case(n: usize) -> impl Strategy<Value = (Vec<Rate>, Vec<(u64, u64)>, u64, u64)> {
    run(1..=n, 50).prop_flat_map(|(rates, history)| {
        let step = step_for_any(&rates);
        let cost = 1..=min_capacity(&rates);
        (Just(rates), Just(history), step, cost)
    })
}

proptest! {
    #![proptest_config(config(256))]

    /// After a throttled call at `now` (no jitter, no `STRIKES`) replying
    /// `retry_after_ms = r`: the same call at `now + r` is allowed, and at
    /// `now + r - 1` it is throttled with `retry_after_ms == 1` and the same
    /// binding key. One to three buckets.
    #[test]
    fn retry_after_is_exact((rates, history, step, cost) in throttle_case(3)) {
        let (state, now, reply) = throttle(&rates, &history, step, cost)?;
        let r = reply.retry_after_ms;
        prop_assert!(r >= 1);
        let call = req(&rates, cost);
        let at = state.peek(&call, now + r);
        prop_assert_eq!(at.status, Status::Allowed, "not allowed at now + retry_after ({}): {:?}", r, at);
        let just_before = state.peek(&call, now + r - 1);
        prop_assert_eq!(just_before.status, Status::Throttled, "allowed 1 ms before now + retry_after ({})", r);
        prop_assert_eq!(just_before.retry_after_ms, 1);
        prop_assert_eq!(just_before.binding, reply.binding);
    }

    /// With `JITTER p`, the reply's wait is stretched within
    /// `[r, r + ceil(r * p / 100)]` of the exact wait `r`, so waiting it out
    /// always succeeds.
    #[test]
    fn jittered_retry_after_is_enough(
        (rates, history, step, cost) in throttle_case(3),
        jitter_percent in 0u8..=100,
        random in any::<u64>(),
    ) {
        let (state, now, reply) = throttle(&rates, &history, step, cost)?;
        let r = reply.retry_after_ms;
        let call = TakeRequest { jitter_percent, ..req(&rates, cost) };
        let jittered = Wire::from(take(&mut state.buckets.clone(), &mut state.penalty.clone(), &call, now, random).0);
        prop_assert_eq!(jittered.status, Status::Throttled);
        let rj = jittered.retry_after_ms;
        let most = i128::from(r) + ceil_div(i128::from(r) * i128::from(jitter_percent), 100);
        prop_assert!(rj >= r && i128::from(rj) <= most, "jittered {} outside [{}, {}]", rj, r, most);
        prop_assert_eq!(state.peek(&call, now + rj).status, Status::Allowed);
    }
}

// ---------------------------------------------------------------------------
// 4. reset_ms is exact.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    /// For an allowed call at `now` with `reset_ms = z` and binding key `i`:
    /// a `COST 0` probe of bucket `i` at `now + z` reports `remaining ==
    /// capacity` (and `reset_ms == 0`); when `z > 0`, at `now + z - 1` it
    /// reports less than `capacity` (and `reset_ms == 1`). The reply's
    /// `remaining` is the fewest points left over all buckets.
    #[test]
    fn reset_ms_is_exact(
        (rates, history, step, cost) in run(1..=3, 50).prop_flat_map(|(rates, history)| {
            let step = step_for_any(&rates);
            let cost = 0..=min_capacity(&rates);
            (Just(rates), Just(history), step, cost)
        }),
    ) {
        let mut state = State::new(rates.len());
        let mut now = T0;
        for (s, c) in history {
            now += s as i64;
            state.call(&req(&rates, c), now);
        }
        now += step as i64;
        let (mut reply, _) = state.call(&req(&rates, cost), now);
        if reply.status != Status::Allowed {
            // The clock only went forward, so no bucket is over capacity and
            // a probe is always allowed.
            reply = state.call(&req(&rates, 0), now).0;
            prop_assert_eq!(reply.status, Status::Allowed);
        }
        let b = reply.binding as usize;
        let rate = rates[b];
        let capacity = rate.capacity as i64;
        let fewest = (0..rates.len()).map(|k| state.probe_one(k, rates[k], now).remaining).min();
        prop_assert_eq!(Some(reply.remaining), fewest);
        prop_assert_eq!(reply.limit, capacity);

        let z = reply.reset_ms;
        prop_assert!(z >= 0);
        let full = state.probe_one(b, rate, now + z);
        prop_assert_eq!(full.remaining, capacity, "not full at now + reset_ms ({})", z);
        prop_assert_eq!(full.reset_ms, 0);
        if z > 0 {
            let almost = state.probe_one(b, rate, now + z - 1);
            prop_assert!(almost.remaining < capacity, "already full 1 ms before now + reset_ms ({})", z);
            prop_assert_eq!(almost.reset_ms, 1);
        } else {
            prop_assert_eq!(reply.remaining, capacity);
        }
    }
}

// ---------------------------------------------------------------------------
// 9. Overflow.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(512))]

    /// With every number inside [`crate::core::limits`], any valid stored
    /// state (buckets and penalty decoded from anything) and any `now` in
    /// `i64`, `take` never panics (a debug build panics on arithmetic
    /// overflow) and its replies stay in range. Several calls in a row, so
    /// the states it writes are fed back to it.
    #[test]
    fn take_never_overflows_within_limits(
        req in request_within_limits(),
        stored in prop::collection::vec(prop::option::of(any_valid_bucket()), MAX_BUCKETS),
        penalty in any_valid_penalty(),
        calls in prop::collection::vec((any_now(), any::<u64>()), 1..=8),
    ) {
        let n = req.limits.len();
        let mut buckets = stored[..n].to_vec();
        let mut penalty = penalty;
        for (now, random) in calls {
            let reply = Wire::from(take(&mut buckets, &mut penalty, &req, now, random).0);
            check_reply_ranges(&reply, &req.limits, n)?;
            for b in buckets.iter().flatten() {
                prop_assert!(b.is_valid(), "take wrote an invalid bucket {b:?}");
            }
            prop_assert!(penalty.is_valid());
            let mut record = Record::default();
            record.bucket = buckets[0];
            record.penalty = Some(Box::new(penalty));
            prop_assert_eq!(decode(&encode(&record)), Ok(record.clone()));
            let _ = record.prune(now);
        }
    }

    /// Beyond the limits on numbers (any `u64` in a rate, including 0, any
    /// cost, any policy, any jitter percent) with 1 to [`MAX_BUCKETS`]
    /// rates and 0 to [`MAX_BUCKETS`] buckets, `take` still does not panic:
    /// the arithmetic saturates, as the module docs promise for corrupt
    /// stored bytes.
    #[test]
    fn take_never_panics_beyond_limits(
        (rates, nb) in (1..=MAX_BUCKETS, 0..=MAX_BUCKETS).prop_flat_map(|(nr, nb)| (any_rates(nr), Just(nb))),
        cost in any::<u64>(),
        policy in any_policy(),
        stored in prop::collection::vec(prop::option::of(any_valid_bucket()), MAX_BUCKETS),
        penalty in any_valid_penalty(),
        jitter_percent in any::<u8>(),
        calls in prop::collection::vec((any_now(), any::<u64>()), 1..=4),
    ) {
        let req = TakeRequest { limits: rates.into_iter().take(MAX_BUCKETS).collect(), cost, penalty: policy, jitter_percent, delay_ms: None, settle: Default::default(), reserve: [0; MAX_BUCKETS], partial_min: None };
        let mut buckets = stored[..nb].to_vec();
        let mut penalty = penalty;
        for (now, random) in calls {
            let _ = take(&mut buckets, &mut penalty, &req, now, random);
        }
    }

    /// More rates and buckets than [`MAX_BUCKETS`] (which `take` clamps to
    /// with `n = ...min(MAX_BUCKETS)`) do not make it panic either (the
    /// parser refuses them; the core must not rely on it).
    #[test]
    fn take_never_panics_with_more_than_max_buckets(
        rates in any_rates(MAX_BUCKETS + 1),
        cost in any::<u64>(),
        stored in prop::collection::vec(prop::option::of(any_valid_bucket()), MAX_BUCKETS + 1),
        calls in prop::collection::vec((any_now(), any::<u64>()), 1..=4),
    ) {
        let req = TakeRequest { limits: rates.into_iter().take(MAX_BUCKETS).collect(), cost, penalty: None, jitter_percent: 0, delay_ms: None, settle: Default::default(), reserve: [0; MAX_BUCKETS], partial_min: None };
        let mut buckets = stored;
        let mut penalty = Penalty::default();
        for (now, random) in calls {
            let _ = take(&mut buckets, &mut penalty, &req, now, random);
        }
    }
}

/// `n` rates with any `u64` in each field.
fn any_rates(n: usize) -> impl Strategy<Value = Vec<Rate>> {
    let rate =
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(capacity, tokens, period_ms)| Rate {
            capacity,
            tokens,
            period_ms,
        });
    prop::collection::vec(rate, n)
}

/// Any policy, or none.
fn any_policy() -> impl Strategy<Value = Option<PenaltyPolicy>> {
    prop::option::of(
        (
            any::<u64>(),
            any::<u64>(),
            any::<[u64; 3]>(),
            any::<u64>(),
            any::<bool>(),
        )
            .prop_map(|(threshold, window_ms, box_ms, offenses_ttl_ms, every)| {
                PenaltyPolicy {
                    threshold,
                    window_ms,
                    box_ms,
                    offenses_ttl_ms,
                    every,
                }
            }),
    )
}

/// Fixed regressions found by the properties above.
mod counterexamples {
    use super::*;

    /// `a_probe_after_a_tier_change_has_an_exact_reset`.
    #[test]
    fn a_probe_reset_after_a_tier_change() {
        let a = Rate {
            capacity: 1,
            tokens: 1,
            period_ms: 78,
        };
        let b = Rate {
            capacity: 105,
            tokens: 885,
            period_ms: 65_334,
        };
        let mut state = State::new(1);
        state.call(&req(&[a], 1), T0);
        let probe = state.probe_one(0, b, T0);
        assert_eq!((probe.remaining, probe.reset_ms), (104, 78));
        assert_eq!(state.probe_one(0, b, T0 + 78).remaining, 105);
        assert_eq!(
            state.probe_one(0, b, T0 + 77).remaining,
            104,
            "not full before T0 + reset_ms"
        );
    }

    /// `take_never_panics_with_more_than_max_buckets`.
    #[test]
    fn seventeen_buckets_and_a_rescale() {
        let rate = Rate {
            capacity: 1,
            tokens: 1,
            period_ms: 1,
        };
        let rates = vec![rate; MAX_BUCKETS + 1];
        let mut buckets = vec![None; MAX_BUCKETS + 1];
        buckets[MAX_BUCKETS] = Some(Bucket {
            tat_ms: T0,
            tat_frac: 0,
            tokens: bucket::tick_scale(2),
            period_ms: 1,
        });
        let mut penalty = Penalty::default();
        take(&mut buckets, &mut penalty, &req(&rates, 2), T0, 0);
    }
}
