//! `RL.TAKE ... DELAY`: shaping instead of rejecting, against a real server.

mod common;

use std::time::Duration;

use common::*;

/// 20 concurrent callers on a bucket of 1 point refilled 10 times a
/// second, each sleeping the wait it is given: none is rejected, and they
/// proceed 100 ms apart as measured by the server's clock.
#[test]
fn twenty_callers_that_sleep_the_wait_proceed_at_the_rate() {
    let server = Server::start(&[]);
    // Each caller reads the server clock before its call (the earliest of
    // these is no later than the first slot) and after its wait.
    let times: Vec<(i64, i64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..20)
            .map(|_| {
                let server = &server;
                s.spawn(move || {
                    let mut con = server.client();
                    let before = server_time_us(&mut con);
                    let d = decide(&mut con, "RL.TAKE shape 1 10 1 DELAY 5");
                    assert!(
                        d.status == ALLOWED || d.status == DELAYED,
                        "never rejected: {d:?}"
                    );
                    std::thread::sleep(Duration::from_millis(d.retry_after_ms as u64));
                    (before, server_time_us(&mut con))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("caller"))
            .collect()
    });
    let base = times.iter().map(|t| t.0).min().expect("callers");
    let mut proceeds: Vec<i64> = times.iter().map(|t| t.1).collect();
    proceeds.sort_unstable();
    for (k, t) in proceeds.iter().enumerate() {
        // Slot k is 100 ms x k after the first call; a caller that sleeps
        // its wait proceeds at its slot or later, never earlier.
        let since_ms = (t - base) / 1000;
        assert!(
            since_ms >= k as i64 * 100 - 1,
            "caller {k} proceeded {since_ms} ms after the start"
        );
    }
    let span_ms = (proceeds[19] - base) / 1000;
    assert!(
        span_ms <= 1900 + 1000,
        "20 calls at 10/s take about 1.9 s: {span_ms} ms"
    );
}

#[test]
fn a_wait_beyond_max_wait_is_throttled_and_reserves_nothing() {
    let server = Server::start(&[]);
    let mut con = server.client();
    assert_eq!(
        decide(&mut con, "RL.TAKE d 1 1 10 DELAY 15").status,
        ALLOWED
    );
    let d = decide(&mut con, "RL.TAKE d 1 1 10 DELAY 15");
    assert_eq!(d.status, DELAYED);
    near(
        d.retry_after_ms,
        9_900,
        10_000,
        "wait for the reserved slot",
    );
    let dump: Vec<u8> = redis::cmd("DUMP").arg("d").query(&mut con).expect("DUMP");
    let d = decide(&mut con, "RL.TAKE d 1 1 10 DELAY 15");
    assert_eq!(
        d.status, THROTTLED,
        "the next slot is 20 s away, beyond 15 s"
    );
    near(d.retry_after_ms, 19_900, 20_000, "retry_after_ms");
    let after: Vec<u8> = redis::cmd("DUMP").arg("d").query(&mut con).expect("DUMP");
    assert_eq!(dump, after, "nothing reserved");
    assert_eq!(
        decide(&mut con, "RL.TAKE d 1 1 10").status,
        THROTTLED,
        "a call without DELAY sees the reservation"
    );
    expect_err(call(&mut con, "RL.TAKE d 1 1 10 DELAY 0"), "DELAY max_wait");
    expect_err(
        call(&mut con, "RL.WINDOW w 1 10 DELAY 5"),
        "unknown option 'DELAY'",
    );
    let info = server.info("rl");
    assert_eq!(info_field(&info, "rl_take_delayed").as_deref(), Some("1"));
}

#[test]
fn reservations_replicate_as_effects() {
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let mut con = master.client();
    for _ in 0..5 {
        ints(&mut con, "RL.TAKE r 2 1 1 DELAY 10 ALSO s 5 5 1");
    }
    wait_replica(&mut con, 1, 5000);
    assert_eq!(snapshot(&mut con), snapshot(&mut replica.client()));
}
