//! End to end, the tier form: nginx (`resty.rl.nginx`) + redis-server with
//! the module + a local upstream, driven with real HTTP. See
//! `gateway/REFERENCE.md` ("The tier form"). Here: the RateLimit fields, 429s, penalty boxes and
//! their release, leases. Also `gateway_routes.rs` (costs, arguments, load),
//! `gateway_logins.rs` (the token endpoint), `gateway_modes.rs` (Redis
//! failures, shadow mode, the sample nginx.conf).
//!
//! Each test starts its own Redis and nginx on free loopback ports. The
//! policy is `gateway/test/policy.lua` (the sample policy's thresholds,
//! boxes, costs and leases, with small budgets and 1 point per minute of
//! refill, so counts are exact).

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_dates.rs"]
mod gateway_dates;
#[path = "common/gateway_tier.rs"]
mod gateway_tier;

use std::time::{Duration, Instant};

use common::{int, ints};
use gateway::{agent, counter, get, leases, poll, post, problem, ratelimit, Resp};
use gateway_tier::{setup, unix_now, ASYNC, BOX_SLACK, ENTERPRISE, GROWTH, GROWTH_2, SANDBOX};
use serde_json::Value;

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
    // the API key header is read through ngx_lua's C functions (the fast
    // path), not through ngx.req.get_headers
    assert!(
        !nginx
            .error_log()
            .contains("read through ngx.req.get_headers"),
        "{}",
        nginx.error_log()
    );
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
    assert_eq!(
        r.header("X-Penalty-Box-Status"),
        None,
        "no warning before an early retry"
    );
    let (name, rem, reset) = ratelimit(&r);
    assert_eq!((name.as_str(), rem), ("sandbox-key", 0));
    assert!(
        reset.is_some_and(|t| t > 2900 && t <= 3000),
        "50 points to refill: {reset:?}"
    );
    assert_eq!(b1["quota_tier"], "sandbox");
    // the first refusal is no strike (only a retry before Retry-After is)
    assert_eq!(b1["penalty_strikes_remaining"], 20);
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

/// Sends throttled requests until the box trips (a strike is an early
/// retry). The first refusal (`first`, already sent, or sent
/// here) is no strike: `threshold` strikes remain; each retry before its
/// Retry-After is one, and the `threshold`-th trips the box. Returns the
/// boxed response.
fn strike_until_boxed(
    a: &ureq::Agent,
    url: &str,
    key: (&str, &str),
    threshold: i64,
    mut first: Option<Resp>,
) -> Resp {
    for i in 0..threshold {
        let r = first.take().unwrap_or_else(|| get(a, url, &[key]));
        let b = problem(&r, 429, "rate-limit-exceeded");
        // The warning comes with the first strike, not the first refusal.
        let warned = r.header("X-Penalty-Box-Status") == Some("Warning");
        assert_eq!(warned, i > 0, "refusal {i}");
        assert_eq!(b["penalty_strikes_remaining"], threshold - i, "refusal {i}");
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
        let at =
            gateway_dates::http_date(retry).unwrap_or_else(|| panic!("not an HTTP-date: {retry}"));
        assert!(
            (now + left - 2..=now + left + 1).contains(&at),
            "{retry}: {at} vs now {now} + {left}"
        );
    } else {
        assert_eq!(retry, left.to_string());
    }
    let ends = b["lockout_ends_at"].as_str().expect("lockout_ends_at");
    let at = gateway_dates::rfc3339(ends).unwrap_or_else(|| panic!("not RFC 3339 UTC: {ends}"));
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
        // A holds ledger L1 for 8 s: B, C and D come while it runs, even on
        // a loaded machine (each step waits for the lease it needs, not a time)
        let a1 = s.spawn(|| post(&agent(), &reconcile("L1", "8"), &[GROWTH]));
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
        let c1 = s.spawn(|| post(&agent(), &reconcile("L2", "8"), &[GROWTH_2]));
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
