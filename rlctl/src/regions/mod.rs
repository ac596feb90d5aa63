//! `rlctl regions`: the multi-region quota sync worker (`sync`) and its
//! counters (`status`). See README.md, "Multi-region quotas", and
//! docs/regions.md for the consistency model.
//!
//! One worker runs per region. Its producer (`produce`) appends the local
//! region's component of every changed quota key to the local stream; one
//! consumer per remote region (`consume`) reads that region's stream and
//! merges the components into the local region.

pub mod config;
mod consume;
mod entry;
mod gap;
mod produce;

use crate::config::Config;
use crate::secrets::Secrets;
use crate::store::{Store, Target};
use config::RegionsConf;
use redis::Value;
use std::sync::Arc;

/// The worker's counters: a hash next to the stream, `<stream>:counts`.
#[derive(Clone)]
pub struct Counter {
    store: Store,
    key: String,
}

impl Counter {
    fn new(store: Store, regions: &RegionsConf) -> Counter {
        Counter {
            store,
            key: counts_key(regions),
        }
    }

    /// Adds to the counters (HINCRBY); a failure is logged, not retried.
    async fn add<S: AsRef<str>>(&self, fields: &[(S, i64)]) {
        let mut pipe = redis::pipe();
        for (field, n) in fields.iter().filter(|(_, n)| *n != 0) {
            pipe.cmd("HINCRBY")
                .arg(&self.key)
                .arg(field.as_ref())
                .arg(*n)
                .ignore();
        }
        if let Err(e) = self.store.query_pipe::<()>(&pipe).await {
            tracing::warn!(destination = "redis", key = %self.key, reason = %e, "counters not updated");
        }
    }
}

/// The longest a batch of reads or merges on the local region may take:
/// three command timeouts (each command is bounded by its own; this also
/// bounds a batch that waits on a connection being re-established).
fn batch_timeout(local: &Target) -> std::time::Duration {
    local.timeout * 3
}

fn counts_key(regions: &RegionsConf) -> String {
    format!("{}:counts", regions.stream)
}

fn regions_of(conf: &Config) -> Result<Arc<RegionsConf>, String> {
    conf.regions
        .clone()
        .map(Arc::new)
        .ok_or_else(|| "the configuration has no [regions] section".to_string())
}

/// The connection to a remote region, its password read from the
/// environment variable its section names.
fn remote_target(name: &str, regions: &RegionsConf) -> Result<Target, String> {
    let r = &regions.remote[name];
    let password = r
        .password_env
        .as_ref()
        .map(|var| {
            std::env::var(var).map_err(|_| {
                format!("regions.remote.{name}.password_env: environment variable {var} is not set")
            })
        })
        .transpose()?;
    Ok(Target::of(r, password))
}

/// Runs the sync worker until SIGINT or SIGTERM.
pub async fn sync(conf: Config) -> Result<(), String> {
    let regions = regions_of(&conf)?;
    let secrets = Secrets::redis_only(&conf)?;
    let target = Target::new(&conf, secrets.redis_password);
    let remotes = regions
        .remote
        .keys()
        .map(|name| Ok((name.clone(), remote_target(name, &regions)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let conf = Arc::new(conf);
    let local = target.store_with_retry().await;
    let limit = batch_timeout(&target);
    tracing::info!(region = %regions.local, remotes = remotes.len(), "sync started");
    let mut tasks = vec![tokio::spawn(produce::run(
        conf.clone(),
        regions.clone(),
        target,
        local.clone(),
    ))];
    for (name, remote) in remotes {
        tasks.push(tokio::spawn(consume::run(
            regions.clone(),
            name,
            remote,
            local.clone(),
            limit,
        )));
    }
    crate::watch::wait_for_stop().await;
    tracing::info!("stopping");
    for t in tasks {
        t.abort();
    }
    Ok(())
}

/// Prints, for each remote region, what the local worker did with its
/// entries (the counters) and how far behind it is (its consumer group on
/// that region's stream: entries not yet read, read but not acknowledged).
pub async fn status(conf: &Config, json: bool) -> Result<(), String> {
    let regions = regions_of(conf)?;
    let secrets = Secrets::redis_only(conf)?;
    let local = Target::new(conf, secrets.redis_password).store().await?;
    let counts: std::collections::HashMap<String, i64> = local
        .query(redis::cmd("HGETALL").arg(counts_key(&regions)))
        .await
        .map_err(|e| format!("HGETALL {}: {e}", counts_key(&regions)))?;
    let mut rows = Vec::new();
    for name in regions.remote.keys() {
        let lag = match group_lag(&regions, &remote_target(name, &regions)?).await {
            Ok(v) => v,
            Err(e) => serde_json::json!({ "error": e }),
        };
        let mut row = serde_json::json!({ "region": name, "group": lag });
        for what in [
            "applied",
            "grew",
            "malformed",
            "refused",
            "trimmed",
            "gaps",
            "resynced",
        ] {
            row[what] = counts
                .get(&format!("{name}:{what}"))
                .copied()
                .unwrap_or(0)
                .into();
        }
        rows.push(row);
    }
    let out = serde_json::json!({
        "region": regions.local,
        "published": counts.get("published").copied().unwrap_or(0),
        "remotes": rows,
    });
    if json {
        println!("{out}");
    } else {
        println!("{} published {}", regions.local, out["published"]);
        for r in &rows {
            println!(
                "from {}: applied {} (grew {}), malformed {}, refused {}, trimmed {}, gaps {} (resynced {}); {}",
                r["region"].as_str().unwrap_or(""),
                r["applied"],
                r["grew"],
                r["malformed"],
                r["refused"],
                r["trimmed"],
                r["gaps"],
                r["resynced"],
                group_text(&regions.local, &r["group"])
            );
        }
    }
    Ok(())
}

/// The `group` of a `regions status` row, in words.
fn group_text(local: &str, group: &serde_json::Value) -> String {
    let num = |v: &serde_json::Value| v.as_i64().map_or("unknown".into(), |n| n.to_string());
    if let Some(e) = group.get("error") {
        format!("group {local}: not read ({})", e.as_str().unwrap_or(""))
    } else if group.is_null() {
        format!("group {local}: not created yet (`rlctl regions sync` of {local} creates it)")
    } else {
        format!(
            "group {local}: pending {}, lag {}",
            num(&group["pending"]),
            num(&group["lag"])
        )
    }
}

/// The local region's consumer group on a remote stream: `pending` (read,
/// not acknowledged) and `lag` (not yet read; null when Redis cannot tell).
async fn group_lag(regions: &RegionsConf, remote: &Target) -> Result<serde_json::Value, String> {
    let store = remote.store().await?;
    let groups: Vec<std::collections::HashMap<String, Value>> = match store
        .query(redis::cmd("XINFO").arg("GROUPS").arg(&regions.stream))
        .await
    {
        Ok(g) => g,
        // No stream yet: no group either.
        Err(e) if e.to_string().contains("no such key") => Vec::new(),
        Err(e) => return Err(format!("XINFO GROUPS {}: {e}", regions.stream)),
    };
    let int = |v: Option<&Value>| match v {
        Some(Value::Int(i)) => serde_json::Value::from(*i),
        _ => serde_json::Value::Null,
    };
    for g in &groups {
        if matches!(g.get("name"), Some(Value::BulkString(n)) if n.as_slice() == regions.local.as_bytes())
        {
            return Ok(serde_json::json!({
                "pending": int(g.get("pending")),
                "lag": int(g.get("lag")),
            }));
        }
    }
    Ok(serde_json::Value::Null)
}
