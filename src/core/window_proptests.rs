//! Property tests of `RL.WINDOW` ([`crate::core::window`]): the three modes
//! are driven through [`decide`] (and directly through the [`Limiter`]
//! methods) with random parameters, arrivals and clocks, and checked
//! against the guarantees in the module docs and against a naive reference
//! model of the sliding log.
//!
//! Failure persistence is off (no `proptest-regressions/` files are
//! written); a counterexample found here belongs in a unit test.

use proptest::prelude::*;

use super::limiter::Limiter;
use super::limits::{MAX_DURATION_MS, MAX_EXACT_LIMIT, MAX_POINTS};
use super::penalty::Penalty;
use super::reply::{Reply, Status};
use super::take::{decide, Request};
use super::time::{ceil_div, Millis};
use super::window::{key_offset, Entry, Mode, Window, WindowSeen, WindowState};

/// An arbitrary but realistic start time.
const T0: Millis = 1_700_000_000_000;

/// A config with `cases` cases and no regression files.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// Driving `decide`.
// ---------------------------------------------------------------------------

/// One call of `cost` on one key, no options.
fn call(w: Window, state: &mut Option<WindowState>, cost: u64, now: Millis) -> Reply {
    let mut states = [state.take()];
    let (reply, _) = decide(
        &mut states,
        &mut Penalty::default(),
        &Request::new(&[w], cost),
        now,
        0,
    );
    let [s] = states;
    *state = s;
    reply
}

/// The same call on a copy, leaving `state` untouched.
fn peek(w: Window, state: &Option<WindowState>, cost: u64, now: Millis) -> Reply {
    call(w, &mut state.clone(), cost, now)
}

/// The boundary at or before `t` of windows of `w`.
fn boundary(w: &Window, t: Millis) -> Millis {
    let len = w.window_ms as i64;
    t - (t - (w.offset_ms % w.window_ms) as i64).rem_euclid(len)
}

/// Sum of the costs admitted at times in `[from, to]`.
fn admitted_in(log: &[(Millis, u64)], from: Millis, to: Millis) -> u64 {
    log.iter()
        .filter(|(t, _)| (from..=to).contains(t))
        .map(|(_, c)| c)
        .sum()
}

/// Play `arrivals` (forward step, cost) from `T0` on one key; returns the
/// state, the clock after the last call and the admitted `(time, cost)`.
fn play(w: Window, arrivals: &[(u64, u64)]) -> (Option<WindowState>, Millis, Vec<(Millis, u64)>) {
    let mut state = None;
    let mut now = T0;
    let mut admitted = Vec::new();
    for &(step, cost) in arrivals {
        now += step as i64;
        if call(w, &mut state, cost, now).status == Status::Allowed && cost > 0 {
            admitted.push((now, cost));
        }
    }
    (state, now, admitted)
}

// ---------------------------------------------------------------------------
// Strategies.
// ---------------------------------------------------------------------------

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Sliding), Just(Mode::Exact), Just(Mode::Fixed)]
}

/// limit 1..=20, window 1..=10 or 1..=2000 ms, any offset in the window.
fn window(mode: impl Strategy<Value = Mode>) -> impl Strategy<Value = Window> {
    (
        1u64..=20,
        prop_oneof![1u64..=10, 1u64..=2000],
        any::<u64>(),
        mode,
    )
        .prop_map(|(limit, window_ms, offset, mode)| Window {
            limit,
            window_ms,
            mode,
            offset_ms: offset % window_ms,
        })
}

/// Up to `len` arrivals on the scale of `w`: steps often 0, often a
/// fraction of the window, sometimes more than two windows; costs mostly
/// small, up to the limit.
fn arrivals(w: &Window, len: usize) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let step = prop_oneof![
        3 => Just(0u64),
        4 => 0..=w.window_ms / 4 + 1,
        2 => 0..=w.window_ms + 1,
        1 => 0..=3 * w.window_ms,
    ];
    let cost = prop_oneof![3 => Just(1u64), 2 => 0..=w.limit];
    prop::collection::vec((step, cost), 0..=len)
}

/// A window of `mode` and up to `len` arrivals for it.
fn run(
    mode: impl Strategy<Value = Mode>,
    len: usize,
) -> impl Strategy<Value = (Window, Vec<(u64, u64)>)> {
    window(mode).prop_flat_map(move |w| (Just(w), arrivals(&w, len)))
}

/// A state of any mode with any fields, valid or not.
fn any_state() -> impl Strategy<Value = WindowState> {
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

/// A valid state: window lengths in bounds, a sorted log of positive costs.
fn valid_state() -> impl Strategy<Value = WindowState> {
    let w = 1u64..=MAX_DURATION_MS;
    let log = (
        any::<i64>(),
        prop::collection::vec((1u64..=u64::MAX, 1u64..=u64::MAX), 0..40),
    )
        .prop_map(|(first, rest)| {
            let mut at = first;
            let mut log = Vec::new();
            for (i, (delta, cost)) in rest.into_iter().enumerate() {
                if i > 0 {
                    match at.checked_add_unsigned(delta % 1_000_000_000) {
                        Some(next) if next > at => at = next,
                        _ => break,
                    }
                }
                log.push(Entry { at, cost });
            }
            log
        });
    prop_oneof![
        (any::<i64>(), any::<u64>(), any::<u64>(), w.clone()).prop_map(
            |(start, prev, curr, window_ms)| WindowState::Sliding {
                start,
                prev,
                curr,
                window_ms
            }
        ),
        (w, log).prop_map(|(window_ms, log)| WindowState::Exact { window_ms, log }),
        (any::<i64>(), any::<u64>()).prop_map(|(end, count)| WindowState::Fixed { end, count }),
    ]
}

// ---------------------------------------------------------------------------
// The reference sliding log.
// ---------------------------------------------------------------------------

/// The naive model of `EXACT`: every admitted `(t, cost)` in a `Vec`, scanned
/// linearly; a point counts while `now < t + W`; entries that no longer
/// count are dropped when something is admitted.
#[derive(Default)]
struct RefLog {
    entries: Vec<(Millis, u64)>,
}

impl RefLog {
    fn count(&self, w: &Window, now: Millis) -> u64 {
        self.entries
            .iter()
            .filter(|(t, _)| now < t + w.window_ms as i64)
            .map(|(_, c)| c)
            .sum()
    }

    /// Allowed? Then record it.
    fn call(&mut self, w: &Window, cost: u64, now: Millis) -> bool {
        let fits = self.count(w, now) + cost <= w.limit;
        if fits && cost > 0 {
            self.entries.retain(|(t, _)| now < t + w.window_ms as i64);
            self.entries.push((now, cost));
        }
        fits
    }

    /// Live entries merged per millisecond, by expiry: `(expiry, cost)`.
    fn steps(&self, w: &Window, now: Millis) -> Vec<(Millis, u64)> {
        let mut live: Vec<(Millis, u64)> = self
            .entries
            .iter()
            .filter(|(t, _)| now < t + w.window_ms as i64)
            .map(|&(t, c)| (t + w.window_ms as i64, c))
            .collect();
        live.sort();
        let mut merged: Vec<(Millis, u64)> = Vec::new();
        for (e, c) in live {
            match merged.last_mut() {
                Some(last) if last.0 == e => last.1 += c,
                _ => merged.push((e, c)),
            }
        }
        merged
    }

    /// The exact wait for `cost`, and the index of the step that frees
    /// enough (`None` when it fits now).
    fn wait(&self, w: &Window, cost: u64, now: Millis) -> i64 {
        let count = self.count(w, now);
        if count + cost <= w.limit {
            return 0;
        }
        let excess = count + cost - w.limit;
        let mut freed = 0;
        for (expiry, c) in self.steps(w, now) {
            freed += c;
            if freed >= excess {
                return expiry - now;
            }
        }
        unreachable!("cost <= limit")
    }

    fn reset(&self, w: &Window, now: Millis) -> i64 {
        self.steps(w, now).last().map_or(0, |(e, _)| e - now)
    }
}

// ---------------------------------------------------------------------------
// Sliding.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    /// Fixed parameters, clock going forward. For every sub-window boundary
    /// `s` (with `p` points admitted in `[s - W, s)`) and every admission
    /// at `s + x` (`0 <= x < W`), the points admitted in `[s, s + x]` are at
    /// most `limit - ceil(p * (W - x) / W)`. Hence:
    /// - any aligned sub-window `[s, s + W)` admits at most `limit`;
    /// - `[s - W, s + x]` admits at most `limit + floor(p * x / W) <= limit +
    ///   floor(limit * x / W)`: a burst of `limit` just before a boundary
    ///   leaves only `floor(limit * x / W)` points for the first `x + 1` ms
    ///   after it, so a boundary burst is never doubled.
    #[test]
    fn sliding_bounds_per_sub_window_and_at_boundaries((w, arrivals) in run(Just(Mode::Sliding), 120)) {
        let (_, _, admitted) = play(w, &arrivals);
        let len = w.window_ms as i64;
        for &(t, _) in &admitted {
            let s = boundary(&w, t);
            let x = t - s;
            let p = admitted_in(&admitted, s - len, s - 1);
            let current = admitted_in(&admitted, s, t);
            let weighted = ceil_div(i128::from(p) * i128::from(len - x), i128::from(len));
            prop_assert!(i128::from(current) <= i128::from(w.limit) - weighted,
                "t {t} s {s} p {p} current {current}");
            prop_assert!(admitted_in(&admitted, s, s + len - 1) <= w.limit);
            let around = admitted_in(&admitted, s - len, t);
            prop_assert!(around <= w.limit + (w.limit * x as u64) / w.window_ms,
                "around the boundary {s}: {around}");
        }
    }

    /// The same bounds with a burst of `limit` forced into the last
    /// millisecond before a boundary, then arrivals of 1 point: after the
    /// boundary at most `floor(limit * x / W)` points by `s + x`.
    #[test]
    fn a_boundary_burst_is_not_doubled(w in window(Just(Mode::Sliding)), steps in prop::collection::vec(0u64..=50, 1..80)) {
        let mut state = None;
        let s = boundary(&w, T0) + w.window_ms as i64;
        prop_assert_eq!(call(w, &mut state, w.limit, s - 1).status, Status::Allowed);
        let mut now = s;
        let mut after = 0u64;
        for step in steps {
            if now - s >= w.window_ms as i64 {
                break;
            }
            if call(w, &mut state, 1, now).status == Status::Allowed {
                after += 1;
            }
            let x = (now - s) as u64;
            prop_assert!(after <= w.limit * x / w.window_ms, "x {x}: {after}");
            now += step as i64;
        }
    }
}

// ---------------------------------------------------------------------------
// Exact.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    /// Any arrival sequence, the clock stepping forward and sometimes back:
    /// `EXACT` makes the same decision as the naive reference log, replies
    /// the same `remaining` and `reset_ms`, and [`Window::wait_exact`] is
    /// the reference's exact wait, and so is `retry_after_ms` through
    /// `decide`. The clock going forward, no span of `W` milliseconds
    /// admits more than `limit`.
    #[test]
    fn exact_matches_the_reference_log(
        (w, arrivals) in run(Just(Mode::Exact), 120),
        back in prop::collection::vec(prop_oneof![9 => Just(0i64), 1 => 0i64..=3000], 120),
    ) {
        let mut state = None;
        let mut reference = RefLog::default();
        let mut now = T0;
        let mut forward = true;
        let mut admitted = Vec::new();
        for (i, &(step, cost)) in arrivals.iter().enumerate() {
            let b = back.get(i).copied().unwrap_or(0);
            forward &= b == 0;
            now += step as i64 - b;
            let exact_wait = w.wait_exact(state.as_ref(), cost, now);
            let ref_wait = reference.wait(&w, cost, now);
            prop_assert_eq!(exact_wait, ref_wait);
            let reply = call(w, &mut state, cost, now);
            let allowed = reference.call(&w, cost, now);
            prop_assert_eq!(reply.status == Status::Allowed, allowed, "at {}", now - T0);
            prop_assert_eq!(reply.remaining, w.limit as i64 - reference.count(&w, now).min(w.limit) as i64);
            prop_assert_eq!(reply.reset_ms, reference.reset(&w, now));
            if !allowed {
                prop_assert_eq!(reply.retry_after_ms, ref_wait);
            } else if cost > 0 {
                admitted.push((now, cost));
            }
            if forward && allowed {
                let span = admitted_in(&admitted, now - w.window_ms as i64 + 1, now);
                prop_assert!(span <= w.limit, "{span} in the last W at {}", now - T0);
            }
            if let Some(s) = &state {
                prop_assert!(s.is_valid());
                if let WindowState::Exact { log, .. } = s {
                    prop_assert!(log.len() as u64 <= w.limit.min(MAX_EXACT_LIMIT));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Fixed.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(256))]

    /// Fixed parameters, clock going forward: every window
    /// `[offset + k W, offset + (k + 1) W)` admits at most `limit`, and a
    /// call is throttled only when its own window is too full for it.
    #[test]
    fn fixed_never_exceeds_a_window((w, arrivals) in run(Just(Mode::Fixed), 120)) {
        let mut state = None;
        let mut now = T0;
        let mut admitted = Vec::new();
        for &(step, cost) in &arrivals {
            now += step as i64;
            let b = boundary(&w, now);
            let before = admitted_in(&admitted, b, now);
            let reply = call(w, &mut state, cost, now);
            prop_assert_eq!(reply.status == Status::Allowed, before + cost <= w.limit);
            if reply.status == Status::Allowed && cost > 0 {
                admitted.push((now, cost));
            }
            prop_assert!(admitted_in(&admitted, b, b + w.window_ms as i64 - 1) <= w.limit);
            if reply.status == Status::Throttled {
                prop_assert_eq!(now + reply.retry_after_ms, b + w.window_ms as i64);
            }
        }
    }
}

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
    state.is_some_and(|s| w.rewrite(s, &w.see(Some(s), now), now).is_some())
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
        prop_assert_eq!(b.remaining(&seen), reply.remaining);
        prop_assert_eq!(b.reset_ms(after.as_ref(), now), z);
        if let Some(s) = &after {
            prop_assert_eq!(b.rewrite(s, &seen, now), None, "stored states are native");
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
        let converted = b.rewrite(&stored, &seen, now).unwrap_or_else(|| stored.clone());
        prop_assert_eq!(b.see(Some(&converted), now), seen, "the rewrite reads the same");
        let n = stored.count_at(now);
        let (as_new, _) = b.charge(None, &WindowSeen::default(), n, now);
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
            } else if n > 0 && b.rewrite(&stored, &seen, now).is_some() {
                let fresh = b.see(Some(&as_new), t).count();
                prop_assert!(count >= fresh, "new at {}: {:?}", t - now, converted);
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
                prop_assert_eq!(fx.states_changed, 0);
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
        state in prop::option::of(any_state()),
        now in prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0i64), any::<i64>()],
        cost in prop_oneof![Just(0u64), Just(MAX_POINTS), 0u64..=MAX_POINTS],
    ) {
        let w = Window { limit, window_ms, mode: m, offset_ms };
        let seen = w.see(state.as_ref(), now);
        let _ = w.fits(&seen, cost);
        prop_assert!(w.wait_ms(state.as_ref(), &seen, cost, now) >= 0);
        prop_assert!(w.wait_exact(state.as_ref(), cost, now) >= 0);
        prop_assert!((0..=limit as i64).contains(&w.remaining(&seen)));
        prop_assert!(w.reset_ms(state.as_ref(), now) >= 0);
        let (charged, _) = w.charge(state.as_ref(), &seen, cost, now);
        let _ = charged.counts_until(now);
        let _ = charged.is_valid();
        if let Some(s) = &state {
            let _ = w.rewrite(s, &seen, now);
            let _ = s.counts_until(now);
            let _ = s.is_valid();
            let _ = rmp_serde::to_vec(s);
        }
        let mut states = [state];
        let (reply, _) = decide(&mut states, &mut Penalty::default(), &Request::new(&[w], cost), now, u64::MAX);
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
