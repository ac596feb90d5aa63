//! What a receiver or what is stored in Redis cannot make rlctl do: follow
//! a webhook's redirect to another address.

mod common;

use common::receivers::Webhooks;
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
