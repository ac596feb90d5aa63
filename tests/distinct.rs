//! RL.DISTINCT against a real redis-server (its clock moved by the
//! `TimeShift` shim): the documented behaviour, bad input, the box it trips
//! (and that `RL.TAKE` then meets), the credential-stuffing pattern,
//! replication and AOF replay, and what a call replicates: the member it
//! saw and the members it trimmed, not the set.

mod common;

use common::*;

/// `DUMP` of a key (nil as empty).
fn dump(con: &mut redis::Connection, key: &str) -> Vec<u8> {
    redis::cmd("DUMP")
        .arg(key)
        .query::<Option<Vec<u8>>>(con)
        .expect("DUMP")
        .unwrap_or_default()
}

/// `d` has `[status, limit, remaining]`, the reply's fixed fields, and
/// `reset_ms` at most `reset` and at most 5 s less (the clock runs on);
/// `retry_after_ms` is 0 when allowed, `reset_ms` otherwise.
fn expect(d: Decision, head: [i64; 3], reset: i64, what: &str) {
    assert_eq!(
        d.untimed(),
        [head[0], head[1], head[2], 0, -1, 0],
        "{what}: {d:?}"
    );
    near(d.reset_ms, reset - 5_000, reset, what);
    let retry = if d.status == ALLOWED { 0 } else { d.reset_ms };
    assert_eq!(d.retry_after_ms, retry, "{what}: retry_after_ms");
}

#[test]
fn counts_distinct_members_in_a_sliding_window() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    let at = |m: &str| format!("RL.DISTINCT ip:1 {m} 3 60");
    let peek = |m: &str| format!("RL.DISTINCT ip:1 {m} 3 60 PEEK");
    expect(decide(&mut con, &at("alice")), [1, 3, 2], 60_000, "alice");
    clock.advance_ms(1_000);
    let again = decide(&mut con, &at("alice"));
    expect(
        again,
        [1, 3, 2],
        60_000,
        "a member seen again counts once, from its latest sighting",
    );
    clock.advance_ms(1_000);
    expect(
        decide(&mut con, &at("bob")),
        [1, 3, 1],
        59_000,
        "bob: alice is the oldest",
    );
    expect(
        decide(&mut con, &at("carol")),
        [1, 3, 0],
        59_000,
        "carol: at the limit",
    );
    // Above the limit: refused, back at the limit when alice leaves.
    let before = dump(&mut con, "ip:1");
    expect(
        decide(&mut con, &peek("dave")),
        [0, 3, 0],
        59_000,
        "PEEK dave",
    );
    assert_eq!(dump(&mut con, "ip:1"), before, "PEEK records nothing");
    expect(
        decide(&mut con, &at("dave")),
        [0, 3, 0],
        59_000,
        "dave: above the limit",
    );
    expect(
        decide(&mut con, &at("bob")),
        [0, 3, 0],
        59_000,
        "a refused member is recorded: the count stays above the limit",
    );
    near(
        int(&mut con, "PEXPIRETIME ip:1") - clock_now(&mut con),
        55_000,
        60_000,
        "the key lasts until its newest member leaves",
    );
    // alice (seen at +1 s) left at +61 s: the count is back at 3.
    clock.advance_ms(59_500);
    expect(decide(&mut con, &peek("bob")), [1, 3, 0], 500, "bob again");
    expect(
        decide(&mut con, &peek("erin")),
        [0, 3, 0],
        500,
        "erin is one too many",
    );
    // Once every member has left the window, the key is gone.
    clock.advance_ms(61_000);
    assert_eq!(int(&mut con, "EXISTS ip:1"), 0, "expired with its members");
    expect(
        decide(&mut con, &at("erin")),
        [1, 3, 2],
        60_000,
        "a new window",
    );
    let info = server.info("rl");
    assert_eq!(
        info_field(&info, "rl_distinct_calls").as_deref(),
        Some("10")
    );
    assert_eq!(
        info_field(&info, "rl_distinct_allowed").as_deref(),
        Some("6")
    );
    assert_eq!(info_field(&info, "rl_distinct_over").as_deref(), Some("4"));
}

/// The server's clock in ms.
fn clock_now(con: &mut redis::Connection) -> i64 {
    server_time_us(con) / 1000
}

#[test]
fn bad_input_is_an_error_that_writes_nothing() {
    let server = Server::start(&[]);
    let mut con = server.client();
    assert_rejected(
        &mut con,
        &[
            ("RL.DISTINCT k", "missing member"),
            ("RL.DISTINCT k m", "missing limit"),
            ("RL.DISTINCT k m 10", "missing window"),
            ("RL.DISTINCT k m 0 60", "limit must be"),
            ("RL.DISTINCT k m 10001 60", "limit must be"),
            ("RL.DISTINCT k m 1.5 60", "limit must be"),
            (
                "RL.DISTINCT k m 99999999999999999999999 60",
                "limit must be",
            ),
            ("RL.DISTINCT k m 10 0", "window must be"),
            ("RL.DISTINCT k m 10 -1", "window must be"),
            ("RL.DISTINCT k m 10 inf", "window must be"),
            ("RL.DISTINCT k m 10 nan", "window must be"),
            ("RL.DISTINCT k m 10 3153600001", "window must be"),
            ("RL.DISTINCT k m 10 60 TRIP", "missing TRIP level"),
            ("RL.DISTINCT k m 10 60 TRIP 0 60", "TRIP level must be"),
            ("RL.DISTINCT k m 10 60 TRIP 4 60", "TRIP level must be"),
            ("RL.DISTINCT k m 10 60 TRIP 3", "missing TRIP duration"),
            ("RL.DISTINCT k m 10 60 TRIP 3 -5", "TRIP duration must be"),
            (
                "RL.DISTINCT k m 10 60 PEEK PEEK",
                "PEEK is given more than once",
            ),
            (
                "RL.DISTINCT k m 10 60 TRIP 1 1 TRIP 1 1",
                "TRIP is given more than once",
            ),
            ("RL.DISTINCT k m 10 60 COST 2", "unknown option"),
        ],
    );
    call_ok(&mut con, "SET s v");
    expect_err(call(&mut con, "RL.DISTINCT s m 10 60"), "WRONGTYPE");
}

#[test]
fn trip_boxes_the_key_for_every_limiter_and_announces_it() {
    let server = Server::start(&["--notify-keyspace-events", "KEd"]);
    let mut sub_con = server.client();
    let mut pubsub = rl_events(&mut sub_con);
    let mut con = server.client();
    let line = |m: &str| format!("RL.DISTINCT sub:alice {m} 2 600 TRIP 2 300");
    assert_eq!(decide(&mut con, &line("10.0.0.1")).status, ALLOWED);
    assert_eq!(decide(&mut con, &line("10.0.0.2")).status, ALLOWED);
    let peek = decide(&mut con, &format!("{} PEEK", line("10.0.0.3")));
    assert_eq!(peek.status, THROTTLED, "PEEK never trips");
    assert_eq!(box_status(&mut con, "sub:alice").to_array(), [0, 0, 0, 0]);
    let tripped = decide(&mut con, &line("10.0.0.3"));
    assert_eq!(
        tripped.untimed(),
        [BOXED, 2, 0, 2, 0, 0],
        "the count went above the limit: boxed at level 2"
    );
    near(tripped.retry_after_ms, 299_000, 300_000, "the box's time");
    let status = box_status(&mut con, "sub:alice").to_array();
    assert_eq!(
        (status[0], status[2]),
        (2, 1),
        "level 2, one offense: {status:?}"
    );
    // The box is the key's: a token bucket on the same key is boxed too,
    // and a distinct call answers -1 at once without recording.
    let take = decide(&mut con, "RL.TAKE sub:alice 10 10 60");
    assert_eq!((take.status, take.box_level), (BOXED, 2));
    let before = dump(&mut con, "sub:alice");
    assert_eq!(decide(&mut con, &line("10.0.0.9")).status, BOXED);
    assert_eq!(
        dump(&mut con, "sub:alice"),
        before,
        "boxed: nothing recorded"
    );
    let msg = pubsub.get_message().expect("an event within 5 s");
    let payload: String = msg.get_payload().expect("payload");
    assert_eq!(
        (msg.get_channel_name(), payload.as_str()),
        ("__keyevent@0__:rl.boxed", "sub:alice")
    );
    let info = server.info("rl");
    assert_eq!(info_field(&info, "rl_distinct_trips").as_deref(), Some("1"));
    assert_eq!(
        info_field(&info, "rl_box_trips_level2").as_deref(),
        Some("1")
    );
    // Released, the count is still above the limit: the next new IP trips
    // again (a second offense).
    assert_eq!(int(&mut con, "RL.BOX RELEASE sub:alice"), 1);
    assert_eq!(decide(&mut con, &line("10.0.0.4")).status, BOXED);
    assert_eq!(box_status(&mut con, "sub:alice").to_array()[2], 2);
}

#[test]
fn fifty_subjects_from_one_ip_in_ten_minutes_trip_level_3() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    let key = "stuffing:ip:203.0.113.9";
    let line = |i: usize| format!("RL.DISTINCT {key} user{i}@example.com 50 600 TRIP 3 0");
    for i in 0..50 {
        let d = decide(&mut con, &line(i));
        assert_eq!(
            (d.status, d.remaining),
            (ALLOWED, 49 - i as i64),
            "subject {i}"
        );
        clock.advance_ms(10_000);
        // Retrying a subject already seen is no new subject.
        assert_eq!(decide(&mut con, &line(i)).status, ALLOWED);
    }
    let d = decide(&mut con, &line(50));
    assert_eq!(
        d.untimed(),
        [BOXED, 50, 0, 3, 0, 0],
        "the 51st subject trips"
    );
    assert_eq!(d.retry_after_ms, -1, "a manual box");
    assert_eq!(box_status(&mut con, key).to_array(), [3, -1, 1, 0]);
    assert_eq!(
        int(&mut con, &format!("PEXPIRETIME {key}")),
        -1,
        "kept while boxed"
    );
    // A slow IP, 50 subjects spread over more than ten minutes, is not.
    let slow = |i: usize| format!("RL.DISTINCT slow:ip {i} 50 600 TRIP 3 0");
    for i in 0..200 {
        assert_eq!(
            decide(&mut con, &slow(i)).status,
            ALLOWED,
            "slow subject {i}"
        );
        clock.advance_ms(12_500);
    }
    // Memory stays bounded by limit + 1 members, however many were seen.
    let bytes = dump(&mut con, "slow:ip").len();
    assert!(bytes < 51 * 20 + 64, "DUMP of {bytes} bytes");
}

#[test]
fn replicas_and_the_aof_hold_the_same_members() {
    let master = Server::start(AOF_EVERY_WRITE);
    let replica = start_replica(&master);
    let mut con = master.client();
    for i in 0..40 {
        decide(&mut con, &format!("RL.DISTINCT ip:{} s{i} 10 3600", i % 3));
        decide(
            &mut con,
            &format!("RL.DISTINCT sub:{} ip{i} 5 3600 TRIP 1 600", i % 2),
        );
        decide(&mut con, &format!("RL.DISTINCT ip:0 s{i} 10 3600 PEEK"));
    }
    wait_replica(&mut con, 1, 5000);
    let on_master = snapshot(&mut con);
    assert_eq!(on_master.len(), 5, "{:?}", on_master.keys());
    assert_eq!(
        snapshot(&mut replica.client()),
        on_master,
        "DUMP and PEXPIRETIME"
    );
    master.kill9();
    master.restart();
    assert_eq!(
        snapshot(&mut master.client()),
        on_master,
        "after replaying the AOF"
    );
}

#[test]
fn a_call_replicates_its_member_not_the_set_and_replicas_end_with_the_same_bytes() {
    let clock = TimeShift::new();
    let master = Server::start_with(&clock.prefix(), AOF_EVERY_WRITE);
    let replica = start_replica(&master);
    let mut con = master.client();
    let key = "login:{ip}";
    for i in 0..150 {
        clock.advance_ms(1);
        decide(&mut con, &format!("RL.DISTINCT {key} subject-{i} 100 60"));
    }
    let whole = dump(&mut con, key).len();
    assert!(whole > 1000, "101 members kept: a DUMP of {whole} bytes");
    // A fixed pseudo-random sequence: members old and new, clock steps up
    // to 2 s in a 60 s window (members leave it), now and then a window of
    // 5 s (most leave at once), a PEEK, a box tripped above the limit.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let offset = || info_u64(&master, "replication", "master_repl_offset");
    let mut largest = 0;
    for _ in 0..300 {
        clock.advance_ms(next(2000) as i64);
        let member = next(400);
        let window = if next(25) == 0 { 5 } else { 60 };
        let option = match next(20) {
            0 => " PEEK",
            1 => " TRIP 1 1",
            _ => "",
        };
        let before = offset();
        decide(
            &mut con,
            &format!("RL.DISTINCT {key} subject-{member} 100 {window}{option}"),
        );
        largest = largest.max(offset() - before);
    }
    assert!(
        largest < 200,
        "at most {largest} replicated bytes per call (the set: {whole})"
    );
    wait_replica(&mut con, 1, 10_000);
    let on_master = snapshot(&mut con);
    assert!(on_master.contains_key(key), "{:?}", on_master.keys());
    assert_eq!(
        snapshot(&mut replica.client()),
        on_master,
        "DUMP and PEXPIRETIME"
    );
    master.restart();
    assert_eq!(
        snapshot(&mut master.client()),
        on_master,
        "after replaying the AOF"
    );
}
