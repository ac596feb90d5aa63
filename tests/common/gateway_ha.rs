//! Shared by the gateway's Redis Cluster and Sentinel tests
//! (`tests/gateway_cluster.rs`, `tests/gateway_sentinel.rs`): the rule
//! policy they run (a bucket per key, a quota per tenant, a boxing bucket;
//! every rule fails closed, so a Redis failure answers 503 and never
//! admits), one request, /metrics counters, replication waits and the
//! bounded wait for the gateway to follow a failover.
//!
//! Included next to `common/gateway.rs` and `common/gateway_policy.rs`:
//! `#[path = "common/gateway_ha.rs"] mod gateway_ha;`.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use super::common::{wait_until, Server};
use super::gateway::{agent, get};
use super::gateway_policy::{Front, PolicyGateway};

/// Longest wait for the gateway to follow a failover.
pub const FOLLOW: Duration = Duration::from_secs(30);

/// Burst of every key's bucket (refill 1 an hour: admissions are exact).
pub const BURST: usize = 5;

/// The rule policy with `redis` (a Lua table's fields: mode and
/// endpoints): a bucket per key (header X-Key), a daily quota per tenant
/// (header X-Tenant), a bucket with strikes and a one-hour box for the
/// X-Box of /v1/boxed; fail closed.
pub fn policy(redis: &str) -> Front {
    Front::Nginx(format!(
        r#"{{
    redis = {{ {redis}, timeout_ms = 1000, refresh_ms = 200 }},
    key_prefix = "ha",
    identity = {{ required = false }},
    rules = {{
        {{ name = "key-bucket", scope = {{ "header:X-Key" }}, on_redis_failure = "closed",
          limiter = {{ kind = "bucket", rate = 1, burst = {BURST}, period = 3600 }} }},
        {{ name = "tenant-day", scope = {{ "header:X-Tenant" }}, on_redis_failure = "closed",
          limiter = {{ kind = "quota", limit = 100000, period = "DAY" }} }},
        {{ name = "boxing", match = {{ path = "/v1/boxed" }}, scope = {{ "header:X-Box" }},
          on_redis_failure = "closed",
          limiter = {{ kind = "bucket", rate = 1, burst = 1, period = 3600,
                      strikes = {{ threshold = 1, window = 3600 }}, box = {{ 3600, 3600, 3600 }} }} }},
    }},
}}"#
    ))
}

/// The Redis key of a key's bucket.
pub fn bucket_key(k: &str) -> String {
    format!("ha:{{header:X-Key:{k}}}:key-bucket")
}

/// The Redis key of a boxing bucket.
pub fn box_key(b: &str) -> String {
    format!("ha:{{header:X-Box:{b}}}:boxing")
}

/// The `RL.TAKE ... COST 0` of a key's bucket (a probe: spends nothing).
pub fn bucket_probe(k: &str) -> String {
    format!("RL.TAKE {} {BURST} 1 3600 COST 0", bucket_key(k))
}

/// The `RL.TAKE ... COST 0` of a boxing bucket (status -1: boxed).
pub fn box_probe(b: &str) -> String {
    format!("RL.TAKE {} 1 1 3600 COST 0", box_key(b))
}

/// One request for key `k` of tenant `t`: its status.
pub fn ask(a: &ureq::Agent, gw: &PolicyGateway, k: &str, t: &str) -> u16 {
    get(
        a,
        &format!("{}/v1/work", gw.url(0)),
        &[("X-Key", k), ("X-Tenant", t)],
    )
    .status
}

/// One request of /v1/boxed for box `b`: its status.
pub fn ask_boxed(a: &ureq::Agent, gw: &PolicyGateway, b: &str) -> u16 {
    get(
        a,
        &format!("{}/v1/boxed", gw.url(0)),
        &[("X-Box", b), ("X-Key", "boxer"), ("X-Tenant", "boxers")],
    )
    .status
}

/// A counter of the gateway's /metrics (0 when absent).
pub fn metric(gw: &PolicyGateway, line_start: &str) -> u64 {
    let m = get(&agent(), &format!("{}/metrics", gw.url(0)), &[]);
    m.body
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Waits (bounded) until `replica` has every write of `primary`.
pub fn wait_synced(primary: &Server, replica: &Server) {
    wait_until(Duration::from_secs(10), "replica synced", || {
        let p = primary.info_get("replication", "master_repl_offset");
        let r = replica.info_get("replication", "slave_repl_offset");
        p.is_some() && p == r
    });
}

/// Requests for `k` until one is answered by Redis again (not 503),
/// bounded by [`FOLLOW`]; returns every status seen.
pub fn until_followed(a: &ureq::Agent, gw: &PolicyGateway, k: &str) -> Vec<u16> {
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < FOLLOW {
        let s = ask(a, gw, k, "probes");
        seen.push(s);
        if s != 503 {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the gateway did not follow within {FOLLOW:?}: {seen:?}");
}
