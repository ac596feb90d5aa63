//! Failure paths an attacker or a broken deployment reaches: a refund that
//! fails after a refusal, a Redis without the rl module, metric series
//! made from request content, request values in response fields, slow
//! and idle clients, SIGTERM.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;
use std::time::Instant;

use common::*;

const CONFIG: &str = r#"
domain: rl
descriptors:
  - key: tenant
    rate_limit: {unit: year, requests_per_unit: 1000}
  - key: one
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
  - key: account
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

/// A loopback proxy to `port` that drops a connection (both ways) when
/// the client sends a command holding `REFUND`; its port.
fn refund_breaking_proxy(port: u16) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listener");
    let local = listener.local_addr().expect("proxy address").port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            let (mut c_in, mut s_out) = (client, server);
            let (Ok(mut c_out), Ok(mut s_in)) = (c_in.try_clone(), s_out.try_clone()) else {
                continue;
            };
            std::thread::spawn(move || {
                let mut buf = [0u8; 16384];
                while let Ok(n) = c_in.read(&mut buf) {
                    let chunk = &buf[..n];
                    if n == 0 || chunk.windows(6).any(|w| w == b"REFUND") {
                        break;
                    }
                    if s_out.write_all(chunk).is_err() {
                        break;
                    }
                }
                let _ = c_in.shutdown(Shutdown::Both);
                let _ = s_out.shutdown(Shutdown::Both);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_in, &mut c_out);
                let _ = c_out.shutdown(Shutdown::Both);
            });
        }
    });
    local
}

/// A refusal stays OVER_LIMIT when the refund of the other limit fails
/// (the failure is counted), instead of becoming an error that Envoy's
/// default `failure_mode_deny: false` would admit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_refund_keeps_the_refusal() {
    let dir = tempdir();
    let conf = config_dir(dir.path(), "rl.yaml", CONFIG);
    let redis = Redis::start(dir.path());
    let proxy = refund_breaking_proxy(redis.port);
    let service = Service::start(dir.path(), &conf, proxy, &[]);
    let mut c = service.client().await;
    let r = || request("rl", vec![desc(&[("tenant", "t")]), desc(&[("one", "x")])]);
    assert_eq!(ask(&mut c, r()).await.overall_code, OK);
    // `one` refuses, `tenant` admitted and is refunded: the refund is cut
    let resp = c
        .should_rate_limit(r())
        .await
        .expect("a refusal, not an error");
    assert_eq!(resp.into_inner().overall_code, OVER);
    assert!(
        service
            .metrics()
            .contains("ratelimit_service_refund_error 1"),
        "{}",
        service.metrics()
    );
}

/// Against a Redis without the rl module the health checks fail (every
/// decision would), and the error a caller gets names no Redis key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_without_the_module_is_unhealthy() {
    let dir = tempdir();
    let conf = config_dir(dir.path(), "rl.yaml", CONFIG);
    let port = free_port();
    let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let mut redis = std::process::Command::new(bin);
    redis
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir.path());
    let _redis = Proc::spawn_logged(redis, dir.path().join("bare-redis.log"));
    wait_until("bare redis", Duration::from_secs(10), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let (grpc, http) = (free_port(), free_port());
    let service = Proc::spawn_logged(
        Service::command(&conf, port, grpc, http),
        dir.path().join("rl-envoy.log"),
    );
    wait_until("/healthcheck 500", Duration::from_secs(20), || {
        http_get(http, "/healthcheck").is_some_and(|(code, _)| code == 500)
    });
    assert!(
        service.output().contains("lacks the rl module"),
        "{}",
        service.output()
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{grpc}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("grpc connect");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let check = tonic_health::pb::HealthCheckRequest {
        service: "envoy.service.ratelimit.v3.RateLimitService".into(),
    };
    let mut not_serving = false;
    for _ in 0..60 {
        if let Ok(r) = health.check(check.clone()).await {
            if r.into_inner().status == 2 {
                not_serving = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(not_serving, "grpc health is not NOT_SERVING");
    let mut c = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient::new(channel);
    let e = c
        .should_rate_limit(request("rl", vec![desc(&[("tenant", "secret-value")])]))
        .await
        .expect_err("no module: an error");
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert!(
        !e.message().contains("secret-value") && !e.message().contains("rl-envoy:"),
        "{}",
        e.message()
    );
}

/// A request's own `limit` counts under its entries' keys, not their
/// values: values chosen by clients make no new series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_stats_ignore_values() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let s = Single::start("rl.yaml", CONFIG, &[]);
    let mut c = s.service.client().await;
    for i in 0..20 {
        let mut d = desc(&[("user", &format!("u{i}")), ("path", &format!("/p{i}"))]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: 2, // minute
        });
        assert_eq!(ask(&mut c, request("rl", vec![d])).await.overall_code, OK);
    }
    let text = s.service.metrics();
    assert!(
        text.contains(
            "ratelimit_service_rate_limit_total_hits{domain=\"rl\",key1=\"user\",key2=\"path\"} 20"
        ),
        "{text}"
    );
    assert!(!text.contains("u1"), "{text}");
}

/// A `detailed_metric` limit without a `name` is named in
/// `RateLimit-Policy` by its configured key: the request's value (an
/// account number Envoy took from a token, say) stays in the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_names_hold_no_request_values() {
    let s = Single::start("rl.yaml", CONFIG, &[]);
    let mut c = s.service.client().await;
    let r = ask(
        &mut c,
        request("rl", vec![desc(&[("account", "acct-8841")])]),
    )
    .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        header(&r, "RateLimit-Policy"),
        Some(r#""rl.account";q=5;w=60"#)
    );
    let rl = header(&r, "RateLimit").unwrap_or_default();
    assert!(rl.starts_with(r#""rl.account";r=4;t="#), "{rl}");
    assert!(s.service.metrics().contains("key1=\"account_acct-8841\""));
}

/// Whether the server closes `conn` within `within` (a read returns 0 or
/// a reset); `false` when it is still open then.
fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    conn.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

/// A client that sends half a request header, or nothing, is closed after
/// the client timeout on both ports; past the HTTP port's connection cap a
/// new connection is closed at once.
#[test]
fn slow_and_idle_clients_are_closed() {
    let dir = tempdir();
    let conf = config_dir(dir.path(), "rl.yaml", CONFIG);
    let redis = Redis::start(dir.path());
    let (grpc, http) = (free_port(), free_port());
    let mut cmd = Service::command(&conf, redis.port, grpc, http);
    // environment variables: a service without these settings still starts
    cmd.env("RL_ENVOY_CLIENT_TIMEOUT_MS", "2000")
        .env("RL_ENVOY_HTTP_MAX_CONNECTIONS", "2");
    let service = Service::launch(dir.path(), cmd, grpc, http);
    // The launch probe's connection frees its slot when the service has
    // read its close, which a loaded machine may not have done yet: the
    // two connections below count as holding the two slots once the
    // second one is still open a moment later (retried, bounded).
    let (start, mut half, mut idle) = (0..20)
        .find_map(|_| {
            let start = Instant::now();
            let mut half = TcpStream::connect(("127.0.0.1", http)).expect("http connect");
            half.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n")
                .expect("half a header");
            let mut idle = TcpStream::connect(("127.0.0.1", http)).expect("http connect");
            if closed_within(&mut idle, Duration::from_millis(150)) {
                std::thread::sleep(Duration::from_millis(100));
                return None;
            }
            Some((start, half, idle))
        })
        .expect("two connections hold the two slots");
    let mut silent = TcpStream::connect(("127.0.0.1", grpc)).expect("grpc connect");
    let mut over = TcpStream::connect(("127.0.0.1", http)).expect("http connect");
    assert!(
        closed_within(&mut over, Duration::from_millis(1000)),
        "a connection past the cap stays open"
    );
    assert!(
        closed_within(&mut half, Duration::from_secs(5)),
        "half a header"
    );
    assert!(
        closed_within(&mut silent, Duration::from_secs(5)),
        "silent gRPC client"
    );
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)),
        "idle HTTP client"
    );
    assert!(start.elapsed() < Duration::from_secs(6));
    assert_eq!(
        http_get(service.http, "/healthcheck").map(|r| r.0),
        Some(200)
    );
}

/// SIGTERM stops the service cleanly (exit status 0, logged), as Ctrl-C does.
#[test]
fn sigterm_stops_cleanly() {
    let mut s = Single::start("rl.yaml", CONFIG, &[]);
    let pid = s.service.proc.child.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = s.service.proc.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "still running 5 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {}", s.service.proc.output());
    assert!(s.service.proc.output().contains("SIGTERM"));
}
