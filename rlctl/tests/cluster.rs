//! A 3-primary cluster with replicas: the worker finds every primary,
//! `rlctl boxes` lists boxes across the cluster, and a primary failover
//! (SIGKILL, a replica promoted) loses no alert and sends none twice.

mod common;

use common::receivers::{Smtp, Webhooks};
use common::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Trips `key` through a fresh cluster client, retrying while its shard
/// fails over (bounded: 30 s).
fn trip_retrying(cluster: &Cluster, key: &str, level: u8) {
    let start = Instant::now();
    loop {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut con = cluster.client();
            redis::cmd("RL.BOX")
                .arg("TRIP")
                .arg(key)
                .arg(level)
                .arg(3600)
                .query::<Vec<i64>>(&mut con)
        }));
        if let Ok(Ok(_)) = r {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "RL.BOX TRIP {key} kept failing: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_cluster_is_followed_across_a_failover() {
    let mut cluster = Cluster::start(3, 1);
    let web = Webhooks::start();
    let smtp = Smtp::start();
    let dir = fresh_dir("cluster");
    let cfg = dir.join("rlctl.toml");
    // One seed is enough: the worker discovers the other nodes.
    std::fs::write(
        &cfg,
        config_text(&cluster.urls()[..1], true, &web.base, smtp.port, ""),
    )
    .unwrap();
    let env = secrets();
    let _worker = Worker::start(&dir, &cfg, &env, 3);

    // Keys on every primary (unowned: internal webhook only), and a tenant key.
    let mut by_primary: HashMap<usize, Vec<String>> = HashMap::new();
    for i in 0..60 {
        let key = format!("rl:{{ip:10.0.0.{i}}}:login");
        by_primary
            .entry(cluster.primary_for(&key))
            .or_default()
            .push(key);
    }
    assert_eq!(by_primary.len(), 3, "keys on the 3 primaries");
    let mut first: Vec<String> = by_primary
        .values()
        .flat_map(|v| v.iter().take(2).cloned())
        .collect();
    first.push("rl:{t:t-grow}:key:k-1".into());
    {
        let mut con = cluster.client();
        for k in &first {
            trip(&mut con, k, 2, 3600);
        }
    }
    let internal_keys = |web: &Webhooks| -> Vec<String> {
        let mut v: Vec<String> = web.internal_keys().into_iter().collect();
        v.sort();
        v
    };
    wait_until(Duration::from_secs(20), "alerts from every primary", || {
        internal_keys(&web).len() == first.len()
    });
    wait_until(Duration::from_secs(10), "the tenant's alerts", || {
        web.to("/tenant/t-grow").len() == 1 && smtp.all().len() == 1
    });

    let o = rlctl(&cfg, &["boxes", "--json"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let nodes: std::collections::HashSet<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node"].as_str().unwrap())
        .collect();
    assert_eq!(rows.as_array().unwrap().len(), first.len());
    assert_eq!(nodes.len(), 3, "boxes listed from the 3 primaries");

    // Fail over the tenant's shard: kill its primary; its replica takes over.
    let victim = cluster.primary_for("rl:{t:t-grow}:key:k-1");
    let victim_port = cluster.nodes[victim].port;
    let on_victim: Vec<String> = by_primary[&victim]
        .iter()
        .skip(2)
        .take(3)
        .cloned()
        .collect();
    cluster.nodes[victim].kill9();
    let mut second = on_victim.clone();
    second.push("rl:{t:t-grow}:key:k-2".into());
    for k in &second {
        trip_retrying(&cluster, k, 2); // accepted once the replica is promoted
    }
    let others: Vec<String> = by_primary
        .iter()
        .filter(|(p, _)| **p != victim)
        .flat_map(|(_, v)| v.iter().skip(2).take(1).cloned())
        .collect();
    {
        let mut con = cluster.client();
        for k in &others {
            trip(&mut con, k, 2, 3600);
        }
    }
    assert_ne!(
        cluster.nodes[cluster.primary_for("rl:{t:t-grow}:key:k-2")].port,
        victim_port,
        "promoted"
    );

    let mut all: Vec<String> = first
        .iter()
        .chain(&second)
        .chain(&others)
        .cloned()
        .collect();
    all.sort();
    wait_until(
        Duration::from_secs(40),
        "every alert after the failover",
        || internal_keys(&web) == all,
    );
    wait_until(
        Duration::from_secs(10),
        "the tenant's second alerts",
        || web.to("/tenant/t-grow").len() == 2 && smtp.all().len() == 2,
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(internal_keys(&web), all, "each alerted once, none lost");
    let tenant_keys: Vec<String> = web
        .to("/tenant/t-grow")
        .iter()
        .map(|r| r.json()["key_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(tenant_keys, ["k-1", "k-2"]);
}
