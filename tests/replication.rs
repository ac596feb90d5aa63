//! Replication of effects: a replica ends byte-identical to its master
//! (`DUMP` and `PEXPIRETIME` of every key, `DEBUG DIGEST`), a promoted
//! replica keeps every bucket, strike and box, and the internal apply
//! command is refused to ordinary clients.

mod common;

use common::*;

#[test]
fn a_replica_is_byte_identical_to_its_master() {
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let mut con = master.client();
    mixed_workload(&mut con, 40);
    wait_replica(&mut con, 1, 5000);
    let on_master = snapshot(&mut con);
    let on_replica = snapshot(&mut replica.client());
    assert!(
        on_master.len() >= 40,
        "the workload left keys: {}",
        on_master.len()
    );
    assert_eq!(on_master, on_replica);
    let digest =
        |s: &Server| value_str(&call(&mut s.client(), "DEBUG DIGEST").expect("DEBUG DIGEST"));
    assert_eq!(digest(&master), digest(&replica));
}

#[test]
fn a_promoted_replica_keeps_buckets_strikes_and_boxes() {
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let mut con = master.client();
    ints(&mut con, "RL.TAKE bucket 10 1 1000 COST 7");
    // Allowed, refused (a retry announced), then two early retries.
    for _ in 0..4 {
        ints(&mut con, "RL.TAKE striker 1 1 1000 STRIKES 5 600");
    }
    ints(&mut con, "RL.BOX TRIP boxed 2 600");
    ints(&mut con, "RL.BOX TRIP manual 3 0");
    wait_replica(&mut con, 1, 5000);
    master.kill9();

    let mut promoted = replica.client();
    call(&mut promoted, "REPLICAOF NO ONE").expect("REPLICAOF NO ONE");
    assert_eq!(
        decide(&mut promoted, "RL.TAKE bucket 10 1 1000 COST 0").remaining,
        3,
        "spent points kept"
    );
    assert_eq!(
        ints(&mut promoted, "RL.BOX STATUS striker"),
        [0, 0, 0, 2],
        "strikes kept"
    );
    let d = decide(&mut promoted, "RL.TAKE striker 1 1 1000 STRIKES 3 600");
    assert_eq!(
        (d.status, d.box_level),
        (BOXED, 1),
        "the third strike trips: the first two and the announced retry were kept"
    );
    let s = box_status(&mut promoted, "boxed");
    assert_eq!((s.level, s.offenses), (2, 1));
    assert!(s.ttl_ms > 590_000, "box deadline kept: {s:?}");
    assert_eq!(decide(&mut promoted, "RL.TAKE manual 5 5 1").status, BOXED);
    assert_eq!(int(&mut promoted, "PTTL manual"), -1);
}

#[test]
fn the_apply_command_is_refused_to_clients() {
    let master = Server::start(&[]);
    let mut con = master.client();
    ints(&mut con, "RL.BOX TRIP me 3 0");
    let payload: Vec<u8> = redis::cmd("DUMP").arg("me").query(&mut con).expect("DUMP");
    for attempt in [
        redis::cmd("RL.APPLY")
            .arg("me")
            .arg(&payload[..])
            .query::<redis::Value>(&mut con),
        redis::cmd("EVAL")
            .arg("return redis.call('RL.APPLY', KEYS[1], ARGV[1])")
            .arg(1)
            .arg("me")
            .arg("x")
            .query::<redis::Value>(&mut con),
    ] {
        expect_err(attempt, "internal");
    }
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("RL.APPLY").arg("me").arg("x");
    expect_err(pipe.query::<redis::Value>(&mut con), "internal");
    assert_eq!(
        box_status(&mut con, "me").level,
        3,
        "the box is still there"
    );
}

#[test]
fn calls_inside_multi_and_eval_replicate_their_effects() {
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let mut con = master.client();
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("RL.TAKE")
        .arg("m")
        .arg(5)
        .arg(1)
        .arg(100)
        .arg("COST")
        .arg(3);
    pipe.cmd("RL.TAKE")
        .arg("m")
        .arg(5)
        .arg(1)
        .arg(100)
        .arg("COST")
        .arg(3)
        .arg("STRIKES")
        .arg(1)
        .arg(60);
    let _: redis::Value = pipe.query(&mut con).expect("MULTI");
    let _: redis::Value = redis::cmd("EVAL")
        .arg("redis.call('RL.TAKE', KEYS[1], 5, 1, 100, 'COST', 2); return redis.call('RL.BOX', 'TRIP', KEYS[2], 1, 100)")
        .arg(2)
        .arg("e")
        .arg("f")
        .query(&mut con)
        .expect("EVAL");
    wait_replica(&mut con, 1, 5000);
    let on_master = snapshot(&mut con);
    assert_eq!(on_master.len(), 3);
    assert_eq!(on_master, snapshot(&mut replica.client()));
}

/// The arguments after the key of each `RL.APPLY` on `tap` up to the
/// marker `SET <marker>`: the payload, then the expiry when one was sent.
fn applied_expiries(
    tap: &mut ReplicationTap,
    con: &mut redis::Connection,
    marker: &str,
) -> Vec<usize> {
    call_ok(con, &format!("SET {marker} 1"));
    tap.until_marker(marker)
        .into_iter()
        .filter(|c| c[0].eq_ignore_ascii_case(b"RL.APPLY"))
        .map(|c| c.len())
        .collect()
}

#[test]
fn a_window_replicates_its_expiry_only_when_its_end_moves() {
    let clock = TimeShift::new();
    let master = Server::start_with(&clock.prefix(), &[]);
    let replica = start_replica(&master);
    let mut con = master.client();
    let mut tap = ReplicationTap::sync(&master);
    let end = |con: &mut redis::Connection, key: &str| int(con, &format!("PEXPIRETIME {key}"));
    for (key, mode) in [("sliding", ""), ("fixed", "FIXED")] {
        // 1 s into a window of the key: the next 59 s fall in it.
        clock.start_window(key, 60_000, 1_000);
        let line = format!("RL.WINDOW {key} 100 60 {mode}");
        let d = decide(&mut con, &line);
        assert!(d.allowed());
        if mode == "FIXED" {
            assert!((58_000..=59_000).contains(&d.reset_ms), "{}", d.reset_ms);
        }
        let first = end(&mut con, key);
        for _ in 0..3 {
            clock.advance_ms(1_000);
            assert!(decide(&mut con, &line).allowed());
            assert_eq!(end(&mut con, key), first, "{key}: the end stays");
        }
        // Created: with its expiry; then the same end: without one.
        let sent = applied_expiries(&mut tap, &mut con, &format!("{key}:calls"));
        assert_eq!(sent, [4, 3, 3, 3], "{key}: RL.APPLY's argument counts");
        wait_replica(&mut con, 1, 5000);
        assert_eq!(
            end(&mut replica.client(), key),
            first,
            "{key}: the replica's end"
        );
    }

    // (Still within `fixed`'s window.) An expiry removed by hand stays
    // removed, on the replica too, until the window ends: the next
    // window's end is set, and sent.
    let before = end(&mut con, "fixed");
    call_ok(&mut con, "PERSIST fixed");
    clock.advance_ms(1_000);
    assert!(decide(&mut con, "RL.WINDOW fixed 100 60 FIXED").allowed());
    assert_eq!(end(&mut con, "fixed"), -1, "left as the PERSIST left it");
    clock.advance_ms(60_000);
    let d = decide(&mut con, "RL.WINDOW fixed 100 60 FIXED");
    assert_eq!(d.remaining, 99, "a new window");
    assert!(end(&mut con, "fixed") > before, "the next window's end");
    let sent = applied_expiries(&mut tap, &mut con, "fixed:next");
    assert_eq!(sent, [3, 4], "RL.APPLY's argument counts");
    wait_replica(&mut con, 1, 5000);
    assert_eq!(snapshot(&mut con), snapshot(&mut replica.client()));
}
