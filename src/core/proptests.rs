//! Property tests of the core: the algorithms are driven through
//! [`take::take`] (and the codec through `encode`/`decode`) with random
//! rates, costs, clocks and stored states, and checked against invariants
//! derived from the module docs rather than against the implementation.
//!
//! Failure persistence is off (no `proptest-regressions/` files are
//! written); a counterexample found here belongs in a unit test.

use proptest::prelude::*;
use proptest::strategy::Union;
use std::num::NonZeroU64;

use super::bucket::{self, Bucket, Rate};
use super::codec::{decode, encode, CodecError, VERSION};
use super::limits::{MAX_BOX_LEVEL, MAX_BUCKETS, MAX_DURATION_MS, MAX_POINTS, MAX_THRESHOLD};
use super::penalty::{Penalty, PenaltyPolicy};
use super::record::Record;
use super::reply::{Reply, Status};
use super::take::{take, Effects, TakeRequest};
use super::time::{ceil_div, Millis};

/// An arbitrary but realistic start time.
const T0: Millis = 1_700_000_000_000;

/// One hour in milliseconds.
const HOUR_MS: i64 = 3_600_000;

/// A config with `cases` cases and no regression files.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Driving `take`.
// ---------------------------------------------------------------------------

/// The state `take` reads and writes: one optional bucket per key and the
/// first key's penalty.
#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    buckets: Vec<Option<Bucket>>,
    penalty: Penalty,
}

impl State {
    fn new(n: usize) -> Self {
        State {
            buckets: vec![None; n],
            penalty: Penalty::default(),
        }
    }

    /// One call with no jitter.
    fn call(&mut self, req: &TakeRequest, now: Millis) -> (Reply, Effects) {
        take(&mut self.buckets, &mut self.penalty, req, now, 0)
    }

    /// The same call on a copy, leaving `self` untouched.
    fn peek(&self, req: &TakeRequest, now: Millis) -> Reply {
        self.clone().call(req, now).0
    }

    /// A `COST 0` probe of bucket `i` alone under `rate`.
    fn probe_one(&self, i: usize, rate: Rate, now: Millis) -> Reply {
        let mut buckets = [self.buckets[i]];
        take(
            &mut buckets,
            &mut Penalty::default(),
            &req(&[rate], 0),
            now,
            0,
        )
        .0
    }
}

fn req(rates: &[Rate], cost: u64) -> TakeRequest {
    TakeRequest::new(rates, cost)
}

fn with_strikes(rates: &[Rate], cost: u64, policy: PenaltyPolicy) -> TakeRequest {
    TakeRequest {
        penalty: Some(policy),
        ..req(rates, cost)
    }
}

fn i(v: u64) -> i128 {
    i128::from(v)
}

/// Checks that hold for every reply: ranges of each field.
fn check_reply_ranges(reply: &Reply, rates: &[Rate], n: usize) -> Result<(), TestCaseError> {
    prop_assert!(
        reply.binding >= 0 && (reply.binding as usize) < n.max(1),
        "binding {reply:?}"
    );
    let capacity = i64::try_from(rates[reply.binding as usize].capacity).unwrap_or(i64::MAX);
    match reply.status {
        Status::Allowed => {
            prop_assert_eq!(reply.limit, capacity);
            prop_assert!((0..=capacity).contains(&reply.remaining), "{reply:?}");
            prop_assert!(reply.reset_ms >= 0, "{reply:?}");
            prop_assert_eq!(reply.retry_after_ms, 0);
            prop_assert_eq!(reply.box_level, 0);
        }
        Status::Throttled | Status::Delayed => {
            prop_assert_eq!(reply.limit, capacity);
            prop_assert!((0..=capacity).contains(&reply.remaining), "{reply:?}");
            prop_assert!(reply.reset_ms >= 0, "{reply:?}");
            prop_assert!(reply.retry_after_ms >= 1, "{reply:?}");
            prop_assert_eq!(reply.box_level, 0);
        }
        Status::Boxed => {
            prop_assert_eq!(reply.binding, 0);
            prop_assert_eq!(reply.remaining, 0);
            prop_assert!(
                (1..=i64::from(MAX_BOX_LEVEL)).contains(&reply.box_level),
                "{reply:?}"
            );
            prop_assert!(reply.retry_after_ms >= -1, "{reply:?}");
            prop_assert_eq!(reply.retry_after_ms, reply.reset_ms);
            prop_assert_eq!(reply.strikes_remaining, 0);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Strategies.
// ---------------------------------------------------------------------------

/// capacity 1..=1000, tokens 1..=1000, period 1..=100_000 ms.
fn rate() -> impl Strategy<Value = Rate> {
    (1u64..=1000, 1u64..=1000, 1u64..=100_000).prop_map(|(capacity, tokens, period_ms)| Rate {
        capacity,
        tokens,
        period_ms,
    })
}

/// Forward time steps on the scale of `rate`: often 0, often around the
/// time one point takes to refill, sometimes around a full refill.
fn step_for(rate: &Rate) -> BoxedStrategy<u64> {
    let point = rate.period_ms.div_ceil(rate.tokens);
    let full = (rate.capacity * rate.period_ms).div_ceil(rate.tokens);
    prop_oneof![
        4 => Just(0u64),
        3 => 0..=2 * point,
        2 => 0..=full + 1,
        1 => 0..=2 * rate.period_ms,
    ]
    .boxed()
}

/// Forward steps on the scale of any of `rates`.
fn step_for_any(rates: &[Rate]) -> Union<BoxedStrategy<u64>> {
    Union::new(rates.iter().map(step_for))
}

fn max_capacity(rates: &[Rate]) -> u64 {
    rates.iter().map(|r| r.capacity).max().unwrap_or(1)
}

fn min_capacity(rates: &[Rate]) -> u64 {
    rates.iter().map(|r| r.capacity).min().unwrap_or(1)
}

/// `n` rates and up to `len` calls `(forward step, cost 0..=max capacity)`.
fn run(
    n: std::ops::RangeInclusive<usize>,
    len: usize,
) -> impl Strategy<Value = (Vec<Rate>, Vec<(u64, u64)>)> {
    prop::collection::vec(rate(), n).prop_flat_map(move |rates| {
        let calls =
            prop::collection::vec((step_for_any(&rates), 0..=max_capacity(&rates)), 0..=len);
        (Just(rates), calls)
    })
}

/// A penalty policy on a small scale, so that boxes trip and expire.
fn small_policy() -> impl Strategy<Value = PenaltyPolicy> {
    let box_ms = prop_oneof![1 => Just(0u64), 4 => 1u64..=100_000];
    (
        1u64..=5,
        1u64..=100_000,
        [box_ms.clone(), box_ms.clone(), box_ms],
        0u64..=1_000_000,
    )
        .prop_map(
            |(threshold, window_ms, box_ms, offenses_ttl_ms)| PenaltyPolicy {
                threshold,
                window_ms,
                box_ms,
                offenses_ttl_ms,
            },
        )
}

/// A stored bucket that satisfies [`Bucket::is_valid`], over the whole
/// range of each field, with a bias towards the edges.
fn any_valid_bucket() -> impl Strategy<Value = Bucket> {
    let wide = prop_oneof![Just(1u64), 1u64..=10, 1u64..=u64::MAX, Just(u64::MAX)];
    let tat = prop_oneof![
        Just(i64::MIN),
        Just(i64::MAX),
        Just(0i64),
        T0 - HOUR_MS..=T0 + HOUR_MS,
        any::<i64>()
    ];
    (tat, wide.clone(), wide, any::<u64>(), any::<bool>()).prop_map(
        |(tat_ms, tokens, period_ms, r, last)| Bucket {
            tat_ms,
            tat_frac: if last { tokens - 1 } else { r % tokens },
            tokens: bucket::tick_scale(tokens),
            period_ms,
        },
    )
}

/// A penalty that satisfies [`Penalty::is_valid`], arbitrary elsewhere.
fn any_valid_penalty() -> impl Strategy<Value = Penalty> {
    let time = prop_oneof![
        Just(i64::MIN),
        Just(i64::MAX),
        Just(0i64),
        T0 - HOUR_MS..=T0 + HOUR_MS,
        any::<i64>()
    ];
    let count = prop_oneof![Just(0u64), 0u64..=10, Just(u64::MAX), any::<u64>()];
    (
        count.clone(),
        time.clone(),
        count,
        time.clone(),
        0..=MAX_BOX_LEVEL,
        time,
    )
        .prop_map(
            |(strikes, strikes_until, offenses, offenses_until, box_level, box_until)| Penalty {
                strikes,
                strikes_until,
                offenses,
                offenses_until,
                box_level,
                box_until,
            },
        )
}

fn any_valid_record() -> impl Strategy<Value = Record> {
    (
        prop::option::of(any_valid_bucket()),
        prop::option::of(any_valid_penalty()),
    )
        .prop_map(|(bucket, penalty)| {
            let mut record = Record::default();
            record.bucket = bucket;
            record.penalty = penalty.map(Box::new);
            record
        })
}

/// 1, the maximum, or anything in between.
fn up_to(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![Just(1u64), Just(max), 1..=max]
}

/// Any instant, biased to the edges of `i64`.
fn any_now() -> impl Strategy<Value = Millis> {
    prop_oneof![
        Just(i64::MIN),
        Just(i64::MAX),
        Just(i64::MAX - 1),
        Just(0i64),
        T0 - HOUR_MS..=T0 + HOUR_MS,
        any::<i64>()
    ]
}

/// Any request whose numbers are inside [`crate::core::limits`].
fn request_within_limits() -> impl Strategy<Value = TakeRequest> {
    let rate = (up_to(MAX_POINTS), up_to(MAX_POINTS), up_to(MAX_DURATION_MS)).prop_map(
        |(capacity, tokens, period_ms)| Rate {
            capacity,
            tokens,
            period_ms,
        },
    );
    let box_ms = prop_oneof![Just(0u64), up_to(MAX_DURATION_MS)];
    let policy = (
        up_to(MAX_THRESHOLD),
        up_to(MAX_DURATION_MS),
        [box_ms.clone(), box_ms.clone(), box_ms],
        0..=MAX_DURATION_MS,
    )
        .prop_map(
            |(threshold, window_ms, box_ms, offenses_ttl_ms)| PenaltyPolicy {
                threshold,
                window_ms,
                box_ms,
                offenses_ttl_ms,
            },
        );
    let cost = prop_oneof![Just(0u64), up_to(MAX_POINTS)];
    (
        prop::collection::vec(rate, 1..=MAX_BUCKETS),
        cost,
        prop::option::of(policy),
        0u8..=100,
        prop::option::of(up_to(MAX_DURATION_MS)),
    )
        .prop_map(
            |(rates, cost, penalty, jitter_percent, delay_ms)| TakeRequest {
                limits: rates.into_iter().take(MAX_BUCKETS).collect(),
                cost,
                penalty,
                jitter_percent,
                delay_ms,
            },
        )
}

// ---------------------------------------------------------------------------
// 1. Never over-admits.
// ---------------------------------------------------------------------------

/// For every pair of admitted calls `i <= j` with a cost, the points
/// admitted by calls `i..=j` fit in every bucket's rate:
/// `sum * period <= capacity * period + travel * tokens`, that is
/// `sum <= capacity + floor(travel * tokens / period)`, where `travel` is
/// how far the clock went forward from call `i` to call `j` (backward steps
/// not subtracted): `t_j - t_i` when the clock only goes forward. With `i`
/// the first admitted call this is the bound from the start (a throttled
/// first call only makes the window from the start longer; a probe charges
/// nothing, so it starts no window).
fn check_never_over_admits(
    rates: &[Rate],
    times_and_costs: &[(Millis, u64)],
) -> Result<(), TestCaseError> {
    let mut state = State::new(rates.len());
    // (time, forward travel so far, cost) of every admitted call with a cost.
    let mut admitted: Vec<(Millis, i64, u64)> = Vec::new();
    let mut travel = 0i64;
    let mut last: Option<Millis> = None;
    for &(now, cost) in times_and_costs {
        travel += last.map_or(0, |last| (now - last).max(0));
        last = Some(now);
        let (reply, _) = state.call(&req(rates, cost), now);
        check_reply_ranges(&reply, rates, rates.len())?;
        if reply.status != Status::Allowed || cost == 0 {
            continue;
        }
        admitted.push((now, travel, cost));
        let mut sum = 0i128;
        for &(since, travel_then, c) in admitted.iter().rev() {
            sum += i(c);
            let forward = i128::from(travel - travel_then);
            for r in rates {
                let allowance = i(r.capacity) * i(r.period_ms) + forward * i(r.tokens);
                prop_assert!(
                    sum * i(r.period_ms) <= allowance,
                    "{sum} points admitted from {since} to {now} ({forward} ms forward) exceed {r:?}"
                );
            }
        }
    }
    Ok(())
}

/// Forward steps turned into absolute times from [`T0`].
fn times(calls: &[(u64, u64)]) -> Vec<(Millis, u64)> {
    let mut now = T0;
    calls
        .iter()
        .map(|&(step, cost)| {
            now += step as i64;
            (now, cost)
        })
        .collect()
}

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

/// Whether bucket `i` is in a `states_changed` bit set.
fn changed(set: u32, i: usize) -> bool {
    set >> i & 1 == 1
}

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
            if !changed(fx.states_changed, k) {
                prop_assert_eq!(
                    state.buckets[k],
                    before.buckets[k],
                    "bucket {} changed unreported",
                    k
                );
            }
        }
        prop_assert!(
            fx.states_changed >> n == 0,
            "bits beyond {} buckets: {:?}",
            n,
            fx
        );
        if !fx.penalty_changed {
            prop_assert_eq!(state.penalty, before.penalty);
        }
        if cost == 0 {
            prop_assert_eq!(&state, &before, "a probe changed the state: {:?}", reply);
            prop_assert_eq!(fx, Effects::default());
        }
        if reply.status == Status::Allowed {
            prop_assert_eq!(
                state.penalty,
                before.penalty,
                "an allowed call touched the penalty"
            );
            let all = if cost > 0 { (1u32 << n) - 1 } else { 0 };
            prop_assert_eq!(fx.states_changed, all);
            prop_assert!(!fx.penalty_changed && fx.tripped.is_none());
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
            if changed(fx.states_changed, k) {
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
            prop_assert_eq!(fx.states_changed, 0);
        }
        match reply.status {
            Status::Throttled => {
                prop_assert!(fx.tripped.is_none());
                if policy.is_none() {
                    prop_assert_eq!(state.penalty, before.penalty);
                    prop_assert!(!fx.penalty_changed);
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
                    prop_assert!(fx.penalty_changed);
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
) -> Result<(State, Millis, Reply), TestCaseError> {
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
        let (jittered, _) = take(&mut state.buckets.clone(), &mut state.penalty.clone(), &call, now, random);
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
// 5. Backward clock steps.
// ---------------------------------------------------------------------------

/// Time steps in either direction, with jumps of an hour back and forth.
fn any_step() -> impl Strategy<Value = i64> {
    prop_oneof![
        2 => Just(-HOUR_MS),
        1 => Just(HOUR_MS),
        3 => -1000i64..=0,
        4 => 0i64..=1000,
        2 => 0i64..=100_000,
        1 => -1_000_000_000_000i64..=1_000_000_000_000,
    ]
}

/// Up to 200 calls with steps of any sign and costs up to the largest
/// capacity, on one to three buckets.
fn clock_steps_run() -> impl Strategy<Value = (Vec<Rate>, Vec<(Millis, u64)>)> {
    prop::collection::vec(rate(), 1..=3)
        .prop_flat_map(|rates| {
            let calls = prop::collection::vec((any_step(), 0..=max_capacity(&rates)), 1..=200);
            (Just(rates), calls)
        })
        .prop_map(|(rates, calls)| {
            let mut now = T0;
            let timed = calls
                .into_iter()
                .map(|(step, cost)| {
                    now += step;
                    (now, cost)
                })
                .collect();
            (rates, timed)
        })
}

proptest! {
    #![proptest_config(config(256))]

    /// With steps of any sign (including jumps of -1 hour), `take` never
    /// panics, replies stay in range, and the points admitted between two
    /// admitted calls are bounded by how far the clock went *forward*
    /// between them: `sum <= capacity + floor(travel * tokens / period_ms)`
    /// for every bucket. A backward step is never turned into points by
    /// itself; going forward again over time already seen refills.
    #[test]
    fn clock_steps_grant_nothing_beyond_forward_travel((rates, timed) in clock_steps_run()) {
        check_never_over_admits(&rates, &timed)?;
    }

    /// The stronger form: time already seen refills only once. The points
    /// admitted from the first charge at `t0` up to any call never exceed
    /// `capacity + (latest - t0) * tokens / period_ms`, where `latest` is
    /// the latest clock reading so far: after a backward step the bucket
    /// refills only as the clock passes again the time it had reached.
    #[test]
    fn backward_clock_steps_grant_nothing((rates, timed) in clock_steps_run()) {
        let mut state = State::new(rates.len());
        let mut t0 = None;
        let mut latest = i64::MIN;
        let mut total = 0i128;
        for (now, cost) in timed {
            latest = latest.max(now);
            let (reply, _) = state.call(&req(&rates, cost), now);
            if reply.status == Status::Allowed && cost > 0 {
                total += i(cost);
                t0 = t0.or(Some(now));
            }
            let Some(t0) = t0 else { continue };
            for r in &rates {
                let bound = i(r.capacity)
                    + (i128::from(latest - t0) * i(r.tokens)).div_euclid(i(r.period_ms));
                prop_assert!(total <= bound, "{total} points admitted by {latest} exceed {r:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// 6. Tier change.
// ---------------------------------------------------------------------------

/// Two rates A and B; often B keeps some of A's parameters (only the
/// capacity changes, or only the tokens, or only the period).
fn tier_change() -> impl Strategy<Value = (Rate, Rate)> {
    (rate(), rate(), 0u8..5).prop_map(|(a, mut b, keep)| {
        match keep {
            0 => b.capacity = a.capacity,
            1 => b.tokens = a.tokens,
            2 => b.period_ms = a.period_ms,
            3 => {
                b = Rate {
                    capacity: b.capacity,
                    ..a
                }
            }
            _ => {}
        }
        (a, b)
    })
}

proptest! {
    #![proptest_config(config(256))]

    /// Charge a bucket with rate A, then call with rate B at some instant
    /// `t`. The points spent under A at `t` are
    /// `s = max(0, (tat_ms - t) * tokens + tat_frac) / period_A` (a
    /// fraction); B keeps them, rounded up so no fraction is granted: B's
    /// debt is `d = ceil(s * period_B)` ticks (which may exceed an empty
    /// bucket after a downgrade), so `remaining_B == max(0, capacity_B -
    /// ceil(s))`, `reset_ms_B` of a probe is when A's stored state is full,
    /// and a cost `c` under B is admitted at `t` exactly when
    /// `d + c * period_B <= capacity_B * period_B`. Under A itself,
    /// `remaining_A == capacity_A - ceil(s)`. A throttled call under B
    /// rewrites the bucket exactly when its scale differs from B's, at B's
    /// scale and with the same points spent; from then on B's
    /// `retry_after_ms` is exact. An admitted call's `reset_ms` under B is
    /// exact.
    #[test]
    fn a_tier_change_keeps_spent_points(
        (a, b, history, delta, cost_b) in tier_change().prop_flat_map(|(a, b)| {
            let history = prop::collection::vec((step_for(&a), 0..=a.capacity), 1..=30);
            let delta = prop_oneof![3 => Just(0u64), 2 => step_for(&a)];
            (Just(a), Just(b), history, delta, 0..=b.capacity)
        }),
    ) {
        let mut state = State::new(1);
        let mut now = T0;
        for (s, c) in history {
            now += s as i64;
            state.call(&req(&[a], c), now);
        }
        let t = now + delta as i64;
        let stored = state.buckets[0].map_or(Ok(0), |bk| {
            prop_assert_eq!((bk.tokens.get(), bk.period_ms), (a.tokens, a.period_ms));
            Ok((i128::from(bk.tat_ms) - i128::from(t)) * i(bk.tokens.get()) + i(bk.tat_frac))
        })?.max(0);
        let spent = ceil_div(stored, i(a.period_ms));
        prop_assert!(spent <= i(a.capacity), "spent {spent} of {a:?}");

        let under_a = state.probe_one(0, a, t);
        prop_assert_eq!(i128::from(under_a.remaining), i(a.capacity) - spent);

        let under_b = state.probe_one(0, b, t);
        let expected = (i(b.capacity) - spent).max(0);
        prop_assert_eq!(i128::from(under_b.remaining), expected, "spent {} of {:?}, then {:?}", spent, a, b);
        let raw_debt_b = ceil_div(stored * i(b.period_ms), i(a.period_ms));
        // A probe writes nothing: the bucket is full when A's state says so.
        prop_assert_eq!(i128::from(under_b.reset_ms), ceil_div(stored, i(a.tokens)));

        let before = state.clone();
        let (reply, fx) = state.call(&req(&[b], cost_b), t);
        let fits_b = raw_debt_b + i(cost_b) * i(b.period_ms) <= i(b.capacity) * i(b.period_ms);
        prop_assert_eq!(reply.status == Status::Allowed, fits_b,
            "cost {} under {:?} with {} spent", cost_b, b, spent);
        match reply.status {
            Status::Throttled => {
                // A throttled probe (cost 0: B's capacity is below what was
                // spent) writes nothing, even at another scale.
                let foreign = (a.tokens, a.period_ms) != (b.tokens, b.period_ms);
                let rescaled = foreign && cost_b > 0;
                prop_assert_eq!(changed(fx.states_changed, 0), rescaled);
                if rescaled {
                    let bk = state.buckets[0];
                    prop_assert_eq!(bk.map(|bk| (bk.tokens.get(), bk.period_ms)), Some((b.tokens, b.period_ms)));
                } else {
                    prop_assert_eq!(&state, &before);
                }
                // The same points spent...
                prop_assert_eq!(state.probe_one(0, b, t).remaining, under_b.remaining);
                // ...and B's wait is exact from now on (a probe of a foreign
                // state converts it at every read without storing it: its
                // wait is B's reading of A's state, not checked here).
                if foreign && !rescaled {
                    return Ok(());
                }
                let r = reply.retry_after_ms;
                prop_assert_eq!(state.peek(&req(&[b], cost_b), t + r).status, Status::Allowed);
                prop_assert_eq!(state.peek(&req(&[b], cost_b), t + r - 1).status, Status::Throttled);
            }
            _ if cost_b > 0 => {
                let z = reply.reset_ms;
                prop_assert_eq!(state.probe_one(0, b, t + z).remaining, b.capacity as i64);
                if z > 0 {
                    prop_assert!(state.probe_one(0, b, t + z - 1).remaining < b.capacity as i64);
                }
            }
            _ => prop_assert_eq!(&state, &before),
        }
    }

    /// A `COST 0` probe under rate B of a bucket last charged under rate A
    /// replies a `reset_ms = z` after which the bucket really is full
    /// under B: at `t + z` a probe under B reports `remaining ==
    /// capacity_B` (property 4, across a tier change). A probe writes
    /// nothing, so the bucket keeps A's scale and refills at A's speed
    /// until a call rewrites it; its `reset_ms` is read from the stored
    /// state, not computed at B's speed.
    #[test]
    fn a_probe_after_a_tier_change_has_an_exact_reset(
        (a, b, history) in tier_change().prop_flat_map(|(a, b)| {
            let history = prop::collection::vec((step_for(&a), 0..=a.capacity), 1..=30);
            (Just(a), Just(b), history)
        }),
    ) {
        let mut state = State::new(1);
        let mut now = T0;
        for (s, c) in history {
            now += s as i64;
            state.call(&req(&[a], c), now);
        }
        let z = state.probe_one(0, b, now).reset_ms;
        let later = state.probe_one(0, b, now + z);
        prop_assert_eq!(later.remaining, b.capacity as i64, "not full at now + reset_ms ({}) under {:?} after {:?}", z, b, a);
    }
}

// ---------------------------------------------------------------------------
// 7. Codec.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(512))]

    /// Every valid record survives `decode(encode(r))`, and its encoding
    /// starts with [`VERSION`].
    #[test]
    fn codec_round_trips(record in any_valid_record()) {
        let bytes = encode(&record);
        prop_assert_eq!(bytes[0], VERSION);
        prop_assert_eq!(decode(&bytes), Ok(record));
    }

    /// Any bytes decode without panicking; what decodes is valid and
    /// canonical (encodes back to the same bytes).
    #[test]
    fn codec_never_panics_on_arbitrary_bytes(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            prop::collection::vec(any::<u8>(), 0..64).prop_map(|mut v| { v.insert(0, VERSION); v }),
        ],
    ) {
        if let Ok(record) = decode(&bytes) {
            prop_assert!(record.is_valid());
            prop_assert_eq!(encode(&record), bytes);
        }
    }

    /// Every strict prefix of a valid encoding is refused.
    #[test]
    fn codec_refuses_truncations(record in any_valid_record()) {
        let bytes = encode(&record);
        for len in 0..bytes.len() {
            prop_assert!(decode(&bytes[..len]).is_err(), "prefix of {} of {} bytes decoded", len, bytes.len());
        }
    }

    /// Flipping bits of any one byte of a valid encoding either is refused
    /// or decodes to a different valid record whose encoding is exactly the
    /// mutated bytes (decoding accepts canonical bytes only).
    #[test]
    fn codec_single_byte_flips_are_refused_or_canonical(
        record in any_valid_record(),
        at in any::<prop::sample::Index>(),
        mask in 1u8..=255,
    ) {
        let mut bytes = encode(&record);
        let k = at.index(bytes.len());
        bytes[k] ^= mask;
        match decode(&bytes) {
            Err(e) => {
                // A flipped version byte naming an older version reads the
                // body in that version's layout, and is refused as malformed.
                if k == 0 && !(1..=VERSION).contains(&bytes[0]) {
                    prop_assert_eq!(e, CodecError::UnknownVersion);
                }
            }
            Ok(other) => {
                prop_assert!(other.is_valid());
                prop_assert_ne!(&other, &record);
                prop_assert_eq!(encode(&other), bytes);
            }
        }
    }

    /// A record that breaks an invariant (`tat_frac >= tokens`, a zero
    /// scale, `box_level > 3`) is refused even when well-formed.
    #[test]
    fn codec_refuses_invalid_records(
        record in any_valid_record(),
        breakage in 0u8..4,
        junk in any::<u64>(),
        level in (MAX_BOX_LEVEL + 1)..=u8::MAX,
    ) {
        let mut record = record;
        match breakage {
            0 => {
                let mut b = record.bucket.unwrap_or(Bucket { tat_ms: T0, tat_frac: 0, tokens: NonZeroU64::MIN, period_ms: 1 });
                b.tat_frac = b.tokens.get().saturating_add(junk % 3).max(b.tokens.get());
                record.bucket = Some(b);
            }
            1 => {
                // A zero scale cannot be held in a `Bucket`: write its bytes.
                let b = record.bucket.unwrap_or(Bucket { tat_ms: T0, tat_frac: 0, tokens: NonZeroU64::MIN, period_ms: 1 });
                let fields = (
                    Some((b.tat_ms, 0u64, 0u64, b.period_ms)),
                    &record.penalty,
                    record.leases(),
                    record.window(),
                    record.quota(),
                );
                let mut bytes = vec![VERSION];
                prop_assert!(rmp_serde::encode::write(&mut bytes, &fields).is_ok());
                prop_assert_eq!(decode(&bytes), Err(CodecError::Malformed));
                return Ok(());
            }
            2 => {
                let mut b = record.bucket.unwrap_or(Bucket { tat_ms: T0, tat_frac: 0, tokens: NonZeroU64::MIN, period_ms: 1 });
                b.period_ms = 0;
                record.bucket = Some(b);
            }
            _ => {
                let mut p = record.penalty_or_default();
                p.box_level = level;
                record.penalty = Some(Box::new(p));
            }
        }
        prop_assert!(!record.is_valid());
        prop_assert_eq!(decode(&encode(&record)), Err(CodecError::Malformed));
    }
}

// ---------------------------------------------------------------------------
// 8. Penalty ladder.
// ---------------------------------------------------------------------------

/// A box duration: manual (0) one time in five.
fn box_duration() -> impl Strategy<Value = u64> {
    prop_oneof![1 => Just(0u64), 4 => 1u64..=1_000_000]
}

/// One bucket that holds one point and takes ~31 years to refill it: after
/// the first call every `COST 1` call is throttled.
const SCARCE: Rate = Rate {
    capacity: 1,
    tokens: 1,
    period_ms: 1_000_000_000_000,
};

proptest! {
    #![proptest_config(config(128))]

    /// With a threshold `h` and consecutive throttled calls within one
    /// window: calls 1..h-1 are throttled with `strikes_remaining` counting
    /// down, the `h`-th trips the box (status -1). While boxed every call is
    /// -1 with `retry_after_ms` = the box's time left and changes neither
    /// buckets nor penalty. The box ends exactly at its deadline. Remembered
    /// offenses make successive trips go to levels 1, 2, 3, 3; a level with
    /// duration 0 is manual (`retry_after_ms == -1`, boxed until released).
    #[test]
    fn the_penalty_ladder(
        threshold in 1u64..=50,
        window_ms in 60_000u64..=600_000,
        box_ms in [box_duration(), box_duration(), box_duration()],
        gaps in prop::collection::vec(0i64..=1000, 4 * 50),
        boxed_offsets in prop::collection::vec(any::<prop::sample::Index>(), 4 * 3),
    ) {
        let policy = PenaltyPolicy { threshold, window_ms, box_ms, offenses_ttl_ms: 100_000_000 };
        let rates = [SCARCE];
        let call = with_strikes(&rates, 1, policy);
        let mut state = State::new(1);
        let mut now = T0;
        let (first, _) = state.call(&call, now);
        prop_assert_eq!(first.status, Status::Allowed);
        prop_assert_eq!(first.strikes_remaining, threshold as i64);
        let mut gaps = gaps.into_iter();
        let mut offsets = boxed_offsets.into_iter();
        let mut levels = Vec::new();
        for trip in 0..4 {
            // Strikes 1..=threshold, all inside one window.
            let mut tripped_at = None;
            for k in 1..=threshold {
                now += gaps.next().unwrap_or(0);
                let before = state.clone();
                let (reply, fx) = state.call(&call, now);
                prop_assert_eq!(&state.buckets, &before.buckets);
                prop_assert!(fx.penalty_changed && fx.states_changed == 0);
                if k < threshold {
                    prop_assert_eq!(reply.status, Status::Throttled, "trip {} strike {} of {}", trip, k, threshold);
                    prop_assert_eq!(reply.strikes_remaining, (threshold - k) as i64);
                    prop_assert!(fx.tripped.is_none());
                } else {
                    prop_assert_eq!(reply.status, Status::Boxed, "trip {} strike {} of {}", trip, k, threshold);
                    let level = (trip + 1).min(3);
                    let duration = box_ms[level - 1];
                    prop_assert_eq!(reply.box_level, level as i64);
                    prop_assert_eq!(fx.tripped.map(|b| b.level), Some(level as u8));
                    let expected_retry = if duration == 0 { -1 } else { duration as i64 };
                    prop_assert_eq!(reply.retry_after_ms, expected_retry);
                    prop_assert_eq!(reply.limit, 1);
                    levels.push(level);
                    tripped_at = Some((now, duration));
                }
            }
            let Some((at, duration)) = tripped_at else {
                return Err(TestCaseError::fail("no trip"));
            };
            // Boxed: nothing moves, whatever the call.
            let span = if duration == 0 { 1_000_000_000_000_000 } else { duration as usize };
            for _ in 0..3 {
                let offset = offsets.next().map_or(0, |o| o.index(span)) as i64;
                for cost in [0, 1] {
                    let before = state.clone();
                    let (reply, fx) = state.call(&with_strikes(&rates, cost, policy), at + offset);
                    prop_assert_eq!(reply.status, Status::Boxed);
                    prop_assert_eq!(reply.box_level, levels[levels.len() - 1] as i64);
                    let left = if duration == 0 { -1 } else { duration as i64 - offset };
                    prop_assert_eq!(reply.retry_after_ms, left);
                    prop_assert_eq!(fx, Effects::default());
                    prop_assert_eq!(&state, &before);
                }
            }
            if duration == 0 {
                prop_assert!(state.penalty.release(false, at));
                now = at;
            } else {
                // The box is over exactly at its deadline: the next call is
                // an ordinary strike (or a new trip when the threshold is 1).
                let end = at + duration as i64;
                prop_assert_eq!(state.peek(&call, end - 1).status, Status::Boxed);
                let next = state.peek(&call, end);
                prop_assert!(next.status == Status::Throttled || (threshold == 1 && next.status == Status::Boxed));
                now = end;
            }
        }
        prop_assert_eq!(levels, vec![1, 2, 3, 3]);
    }

    /// Strikes at arbitrary (non-decreasing) times trip the box exactly when
    /// `threshold` of them fall in one window, a window opening at the first
    /// strike after the previous one closed. Checked against a small model.
    #[test]
    fn strikes_count_within_their_window(
        (threshold, window_ms, gaps) in (1u64..=10, 1i64..=10_000).prop_flat_map(|(threshold, window)| {
            // Gaps that often land exactly on the end of a window.
            let gap = prop_oneof![Just(0i64), Just(window - 1), Just(window), 0..=window / 4 + 1, 0..=2 * window];
            (Just(threshold), Just(window as u64), prop::collection::vec(gap, 1..=100))
        }),
    ) {
        let policy = PenaltyPolicy { threshold, window_ms, box_ms: [1_000_000_000; 3], offenses_ttl_ms: 0 };
        let rates = [SCARCE];
        let call = with_strikes(&rates, 1, policy);
        let mut state = State::new(1);
        state.call(&call, T0);
        let mut now = T0;
        let (mut count, mut window_end) = (0u64, i64::MIN);
        for gap in gaps {
            now += gap;
            if now >= window_end {
                count = 0;
                window_end = now + window_ms as i64;
            }
            count += 1;
            let (reply, _) = state.call(&call, now);
            if count == threshold {
                prop_assert_eq!(reply.status, Status::Boxed, "strike {} in the window ending {}", count, window_end);
                prop_assert_eq!(reply.box_level, 1);
                break;
            }
            prop_assert_eq!(reply.status, Status::Throttled);
            prop_assert_eq!(reply.strikes_remaining, (threshold - count) as i64);
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
            let (reply, _) = take(&mut buckets, &mut penalty, &req, now, random);
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
        let req = TakeRequest { limits: rates.into_iter().take(MAX_BUCKETS).collect(), cost, penalty: policy, jitter_percent, delay_ms: None };
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
        let req = TakeRequest { limits: rates.into_iter().take(MAX_BUCKETS).collect(), cost, penalty: None, jitter_percent: 0, delay_ms: None };
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
        (any::<u64>(), any::<u64>(), any::<[u64; 3]>(), any::<u64>()).prop_map(
            |(threshold, window_ms, box_ms, offenses_ttl_ms)| PenaltyPolicy {
                threshold,
                window_ms,
                box_ms,
                offenses_ttl_ms,
            },
        ),
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
