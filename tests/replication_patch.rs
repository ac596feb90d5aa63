//! Patches: a call that leaves a large part of a key alone (an `EXACT`
//! log beside a bucket) replicates only the parts it reached, and a call
//! that only charges a log or changes one lease replicates that entry or
//! lease, as a patch payload in `RL.APPLY`; a real replica and an AOF
//! replay end with the master's exact bytes; a corrupt patch is refused
//! with nothing written; a patch for a key the replica lacks gives it the
//! parts it carries.

mod common;

use std::io::Write;
use std::time::Duration;

use common::*;
use redis::Connection;

/// Entries in the large log.
const ENTRIES: usize = 9_990;

/// Fill `key` with an `EXACT` log of [`ENTRIES`] entries, one per
/// millisecond of the shifted clock (a pipeline of calls per batch).
fn fill_exact_log(con: &mut Connection, clock: &TimeShift, key: &str) {
    for _ in 0..ENTRIES {
        clock.advance_ms(1);
        let d = decide(con, &format!("RL.WINDOW {key} 10000 3600 EXACT"));
        assert!(d.allowed(), "the log has room");
    }
}

/// The `RL.APPLY` commands on `tap` up to the marker `SET <marker>`.
fn applies_until(
    tap: &mut ReplicationTap,
    con: &mut Connection,
    marker: &str,
) -> Vec<Vec<Vec<u8>>> {
    call_ok(con, &format!("SET {marker} 1"));
    tap.until_marker(marker)
        .into_iter()
        .filter(|c| c[0].eq_ignore_ascii_case(b"RL.APPLY"))
        .collect()
}

fn dump(con: &mut Connection, key: &str) -> Option<Vec<u8>> {
    dump_and_expiry(con, key).expect("DUMP").0
}

#[test]
fn a_take_beside_a_large_log_replicates_a_small_patch_and_replays_to_the_same_bytes() {
    let clock = TimeShift::new();
    let master = Server::start_with(&clock.prefix(), &["--appendonly", "yes"]);
    let replica = start_replica(&master);
    let mut con = master.client();
    fill_exact_log(&mut con, &clock, "both");
    assert!(dump(&mut con, "both").is_some(), "the key");

    let mut tap = ReplicationTap::sync(&master);
    for _ in 0..3 {
        clock.advance_ms(1);
        assert!(decide(&mut con, "RL.TAKE both 10 1 60").allowed());
    }
    // A window call that only charges the log sends its new entry; one
    // that converts it (another window length) sends it whole.
    clock.advance_ms(1);
    assert!(decide(&mut con, "RL.WINDOW both 10000 3600 EXACT").allowed());
    clock.advance_ms(1);
    assert!(decide(&mut con, "RL.TAKE both 10 1 60").allowed());
    clock.advance_ms(1);
    assert!(decide(&mut con, "RL.WINDOW both 10000 7200 EXACT").allowed());
    clock.advance_ms(1);
    assert!(decide(&mut con, "RL.WINDOW both 10000 7200 EXACT").allowed());
    let applies = applies_until(&mut tap, &mut con, "patch:done");
    assert_eq!(applies.len(), 7, "one RL.APPLY per call");
    let sizes: Vec<usize> = applies.iter().map(|c| c[2].len()).collect();
    for i in [0, 1, 2, 3, 4, 6] {
        assert_eq!(applies[i][2][0], PATCH_MARKER, "call {i} is a patch");
        let bytes: usize = applies[i].iter().map(Vec::len).sum();
        assert!(bytes < 200, "call {i} replicates {bytes} bytes: {sizes:?}");
    }
    assert_ne!(
        applies[5][2][0], PATCH_MARKER,
        "the converting call goes whole"
    );
    assert!(
        applies[5][2].len() > 2 * ENTRIES,
        "the whole log: {} bytes",
        applies[5][2].len()
    );

    wait_replica(&mut con, 1, 10_000);
    let on_master = snapshot(&mut con);
    assert_eq!(on_master, snapshot(&mut replica.client()));
    assert_eq!(digest(&mut con), digest(&mut replica.client()));

    // The AOF replays the same patches onto the same bytes.
    let digest_before = digest(&mut con);
    let (_, aof) = incremental_aof(&master);
    let patches_in_aof = aof
        .iter()
        .filter(|c| c[0].eq_ignore_ascii_case(b"RL.APPLY") && c[2][0] == PATCH_MARKER)
        .count();
    // The fill's calls after the first were log charges too.
    assert_eq!(patches_in_aof, ENTRIES - 1 + 6, "the AOF holds the patches");
    master.restart();
    let mut con = master.client();
    assert_eq!(snapshot(&mut con), on_master, "after an AOF replay");
    assert_eq!(digest(&mut con), digest_before);
}

#[test]
fn a_corrupt_patch_is_refused_and_a_patch_for_a_missing_key_keeps_its_parts() {
    let clock = TimeShift::new();
    let source = Server::start_with(&clock.prefix(), &[]);
    let mut src = source.client();
    for _ in 0..50 {
        clock.advance_ms(1);
        call_ok(&mut src, "RL.WINDOW k 1000 3600 EXACT");
    }
    let rdb = rdb_of(&source);
    let mut tap = ReplicationTap::sync(&source);
    clock.advance_ms(1);
    call_ok(&mut src, "RL.TAKE k 10 1 60");
    let applies = applies_until(&mut tap, &mut src, "mark");
    let patch = applies[0][2].clone();
    assert_eq!(patch[0], PATCH_MARKER);
    let expected = dump(&mut src, "k").expect("k");

    let master = FakeMaster::new();
    let replica = master.replica(&[]);
    let mut link = serve_whole(&master, &replica, &rdb);
    let mut rep = replica.client();
    let before = dump(&mut rep, "k").expect("k loaded");
    let mut stream = Vec::new();
    // Corrupt forms: truncated, a trailing byte, a flipped mask.
    let mut corrupt = vec![patch[..patch.len() - 1].to_vec()];
    let mut trailing = patch.clone();
    trailing.push(0);
    corrupt.push(trailing);
    let mut bad_version = patch.clone();
    bad_version[2] = 0x7f;
    corrupt.push(bad_version);
    for p in &corrupt {
        stream.extend(resp_command(&[b"RL.APPLY", b"k", p, b"PERSIST"]));
    }
    stream.extend(resp_command(&[b"SET", b"corrupt:sent", b"1"]));
    link.write_all(&stream).expect("stream");
    wait_until(Duration::from_secs(20), "the corrupt patches read", || {
        int(&mut rep, "EXISTS corrupt:sent") == 1
    });
    assert!(replica.is_alive() && !log_shows_crash(&replica));
    assert_eq!(dump(&mut rep, "k"), Some(before), "nothing written");
    assert!(int(&mut rep, "PTTL k") > 0, "the expiry untouched");

    // The valid patch onto the replica's record, and onto a missing key.
    let mut stream = resp_command(&[b"RL.APPLY", b"k", &patch, b"PERSIST"]);
    stream.extend(resp_command(&[b"RL.APPLY", b"missing", &patch, b"PERSIST"]));
    stream.extend(resp_command(&[b"SET", b"valid:sent", b"1"]));
    link.write_all(&stream).expect("stream");
    wait_until(Duration::from_secs(20), "the valid patches applied", || {
        int(&mut rep, "EXISTS valid:sent") == 1
    });
    assert_eq!(dump(&mut rep, "k"), Some(expected), "the master's bytes");
    let missing = dump(&mut rep, "missing").expect("the missing key written");
    assert!(
        missing.len() < 64,
        "only the bucket: {} bytes",
        missing.len()
    );
    call_ok(&mut rep, "REPLICAOF NO ONE");
    let bucket_only = decide(&mut rep, "RL.TAKE missing 10 1 60 COST 0");
    assert_eq!(bucket_only.remaining, 9, "the bucket the patch carried");
    let window = decide(&mut rep, "RL.WINDOW missing 1000 3600 EXACT COST 0");
    assert_eq!(window.remaining, 1000, "no log: it was never sent");
}

#[test]
fn a_lease_call_on_a_large_set_replicates_one_lease_and_replays_to_the_same_bytes() {
    let clock = TimeShift::new();
    // Every write reaches the AOF before the restart, the marker included.
    let master = Server::start_with(
        &clock.prefix(),
        &["--appendonly", "yes", "--appendfsync", "always"],
    );
    let replica = start_replica(&master);
    let mut con = master.client();
    let mut pipe = redis::pipe();
    for i in 0..900 {
        pipe.cmd("RL.LEASE")
            .arg("ACQUIRE")
            .arg("pool")
            .arg(1000)
            .arg(60 + i % 60)
            .arg("ID")
            .arg(format!("job-{i:04}"))
            .ignore();
    }
    let () = pipe.query(&mut con).expect("900 leases");
    let mut tap = ReplicationTap::sync(&master);
    let calls = [
        "RL.LEASE ACQUIRE pool 1000 30 ID fresh",
        "RL.LEASE ACQUIRE pool 1000 30 ID job-0001",
        "RL.LEASE RENEW pool job-0002 90",
        "RL.LEASE RELEASE pool job-0003",
    ];
    for call in calls {
        clock.advance_ms(1);
        call_ok(&mut con, call);
    }
    // Past the shortest deadlines: the grant sweeps the expired leases,
    // and the replica sweeps them too.
    clock.advance_ms(61_000);
    call_ok(&mut con, "RL.LEASE ACQUIRE pool 1000 30 ID late");
    let applies = applies_until(&mut tap, &mut con, "leases:done");
    assert_eq!(applies.len(), calls.len() + 1, "one RL.APPLY per call");
    for (i, apply) in applies.iter().enumerate() {
        assert_eq!(apply[2][0], PATCH_MARKER, "call {i} is a patch");
        let bytes: usize = apply.iter().map(Vec::len).sum();
        assert!(bytes < 120, "call {i} replicates {bytes} bytes");
    }
    let live: Vec<(Vec<u8>, i64)> = redis::cmd("RL.LEASE")
        .arg("LIST")
        .arg("pool")
        .query(&mut con)
        .expect("LIST");
    assert!(live.len() < 900, "swept: {} left", live.len());
    wait_replica(&mut con, 1, 10_000);
    assert_eq!(snapshot(&mut con), snapshot(&mut replica.client()));
    assert_eq!(digest(&mut con), digest(&mut replica.client()));
    let digest_before = digest(&mut con);
    master.restart();
    let mut con = master.client();
    assert_eq!(digest(&mut con), digest_before, "after an AOF replay");
}
