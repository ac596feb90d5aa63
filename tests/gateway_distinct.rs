//! End to end: distinct-member rules (RL.DISTINCT) and quota threshold
//! events of a rule policy (gateway/REFERENCE.md, "Rule policies"), with
//! the small numbers of `gateway/test/distinct.lua`; the shipped ledger
//! example's stuffing rules run as shipped in `tests/gateway_ledger.rs`.
//! Real nginx, Redis with the module, real HTTP.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::collections::HashMap;
use std::time::Duration;

use common::{ints, Server};
use gateway::{agent, get, poll, problem};
use gateway_policy::{alerts, login, start, Front};

const ASYNC: Duration = Duration::from_secs(10);

fn policy(name: &str) -> Front {
    Front::Nginx(format!("dofile(GW .. \"/test/distinct.lua\").{name}"))
}

#[test]
fn stuffing_rules_trip_level_3_only_on_their_signature() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[policy("stuffing")], &[]).expect("start");
    let a = agent();
    let token = format!("{}/v1/auth/token", gw.url(0));
    let attempt = |who: &str, secret: &str, ip: &str| login(&a, &token, who, secret, ip);
    // failures counted on an IP's event window (limit min_events - 1 = 6)
    let events = |con: &mut redis::Connection, ip: &str| {
        6 - ints(
            con,
            &format!("RL.WINDOW stuff:{{ip:{ip}}}:stuffing-ip:events 6 600 COST 0 EXACT"),
        )[2]
    };
    let level =
        |con: &mut redis::Connection, key: &str| ints(con, &format!("RL.BOX STATUS {key}"))[0];
    let fail = |con: &mut redis::Connection, who: &str, ip: &str, n: i64| {
        let r = attempt(who, "x", ip);
        assert_eq!(r.status, 401, "failure {n} from {ip}: {r:#?}");
        poll(ASYNC, "the failure is counted", || {
            events(con, ip) == n.min(6)
        });
    };

    // 6 failures over 2 subjects, then 3 subjects over 4 failures: neither
    // is the signature (both conditions are needed)
    let a_ip = "203.0.113.9";
    let a_key = format!("stuff:{{ip:{a_ip}}}:stuffing-ip");
    for n in 1..=5 {
        fail(&mut con, "u1", a_ip, n);
    }
    fail(&mut con, "u2", a_ip, 6);
    assert_eq!(level(&mut con, &a_key), 0, "2 subjects");
    let c_ip = "203.0.113.10";
    for (n, who) in ["c1", "c2", "c3", "c4"].iter().enumerate() {
        fail(&mut con, who, c_ip, n as i64 + 1);
    }
    assert_eq!(
        level(&mut con, &format!("stuff:{{ip:{c_ip}}}:stuffing-ip")),
        0,
        "4 failures"
    );
    // the 7th failure, a 3rd subject: level 3 on the IP for a minute
    assert_eq!(attempt("u3", "x", a_ip).status, 401);
    poll(ASYNC, "the IP is boxed at level 3", || {
        level(&mut con, &a_key) == 3
    });
    let r = attempt("alice", "right", a_ip);
    let b = problem(&r, 429, "penalty-box-active");
    assert_eq!(b["penalty_level"], 3);
    assert_eq!(b["policy"], "stuffing-ip");
    let wait: u64 = r.must("Retry-After").parse().expect("seconds");
    assert!((50..=60).contains(&wait), "{wait}");
    assert_eq!(attempt("alice", "right", c_ip).status, 200, "another IP");
    poll(ASYNC, "the level-3 alert", || {
        alerts(&mut con, "stuff:alerts")
            .iter()
            .any(|m| m["policy"] == "stuffing-ip" && m["level"] == "3")
    });

    // concurrent failures completing the signature trip once: one offense
    let e_ip = "203.0.113.11";
    let e_key = format!("stuff:{{ip:{e_ip}}}:stuffing-ip");
    for who in ["e1", "e2"] {
        ints(&mut con, &format!("RL.DISTINCT {e_key} {who} 2 600"));
    }
    ints(
        &mut con,
        &format!("RL.WINDOW {e_key}:events 6 600 COST 6 EXACT"),
    );
    let url = token.clone();
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || login(&agent(), &url, &format!("n{i}"), "x", e_ip).status)
        })
        .collect();
    for w in workers {
        assert!([401, 429].contains(&w.join().expect("worker")));
    }
    poll(ASYNC, "the IP is boxed", || level(&mut con, &e_key) == 3);
    std::thread::sleep(Duration::from_millis(300)); // the other timers' trips, had they any
    assert_eq!(
        ints(&mut con, &format!("RL.BOX STATUS {e_key}"))[2],
        1,
        "one offense"
    );

    // one subject from a 3rd IP: refused (over the limit), and that
    // refused attempt (a 429, listed) trips the manual box
    let sub_key = "stuff:{subject:victim}:stuffing-subject";
    // IPs counted, read as a new member's room under a larger limit (10)
    let ips_left = |con: &mut redis::Connection| {
        ints(con, &format!("RL.DISTINCT {sub_key} none 10 600 PEEK"))[2]
    };
    for (n, ip) in ["198.51.100.1", "198.51.100.2"].iter().enumerate() {
        assert_eq!(attempt("victim", "x", ip).status, 401);
        poll(ASYNC, "the IP is counted", || {
            ips_left(&mut con) == 8 - n as i64
        });
    }
    problem(
        &attempt("victim", "x", "198.51.100.3"),
        429,
        "rate-limit-exceeded",
    );
    poll(ASYNC, "the subject is boxed by hand", || {
        ints(&mut con, &format!("RL.BOX STATUS {sub_key}"))[..2] == [3, -1]
    });
    let r = attempt("victim", "x", "198.51.100.4");
    assert_eq!(problem(&r, 403, "penalty-box-active")["penalty_level"], 3);
    assert_eq!(r.header("Retry-After"), None, "a manual box");
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

#[test]
fn distinct_members_per_request_are_refused_beyond_the_limit() {
    let redis = Server::start(&[]);
    let gw = start(redis.port, &[policy("stuffing")], &[]).expect("start");
    let a = agent();
    let url = format!("{}/v1/clients", gw.url(0));
    let call =
        |tenant: &str, client: &str| get(&a, &url, &[("X-Tenant", tenant), ("X-Client", client)]);
    for c in ["c1", "c2", "c1", "c2"] {
        let r = call("t", c);
        assert_eq!(r.status, 200, "{c}: {r:#?}");
        assert_eq!(
            r.must("RateLimit-Policy"),
            r#""clients";q=2;qu="members";w=60"#
        );
    }
    let r = call("t", "c3");
    let b = problem(&r, 429, "rate-limit-exceeded");
    assert_eq!(b["policy"], "clients");
    let wait: u64 = r.must("Retry-After").parse().expect("seconds");
    assert!((1..=60).contains(&wait), "{wait}");
    // the refused member is counted too (the module's choice): the tenant
    // stays refused, for every member, until the count falls back
    problem(&call("t", "c1"), 429, "rate-limit-exceeded");
    assert_eq!(call("t2", "c3").status, 200, "another tenant");
    let r = get(&a, &url, &[("X-Tenant", "t")]);
    assert_eq!(r.status, 200, "no member: the rule does not apply");
    assert_eq!(r.header("RateLimit-Policy"), None);
}

/// `calls=` of `cmdstat_<cmd>` in INFO commandstats (0 when never called).
fn calls(con: &mut redis::Connection, cmd: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn quota_thresholds_are_announced_once_per_period() {
    let redis = Server::start(&[]);
    let mut con = redis.client();
    let gw = start(redis.port, &[policy("quota")], &[]).expect("start");
    let url = format!("{}/v1/anything", gw.url(0));
    // 12 concurrent requests on a quota of 10: 50 % and 100 % crossed once each
    let workers: Vec<_> = (0..12)
        .map(|i| {
            let url = url.clone();
            let key = if i % 2 == 0 { "q-1" } else { "q-2" };
            std::thread::spawn(move || get(&agent(), &url, &[("X-Api-Key", key)]).status)
        })
        .collect();
    let mut statuses: Vec<u16> = workers
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [vec![200; 10], vec![403; 2]].concat());
    let stream = "rl:events:quota";
    poll(ASYNC, "two events", || alerts(&mut con, stream).len() >= 2);
    let period = String::from_utf8(
        std::process::Command::new("date")
            .args(["-u", "+%Y-%m"])
            .output()
            .expect("date")
            .stdout,
    )
    .expect("utf-8");
    let want = |used: &str, threshold: &str| -> HashMap<String, String> {
        [
            ("tenant", "t-1"),
            ("quota", "monthly"),
            ("used", used),
            ("limit", "10"),
            ("period", period.trim()),
            ("threshold", threshold),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    };
    let mut got = alerts(&mut con, stream);
    got.sort_by_key(|m| m["threshold"].parse::<u32>().unwrap_or(0));
    assert_eq!(got, vec![want("5", "50"), want("10", "100")]);
    // only the two crossings wrote a marker: requests below a threshold write nothing more
    assert_eq!((calls(&mut con, "set"), calls(&mut con, "xadd")), (2, 2));

    // points given back, the thresholds crossed again: no second event
    ints(
        &mut con,
        "RL.QUOTA qa:{tenant:t-1}:monthly 10 MONTH REFUND 6",
    );
    for i in 0..6 {
        let r = get(&agent(), &url, &[("X-Api-Key", "q-1")]);
        assert_eq!(r.status, 200, "request {i}: {r:#?}");
    }
    poll(ASYNC, "both markers tried again", || {
        calls(&mut con, "set") == 4
    });
    assert_eq!(alerts(&mut con, stream).len(), 2);
    assert_eq!(calls(&mut con, "xadd"), 2);
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}
