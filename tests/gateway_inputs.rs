//! End to end: what a request carries that the gateway must read as the
//! upstream will, on the shipped examples (`gateway/examples/`): bodies
//! that nginx keeps in a temp file (above `client_body_buffer_size`), a
//! body too large to read, a repeated API key header; and, with Redis
//! down, the upstream headers of an admitted request and an API key the
//! gateway cannot look up. See gateway/README.md ("Request bodies",
//! "Failure modes").

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{ints, Server};
use gateway::{agent, get, into_resp, leases, poll, post, post_form, problem, HTTP_TIMEOUT};
use gateway_policy::{example, jwt, post_json, start, Front, JWT_SECRET};
use serde_json::json;

/// Long enough for a log-phase timer on a loaded machine.
const ASYNC: Duration = Duration::from_secs(10);

/// Padding above nginx's in-memory body size (16 KB on 64-bit): the body
/// goes to a temp file.
const PAD: usize = 20 * 1024;
/// Padding above the 1 MiB the gateway reads.
const BIG: usize = 1536 * 1024;

/// A GET with `headers` as given (a name may repeat), over HTTP/1.0 (no
/// chunked answer): the status and the body.
fn raw_get(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(HTTP_TIMEOUT)).expect("timeout");
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n");
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += "\r\n";
    s.write_all(req.as_bytes()).expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status: {out}"));
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    (status, body.unwrap_or_default())
}

/// A `Bearer` JWT of the velocity example for user `sub`.
fn bearer(sub: &str) -> String {
    format!(
        "Bearer {}",
        jwt(json!({"sub": sub, "brand_id": "b-pad"}), JWT_SECRET)
    )
}

#[test]
fn a_padded_deposit_is_still_marked_for_kyc() {
    let redis = Server::start(&[]);
    let gw = start(redis.port, &[example("velocity")], &[]).expect("start");
    let a = agent();
    let auth = bearer("u-pad");
    let h = [
        ("Authorization", auth.as_str()),
        ("X-Forwarded-For", "198.51.100.20"),
    ];
    let deposits = format!("{}/v1/deposits", gw.url(0));
    // an amount above the brand's 24 h total (1,000,000 cents by default)
    // next to a 20 KB memo: marked for the KYC gate
    let r = post_json(
        &a,
        &deposits,
        &h,
        json!({"amount": 2000000, "memo": "x".repeat(PAD)}),
    );
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(
        r.json()["marks"]["x-kyc-required"],
        "deposit_total_24h",
        "{r:#?}"
    );
    // a JSON body the gateway cannot decode (nested deeper than its
    // decoder reads): refused, never let past the amount's rule
    let deep = format!(
        "{{\"amount\": 2000000, \"memo\": {}1{}}}",
        "[".repeat(1100),
        "]".repeat(1100)
    );
    let r = gateway::into_resp(
        a.post(&deposits)
            .set("Content-Type", "application/json")
            .set(h[0].0, h[0].1)
            .set(h[1].0, h[1].1)
            .send_string(&deep),
    );
    assert_eq!(r.status, 400, "{r:#?}");
    assert_eq!(r.json()["error"], "INVALID_ARGUMENT", "{r:#?}");
    // above the gateway's limit (1 MiB): refused, in the design's body
    let r = post_json(
        &a,
        &deposits,
        &h,
        json!({"amount": 100, "memo": "x".repeat(BIG)}),
    );
    assert_eq!(r.status, 413, "{r:#?}");
    assert_eq!(r.json()["error"], "PAYLOAD_TOO_LARGE", "{r:#?}");
    gw.nginx.assert_no_lua_errors();
}

#[test]
fn padded_failed_logins_are_locked_out() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[example("ledger")], &[]).expect("start");
    let a = agent();
    let pad = "x".repeat(PAD);
    let token = format!("{}/v1/auth/token", gw.url(0));
    let attempt = |memo: &str| {
        post_form(
            &a,
            &token,
            &[("X-Forwarded-For", "198.51.100.21")],
            &[
                ("client_id", "mallory"),
                ("client_secret", "wrong"),
                ("memo", memo),
            ],
        )
    };
    // 5 failures of one subject, each form body padded, then the lockout
    for i in 0..5 {
        let r = attempt(&pad);
        assert_eq!(r.status, 401, "attempt {i}: {r:#?}");
        poll(ASYNC, "the failure is recorded", || {
            ints(
                &mut con,
                "RL.WINDOW ledger:{subject:mallory}:auth-subject 5 900 COST 0 EXACT",
            )[2] == 4 - i
        });
    }
    for i in 5..7 {
        let r = attempt(&pad);
        problem(&r, 429, "penalty-box-active");
        assert_eq!(r.must("Retry-After"), "900", "attempt {i}");
    }
    // above the gateway's limit: 413 with a problem body
    problem(&attempt(&"x".repeat(BIG)), 413, "body-too-large");
    gw.nginx.assert_no_lua_errors();
}

#[test]
fn a_login_is_counted_whatever_its_media_types_spelling_and_refused_when_unreadable() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[example("ledger")], &[]).expect("start");
    let a = agent();
    let token = format!("{}/v1/auth/token", gw.url(0));
    // Media types compare case-insensitively: a form body in capitals is
    // read, and its failure counted against its subject.
    let r = into_resp(
        a.post(&token)
            .set("Content-Type", "Application/X-WWW-Form-Urlencoded")
            .set("X-Forwarded-For", "198.51.100.31")
            .send_string("client_id=trudy&client_secret=wrong"),
    );
    assert_eq!(r.status, 401, "{r:#?}");
    poll(ASYNC, "the failure is recorded", || {
        ints(
            &mut con,
            "RL.WINDOW ledger:{subject:trudy}:auth-subject 5 900 COST 0 EXACT",
        )[2] == 4
    });
    // A body the gateway cannot read (multipart) with the subject in it:
    // refused, never let through unlimited.
    let body =
        "--b\r\nContent-Disposition: form-data; name=\"client_id\"\r\n\r\ntrudy\r\n--b--\r\n";
    let r = into_resp(
        a.post(&token)
            .set("Content-Type", "multipart/form-data; boundary=b")
            .set("X-Forwarded-For", "198.51.100.32")
            .send_string(body),
    );
    problem(&r, 415, "body-unsupported");
    gw.nginx.assert_no_lua_errors();
}

#[test]
fn padded_concurrent_reconciles_of_one_ledger_conflict() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let ledger = "dofile(GW .. \"/examples/ledger.lua\")";
    let gw = start(
        redis.port,
        &[example("ledger"), Front::Kong(ledger.into())],
        &[],
    )
    .expect("start");
    let a = agent();
    // growth: two reconciles per tenant at a time, one per ledger
    let growth = ("X-Api-Key", "demo-growth-key");
    let reconcile = format!("{}/v1/ledgers/reconcile", gw.url(0));
    // the ledger id in a padded JSON body only: the second gets 409
    let body = json!({"ledger_id": "L-pad", "memo": "x".repeat(PAD)});
    let held = {
        let (a, url, body) = (agent(), format!("{reconcile}?hold=3"), body.clone());
        std::thread::spawn(move || post_json(&a, &url, &[growth], body))
    };
    let lease = "ledger:{tenant:t-200}:reconcile-ledger:arg:ledger_id=L-pad";
    poll(ASYNC, "the first reconcile holds its lease", || {
        leases(&mut con, lease) == 1
    });
    let r = post_json(&a, &reconcile, &[growth], body.clone());
    problem(&r, 409, "concurrency-limit-exceeded");
    // nor is an id behind a hundred other query arguments
    let many: Vec<String> = (0..120).map(|i| format!("a{i}=1")).collect();
    let r = post(
        &a,
        &format!("{reconcile}?{}&ledger_id=L-pad", many.join("&")),
        &[growth],
    );
    problem(&r, 409, "concurrency-limit-exceeded");
    assert_eq!(held.join().expect("holder").status, 200);
    // above the gateway's limit: 413, no lease taken
    let r = post_json(
        &a,
        &reconcile,
        &[growth],
        json!({"ledger_id": "L-big", "memo": "x".repeat(BIG)}),
    );
    problem(&r, 413, "body-too-large");
    assert_eq!(
        leases(
            &mut con,
            "ledger:{tenant:t-200}:reconcile-ledger:arg:ledger_id=L-big"
        ),
        0
    );
    // the Kong plugin: its PDK does not read a body kept in a temp file
    let r = post_json(
        &a,
        &format!("{}/v1/ledgers/reconcile", gw.url(1)),
        &[growth],
        body,
    );
    problem(&r, 413, "body-too-large");
    gw.nginx.assert_no_lua_errors();
}

/// The tiered example with a static business key (known without the
/// identity store, so also while Redis is down).
const TIERED_WITH_BUSINESS: &str = "(function() \
    local p = dofile(GW .. \"/examples/tiered.lua\"); \
    p.identity.api_key.keys[\"demo-business-key\"] = \
    { tenant = \"app-9\", tier = \"business\", key_id = \"b-9\" }; return p end)()";
const FREE: (&str, &str) = ("X-Api-Key", "demo-free-key");
const BUSINESS: (&str, &str) = ("X-Api-Key", "demo-business-key");

#[test]
fn two_api_key_headers_are_refused() {
    let redis = Server::start(&[]);
    // the tiered example (a rule policy) and the tier form
    let tier_form = "dofile(GW .. \"/test/policy.lua\")\
        ({ redis = { port = tonumber(os.getenv(\"RL_REDIS_PORT\")) } })";
    let gw = start(
        redis.port,
        &[
            Front::Nginx(TIERED_WITH_BUSINESS.into()),
            Front::Nginx(tier_form.into()),
        ],
        &[],
    )
    .expect("start");
    let pairs = [
        ["demo-free-key", "demo-business-key"],
        ["demo-business-key", "demo-free-key"],
        ["k-growth", "k-sandbox"],
        ["demo-free-key", "demo-free-key"],
    ];
    for port in [gw.ports[0], gw.ports[1]] {
        for keys in pairs {
            let (status, body) = raw_get(
                port,
                "/v1/ledgers",
                &[("X-Api-Key", keys[0]), ("X-Api-Key", keys[1])],
            );
            assert_eq!(status, 401, "{keys:?}: {body}");
            let b: serde_json::Value = serde_json::from_str(&body).expect("JSON body");
            assert!(
                b["type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("/unauthenticated")),
                "{b}"
            );
            assert!(
                b["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("more than once")),
                "{b}"
            );
        }
    }
    // one key: admitted
    let a = agent();
    let r = get(&a, &format!("{}/v1/things", gw.url(0)), &[BUSINESS]);
    assert_eq!(r.status, 200, "{r:#?}");
    let r = get(
        &a,
        &format!("{}/v1/ledgers", gw.url(1)),
        &[("X-Api-Key", "k-growth")],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    gw.nginx.assert_no_lua_errors();
}

#[test]
fn the_upstream_gets_the_gateways_priority_while_redis_is_down() {
    let redis = Server::start(&[]);
    // and a soft rule: 2 a minute per key, then marked (1 per worker on
    // the local limiter)
    let policy = format!(
        "(function() local p = {TIERED_WITH_BUSINESS}; table.insert(p.rules, \
         {{ name = \"soft-cap\", scope = {{ \"key_id\" }}, \
         limiter = {{ kind = \"window\", limit = 2, window = 60 }}, \
         on_refusal = {{ action = \"soft\" }} }}); return p end)()"
    );
    let gw = start(redis.port, &[Front::Nginx(policy)], &[]).expect("start");
    let a = agent();
    let url = format!("{}/v1/things", gw.url(0));
    let forged = ("X-RateLimit-Priority", "3");
    let r = get(&a, &url, &[FREE, forged]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert_eq!(r.json()["marks"]["x-ratelimit-priority"], "0", "{r:#?}");
    // Redis away: a business key runs on the local limiter, and the
    // upstream still gets its priority and tier, not the client's
    redis.kill9();
    let mut soft_blocked = 0;
    for forged in [
        None,
        Some(forged),
        Some(("X-RateLimit-Tier", "enterprise")),
        Some(("X-RateLimit-Soft-Block", "forged")),
    ] {
        let mut h = vec![BUSINESS];
        h.extend(forged);
        let r = get(&a, &url, &h);
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(r.must("X-RateLimit-Degraded"), "fallback");
        let marks = &r.json()["marks"];
        assert_eq!(
            (&marks["x-ratelimit-priority"], &marks["x-ratelimit-tier"]),
            (&json!("2"), &json!("business")),
            "{r:#?}"
        );
        // a soft refusal of the local limiter marks the request too
        match marks["x-ratelimit-soft-block"].as_str() {
            Some("soft-cap") => soft_blocked += 1,
            None => {}
            other => panic!("{other:?}: {r:#?}"),
        }
    }
    // 4 requests, 2 workers, 1 each before the mark
    assert!(soft_blocked >= 1, "no soft block marked");
    gw.nginx.assert_no_lua_errors();
}

#[test]
fn an_unknown_api_key_is_not_admitted_while_redis_is_down() {
    let redis = Server::start(&[]);
    let gw = start(redis.port, &[example("tiered")], &[]).expect("start");
    let a = agent();
    let url = format!("{}/v1/things", gw.url(0));
    assert_eq!(get(&a, &url, &[FREE]).status, 200);
    redis.kill9();
    // the Free tier is shed; a key this gateway never saw cannot be
    // looked up, and is not treated better (a key known to be unknown,
    // from the cache, gets 401)
    problem(&get(&a, &url, &[FREE]), 503, "rate-limiter-unavailable");
    for key in ["never-issued", "another-unknown-key"] {
        let r = get(&a, &url, &[("X-Api-Key", key)]);
        let b = problem(&r, 503, "rate-limiter-unavailable");
        let wait = r.header("Retry-After").expect("Retry-After");
        // the body says the same wait as its header
        assert_eq!(
            b["retry_after_seconds"]
                .as_u64()
                .map(|s| s.to_string())
                .as_deref(),
            Some(wait),
            "{b}"
        );
        assert!(
            b["detail"].as_str().is_some_and(|d| d.contains("API key")),
            "{b}"
        );
    }
    gw.nginx.assert_no_lua_errors();
}
