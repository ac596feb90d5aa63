//! End to end: the gateway on Redis Cluster (`redis.mode = "cluster"`,
//! gateway/README.md "Redis: one server, Sentinel, Cluster"). A real 3-primary
//! cluster with one replica each (`redis-cli --cluster create`), nginx with
//! a rule policy whose keys have two hash tags (the key's and the
//! tenant's), real HTTP. The gateway's CRC16 against `CLUSTER KEYSLOT`;
//! keys on every primary; a slot migrated under load (ASK while it
//! migrates, MOVED once it moved, both counted in /metrics); a
//! `CLUSTER FAILOVER` and a `kill -9` of a primary followed.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_ha.rs"]
mod gateway_ha;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Cluster, Flavor, Server};
use gateway::{agent, get};
use gateway_ha::{
    ask, ask_boxed, box_key, box_probe, bucket_key, bucket_probe, metric, policy, until_followed,
    wait_synced, BURST, FOLLOW,
};
use gateway_policy::{post_json, start};

/// What a bucket has left (RL.TAKE COST 0 on the primary that owns it).
fn bucket_left(cluster: &Cluster, k: &str) -> i64 {
    let mut con = cluster.master_for_key(bucket_key(k).as_bytes()).client();
    common::ints(&mut con, &bucket_probe(k))[2]
}

/// How many `CLUSTER SHARDS` a node has answered (INFO commandstats).
fn shards_calls(node: &Server) -> u64 {
    node.info("commandstats")
        .lines()
        .find(|l| l.starts_with("cmdstat_cluster|shards:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The policy's `redis` fields: cluster mode, every node a seed.
fn cluster_redis(cluster: &Cluster) -> String {
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("\"127.0.0.1:{}\"", n.port))
        .collect();
    format!("mode = \"cluster\", nodes = {{ {} }}", seeds.join(", "))
}

/// Keys whose buckets land on every primary, `per` per primary.
fn keys_on_every_primary(cluster: &Cluster, per: usize) -> Vec<(String, u16)> {
    let mut by_port: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for port in cluster.masters().iter().map(|m| m.port) {
        by_port.insert(port, Vec::new());
    }
    for i in 0..1000 {
        let k = format!("k{i}");
        let port = cluster.master_for_key(bucket_key(&k).as_bytes()).port;
        let v = by_port.get_mut(&port).expect("a primary");
        if v.len() < per {
            v.push(k);
        }
        if by_port.values().all(|v| v.len() >= per) {
            break;
        }
    }
    by_port
        .into_iter()
        .flat_map(|(p, ks)| ks.into_iter().map(move |k| (k, p)))
        .collect()
}

#[test]
fn the_gateways_crc16_is_redis_keyslot() {
    // the slots are the gateway's (no request reaches Redis): no module needed
    let cluster = Cluster::launch(Flavor::Plain, 3, 0, &[]);
    let gw = start(
        cluster.nodes[0].port,
        &[policy(&cluster_redis(&cluster))],
        &[],
    )
    .expect("start");
    let mut keys: Vec<String> = [
        "",
        "{",
        "}",
        "{}",
        "{}}",
        "{{}}",
        "{{a}}",
        "a{",
        "a}",
        "a{}",
        "a{}b",
        "}a{b}",
        "{a}",
        "{a}b",
        "x{a}{b}",
        "x{}{b}",
        "foo{bar}{zap}",
        "foo{{bar}}zap",
        "{user1000}.following",
        "{user1000}.followers",
        "foo{}{bar}",
        "{ }",
        "a{b{c}d}",
        "\u{e9}t\u{e9}",
        "tab\tkey",
        "new\nline",
        "\u{1f600}{\u{1f600}}",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for i in 0..2000 {
        keys.push(format!("key:{i}:{}", i * 7919 % 1000));
        keys.push(format!("rl:{{tenant:t{i}}}:bucket"));
    }
    keys.push("k".repeat(5000));
    let url = format!("http://127.0.0.1:{}/keyslot", gw.nginx.ports.upstream);
    let r = post_json(&agent(), &url, &[], serde_json::json!(keys));
    assert_eq!(r.status, 200, "{r:#?}");
    let ours: Vec<i64> = serde_json::from_str(&r.body).expect("slots");
    assert_eq!(ours.len(), keys.len());
    let mut con = cluster.nodes[0].client();
    for (k, ours) in keys.iter().zip(&ours) {
        let theirs: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(k.as_bytes())
            .query(&mut con)
            .expect("CLUSTER KEYSLOT");
        assert_eq!(*ours, theirs, "slot of {k:?}");
    }
}

#[test]
fn a_cluster_serves_every_primary_and_a_migrating_slot_under_load() {
    let cluster = Cluster::launch(Flavor::Module, 3, 1, &[]);
    let gw = start(
        cluster.nodes[0].port,
        &[policy(&cluster_redis(&cluster))],
        &[],
    )
    .expect("start");
    let started = Instant::now();
    let a = agent();
    // keys on every primary: each admits exactly its burst
    let keys = keys_on_every_primary(&cluster, 2);
    let ports: HashSet<u16> = keys.iter().map(|k| k.1).collect();
    assert_eq!(ports.len(), 3, "keys on every primary: {keys:?}");
    for (k, _) in &keys {
        let statuses: Vec<u16> = (0..BURST + 2).map(|_| ask(&a, &gw, k, "t1")).collect();
        let mut want = vec![200; BURST];
        want.extend([429, 429]);
        assert_eq!(statuses, want, "key {k}");
        assert_eq!(bucket_left(&cluster, k), 0, "{k}'s bucket on its primary");
    }

    // a slot migrated while 4 threads send requests: the key `moving`
    // (2 of its points spent) goes from its primary to another one
    let moving = "m1";
    let src = cluster.master_for_key(bucket_key(moving).as_bytes());
    let dst = cluster
        .masters()
        .into_iter()
        .find(|m| m.port != src.port)
        .expect("another primary");
    for _ in 0..2 {
        assert_eq!(ask(&a, &gw, moving, "t2"), 200);
    }
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(bucket_key(moving))
        .query(&mut src.client())
        .expect("KEYSLOT");
    let id = |s: &Server| -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut s.client())
            .expect("MYID")
    };
    let (src_id, dst_id) = (id(src), id(dst));
    let stop = Arc::new(AtomicBool::new(false));
    let statuses: Arc<Mutex<BTreeMap<String, Vec<u16>>>> = Arc::default();
    let load: Vec<_> = (0..4)
        .map(|i| {
            let (stop, statuses, url) = (stop.clone(), statuses.clone(), gw.url(0));
            std::thread::spawn(move || {
                let a = agent();
                for n in 0..2000 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let k = if n % 2 == 0 {
                        "m1".to_string()
                    } else {
                        format!("l{i}-{}", n % 7)
                    };
                    let r = get(
                        &a,
                        &format!("{url}/v1/work"),
                        &[("X-Key", &k), ("X-Tenant", "t2")],
                    );
                    statuses
                        .lock()
                        .unwrap()
                        .entry(k)
                        .or_default()
                        .push(r.status);
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        })
        .collect();
    let setslot = |s: &Server, args: &[&str]| {
        let mut c = redis::cmd("CLUSTER");
        c.arg("SETSLOT").arg(slot);
        for x in args {
            c.arg(*x);
        }
        let _: () = c.query(&mut s.client()).expect("CLUSTER SETSLOT");
    };
    setslot(dst, &["IMPORTING", &src_id]);
    setslot(src, &["MIGRATING", &dst_id]);
    let _: redis::Value = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(dst.port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(bucket_key(moving))
        .query(&mut src.client())
        .expect("MIGRATE");
    // while the slot migrates, the moved key is answered through ASK
    common::wait_until(Duration::from_secs(10), "ASK followed", || {
        ask(&a, &gw, moving, "t2");
        metric(&gw, "rl_gateway_redis_redirects_total{kind=\"ask\"}") > 0
    });
    // the new owner first, then the old one, then the others
    setslot(dst, &["NODE", &dst_id]);
    setslot(src, &["NODE", &dst_id]);
    for s in cluster.masters() {
        if s.port != src.port && s.port != dst.port {
            setslot(s, &["NODE", &dst_id]);
        }
    }
    common::wait_until(Duration::from_secs(10), "MOVED followed", || {
        ask(&a, &gw, moving, "t2");
        metric(&gw, "rl_gateway_redis_redirects_total{kind=\"moved\"}") > 0
    });
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    for t in load {
        t.join().expect("load thread");
    }
    let statuses = statuses.lock().unwrap();
    for (k, s) in statuses.iter() {
        let bad: Vec<_> = s.iter().filter(|x| **x != 200 && **x != 429).collect();
        assert!(
            bad.is_empty(),
            "{k}: only 200 and 429 while the slot moves: {bad:?}"
        );
        let admitted = s.iter().filter(|x| **x == 200).count();
        let bound = if k == moving { BURST - 2 } else { BURST };
        assert!(
            admitted <= bound,
            "{k}: {admitted} admitted > its bucket's {bound}"
        );
    }
    assert_eq!(
        cluster.master_for_key(bucket_key(moving).as_bytes()).port,
        dst.port
    );
    assert_eq!(
        bucket_left(&cluster, moving),
        0,
        "the moved bucket kept its count"
    );
    // no thundering herd: the MOVED storm of 4 threads and 2 workers cost
    // at most one map refresh per refresh_ms (200) per nginx, plus slack
    let refreshes: u64 = cluster.nodes.iter().map(shards_calls).sum();
    let bound = started.elapsed().as_millis() as u64 / 200 + 3;
    assert!(
        (1..=bound).contains(&refreshes),
        "{refreshes} CLUSTER SHARDS calls in {:?} (bound {bound})",
        started.elapsed()
    );
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

#[test]
fn a_cluster_failover_and_a_killed_primary_are_followed() {
    let cluster = Cluster::launch(Flavor::Module, 3, 1, &["--cluster-node-timeout", "1500"]);
    let gw = start(
        cluster.nodes[0].port,
        &[policy(&cluster_redis(&cluster))],
        &[],
    )
    .expect("start");
    let a = agent();
    let k = "f1";
    assert_eq!(ask(&a, &gw, k, "t3"), 200);
    // the box: one admitted, one refused, an early retry trips a one-hour box
    assert_eq!(ask_boxed(&a, &gw, "b1"), 200);
    assert_eq!(ask_boxed(&a, &gw, "b1"), 429);
    // the refusal is no strike; the retry before its Retry-After is, and boxes
    assert_eq!(ask_boxed(&a, &gw, "b1"), 429);
    let mut con = cluster.master_for_key(box_key("b1").as_bytes()).client();
    assert_eq!(common::ints(&mut con, &box_probe("b1"))[0], -1, "boxed");
    let mut admitted = 1;
    let mut unanswered = 0;

    // CLUSTER FAILOVER on the replica of k's primary: coordinated, no write lost
    let primary = cluster.master_for_key(bucket_key(k).as_bytes());
    let replica_port = replica_of(&cluster, primary);
    let replica = cluster.node(replica_port);
    wait_synced(primary, replica);
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut replica.client())
        .expect("FAILOVER");
    common::wait_until(Duration::from_secs(15), "the replica is primary", || {
        cluster.master_for_key(bucket_key(k).as_bytes()).port == replica_port
    });
    let seen = until_followed(&a, &gw, k);
    admitted += seen.iter().filter(|s| **s == 200).count();
    unanswered += seen.iter().filter(|s| **s == 503).count();
    assert!(seen.iter().all(|s| [200, 503].contains(s)), "{seen:?}");

    // kill -9 of the new primary: its replica (the old primary) takes over
    let old = primary.port;
    wait_synced(replica, cluster.node(old));
    replica.kill9();
    common::wait_until(FOLLOW, "the old primary is primary again", || {
        let mut con = cluster.node(old).client();
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut con)
            .unwrap_or_default();
        info.contains("role:master")
            && redis::cmd("CLUSTER")
                .arg("INFO")
                .query::<String>(&mut con)
                .is_ok_and(|i| i.contains("cluster_state:ok"))
    });
    let seen = until_followed(&a, &gw, k);
    admitted += seen.iter().filter(|s| **s == 200).count();
    unanswered += seen.iter().filter(|s| **s == 503).count();
    assert!(seen.iter().all(|s| [200, 503].contains(s)), "{seen:?}");
    // the rest of k's burst, then refused: nothing admitted beyond it
    for _ in 0..BURST + 2 {
        if ask(&a, &gw, k, "t3") == 200 {
            admitted += 1;
        }
    }
    // A 503 is a call the gateway gave up on: Redis may still have taken
    // its point (a timeout after the write), so it may count as spent.
    assert!(
        admitted <= BURST && admitted + unanswered >= BURST,
        "the burst across two failovers: {admitted} admitted, {unanswered} unanswered, burst {BURST}"
    );
    let mut con = live_master_for(&cluster, &bucket_key(k), replica_port);
    assert_eq!(common::ints(&mut con, &bucket_probe(k))[2], 0);
    // the box survived both failovers
    let mut con = live_master_for(&cluster, &box_key("b1"), replica_port);
    assert_eq!(common::ints(&mut con, &box_probe("b1"))[0], -1);
    assert_eq!(ask_boxed(&a, &gw, "b1"), 429, "still boxed");
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

/// The port of the replica of `primary` (per its INFO replication).
fn replica_of(cluster: &Cluster, primary: &Server) -> u16 {
    let info = primary.info("replication");
    let line = info
        .lines()
        .find(|l| l.starts_with("slave0:"))
        .unwrap_or_else(|| panic!("no replica: {info}"));
    let port = line
        .split(',')
        .find_map(|f| f.strip_prefix("port="))
        .expect("port=");
    let port: u16 = port.parse().expect("port");
    cluster.node(port).port
}

/// A connection to the primary of `key`, asking a live node (not `dead`).
fn live_master_for(cluster: &Cluster, key: &str, dead: u16) -> redis::Connection {
    let live = cluster
        .nodes
        .iter()
        .find(|n| n.port != dead)
        .expect("a live node");
    let slots = common::cluster_slots(&mut live.client()).expect("CLUSTER SLOTS");
    let slot = i64::from(common::key_slot(key.as_bytes()));
    let r = slots
        .iter()
        .find(|r| r.0 <= slot && slot <= r.1)
        .expect("slot served");
    cluster.node(u16::try_from(r.2).expect("port")).client()
}

/// The keys of `pattern` on every primary, with the port of the primary
/// that holds each.
fn keys_held(cluster: &Cluster, pattern: &str) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for m in cluster.masters() {
        let mut con = m.client();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut con)
            .expect("KEYS");
        out.extend(keys.into_iter().map(|k| (k, m.port)));
    }
    out
}

#[test]
fn a_shipped_example_takes_cluster_mode_from_the_environment() {
    let cluster = Cluster::start(3, 0);
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let seeds = seeds.join(",");
    // RL_REDIS_PORT names no server: only the seeds of RL_REDIS_NODES lead
    // to the cluster
    let gw = gateway_policy::start_with_env(
        1,
        &[gateway_policy::example("tiered")],
        &[],
        &[("RL_REDIS_MODE", "cluster"), ("RL_REDIS_NODES", &seeds)],
    )
    .expect("start");
    let a = agent();
    let url = format!("{}/v1/things", gw.url(0));
    for i in 0..2 {
        let r = get(&a, &url, &[("X-Api-Key", "demo-free-key")]);
        assert_eq!(r.status, 200, "request {i}: {r:#?}");
        let policy = r.must("RateLimit-Policy");
        assert!(policy.contains("\"free-monthly\""), "{policy}");
        assert!(!policy.contains("degraded"), "decided in Redis: {policy}");
    }
    // the monthly quota counted both requests, on the primary that owns
    // its slot
    let key = "tq:{tenant:app-1}:tier-monthly";
    let held = keys_held(&cluster, "tq:*");
    let port = cluster.master_for_key(key.as_bytes()).port;
    assert!(held.contains(&(key.to_string(), port)), "{held:?}");
    let mut con = cluster.master_for_key(key.as_bytes()).client();
    let left = common::ints(&mut con, &format!("RL.QUOTA {key} 10000 MONTH COST 0"))[2];
    assert_eq!(left, 10000 - 2, "{key}");
}
