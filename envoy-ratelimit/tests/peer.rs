//! envoyproxy/ratelimit's documented behaviours, asked over gRPC of the
//! real service against redis-server with the rl module: nested
//! descriptors, wildcards, `replaces`, `unlimited`, shadow mode,
//! `hits_addend`, limit overrides, the peer's stats, aligned fixed windows.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;

const CONFIG: &str = r#"
domain: peer
descriptors:
  - key: database
    value: users
    rate_limit: {unit: year, requests_per_unit: 3}
  - key: remote_address
    rate_limit: {unit: year, requests_per_unit: 2}
    descriptors:
      - key: path
        value: /special
        rate_limit: {unit: year, requests_per_unit: 1}
  - key: client
    value: "gold-*"
    rate_limit: {unit: year, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: key1
    rate_limit: {unit: year, name: limit1, requests_per_unit: 10}
  - key: key2
    rate_limit:
      unit: year
      name: limit2
      requests_per_unit: 1000
      replaces: [{name: limit1}]
  - key: second
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

fn setup() -> Single {
    Single::start("peer.yaml", CONFIG, &[])
}

/// The codes of `n` requests of one descriptor.
async fn codes(s: &Single, entries: &[(&str, &str)], n: usize) -> Vec<i32> {
    let mut c = s.service.client().await;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            ask(&mut c, request("peer", vec![desc(entries)]))
                .await
                .overall_code,
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_wildcard_unlimited_replaces() {
    let s = setup();
    assert_eq!(
        codes(&s, &[("database", "users")], 4).await,
        [OK, OK, OK, OVER]
    );
    // another value of a key without value in the config: counted per value
    assert_eq!(
        codes(&s, &[("remote_address", "10.0.0.1")], 3).await,
        [OK, OK, OVER]
    );
    assert_eq!(codes(&s, &[("remote_address", "10.0.0.2")], 1).await, [OK]);
    // nested: its own limit, and deeper than the config: no limit
    let special = [("remote_address", "10.0.0.1"), ("path", "/special")];
    assert_eq!(codes(&s, &special, 2).await, [OK, OVER]);
    let other = [("remote_address", "10.0.0.1"), ("path", "/other")];
    assert_eq!(codes(&s, &other, 4).await, [OK; 4]);
    // a value not in the config: no limit
    assert_eq!(codes(&s, &[("database", "other")], 5).await, [OK; 5]);
    // wildcard: each value its own count
    assert_eq!(codes(&s, &[("client", "gold-1")], 3).await, [OK, OK, OVER]);
    assert_eq!(codes(&s, &[("client", "gold-2")], 2).await, [OK, OK]);
    assert_eq!(codes(&s, &[("client", "silver")], 4).await, [OK; 4]);
    // unlimited
    let mut c = s.service.client().await;
    let r = ask(&mut c, request("peer", vec![desc(&[("free", "x")])])).await;
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());
    assert!(r.response_headers_to_add.is_empty());
    // replaces: with key2 present, limit1 does not apply
    let both = || request("peer", vec![desc(&[("key1", "a")]), desc(&[("key2", "b")])]);
    let r = ask(&mut c, both()).await;
    assert!(r.statuses[0].current_limit.is_none());
    assert_eq!(limit(&r, 1).requests_per_unit, 1000);
    assert_eq!(limit(&r, 1).name, "limit2");
    let r = ask(&mut c, request("peer", vec![desc(&[("key1", "a")])])).await;
    assert_eq!(limit(&r, 0).requests_per_unit, 10);
    assert_eq!(
        r.statuses[0].limit_remaining, 9,
        "key1 was not charged while replaced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_hits_addend_override_and_stats() {
    let s = setup();
    let mut c = s.service.client().await;
    // shadow mode: never refuses, counts
    for i in 0..3 {
        let r = ask(&mut c, request("peer", vec![desc(&[("shadow", "x")])])).await;
        assert_eq!(r.overall_code, OK, "shadow request {i}");
        assert_eq!(r.statuses[0].code, OK);
    }
    // request-level hits_addend
    let mut r = request("peer", vec![desc(&[("database", "users")])]);
    r.hits_addend = 3;
    let a = ask(&mut c, r.clone()).await;
    assert_eq!((a.overall_code, a.statuses[0].limit_remaining), (OK, 0));
    r.hits_addend = 1;
    assert_eq!(ask(&mut c, r).await.overall_code, OVER);
    // per-descriptor hits_addend wins over the request's
    let mut d = desc(&[("client", "gold-9")]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 2 });
    let mut r = request("peer", vec![d]);
    r.hits_addend = 1;
    let a = ask(&mut c, r.clone()).await;
    assert_eq!((a.overall_code, a.statuses[0].limit_remaining), (OK, 0));
    // a refused request spends nothing: a hits_addend of 0 probes
    let a = ask(&mut c, r.clone()).await;
    assert_eq!(a.overall_code, OVER);
    r.descriptors[0].hits_addend =
        Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    let a = ask(&mut c, r).await;
    assert_eq!((a.overall_code, a.statuses[0].limit_remaining), (OK, 0));
    // Envoy's per-descriptor limit override (unit 4 = day)
    let mut d = desc(&[("database", "anything")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 4,
    });
    let r = request("peer", vec![d]);
    assert_eq!(ask(&mut c, r.clone()).await.overall_code, OK);
    let a = ask(&mut c, r).await;
    assert_eq!(a.overall_code, OVER);
    assert_eq!(limit(&a, 0).unit, 4);
    // the peer's stat names
    let m = s.service.metrics();
    let line = |name: &str, key: &str| {
        let prefix = format!(
            "ratelimit_service_rate_limit_{name}{{domain=\"peer\",key1=\"{key}\",key2=\"\"}} "
        );
        m.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no {prefix} in\n{m}"))
            .to_string()
    };
    assert_eq!(line("total_hits", "shadow"), "3");
    assert_eq!(line("over_limit", "shadow"), "2");
    assert_eq!(line("shadow_mode", "shadow"), "2");
    assert_eq!(line("within_limit", "shadow"), "1");
    assert_eq!(line("total_hits", "database_users"), "4");
    assert_eq!(line("near_limit", "database_users"), "1");
    assert_eq!(line("over_limit", "database_users"), "1");
    assert!(m.contains("ratelimit_service_config_load_success 1"), "{m}");
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_windows_align_as_the_peer_aligns_them() {
    let s = setup();
    let mut c = s.service.client().await;
    // duration_until_reset runs to the end of the minute
    let before = now_ms();
    let r = ask(&mut c, request("peer", vec![desc(&[("minute", "m")])])).await;
    let after = now_ms();
    let d = r.statuses[0].duration_until_reset.unwrap();
    let reset_ms = d.seconds as u64 * 1000 + d.nanos as u64 / 1_000_000;
    assert!(
        reset_ms <= 60_000 - before % 60_000
            && reset_ms + (after - before) + 1 >= 60_000 - after % 60_000,
        "reset {reset_ms} ms at {before}..{after}"
    );
    // per second: 8 values, each exhausted early in a second, still
    // exhausted later in that second, admitted again in the next one
    // (an rl window offset by the key would reset in between for most of
    // them). Rounds whose requests straddle a second are retried.
    let mut checked = 0;
    for _round in 0..40 {
        if checked >= 8 {
            break;
        }
        // start 50 ms into a second
        let wait = (1050 - now_ms() % 1000) % 1000;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let second = now_ms() / 1000;
        let value = format!("v{checked}");
        let e = [("second", value.as_str())];
        let first = codes(&s, &e, 3).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let late = codes(&s, &e, 1).await;
        if now_ms() / 1000 != second {
            continue; // the round straddled a second: not conclusive
        }
        assert_eq!(first, [OK, OK, OVER], "{value}");
        assert_eq!(late, [OVER], "{value}: reset inside the second");
        let wait = 1000 - now_ms() % 1000 + 20;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        assert_eq!(
            codes(&s, &e, 1).await,
            [OK],
            "{value}: not reset at the second"
        );
        checked += 1;
    }
    assert_eq!(checked, 8, "too many rounds straddled a second");
}
