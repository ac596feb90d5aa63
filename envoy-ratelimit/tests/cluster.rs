//! The service on a Redis Cluster of three primaries with the rl module:
//! descriptors in different slots are decided in separate calls and a
//! refused request gives back what the others took; with `--hash-tag
//! domain` a request is one call; a slot migrated under load.

mod common;

use common::*;
use envoy_types::pb::google::protobuf::UInt64Value;

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

/// A cluster and the service on it (`--redis-cluster` and `extra`); the
/// folder holds their files and the configuration.
fn start(extra: &[&str]) -> (tempfile::TempDir, Cluster, Service) {
    let dir = tempdir();
    let conf = config_dir(dir.path(), "c.yaml", CONFIG);
    let cluster = Cluster::start(dir.path());
    let seeds = cluster.seeds();
    let args: Vec<&str> = ["--redis-cluster", &seeds]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let service = Service::start(dir.path(), &conf, 1, &args);
    (dir, cluster, service)
}

/// How many of the cluster's nodes hold keys.
fn nodes_with_keys(cluster: &Cluster) -> usize {
    cluster
        .nodes
        .iter()
        .filter(|n| {
            let mut c = n.client().unwrap();
            redis::cmd("DBSIZE").query::<u64>(&mut c).unwrap() > 0
        })
        .count()
}

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
    let (_dir, cluster, service) = start(&[]);
    refused_requests_cost_nothing(&service).await;
    // keys live on more than one node
    let with_keys = nodes_with_keys(&cluster);
    assert!(with_keys >= 2, "every key on one node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domain_tag_one_slot() {
    let (_dir, cluster, service) = start(&["--hash-tag", "domain"]);
    refused_requests_cost_nothing(&service).await;
    let with_keys = nodes_with_keys(&cluster);
    assert_eq!(with_keys, 1, "a domain's keys in one slot");
}

/// A primary: its id, its port, its slot ranges.
type Primary = (String, u16, Vec<(u16, u16)>);

/// The primaries `CLUSTER NODES` of `node` lists.
fn primaries(node: &Redis) -> Vec<Primary> {
    let mut c = node.client().unwrap();
    let text: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).unwrap();
    text.lines()
        .filter(|l| l.contains("master"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = f[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|p| p.parse().ok())
                .unwrap();
            let ranges = f[8..]
                .iter()
                .filter(|r| !r.starts_with('['))
                .map(|r| {
                    let mut it = r.split('-').map(|x| x.parse::<u16>().unwrap());
                    let a = it.next().unwrap();
                    (a, it.next().unwrap_or(a))
                })
                .collect();
            (f[0].to_string(), port, ranges)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_migration_under_load() {
    let (_dir, cluster, service) = start(&["--hash-tag", "domain"]);
    let mut c0 = cluster.nodes[0].client().unwrap();
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg("{c}")
        .query(&mut c0)
        .unwrap();
    let nodes = primaries(&cluster.nodes[0]);
    let src = nodes
        .iter()
        .find(|n| n.2.iter().any(|&(a, b)| a <= slot && slot <= b))
        .unwrap()
        .clone();
    let dst = nodes.iter().find(|n| n.0 != src.0).unwrap().clone();
    let node = |port: u16| cluster.nodes.iter().find(|n| n.port == port).unwrap();

    // load: 2000 requests of two descriptors (tenant 10 a year, 400 users 1)
    let load = {
        let mut c = service.client().await;
        tokio::spawn(async move {
            let (mut ok, mut over, mut errors) = (0, 0, 0);
            for i in 0..2000 {
                let user = format!("m{}", i % 400);
                let r = request(
                    "c",
                    vec![desc(&[("tenant", "mig")]), desc(&[("user", &user)])],
                );
                match c.should_rate_limit(r).await {
                    Ok(resp) if resp.get_ref().overall_code == OK => ok += 1,
                    Ok(_) => over += 1,
                    Err(_) => errors += 1,
                }
            }
            (ok, over, errors)
        })
    };
    // move the slot while the load runs
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let mut s = node(src.1).client().unwrap();
    let mut d = node(dst.1).client().unwrap();
    let setslot = |c: &mut redis::Connection, how: &str, id: &str| {
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(how)
            .arg(id)
            .query::<()>(c)
            .unwrap()
    };
    setslot(&mut d, "IMPORTING", &src.0);
    setslot(&mut s, "MIGRATING", &dst.0);
    for _ in 0..1000 {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(&mut s)
            .unwrap();
        if keys.is_empty() {
            break;
        }
        redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(dst.1)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query::<()>(&mut s)
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    for n in &cluster.nodes {
        setslot(&mut n.client().unwrap(), "NODE", &dst.0);
    }
    assert!(!load.is_finished(), "the load ended before the slot moved");
    let (ok, over, errors) = load.await.unwrap();
    assert_eq!(ok + over + errors, 2000);
    // whatever was answered, the counts say exactly what was admitted
    assert_eq!(ok, 10, "ok {ok} over {over} errors {errors}");
    assert_eq!(probe(&service, &[("tenant", "mig")]).await, 0);
    let mut charged_users = 0;
    for i in 0..400 {
        charged_users += 1 - probe(&service, &[("user", &format!("m{i}"))]).await;
    }
    assert_eq!(
        charged_users, ok,
        "users charged {charged_users}, admitted {ok}"
    );
    // the slot moved
    let mut dc = node(dst.1).client().unwrap();
    let n: u64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(&mut dc)
        .unwrap();
    assert!(n > 0, "no key on the new owner");
}
