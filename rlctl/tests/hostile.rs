//! What a receiver or what is stored in Redis cannot make rlctl do: follow
//! a webhook's redirect to another address; stop every retry with one
//! record of the wrong type; print a key name that drives the terminal,
//! or a password in a Redis URL.

mod common;

use common::receivers::{Fail, Webhooks};
use common::*;
use std::time::Duration;

#[test]
fn a_webhook_redirect_is_a_failed_attempt_not_followed() {
    let s = Single::start("redirect", ("", ""));
    let internal = Webhooks::start();
    let admin = format!("{}/admin", internal.base);
    s.web.redirect("/tenant/t-grow", &admin);
    let worker = s.worker();
    let mut con = s.server.client();
    trip(&mut con, "rl:{t:t-grow}:key:k-redir", 2, 3600);
    wait_until(Duration::from_secs(20), "attempts at the tenant", || {
        s.web.to("/tenant/t-grow").len() >= 2
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        internal.all().is_empty(),
        "the redirect's target is never called: {:?}",
        internal.all()
    );
    let log = worker.log_text();
    assert!(
        log.lines().any(|l| l.contains("delivery attempt failed")
            && l.contains("307")
            && l.contains("redirects are not followed")),
        "{log}"
    );
    let o = rlctl(&s.cfg, &["undelivered", "--json"], &[]);
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pending = listed["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{listed}");
    let last = pending[0]["last_error"].as_str().unwrap();
    assert!(last.contains("307") && !last.contains("admin"), "{listed}");
}

#[test]
fn a_wrong_type_retry_record_blocks_nothing_else() {
    let s = Single::start("poison", ("", ""));
    let mut con = s.server.client();
    let _: () = redis::cmd("ZADD")
        .arg("rlctl:retries")
        .arg(1)
        .arg("poison/internal")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("rlctl:retry:poison/internal")
        .arg("a")
        .arg("b")
        .query(&mut con)
        .unwrap();
    let o = rlctl(&s.cfg, &["undelivered", "--json"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let pending = listed["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{listed}");
    assert_eq!(pending[0]["delivery"], "poison/internal");
    assert!(pending[0]["unreadable"]
        .as_str()
        .is_some_and(|w| w.contains("WRONGTYPE")));
    let o = rlctl(&s.cfg, &["undelivered"], &[]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("poison/internal unreadable record"), "{text}");

    s.web.fail(
        "/tenant/t-grow",
        Fail {
            status: 503,
            times: 2,
        },
    );
    let worker = s.worker();
    trip(&mut con, "rl:{t:t-grow}:key:k-poison", 2, 3600);
    wait_until(Duration::from_secs(20), "the retried delivery", || {
        s.web.to("/tenant/t-grow").len() == 3
    });
    let due: Option<f64> = redis::cmd("ZSCORE")
        .arg("rlctl:retries")
        .arg("poison/internal")
        .query(&mut con)
        .unwrap();
    assert_eq!(due, None, "dropped from the schedule");
    assert!(worker.log_text().contains("cannot be read"));
}

#[test]
fn boxes_prints_key_names_escaped() {
    let s = Single::start("boxes-escape", ("", ""));
    let mut con = s.server.client();
    let forged = "rl:\x1b[31mred\x1b[0m\r\nrl:{t:t-grow}:key:fake  3      until released by hand";
    trip(&mut con, forged, 2, 3600);
    let o = rlctl(&s.cfg, &["boxes"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        !table.contains('\x1b') && !table.contains('\r'),
        "{table:?}"
    );
    assert_eq!(table.lines().count(), 3, "header, one row, count: {table}");
    assert!(
        table.contains("rl:\\u{1b}[31mred\\u{1b}[0m\\r\\nrl:"),
        "{table}"
    );
}

#[test]
fn redis_credentials_are_not_printed() {
    let dir = fresh_dir("redact");
    let cfg = dir.join("rlctl.toml");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port(); // closed once dropped: nothing listens there
    std::fs::write(
        &cfg,
        format!("[redis]\nurls = [\"redis://admin:hunter2@127.0.0.1:{port}\"]\ntimeout_ms = 300\n"),
    )
    .unwrap();
    let o = rlctl(&cfg, &["boxes"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        !err.contains("hunter2") && err.contains("redis://***@127.0.0.1"),
        "{err}"
    );
}
