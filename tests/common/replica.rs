//! Replication: replicas of a [`Server`], `WAIT`, and the AOF
//! configuration the replication and persistence tests share.

use std::time::Duration;

use super::{info_field, poll_for, tail, Server, POLL};

/// Longest wait for a replica to finish its initial sync.
pub const REPLICA_TIMEOUT: Duration = Duration::from_secs(15);

/// Starts a replica of `master` (same [`Flavor`]), and waits (bounded, 15 s)
/// until the replica reports `master_link_status:up` with no sync in progress
/// and the master lists it as `state=online`.
pub fn start_replica(master: &Server) -> Server {
    start_replica_with(&[], master)
}

/// [`start_replica`] with the replica run under `program_prefix` (e.g.
/// `&TimeShift::new().prefix()`, a replica whose clock differs).
pub fn start_replica_with(program_prefix: &[&str], master: &Server) -> Server {
    let port = master.port.to_string();
    let replica = Server::launch(
        program_prefix,
        master.flavor(),
        &["--replicaof", "127.0.0.1", &port],
    );
    let needle = format!("port={},state=online", replica.port);
    let in_sync = poll_for(REPLICA_TIMEOUT, POLL, || {
        let r = replica.info("replication");
        let synced = info_field(&r, "master_link_status").as_deref() == Some("up")
            && info_field(&r, "master_sync_in_progress").as_deref() == Some("0");
        (synced && master.info("replication").contains(&needle)).then_some(())
    });
    if in_sync.is_none() {
        panic!(
            "replica {} of {} not in sync after {REPLICA_TIMEOUT:?}\n\
             --- replica INFO replication ---\n{}\n--- replica log ---\n{}\n\
             --- master log ---\n{}",
            replica.addr(),
            master.addr(),
            replica.info("replication"),
            tail(&replica.log(), 30),
            tail(&master.log(), 30)
        );
    }
    replica
}

/// `WAIT n_replicas timeout_ms` on `master_conn`, asserting that at least
/// `n_replicas` replicas acknowledged. Returns the acknowledged count.
pub fn wait_replica(
    master_conn: &mut redis::Connection,
    n_replicas: usize,
    timeout_ms: u64,
) -> usize {
    let acked: usize = redis::cmd("WAIT")
        .arg(n_replicas)
        .arg(timeout_ms)
        .query(master_conn)
        .expect("WAIT");
    assert!(
        acked >= n_replicas,
        "WAIT {n_replicas} {timeout_ms}: only {acked} replica(s) acknowledged"
    );
    acked
}

/// Config arguments for an AOF written on every write, without an RDB
/// preamble (so the AOF holds the replicated commands themselves).
pub const AOF_EVERY_WRITE: &[&str] = &[
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--aof-use-rdb-preamble",
    "no",
];
