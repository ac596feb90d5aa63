//! Reliability, item 5: clock faults. The server's wall clock is stepped
//! back one hour and forward again mid-run (with the harness's
//! `TimeShift`, since libfaketime deadlocks Debian's redis-server): no
//! bucket, window, quota or lease admits more than it would have without
//! the step, and after the forward step no box or lease lasts longer than
//! configured. A replica whose clock is 5 s ahead ends identical to its
//! master.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Buckets, exact windows, quotas and lease keys under load.
const KEYS: usize = 40;
/// Bucket: capacity 20, 10 points per second.
const CAP: f64 = 20.0;
const RATE: f64 = 10.0;
/// Exact window: 10 per 2 s.
const WIN_LIMIT: f64 = 10.0;
const WIN_S: f64 = 2.0;
/// Daily quota.
const QUOTA: i64 = 30;
/// Leases per key, and the box/lease duration in seconds.
const MAX_LEASES: i64 = 3;
const HOLD_S: i64 = 30;

/// Allowed calls per key and kind in one phase.
#[derive(Default, Clone)]
struct Phase {
    bucket: Vec<i64>,
    window: Vec<i64>,
    quota: Vec<i64>,
    leases: Vec<i64>,
    /// Client-side duration of the phase, first send to last reply.
    secs: f64,
}

/// Calls every key's bucket, window, quota and lease once per round,
/// pipelined, for `dur`.
fn run_phase(raw: &mut RawConn, dur: Duration) -> Phase {
    let mut p = Phase {
        bucket: vec![0; KEYS],
        window: vec![0; KEYS],
        quota: vec![0; KEYS],
        leases: vec![0; KEYS],
        secs: 0.0,
    };
    let mut cmds: Vec<Vec<String>> = Vec::new();
    for i in 0..KEYS {
        let line = [
            format!("RL.TAKE b:{i} {CAP} {RATE} 1"),
            format!("RL.WINDOW w:{i} {WIN_LIMIT} {WIN_S} EXACT"),
            format!("RL.QUOTA q:{i} {QUOTA} DAY"),
            format!("RL.LEASE ACQUIRE l:{i} {MAX_LEASES} {HOLD_S}"),
        ];
        cmds.extend(
            line.iter()
                .map(|l| l.split(' ').map(str::to_string).collect()),
        );
    }
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        let replies = raw.pipeline(&cmds).expect("phase batch");
        for (j, r) in replies.iter().enumerate() {
            let status = match r {
                Resp::Array(Some(items)) => match items[0] {
                    Resp::Int(s) => s,
                    ref other => panic!("{:?}: {other:?}", cmds[j]),
                },
                other => panic!("{:?}: {other:?}", cmds[j]),
            };
            let i = j / 4;
            if status == 1 {
                match j % 4 {
                    0 => p.bucket[i] += 1,
                    1 => p.window[i] += 1,
                    2 => p.quota[i] += 1,
                    _ => p.leases[i] += 1,
                }
            }
        }
    }
    p.secs = t0.elapsed().as_secs_f64();
    p
}

/// Trips a box of `HOLD_S` seconds on `box:{tag}:{i}` and takes a lease of
/// `HOLD_S` seconds on `hold:{tag}:{i}`, for 10 keys.
fn trip_and_hold(con: &mut redis::Connection, tag: &str) {
    for i in 0..10 {
        let line =
            format!("RL.TAKE box:{tag}:{i} 1 1 3600 STRIKES 1 60 BOX {HOLD_S} {HOLD_S} {HOLD_S}");
        decide(con, &line);
        assert_eq!(
            decide(con, &line).status,
            THROTTLED,
            "refused, a retry announced"
        );
        assert_eq!(
            decide(con, &line).status,
            BOXED,
            "the early retry trips the box"
        );
        call(con, &format!("RL.LEASE ACQUIRE hold:{tag}:{i} 5 {HOLD_S}")).expect("ACQUIRE");
    }
}

/// The longest remaining box and lease time (ms) over every key tagged so
/// far, and how many are still active.
fn longest_holds(con: &mut redis::Connection, tags: &[&str]) -> (i64, i64, usize) {
    let (mut box_ms, mut lease_ms, mut active) = (0, 0, 0);
    for tag in tags {
        for i in 0..10 {
            let s = box_status(con, &format!("box:{tag}:{i}"));
            if s.level > 0 {
                active += 1;
                box_ms = box_ms.max(s.ttl_ms);
            }
            for (_, ms_left) in lease_list(con, &format!("hold:{tag}:{i}")) {
                active += 1;
                lease_ms = lease_ms.max(ms_left);
            }
        }
    }
    (box_ms, lease_ms, active)
}

#[test]
fn clock_steps_back_and_forward_admit_nothing_extra() {
    let fig = Figure::start();
    let clock = TimeShift::new();
    // Put the server at 00:30 UTC, so that the step back crosses midnight
    // (the daily quota's period boundary).
    let day = 86_400_000;
    let target = (now_ms() / day + 1) * day + 30 * 60_000;
    clock.set_now_ms(target);
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    let mut raw = RawConn::connect(&server);

    trip_and_hold(&mut con, "p1");
    let p1 = run_phase(&mut raw, Duration::from_millis(1000));
    clock.advance_ms(-3_600_000);
    // Right after the step back: the holds made before it now end later
    // (absolute deadlines), never earlier.
    let (box_back, lease_back, _) = longest_holds(&mut con, &["p1"]);
    trip_and_hold(&mut con, "p2");
    let p2 = run_phase(&mut raw, Duration::from_millis(1500));
    clock.advance_ms(3_600_000);
    let after_forward = longest_holds(&mut con, &["p1", "p2"]);
    trip_and_hold(&mut con, "p3");
    let p3 = run_phase(&mut raw, Duration::from_millis(1000));
    clock.advance_ms(3_600_000);
    let after_second_forward = longest_holds(&mut con, &["p1", "p2", "p3"]);
    trip_and_hold(&mut con, "p4");
    let fresh = longest_holds(&mut con, &["p4"]);

    // Over-admission across the backward step: what P1 + P2 admitted
    // against what the run could have admitted without any step.
    let t12 = p1.secs + p2.secs;
    let mut over = 0i64;
    let mut detail = Vec::new();
    for i in 0..KEYS {
        let bucket_bound = (CAP + RATE * t12).floor() as i64;
        let win_bound = (WIN_LIMIT * ((t12 / WIN_S).floor() + 1.0)) as i64;
        let checks = [
            ("bucket", p1.bucket[i] + p2.bucket[i], bucket_bound),
            ("window", p1.window[i] + p2.window[i], win_bound),
            ("quota", p1.quota[i] + p2.quota[i] + p3.quota[i], QUOTA),
            (
                "lease",
                p1.leases[i] + p2.leases[i] + p3.leases[i],
                MAX_LEASES,
            ),
        ];
        for (what, got, bound) in checks {
            if got > bound {
                over += got - bound;
                detail.push(format!("{what} {i}: {got} > {bound}"));
            }
        }
    }
    let hold_ms = HOLD_S * 1000;
    let too_long = [after_forward, after_second_forward, fresh]
        .iter()
        .filter(|(b, l, _)| *b > hold_ms || *l > hold_ms)
        .count();
    let sum = |v: &[i64]| v.iter().sum::<i64>();
    fig.record(
        "5. Clock faults: steps back and forward",
        &format!(
            "TimeShift on the server (libfaketime deadlocks Debian's redis-server): clock at 00:30 UTC, stepped back 1 h (across midnight) then forward 1 h twice, under pipelined load on {KEYS} buckets (20 + 10/s), exact windows (10 per 2 s), daily quotas ({QUOTA}) and lease keys (max {MAX_LEASES}); {HOLD_S} s boxes and leases taken before each step"
        ),
        &format!(
            "over-admissions after the backward step 0 (admitted in 2.5 s: buckets {} of at most {}, of which {} in the 1.5 s after the step (a bucket refills only as the clock passes again the time it had reached; without the step about {} would have been admitted); windows {}, quotas {} of {}, leases {} of {}); after the backward step boxes/leases end later (up to {} s / {} s left, absolute deadlines); after each forward step the longest box/lease left is {} s / {} s and {} s / {} s, fresh ones {} s / {} s (configured {HOLD_S} s): longer than configured 0",
            sum(&p1.bucket) + sum(&p2.bucket),
            KEYS as i64 * (CAP + RATE * t12).floor() as i64,
            sum(&p2.bucket),
            KEYS as i64 * (RATE * p2.secs).floor() as i64,
            sum(&p1.window) + sum(&p2.window),
            sum(&p1.quota) + sum(&p2.quota) + sum(&p3.quota),
            QUOTA * KEYS as i64,
            sum(&p1.leases) + sum(&p2.leases) + sum(&p3.leases),
            MAX_LEASES * KEYS as i64,
            box_back / 1000,
            lease_back / 1000,
            after_forward.0 / 1000,
            after_forward.1 / 1000,
            after_second_forward.0 / 1000,
            after_second_forward.1 / 1000,
            fresh.0 / 1000,
            fresh.1 / 1000,
        ),
    );
    assert_eq!(over, 0, "over-admissions: {detail:?}");
    assert_eq!(too_long, 0, "a box or lease outlasts its configuration");
    assert!(
        box_back > 0 && lease_back > 0,
        "a backward step ends no box or lease early"
    );
    assert_eq!(after_second_forward.2, 0, "everything held before it ended");
    assert!(fresh.0 > 0 && fresh.1 > 0, "fresh holds are live");
    // Sanity: the load did admit, so the bounds were approached.
    assert!(sum(&p1.bucket) >= KEYS as i64 * CAP as i64);
    assert!(
        sum(&p3.bucket) > 0,
        "after the forward step buckets admit again"
    );
}

#[test]
fn a_replica_5_s_ahead_ends_with_equal_digests() {
    let fig = Figure::start();
    let master = Server::start(&[]);
    let ahead = TimeShift::new();
    ahead.set_ms(5_000);
    let replica = start_replica_with(&ahead.prefix(), &master);
    let mut con = master.client();
    // Long-lived state of every kind, and short-lived keys (1-3 s) that
    // the replica sees as expired up to 5 s before the master does.
    mixed_workload(&mut con, 60);
    let mut raw = RawConn::connect(&master);
    let t0 = Instant::now();
    let mut calls = 0;
    let mut round = 0;
    while t0.elapsed() < Duration::from_millis(2500) {
        let cmds: Vec<Vec<String>> = (0..200)
            .map(|i| {
                let k = (round * 7 + i) % 300;
                let line = match i % 6 {
                    0 => format!("RL.TAKE s:{k} 5 5 1 COST 2 STRIKES 2 2 BOX 1 2 3"),
                    1 => format!("RL.WINDOW s:w{k} 3 1 EXACT"),
                    2 => format!("RL.LEASE ACQUIRE s:l{k} 2 1.5"),
                    3 => format!("CL.THROTTLE s:c{k} 4 5 2"),
                    4 => format!("RL.TAKE long:{k} 100 1 3600 COST 1"),
                    _ => format!("RL.WINDOW long:w{k} 50 3600 FIXED"),
                };
                line.split(' ').map(str::to_string).collect()
            })
            .collect();
        for r in raw.pipeline(&cmds).expect("load") {
            assert!(!matches!(r, Resp::Error(_)), "{r:?}");
        }
        calls += cmds.len();
        round += 1;
    }
    // Let the short keys expire on the master too (the master's clock
    // decides: a SCAN expires what it visits), then compare.
    std::thread::sleep(Duration::from_millis(3500));
    let _ = scan_keys(&mut con, "*");
    wait_replica(&mut con, 1, 10_000);
    let mut rep = replica.client();
    let (dm, dr) = (digest(&mut con), digest(&mut rep));
    let mut on_master = snapshot(&mut con);
    let mut on_replica = snapshot(&mut rep);
    // Reads on the replica apply its own clock: a key the master expires in
    // the next 5 s already reads as missing there (Redis's logical expiry on
    // replicas). Those keys are left to DEBUG DIGEST, which sees every key.
    let soon = now_ms() + 10_000;
    let expiring: Vec<String> = on_master
        .iter()
        .filter(|(_, (_, at))| *at > 0 && *at < soon)
        .map(|(k, _)| k.clone())
        .collect();
    for k in &expiring {
        on_master.remove(k);
        on_replica.remove(k);
    }
    let differ = on_master
        .iter()
        .filter(|(k, v)| on_replica.get(*k) != Some(v))
        .count()
        + on_replica
            .keys()
            .filter(|k| !on_master.contains_key(*k))
            .count();
    let expiry_differ = on_master
        .iter()
        .filter(|(k, (_, at))| on_replica.get(*k).map(|r| r.1) != Some(*at))
        .count();
    fig.record(
        "5. A replica whose clock is 5 s ahead",
        &format!(
            "master + replica under TimeShift +5 s; mixed workload of every kind, then {calls} pipelined calls in 2.5 s on keys living 1-3 s and keys living 1 h; short keys left to expire; WAIT"
        ),
        &format!(
            "DEBUG DIGEST equal: {}; {} keys compared by DUMP and PEXPIRETIME ({} expiring within 10 s left to the digest), differing {differ} (PEXPIRETIME {expiry_differ})",
            dm == dr,
            on_master.len(),
            expiring.len()
        ),
    );
    assert!(on_master.len() > 500, "{} keys", on_master.len());
    let mut shown = Vec::new();
    for (k, v) in &on_master {
        let r = on_replica.get(k);
        if r != Some(v) {
            let ttl = int(&mut con, &format!("PTTL {k}"));
            shown.push(format!("{k}: master {v:?} (PTTL {ttl}) replica {r:?}"));
        }
    }
    for k in on_replica.keys().filter(|k| !on_master.contains_key(*k)) {
        shown.push(format!("{k}: only on the replica {:?}", on_replica[k]));
    }
    assert_eq!(differ, 0, "{shown:#?}");
    assert_eq!(dm, dr, "digests");
}

/// commands.md, Time: after a step back, a bucket "refills only as the
/// clock passes again the time it had reached (its `retry_after_ms` says
/// so). Time already seen refills only once." Checked for `RL.TAKE` and
/// the same bucket behind `CL.THROTTLE`: every call is throttled, the wait
/// covers the step, and the points come back once the clock has passed
/// the time it had reached.
#[test]
fn after_a_backward_step_a_bucket_refills_only_as_the_clock_passes_again() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    assert_eq!(
        decide(&mut con, "RL.TAKE k 20 10 1 COST 20").status,
        ALLOWED
    );
    assert_eq!(ints(&mut con, "CL.THROTTLE c 19 10 1 20")[0], 0);
    clock.advance_ms(-3_600_000);
    let probe = decide(&mut con, "RL.TAKE k 20 10 1 COST 0");
    assert_eq!(
        probe.status, THROTTLED,
        "the debt includes the step: {probe:?}"
    );
    let one = decide(&mut con, "RL.TAKE k 20 10 1 COST 1");
    assert!(
        one.status == THROTTLED && (3_599_000..=3_601_000).contains(&one.retry_after_ms),
        "one point back when the clock has passed the step again: {one:?}"
    );
    let c = ints(&mut con, "CL.THROTTLE c 19 10 1 1");
    assert!(
        c[0] == 1 && (3599..=3601).contains(&c[3]),
        "CL.THROTTLE too: {c:?}"
    );
    // Halfway back to the time already seen: still nothing.
    clock.advance_ms(1_800_000);
    assert_eq!(
        decide(&mut con, "RL.TAKE k 20 10 1 COST 1").status,
        THROTTLED,
        "time already seen refills once"
    );
    // retry_after_ms is true: the clock passes the step, plus one point.
    clock.advance_ms(1_800_000 + 100);
    assert_eq!(decide(&mut con, "RL.TAKE k 20 10 1 COST 1").status, ALLOWED);
    assert_eq!(ints(&mut con, "CL.THROTTLE c 19 10 1 1")[0], 0);
}
