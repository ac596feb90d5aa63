//! Reliability, item 1: failover keeps every limit. A master and its
//! replica under concurrent `RL.TAKE` (boxes tripping and released),
//! `RL.WINDOW` and `RL.LEASE` load; each write is followed by `WAIT 1`.
//! (a) `FAILOVER TO` the replica mid-load; (b) `kill -9` of the master and
//! `REPLICAOF NO ONE` on the replica. Every key whose last write was
//! acknowledged by `WAIT 1` must be byte-identical on the promoted replica
//! (no box lost or changed, no lease lost, no bucket refilled), and the
//! load that continues on the new master never admits more than capacity.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use common::*;
use redis::{Connection, Value};

const WORKERS: usize = 6;
/// Keys per kind per worker.
const KEYS: usize = 24;
/// Bucket capacity (it refills one point per 10^6 s: never, in a test).
const CAP: i64 = 5;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Take,
    Window,
    Lease,
}

/// The state of a key after its last acknowledged write.
#[derive(Clone, Debug)]
struct Acked {
    dump: Option<Vec<u8>>,
    at: i64,
    boxed: bool,
}

#[derive(Default)]
struct Log {
    acked: BTreeMap<String, Acked>,
    /// Keys whose last write is not known to be acknowledged.
    pending: HashSet<String>,
    /// Acknowledged live lease ids per lease key.
    leases: BTreeMap<String, BTreeSet<String>>,
    /// RL.TAKE calls answered 1, per key, over the whole run.
    allowed: BTreeMap<String, i64>,
    ops: u64,
    acks: u64,
    errors: u64,
}

struct Shared<'a> {
    nodes: [&'a Server; 2],
    /// Index in `nodes` of the node to write to.
    current: AtomicUsize,
    /// Bumped by the test to let parked workers go on.
    epoch: AtomicUsize,
    parked: AtomicUsize,
    stop: AtomicBool,
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

fn connect(server: &Server) -> Option<Connection> {
    let client = redis::Client::open(server.url()).ok()?;
    let con = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    con.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    Some(con)
}

/// One worker: writes, `WAIT 1 1000` after each, records what was
/// acknowledged; on an error it parks until the test moves it on.
fn worker(w: usize, shared: &Shared, log: &Mutex<Log>) {
    let mut rng = Rng(w as u64 * 7919 + 1);
    let mut epoch = shared.epoch.load(Ordering::SeqCst);
    let mut con = connect(shared.nodes[shared.current.load(Ordering::SeqCst)]);
    let mut n = 0u64;
    let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
    while !shared.stop.load(Ordering::SeqCst) {
        n += 1;
        let i = rng.below(KEYS as u64);
        let kind = match rng.below(10) {
            0..=4 => Kind::Take,
            5..=6 => Kind::Window,
            _ => Kind::Lease,
        };
        let (key, line) = match kind {
            Kind::Take => {
                let key = format!("tk:{w}:{i}");
                let line = if rng.below(12) == 0 {
                    format!("RL.BOX RELEASE {key}")
                } else {
                    format!("RL.TAKE {key} {CAP} 1 1000000 STRIKES 3 3600 BOX 600 1200 0")
                };
                (key, line)
            }
            Kind::Window => {
                let key = format!("wn:{w}:{i}");
                let mode = ["", " EXACT", " FIXED"][i as usize % 3];
                let line = format!("RL.WINDOW {key} 4 3600{mode} STRIKES 2 3600 BOX 600 1200 0");
                (key, line)
            }
            Kind::Lease => {
                let key = format!("ls:{w}:{i}");
                let ids = held.entry(key.clone()).or_default();
                let line = if ids.len() < 3 && rng.below(3) != 0 || ids.is_empty() {
                    format!("RL.LEASE ACQUIRE {key} 3 3600 ID {w}-{n}")
                } else {
                    let id = ids.remove(rng.below(ids.len() as u64) as usize);
                    format!("RL.LEASE RELEASE {key} {id}")
                };
                (key, line)
            }
        };
        let outcome = (|| -> Result<(), ()> {
            let c = con.as_mut().ok_or(())?;
            // Pending from before the call: a write can be applied (and
            // replicated) although its reply never arrives.
            log.lock().expect("log").pending.insert(key.clone());
            let reply = call(c, &line).map_err(|_| ())?;
            let mut l = log.lock().expect("log");
            l.ops += 1;
            let mut boxed = false;
            if kind == Kind::Lease {
                let granted = line.contains("ACQUIRE") && value_i64(&array(reply.clone())[0]) == 1;
                if granted {
                    let id = line.rsplit(' ').next().expect("id").to_string();
                    held.entry(key.clone()).or_default().push(id);
                }
            } else if let Value::Array(ref items) = reply {
                let status = value_i64(&items[0]);
                boxed = status == -1;
                if kind == Kind::Take && status == 1 {
                    *l.allowed.entry(key.clone()).or_default() += 1;
                }
            }
            drop(l);
            let acked: i64 = redis::cmd("WAIT")
                .arg(1)
                .arg(1000)
                .query(c)
                .map_err(|_| ())?;
            if acked < 1 {
                return Ok(());
            }
            let (dump, at) = dump_and_expiry(c, &key).map_err(|_| ())?;
            let mut l = log.lock().expect("log");
            l.acks += 1;
            l.pending.remove(&key);
            l.acked.insert(key.clone(), Acked { dump, at, boxed });
            if kind == Kind::Lease {
                let ids: BTreeSet<String> = held
                    .get(&key)
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .collect();
                l.leases.insert(key.clone(), ids);
            }
            Ok(())
        })();
        if outcome.is_err() {
            log.lock().expect("log").errors += 1;
            // Park until the test has switched nodes (bounded).
            shared.parked.fetch_add(1, Ordering::SeqCst);
            let _ = poll_for(Duration::from_secs(60), Duration::from_millis(5), || {
                (shared.epoch.load(Ordering::SeqCst) != epoch || shared.stop.load(Ordering::SeqCst))
                    .then_some(())
            });
            shared.parked.fetch_sub(1, Ordering::SeqCst);
            epoch = shared.epoch.load(Ordering::SeqCst);
            con = connect(shared.nodes[shared.current.load(Ordering::SeqCst)]);
        }
    }
}

/// What the promoted node holds for every acknowledged key.
struct Check {
    boxes: usize,
    boxes_bad: usize,
    leases: usize,
    leases_lost: usize,
    buckets: usize,
    buckets_bad: usize,
    pending: usize,
}

fn check(con: &mut Connection, logs: &[Mutex<Log>]) -> (Check, Vec<String>) {
    let mut c = Check {
        boxes: 0,
        boxes_bad: 0,
        leases: 0,
        leases_lost: 0,
        buckets: 0,
        buckets_bad: 0,
        pending: 0,
    };
    let mut bad = Vec::new();
    for log in logs {
        let l = log.lock().expect("log");
        c.pending += l.pending.len();
        for (key, want) in &l.acked {
            if l.pending.contains(key) {
                continue;
            }
            let got = dump_and_expiry(con, key).expect("DUMP on the new master");
            let same = got.0 == want.dump && got.1 == want.at;
            if !same {
                bad.push(format!("{key}: acked {want:?}, now {got:?}"));
            }
            if key.starts_with("ls:") {
                let ids = &l.leases[key];
                c.leases += ids.len();
                let live: BTreeSet<String> =
                    array(call(con, &format!("RL.LEASE LIST {key}")).expect("LIST"))
                        .into_iter()
                        .map(|p| value_str(&array(p)[0]))
                        .collect();
                c.leases_lost += ids.difference(&live).count();
            } else if want.boxed {
                c.boxes += 1;
                c.boxes_bad += usize::from(!same);
            } else {
                c.buckets += 1;
                c.buckets_bad += usize::from(!same);
            }
        }
    }
    (c, bad)
}

/// Runs the load, applies `fault` mid-run (it returns the index of the
/// new master), checks, resumes, and returns the figure.
fn failover_under_load(
    label: &str,
    how: &str,
    fault: impl FnOnce(&Server, &Server) -> usize,
    lossless: bool,
) {
    let fig = Figure::start();
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let shared = Shared {
        nodes: [&master, &replica],
        current: AtomicUsize::new(0),
        epoch: AtomicUsize::new(0),
        parked: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    };
    let logs: Vec<Mutex<Log>> = (0..WORKERS).map(|_| Mutex::new(Log::default())).collect();
    let mut result = None;
    let mut new_replica: Option<Server> = None;
    std::thread::scope(|s| {
        for (w, log) in logs.iter().enumerate() {
            let shared = &shared;
            s.spawn(move || worker(w, shared, log));
        }
        std::thread::sleep(Duration::from_millis(2000));
        let ops_before: u64 = logs.iter().map(|l| l.lock().expect("log").ops).sum();
        let new = fault(&master, &replica);
        shared.current.store(new, Ordering::SeqCst);
        // Every worker notices (its next write fails) and parks.
        wait_until(
            Duration::from_secs(30),
            "every worker to notice the failover",
            || shared.parked.load(Ordering::SeqCst) >= WORKERS,
        );
        let mut con = shared.nodes[new].client();
        let (c, bad) = check(&mut con, &logs);
        if !lossless {
            // The promoted node gets a replica of its own, so that writes
            // after the failover are acknowledged too.
            new_replica = Some(start_replica(shared.nodes[new]));
        }
        shared.epoch.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1500));
        shared.stop.store(true, Ordering::SeqCst);
        result = Some((c, bad, ops_before));
    });
    let (c, bad, ops_before) = result.expect("ran");
    // Across the whole run (before and after the failover) no bucket
    // admitted more than its capacity.
    let mut over = 0;
    let (mut ops, mut acks, mut errors) = (0, 0, 0);
    for log in &logs {
        let l = log.lock().expect("log");
        over += l.allowed.values().map(|a| (a - CAP).max(0)).sum::<i64>();
        ops += l.ops;
        acks += l.acks;
        errors += l.errors;
    }
    let mut con = shared.nodes[shared.current.load(Ordering::SeqCst)].client();
    let keys_after = int(&mut con, "DBSIZE");
    // The new master's replica (the old master after FAILOVER, a fresh
    // one after kill -9) converges with it.
    let follower = if lossless {
        shared.nodes[0]
    } else {
        new_replica.as_ref().expect("a new replica")
    };
    let _: () = redis::cmd("SET")
        .arg("marker")
        .arg(1)
        .query(&mut con)
        .expect("SET");
    wait_replica(&mut con, 1, 10_000);
    let converged = digest(&mut con) == digest(&mut follower.client());
    fig.record(
        label,
        how,
        &format!(
            "{ops} writes ({ops_before} before the fault), {acks} acknowledged by WAIT 1, {errors} failed at the switch; of the acknowledged: boxes lost or changed {} of {}, leases lost {} of {}, buckets/windows refilled or changed {} of {} ({} keys with an unacknowledged last write skipped); points admitted above capacity over the whole run {over}; {keys_after} keys on the new master, its replica's digest equal: {converged}",
            c.boxes_bad, c.boxes, c.leases_lost, c.leases, c.buckets_bad, c.buckets, c.pending
        ),
    );
    assert!(
        bad.is_empty(),
        "acknowledged state differs after the failover: {:#?}",
        &bad[..bad.len().min(10)]
    );
    assert!(
        c.boxes > 10 && c.leases > 10 && c.buckets > 10,
        "the load reached every kind"
    );
    assert!(
        c.pending <= WORKERS,
        "at most one unacknowledged write per worker"
    );
    assert!(converged, "the new master's replica converged");
    if lossless {
        assert_eq!(over, 0, "points admitted above capacity");
    } else {
        assert!(
            over <= WORKERS as i64,
            "over-admission beyond the unacknowledged writes: {over}"
        );
    }
}

#[test]
fn failover_to_the_replica_mid_load_keeps_every_limit() {
    failover_under_load(
        "1a. Failover (FAILOVER TO) keeps every limit",
        &format!(
            "master + replica, {WORKERS} clients: RL.TAKE (5 points, STRIKES 3, BOX 600/1200/manual, some RL.BOX RELEASE), RL.WINDOW (3 modes, STRIKES 2), RL.LEASE ACQUIRE/RELEASE, each write followed by WAIT 1 1000 and a DUMP; FAILOVER TO the replica after 2 s; DUMP + PEXPIREAT of every acknowledged key compared on the new master; load resumed there for 1.5 s"
        ),
        |master, replica| {
            let r = call(
                &mut master.client(),
                &format!("FAILOVER TO 127.0.0.1 {} TIMEOUT 10000", replica.port),
            );
            assert!(r.is_ok(), "FAILOVER: {r:?}");
            wait_until(Duration::from_secs(20), "the replica took over", || {
                replica.info_get("replication", "role").as_deref() == Some("master")
                    && master.info_get("replication", "master_link_status").as_deref() == Some("up")
            });
            1
        },
        true,
    );
}

#[test]
fn kill_9_of_the_master_then_replicaof_no_one_keeps_acknowledged_limits() {
    failover_under_load(
        "1b. Failover (kill -9, REPLICAOF NO ONE) keeps acknowledged limits",
        &format!(
            "master + replica, {WORKERS} clients: the same load with WAIT 1 1000 after each write; kill -9 of the master after 2 s, REPLICAOF NO ONE on the replica; DUMP + PEXPIREAT of every acknowledged key compared on the promoted replica; a new replica attached; load resumed for 1.5 s"
        ),
        |master, replica| {
            master.kill9();
            call(&mut replica.client(), "REPLICAOF NO ONE").expect("REPLICAOF NO ONE");
            1
        },
        false,
    );
}
