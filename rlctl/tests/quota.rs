//! Quota threshold alerts from the gateway's quota stream.

mod common;

use common::receivers::{Smtp, Webhooks};
use common::*;
use std::time::Duration;

fn reading(con: &mut redis::Connection, fields: &[(&str, &str)]) {
    let mut cmd = redis::cmd("XADD");
    cmd.arg("rl:events:quota").arg("*");
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    let _: String = cmd.query(con).expect("XADD");
}

fn usage(con: &mut redis::Connection, tenant: &str, used: &str) {
    reading(
        con,
        &[
            ("tenant", tenant),
            ("quota", "requests"),
            ("used", used),
            ("limit", "1000"),
            ("period", "2026-12"),
        ],
    );
}

#[test]
fn quota_thresholds_alert_once_per_period() {
    let s = Single::start("quota", ("", ""));
    let (server, web, smtp) = (&s.server, &s.web, &s.smtp);
    let mut con = server.client();
    usage(&mut con, "t-grow", "500"); // before the worker's first start: read too
    let mut worker = s.worker();
    usage(&mut con, "t-grow", "850"); // 80 %
    usage(&mut con, "t-grow", "860");
    reading(
        &mut con,
        &[
            ("tenant", "t-grow"),
            ("quota", "requests"),
            ("limit", "1000"),
            ("period", "2026-12"),
        ],
    );
    usage(&mut con, "t-grow", "1000"); // 100 %: 90 % is passed over
    usage(&mut con, "t-grow", "950"); // lower than what was alerted: nothing
    usage(&mut con, "t-sand", "900"); // 90 %

    let done = |web: &Webhooks, smtp: &Smtp| {
        web.to("/tenant/t-grow").len() == 2
            && web.to("/tenant/t-sand").len() == 1
            && smtp.all().len() == 3
    };
    wait_until(Duration::from_secs(20), "the quota alerts", || {
        done(web, smtp)
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(done(web, smtp), "no more: {:#?}", web.all());
    assert!(
        web.to("/internal").is_empty(),
        "quota alerts go to the tier's quota destinations only"
    );

    let grow: Vec<serde_json::Value> = web.to("/tenant/t-grow").iter().map(|r| r.json()).collect();
    let thresholds: Vec<i64> = grow
        .iter()
        .map(|j| j["threshold"].as_i64().unwrap())
        .collect();
    assert_eq!(thresholds, [80, 100]);
    assert_eq!(grow[0]["type"], "rl.quota");
    assert_eq!(grow[0]["alert_id"], "quota:t-grow:requests:2026-12:80");
    assert_eq!(
        (grow[0]["used"].as_i64(), grow[0]["limit"].as_i64()),
        (Some(850), Some(1000))
    );
    assert!(web
        .to("/tenant/t-grow")
        .iter()
        .all(|r| signature_ok(r, "growth-secret")));
    let mail = smtp
        .all()
        .into_iter()
        .find(|m| m.to == ["dev@sand.test"])
        .expect("sandbox email");
    assert!(
        mail.header("Subject")
            .unwrap()
            .contains("90% of its requests quota"),
        "{}",
        mail.data
    );
    let log = worker.log_text();
    let bad = log.lines().find(|l| l.contains("quota reading not used"));
    assert!(
        bad.is_some_and(|l| l.contains("used") && l.contains("missing")),
        "the bad entry is logged with its field:\n{log}"
    );

    let audit = audit_entries(&mut con);
    let seen: Vec<&str> = audit
        .iter()
        .filter(|e| e["type"] == "quota_seen")
        .map(|e| e["alert_id"].as_str())
        .collect();
    assert_eq!(
        seen,
        [
            "quota:t-grow:requests:2026-12:80",
            "quota:t-grow:requests:2026-12:100",
            "quota:t-sand:requests:2026-12:90"
        ]
    );
    let pending: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg("rl:events:quota")
        .arg("rlctl")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        pending.first(),
        Some(&redis::Value::Int(0)),
        "every entry acknowledged: {pending:?}"
    );

    // A restart reads nothing again and sends nothing again.
    worker.kill9();
    let _worker = s.worker();
    usage(&mut con, "t-grow", "1000");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(done(web, smtp), "nothing resent: {:#?}", web.all());
}

fn xreadgroup_calls(con: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_xreadgroup:calls="))
        .and_then(|v| v.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_garbage_marker_and_a_pending_entry_do_not_stop_the_stream() {
    let s = Single::start("quota-garbage", ("", ""));
    let mut con = s.server.client();
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg("rl:events:quota")
        .arg("rlctl")
        .arg("0")
        .arg("MKSTREAM")
        .query(&mut con)
        .expect("XGROUP CREATE");
    let _: () = redis::cmd("SET")
        .arg("rlctl:quota:t-grow:requests:2026-12")
        .arg("garbage")
        .query(&mut con)
        .expect("SET");
    usage(&mut con, "t-grow", "850");
    // Read by the worker's consumer and not acknowledged: a crash after the read.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("rlctl")
        .arg("watch")
        .arg("STREAMS")
        .arg("rl:events:quota")
        .arg(">")
        .query(&mut con)
        .expect("XREADGROUP");
    let _worker = s.worker();
    usage(&mut con, "t-sand", "900");
    wait_until(Duration::from_secs(20), "both alerts", || {
        s.web.to("/tenant/t-sand").len() == 1 && s.web.to("/tenant/t-grow").len() == 1
    });
    let before = xreadgroup_calls(&mut con);
    std::thread::sleep(Duration::from_secs(2));
    let calls = xreadgroup_calls(&mut con) - before;
    assert!(
        calls <= 20,
        "the reader blocks between readings: {calls} reads in 2 s"
    );
    let marker: String = redis::cmd("GET")
        .arg("rlctl:quota:t-grow:requests:2026-12")
        .query(&mut con)
        .unwrap();
    assert_eq!(marker, "80");
    let pending: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg("rl:events:quota")
        .arg("rlctl")
        .query(&mut con)
        .unwrap();
    assert_eq!(pending.first(), Some(&redis::Value::Int(0)), "{pending:?}");
}
