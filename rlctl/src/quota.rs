//! Quota threshold alerts from the gateway's quota stream.
//!
//! The gateway appends usage readings (README, "Quota events"):
//! `XADD rl:events:quota MAXLEN ~ 100000 * tenant <id> quota <name> used <n> limit <n> period <YYYY-MM>`.
//! rlctl reads them in a consumer group (at least once: an entry is
//! acknowledged after its deliveries are queued; after a crash the
//! entries not acknowledged are read again) and alerts once per tenant,
//! quota, period and threshold: the highest threshold crossed, when higher
//! than the last one alerted for that period.

use crate::alert::{plan_quota, QuotaAlert};
use crate::audit::Audit;
use crate::config::Config;
use crate::deliver::Senders;
use crate::secrets::Secrets;
use crate::store::{Store, Target};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// The consumer name inside the group (one worker).
const CONSUMER: &str = "watch";
/// How long alert markers of a period are kept (40 days: a month and more).
const KEEP_MS: i64 = 40 * 86_400_000;

/// One reading, as the gateway writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// Tenant id.
    pub tenant: String,
    /// Quota name.
    pub quota: String,
    /// Points used in the period.
    pub used: u64,
    /// The quota of the period.
    pub limit: u64,
    /// The period (`2026-12`).
    pub period: String,
}

impl Reading {
    /// Reads the fields of one stream entry; a missing or bad field is named.
    pub fn parse(fields: &HashMap<String, String>) -> Result<Reading, String> {
        let get = |name: &str| {
            fields
                .get(name)
                .cloned()
                .ok_or_else(|| format!("field {name:?} missing"))
        };
        let num = |name: &str| -> Result<u64, String> {
            get(name)?
                .parse::<u64>()
                .map_err(|_| format!("field {name:?} is not an integer"))
        };
        let r = Reading {
            tenant: get("tenant")?,
            quota: get("quota")?,
            used: num("used")?,
            limit: num("limit")?,
            period: get("period")?,
        };
        if r.limit == 0 {
            return Err("field \"limit\" is 0".into());
        }
        Ok(r)
    }

    /// The highest of `thresholds` (percentages) reached.
    pub fn crossed(&self, thresholds: &[u32]) -> Option<u32> {
        let pct = u128::from(self.used) * 100 / u128::from(self.limit);
        thresholds
            .iter()
            .copied()
            .filter(|t| u128::from(*t) <= pct)
            .max()
    }
}

/// Reads the stream until aborted.
pub async fn consume(
    conf: Arc<Config>,
    secrets: Arc<Secrets>,
    target: Target,
    audit: Audit,
    senders: Senders,
) {
    // A connection of its own: XREADGROUP BLOCK holds it.
    let reader = target.store_with_retry().await;
    let store = target.store_with_retry().await;
    let stream = &conf.keys.quota_stream;
    let group = &conf.keys.quota_group;
    if let Err(e) = crate::store::create_group(&reader, stream, group).await {
        tracing::error!(destination = "redis", reason = %e, "cannot create the quota consumer group");
    }
    let block_ms = (conf.redis.timeout_ms / 2).clamp(1, 1000);
    // First the entries this consumer had read but not acknowledged, each
    // once (the cursor moves past every one read), then new ones (">").
    let mut from = PENDING_START.to_string();
    let mut backoff = Backoff::default();
    loop {
        let reply: redis::RedisResult<Option<StreamReply>> = reader
            .query(&crate::store::xreadgroup(
                group, CONSUMER, 100, block_ms, stream, &from,
            ))
            .await;
        let entries = match reply {
            Ok(r) => r
                .into_iter()
                .flatten()
                .flat_map(|(_, e)| e)
                .collect::<Vec<_>>(),
            Err(e) => {
                tracing::warn!(destination = "redis", reason = %e, "XREADGROUP on the quota stream failed");
                backoff.wait().await;
                continue;
            }
        };
        if from != ">" {
            match entries.last() {
                Some((id, _)) => from = id.clone(),
                None => from = ">".into(),
            }
        }
        let mut failed = false;
        for (id, fields) in entries {
            if let Err(e) = on_reading(&conf, &secrets, &store, &audit, &senders, &fields).await {
                tracing::warn!(destination = "quota", entry = %id, reason = %e, "quota reading not used");
                if e.starts_with("redis:") {
                    failed = true;
                    continue; // not acknowledged: read again
                }
            }
            let acked: redis::RedisResult<i64> = store
                .query(redis::cmd("XACK").arg(stream).arg(group).arg(&id))
                .await;
            if let Err(e) = acked {
                failed = true;
                tracing::warn!(destination = "redis", entry = %id, reason = %e, "XACK failed");
            }
        }
        if failed {
            // What was not acknowledged is read again, after a pause.
            from = PENDING_START.into();
            backoff.wait().await;
        } else {
            backoff.reset();
        }
    }
}

/// The id from which this consumer's unacknowledged entries are read.
const PENDING_START: &str = "0";

/// The pause after a Redis failure: 100 ms, doubled each time, at most 5 s.
#[derive(Default)]
struct Backoff {
    failures: u32,
}

impl Backoff {
    async fn wait(&mut self) {
        let ms = 100u64.saturating_mul(1 << self.failures.min(6)).min(5000);
        self.failures = self.failures.saturating_add(1);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn reset(&mut self) {
        self.failures = 0;
    }
}

type StreamReply = Vec<(String, Vec<(String, HashMap<String, String>)>)>;

async fn on_reading(
    conf: &Config,
    secrets: &Secrets,
    store: &Store,
    audit: &Audit,
    senders: &Senders,
    fields: &HashMap<String, String>,
) -> Result<(), String> {
    let r = Reading::parse(fields)?;
    let Some(threshold) = r.crossed(&conf.quota.thresholds) else {
        return Ok(());
    };
    let last_key = format!(
        "{}quota:{}:{}:{}",
        conf.keys.state_prefix, r.tenant, r.quota, r.period
    );
    let stored: Option<String> = store
        .query(redis::cmd("GET").arg(&last_key))
        .await
        .map_err(|e| format!("redis: GET {last_key}: {e}"))?;
    // A marker that is not a threshold is as good as none: it is replaced
    // below, so it is logged once.
    let last: Option<u32> = stored.and_then(|text| {
        text.parse()
            .map_err(|_| {
                tracing::warn!(destination = "quota", marker = %last_key, "a quota marker that is not a threshold: replaced");
            })
            .ok()
    });
    let alert_id = format!("quota:{}:{}:{}:{threshold}", r.tenant, r.quota, r.period);
    let first_time = last.is_none_or(|l| l < threshold);
    if !first_time && last != Some(threshold) {
        return Ok(()); // a higher threshold was already alerted
    }
    if first_time {
        store
            .query::<()>(
                redis::cmd("SET")
                    .arg(&last_key)
                    .arg(threshold)
                    .arg("PX")
                    .arg(KEEP_MS),
            )
            .await
            .map_err(|e| format!("redis: SET {last_key}: {e}"))?;
        let fields = [
            ("alert_id", alert_id.clone()),
            ("tenant", r.tenant.clone()),
            ("quota", r.quota.clone()),
            ("period", r.period.clone()),
            ("used", r.used.to_string()),
            ("limit", r.limit.to_string()),
            ("threshold", threshold.to_string()),
        ];
        audit.record_or_log("quota_seen", &fields).await;
    }
    let owner = crate::owner::of_tenant(conf, &r.tenant);
    let alert = QuotaAlert {
        alert_id,
        owner,
        quota: r.quota,
        period: r.period,
        used: r.used,
        limit: r.limit,
        threshold,
    };
    let (deliveries, skipped) = plan_quota(conf, secrets, &alert, KEEP_MS);
    for (dest, why) in skipped {
        tracing::warn!(destination = dest.name(), alert = %alert.alert_id, reason = %why, "alert not sent");
    }
    for d in deliveries {
        senders.submit(d).await.map_err(|e| format!("redis: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_name_the_bad_field_and_find_the_threshold() {
        let mut f: HashMap<String, String> = [
            ("tenant", "t"),
            ("quota", "requests"),
            ("used", "905"),
            ("limit", "1000"),
            ("period", "2026-12"),
            // the gateway adds the threshold it crossed; rlctl applies its own
            ("threshold", "100"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        let r = Reading::parse(&f).unwrap();
        assert_eq!(r.crossed(&[80, 90, 100]), Some(90));
        f.insert("used".into(), "x".into());
        assert!(Reading::parse(&f).unwrap_err().contains("\"used\""));
        f.insert("used".into(), "10".into());
        assert_eq!(Reading::parse(&f).unwrap().crossed(&[80, 90, 100]), None);
    }
}
