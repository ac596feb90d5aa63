//! Pending deliveries, kept in Redis until they end: a sorted set of due
//! times (`<state_prefix>retries`, one member per delivery id
//! `<alert id>/<destination>`) and, per delivery, what it is about
//! (`<state_prefix>retry:<delivery id>`: the alert's source, never a
//! secret; its payload is made again from it, with the secrets of the
//! running worker). A failed attempt moves the due time by a capped
//! exponential backoff; the poller queues what is due, so a delivery
//! survives a restart and is retried for `delivery.retry_for_ms`. Past
//! that it is given up (`expired`) and an `rl.delivery_expired` alert goes
//! to the internal webhook.

use crate::alert::{self, plan_box, plan_quota, BoxAlert, Delivery, Operator, QuotaAlert};
use crate::config::{Config, DeliveryConf, Dest};
use crate::deliver::Senders;
use crate::owner;
use crate::secrets::Secrets;
use crate::store::{now_ms, BoxStatus, Store};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// What an alert is about: enough to make its deliveries again.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// A box trip (the owner is looked up again from the key).
    Box {
        trip_id: String,
        key: String,
        status: BoxStatus,
        keep_ms: i64,
        operator: Option<Operator>,
    },
    /// A quota threshold.
    Quota {
        alert_id: String,
        tenant: String,
        quota: String,
        period: String,
        used: u64,
        limit: u64,
        threshold: u32,
        keep_ms: i64,
    },
    /// A delivery given up after `delivery.retry_for_ms` (to the internal
    /// webhook; its own expiry raises nothing more).
    Expired {
        alert_id: String,
        dest: Dest,
        subject: (String, String),
        target: String,
        attempts: u32,
        first_ms: i64,
        reason: String,
    },
}

impl Source {
    /// The source of a box alert.
    pub fn of_box(a: &BoxAlert) -> Source {
        Source::Box {
            trip_id: a.trip_id.clone(),
            key: a.key.clone(),
            status: a.status,
            keep_ms: a.keep_ms,
            operator: a.operator.clone(),
        }
    }

    /// The source of a quota alert.
    pub fn of_quota(q: &QuotaAlert, keep_ms: i64) -> Source {
        Source::Quota {
            alert_id: q.alert_id.clone(),
            tenant: q.owner.tenant_id.clone().unwrap_or_default(),
            quota: q.quota.clone(),
            period: q.period.clone(),
            used: q.used,
            limit: q.limit,
            threshold: q.threshold,
            keep_ms,
        }
    }
}

/// The delivery of `source` to `dest`, made with the current configuration
/// and secrets; an error says why there is none now.
pub fn rebuild(
    conf: &Config,
    secrets: &Secrets,
    source: &Source,
    dest: Dest,
) -> Result<Delivery, String> {
    let (deliveries, skipped) = match source {
        Source::Box {
            trip_id,
            key,
            status,
            keep_ms,
            operator,
        } => plan_box(
            conf,
            secrets,
            &BoxAlert {
                trip_id: trip_id.clone(),
                key: key.clone(),
                status: *status,
                owner: owner::lookup(conf, key),
                keep_ms: *keep_ms,
                operator: operator.clone(),
            },
        ),
        Source::Quota {
            alert_id,
            tenant,
            quota,
            period,
            used,
            limit,
            threshold,
            keep_ms,
        } => plan_quota(
            conf,
            secrets,
            &QuotaAlert {
                alert_id: alert_id.clone(),
                owner: owner::of_tenant(conf, tenant),
                quota: quota.clone(),
                period: period.clone(),
                used: *used,
                limit: *limit,
                threshold: *threshold,
            },
            *keep_ms,
        ),
        Source::Expired { .. } => (vec![expired_alert(conf, secrets, source)?], Vec::new()),
    };
    if let Some(d) = deliveries.into_iter().find(|d| d.dest == dest) {
        return Ok(d);
    }
    Err(skipped.into_iter().find(|(d, _)| *d == dest).map_or(
        "the destination is no longer configured".into(),
        |(_, why)| why,
    ))
}

/// The internal alert saying that a delivery was given up.
fn expired_alert(conf: &Config, secrets: &Secrets, source: &Source) -> Result<Delivery, String> {
    let Source::Expired {
        alert_id,
        dest,
        subject,
        target,
        attempts,
        first_ms,
        reason,
    } = source
    else {
        return Err("not an expiry".into());
    };
    let body = json!({
        "type": "rl.delivery_expired",
        "alert_id": alert_id,
        "dest": dest.name(),
        subject.0.as_str(): subject.1,
        "target": target,
        "attempts": attempts,
        "first_attempt_ms": first_ms,
        "reason": reason,
    });
    let id = format!("{alert_id}.{}.expired", dest.name());
    Ok(Delivery {
        marker: alert::marker_key(conf, &id, Dest::Internal),
        alert_id: id,
        dest: Dest::Internal,
        payload: alert::internal(conf, secrets, body)?,
        marker_ttl_ms: 86_400_000,
        subject: ("expired_alert", alert_id.clone()),
        source: source.clone(),
        first_ms: 0,
        attempts: 0,
    })
}

/// What is kept in Redis for a pending delivery.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Pending {
    /// What the alert is about.
    pub source: Source,
    /// Where it goes.
    pub dest: Dest,
    /// The first attempt (ms since the epoch).
    pub first_ms: i64,
    /// Attempts made.
    pub attempts: u32,
    /// Why the last attempt failed.
    #[serde(default)]
    pub reason: String,
}

/// The Redis keys of pending deliveries.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The sorted set of due times.
    pub due: String,
    prefix: String,
    /// How long a pending record is kept (the horizon plus a day).
    keep_ms: u64,
}

impl Keys {
    /// The keys of `conf`.
    pub fn new(conf: &Config) -> Keys {
        Keys {
            due: format!("{}retries", conf.keys.state_prefix),
            prefix: format!("{}retry:", conf.keys.state_prefix),
            keep_ms: conf.delivery.retry_for_ms + 86_400_000,
        }
    }

    /// The record of delivery `id`.
    pub fn record(&self, id: &str) -> String {
        format!("{}{id}", self.prefix)
    }
}

/// The id of a delivery: `<alert id>/<destination>` (`X-Rlctl-Delivery`).
pub fn delivery_id(d: &Delivery) -> String {
    format!("{}/{}", d.alert_id, d.dest.name())
}

/// Records a new pending delivery, due at `due_ms`: its record first,
/// then its due time, so a due time never lacks its record. Returns false
/// when it is pending already (recorded by an earlier run: the poller owns
/// it, and its due time is added if a crash left it out).
pub async fn add(store: &Store, keys: &Keys, d: &Delivery, due_ms: i64) -> Result<bool, String> {
    let id = delivery_id(d);
    let recorded = save_with(store, keys, d, "", true).await?;
    let added: i64 = store
        .query(
            redis::cmd("ZADD")
                .arg(&keys.due)
                .arg("NX")
                .arg(due_ms)
                .arg(&id),
        )
        .await
        .map_err(|e| format!("ZADD {}: {e}", keys.due))?;
    Ok(recorded && added == 1)
}

/// Writes the record of `d` (its attempts so far, and `reason`).
pub async fn save(store: &Store, keys: &Keys, d: &Delivery, reason: &str) -> Result<(), String> {
    save_with(store, keys, d, reason, false).await.map(|_| ())
}

/// Writes the record of `d`; with `only_new`, only when there is none
/// (`SET ... NX`). Returns whether it was written.
async fn save_with(
    store: &Store,
    keys: &Keys,
    d: &Delivery,
    reason: &str,
    only_new: bool,
) -> Result<bool, String> {
    let rec = Pending {
        source: d.source.clone(),
        dest: d.dest,
        first_ms: d.first_ms,
        attempts: d.attempts,
        reason: reason.to_string(),
    };
    let key = keys.record(&delivery_id(d));
    let text = serde_json::to_string(&rec).map_err(|e| e.to_string())?;
    let mut cmd = redis::cmd("SET");
    cmd.arg(&key).arg(text).arg("PX").arg(keys.keep_ms);
    if only_new {
        cmd.arg("NX");
    }
    let written: Option<String> = store
        .query(&cmd)
        .await
        .map_err(|e| format!("SET {key}: {e}"))?;
    Ok(written.is_some())
}

/// Moves `d`'s due time to `due_ms`.
pub async fn reschedule(
    store: &Store,
    keys: &Keys,
    d: &Delivery,
    due_ms: i64,
) -> Result<(), String> {
    store
        .query::<i64>(
            redis::cmd("ZADD")
                .arg(&keys.due)
                .arg("XX")
                .arg(due_ms)
                .arg(delivery_id(d)),
        )
        .await
        .map(|_| ())
        .map_err(|e| format!("ZADD {}: {e}", keys.due))
}

/// Forgets delivery `id` (it ended: its marker is written).
pub async fn remove(store: &Store, keys: &Keys, id: &str) -> Result<(), String> {
    store
        .query::<i64>(redis::cmd("ZREM").arg(&keys.due).arg(id))
        .await
        .map_err(|e| format!("ZREM {}: {e}", keys.due))?;
    store
        .query::<i64>(redis::cmd("DEL").arg(keys.record(id)))
        .await
        .map(|_| ())
        .map_err(|e| format!("DEL {}: {e}", keys.record(id)))
}

/// The wait before attempt `attempts + 1`: `backoff_ms` doubled per
/// attempt after the first, at most `backoff_max_ms`.
pub fn backoff_ms(d: &DeliveryConf, attempts: u32) -> u64 {
    let doublings = attempts.saturating_sub(1).min(40);
    d.backoff_ms
        .saturating_mul(1u64 << doublings)
        .min(d.backoff_max_ms)
}

/// What is stored for one pending delivery.
#[derive(Debug, Clone)]
pub enum Stored {
    /// Its record.
    Record(Pending),
    /// No record (gone, or not a record of this version).
    Missing,
    /// The record cannot be read (not a string: Redis refused the read).
    Unreadable(String),
}

/// Every pending delivery: its id, due time and what is stored for it.
/// One whose record cannot be read is listed as such; only a failure of
/// Redis itself ends the listing.
pub async fn list(store: &Store, keys: &Keys) -> Result<Vec<(String, i64, Stored)>, String> {
    let due: Vec<(String, i64)> = store
        .query(
            redis::cmd("ZRANGE")
                .arg(&keys.due)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES"),
        )
        .await
        .map_err(|e| format!("ZRANGE {}: {e}", keys.due))?;
    let mut out = Vec::with_capacity(due.len());
    for (id, at) in due {
        out.push((id.clone(), at, load(store, keys, &id).await?));
    }
    Ok(out)
}

/// The record of delivery `id`; an error only when Redis itself failed
/// (a connection or a timeout), not for a key Redis refuses to read.
async fn load(store: &Store, keys: &Keys, id: &str) -> Result<Stored, String> {
    let key = keys.record(id);
    let text: redis::RedisResult<Option<String>> = store.query(redis::cmd("GET").arg(&key)).await;
    Ok(match text {
        Ok(Some(t)) => serde_json::from_str(&t).map_or(Stored::Missing, Stored::Record),
        Ok(None) => Stored::Missing,
        Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
            return Err(format!("GET {key}: {e}"));
        }
        Err(e) => Stored::Unreadable(format!("GET {key}: {e}")),
    })
}

/// The poller: every `delivery.backoff_ms` (at most a second), queues the
/// deliveries that are due and not in flight here.
pub async fn poll(conf: Arc<Config>, secrets: Arc<Secrets>, store: Store, senders: Senders) {
    let keys = Keys::new(&conf);
    let every = Duration::from_millis(conf.delivery.backoff_ms.clamp(10, 1000));
    loop {
        if let Err(e) = poll_once(&conf, &secrets, &store, &keys, &senders).await {
            tracing::warn!(destination = "redis", reason = %e, "pending deliveries not read");
        }
        tokio::time::sleep(every).await;
    }
}

async fn poll_once(
    conf: &Config,
    secrets: &Secrets,
    store: &Store,
    keys: &Keys,
    senders: &Senders,
) -> Result<(), String> {
    let due: Vec<String> = store
        .query(
            redis::cmd("ZRANGEBYSCORE")
                .arg(&keys.due)
                .arg("-inf")
                .arg(now_ms())
                .arg("LIMIT")
                .arg(0)
                .arg(conf.delivery.queue),
        )
        .await
        .map_err(|e| format!("ZRANGEBYSCORE {}: {e}", keys.due))?;
    for id in due {
        if senders.in_flight(&id) {
            continue;
        }
        let rec = match load(store, keys, &id).await? {
            Stored::Record(rec) => rec,
            Stored::Missing => {
                tracing::warn!(delivery = %id, "a pending delivery without its record: dropped");
                remove(store, keys, &id).await?;
                continue;
            }
            Stored::Unreadable(why) => {
                // Its key is left as it is, for an operator to look at.
                tracing::error!(delivery = %id, reason = %why, "a pending delivery whose record cannot be read: dropped from the schedule");
                store
                    .query::<i64>(redis::cmd("ZREM").arg(&keys.due).arg(&id))
                    .await
                    .map_err(|e| format!("ZREM {}: {e}", keys.due))?;
                continue;
            }
        };
        match rebuild(conf, secrets, &rec.source, rec.dest) {
            Ok(mut d) => {
                d.first_ms = rec.first_ms;
                d.attempts = rec.attempts;
                senders.resume(d).await?;
            }
            Err(why) => senders.give_up(&id, rec, &why).await,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let d = DeliveryConf {
            backoff_ms: 500,
            backoff_max_ms: 3000,
            ..DeliveryConf::default()
        };
        let waits: Vec<u64> = (1..=6).map(|a| backoff_ms(&d, a)).collect();
        assert_eq!(waits, [500, 1000, 2000, 3000, 3000, 3000]);
        assert_eq!(backoff_ms(&d, u32::MAX), 3000);
    }
}
