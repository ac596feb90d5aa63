//! `rlctl regions sync` across three regions on loopback (two one-server
//! regions and a three-primary cluster, see `common::regions`): totals
//! converge to the exact sum, a partition admits no more than the
//! documented bound and heals within the documented time, a worker killed
//! with SIGKILL and a Redis restarted from its AOF lose and double nothing,
//! bad stream entries are refused, counted and never applied.

mod common;

use common::regions::*;
use redis::ConnectionLike;
use std::collections::BTreeMap;
use std::time::Duration;

/// What each region admitted, by key: the components every region must
/// end with (a region that admitted nothing has no component).
#[derive(Default)]
struct Ledger(BTreeMap<String, BTreeMap<String, (u64, u64)>>);

impl Ledger {
    fn add(&mut self, key: &str, region: &str, cost: u64) {
        let c = self
            .0
            .entry(key.to_string())
            .or_default()
            .entry(region.to_string())
            .or_default();
        c.0 += cost;
    }

    fn total(&self, key: &str) -> u64 {
        self.0[key].values().map(|(a, r)| a - r).sum()
    }

    fn keys(&self) -> Vec<String> {
        self.0.keys().cloned().collect()
    }
}

/// `calls` calls of cost 1..=3 on every key, round-robin over the regions.
fn traffic(
    world: &World,
    cons: &mut [Box<dyn ConnectionLike + Send>],
    ledger: &mut Ledger,
    keys: &[String],
    calls: u64,
) {
    for i in 0..calls {
        for (r, con) in cons.iter_mut().enumerate() {
            for k in keys {
                let cost = 1 + (i + r as u64) % 3;
                if take(&mut **con, k, 1_000_000_000, cost) {
                    ledger.add(k, world.regions[r].name, cost);
                }
            }
        }
    }
}

/// The documented time for the components to converge after a link heals:
/// the failed read ends within `timeout_ms`, the next try starts after
/// `retry_ms`, and each round of `read_count` entries (read, apply,
/// acknowledge) takes at most three command timeouts.
fn convergence_bound(backlog: u64) -> Duration {
    let rounds = backlog.div_ceil(500) + 1;
    Duration::from_millis(RETRY_MS + TIMEOUT_MS + rounds * 3 * TIMEOUT_MS)
}

/// The entries a partition left to sync: what its sides admitted.
fn backlog_of(admitted: &BTreeMap<&str, u64>) -> u64 {
    admitted.values().sum()
}

/// `rlctl regions status --json` in eu: the whole reply and its row of us.
fn status_of_us(world: &World) -> (serde_json::Value, serde_json::Value) {
    let out = common::rlctl(&world.configs[0], &["regions", "status", "--json"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let from_us = status["remotes"]
        .as_array()
        .expect("remotes")
        .iter()
        .find(|r| r["region"] == "us")
        .expect("us")
        .clone();
    (status, from_us)
}

#[test]
fn steady_traffic_converges_and_a_partition_stays_within_its_bound() {
    let world = World::start("regions-steady", false);
    let mut cons = world.cons();
    let keys: Vec<String> = (0..6).map(|t| format!("rl:{{t:{t}}}:month")).collect();
    if let Redis::Cluster(ap) = &world.regions[2].redis {
        let mut primaries: Vec<usize> = keys.iter().map(|k| ap.primary_for(k)).collect();
        primaries.sort();
        primaries.dedup();
        assert_eq!(primaries.len(), 3, "the keys live on every primary of ap");
    }
    let mut ledger = Ledger::default();
    traffic(&world, &mut cons, &mut ledger, &keys, 40);
    wait_converged(&mut cons, &keys, &ledger.0, Duration::from_secs(30));
    for (r, con) in cons.iter_mut().enumerate() {
        for k in &keys {
            let total: u64 = components(&mut **con, k).values().map(|(a, f)| a - f).sum();
            assert_eq!(total, ledger.total(k), "{k} in {}", world.regions[r].name);
        }
    }

    // A partition between eu and us (both directions); ap still sees both.
    let key = "rl:{t:p}:month".to_string();
    let limit = 300;
    let mut admitted = BTreeMap::new();
    let mut p = Ledger::default();
    for (r, con) in cons.iter_mut().enumerate() {
        for _ in 0..50 {
            assert!(take(&mut **con, &key, limit, 1));
            p.add(&key, world.regions[r].name, 1);
        }
    }
    wait_converged(
        &mut cons,
        std::slice::from_ref(&key),
        &p.0,
        Duration::from_secs(30),
    );
    world.link("eu", "us").cut();
    world.link("us", "eu").cut();
    for (r, name) in [(0, "eu"), (1, "us")] {
        let mut n = 0;
        for _ in 0..200 {
            if take(&mut *cons[r], &key, limit, 1) {
                n += 1;
                p.add(&key, name, 1);
            }
        }
        admitted.insert(name, n);
    }
    // Each side saw 150 before the partition and its own count since: each
    // admitted the 150 left, which proves the partition; the total exceeds
    // the limit by the traffic the other side admitted during it, the
    // documented bound (the most admitted outside any one region while it
    // could not see them).
    assert_eq!(admitted["eu"], 150, "eu admits up to the limit it sees");
    assert_eq!(
        admitted["us"], 150,
        "us did not see eu's calls: partitioned"
    );
    let over = p.total(&key) - limit;
    let bound = admitted["eu"].max(admitted["us"]);
    assert!(
        over <= bound,
        "over-admission {over} above the bound {bound}"
    );
    // ap saw both sides all along: once their partition traffic has
    // reached it (sync is asynchronous), it admits nothing more.
    wait_converged(
        &mut cons[2..],
        std::slice::from_ref(&key),
        &p.0,
        convergence_bound(backlog_of(&admitted)),
    );
    assert!(!take(&mut *cons[2], &key, limit, 1));

    world.link("eu", "us").heal();
    world.link("us", "eu").heal();
    wait_converged(
        &mut cons,
        std::slice::from_ref(&key),
        &p.0,
        convergence_bound(backlog_of(&admitted)),
    );
    for con in cons.iter_mut() {
        let c = components(&mut **con, &key);
        assert_eq!(c["eu"], (200, 0), "eu's 50 + 150, counted once");
        assert_eq!(c["us"], (200, 0));
        assert_eq!(c["ap"], (50, 0));
    }
}

#[test]
fn a_killed_worker_and_a_restarted_redis_lose_and_double_nothing() {
    let mut world = World::start("regions-kill", true);
    let keys: Vec<String> = (0..8).map(|t| format!("rl:{{t:{t}}}:day")).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ledgers: Vec<_> = world
        .regions
        .iter()
        .map(|region| {
            let (mut con, name, keys, stop) =
                (region.con(), region.name, keys.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut ledger = Ledger::default();
                for i in 0..20_000u64 {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    let k = &keys[(i as usize) % keys.len()];
                    if take(&mut *con, k, 1_000_000_000, 1 + i % 2) {
                        ledger.add(k, name, 1 + i % 2);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                ledger
            })
        })
        .collect();
    // eu's worker dies with SIGKILL while traffic flows, and comes back;
    // keys counted in eu only while it was down reach the others by the
    // scan of its start.
    std::thread::sleep(Duration::from_millis(700));
    world.workers[0].as_mut().expect("eu's worker").kill9();
    let mut down = Ledger::default();
    {
        let mut eu = world.regions[0].con();
        for t in 0..4 {
            let key = format!("rl:{{t:down{t}}}:day");
            assert!(take(&mut *eu, &key, 1000, 2));
            down.add(&key, "eu", 2);
        }
    }
    std::thread::sleep(Duration::from_millis(700));
    world.workers[0] = Some(world.worker(0));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut ledger = down;
    for l in ledgers {
        for (k, comps) in l.join().expect("traffic thread").0 {
            for (region, (added, _)) in comps {
                ledger.add(&k, &region, added);
            }
        }
    }
    let mut cons = world.cons();
    wait_converged(
        &mut cons,
        &ledger.keys(),
        &ledger.0,
        Duration::from_secs(30),
    );

    // A lost subscription: the changes made before eu's worker subscribes
    // again are found by the scan that follows every subscription.
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut *cons[0])
        .expect("CLIENT KILL TYPE pubsub");
    for t in 0..4 {
        let key = format!("rl:{{t:gap{t}}}:day");
        assert!(take(&mut *cons[0], &key, 1000, 1));
        ledger.add(&key, "eu", 1);
    }
    wait_converged(
        &mut cons,
        &ledger.keys(),
        &ledger.0,
        Duration::from_secs(30),
    );

    // Now with entries surely in flight: eu's writes paused, eu's worker
    // reads the last changes of 8 keys from us's stream (its first batch
    // of them at least) and cannot apply them: pending in its group. It
    // dies, eu resumes, and the new worker must apply them (no later entry
    // of these keys would hide a loss).
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(5000)
        .arg("WRITE")
        .query(&mut *cons[0])
        .expect("CLIENT PAUSE");
    for t in 0..8 {
        let key = format!("rl:{{t:last{t}}}:day");
        assert!(take(&mut *cons[1], &key, 1000, 3));
        ledger.add(&key, "us", 3);
    }
    common::wait_until(
        Duration::from_secs(4),
        "entries pending in eu's group",
        || {
            let p: (i64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
                .arg(STREAM)
                .arg("eu")
                .query(&mut *cons[1])
                .expect("XPENDING");
            p.0 > 0
        },
    );
    world.workers[0].as_mut().expect("eu's worker").kill9();
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut *cons[0])
        .expect("CLIENT UNPAUSE");
    world.workers[0] = Some(world.worker(0));
    let keys = ledger.keys();
    wait_converged(&mut cons, &keys, &ledger.0, Duration::from_secs(30));

    // us's Redis killed and restarted from its AOF: its own components,
    // what it merged, its stream and the other regions' groups on it are
    // all back; more traffic in every region then converges exactly.
    world.regions[1].server().restart();
    let mut cons = world.cons();
    wait_converged(&mut cons, &keys, &ledger.0, Duration::from_secs(30));
    let mut more = Ledger::default();
    traffic(&world, &mut cons, &mut more, &keys, 10);
    for (k, comps) in more.0 {
        for (region, (added, _)) in comps {
            ledger.add(&k, &region, added);
        }
    }
    wait_converged(&mut cons, &keys, &ledger.0, Duration::from_secs(30));
}

#[test]
fn bad_entries_are_refused_counted_and_never_applied() {
    let world = World::start("regions-bad", false);
    let mut cons = world.cons();
    let end = {
        let k = "rl:{t:probe}:month";
        assert!(take(&mut *cons[1], k, 1000, 1));
        let v: redis::Value = redis::cmd("RL.REGION")
            .arg("READ")
            .arg(k)
            .query(&mut *cons[1])
            .expect("READ");
        match v {
            redis::Value::Array(parts) => redis::from_redis_value::<i64>(&parts[0]).expect("end"),
            other => panic!("{other:?}"),
        }
    };
    let end = end.to_string();
    let entry = |key: &str, region: &str, added: &str, refunded: &str, period_end: &str| {
        vec![
            ("key", key.to_string()),
            ("period", "MONTH".to_string()),
            ("period_end_ms", period_end.to_string()),
            ("region", region.to_string()),
            ("added", added.to_string()),
            ("refunded", refunded.to_string()),
        ]
    };
    let bad: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("malformed", vec![("garbage", "x".to_string())]),
        ("malformed", entry("rl:{t:b1}:month", "us", "5", "9", &end)),
        ("malformed", entry("rl:{t:b2}:month", "us", "-5", "0", &end)),
        ("refused", entry("rl:{t:b3}:month", "zz", "5", "0", &end)),
        ("refused", entry("rl:{t:b4}:month", "eu", "5", "0", &end)),
        (
            "refused",
            entry("rl:{t:b5}:month", "us", "1152921504606846976", "0", &end),
        ),
        (
            "refused",
            entry("rl:{t:b6}:month", "us", "5", "0", "4102444800001"),
        ),
    ];
    let mut us = world.regions[1].con();
    for (_, fields) in &bad {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(STREAM).arg("*");
        for (f, v) in fields {
            cmd.arg(*f).arg(v);
        }
        let _: String = cmd.query(&mut *us).expect("XADD a bad entry");
    }
    // A good change after them still arrives.
    assert!(take(&mut *us, "rl:{t:good}:month", 1000, 7));
    let mut expected = Ledger::default();
    expected.add("rl:{t:good}:month", "us", 7);
    wait_converged(
        &mut cons,
        &["rl:{t:good}:month".to_string()],
        &expected.0,
        Duration::from_secs(30),
    );
    let count = |what: &str| bad.iter().filter(|(w, _)| *w == what).count() as i64;
    let (malformed, refused) = (count("malformed"), count("refused"));
    for r in [0, 2] {
        let name = world.regions[r].name;
        let mut counts = BTreeMap::new();
        common::wait_until(Duration::from_secs(10), "the counters", || {
            counts = world.counts(r);
            counts.get("us:malformed") == Some(&malformed)
                && counts.get("us:refused") == Some(&refused)
        });
        for b in 1..=6 {
            let key = format!("rl:{{t:b{b}}}:month");
            assert!(
                components(&mut *cons[r], &key).is_empty(),
                "{name}: {key} written from a bad entry"
            );
        }
        let pending: (i64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
            .arg(STREAM)
            .arg(name)
            .query(&mut *us)
            .expect("XPENDING");
        assert_eq!(pending.0, 0, "{name}: bad entries acknowledged");
    }
    // `rlctl regions status` shows the same counters and an empty backlog.
    let (status, from_us) = status_of_us(&world);
    assert_eq!(status["region"], "eu");
    assert_eq!(from_us["malformed"], malformed);
    assert_eq!(from_us["refused"], refused);
    assert_eq!(from_us["group"]["pending"], 0);
    assert!(status["published"].as_i64().is_some());
    // eu's own component is never changed by a remote entry.
    assert!(components(&mut *cons[0], "rl:{t:b4}:month").is_empty());
}

/// A stream entry id as two numbers, for comparing.
fn entry_id(v: &redis::Value) -> (u64, u64) {
    let text: String = redis::from_redis_value(v).expect("an entry id");
    let (ms, seq) = text.split_once('-').expect("ms-seq");
    (ms.parse().expect("ms"), seq.parse().expect("seq"))
}

#[test]
fn a_partition_longer_than_the_stream_is_resynced_exactly() {
    // Every stream holds about 20 entries (nodes of 5 on us, so the
    // approximate trim keeps close to that).
    let world = World::launch_with("regions-gap", false, true, "stream_maxlen = 20\n");
    let mut cons = world.cons();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("stream-node-max-entries")
        .arg(5)
        .query(&mut *cons[1])
        .expect("CONFIG SET stream-node-max-entries");
    let mut ledger = Ledger::default();
    assert!(take(&mut *cons[1], "rl:{t:before}:month", 1000, 1));
    ledger.add("rl:{t:before}:month", "us", 1);
    wait_converged(
        &mut cons,
        &ledger.keys(),
        &ledger.0,
        Duration::from_secs(30),
    );

    // eu cannot read us's stream while us changes 200 keys: ten times what
    // the stream holds.
    world.link("eu", "us").cut();
    let published = |w: &World| w.counts(1).get("published").copied().unwrap_or(0);
    let before = published(&world);
    let keys: Vec<String> = (0..200).map(|t| format!("rl:{{t:g{t}}}:month")).collect();
    for (i, k) in keys.iter().enumerate() {
        let cost = 1 + i as u64 % 3;
        assert!(take(&mut *cons[1], k, 1000, cost));
        ledger.add(k, "us", cost);
    }
    assert!(take(&mut *cons[0], "rl:{t:g0}:month", 1000, 5));
    ledger.add("rl:{t:g0}:month", "eu", 5);
    common::wait_until(Duration::from_secs(20), "us publishes its changes", || {
        published(&world) >= before + 200
    });
    // The entries eu had not read are gone from the stream.
    let info: std::collections::HashMap<String, redis::Value> = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(STREAM)
        .query(&mut *cons[1])
        .expect("XINFO STREAM");
    let first = match &info["first-entry"] {
        redis::Value::Array(e) => entry_id(&e[0]),
        other => panic!("first-entry: {other:?}"),
    };
    let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(STREAM)
        .query(&mut *cons[1])
        .expect("XINFO GROUPS");
    let eu = groups
        .iter()
        .find(|g| g["name"] == redis::Value::BulkString(b"eu".to_vec()))
        .expect("eu's group");
    assert!(
        entry_id(&eu["last-delivered-id"]) < first,
        "the stream was trimmed past what eu read"
    );

    // Healed: every component arrives, exactly, and the gap is counted once.
    world.link("eu", "us").heal();
    wait_converged(
        &mut cons,
        &ledger.keys(),
        &ledger.0,
        Duration::from_secs(30),
    );
    for k in &keys {
        let total: u64 = components(&mut *cons[0], k)
            .values()
            .map(|(a, r)| a - r)
            .sum();
        assert_eq!(total, ledger.total(k), "{k} in eu");
    }
    common::wait_until(Duration::from_secs(10), "eu counts the gap", || {
        world.counts(0).get("us:gaps") == Some(&1)
    });
    let (_, from_us) = status_of_us(&world);
    assert_eq!(from_us["gaps"], 1);
    assert!(
        from_us["resynced"].as_i64().expect("resynced") >= 201,
        "every key of us merged: {from_us}"
    );
}
