//! End to end: the shipped rule policies of the deposit velocity and the
//! tiered quota designs (`gateway/examples/velocity.lua`, `tiered.lua`; the
//! ledger's is `gateway_ledger.rs`), each loaded as shipped by a real nginx (the Redis port comes through
//! `RL_REDIS_PORT`, as the examples read it) against redis-server with the
//! module, driven with real HTTP. See gateway/README.md ("The
//! shipped examples") and gateway/REFERENCE.md.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::time::Duration;

use common::{ints, Server};
use gateway::{agent, get, leases, poll, post, problem, Resp};
use gateway_policy::{alerts, example, hset, jwt, key_record, post_json, start, JWT_SECRET};
use serde_json::json;

/// Long enough for a log-phase timer, an identity cache entry (2 s) or a
/// deny cache poll (1 s) on a loaded machine.
const ASYNC: Duration = Duration::from_secs(10);

#[test]
fn velocity_example_runs_every_rule_of_its_design() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[example("velocity")], &[]).expect("start");
    let a = agent();
    let base = gw.url(0);
    let deposits = format!("{base}/v1/deposits");
    // brand b1's 24 h deposit limit, in cents (the design's psp_configs)
    hset(
        &mut con,
        "vel:id:brand:b1",
        &[("deposit_total_24h", "1000")],
    );
    let bearer = |user: &str| {
        format!(
            "Bearer {}",
            jwt(json!({"sub": user, "brand_id": "b1"}), JWT_SECRET)
        )
    };
    // each part of the test comes from its own address (the IP rule)
    let from = |ip: &'static str| ("X-Forwarded-For", ip);

    // the design's body on every refusal
    let check_body =
        |r: &Resp, status: u16, error: &str, block: Option<&str>, retry: Option<u64>| {
            assert_eq!(r.status, status, "{r:#?}");
            assert_eq!(r.must("Content-Type"), "application/json");
            let b = r.json();
            assert_eq!(
                (b["error"].as_str(), b["block_type"].as_str()),
                (Some(error), block),
                "{b}"
            );
            assert!(b["message"].as_str().is_some_and(|m| !m.is_empty()), "{b}");
            assert_eq!(b["retry_after"].as_u64(), retry, "{b}");
            assert_eq!(
                b.as_object().map(|o| o.len()),
                Some(4),
                "only the design's fields: {b}"
            );
            if let Some(s) = retry {
                assert_eq!(r.must("Retry-After"), s.to_string());
            }
        };

    // 5 deposits a minute per user, then blocked for 5 minutes
    let u1 = bearer("u1");
    let h1 = [("Authorization", u1.as_str()), from("198.51.100.1")];
    for i in 0..5 {
        let r = post_json(&a, &deposits, &h1, json!({"amount": 100}));
        assert_eq!(r.status, 200, "deposit {i}: {r:#?}");
    }
    redis.reset_stats();
    let r = post_json(&a, &deposits, &h1, json!({"amount": 100}));
    check_body(&r, 429, "RATE_LIMIT_EXCEEDED", Some("velocity"), Some(300));
    // exceeding is the offence (EVERY): the refusal blocks in the rule's
    // one command, never sent twice; then the 3 rules that admitted with a
    // cost (ip, deposit-1h, deposit-amount-24h) give it back
    assert_eq!(
        redis.command_calls("rl.window"),
        5 + 3,
        "one command per rule of the route, then 3 refunds"
    );
    assert!(r
        .must("RateLimit-Policy")
        .contains(r#""deposit-1m";q=5;w=60"#));
    // withdrawals are counted apart: 3 an hour, then 2 hours
    for _ in 0..3 {
        assert_eq!(post(&a, &format!("{base}/v1/withdrawals"), &h1).status, 200);
    }
    let r = post(&a, &format!("{base}/v1/withdrawals"), &h1);
    check_body(&r, 429, "RATE_LIMIT_EXCEEDED", Some("velocity"), Some(7200));

    // 3 failed payments (the provider's 402) in 15 minutes: re-auth / captcha
    let u2 = bearer("u2");
    let h2 = [("Authorization", u2.as_str()), from("198.51.100.2")];
    for i in 0..3 {
        let r = post_json(
            &a,
            &format!("{deposits}?status=402"),
            &h2,
            json!({"amount": 5}),
        );
        assert_eq!(r.status, 402, "{i}: {r:#?}");
        poll(ASYNC, "the failure is recorded", || {
            ints(
                &mut con,
                "RL.WINDOW vel:{user:u2}:failed-payments 3 900 COST 0 EXACT",
            )[2] == 2 - i
        });
    }
    let r = post_json(&a, &deposits, &h2, json!({"amount": 5}));
    check_body(&r, 401, "REAUTH_REQUIRED", Some("velocity"), Some(900));
    assert_eq!(r.must("X-Challenge"), "captcha");
    assert!(r.must("WWW-Authenticate").contains("reauth_required"));

    // the 24 h amount per user and brand, per brand from the identity
    // store (set at the start): over it, a soft block: the deposit goes
    // through, marked
    let u3 = bearer("u3");
    let h3 = [("Authorization", u3.as_str()), from("198.51.100.3")];
    let r = post_json(&a, &deposits, &h3, json!({"amount": 600}));
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(r.json().get("marks").is_none(), "{r:#?}");
    assert!(r
        .must("RateLimit-Policy")
        .contains(r#""deposit-amount-24h";q=1000;qu="cents";w=86400"#));
    let r = post_json(&a, &deposits, &h3, json!({"amount": 600}));
    assert_eq!(r.status, 200, "a soft block goes upstream: {r:#?}");
    assert_eq!(r.json()["marks"]["x-kyc-required"], "deposit_total_24h");
    // the client cannot send the mark itself
    let mut forged = h3.to_vec();
    forged.push(("X-KYC-Required", "forged"));
    let r = post_json(&a, &deposits, &forged, json!({"amount": 100}));
    assert!(r.json().get("marks").is_none(), "{r:#?}");
    // an ambiguous amount (query and body differ) is refused
    let r = post_json(
        &a,
        &format!("{deposits}?amount=1"),
        &h3,
        json!({"amount": 900}),
    );
    check_body(&r, 400, "INVALID_ARGUMENT", None, None);

    // 60 requests a minute per client address (behind the trusted proxy)
    let h4 = [("Authorization", u1.as_str()), from("203.0.113.7")];
    for i in 0..60 {
        let r = get(&a, &format!("{base}/v1/balance"), &h4);
        assert_eq!(r.status, 200, "request {i}: {r:#?}");
    }
    let r = get(&a, &format!("{base}/v1/balance"), &h4);
    check_body(
        &r,
        429,
        "RATE_LIMIT_EXCEEDED",
        Some("ip"),
        r.must("Retry-After").parse().ok(),
    );
    let r = get(
        &a,
        &format!("{base}/v1/balance"),
        &[h4[0], from("203.0.113.8")],
    );
    assert_eq!(r.status, 200, "another address: {r:#?}");

    // no token, a bad signature, another secret: 401
    let bad = format!("Bearer {}", jwt(json!({"sub": "u1"}), "another-secret"));
    for h in [vec![], vec![("Authorization", bad.as_str())]] {
        let r = get(&a, &format!("{base}/v1/balance"), &h);
        check_body(&r, 401, "UNAUTHENTICATED", None, None);
    }
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

#[test]
fn tiered_example_runs_every_rule_of_its_design() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[example("tiered")], &[]).expect("start");
    let a = agent();
    let base = gw.url(0);
    let url = format!("{base}/v1/things");
    let free = ("X-Api-Key", "demo-free-key");

    // steady rate and burst, without strikes: throttles never box
    let r = get(&a, &url, &[free]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(r
        .must("RateLimit-Policy")
        .starts_with(r#""free-monthly";q=10000;w="#));
    assert!(r
        .must("RateLimit-Policy")
        .contains(r#""free-rate";q=1;w=1"#));
    assert_eq!(r.json()["marks"]["x-ratelimit-priority"], "0");
    let mut throttled = 0;
    for _ in 0..40 {
        let r = get(&a, &url, &[free]);
        if r.status == 429 {
            let b = problem(&r, 429, "rate-limit-exceeded");
            assert!(
                r.header("X-Penalty-Box-Status").is_none(),
                "strikes are off"
            );
            assert!(b.get("penalty_strikes_remaining").is_none(), "{b}");
            assert_eq!(b["dashboard_url"], "https://dashboard.example.com/usage");
            assert_eq!(b["quota_tier"], "free");
            throttled += 1;
        }
    }
    assert!(throttled >= 25, "burst 10 at 1/s: {throttled}");

    // a key from the identity store; its tenant's monthly quota (an
    // override) answers 403 with the upgrade link, and a refused request
    // spends nothing on it
    let rec = key_record("tq", "biz-key");
    hset(
        &mut con,
        &rec,
        &[
            ("key_id", "b-1"),
            ("tenant", "app-2"),
            ("tier", "developer"),
        ],
    );
    hset(&mut con, "tq:id:tenant:app-2", &[("monthly", "4")]);
    let biz = ("X-Api-Key", "biz-key");
    for i in 0..4 {
        let r = get(&a, &url, &[biz]);
        assert_eq!(r.status, 200, "request {i}: {r:#?}");
    }
    let r = get(&a, &url, &[biz]);
    let b = problem(&r, 403, "quota-exceeded");
    assert_eq!(
        b["upgrade_url"],
        "https://dashboard.example.com/billing/upgrade"
    );
    assert_eq!(b["policy"], "developer-monthly");
    assert!(r
        .must("Retry-After")
        .parse::<u64>()
        .is_ok_and(|s| s > 0 && s <= 31 * 86400));
    // the 4th request took the quota from 75 % to 100 %: one event for
    // rlctl watch, the highest threshold crossed
    poll(ASYNC, "the quota event", || {
        !alerts(&mut con, "rl:events:quota").is_empty()
    });
    let ev = &alerts(&mut con, "rl:events:quota")[0];
    assert_eq!(
        [
            &ev["tenant"],
            &ev["quota"],
            &ev["used"],
            &ev["limit"],
            &ev["threshold"]
        ],
        ["app-2", "developer-monthly", "4", "4", "100"]
    );

    // the monthly egress: response body bytes, counted after the response
    let rec = key_record("tq", "egress-key");
    hset(
        &mut con,
        &rec,
        &[
            ("key_id", "x-1"),
            ("tenant", "app-4"),
            ("tier", "developer"),
        ],
    );
    hset(&mut con, "tq:id:tenant:app-4", &[("egress_bytes", "150")]);
    let egress = ("X-Api-Key", "egress-key");
    let mut sent = 0;
    let mut last = get(&a, &url, &[egress]);
    for _ in 0..20 {
        if last.status != 200 {
            break;
        }
        sent += last.body.len();
        // the count lands in a timer after the response
        std::thread::sleep(Duration::from_millis(100));
        last = get(&a, &url, &[egress]);
    }
    let b = problem(&last, 403, "quota-exceeded");
    assert_eq!(b["policy"], "developer-egress");
    assert!(
        (150..150 + 200).contains(&sent),
        "{sent} bytes before the refusal"
    );
    let left = ints(
        &mut con,
        "RL.QUOTA tq:{tenant:app-4}:tier-egress 150 MONTH COST 0",
    )[2];
    assert_eq!(left, 0, "used up");
    // the egress quota's thresholds too: 100 % reached once, each threshold at most once
    let egress_events = |con: &mut redis::Connection| {
        alerts(con, "rl:events:quota")
            .into_iter()
            .filter(|m| m["quota"] == "developer-egress")
            .collect::<Vec<_>>()
    };
    poll(ASYNC, "the egress event at 100 %", || {
        egress_events(&mut con)
            .iter()
            .any(|m| m["threshold"] == "100")
    });
    let mut seen: Vec<String> = egress_events(&mut con)
        .iter()
        .map(|m| {
            assert_eq!(
                (&m["tenant"], &m["limit"]),
                (&"app-4".into(), &"150".into())
            );
            m["threshold"].clone()
        })
        .collect();
    let n = seen.len();
    seen.dedup();
    assert_eq!(seen.len(), n, "a threshold announced twice: {seen:?}");

    // an upgrade takes effect within seconds: the tenant's tier, with more quota
    hset(
        &mut con,
        "tq:id:tenant:app-2",
        &[("tier", "business"), ("monthly", "100")],
    );
    poll(ASYNC, "the upgrade applies", || {
        get(&a, &url, &[biz]).status == 200
    });
    let r = get(&a, &url, &[biz]);
    assert!(
        r.must("RateLimit-Policy")
            .contains(r#""business-rate";q=100;w=1"#),
        "{r:#?}"
    );
    assert_eq!(r.json()["marks"]["x-ratelimit-priority"], "2");

    // concurrent requests per key: 2 for free; the third gets 429, Retry-After 1
    let rec = key_record("tq", "conc-key");
    hset(
        &mut con,
        &rec,
        &[("key_id", "c-1"), ("tenant", "app-3"), ("tier", "free")],
    );
    let holders: Vec<_> = (0..2)
        .map(|_| {
            let a = agent();
            let u = format!("{url}?hold=2");
            std::thread::spawn(move || get(&a, &u, &[("X-Api-Key", "conc-key")]))
        })
        .collect();
    let lease_key = "tq:{key_id:c-1}:tier-concurrency";
    poll(ASYNC, "two requests in flight", || {
        leases(&mut con, lease_key) == 2
    });
    let r = get(&a, &url, &[("X-Api-Key", "conc-key")]);
    let b = problem(&r, 429, "concurrency-limit-exceeded");
    assert_eq!(
        (r.must("Retry-After"), b["concurrency_limit"].as_i64()),
        ("1", Some(2))
    );
    for h in holders {
        assert_eq!(h.join().expect("holder").status, 200);
    }

    // Redis away: the Free tier is shed, paid tiers run on the local limiter
    redis.kill9();
    let r = get(&a, &url, &[free]);
    problem(&r, 503, "rate-limiter-unavailable");
    let r = get(&a, &url, &[biz]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(
        r.must("RateLimit")
            .starts_with(r#""business-rate-degraded""#),
        "{r:#?}"
    );
    // a key this gateway never saw cannot be looked up: never admitted
    // unchecked (tests/gateway_inputs.rs)
    let r = get(&a, &url, &[("X-Api-Key", "never-seen-key")]);
    problem(&r, 503, "rate-limiter-unavailable");
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}
