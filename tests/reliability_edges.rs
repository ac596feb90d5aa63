//! Reliability, item 9: semantics at the edges. Limiter writes abort a
//! `WATCH`ed transaction (and calls that write nothing do not); every
//! `RL.*` write on a replica gets `READONLY`; `RENAME`, `COPY`, `MOVE`,
//! `SWAPDB`, `UNLINK` and `FLUSHALL ASYNC` of big keys keep master and
//! replica equal and the server healthy.

mod common;

use std::time::Duration;

use common::*;
use redis::{Connection, Value};

/// `WATCH key` on one connection, `calls` on another, then `EXEC` on the
/// first: true when the transaction was aborted.
fn aborts_watch(server: &Server, key: &str, calls: &[&str]) -> bool {
    let mut watcher = server.client();
    let mut other = server.client();
    let _: () = redis::cmd("WATCH")
        .arg(key)
        .query(&mut watcher)
        .expect("WATCH");
    for line in calls {
        call_ok(&mut other, line);
    }
    let r: Value = redis::pipe()
        .atomic()
        .cmd("SET")
        .arg("watch:side")
        .arg(1)
        .query(&mut watcher)
        .expect("EXEC");
    r == Value::Nil
}

#[test]
fn limiter_writes_abort_watch_and_non_writes_do_not() {
    let fig = Figure::start();
    let server = Server::start(&[]);
    let mut con = server.client();
    // Set up state so that each call below really writes (or really does not).
    call_ok(&mut con, "RL.TAKE w:full 2 1 600 COST 2");
    call_ok(&mut con, "RL.WINDOW w:win 1 600");
    call_ok(&mut con, "RL.LEASE ACQUIRE w:lease 1 600 ID a");
    call_ok(&mut con, "RL.BOX TRIP w:boxed 1 600");
    call_ok(&mut con, "RL.TAKE w:box2 1 1 600 COST 1");
    let writes: &[(&str, &[&str])] = &[
        ("w:new", &["RL.TAKE w:new 5 1 60"]),
        ("w:full", &["RL.TAKE w:full 2 1 600 STRIKES 5 60"]),
        ("w:win", &["RL.WINDOW w:win 1 600 EXACT"]),
        ("w:lease", &["RL.LEASE RENEW w:lease a 900"]),
        ("w:lease2", &["RL.LEASE ACQUIRE w:lease2 3 60"]),
        ("w:boxed", &["RL.BOX TRIP w:boxed 2 60"]),
        (
            "w:box2",
            &["RL.BOX TRIP w:box2 1 0", "RL.BOX RELEASE w:box2"],
        ),
        ("w:lease", &["RL.LEASE RELEASE w:lease a"]),
        ("w:quota", &["RL.QUOTA w:quota 5 DAY"]),
        ("w:cl", &["CL.THROTTLE w:cl 5 1 60"]),
        (
            "w:delay",
            &["RL.TAKE w:delay 1 1 60", "RL.TAKE w:delay 1 1 60 DELAY 5"],
        ),
    ];
    let mut not_aborted = Vec::new();
    for (key, calls) in writes {
        if !aborts_watch(&server, key, calls) {
            not_aborted.push(format!("{calls:?}"));
        }
    }
    // Calls that the reference says write nothing.
    call_ok(&mut con, "RL.LEASE ACQUIRE w:lease3 1 600 ID b");
    let reads: &[(&str, &[&str])] = &[
        ("w:full", &["RL.TAKE w:full 2 1 600 COST 0"]),
        ("w:full", &["RL.TAKE w:full 2 1 600"]),
        ("w:boxed", &["RL.TAKE w:boxed 5 5 60"]),
        ("w:boxed", &["RL.BOX STATUS w:boxed"]),
        ("w:lease3", &["RL.LEASE ACQUIRE w:lease3 1 600"]),
        ("w:lease3", &["RL.LEASE LIST w:lease3"]),
        (
            "w:absent",
            &["RL.BOX RELEASE w:absent", "RL.TAKE w:absent 1 1 1 COST 0"],
        ),
        (
            "w:quota",
            &[
                "RL.QUOTA w:quota 5 DAY COST 3 PEEK",
                "RL.QUOTA w:quota 5 DAY COST 0",
            ],
        ),
        ("w:win", &["RL.WINDOW w:win 1 600 COST 0"]),
    ];
    let mut aborted = Vec::new();
    for (key, calls) in reads {
        if aborts_watch(&server, key, calls) {
            aborted.push(format!("{calls:?}"));
        }
    }
    fig.record(
        "9. A limiter write aborts a WATCHed transaction",
        &format!(
            "WATCH key, {} kinds of RL.* write from another client, EXEC; and {} calls documented as writing nothing",
            writes.len(),
            reads.len()
        ),
        &format!(
            "writes that did not abort EXEC: {}; non-writing calls that aborted EXEC: {}",
            not_aborted.len(),
            aborted.len()
        ),
    );
    assert!(
        not_aborted.is_empty(),
        "did not abort WATCH: {not_aborted:?}"
    );
    assert!(
        aborted.is_empty(),
        "aborted WATCH without writing: {aborted:?}"
    );
}

#[test]
fn every_rl_write_on_a_replica_gets_readonly() {
    let fig = Figure::start();
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let mut con = master.client();
    call_ok(&mut con, "RL.TAKE r:k 5 1 60 COST 2");
    call_ok(&mut con, "RL.LEASE ACQUIRE r:l 2 600 ID a");
    call_ok(&mut con, "RL.BOX TRIP r:b 1 600");
    wait_replica(&mut con, 1, 5000);
    let before = digest(&mut con);
    let mut rep = replica.client();
    let writes = [
        "RL.TAKE r:k 5 1 60",
        "RL.TAKE r:k 5 1 60 COST 0",
        "RL.TAKE r:new 5 1 60",
        "RL.WINDOW r:w 5 60",
        "RL.WINDOW r:w 5 60 COST 0",
        "RL.LEASE ACQUIRE r:l 2 600",
        "RL.LEASE RENEW r:l a 600",
        "RL.LEASE RELEASE r:l a",
        "RL.BOX TRIP r:b 2 60",
        "RL.BOX RELEASE r:b",
        "RL.BOX RELEASE r:b FORGET",
        "RL.APPLY r:k x",
        "RL.QUOTA r:q 5 DAY",
        "RL.QUOTA r:q 5 DAY PEEK",
        "CL.THROTTLE r:c 5 1 60",
        "RL.TAKE r:k 5 1 60 DELAY 1",
    ];
    let mut not_readonly = Vec::new();
    for line in writes {
        match call(&mut rep, line) {
            Err(e) if err_text(&e).starts_with("READONLY") => {}
            other => not_readonly.push(format!("{line}: {other:?}")),
        }
    }
    // A script calling a write on the replica is refused too.
    let script = redis::cmd("EVAL")
        .arg("return redis.call('RL.TAKE', KEYS[1], 5, 1, 60)")
        .arg(1)
        .arg("r:k")
        .query::<Value>(&mut rep);
    if !matches!(&script, Err(e) if err_text(e).contains("READONLY")) {
        not_readonly.push(format!("EVAL RL.TAKE: {script:?}"));
    }
    // Reads work on the replica.
    assert_eq!(box_status(&mut rep, "r:b").level, 1);
    assert_eq!(array(call_ok(&mut rep, "RL.LEASE LIST r:l")).len(), 1);
    assert_eq!(digest(&mut rep), before, "the replica is unchanged");
    fig.record(
        "9. RL.* writes on a replica get READONLY",
        &format!(
            "{} write forms (TAKE incl. COST 0 and DELAY, WINDOW, QUOTA incl. PEEK, CL.THROTTLE, LEASE ACQUIRE/RENEW/RELEASE, BOX TRIP/RELEASE, APPLY) and EVAL on a read-only replica",
            writes.len()
        ),
        &format!(
            "writes not refused with READONLY: {}; replica digest unchanged; STATUS and LIST answer",
            not_readonly.len()
        ),
    );
    assert!(not_readonly.is_empty(), "{not_readonly:#?}");
}

/// A lease key with `n` leases and an EXACT window key with `entries` log
/// entries (one per millisecond: the clock is moved 1 ms per call).
fn build_big_keys(con: &mut Connection, clock: &TimeShift, tag: &str, n: usize, entries: usize) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("RL.LEASE")
            .arg("ACQUIRE")
            .arg(format!("big:{tag}:lease"))
            .arg(1000)
            .arg(3600)
            .arg("ID")
            .arg(format!("lease-{i:06}-{}", "x".repeat(40)))
            .ignore();
    }
    let _: () = pipe.query(con).expect("ACQUIRE leases");
    for _ in 0..entries {
        clock.advance_ms(1);
        let d = decide(con, &format!("RL.WINDOW big:{tag}:win 10000 3600 EXACT"));
        assert_eq!(d.status, ALLOWED);
    }
}

#[test]
fn rename_copy_move_swapdb_unlink_and_flushall_async_behave() {
    let fig = Figure::start();
    let clock = TimeShift::new();
    // The 1 MB backlog of Redis 7.0 (Valkey 8 defaults to 10 MB): used_memory
    // counts the backlog, and the check that the flush freed at least half
    // of it is about the keys.
    let master = Server::start_with(&clock.prefix(), &["--repl-backlog-size", "1mb"]);
    let replica = start_replica_with(&clock.prefix(), &master);
    let mut con = master.client();
    let mut checks = 0;
    let mut converge = |con: &mut Connection, what: &str| {
        wait_replica(con, 1, 10_000);
        let mut rep = replica.client();
        for db in [0, 1] {
            let _: () = redis::cmd("SELECT")
                .arg(db)
                .query(&mut rep)
                .expect("SELECT");
            let _: () = redis::cmd("SELECT").arg(db).query(con).expect("SELECT");
            assert_eq!(snapshot(con), snapshot(&mut rep), "{what}: db {db} differs");
        }
        let _: () = redis::cmd("SELECT").arg(0).query(con).expect("SELECT");
        checks += 1;
    };

    // RENAME keeps the state and the absolute expiry; the old name is gone.
    call_ok(&mut con, "RL.TAKE e:a 10 1 600 COST 4 STRIKES 3 600");
    call_ok(&mut con, "RL.TAKE e:a 10 1 600 COST 9 STRIKES 3 600");
    call_ok(&mut con, "RL.TAKE e:a 10 1 600 COST 9 STRIKES 3 600");
    let (dump_a, at_a) = dump_and_expiry(&mut con, "e:a").expect("DUMP");
    call_ok(&mut con, "RENAME e:a e:b");
    assert_eq!(
        dump_and_expiry(&mut con, "e:b").expect("DUMP"),
        (dump_a.clone(), at_a)
    );
    assert_eq!(int(&mut con, "EXISTS e:a"), 0);
    let d = decide(&mut con, "RL.TAKE e:b 10 1 600 COST 0");
    assert!(
        d.remaining <= 6,
        "spent points kept under the new name: {d:?}"
    );
    assert_eq!(
        box_status(&mut con, "e:b").strikes,
        1,
        "the strike moved too"
    );
    // RENAME over an existing limiter key replaces it.
    call_ok(&mut con, "RL.BOX TRIP e:c 3 0");
    call_ok(&mut con, "RENAME e:b e:c");
    assert_eq!(box_status(&mut con, "e:c").level, 0, "the box was replaced");
    converge(&mut con, "RENAME");

    // COPY is a deep copy with the same expiry.
    call_ok(&mut con, "RL.LEASE ACQUIRE e:l 3 600 ID one");
    call_ok(&mut con, "COPY e:l e:l2");
    assert_eq!(
        dump_and_expiry(&mut con, "e:l").expect("DUMP"),
        dump_and_expiry(&mut con, "e:l2").expect("DUMP")
    );
    call_ok(&mut con, "RL.LEASE ACQUIRE e:l2 3 600 ID two");
    assert_eq!(
        array(call_ok(&mut con, "RL.LEASE LIST e:l")).len(),
        1,
        "the source is unchanged"
    );
    assert_eq!(array(call_ok(&mut con, "RL.LEASE LIST e:l2")).len(), 2);
    converge(&mut con, "COPY");

    // MOVE to db 1, and SWAPDB: the state follows the key.
    let moved = dump_and_expiry(&mut con, "e:c").expect("DUMP");
    assert_eq!(int(&mut con, "MOVE e:c 1"), 1);
    call_ok(&mut con, "SELECT 1");
    assert_eq!(dump_and_expiry(&mut con, "e:c").expect("DUMP"), moved);
    call_ok(&mut con, "RL.TAKE e:c 10 1 600 COST 1");
    call_ok(&mut con, "SELECT 0");
    converge(&mut con, "MOVE");
    call_ok(&mut con, "SWAPDB 0 1");
    assert_eq!(int(&mut con, "EXISTS e:c"), 1, "db 1 is now db 0");
    assert_eq!(int(&mut con, "EXISTS e:l"), 0);
    let d = decide(&mut con, "RL.TAKE e:c 10 1 600 COST 0");
    assert!(d.remaining <= 5, "{d:?}");
    converge(&mut con, "SWAPDB");
    call_ok(&mut con, "SWAPDB 0 1");

    // Big keys: 1000 leases, a 5000-entry exact log; 40 copies of each.
    build_big_keys(&mut con, &clock, "0", 1000, 5000);
    let lease_bytes = int(&mut con, "MEMORY USAGE big:0:lease");
    let win_bytes = int(&mut con, "MEMORY USAGE big:0:win");
    for i in 1..=40 {
        call_ok(&mut con, &format!("COPY big:0:lease big:{i}:lease"));
        call_ok(&mut con, &format!("COPY big:0:win big:{i}:win"));
    }
    converge(&mut con, "big keys");
    let expired_before = info_u64(&master, "rl", "rl_lease_expired");
    let used_before = info_u64(&master, "memory", "used_memory");

    // UNLINK half of them, then FLUSHALL ASYNC the rest (freed in a
    // background thread), while another client keeps calling.
    let mut keys: Vec<String> = (0..=20).map(|i| format!("big:{i}:lease")).collect();
    keys.extend((0..=20).map(|i| format!("big:{i}:win")));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let background_calls = std::thread::scope(|s| {
        let load = s.spawn(|| {
            let mut c = master.client();
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 200_000 {
                let k = n % 100;
                call_ok(&mut c, &format!("RL.TAKE bg:{k} 50 1 600 STRIKES 2 600"));
                call_ok(&mut c, &format!("RL.LEASE ACQUIRE bg:l{k} 5 600 ID i{n}"));
                call_ok(&mut c, &format!("RL.LEASE RELEASE bg:l{k} i{n}"));
                n += 1;
            }
            n
        });
        std::thread::sleep(Duration::from_millis(100));
        let unlinked: i64 = redis::cmd("UNLINK")
            .arg(&keys)
            .query(&mut con)
            .expect("UNLINK");
        assert_eq!(unlinked, keys.len() as i64);
        std::thread::sleep(Duration::from_millis(100));
        call_ok(&mut con, "FLUSHALL ASYNC");
        wait_until(Duration::from_secs(10), "lazyfree done", || {
            info_u64(&master, "memory", "lazyfree_pending_objects") == 0
        });
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        load.join().expect("load thread")
    });
    assert!(background_calls > 0);
    converge(&mut con, "UNLINK and FLUSHALL ASYNC");
    assert!(scan_keys(&mut con, "big:*").is_empty(), "no big key left");
    let used_after = info_u64(&master, "memory", "used_memory");
    let expired_after = info_u64(&master, "rl", "rl_lease_expired");
    assert!(master.is_alive() && replica.is_alive());
    assert!(!log_shows_crash(&master) && !log_shows_crash(&replica));
    assert!(
        used_after < used_before / 2,
        "memory freed: {used_before} -> {used_after}"
    );
    fig.record(
        "9. RENAME, COPY, MOVE, SWAPDB, UNLINK, FLUSHALL ASYNC behave",
        &format!(
            "master + replica: state, strikes and PEXPIRETIME follow RENAME/COPY/MOVE/SWAPDB; 41 lease keys x 1000 leases ({lease_bytes} B each) and 41 exact logs x 5000 entries ({win_bytes} B each) UNLINKed, then FLUSHALL ASYNC, while another client made {background_calls} x 3 calls"
        ),
        &format!(
            "{checks} master/replica comparisons equal; used_memory {} MB -> {} MB; rl_lease_expired unchanged ({expired_before} -> {expired_after}); crashes 0",
            used_before / 1_000_000,
            used_after / 1_000_000
        ),
    );
    assert_eq!(
        expired_before, expired_after,
        "deleted leases are not counted as expired"
    );
}
