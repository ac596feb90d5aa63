//! [`Cluster`]: a Redis Cluster of local nodes, and `CLUSTER SLOTS`.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use redis::{RedisResult, Value};

use super::{
    free_cluster_port, info_field, poll_for, redis_cli_bin, value_i64, Flavor, Server, IO_TIMEOUT,
    POLL,
};

/// Longest wait for a cluster to become consistent after `--cluster create`.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// One slot range of `CLUSTER SLOTS`: (start, end, master port, sorted
/// replica ports).
pub type SlotRange = (i64, i64, i64, Vec<i64>);

/// A Redis Cluster of local nodes, created with `redis-cli --cluster create`.
/// Dropping it drops (kills) every node.
pub struct Cluster {
    /// All nodes, in the order given to `redis-cli --cluster create` (the
    /// first `masters` are normally the masters; use [`Cluster::masters`]).
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// A cluster of `masters` (>= 3) masters, each with
    /// `replicas_per_master` replicas, with the module loaded.
    pub fn start(masters: usize, replicas_per_master: usize) -> Cluster {
        Cluster::launch(Flavor::Module, masters, replicas_per_master, &[])
    }

    /// Like [`Cluster::start`], without the module.
    pub fn start_plain(masters: usize, replicas_per_master: usize) -> Cluster {
        Cluster::launch(Flavor::Plain, masters, replicas_per_master, &[])
    }

    /// The general form: nodes run with `--cluster-enabled yes
    /// --cluster-config-file nodes.conf --cluster-node-timeout 15000
    /// --repl-ping-replica-period 1` plus `extra` (which can override them);
    /// then `redis-cli --cluster create ... --cluster-yes`; then waits
    /// (bounded, [`CLUSTER_TIMEOUT`]) until every node reports
    /// `cluster_state:ok`, all nodes agree on a complete `CLUSTER SLOTS`
    /// (every master with all its replicas listed), and every replica's link
    /// to its master is up and synced.
    pub fn launch(
        flavor: Flavor,
        masters: usize,
        replicas_per_master: usize,
        extra: &[&str],
    ) -> Cluster {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "15000",
            // CLUSTER SLOTS lists a replica only once its replication offset
            // is non-zero, and an idle master moves it only by pinging its
            // replicas (every 10 s by default): 1 s cuts the wait for a
            // freshly created cluster with replicas from ~12 s to ~3 s.
            "--repl-ping-replica-period",
            "1",
        ];
        args.extend_from_slice(extra);
        let total = masters * (1 + replicas_per_master);
        let nodes: Vec<Server> = (0..total)
            .map(|_| Server::launch_on(free_cluster_port, &[], flavor, &args))
            .collect();
        let cluster = Cluster { nodes };
        cluster.create(replicas_per_master);
        cluster.wait_consistent(masters, replicas_per_master);
        cluster
    }

    /// Runs `redis-cli --cluster create` (bounded, 60 s).
    fn create(&self, replicas_per_master: usize) {
        let out_path = self.nodes[0].dir.join("cluster-create.out");
        let out = std::fs::File::create(&out_path).expect("create cluster-create.out");
        let mut cmd = Command::new(redis_cli_bin());
        cmd.arg("--cluster").arg("create");
        for n in &self.nodes {
            cmd.arg(n.addr());
        }
        cmd.arg("--cluster-replicas")
            .arg(replicas_per_master.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone file handle"))
            .stderr(out);
        let mut child = cmd.spawn().expect("spawn redis-cli --cluster create");
        let Some(status) = poll_for(Duration::from_secs(60), POLL, || {
            child.try_wait().expect("wait for redis-cli")
        }) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "redis-cli --cluster create timed out:\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default()
            );
        };
        let output = std::fs::read_to_string(&out_path).unwrap_or_default();
        assert!(
            status.success() && output.contains("[OK] All 16384 slots covered"),
            "redis-cli --cluster create failed ({status}):\n{output}"
        );
    }

    /// See [`Cluster::launch`].
    fn wait_consistent(&self, masters: usize, replicas_per_master: usize) {
        let mut why = String::new();
        let consistent = poll_for(CLUSTER_TIMEOUT, Duration::from_millis(100), || {
            match self.check_consistent(masters, replicas_per_master) {
                Ok(()) => Some(()),
                Err(e) => {
                    why = e;
                    None
                }
            }
        });
        if consistent.is_none() {
            panic!("cluster not consistent after {CLUSTER_TIMEOUT:?}: {why}");
        }
    }

    fn check_consistent(&self, masters: usize, replicas_per_master: usize) -> Result<(), String> {
        let mut first: Option<Vec<SlotRange>> = None;
        for node in &self.nodes {
            let mut con = node.client();
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut con)
                .map_err(|e| e.to_string())?;
            if info_field(&info, "cluster_state").as_deref() != Some("ok") {
                return Err(format!("{} cluster_state is not ok", node.addr()));
            }
            let slots = cluster_slots(&mut con).map_err(|e| e.to_string())?;
            let covered: i64 = slots.iter().map(|r| r.1 - r.0 + 1).sum();
            if covered != 16384 {
                return Err(format!("{} covers {covered} slots", node.addr()));
            }
            let masters_seen: HashSet<i64> = slots.iter().map(|r| r.2).collect();
            if masters_seen.len() != masters
                || slots.iter().any(|r| r.3.len() != replicas_per_master)
            {
                return Err(format!(
                    "{} CLUSTER SLOTS incomplete: {slots:?}",
                    node.addr()
                ));
            }
            match &first {
                None => first = Some(slots),
                Some(f) if *f != slots => {
                    return Err(format!(
                        "{} disagrees on CLUSTER SLOTS: {slots:?} vs {f:?}",
                        node.addr()
                    ))
                }
                Some(_) => {}
            }
            let repl: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut con)
                .map_err(|e| e.to_string())?;
            if info_field(&repl, "role").as_deref() == Some("slave")
                && (info_field(&repl, "master_link_status").as_deref() != Some("up")
                    || info_field(&repl, "master_sync_in_progress").as_deref() != Some("0"))
            {
                return Err(format!("replica {} not in sync yet", node.addr()));
            }
        }
        Ok(())
    }

    /// A cluster-aware client over all nodes (`ClusterClient::new`), with
    /// [`IO_TIMEOUT`] read/write timeouts.
    pub fn client(&self) -> redis::cluster::ClusterConnection {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.url()).collect();
        let con = redis::cluster::ClusterClient::new(urls)
            .expect("ClusterClient::new")
            .get_connection()
            .expect("cluster get_connection");
        con.set_read_timeout(Some(IO_TIMEOUT))
            .expect("set read timeout");
        con.set_write_timeout(Some(IO_TIMEOUT))
            .expect("set write timeout");
        con
    }

    /// `CLUSTER SLOTS` as seen by the first node, normalised and sorted.
    pub fn slots(&self) -> Vec<SlotRange> {
        cluster_slots(&mut self.nodes[0].client()).expect("CLUSTER SLOTS")
    }

    /// The node with the given port.
    pub fn node(&self, port: u16) -> &Server {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// The nodes that currently are masters (per `CLUSTER SLOTS`).
    pub fn masters(&self) -> Vec<&Server> {
        let ports: HashSet<i64> = self.slots().iter().map(|r| r.2).collect();
        self.nodes
            .iter()
            .filter(|n| ports.contains(&i64::from(n.port)))
            .collect()
    }

    /// The master node currently serving `key`'s hash slot.
    pub fn master_for_key(&self, key: &[u8]) -> &Server {
        let slot = i64::from(key_slot(key));
        let range = self
            .slots()
            .into_iter()
            .find(|r| r.0 <= slot && slot <= r.1)
            .unwrap_or_else(|| panic!("slot {slot} not served"));
        let port = u16::try_from(range.2).expect("port fits u16");
        self.node(port)
    }
}

/// The cluster hash slot of `key` (honours `{hash tags}`).
pub fn key_slot(key: &[u8]) -> u16 {
    redis::cluster_routing::get_slot(key)
}

/// `CLUSTER SLOTS` on `con`, normalised to sorted [`SlotRange`]s.
pub fn cluster_slots(con: &mut redis::Connection) -> RedisResult<Vec<SlotRange>> {
    let v: Value = redis::cmd("CLUSTER").arg("SLOTS").query(con)?;
    let Value::Array(ranges) = v else {
        panic!("CLUSTER SLOTS: unexpected reply {v:?}");
    };
    let mut out: Vec<SlotRange> = ranges
        .into_iter()
        .map(|r| {
            let Value::Array(items) = r else {
                panic!("CLUSTER SLOTS range: unexpected {r:?}");
            };
            let int = |v: &Value| value_i64(v);
            let port_of = |v: &Value| match v {
                Value::Array(node) => int(&node[1]),
                other => panic!("CLUSTER SLOTS node: unexpected {other:?}"),
            };
            let mut replicas: Vec<i64> = items[3..].iter().map(port_of).collect();
            replicas.sort_unstable();
            (int(&items[0]), int(&items[1]), port_of(&items[2]), replicas)
        })
        .collect();
    out.sort();
    Ok(out)
}
