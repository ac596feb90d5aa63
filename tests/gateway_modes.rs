//! End to end, the tier form (see `tests/gateway.rs`): Redis slow or dead
//! (fail closed, degrade), shadow mode, and the sample nginx.conf as
//! shipped (a bad policy stops nginx).

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_tier.rs"]
mod gateway_tier;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::ints;
use common::Server;
use gateway::{agent, counter, get, leases, poll, post, post_form, problem, ratelimit, Nginx};
use gateway_tier::{setup, ASYNC, FALLBACK_RATIO, GROWTH, GROWTH_KEY_BURST, PAUSE_MS, SANDBOX};

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
    // the pause ends by itself after PAUSE_MS (an UNPAUSE would wait for
    // it anyway, in a read of seconds that a stopped and continued test
    // process sees fail with EINTR): the gateway answers from Redis again
    // within ASYNC (> PAUSE_MS)
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
    // what would have happened: 50 allowed, 20 throttled (the first is no
    // strike, the 19 early retries are), then boxed
    poll(ASYNC, "30 shadow lines", || nginx.events().len() >= 30);
    let events = nginx.events();
    let would = |d: &str| events.iter().filter(|e| e["would_be"] == d).count();
    assert_eq!((would("throttled"), would("boxed")), (20, 10), "{events:?}");
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
    // A prefix only its owner can read, as a checkout in root's home is:
    // what the workers (another user under root) need must live elsewhere.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
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
        // a body above client_body_buffer_size goes through the sample's
        // temp path (outside the prefix): forwarded (502, the upstream is
        // down), not 500
        let big = "x".repeat(40_000);
        let r = post_form(
            &a,
            &format!("{base}/v1/ledgers/l-1/entries"),
            &[("X-Api-Key", "demo-growth-key")],
            &[("memo", &big)],
        );
        assert_eq!(r.status, 502, "{r:#?}");
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

/// The raw RESP reply to `args` from the Redis at `port`, read until
/// `lines` CRLF-terminated lines have come.
fn raw_reply(port: u16, args: &[&str], lines: usize) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req += &format!("${}\r\n{a}\r\n", a.len());
    }
    s.write_all(req.as_bytes()).expect("send");
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    for _ in 0..100 {
        if out.windows(2).filter(|w| w == b"\r\n").count() >= lines {
            break;
        }
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "Redis closed the connection");
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(out).expect("a RESP reply in UTF-8")
}

#[test]
fn the_gateway_reads_limiter_replies_as_redis_sends_them() {
    let (redis, nginx) = setup();
    // real replies: allowed, refused (a wait, no strike yet), boxed
    // (status -1, no reset: negative integers)
    let boxing = [
        "RL.TAKE", "ia:b", "1", "1", "60", "STRIKES", "1", "60", "BOX", "300", "3600", "86400",
    ];
    let mut replies: Vec<String> = (0..3)
        .map(|_| raw_reply(redis.port, &["RL.TAKE", "ia:k", "2", "1", "60"], 9))
        .collect();
    replies.extend((0..3).map(|_| raw_reply(redis.port, &boxing, 9)));
    assert!(replies.iter().any(|r| r.contains(":-1\r\n")), "{replies:?}");
    // each reply whole, every prefix of it, one element too many, `*7`, and
    // each digit turned into a letter
    let mut cases: Vec<(String, Option<Vec<i64>>)> = Vec::new();
    for r in &replies {
        let want: Vec<i64> = r
            .split("\r\n")
            .skip(1)
            .filter(|l| !l.is_empty())
            .map(|l| l.trim_start_matches(':').parse().expect("an integer"))
            .collect();
        assert_eq!(want.len(), 8, "{r:?}");
        cases.push((r.clone(), Some(want)));
        cases.extend((0..r.len()).map(|i| (r[..i].to_string(), None)));
        cases.push((format!("{r}:1\r\n"), None));
        cases.push((r.replacen("*8", "*7", 1), None));
        for (i, _) in r
            .char_indices()
            .filter(|(i, c)| *i > 1 && c.is_ascii_digit())
        {
            cases.push((format!("{}x{}", &r[..i], &r[i + 1..]), None));
        }
    }
    let body = serde_json::json!(cases.iter().map(|(c, _)| c).collect::<Vec<_>>());
    let url = format!("http://127.0.0.1:{}/int-array?n=8", nginx.ports.upstream);
    let r = gateway::into_resp(
        agent()
            .post(&url)
            .set("Content-Type", "application/json")
            .send_string(&body.to_string()),
    );
    assert_eq!(r.status, 200, "{r:#?}");
    let got: Vec<Option<Vec<i64>>> = serde_json::from_str(&r.body).expect("a JSON array");
    assert_eq!(got.len(), cases.len());
    for ((case, want), got) in cases.iter().zip(&got) {
        assert_eq!(got, want, "{case:?}");
    }
}
