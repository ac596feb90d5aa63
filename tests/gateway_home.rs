//! End to end: a region's allowance (`allowance.home`, `allowance.borrow`;
//! gateway/README.md, "Several regions"). Two Redis servers with the
//! module, the home region's and a remote region's; nginx in the remote
//! region (its own Redis the remote one) leases its allowance from the
//! home bucket in timers. While the home is unreachable (SIGSTOP) the node
//! admits at most `borrow` points more, then refuses (429); once the home
//! answers again, the borrowed points are charged to the home bucket as a
//! debt, exactly once; a graceful stop gives what the node holds back to
//! the home. The region's usage dashboard shows the home bucket.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::time::{Duration, Instant};

use common::Server;
use gateway::{agent, get};
use gateway_policy::{start, Front, PolicyGateway};

/// The home bucket: 10 points, refilled 1 a day (nothing in a test).
const BURST: i64 = 10;
/// Points the node may admit on its own while the home is unreachable.
const BORROW: i64 = 3;
/// Longest wait for a phase (each one bounded in requests too).
const PHASE: Duration = Duration::from_secs(20);

/// The remote region's policy: `held` on /v1/held, a bucket per tenant
/// leased from the home Redis on `home_port` in allowances of 4 (fetched
/// ahead below 2, kept an hour: no refund during the test), borrowing up
/// to BORROW points; `kept` on /v1/kept the same without borrowing, on a
/// bucket of 100; the home's timeout 1 s (a loaded machine must not
/// time it out by accident).
fn policy(home_port: u16) -> String {
    format!(
        r#"return {{
    redis = {{ port = tonumber(os.getenv("RL_REDIS_PORT")), timeout_ms = 1000 }},
    key_prefix = "hm",
    identity = {{ api_key = {{ keys = {{ ["k1"] = {{ key_id = "k1", tenant = "t1", tier = "pro" }} }} }} }},
    tiers = {{ pro = {{}} }},
    rules = {{
        {{ name = "held", match = {{ path = "/v1/held" }}, scope = {{ "tenant" }},
          limiter = {{ kind = "bucket", burst = {BURST}, rate = 1, period = 86400 }},
          allowance = {{ size = 4, max_age = 3600,
                        home = {{ host = "127.0.0.1", port = {home_port}, timeout_ms = 1000 }},
                        borrow = {BORROW} }} }},
        {{ name = "kept", match = {{ path = "/v1/kept" }}, scope = {{ "tenant" }},
          limiter = {{ kind = "bucket", burst = 100, rate = 1, period = 86400 }},
          allowance = {{ size = 4, max_age = 3600,
                        home = {{ host = "127.0.0.1", port = {home_port}, timeout_ms = 1000 }} }} }},
    }},
}}"#
    )
}

/// The points of the home bucket of rule `name` (capacity `burst`; a
/// `COST 0` probe): negative in debt.
fn level_of(home: &Server, name: &str, burst: i64) -> i64 {
    let reply: Vec<i64> = redis::cmd("RL.TAKE")
        .arg(format!("hm:{{tenant:t1}}:{name}"))
        .arg(burst)
        .arg(1)
        .arg(86400)
        .arg("COST")
        .arg(0)
        .query(&mut home.client())
        .expect("probe");
    reply[2]
}

/// The points of the home bucket of `held`.
fn level(home: &Server) -> i64 {
    level_of(home, "held", BURST)
}

/// The `(left, limit)` of policy `name` on the node's usage dashboard
/// (`GET /_rl/usage` with the API key).
fn dashboard(node: &PolicyGateway, name: &str) -> (i64, i64) {
    let r = get(
        &agent(),
        &format!("{}/_rl/usage", node.url(0)),
        &[("X-Api-Key", "k1")],
    );
    assert_eq!(r.status, 200, "{r:#?}");
    let u = r.json();
    let p = u["policies"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no policy {name}: {u}"));
    (
        p["left"].as_i64().expect("left"),
        p["limit"].as_i64().expect("limit"),
    )
}

/// Requests to the node, `gap` apart, until `done(admitted)` or `max`
/// requests or PHASE: the number admitted (anything else must be a 429).
fn requests(
    node: &PolicyGateway,
    path: &str,
    max: usize,
    gap: Duration,
    mut done: impl FnMut(i64) -> bool,
) -> i64 {
    let a = agent();
    let url = format!("{}{path}", node.url(0));
    let until = Instant::now() + PHASE;
    let mut admitted = 0;
    for _ in 0..max {
        if done(admitted) || Instant::now() >= until {
            break;
        }
        let r = get(&a, &url, &[("X-Api-Key", "k1")]);
        assert!(r.status == 200 || r.status == 429, "{r:#?}");
        if r.status == 200 {
            admitted += 1;
        } else {
            assert_eq!(r.must("Retry-After"), "1", "{r:#?}");
        }
        std::thread::sleep(gap);
    }
    admitted
}

#[test]
fn a_region_leases_from_the_home_borrows_while_it_is_away_and_repays_the_debt_once() {
    let home = Server::start(&[]);
    let remote = Server::start(&[]);
    let mut node = start(
        remote.port,
        &[Front::Nginx("dofile(DIR .. \"/policy.lua\")".into())],
        &[("policy.lua", &policy(home.port))],
    )
    .unwrap_or_else(|e| panic!("nginx: {e}"));
    let gap = Duration::from_millis(20);

    // (1) steady traffic: the home bucket pays every point, the remote
    // Redis holds nothing; never more than the home's 10 admitted
    let admitted = requests(&node, "/v1/held", 300, gap, |n| n == BURST);
    assert_eq!(admitted, BURST, "the home's points were all admitted");
    assert_eq!(level(&home), 0, "the home bucket paid them");
    assert_eq!(
        requests(&node, "/v1/held", 10, gap, |_| false),
        0,
        "nothing beyond"
    );
    // the region's usage dashboard reads the home bucket: empty, not full
    assert_eq!(
        dashboard(&node, "held"),
        (0, BURST),
        "the home bucket's left"
    );
    assert_eq!(dashboard(&node, "kept"), (100, 100));
    let keys: i64 = redis::cmd("DBSIZE").query(&mut remote.client()).unwrap();
    assert_eq!(keys, 0, "nothing on the remote Redis");

    // (2) the home unreachable: exactly `borrow` more, then 429
    let pid = common::redis_pid(&home);
    common::signal(pid, "STOP");
    let borrowed = requests(&node, "/v1/held", 100, Duration::from_millis(50), |_| false);
    common::signal(pid, "CONT");
    assert_eq!(
        borrowed, BORROW,
        "admitted on the node's own while the home was away"
    );

    // (3) the home back: the borrowed points become its debt, once
    let mut debt = 0;
    let admitted = requests(&node, "/v1/held", 100, Duration::from_millis(100), |_| {
        debt = level(&home);
        debt == -BORROW
    });
    assert_eq!(debt, -BORROW, "the borrowed points charged to the home");
    assert_eq!(admitted, 0, "a bucket in debt admits nothing");
    assert_eq!(requests(&node, "/v1/held", 15, gap, |_| false), 0);
    assert_eq!(level(&home), -BORROW, "charged once, not again");
    let keys: i64 = redis::cmd("DBSIZE").query(&mut remote.client()).unwrap();
    assert_eq!(keys, 0, "nothing on the remote Redis");

    // (4) a graceful stop gives what the node holds back to the home
    let kept = requests(&node, "/v1/kept", 50, gap, |n| n == 5);
    assert_eq!(kept, 5);
    assert!(
        level_of(&home, "kept", 100) < 100 - 5,
        "the node holds points"
    );
    assert!(node.nginx.quit(PHASE), "nginx stops within {PHASE:?}");
    assert_eq!(
        level_of(&home, "kept", 100),
        100 - 5,
        "every unspent point came back"
    );
    let keys: i64 = redis::cmd("DBSIZE").query(&mut remote.client()).unwrap();
    assert_eq!(keys, 0, "nothing on the remote Redis");
    node.nginx.assert_no_lua_errors();
}
