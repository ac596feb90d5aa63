//! The audit trail: a capped Redis Stream (`XADD ... MAXLEN ~`), replicated
//! like any other write. Each entry is flat string fields: `type` (what
//! happened), `at` (RFC 3339, UTC), then the fields of that type
//! (README, "Audit trail").

use crate::store::Store;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Writes entries to the audit stream.
#[derive(Clone)]
pub struct Audit {
    store: Store,
    stream: String,
    maxlen: u64,
}

/// One entry read back.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Entry {
    /// The stream id (`<ms>-<seq>`).
    pub id: String,
    /// Its fields.
    pub fields: BTreeMap<String, String>,
}

impl Audit {
    /// An audit writer on `stream`, capped near `maxlen` entries.
    pub fn new(store: Store, stream: &str, maxlen: u64) -> Audit {
        Audit {
            store,
            stream: stream.to_string(),
            maxlen,
        }
    }

    /// Appends one entry of type `kind`; returns its id.
    pub async fn record(&self, kind: &str, fields: &[(&str, String)]) -> Result<String, String> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&self.stream)
            .arg("MAXLEN")
            .arg("~")
            .arg(self.maxlen)
            .arg("*");
        cmd.arg("type").arg(kind).arg("at").arg(rfc3339_now());
        for (name, value) in fields {
            cmd.arg(*name).arg(value);
        }
        self.store
            .query(&cmd)
            .await
            .map_err(|e| format!("audit XADD {}: {e}", self.stream))
    }

    /// Appends an entry and logs (never fails) when the write fails: for the
    /// worker, where a lost audit line must not stop alerting.
    pub async fn record_or_log(&self, kind: &str, fields: &[(&str, String)]) {
        if let Err(e) = self.record(kind, fields).await {
            tracing::error!(destination = "audit", reason = %e, kind, "audit entry not written");
        }
    }
}

/// The current time as RFC 3339 with milliseconds, UTC.
pub fn rfc3339_now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Parses `--since`: an RFC 3339 time (`2026-12-01T08:00:00Z`) or a
/// duration before now (`90m`, `2h`, `1day`); returns ms since the epoch.
pub fn parse_since(text: &str) -> Result<i64, String> {
    let at = match humantime::parse_rfc3339_weak(text) {
        Ok(t) => t,
        Err(_) => {
            let ago = humantime::parse_duration(text).map_err(|e| {
                format!("--since: {text:?} is neither an RFC 3339 time nor a duration ({e})")
            })?;
            SystemTime::now().checked_sub(ago).unwrap_or(UNIX_EPOCH)
        }
    };
    let ms = at
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    Ok(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// Reads entries from `since_ms` (all when `None`), oldest first, keeping
/// those about `key` when given, at most `limit`.
pub async fn read(
    store: &Store,
    stream: &str,
    since_ms: Option<i64>,
    key: Option<&str>,
    limit: usize,
) -> Result<Vec<Entry>, String> {
    const PAGE: usize = 500;
    let mut start = since_ms.map_or("-".to_string(), |ms| format!("{ms}-0"));
    let mut out = Vec::new();
    if limit == 0 {
        return Ok(out);
    }
    // Each page advances past its last id, so this ends with the stream.
    loop {
        let page: Vec<(String, Vec<(String, String)>)> = store
            .query(
                redis::cmd("XRANGE")
                    .arg(stream)
                    .arg(&start)
                    .arg("+")
                    .arg("COUNT")
                    .arg(PAGE),
            )
            .await
            .map_err(|e| format!("XRANGE {stream}: {e}"))?;
        let n = page.len();
        for (id, pairs) in page {
            start = format!("({id}");
            let fields: BTreeMap<String, String> = pairs.into_iter().collect();
            if key.is_none_or(|k| fields.get("key").map(String::as_str) == Some(k)) {
                out.push(Entry { id, fields });
                if out.len() >= limit {
                    return Ok(out);
                }
            }
        }
        if n < PAGE {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_time_or_a_duration() {
        assert_eq!(
            parse_since("2026-12-01T00:00:00Z").unwrap(),
            1_796_083_200_000
        );
        let an_hour_ago = parse_since("1h").unwrap();
        let now = crate::store::now_ms();
        assert!((now - 3_600_000 - an_hour_ago).abs() < 5_000);
        assert!(parse_since("yesterday").unwrap_err().contains("--since"));
    }
}
