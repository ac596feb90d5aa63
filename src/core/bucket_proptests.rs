//! Property tests of the bucket across clock steps and tier changes.
//!
//! Driven through the shared kit (`testkit`) with random rates, costs,
//! clocks and stored states, and checked against invariants derived from
//! the module docs rather than against the implementation.

use proptest::prelude::*;

use super::bucket::{self, Rate};
use super::decision::Status;
use super::testkit::*;
use super::time::{ceil_div, Millis};

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
    /// bucket after a downgrade), so `remaining_B == capacity_B - ceil(s)`
    /// (negative after such a downgrade), `reset_ms_B` of a probe is the
    /// later of A's stored state full and B's debt refilled at B's speed,
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
        let expected = i(b.capacity) - spent;
        prop_assert_eq!(i128::from(under_b.remaining), expected, "spent {} of {:?}, then {:?}", spent, a, b);
        let raw_debt_b = ceil_div(stored * i(b.period_ms), i(a.period_ms));
        // A probe writes nothing: the bucket refills at A's speed until a
        // call rewrites it, at B's after; its reset is the later of the two.
        let foreign = (a.tokens, a.period_ms) != (b.tokens, b.period_ms);
        let at_a = ceil_div(stored, i(a.tokens));
        let at_b = ceil_div(raw_debt_b.min(bucket::max_debt(&b)), i(b.tokens));
        let reset = if foreign { at_a.max(at_b) } else { at_a };
        prop_assert_eq!(i128::from(under_b.reset_ms), reset);

        let before = state.clone();
        let (reply, fx) = state.call(&req(&[b], cost_b), t);
        let fits_b = raw_debt_b + i(cost_b) * i(b.period_ms) <= i(b.capacity) * i(b.period_ms);
        prop_assert_eq!(reply.status == Status::Allowed, fits_b,
            "cost {} under {:?} with {} spent", cost_b, b, spent);
        match reply.status {
            Status::Throttled => {
                // A throttled probe (cost 0: B's capacity is below what was
                // spent) writes nothing, even at another scale.
                let rescaled = foreign && cost_b > 0;
                prop_assert_eq!(fx.states.contains(0), rescaled);
                if rescaled {
                    let bk = state.buckets[0];
                    prop_assert_eq!(bk.map(|bk| (bk.tokens.get(), bk.period_ms)), Some((b.tokens, b.period_ms)));
                } else {
                    prop_assert_eq!(&state, &before);
                }
                // The same points spent...
                prop_assert_eq!(state.probe_one(0, b, t).remaining, under_b.remaining);
                let r = reply.retry_after_ms;
                if foreign && !rescaled {
                    // A probe leaves A's state: its wait holds whether the
                    // bucket keeps refilling at A's speed or a call with a
                    // cost rewrites it at B's now, and is exact for one.
                    let mut rewritten = state.clone();
                    let (_, fx) = rewritten.call(&req(&[b], b.capacity), t);
                    prop_assert!(fx.states.contains(0));
                    let probe = |s: &State, at| s.peek(&req(&[b], 0), at).status;
                    prop_assert_eq!(probe(&state, t + r), Status::Allowed);
                    prop_assert_eq!(probe(&rewritten, t + r), Status::Allowed);
                    prop_assert!(
                        probe(&state, t + r - 1) == Status::Throttled
                            || probe(&rewritten, t + r - 1) == Status::Throttled,
                        "a probe's retry {} is late under both {:?} and {:?}", r, a, b
                    );
                    return Ok(());
                }
                // ...and B's wait is exact from now on.
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
