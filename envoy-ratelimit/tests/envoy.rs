//! End to end through the real Envoy (1.40, .ci/get-envoy) running
//! examples/envoy.yaml with examples/config: its rate-limit filter asks the
//! service, which decides in redis-server with the rl module; a loopback
//! upstream answers what passes.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use envoy_types::pb::google::protobuf::UInt64Value;

const EXAMPLE: &str = include_str!("../examples/envoy.yaml");
const EDGE: &str = include_str!("../examples/config/edge.yaml");

struct Stack {
    dir: tempfile::TempDir,
    redis: Redis,
    service: Service,
    upstream: u16,
}

fn stack() -> Stack {
    let dir = tempdir();
    let conf = config_dir(dir.path(), "edge.yaml", EDGE);
    let redis = Redis::start(dir.path());
    let service = Service::start(dir.path(), &conf, redis.port, &[]);
    Stack {
        dir,
        redis,
        service,
        upstream: upstream(),
    }
}

/// Envoy running the example with this stack's ports; returns it and its
/// listener port.
fn envoy(s: &Stack, dir: &Path, deny: bool) -> (Envoy, u16) {
    let listen = free_port();
    let config = EXAMPLE
        .replace("port_value: 9901", "port_value: ADMIN_PORT")
        .replace("port_value: 10000", &format!("port_value: {listen}"))
        .replace("port_value: 8000", &format!("port_value: {}", s.upstream))
        .replace(
            "port_value: 8081",
            &format!("port_value: {}", s.service.grpc),
        )
        .replace(
            "failure_mode_deny: false",
            &format!("failure_mode_deny: {deny}"),
        );
    (Envoy::start(dir, &config), listen)
}

fn get(port: u16, path: &str, headers: &[(&str, &str)]) -> (u16, Vec<(String, String)>) {
    let (status, hs, _) = http_get_full(port, path, headers).expect("envoy answers");
    (status, hs)
}

fn find<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    hs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[test]
fn token_bucket_and_headers_through_envoy() {
    let s = stack();
    let (_envoy, port) = envoy(&s, s.dir.path(), false);
    let mut codes = Vec::new();
    let mut last = Vec::new();
    for _ in 0..7 {
        let (code, hs) = get(port, "/bucket", &[]);
        codes.push(code);
        last = hs;
    }
    // the burst of 5, then 1 an hour
    assert_eq!(codes, [200, 200, 200, 200, 200, 429, 429]);
    let policy = find(&last, "ratelimit-policy").expect("RateLimit-Policy on a 429");
    let list = sfv::Parser::parse_list(policy.as_bytes()).expect("a structured list");
    assert_eq!(list.len(), 1, "{policy}");
    assert_eq!(policy, r#""bucket";q=1;w=3600"#);
    let rl = find(&last, "ratelimit").expect("RateLimit on a 429");
    let item = sfv::Parser::parse_item(rl.as_bytes()).expect("a structured item");
    assert_eq!(item.bare_item.as_str(), Some("bucket"));
    assert_eq!(item.params.get("r").and_then(|v| v.as_int()), Some(0));
    let retry: u64 = find(&last, "retry-after").unwrap().parse().unwrap();
    assert!(retry > 3000 && retry <= 3600, "Retry-After {retry}");
    // an allowed request carries the fields too
    let (code, hs) = get(port, "/", &[("x-user", "alice")]);
    assert_eq!(code, 200);
    assert!(
        find(&hs, "ratelimit-policy").is_some_and(|p| p.contains("\"per-user\";q=1;w=31536000")),
        "{hs:?}"
    );
    assert!(find(&hs, "retry-after").is_none());
    // the user's second request in the year is refused by the user's limit
    assert_eq!(get(port, "/", &[("x-user", "alice")]).0, 429);
    // an unlimited descriptor next to limited ones does not lift them
    assert_eq!(
        get(port, "/", &[("x-user", "alice"), ("x-admin", "1")]).0,
        429
    );
}

/// Remaining points of `entries` (a probe: hits_addend 0).
async fn remaining(s: &Stack, entries: &[(&str, &str)]) -> u32 {
    let mut c = s.service.client().await;
    let mut d = desc(entries);
    d.hits_addend = Some(UInt64Value { value: 0 });
    ask(&mut c, request("edge", vec![d])).await.statuses[0].limit_remaining
}

/// `clients` threads, each sending `each` requests as user `<prefix><i>`;
/// returns the admitted count per user.
fn burst(port: u16, prefix: &str, clients: usize, each: usize) -> Vec<usize> {
    let admitted: Vec<AtomicUsize> = (0..clients).map(|_| AtomicUsize::new(0)).collect();
    std::thread::scope(|sc| {
        for (i, count) in admitted.iter().enumerate() {
            sc.spawn(move || {
                let user = format!("{prefix}{i}");
                for _ in 0..each {
                    let (code, _) = get(port, "/", &[("x-user", &user)]);
                    assert!(code == 200 || code == 429, "status {code}");
                    if code == 200 {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    admitted.into_iter().map(AtomicUsize::into_inner).collect()
}

#[test]
fn all_or_nothing_under_50_concurrent_clients() {
    let s = stack();
    let (_envoy, port) = envoy(&s, s.dir.path(), false);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // phase 1: 50 users x 4 requests; a user may pass once a year, the
    // tenant 60 times: each user passes exactly once, and the 150 requests
    // refused by their user did not spend the tenant's points
    let per_user = burst(port, "a", 50, 4);
    assert!(per_user.iter().all(|&n| n == 1), "{per_user:?}");
    let tenant_left = rt.block_on(remaining(&s, &[("generic_key", "tenant")]));
    assert_eq!(
        tenant_left, 10,
        "refused requests were charged to the tenant"
    );
    // phase 2: 50 new users at once, 10 tenant points left: exactly 10
    // pass, and the 40 users refused by the tenant keep their point
    let per_user = burst(port, "b", 50, 1);
    assert_eq!(per_user.iter().sum::<usize>(), 10, "{per_user:?}");
    assert_eq!(rt.block_on(remaining(&s, &[("generic_key", "tenant")])), 0);
    for (i, n) in per_user.iter().enumerate() {
        let left = rt.block_on(remaining(&s, &[("user", &format!("b{i}"))]));
        assert_eq!(left as usize, 1 - n, "user b{i} admitted {n}");
    }
}

#[test]
fn failure_mode_deny_decides_when_redis_is_down() {
    let mut s = stack();
    let dir = s.dir.path().to_path_buf();
    let (_open, open_port) = envoy(&s, &dir, false);
    let (_deny, deny_port) = envoy(&s, &dir, true);
    assert_eq!(get(open_port, "/", &[]).0, 200);
    assert_eq!(get(deny_port, "/", &[]).0, 200);
    let port = s.redis.port;
    s.redis.proc.kill();
    // the service answers UNAVAILABLE: Envoy lets it through, or not
    assert_eq!(get(open_port, "/", &[]).0, 200);
    assert_eq!(get(deny_port, "/", &[]).0, 500);
    s.redis = Redis::start_on(&dir, port);
    wait_until(
        "rate limiting back",
        std::time::Duration::from_secs(20),
        || get(deny_port, "/", &[]).0 == 200,
    );
}
