//! RL.LEASE against a real redis-server: grants, denials, idempotent
//! retries, expiry, TTL, races, replication and promotion, OOM.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use redis::{Connection, Value};

/// `[granted, lease-id or nil, in_use, max, retry_after_ms]`.
fn acquire(con: &mut Connection, line: &str) -> (i64, Option<String>, i64, i64, i64) {
    let v = array(call_ok(con, line));
    let id = match &v[1] {
        Value::Nil => None,
        other => Some(value_str(other)),
    };
    (
        value_i64(&v[0]),
        id,
        value_i64(&v[2]),
        value_i64(&v[3]),
        value_i64(&v[4]),
    )
}

#[test]
fn at_most_max_leases_and_a_denial_says_when_to_retry() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let (g1, id1, in_use, max, _) = acquire(&mut con, "RL.LEASE ACQUIRE rl:{t:1}:reconcile 2 30");
    assert_eq!((g1, in_use, max), (1, 1, 2));
    let (g2, id2, in_use, _, retry) = acquire(&mut con, "RL.LEASE ACQUIRE rl:{t:1}:reconcile 2 60");
    assert_eq!((g2, in_use, retry), (1, 2, 0));
    let (id1, id2) = (id1.expect("an id"), id2.expect("an id"));
    assert_ne!(id1, id2);

    let before: Vec<u8> = redis::cmd("DUMP")
        .arg("rl:{t:1}:reconcile")
        .query(&mut con)
        .expect("DUMP");
    let offset = server.info_get("replication", "master_repl_offset");
    let (g3, id3, in_use, max, retry) =
        acquire(&mut con, "RL.LEASE ACQUIRE rl:{t:1}:reconcile 2 30");
    assert_eq!((g3, id3, in_use, max), (0, None, 2, 2));
    near(retry, 29_000, 30_000, "until the earliest lease expires");
    let after: Vec<u8> = redis::cmd("DUMP")
        .arg("rl:{t:1}:reconcile")
        .query(&mut con)
        .expect("DUMP");
    assert_eq!(before, after, "a denial writes nothing");
    assert_eq!(
        server.info_get("replication", "master_repl_offset"),
        offset,
        "nothing replicated"
    );

    let listed = lease_list(&mut con, "rl:{t:1}:reconcile");
    assert_eq!(listed.len(), 2);
    for (id, ms_left) in &listed {
        let ttl = if *id == id1 { 30_000 } else { 60_000 };
        assert!(*id == id1 || *id == id2, "{id}");
        near(*ms_left, ttl - 1000, ttl, "ms_left");
    }
    near(
        int(&mut con, "PTTL rl:{t:1}:reconcile"),
        59_000,
        60_000,
        "the key lives as long as its latest lease",
    );

    assert_eq!(
        int(
            &mut con,
            &format!("RL.LEASE RELEASE rl:{{t:1}}:reconcile {id1}")
        ),
        1
    );
    assert_eq!(
        int(
            &mut con,
            &format!("RL.LEASE RELEASE rl:{{t:1}}:reconcile {id1}")
        ),
        0,
        "already released"
    );
    assert_eq!(
        acquire(&mut con, "RL.LEASE ACQUIRE rl:{t:1}:reconcile 2 30").0,
        1,
        "the slot is free again"
    );
    assert_eq!(
        int(
            &mut con,
            &format!("RL.LEASE RENEW rl:{{t:1}}:reconcile {id2} 120")
        ),
        1
    );
    near(
        int(&mut con, "PTTL rl:{t:1}:reconcile"),
        119_000,
        120_000,
        "TTL follows the renewed lease",
    );
    assert_eq!(
        int(
            &mut con,
            &format!("RL.LEASE RENEW rl:{{t:1}}:reconcile {id1} 120")
        ),
        0,
        "not live"
    );
}

#[test]
fn an_id_makes_acquire_idempotent() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let first = acquire(
        &mut con,
        "RL.LEASE ACQUIRE rl:{ledger:9}:lock 1 10 ID req-42",
    );
    assert_eq!(first, (1, Some("req-42".to_string()), 1, 1, 0));
    let retried = acquire(
        &mut con,
        "RL.LEASE ACQUIRE rl:{ledger:9}:lock 1 30 ID req-42",
    );
    assert_eq!(
        retried,
        (1, Some("req-42".to_string()), 1, 1, 0),
        "no second slot"
    );
    near(
        lease_list(&mut con, "rl:{ledger:9}:lock")[0].1,
        29_000,
        30_000,
        "the retry refreshed the ttl",
    );
    let other = acquire(
        &mut con,
        "RL.LEASE ACQUIRE rl:{ledger:9}:lock 1 30 ID req-43",
    );
    assert_eq!((other.0, other.2), (0, 1), "the lock is held");
}

#[test]
fn a_crashed_worker_frees_its_slot_when_the_ttl_passes() {
    let server = Server::start(&[]);
    let mut con = server.client();
    assert_eq!(acquire(&mut con, "RL.LEASE ACQUIRE crash 1 0.2").0, 1);
    assert_eq!(acquire(&mut con, "RL.LEASE ACQUIRE crash 1 0.2").0, 0);
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(
        lease_list(&mut con, "crash"),
        vec![],
        "an expired lease is not listed"
    );
    assert_eq!(
        int(&mut con, "EXISTS crash"),
        0,
        "the key went with its last lease"
    );
    assert_eq!(acquire(&mut con, "RL.LEASE ACQUIRE crash 1 0.2").0, 1);
}

#[test]
fn generated_ids_are_unique() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let ids: HashSet<String> = (0..200)
        .map(|_| {
            acquire(&mut con, "RL.LEASE ACQUIRE many 1000 60")
                .1
                .expect("granted")
        })
        .collect();
    assert_eq!(ids.len(), 200);
    assert_eq!(lease_list(&mut con, "many").len(), 200);
}

#[test]
fn twenty_racing_connections_get_exactly_max_grants() {
    let server = Server::start(&[]);
    let granted: i64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..20)
            .map(|_| {
                let server = &server;
                s.spawn(move || acquire(&mut server.client(), "RL.LEASE ACQUIRE race 5 60").0)
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("client")).sum()
    });
    assert_eq!(granted, 5);
    assert_eq!(lease_list(&mut server.client(), "race").len(), 5);
}

#[test]
fn a_promoted_replica_keeps_every_live_lease_with_its_deadline() {
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let mut con = master.client();
    let mut ids = vec![];
    for ttl in [60, 120, 180] {
        ids.push(
            acquire(&mut con, &format!("RL.LEASE ACQUIRE export 3 {ttl}"))
                .1
                .expect("granted"),
        );
    }
    let released = ids.remove(0);
    assert_eq!(
        int(&mut con, &format!("RL.LEASE RELEASE export {released}")),
        1
    );
    int(&mut con, &format!("RL.LEASE RENEW export {} 240", ids[0]));
    wait_replica(&mut con, 1, 5000);
    assert_eq!(snapshot(&mut con), snapshot(&mut replica.client()));
    master.kill9();

    let mut promoted = replica.client();
    call(&mut promoted, "REPLICAOF NO ONE").expect("REPLICAOF NO ONE");
    let mut listed = lease_list(&mut promoted, "export");
    listed.sort_by_key(|(_, ms)| *ms);
    assert_eq!(
        listed.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(),
        [ids[1].clone(), ids[0].clone()]
    );
    near(listed[0].1, 175_000, 180_000, "deadline kept");
    near(listed[1].1, 235_000, 240_000, "renewed deadline kept");
    let (granted, _, in_use, _, _) = acquire(&mut promoted, "RL.LEASE ACQUIRE export 3 60");
    assert_eq!((granted, in_use), (1, 3));
    assert_eq!(
        acquire(&mut promoted, "RL.LEASE ACQUIRE export 3 60").0,
        0,
        "still at most 3"
    );
}

#[test]
fn release_works_when_the_server_is_out_of_memory() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let id = acquire(&mut con, "RL.LEASE ACQUIRE oom 2 60")
        .1
        .expect("granted");
    let used: i64 = server
        .info_get("memory", "used_memory")
        .expect("used_memory")
        .parse()
        .expect("a number");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used / 2)
        .query(&mut con)
        .expect("CONFIG");
    expect_err(call(&mut con, "RL.LEASE ACQUIRE oom 2 60"), "OOM");
    expect_err(call(&mut con, "RL.TAKE t 1 1 1"), "OOM");
    assert_eq!(int(&mut con, &format!("RL.LEASE RELEASE oom {id}")), 1);
    ints(&mut con, "RL.BOX STATUS t");
    int(&mut con, "RL.BOX RELEASE t");
}

#[test]
fn bad_input_and_wrong_types_change_nothing() {
    let server = Server::start(&[]);
    let mut con = server.client();
    assert_rejected(
        &mut con,
        &[
            ("RL.LEASE ACQUIRE k 0 10", "max"),
            ("RL.LEASE ACQUIRE k 10001 10", "max"),
            ("RL.LEASE ACQUIRE k 1 0", "ttl"),
            ("RL.LEASE ACQUIRE k 1 nan", "ttl"),
            ("RL.LEASE ACQUIRE k 1 10 ID", "missing lease-id"),
            ("RL.LEASE ACQUIRE k 1 10 FOO bar", "unknown option"),
            ("RL.LEASE RELEASE k", "missing lease-id"),
            ("RL.LEASE RENEW k id", "missing ttl"),
            ("RL.LEASE RENEW k id -1", "ttl"),
            ("RL.LEASE LIST", "missing key"),
        ],
    );
    let _: () = redis::cmd("SET")
        .arg("s")
        .arg("v")
        .query(&mut con)
        .expect("SET");
    for line in [
        "RL.LEASE ACQUIRE s 1 1",
        "RL.LEASE RELEASE s x",
        "RL.LEASE RENEW s x 1",
        "RL.LEASE LIST s",
    ] {
        expect_err(call(&mut con, line), "WRONGTYPE");
    }
}

#[test]
fn info_counts_leases() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let id = acquire(&mut con, "RL.LEASE ACQUIRE i 1 0.1")
        .1
        .expect("granted");
    acquire(&mut con, "RL.LEASE ACQUIRE i 1 0.1");
    assert_eq!(int(&mut con, &format!("RL.LEASE RELEASE i {id}")), 1);
    acquire(&mut con, "RL.LEASE ACQUIRE i 1 0.1");
    std::thread::sleep(Duration::from_millis(150));
    acquire(&mut con, "RL.LEASE ACQUIRE i 1 0.1");
    let info = server.info("rl");
    for (field, value) in [
        ("rl_lease_granted", "3"),
        ("rl_lease_denied", "1"),
        ("rl_lease_released", "1"),
        ("rl_lease_expired", "1"),
    ] {
        assert_eq!(
            info_field(&info, field).as_deref(),
            Some(value),
            "{field} in\n{info}"
        );
    }
}
