//! End to end: the gateway on Redis Sentinel (`redis.mode = "sentinel"`,
//! gateway/README.md "Redis: one server, Sentinel, Cluster"): a primary and a
//! replica with the module, three real sentinels (`redis-server
//! sentinel.conf --sentinel`), nginx with a rule policy that fails closed.
//! `SENTINEL FAILOVER`, then `kill -9` of the new primary: the gateway
//! follows each new primary, a key's burst is admitted exactly once across
//! both, and a box survives.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_ha.rs"]
mod gateway_ha;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{free_port, fresh_dir, redis_server_bin, start_replica, wait_until, Server};
use gateway::agent;
use gateway_ha::{
    ask, ask_boxed, box_probe, bucket_probe, policy, until_followed, wait_synced, BURST, FOLLOW,
};
use gateway_policy::start;

/// The name the sentinels monitor.
const MASTER: &str = "mymaster";

/// A running sentinel; killed on drop.
struct Sentinel {
    port: u16,
    child: Child,
}

impl Sentinel {
    /// A sentinel monitoring `primary` (quorum 2, down after 1 s).
    fn start(primary: &Server) -> Sentinel {
        let dir = fresh_dir("sentinel");
        let port = free_port();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nlogfile {}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {} 2\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 10000\n",
                dir.display(),
                dir.join("sentinel.log").display(),
                primary.port
            ),
        )
        .expect("sentinel.conf");
        let child = Command::new(redis_server_bin())
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sentinel");
        let s = Sentinel { port, child };
        wait_until(Duration::from_secs(10), "sentinel up", || {
            s.client().is_ok()
        });
        s
    }

    fn client(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.port))?
            .get_connection_with_timeout(Duration::from_secs(2))
    }

    /// The primary's port as this sentinel sees it.
    fn primary_port(&self) -> Option<u16> {
        let mut con = self.client().ok()?;
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER)
            .query(&mut con)
            .ok()?;
        addr.get(1)?.parse().ok()
    }

    /// How many replicas this sentinel knows.
    fn replicas(&self) -> usize {
        let Ok(mut con) = self.client() else { return 0 };
        redis::cmd("SENTINEL")
            .arg("replicas")
            .arg(MASTER)
            .query::<Vec<redis::Value>>(&mut con)
            .map(|v| v.len())
            .unwrap_or(0)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until every sentinel names `port` as the primary and `server`
/// says it is one.
fn wait_primary(sentinels: &[Sentinel], server: &Server) {
    wait_until(FOLLOW, "sentinels agree on the new primary", || {
        sentinels
            .iter()
            .all(|s| s.primary_port() == Some(server.port))
            && server.info_get("replication", "role").as_deref() == Some("master")
    });
}

#[test]
fn sentinel_failovers_are_followed_and_nothing_is_over_admitted() {
    let first = Server::start(&[]);
    let second = start_replica(&first);
    let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(&first)).collect();
    wait_until(
        Duration::from_secs(20),
        "sentinels know the replica",
        || sentinels.iter().all(|s| s.replicas() == 1),
    );
    let list: Vec<String> = sentinels
        .iter()
        .map(|s| format!("\"127.0.0.1:{}\"", s.port))
        .collect();
    let redis = format!(
        "mode = \"sentinel\", master_name = \"{MASTER}\", sentinels = {{ {} }}",
        list.join(", ")
    );
    let gw = start(first.port, &[policy(&redis)], &[]).expect("start");
    let a = agent();
    let k = "s1";
    for _ in 0..2 {
        assert_eq!(ask(&a, &gw, k, "t"), 200);
    }
    assert_eq!(ask_boxed(&a, &gw, "b1"), 200);
    assert_eq!(ask_boxed(&a, &gw, "b1"), 429);
    // the refusal is no strike; the retry before its Retry-After is, and boxes
    assert_eq!(ask_boxed(&a, &gw, "b1"), 429);
    assert_eq!(common::ints(&mut first.client(), &box_probe("b1"))[0], -1);

    // SENTINEL FAILOVER: the replica is promoted, the old primary demoted.
    // Writes the old primary takes between the two are lost (asynchronous
    // replication): the key under test waits (a probe key shows the
    // gateway following) until the old primary is a replica
    wait_synced(&first, &second);
    let _: () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(MASTER)
        .query(&mut sentinels[0].client().expect("sentinel"))
        .expect("SENTINEL FAILOVER");
    wait_primary(&sentinels, &second);
    wait_until(FOLLOW, "the old primary is a replica", || {
        first.info_get("replication", "role").as_deref() == Some("slave")
    });
    let seen = until_followed(&a, &gw, "probe-1");
    assert!(seen.iter().all(|s| [200, 503].contains(s)), "{seen:?}");
    let mut admitted = 2;
    for _ in 0..2 {
        assert_eq!(ask(&a, &gw, k, "t"), 200, "the new primary kept the bucket");
        admitted += 1;
    }
    assert_eq!(common::ints(&mut second.client(), &bucket_probe(k))[2], 1);

    // kill -9 of the new primary: the sentinels promote the old one
    wait_until(
        Duration::from_secs(10),
        "the old primary replicates",
        || {
            first
                .info_get("replication", "master_link_status")
                .as_deref()
                == Some("up")
        },
    );
    wait_synced(&second, &first);
    second.kill9();
    wait_primary(&sentinels, &first);
    let seen = until_followed(&a, &gw, "probe-2");
    assert!(seen.iter().all(|s| [200, 503].contains(s)), "{seen:?}");
    for _ in 0..BURST {
        if ask(&a, &gw, k, "t") == 200 {
            admitted += 1;
        }
    }
    assert_eq!(
        admitted, BURST,
        "the burst admitted exactly once across two failovers"
    );
    assert_eq!(common::ints(&mut first.client(), &bucket_probe(k))[2], 0);
    assert_eq!(
        common::ints(&mut first.client(), &box_probe("b1"))[0],
        -1,
        "the box survived"
    );
    assert_eq!(ask_boxed(&a, &gw, "b1"), 429, "still boxed");
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}
