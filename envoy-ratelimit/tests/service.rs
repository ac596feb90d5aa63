//! The service's own behaviour over gRPC: rl's additions (several limits
//! on a descriptor, algorithms, the penalty box, headers), bad input,
//! configuration errors and reloads, Redis failures, health.

mod common;

use std::time::Duration;

use common::*;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Code;

const CONFIG: &str = r#"
domain: rl
descriptors:
  - key: api
    rate_limit:
      unit: hour
      requests_per_unit: 100
      name: api-hour
      algorithm: sliding_window
      also:
        - unit: year
          requests_per_unit: 3
          algorithm: exact
  - key: login
    rate_limit:
      unit: hour
      requests_per_unit: 1
      name: login
      algorithm: token_bucket
      strikes: {threshold: 2, window: 600, box: [120, 240, 480]}
  - key: tenant
    rate_limit: {unit: year, requests_per_unit: 1000, name: tenant}
  - key: monthly
    rate_limit: {unit: month, requests_per_unit: 2, algorithm: calendar}
"#;

fn setup(extra: &[&str]) -> Single {
    Single::start("rl.yaml", CONFIG, extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_headers_and_the_penalty_box() {
    let s = setup(&[]);
    let mut c = s.service.client().await;
    let api = || request("rl", vec![desc(&[("api", "k1")])]);
    for left in [2, 1, 0] {
        let r = ask(&mut c, api()).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, left);
        // the binding limit is the year's exact log (fewest left)
        assert_eq!(limit(&r, 0).requests_per_unit, 3);
    }
    let r = ask(&mut c, api()).await;
    assert_eq!(r.overall_code, OVER);
    let policy = header(&r, "RateLimit-Policy").unwrap();
    let list = sfv::Parser::parse_list(policy.as_bytes()).expect("RateLimit-Policy is a list");
    assert_eq!(list.len(), 2, "{policy}");
    assert_eq!(
        policy,
        r#""api-hour";q=100;w=3600, "api-hour#1";q=3;w=31536000"#
    );
    let rl = header(&r, "RateLimit").unwrap();
    let item = sfv::Parser::parse_item(rl.as_bytes()).expect("RateLimit is an item");
    assert_eq!(item.bare_item.as_str(), Some("api-hour#1"));
    assert_eq!(item.params.get("r").and_then(|v| v.as_int()), Some(0));
    let retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
    assert!(
        retry > 31_000_000 && retry <= 31_536_000,
        "Retry-After {retry}"
    );

    // a calendar quota: resets at 00:00 UTC on the 1st of next month
    let monthly = || request("rl", vec![desc(&[("monthly", "acme")])]);
    assert_eq!(ask(&mut c, monthly()).await.overall_code, OK);
    let r = ask(&mut c, monthly()).await;
    assert_eq!((r.overall_code, r.statuses[0].limit_remaining), (OK, 0));
    let r = ask(&mut c, monthly()).await;
    assert_eq!(r.overall_code, OVER);
    let reset = r.statuses[0].duration_until_reset.unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let end = now + reset.seconds;
    assert!(reset.seconds <= 31 * 86_400, "{reset:?}");
    let off_midnight = end.rem_euclid(86_400);
    assert!(
        !(3..86_397).contains(&off_midnight),
        "the quota ends {off_midnight} s after a midnight"
    );

    // the penalty box: the refusal is not a strike, two early retries are
    let login = || request("rl", vec![desc(&[("login", "alice")])]);
    assert_eq!(ask(&mut c, login()).await.overall_code, OK);
    let r = ask(&mut c, login()).await;
    assert_eq!(r.overall_code, OVER);
    let first_retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
    assert!(first_retry > 3000, "{first_retry}");
    ask(&mut c, login()).await;
    let r = ask(&mut c, login()).await;
    assert_eq!(r.overall_code, OVER);
    let boxed_retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
    assert!(
        boxed_retry <= 120 && boxed_retry > 100,
        "boxed for {boxed_retry}"
    );
    // a box has no `t`: Retry-After says when it ends
    let rl = header(&r, "RateLimit").unwrap();
    assert_eq!(rl, r#""login";r=0"#);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_status() {
    let s = setup(&[]);
    let mut c = s.service.client().await;
    let err = |r: Result<_, tonic::Status>| r.expect_err("an error status");
    let e = err(c
        .should_rate_limit(request("", vec![desc(&[("a", "b")])]))
        .await);
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "rate limit domain must not be empty");
    let e = err(c.should_rate_limit(request("rl", vec![])).await);
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "rate limit descriptor list must not be empty");
    let many = (0..10_000)
        .map(|i| desc(&[("tenant", &format!("t{i}"))]))
        .collect();
    let e = err(c.should_rate_limit(request("rl", many)).await);
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "too many descriptors: 10000 (at most 1000)");
    // an unknown domain limits nothing, as in the peer
    let r = ask(&mut c, request("nope", vec![desc(&[("tenant", "x")])])).await;
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    // a descriptor without entries, a huge value
    let huge = "v".repeat(200_000);
    let r = ask(
        &mut c,
        request("rl", vec![desc(&[]), desc(&[("tenant", &huge)])]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[1].limit_remaining, 999);
    // the most descriptors allowed, all limited: decided (in groups of 16)
    let most: Vec<_> = (0..1000)
        .map(|i| desc(&[("tenant", &format!("t{i}"))]))
        .collect();
    let r = ask(&mut c, request("rl", most)).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 1000);
    assert!(r.statuses.iter().all(|st| st.limit_remaining == 999));
    // a bad unit in an override
    let mut d = desc(&[("tenant", "x")]);
    d.limit = Some(
        envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 1,
            unit: 99,
        },
    );
    let e = err(c.should_rate_limit(request("rl", vec![d])).await);
    assert_eq!(e.code(), Code::InvalidArgument);
    // malformed frames: garbage, a valid HTTP/2 preface then garbage
    for garbage in [
        &b"\x00\x00\x05\x00\x01hello, this is not a gRPC frame"[..],
        &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x04\x01\x05\x00\x00\x00\x01\xff\xff\xff\xff"[..],
    ] {
        use std::io::{Read, Write};
        let mut sock = std::net::TcpStream::connect(("127.0.0.1", s.service.grpc)).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = sock.write_all(garbage);
        let mut buf = [0u8; 256];
        let _ = sock.read(&mut buf);
    }
    // still serving
    let r = ask(&mut c, request("rl", vec![desc(&[("tenant", "y")])])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        http_get(s.service.http, "/healthcheck").map(|r| r.0),
        Some(200)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_errors_and_reload_while_serving() {
    let s = setup(&[]);
    // at start, a bad file stops the service with the peer's message
    let bad_dir = s.dir.path().join("bad");
    std::fs::create_dir(&bad_dir).unwrap();
    for (file, text, message) in [
        ("a.yaml", "domain: d\ndescriptors:\n  - key: k\n  - key: k\n", "config.a: duplicate descriptor composite key 'd.k'"),
        ("b.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: weekly, requests_per_unit: 1}\n", "config.b: invalid rate limit unit 'weekly'"),
    ] {
        for old in std::fs::read_dir(&bad_dir).unwrap() {
            std::fs::remove_file(old.unwrap().path()).unwrap();
        }
        write_config(&bad_dir, file, text);
        let out = Service::command(&bad_dir, s.redis.port, free_port(), free_port())
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{stderr}");
    }
    // a duplicate domain across two files
    write_config(&bad_dir, "c.yaml", "domain: d\n");
    write_config(&bad_dir, "b.yaml", "domain: d\n");
    let out = Service::command(&bad_dir, s.redis.port, free_port(), free_port())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("config.c: duplicate domain 'd' in config file"));

    // while serving: a new file is picked up
    let mut c = s.service.client().await;
    let new = || request("new", vec![desc(&[("k", "v")])]);
    assert!(ask(&mut c, new()).await.statuses[0].current_limit.is_none());
    write_config(&s.conf, "new.yaml", "domain: new\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1}\n");
    assert!(
        limit_comes(&mut c, new, true).await,
        "the new file was not loaded"
    );
    assert_eq!(ask(&mut c, new()).await.overall_code, OVER);
    // a broken change is refused; the previous configuration stays
    write_config(
        &s.conf,
        "new.yaml",
        "domain: new\ndescriptors:\n  - key: k\n    rate_limit: {unit: nope}\n",
    );
    wait_until("config_load_error", Duration::from_secs(10), || {
        s.service
            .metrics()
            .contains("ratelimit_service_config_load_error 1")
    });
    assert_eq!(ask(&mut c, new()).await.overall_code, OVER);
    assert!(s
        .service
        .proc
        .output()
        .contains("config.new: invalid rate limit unit 'nope'"));
    // removing the file removes the domain
    std::fs::remove_file(s.conf.join("new.yaml")).unwrap();
    assert!(
        limit_comes(&mut c, new, false).await,
        "the removed file's domain is still served"
    );
}

/// Whether the answer to `r()` comes to carry a limit (`limited`) or no
/// limit, asked up to 100 times 50 ms apart (the service reloads its
/// configuration folder on its own).
async fn limit_comes(
    c: &mut RateLimitServiceClient<tonic::transport::Channel>,
    r: impl Fn() -> RateLimitRequest,
    limited: bool,
) -> bool {
    for _ in 0..100 {
        if ask(c, r()).await.statuses[0].current_limit.is_some() == limited {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_is_a_grpc_error_then_back() {
    let mut s = setup(&[]);
    let mut c = s.service.client().await;
    let r = || request("rl", vec![desc(&[("tenant", "t")])]);
    assert_eq!(ask(&mut c, r()).await.overall_code, OK);
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", s.service.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let check = tonic_health::pb::HealthCheckRequest {
        service: "envoy.service.ratelimit.v3.RateLimitService".into(),
    };
    wait_until_async_ok(&mut health, &check, 1).await;
    let port = s.redis.port;
    s.redis.proc.kill();
    let e = c
        .should_rate_limit(r())
        .await
        .expect_err("an error while Redis is down");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(s
        .service
        .metrics()
        .contains("ratelimit_service_should_rate_limit_error{err_type=\"redis_error\"} 1"));
    assert_eq!(
        http_get(s.service.http, "/healthcheck").map(|r| r.0),
        Some(500)
    );
    wait_until_async_ok(&mut health, &check, 2).await;
    // Redis back on the same port: answers again (the count starts over)
    s.redis = Redis::start_on(s.dir.path(), port);
    let mut back = false;
    for _ in 0..100 {
        if let Ok(resp) = c.should_rate_limit(r()).await {
            assert_eq!(resp.into_inner().overall_code, OK);
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(back, "no answer after Redis came back");
    wait_until_async_ok(&mut health, &check, 1).await;
    // --version
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rl-envoy"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        concat!("rl-envoy ", env!("CARGO_PKG_VERSION"))
    );
}

/// Waits (bounded) until the health status of `check` is `status` (1
/// SERVING, 2 NOT_SERVING).
async fn wait_until_async_ok(
    health: &mut tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>,
    check: &tonic_health::pb::HealthCheckRequest,
    status: i32,
) {
    for _ in 0..100 {
        if let Ok(r) = health.check(check.clone()).await {
            if r.into_inner().status == status {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("health never became {status}");
}
