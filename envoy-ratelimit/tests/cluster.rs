//! The service on a Redis Cluster of three primaries with the rl module:
//! descriptors in different slots are decided in separate calls and a
//! refused request gives back what the others took; with `--hash-tag
//! domain` a request is one call.

mod common;

use common::*;
use envoy_types::pb::google::protobuf::UInt64Value;

const OK: i32 = 1;
const OVER: i32 = 2;

const CONFIG: &str = r#"
domain: c
descriptors:
  - key: tenant
    rate_limit: {unit: year, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: year, requests_per_unit: 1}
    descriptors:
      - key: path
        rate_limit: {unit: year, requests_per_unit: 5, algorithm: sliding_window}
"#;

async fn probe(s: &Service, entries: &[(&str, &str)]) -> u32 {
    let mut c = s.client().await;
    let mut d = desc(entries);
    d.hits_addend = Some(UInt64Value { value: 0 });
    ask(&mut c, request("c", vec![d])).await.statuses[0].limit_remaining
}

async fn refused_requests_cost_nothing(service: &Service) {
    let mut c = service.client().await;
    // 20 users: the tenant key and the users' keys hash to different
    // slots (and mostly different nodes) with the default tag
    for i in 0..20 {
        let user = format!("u{i}");
        let r = || {
            request(
                "c",
                vec![
                    desc(&[("tenant", "t")]),
                    desc(&[("user", &user)]),
                    desc(&[("user", &user), ("path", "/a")]),
                ],
            )
        };
        let first = ask(&mut c, r()).await.overall_code;
        assert_eq!(first, if i < 10 { OK } else { OVER }, "user {i}");
        // the user's second request is refused by the user's limit
        assert_eq!(ask(&mut c, r()).await.overall_code, OVER, "user {i}");
        let left = probe(service, &[("user", &user), ("path", "/a")]).await;
        assert_eq!(left, if i < 10 { 4 } else { 5 }, "user {i}'s path limit");
        let user_left = probe(service, &[("user", &user)]).await;
        assert_eq!(user_left, if i < 10 { 0 } else { 1 }, "user {i}");
    }
    assert_eq!(probe(service, &[("tenant", "t")]).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_entry_tags_across_slots() {
    let dir = tempdir();
    let conf = dir.path().join("config");
    std::fs::create_dir(&conf).unwrap();
    write_config(&conf, "c.yaml", CONFIG);
    let cluster = Cluster::start(dir.path());
    let seeds = cluster.seeds();
    let service = Service::start(dir.path(), &conf, 1, &["--redis-cluster", &seeds]);
    refused_requests_cost_nothing(&service).await;
    // keys live on more than one node
    let with_keys = cluster
        .nodes
        .iter()
        .filter(|n| {
            let mut c = n.client().unwrap();
            redis::cmd("DBSIZE").query::<u64>(&mut c).unwrap() > 0
        })
        .count();
    assert!(with_keys >= 2, "every key on one node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domain_tag_one_slot() {
    let dir = tempdir();
    let conf = dir.path().join("config");
    std::fs::create_dir(&conf).unwrap();
    write_config(&conf, "c.yaml", CONFIG);
    let cluster = Cluster::start(dir.path());
    let seeds = cluster.seeds();
    let service = Service::start(
        dir.path(),
        &conf,
        1,
        &["--redis-cluster", &seeds, "--hash-tag", "domain"],
    );
    refused_requests_cost_nothing(&service).await;
    let with_keys = cluster
        .nodes
        .iter()
        .filter(|n| {
            let mut c = n.client().unwrap();
            redis::cmd("DBSIZE").query::<u64>(&mut c).unwrap() > 0
        })
        .count();
    assert_eq!(with_keys, 1, "a domain's keys in one slot");
}
