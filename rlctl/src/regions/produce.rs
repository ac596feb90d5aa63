//! The producer: publishes the local region's component of every quota key
//! that changes to the local stream.
//!
//! - One task per primary of the local region subscribes to the module's
//!   `rl.quota.region` keyevent channel on that node (a cluster's nodes
//!   each have their own pub/sub), then scans the node (`SCAN ... TYPE
//!   rl-record`) and hands every key over: changes made while nobody was
//!   subscribed (the worker down, a lost subscription) are found this way.
//!   A task whose subscription ends is started again (and scans again).
//! - One publisher takes the keys in batches (a key changed many times is
//!   read once per batch), reads each (`RL.REGION READ`), and appends the
//!   local component, its full value, to the stream (`XADD MAXLEN ~`).
//!   Sending a full value again is harmless: merges keep the maximum.
//!
//! The queue between them is bounded: a publisher that cannot append
//! (Redis unreachable) makes the subscribers wait; Redis disconnects a
//! subscriber that falls too far behind, which subscribes and scans again.

use super::config::RegionsConf;
use super::entry::{component_of, is_refusal, Change};
use super::{batch_timeout, Counter};
use crate::config::Config;
use crate::store::{self, Store, Target};
use futures_util::StreamExt;
use redis::Value;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The keyevent channel of the module's `rl.quota.region` event (db 0).
pub const CHANNEL: &str = "__keyevent@0__:rl.quota.region";

/// Runs the producer until aborted.
pub async fn run(conf: Arc<Config>, regions: Arc<RegionsConf>, target: Target, local: Store) {
    let batch = usize::try_from(regions.publish_batch).unwrap_or(usize::MAX);
    let (tx, rx) = mpsc::channel::<Vec<u8>>(batch.saturating_mul(4).max(1));
    let limit = batch_timeout(&target);
    let publisher = tokio::spawn(publish(regions, local, rx, batch, limit));
    let refresh = Duration::from_millis(conf.redis.topology_refresh_ms);
    let t = target.clone();
    store::follow_primaries(target, refresh, move |url| {
        follow_node(conf.clone(), t.clone(), url, tx.clone())
    })
    .await;
    publisher.abort();
}

/// Subscribes to one primary, hands over every key it holds, then the
/// keys of its events until the connection ends.
async fn follow_node(
    conf: Arc<Config>,
    target: Target,
    url: String,
    tx: mpsc::Sender<Vec<u8>>,
) -> Result<(), String> {
    let (mut con, mut pubsub) =
        store::subscribe_node(&target, &url, conf.redis.set_notify_config, &[CHANNEL]).await?;
    let stopped = |_| "the publisher stopped".to_string();
    let (mut cursor, mut keys) = (0, 0u64);
    loop {
        let (next, page) = store::scan_records(&mut con, cursor, conf.redis.scan_count).await?;
        for key in page {
            keys += 1;
            tx.send(key).await.map_err(stopped)?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    tracing::info!(node = %crate::text::redact_url(&url), keys, "reconciled");
    let mut messages = pubsub.on_message();
    while let Some(msg) = messages.next().await {
        tx.send(msg.get_payload_bytes().to_vec())
            .await
            .map_err(stopped)?;
    }
    Err("connection closed".into())
}

/// Takes up to `batch` distinct keys at a time and publishes them, trying
/// a batch again every `retry_ms` until it is appended.
async fn publish(
    regions: Arc<RegionsConf>,
    local: Store,
    mut rx: mpsc::Receiver<Vec<u8>>,
    batch: usize,
    limit: Duration,
) {
    let retry = Duration::from_millis(regions.retry_ms);
    let counter = Counter::new(local.clone(), &regions);
    while let Some(first) = rx.recv().await {
        let mut seen = HashSet::from([first.clone()]);
        let mut keys = vec![first];
        while keys.len() < batch {
            let Ok(key) = rx.try_recv() else { break };
            if seen.insert(key.clone()) {
                keys.push(key);
            }
        }
        loop {
            match publish_batch(&regions, &local, &keys, limit).await {
                Ok(n) => {
                    counter.add(&[("published", n)]).await;
                    break;
                }
                Err(e) => {
                    tracing::warn!(destination = "redis", keys = keys.len(), reason = %e, "cannot publish; trying again");
                    tokio::time::sleep(retry).await;
                }
            }
        }
    }
}

/// Reads `keys` and appends their local components; returns how many.
async fn publish_batch(
    regions: &RegionsConf,
    local: &Store,
    keys: &[Vec<u8>],
    limit: Duration,
) -> Result<i64, String> {
    let reads = futures_util::future::join_all(
        keys.iter()
            .map(|k| async move { local.query_key::<Value>(&Change::read_cmd(k), k).await }),
    );
    // Each command has its timeout; this bounds the batch whatever happens.
    let reads = tokio::time::timeout(limit, reads)
        .await
        .map_err(|_| "RL.REGION READ: the batch timed out".to_string())?;
    let mut pipe = redis::pipe();
    let mut n = 0;
    for (key, read) in keys.iter().zip(reads) {
        let shown = String::from_utf8_lossy(key);
        let reply = match read {
            Ok(r) => r,
            Err(e) if is_refusal(&e) => {
                tracing::warn!(key = %shown, reason = %e, "RL.REGION READ refused; key skipped");
                continue;
            }
            Err(e) => return Err(format!("RL.REGION READ {shown}: {e}")),
        };
        match component_of(key, &reply, &regions.local) {
            Ok(Some(change)) => {
                let xadd = pipe
                    .cmd("XADD")
                    .arg(&regions.stream)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(regions.stream_maxlen)
                    .arg("*");
                for (field, value) in change.fields() {
                    xadd.arg(field).arg(value);
                }
                xadd.ignore();
                n += 1;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(key = %shown, reason = %e, "key skipped"),
        }
    }
    if n > 0 {
        local
            .query_pipe::<()>(&pipe)
            .await
            .map_err(|e| format!("XADD {}: {e}", regions.stream))?;
    }
    Ok(n)
}
