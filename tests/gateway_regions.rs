//! End to end: the tiered example (`gateway/examples/tiered.lua`) in two
//! regions with `RL_REGIONS=1` (gateway/README.md, "Several regions";
//! docs/regions.md): two redis-server with the module (`region eu` and
//! `region us` of `regions eu,us`), one nginx per region on its own Redis,
//! one `rlctl regions sync` worker per region. One API key's traffic
//! through both gateways uses up its tenant's monthly quota globally: a
//! region admits what the total it sees leaves and refuses once the total
//! reaches the limit, and both usage dashboards show the global count.
//! The phases wait for the sync between them, so no region decides on a
//! stale view (docs/regions.md's bound is then the limit itself).

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{fresh_dir, ints, poll_for, Server};
use gateway::{agent, get, problem, Resp};
use gateway_policy::{example, hset, key_record, rlctl_bin, start_with_env, PolicyGateway};
use serde_json::Value;

/// Every region, as `rl.regions`.
const REGIONS: &str = "eu,us";
/// The tenant's monthly quota (an identity store override of the tier's).
const LIMIT: u64 = 30;
/// The API key of the test, of tenant `app-r` on the developer tier.
const API_KEY: &str = "region-key";
/// The quota's Redis key (the tiered example's `{tier}-monthly` rule).
const QUOTA_KEY: &str = "tq:{tenant:app-r}:tier-monthly";
/// Longest wait for a region's calls to show in the other region (a
/// worker's merge: milliseconds; bounded far above for a loaded machine).
const SYNC: Duration = Duration::from_secs(20);

/// One `rlctl regions sync` worker; stopped (SIGKILL) when dropped.
struct SyncWorker {
    child: Child,
    log: PathBuf,
}

impl SyncWorker {
    /// Starts region `local`'s worker (its Redis `own`, the other region
    /// `remote` named `remote_name`) and waits (30 s at most) until it has
    /// scanned its Redis and follows the other region's stream.
    fn start(dir: &Path, local: &str, own: &Server, remote_name: &str, remote: &Server) -> Self {
        let config = dir.join(format!("rlctl-{local}.toml"));
        let text = format!(
            "[redis]\nurls = [\"redis://127.0.0.1:{}\"]\ntimeout_ms = 2000\n\n\
             [regions]\nlocal = \"{local}\"\nblock_ms = 500\nretry_ms = 200\n\n\
             [regions.remote.{remote_name}]\nurls = [\"redis://127.0.0.1:{}\"]\n\
             timeout_ms = 2000\n",
            own.port, remote.port
        );
        std::fs::write(&config, text).expect("write the worker's configuration");
        let log = dir.join(format!("sync-{local}.log"));
        let file = std::fs::File::create(&log).expect("worker log");
        let child = Command::new(rlctl_bin())
            .arg("--config")
            .arg(&config)
            .args(["regions", "sync"])
            .env("RLCTL_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("spawn rlctl regions sync");
        let w = SyncWorker { child, log };
        let ready = poll_for(Duration::from_secs(30), Duration::from_millis(100), || {
            let text = w.log_text();
            (text.contains("reconciled") && text.contains("following")).then_some(())
        });
        assert!(
            ready.is_some(),
            "worker {local} not ready:\n{}",
            w.log_text()
        );
        w
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for SyncWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A region: its Redis (the module told the region) and its gateway
/// running the tiered example with regions on.
struct Region {
    name: &'static str,
    redis: Server,
    gw: PolicyGateway,
}

impl Region {
    /// Starts region `name`; its identity store holds the test's key and
    /// the tenant's quota (each region's store is its own Redis).
    fn start(name: &'static str) -> Region {
        let redis = Server::start(&["region", name, "regions", REGIONS]);
        let mut con = redis.client();
        let rec = key_record("tq", API_KEY);
        hset(
            &mut con,
            &rec,
            &[
                ("key_id", "r-1"),
                ("tenant", "app-r"),
                ("tier", "developer"),
            ],
        );
        hset(
            &mut con,
            "tq:id:tenant:app-r",
            &[("monthly", &LIMIT.to_string())],
        );
        let gw = start_with_env(
            redis.port,
            &[example("tiered")],
            &[],
            &[("RL_REGIONS", "1")],
        )
        .unwrap_or_else(|e| panic!("{name}'s gateway: {e}"));
        Region { name, redis, gw }
    }

    /// Sends up to `n` requests of the key, stopping at the first one not
    /// admitted: how many were admitted, and that refusal.
    fn send(&self, n: usize) -> (u64, Option<Resp>) {
        let a = agent();
        let url = format!("{}/v1/things", self.gw.url(0));
        for i in 0..n {
            let r = get(&a, &url, &[("X-Api-Key", API_KEY)]);
            if r.status != 200 {
                return (i as u64, Some(r));
            }
        }
        (n as u64, None)
    }

    /// The monthly quota's `(used, limit)` on this region's usage
    /// dashboard, and the whole report.
    fn usage(&self) -> (Option<(u64, u64)>, Value) {
        let r = get(
            &agent(),
            &format!("{}/_rl/usage", self.gw.url(0)),
            &[("X-Api-Key", API_KEY)],
        );
        assert_eq!(r.status, 200, "{}: {r:#?}", self.name);
        let u = r.json();
        let quota = u["policies"].as_array().and_then(|ps| {
            ps.iter()
                .find(|p| p["name"] == "developer-monthly")
                .and_then(|p| Some((p["used"].as_u64()?, p["limit"].as_u64()?)))
        });
        (quota, u)
    }

    /// Waits (bounded by [`SYNC`]) until the usage dashboard shows `used`
    /// of the monthly quota; the report.
    fn shows(&self, used: u64) -> Value {
        let mut last = Value::Null;
        let got = poll_for(SYNC, Duration::from_millis(100), || {
            let (q, u) = self.usage();
            last = u;
            (q == Some((used, LIMIT))).then_some(())
        });
        assert!(
            got.is_some(),
            "{}'s dashboard never showed {used} of {LIMIT}: {last}",
            self.name
        );
        last
    }

    /// `RL.QUOTA <quota key> LIMIT MONTH COST 0 REGION` on this region's
    /// Redis: the 8 integers (the third is what is left of the total).
    fn probe(&self) -> Vec<i64> {
        ints(
            &mut self.redis.client(),
            &format!("RL.QUOTA {QUOTA_KEY} {LIMIT} MONTH COST 0 REGION"),
        )
    }
}

/// A refusal of the monthly quota: 403 `quota-exceeded` naming the rule.
fn quota_refusal(r: Option<Resp>, region: &str) {
    let r = r.unwrap_or_else(|| panic!("{region} admitted every request"));
    let b = problem(&r, 403, "quota-exceeded");
    assert_eq!(b["policy"], "developer-monthly", "{region}: {b}");
}

#[test]
fn the_tiered_example_shares_a_monthly_quota_across_two_regions() {
    let eu = Region::start("eu");
    let us = Region::start("us");
    let dir = fresh_dir("gateway-regions");
    let _workers = [
        SyncWorker::start(&dir, "eu", &eu.redis, "us", &us.redis),
        SyncWorker::start(&dir, "us", &us.redis, "eu", &eu.redis),
    ];

    // eu takes 12 of the 30: admitted, and seen by both dashboards
    let (admitted, refusal) = eu.send(12);
    assert_eq!((admitted, refusal.map(|r| r.status)), (12, None));
    eu.shows(12);
    us.shows(12);

    // us admits exactly what the total leaves, then refuses
    let (admitted, refusal) = us.send(40);
    assert_eq!(admitted, LIMIT - 12, "us admits the 18 left of the total");
    quota_refusal(refusal, "us");

    // once us's calls are merged, eu refuses too: the limit is global
    let report = eu.shows(LIMIT);
    assert_eq!(report["quota"]["policy"], "developer-monthly", "{report}");
    assert_eq!(report["quota"]["left"], 0, "{report}");
    let (admitted, refusal) = eu.send(5);
    assert_eq!(admitted, 0, "eu admits nothing past the global limit");
    quota_refusal(refusal, "eu");

    // both regions hold the same total, every point counted once: eu's 12
    // and us's 18 (the refused requests spent nothing)
    let report = us.shows(LIMIT);
    let days = report["quota"]["days"]
        .as_array()
        .expect("the month by day");
    let by_day: u64 = days.iter().filter_map(|d| d["used"].as_u64()).sum();
    assert_eq!(
        by_day, LIMIT,
        "the per-day counters are global too: {report}"
    );
    for r in [&eu, &us] {
        assert_eq!(r.probe()[2], 0, "{}: nothing left of the total", r.name);
        r.gw.nginx.assert_no_lua_errors();
    }
    let components = |r: &Region| -> Vec<(String, i64, i64)> {
        let v: Vec<redis::Value> = redis::cmd("RL.REGION")
            .arg("READ")
            .arg(QUOTA_KEY)
            .query(&mut r.redis.client())
            .expect("RL.REGION READ");
        let list: Vec<Vec<redis::Value>> = redis::from_redis_value(&v[2]).expect("the components");
        let mut out: Vec<(String, i64, i64)> = list
            .iter()
            .map(|c| {
                (
                    redis::from_redis_value(&c[0]).expect("region"),
                    redis::from_redis_value(&c[1]).expect("added"),
                    redis::from_redis_value(&c[2]).expect("refunded"),
                )
            })
            .collect();
        out.sort();
        out
    };
    let want = vec![("eu".to_string(), 12, 0), ("us".to_string(), 18, 0)];
    assert_eq!(components(&eu), want, "eu's components");
    assert_eq!(components(&us), want, "us's components");
}
