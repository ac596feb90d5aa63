//! End to end: what a refusal says, and for how long. The edge deny cache
//! answers with the strictest box of a request (a credential-stuffing box
//! at level 3 over the per-subject or per-IP lockout at level 1); a box
//! released by any client (`RL.BOX RELEASE` from `redis-cli`, without the
//! release version) reaches the gateway within `deny_cache.recheck`; a
//! refusal by a rule's tenant bucket is named as the tenant's in its
//! headers, body and event line; the fail-closed 503's body agrees with its
//! `Retry-After`. The shipped examples (`gateway/examples/`) and the tier
//! form's test policy, on a real nginx against redis-server with the
//! module. See gateway/README.md ("The edge deny cache, and how to release
//! a box").

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_dates.rs"]
mod gateway_dates;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;
#[path = "common/gateway_tier.rs"]
mod gateway_tier;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{ints, redis_cli_bin, Server};
use gateway::{agent, get, poll, post, post_form, problem, ratelimit, Resp};
use gateway_policy::{example, hset, jwt, key_record, login, post_json, start, Front, JWT_SECRET};
use serde_json::json;

/// Long enough for a log-phase timer or an identity cache entry (2 s) on a
/// loaded machine.
const ASYNC: Duration = Duration::from_secs(10);
/// The default `deny_cache.recheck` (seconds): the bound on a release
/// reaching the gateway, plus one round trip.
const RECHECK: Duration = Duration::from_secs(2);

/// The tier form's test policy (`gateway/test/policy.lua`) with its own
/// key prefix and a `deny_cache.recheck` of 1 s.
const TIER_RECHECK_1: &str = "dofile(GW .. \"/test/policy.lua\")({ redis = { port = \
     tonumber(os.getenv(\"RL_REDIS_PORT\")) }, key_prefix = \"tier\", \
     deny_cache = { recheck = 1 } })";

/// `RL.BOX STATUS key`: [level, ttl_ms, offenses, strikes].
fn box_status(con: &mut redis::Connection, key: &str) -> Vec<i64> {
    ints(con, &format!("RL.BOX STATUS {key}"))
}

/// Checks a level-3 stuffing box's answer: 429, level 3, the rule's name,
/// a Retry-After HTTP-date a day from now.
fn assert_level_3(r: &Resp, policy: &str) {
    let b = problem(r, 429, "penalty-box-active");
    assert_eq!(b["penalty_level"], 3, "{b}");
    assert_eq!(b["policy"], policy, "{b}");
    assert_eq!(ratelimit(r).0, policy);
    let until = gateway_dates::http_date(r.must("Retry-After")).expect("an HTTP-date for a day");
    let now = gateway_tier::unix_now();
    assert!(
        (now + 86_390..=now + 86_410).contains(&until),
        "{until} vs {now}"
    );
    let left = b["retry_after_seconds"]
        .as_u64()
        .expect("retry_after_seconds");
    assert!((86_390..=86_400).contains(&left), "{b}");
}

/// Sends `attempt` until its answer is a level-3 box (bounded by `within`),
/// then three more: every one of them is the level-3 box.
fn level_3_from_now_on(within: Duration, policy: &str, attempt: impl Fn() -> Resp) {
    poll(within, "the level-3 box answers", || {
        let r = attempt();
        r.status == 429 && r.json()["penalty_level"] == 3
    });
    for _ in 0..3 {
        assert_level_3(&attempt(), policy);
    }
}

#[test]
fn ledger_stuffing_box_wins_over_the_cached_lockout() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[example("ledger")], &[]).expect("start");
    let a = agent();
    let token = format!("{}/v1/auth/token", gw.url(0));

    // one subject failing from 20 addresses: the first 5 failures reach
    // the upstream, the 6th trips dave's lockout (level 1, 900 s), which
    // the deny cache keeps and answers from then on
    let subject = "ledger:{subject:dave}:auth-subject";
    for n in 1..=5 {
        let r = login(&a, &token, "dave", "x", &format!("192.0.2.{n}"));
        assert_eq!(r.status, 401, "attempt {n}: {r:#?}");
        poll(ASYNC, "the failure is recorded", || {
            ints(&mut con, &format!("RL.WINDOW {subject} 5 900 COST 0 EXACT"))[2] == 5 - n
        });
    }
    for n in 6..=20 {
        let r = login(&a, &token, "dave", "x", &format!("192.0.2.{n}"));
        let b = problem(&r, 429, "penalty-box-active");
        assert_eq!(b["penalty_level"], 1, "attempt {n}: {b}");
    }
    // each of those 429s is a failure of the stuffing rule: 20 addresses
    // trip level 3 on the subject for a day
    let stuffing = "ledger:{subject:dave}:stuffing-subject";
    poll(ASYNC, "the subject is boxed at level 3", || {
        box_status(&mut con, stuffing)[0] == 3
    });
    assert_eq!(
        box_status(&mut con, subject)[0],
        1,
        "the lockout is still there"
    );
    level_3_from_now_on(ASYNC, "stuffing-subject", || {
        login(&a, &token, "dave", "x", "192.0.2.99")
    });

    // one address failing for 50 subjects (500 failures): its lockout
    // (level 1) is cached first, then the stuffing rule trips level 3
    let ip = "203.0.113.60";
    let ip_lockout = format!("ledger:{{ip:{ip}}}:auth-ip");
    ints(&mut con, &format!("RL.BOX TRIP {ip_lockout} 1 900"));
    let r = login(&a, &token, "s0", "x", ip);
    assert_eq!(problem(&r, 429, "penalty-box-active")["penalty_level"], 1);
    // the failures counted so far (the gateway's own keys, written as it
    // writes them): 49 subjects, 498 failures, besides s0's refused attempt
    // (a 429 is a listed failure) once its log phase has run
    let ip_key = format!("ledger:{{ip:{ip}}}:stuffing-ip");
    for n in 1..=49 {
        ints(&mut con, &format!("RL.DISTINCT {ip_key} s{n} 49 600"));
    }
    ints(
        &mut con,
        &format!("RL.WINDOW {ip_key}:events 499 600 COST 498 EXACT"),
    );
    let events = |con: &mut redis::Connection| {
        1000 - ints(
            con,
            &format!("RL.WINDOW {ip_key}:events 1000 600 COST 0 EXACT"),
        )[2]
    };
    poll(ASYNC, "s0's failure is recorded", || {
        events(&mut con) == 499
    });
    // the 500th failure (one past the events window's 499) trips level 3
    // in its log phase; each attempt is sent once the one before has been
    // recorded, so none can see that box yet
    let tripped = |con: &mut redis::Connection| box_status(con, &ip_key)[0] == 3;
    for n in 50..=51 {
        let before = events(&mut con);
        let r = login(&a, &token, &format!("s{n}"), "x", ip);
        assert_eq!(problem(&r, 429, "penalty-box-active")["penalty_level"], 1);
        poll(ASYNC, "the attempt is recorded", || {
            tripped(&mut con) || events(&mut con) > before
        });
        if tripped(&mut con) {
            break;
        }
    }
    poll(ASYNC, "the IP is boxed at level 3", || {
        box_status(&mut con, &ip_key)[0] == 3
    });
    assert_eq!(box_status(&mut con, &ip_lockout)[0], 1);
    level_3_from_now_on(ASYNC, "stuffing-ip", || login(&a, &token, "s53", "x", ip));
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

/// `RL.BOX RELEASE key` sent by `redis-cli` (any client, not rlctl: no
/// release version is touched); returns its reply.
fn release_with_redis_cli(port: u16, key: &str) -> String {
    let out = Command::new(redis_cli_bin())
        .args(["-p", &port.to_string(), "RL.BOX", "RELEASE", key])
        .output()
        .expect("run redis-cli");
    assert!(out.status.success(), "redis-cli: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Releases `boxed_key` with `redis-cli` while `request` is answered from
/// the deny cache, and waits for the first answer that is not a box:
/// within `bound` (plus the slack of a loaded machine). Returns it.
fn released_within(
    redis: &Server,
    boxed_key: &str,
    bound: Duration,
    request: impl Fn() -> Resp,
) -> Resp {
    let boxed = |r: &Resp| r.header("X-Penalty-Box-Status") == Some("Active-Lockout");
    // answered from the cache: no RL.TAKE reaches Redis (a request after a
    // stall longer than the recheck asks Redis, which caches the box
    // again: tried 3 times at most)
    let cached = (0..3).any(|_| {
        let calls = redis.info_get("rl", "rl_take_calls");
        assert!(boxed(&request()));
        redis.info_get("rl", "rl_take_calls") == calls
    });
    assert!(cached, "never answered from the deny cache");
    assert_eq!(release_with_redis_cli(redis.port, boxed_key), "1");
    let released = Instant::now();
    let deadline = released + bound + ASYNC;
    loop {
        let r = request();
        if !boxed(&r) {
            eprintln!(
                "the release reached the gateway after {:?}",
                released.elapsed()
            );
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "the release never reached the gateway (bound {bound:?})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_box_released_by_any_client_reaches_the_gateway_within_the_recheck() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    // the ledger example as shipped (the default recheck), and the tier
    // form's test policy with a recheck of 1 s
    let gw = start(
        redis.port,
        &[example("ledger"), Front::Nginx(TIER_RECHECK_1.into())],
        &[],
    )
    .expect("start");
    let a = agent();

    // a sandbox key of the ledger with a small budget, boxed (level 1, 300 s)
    let rec = key_record("ledger", "sb-key");
    hset(
        &mut con,
        &rec,
        &[("key_id", "b-1"), ("tenant", "t-sb"), ("tier", "sandbox")],
    );
    let boxed_key = "ledger:{tenant:t-sb}:tier-key:key_id=b-1";
    let url = format!("{}/v1/ledgers", gw.url(0));
    let sb = ("X-Api-Key", "sb-key");
    // a first request starts the node's release poller (its first poll
    // drops what was cached before it)
    assert_eq!(get(&a, &url, &[sb]).status, 200);
    ints(&mut con, &format!("RL.BOX TRIP {boxed_key} 1 300"));
    let r = get(&a, &url, &[sb]);
    assert_eq!(problem(&r, 429, "penalty-box-active")["penalty_level"], 1);
    let r = released_within(&redis, boxed_key, RECHECK, || get(&a, &url, &[sb]));
    assert_eq!(r.status, 200, "{r:#?}");

    // the tier form: the API key's bucket
    let tier_key = "tier:{t:sbx}:key:s1";
    let url = format!("{}/v1/ledgers", gw.url(1));
    let key = ("X-Api-Key", "k-sandbox");
    assert_eq!(get(&a, &url, &[key]).status, 200);
    ints(&mut con, &format!("RL.BOX TRIP {tier_key} 1 300"));
    let r = get(&a, &url, &[key]);
    assert_eq!(problem(&r, 429, "penalty-box-active")["penalty_level"], 1);
    let r = released_within(&redis, tier_key, Duration::from_secs(1), || {
        get(&a, &url, &[key])
    });
    assert_eq!(r.status, 200, "{r:#?}");
    // nobody moved the release version
    let version: Option<String> = redis::cmd("GET")
        .arg("ledger:deny:version")
        .query(&mut con)
        .expect("GET");
    assert_eq!(version, None);
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

/// Past `deny_cache.recheck` a cached box sends its requests to Redis;
/// when Redis is away then, the box still refuses (not the local
/// limiter's degraded admission), in both forms.
#[test]
fn a_cached_box_still_refuses_when_redis_fails_after_the_recheck() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let rules = "(function() local p = dofile(GW .. \"/examples/ledger.lua\") \
                 p.deny_cache = { recheck = 1 } return p end)()";
    let gw = start(
        redis.port,
        &[
            Front::Nginx(rules.into()),
            Front::Nginx(TIER_RECHECK_1.into()),
        ],
        &[],
    )
    .expect("start");
    let a = agent();
    let ledger = format!("{}/v1/ledgers", gw.url(0));
    let sandbox = ("X-Api-Key", "demo-sandbox-key");
    let tier_url = format!("{}/v1/ledgers", gw.url(1));
    let tier_key = ("X-Api-Key", "k-sandbox");
    // first requests start the release pollers, then both keys are boxed
    // and cached
    assert_eq!(get(&a, &ledger, &[sandbox]).status, 200);
    assert_eq!(get(&a, &tier_url, &[tier_key]).status, 200);
    ints(
        &mut con,
        "RL.BOX TRIP ledger:{tenant:t-100}:tier-key:key_id=k-1 1 300",
    );
    ints(&mut con, "RL.BOX TRIP tier:{t:sbx}:key:s1 1 300");
    let boxed = |r: &Resp| {
        problem(r, 429, "penalty-box-active");
        assert_eq!(r.must("X-Penalty-Box-Status"), "Active-Lockout");
        assert!(r.header("X-RateLimit-Degraded").is_none(), "{r:#?}");
    };
    boxed(&get(&a, &ledger, &[sandbox]));
    boxed(&get(&a, &tier_url, &[tier_key]));
    // past the recheck, with Redis gone
    std::thread::sleep(Duration::from_millis(1500));
    redis.kill9();
    for _ in 0..3 {
        boxed(&get(&a, &ledger, &[sandbox]));
        boxed(&get(&a, &tier_url, &[tier_key]));
    }
}

#[test]
fn ledger_a_tenant_bucket_refusal_is_named_as_the_tenants() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[example("ledger")], &[]).expect("start");
    let a = agent();
    // two growth keys of one tenant whose bucket holds 8 points
    for (api_key, key_id) in [("g-key-1", "g-1"), ("g-key-2", "g-2")] {
        hset(
            &mut con,
            &key_record("ledger", api_key),
            &[("key_id", key_id), ("tenant", "t-g"), ("tier", "growth")],
        );
    }
    hset(
        &mut con,
        "ledger:id:tenant:t-g",
        &[("tenant_burst", "8"), ("tenant_rate", "1")],
    );
    let url = format!("{}/v1/ledgers", gw.url(0));
    for i in 0..8 {
        let key = if i % 2 == 0 { "g-key-1" } else { "g-key-2" };
        let r = get(&a, &url, &[("X-Api-Key", key)]);
        assert_eq!(r.status, 200, "request {i}: {r:#?}");
    }
    let r = get(&a, &url, &[("X-Api-Key", "g-key-1")]);
    let b = problem(&r, 429, "rate-limit-exceeded");
    let (name, left, _) = ratelimit(&r);
    assert_eq!((name.as_str(), left), ("growth-tenant", 0));
    assert_eq!(b["policy"], "growth-tenant", "{b}");
    let detail = b["detail"].as_str().expect("detail");
    assert!(
        detail.starts_with("growth-tenant: 8 points per 60 s exhausted"),
        "{detail}"
    );
    assert_eq!(
        b["retry_after_seconds"].as_u64().map(|s| s.to_string()),
        Some(r.must("Retry-After").to_string())
    );
    poll(ASYNC, "the event line", || {
        gw.nginx
            .events()
            .iter()
            .any(|e| e["decision"] == "throttled" && e["policy"] == "growth-tenant")
    });
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

#[test]
fn fail_closed_bodies_agree_with_their_retry_after() {
    let redis = Server::start(&[]);
    let gw = start(redis.port, &[example("ledger"), example("velocity")], &[]).expect("start");
    let a = agent();
    let ledger = format!("{}/v1/ledgers/reconcile?ledger_id=L1", gw.url(0));
    let growth = ("X-Api-Key", "demo-growth-key");
    let deposits = format!("{}/v1/deposits", gw.url(1));
    let bearer = format!(
        "Bearer {}",
        jwt(json!({"sub": "u1", "brand_id": "b1"}), JWT_SECRET)
    );
    let user = [
        ("Authorization", bearer.as_str()),
        ("X-Forwarded-For", "198.51.100.1"),
    ];
    assert_eq!(post(&a, &ledger, &[growth]).status, 200);
    assert_eq!(
        post_json(&a, &deposits, &user, json!({"amount": 100})).status,
        200
    );

    // Redis away: both routes are critical and fail closed
    redis.kill9();
    let r = post(&a, &ledger, &[growth]);
    let b = problem(&r, 503, "rate-limiter-unavailable");
    assert_eq!(r.must("Retry-After"), "15");
    assert_eq!(b["retry_after_seconds"], 15, "{b}");
    assert_eq!(
        b["recommended_backoff"], "exponential_with_full_jitter",
        "{b}"
    );

    let r = post_json(&a, &deposits, &user, json!({"amount": 100}));
    assert_eq!(r.status, 503, "{r:#?}");
    assert_eq!(r.must("Content-Type"), "application/json");
    assert_eq!(r.must("Retry-After"), "15");
    let b = r.json();
    assert_eq!(b["error"], "RATE_LIMITER_UNAVAILABLE", "{b}");
    assert_eq!(b["retry_after"], 15, "{b}");
    // the token endpoint too (the ledger's third critical route)
    let r = post_form(
        &a,
        &format!("{}/v1/auth/token", gw.url(0)),
        &[],
        &[("client_id", "bob"), ("client_secret", "x")],
    );
    let b = problem(&r, 503, "rate-limiter-unavailable");
    assert_eq!(
        (r.must("Retry-After"), b["retry_after_seconds"].as_u64()),
        ("15", Some(15))
    );
}

/// The tier form's token endpoint: a subject locked out at level 1 and
/// its address at level 2; the attempt is answered with the address's
/// box (the stricter one).
#[test]
fn tier_form_login_answers_with_the_stricter_lockout() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let policy = "dofile(GW .. \"/test/policy.lua\")({ redis = { port = \
                  tonumber(os.getenv(\"RL_REDIS_PORT\")) } })";
    let gw = start(redis.port, &[Front::Nginx(policy.into())], &[]).expect("start");
    let a = agent();
    ints(&mut con, "RL.BOX TRIP rl:{auth:sub:alice} 1 900");
    ints(&mut con, "RL.BOX TRIP rl:{auth:ip:192.0.2.77} 2 3600");
    let r = post_form(
        &a,
        &format!("{}/v1/auth/token", gw.url(0)),
        &[("X-Test-Client-Ip", "192.0.2.77")],
        &[("client_id", "alice"), ("client_secret", "right")],
    );
    let b = problem(&r, 429, "penalty-box-active");
    assert_eq!(b["penalty_level"], 2, "{b}");
    assert_eq!(ratelimit(&r).0, "auth-ip");
    let left = b["retry_after_seconds"].as_u64().expect("seconds");
    assert!((3590..=3600).contains(&left), "{b}");
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}
