//! The service behind Redis Sentinel: a primary and a replica with the rl
//! module and one sentinel; the primary is killed, the sentinel promotes
//! the replica, and the service follows it (its counts, replicated, carry on).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn info_has(r: &Redis, section: &str, needle: &str) -> bool {
    r.client()
        .and_then(|mut c| redis::cmd("INFO").arg(section).query::<String>(&mut c))
        .is_ok_and(|i| i.contains(needle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_failover() {
    let dir = tempdir();
    let conf = config_dir(
        dir.path(),
        "s.yaml",
        "domain: s\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: year, requests_per_unit: 1000}\n",
    );
    let primary_dir = dir.path().join("primary");
    let replica_dir = dir.path().join("replica");
    std::fs::create_dir(&primary_dir).unwrap();
    std::fs::create_dir(&replica_dir).unwrap();
    let mut primary = Redis::start(&primary_dir);
    let replica = Redis::start_with(
        &replica_dir,
        free_port(),
        &["--replicaof", "127.0.0.1", &primary.port.to_string()],
    );
    wait_until("replica in sync", Duration::from_secs(20), || {
        info_has(&replica, "replication", "master_link_status:up")
    });
    let sport = free_port();
    let sconf = dir.path().join("sentinel.conf");
    std::fs::write(
        &sconf,
        format!(
            "port {sport}\nbind 127.0.0.1\ndir {}\nsentinel monitor m 127.0.0.1 {} 1\n\
             sentinel down-after-milliseconds m 500\nsentinel failover-timeout m 2000\n",
            dir.path().display(),
            primary.port
        ),
    )
    .unwrap();
    let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let mut cmd = Command::new(bin);
    cmd.arg(&sconf).arg("--sentinel");
    let _sentinel = Proc::spawn_logged(cmd, dir.path().join("sentinel.log"));
    let seed = format!("redis://127.0.0.1:{sport}/");
    let service = Service::start(
        dir.path(),
        &conf,
        1,
        &["--redis-sentinel", &seed, "--redis-sentinel-master", "m"],
    );
    let mut c = service.client().await;
    let r = || request("s", vec![desc(&[("tenant", "t")])]);
    let first = ask(&mut c, r()).await;
    assert_eq!(
        (first.overall_code, first.statuses[0].limit_remaining),
        (OK, 999)
    );
    wait_until("the count replicated", Duration::from_secs(10), || {
        info_has(&replica, "keyspace", "keys=1")
    });
    primary.proc.kill();
    let mut after = None;
    for _ in 0..300 {
        if let Ok(resp) = c.should_rate_limit(r()).await {
            after = Some(resp.into_inner());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = after.expect("no answer after the failover");
    assert_eq!(after.overall_code, OK);
    assert_eq!(
        after.statuses[0].limit_remaining, 998,
        "the count carried on"
    );
    assert!(info_has(&replica, "replication", "role:master"));
}
