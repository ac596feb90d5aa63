//! Table tests of the windows (sliding, exact, fixed): exact replies on
//! hand-computed timelines, boundaries, clock steps and parameter changes.

use super::*;
use crate::core::penalty::Penalty;
use crate::core::take::{decide, Request};

/// A charge as a new state from a stored one (the tests read better so).
pub(super) fn charged(
    w: &Window,
    state: Option<&WindowState>,
    seen: &WindowSeen,
    cost: u64,
    now: Millis,
) -> (WindowState, WindowSeen) {
    let mut s = state.cloned();
    let seen = w.charge(&mut s, seen, cost, now);
    (s.expect("a charge stores a state"), seen)
}

/// A rewrite as the new state, `None` when the state needs none.
pub(super) fn rewritten(
    w: &Window,
    state: &WindowState,
    seen: &WindowSeen,
    now: Millis,
) -> Option<WindowState> {
    let mut s = state.clone();
    w.rewrite(&mut s, seen, now).then_some(s)
}

/// A boundary of every window used below (offset 0): a multiple of
/// 3_600_000.
const T0: Millis = 1_699_999_200_000;

fn window(limit: u64, window_ms: u64, mode: Mode, offset_ms: u64) -> Window {
    Window {
        limit,
        window_ms,
        mode,
        offset_ms,
    }
}

/// Replay `rows` of `(ms after T0, cost, expected reply)` through
/// `decide` on one key.
fn replay(w: Window, rows: &[(i64, u64, [i64; 8])]) -> Option<WindowState> {
    let mut states = [None];
    let mut penalty = Penalty::default();
    for (at, cost, expected) in rows {
        let (reply, _) = decide(
            &mut states,
            &mut penalty,
            &Request::new(&[w], *cost),
            T0 + at,
            0,
        );
        assert_eq!(
            crate::core::testkit::ToWire::wire(&reply),
            *expected,
            "{w:?} at +{at} ms, cost {cost}"
        );
    }
    let [state] = states;
    state
}

#[test]
fn fnv1a_reference_values() {
    assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    // Eight bytes a step: the same as the byte-by-byte definition at
    // every length around the steps.
    let bytes: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
    for len in 0..=bytes.len() {
        let fold = bytes[..len].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        assert_eq!(fnv1a_64(&bytes[..len]), fold, "{len}");
    }
}

#[test]
fn key_offsets_are_fixed_and_in_range() {
    // Pinned (computed independently): master, replica and every
    // restart must agree, so the algorithm must never change.
    let rows: &[(&[u8], u64, u64)] = &[
        (b"", 60_000, 56_206),
        (b"rl:{t:42}:key:7", 60_000, 14_199),
        (b"rl:{t:42}:key:8", 60_000, 33_710),
        (b"auth:{sub:alice}", 900_000, 402_097),
        (b"a", 1000, 510),
        (b"a", 1, 0),
        (b"a", 0, 0),
    ];
    for (key, w, expected) in rows {
        let got = key_offset(key, *w);
        assert_eq!(got, *expected, "{key:?} {w}");
        assert!(got < (*w).max(1));
    }
}

#[test]
fn sliding_table() {
    // 10 points per second, offset 0: sub-windows [T0 + k s, T0 + (k+1) s).
    let w = window(10, 1000, Mode::Sliding, 0);
    let rows: &[(i64, u64, [i64; 8])] = &[
        // [status, limit, remaining, reset, retry, box, strikes, binding]
        (0, 4, [1, 10, 6, 2000, 0, 0, -1, 0]),
        (500, 6, [1, 10, 0, 1500, 0, 0, -1, 0]),
        // prev = 10 fades from the boundary: 1 point fits at e = 100.
        (999, 1, [0, 10, 0, 1001, 101, 0, -1, 0]),
        // Next sub-window: prev = 10 weighs 10 * (1000 - e) / 1000, up.
        (1000, 0, [1, 10, 0, 1000, 0, 0, -1, 0]),
        (1000, 1, [0, 10, 0, 1000, 100, 0, -1, 0]),
        (1099, 1, [0, 10, 0, 901, 1, 0, -1, 0]),
        (1100, 1, [1, 10, 0, 1900, 0, 0, -1, 0]),
        // e = 500: ceil(10 * 500 / 1000) + 1 = 6; 5 more fit at e = 600.
        (1500, 5, [0, 10, 4, 1500, 100, 0, -1, 0]),
        (1600, 5, [1, 10, 0, 1400, 0, 0, -1, 0]),
        // Sub-window 3 holds prev = 6 (1 + 5), weighing from e = 0.
        (2000, 5, [0, 10, 4, 1000, 167, 0, -1, 0]),
        (2166, 5, [0, 10, 4, 834, 1, 0, -1, 0]),
        (2167, 5, [1, 10, 0, 1833, 0, 0, -1, 0]),
        // Two sub-windows later everything is gone.
        (4000, 0, [1, 10, 10, 0, 0, 0, -1, 0]),
    ];
    replay(w, rows);
}

#[test]
fn fixed_table_with_an_offset() {
    // Windows [T0 + 250 + k s, T0 + 1250 + k s).
    let w = window(3, 1000, Mode::Fixed, 250);
    let rows: &[(i64, u64, [i64; 8])] = &[
        (0, 2, [1, 3, 1, 250, 0, 0, -1, 0]),
        (249, 1, [1, 3, 0, 1, 0, 0, -1, 0]),
        (250, 3, [1, 3, 0, 1000, 0, 0, -1, 0]),
        (251, 1, [0, 3, 0, 999, 999, 0, -1, 0]),
        (1249, 1, [0, 3, 0, 1, 1, 0, -1, 0]),
        (1250, 0, [1, 3, 3, 0, 0, 0, -1, 0]),
        (1250, 1, [1, 3, 2, 1000, 0, 0, -1, 0]),
    ];
    replay(w, rows);
}

#[test]
fn exact_table() {
    // 3 points per second, the true count over (now - 1 s, now].
    let w = window(3, 1000, Mode::Exact, 0);
    let rows: &[(i64, u64, [i64; 8])] = &[
        (0, 1, [1, 3, 2, 1000, 0, 0, -1, 0]),
        (0, 1, [1, 3, 1, 1000, 0, 0, -1, 0]),
        (400, 1, [1, 3, 0, 1000, 0, 0, -1, 0]),
        (401, 1, [0, 3, 0, 999, 599, 0, -1, 0]),
        // Two points need both entries of +0 to expire: still 1000.
        (999, 0, [1, 3, 0, 401, 0, 0, -1, 0]),
        (1000, 2, [1, 3, 0, 1000, 0, 0, -1, 0]),
        (1001, 3, [0, 3, 0, 999, 999, 0, -1, 0]),
        (1399, 1, [0, 3, 0, 601, 1, 0, -1, 0]),
        (1400, 1, [1, 3, 0, 1000, 0, 0, -1, 0]),
    ];
    let state = replay(w, rows);
    let Some(WindowState::Exact { log, .. }) = state else {
        panic!("{state:?}");
    };
    // +0 and +400 were pruned; +1000 (2 points) and +1400 remain.
    assert_eq!(
        log.entries().collect::<Vec<_>>(),
        vec![
            Entry {
                at: T0 + 1000,
                cost: 2
            },
            Entry {
                at: T0 + 1400,
                cost: 1
            }
        ]
    );
}

#[test]
fn a_boundary_burst_is_not_doubled() {
    // 100 points at the last millisecond of a sub-window, then calls of
    // 1 point every millisecond: in the first x ms after the boundary
    // (x + 1 instants) at most floor(100 * x / 1000) are admitted.
    let w = window(100, 1000, Mode::Sliding, 0);
    let mut state = None;
    w.charge(&mut state, &WindowSeen::default(), 100, T0 + 999);
    let mut admitted = 0u64;
    for x in 0..1000i64 {
        let now = T0 + 1000 + x;
        let seen = w.see(state.as_ref(), now);
        if w.fits(&seen, 1) {
            w.charge(&mut state, &seen, 1, now);
            admitted += 1;
        }
        assert!(admitted <= (100 * x as u64) / 1000, "x = {x}: {admitted}");
    }
    assert_eq!(admitted, 99);
}

#[test]
fn sliding_wait_is_exact_in_each_phase() {
    // (prev, curr, elapsed, limit, cost, expected wait)
    let rows: &[(u64, u64, i64, u64, u64, i64)] = &[
        (10, 0, 0, 10, 1, 100),    // prev fades: 1 point per 100 ms
        (10, 0, 950, 10, 10, 50),  // all 10 at the boundary
        (10, 5, 0, 10, 5, 1000),   // prev must fade out entirely
        (10, 5, 0, 10, 6, 1200),   // next sub-window: 5 * (1 - 0.2) = 4
        (10, 10, 0, 10, 10, 2000), // nothing fits until both are gone
        (3, 0, 0, 10, 8, 334),     // ceil(3 * 666 / 1000) = 2
    ];
    for &(prev, curr, elapsed, limit, cost, expected) in rows {
        let w = window(limit, 1000, Mode::Sliding, 0);
        let state = WindowState::Sliding {
            start: T0,
            prev,
            curr,
            window_ms: 1000,
        };
        let now = T0 + elapsed;
        let seen = w.see(Some(&state), now);
        let wait = w.wait_ms(Some(&state), &seen, cost, now);
        assert_eq!(wait, expected, "{prev} {curr} +{elapsed} cost {cost}");
        assert!(w.fits(&w.see(Some(&state), now + wait), cost));
        assert!(!w.fits(&w.see(Some(&state), now + wait - 1), cost));
    }
}

#[test]
fn a_backward_clock_step_releases_nothing() {
    for mode in [Mode::Sliding, Mode::Exact, Mode::Fixed] {
        let w = window(5, 1000, mode, 0);
        let (state, _) = charged(&w, None, &WindowSeen::default(), 5, T0 + 500);
        for back in [1, 500, 3_600_000] {
            let seen = w.see(Some(&state), T0 + 500 - back);
            assert_eq!(w.remaining(&seen), 0, "{mode:?} {back}");
            assert!(!w.fits(&seen, 1));
            // Still counted for at least as long as without the step.
            let wait = w.wait_ms(Some(&state), &seen, 1, T0 + 500 - back);
            assert!(wait >= back, "{mode:?} {back}: {wait}");
            assert_eq!(rewritten(&w, &state, &seen, T0 + 500 - back), None);
        }
        // A charge before the stored window counts in it, not earlier.
        let w1 = window(6, 1000, mode, 0);
        let early = T0 - 3_600_000;
        let seen = w1.see(Some(&state), early);
        let (charged, seen) = charged(&w1, Some(&state), &seen, 1, early);
        assert_eq!(w1.remaining(&seen), 0, "{mode:?}");
        assert!(
            charged.counts_until(early) >= state.counts_until(T0 + 500),
            "{mode:?} {charged:?}"
        );
    }
}

#[test]
fn a_new_limit_is_just_a_number() {
    for mode in [Mode::Sliding, Mode::Exact, Mode::Fixed] {
        let (state, _) = charged(
            &window(10, 1000, mode, 0),
            None,
            &WindowSeen::default(),
            6,
            T0,
        );
        let up = window(20, 1000, mode, 0);
        let down = window(4, 1000, mode, 0);
        assert_eq!(up.remaining(&up.see(Some(&state), T0)), 14);
        let seen = down.see(Some(&state), T0);
        assert_eq!(down.remaining(&seen), 0);
        assert!(
            !down.fits(&seen, 0),
            "over the new limit: even a probe waits"
        );
        assert_eq!(rewritten(&up, &state, &seen, T0), None);
        assert_eq!(rewritten(&down, &state, &seen, T0), None);
    }
}

#[test]
fn parameter_changes_convert_conservatively() {
    // 6 points at T0 + 100 in a 1 s window of offset 0 (for Sliding, the
    // sub-window [T0, T0 + 1000) is current; its count holds until
    // T0 + 2000). Then the call names another window.
    // (from, to, expected state after a throttled call at T0 + 200)
    let s = |start, prev, curr, window_ms| WindowState::Sliding {
        start,
        prev,
        curr,
        window_ms,
    };
    let e = |window_ms, at, cost| WindowState::Exact {
        window_ms,
        log: vec![Entry { at, cost }].into(),
    };
    let f = |end, count| WindowState::Fixed { end, count };
    let rows: Vec<(Window, Window, WindowState)> = vec![
        // Sliding, shorter W: the 6 points hold until T0 + 2000, then fade.
        (
            window(10, 1000, Mode::Sliding, 0),
            window(10, 300, Mode::Sliding, 0),
            s(T0 + 2100, 6, 0, 300),
        ),
        // Sliding, longer W: carried into the window holding now, whole.
        (
            window(10, 1000, Mode::Sliding, 0),
            window(10, 5000, Mode::Sliding, 0),
            s(T0 + 5000, 6, 0, 5000),
        ),
        // Same W, another offset: held until the old end.
        (
            window(10, 1000, Mode::Sliding, 0),
            window(10, 1000, Mode::Sliding, 10),
            s(T0 + 2010, 6, 0, 1000),
        ),
        // Sliding to Fixed: until max(T0 + 2000, window end T0 + 1000).
        (
            window(10, 1000, Mode::Sliding, 0),
            window(10, 1000, Mode::Fixed, 0),
            f(T0 + 2000, 6),
        ),
        // Sliding to Exact: one entry counting until T0 + 2000.
        (
            window(10, 1000, Mode::Sliding, 0),
            window(10, 1000, Mode::Exact, 0),
            e(1000, T0 + 1000, 6),
        ),
        // Exact, shorter W: each entry keeps counting for the old W.
        (
            window(10, 1000, Mode::Exact, 0),
            window(10, 400, Mode::Exact, 0),
            e(400, T0 + 700, 6),
        ),
        // Exact, longer W: each entry counts for the new W.
        (
            window(10, 1000, Mode::Exact, 0),
            window(10, 4000, Mode::Exact, 0),
            e(4000, T0 + 100, 6),
        ),
        // Exact to Fixed: until T0 + 1100 < window end T0 + 2000.
        (
            window(10, 1000, Mode::Exact, 0),
            window(10, 2000, Mode::Fixed, 0),
            f(T0 + 2000, 6),
        ),
        // Fixed, another offset: the count joins the window holding now
        // ([T0 + 150, T0 + 1150)), which ends after the old one.
        (
            window(10, 1000, Mode::Fixed, 0),
            window(10, 1000, Mode::Fixed, 150),
            f(T0 + 1150, 6),
        ),
        // Fixed to Exact: one entry as if admitted now, counting until
        // T0 + 1200, after the old end T0 + 1000.
        (
            window(10, 1000, Mode::Fixed, 0),
            window(10, 1000, Mode::Exact, 0),
            e(1000, T0 + 200, 6),
        ),
        // Fixed to Sliding, longer W: prev of the next sub-window.
        (
            window(10, 1000, Mode::Fixed, 0),
            window(10, 3000, Mode::Sliding, 0),
            s(T0 + 3000, 6, 0, 3000),
        ),
    ];
    for (from, to, expected) in rows {
        let (stored, _) = charged(&from, None, &WindowSeen::default(), 6, T0 + 100);
        let now = T0 + 200;
        let seen = to.see(Some(&stored), now);
        let converted = rewritten(&to, &stored, &seen, now);
        assert_eq!(converted.as_ref(), Some(&expected), "{from:?} -> {to:?}");
        // The rewritten state reads as the foreign one did, and is native.
        assert_eq!(to.see(converted.as_ref(), now), seen, "{from:?} -> {to:?}");
        assert_eq!(rewritten(&to, &expected, &seen, now), None);
        // Never fewer points counted than either configuration counts.
        for t in (now..now + 6000).step_by(7) {
            let new = to.see(Some(&expected), t).count();
            assert!(new >= stored.count_at(t), "{from:?} -> {to:?} at {t}");
        }
        let first_window = to.see(Some(&expected), to.window_end(now) as i64 - 1);
        assert_eq!(first_window.count(), 6, "{from:?} -> {to:?}");
    }
}

#[test]
fn a_charge_after_a_change_adds_to_the_converted_state() {
    let from = window(10, 1000, Mode::Sliding, 0);
    let to = window(10, 300, Mode::Sliding, 0);
    let (stored, _) = charged(&from, None, &WindowSeen::default(), 6, T0 + 100);
    let seen = to.see(Some(&stored), T0 + 200);
    let (charged, after) = charged(&to, Some(&stored), &seen, 3, T0 + 200);
    assert_eq!(
        charged,
        WindowState::Sliding {
            start: T0 + 2100,
            prev: 6,
            curr: 3,
            window_ms: 300
        }
    );
    assert_eq!(after.count(), 9);
    // Frozen until T0 + 2100, then prev = 6 fades: ceil(6 * (300 - x) /
    // 300) <= 10 - 2 - 3 from x = 50.
    assert_eq!(to.wait_ms(Some(&charged), &after, 2, T0 + 200), 1900 + 50);
}

#[test]
fn counts_until_and_validity() {
    let rows: &[(WindowState, Millis, Option<Millis>, bool)] = &[
        (
            WindowState::Sliding {
                start: T0,
                prev: 1,
                curr: 0,
                window_ms: 1000,
            },
            T0,
            Some(T0 + 999),
            true,
        ),
        (
            WindowState::Sliding {
                start: T0,
                prev: 0,
                curr: 1,
                window_ms: 1000,
            },
            T0 + 1500,
            Some(T0 + 1999),
            true,
        ),
        (
            WindowState::Sliding {
                start: T0,
                prev: 5,
                curr: 5,
                window_ms: 0,
            },
            T0,
            Some(T0 + 1),
            false,
        ),
        (
            WindowState::Fixed { end: T0, count: 2 },
            T0 - 1,
            Some(T0 - 1),
            true,
        ),
        (WindowState::Fixed { end: T0, count: 2 }, T0, None, true),
        (
            WindowState::Exact {
                window_ms: 100,
                log: vec![
                    Entry { at: T0, cost: 1 },
                    Entry {
                        at: T0 + 5,
                        cost: 2,
                    },
                ]
                .into(),
            },
            T0 + 99,
            Some(T0 + 104),
            true,
        ),
        (
            WindowState::Exact {
                window_ms: 100,
                log: vec![Entry { at: T0, cost: 1 }, Entry { at: T0, cost: 2 }].into(),
            },
            T0 + 200,
            None,
            false,
        ),
        (
            WindowState::Exact {
                window_ms: 100,
                log: vec![Entry { at: T0, cost: 0 }].into(),
            },
            T0,
            None,
            false,
        ),
    ];
    for (state, now, until, valid) in rows {
        assert_eq!(state.counts_until(*now), *until, "{state:?}");
        assert_eq!(state.is_valid(), *valid, "{state:?}");
    }
}

#[test]
fn encoded_sizes() {
    let size = |s: &WindowState| rmp_serde::to_vec(s).map(|v| v.len()).unwrap_or(0);
    let sliding = WindowState::Sliding {
        start: T0,
        prev: 57,
        curr: 3,
        window_ms: 60_000,
    };
    let fixed = WindowState::Fixed {
        end: T0 + 60_000,
        count: 12,
    };
    assert_eq!(size(&sliding), 18);
    assert_eq!(size(&fixed), 14);
    let log: Vec<Entry> = (0..1000)
        .map(|i| Entry {
            at: T0 + i * 3_600,
            cost: 1,
        })
        .collect();
    let exact = WindowState::Exact {
        window_ms: 3_600_000,
        log: log.into(),
    };
    // Header: map, "e", array of 2, window (u32), array16 header; the
    // first entry: time (u64) and cost; then 4 bytes per entry: the
    // delta 3600 as a u16 (3 bytes) and the cost (1 byte).
    assert_eq!(size(&exact), 4 + 5 + 3 + 9 + 1 + 999 * 4);
}

#[test]
fn window_end_in_64_bits_is_the_general_boundary() {
    let times = [
        i64::MIN,
        i64::MIN + 1,
        -86_400_001,
        -1,
        0,
        1,
        59_999,
        60_000,
        1_764_000_000_123,
        i64::MAX - 1,
        i64::MAX,
    ];
    for window_ms in [1, 2, 1000, 60_000, 3_153_600_000_000, u64::MAX] {
        for offset_ms in [0, 1, window_ms / 2, window_ms - 1, window_ms, u64::MAX] {
            let w = Window {
                limit: 10,
                window_ms,
                mode: Mode::Fixed,
                offset_ms,
            };
            for now in times {
                let general = w.boundary_before(i128::from(now)) + w.w();
                assert_eq!(w.window_end(now), general, "{window_ms} {offset_ms} {now}");
            }
        }
    }
}
