//! Property tests of `RL.WINDOW` ([`crate::core::window`]): the three modes
//! are driven through [`decide`] (and directly through the [`Limiter`]
//! methods) with random parameters, arrivals and clocks, and checked
//! against the guarantees in the module docs and against a naive reference
//! model of the sliding log.
//!
//! Failure persistence is off (no `proptest-regressions/` files are
//! written); a counterexample found here belongs in a unit test.

use proptest::prelude::*;

use super::{Entry, Mode, Window, WindowState};
use crate::core::limiter::Limiter;
use crate::core::limits::MAX_EXACT_LIMIT;
use crate::core::take::{decide, Request};
use crate::core::testkit::*;

// ---------------------------------------------------------------------------
// Driving `decide`.
// ---------------------------------------------------------------------------

/// One call of `cost` on one key, no options.
pub(super) fn call(w: Window, state: &mut Option<WindowState>, cost: u64, now: Millis) -> Wire {
    let (reply, _) = decide(
        &mut [&mut *state],
        &mut Penalty::default(),
        &Request::new(&[w], cost),
        now,
        0,
    );
    reply.into()
}

/// The same call on a copy, leaving `state` untouched.
pub(super) fn peek(w: Window, state: &Option<WindowState>, cost: u64, now: Millis) -> Wire {
    call(w, &mut state.clone(), cost, now)
}

/// The boundary at or before `t` of windows of `w`.
pub(super) fn boundary(w: &Window, t: Millis) -> Millis {
    let len = w.window_ms as i64;
    t - (t - (w.offset_ms % w.window_ms) as i64).rem_euclid(len)
}

/// Sum of the costs admitted at times in `[from, to]`.
pub(super) fn admitted_in(log: &[(Millis, u64)], from: Millis, to: Millis) -> u64 {
    log.iter()
        .filter(|(t, _)| (from..=to).contains(t))
        .map(|(_, c)| c)
        .sum()
}

/// Play `arrivals` (forward step, cost) from `T0` on one key; returns the
/// state, the clock after the last call and the admitted `(time, cost)`.
pub(super) fn play(
    w: Window,
    arrivals: &[(u64, u64)],
) -> (Option<WindowState>, Millis, Vec<(Millis, u64)>) {
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

pub(super) fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Sliding), Just(Mode::Exact), Just(Mode::Fixed)]
}

/// limit 1..=20, window 1..=10 or 1..=2000 ms, any offset in the window.
pub(super) fn window(mode: impl Strategy<Value = Mode>) -> impl Strategy<Value = Window> {
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
pub(super) fn arrivals(w: &Window, len: usize) -> impl Strategy<Value = Vec<(u64, u64)>> {
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
pub(super) fn run(
    mode: impl Strategy<Value = Mode>,
    len: usize,
) -> impl Strategy<Value = (Window, Vec<(u64, u64)>)> {
    window(mode).prop_flat_map(move |w| (Just(w), arrivals(&w, len)))
}

/// A valid state: window lengths in bounds, a sorted log of positive costs.
pub(super) fn valid_state() -> impl Strategy<Value = WindowState> {
    let w = 1u64..=MAX_DURATION_MS;
    let log = (
        any::<i64>(),
        prop::collection::vec(
            (1u64..=u64::MAX, 1u64..=crate::core::part::MAX_COUNT),
            0..40,
        ),
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
        (w, log).prop_map(|(window_ms, log)| WindowState::Exact {
            window_ms,
            log: log.into()
        }),
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
pub(super) struct RefLog {
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
// Charging from a reading.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(512))]

    /// A sliding or fixed window is charged from its reading alone: the
    /// state and reading equal those of the general path (the state read in
    /// this window's form, `cost` added, read again), whatever the state.
    #[test]
    fn a_charge_from_the_reading_is_the_general_charge(
        w in window(prop_oneof![Just(Mode::Sliding), Just(Mode::Fixed)]),
        state in prop::option::of(valid_state()),
        cost in 1u64..=1_000,
        now in -1_000_000i64..=1_000_000_000,
    ) {
        let seen = w.see(state.as_ref(), now);
        let mut charged = state.clone();
        let after = w.charge(&mut charged, &seen, cost, now);
        let general = w.with_cost(state.as_ref(), cost, now);
        prop_assert_eq!(after, w.see(Some(&general), now));
        prop_assert_eq!(charged, Some(general));
    }
}
