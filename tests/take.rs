//! RL.TAKE against a real redis-server: the documented behaviour, bad input,
//! expiry, time steps and INFO counters.

mod common;

use common::*;
use redis::Value;

#[test]
fn growth_tier_with_a_tenant_bucket() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let both = "RL.TAKE rl:{t:42}:key:7 3000 3000 60 COST 10 ALSO rl:{t:42}:tenant 100 100 60";
    let d = decide(&mut con, both);
    assert_eq!(
        (d.status, d.limit, d.remaining, d.binding),
        (ALLOWED, 100, 90, 1),
        "the tenant bucket has fewer points left: it binds"
    );
    near(d.reset_ms, 5990, 6000, "reset_ms");
    assert_eq!(
        (d.retry_after_ms, d.box_level, d.strikes_remaining),
        (0, 0, -1)
    );
    let d = decide(&mut con, "RL.TAKE rl:{t:42}:key:7 3000 3000 60 COST 10");
    assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 3000, 2980));
    // Burn the tenant bucket: 9 more calls of 10 points, then a throttle.
    for _ in 0..9 {
        decide(&mut con, both);
    }
    let d = decide(&mut con, both);
    assert_eq!((d.status, d.limit, d.remaining), (THROTTLED, 100, 0));
    near(
        d.retry_after_ms,
        5000,
        6000,
        "retry_after_ms: 10 points at 100/min",
    );
    assert_eq!((d.box_level, d.strikes_remaining, d.binding), (0, -1, 1));
    // Nothing was taken from the key bucket by the throttled call.
    let probe = decide(&mut con, "RL.TAKE rl:{t:42}:key:7 3000 3000 60 COST 0");
    assert_eq!((probe.status, probe.limit), (ALLOWED, 3000));
    near(
        probe.remaining,
        2890,
        2940,
        "110 points spent, a little refill",
    );
}

#[test]
fn the_bucket_with_the_longest_wait_binds_and_retry_after_is_honoured() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let line = "RL.TAKE a 2 2 0.2 ALSO b 10 10 100 ALSO c 2 1 0.5";
    assert_eq!(
        decide(&mut con, line).binding,
        0,
        "a and c tie with 1 point left: the first binds"
    );
    assert_eq!(decide(&mut con, line).status, ALLOWED);
    let d = decide(&mut con, line);
    assert_eq!(d.status, THROTTLED);
    assert_eq!(d.binding, 2, "c refills slowest: it needs the longest wait");
    near(d.retry_after_ms, 300, 500, "retry_after_ms");
    std::thread::sleep(std::time::Duration::from_millis(d.retry_after_ms as u64));
    assert_eq!(
        decide(&mut con, line).status,
        ALLOWED,
        "waiting retry_after_ms admits the request"
    );
}

#[test]
fn a_probe_writes_nothing() {
    let server = Server::start(&[]);
    let mut con = server.client();
    assert_eq!(
        ints(&mut con, "RL.TAKE p 5 1 10 COST 0"),
        [1, 5, 5, 0, 0, 0, -1, 0]
    );
    assert_eq!(int(&mut con, "EXISTS p"), 0, "no key created");
    decide(&mut con, "RL.TAKE p 5 1 10 COST 2");
    let expire = int(&mut con, "PEXPIRETIME p");
    let offset = server.info_get("replication", "master_repl_offset");
    let dump: Value = call(&mut con, "DUMP p").expect("DUMP");
    std::thread::sleep(std::time::Duration::from_millis(5));
    let d = decide(&mut con, "RL.TAKE p 5 1 10 COST 0 STRIKES 1 10");
    assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 5, 3));
    assert_eq!(d.strikes_remaining, 1);
    assert_eq!(int(&mut con, "PEXPIRETIME p"), expire, "TTL not refreshed");
    assert_eq!(
        call(&mut con, "DUMP p").expect("DUMP"),
        dump,
        "value unchanged"
    );
    assert_eq!(
        server.info_get("replication", "master_repl_offset"),
        offset,
        "nothing replicated"
    );
}

#[test]
fn strikes_trip_an_escalating_box() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    let line = "RL.TAKE login 1 1 1000 STRIKES 2 60 BOX 10 20 0";
    let d = decide(&mut con, line);
    assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 1, 0));
    let d = decide(&mut con, line);
    assert_eq!(
        (d.status, d.strikes_remaining),
        (THROTTLED, 2),
        "refused, a retry announced: no strike"
    );
    let d = decide(&mut con, line);
    assert_eq!(
        (d.status, d.strikes_remaining),
        (THROTTLED, 1),
        "an early retry: the first strike"
    );
    let d = decide(&mut con, line);
    assert_eq!(
        d.untimed(),
        [BOXED, 1, 0, 1, 0, 0],
        "second strike trips level 1"
    );
    near(d.retry_after_ms, 9990, 10000, "box ttl");
    assert_eq!(
        d.reset_ms, d.retry_after_ms,
        "reset_ms equals retry_after_ms when boxed"
    );
    assert_eq!(box_status(&mut con, "login").level, 1);

    clock.advance_ms(10_001);
    let d = decide(&mut con, line);
    assert_eq!(d.status, THROTTLED, "box over; the bucket is still empty");
    let d = decide(&mut con, line);
    assert_eq!(
        (d.status, d.strikes_remaining),
        (THROTTLED, 1),
        "retried early: a strike"
    );
    let d = decide(&mut con, line);
    assert_eq!(
        (d.status, d.box_level),
        (BOXED, 2),
        "the offense is remembered: level 2"
    );
    near(d.retry_after_ms, 19_990, 20_000, "level 2 lasts d2");

    clock.advance_ms(20_001);
    // A refusal, then two early retries: the third trip.
    decide(&mut con, line);
    decide(&mut con, line);
    let d = decide(&mut con, line);
    assert_eq!(
        (d.status, d.reset_ms, d.retry_after_ms, d.box_level),
        (BOXED, -1, -1, 3),
        "level 3 with d3 = 0 is manual"
    );
    assert_eq!(ints(&mut con, "RL.BOX STATUS login"), [3, -1, 3, 0]);
    assert_eq!(
        int(&mut con, "PTTL login"),
        -1,
        "a manual box keeps the key without TTL"
    );
    clock.advance_ms(86_400_000 * 30);
    assert_eq!(
        decide(&mut con, line).status,
        BOXED,
        "still boxed a month later"
    );
    assert_eq!(int(&mut con, "RL.BOX RELEASE login"), 1);
    assert_eq!(decide(&mut con, line).status, ALLOWED);
}

#[test]
fn an_active_box_blocks_every_call_and_charges_nothing() {
    let server = Server::start(&[]);
    let mut con = server.client();
    decide(&mut con, "RL.TAKE k 10 10 60 COST 4");
    assert_eq!(
        BoxStatus::from(ints(&mut con, "RL.BOX TRIP k 2 30")).level,
        2
    );
    let d = decide(&mut con, "RL.TAKE k 10 10 60 COST 1 ALSO other 5 5 60");
    assert_eq!(d.untimed(), [BOXED, 10, 0, 2, 0, 0]);
    near(d.retry_after_ms, 29_900, 30_000, "box ttl");
    assert_eq!(
        int(&mut con, "EXISTS other"),
        0,
        "no bucket read or charged"
    );
    assert_eq!(int(&mut con, "RL.BOX RELEASE k"), 1);
    assert_eq!(
        decide(&mut con, "RL.TAKE k 10 10 60 COST 0").remaining,
        6,
        "the box charged nothing"
    );
}

#[test]
fn key_ttl_follows_what_matters() {
    let server = Server::start(&[]);
    let mut con = server.client();
    decide(&mut con, "RL.TAKE b 10 1 1 COST 5");
    near(
        int(&mut con, "PTTL b"),
        4900,
        5000,
        "bucket full again in 5 s",
    );
    // Allowed, refused, then an early retry: a strike.
    for _ in 0..3 {
        decide(&mut con, "RL.TAKE s 1 1 1 STRIKES 5 100");
    }
    near(
        int(&mut con, "PTTL s"),
        99_000,
        100_000,
        "a live strike window keeps the key",
    );
    ints(&mut con, "RL.BOX TRIP x 1 10");
    near(
        int(&mut con, "PTTL x"),
        86_399_000,
        86_400_000,
        "the offense is remembered a day",
    );
    assert_eq!(int(&mut con, "RL.BOX RELEASE x FORGET"), 1);
    assert_eq!(
        int(&mut con, "EXISTS x"),
        0,
        "nothing left: the key is deleted"
    );
}

#[test]
fn a_tier_upgrade_keeps_what_was_spent() {
    let server = Server::start(&[]);
    let mut con = server.client();
    decide(&mut con, "RL.TAKE k 3000 3000 60 COST 100");
    let d = decide(&mut con, "RL.TAKE k 6000 6000 60 COST 0");
    assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 6000, 5900));
    let d = decide(&mut con, "RL.TAKE k 50 50 60 COST 0");
    assert_eq!(
        (d.status, d.limit),
        (THROTTLED, 50),
        "a downgrade below what was spent keeps the debt"
    );
    near(
        d.remaining,
        -50,
        -1,
        "and shows it: 100 spent, room for 50 (less what refilled)",
    );
    near(
        d.retry_after_ms,
        59_000,
        60_000,
        "until the 50 points above the new capacity refilled",
    );
}

#[test]
fn a_throttled_bucket_refills_at_its_new_rate() {
    let server = Server::start(&[]);
    let mut con = server.client();
    decide(&mut con, "RL.TAKE up 1 1 60");
    let d = decide(&mut con, "RL.TAKE up 1 1 0.3");
    assert_eq!(d.status, THROTTLED);
    near(d.retry_after_ms, 200, 300, "the wait at the new rate");
    std::thread::sleep(std::time::Duration::from_millis(d.retry_after_ms as u64));
    assert_eq!(
        decide(&mut con, "RL.TAKE up 1 1 0.3").status,
        ALLOWED,
        "waiting retry_after_ms at the new rate admits"
    );
}

#[test]
fn jitter_stretches_retry_after_within_its_bound() {
    let server = Server::start(&[]);
    let mut con = server.client();
    decide(&mut con, "RL.TAKE j 1 1 100");
    let mut seen = std::collections::HashSet::new();
    for _ in 0..50 {
        let d = decide(&mut con, "RL.TAKE j 1 1 100 JITTER 50");
        assert_eq!(d.status, THROTTLED);
        near(d.retry_after_ms, 99_000, 150_000, "jittered retry");
        seen.insert(d.retry_after_ms / 1000);
    }
    assert!(seen.len() > 5, "jitter spreads retries: {seen:?}");
}

/// `STRIKES ... EVERY` on each limiter command: the refusal after allowed
/// calls is a strike (without `EVERY` it is not), so one call locks a
/// subject out; the state it writes replicates like any strike.
#[test]
fn with_every_each_refusal_is_a_strike() {
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let mut con = master.client();
    for (i, limiter) in [
        "RL.TAKE {k}:{i} 5 5 3600",
        "RL.WINDOW {k}:{i} 5 3600",
        "RL.QUOTA {k}:{i} 5 MONTH",
    ]
    .iter()
    .enumerate()
    {
        let call = |key: &str, options: &str| {
            format!(
                "{} {options}",
                limiter.replace("{k}", key).replace("{i}", &i.to_string())
            )
        };
        for (key, options, sixth) in [
            (
                "every",
                "STRIKES 1 900 EVERY BOX 900 3600 86400",
                (BOXED, 0, 1),
            ),
            ("two", "STRIKES 2 900 EVERY", (THROTTLED, 1, 0)),
            ("early", "STRIKES 1 900", (THROTTLED, 1, 0)),
        ] {
            for n in 1..=5 {
                let d = decide(&mut con, &call(key, options));
                assert_eq!(d.status, ALLOWED, "{} call {n}", call(key, options));
            }
            let d = decide(&mut con, &call(key, options));
            assert_eq!(
                (d.status, d.strikes_remaining, d.box_level),
                sixth,
                "{}: the sixth call",
                call(key, options)
            );
        }
        // A probe is never a strike, EVERY or not.
        let probe = call("two", "COST 0 STRIKES 2 900 EVERY");
        assert_eq!(decide(&mut con, &probe).strikes_remaining, 1, "{probe}");
        let d = decide(&mut con, &call("two", "STRIKES 2 900 EVERY"));
        assert_eq!((d.status, d.box_level), (BOXED, 1), "the second refusal");
        let d = decide(&mut con, &call("every", "COST 0"));
        assert_eq!((d.status, d.box_level), (BOXED, 1));
        near(d.retry_after_ms, 1, 900_000, "the box of the sixth call");
    }
    wait_replica(&mut con, 1, 5000);
    assert_eq!(snapshot(&mut con), snapshot(&mut replica.client()));
}

#[test]
fn a_backward_clock_step_grants_nothing() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    let d = decide(&mut con, "RL.TAKE c 5 5 10 COST 5");
    assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 5, 0));
    clock.advance_ms(-3_600_000);
    let d = decide(&mut con, "RL.TAKE c 5 5 10 COST 1");
    assert_eq!((d.status, d.limit), (THROTTLED, 5));
    near(
        d.remaining,
        -1801,
        -1795,
        "an hour early, the bucket holds 1800 points (one per 2 s) too many",
    );
    near(
        d.retry_after_ms,
        3_600_000,
        3_602_000,
        "points come back as the clock passes them again",
    );
    clock.advance_ms(1_000_000);
    assert_eq!(
        decide(&mut con, "RL.TAKE c 5 5 10 COST 1").status,
        THROTTLED,
        "time already seen refills once"
    );
    clock.advance_ms(2_600_000 + 10_000);
    assert_eq!(decide(&mut con, "RL.TAKE c 5 5 10 COST 5").status, ALLOWED);
}

#[test]
fn bad_input_is_an_error_that_names_the_argument_and_changes_nothing() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let cases = [
        ("RL.TAKE", "wrong number of arguments"),
        ("RL.TAKE k", "missing capacity"),
        ("RL.TAKE k 10 10", "missing period"),
        ("RL.TAKE k 0 10 60", "capacity"),
        ("RL.TAKE k -1 10 60", "capacity"),
        ("RL.TAKE k 10 0 60", "tokens"),
        ("RL.TAKE k 10 10 0", "period"),
        ("RL.TAKE k 10 10 -1", "period"),
        ("RL.TAKE k 10 10 nan", "period"),
        ("RL.TAKE k 10 10 inf", "period"),
        ("RL.TAKE k 10 10 1e3", "period"),
        ("RL.TAKE k 10 10 0.0001", "period"),
        ("RL.TAKE k 1000000000000000000000 10 60", "capacity"),
        ("RL.TAKE k 10 10 60 COST 11", "COST"),
        ("RL.TAKE k 10 10 60 COST -1", "COST"),
        ("RL.TAKE k 10 10 60 COST", "missing COST"),
        ("RL.TAKE k 10 10 60 ALSO t 5 5 60 COST 6", "COST"),
        ("RL.TAKE k 10 10 60 ALSO t 5 5", "missing ALSO period"),
        ("RL.TAKE k 10 10 60 ALSO k 5 5 5", "ALSO key"),
        ("RL.TAKE k 10 10 60 STRIKES 0 60", "STRIKES threshold"),
        ("RL.TAKE k 10 10 60 STRIKES 5 0", "STRIKES window"),
        ("RL.TAKE k 10 10 60 BOX 1 2 3", "BOX requires STRIKES"),
        ("RL.TAKE k 10 10 60 OFFENSES 5", "OFFENSES requires STRIKES"),
        ("RL.TAKE k 10 10 60 EVERY", "EVERY requires STRIKES"),
        ("RL.TAKE k 10 10 60 COST 0 EVERY", "EVERY requires STRIKES"),
        ("RL.TAKE k 10 10 60 STRIKES 1 1 EVERY EVERY", "EVERY"),
        ("RL.TAKE k 10 10 60 STRIKES 1 1 BOX 1 2", "missing BOX d3"),
        ("RL.TAKE k 10 10 60 STRIKES 1 1 BOX 1 2 x", "BOX d3"),
        ("RL.TAKE k 10 10 60 STRIKES 1 1 OFFENSES 0", "OFFENSES ttl"),
        ("RL.TAKE k 10 10 60 JITTER 101", "JITTER"),
        ("RL.TAKE k 10 10 60 JITTER", "missing JITTER"),
        (
            "RL.TAKE k 10 10 60 COST 1 COST 1",
            "COST is given more than once",
        ),
        ("RL.TAKE k 10 10 60 NOPE", "unknown option"),
        ("RL.BOX", "wrong number of arguments"),
        ("RL.BOX NOPE k", "unknown subcommand"),
        ("RL.BOX STATUS", "wrong number of arguments"),
        ("RL.BOX TRIP k 4 10", "level"),
        ("RL.BOX TRIP k 1 -5", "duration"),
        ("RL.BOX RELEASE k NOW", "unknown option"),
    ];
    assert_rejected(&mut con, &cases);
}

#[test]
fn wrongtype_for_any_key_of_another_type() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("v")
        .query(&mut con)
        .expect("SET");
    for line in [
        "RL.TAKE s 1 1 1",
        "RL.TAKE k 1 1 1 ALSO s 1 1 1",
        "RL.BOX STATUS s",
        "RL.BOX TRIP s 1 1",
        "RL.BOX RELEASE s",
    ] {
        expect_err(call(&mut con, line), "WRONGTYPE");
    }
    assert_eq!(
        int(&mut con, "EXISTS k"),
        0,
        "the first key was not charged"
    );
    let v: String = redis::cmd("GET").arg("s").query(&mut con).expect("GET");
    assert_eq!(v, "v");
    ints(&mut con, "RL.TAKE k 1 1 1");
    expect_err(call(&mut con, "GET k"), "WRONGTYPE");
    assert_eq!(
        value_str(&call(&mut con, "TYPE k").expect("TYPE")),
        "rl-record"
    );
}

#[test]
fn command_getkeys_names_every_key() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let keys = str_array(
        call(
            &mut con,
            "COMMAND GETKEYS RL.TAKE a 1 1 1 COST 1 ALSO b 2 2 2 STRIKES 1 1 ALSO c 3 3 3 JITTER 5",
        )
        .expect("GETKEYS"),
    );
    assert_eq!(keys, ["a", "b", "c"]);
    assert_eq!(
        str_array(call(&mut con, "COMMAND GETKEYS RL.BOX STATUS x").expect("GETKEYS")),
        ["x"]
    );
    assert_eq!(
        str_array(call(&mut con, "COMMAND GETKEYS RL.BOX TRIP y 1 0").expect("GETKEYS")),
        ["y"]
    );
}

#[test]
fn info_counts_calls_and_outcomes() {
    let server = Server::start(&[]);
    let mut con = server.client();
    // Allowed, refused, refused early (a strike), tripped, boxed.
    for _ in 0..5 {
        ints(&mut con, "RL.TAKE i 1 1 100 STRIKES 2 100 BOX 100 100 100");
    }
    ints(&mut con, "RL.BOX TRIP j 3 0");
    int(&mut con, "RL.BOX RELEASE j");
    let info = server.info("rl");
    for (field, value) in [
        ("rl_take_calls", "5"),
        ("rl_take_allowed", "1"),
        ("rl_take_throttled", "2"),
        ("rl_take_boxed", "2"),
        ("rl_box_trips_level1", "1"),
        ("rl_box_trips_level3", "1"),
        ("rl_box_trips_manual", "1"),
        ("rl_box_releases", "1"),
    ] {
        assert_eq!(
            info_field(&info, field).as_deref(),
            Some(value),
            "{field} in\n{info}"
        );
    }
}
