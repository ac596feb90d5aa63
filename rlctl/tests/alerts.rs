//! Every level and tier reaches the right destinations, with the right
//! content and signature; one server, one worker.

mod common;

use common::receivers::{Smtp, Webhooks};
use common::*;
use std::time::Duration;

#[test]
fn levels_and_tiers_reach_their_destinations() {
    let s = Single::start("levels", ("", ""));
    let (server, web, smtp) = (&s.server, &s.web, &s.smtp);
    let _worker = s.worker();
    let mut con = server.client();

    trip(&mut con, "rl:{t:t-grow}:key:k-1", 1, 300); // level 1: no alert
    trip(&mut con, "rl:{t:t-grow}:key:k-2", 2, 3600);
    trip(&mut con, "rl:{t:t-grow}:key:k-3", 3, 0); // manual: suspended
    trip(&mut con, "ledger:{ip:203.0.113.50}:stuffing-ip", 3, 86400); // timed: a ban
    trip(&mut con, "rl:{t:t-ent}:key:k-9", 3, 0); // manual
    trip(&mut con, "rl:{auth:ip:203.0.113.9}", 2, 900); // no tenant

    // An automatic trip by RL.TAKE ... STRIKES at level 2: a first offense
    // (a manual box, released), then an early retry trips the second.
    let sand = "rl:{t:t-sand}:key:k-5";
    trip(&mut con, sand, 1, 0);
    let _: i64 = redis::cmd("RL.BOX")
        .arg("RELEASE")
        .arg(sand)
        .query(&mut con)
        .unwrap();
    let take = |con: &mut redis::Connection| -> Vec<i64> {
        redis::cmd("RL.TAKE")
            .arg(sand)
            .arg(1)
            .arg(1)
            .arg(600)
            .arg("STRIKES")
            .arg(1)
            .arg(60)
            .query(con)
            .unwrap()
    };
    assert_eq!(take(&mut con)[0], 1);
    // The first refusal announces a retry; retrying before it is the
    // strike that trips the box.
    assert_eq!(take(&mut con)[0], 0);
    let tripped = take(&mut con);
    assert_eq!(
        (tripped[0], tripped[5]),
        (-1, 2),
        "the automatic trip is a level-2 box: {tripped:?}"
    );

    let expected = |web: &Webhooks, smtp: &Smtp| {
        web.to("/tenant/t-grow").len() == 1
            && web.to("/tenant/t-sand").len() == 1
            && web.to("/internal").len() == 6
            && web.to("/pager").len() == 4
            && smtp.all().len() == 2
    };
    wait_until(Duration::from_secs(20), "the alerts of every trip", || {
        expected(web, smtp)
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        expected(web, smtp),
        "nothing more arrives: {:#?}",
        web.all()
    );
    assert!(
        web.to("/tenant/t-ent").is_empty(),
        "an Enterprise level 3 does not go to the tenant"
    );

    // The tenant's webhook: signed with its secret, no Redis key name.
    let grow = &web.to("/tenant/t-grow")[0];
    assert!(
        signature_ok(grow, "growth-secret"),
        "tenant signature: {:?}",
        grow.headers
    );
    assert!(!signature_ok(grow, "internal-secret"));
    let j = grow.json();
    assert_eq!(j["type"], "rl.box");
    assert_eq!(j["level"], 2);
    assert_eq!(j["tenant"], "t-grow");
    assert_eq!(j["key_id"], "k-2");
    assert_eq!(j["tier"], "growth");
    assert_eq!(j["offenses"], 1);
    assert_eq!(j["guidelines_url"], "https://docs.test/backoff");
    assert!(j["ttl_ms"].as_i64().unwrap() > 3_500_000);
    assert!(
        j.get("key").is_none(),
        "the tenant does not see Redis key names: {j}"
    );
    assert!(
        grow.delivery().ends_with("/tenant_webhook"),
        "{}",
        grow.delivery()
    );
    // Ids are opaque: neither the body nor the delivery id names the key.
    let trip_id = j["trip_id"].as_str().unwrap();
    assert!(
        trip_id.len() == 32 && trip_id.chars().all(|c| c.is_ascii_hexdigit()),
        "{trip_id}"
    );
    assert_eq!(grow.delivery(), format!("{trip_id}/tenant_webhook"));
    assert!(
        !grow.body.contains("rl:{") && !grow.body.contains("k-2#"),
        "{}",
        grow.body
    );
    let j = web.to("/tenant/t-sand")[0].json();
    assert_eq!(
        (j["level"].as_i64(), j["key_id"].as_str()),
        (Some(2), Some("k-5"))
    );

    // The internal webhook: one per level-2 and level-3 trip, with the key.
    let internal = web.to("/internal");
    assert!(internal.iter().all(|r| signature_ok(r, "internal-secret")));
    let mut keys: Vec<String> = internal
        .iter()
        .map(|r| r.json()["key"].as_str().unwrap().to_string())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "ledger:{ip:203.0.113.50}:stuffing-ip",
            "rl:{auth:ip:203.0.113.9}",
            "rl:{t:t-ent}:key:k-9",
            "rl:{t:t-grow}:key:k-2",
            "rl:{t:t-grow}:key:k-3",
            "rl:{t:t-sand}:key:k-5"
        ]
    );

    // Pages: Events API v2; the Enterprise rule pages on-call and the account owner.
    let pages: Vec<serde_json::Value> = web.to("/pager").iter().map(|r| r.json()).collect();
    for p in &pages {
        assert_eq!(p["event_action"], "trigger");
        assert_eq!(p["payload"]["severity"], "critical");
        assert_eq!(p["payload"]["source"], "rlctl");
        assert_eq!(p["payload"]["custom_details"]["level"], 3);
        let trip_id = p["payload"]["custom_details"]["trip_id"].as_str().unwrap();
        assert!(p["dedup_key"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{trip_id}:page")));
    }
    let ent: Vec<&serde_json::Value> = pages
        .iter()
        .filter(|p| p["payload"]["component"] == "rl:{t:t-ent}:key:k-9")
        .collect();
    let mut routing: Vec<&str> = ent
        .iter()
        .map(|p| p["routing_key"].as_str().unwrap())
        .collect();
    routing.sort();
    assert_eq!(routing, ["oncall-routing-key", "owners-routing-key"]);
    for p in &ent {
        let d = &p["payload"]["custom_details"];
        assert_eq!(
            d["automatic_suspension"], false,
            "Enterprise: never an automatic suspension"
        );
        assert_eq!(d["account_owner"], "jane.owner@ops.test");
        assert_eq!(d["ttl_ms"], -1);
    }
    let owner_page = ent
        .iter()
        .find(|p| p["routing_key"] == "owners-routing-key")
        .unwrap();
    assert_eq!(
        owner_page["payload"]["custom_details"]["notify"],
        "jane.owner@ops.test"
    );
    let grow_page = pages
        .iter()
        .find(|p| p["payload"]["component"] == "rl:{t:t-grow}:key:k-3")
        .unwrap();
    assert_eq!(grow_page["routing_key"], "oncall-routing-key");
    assert_eq!(
        grow_page["payload"]["custom_details"]["automatic_suspension"],
        true
    );
    assert!(grow_page["payload"]["custom_details"]["action"]
        .as_str()
        .unwrap()
        .starts_with("suspended pending review"));
    // A timed level-3 box of a source (stuffing): the IP to ban, no suspension.
    let ban = pages
        .iter()
        .find(|p| p["payload"]["component"] == "ledger:{ip:203.0.113.50}:stuffing-ip")
        .unwrap();
    let d = &ban["payload"]["custom_details"];
    assert_eq!(d["offender"], serde_json::json!({"ip": "203.0.113.50"}));
    assert_eq!(d["automatic_suspension"], false);
    assert!(
        d["action"]
            .as_str()
            .unwrap()
            .starts_with("ban source IP 203.0.113.50 for 1day"),
        "{d}"
    );
    let internal_ban = internal
        .iter()
        .map(|r| r.json())
        .find(|j| j["key"] == "ledger:{ip:203.0.113.50}:stuffing-ip")
        .unwrap();
    assert_eq!(
        (
            internal_ban["offender"]["ip"].as_str(),
            internal_ban["level"].as_i64()
        ),
        (Some("203.0.113.50"), Some(3))
    );

    // Emails: to the tenant's contacts, from the configured sender.
    let mails = smtp.all();
    let grow_mail = mails
        .iter()
        .find(|m| m.to.iter().any(|t| t == "ops@grow.test"))
        .expect("growth email");
    let mut to = grow_mail.to.clone();
    to.sort();
    assert_eq!(to, ["cto@grow.test", "ops@grow.test"]);
    assert_eq!(grow_mail.from, "alerts@ops.test");
    let subject = grow_mail.header("Subject").unwrap();
    assert!(
        subject.contains("k-2") && subject.contains("Growth Co") && subject.contains("level 2"),
        "{subject}"
    );
    assert!(
        grow_mail.data.contains("https://docs.test/backoff"),
        "{}",
        grow_mail.data
    );
    assert!(
        grow_mail.data.contains("Time left: 1h."),
        "{}",
        grow_mail.data
    );
    assert!(mails.iter().any(|m| m.to == ["dev@sand.test"]));

    // The audit trail: every trip seen, every delivery and its result.
    let audit = audit_entries(&mut con);
    let seen: Vec<&str> = audit
        .iter()
        .filter(|e| e["type"] == "trip_seen")
        .map(|e| e["key"].as_str())
        .collect();
    for key in [
        "rl:{t:t-grow}:key:k-1",
        "rl:{t:t-grow}:key:k-2",
        "rl:{t:t-ent}:key:k-9",
        "rl:{t:t-sand}:key:k-5",
    ] {
        assert!(seen.contains(&key), "trip_seen {key}: {seen:?}");
    }
    let sent: Vec<_> = audit
        .iter()
        .filter(|e| e["type"] == "delivery" && e["result"] == "sent")
        .collect();
    assert_eq!(sent.len(), 14, "14 deliveries sent: {sent:#?}");
    assert!(sent.iter().all(|e| e["attempts"] == "1"));
    assert!(
        !audit.iter().any(|e| e
            .values()
            .any(|v| v.contains("secret") || v.contains("routing-key"))),
        "no secret in the audit trail"
    );
}

#[test]
fn the_kill_switch_is_alerted_with_who_and_why() {
    let s = Single::start("killswitch", ("", ""));
    let (server, web, smtp, cfg) = (&s.server, &s.web, &s.smtp, &s.cfg);
    let _worker = s.worker();
    let key = "rl:{t:t-ent}:key:k-1";
    let args = [
        "trip",
        key,
        "--level",
        "3",
        "--for",
        "manual",
        "--reason",
        "leaked key",
        "--by",
        "alice",
    ];
    let o = rlctl(cfg, &args, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_until(
        Duration::from_secs(20),
        "the pages and the internal alert",
        || web.to("/pager").len() == 2 && web.to("/internal").len() == 1,
    );
    for p in web.to("/pager") {
        let d = &p.json()["payload"]["custom_details"];
        assert_eq!(
            (
                d["tripped_by"]["by"].as_str(),
                d["tripped_by"]["reason"].as_str()
            ),
            (Some("alice"), Some("leaked key"))
        );
        assert_eq!(d["ttl_ms"], -1);
    }
    let internal = web.to("/internal")[0].json();
    assert_eq!(internal["tripped_by"]["by"], "alice");
    assert!(
        web.to("/tenant/t-ent").is_empty() && smtp.all().is_empty(),
        "level 3: no tenant alert"
    );

    let o = rlctl(
        cfg,
        &["release", key, "--reason", "key rotated", "--by", "bob"],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut con = server.client();
    wait_until(
        Duration::from_secs(10),
        "the release seen by the worker",
        || {
            audit_entries(&mut con)
                .iter()
                .any(|e| e["type"] == "release_seen")
        },
    );
    let audit = audit_entries(&mut con);
    let kinds: Vec<&str> = audit
        .iter()
        .map(|e| e["type"].as_str())
        .filter(|t| !t.starts_with("watch_"))
        .collect();
    for kind in [
        "manual_trip",
        "trip_seen",
        "alert",
        "delivery",
        "manual_release",
        "release_seen",
    ] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
    let seen = audit.iter().find(|e| e["type"] == "trip_seen").unwrap();
    assert_eq!(
        (seen["by"].as_str(), seen["reason"].as_str()),
        ("alice", "leaked key")
    );
    let note: Option<String> = redis::cmd("GET")
        .arg(format!("rlctl:note:{key}"))
        .query(&mut con)
        .unwrap();
    assert_eq!(note, None, "the note is taken with the trip");
}
