//! End to end: the three shipped rule policies (`gateway/examples/`), each
//! loaded as shipped by a real nginx (the Redis port comes through
//! `RL_REDIS_PORT`, as the examples read it) against redis-server with the
//! module, driven with real HTTP. See gateway/README.md ("Policy
//! reference" and "The examples").

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::time::Duration;

use common::{int, ints, Server};
use gateway::{agent, get, leases, poll, post, post_form, problem, ratelimit, Resp};
use gateway_policy::{example, jwt, key_record, post_json, start, JWT_SECRET};
use serde_json::json;

/// Long enough for a log-phase timer, an identity cache entry (2 s) or a
/// deny cache poll (1 s) on a loaded machine.
const ASYNC: Duration = Duration::from_secs(10);

fn hset(con: &mut redis::Connection, key: &str, fields: &[(&str, &str)]) {
    let mut c = redis::cmd("HSET");
    c.arg(key);
    for (f, v) in fields {
        c.arg(*f).arg(*v);
    }
    let _: i64 = c.query(con).expect("HSET");
}

/// The entries of the alert stream, as field maps.
fn alerts(
    con: &mut redis::Connection,
    stream: &str,
) -> Vec<std::collections::HashMap<String, String>> {
    let v: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(con)
        .expect("XRANGE");
    v.into_iter()
        .map(|(_, kv)| {
            kv.chunks(2)
                .filter(|c| c.len() == 2)
                .map(|c| (c[0].clone(), c[1].clone()))
                .collect()
        })
        .collect()
}

/// Sends GETs until one is boxed (at most `max`); returns it.
fn until_boxed(a: &ureq::Agent, url: &str, key: (&str, &str), max: usize) -> Resp {
    for _ in 0..max {
        let r = get(a, url, &[key]);
        if r.status != 200 && r.status != 429
            || r.header("X-Penalty-Box-Status") == Some("Active-Lockout")
        {
            return r;
        }
    }
    panic!("not boxed after {max} requests");
}

#[test]
fn ledger_example_runs_every_rule_of_its_design() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[example("ledger")], &[]).expect("start");
    let a = agent();
    let base = gw.url(0);
    let growth = ("X-Api-Key", "demo-growth-key");
    let sandbox = ("X-Api-Key", "demo-sandbox-key");

    // tiers as data, both buckets named, points as the unit
    let r = get(&a, &format!("{base}/v1/ledgers"), &[growth]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(
        r.must("RateLimit-Policy"),
        r#""growth-key";q=3000;qu="points";w=60, "growth-tenant";q=6000;qu="points";w=60"#
    );
    assert_eq!(ratelimit(&r), ("growth-key".into(), 2999, Some(1)));
    let r = post(
        &a,
        &format!("{base}/v1/ledgers/reconcile?ledger_id=L1"),
        &[growth],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 2989, "reconcile costs 10");
    assert!(r
        .must("RateLimit-Policy")
        .contains(r#""reconcile-tenant";q=2;qu="concurrent-requests""#));
    let r = get(&a, &format!("{base}/v1/ledgers"), &[]);
    problem(&r, 401, "unauthenticated");

    // one reconcile per ledger: 409 with Retry-After from the declared
    // duration (5 s), not the lease ttl (300 s); free again once done
    let held = {
        let a = agent();
        let url = format!("{base}/v1/ledgers/reconcile?ledger_id=L9&hold=2");
        std::thread::spawn(move || post(&a, &url, &[sandbox]))
    };
    let ledger_lease = "ledger:{tenant:t-100}:reconcile-ledger:arg:ledger_id=L9";
    poll(ASYNC, "the first reconcile holds its lease", || {
        leases(&mut con, ledger_lease) == 1
    });
    let r = post(
        &a,
        &format!("{base}/v1/ledgers/reconcile?ledger_id=L9"),
        &[sandbox],
    );
    let b = problem(&r, 409, "concurrency-limit-exceeded");
    let retry: u64 = r.must("Retry-After").parse().expect("seconds");
    assert!((1..=5).contains(&retry), "{retry}");
    assert_eq!(b["recommended_backoff"], "exponential_with_full_jitter");
    assert_eq!(b["concurrency_limit"], 1);
    assert_eq!(held.join().expect("holder").status, 200);
    poll(ASYNC, "released after the response", || {
        leases(&mut con, ledger_lease) == 0
    });
    let r = post(
        &a,
        &format!("{base}/v1/ledgers/reconcile?ledger_id=L9"),
        &[sandbox],
    );
    assert_eq!(r.status, 200, "{r:#?}");

    // exports: 25 points, 50 beyond 90 days; 2 an hour for sandbox
    let key_bucket = "ledger:{tenant:t-100}:tier-key:key_id=k-1";
    let export_lease = "ledger:{tenant:t-100}:export-tenant";
    let left = |con: &mut redis::Connection| {
        ints(con, &format!("RL.TAKE {key_bucket} 300 300 60 COST 0"))[2]
    };
    let before = left(&mut con);
    let r = get(
        &a,
        &format!("{base}/v1/reports/audit-export?from=2020-01-01&to=2020-12-31"),
        &[sandbox],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    let spent = before - left(&mut con);
    assert!(
        (49..=50).contains(&spent),
        "a year costs 50 (1 may have refilled): {spent}"
    );
    poll(ASYNC, "export lease released", || {
        leases(&mut con, export_lease) == 0
    });
    let r = get(
        &a,
        &format!("{base}/v1/reports/audit-export?from=2020-01-01&to=2020-02-01"),
        &[sandbox],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    poll(ASYNC, "export lease released", || {
        leases(&mut con, export_lease) == 0
    });
    let before = left(&mut con);
    let r = get(
        &a,
        &format!("{base}/v1/reports/audit-export?from=2020-01-01&to=2020-02-01"),
        &[sandbox],
    );
    let b = problem(&r, 429, "rate-limit-exceeded");
    assert_eq!(b["policy"], "export-hourly");
    assert!(
        left(&mut con) >= before,
        "a refused export spends no points"
    );

    // failed logins: 5 per subject, the 6th is locked out for 15 minutes
    let token = format!("{base}/v1/auth/token");
    for i in 0..5 {
        let r = post_form(
            &a,
            &token,
            &[],
            &[("client_id", "bob"), ("client_secret", "x")],
        );
        assert_eq!(r.status, 401, "attempt {i}: {r:#?}");
        // r is what the next attempt will see: this failure counted
        assert_eq!(ratelimit(&r), ("auth-subject".into(), 4 - i, Some(900)));
        poll(ASYNC, "the failure is recorded", || {
            ints(
                &mut con,
                "RL.WINDOW ledger:{subject:bob}:auth-subject 5 900 COST 0 EXACT",
            )[2] == 4 - i
        });
    }
    let r = post_form(
        &a,
        &token,
        &[],
        &[("client_id", "bob"), ("client_secret", "right")],
    );
    let b = problem(&r, 429, "penalty-box-active");
    assert_eq!(r.must("Retry-After"), "900");
    assert_eq!(b["penalty_level"], 1);
    let r = post_form(
        &a,
        &token,
        &[],
        &[("client_id", "alice"), ("client_secret", "right")],
    );
    assert_eq!(r.status, 200, "another subject: {r:#?}");

    // the identity store: a key, a tier change and a revocation take
    // effect within seconds, without a reload
    let rec = key_record("ledger", "store-key");
    hset(
        &mut con,
        &rec,
        &[("key_id", "s-9"), ("tenant", "t-9"), ("tier", "sandbox")],
    );
    let store_key = ("X-Api-Key", "store-key");
    let r = get(&a, &format!("{base}/v1/ledgers"), &[store_key]);
    assert_eq!(ratelimit(&r).0, "sandbox-key", "{r:#?}");
    hset(&mut con, "ledger:id:tenant:t-9", &[("tier", "growth")]);
    poll(ASYNC, "the tier change applies", || {
        ratelimit(&get(&a, &format!("{base}/v1/ledgers"), &[store_key])).0 == "growth-key"
    });
    hset(&mut con, &rec, &[("revoked", "1")]);
    poll(ASYNC, "the revocation applies", || {
        get(&a, &format!("{base}/v1/ledgers"), &[store_key]).status == 401
    });

    // boxes: a small budget for one sandbox tenant (per-tenant overrides)
    let rec = key_record("ledger", "sb-key");
    hset(
        &mut con,
        &rec,
        &[("key_id", "b-1"), ("tenant", "t-sb"), ("tier", "sandbox")],
    );
    hset(
        &mut con,
        "ledger:id:tenant:t-sb",
        &[
            ("key_burst", "5"),
            ("key_rate", "1"),
            ("tenant_burst", "10"),
            ("tenant_rate", "1"),
        ],
    );
    let sb = ("X-Api-Key", "sb-key");
    let url = format!("{base}/v1/ledgers");
    let r = until_boxed(&a, &url, sb, 30);
    let b = problem(&r, 429, "penalty-box-active");
    assert_eq!(
        (b["penalty_level"].as_i64(), r.must("Retry-After")),
        (Some(1), "300")
    );
    // the edge deny cache answers now: no more RL.TAKE reaches Redis
    let calls = redis
        .info_get("rl", "rl_take_calls")
        .expect("rl_take_calls");
    for _ in 0..5 {
        problem(&get(&a, &url, &[sb]), 429, "penalty-box-active");
    }
    assert_eq!(
        redis.info_get("rl", "rl_take_calls").as_deref(),
        Some(calls.as_str())
    );
    // a release is seen once the release version moves (within a second)
    let boxed_key = "ledger:{tenant:t-sb}:tier-key:key_id=b-1";
    assert_eq!(int(&mut con, &format!("RL.BOX RELEASE {boxed_key}")), 1);
    std::thread::sleep(Duration::from_millis(1500));
    problem(&get(&a, &url, &[sb]), 429, "penalty-box-active");
    int(&mut con, "INCR ledger:deny:version");
    poll(ASYNC, "the release reaches the edge", || {
        get(&a, &url, &[sb]).json()["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("/rate-limit-exceeded"))
    });
    // level 2 alerts (notify); level 3 suspends a sandbox key (manual box)
    let r = until_boxed(&a, &url, sb, 30);
    assert_eq!(problem(&r, 429, "penalty-box-active")["penalty_level"], 2);
    int(&mut con, &format!("RL.BOX RELEASE {boxed_key}"));
    int(&mut con, "INCR ledger:deny:version");
    poll(ASYNC, "released again", || {
        get(&a, &url, &[sb]).header("X-Penalty-Box-Status") == Some("Warning")
    });
    let r = until_boxed(&a, &url, sb, 30);
    let b = problem(&r, 403, "penalty-box-active");
    assert_eq!(
        (b["penalty_level"].as_i64(), r.header("Retry-After")),
        (Some(3), None)
    );
    poll(ASYNC, "alerts", || {
        alerts(&mut con, "ledger:alerts").len() >= 2
    });
    let al = alerts(&mut con, "ledger:alerts");
    let pick = |level: &str| {
        al.iter()
            .find(|m| m["level"] == level)
            .cloned()
            .expect("alert")
    };
    assert_eq!(
        (pick("2")["action"].as_str(), pick("2")["tenant"].as_str()),
        ("notify", "t-sb")
    );
    assert_eq!(
        (pick("3")["action"].as_str(), pick("3")["key_id"].as_str()),
        ("suspend", "b-1")
    );

    // Enterprise level 3 pages instead of suspending: a 1-hour box
    let rec = key_record("ledger", "ent-key");
    hset(
        &mut con,
        &rec,
        &[
            ("key_id", "e-9"),
            ("tenant", "t-ent"),
            ("tier", "enterprise"),
        ],
    );
    hset(
        &mut con,
        "ledger:id:tenant:t-ent",
        &[
            ("key_burst", "5"),
            ("key_rate", "1"),
            ("tenant_burst", "10"),
            ("tenant_rate", "1"),
        ],
    );
    let ent_key = "ledger:{tenant:t-ent}:tier-key:key_id=e-9";
    for _ in 0..2 {
        // two earlier offenses
        ints(&mut con, &format!("RL.BOX TRIP {ent_key} 1 0.5"));
    }
    std::thread::sleep(Duration::from_millis(700));
    let r = until_boxed(&a, &url, ("X-Api-Key", "ent-key"), 120);
    let b = problem(&r, 429, "penalty-box-active");
    assert_eq!(b["penalty_level"], 3);
    let until = gateway::http_date(r.must("Retry-After")).expect("an HTTP-date for 1 hour");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        (now + 3590..=now + 3610).contains(&until),
        "{until} vs {now}"
    );
    poll(ASYNC, "the page alert", || {
        alerts(&mut con, "ledger:alerts")
            .iter()
            .any(|m| m["action"] == "page" && m["tier"] == "enterprise")
    });
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

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
    let r = post_json(&a, &deposits, &h1, json!({"amount": 100}));
    check_body(&r, 429, "RATE_LIMIT_EXCEEDED", Some("velocity"), Some(300));
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
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}
