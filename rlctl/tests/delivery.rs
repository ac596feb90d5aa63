//! Delivery guarantees: retries until the horizon then a recorded and
//! alerted expiry, a destination down for long across a restart still
//! reached, nothing resent after a restart, trips made while the worker was
//! down still alerted, and a worker killed during a burst delivering every
//! alert once.

mod common;

use common::receivers::{Fail, Smtp};
use common::*;
use std::collections::HashMap;
use std::time::Duration;

fn deliveries(audit: &[HashMap<String, String>], key: &str) -> Vec<HashMap<String, String>> {
    audit
        .iter()
        .filter(|e| e["type"] == "delivery" && e.get("key").map(String::as_str) == Some(key))
        .cloned()
        .collect()
}

#[test]
fn a_failing_destination_is_retried_until_its_horizon_then_alerted() {
    // Retried for 3 s (a few dozen attempts at 50 to 200 ms), then given up.
    let s = Single::start("failing", ("retry_for_ms = 10000", "retry_for_ms = 3000"));
    s.web.fail(
        "/tenant/t-grow",
        Fail {
            status: 500,
            times: usize::MAX,
        },
    );
    s.web.fail(
        "/internal",
        Fail {
            status: 503,
            times: 2,
        },
    );
    s.web.fail(
        "/tenant/t-sand",
        Fail {
            status: 400,
            times: usize::MAX,
        },
    );
    let mut worker = s.worker();
    let mut con = s.server.client();
    let grow = "rl:{t:t-grow}:key:k-1";
    let sand = "rl:{t:t-sand}:key:k-2";
    trip(&mut con, grow, 2, 3600);
    wait_until(
        Duration::from_secs(20),
        "every delivery of the first trip to end",
        || deliveries(&audit_entries(&mut con), grow).len() == 3,
    );
    trip(&mut con, sand, 2, 3600);
    wait_until(
        Duration::from_secs(20),
        "every delivery of the second trip to end",
        || deliveries(&audit_entries(&mut con), sand).len() == 3,
    );
    let tried = s.web.to("/tenant/t-grow").len();
    assert!(tried >= 3, "a 500 is retried until the horizon: {tried}");
    assert_eq!(s.web.to("/tenant/t-sand").len(), 1, "a 400 is not retried");
    // two 503s, then sent; the sandbox one; the expiry of the 500s
    wait_until(Duration::from_secs(10), "the expiry alert", || {
        s.web.to("/internal").len() == 2 + 1 + 1 + 1
    });
    let expiry = s
        .web
        .to("/internal")
        .into_iter()
        .map(|r| r.json())
        .find(|j| j["type"] == "rl.delivery_expired")
        .expect("an rl.delivery_expired alert");
    assert_eq!(
        (expiry["dest"].as_str(), expiry["key"].as_str()),
        (Some("tenant_webhook"), Some(grow))
    );
    assert_eq!(expiry["attempts"].as_u64(), Some(tried as u64));
    assert!(expiry["reason"].as_str().unwrap().contains("HTTP 500"));
    assert_eq!(s.smtp.all().len(), 2);
    let audit = audit_entries(&mut con);
    let by_dest = |key: &str, dest: &str| {
        deliveries(&audit, key)
            .into_iter()
            .find(|e| e["dest"] == dest)
            .unwrap()
    };
    let failed = by_dest(grow, "tenant_webhook");
    assert_eq!(
        (failed["result"].as_str(), failed["attempts"].as_str()),
        ("expired", tried.to_string().as_str())
    );
    assert!(failed["reason"].contains("HTTP 500"), "{failed:?}");
    assert!(failed["target"].ends_with("/tenant/t-grow"), "{failed:?}");
    let retried = by_dest(grow, "internal");
    assert_eq!(
        (retried["result"].as_str(), retried["attempts"].as_str()),
        ("sent", "3")
    );
    let permanent = by_dest(sand, "tenant_webhook");
    assert_eq!(
        (permanent["result"].as_str(), permanent["attempts"].as_str()),
        ("failed", "1")
    );
    assert!(permanent["reason"].contains("HTTP 400"), "{permanent:?}");
    let log = worker.log_text();
    let line = log.lines().find(|l| {
        l.contains("delivery failed")
            && l.contains("destination=\"tenant_webhook\"")
            && l.contains("500")
    });
    assert!(
        line.is_some(),
        "the failure is logged with destination and reason:\n{log}"
    );
    assert!(log.contains("delivery attempt failed"), "{log}");

    // `rlctl undelivered` lists what was given up; nothing is pending.
    let o = rlctl(&s.cfg, &["undelivered", "--json"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed["pending"], serde_json::json!([]), "{listed}");
    let mut given_up: Vec<(String, String)> = listed["given_up"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let f = &e["fields"];
            (
                f["dest"].as_str().unwrap().to_string(),
                f["result"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    given_up.sort();
    assert_eq!(
        given_up,
        [
            ("tenant_webhook".to_string(), "expired".to_string()),
            ("tenant_webhook".to_string(), "failed".to_string())
        ]
    );

    // A restart sends nothing again: not the sent ones, not the failed one.
    worker.kill9();
    let before = s.web.all().len();
    let _again = s.worker();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        s.web.all().len(),
        before,
        "nothing resent after the restart"
    );
    assert_eq!(s.smtp.all().len(), 2);
}

#[test]
fn a_destination_down_for_long_is_reached_after_a_restart() {
    // Retried for 10 minutes; the old default gave up after 5 attempts.
    let s = Single::start(
        "down-long",
        ("retry_for_ms = 10000", "retry_for_ms = 600000"),
    );
    let down = Fail {
        status: 503,
        times: usize::MAX,
    };
    s.web.fail("/tenant/t-grow", down);
    let mut worker = s.worker();
    let mut con = s.server.client();
    let key = "rl:{t:t-grow}:key:k-down";
    trip(&mut con, key, 2, 2); // over before the restart: not reconciled
    wait_until(Duration::from_secs(20), "more attempts than before", || {
        s.web.to("/tenant/t-grow").len() >= 7
    });
    worker.kill9();
    wait_until(Duration::from_secs(10), "the box to end", || {
        status(&mut con, key)[0] == 0
    });
    let o = rlctl(&s.cfg, &["undelivered", "--json"], &[]);
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pending = listed["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{listed}");
    assert!(pending[0]["delivery"]
        .as_str()
        .unwrap()
        .ends_with("/tenant_webhook"));
    assert!(pending[0]["attempts"].as_u64().unwrap() >= 6, "{listed}");
    assert!(pending[0]["last_error"].as_str().unwrap().contains("503"));

    let before = s.web.to("/tenant/t-grow").len();
    s.web.fail(
        "/tenant/t-grow",
        Fail {
            status: 503,
            times: 0,
        },
    ); // back up
    let _worker = s.worker();
    wait_until(Duration::from_secs(20), "the alert delivered", || {
        deliveries(&audit_entries(&mut con), key)
            .iter()
            .any(|e| e["dest"] == "tenant_webhook")
    });
    let sent: Vec<_> = deliveries(&audit_entries(&mut con), key)
        .into_iter()
        .filter(|e| e["dest"] == "tenant_webhook")
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0]["result"], "sent");
    let attempts: usize = sent[0]["attempts"].parse().unwrap();
    assert!(
        attempts > before.min(6),
        "attempts counted across the restart: {attempts}"
    );
    let reqs = s.web.to("/tenant/t-grow");
    assert_eq!(reqs.len(), before + 1, "sent once when back up");
    let ids: std::collections::HashSet<String> = reqs.iter().map(|r| r.delivery()).collect();
    assert_eq!(ids.len(), 1, "one delivery id throughout: {ids:?}");
    let o = rlctl(&s.cfg, &["undelivered", "--json"], &[]);
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed["pending"], serde_json::json!([]), "{listed}");
}

#[test]
fn a_restart_resends_nothing_and_alerts_trips_made_while_down() {
    let s = Single::start("restart", ("", ""));
    let mut worker = s.worker();
    let mut con = s.server.client();
    trip(&mut con, "rl:{t:t-grow}:key:before", 2, 3600);
    // Killed once the deliveries are recorded (a kill between a send and its
    // record resends that one: the burst test covers it).
    wait_until(
        Duration::from_secs(20),
        "the first trip's alerts recorded",
        || deliveries(&audit_entries(&mut con), "rl:{t:t-grow}:key:before").len() == 3,
    );
    assert_eq!((s.web.all().len(), s.smtp.all().len()), (2, 1));
    worker.kill9();

    trip(&mut con, "rl:{t:t-grow}:key:while-down", 2, 3600);
    let short: Vec<i64> = redis::cmd("RL.BOX")
        .arg("TRIP")
        .arg("rl:{t:t-grow}:key:over")
        .arg(2)
        .arg("0.3")
        .query(&mut con)
        .unwrap();
    assert_eq!(short[0], 2);
    std::thread::sleep(Duration::from_millis(600)); // the short box is over
    let _worker = s.worker();
    let what = "the alerts of the trip made while down";
    let done = || s.web.all().len() == 4 && s.smtp.all().len() == 2;
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what}: {:#?}\n{}",
            s.web.all(),
            _worker.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let keys: Vec<String> = s.web.internal_keys().into_iter().collect();
    assert_eq!(
        keys,
        ["rl:{t:t-grow}:key:before", "rl:{t:t-grow}:key:while-down"],
        "once each; the box that ended is not alerted"
    );
    assert_eq!(s.web.to("/tenant/t-grow").len(), 2);
    let audit = audit_entries(&mut con);
    let seen: Vec<(&str, &str)> = audit
        .iter()
        .filter(|e| e["type"] == "trip_seen")
        .map(|e| (e["key"].as_str(), e["source"].as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("rl:{t:t-grow}:key:before", "event"),
            ("rl:{t:t-grow}:key:while-down", "reconcile")
        ]
    );
}

#[test]
fn the_worker_killed_during_a_burst_delivers_every_alert_once() {
    // 10 sends a second per destination: a burst of 30 trips takes 3 s.
    let s = Single::start("burst", ("rate_per_second = 50", "rate_per_second = 10"));
    let mut worker = s.worker();
    let mut con = s.server.client();
    let keys: Vec<String> = (0..40)
        .map(|i| format!("rl:{{t:t-grow}}:key:burst-{i}"))
        .collect();
    for k in &keys[..30] {
        trip(&mut con, k, 2, 3600);
    }
    wait_until(Duration::from_secs(20), "part of the burst", || {
        s.web.to("/tenant/t-grow").len() >= 5
    });
    worker.kill9();
    let at_kill = s.web.to("/tenant/t-grow").len();
    assert!(
        at_kill < 30,
        "killed during the burst ({at_kill} of 30 delivered)"
    );
    for k in &keys[30..] {
        trip(&mut con, k, 2, 3600); // while the worker is down
    }
    let _worker = s.worker();

    // Receivers deduplicate by the delivery id, as documented; then every
    // alert arrived exactly once at each destination.
    let distinct = |reqs: Vec<common::receivers::Request>| -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for r in reqs {
            *m.entry(r.delivery()).or_insert(0) += 1;
        }
        m
    };
    let mails = |smtp: &Smtp| -> HashMap<String, usize> {
        let mut m = HashMap::new();
        for mail in smtp.all() {
            *m.entry(mail.header("Message-ID").unwrap_or_default())
                .or_insert(0) += 1;
        }
        m
    };
    wait_until(Duration::from_secs(40), "every alert of the burst", || {
        distinct(s.web.to("/tenant/t-grow")).len() == 40
            && distinct(s.web.to("/internal")).len() == 40
            && mails(&s.smtp).len() == 40
    });
    std::thread::sleep(Duration::from_millis(1500));
    for (dest, counts) in [
        ("tenant", distinct(s.web.to("/tenant/t-grow"))),
        ("internal", distinct(s.web.to("/internal"))),
        ("email", mails(&s.smtp)),
    ] {
        assert_eq!(counts.len(), 40, "{dest}: 40 alerts");
        // At most the sends in flight at the kill (delivery.concurrency = 2)
        // can arrive twice: sent, but killed before their marker was written.
        let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.len() <= 2 && counts.values().all(|n| *n <= 2),
            "{dest}: resent only what was in flight: {twice:?}"
        );
    }
    let internal_keys: std::collections::HashSet<String> =
        s.web.internal_keys().into_iter().collect();
    assert_eq!(
        internal_keys,
        keys.iter().cloned().collect(),
        "every key of the burst"
    );
}
