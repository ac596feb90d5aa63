//! Reliability, item 3: the replication stream and the AOF hold only
//! deterministic effects (`RL.APPLY key payload` with an absolute
//! `PXAT` or `PERSIST`, or `DEL`), never a time-dependent `RL.*` command and never a
//! relative expiry, for plain calls, calls inside `MULTI` and `EVAL`,
//! throttled calls, boxes, windows and leases.

mod common;

use common::*;
use redis::Connection;

/// Commands that must never reach a replica or the AOF verbatim.
const FORBIDDEN: &[&str] = &[
    "RL.TAKE",
    "RL.WINDOW",
    "RL.LEASE",
    "RL.BOX",
    "PEXPIRE",
    "EXPIRE",
    "SETEX",
    "PSETEX",
    "GETEX",
];
/// Bookkeeping commands Redis itself mixes into the stream.
const NOISE: &[&str] = &["SELECT", "PING", "REPLCONF"];

/// One scenario: a label, the calls to make, and the command names its
/// effect must replicate as (bookkeeping commands left out).
struct Scenario {
    label: &'static str,
    run: fn(&mut Connection),
    expect: &'static [&'static str],
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            label: "plain allowed RL.TAKE",
            run: |c| {
                call_ok(c, "RL.TAKE s:plain 10 1 60 COST 3");
            },
            expect: &["RL.APPLY"],
        },
        Scenario {
            label: "RL.TAKE with ALSO and JITTER",
            run: |c| {
                call_ok(
                    c,
                    "RL.TAKE s:{t}:a 10 1 60 COST 2 ALSO s:{t}:b 5 1 60 JITTER 50",
                );
            },
            // Both keys in one command.
            expect: &["RL.APPLY"],
        },
        Scenario {
            label: "calls inside MULTI/EXEC",
            run: |c| {
                let mut pipe = redis::pipe();
                pipe.atomic()
                    .cmd("RL.TAKE")
                    .arg("s:multi:1")
                    .arg(5)
                    .arg(1)
                    .arg(100)
                    .cmd("RL.WINDOW")
                    .arg("s:multi:2")
                    .arg(5)
                    .arg(100)
                    .arg("EXACT")
                    .cmd("RL.TAKE")
                    .arg("s:multi:1")
                    .arg(5)
                    .arg(1)
                    .arg(100)
                    .arg("COST")
                    .arg(0);
                let _: redis::Value = pipe.query(c).expect("MULTI/EXEC");
            },
            expect: &["MULTI", "RL.APPLY", "RL.APPLY", "EXEC"],
        },
        Scenario {
            label: "calls inside EVAL",
            run: |c| {
                let _: redis::Value = redis::cmd("EVAL")
                    .arg(
                        "redis.call('RL.TAKE', KEYS[1], 5, 1, 100, 'COST', 2); \
                         redis.call('RL.LEASE', 'ACQUIRE', KEYS[2], 2, 100, 'ID', 'x'); \
                         return redis.call('RL.BOX', 'TRIP', KEYS[3], 1, 100)",
                    )
                    .arg(3)
                    .arg("s:eval:1")
                    .arg("s:eval:2")
                    .arg("s:eval:3")
                    .query(c)
                    .expect("EVAL");
            },
            expect: &["MULTI", "RL.APPLY", "RL.APPLY", "RL.APPLY", "EXEC"],
        },
        Scenario {
            label: "throttled without STRIKES (writes nothing)",
            run: |c| {
                call_ok(c, "RL.TAKE s:thr 2 1 600 COST 2");
                let r = ints(c, "RL.TAKE s:thr 2 1 600 COST 2");
                assert_eq!(r[0], 0, "throttled");
            },
            expect: &["RL.APPLY"],
        },
        Scenario {
            label: "throttled with STRIKES (a strike is written)",
            run: |c| {
                let r = ints(c, "RL.TAKE s:thr 2 1 600 COST 2 STRIKES 3 60 JITTER 100");
                assert_eq!(
                    (r[0], r[6]),
                    (0, 3),
                    "throttled, its retry recorded: no strike yet"
                );
            },
            expect: &["RL.APPLY"],
        },
        Scenario {
            label: "the call that trips a box, then a call meeting it",
            run: |c| {
                let r = ints(c, "RL.TAKE s:thr 2 1 600 COST 2 STRIKES 2 60 BOX 30 60 90");
                assert_eq!((r[0], r[6]), (0, 1), "an early retry: a strike");
                let r = ints(c, "RL.TAKE s:thr 2 1 600 COST 2 STRIKES 2 60 BOX 30 60 90");
                assert_eq!(r[0], -1, "the box trips");
                let r = ints(c, "RL.TAKE s:thr 2 1 600 COST 1");
                assert_eq!(r[0], -1, "boxed");
            },
            expect: &["RL.APPLY", "RL.APPLY"],
        },
        Scenario {
            label: "RL.WINDOW sliding, exact and fixed, one throttled with STRIKES",
            run: |c| {
                call_ok(c, "RL.WINDOW s:w1 3 60");
                call_ok(c, "RL.WINDOW s:w2 3 60 EXACT COST 3");
                call_ok(c, "RL.WINDOW s:w3 3 60 FIXED");
                let r = ints(c, "RL.WINDOW s:w2 3 60 EXACT STRIKES 5 60");
                assert_eq!(r[0], 0, "throttled");
            },
            expect: &["RL.APPLY", "RL.APPLY", "RL.APPLY", "RL.APPLY"],
        },
        Scenario {
            label: "manual box (PERSIST), then RELEASE FORGET (DEL)",
            run: |c| {
                call_ok(c, "RL.BOX TRIP s:manual 3 0");
                assert_eq!(int(c, "RL.BOX RELEASE s:manual FORGET"), 1);
            },
            expect: &["RL.APPLY", "DEL"],
        },
        Scenario {
            label: "RL.LEASE acquire, renew, denied acquire, release of the last lease",
            run: |c| {
                call_ok(c, "RL.LEASE ACQUIRE s:lease 1 60 ID a");
                assert_eq!(int(c, "RL.LEASE RENEW s:lease a 120"), 1);
                assert_eq!(ints_or_nil_status(c, "RL.LEASE ACQUIRE s:lease 1 60"), 0);
                assert_eq!(int(c, "RL.LEASE RELEASE s:lease a"), 1);
            },
            expect: &["RL.APPLY", "RL.APPLY", "DEL"],
        },
        Scenario {
            label: "RL.QUOTA, then a PEEK (writes nothing)",
            run: |c| {
                call_ok(c, "RL.QUOTA s:quota 10 DAY COST 2 ALSO s:quota2 100 MONTH");
                call_ok(c, "RL.QUOTA s:quota 10 DAY COST 5 PEEK");
            },
            expect: &["RL.APPLY"],
        },
        Scenario {
            label: "CL.THROTTLE, and a redis-cell string converted in place",
            run: |c| {
                call_ok(c, "CL.THROTTLE s:cell 5 1 60");
                let ns = (now_ms() as u128 + 10_000) * 1_000_000;
                call_ok(c, &format!("SET s:legacy {ns} PX 10000"));
                let r = ints(c, "CL.THROTTLE s:legacy 15 1 1");
                assert_eq!(r.len(), 5, "converted and answered: {r:?}");
                call_ok(c, "TYPE s:legacy");
                // A quantity above the burst takes nothing: the value is
                // answered from as it is, and nothing is written.
                call_ok(c, &format!("SET s:legacy2 {ns} PX 10000"));
                let r = ints(c, "CL.THROTTLE s:legacy2 15 1 1 20");
                assert_eq!(r[0], 1, "limited: {r:?}");
            },
            // The conversion goes with the charge, in one RL.APPLY.
            expect: &["RL.APPLY", "SET", "RL.APPLY", "SET"],
        },
        Scenario {
            label: "RL.TAKE with DELAY: allowed, then delayed (status 2)",
            run: |c| {
                // A minute per point: the key outlives the AOF replay
                // that compares it, however slow the machine.
                call_ok(c, "RL.TAKE s:delay 1 1 60 DELAY 120");
                let r = ints(c, "RL.TAKE s:delay 1 1 60 DELAY 120");
                assert_eq!(r[0], 2, "delayed: {r:?}");
            },
            expect: &["RL.APPLY", "RL.APPLY"],
        },
        Scenario {
            label: "probes and reads (COST 0, STATUS, LIST) write nothing",
            run: |c| {
                call_ok(c, "RL.TAKE s:plain 10 1 60 COST 0");
                call_ok(c, "RL.WINDOW s:w1 3 60 COST 0");
                call_ok(c, "RL.BOX STATUS s:thr");
                call_ok(c, "RL.LEASE LIST s:lease");
            },
            expect: &[],
        },
    ]
}

/// The status (first element) of a lease reply, whose second element may
/// be nil.
fn ints_or_nil_status(con: &mut Connection, line: &str) -> i64 {
    let v = array(call_ok(con, line));
    value_i64(&v[0])
}

fn name(cmd: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(&cmd[0]).to_ascii_uppercase()
}

/// Checks one scenario's commands (marker excluded); returns the number of
/// verbatim `RL.*` commands, of relative expiries and of effect commands.
fn check(
    label: &str,
    cmds: &[Vec<Vec<u8>>],
    expect: &[&str],
    now_ms: i64,
) -> (usize, usize, usize) {
    let (mut verbatim, mut relative) = (0, 0);
    let shown: Vec<String> = cmds.iter().map(|c| show_command(c)).collect();
    let names: Vec<String> = cmds
        .iter()
        .map(|c| name(c))
        .filter(|n| !NOISE.contains(&n.as_str()))
        .collect();
    for c in cmds {
        let n = name(c);
        if FORBIDDEN.contains(&n.as_str()) {
            if n.starts_with("RL.") || n.starts_with("CL.") {
                verbatim += 1;
            } else {
                relative += 1;
            }
        }
        if n == "RL.APPLY" {
            // RL.APPLY key payload expiry [key payload expiry]...: each
            // expiry an absolute ms time or PERSIST.
            assert!(
                c.len() >= 4 && (c.len() - 1) % 3 == 0,
                "{label}: RL.APPLY without an expiry per key: {}",
                show_command(c)
            );
            for expiry in c.iter().skip(3).step_by(3) {
                let expiry = String::from_utf8_lossy(expiry).to_ascii_uppercase();
                if expiry != "PERSIST" {
                    let at: i64 = expiry.parse().expect("ms");
                    assert!(
                        at > now_ms - 60_000 && at < now_ms + 3_153_600_000_000 + 60_000,
                        "{label}: the expiry is an absolute time: {}",
                        show_command(c)
                    );
                }
            }
        }
    }
    assert_eq!(
        verbatim + relative,
        0,
        "{label}: forbidden commands in {shown:#?}"
    );
    assert_eq!(
        names, expect,
        "{label}: the effect replicated as {shown:#?}"
    );
    (verbatim, relative, names.len())
}

#[test]
fn the_replication_stream_holds_only_deterministic_effects() {
    let fig = Figure::start();
    let server = Server::start(&[]);
    let mut tap = ReplicationTap::sync(&server);
    let mut con = server.client();
    call_ok(&mut con, "SET mark:start 1");
    tap.until_marker("mark:start");
    let (mut commands, mut verbatim, mut relative, mut effects) = (0, 0, 0, 0);
    let all = scenarios();
    for (i, s) in all.iter().enumerate() {
        (s.run)(&mut con);
        let marker = format!("mark:{i}");
        call_ok(&mut con, &format!("SET {marker} 1"));
        let mut cmds = tap.until_marker(&marker);
        cmds.pop();
        commands += cmds.len();
        let (v, r, e) = check(s.label, &cmds, s.expect, now_ms());
        verbatim += v;
        relative += r;
        effects += e;
    }
    // The replica and the master agree after all of it (a real replica
    // applies the same stream).
    let replica = start_replica(&server);
    wait_replica(&mut con, 1, 5000);
    assert_eq!(digest(&mut con), digest(&mut replica.client()));
    fig.record(
        "3. Replication stream holds only deterministic effects",
        &format!(
            "raw SYNC socket reads the stream, scenario by scenario, for {} scenarios (plain call, ALSO + JITTER, inside MULTI, inside EVAL, throttled without and with STRIKES, the call tripping a box and one meeting it, 3 window modes, manual box + RELEASE FORGET, leases, RL.QUOTA + PEEK, CL.THROTTLE incl. redis-cell strings converted (charged, and not), DELAY, probes); command names compared exactly; then a real replica's digest",
            all.len()
        ),
        &format!(
            "{commands} commands read, {effects} effect commands exactly as expected; verbatim RL.*/CL.* {verbatim}, relative expiries {relative}; replica digest equal"
        ),
    );
}

#[test]
fn the_aof_holds_only_deterministic_effects() {
    let fig = Figure::start();
    let server = Server::start(AOF_EVERY_WRITE);
    let mut con = server.client();
    let all = scenarios();
    for s in &all {
        (s.run)(&mut con);
    }
    let (_, cmds) = incremental_aof(&server);
    let expect: Vec<&str> = all.iter().flat_map(|s| s.expect.iter().copied()).collect();
    let (verbatim, relative, effects) = check("AOF", &cmds, &expect, now_ms());
    // The AOF replays to the same state (but for keys that may expire
    // meanwhile: a fixed window ends at its key's boundary, anywhere in
    // the next 60 s).
    let cutoff = now_ms() + 10_000;
    let before = snapshot_lasting_past(&mut con, cutoff);
    server.kill9();
    server.restart();
    assert_eq!(
        snapshot_lasting_past(&mut server.client(), cutoff),
        before,
        "AOF replay"
    );
    fig.record(
        "3. AOF holds only deterministic effects",
        "the same scenarios with appendonly yes, aof-use-rdb-preamble no; the incremental AOF parsed; then kill -9 and replay",
        &format!(
            "{} commands in the AOF, {effects} effect commands exactly as expected; verbatim RL.*/CL.* {verbatim}, relative expiries {relative}; replay after kill -9 identical",
            cmds.len()
        ),
    );
}
