//! Reliability, item 2: convergence under load. 50 connections hammer
//! 1000 keys with every kind of write while the replica is frozen
//! (`SIGSTOP`) for 2 s; after `SIGCONT` and `WAIT`, master and replica
//! have equal `DEBUG DIGEST`s and no key's `PEXPIRETIME` differs.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;

const CONNECTIONS: usize = 50;
/// Calls per connection: 50 x 10^5 calls take about 75 s on 2 cores.
const CALLS: usize = 100_000;
const KEYS: usize = 1000;
/// Calls per pipeline round trip.
const BATCH: usize = 50;

/// The `n`-th call of connection `c`: every kind of write, long periods
/// (nothing expires during the test), boxes tripping on some keys.
fn call_line(c: usize, n: usize) -> Vec<String> {
    let mut h = (c * CALLS + n) as u64;
    h = (h ^ (h >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let k = (h >> 32) as usize % KEYS;
    let line = match (c + n) % 10 {
        0..=2 => {
            format!("RL.TAKE k:{{{k}}} 1000000 1000 3600 COST 3 ALSO t:{{{k}}} 1000000 1000 3600")
        }
        3 => format!("RL.TAKE s:{k} 20 1 3600 STRIKES 3 3600 BOX 3600 7200 0"),
        4 => format!("RL.WINDOW w:{k} 1000000000 3600"),
        5 => format!("RL.WINDOW e:{k} 40 3600 EXACT STRIKES 5 3600"),
        6 => format!("RL.LEASE ACQUIRE l:{k} 1000 3600 ID c{c}"),
        7 => format!("RL.LEASE RELEASE l:{k} c{}", (c + 1) % CONNECTIONS),
        8 => format!("RL.QUOTA q:{k} 1000000000 MONTH COST 2"),
        _ => format!("CL.THROTTLE c:{k} 1000000 1000 3600 2"),
    };
    line.split(' ').map(str::to_string).collect()
}

#[test]
fn master_and_replica_converge_after_the_replica_is_frozen_under_load() {
    let fig = Figure::start();
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let replica_pid = redis_pid(&replica);
    let done = AtomicU64::new(0);
    let errors = AtomicU64::new(0);
    let frozen = AtomicBool::new(false);
    let t0 = Instant::now();
    let mut stop_at = 0.0;
    std::thread::scope(|s| {
        for c in 0..CONNECTIONS {
            let (master, done, errors) = (&master, &done, &errors);
            s.spawn(move || {
                let mut raw = RawConn::connect(master);
                for start in (0..CALLS).step_by(BATCH) {
                    let cmds: Vec<Vec<String>> = (start..(start + BATCH).min(CALLS))
                        .map(|n| call_line(c, n))
                        .collect();
                    for r in raw.pipeline(&cmds).expect("load batch") {
                        if matches!(r, Resp::Error(_)) {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    done.fetch_add(cmds.len() as u64, Ordering::Relaxed);
                }
            });
        }
        // Freeze the replica once a third of the calls are done, for 2 s.
        let total = (CONNECTIONS * CALLS) as u64;
        let _ = poll_for(Duration::from_secs(300), Duration::from_millis(10), || {
            (done.load(Ordering::Relaxed) >= total / 3).then_some(())
        });
        signal(replica_pid, "STOP");
        frozen.store(true, Ordering::Relaxed);
        stop_at = t0.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_secs(2));
        signal(replica_pid, "CONT");
    });
    let load_s = t0.elapsed().as_secs_f64();
    assert!(frozen.load(Ordering::Relaxed));
    let mut con = master.client();
    let t1 = Instant::now();
    // WAIT waits for this connection's own writes: write a marker after all
    // of the load's writes first.
    let _: () = redis::cmd("SET")
        .arg("marker")
        .arg(1)
        .query(&mut con)
        .expect("SET");
    wait_replica(&mut con, 1, 60_000);
    let catch_up_s = t1.elapsed().as_secs_f64();
    let mut rep = replica.client();
    let (dm, dr) = (digest(&mut con), digest(&mut rep));
    let keys = scan_keys(&mut con, "*");
    let on_master = expiretimes(&mut con, &keys);
    let on_replica = expiretimes(&mut rep, &keys);
    let differ = on_master
        .iter()
        .filter(|(k, at)| on_replica.get(*k) != Some(at))
        .count();
    let replica_keys = int(&mut rep, "DBSIZE") as usize;
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for k in &keys {
        let p = String::from_utf8_lossy(k)
            .split(':')
            .next()
            .unwrap_or("")
            .to_string();
        *kinds.entry(p).or_default() += 1;
    }
    eprintln!("keys by prefix: {kinds:?}");
    let full_syncs = info_u64(&master, "stats", "sync_full");
    let calls = done.load(Ordering::Relaxed);
    let errs = errors.load(Ordering::Relaxed);
    fig.record(
        "2. Convergence under load",
        &format!(
            "{CONNECTIONS} connections x {CALLS} calls (pipelined by {BATCH}) on {KEYS} key names per kind: RL.TAKE with ALSO and with STRIKES/boxes, RL.WINDOW sliding and EXACT with STRIKES, RL.LEASE ACQUIRE/RELEASE, RL.QUOTA, CL.THROTTLE; replica SIGSTOPped 2 s at {stop_at:.1} s, SIGCONT, WAIT"
        ),
        &format!(
            "{calls} calls in {load_s:.1} s ({:.0}/s, {errs} errors); replica caught up {catch_up_s:.1} s after the load (full resyncs {}); DEBUG DIGEST equal: {}; {} keys, PEXPIRETIME differing on {differ}",
            calls as f64 / load_s,
            full_syncs.saturating_sub(1),
            dm == dr,
            keys.len()
        ),
    );
    assert_eq!(calls, (CONNECTIONS * CALLS) as u64);
    assert_eq!(errs, 0, "no call failed");
    assert_eq!(dm, dr, "DEBUG DIGEST differs");
    assert_eq!(replica_keys, keys.len());
    assert_eq!(differ, 0, "keys whose PEXPIRETIME differs");
    assert_eq!(kinds.len(), 9, "8 kinds of key and the marker: {kinds:?}");
    assert!(keys.len() > 7 * KEYS, "{} keys", keys.len());
}
