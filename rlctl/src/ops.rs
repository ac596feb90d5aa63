//! The operator commands: `boxes`, `release`, `trip` (the kill switch),
//! `audit`. Each manual action is written to the audit trail with who and
//! why; an action whose audit entry could not be written fails loudly.

use crate::alert::Operator;
use crate::audit::{self, Audit};
use crate::config::Config;
use crate::owner;
use crate::retry::Stored;
use crate::secrets::Secrets;
use crate::store::{self, BoxStatus, Target};
use std::time::Duration;

/// One active box, as `rlctl boxes` shows it.
#[derive(Debug, serde::Serialize)]
struct BoxRow {
    key: String,
    level: i64,
    ttl_ms: i64,
    offenses: i64,
    tenant: Option<String>,
    tier: String,
    node: String,
}

fn target(conf: &Config) -> Result<Target, String> {
    let secrets = Secrets::redis_only(conf)?;
    Ok(Target::new(conf, secrets.redis_password))
}

/// `rlctl boxes`: every active box on every primary.
pub async fn boxes(conf: &Config, json: bool) -> Result<(), String> {
    let target = target(conf)?;
    let mut known = Vec::new();
    let mut rows = Vec::new();
    for node in target.primaries(&mut known).await? {
        let mut con = target.node(&node).await?;
        for (key, s) in store::scan_boxes(&mut con, conf.redis.scan_count)
            .await
            .map_err(|e| format!("{node}: {e}"))?
        {
            let o = owner::lookup(conf, &key);
            rows.push(BoxRow {
                key,
                level: s.level,
                ttl_ms: s.ttl_ms,
                offenses: s.offenses,
                tenant: o.tenant_id,
                tier: o.tier,
                node: node.clone(),
            });
        }
    }
    rows.sort_by(|a, b| a.key.cmp(&b.key));
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    // Key names are anyone's bytes: escaped, so one cannot drive the
    // terminal or print rows of its own.
    let keys: Vec<String> = rows
        .iter()
        .map(|r| crate::text::escape(&r.key, usize::MAX))
        .collect();
    let width = keys.iter().map(String::len).max().unwrap_or(3).max(3);
    println!(
        "{:<width$}  LEVEL  TIME LEFT               OFFENSES  TENANT  TIER",
        "KEY"
    );
    for (r, key) in rows.iter().zip(&keys) {
        println!(
            "{:<width$}  {:<5}  {:<22}  {:<8}  {:<6}  {}",
            key,
            r.level,
            crate::alert::time_left(r.ttl_ms),
            r.offenses,
            r.tenant.as_deref().unwrap_or("-"),
            r.tier
        );
    }
    println!("{} active box(es)", rows.len());
    Ok(())
}

/// `rlctl stats`: the module's `INFO rl` counters summed over the primaries
/// (trips by level, releases, boxed replies: commands.md, "Observability").
pub async fn stats(conf: &Config, json: bool) -> Result<(), String> {
    let target = target(conf)?;
    let mut known = Vec::new();
    let mut totals: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
    for node in target.primaries(&mut known).await? {
        let mut con = target.node(&node).await?;
        let info: String = redis::cmd("INFO")
            .arg("rl")
            .query_async(&mut con)
            .await
            .map_err(|e| format!("{node}: INFO rl: {e}"))?;
        for line in info.lines() {
            let Some((name, value)) = line.trim().split_once(':') else {
                continue;
            };
            if let (true, Ok(v)) = (name.starts_with("rl_"), value.parse::<i64>()) {
                *totals.entry(name.to_string()).or_insert(0) += v;
            }
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&totals).map_err(|e| e.to_string())?
        );
    } else {
        for (name, v) in &totals {
            println!("{name:<24} {v}");
        }
    }
    Ok(())
}

fn required(flag: &str, value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err(format!("{flag}: must not be empty"));
    }
    Ok(())
}

/// What `rlctl release` found to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Released {
    /// The box was lifted (and, with `--forget`, the offenses cleared).
    Lifted,
    /// No box was active; `--forget` cleared the offenses and strikes.
    Forgotten,
    /// No box, and nothing to forget: nothing was changed or recorded.
    Nothing,
}

/// `rlctl release KEY --reason TEXT --by NAME [--forget]`.
///
/// The audit entry is written before the box is lifted, so a release never
/// happens without one (an entry that cannot be written, a full server
/// under `noeviction` say, stops the release). Then the gateways' deny
/// cache is told (`INCR <prefix>:deny:version`), so the edge lets the key
/// through within its `deny_cache.poll`.
pub async fn release(
    conf: &Config,
    key: &str,
    reason: &str,
    by: &str,
    forget: bool,
) -> Result<Released, String> {
    required("--reason", reason)?;
    required("--by", by)?;
    let target = target(conf)?;
    let store = target.store().await?;
    let before = store::box_status_routed(&store, key).await?;
    let result = if before.level > 0 {
        Released::Lifted
    } else if forget && (before.offenses > 0 || before.strikes > 0) {
        Released::Forgotten
    } else {
        eprintln!(
            "rlctl: {key}: no active box{}; nothing changed",
            if forget { " and nothing to forget" } else { "" }
        );
        return Ok(Released::Nothing);
    };
    let result_name = if result == Released::Lifted {
        "lifted"
    } else {
        "forgotten"
    };
    let audit = Audit::new(
        store.clone(),
        &conf.keys.audit_stream,
        conf.keys.audit_maxlen,
    );
    let fields = [
        ("key", key.to_string()),
        ("by", by.to_string()),
        ("reason", reason.to_string()),
        ("forget", forget.to_string()),
        ("level_before", before.level.to_string()),
        ("result", result_name.to_string()),
    ];
    let id = audit
        .record("manual_release", &fields)
        .await
        .map_err(|e| format!("not released (nothing changed): {e}"))?;
    let mut cmd = redis::cmd("RL.BOX");
    cmd.arg("RELEASE").arg(key);
    if forget {
        cmd.arg("FORGET");
    }
    if let Err(e) = store.query::<i64>(&cmd).await {
        return Err(format!(
            "audit entry {id} written, but RL.BOX RELEASE {key} failed: {e} (run the release again)"
        ));
    }
    if result == Released::Lifted {
        let version = deny_version_key(key);
        let bumped: redis::RedisResult<i64> = store.query(redis::cmd("INCR").arg(&version)).await;
        if let Err(e) = bumped {
            return Err(format!(
                "released (audit entry {id}), but the gateways were not told: INCR {version}: {e} \
                 (the edge keeps refusing the key until its box would have ended; run the INCR by hand)"
            ));
        }
    }
    println!(
        "{key}: {result_name} (was level {}); audit entry {id}",
        before.level
    );
    Ok(result)
}

/// The gateway's release version of `key`'s deny cache: the gateway names
/// keys `<prefix>:{...}...` and polls `<prefix>:deny:version`; a key of
/// another form gets `rl:deny:version`, the gateway's default prefix.
pub fn deny_version_key(key: &str) -> String {
    let prefix = key.split_once(":{").map_or("rl", |(p, _)| p);
    let prefix = if prefix.is_empty() { "rl" } else { prefix };
    format!("{prefix}:deny:version")
}

/// Parses `--for`: a duration (`15m`, `1h`, `1500ms`) or `manual` / `0`
/// (a box until `rlctl release`); returns seconds as RL.BOX TRIP takes them.
pub fn parse_box_duration(text: &str) -> Result<String, String> {
    if text == "manual" || text == "0" {
        return Ok("0".into());
    }
    let d = humantime::parse_duration(text)
        .map_err(|e| format!("--for: {text:?}: {e} (say 15m, 1h, 1500ms or manual)"))?;
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("--for: {text:?}: at most millisecond precision"));
    }
    if d > Duration::from_secs(3_153_600_000) {
        return Err(format!("--for: {text:?}: at most 100 years"));
    }
    Ok(format!("{}.{:03}", d.as_secs(), d.subsec_millis()))
}

/// `rlctl trip KEY --level N --for DURATION --reason TEXT --by NAME`.
pub async fn trip(
    conf: &Config,
    key: &str,
    level: u8,
    duration: &str,
    reason: &str,
    by: &str,
) -> Result<(), String> {
    if !(1..=3).contains(&level) {
        return Err(format!("--level: 1, 2 or 3, got {level}"));
    }
    let seconds = parse_box_duration(duration)?;
    required("--reason", reason)?;
    required("--by", by)?;
    let target = target(conf)?;
    let store = target.store().await?;
    // The note tells the worker who tripped the box and why (it takes it
    // with the trip, within a minute).
    let note_key = crate::alert::note_key(conf, key);
    let note = Operator {
        by: by.to_string(),
        reason: reason.to_string(),
        at_ms: store::now_ms(),
    };
    let note = serde_json::to_string(&note).map_err(|e| e.to_string())?;
    store
        .query::<()>(
            redis::cmd("SET")
                .arg(&note_key)
                .arg(note)
                .arg("PX")
                .arg(120_000),
        )
        .await
        .map_err(|e| format!("SET {note_key}: {e}"))?;
    let reply: redis::RedisResult<Vec<i64>> = store
        .query(
            redis::cmd("RL.BOX")
                .arg("TRIP")
                .arg(key)
                .arg(level)
                .arg(&seconds),
        )
        .await;
    let v = match reply {
        Ok(v) => v,
        Err(e) => {
            let _: redis::RedisResult<i64> = store.query(redis::cmd("DEL").arg(&note_key)).await;
            return Err(format!("RL.BOX TRIP {key}: {e}"));
        }
    };
    let s = match v.as_slice() {
        [level, ttl_ms, offenses, strikes] => BoxStatus {
            level: *level,
            ttl_ms: *ttl_ms,
            offenses: *offenses,
            strikes: *strikes,
        },
        _ => return Err(format!("RL.BOX TRIP: expected 4 integers, got {v:?}")),
    };
    let audit = Audit::new(store, &conf.keys.audit_stream, conf.keys.audit_maxlen);
    let fields = [
        ("key", key.to_string()),
        ("by", by.to_string()),
        ("reason", reason.to_string()),
        ("level", s.level.to_string()),
        ("duration_s", seconds),
        ("ttl_ms", s.ttl_ms.to_string()),
        ("offenses", s.offenses.to_string()),
    ];
    let id = audit
        .record("manual_trip", &fields)
        .await
        .map_err(|e| format!("tripped, but {e}"))?;
    println!(
        "{key}: boxed at level {} {} (offenses {}); audit entry {id}",
        s.level,
        box_length(s.ttl_ms),
        s.offenses
    );
    Ok(())
}

/// How long a box just tripped lasts, after "boxed at level N": "for
/// 15m", "for 1s 500ms" (to the millisecond: the trip's own reply), or
/// "until released by hand" for a manual box (`ttl_ms` -1).
fn box_length(ttl_ms: i64) -> String {
    match u64::try_from(ttl_ms) {
        Ok(ms) => format!(
            "for {}",
            humantime::format_duration(Duration::from_millis(ms))
        ),
        Err(_) => crate::alert::time_left(ttl_ms),
    }
}

/// `rlctl audit [--since TIME] [--key KEY] [--limit N] [--json]`.
pub async fn show_audit(
    conf: &Config,
    since: Option<&str>,
    key: Option<&str>,
    limit: usize,
    json: bool,
) -> Result<(), String> {
    let since_ms = since.map(audit::parse_since).transpose()?;
    let target = target(conf)?;
    let store = target.store().await?;
    let entries = audit::read(&store, &conf.keys.audit_stream, since_ms, key, limit).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&entries).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    for e in &entries {
        let at = e.fields.get("at").map_or("-", String::as_str);
        let kind = e.fields.get("type").map_or("-", String::as_str);
        let rest: Vec<String> = e
            .fields
            .iter()
            .filter(|(k, _)| k.as_str() != "at" && k.as_str() != "type")
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect();
        println!("{at} {kind} {}", rest.join(" "));
    }
    Ok(())
}

/// One delivery still being retried, as `rlctl undelivered` shows it.
#[derive(Debug, serde::Serialize)]
struct PendingRow {
    delivery: String,
    due_ms: i64,
    attempts: Option<u32>,
    first_attempt_ms: Option<i64>,
    last_error: Option<String>,
    /// Why its record cannot be read (absent when it can).
    #[serde(skip_serializing_if = "Option::is_none")]
    unreadable: Option<String>,
}

/// `rlctl undelivered [--since TIME] [--json]`: the deliveries still being
/// retried (from Redis), then those given up (`failed` or `expired`
/// delivery entries of the audit trail).
pub async fn undelivered(conf: &Config, since: Option<&str>, json: bool) -> Result<(), String> {
    let since_ms = since.map(audit::parse_since).transpose()?;
    let store = target(conf)?.store().await?;
    let keys = crate::retry::Keys::new(conf);
    let pending: Vec<PendingRow> = crate::retry::list(&store, &keys)
        .await?
        .into_iter()
        .map(|(delivery, due_ms, stored)| {
            let (rec, unreadable) = match stored {
                Stored::Record(r) => (Some(r), None),
                Stored::Missing => (None, None),
                Stored::Unreadable(why) => (None, Some(why)),
            };
            PendingRow {
                delivery,
                due_ms,
                attempts: rec.as_ref().map(|r| r.attempts),
                first_attempt_ms: rec.as_ref().map(|r| r.first_ms),
                last_error: rec.map(|r| r.reason).filter(|r| !r.is_empty()),
                unreadable,
            }
        })
        .collect();
    let given_up: Vec<audit::Entry> =
        audit::read(&store, &conf.keys.audit_stream, since_ms, None, usize::MAX)
            .await?
            .into_iter()
            .filter(|e| {
                e.fields.get("type").map(String::as_str) == Some("delivery")
                    && matches!(
                        e.fields.get("result").map(String::as_str),
                        Some("failed" | "expired")
                    )
            })
            .collect();
    if json {
        let all = serde_json::json!({"pending": pending, "given_up": given_up});
        println!(
            "{}",
            serde_json::to_string_pretty(&all).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!("{} pending", pending.len());
    for p in &pending {
        if let Some(why) = &p.unreadable {
            println!("  {} unreadable record: {why}", p.delivery);
            continue;
        }
        println!(
            "  {} attempts={} next_in={} last_error={:?}",
            p.delivery,
            p.attempts.unwrap_or(0),
            crate::alert::time_left((p.due_ms - store::now_ms()).max(0)),
            p.last_error.as_deref().unwrap_or("-")
        );
    }
    println!("{} given up", given_up.len());
    for e in &given_up {
        let field = |name: &str| e.fields.get(name).map_or("-", String::as_str);
        println!(
            "  {} {}/{} result={} attempts={} reason={:?}",
            field("at"),
            field("alert_id"),
            field("dest"),
            field("result"),
            field("attempts"),
            field("reason")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_durations_become_seconds() {
        assert_eq!(parse_box_duration("15m").unwrap(), "900.000");
        assert_eq!(parse_box_duration("1500ms").unwrap(), "1.500");
        assert_eq!(parse_box_duration("manual").unwrap(), "0");
        assert!(parse_box_duration("soon").unwrap_err().starts_with("--for"));
        assert!(parse_box_duration("1us").is_err());
    }

    #[test]
    fn a_manual_box_reads_until_released_by_hand() {
        assert_eq!(box_length(900_000), "for 15m");
        assert_eq!(box_length(1_500), "for 1s 500ms");
        assert_eq!(box_length(-1), "until released by hand");
    }

    #[test]
    fn the_deny_version_follows_the_key_prefix() {
        assert_eq!(
            deny_version_key("ledger:{tenant:t-42}:tier-key:key_id=k-7"),
            "ledger:deny:version"
        );
        assert_eq!(deny_version_key("rl:{t:t-200}:key:k-2"), "rl:deny:version");
        assert_eq!(deny_version_key("plain-key"), "rl:deny:version");
    }
}
