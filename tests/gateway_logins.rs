//! End to end, the tier form (see `tests/gateway.rs`): the token endpoint's
//! failed logins (per subject, per IP), where the subject comes from, and
//! concurrent guesses.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_tier.rs"]
mod gateway_tier;

use common::{int, ints};
use gateway::{agent, counter, leases, poll, post_form, problem, ratelimit};
use gateway_tier::{setup, ASYNC};
use serde_json::Value;

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
        // the sixth attempt is refused even with the right secret, in one
        // command per window after the probes: the failure that does not
        // fit is a strike at once (EVERY), never sent twice
        redis.reset_stats();
        let r = attempt(who, "right", "192.0.2.1");
        let b = problem(&r, 429, "penalty-box-active");
        assert_eq!(
            redis.command_calls("rl.window"),
            3,
            "2 probes (subject, IP), 1 failure recorded on the subject"
        );
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
