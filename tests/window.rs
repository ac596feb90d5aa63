//! RL.WINDOW against a real redis-server: the three modes, ALSO windows,
//! penalties, probes, offsets, exact retry_after_ms, persistence.

mod common;

use common::*;

/// Call `line` until the reply is throttled; returns the allowed count
/// and the throttled reply (bounded by `limit + 1` calls).
fn fill(con: &mut redis::Connection, line: &str, limit: usize) -> (usize, Decision) {
    for allowed in 0..=limit {
        let d = decide(con, line);
        if !d.allowed() {
            return (allowed, d);
        }
    }
    panic!("{line}: more than {limit} calls allowed");
}

#[test]
fn every_mode_admits_the_limit_then_says_exactly_when_to_retry() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    for mode in ["", "EXACT", "FIXED"] {
        let line = format!("RL.WINDOW w:{mode} 5 10 {mode}");
        let (allowed, d) = fill(&mut con, &line, 5);
        assert_eq!(allowed, 5, "{mode}");
        assert_eq!(d.untimed(), [THROTTLED, 5, 0, 0, -1, 0], "{mode}: {d:?}");
        let wait = d.retry_after_ms;
        assert!(wait > 0 && wait <= 20_000, "{mode}: {wait}");
        // Frozen clock: shift it by the wait (the real clock moves a few ms
        // more, which only helps).
        clock.advance_ms(wait);
        assert_eq!(
            decide(&mut con, &line).status,
            ALLOWED,
            "{mode}: waiting retry_after_ms admits"
        );
    }
}

#[test]
fn exact_counts_the_true_sliding_window() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    let line = "RL.WINDOW e 3 10 EXACT";
    decide(&mut con, line);
    clock.advance_ms(4_000);
    decide(&mut con, line);
    decide(&mut con, line);
    let d = decide(&mut con, line);
    assert_eq!(d.status, THROTTLED);
    near(
        d.retry_after_ms,
        5_900,
        6_000,
        "the first call leaves the window 10 s after it was made",
    );
    near(
        d.reset_ms,
        9_900,
        10_000,
        "reset: the last calls leave the window in 10 s",
    );
    clock.advance_ms(d.retry_after_ms);
    let d = decide(&mut con, line);
    assert_eq!(
        (d.status, d.limit, d.remaining),
        (ALLOWED, 3, 0),
        "exactly one slot came back"
    );
    assert_eq!(decide(&mut con, line).status, THROTTLED);
}

#[test]
fn fixed_windows_of_two_keys_reset_at_different_instants() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let resets: Vec<i64> = ["rl:{t:1}:key:7", "rl:{t:1}:key:8", "rl:{t:2}:key:7"]
        .iter()
        .map(|k| decide(&mut con, &format!("RL.WINDOW {k} 10 3600 FIXED")).reset_ms)
        .collect();
    assert!(
        resets[0] != resets[1] && resets[1] != resets[2] && resets[0] != resets[2],
        "{resets:?}"
    );

    // The offset is a property of the key name: the same after a reload.
    let before = decide(&mut con, "RL.WINDOW rl:{t:1}:key:7 10 3600 FIXED COST 0").reset_ms;
    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut con)
        .expect("DEBUG RELOAD");
    let after = decide(&mut con, "RL.WINDOW rl:{t:1}:key:7 10 3600 FIXED COST 0");
    assert_eq!(after.remaining, 9, "the count survived");
    near(after.reset_ms, before - 1000, before, "the same boundary");
}

/// A window key expires at the end of what it counts: the same instant
/// call after call within a window. A TTL removed or moved by hand stays
/// as it was left while the window lasts; the next window's end is set.
#[test]
fn a_window_key_expires_at_its_end_and_a_ttl_set_by_hand_lasts_its_window() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    for mode in ["FIXED", ""] {
        for change in [
            "PERSIST {key}",
            "PEXPIRE {key} 99999999",
            "PEXPIRE {key} 5000",
        ] {
            let key = format!("w:ttl:{mode}:{}", change.len());
            // 1 s into a window of the key: the next 59 min fall in it.
            clock.start_window(&key, 3_600_000, 1_000);
            let line = format!("RL.WINDOW {key} 100 3600 {mode}");
            let expiry = |con: &mut redis::Connection| int(con, &format!("PEXPIRETIME {key}"));
            decide(&mut con, &line);
            let end = expiry(&mut con);
            assert!(end > 0, "{mode}: {end}");
            clock.advance_ms(1_000);
            decide(&mut con, &line);
            assert_eq!(expiry(&mut con), end, "{mode}: the same end");
            int(&mut con, &change.replace("{key}", &key));
            let by_hand = expiry(&mut con);
            assert_ne!(by_hand, end, "{mode}: {change}");
            clock.advance_ms(1_000);
            let d = decide(&mut con, &line);
            assert_eq!(d.remaining, 97, "{mode}: {change}: the same window");
            assert_eq!(expiry(&mut con), by_hand, "{mode}: after {change}");
            // the sliding window's end moves one window later
            clock.advance_ms(3_600_000);
            decide(&mut con, &line);
            let next = expiry(&mut con);
            assert!(next > end && next != by_hand, "{mode}: {change}: {next}");
        }
    }
}

#[test]
fn deposit_velocity_five_a_minute_and_twenty_an_hour() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    let line = "RL.WINDOW vel:{user:9}:1m 5 60 ALSO vel:{user:9}:1h 20 3600 EXACT";
    let mut allowed = 0;
    for minute in 0..5 {
        // A minute of deposits, as fast as they are admitted.
        let (n, d) = fill(&mut con, line, 5);
        allowed += n;
        if d.binding == 1 {
            assert_eq!((minute, allowed), (3, 20), "the hour window binds at 20");
            assert!(
                d.retry_after_ms > 3_000_000,
                "until the first deposit leaves the hour: {d:?}"
            );
            return;
        }
        assert_eq!((n, d.binding), (5, 0), "the minute window binds first");
        clock.advance_ms(60_000);
    }
    panic!("the hour window never bound: {allowed}");
}

#[test]
fn a_login_lockout_counts_only_failures() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let probe = "RL.WINDOW auth:{sub:alice} 5 900 COST 0";
    let failure = "RL.WINDOW auth:{sub:alice} 5 900 STRIKES 1 900 BOX 900 3600 86400";
    let d = decide(&mut con, probe);
    assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 5, 5));
    assert_eq!(
        int(&mut con, "EXISTS auth:{sub:alice}"),
        0,
        "a probe writes nothing"
    );
    let mut resets = Vec::new();
    for left in (0..5).rev() {
        let d = decide(&mut con, failure);
        assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 5, left));
        resets.push(d.reset_ms);
    }
    let d = decide(&mut con, probe);
    assert_eq!(
        (d.status, d.limit, d.remaining),
        (ALLOWED, 5, 0),
        "a probe always fits: 0 failures left"
    );
    let d = decide(&mut con, failure);
    assert_eq!(d.status, THROTTLED, "the sixth failure is refused");
    // The five failures weigh 5 until their sub-window ends, then
    // ceil(5 × (window − e) / window), which is 4 once e ≥ 0.2 window: so
    // the retry is at most 1.2 windows away.
    near(
        d.retry_after_ms,
        1,
        1_080_000,
        "until the sliding count admits one more",
    );
    resets.push(d.reset_ms);
    // `reset_ms` (the end of the sub-window after the last point) only
    // falls while the calls stay in one sub-window; unless a boundary
    // passed during these milliseconds, the retry is exactly 0.2 window
    // into the next sub-window, 0.8 window before `reset_ms`.
    if resets.windows(2).all(|w| w[1] <= w[0]) {
        near(
            d.retry_after_ms,
            d.reset_ms - 720_000 - 1,
            d.reset_ms - 720_000 + 1,
            "five points of one sub-window weigh 4 after 0.2 window",
        );
    }
    let d = decide(&mut con, failure);
    assert_eq!(
        (d.status, d.retry_after_ms, d.box_level),
        (BOXED, 900_000, 1),
        "retrying before that is a strike: locked out for 15 minutes"
    );
    assert_eq!(
        decide(&mut con, probe).status,
        BOXED,
        "the probe sees the lockout"
    );
}

#[test]
fn a_cost_above_any_limit_and_other_bad_input_change_nothing() {
    let server = Server::start(&[]);
    let mut con = server.client();
    assert_rejected(
        &mut con,
        &[
            ("RL.WINDOW k 0 60", "limit"),
            ("RL.WINDOW k 5 0", "window"),
            ("RL.WINDOW k 5 60 COST 6", "COST"),
            (
                "RL.WINDOW k 5 60 ALSO t 2 60 COST 3",
                "COST is above the capacity of ALSO bucket 1",
            ),
            (
                "RL.WINDOW k 10001 60 EXACT",
                "limit must be at most 10000 with EXACT",
            ),
            ("RL.WINDOW k 5 60 EXACT FIXED", "EXACT or FIXED"),
            ("RL.WINDOW k 5 60 BOX 1 1 1", "BOX requires STRIKES"),
            ("RL.WINDOW k 5 60 ALSO k 5 60", "repeats a key"),
        ],
    );
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("v")
        .query(&mut con)
        .expect("SET");
    expect_err(call(&mut con, "RL.WINDOW k 5 60 ALSO s 5 60"), "WRONGTYPE");
    assert_eq!(int(&mut con, "EXISTS k"), 0);
}

#[test]
fn a_key_can_hold_a_bucket_a_window_and_leases_at_once() {
    let server = Server::start(&[]);
    let mut con = server.client();
    decide(&mut con, "RL.TAKE multi 10 10 60 COST 3");
    decide(&mut con, "RL.WINDOW multi 5 600 COST 2");
    call(&mut con, "RL.LEASE ACQUIRE multi 1 1200").expect("ACQUIRE");
    assert_eq!(
        decide(&mut con, "RL.TAKE multi 10 10 60 COST 0").remaining,
        7
    );
    assert_eq!(
        decide(&mut con, "RL.WINDOW multi 5 600 COST 0").remaining,
        3
    );
    near(
        int(&mut con, "PTTL multi"),
        1_199_000,
        1_200_000,
        "the lease lives longest",
    );
}

#[test]
fn info_counts_window_calls() {
    let server = Server::start(&[]);
    let mut con = server.client();
    // Allowed, refused, refused early (a strike), tripped.
    for _ in 0..4 {
        ints(&mut con, "RL.WINDOW i 1 60 STRIKES 2 60");
    }
    let info = server.info("rl");
    for (field, value) in [
        ("rl_window_calls", "4"),
        ("rl_window_allowed", "1"),
        ("rl_window_throttled", "2"),
        ("rl_window_boxed", "1"),
        ("rl_take_calls", "0"),
    ] {
        assert_eq!(
            info_field(&info, field).as_deref(),
            Some(value),
            "{field} in\n{info}"
        );
    }
}

#[test]
fn command_getkeys_names_every_window_key() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let keys = str_array(
        call(
            &mut con,
            "COMMAND GETKEYS RL.WINDOW a 1 1 EXACT ALSO b 2 2 COST 1 ALSO c 3 3",
        )
        .expect("GETKEYS"),
    );
    assert_eq!(keys, ["a", "b", "c"]);
}

#[test]
fn window_lengths_that_alternate_keep_the_key_loadable_and_its_end_near() {
    // Two configurations served at once (a rolling deployment), at the
    // longest window a call takes: every call converts the key. Its end
    // stays within four windows of now (a converted sliding window starts
    // at most two ahead, and a point charged into it counts two more), and
    // the key loads back (DUMP / RESTORE, DEBUG RELOAD), as a replica's
    // full sync or a restart would.
    let server = Server::start(&[]);
    let mut con = server.client();
    let century_s: i64 = 100 * 365 * 24 * 3600;
    for i in 0..6 {
        let (mode, window) = match i % 3 {
            0 => ("", century_s),
            1 => ("", century_s - 1),
            _ => ("FIXED", century_s),
        };
        // One point a century: every call after the first is throttled,
        // and a throttled call stores the converted state.
        decide(&mut con, &format!("RL.WINDOW w 1 {window} {mode}"));
        let pttl = int(&mut con, "PTTL w");
        assert!(
            pttl > 0 && pttl <= 4 * century_s * 1000 + 60_000,
            "call {i}: the key lasts {pttl} ms"
        );
    }
    let dump: Vec<u8> = redis::cmd("DUMP").arg("w").query(&mut con).expect("DUMP");
    let _: () = redis::cmd("RESTORE")
        .arg("w2")
        .arg(0)
        .arg(dump)
        .query(&mut con)
        .expect("the key restores");
    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut con)
        .expect("DEBUG RELOAD");
    assert_eq!(
        int(&mut con, "EXISTS w w2"),
        2,
        "both keys after the reload"
    );
    // Shorter alternating windows: the key's end stays within a few
    // windows of now however many calls alternate.
    for i in 0..200 {
        let window = if i % 2 == 0 { 86_400 } else { 86_399 };
        decide(&mut con, &format!("RL.WINDOW d 1000000 {window}"));
    }
    let pttl = int(&mut con, "PTTL d");
    assert!(
        pttl <= 5 * 86_400_000,
        "after 200 alternating calls: {pttl} ms"
    );
}
