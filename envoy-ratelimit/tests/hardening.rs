//! Failure paths an attacker or a broken deployment reaches: a refund that
//! fails after a refusal.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};

use common::*;

const CONFIG: &str = r#"
domain: rl
descriptors:
  - key: tenant
    rate_limit: {unit: year, requests_per_unit: 1000}
  - key: one
    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: token_bucket}
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
