//! End to end: nginx (`resty.rl.nginx`) + redis-server with the module +
//! a local upstream, driven with real HTTP. See `gateway/README.md`.
//!
//! Each test starts its own Redis and nginx on free loopback ports. The
//! policy is `gateway/test/policy.lua` (the sample policy's thresholds,
//! boxes, costs and leases, with small budgets and 1 point per minute of
//! refill, so counts are exact).

mod common;
#[path = "common/gateway.rs"]
mod gateway;

use std::time::{Duration, Instant};

use common::Server;
use common::{int, ints};
use gateway::{
    agent, counter, get, head, leases, poll, post, post_form, problem, ratelimit, Nginx, Resp,
};
use serde_json::Value;

const SANDBOX: (&str, &str) = ("X-Api-Key", "k-sandbox");
const GROWTH: (&str, &str) = ("X-Api-Key", "k-growth");
const GROWTH_2: (&str, &str) = ("X-Api-Key", "k-growth-2");
const ENTERPRISE: (&str, &str) = ("X-Api-Key", "k-ent");
/// Long enough for a log-phase timer on a loaded machine.
const ASYNC: Duration = Duration::from_secs(10);

/// How long the "slow Redis" test pauses Redis (an UNPAUSE waits for the
/// pause too, so the test pays it).
const PAUSE_MS: u64 = 5_000;
/// The test policy's growth key burst and the local limiter's share.
const GROWTH_KEY_BURST: u64 = 100;
const FALLBACK_RATIO: f64 = 0.25;
/// Seconds a box may have run when a test looks at it.
const BOX_SLACK: u64 = 5;

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

fn setup() -> (Server, Nginx) {
    let redis = Server::start(&[]);
    let nginx = Nginx::start(redis.port);
    (redis, nginx)
}

#[test]
fn allowed_requests_carry_the_ratelimit_fields() {
    let (_redis, nginx) = setup();
    let a = agent();
    let main = nginx.url(nginx.ports.main);
    let r = get(
        &a,
        &format!("{main}/v1/ledgers/L-1/entries?page=2"),
        &[GROWTH],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(
        r.json(),
        serde_json::json!({"method": "GET", "uri": "/v1/ledgers/L-1/entries"})
    );
    assert_eq!(
        r.must("RateLimit-Policy"),
        r#""growth-key";q=1;qu="points";w=60, "growth-tenant";q=1;qu="points";w=60"#
    );
    // 99 left of 100 in the key's bucket (the tenant's has 149): the key binds
    let (name, rem, reset) = ratelimit(&r);
    assert_eq!((name.as_str(), rem), ("growth-key", 99));
    assert_eq!(reset, Some(60), "1 point refills in 60 s");
    assert!(
        r.header("RateLimit-Limit").is_none(),
        "legacy fields are off"
    );
    assert!(r.header("Retry-After").is_none());

    // the legacy triple behind the option (another front end, same Redis)
    let legacy = nginx.url(nginx.ports.legacy);
    let r = post(&a, &format!("{legacy}/v1/ledgers/L-1/entries"), &[GROWTH]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(r.must("RateLimit-Limit"), "100");
    assert_eq!(r.must("RateLimit-Remaining"), "98");
    let reset: u64 = r.must("RateLimit-Reset").parse().expect("seconds");
    assert!((110..=120).contains(&reset), "2 points to refill: {reset}");
    assert_eq!(ratelimit(&r).1, 98);

    // no API key, or an unknown one: 401, nothing charged
    for h in [vec![], vec![("X-Api-Key", "nope")]] {
        let r = get(&a, &format!("{main}/v1/ledgers"), &h);
        let b = problem(&r, 401, "unauthenticated");
        assert!(b["detail"].as_str().unwrap().contains("X-Api-Key"));
    }
    assert_eq!(
        counter(&a, &main, "allowed", "GET /v1/ledgers/{id}/entries"),
        1
    );
    assert_eq!(counter(&a, &main, "unauthenticated", "GET /v1/ledgers"), 2);
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

#[test]
fn throttled_requests_get_429_with_a_problem_body() {
    let (redis, nginx) = setup();
    let a = agent();
    let main = nginx.url(nginx.ports.main);
    let url = format!("{main}/v1/ledgers");
    for i in 0..50 {
        let r = get(&a, &url, &[SANDBOX]);
        assert_eq!(r.status, 200, "request {i}: {r:#?}");
        assert_eq!(ratelimit(&r).1, 49 - i);
    }
    let r = get(&a, &url, &[SANDBOX]);
    let b1 = problem(&r, 429, "rate-limit-exceeded");
    // 1 point at 1 point per minute, less what refilled during the test
    let retry: u64 = r.must("Retry-After").parse().expect("delta-seconds");
    assert!((50..=60).contains(&retry), "{retry}");
    assert_eq!(b1["retry_after_seconds"], retry);
    assert_eq!(r.must("X-Penalty-Box-Status"), "Warning");
    let (name, rem, reset) = ratelimit(&r);
    assert_eq!((name.as_str(), rem), ("sandbox-key", 0));
    assert!(
        reset.is_some_and(|t| t > 2900 && t <= 3000),
        "50 points to refill: {reset:?}"
    );
    assert_eq!(b1["quota_tier"], "sandbox");
    assert_eq!(b1["penalty_strikes_remaining"], 19);
    assert_eq!(b1["instance"], "/v1/ledgers");
    assert_eq!(b1["recommended_backoff"], "exponential_with_full_jitter");
    let detail = b1["detail"].as_str().unwrap();
    for part in [
        "sandbox",
        "per-key",
        "burst 50",
        "costs 1 point",
        "retry in",
    ] {
        assert!(detail.contains(part), "detail lacks {part:?}: {detail}");
    }
    let b = b1.clone();
    assert!(b.get("penalty_level").is_none() && b.get("lockout_ends_at").is_none());

    // the tenant bucket binds for a second key of a spent tenant
    for i in 0..100 {
        assert_eq!(get(&a, &url, &[GROWTH]).status, 200, "growth request {i}");
    }
    for i in 0..50 {
        let r = get(&a, &url, &[GROWTH_2]);
        assert_eq!(r.status, 200, "growth-2 request {i}: {r:#?}");
    }
    let r = get(&a, &url, &[GROWTH_2]);
    let b = problem(&r, 429, "rate-limit-exceeded");
    assert_eq!(ratelimit(&r).0, "growth-tenant");
    assert!(b["detail"].as_str().unwrap().contains("per-tenant"), "{b}");

    // one structured line per throttled request, no secret in it
    poll(ASYNC, "2 rl_event lines", || nginx.events().len() >= 2);
    let events = nginx.events();
    assert_eq!(events.len(), 2, "{events:?}");
    let e = &events[0];
    assert_eq!(e["decision"], "throttled");
    assert_eq!(e["tenant"], "sbx");
    assert_eq!(e["key_id"], "s1");
    assert_eq!(e["tier"], "sandbox");
    assert_eq!(e["route"], "GET /v1/ledgers");
    assert_eq!(e["status"], 429);
    assert_eq!(e["cost"], 1);
    assert_eq!(e["retry_after"], retry);
    assert_eq!(e["request_id"], b1["request_id"]);
    assert!(
        !nginx.error_log().contains("k-sandbox"),
        "the API key is logged"
    );
    assert_eq!(events[1]["policy"], "growth-tenant");
    assert_eq!(counter(&a, &main, "throttled", "GET /v1/ledgers"), 2);
    assert_eq!(counter(&a, &main, "allowed", "GET /v1/ledgers"), 200);
    // nothing was charged by the throttled call: growth-2's own bucket
    // (not the tenant's, which refused it) still has its 50 points (51
    // if a minute went by)
    let mut con = redis.client();
    let left = ints(&mut con, "RL.TAKE rl:{t:acme}:key:g2 100 1 60 COST 0")[2];
    assert!((50..=51).contains(&left), "growth-2 has {left} points");
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

/// Sends throttled requests until the box trips, checking each strike
/// (`first`: the first strike, already sent); returns the boxed response.
fn strike_until_boxed(
    a: &ureq::Agent,
    url: &str,
    key: (&str, &str),
    threshold: i64,
    mut first: Option<Resp>,
) -> Resp {
    for i in 1..threshold {
        let r = first.take().unwrap_or_else(|| get(a, url, &[key]));
        let b = problem(&r, 429, "rate-limit-exceeded");
        assert_eq!(r.must("X-Penalty-Box-Status"), "Warning");
        assert_eq!(b["penalty_strikes_remaining"], threshold - i, "strike {i}");
    }
    get(a, url, &[key])
}

/// An operator lifts the box of `rkey` (`RL.BOX RELEASE`, then `INCR
/// rl:deny:version` so that the nodes drop their deny cache), and the
/// gateway sees it (polled: boxed answers from the cache count no strike).
/// Returns the first answer that is not a box.
fn release(
    con: &mut redis::Connection,
    rkey: &str,
    a: &ureq::Agent,
    url: &str,
    key: (&str, &str),
) -> Resp {
    assert_eq!(int(con, &format!("RL.BOX RELEASE {rkey}")), 1);
    int(con, "INCR rl:deny:version");
    let deadline = Instant::now() + ASYNC;
    loop {
        let r = get(a, url, &[key]);
        if r.header("X-Penalty-Box-Status") != Some("Active-Lockout") {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "the release never reached the gateway"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A box answer of level `level` of a box lasting `secs` (429,
/// Active-Lockout), answered at most `BOX_SLACK` seconds into the box.
fn assert_boxed(r: &Resp, level: i64, secs: u64) {
    let b = problem(r, 429, "penalty-box-active");
    assert_eq!(r.must("X-Penalty-Box-Status"), "Active-Lockout");
    assert_eq!(b["penalty_level"], level, "{b}");
    assert_eq!(b["penalty_strikes_remaining"], 0);
    let left = b["retry_after_seconds"]
        .as_u64()
        .expect("retry_after_seconds");
    assert!(
        (secs - BOX_SLACK..=secs).contains(&left),
        "{left} s left of {secs}"
    );
    let now = unix_now();
    let retry = r.must("Retry-After");
    if secs >= 3600 {
        // an HTTP-date for boxes of an hour or more, however long is left
        let at = gateway::http_date(retry).unwrap_or_else(|| panic!("not an HTTP-date: {retry}"));
        assert!(
            (now + left - 2..=now + left + 1).contains(&at),
            "{retry}: {at} vs now {now} + {left}"
        );
    } else {
        assert_eq!(retry, left.to_string());
    }
    let ends = b["lockout_ends_at"].as_str().expect("lockout_ends_at");
    let at = gateway::rfc3339(ends).unwrap_or_else(|| panic!("not RFC 3339 UTC: {ends}"));
    assert!(
        (now + left - 2..=now + left + 1).contains(&at),
        "{ends}: {at} vs now {now} + {left}"
    );
    assert!(b["detail"]
        .as_str()
        .unwrap()
        .contains(&format!("level {level}")));
    let (name, rem, _) = ratelimit(r);
    assert_eq!(rem, 0);
    assert!(name.ends_with("-key"));
}

#[test]
fn penalty_box_levels_and_manual_review() {
    let (redis, nginx) = setup();
    let mut con = redis.client();
    let a = agent();
    let url = format!("{}/v1/ledgers/L-9", nginx.url(nginx.ports.main));
    // sandbox: 50 points, then 20 strikes per level; 300 s, 1 h, 1 day
    for _ in 0..50 {
        assert_eq!(get(&a, &url, &[SANDBOX]).status, 200);
    }
    let key = "rl:{t:sbx}:key:s1";
    let mut first = None;
    for (level, secs) in [(1, 300), (2, 3600), (3, 86400)] {
        let r = strike_until_boxed(&a, &url, SANDBOX, 20, first.take());
        assert_boxed(&r, level, secs);
        if secs == 3600 {
            // a second into a 1-hour box: still an HTTP-date (the form
            // follows the box's length, not the time left)
            std::thread::sleep(Duration::from_millis(1100));
        }
        // while boxed: the same answer (from the edge deny cache), no strike
        let calls = redis.info_get("rl", "rl_take_calls");
        assert_boxed(&get(&a, &url, &[SANDBOX]), level, secs);
        assert_eq!(
            redis.info_get("rl", "rl_take_calls"),
            calls,
            "no Redis round trip"
        );
        assert_eq!(ints(&mut con, &format!("RL.BOX STATUS {key}"))[0], level);
        // an operator lifts the box; the offenses stay, so the next trip escalates
        first = Some(release(&mut con, key, &a, &url, SANDBOX));
    }

    // enterprise: 100 strikes, level 3 is never automatic: manual review
    let url = format!("{}/v1/ledgers", nginx.url(nginx.ports.main));
    for _ in 0..50 {
        assert_eq!(get(&a, &url, &[ENTERPRISE]).status, 200);
    }
    let key = "rl:{t:bigco}:key:e1";
    let mut first = None;
    for (level, secs) in [(1, 300), (2, 3600)] {
        let r = strike_until_boxed(&a, &url, ENTERPRISE, 100, first.take());
        assert_boxed(&r, level, secs);
        first = Some(release(&mut con, key, &a, &url, ENTERPRISE));
    }
    let r = strike_until_boxed(&a, &url, ENTERPRISE, 100, first.take());
    let b = problem(&r, 403, "penalty-box-active");
    assert_eq!(r.must("X-Penalty-Box-Status"), "Active-Lockout");
    assert!(r.header("Retry-After").is_none(), "no time to come back");
    assert_eq!(b["penalty_level"], 3);
    assert_eq!(b["quota_tier"], "enterprise");
    assert!(
        b["lockout_ends_at"].is_null() && b["retry_after_seconds"].is_null(),
        "{b}"
    );
    assert_eq!(b["recommended_backoff"], "none");
    assert!(b["detail"].as_str().unwrap().contains("manual review"));
    assert_eq!(ratelimit(&r), ("enterprise-key".to_string(), 0, None));
    assert_eq!(
        ints(&mut con, &format!("RL.BOX STATUS {key}"))[..2],
        [3, -1]
    );
    // the review releases it: throttled again (the bucket is still empty), not boxed
    let r = release(&mut con, key, &a, &url, ENTERPRISE);
    problem(&r, 429, "rate-limit-exceeded");

    // one line per boxed request: the 6 trips and the 3 sandbox answers
    // "while boxed" exactly, plus the cached answers seen while a release
    // was on its way to the gateway (deny_cache: true)
    let main = nginx.url(nginx.ports.main);
    let events = nginx.events();
    let boxed: Vec<&Value> = events.iter().filter(|e| e["decision"] == "boxed").collect();
    let cached_on = |route: &str| {
        boxed
            .iter()
            .filter(|e| e["deny_cache"] == true && e["route"] == route)
            .count() as u64
    };
    let trips = boxed.iter().filter(|e| e["deny_cache"] != true).count();
    assert_eq!(trips, 6, "each trip answered by Redis");
    assert!(
        cached_on("GET /v1/ledgers/{id}") >= 3,
        "the answers while boxed"
    );
    assert_eq!(
        counter(&a, &main, "boxed", "GET /v1/ledgers/{id}"),
        3 + cached_on("GET /v1/ledgers/{id}")
    );
    assert_eq!(
        counter(&a, &main, "boxed", "GET /v1/ledgers"),
        3 + cached_on("GET /v1/ledgers")
    );
    assert!(boxed
        .iter()
        .any(|e| e["box_level"] == 3 && e["status"] == 403));
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

#[test]
fn leases_give_409_per_ledger_and_429_per_tenant() {
    let (redis, nginx) = setup();
    let mut con = redis.client();
    let main = nginx.url(nginx.ports.main);
    let reconcile = |ledger: &str, hold: &str| {
        format!("{main}/v1/ledgers/reconcile?ledger_id={ledger}&hold={hold}")
    };
    let ledger_key = |l: &str| format!("rl:{{t:acme}}:lease:reconcile-ledger:{l}");
    let tenant_key = "rl:{t:acme}:lease:reconcile";
    std::thread::scope(|s| {
        // A holds ledger L1 for 2.5 s
        let a1 = s.spawn(|| post(&agent(), &reconcile("L1", "2.5"), &[GROWTH]));
        poll(ASYNC, "A's lease", || {
            leases(&mut redis.client(), &ledger_key("L1")) == 1
        });
        let a = agent();
        let r = post(&a, &reconcile("L1", "0"), &[GROWTH]);
        let b = problem(&r, 409, "concurrency-limit-exceeded");
        let retry: u64 = r.must("Retry-After").parse().expect("delta-seconds");
        // the holder's expected end (5 s declared), not the 300 s ttl
        assert!((1..=5).contains(&retry), "the expected duration: {retry}");
        assert_eq!(b["retry_after_seconds"], retry);
        assert_eq!(b["concurrency_limit"], 1);
        assert!(
            b["detail"].as_str().unwrap().contains("per ledger_id"),
            "{b}"
        );
        // the points were spent (a conflict is work done), and the rate fields say so
        assert_eq!(ratelimit(&r).1, 80);
        // C on another ledger: growth allows 2 reconciles per tenant
        let c1 = s.spawn(|| post(&agent(), &reconcile("L2", "2.5"), &[GROWTH_2]));
        poll(ASYNC, "C's lease", || {
            leases(&mut redis.client(), tenant_key) == 2
        });
        // D on a third ledger: the tenant's 2 are taken
        let r = post(&a, &reconcile("L3", "0"), &[GROWTH]);
        let b = problem(&r, 429, "concurrency-limit-exceeded");
        assert_eq!(b["concurrency_limit"], 2);
        assert!(r.header("Retry-After").is_some());
        // D gave back the ledger lease it had taken
        assert_eq!(leases(&mut con, &ledger_key("L3")), 0);
        let (ra, rc) = (a1.join().expect("A"), c1.join().expect("C"));
        assert_eq!((ra.status, rc.status), (200, 200), "{ra:#?} {rc:#?}");
    });
    // released in the log phase (a timer)
    poll(ASYNC, "leases released", || {
        leases(&mut con, tenant_key) == 0 && leases(&mut con, &ledger_key("L1")) == 0
    });
    let a = agent();
    assert_eq!(post(&a, &reconcile("L1", "0"), &[GROWTH]).status, 200);
    assert_eq!(
        counter(&a, &main, "conflict", "POST /v1/ledgers/reconcile"),
        2
    );
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

#[test]
fn exports_cost_25_or_50_beyond_90_days() {
    let (redis, nginx) = setup();
    let mut con = redis.client();
    let a = agent();
    let main = nginx.url(nginx.ports.main);
    let export =
        |from: &str, to: &str| format!("{main}/v1/reports/audit-export?from={from}&to={to}");
    let lease = "rl:{t:acme}:lease:export";
    let r = get(&a, &export("2026-01-01", "2026-03-31"), &[GROWTH]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 75, "cost 25 for 89 days");
    poll(ASYNC, "export lease released", || {
        leases(&mut con, lease) == 0
    });
    let r = get(&a, &export("2025-01-01", "2026-01-01"), &[GROWTH]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 25, "cost 50 for 365 days");
    poll(ASYNC, "export lease released", || {
        leases(&mut con, lease) == 0
    });
    let r = get(&a, &export("2025-01-01", "2026-01-01"), &[GROWTH]);
    let b = problem(&r, 429, "rate-limit-exceeded");
    assert!(
        b["detail"].as_str().unwrap().contains("costs 50 points"),
        "{b}"
    );
    // 25 more points at 1 per minute
    let retry = b["retry_after_seconds"].as_u64().unwrap();
    assert!((1440..=1500).contains(&retry), "{retry}");
    // exactly 90 days: 25
    let r = get(&a, &export("2026-01-01", "2026-04-01"), &[GROWTH]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 0);
    // one export at a time per growth tenant: a second one while the first runs
    // (the other key of the tenant: 100 points; the tenant has 50 left)
    poll(ASYNC, "export lease released", || {
        leases(&mut con, lease) == 0
    });
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            get(
                &agent(),
                &format!("{main}/v1/reports/audit-export?from=2026-03-01&to=2026-03-02&hold=2"),
                &[GROWTH_2],
            )
        });
        poll(ASYNC, "first export's lease", || {
            leases(&mut redis.client(), lease) == 1
        });
        let r = get(&a, &export("2026-03-01", "2026-03-02"), &[GROWTH_2]);
        let b = problem(&r, 429, "concurrency-limit-exceeded");
        assert_eq!(b["concurrency_limit"], 1);
        assert!(b["detail"].as_str().unwrap().contains("per tenant"), "{b}");
        assert_eq!(first.join().expect("first").status, 200);
    });
    assert_eq!(
        counter(&a, &main, "conflict", "GET /v1/reports/audit-export"),
        1
    );
    // the first export's count comes from its log phase, after its response
    poll(ASYNC, "4 exports counted", || {
        counter(&a, &main, "allowed", "GET /v1/reports/audit-export") == 4
    });
}

#[test]
fn failed_logins_lock_out_the_subject_then_the_ip() {
    let (redis, nginx) = setup();
    let mut con = redis.client();
    let a = agent();
    let url = format!("{}/v1/auth/token", nginx.url(nginx.ports.main));
    let ip = |addr: &'static str| ("X-Test-Client-Ip", addr);
    // failures left for a subject / an IP, read with a probe that writes nothing
    let left = |con: &mut redis::Connection, key: &str, limit: u32| {
        ints(con, &format!("RL.WINDOW {key} {limit} 900 COST 0"))[2]
    };
    let attempt = |id: &str, secret: &str, addr: &'static str| {
        post_form(
            &a,
            &url,
            &[ip(addr)],
            &[("client_id", id), ("client_secret", secret)],
        )
    };

    // alice (exists) with a bad secret and mallory (unknown): same answers
    let mut lockouts = vec![];
    for who in ["alice", "mallory"] {
        let key = format!("rl:{{auth:sub:{who}}}");
        for i in 1..=5 {
            let r = attempt(who, "wrong", "192.0.2.1");
            assert_eq!(r.status, 401, "{r:#?}");
            assert_eq!(r.body, "{\"error\":\"invalid_client\"}\n");
            assert_eq!(
                r.must("RateLimit-Policy"),
                r#""auth-subject";q=5;w=900, "auth-ip";q=20;w=900"#
            );
            // r is what the next attempt sees: this failure counted, a whole window
            assert_eq!(ratelimit(&r), ("auth-subject".into(), 5 - i, Some(900)));
            poll(ASYNC, "failure recorded", || {
                left(&mut con, &key, 5) == 5 - i
            });
        }
        // the sixth attempt is refused even with the right secret
        let r = attempt(who, "right", "192.0.2.1");
        let b = problem(&r, 429, "penalty-box-active");
        assert_eq!(r.must("X-Penalty-Box-Status"), "Active-Lockout");
        assert_eq!(r.must("Retry-After"), "900");
        assert_eq!(b["penalty_level"], 1);
        assert_eq!(b["retry_after_seconds"], 900);
        assert_eq!(b["quota_tier"], "auth");
        let ends = b["lockout_ends_at"].as_str().unwrap().to_string();
        assert!(ends.ends_with('Z'));
        assert_eq!(ratelimit(&r).0, "auth-subject");
        lockouts.push(b);
    }
    for field in ["type", "title", "detail", "status", "penalty_level"] {
        assert_eq!(lockouts[0][field], lockouts[1][field], "{field} differs");
    }
    // the IP: 20 failures across subjects, then the IP is locked out
    let ip_key = "rl:{auth:ip:198.51.100.7}";
    for n in 1..=20 {
        let who = format!("user{}", (n - 1) / 5);
        let r = attempt(&who, "wrong", "198.51.100.7");
        assert_eq!(r.status, 401, "failure {n}: {r:#?}");
        poll(ASYNC, "IP failure recorded", || {
            left(&mut con, ip_key, 20) == 20 - n
        });
    }
    // a fresh subject from that address is refused: the IP is locked out
    let r = attempt("dave", "wrong", "198.51.100.7");
    let b = problem(&r, 429, "penalty-box-active");
    assert_eq!(ratelimit(&r).0, "auth-ip");
    assert_eq!(b["penalty_level"], 1);
    assert_eq!(b["detail"], lockouts[0]["detail"]);
    // an operator forgives alice: she signs in from elsewhere, and a
    // success is not counted as a failure
    let _: () = redis::cmd("DEL")
        .arg("rl:{auth:sub:alice}")
        .query(&mut con)
        .expect("DEL");
    let r = attempt("alice", "right", "192.0.2.9");
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(r.body.contains("access_token"));
    assert_eq!(attempt("alice", "wrong", "192.0.2.9").status, 401);
    poll(ASYNC, "the failure (only) recorded", || {
        left(&mut con, "rl:{auth:sub:alice}", 5) < 5
    });
    assert_eq!(left(&mut con, "rl:{auth:sub:alice}", 5), 4);
    let main = nginx.url(nginx.ports.main);
    poll(ASYNC, "3 lockouts counted", || {
        counter(&a, &main, "locked_out", "POST /v1/auth/token") == 3
    });
    let locked: Vec<Value> = nginx
        .events()
        .into_iter()
        .filter(|e| e["decision"] == "locked_out")
        .collect();
    assert_eq!(locked.len(), 3, "{locked:?}");
    assert_eq!(
        (&locked[0]["subject"], &locked[0]["client_ip"]),
        (&"alice".into(), &"192.0.2.1".into())
    );
    assert_eq!(locked[2]["policy"], "auth-ip");
    assert!(
        !nginx.error_log().contains("right") && !nginx.error_log().contains("wrong"),
        "a secret in the log"
    );
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

#[test]
fn redis_slow_or_dead_fails_closed_on_critical_routes_and_degrades_elsewhere() {
    let (redis, nginx) = setup();
    let a = agent();
    let main = nginx.url(nginx.ports.main);
    let read = format!("{main}/v1/ledgers/L-1");
    let critical = format!("{main}/v1/ledgers/reconcile?ledger_id=L1");
    let check_failed = |a: &ureq::Agent| {
        let t = Instant::now();
        let r = post(a, &critical, &[GROWTH]);
        let b = problem(&r, 503, "rate-limiter-unavailable");
        assert_eq!(r.must("Retry-After"), "15");
        assert_eq!(b["retry_after_seconds"], 15);
        assert_eq!(b["quota_tier"], "growth");
        // the static policies, but no live counter
        assert_eq!(
            r.must("RateLimit-Policy"),
            r#""growth-key";q=1;qu="points";w=60, "growth-tenant";q=1;qu="points";w=60"#
        );
        assert!(r.header("RateLimit").is_none());
        let r = post_form(
            a,
            &format!("{main}/v1/auth/token"),
            &[],
            &[("client_id", "alice")],
        );
        problem(&r, 503, "rate-limiter-unavailable");
        assert!(r.must("RateLimit-Policy").starts_with("\"auth-subject\""));
        let r = get(a, &read, &[GROWTH]);
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(ratelimit(&r).0, "growth-key-degraded");
        assert_eq!(
            r.must("RateLimit-Policy"),
            r#""growth-key-degraded";q=1;qu="points";w=60, "growth-tenant-degraded";q=1;qu="points";w=60"#
        );
        // a few budgets of 250 ms: answered while Redis is still paused
        // (the pause started before `t`), however loaded the machine
        assert!(
            t.elapsed() < Duration::from_millis(PAUSE_MS - 500),
            "{:?}",
            t.elapsed()
        );
        r.must("X-Worker").to_string()
    };
    // local admissions per worker: the local limiter is per worker
    let mut per_worker: std::collections::HashMap<String, u64> = Default::default();

    // slower than the budget: Redis paused
    assert_eq!(get(&a, &read, &[GROWTH]).status, 200);
    let mut con = redis.client();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE_MS)
        .arg("ALL")
        .query(&mut con)
        .expect("CLIENT PAUSE");
    *per_worker.entry(check_failed(&a)).or_default() += 1;
    // UNPAUSE waits for the pause; a read interrupted meanwhile (EINTR,
    // seen on a loaded machine) is retried, 3 times at most
    let mut unpaused = Err(String::new());
    for _ in 0..3 {
        unpaused = redis::cmd("CLIENT")
            .arg("UNPAUSE")
            .query::<()>(&mut redis.client())
            .map_err(|e| e.to_string());
        if unpaused.is_ok() {
            break;
        }
    }
    unpaused.expect("CLIENT UNPAUSE");
    poll(ASYNC, "Redis answers again", || {
        ratelimit(&get(&a, &read, &[GROWTH])).0 == "growth-key"
    });

    // dead: killed mid-test
    redis.kill9();
    *per_worker.entry(check_failed(&a)).or_default() += 1;
    // the local limiter: fallback_ratio of the tier's key burst per worker
    // (the tenant's share is larger), whichever workers the connections
    // land on; 60 requests overrun it on at least one of the 2 workers
    let per_worker_budget = (GROWTH_KEY_BURST as f64 * FALLBACK_RATIO).floor() as u64;
    let mut throttled = 0;
    for _ in 0..60 {
        let r = get(&a, &read, &[GROWTH]);
        match r.status {
            200 => {
                *per_worker
                    .entry(r.must("X-Worker").to_string())
                    .or_default() += 1
            }
            429 => {
                let b = problem(&r, 429, "rate-limit-exceeded");
                assert!(b["penalty_strikes_remaining"].is_null());
                assert!(b["detail"].as_str().unwrap().contains("degraded"));
                throttled += 1;
            }
            s => panic!("status {s}: {r:#?}"),
        }
    }
    assert!(throttled > 0, "the local limiter throttles");
    // with the 2 degraded reads of check_failed
    for (worker, admitted) in &per_worker {
        assert!(
            *admitted <= per_worker_budget,
            "worker {worker} admitted {admitted} > {per_worker_budget} while Redis was down"
        );
    }
    let admitted: u64 = per_worker.values().sum();
    assert!(admitted + throttled == 62, "{admitted} + {throttled}");
    // counted in the log phase, after the responses
    poll(ASYNC, "degraded decisions counted", || {
        counter(&a, &main, "degraded_allowed", "GET /v1/ledgers/{id}") >= admitted
            && counter(&a, &main, "degraded_throttled", "GET /v1/ledgers/{id}") == throttled
    });
    assert_eq!(
        counter(&a, &main, "failed_closed", "POST /v1/ledgers/reconcile"),
        2
    );
    assert_eq!(
        counter(&a, &main, "failed_closed", "POST /v1/auth/token"),
        2
    );
    let metrics = get(&a, &format!("{main}/metrics"), &[]).body;
    assert!(
        metrics.contains("rl_gateway_redis_errors_total{kind=\"timeout\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("rl_gateway_redis_errors_total{kind=\"refused\"}"),
        "{metrics}"
    );

    // back: Redis restarted (empty), decisions come from it again
    redis.restart();
    poll(ASYNC, "Redis answers after restart", || {
        let r = get(&a, &read, &[GROWTH]);
        r.status == 200 && ratelimit(&r).0 == "growth-key"
    });
    assert_eq!(post(&a, &critical, &[GROWTH]).status, 200);
}

#[test]
fn shadow_mode_logs_and_lets_everything_through() {
    let (redis, nginx) = setup();
    let mut con = redis.client();
    let a = agent();
    let shadow = nginx.url(nginx.ports.shadow);
    let url = format!("{shadow}/v1/ledgers");
    for i in 0..80 {
        let r = get(&a, &url, &[SANDBOX]);
        assert_eq!(r.status, 200, "request {i}: {r:#?}");
        assert!(r.header("RateLimit").is_none() && r.header("RateLimit-Policy").is_none());
        assert!(r.header("Retry-After").is_none());
    }
    // what would have happened: 50 allowed, 19 throttled, then boxed
    poll(ASYNC, "30 shadow lines", || nginx.events().len() >= 30);
    let events = nginx.events();
    let would = |d: &str| events.iter().filter(|e| e["would_be"] == d).count();
    assert_eq!((would("throttled"), would("boxed")), (19, 11), "{events:?}");
    assert!(events
        .iter()
        .all(|e| e["decision"] == "shadow_allowed" && e["status"] == 200));
    assert_eq!(
        counter(&a, &shadow, "shadow_allowed", "GET /v1/ledgers"),
        30
    );
    // the module did box the key (in the shadow prefix)
    assert_eq!(ints(&mut con, "RL.BOX STATUS shadow:{t:sbx}:key:s1")[0], 1);
    // a lease conflict is let through too
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            post(
                &agent(),
                &format!("{shadow}/v1/ledgers/reconcile?ledger_id=L1&hold=1.5"),
                &[GROWTH],
            )
        });
        poll(ASYNC, "first lease", || {
            leases(
                &mut redis.client(),
                "shadow:{t:acme}:lease:reconcile-ledger:L1",
            ) == 1
        });
        let r = post(
            &a,
            &format!("{shadow}/v1/ledgers/reconcile?ledger_id=L1"),
            &[GROWTH],
        );
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(first.join().expect("first").status, 200);
    });
    poll(ASYNC, "conflict line", || {
        nginx.events().iter().any(|e| e["would_be"] == "conflict")
    });
    // an unknown key would get 401; shadow lets it through
    let r = get(&a, &url, &[("X-Api-Key", "nope")]);
    assert_eq!(r.status, 200, "{r:#?}");
    poll(ASYNC, "unauthenticated line", || {
        nginx
            .events()
            .iter()
            .any(|e| e["would_be"] == "unauthenticated")
    });
    // Redis down: a critical route would fail closed; shadow lets it through
    redis.kill9();
    let r = post(
        &a,
        &format!("{shadow}/v1/ledgers/reconcile?ledger_id=L9"),
        &[GROWTH],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

#[test]
fn under_load_admitted_points_never_exceed_the_budget() {
    let (_redis, nginx) = setup();
    let url = format!("{}/v1/ledgers/L-7/entries", nginx.url(nginx.ports.main));
    // 2 keys of one tenant, 3 connections each, 500 requests per connection
    let per_conn = 500;
    let start = Instant::now();
    let results: Vec<(usize, u64, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|c| {
                let url = &url;
                s.spawn(move || {
                    let key = if c % 2 == 0 { "k-load-1" } else { "k-load-2" };
                    let a = agent();
                    let (mut ok, mut limited) = (0, 0);
                    for _ in 0..per_conn {
                        let r = get(&a, url, &[("X-Api-Key", key)]);
                        match r.status {
                            200 => ok += 1,
                            429 => limited += 1,
                            s => panic!("status {s}: {r:#?}"),
                        }
                    }
                    (c % 2, ok, limited)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("load thread"))
            .collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let admitted = |k: usize| -> u64 { results.iter().filter(|r| r.0 == k).map(|r| r.1).sum() };
    let total: u64 = results.iter().map(|r| r.1 + r.2).sum();
    assert_eq!(total, 6 * per_conn);
    let (k1, k2) = (admitted(0), admitted(1));
    // key: burst 50 + 100/s; tenant: burst 75 + 150/s (cost 1 each); the
    // module counts on its clock, within the interval measured here
    let key_cap = 50.0 + 100.0 * elapsed;
    let tenant_cap = 75.0 + 150.0 * elapsed;
    eprintln!(
        "load: {total} requests in {elapsed:.2} s, admitted {k1} + {k2} (key cap {key_cap:.0}, tenant cap {tenant_cap:.0})"
    );
    assert!(
        k1 as f64 <= key_cap && k2 as f64 <= key_cap,
        "{k1} {k2} > {key_cap}"
    );
    assert!(
        ((k1 + k2) as f64) <= tenant_cap,
        "{} > {tenant_cap}",
        k1 + k2
    );
    // and the budget was used, not refused wholesale: the tenant's burst
    // plus half its refill over the measured time, or half of what was
    // sent when the machine sent less than that (no minimum speed)
    let floor = (75.0 + 75.0 * elapsed).min(total as f64 / 2.0);
    assert!(
        (k1 + k2) as f64 >= floor,
        "admitted {} of a budget of {tenant_cap:.0} (floor {floor:.0})",
        k1 + k2
    );
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

/// Starts the sample configuration (`gateway/nginx/`: nginx.conf,
/// rl-http.conf, policy.lua, or `policy` instead) in a fresh prefix with
/// `lib/` linked, on a free port instead of 8080, against Redis on
/// `redis_port` (through `RL_REDIS_PORT`, as the sample reads it) and an
/// upstream port where nothing listens. Returns the running nginx and its
/// port, or nginx's output when it did not start.
fn start_sample(policy: Option<&str>, redis_port: u16) -> Result<(Nginx, u16), String> {
    gateway::nginx_bin();
    let dir = common::fresh_dir("sample");
    let gw = gateway::gateway_dir();
    std::os::unix::fs::symlink(gw.join("lib"), dir.join("lib")).expect("symlink");
    std::fs::create_dir(dir.join("logs")).expect("logs");
    std::fs::create_dir(dir.join("nginx")).expect("nginx");
    let (port, upstream) = (common::free_port(), common::free_port());
    let edits = [
        ("listen 8080;", format!("listen 127.0.0.1:{port};")),
        (
            "server 127.0.0.1:9000;",
            format!("server 127.0.0.1:{upstream};"),
        ),
    ];
    for f in ["nginx.conf", "rl-http.conf", "policy.lua"] {
        let mut text = std::fs::read_to_string(gw.join("nginx").join(f)).expect("read sample");
        for (from, to) in &edits {
            text = text.replace(from, to);
        }
        std::fs::write(dir.join("nginx").join(f), text).expect("write sample");
    }
    if let Some(p) = policy {
        std::fs::write(dir.join("nginx/policy.lua"), p).expect("write policy");
    }
    let ports = gateway::Ports {
        main: port,
        legacy: port,
        shadow: port,
        kong: port,
        upstream: port,
    };
    let conf = dir.join("nginx/nginx.conf");
    let redis_port = redis_port.to_string();
    Nginx::launch(
        dir,
        &conf,
        &["-g", "daemon off;"],
        &[("RL_REDIS_PORT", &redis_port)],
        ports,
    )
    .map(|n| (n, port))
}

#[test]
fn the_sample_nginx_conf_runs_its_policy_and_a_bad_policy_stops_nginx() {
    let redis = Server::start(&[]);
    {
        let (nginx, port) = start_sample(None, redis.port).unwrap_or_else(|e| panic!("{e}"));
        let a = agent();
        let base = format!("http://127.0.0.1:{port}");
        // the sample policy's growth tier; the upstream is down (502), the
        // fields are there all the same
        let r = get(
            &a,
            &format!("{base}/v1/ledgers"),
            &[("X-Api-Key", "demo-growth-key")],
        );
        assert_eq!(r.status, 502, "{r:#?}");
        assert_eq!(
            r.must("RateLimit-Policy"),
            r#""growth-key";q=3000;qu="points";w=60, "growth-tenant";q=6000;qu="points";w=60"#
        );
        assert_eq!(r.must("RateLimit"), r#""growth-key";r=2999;t=1"#);
        let r = get(
            &a,
            &format!("{base}/v1/reports/audit-export"),
            &[("X-Api-Key", "demo-enterprise-key")],
        );
        assert_eq!(
            ratelimit(&r),
            ("enterprise-key".to_string(), 11950, Some(1))
        );
        assert_eq!(counter(&a, &base, "allowed", "GET /v1/ledgers"), 1);
        assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
    }
    // a policy error names the option, and nginx does not start
    for (policy, message) in [
        (
            r#"return { identity = { keys = { k = { tenant = "t", tier = "gold", key_id = "x" } } } }"#,
            "rl config: identity.keys: unknown tier gold",
        ),
        (
            r#"return { routes = { { method = "GET", template = "/v1/x", cost = 100000 } } }"#,
            "rl config: tier ",
        ),
        (
            r#"return { redis = { timeout_ms = 0 } }"#,
            "rl config: redis.timeout_ms must be > 0",
        ),
        (
            r#"return { tiers = { growth = { key = { rate = 1, burst = 100 },
                tenant = { rate = 1, burst = 100 }, period = 1 / 3,
                strikes = { threshold = 1, window = 60 }, box = { 1, 1, 1 }, offenses_ttl = 60 } } }"#,
            "rl config: tier growth: period must be seconds > 0 with at most 3 decimals",
        ),
        (
            r#"return { fallback_entries = 0 }"#,
            "rl config: fallback_entries must be an integer >= 1",
        ),
        (
            r#"return { fail_closed_retry_after = 2.5 }"#,
            "rl config: fail_closed_retry_after must be an integer >= 1",
        ),
    ] {
        match start_sample(Some(policy), redis.port) {
            Ok(_) => panic!("nginx started with {policy}"),
            Err(text) => assert!(text.contains(message), "{policy}: {text}"),
        }
    }
}

/// `Authorization: Basic` with `user:secret` (form-urlencoded user, as
/// OAuth's client_secret_basic).
fn basic(user: &str, secret: &str) -> String {
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let raw = format!("{user}:{secret}").into_bytes();
    let mut out = String::new();
    for chunk in raw.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    format!("Basic {out}")
}

#[test]
fn the_login_subject_comes_from_the_body_or_basic_auth_never_the_query() {
    let (redis, nginx) = setup();
    let mut con = redis.client();
    let a = agent();
    let token = format!("{}/v1/auth/token", nginx.url(nginx.ports.main));
    let ip = ("X-Test-Client-Ip", "192.0.2.50");
    let left = |con: &mut redis::Connection, key: &str, limit: u32| {
        ints(con, &format!("RL.WINDOW {key} {limit} 900 COST 0"))[2]
    };
    // alice fails 5 times (body), and is locked out
    for i in 1..=5 {
        let r = post_form(
            &a,
            &token,
            &[ip],
            &[("client_id", "alice"), ("client_secret", "wrong")],
        );
        assert_eq!(r.status, 401, "{r:#?}");
        poll(ASYNC, "failure recorded", || {
            left(&mut con, "rl:{auth:sub:alice}", 5) == 5 - i
        });
    }
    // the bypass: a random client_id in the query, the real one in the body
    // (which the upstream reads): refused before the upstream, never counted
    // against the random subject, never a token
    for n in 0..3 {
        let r = post_form(
            &a,
            &format!("{token}?client_id=rnd{n}"),
            &[ip],
            &[("client_id", "alice"), ("client_secret", "right")],
        );
        let b = problem(&r, 400, "ambiguous-argument");
        assert!(b["detail"].as_str().unwrap().contains("client_id"), "{b}");
        assert!(!r.body.contains("access_token"));
    }
    assert_eq!(int(&mut con, "EXISTS rl:{auth:sub:rnd0}"), 0);
    // the same value in both: alice's lockout applies
    let r = post_form(
        &a,
        &format!("{token}?client_id=alice"),
        &[ip],
        &[("client_id", "alice"), ("client_secret", "right")],
    );
    problem(&r, 429, "penalty-box-active");
    // a query-only client_id is no subject source: ambiguous too
    let r = post_form(
        &a,
        &format!("{token}?client_id=alice"),
        &[ip],
        &[("client_secret", "right")],
    );
    problem(&r, 400, "ambiguous-argument");

    // client_secret_basic: the Basic user is the subject
    let bob = basic("bob", "wrong");
    for i in 1..=5 {
        let r = post_form(
            &a,
            &token,
            &[("Authorization", &bob), ip],
            &[("grant_type", "client_credentials")],
        );
        assert_eq!(r.status, 401, "{r:#?}");
        assert_eq!(ratelimit(&r).0, "auth-subject");
        poll(ASYNC, "bob's failure recorded", || {
            left(&mut con, "rl:{auth:sub:bob}", 5) == 5 - i
        });
    }
    let r = post_form(
        &a,
        &token,
        &[("Authorization", &bob), ip],
        &[("grant_type", "client_credentials")],
    );
    problem(&r, 429, "penalty-box-active");
    assert_eq!(ratelimit(&r).0, "auth-subject");
    // Basic user and body client_id disagree: 400
    let r = post_form(
        &a,
        &token,
        &[("Authorization", &basic("carol", "x")), ip],
        &[("client_id", "dave")],
    );
    problem(&r, 400, "ambiguous-argument");

    // no subject at all: only the IP window, no shared "nobody" key
    let ip2 = ("X-Test-Client-Ip", "192.0.2.60");
    for _ in 0..6 {
        let r = post_form(&a, &token, &[ip2], &[("client_secret", "wrong")]);
        assert_eq!(r.status, 401, "{r:#?}");
        assert_eq!(r.must("RateLimit-Policy"), r#""auth-ip";q=20;w=900"#);
        assert_eq!(ratelimit(&r).0, "auth-ip");
    }
    poll(ASYNC, "the IP's failures recorded", || {
        left(&mut con, "rl:{auth:ip:192.0.2.60}", 20) == 14
    });
    assert_eq!(int(&mut con, "EXISTS rl:{auth:sub:-}"), 0);
    let main = nginx.url(nginx.ports.main);
    poll(ASYNC, "the 400s counted", || {
        counter(&a, &main, "invalid", "POST /v1/auth/token") == 5
    });
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

#[test]
fn concurrent_failed_logins_do_not_exceed_the_limit() {
    let (redis, nginx) = setup();
    let main = nginx.url(nginx.ports.main);
    // the upstream takes 100 ms per attempt, so attempts overlap
    let token = format!("{main}/v1/auth/token?hold=0.1");
    let (threads, attempts) = (8, 10);
    let outcomes: Vec<Vec<u16>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let token = &token;
                s.spawn(move || {
                    let a = agent();
                    (0..attempts)
                        .map(|i| {
                            // a new address each time: the subject's window
                            // is the one under test
                            let addr = format!("203.0.113.{}", t * attempts + i + 1);
                            let r = post_form(
                                &a,
                                token,
                                &[("X-Test-Client-Ip", &addr)],
                                &[("client_id", "eve"), ("client_secret", "guess")],
                            );
                            if r.status == 429
                                && r.json()["type"]
                                    .as_str()
                                    .unwrap_or("")
                                    .ends_with("concurrency-limit-exceeded")
                            {
                                assert_eq!(r.must("Retry-After"), "1");
                            }
                            r.status
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("login thread"))
            .collect()
    });
    let all: Vec<u16> = outcomes.into_iter().flatten().collect();
    let failures = all.iter().filter(|s| **s == 401).count();
    eprintln!(
        "{} attempts: {failures} reached the upstream and failed",
        all.len()
    );
    assert!(all.iter().all(|s| [401, 429].contains(s)), "{all:?}");
    // one attempt in flight per subject: exactly the limit of 5 failures
    // reaches the upstream, however many run at once
    assert!(
        (1..=5).contains(&failures),
        "{failures} failures reached the upstream"
    );
    // and eve is locked out now
    let r = post_form(
        &agent(),
        &format!("{main}/v1/auth/token"),
        &[("X-Test-Client-Ip", "203.0.113.200")],
        &[("client_id", "eve"), ("client_secret", "guess")],
    );
    if failures == 5 {
        problem(&r, 429, "penalty-box-active");
    }
    // no attempt lease left behind
    poll(ASYNC, "attempt lease released", || {
        leases(&mut redis.client(), "rl:{auth:sub:eve}:attempt") == 0
    });
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

#[test]
fn head_requests_pay_like_get_and_ambiguous_arguments_are_refused() {
    let (redis, nginx) = setup();
    let mut con = redis.client();
    let a = agent();
    let main = nginx.url(nginx.ports.main);
    let lease = "rl:{t:acme}:lease:export";
    // HEAD of an export: cost 25 and the export lease, as GET
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            head(
                &agent(),
                &format!("{main}/v1/reports/audit-export?from=2026-03-01&to=2026-03-02&hold=1.5"),
                &[GROWTH],
            )
        });
        poll(ASYNC, "the HEAD export's lease", || {
            leases(&mut redis.client(), lease) == 1
        });
        let r = first.join().expect("HEAD");
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(ratelimit(&r).1, 75, "cost 25");
    });
    poll(ASYNC, "export lease released", || {
        leases(&mut con, lease) == 0
    });
    // a repeated `from`: the range cost (50), whichever value the upstream takes
    let r = get(
        &a,
        &format!("{main}/v1/reports/audit-export?from=2026-03-01&from=2000-01-01&to=2026-03-02"),
        &[GROWTH_2],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(ratelimit(&r).1, 50, "cost 50 for g2's 100 points");
    poll(ASYNC, "export lease released", || {
        leases(&mut con, lease) == 0
    });
    // reconcile: ledger_id in the query and a different one in the body
    let r = post_form(
        &a,
        &format!("{main}/v1/ledgers/reconcile?ledger_id=L1"),
        &[GROWTH],
        &[("ledger_id", "L2")],
    );
    let b = problem(&r, 400, "ambiguous-argument");
    assert!(b["detail"].as_str().unwrap().contains("ledger_id"), "{b}");
    for l in ["L1", "L2"] {
        assert_eq!(
            leases(
                &mut con,
                &format!("rl:{{t:acme}}:lease:reconcile-ledger:{l}")
            ),
            0
        );
    }
    assert_eq!(leases(&mut con, "rl:{t:acme}:lease:reconcile"), 0);
    // the same value in both, or in the body only: one defined ledger
    let r = post_form(
        &a,
        &format!("{main}/v1/ledgers/reconcile?ledger_id=L1"),
        &[GROWTH],
        &[("ledger_id", "L1")],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            post_form(
                &agent(),
                &format!("{main}/v1/ledgers/reconcile?hold=1.5"),
                &[GROWTH],
                &[("ledger_id", "L7")],
            )
        });
        poll(ASYNC, "the body's ledger lease", || {
            leases(&mut redis.client(), "rl:{t:acme}:lease:reconcile-ledger:L7") == 1
        });
        assert_eq!(first.join().expect("reconcile").status, 200);
    });
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}
