//! Deciding a request's checks in Redis with rl's commands.
//!
//! Checks that can share one command (`RL.WINDOW` in one mode, `RL.TAKE`
//! or `RL.QUOTA`; the same cost, no penalty box, not in shadow mode, and in
//! Redis Cluster the same hash tag) form a group, decided by ONE call with
//! `ALSO` (at most 16 keys): all-or-nothing inside Redis. Every group of a
//! request goes in one pipeline (one per group in a cluster); when a group
//! refuses, the groups that were charged get their points back (`REFUND`),
//! so a refused request is charged nothing. Across groups this is
//! compensation, not isolation: a concurrent request may see the charge for
//! the instant before the refund.

use std::borrow::Borrow;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::AsyncConnectionConfig;
use redis::{Cmd, Pipeline, RedisError, RedisResult, Value};

use crate::config::{Algorithm, Rule, Unit};

/// One rule of one descriptor to decide.
#[derive(Clone, Debug)]
pub struct Check {
    /// Index of the request's descriptor.
    pub desc: usize,
    /// What is counted.
    pub rule: Rule,
    /// The Redis key (for a fixed window: the aligned key of the current window).
    pub key: String,
    /// The hash tag of `key` (what decides its cluster slot).
    pub tag: String,
    /// Points this request spends.
    pub cost: u64,
    /// Counted, never refusing.
    pub shadow: bool,
    /// A fixed window's time to its end (the peer's `duration_until_reset`).
    pub fixed_reset_ms: Option<u64>,
}

impl Check {
    /// The most points the limit can ever admit at once.
    fn capacity(&self) -> u64 {
        match self.rule.algorithm {
            Algorithm::TokenBucket => self.rule.burst,
            _ => u64::from(self.rule.requests_per_unit),
        }
    }
}

/// The decision for one check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The check refuses the request (in shadow mode: would refuse).
    pub over: bool,
    /// Whole points left.
    pub remaining: u64,
    /// Milliseconds until the limit counts nothing (a window) or is full (a bucket).
    pub reset_ms: u64,
    /// When `over`: milliseconds until the request would fit.
    pub retry_ms: u64,
    /// A penalty box is active on the key.
    pub boxed: bool,
}

/// Where the counts live.
#[derive(Clone)]
pub enum Store {
    /// One Redis: one pipeline per request.
    Single(Box<ConnectionManager>),
    /// A Redis Cluster (`MOVED`/`ASK` followed by the client): one pipeline per group.
    Cluster(ClusterConnection),
    /// The primary that Redis Sentinel names, asked again after a failure.
    Sentinel(Arc<SentinelStore>),
}

/// A connection to the primary of a Sentinel-monitored Redis: made through
/// the sentinels, dropped after an error (a timeout, a closed connection,
/// `READONLY` from a demoted primary) so that the next request asks the
/// sentinels again.
pub struct SentinelStore {
    client: tokio::sync::Mutex<SentinelClient>,
    conn: tokio::sync::RwLock<Option<MultiplexedConnection>>,
    timeout: Duration,
}

impl SentinelStore {
    /// A store for `service` (the master name) known to `sentinels`.
    pub fn new(sentinels: Vec<String>, service: String, timeout: Duration) -> RedisResult<Self> {
        let client = SentinelClient::build(sentinels, service, None, SentinelServerType::Master)?;
        Ok(SentinelStore {
            client: tokio::sync::Mutex::new(client),
            conn: tokio::sync::RwLock::new(None),
            timeout,
        })
    }

    async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        if let Some(c) = self.conn.read().await.as_ref() {
            return Ok(c.clone());
        }
        let mut slot = self.conn.write().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(self.timeout)
            .set_response_timeout(self.timeout);
        let c = self
            .client
            .lock()
            .await
            .get_async_connection_with_config(&config)
            .await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn query(&self, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        let mut c = self.connection().await?;
        let r = send(&mut c, pipe).await;
        if r.is_err() {
            *self.conn.write().await = None;
        }
        r
    }
}

/// Sends `pipe` (no command of it ignored): one value per command. A pipe
/// of one command goes as that command, without the pipeline's wrapping.
async fn send<C: ConnectionLike>(conn: &mut C, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
    let mut cmds = pipe.cmd_iter();
    match (cmds.next(), cmds.next()) {
        (Some(cmd), None) => Ok(vec![cmd.query_async(conn).await?]),
        _ => pipe.query_async(conn).await,
    }
}

impl Store {
    async fn run(&self, pipe: &Pipeline, timeout: Duration) -> RedisResult<Vec<Value>> {
        let fut = async {
            match self {
                Store::Single(c) => send(&mut ConnectionManager::clone(c), pipe).await,
                Store::Cluster(c) => send(&mut c.clone(), pipe).await,
                Store::Sentinel(s) => s.query(pipe).await,
            }
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => {
                if let Store::Sentinel(s) = self {
                    *s.conn.write().await = None;
                }
                Err(RedisError::from((
                    redis::ErrorKind::IoError,
                    "redis timed out",
                )))
            }
        }
    }

    /// Whether Redis answers and has the rl module (for the health checks):
    /// `COMMAND INFO RL.WINDOW` describes the command, or answers nil
    /// without the module. `Err` says why not.
    pub async fn ready(&self, timeout: Duration) -> Result<(), &'static str> {
        let mut pipe = redis::pipe();
        pipe.cmd("COMMAND").arg("INFO").arg("RL.WINDOW");
        let values = self
            .run(&pipe, timeout)
            .await
            .map_err(|_| "redis unavailable")?;
        match values.first() {
            Some(Value::Array(info)) if info.iter().any(|i| *i != Value::Nil) => Ok(()),
            _ => Err("redis lacks the rl module"),
        }
    }

    fn is_cluster(&self) -> bool {
        matches!(self, Store::Cluster(_))
    }
}

/// What a command does with its keys.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Charge,
    Refund,
    Probe,
}

/// Groups of indices into `checks` (see the module's documentation).
pub fn group<C: Borrow<Check>>(checks: &[C], by_tag: bool) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, c) in checks.iter().enumerate() {
        let c = c.borrow();
        let alone = c.shadow || c.rule.strikes.is_some();
        let fits = |g: &Vec<usize>| {
            let f = checks[g[0]].borrow();
            g.len() < 16
                && !f.shadow
                && f.rule.strikes.is_none()
                && f.rule.algorithm == c.rule.algorithm
                && f.cost == c.cost
                && (!by_tag || f.tag == c.tag)
                && g.iter().all(|&j| checks[j].borrow().key != c.key)
        };
        match (alone, groups.iter_mut().find(|g| fits(g))) {
            (false, Some(g)) => g.push(i),
            _ => groups.push(vec![i]),
        }
    }
    groups
}

fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

fn bucket_args(cmd: &mut Cmd, c: &Check) {
    let unit_ms = c.rule.unit.seconds() * 1000;
    let limit = u64::from(c.rule.requests_per_unit);
    match c.rule.algorithm {
        Algorithm::Fixed => {
            let w = crate::keys::fixed_window_ms(c.rule.unit);
            cmd.arg(&c.key).arg(limit).arg(seconds(w));
        }
        Algorithm::SlidingWindow | Algorithm::Exact => {
            cmd.arg(&c.key).arg(limit).arg(seconds(unit_ms));
        }
        Algorithm::TokenBucket => {
            cmd.arg(&c.key)
                .arg(c.rule.burst)
                .arg(limit)
                .arg(seconds(unit_ms));
        }
        Algorithm::Calendar => {
            let period = match c.rule.unit {
                Unit::Day => "DAY",
                Unit::Week => "WEEK",
                // the configuration admits only day, week and month
                _ => "MONTH",
            };
            cmd.arg(&c.key).arg(limit).arg(period);
        }
    }
}

/// The one command deciding `members` (indices into `checks`).
fn command<C: Borrow<Check>>(checks: &[C], members: &[usize], mode: Mode) -> Cmd {
    let first = checks[members[0]].borrow();
    let mut cmd = redis::cmd(match first.rule.algorithm {
        Algorithm::TokenBucket => "RL.TAKE",
        Algorithm::Calendar => "RL.QUOTA",
        _ => "RL.WINDOW",
    });
    bucket_args(&mut cmd, first);
    match mode {
        Mode::Charge => cmd.arg("COST").arg(first.cost),
        Mode::Refund => cmd.arg("REFUND").arg(first.cost),
        Mode::Probe => cmd.arg("COST").arg(0),
    };
    for &i in &members[1..] {
        cmd.arg("ALSO");
        bucket_args(&mut cmd, checks[i].borrow());
    }
    match first.rule.algorithm {
        Algorithm::Fixed => {
            cmd.arg("FIXED");
        }
        Algorithm::Exact => {
            cmd.arg("EXACT");
        }
        _ => {}
    }
    if let (Some(s), Mode::Charge) = (&first.rule.strikes, mode) {
        cmd.arg("STRIKES")
            .arg(s.threshold)
            .arg(s.window)
            .arg("BOX")
            .arg(s.boxes[0])
            .arg(s.boxes[1])
            .arg(s.boxes[2]);
    }
    cmd
}

/// rl's reply: status, limit, remaining, reset_ms, retry_after_ms, box
/// level, strikes remaining, binding.
fn reply(v: &Value) -> RedisResult<[i64; 8]> {
    let ints: Vec<i64> = redis::from_redis_value(v)?;
    let mut out = [0; 8];
    if ints.len() < 8 {
        return Err(RedisError::from((
            redis::ErrorKind::TypeError,
            "rl reply shorter than 8 integers",
        )));
    }
    out.copy_from_slice(&ints[..8]);
    Ok(out)
}

fn outcome(c: &Check, r: &[i64; 8], over: bool) -> Outcome {
    let boxed = r[0] == -1;
    let non_neg = |v: i64| u64::try_from(v).unwrap_or(0);
    let (reset_ms, retry_ms) = match c.fixed_reset_ms {
        Some(end) => (end, if boxed { non_neg(r[4]).max(end) } else { end }),
        None => (non_neg(r[3]), non_neg(r[4])),
    };
    Outcome {
        over,
        remaining: non_neg(r[2]),
        reset_ms,
        retry_ms: if over { retry_ms } else { 0 },
        boxed,
    }
}

/// A check that no call can admit (a limit of 0, or a cost above it).
fn never_fits(c: &Check) -> Outcome {
    let reset = c.fixed_reset_ms.unwrap_or(c.rule.unit.seconds() * 1000);
    Outcome {
        over: true,
        remaining: 0,
        reset_ms: reset,
        retry_ms: reset,
        boxed: false,
    }
}

/// What [`decide`] found.
#[derive(Debug)]
pub struct Decided {
    /// One outcome per check.
    pub outcomes: Vec<Outcome>,
    /// Giving the points back after a refusal failed: the refusal stands,
    /// the admitting groups stay charged until their limits forget it.
    pub refund_error: Option<RedisError>,
}

/// Decides `checks` (see the module's documentation). An error is one
/// before any decision; a refusal stands even when its refund fails
/// ([`Decided::refund_error`]).
pub async fn decide(store: &Store, checks: &[Check], timeout: Duration) -> RedisResult<Decided> {
    let mut outcomes: Vec<Option<Outcome>> = vec![None; checks.len()];
    // the checks to send, and their indices in `checks`
    let mut sendable: Vec<&Check> = Vec::with_capacity(checks.len());
    let mut index = Vec::with_capacity(checks.len());
    for (i, c) in checks.iter().enumerate() {
        if c.capacity() == 0 || c.cost > c.capacity() {
            outcomes[i] = Some(never_fits(c));
        } else {
            sendable.push(c);
            index.push(i);
        }
    }
    let groups = group(&sendable, store.is_cluster());
    // one pipeline per group: its call, then a probe of each member when
    // several (the call's reply describes only the binding one)
    let pipes: Vec<Pipeline> = groups
        .iter()
        .map(|g| {
            let mut p = redis::pipe();
            p.add_command(command(&sendable, g, Mode::Charge));
            if g.len() > 1 {
                for &m in g {
                    p.add_command(command(&sendable, &[m], Mode::Probe));
                }
            }
            p
        })
        .collect();
    let replies = run_all(store, &pipes, timeout).await?;
    let mut refused = false;
    let mut charged = Vec::new();
    for (g, values) in groups.iter().zip(&replies) {
        let call = reply(values.first().unwrap_or(&Value::Nil))?;
        let ok = call[0] == 1 || call[0] == 2;
        let shadow = sendable[g[0]].shadow;
        if !ok && !shadow {
            refused = true;
        }
        if ok && sendable[g[0]].cost > 0 {
            charged.push(g);
        }
        for (n, &m) in g.iter().enumerate() {
            let c = sendable[m];
            let o = if g.len() == 1 {
                outcome(c, &call, !ok)
            } else {
                let probe = reply(values.get(n + 1).unwrap_or(&Value::Nil))?;
                let binding = usize::try_from(call[7]).unwrap_or(0) == n;
                let over =
                    !ok && (binding || probe[0] == -1 || (probe[2] as i128) < c.cost as i128);
                outcome(c, &probe, over)
            };
            outcomes[index[m]] = Some(o);
        }
    }
    let mut refund_error = None;
    if refused && !charged.is_empty() {
        let pipes: Vec<Pipeline> = charged
            .iter()
            .map(|g| {
                let mut p = redis::pipe();
                p.add_command(command(&sendable, g, Mode::Refund));
                p
            })
            .collect();
        match run_all(store, &pipes, timeout).await {
            Ok(_) => {
                for g in &charged {
                    for &m in g.iter() {
                        let c = sendable[m];
                        if let Some(o) = outcomes[index[m]].as_mut() {
                            o.remaining = o.remaining.saturating_add(c.cost).min(c.capacity());
                        }
                    }
                }
            }
            Err(e) => refund_error = Some(e),
        }
    }
    Ok(Decided {
        outcomes: outcomes
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect(),
        refund_error,
    })
}

/// Runs the pipelines: as one on a single Redis, concurrently in a cluster
/// (every one runs; the first error is the answer).
async fn run_all(
    store: &Store,
    pipes: &[Pipeline],
    timeout: Duration,
) -> RedisResult<Vec<Vec<Value>>> {
    if pipes.is_empty() {
        return Ok(Vec::new());
    }
    match store {
        Store::Single(_) | Store::Sentinel(_) if pipes.len() == 1 => {
            Ok(vec![store.run(&pipes[0], timeout).await?])
        }
        Store::Single(_) | Store::Sentinel(_) => {
            let mut all = redis::pipe();
            let mut sizes = Vec::with_capacity(pipes.len());
            for p in pipes {
                let cmds: Vec<&Cmd> = p.cmd_iter().collect();
                sizes.push(cmds.len());
                for c in cmds {
                    all.add_command(c.clone());
                }
            }
            let mut values = store.run(&all, timeout).await?.into_iter();
            Ok(sizes
                .into_iter()
                .map(|n| values.by_ref().take(n).collect())
                .collect())
        }
        Store::Cluster(_) => {
            let futs = pipes.iter().map(|p| store.run(p, timeout));
            let mut out = Vec::with_capacity(pipes.len());
            for r in futures_util::future::join_all(futs).await {
                out.push(r?);
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
