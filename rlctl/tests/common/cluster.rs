//! A Redis Cluster of servers with the module.

use super::{wait_until, Server};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A cluster of `masters` primaries with `replicas` replicas each.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// Starts the nodes, creates the cluster, waits until every node agrees.
    pub fn start(masters: usize, replicas: usize) -> Cluster {
        Cluster::start_with(masters, replicas, &[])
    }

    /// [`Cluster::start`] with the module's load arguments `module_args`.
    pub fn start_with(masters: usize, replicas: usize, module_args: &[&str]) -> Cluster {
        let options = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
            // A replica may take over whatever the age of its data (a
            // loaded machine can delay its exchanges with the primary).
            "--cluster-replica-validity-factor",
            "0",
        ];
        let args: Vec<&str> = module_args.iter().chain(&options).copied().collect();
        let nodes: Vec<Server> = (0..masters * (1 + replicas))
            .map(|_| Server::launch(true, &args))
            .collect();
        let out = Command::new(super::redis_cli_bin())
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        wait_until(Duration::from_secs(60), "a consistent cluster", || {
            cluster.consistent(masters * (1 + replicas))
        });
        wait_until(Duration::from_secs(60), "every replica in sync", || {
            cluster.replicas_in_sync() == masters * replicas
        });
        cluster
    }

    fn consistent(&self, total: usize) -> bool {
        let mut views = Vec::new();
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            let Some(mut c) = n.try_client() else {
                return false;
            };
            let Ok(info) = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c) else {
                return false;
            };
            if !info.contains("cluster_state:ok")
                || !info.contains(&format!("cluster_known_nodes:{total}"))
            {
                return false;
            }
            let Ok(nodes) = redis::cmd("CLUSTER").arg("NODES").query::<String>(&mut c) else {
                return false;
            };
            let mut masters: Vec<String> = nodes
                .lines()
                .filter(|l| {
                    l.contains("master") && !l.contains("fail") && l.split_whitespace().count() > 8
                })
                .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
                .collect();
            masters.sort();
            views.push(masters);
        }
        views.windows(2).all(|w| w[0] == w[1])
    }

    /// Replicas whose link to their primary is up.
    fn replicas_in_sync(&self) -> usize {
        self.live()
            .filter(|n| {
                let Some(mut c) = n.try_client() else {
                    return false;
                };
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut c)
                    .unwrap_or_default();
                info.contains("role:slave") && info.contains("master_link_status:up")
            })
            .count()
    }

    /// The nodes still running.
    pub fn live(&self) -> impl Iterator<Item = &Server> {
        self.nodes.iter().filter(|n| n.child.is_some())
    }

    /// Seed URLs (every node).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// A cluster-aware client over the live nodes.
    pub fn client(&self) -> redis::cluster::ClusterConnection {
        let urls: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(Server::url)
            .collect();
        redis::cluster::ClusterClientBuilder::new(urls)
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(5))
            .build()
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }

    /// The node serving `key`'s slot as a primary, by `CLUSTER NODES` of a live node.
    pub fn primary_for(&self, key: &str) -> usize {
        let slot = redis::cluster_routing::get_slot(key.as_bytes());
        let live = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live node");
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut live.client())
            .expect("CLUSTER NODES");
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 9 || !f[2].contains("master") || f[2].contains("fail") {
                continue;
            }
            let serves = f[8..].iter().any(|r| {
                let mut it = r.split('-');
                let lo: u16 = it.next().and_then(|x| x.parse().ok()).unwrap_or(u16::MAX);
                let hi: u16 = it.next().and_then(|x| x.parse().ok()).unwrap_or(lo);
                (lo..=hi).contains(&slot)
            });
            if serves {
                let port: u16 = f[1]
                    .split('@')
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse().ok())
                    .expect("port");
                return self
                    .nodes
                    .iter()
                    .position(|n| n.port == port)
                    .expect("known node");
            }
        }
        panic!("no primary serves slot {slot}");
    }
}
