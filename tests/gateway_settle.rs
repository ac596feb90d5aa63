//! End to end: post-paid charging (`settle` of a rule: an estimate before,
//! `DEBT` or `REFUND` of the difference after the response, from an
//! upstream header, the `usage.total_tokens` of an OpenAI-compatible JSON
//! body or event stream, or the bytes sent) and priority tiers (`reserve`
//! of a fleet bucket shared by every tenant). Real nginx (two workers),
//! Redis with the module, real HTTP; the upstream is
//! `gateway/test/upstream.lua` (`/v1/llm/...`). Each settled amount is
//! checked in Redis with a `COST 0` probe.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Server;
use gateway::{agent, get, poll, ratelimit};
use gateway_policy::{start, Front, PolicyGateway};

/// Long enough for a log-phase timer on a loaded machine.
const ASYNC: Duration = Duration::from_secs(10);

/// Starts nginx with the policy `src` (Lua) against `redis`.
fn gateway_with(redis: &Server, src: &str) -> PolicyGateway {
    front_with(redis, src, Front::Nginx)
}

/// Starts nginx with the policy `src` run by `front` (the nginx front end
/// or the Kong plugin).
fn front_with(redis: &Server, src: &str, front: fn(String) -> Front) -> PolicyGateway {
    start(
        redis.port,
        &[front("dofile(DIR .. \"/policy.lua\")".into())],
        &[("policy.lua", src)],
    )
    .unwrap_or_else(|e| panic!("nginx: {e}"))
}

/// The post-paid policy: estimates of 100 tokens (header, chat) and 1000
/// bytes (egress), each on its own limiter kind; refills that are
/// negligible during a test (1 point a day), so every amount is exact.
const SETTLE_POLICY: &str = r#"return {
    redis = { port = tonumber(os.getenv("RL_REDIS_PORT")), timeout_ms = 1000 },
    key_prefix = "pp",
    identity = { api_key = { keys = { ["k1"] = { key_id = "k1", tenant = "t1", tier = "pro" } } } },
    tiers = { pro = {} },
    rules = {
        { name = "upstream-tokens", match = { path = "/v1/llm/header" }, cost = 100,
          limiter = { kind = "bucket", burst = 1000, rate = 1, period = 86400 },
          settle = { from = "header", header = "X-Usage-Tokens" } },
        { name = "llm-tokens", match = { path = "/v1/llm/chat" }, cost = 100, unit = "tokens",
          limiter = { kind = "quota", limit = 1000, period = "DAY" },
          settle = { from = "usage" } },
        { name = "egress", match = { path = "/v1/llm/bytes" }, cost = 1000,
          limiter = { kind = "window", limit = 100000, window = 3600 },
          settle = { from = "bytes" } },
    },
}"#;

/// `remaining` of a `COST 0` probe (`cmd` without its COST); negative: the
/// debt of a bucket.
fn probe(con: &mut redis::Connection, cmd: &[&str]) -> i64 {
    let mut c = redis::cmd(cmd[0]);
    for a in &cmd[1..] {
        c.arg(*a);
    }
    let reply: Vec<i64> = c.arg("COST").arg(0).query(con).expect("probe");
    if cmd[0] == "RL.TAKE" && reply[0] == 0 {
        // a bucket in debt probes as 0 left; its wait until 0 says the debt
        // (these buckets refill 1 point a day)
        return -((reply[4] + 86_399_999) / 86_400_000);
    }
    reply[2]
}

/// Polls the probe until it reads `want` (the log phase's timer settles
/// after the response).
fn settles_to(con: &mut redis::Connection, cmd: &[&str], want: i64) {
    let mut last = 0;
    let settled = common::poll_for(ASYNC, Duration::from_millis(20), || {
        last = probe(con, cmd);
        (last == want).then_some(())
    });
    assert!(settled.is_some(), "{cmd:?} settles to {want}, reads {last}");
    // and stays there: nothing else is charged later
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(probe(con, cmd), want, "{cmd:?} after settling (was {last})");
}

#[test]
fn a_header_set_by_the_upstream_settles_debt_and_refund_exactly() {
    let redis = Server::start(&[]);
    let gw = gateway_with(&redis, SETTLE_POLICY);
    let mut con = redis.client();
    let a = agent();
    let url = |q: &str| format!("{}/v1/llm/header?{q}", gw.url(0));
    let key = [
        "RL.TAKE",
        "pp:{key_id:k1}:upstream-tokens",
        "1000",
        "1",
        "86400",
    ];
    let k = [("X-Api-Key", "k1")];

    // estimate 100 before, actual 250 after: a debt of 150
    let r = get(&a, &url("usage_header=250"), &k);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 900, "{r:#?}");
    assert!(
        r.header("X-Usage-Tokens").is_none(),
        "the usage header is hidden: {r:#?}"
    );
    settles_to(&mut con, &key, 750);
    // the next response shows the debt: 750 - its own estimate
    let r = get(&a, &url("usage_header=30"), &k);
    assert_eq!(ratelimit(&r).1, 650, "{r:#?}");
    // actual 30 < estimate 100: a refund of 70
    settles_to(&mut con, &key, 720);
    // no header: the estimate stands (and a warning says so)
    let r = get(&a, &url(""), &k);
    assert_eq!(ratelimit(&r).1, 620, "{r:#?}");
    poll(ASYNC, "the missing usage is logged", || {
        gw.nginx
            .error_log()
            .contains("no actual cost in the response (header)")
    });
    assert_eq!(probe(&mut con, &key), 620);
    // a debt beyond the capacity: the bucket goes below empty and the
    // next request is refused until the refill repays it
    let r = get(&a, &url("usage_header=2100"), &k);
    assert_eq!(r.status, 200, "{r:#?}");
    settles_to(&mut con, &key, 620 - 2100);
    let r = get(&a, &url("usage_header=1"), &k);
    assert_eq!(r.status, 429, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 0, "{r:#?}");
    let retry: u64 = r.must("Retry-After").parse().expect("Retry-After");
    // 1480 points of debt at 1 a day, then the estimate of 100
    assert!(
        retry > 1579 * 86400,
        "Retry-After {retry} includes the repayment"
    );
    assert_eq!(
        probe(&mut con, &key),
        620 - 2100,
        "a refusal charges nothing"
    );
    gw.nginx.assert_no_lua_errors();
}

#[test]
fn openai_usage_settles_from_a_json_body_and_from_a_stream_and_bytes_from_egress() {
    let redis = Server::start(&[]);
    let gw = gateway_with(&redis, SETTLE_POLICY);
    let mut con = redis.client();
    let a = agent();
    let k = [("X-Api-Key", "k1")];
    let quota = ["RL.QUOTA", "pp:{key_id:k1}:llm-tokens", "1000", "DAY"];

    // a chat completion of 340 tokens: a debt of 240
    let r = get(&a, &format!("{}/v1/llm/chat?tokens=340", gw.url(0)), &k);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(
        r.json()["usage"]["total_tokens"],
        340,
        "the body passes untouched"
    );
    settles_to(&mut con, &quota, 1000 - 340);
    // streamed: 57 tokens in the final chunk (split across two writes; the
    // content mentions "total_tokens" too): a refund of 43
    let r = get(
        &a,
        &format!("{}/v1/llm/chat?tokens=57&stream=1", gw.url(0)),
        &k,
    );
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(r.must("Content-Type").starts_with("text/event-stream"));
    assert_eq!(
        r.body.matches("data: ").count(),
        7,
        "every event passes: {}",
        r.body
    );
    assert!(r.body.contains("\"total_tokens\":57") && r.body.ends_with("data: [DONE]\n\n"));
    settles_to(&mut con, &quota, 1000 - 340 - 57);
    // the next response's RateLimit shows what the usage left
    let r = get(&a, &format!("{}/v1/llm/chat?tokens=100", gw.url(0)), &k);
    assert_eq!(ratelimit(&r).1, 1000 - 340 - 57 - 100, "{r:#?}");
    settles_to(&mut con, &quota, 1000 - 340 - 57 - 100);
    // a response without usage: the estimate stands
    let r = get(&a, &format!("{}/v1/llm/chat", gw.url(0)), &k);
    assert_eq!(r.status, 200);
    poll(ASYNC, "the missing usage is logged", || {
        gw.nginx
            .error_log()
            .contains("no actual cost in the response (usage)")
    });
    assert_eq!(probe(&mut con, &quota), 1000 - 340 - 57 - 200);

    // egress: estimate 1000 bytes, 5000 sent (a debt), then 10 (a refund)
    let window = ["RL.WINDOW", "pp:{key_id:k1}:egress", "100000", "3600"];
    let r = get(&a, &format!("{}/v1/llm/bytes?bytes=5000", gw.url(0)), &k);
    assert_eq!((r.status, r.body.len()), (200, 5000));
    settles_to(&mut con, &window, 100000 - 5000);
    let r = get(&a, &format!("{}/v1/llm/bytes?bytes=10", gw.url(0)), &k);
    assert_eq!(ratelimit(&r).1, 100000 - 5000 - 1000, "{r:#?}");
    settles_to(&mut con, &window, 100000 - 5010);
    gw.nginx.assert_no_lua_errors();
}

#[test]
fn a_usage_rule_without_the_body_filter_keeps_its_estimate_and_says_why() {
    let redis = Server::start(&[]);
    let gw = front_with(&redis, SETTLE_POLICY, Front::NginxWithoutBodyFilter);
    let mut con = redis.client();
    let quota = ["RL.QUOTA", "pp:{key_id:k1}:llm-tokens", "1000", "DAY"];
    let r = get(
        &agent(),
        &format!("{}/v1/llm/chat?tokens=340", gw.url(0)),
        &[("X-Api-Key", "k1")],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(
        r.json()["usage"]["total_tokens"],
        340,
        "the body passes untouched"
    );
    poll(ASYNC, "the unread body is logged", || {
        gw.nginx.error_log().contains(
            "llm-tokens: no actual cost in the response (usage: the body was not read, \
             settle.from = \"usage\" needs body_filter_by_lua); the estimate 100 stands",
        )
    });
    assert_eq!(
        probe(&mut con, &quota),
        1000 - 100,
        "the estimate, not the 340 used"
    );
    gw.nginx.assert_no_lua_errors();
}

#[test]
fn the_kong_plugin_settles_a_header_and_a_streamed_usage() {
    let redis = Server::start(&[]);
    let gw = front_with(&redis, SETTLE_POLICY, Front::Kong);
    let mut con = redis.client();
    let a = agent();
    let k = [("X-Api-Key", "k1")];
    let r = get(
        &a,
        &format!("{}/v1/llm/header?usage_header=250", gw.url(0)),
        &k,
    );
    assert_eq!((r.status, ratelimit(&r).1), (200, 900), "{r:#?}");
    let bucket = [
        "RL.TAKE",
        "pp:{key_id:k1}:upstream-tokens",
        "1000",
        "1",
        "86400",
    ];
    settles_to(&mut con, &bucket, 750);
    let r = get(
        &a,
        &format!("{}/v1/llm/chat?tokens=57&stream=1", gw.url(0)),
        &k,
    );
    assert!(
        r.status == 200 && r.body.ends_with("data: [DONE]\n\n"),
        "{r:#?}"
    );
    let quota = ["RL.QUOTA", "pp:{key_id:k1}:llm-tokens", "1000", "DAY"];
    settles_to(&mut con, &quota, 1000 - 57);
    gw.nginx.assert_no_lua_errors();
}

/// The priority policy: one fleet bucket per route (100 points on
/// /v1/seq, 300 on /v1/load), shared by every tenant; Free keeps 50 % of
/// it for the others, Business 20 %, Enterprise nothing. Refill 1 point a
/// day: the counts are exact.
const TIER_POLICY: &str = r#"return {
    redis = { port = tonumber(os.getenv("RL_REDIS_PORT")), timeout_ms = 1000 },
    key_prefix = "prio",
    identity = { api_key = { keys = {
        ["k-free"] = { key_id = "f1", tenant = "t-free", tier = "free" },
        ["k-biz"] = { key_id = "b1", tenant = "t-biz", tier = "business" },
        ["k-ent"] = { key_id = "e1", tenant = "t-ent", tier = "enterprise" },
    } } },
    tiers = { free = { reserve = 50 }, business = { reserve = 20 }, enterprise = { reserve = 0 } },
    routes = { { method = "GET", template = "/v1/seq" }, { method = "GET", template = "/v1/load" } },
    rules = {
        { name = "fleet", match = { path = "/v1/seq" }, scope = { "route" },
          limiter = { kind = "bucket", burst = 100, rate = 1, period = 86400,
                      reserve = "tier.reserve" } },
        { name = "fleet-load", match = { path = "/v1/load" }, scope = { "route" },
          limiter = { kind = "bucket", burst = 300, rate = 1, period = 86400,
                      reserve = "tier.reserve" } },
    },
}"#;

#[test]
fn lower_tiers_are_refused_first_and_the_top_tier_gets_through() {
    let redis = Server::start(&[]);
    let gw = gateway_with(&redis, TIER_POLICY);
    let a = agent();
    let seq = format!("{}/v1/seq", gw.url(0));
    let admitted = |key: &str, n: usize| {
        (0..n)
            .filter(|_| {
                let r = get(&a, &seq, &[("X-Api-Key", key)]);
                assert!(r.status == 200 || r.status == 429, "{r:#?}");
                r.status == 200
            })
            .count()
    };
    // a deterministic sequence on a bucket of 100: Free stops at 50 left,
    // Business at 20, Enterprise empties it
    assert_eq!(admitted("k-free", 60), 50);
    assert_eq!(admitted("k-biz", 40), 30);
    assert_eq!(admitted("k-free", 5), 0);
    assert_eq!(admitted("k-ent", 30), 20);
    assert_eq!(admitted("k-biz", 5), 0);

    // overload: 3 clients per tier at once, 150 requests each, on a fleet
    // bucket of 300 (1350 requests for 300 points)
    let counts: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let load = format!("{}/v1/load", gw.url(0));
    std::thread::scope(|s| {
        for (tier, key) in ["k-free", "k-biz", "k-ent"].iter().enumerate() {
            for _ in 0..3 {
                let (counts, load) = (counts.clone(), load.clone());
                s.spawn(move || {
                    let a = agent();
                    for _ in 0..150 {
                        let r = get(&a, &load, &[("X-Api-Key", key)]);
                        assert!(r.status == 200 || r.status == 429, "{r:#?}");
                        if r.status == 200 {
                            counts[tier].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        }
    });
    let [free, biz, ent] = [0, 1, 2].map(|i| counts[i].load(Ordering::Relaxed));
    // the refill adds at most 1 point during the test
    assert!(
        free <= 151,
        "Free took {free} of 300 (it keeps 150 for the others)"
    );
    assert!(
        free + biz <= 241,
        "Free and Business took {free} + {biz} (they keep 60)"
    );
    assert!(
        (300..=301).contains(&(free + biz + ent)),
        "{free} + {biz} + {ent}"
    );
    assert!(
        ent >= 60,
        "Enterprise got {ent} (at least the 20 % nobody else may take)"
    );
    assert!(free < 450 && biz < 450, "both lower tiers were refused");
    gw.nginx.assert_no_lua_errors();
}

#[test]
fn bad_reserve_settle_and_allowance_options_stop_nginx_with_the_field_named() {
    let redis = Server::start(&[]);
    let bucket = r#"{ kind = "bucket", burst = 100, rate = 1, period = 60 }"#;
    let cases = [
        (
            r#"{ kind = "bucket", burst = 100, rate = 1, reserve = 101 }"#,
            "",
            "rules[1] (r).limiter: reserve must be an integer percent from 0 to 100",
        ),
        (
            bucket,
            r#"settle = { from = "body" },"#,
            "rules[1] (r): settle.from must be header, usage or bytes",
        ),
        (
            bucket,
            r#"settle = { from = "header" },"#,
            "settle.header must name the upstream's response header",
        ),
        (
            r#"{ kind = "window", limit = 100, window = 60 }"#,
            "allowance = { size = 10 },",
            "rules[1] (r): allowance needs a bucket limiter without also",
        ),
        (
            bucket,
            r#"allowance = { size = 10, dict = "nope" },"#,
            "lua_shared_dict nope (the allowances of the node) is not declared",
        ),
        (
            bucket,
            "allowance = { size = 10, refill_below = 10 },",
            "rules[1] (r): allowance.refill_below must be an integer >= 0, below size",
        ),
    ];
    for (limiter, extra, want) in cases {
        let src = format!(
            r#"return {{
    redis = {{ port = tonumber(os.getenv("RL_REDIS_PORT")) }},
    identity = {{ api_key = {{ keys = {{ ["k"] = {{ key_id = "k1" }} }} }} }},
    rules = {{ {{ name = "r", {extra} limiter = {limiter} }} }},
}}"#
        );
        let err = match start(
            redis.port,
            &[Front::Nginx("dofile(DIR .. \"/policy.lua\")".into())],
            &[("policy.lua", &src)],
        ) {
            Ok(_) => panic!("nginx started with {src}"),
            Err(e) => e,
        };
        assert!(err.contains(want), "want {want:?} in:\n{err}");
    }
}
