//! End to end: local allowances (`allowance` of a bucket rule). Two nginx
//! instances (two workers each) against one Redis: each node takes
//! allowances with `RL.TAKE ... PARTIAL`, spends them from its shared dict,
//! and gives back what is left with `REFUND` when an allowance ages out
//! and when nginx stops gracefully. Under concurrent load the points
//! admitted never exceed `capacity + refill` over the elapsed time; the
//! unspent points come back exactly.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::Server;
use gateway::{agent, get};
use gateway_policy::{start, Front, PolicyGateway};

/// Longest wait for an allowance to age out, or for nginx to stop.
const ASYNC: Duration = Duration::from_secs(10);

/// The policy: `held` (a bucket of 1000 refilled 1 point a day, allowances
/// of 20 kept up to an hour) on /v1/held, and `busy` (a bucket of 50
/// refilled 10 points a second, allowances of 10 kept half a second) on
/// /v1/busy, both per tenant; `aging` as `held` with allowances kept 1 s;
/// `ahead` as `busy`, its next allowance fetched ahead (a timer) once a
/// node holds fewer than 5 points.
const POLICY: &str = r#"return {
    redis = { port = tonumber(os.getenv("RL_REDIS_PORT")), timeout_ms = 1000 },
    key_prefix = "al",
    identity = { api_key = { keys = { ["k1"] = { key_id = "k1", tenant = "t1", tier = "pro" } } } },
    tiers = { pro = {} },
    rules = {
        { name = "held", match = { path = "/v1/held" }, scope = { "tenant" },
          limiter = { kind = "bucket", burst = 1000, rate = 1, period = 86400 },
          allowance = { size = 20, max_age = 3600 } },
        { name = "aging", match = { path = "/v1/aging" }, scope = { "tenant" },
          limiter = { kind = "bucket", burst = 1000, rate = 1, period = 86400 },
          allowance = { size = 20, max_age = 1 } },
        { name = "busy", match = { path = "/v1/busy" }, scope = { "tenant" },
          limiter = { kind = "bucket", burst = 50, rate = 10, period = 1 },
          allowance = { size = 10, max_age = 0.5 } },
        { name = "ahead", match = { path = "/v1/ahead" }, scope = { "tenant" },
          limiter = { kind = "bucket", burst = 50, rate = 10, period = 1 },
          allowance = { size = 10, max_age = 0.5, refill_below = 5 } },
    },
}"#;

/// Two nginx instances with the policy over `redis`.
fn two_nodes(redis: &Server) -> [PolicyGateway; 2] {
    let node = || {
        start(
            redis.port,
            &[Front::Nginx("dofile(DIR .. \"/policy.lua\")".into())],
            &[("policy.lua", POLICY)],
        )
        .unwrap_or_else(|e| panic!("nginx: {e}"))
    };
    [node(), node()]
}

/// What a `COST 0` probe of rule `name`'s bucket (1000, 1 a day) reads.
fn left(con: &mut redis::Connection, name: &str) -> i64 {
    let reply: Vec<i64> = redis::cmd("RL.TAKE")
        .arg(format!("al:{{tenant:t1}}:{name}"))
        .arg(1000)
        .arg(1)
        .arg(86400)
        .arg("COST")
        .arg(0)
        .query(con)
        .expect("probe");
    reply[2]
}

/// `n` requests to `path` from each of `clients` clients per node at once
/// (stopping at `until`); the number admitted (anything else must be a 429).
fn load(
    nodes: &[PolicyGateway; 2],
    path: &str,
    clients: usize,
    n: usize,
    until: Option<Instant>,
) -> u64 {
    let admitted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for node in nodes {
            for _ in 0..clients {
                let url = format!("{}{path}", node.url(0));
                let admitted = &admitted;
                s.spawn(move || {
                    let a = agent();
                    for _ in 0..n {
                        if until.is_some_and(|t| Instant::now() >= t) {
                            break;
                        }
                        let r = get(&a, &url, &[("X-Api-Key", "k1")]);
                        assert!(r.status == 200 || r.status == 429, "{r:#?}");
                        if r.status == 200 {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        }
    });
    admitted.into_inner()
}

/// A module counter of `INFO rl`.
fn info(redis: &Server, field: &str) -> u64 {
    redis
        .info_get("rl", field)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn allowances_are_spent_locally_and_come_back_when_they_age_and_when_nginx_stops() {
    let redis = Server::start(&[]);
    let mut nodes = two_nodes(&redis);
    let mut con = redis.client();

    // one client per node, 70 requests each: every one admitted, from 4
    // allowances of 20 a node (one fetch per 20 requests), 10 points left
    // on each node
    assert_eq!(load(&nodes, "/v1/held", 1, 70, None), 140);
    assert_eq!(
        info(&redis, "rl_partial_grants"),
        8,
        "one fetch per 20 requests"
    );
    assert_eq!(
        left(&mut con, "held"),
        1000 - 160,
        "the nodes hold 10 points each"
    );

    // aging: what is not spent within max_age goes back
    assert_eq!(load(&nodes, "/v1/aging", 2, 25, None), 100);
    let aged = common::poll_for(ASYNC, Duration::from_millis(50), || {
        (left(&mut con, "aging") == 1000 - 100).then_some(())
    });
    assert!(aged.is_some(), "aged out: {} left", left(&mut con, "aging"));

    // a reload: the old workers of the first node give back its 10 points
    nodes[0].reload();
    let reloaded = common::poll_for(ASYNC, Duration::from_millis(50), || {
        (left(&mut con, "held") == 1000 - 150).then_some(())
    });
    assert!(
        reloaded.is_some(),
        "after a reload: {}",
        left(&mut con, "held")
    );
    // a graceful stop gives back what the nodes still hold
    for node in &mut nodes {
        assert!(node.nginx.quit(ASYNC), "nginx stops within {ASYNC:?}");
    }
    assert_eq!(
        left(&mut con, "held"),
        1000 - 140,
        "every unspent point came back"
    );
    for node in &nodes {
        node.nginx.assert_no_lua_errors();
    }
}

#[test]
fn two_nodes_under_concurrent_load_never_admit_beyond_capacity_plus_refill() {
    let redis = Server::start(&[]);
    let nodes = two_nodes(&redis);
    // fetched in the requests (busy), then also ahead in timers (ahead)
    for path in ["/v1/busy", "/v1/ahead"] {
        let refused_before = info(&redis, "rl_take_throttled");
        // the bucket starts full at the first fetch, after `started`
        let started = Instant::now();
        let admitted = load(
            &nodes,
            path,
            2,
            2000,
            Some(started + Duration::from_secs(3)),
        );
        let elapsed = started.elapsed().as_secs_f64();
        // capacity 50, 10 points a second
        let bound = 50.0 + 10.0 * elapsed;
        assert!(
            (admitted as f64) <= bound,
            "{path}: {admitted} admitted in {elapsed:.2} s: above the bound {bound:.1}"
        );
        assert!(
            admitted >= 50,
            "{path}: the load used the capacity: {admitted}"
        );
        let refused = info(&redis, "rl_take_throttled") - refused_before;
        assert!(
            refused > 0,
            "{path}: the load went beyond the bucket ({admitted} admitted)"
        );
    }
    for node in &nodes {
        node.nginx.assert_no_lua_errors();
    }
}

/// The Kong plugin (under the PDK shim, as in tests/gateway_kong.rs: Kong
/// itself is not installed here) with the same policy as JSON in its
/// `policy` field: allowances are taken, spent from the node's dict and
/// given back at a graceful stop, as under the nginx front end.
#[test]
fn the_kong_plugin_spends_allowances_locally_and_gives_them_back() {
    let redis = Server::start(&[]);
    let mut node = start(
        redis.port,
        &[Front::Kong("dofile(DIR .. \"/policy.lua\")".into())],
        &[("policy.lua", POLICY)],
    )
    .unwrap_or_else(|e| panic!("nginx: {e}"));
    let mut con = redis.client();
    let a = agent();
    let url = format!("{}/v1/held", node.url(0));
    for i in 0..50 {
        let r = get(&a, &url, &[("X-Api-Key", "k1")]);
        assert_eq!(r.status, 200, "request {i}: {r:#?}");
        assert!(r.must("RateLimit").starts_with(r#""held";r="#), "{r:#?}");
    }
    // 50 requests, one after another: allowances of 20 in the node's dict
    // (both workers spend them), one fetch per 20 requests
    assert_eq!(
        info(&redis, "rl_partial_grants"),
        3,
        "one fetch per 20 requests"
    );
    assert_eq!(
        left(&mut con, "held"),
        1000 - 60,
        "the node holds 10 points"
    );
    assert!(node.nginx.quit(ASYNC), "nginx stops within {ASYNC:?}");
    assert_eq!(
        left(&mut con, "held"),
        1000 - 50,
        "every unspent point came back"
    );
    node.nginx.assert_no_lua_errors();
}
