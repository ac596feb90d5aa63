//! End to end: rule policies (gateway/REFERENCE.md, "Rule policies")
//! beyond the shipped examples: bad policies refused at start and at
//! reload with the field named, the Kong plugin running a rule policy
//! through its schema, the rule kinds and identities the examples do not
//! use, shadow mode, and a load that mixes rules. Real nginx, Redis with
//! the module, real HTTP; the policies are `gateway/test/rules.lua`.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Server;
use gateway::{agent, get, leases, poll, post, problem, ratelimit};
use gateway_policy::{jwt, post_json, start, Front, JWT_SECRET};
use serde_json::json;

const ASYNC: Duration = Duration::from_secs(10);

/// A rule policy file body: one bucket rule named `name` with `limiter`
/// (Lua source) over Redis from the environment.
fn policy_src(name: &str, limiter: &str, extra: &str) -> String {
    format!(
        r#"return {{
    redis = {{ port = tonumber(os.getenv("RL_REDIS_PORT")), timeout_ms = 1000 }},
    key_prefix = "reload",
    identity = {{ api_key = {{ keys = {{ ["k"] = {{ key_id = "k1", tenant = "t1", tier = "pro" }} }} }} }},
    tiers = {{ pro = {{ rate = 100 }} }},
    routes = {{ {{ method = "GET", template = "/v1/x", cost = 5 }} }},
    {extra}
    rules = {{ {{ name = "{name}", scope = {{ "key_id" }}, cost = "route", limiter = {limiter} }} }},
}}"#
    )
}

const GOOD: &str = r#"{ kind = "bucket", rate = "tier.rate", burst = 10, period = 60 }"#;

#[test]
fn bad_policies_are_refused_at_start_and_at_reload_with_the_field_named() {
    let redis = Server::start(&[]);
    let front = Front::Nginx("dofile(DIR .. \"/policy.lua\")".into());
    let cases = [
        (
            r#"{ kind = "distinct", limit = 5, window = 60 }"#.to_string(),
            "",
            "rules[1] (alpha).limiter: member must name the attribute counted",
        ),
        (
            r#"{ kind = "distinct", member = "ip", limit = 5, window = 60, min_events = 9 }"#
                .to_string(),
            "",
            "rules[1] (alpha).limiter: min_events needs trip",
        ),
        (
            r#"{ kind = "distinct", member = "ip", limit = 5, window = 60,
              trip = { level = 3, duration = 0 } }"#
                .to_string(),
            "",
            "unused",
        ),
        (
            r#"{ kind = "bucket", rate = "tier.nope", burst = 10 }"#.into(),
            "",
            "rules[1] (alpha).limiter: rate must be an integer >= 1 (tier pro)",
        ),
        (
            r#"{ kind = "bucket", rate = 1, burst = 2 }"#.into(),
            "",
            "rules[1] (alpha): limiter.burst must be at least the dearest route's cost 5",
        ),
        (
            r#"{ kind = "window", limit = { ref = "brand.max" }, window = 60 }"#.into(),
            "",
            "brand.max needs a default",
        ),
        (
            r#"{ kind = "bucket", rate = 1, burst = 10, strikes = { threshold = 2, window = 60 },
              box = { 60, 60, 0 } }"#
                .into(),
            "",
            "unused",
        ),
        (
            r#"{ kind = "lease", max = 0 }"#.into(),
            "",
            "rules[1] (alpha).limiter: max must be an integer from 1 to 1000",
        ),
        (
            GOOD.into(),
            r#"body = { format = "xml" },"#,
            "body.format must be problem",
        ),
        // the Redis modes (a later `redis` field replaces the first)
        (
            GOOD.into(),
            r#"redis = { mode = "ring" },"#,
            "redis.mode must be single, cluster or sentinel",
        ),
        (
            GOOD.into(),
            r#"redis = { mode = "cluster", nodes = { "no-port" } },"#,
            "redis.nodes must be a list of \"host:port\"",
        ),
        (
            GOOD.into(),
            r#"redis = { mode = "cluster", nodes = { "127.0.0.1:7000" }, dict = "nope" },"#,
            "lua_shared_dict nope (the cluster's slot map) is not declared",
        ),
        (
            GOOD.into(),
            r#"redis = { mode = "sentinel" },"#,
            "redis.sentinels must be a list of \"host:port\"",
        ),
    ];
    for (i, (limiter, extra, want)) in cases.iter().enumerate() {
        let mut src = policy_src("alpha", limiter, extra);
        let mut want = *want;
        if want == "unused" {
            // a tier that pages at level 3 cannot suspend (a manual box)
            src = src.replace(
                r#"limiter = {"#,
                r#"alerts = { level3 = "page" }, limiter = {"#,
            );
            want = "pages at level 3";
        }
        let err = match start(
            redis.port,
            std::slice::from_ref(&front),
            &[("policy.lua", &src)],
        ) {
            Ok(_) => panic!("case {i}: nginx started with a bad policy"),
            Err(e) => e,
        };
        assert!(err.contains(want), "case {i}: {want:?} not in\n{err}");
    }

    // a bad policy at reload: the old one stays; a good one replaces it
    let gw = start(
        redis.port,
        &[front],
        &[("policy.lua", &policy_src("alpha", GOOD, ""))],
    )
    .expect("start");
    let a = agent();
    let url = format!("{}/v1/x", gw.url(0));
    let policy_of = |a: &ureq::Agent| get(a, &url, &[("X-Api-Key", "k")]);
    assert!(policy_of(&a)
        .must("RateLimit-Policy")
        .starts_with(r#""alpha";q=100;qu="points""#));
    let file = gw.nginx.dir.join("policy.lua");
    std::fs::write(
        &file,
        policy_src("beta", r#"{ kind = "bucket", rate = 0, burst = 10 }"#, ""),
    )
    .expect("write");
    gw.reload();
    poll(ASYNC, "the reload is refused", || {
        gw.nginx
            .error_log()
            .contains("rules[1] (beta).limiter: rate must be an integer >= 1")
    });
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..5 {
        let r = policy_of(&agent());
        assert!(
            r.must("RateLimit-Policy").starts_with(r#""alpha""#),
            "old policy kept: {r:#?}"
        );
    }
    std::fs::write(&file, policy_src("beta", GOOD, "")).expect("write");
    gw.reload();
    poll(ASYNC, "the new policy applies", || {
        policy_of(&agent())
            .must("RateLimit-Policy")
            .starts_with(r#""beta""#)
    });
}

#[test]
fn kong_plugin_runs_a_rule_policy_through_its_schema() {
    let redis = Server::start(&[]);
    let kong = Front::Kong("dofile(GW .. \"/examples/velocity.lua\")".into());
    let gw = start(redis.port, &[kong], &[]).expect("start");
    let a = agent();
    let deposits = format!("{}/v1/deposits", gw.url(0));
    let token = format!(
        "Bearer {}",
        jwt(json!({"sub": "k1", "brand_id": "b9"}), JWT_SECRET)
    );
    let h = [("Authorization", token.as_str())];
    for i in 0..5 {
        let r = post_json(&a, &deposits, &h, json!({"amount": 10}));
        assert_eq!(r.status, 200, "deposit {i}: {r:#?}");
        assert!(r
            .must("RateLimit-Policy")
            .contains(r#""deposit-1m";q=5;w=60"#));
    }
    let r = post_json(&a, &deposits, &h, json!({"amount": 10}));
    assert_eq!(r.status, 429, "{r:#?}");
    assert_eq!(r.must("Retry-After"), "300");
    assert_eq!(r.json()["block_type"], "velocity");
    // failed payments through the PDK: the challenge
    let t2 = format!(
        "Bearer {}",
        jwt(json!({"sub": "k2", "brand_id": "b9"}), JWT_SECRET)
    );
    let h2 = [("Authorization", t2.as_str())];
    for _ in 0..3 {
        assert_eq!(post(&a, &format!("{deposits}?status=402"), &h2).status, 402);
    }
    poll(ASYNC, "the challenge", || {
        post(&a, &deposits, &h2).status == 401
    });
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );

    // the schema's validator refuses a bad rule policy, naming the field
    let bad = Front::Kong(
        "(function() local p = dofile(GW .. \"/examples/velocity.lua\"); \
         p.rules[2].limiter.limit = 0; return p end)()"
            .into(),
    );
    let err = start(redis.port, &[bad], &[]).err().expect("refused");
    assert!(
        err.contains("schema violation") && err.contains("rules[2] (deposit-1m).limiter: limit"),
        "{err}"
    );
}

#[test]
fn rule_kinds_and_identities_beyond_the_examples() {
    let redis = Server::start(&[]);
    let kinds = "dofile(GW .. \"/test/rules.lua\").kinds";
    let shadow = format!(
        "(function() local p = {kinds}; p.shadow = true; p.key_prefix = \"sh\"; return p end)()"
    );
    let untrusted = "dofile(GW .. \"/test/rules.lua\").untrusted";
    let gw = start(
        redis.port,
        &[
            Front::Nginx(kinds.into()),
            Front::Nginx(shadow),
            Front::Nginx(untrusted.into()),
        ],
        &[],
    )
    .expect("start");
    let a = agent();
    let base = gw.url(0);

    // the auth layer's header names the user: a fixed window of 3 per user;
    // X-Client keys a sliding window of 4 for everyone using that client
    let items = format!("{base}/v1/items");
    for i in 0..3 {
        let r = get(&a, &items, &[("X-Auth-User", "ann"), ("X-Client", "app")]);
        assert_eq!(r.status, 200, "{i}: {r:#?}");
        assert_eq!(
            r.must("RateLimit-Policy"),
            r#""user-fixed";q=3;w=3600, "client-sliding";q=4;w=3600"#
        );
    }
    let r = get(&a, &items, &[("X-Auth-User", "ann"), ("X-Client", "app")]);
    let b = problem(&r, 429, "rate-limit-exceeded");
    assert_eq!(b["policy"], "user-fixed");
    let (name, rem, t) = ratelimit(&r);
    assert_eq!((name.as_str(), rem), ("user-fixed", 0));
    assert!(t.is_some_and(|t| t <= 3600), "t <= w: {t:?}");
    // another user on the same client: one left on the client's window
    assert_eq!(
        get(&a, &items, &[("X-Auth-User", "bo"), ("X-Client", "app")]).status,
        200
    );
    let r = get(&a, &items, &[("X-Auth-User", "cy"), ("X-Client", "app")]);
    assert_eq!(
        problem(&r, 429, "rate-limit-exceeded")["policy"],
        "client-sliding"
    );
    // no user, no client: no rule applies, no fields
    let r = get(&a, &items, &[]);
    assert_eq!(r.status, 200);
    assert!(r.header("RateLimit-Policy").is_none(), "{r:#?}");

    // an argument as the scope, matched on another argument
    let search = format!("{base}/v1/search");
    for _ in 0..2 {
        assert_eq!(
            get(&a, &format!("{search}?mode=deep&q=rust"), &[]).status,
            200
        );
    }
    problem(
        &get(&a, &format!("{search}?mode=deep&q=rust"), &[]),
        429,
        "rate-limit-exceeded",
    );
    assert_eq!(
        get(&a, &format!("{search}?mode=deep&q=lua"), &[]).status,
        200
    );
    assert_eq!(
        get(&a, &format!("{search}?mode=quick&q=rust"), &[]).status,
        200,
        "no match"
    );

    // shaping: the second charge waits for its point (4 a second) instead of failing
    let charge = format!("{base}/v1/psp/charge");
    // (t0 before the first charge: the second is admitted 250 ms after it)
    let org = [("X-Auth-Org", "o1")];
    let t0 = Instant::now();
    assert_eq!(post(&a, &charge, &org).status, 200);
    let r = post(&a, &charge, &org);
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(240),
        "delayed: {:?}",
        t0.elapsed()
    );

    // jitter stretches Retry-After (60 s at 1 point a minute, up to +50%);
    // strikes box the user after 3 early retries (the first refusal is
    // no strike: the client had not been told to wait yet)
    let jittery = format!("{base}/v1/jittery");
    let user = [("X-Auth-User", "jo")];
    for _ in 0..2 {
        assert_eq!(get(&a, &jittery, &user).status, 200);
    }
    for i in 0..3 {
        let r = get(&a, &jittery, &user);
        problem(&r, 429, "rate-limit-exceeded");
        let s: u64 = r.must("Retry-After").parse().expect("seconds");
        assert!((55..=91).contains(&s), "{s}");
        // Warned from the first strike on, not on the first refusal.
        let warned = r.header("X-Penalty-Box-Status") == Some("Warning");
        assert_eq!(warned, i > 0, "refusal {i}");
    }
    let r = get(&a, &jittery, &user);
    assert_eq!(problem(&r, 429, "penalty-box-active")["penalty_level"], 1);
    assert_eq!(r.must("Retry-After"), "30");

    // X-Forwarded-For from a connection that is not a trusted proxy is
    // ignored: both "addresses" are the connection's, one counter
    let ubase = gw.url(2);
    let ip = format!("{ubase}/v1/ip");
    assert_eq!(
        get(&a, &ip, &[("X-Forwarded-For", "203.0.113.1")]).status,
        200
    );
    assert_eq!(
        get(&a, &ip, &[("X-Forwarded-For", "203.0.113.2")]).status,
        200
    );
    let r = get(&a, &ip, &[("X-Forwarded-For", "203.0.113.3")]);
    assert_eq!(problem(&r, 429, "rate-limit-exceeded")["policy"], "per-ip");
    // a verified JWT's claim as the scope; a forged one is no identity
    let org = format!("{ubase}/v1/org");
    let t1 = format!(
        "Bearer {}",
        jwt(json!({"sub": "u", "org": "o-1"}), JWT_SECRET)
    );
    let t2 = format!(
        "Bearer {}",
        jwt(json!({"sub": "u", "org": "o-2"}), JWT_SECRET)
    );
    let forged = format!("Bearer {}", jwt(json!({"sub": "u", "org": "o-1"}), "guess"));
    assert_eq!(get(&a, &org, &[("Authorization", t1.as_str())]).status, 200);
    problem(
        &get(&a, &org, &[("Authorization", t1.as_str())]),
        429,
        "rate-limit-exceeded",
    );
    assert_eq!(get(&a, &org, &[("Authorization", t2.as_str())]).status, 200);
    let r = get(&a, &org, &[("Authorization", forged.as_str())]);
    assert_eq!(r.status, 200, "no verified claim: the rule does not apply");
    assert!(r.header("RateLimit-Policy").is_none(), "{r:#?}");

    // shadow mode: the same rules decide and log, everything goes through
    let sbase = gw.url(1);
    for _ in 0..6 {
        let r = get(
            &a,
            &format!("{sbase}/v1/items"),
            &[("X-Auth-User", "ann"), ("X-Client", "z")],
        );
        assert_eq!(r.status, 200);
        assert!(r.header("RateLimit").is_none());
    }
    poll(ASYNC, "would-be refusals logged", || {
        gw.nginx
            .events()
            .iter()
            .filter(|e| e["would_be"] == "throttled")
            .count()
            >= 2
    });
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

#[test]
fn a_load_mixing_rules_never_admits_more_than_each_bound() {
    let redis = Server::start(&[]);
    let gw = start(
        redis.port,
        &[Front::Nginx(
            "dofile(GW .. \"/test/rules.lua\").mixed".into(),
        )],
        &[],
    )
    .expect("start");
    let url = format!("{}/v1/work", gw.url(0));
    let admitted: Arc<Mutex<HashMap<&str, u64>>> = Arc::default();
    let refused: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let t0 = Instant::now();
    let workers: Vec<_> = (0..6)
        .map(|i| {
            let (url, admitted, refused) = (url.clone(), admitted.clone(), refused.clone());
            let key = ["m-1", "m-2", "m-3"][i % 3];
            std::thread::spawn(move || {
                let a = agent();
                let deadline = Instant::now() + Duration::from_secs(3);
                for _ in 0..600 {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let r = get(&a, &url, &[("X-Api-Key", key)]);
                    if r.status == 200 {
                        *admitted.lock().unwrap().entry(key).or_default() += 1;
                    } else {
                        let b = r.json();
                        let p = b["policy"].as_str().unwrap_or("?").to_string();
                        *refused.lock().unwrap().entry(p).or_default() += 1;
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let admitted = admitted.lock().unwrap().clone();
    let total: u64 = admitted.values().sum();
    for (key, n) in &admitted {
        let bucket = 20.0 + 20.0 * elapsed;
        assert!((*n as f64) <= bucket, "{key}: {n} > bucket bound {bucket}");
        assert!(*n <= 40, "{key}: {n} > the exact window's 40");
    }
    assert!(total <= 100, "tenant: {total} > the daily quota's 100");
    // the budget is used (no minimum speed: at least a quarter of what
    // was sent when the machine was too slow to send much)
    let sent = total + refused.lock().unwrap().values().sum::<u64>();
    assert!(
        total >= 60.min(sent / 4),
        "the budget is used: {total} of {sent} ({admitted:?}, refused {:?})",
        refused.lock().unwrap()
    );
    // the quota counts only admitted requests: what it has left is exact
    let mut con = redis.client();
    let left = common::ints(
        &mut con,
        "RL.QUOTA mixed:{tenant:mix}:tenant-day 100 DAY COST 0",
    )[2];
    assert_eq!(
        left as u64,
        100 - total,
        "refused requests spend nothing ({:?})",
        refused.lock().unwrap()
    );
}

#[test]
fn a_request_refused_by_the_tenant_rule_gives_back_what_the_key_rules_took() {
    let redis = Server::start(&[]);
    let gw = start(
        redis.port,
        &[Front::Nginx(
            "dofile(GW .. \"/test/rules.lua\").compensated".into(),
        )],
        &[],
    )
    .expect("start");
    let (a, url) = (agent(), format!("{}/v1/work", gw.url(0)));
    let mut con = redis.client();
    // what is left (COST 0 probes) of c1's bucket and window, the
    // tenant's monthly quota and its bucket
    let left = |con: &mut redis::Connection| {
        [
            "RL.TAKE comp:{key_id:c1}:key-bucket 10 1 3600 COST 0",
            "RL.WINDOW comp:{key_id:c1}:key-window 10 3600 COST 0 EXACT",
            "RL.QUOTA comp:{tenant:ct}:monthly 100 MONTH COST 0",
            "RL.TAKE comp:{tenant:ct}:tenant-bucket 2 1 3600 COST 0",
        ]
        .map(|c| common::ints(con, c)[2])
    };
    assert_eq!(get(&a, &url, &[("X-Api-Key", "c-1")]).status, 200);
    assert_eq!(get(&a, &url, &[("X-Api-Key", "c-2")]).status, 200);
    assert_eq!(left(&mut con), [9, 9, 98, 0], "two requests admitted");
    for _ in 0..3 {
        let r = get(&a, &url, &[("X-Api-Key", "c-1")]);
        let b = problem(&r, 429, "rate-limit-exceeded");
        assert_eq!(b["policy"], "tenant-bucket", "{b}");
        assert_eq!(
            left(&mut con),
            [9, 9, 98, 0],
            "a refused request leaves the key's bucket and window and the monthly quota as they were"
        );
        assert_eq!(
            leases(&mut con, "comp:{key_id:c1}:key-conc"),
            0,
            "its lease is given back before the answer"
        );
    }
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
    let m = get(&a, &format!("{}/metrics", gw.url(0)), &[]);
    assert!(
        !m.body.contains("rl_gateway_redis_errors_total{"),
        "the refunds are no Redis errors: {}",
        m.body
    );
}
