//! Redis access: one server or a cluster (commands routed by key), the
//! primaries (discovered from `CLUSTER NODES`), direct per-node
//! connections, and the rl commands rlctl uses.

use crate::config::{Config, RedisConf};
use crate::text::redact_url;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, IntoConnectionInfo, RedisResult};
use std::collections::HashMap;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Connection details shared by every connection rlctl opens.
#[derive(Debug, Clone)]
pub struct Target {
    /// Seed URLs (one for a single server).
    pub urls: Vec<String>,
    /// Cluster mode.
    pub cluster: bool,
    /// Password (from `redis.password_env`).
    pub password: Option<String>,
    /// Connect and response timeout.
    pub timeout: Duration,
}

impl Target {
    /// From the configuration and the password read from the environment.
    pub fn new(conf: &Config, password: Option<String>) -> Target {
        Target::of(&conf.redis, password)
    }

    /// From one Redis section (`[redis]`, `[regions.remote.<name>]`).
    pub fn of(redis: &RedisConf, password: Option<String>) -> Target {
        Target {
            urls: redis.urls.clone(),
            cluster: redis.cluster,
            password,
            timeout: Duration::from_millis(redis.timeout_ms),
        }
    }

    fn client(&self, url: &str) -> RedisResult<redis::Client> {
        let mut info = url.into_connection_info()?;
        if self.password.is_some() {
            info.redis.password = self.password.clone();
        }
        redis::Client::open(info)
    }

    /// A direct connection to one node (`redis://host:port`), bounded in time.
    pub async fn node(&self, url: &str) -> Result<MultiplexedConnection, String> {
        let client = self
            .client(url)
            .map_err(|e| format!("{}: {e}", redact_url(url)))?;
        client
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(self.timeout)
                    .set_response_timeout(self.timeout),
            )
            .await
            .map_err(|e| format!("{}: {e}", redact_url(url)))
    }

    /// A pub/sub connection to one node, bounded in time.
    pub async fn pubsub(&self, url: &str) -> Result<redis::aio::PubSub, String> {
        let client = self
            .client(url)
            .map_err(|e| format!("{}: {e}", redact_url(url)))?;
        match tokio::time::timeout(self.timeout, client.get_async_pubsub()).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(e)) => Err(format!("{}: {e}", redact_url(url))),
            Err(_) => Err(format!("{}: connection timed out", redact_url(url))),
        }
    }

    /// [`Target::store`], retrying every second until it connects (the
    /// worker waits for Redis to come up).
    pub async fn store_with_retry(&self) -> Store {
        loop {
            match self.store().await {
                Ok(s) => return s,
                Err(e) => {
                    tracing::error!(destination = "redis", reason = %e, "cannot connect; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// The key-routed connection (a connection manager, or a cluster connection).
    pub async fn store(&self) -> Result<Store, String> {
        let seeds = self
            .urls
            .iter()
            .map(|u| redact_url(u))
            .collect::<Vec<_>>()
            .join(", ");
        if self.cluster {
            let mut builder = redis::cluster::ClusterClientBuilder::new(self.urls.clone())
                .connection_timeout(self.timeout)
                .response_timeout(self.timeout)
                .retries(6)
                .max_retry_wait(1000);
            if let Some(p) = &self.password {
                builder = builder.password(p.clone());
            }
            let client = builder.build().map_err(|e| format!("{seeds}: {e}"))?;
            let con = client
                .get_async_connection()
                .await
                .map_err(|e| format!("{seeds}: {e}"))?;
            Ok(Store::Cluster(con))
        } else {
            let client = self
                .client(&self.urls[0])
                .map_err(|e| format!("{seeds}: {e}"))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(self.timeout)
                .set_response_timeout(self.timeout)
                .set_number_of_retries(3)
                .set_max_delay(1000);
            let con = match tokio::time::timeout(
                self.timeout * 2,
                ConnectionManager::new_with_config(client, config),
            )
            .await
            {
                Ok(con) => con.map_err(|e| format!("{seeds}: {e}"))?,
                // The manager retries a refused connection until the
                // timeout: one direct attempt says why it failed.
                Err(_) => {
                    return Err(match self.node(&self.urls[0]).await {
                        Err(e) => e,
                        Ok(_) => format!("{seeds}: connection timed out"),
                    })
                }
            };
            Ok(Store::Single(Box::new(con)))
        }
    }

    /// The URLs of the current primaries: the one server, or the masters of
    /// `CLUSTER NODES` as seen by the first of `known` (then the seeds) that
    /// answers. `known` is updated with every node listed.
    pub async fn primaries(&self, known: &mut Vec<String>) -> Result<Vec<String>, String> {
        if !self.cluster {
            return Ok(vec![self.urls[0].clone()]);
        }
        let mut candidates = known.clone();
        candidates.extend(self.urls.iter().filter(|u| !known.contains(u)).cloned());
        let mut errors = Vec::new();
        for url in candidates {
            let mut con = match self.node(&url).await {
                Ok(c) => c,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let text: String = match redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut con)
                .await
            {
                Ok(t) => t,
                Err(e) => {
                    errors.push(format!("{}: CLUSTER NODES: {e}", redact_url(&url)));
                    continue;
                }
            };
            let nodes = parse_cluster_nodes(&text);
            let mut all: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
            all.sort();
            all.dedup();
            *known = all;
            let mut masters: Vec<String> = nodes
                .into_iter()
                .filter(|n| n.serving_primary)
                .map(|n| n.url)
                .collect();
            masters.sort();
            return Ok(masters);
        }
        Err(format!(
            "no cluster node answered CLUSTER NODES: {}",
            errors.join("; ")
        ))
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// `redis://host:port`.
    pub url: String,
    /// A master, not failed, that serves slots.
    pub serving_primary: bool,
}

/// Parses `CLUSTER NODES` (`id host:port@bus flags master ping pong epoch link slots...`).
pub fn parse_cluster_nodes(text: &str) -> Vec<ClusterNode> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            continue;
        }
        let addr = fields[1].split('@').next().unwrap_or("");
        let addr = addr.split(',').next().unwrap_or("");
        if addr.is_empty() || addr.starts_with(':') {
            continue;
        }
        let flags: Vec<&str> = fields[2].split(',').collect();
        let serving_primary = flags.contains(&"master")
            && !flags.contains(&"fail")
            && !flags.contains(&"noaddr")
            && !flags.contains(&"handshake")
            && fields[7] == "connected"
            && fields.len() > 8;
        out.push(ClusterNode {
            url: format!("redis://{addr}"),
            serving_primary,
        });
    }
    out
}

/// The key-routed connection.
#[derive(Clone)]
pub enum Store {
    /// One server (reconnects by itself).
    Single(Box<ConnectionManager>),
    /// A cluster (follows MOVED and failovers).
    Cluster(ClusterConnection),
}

impl Store {
    /// Runs one command, routed by its key.
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Store::Single(c) => cmd.query_async(&mut (**c).clone()).await,
            Store::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Runs one command on the primary of `key`'s slot, for commands whose
    /// key is not their first argument (`RL.REGION READ key`): a cluster
    /// client would route them by their subcommand and follow a MOVED.
    pub async fn query_key<T: FromRedisValue>(&self, cmd: &Cmd, key: &[u8]) -> RedisResult<T> {
        match self {
            Store::Single(c) => cmd.query_async(&mut (**c).clone()).await,
            Store::Cluster(c) => {
                use redis::cluster_routing::{
                    get_slot, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
                };
                let route = Route::new(get_slot(key), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let v = c.clone().route_command(cmd, routing).await?;
                T::from_redis_value(&v)
            }
        }
    }

    /// Runs a pipeline whose commands all have keys of one slot.
    pub async fn query_pipe<T: FromRedisValue>(&self, pipe: &redis::Pipeline) -> RedisResult<T> {
        match self {
            Store::Single(c) => pipe.query_async(&mut (**c).clone()).await,
            Store::Cluster(c) => pipe.query_async(&mut c.clone()).await,
        }
    }
}

/// `RL.BOX STATUS` of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BoxStatus {
    /// 1..3, 0 when no box is active.
    pub level: i64,
    /// ms until the box ends, -1 for a manual box.
    pub ttl_ms: i64,
    /// Offenses remembered.
    pub offenses: i64,
    /// Strikes in the open window.
    pub strikes: i64,
}

impl BoxStatus {
    fn from_reply(v: Vec<i64>) -> Result<BoxStatus, String> {
        match v.as_slice() {
            [level, ttl_ms, offenses, strikes] => Ok(BoxStatus {
                level: *level,
                ttl_ms: *ttl_ms,
                offenses: *offenses,
                strikes: *strikes,
            }),
            _ => Err(format!("RL.BOX STATUS: expected 4 integers, got {v:?}")),
        }
    }
}

/// `RL.BOX STATUS key` through `con`.
pub async fn box_status<C: redis::aio::ConnectionLike>(
    con: &mut C,
    key: &str,
) -> Result<BoxStatus, String> {
    let v: Vec<i64> = redis::cmd("RL.BOX")
        .arg("STATUS")
        .arg(key)
        .query_async(con)
        .await
        .map_err(|e| format!("RL.BOX STATUS {key}: {e}"))?;
    BoxStatus::from_reply(v)
}

/// `RL.BOX STATUS key`, routed by key.
pub async fn box_status_routed(store: &Store, key: &str) -> Result<BoxStatus, String> {
    let v: Vec<i64> = store
        .query(redis::cmd("RL.BOX").arg("STATUS").arg(key))
        .await
        .map_err(|e| format!("RL.BOX STATUS {key}: {e}"))?;
    BoxStatus::from_reply(v)
}

/// Every `rl-record` key of one node (`SCAN ... TYPE rl-record`), with the
/// keys that hold an active box and their status. Keys whose name is not
/// UTF-8 are skipped (rl key names are text).
pub async fn scan_boxes(
    con: &mut MultiplexedConnection,
    count: u64,
) -> Result<Vec<(String, BoxStatus)>, String> {
    let mut cursor: u64 = 0;
    let mut out = Vec::new();
    loop {
        let (next, keys) = scan_records(con, cursor, count).await?;
        for raw in keys {
            let Ok(key) = String::from_utf8(raw) else {
                continue;
            };
            let status = box_status(con, &key).await?;
            if status.level > 0 {
                out.push((key, status));
            }
        }
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

/// One `SCAN cursor COUNT count TYPE rl-record` on one node: the next
/// cursor (0 at the end) and the keys of this page.
pub async fn scan_records(
    con: &mut MultiplexedConnection,
    cursor: u64,
    count: u64,
) -> Result<(u64, Vec<Vec<u8>>), String> {
    redis::cmd("SCAN")
        .arg(cursor)
        .arg("COUNT")
        .arg(count)
        .arg("TYPE")
        .arg("rl-record")
        .query_async(con)
        .await
        .map_err(|e| format!("SCAN: {e}"))
}

/// Adds `E` (keyevent channel) and `d` (module events) to the server's
/// `notify-keyspace-events`, keeping what is there.
pub async fn enable_notifications(con: &mut MultiplexedConnection) -> redis::RedisResult<()> {
    let (_, flags): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(con)
        .await?;
    let mut wanted = flags.clone();
    if !wanted.contains('E') {
        wanted.push('E');
    }
    if !wanted.contains('d') && !wanted.contains('A') {
        wanted.push('d');
    }
    if wanted != flags {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("notify-keyspace-events")
            .arg(&wanted)
            .query_async::<()>(con)
            .await?;
    }
    Ok(())
}

/// With `redis.set_notify_config = false`: warns when the node's
/// `notify-keyspace-events` (if `CONFIG GET` is allowed) lacks `E` or `d`,
/// as no event would arrive (only the scans would find the boxes).
async fn warn_without_notifications(con: &mut MultiplexedConnection, url: &str) {
    let reply: redis::RedisResult<(String, String)> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(con)
        .await;
    if let Ok((_, flags)) = reply {
        if !flags.contains('E') || !(flags.contains('d') || flags.contains('A')) {
            tracing::warn!(
                node = %redact_url(url),
                notify_keyspace_events = %flags,
                "notify-keyspace-events lacks E or d: no rl event will arrive \
                 (set it to include Ed, or set redis.set_notify_config = true)"
            );
        }
    }
}

/// Subscribes to `channels` on one node, after adding `E` and `d` to its
/// `notify-keyspace-events` when `set_notify`: a connection to the node
/// (for its reconciliation) and the subscription.
pub async fn subscribe_node(
    target: &Target,
    url: &str,
    set_notify: bool,
    channels: &[&str],
) -> Result<(MultiplexedConnection, redis::aio::PubSub), String> {
    let mut con = target.node(url).await?;
    if set_notify {
        enable_notifications(&mut con)
            .await
            .map_err(|e| format!("notify-keyspace-events: {e}"))?;
    } else {
        warn_without_notifications(&mut con, url).await;
    }
    let mut pubsub = target.pubsub(url).await?;
    for channel in channels {
        pubsub
            .subscribe(*channel)
            .await
            .map_err(|e| format!("SUBSCRIBE {channel}: {e}"))?;
    }
    tracing::info!(node = %redact_url(url), "subscribed");
    Ok((con, pubsub))
}

/// `XREADGROUP GROUP group consumer COUNT count BLOCK block_ms STREAMS stream from`.
pub fn xreadgroup(
    group: &str,
    consumer: &str,
    count: u64,
    block_ms: u64,
    stream: &str,
    from: &str,
) -> Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(group)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("BLOCK")
        .arg(block_ms)
        .arg("STREAMS")
        .arg(stream)
        .arg(from);
    cmd
}

/// `XGROUP CREATE stream group 0 MKSTREAM`; a group that exists is fine.
pub async fn create_group(store: &Store, stream: &str, group: &str) -> RedisResult<()> {
    let created: RedisResult<()> = store
        .query(
            redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(stream)
                .arg(group)
                .arg("0")
                .arg("MKSTREAM"),
        )
        .await;
    match created {
        Err(e) if e.code() != Some("BUSYGROUP") => Err(e),
        _ => Ok(()),
    }
}

/// Runs one task per primary of `target` (listed again every `refresh`):
/// `follow(url)` is a node's task, run until it ends (its error logged);
/// the task of a node that is no longer a primary is stopped, and a task
/// that ended is started again.
pub async fn follow_primaries<F, T>(target: Target, refresh: Duration, mut follow: F)
where
    F: FnMut(String) -> T,
    T: std::future::Future<Output = Result<(), String>> + Send + 'static,
{
    let mut start = move |url: String| -> JoinHandle<()> {
        let task = follow(url.clone());
        tokio::spawn(async move {
            if let Err(e) = task.await {
                tracing::warn!(destination = "redis", node = %redact_url(&url), reason = %e, "subscription ended");
            }
        })
    };
    let mut known: Vec<String> = Vec::new();
    let mut tasks: HashMap<String, JoinHandle<()>> = HashMap::new();
    let mut ticks = tokio::time::interval(refresh);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let primaries = match target.primaries(&mut known).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(destination = "redis", reason = %e, "cannot list the primaries");
                continue;
            }
        };
        tasks.retain(|url, task| {
            let keep = primaries.contains(url) && !task.is_finished();
            if !keep {
                tracing::info!(node = %redact_url(url), "no longer followed (not a primary, or its subscription ended)");
                task.abort();
            }
            keep
        });
        for url in primaries {
            if let std::collections::hash_map::Entry::Vacant(slot) = tasks.entry(url.clone()) {
                slot.insert(start(url));
            }
        }
    }
}

/// Milliseconds since the Unix epoch, by this machine's clock.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lists_serving_masters() {
        let text = "a 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                    b 127.0.0.1:7001@17001 master,fail - 0 0 2 connected\n\
                    c 127.0.0.1:7002@17002 slave a 0 0 1 connected\n\
                    d 127.0.0.1:7003@17003 master - 0 0 4 connected 5461-10922\n";
        let nodes = parse_cluster_nodes(text);
        let masters: Vec<_> = nodes
            .iter()
            .filter(|n| n.serving_primary)
            .map(|n| n.url.as_str())
            .collect();
        assert_eq!(
            masters,
            vec!["redis://127.0.0.1:7000", "redis://127.0.0.1:7003"]
        );
        assert_eq!(nodes.len(), 4);
    }
}
