//! The core's test kit: the clocks, configs, strategies and drivers that
//! the property and table tests of every algorithm share.
//!
//! Failure persistence is off in [`config`] (no `proptest-regressions/`
//! files are written); a counterexample found belongs in a unit test.

#![allow(dead_code)]

use proptest::prelude::*;
use proptest::strategy::Union;

pub use super::bucket::{self, Bucket, Rate};
pub use super::codec::{decode, encode};
pub use super::decision::{Decision, Status};
pub use super::limits::{MAX_BOX_LEVEL, MAX_BUCKETS, MAX_DURATION_MS, MAX_POINTS, MAX_THRESHOLD};
pub use super::penalty::{Penalty, PenaltyPolicy};
pub use super::record::Record;
pub use super::take::{take, Effects, KeySet, TakeRequest};
pub use super::time::{ceil_div, Millis};
pub use super::window::{Entry, WindowState};
use crate::adapter::reply::to_wire;

/// An arbitrary but realistic start time.
pub const T0: Millis = 1_700_000_000_000;

/// One hour in milliseconds.
pub const HOUR_MS: i64 = 3_600_000;

/// A config with `cases` cases and no regression files.
pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A decision as the reply's 8 integers.
pub fn wire(d: &Decision) -> [i64; 8] {
    to_wire(d)
}

/// The reply's 8 integers of a decision.
pub trait ToWire {
    /// `[status, limit, remaining, reset_ms, retry_after_ms, box_level,
    /// strikes_remaining, binding]`.
    fn wire(&self) -> [i64; 8];
}

impl ToWire for Decision {
    fn wire(&self) -> [i64; 8] {
        to_wire(self)
    }
}

/// A decision field by field as the wire writes it (what commands.md
/// states its invariants on), the status kept typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wire {
    pub status: Status,
    pub limit: i64,
    pub remaining: i64,
    pub reset_ms: i64,
    pub retry_after_ms: i64,
    pub box_level: i64,
    pub strikes_remaining: i64,
    pub binding: i64,
}

impl From<Decision> for Wire {
    fn from(d: Decision) -> Wire {
        let [_, limit, remaining, reset_ms, retry_after_ms, box_level, strikes_remaining, binding] =
            to_wire(&d);
        Wire {
            status: d.status,
            limit,
            remaining,
            reset_ms,
            retry_after_ms,
            box_level,
            strikes_remaining,
            binding,
        }
    }
}

/// A limiter of one bucket: `capacity` points, `tokens` per `period_ms`.
pub fn rate_of(capacity: u64, tokens: u64, period_ms: u64) -> Rate {
    Rate {
        capacity,
        tokens,
        period_ms,
    }
}

// ---------------------------------------------------------------------------
// Driving `take`.
// ---------------------------------------------------------------------------

/// The state `take` reads and writes: one optional bucket per key and the
/// first key's penalty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub buckets: Vec<Option<Bucket>>,
    pub penalty: Penalty,
}

impl State {
    pub fn new(n: usize) -> Self {
        State {
            buckets: vec![None; n],
            penalty: Penalty::default(),
        }
    }

    /// One call with no jitter.
    pub fn call(&mut self, req: &TakeRequest, now: Millis) -> (Wire, Effects) {
        let (d, fx) = take(&mut self.buckets, &mut self.penalty, req, now, 0);
        (d.into(), fx)
    }

    /// The same call on a copy, leaving `self` untouched.
    pub fn peek(&self, req: &TakeRequest, now: Millis) -> Wire {
        self.clone().call(req, now).0
    }

    /// A `COST 0` probe of bucket `i` alone under `rate`.
    pub fn probe_one(&self, i: usize, rate: Rate, now: Millis) -> Wire {
        let mut buckets = [self.buckets[i]];
        take(
            &mut buckets,
            &mut Penalty::default(),
            &req(&[rate], 0),
            now,
            0,
        )
        .0
        .into()
    }
}

pub fn req(rates: &[Rate], cost: u64) -> TakeRequest {
    TakeRequest::new(rates, cost)
}

pub fn with_strikes(rates: &[Rate], cost: u64, policy: PenaltyPolicy) -> TakeRequest {
    TakeRequest {
        penalty: Some(policy),
        ..req(rates, cost)
    }
}

pub fn i(v: u64) -> i128 {
    i128::from(v)
}

/// Checks that hold for every reply: ranges of each field.
pub fn check_reply_ranges(reply: &Wire, rates: &[Rate], n: usize) -> Result<(), TestCaseError> {
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
            // Negative when the bucket holds more than its capacity admits
            // (a debt, a lowered capacity, a backward clock step).
            prop_assert_eq!(reply.limit, capacity);
            prop_assert!(reply.remaining <= capacity, "{reply:?}");
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
pub fn rate() -> impl Strategy<Value = Rate> {
    (1u64..=1000, 1u64..=1000, 1u64..=100_000).prop_map(|(capacity, tokens, period_ms)| Rate {
        capacity,
        tokens,
        period_ms,
    })
}

/// Forward time steps on the scale of `rate`: often 0, often around the
/// time one point takes to refill, sometimes around a full refill.
pub fn step_for(rate: &Rate) -> BoxedStrategy<u64> {
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
pub fn step_for_any(rates: &[Rate]) -> Union<BoxedStrategy<u64>> {
    Union::new(rates.iter().map(step_for))
}

pub fn max_capacity(rates: &[Rate]) -> u64 {
    rates.iter().map(|r| r.capacity).max().unwrap_or(1)
}

pub fn min_capacity(rates: &[Rate]) -> u64 {
    rates.iter().map(|r| r.capacity).min().unwrap_or(1)
}

/// `n` rates and up to `len` calls `(forward step, cost 0..=max capacity)`.
pub fn run(
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
pub fn small_policy() -> impl Strategy<Value = PenaltyPolicy> {
    let box_ms = prop_oneof![1 => Just(0u64), 4 => 1u64..=100_000];
    (
        1u64..=5,
        1u64..=100_000,
        [box_ms.clone(), box_ms.clone(), box_ms],
        0u64..=1_000_000,
        any::<bool>(),
    )
        .prop_map(
            |(threshold, window_ms, box_ms, offenses_ttl_ms, every)| PenaltyPolicy {
                threshold,
                window_ms,
                box_ms,
                offenses_ttl_ms,
                every,
            },
        )
}

/// A stored bucket that satisfies [`Bucket::is_valid`], over the whole
/// range of each field, with a bias towards the edges.
pub fn any_valid_bucket() -> impl Strategy<Value = Bucket> {
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
pub fn any_valid_penalty() -> impl Strategy<Value = Penalty> {
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
        time.clone(),
        time,
    )
        .prop_map(
            |(strikes, strikes_until, offenses, offenses_until, box_level, box_until, retry_at)| {
                Penalty {
                    strikes,
                    strikes_until,
                    offenses,
                    offenses_until,
                    box_level,
                    box_until,
                    retry_at,
                }
            },
        )
}

pub fn any_valid_record() -> impl Strategy<Value = Record> {
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
pub fn up_to(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![Just(1u64), Just(max), 1..=max]
}

/// Any instant, biased to the edges of `i64`.
pub fn any_now() -> impl Strategy<Value = Millis> {
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
pub fn request_within_limits() -> impl Strategy<Value = TakeRequest> {
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
        any::<bool>(),
    )
        .prop_map(
            |(threshold, window_ms, box_ms, offenses_ttl_ms, every)| PenaltyPolicy {
                threshold,
                window_ms,
                box_ms,
                offenses_ttl_ms,
                every,
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
                settle: Default::default(),
                reserve: [0; MAX_BUCKETS],
                partial_min: None,
            },
        )
}

/// For every pair of admitted calls `i <= j` with a cost, the points
/// admitted by calls `i..=j` fit in every bucket's rate:
/// `sum * period <= capacity * period + travel * tokens`, that is
/// `sum <= capacity + floor(travel * tokens / period)`, where `travel` is
/// how far the clock went forward from call `i` to call `j` (backward steps
/// not subtracted): `t_j - t_i` when the clock only goes forward. With `i`
/// the first admitted call this is the bound from the start (a throttled
/// first call only makes the window from the start longer; a probe charges
/// nothing, so it starts no window).
pub fn check_never_over_admits(
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
pub fn times(calls: &[(u64, u64)]) -> Vec<(Millis, u64)> {
    let mut now = T0;
    calls
        .iter()
        .map(|&(step, cost)| {
            now += step as i64;
            (now, cost)
        })
        .collect()
}

/// A window state of any mode with any fields, valid or not.
pub fn any_window_state() -> impl Strategy<Value = WindowState> {
    let log = prop::collection::vec((any::<i64>(), any::<u64>()), 0..6)
        .prop_map(|v| v.into_iter().map(|(at, cost)| Entry { at, cost }).collect());
    prop_oneof![
        (any::<i64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
            |(start, prev, curr, window_ms)| WindowState::Sliding {
                start,
                prev,
                curr,
                window_ms
            }
        ),
        (any::<u64>(), log).prop_map(|(window_ms, log)| WindowState::Exact { window_ms, log }),
        (any::<i64>(), any::<u64>()).prop_map(|(end, count)| WindowState::Fixed { end, count }),
    ]
}
