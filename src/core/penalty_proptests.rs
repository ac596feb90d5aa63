//! Property tests of the penalty ladder: strikes, trips and box levels,
//! and `EVERY` (each refusal a strike).
//!
//! Driven through the shared kit (`testkit`) with random rates, costs,
//! clocks and stored states, and checked against invariants derived from
//! the module docs rather than against the implementation.

use proptest::prelude::*;

use super::bucket::Rate;
use super::decision::Status;
use super::testkit::*;

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
        let policy = PenaltyPolicy { threshold, window_ms, box_ms, offenses_ttl_ms: 100_000_000, every: false };
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
            // The first refusal (after an admission or a box) only announces
            // a retry, 31 years ahead: every later call is an early retry.
            now += gaps.next().unwrap_or(0);
            let (reply, fx) = state.call(&call, now);
            prop_assert_eq!(reply.status, Status::Throttled, "trip {} first refusal", trip);
            prop_assert_eq!(reply.strikes_remaining, threshold as i64);
            prop_assert!(fx.penalty && fx.tripped.is_none());
            // Strikes 1..=threshold, all inside one window.
            let mut tripped_at = None;
            for k in 1..=threshold {
                now += gaps.next().unwrap_or(0);
                let before = state.clone();
                let (reply, fx) = state.call(&call, now);
                prop_assert_eq!(&state.buckets, &before.buckets);
                prop_assert!(fx.penalty && fx.states.is_empty());
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
                // an ordinary refusal, not a strike.
                let end = at + duration as i64;
                prop_assert_eq!(state.peek(&call, end - 1).status, Status::Boxed);
                let next = state.peek(&call, end);
                prop_assert_eq!(next.status, Status::Throttled);
                prop_assert_eq!(next.strikes_remaining, threshold as i64);
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
        let policy = PenaltyPolicy { threshold, window_ms, box_ms: [1_000_000_000; 3], offenses_ttl_ms: 0, every: false };
        let rates = [SCARCE];
        let call = with_strikes(&rates, 1, policy);
        let mut state = State::new(1);
        state.call(&call, T0);
        // The first refusal announces a retry 31 years ahead: no strike.
        prop_assert_eq!(state.call(&call, T0).0.strikes_remaining, threshold as i64);
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

    /// A client that honours every `retry_after_ms` (it calls again exactly
    /// when told, spending its points as it gets them back): without
    /// `EVERY` it is never struck; with `EVERY` each of its refusals is a
    /// strike (one window spans the run), and the box trips at the
    /// `threshold`-th refusal.
    #[test]
    fn every_strikes_each_refusal_of_an_honest_client(
        r in rate(),
        threshold in 1u64..=20,
        costs in prop::collection::vec(1u64..=1000, 1..=80),
        every in any::<bool>(),
    ) {
        let policy = PenaltyPolicy {
            threshold,
            window_ms: 1_000_000_000_000,
            box_ms: [1_000_000_000; 3],
            offenses_ttl_ms: 0,
            every,
        };
        let rates = [r];
        let mut state = State::new(1);
        let mut now = T0;
        let mut refusals = 0u64;
        for cost in costs {
            let cost = cost.min(r.capacity);
            let (reply, _) = state.call(&with_strikes(&rates, cost, policy), now);
            match reply.status {
                Status::Allowed => {}
                Status::Throttled => {
                    refusals += 1;
                    let left = if every { threshold - refusals } else { threshold };
                    prop_assert_eq!(reply.strikes_remaining, left as i64, "refusal {}", refusals);
                    now += reply.retry_after_ms;
                }
                _ => {
                    refusals += 1;
                    prop_assert!(every, "an honest client boxed without EVERY");
                    prop_assert_eq!(refusals, threshold, "tripped at refusal {}", refusals);
                    return Ok(());
                }
            }
        }
    }
}
