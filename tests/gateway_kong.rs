//! The Kong plugin (`gateway/kong/kong/plugins/rl/handler.lua`, configured
//! from its `schema.lua`) run inside the test nginx under the Kong PDK shim
//! (`gateway/test/kong_shim.lua`), against a real Redis with the module and
//! real HTTP: a subset of the nginx front end's scenarios. Kong itself is
//! not installed here (see gateway/TESTING.md).

mod common;
#[path = "common/gateway.rs"]
mod gateway;

use std::time::Duration;

use common::{int, Server};
use gateway::{agent, get, leases, poll, post, post_form, problem, Nginx};

const ASYNC: Duration = Duration::from_secs(10);

#[test]
fn kong_plugin_allows_throttles_boxes_and_locks_out() {
    let redis = Server::start(&[]);
    let nginx = Nginx::start(redis.port);
    let mut con = redis.client();
    let a = agent();
    let kong = nginx.url(nginx.ports.kong);
    let url = format!("{kong}/v1/ledgers/L-1/entries");
    let key = ("X-Api-Key", "k-sandbox");

    // allowed, with the RateLimit fields (set in the header_filter phase)
    let r = get(&a, &url, &[key]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(
        r.must("RateLimit-Policy"),
        r#""sandbox-key";q=1;qu="points";w=60, "sandbox-tenant";q=600;qu="points";w=60"#
    );
    assert_eq!(r.must("RateLimit"), r#""sandbox-key";r=49;t=60"#);
    // the plugin's state is its own (key prefix "kong")
    assert_eq!(int(&mut con, "EXISTS kong:{t:sbx}:key:s1"), 1);
    assert_eq!(int(&mut con, "EXISTS rl:{t:sbx}:key:s1"), 0);

    // throttled, then boxed after 20 strikes (kong.response.exit): the
    // first refusal is no strike, each retry before Retry-After is one
    for _ in 0..49 {
        assert_eq!(get(&a, &url, &[key]).status, 200);
    }
    for refusal in 0..20 {
        let r = get(&a, &url, &[key]);
        let b = problem(&r, 429, "rate-limit-exceeded");
        let warned = r.header("X-Penalty-Box-Status") == Some("Warning");
        assert_eq!(
            warned,
            refusal > 0,
            "the first strike warns, not the first refusal"
        );
        assert_eq!(b["penalty_strikes_remaining"], 20 - refusal);
        assert!(r.header("Retry-After").is_some());
    }
    let r = get(&a, &url, &[key]);
    let b = problem(&r, 429, "penalty-box-active");
    assert_eq!(r.must("X-Penalty-Box-Status"), "Active-Lockout");
    assert_eq!(r.must("Retry-After"), "300");
    assert_eq!(b["penalty_level"], 1);
    assert!(b["lockout_ends_at"].is_string());

    // a second reconcile of one ledger: 409 (lease released in the log phase)
    let growth = ("X-Api-Key", "k-growth");
    let reconcile = |hold: &str| format!("{kong}/v1/ledgers/reconcile?ledger_id=L1&hold={hold}");
    let lease_key = "kong:{t:acme}:lease:reconcile-ledger:L1";
    std::thread::scope(|s| {
        let first = s.spawn(|| post(&agent(), &reconcile("2"), &[growth]));
        poll(ASYNC, "first lease", || {
            leases(&mut redis.client(), lease_key) == 1
        });
        let r = post(&a, &reconcile("0"), &[growth]);
        let b = problem(&r, 409, "concurrency-limit-exceeded");
        assert_eq!(b["concurrency_limit"], 1);
        assert_eq!(first.join().expect("first").status, 200);
    });
    poll(ASYNC, "lease released", || leases(&mut con, lease_key) == 0);

    // failed logins (form body through kong.request.get_body), counted in
    // the log phase, then the lockout
    let token = format!("{kong}/v1/auth/token");
    let form = [("client_id", "alice"), ("client_secret", "wrong")];
    for i in 1..=5 {
        let r = post_form(&a, &token, &[], &form);
        assert_eq!(r.status, 401, "{r:#?}");
        poll(ASYNC, "failure recorded", || {
            common::ints(&mut con, "RL.WINDOW kong:{auth:sub:alice} 5 900 COST 0")[2] == 5 - i
        });
    }
    let r = post_form(
        &a,
        &token,
        &[],
        &[("client_id", "alice"), ("client_secret", "right")],
    );
    let b = problem(&r, 429, "penalty-box-active");
    assert_eq!(r.must("Retry-After"), "900");
    assert_eq!(b["penalty_level"], 1);
    // another client_id in the query (kong.request.get_query) than in the
    // body: refused, not counted against the query's subject
    let r = post_form(
        &a,
        &format!("{token}?client_id=someone-else"),
        &[],
        &[("client_id", "alice"), ("client_secret", "right")],
    );
    problem(&r, 400, "ambiguous-argument");
    assert_eq!(int(&mut con, "EXISTS kong:{auth:sub:someone-else}"), 0);

    // Redis killed: critical routes fail closed, the others degrade
    redis.kill9();
    let r = post(&a, &reconcile("0"), &[growth]);
    let b = problem(&r, 503, "rate-limiter-unavailable");
    assert_eq!(r.must("Retry-After"), "15");
    assert_eq!(b["retry_after_seconds"], 15);
    let r = get(&a, &format!("{kong}/v1/ledgers"), &[growth]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(r.must("RateLimit").starts_with("\"growth-key-degraded\""));

    // one structured line per refusal, through kong.log (from the log
    // phase, after the response: the last one may still be on its way)
    poll(ASYNC, "the failed_closed line", || {
        nginx
            .events()
            .iter()
            .any(|e| e["decision"] == "failed_closed")
    });
    let events = nginx.events();
    let count = |d: &str| events.iter().filter(|e| e["decision"] == d).count();
    assert_eq!(count("invalid"), 1);
    // the first refusal and the 19 early retries before the 20th boxes
    assert_eq!(count("throttled"), 20);
    assert_eq!(count("boxed"), 1);
    assert_eq!(count("conflict"), 1);
    assert_eq!(count("locked_out"), 1);
    assert_eq!(count("failed_closed"), 1);
    assert!(nginx.error_log().contains("[kong] rl_event"));
    // no PDK call in a phase Kong forbids (the shim raises), no Lua error
    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}
