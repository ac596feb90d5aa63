//! End to end: the shipped rule policy of the payments ledger design
//! (`gateway/examples/ledger.lua`), loaded as shipped by a real nginx (the Redis port comes through
//! `RL_REDIS_PORT`, as the examples read it) against redis-server with the
//! module, driven with real HTTP. See gateway/README.md ("The
//! shipped examples") and gateway/REFERENCE.md.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_dates.rs"]
mod gateway_dates;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::time::Duration;

use common::{int, ints, Server};
use gateway::{agent, get, leases, poll, post, post_form, problem, ratelimit, Resp};
use gateway_policy::{alerts, example, hset, key_record, login, rlctl_bin, start};

/// Long enough for a log-phase timer, an identity cache entry (2 s) or a
/// deny cache poll (1 s) on a loaded machine.
const ASYNC: Duration = Duration::from_secs(10);

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
    // built (if it must be) before the clock of any rule starts
    let rlctl = rlctl_bin();
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[example("ledger")], &[]).expect("start");
    let a = agent();
    let base = gw.url(0);
    let growth = ("X-Api-Key", "demo-growth-key");
    let sandbox = ("X-Api-Key", "demo-sandbox-key");

    // tiers as data, both buckets named, points as the unit (the refill
    // counted from before the first request is charged)
    let first = std::time::Instant::now();
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
    // 10 points less, give or take the refill (50 a second) between the
    // two requests on a busy machine.
    let refilled = first.elapsed().as_millis() as i64 / 20 + 1;
    let left = ratelimit(&r).1;
    assert!(
        (2989..=2989 + refilled).contains(&left),
        "reconcile costs 10: {left} left"
    );
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
    let distinct_before = redis.command_calls("rl.distinct");
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
    // every failure's log phase is over (its last commands are the two
    // distinct records, after two distinct probes in the access phase)
    // before the counters start again
    poll(ASYNC, "the last failure's log phase", || {
        redis.command_calls("rl.distinct") >= distinct_before + 5 * (2 + 2)
            && ints(
                &mut con,
                "RL.WINDOW ledger:{ip:127.0.0.1}:auth-ip 20 900 COST 0 EXACT",
            )[2] == 15
    });
    redis.reset_stats();
    let r = post_form(
        &a,
        &token,
        &[],
        &[("client_id", "bob"), ("client_secret", "right")],
    );
    let b = problem(&r, 429, "penalty-box-active");
    // the log phase records this 429 for the stuffing rules (a listed
    // fail status): one events window and the two distinct members, after
    // the two distinct probes of the access phase
    poll(ASYNC, "the log phase's records", || {
        redis.command_calls("rl.distinct") >= 2 + 2
    });
    assert_eq!(
        redis.command_calls("rl.window"),
        2 + 1 + 1,
        "the probes of auth-subject and auth-ip, then this attempt recorded once, \
         as the failure that trips (EVERY); then the stuffing events window"
    );
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
    // a release, and the release version moved (as rlctl does): seen
    // within a second (a release alone: gateway_refusals.rs)
    let boxed_key = "ledger:{tenant:t-sb}:tier-key:key_id=b-1";
    assert_eq!(int(&mut con, &format!("RL.BOX RELEASE {boxed_key}")), 1);
    int(&mut con, "INCR ledger:deny:version");
    poll(ASYNC, "the release reaches the edge", || {
        get(&a, &url, &[sb]).json()["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("/rate-limit-exceeded"))
    });
    // level 2 alerts (notify); level 3 suspends a sandbox key (manual box)
    let r = until_boxed(&a, &url, sb, 30);
    assert_eq!(problem(&r, 429, "penalty-box-active")["penalty_level"], 2);
    // released by support with rlctl: it tells the edge itself
    let dir = common::fresh_dir("ledger-rlctl");
    let cfg = dir.join("rlctl.toml");
    let conf = format!("[redis]\nurls = [\"redis://127.0.0.1:{}\"]\n", redis.port);
    std::fs::write(&cfg, conf).expect("rlctl.toml");
    let version = |con: &mut redis::Connection| {
        redis::cmd("GET")
            .arg("ledger:deny:version")
            .query::<Option<i64>>(con)
            .expect("GET the release version")
    };
    let before = version(&mut con);
    let out = std::process::Command::new(&rlctl)
        .arg("--config")
        .arg(&cfg)
        .args([
            "release", boxed_key, "--reason", "ticket 7", "--by", "support",
        ])
        .output()
        .expect("run rlctl release");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // the version moved (the edge drops its cached boxes at its next poll)
    assert_eq!(version(&mut con), Some(before.unwrap_or(0) + 1));
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
    let until = gateway_dates::http_date(r.must("Retry-After")).expect("an HTTP-date for 1 hour");
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
fn ledger_example_concurrent_failed_logins_do_not_exceed_the_limit() {
    let redis = Server::start(&[]);
    let gw = start(redis.port, &[example("ledger")], &[]).expect("start");
    let url = format!("{}/v1/auth/token?hold=0.1", gw.url(0));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let a = agent();
                (0..10)
                    .map(|_| {
                        post_form(
                            &a,
                            &url,
                            &[],
                            &[("client_id", "carol"), ("client_secret", "x")],
                        )
                        .status
                    })
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    let statuses: Vec<u16> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    let upstream = statuses.iter().filter(|s| **s == 401).count();
    assert!(
        upstream <= 5,
        "{upstream} guesses reached the upstream: {statuses:?}"
    );
    assert!(upstream >= 1, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| [401, 429].contains(s)),
        "{statuses:?}"
    );
    let mut con = redis.client();
    assert_eq!(
        leases(&mut con, "ledger:{subject:carol}:auth-subject:attempt"),
        0
    );
}

#[test]
fn ledger_example_credential_stuffing_trips_level_3_on_the_source() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[example("ledger")], &[]).expect("start");
    let a = agent();
    let token = format!("{}/v1/auth/token", gw.url(0));
    let attempt = |who: &str, secret: &str, ip: &str| login(&a, &token, who, secret, ip);
    let boxed = |con: &mut redis::Connection, key: &str| ints(con, &format!("RL.BOX STATUS {key}"));

    // one IP: 498 failed auths across 49 subjects already counted (the
    // gateway's own keys, written as it writes them); a 50th subject at
    // the 499th failure is not the signature yet, the 500th failure is:
    // level 3 on the IP for a day
    let ip = "203.0.113.50";
    let ip_key = format!("ledger:{{ip:{ip}}}:stuffing-ip");
    for n in 1..=49 {
        ints(&mut con, &format!("RL.DISTINCT {ip_key} s{n} 49 600"));
    }
    let events = format!("RL.WINDOW {ip_key}:events 499 600 COST 498 EXACT");
    ints(&mut con, &events);
    assert_eq!(attempt("s50", "x", ip).status, 401);
    poll(ASYNC, "the 499th failure is counted", || {
        ints(&mut con, &events.replace("COST 498", "COST 0"))[2] == 0
    });
    assert_eq!(boxed(&mut con, &ip_key)[0], 0, "499 failures only: no trip");
    assert_eq!(attempt("s51", "x", ip).status, 401);
    poll(ASYNC, "the IP is boxed at level 3", || {
        boxed(&mut con, &ip_key)[0] == 3
    });
    let r = attempt("alice", "right", ip);
    let b = problem(&r, 429, "penalty-box-active");
    assert_eq!(b["penalty_level"], 3);
    assert_eq!(b["policy"], "stuffing-ip");
    let until = gateway_dates::http_date(r.must("Retry-After")).expect("an HTTP-date for a day");
    let now = gateway_tier_now();
    assert!(
        (now + 86_390..=now + 86_410).contains(&until),
        "{until} vs {now}"
    );
    assert_eq!(
        attempt("alice", "right", "203.0.113.51").status,
        200,
        "another IP"
    );

    // one subject failing from 20 IPs: level 3 on the subject
    let sub_key = "ledger:{subject:dave}:stuffing-subject";
    for n in 1..=19 {
        ints(
            &mut con,
            &format!("RL.DISTINCT {sub_key} 192.0.2.{n} 19 600"),
        );
    }
    let r = attempt("dave", "x", "198.51.100.20");
    problem(&r, 429, "rate-limit-exceeded");
    poll(ASYNC, "the subject is boxed at level 3", || {
        boxed(&mut con, sub_key)[0] == 3
    });
    let r = attempt("dave", "x", "198.51.100.21");
    assert_eq!(problem(&r, 429, "penalty-box-active")["penalty_level"], 3);
    poll(ASYNC, "both level-3 alerts", || {
        let al = alerts(&mut con, "ledger:alerts");
        ["stuffing-ip", "stuffing-subject"]
            .iter()
            .all(|p| al.iter().any(|m| m["policy"] == *p && m["level"] == "3"))
    });
    // each names its offender (the IP to ban, the subject) and its box, and
    // asks for a ban for the box's day (a timed box: not a suspension)
    let al = alerts(&mut con, "ledger:alerts");
    let of = |policy: &str| al.iter().find(|m| m["policy"] == policy).expect("alert");
    let by_ip = of("stuffing-ip");
    assert_eq!(
        (
            by_ip["action"].as_str(),
            by_ip["ip"].as_str(),
            by_ip["subject"].as_str()
        ),
        ("ban", ip, "s51")
    );
    assert_eq!(by_ip["key"], ip_key);
    let by_subject = of("stuffing-subject");
    assert_eq!(
        (
            by_subject["action"].as_str(),
            by_subject["subject"].as_str(),
            by_subject["ip"].as_str()
        ),
        ("ban", "dave", "198.51.100.20")
    );
    assert_eq!(by_subject["key"], sub_key);
    for m in [by_ip, by_subject] {
        let secs: u64 = m["box_seconds"].parse().unwrap();
        assert!((86_390..=86_400).contains(&secs), "{m:?}");
    }
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

/// Seconds since the Unix epoch.
fn gateway_tier_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}
