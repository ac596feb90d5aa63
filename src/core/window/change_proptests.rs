//! Property tests of `RL.WINDOW` in every mode: exact waits and resets,
//! and parameter changes (another mode, window length or offset), driven
//! through the helpers of [`super::proptests`].

use proptest::prelude::*;

use super::proptests::{run, *};
use super::tests::{charged, rewritten};
use super::{key_offset, Mode, Window, WindowSeen, WindowState};
use crate::core::limiter::Limiter;
use crate::core::part::Part;
use crate::core::take::{decide, Request};
use crate::core::testkit::*;

// ---------------------------------------------------------------------------
// Every mode: exact waits and resets, parameter changes.
// ---------------------------------------------------------------------------

/// A state built under `a`, then read under `b` at `now`.
fn traffic_then(
    a: Window,
    b_mode: impl Strategy<Value = Mode>,
) -> impl Strategy<Value = (Window, Vec<(u64, u64)>, Window, u64, u64)> {
    (
        Just(a),
        arrivals(&a, 60),
        window(b_mode),
        0..=2 * a.window_ms,
        0u64..=20,
    )
}

fn changed_params() -> impl Strategy<Value = (Window, Vec<(u64, u64)>, Window, u64, u64)> {
    window(mode()).prop_flat_map(|a| {
        prop_oneof![
            // Same parameters.
            traffic_then(a, Just(a.mode))
                .prop_map(move |(a, arr, _, gap, cost)| (a, arr, a, gap, cost)),
            // Another limit only.
            traffic_then(a, Just(a.mode)).prop_map(move |(a, arr, b, gap, cost)| {
                (
                    a,
                    arr,
                    Window {
                        limit: b.limit,
                        ..a
                    },
                    gap,
                    cost,
                )
            }),
            // Anything else.
            traffic_then(a, mode()),
        ]
    })
}

/// Whether `state` was written with other parameters than `w`'s and still
/// counts something: a call that spends points rewrites it.
fn is_foreign(w: Window, state: Option<&WindowState>, now: Millis) -> bool {
    state.is_some_and(|s| rewritten(&w, s, &w.see(Some(s), now), now).is_some())
}

/// Checks that `retry_after_ms` of a call of `cost` under `w` at `now` is
/// exact through `decide`: throttled one millisecond earlier, allowed then
/// (absent other traffic). Returns the wait.
fn check_exact_retry(
    w: Window,
    state: &Option<WindowState>,
    cost: u64,
    now: Millis,
) -> Result<i64, TestCaseError> {
    let mut state = state.clone();
    let exact = w.wait_exact(state.as_ref(), cost, now);
    let probe_of_foreign = cost == 0 && is_foreign(w, state.as_ref(), now);
    let reply = call(w, &mut state, cost, now);
    if reply.status == Status::Allowed {
        prop_assert_eq!(exact, 0);
        return Ok(0);
    }
    let wait = reply.retry_after_ms;
    prop_assert!(wait >= 1 && wait >= exact);
    if probe_of_foreign {
        // Nothing was rewritten: the wait is the converted state's, an
        // upper bound of what the stored one needs.
        prop_assert_eq!(peek(w, &state, cost, now + wait).status, Status::Allowed);
        return Ok(wait);
    }
    prop_assert_eq!(
        peek(w, &state, cost, now + exact - 1).status,
        Status::Throttled
    );
    prop_assert_eq!(peek(w, &state, cost, now + exact).status, Status::Allowed);
    prop_assert_eq!(peek(w, &state, cost, now + wait).status, Status::Allowed);
    if w.mode != Mode::Exact {
        prop_assert_eq!(wait, exact);
    }
    Ok(wait)
}

proptest! {
    #![proptest_config(config(256))]

    /// Every mode, a state built by traffic under `a`, then a call of any
    /// cost up to the limit under `b` (the same parameters, another limit,
    /// or anything else) at `now`:
    /// - `retry_after_ms` is exact (see [`check_exact_retry`]);
    /// - `reset_ms` is exact: at `now + reset_ms` nothing counts, one
    ///   millisecond earlier something does;
    /// - the direct `see`/`wait_ms` of the (rewritten) state agree.
    #[test]
    fn waits_and_resets_are_exact((a, arrivals, b, gap, cost) in changed_params()) {
        let (state, last, _) = play(a, &arrivals);
        let now = last + gap as i64;
        let cost = cost.min(b.limit);
        check_exact_retry(b, &state, cost, now)?;

        // After the call (throttled: rewritten if foreign; allowed: charged;
        // a probe writes nothing).
        let probe_of_foreign = cost == 0 && is_foreign(b, state.as_ref(), now);
        let mut after = state.clone();
        let reply = call(b, &mut after, cost, now);
        let z = reply.reset_ms;
        prop_assert!(z >= 0);
        prop_assert_eq!(b.see(after.as_ref(), now + z).count(), 0, "{:?}", after);
        if probe_of_foreign {
            // The reply describes the converted state, which the next call
            // that spends points stores: an upper bound for the stored one.
            return Ok(());
        }
        if z > 0 {
            prop_assert!(b.see(after.as_ref(), now + z - 1).count() > 0, "{:?}", after);
        }

        // Directly, on the stored state: what decide said.
        let seen = b.see(after.as_ref(), now);
        prop_assert_eq!(b.balance(&seen), reply.remaining);
        prop_assert_eq!(b.reset_ms(after.as_ref(), &seen, now), z);
        if let Some(s) = &after {
            prop_assert_eq!(rewritten(&b, s, &seen, now), None, "stored states are native");
            prop_assert!(s.is_valid());
        }
        let wait = b.wait_exact(after.as_ref(), cost, now);
        prop_assert!(b.fits(&b.see(after.as_ref(), now + wait), cost));
        if wait > 0 {
            prop_assert!(!b.fits(&b.see(after.as_ref(), now + wait - 1), cost));
        }
    }

    /// A change of window length, offset or mode never admits more than
    /// either configuration would. With `N` points counted at the change
    /// (under the old parameters) the converted state counts, at every
    /// later instant, at least what the old state counts then and at least
    /// what `N` points admitted at the change count under the new
    /// parameters; for a log kept as a log (`EXACT` to `EXACT`), at least
    /// what the new parameters count of the points admitted before.
    #[test]
    fn parameter_changes_are_conservative((a, arrivals, b, gap, _) in changed_params()) {
        let (state, last, admitted) = play(a, &arrivals);
        let now = last + gap as i64;
        let Some(stored) = state else { return Ok(()) };
        let seen = b.see(Some(&stored), now);
        let converted = rewritten(&b, &stored, &seen, now).unwrap_or_else(|| stored.clone());
        prop_assert_eq!(b.see(Some(&converted), now), seen, "the rewrite reads the same");
        let n = stored.count_at(now);
        let (as_new, _) = charged(&b, None, &WindowSeen::default(), n, now);
        let horizon = 3 * a.window_ms.max(b.window_ms) as i64 + 2;
        let step = (horizon / 97).max(1);
        for t in (now..now + horizon).step_by(step as usize) {
            let count = b.see(Some(&converted), t).count();
            prop_assert!(count >= stored.count_at(t), "old at {}: {:?}", t - now, converted);
            if a.mode == Mode::Exact && b.mode == Mode::Exact {
                let under_b: u64 = admitted
                    .iter()
                    .filter(|(at, _)| now < at + a.window_ms as i64 && t < at + b.window_ms as i64)
                    .map(|(_, c)| c)
                    .sum();
                prop_assert!(count >= under_b, "new at {}: {:?}", t - now, converted);
            } else if n > 0 && rewritten(&b, &stored, &seen, now).is_some() {
                let fresh = b.see(Some(&as_new), t).count();
                prop_assert!(count >= fresh, "new at {}: {:?}", t - now, converted);
            }
        }
    }

    /// Parameters that alternate between calls (two configurations served
    /// at once, as in a rolling deployment) convert the state at every
    /// call; its end stays within a few windows of now instead of moving
    /// further at each conversion, and every state written is one a load
    /// accepts.
    #[test]
    fn alternating_parameters_keep_the_end_near(
        a in window(mode()),
        b in window(mode()),
        steps in prop::collection::vec((0u64..=50, 0u64..=2), 1..400),
    ) {
        let (mut state, mut now) = (None, T0);
        let longest = a.window_ms.max(b.window_ms) as i64;
        for (i, &(step, cost)) in steps.iter().enumerate() {
            now += step as i64;
            let w = if i % 2 == 0 { a } else { b };
            call(w, &mut state, cost, now);
            if let Some(s) = &state {
                prop_assert!(s.is_plausible(now), "call {}: {:?}", i, s);
                let end = s.counts_until(now).unwrap_or(now);
                prop_assert!(end < now + 5 * longest, "call {}: ends {} ahead: {:?}", i, end - now, s);
            }
        }
    }

    /// `ALSO`: two windows are charged all-or-nothing, and a throttled call
    /// leaves both states as they were.
    #[test]
    fn two_windows_all_or_nothing(
        m in mode(),
        (w1, arrivals) in run(Just(Mode::Sliding), 80),
        w2 in window(Just(Mode::Sliding)),
    ) {
        let w1 = Window { mode: m, ..w1 };
        let w2 = Window { mode: m, ..w2 };
        let mut states = [None, None];
        let mut penalty = Penalty::default();
        let mut now = T0;
        for &(step, cost) in &arrivals {
            now += step as i64;
            let cost = cost.min(w2.limit);
            let before = states.clone();
            let fit = [w1, w2]
                .iter()
                .zip(&states)
                .all(|(w, s)| w.fits(&w.see(s.as_ref(), now), cost));
            let (reply, fx) = decide(&mut states, &mut penalty, &Request::new(&[w1, w2], cost), now, 0);
            prop_assert_eq!(reply.status == Status::Allowed, fit);
            if !fit {
                prop_assert_eq!(&states, &before);
                prop_assert_eq!(fx.states, KeySet::default());
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Encoding, hostile inputs, offsets.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    /// Every valid state survives `rmp_serde` unchanged, and its bytes are
    /// canonical: decoding and encoding again gives the same bytes.
    #[test]
    fn serde_round_trip(state in valid_state()) {
        prop_assert!(state.is_valid());
        let bytes = rmp_serde::to_vec(&state).expect("encodes");
        let back: WindowState = rmp_serde::from_slice(&bytes).expect("decodes");
        prop_assert_eq!(&back, &state);
        prop_assert_eq!(rmp_serde::to_vec(&back).expect("encodes"), bytes);
    }

    /// States written by traffic round-trip too.
    #[test]
    fn serde_round_trip_of_played_states((w, arrivals) in run(mode(), 60)) {
        if let (Some(state), _, _) = play(w, &arrivals) {
            let bytes = rmp_serde::to_vec(&state).expect("encodes");
            let back: WindowState = rmp_serde::from_slice(&bytes).expect("decodes");
            prop_assert_eq!(back, state);
        }
    }

    /// Decoding arbitrary bytes never panics.
    #[test]
    fn decoding_garbage_does_not_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = rmp_serde::from_slice::<WindowState>(&bytes);
    }

    /// Any parameters within the bounds of `limits.rs` (and any offset), any
    /// stored state (valid or not), any clock and cost: nothing panics, and
    /// the replies stay in range.
    #[test]
    fn no_panic_on_extreme_inputs(
        limit in prop_oneof![Just(1u64), Just(MAX_POINTS), 1u64..=MAX_POINTS],
        window_ms in prop_oneof![Just(1u64), Just(MAX_DURATION_MS), 1u64..=MAX_DURATION_MS],
        offset_ms in any::<u64>(),
        m in mode(),
        state in prop::option::of(any_window_state()),
        now in prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0i64), any::<i64>()],
        cost in prop_oneof![Just(0u64), Just(MAX_POINTS), 0u64..=MAX_POINTS],
    ) {
        let w = Window { limit, window_ms, mode: m, offset_ms };
        let seen = w.see(state.as_ref(), now);
        let _ = w.fits(&seen, cost);
        prop_assert!(w.wait_ms(state.as_ref(), &seen, cost, now) >= 0);
        prop_assert!(w.wait_exact(state.as_ref(), cost, now) >= 0);
        prop_assert!((0..=limit as i64).contains(&w.remaining(&seen)));
        prop_assert!(w.reset_ms(state.as_ref(), &seen, now) >= 0);
        let (charged, _) = charged(&w, state.as_ref(), &seen, cost, now);
        let _ = charged.counts_until(now);
        let _ = charged.is_valid();
        if let Some(s) = &state {
            let _ = rewritten(&w, s, &seen, now);
            let _ = s.counts_until(now);
            let _ = s.is_valid();
            let _ = rmp_serde::to_vec(s);
        }
        let mut states = [state];
        let reply = Wire::from(decide(&mut states, &mut Penalty::default(), &Request::new(&[w], cost), now, u64::MAX).0);
        prop_assert!(reply.retry_after_ms >= 0 && reply.reset_ms >= 0);
    }

    /// Offsets are in range and a function of the key alone; two different
    /// keys get different offsets for a window of a day (a collision has
    /// probability 1 / 86_400_000).
    #[test]
    fn offsets_in_range_and_spread(k1 in prop::collection::vec(any::<u8>(), 0..40), k2 in prop::collection::vec(any::<u8>(), 0..40), w in 1u64..=MAX_DURATION_MS) {
        prop_assert!(key_offset(&k1, w) < w);
        prop_assert_eq!(key_offset(&k1, w), key_offset(&k1.clone(), w));
        if k1 != k2 {
            prop_assert_ne!(key_offset(&k1, 86_400_000), key_offset(&k2, 86_400_000));
        }
    }
}

/// Typical key names in a minute window: neighbours get different offsets,
/// and 10_000 keys spread evenly (expected distinct values: about 9_209;
/// each tenth of the minute gets 1000 +- 15 %).
#[test]
fn offsets_of_typical_keys_spread_over_the_window() {
    let keys: Vec<String> = (0..10_000)
        .map(|i| format!("rl:{{t:42}}:key:{i}"))
        .collect();
    let offsets: Vec<u64> = keys
        .iter()
        .map(|k| key_offset(k.as_bytes(), 60_000))
        .collect();
    for pair in offsets.windows(2).take(100) {
        assert_ne!(pair[0], pair[1]);
    }
    let mut distinct = offsets.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 9_000, "{}", distinct.len());
    let mut bins = [0u32; 10];
    for o in &offsets {
        bins[(*o / 6_000) as usize] += 1;
    }
    for b in bins {
        assert!((850..=1150).contains(&b), "{bins:?}");
    }
}
