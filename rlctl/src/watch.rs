//! `rlctl watch`: the alert worker.
//!
//! - A topology loop lists the primaries (the one server, or the masters of
//!   `CLUSTER NODES`) every `redis.topology_refresh_ms` and runs one node
//!   task per primary; a failed-over primary's task stops, the new
//!   primary's starts.
//! - A node task subscribes to `__keyevent@0__:rl.boxed` / `rl.released`
//!   on its primary, then reconciles it (`SCAN ... TYPE rl-record`, every
//!   key with an active box): events missed while the worker was down or
//!   between two subscriptions are found this way.
//! - One processor reads each box (`RL.BOX STATUS`), identifies the trip
//!   (README, "Deduplication"), records what is new in the audit trail and
//!   hands the deliveries not yet sent to the senders (`deliver`).
//! - The quota consumer (`quota`) reads the gateway's quota stream.
//!
//! Queues between them are bounded: a full queue makes the previous stage
//! wait; a subscriber that falls too far behind is disconnected by Redis
//! (`client-output-buffer-limit pubsub`) and resubscribes, which reconciles.

use crate::alert::{note_key, plan_box, BoxAlert, Operator};
use crate::audit::Audit;
use crate::config::Config;
use crate::deliver::Senders;
use crate::owner;
use crate::secrets::Secrets;
use crate::store::{self, now_ms, BoxStatus, Store, Target};
use futures_util::StreamExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Two reads of one box's end may differ by the time between them and the
/// clock of the machine: within this much they are the same trip.
const SAME_END_TOLERANCE_MS: i64 = 5000;
/// How long a trip record of a manual box is kept (30 days).
const MANUAL_KEEP_MS: i64 = 30 * 86_400_000;
/// How long a trip record outlives its box (1 day).
const KEEP_AFTER_BOX_MS: i64 = 86_400_000;

/// What a node task saw.
#[derive(Debug)]
enum Observation {
    /// A key that may hold a box (`rl.boxed`, or found by reconciliation);
    /// `tries` counts the failed attempts to process it.
    Boxed {
        key: String,
        source: &'static str,
        tries: u32,
    },
    /// `rl.released` on a key.
    Released { key: String },
}

/// The trip record: `<state_prefix>trip:<key>`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct TripRecord {
    trip_id: String,
    level: i64,
    offenses: i64,
    /// Estimated end (ms since the epoch), -1 for a manual box.
    end_ms: i64,
    /// Who tripped it by hand (`rlctl trip`), and why.
    #[serde(default)]
    operator: Option<Operator>,
}

/// The trip a box belongs to.
struct Trip {
    id: String,
    keep_ms: i64,
    new: bool,
    operator: Option<Operator>,
}

/// A note of `rlctl trip` older than this is not about the trip seen now.
const NOTE_MAX_AGE_MS: i64 = 60_000;

/// Runs the worker until SIGINT or SIGTERM.
pub async fn run(conf: Config, secrets: Secrets) -> Result<(), String> {
    let conf = Arc::new(conf);
    let target = Target::new(&conf, secrets.redis_password.clone());
    let store = target.store_with_retry().await;
    let audit = Audit::new(
        store.clone(),
        &conf.keys.audit_stream,
        conf.keys.audit_maxlen,
    );
    let secrets = Arc::new(secrets);
    let senders = Senders::start(conf.clone(), secrets.clone(), store.clone(), audit.clone())?;
    audit
        .record_or_log("watch_started", &[("pid", std::process::id().to_string())])
        .await;
    let (tx, rx) = mpsc::channel(conf.delivery.queue);
    let retries = tokio::spawn(crate::retry::poll(
        conf.clone(),
        secrets.clone(),
        store.clone(),
        senders.clone(),
    ));
    let processor = tokio::spawn(process(
        conf.clone(),
        secrets.clone(),
        store.clone(),
        audit.clone(),
        senders.clone(),
        rx,
        tx.clone(),
    ));
    let topology = tokio::spawn(follow_topology(conf.clone(), target.clone(), tx));
    let quota = if conf.quota.enabled && conf.tiers.values().any(|t| !t.quota.is_empty()) {
        Some(tokio::spawn(crate::quota::consume(
            conf.clone(),
            secrets,
            target,
            audit.clone(),
            senders.clone(),
        )))
    } else {
        None
    };
    wait_for_stop().await;
    tracing::info!("stopping: no new observations; waiting for deliveries in flight");
    topology.abort();
    retries.abort();
    if let Some(q) = quota {
        q.abort();
    }
    processor.abort();
    for _ in 0..100 {
        if senders.pending() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    audit
        .record_or_log(
            "watch_stopped",
            &[("pending", senders.pending().to_string())],
        )
        .await;
    Ok(())
}

/// Returns at SIGINT or SIGTERM.
pub(crate) async fn wait_for_stop() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(reason = %e, "no SIGTERM handler; stop with SIGINT");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

async fn follow_topology(conf: Arc<Config>, target: Target, tx: mpsc::Sender<Observation>) {
    let refresh = Duration::from_millis(conf.redis.topology_refresh_ms);
    let t = target.clone();
    store::follow_primaries(target, refresh, move |url| {
        follow_node(conf.clone(), t.clone(), url, tx.clone())
    })
    .await
}

/// Subscribes to one primary, reconciles it, then forwards its events
/// until the connection ends.
async fn follow_node(
    conf: Arc<Config>,
    target: Target,
    url: String,
    tx: mpsc::Sender<Observation>,
) -> Result<(), String> {
    let channels = ["__keyevent@0__:rl.boxed", "__keyevent@0__:rl.released"];
    let (mut con, mut pubsub) =
        store::subscribe_node(&target, &url, conf.redis.set_notify_config, &channels).await?;
    let boxes = store::scan_boxes(&mut con, conf.redis.scan_count).await?;
    tracing::info!(node = %crate::text::redact_url(&url), boxes = boxes.len(), "reconciled");
    for (key, _) in boxes {
        tx.send(Observation::Boxed {
            key,
            source: "reconcile",
            tries: 0,
        })
        .await
        .map_err(|_| "processor stopped")?;
    }
    let mut messages = pubsub.on_message();
    while let Some(msg) = messages.next().await {
        let Ok(key) = msg.get_payload::<String>() else {
            continue;
        };
        let obs = if msg.get_channel_name().ends_with("rl.released") {
            Observation::Released { key }
        } else {
            Observation::Boxed {
                key,
                source: "event",
                tries: 0,
            }
        };
        tx.send(obs).await.map_err(|_| "processor stopped")?;
    }
    Err("connection closed".into())
}

/// Observations whose processing failed (Redis unreachable: a shard
/// failing over) are tried again every second, this many times.
const RETRIES: u32 = 60;

async fn process(
    conf: Arc<Config>,
    secrets: Arc<Secrets>,
    store: Store,
    audit: Audit,
    senders: Senders,
    mut rx: mpsc::Receiver<Observation>,
    retry_tx: mpsc::Sender<Observation>,
) {
    // Observations waiting for a retry, at most `delivery.queue`: beyond,
    // they are dropped (logged); the next reconciliation finds them again.
    let waiting = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    while let Some(obs) = rx.recv().await {
        match obs {
            Observation::Boxed { key, source, tries } => {
                if let Err(e) =
                    on_box(&conf, &secrets, &store, &audit, &senders, &key, source).await
                {
                    if tries + 1 >= RETRIES || waiting.load(Ordering::SeqCst) >= conf.delivery.queue
                    {
                        tracing::error!(destination = "redis", key, reason = %e, tries, "observation given up");
                        continue;
                    }
                    tracing::warn!(destination = "redis", key, reason = %e, "observation failed; trying again in 1 s");
                    let tx = retry_tx.clone();
                    let waiting = waiting.clone();
                    waiting.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        waiting.fetch_sub(1, Ordering::SeqCst);
                        let _ = tx
                            .send(Observation::Boxed {
                                key,
                                source,
                                tries: tries + 1,
                            })
                            .await;
                    });
                }
            }
            Observation::Released { key } => {
                audit.record_or_log("release_seen", &[("key", key)]).await
            }
        }
    }
}

async fn on_box(
    conf: &Config,
    secrets: &Secrets,
    store: &Store,
    audit: &Audit,
    senders: &Senders,
    key: &str,
    source: &str,
) -> Result<(), String> {
    let status = store::box_status_routed(store, key).await?;
    if status.level == 0 {
        tracing::debug!(key, source, "no active box (already over)");
        return Ok(());
    }
    let owner = owner::lookup(conf, key);
    let trip = identify_trip(conf, store, key, &status).await?;
    let (trip_id, new) = (trip.id.clone(), trip.new);
    if new {
        tracing::info!(key, trip = %trip_id, level = status.level, source, "trip seen");
        let mut fields = vec![
            ("key", key.to_string()),
            ("trip_id", trip_id.clone()),
            ("level", status.level.to_string()),
            ("ttl_ms", status.ttl_ms.to_string()),
            ("offenses", status.offenses.to_string()),
            ("tier", owner.tier.clone()),
            ("source", source.to_string()),
        ];
        if let Some(t) = &owner.tenant_id {
            fields.push(("tenant", t.clone()));
        }
        if let Some(o) = &trip.operator {
            fields.push(("by", o.by.clone()));
            fields.push(("reason", o.reason.clone()));
        }
        audit.record_or_log("trip_seen", &fields).await;
    }
    let alert = BoxAlert {
        trip_id: trip_id.clone(),
        key: key.to_string(),
        status,
        owner,
        keep_ms: trip.keep_ms,
        operator: trip.operator,
    };
    let (deliveries, skipped) = plan_box(conf, secrets, &alert);
    if new {
        for (dest, why) in skipped {
            tracing::warn!(destination = dest.name(), key, reason = %why, "alert not sent");
            let fields = [
                ("alert_id", trip_id.clone()),
                ("key", key.to_string()),
                ("dest", dest.name().to_string()),
                ("result", "skipped".to_string()),
                ("reason", why),
            ];
            audit.record_or_log("delivery", &fields).await;
        }
    }
    let mut queued = Vec::new();
    for d in deliveries {
        let dest = d.dest;
        if senders.submit(d).await? {
            queued.push(dest.name());
        }
    }
    if !queued.is_empty() {
        let fields = [
            ("alert_id", trip_id),
            ("key", key.to_string()),
            ("level", status.level.to_string()),
            ("dests", queued.join(",")),
            ("resumed", (!new).to_string()),
        ];
        audit.record_or_log("alert", &fields).await;
    }
    Ok(())
}

/// The trip id of the box now on `key`: the recorded one when level,
/// offenses and end agree, else a new one (recorded). Returns
/// the trip.
async fn identify_trip(
    conf: &Config,
    store: &Store,
    key: &str,
    s: &BoxStatus,
) -> Result<Trip, String> {
    let now = now_ms();
    let end_ms = if s.ttl_ms < 0 { -1 } else { now + s.ttl_ms };
    let keep_ms = if s.ttl_ms < 0 {
        MANUAL_KEEP_MS
    } else {
        s.ttl_ms + KEEP_AFTER_BOX_MS
    };
    let record_key = format!("{}trip:{key}", conf.keys.state_prefix);
    let raw: Option<String> = store
        .query(redis::cmd("GET").arg(&record_key))
        .await
        .map_err(|e| format!("GET {record_key}: {e}"))?;
    if let Some(rec) = raw.and_then(|r| serde_json::from_str::<TripRecord>(&r).ok()) {
        let same_end = if end_ms < 0 || rec.end_ms < 0 {
            end_ms == rec.end_ms
        } else {
            (end_ms - rec.end_ms).abs() <= SAME_END_TOLERANCE_MS
        };
        if rec.level == s.level && rec.offenses == s.offenses && same_end {
            return Ok(Trip {
                id: rec.trip_id,
                keep_ms,
                new: false,
                operator: rec.operator,
            });
        }
    }
    // A new trip: made by `rlctl trip` when its note is fresh (taken once).
    let note_key = note_key(conf, key);
    let note: Option<String> = store
        .query(redis::cmd("GETDEL").arg(&note_key))
        .await
        .map_err(|e| format!("GETDEL {note_key}: {e}"))?;
    let operator = note
        .and_then(|n| serde_json::from_str::<Operator>(&n).ok())
        .filter(|o| (now - o.at_ms).abs() <= NOTE_MAX_AGE_MS);
    let trip_id = crate::alert::new_trip_id()?;
    let rec = TripRecord {
        trip_id: trip_id.clone(),
        level: s.level,
        offenses: s.offenses,
        end_ms,
        operator: operator.clone(),
    };
    let body = serde_json::to_string(&rec).map_err(|e| e.to_string())?;
    store
        .query::<()>(
            redis::cmd("SET")
                .arg(&record_key)
                .arg(body)
                .arg("PX")
                .arg(keep_ms),
        )
        .await
        .map_err(|e| format!("SET {record_key}: {e}"))?;
    Ok(Trip {
        id: trip_id,
        keep_ms,
        new: true,
        operator,
    })
}
