//! End to end: answers decided without Redis say so. Redis is paused
//! (`CLIENT PAUSE`, as the other fallback tests do) while requests go to
//! a route with a short Redis budget and to one whose own budget
//! (`routes[i].timeout_ms`) outlasts the pause, on a tier-form policy and
//! on a rule policy: the first get the local limiter's answers marked
//! `X-RateLimit-Degraded: fallback` (a refusal's body too), counted in
//! `/metrics`; the second waits for Redis and is answered by it, unmarked.
//! Then an error reply (a bucket key holding a string) is marked likewise.
//! Real nginx (2 workers), Redis with the module, real HTTP.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::time::{Duration, Instant};

use common::Server;
use gateway::{agent, counter, get, poll, problem, ratelimit, Resp};
use gateway_policy::{start, Front};

const ASYNC: Duration = Duration::from_secs(10);
/// How long Redis is paused: the short-budget requests must all be
/// answered within it, the patient one must be sent before it ends.
const PAUSE_MS: u64 = 5_000;
/// Requests to the short-budget route while Redis is paused, per policy:
/// the local limiter admits 2 per worker (25 % of a burst of 8), so at
/// least 3 of them are refused.
const DEGRADED_REQUESTS: u64 = 7;
const KEY: (&str, &str) = ("X-Api-Key", "k-small");
const DEGRADED: &str = "X-RateLimit-Degraded";

/// The tier form: one tier with a key burst of 8; `/v1/fast` on the 100 ms
/// budget of `redis.timeout_ms`, `/v1/patient` with its own of 20 s.
const TIER_POLICY: &str = r#"
local p = dofile(GW .. "/test/policy.lua")({
    redis = { port = tonumber(os.getenv("RL_REDIS_PORT")), timeout_ms = 100 },
})
p.key_prefix = "tier"
p.identity = { keys = { ["k-small"] = { tenant = "t1", tier = "small", key_id = "s1" } } }
p.tiers = { small = {
    key = { rate = 1, burst = 8 }, tenant = { rate = 1, burst = 100 }, period = 60,
    strikes = { threshold = 20, window = 60 }, box = { 300, 3600, 86400 }, offenses_ttl = 86400,
} }
p.routes = {
    { method = "GET", template = "/v1/fast", cost = 1 },
    { method = "GET", template = "/v1/patient", cost = 1, timeout_ms = 20000 },
}
return p
"#;

/// The same as a rule policy (its routes under /v1/rules: the two front ends
/// share nginx's counters): one bucket rule per API key.
const RULE_POLICY: &str = r#"
return {
    redis = { port = tonumber(os.getenv("RL_REDIS_PORT")), timeout_ms = 100 },
    key_prefix = "rules",
    identity = { api_key = { keys = { ["k-small"] = { key_id = "s1", tenant = "t1", tier = "pro" } } } },
    tiers = { pro = {} },
    routes = {
        { method = "GET", template = "/v1/rules/fast", cost = 1 },
        { method = "GET", template = "/v1/rules/patient", cost = 1, timeout_ms = 20000 },
    },
    rules = { { name = "key-bucket", scope = { "key_id" }, cost = "route",
                limiter = { kind = "bucket", rate = 1, burst = 8, period = 60 } } },
}
"#;

/// Checks one answer given while Redis is paused on the short budget:
/// marked, from the local limiter (`binding-degraded`); a refusal's body
/// says so too. True when it was admitted.
fn check_degraded(r: &Resp, binding: &str) -> bool {
    assert_eq!(r.header(DEGRADED), Some("fallback"), "{r:#?}");
    match r.status {
        200 => {
            assert_eq!(ratelimit(r).0, format!("{binding}-degraded"), "{r:#?}");
            true
        }
        429 => {
            let b = problem(r, 429, "rate-limit-exceeded");
            assert_eq!(b["degraded"], "fallback", "{b}");
            false
        }
        s => panic!("status {s}: {r:#?}"),
    }
}

#[test]
fn answers_decided_without_redis_are_marked_and_a_route_budget_outlasts_a_pause() {
    let redis = Server::start(&[]);
    let gw = start(
        redis.port,
        &[
            Front::Nginx("dofile(DIR .. \"/tier.lua\")".into()),
            Front::Nginx("dofile(DIR .. \"/rules.lua\")".into()),
        ],
        &[("tier.lua", TIER_POLICY), ("rules.lua", RULE_POLICY)],
    )
    .expect("start");
    let a = agent();
    // base URL, binding policy name, path prefix of the routes
    let fronts = [
        (gw.url(0), "small-key", "/v1"),
        (gw.url(1), "key-bucket", "/v1/rules"),
    ];

    // Redis answers: nothing marked
    for (base, binding, v) in &fronts {
        let r = get(&a, &format!("{base}{v}/fast"), &[KEY]);
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(ratelimit(&r).0, *binding);
        assert!(r.header(DEGRADED).is_none(), "{r:#?}");
    }

    common::call(&mut redis.client(), &format!("CLIENT PAUSE {PAUSE_MS} ALL"))
        .expect("CLIENT PAUSE");
    let paused = Instant::now();
    let mut admitted = Vec::new();
    for (base, binding, v) in &fronts {
        let mut n = 0;
        for _ in 0..DEGRADED_REQUESTS {
            n += u64::from(check_degraded(
                &get(&a, &format!("{base}{v}/fast"), &[KEY]),
                binding,
            ));
        }
        // 2 per worker, 2 workers: at most 4, whichever worker answers
        assert!((1..=4).contains(&n), "{base}: {n} admitted locally");
        admitted.push(n);
    }
    // every answer above came from the local limiter while Redis was
    // still paused, however loaded the machine (a budget is 100 ms)
    assert!(
        paused.elapsed() < Duration::from_millis(PAUSE_MS - 1_000),
        "{:?}",
        paused.elapsed()
    );

    // the patient route's budget outlasts the pause: Redis answers it
    std::thread::scope(|s| {
        let patient: Vec<_> = fronts
            .iter()
            .map(|(base, binding, v)| {
                s.spawn(move || {
                    let r = get(&agent(), &format!("{base}{v}/patient"), &[KEY]);
                    assert_eq!(r.status, 200, "{r:#?}");
                    assert!(r.header(DEGRADED).is_none(), "{r:#?}");
                    assert_eq!(ratelimit(&r).0, *binding, "{r:#?}");
                })
            })
            .collect();
        for p in patient {
            p.join().expect("patient request");
        }
    });
    assert!(
        paused.elapsed() >= Duration::from_millis(PAUSE_MS - 200),
        "the patient requests were answered before the pause ended: {:?}",
        paused.elapsed()
    );

    // counted: the local limiter's decisions and the timeouts behind them
    for ((base, _, v), n) in fronts.iter().zip(&admitted) {
        let (fast, patient) = (format!("GET {v}/fast"), format!("GET {v}/patient"));
        poll(ASYNC, "degraded decisions counted", || {
            counter(&a, base, "degraded_allowed", &fast) == *n
                && counter(&a, base, "degraded_throttled", &fast) == DEGRADED_REQUESTS - n
                && counter(&a, base, "allowed", &patient) == 1
        });
        assert_eq!(counter(&a, base, "allowed", &fast), 1);
        let metrics = get(&a, &format!("{base}/metrics"), &[]).body;
        assert!(
            metrics.contains("rl_gateway_redis_errors_total{kind=\"timeout\"}"),
            "{metrics}"
        );
    }

    // an error reply (the key's bucket is not a bucket): decided without
    // Redis too, marked, counted as an error; fixed, Redis decides again
    let (base, binding, v) = &fronts[0];
    let mut con = redis.client();
    common::call_ok(&mut con, "SET tier:{t:t1}:key:s1 not-a-bucket");
    check_degraded(&get(&a, &format!("{base}{v}/fast"), &[KEY]), binding);
    let metrics = get(&a, &format!("{base}/metrics"), &[]).body;
    assert!(
        metrics.contains("rl_gateway_redis_errors_total{kind=\"error\"}"),
        "{metrics}"
    );
    common::call_ok(&mut con, "DEL tier:{t:t1}:key:s1");
    let r = get(&a, &format!("{base}{v}/fast"), &[KEY]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(r.header(DEGRADED).is_none(), "{r:#?}");
    assert_eq!(ratelimit(&r).0, *binding);

    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}
