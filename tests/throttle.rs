//! `CL.THROTTLE`: redis-cell's arguments and reply on rl's bucket, the
//! cases of redis-cell's documentation as a table, and the conversion of
//! a redis-cell value in place.

mod common;

use common::*;

/// The server's clock (`TIME`) in nanoseconds.
#[test]
fn the_cases_of_redis_cells_documentation() {
    let server = Server::start(&[]);
    let mut con = server.client();
    // "user123": a burst of 15, 30 per 60 s (one every 2 s), quantity 1.
    // (line, expected [limited, limit, remaining, retry_after, reset_after])
    let rows: &[(&str, [i64; 5])] = &[
        ("CL.THROTTLE user123 15 30 60", [0, 16, 15, -1, 2]),
        ("CL.THROTTLE user123 15 30 60 1", [0, 16, 14, -1, 4]),
        ("CL.THROTTLE user123 15 30 60 14", [0, 16, 0, -1, 32]),
        ("CL.THROTTLE user123 15 30 60", [1, 16, 0, 2, 32]),
        ("CL.THROTTLE user123 15 30 60 0", [0, 16, 0, -1, 32]),
        // A quantity above the burst can never be allowed.
        ("CL.THROTTLE other 5 10 10 7", [1, 6, 6, -1, 0]),
        ("CL.THROTTLE other 5 10 10 3", [0, 6, 3, -1, 3]),
        ("CL.THROTTLE other 5 10 10 0", [0, 6, 3, -1, 3]),
        // max_burst 0: one call at a time.
        ("CL.THROTTLE single 0 1 1", [0, 1, 0, -1, 1]),
        ("CL.THROTTLE single 0 1 1", [1, 1, 0, 1, 1]),
    ];
    for (line, expected) in rows {
        assert_eq!(ints(&mut con, line), expected, "{line}");
    }
    assert_eq!(
        value_str(&call(&mut con, "TYPE user123").expect("TYPE")),
        "rl-record"
    );
    near(
        int(&mut con, "PTTL user123"),
        31_000,
        32_000,
        "the key lives until the bucket is full",
    );
    // The same bucket is an RL.TAKE bucket.
    assert_eq!(
        ints(&mut con, "RL.TAKE user123 16 30 60 COST 0")[..3],
        [1, 16, 0]
    );
}

#[test]
fn a_redis_cell_value_is_converted_not_reset() {
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let mut con = master.client();
    // redis-cell's state: the theoretical arrival time in ns, just under
    // 4 s ahead (2 points of 2 s spent; the module reads its clock in whole
    // ms, so a TAT of exactly 4 s could read as a fraction more).
    let tat = server_time_us(&mut con) * 1000 + 3_990_000_000;
    let _: () = redis::cmd("SET")
        .arg("cell")
        .arg(tat.to_string())
        .arg("PX")
        .arg(4000)
        .query(&mut con)
        .expect("SET");
    let r = ints(&mut con, "CL.THROTTLE cell 15 30 60");
    assert_eq!(r[..2], [0, 16]);
    assert_eq!(
        r[2], 13,
        "the 2 points spent under redis-cell are kept: {r:?}"
    );
    assert_eq!(
        value_str(&call(&mut con, "TYPE cell").expect("TYPE")),
        "rl-record"
    );
    wait_replica(&mut con, 1, 5000);
    assert_eq!(snapshot(&mut con), snapshot(&mut replica.client()));

    let _: () = redis::cmd("SET")
        .arg("junk")
        .arg("not a time")
        .query(&mut con)
        .expect("SET");
    expect_err(call(&mut con, "CL.THROTTLE junk 15 30 60"), "WRONGTYPE");
    let v: String = redis::cmd("GET").arg("junk").query(&mut con).expect("GET");
    assert_eq!(
        v, "not a time",
        "a string that is not a redis-cell value is left alone"
    );
}

#[test]
fn a_users_counter_with_a_ttl_is_not_converted() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let _: () = redis::cmd("SET")
        .arg("counter")
        .arg("5")
        .arg("EX")
        .arg(3600)
        .query(&mut con)
        .expect("SET");
    for line in [
        "CL.THROTTLE counter 10 10 60",
        "CL.THROTTLE counter 10 10 60 0",
        "CL.THROTTLE counter 10 10 60 11",
    ] {
        expect_err(call(&mut con, line), "WRONGTYPE");
    }
    let v: String = redis::cmd("GET")
        .arg("counter")
        .query(&mut con)
        .expect("GET");
    assert_eq!(v, "5", "the user's counter is left as it was");
    near(
        int(&mut con, "PTTL counter"),
        3_500_000,
        3_600_000,
        "and keeps its TTL",
    );
}

/// A string value, a TTL or none, and a `CL.THROTTLE` quantity: whether the
/// call converts the value (answering with the points it spent kept).
struct StringCase {
    what: &'static str,
    value: String,
    ttl_ms: Option<u64>,
    quantity: u64,
    converts: bool,
}

#[test]
fn only_redis_cell_values_are_converted_and_only_by_a_charge() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let now = server_time_us(&mut con) * 1000;
    // Two points of 2 s spent (a TAT 4 s ahead, just under).
    let plausible = (now + 3_990_000_000).to_string();
    let case = |what, value: &str, ttl_ms, quantity, converts| StringCase {
        what,
        value: value.to_string(),
        ttl_ms,
        quantity,
        converts,
    };
    let cases = [
        case("a TAT with a TTL, charged", &plausible, Some(4000), 1, true),
        case("a TAT with a TTL, probed", &plausible, Some(4000), 0, false),
        case(
            "a TAT with a TTL, above the burst",
            &plausible,
            Some(4000),
            99,
            false,
        ),
        case("a TAT without a TTL", &plausible, None, 1, false),
        case("a balance without a TTL", "1000", None, 1, false),
        case("a balance without a TTL, probed", "1000", None, 0, false),
        case("a counter without a TTL", "5", None, 1, false),
        case("a counter with a TTL", "5", Some(3_600_000), 1, false),
        case(
            "a counter with a TTL, probed",
            "5",
            Some(3_600_000),
            0,
            false,
        ),
        case(
            "a counter with a TTL, above the burst",
            "5",
            Some(3_600_000),
            99,
            false,
        ),
        case(
            "a TAT whose key expires a minute later",
            &plausible,
            Some(64_000),
            1,
            false,
        ),
        case(
            "i64::MAX ns (2262)",
            "9223372036854775807",
            Some(60_000),
            1,
            false,
        ),
        case(
            "300 years before the epoch",
            "-9000000000000000000",
            Some(60_000),
            1,
            false,
        ),
        case(
            "a TAT with spaces",
            &format!(" {plausible}"),
            Some(4000),
            1,
            false,
        ),
        case("text", "not a time", Some(4000), 1, false),
    ];
    for (i, c) in cases.iter().enumerate() {
        let key = format!("s{i}");
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(&c.value);
        if let Some(ttl) = c.ttl_ms {
            set.arg("PX").arg(ttl);
        }
        let _: () = set.query(&mut con).expect("SET");
        let dump_before = call(&mut con, &format!("DUMP {key}")).expect("DUMP");
        let line = format!("CL.THROTTLE {key} 15 30 60 {}", c.quantity);
        let reply = call(&mut con, &line);
        let kind = value_str(&call(&mut con, &format!("TYPE {key}")).expect("TYPE"));
        let is_cell = c.ttl_ms == Some(4000) && c.value == plausible;
        if c.converts {
            let r = int_array(reply.expect(c.what));
            assert_eq!(r[..3], [0, 16, 13], "{}: the points spent are kept", c.what);
            assert_eq!(kind, "rl-record", "{}", c.what);
            continue;
        }
        if is_cell {
            // Answered from the value as it is: 2 points spent, nothing
            // written.
            let r = int_array(reply.expect(c.what));
            assert_eq!(r[2], 14, "{}: {r:?}", c.what);
        } else {
            expect_err(reply, "WRONGTYPE");
        }
        assert_eq!(kind, "string", "{}", c.what);
        let dump_after = call(&mut con, &format!("DUMP {key}")).expect("DUMP");
        assert_eq!(dump_before, dump_after, "{}: left byte for byte", c.what);
    }
}

#[test]
fn bad_input_changes_nothing() {
    let server = Server::start(&[]);
    let mut con = server.client();
    assert_rejected(
        &mut con,
        &[
            ("CL.THROTTLE k", "missing max_burst"),
            ("CL.THROTTLE k -1 30 60", "max_burst"),
            ("CL.THROTTLE k 15 0 60", "count"),
            ("CL.THROTTLE k 15 30 0", "period"),
            ("CL.THROTTLE k 15 30 60 -2", "quantity"),
            ("CL.THROTTLE k 15 30 60 1 1", "extra argument"),
        ],
    );
    ints(&mut con, "CL.THROTTLE k 15 30 60");
    ints(&mut con, "CL.THROTTLE k 15 30 60 99");
    let info = server.info("rl");
    assert_eq!(info_field(&info, "rl_throttle_calls").as_deref(), Some("2"));
    assert_eq!(
        info_field(&info, "rl_throttle_limited").as_deref(),
        Some("1")
    );
}
