//! The operator commands (`boxes`, `trip`, `release`, `audit`) and the
//! configuration check.

mod common;

use common::*;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A server and an rlctl.toml in `fresh_dir(name)` naming it. No worker
/// here: the operator commands need only [redis].
fn server_and_config(name: &str) -> (Server, std::path::PathBuf) {
    let server = Server::start();
    let cfg = fresh_dir(name).join("rlctl.toml");
    std::fs::write(&cfg, format!("[redis]\nurls = [{:?}]\n", server.url())).unwrap();
    (server, cfg)
}

#[test]
fn release_and_trip_leave_audit_entries() {
    let (server, cfg) = server_and_config("ops");
    let key = "rl:{t:t-grow}:key:k-7";
    let mut con = server.client();

    let o = rlctl(
        &cfg,
        &[
            "trip",
            key,
            "--level",
            "2",
            "--for",
            "15m",
            "--reason",
            "leaked key",
            "--by",
            "alice",
        ],
        &[],
    );
    assert!(o.status.success(), "trip: {}", stderr(&o));
    assert!(
        stdout(&o).contains("boxed at level 2 for 15m"),
        "{}",
        stdout(&o)
    );
    let s: Vec<i64> = status(&mut con, key);
    assert_eq!(s[0], 2);
    assert!(s[1] > 890_000 && s[1] <= 900_000, "{s:?}");
    trip(&mut con, "rl:{ip:198.51.100.7}:login", 3, 0);

    let o = rlctl(&cfg, &["boxes", "--json"], &[]);
    assert!(o.status.success(), "boxes: {}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["key"], "rl:{ip:198.51.100.7}:login");
    assert_eq!(
        (rows[0]["level"].as_i64(), rows[0]["ttl_ms"].as_i64()),
        (Some(3), Some(-1))
    );
    assert_eq!(rows[1]["key"], key);
    assert_eq!(
        (rows[1]["tenant"].as_str(), rows[1]["offenses"].as_i64()),
        (Some("t-grow"), Some(1))
    );
    let table = stdout(&rlctl(&cfg, &["boxes"], &[]));
    assert!(
        table.contains("until released by hand") && table.contains("2 active box(es)"),
        "{table}"
    );

    let o = rlctl(
        &cfg,
        &[
            "release",
            key,
            "--reason",
            "customer fixed the retry loop",
            "--by",
            "bob",
        ],
        &[],
    );
    assert!(o.status.success(), "release: {}", stderr(&o));
    assert!(
        stdout(&o).contains("lifted (was level 2)"),
        "{}",
        stdout(&o)
    );
    let s: Vec<i64> = status(&mut con, key);
    assert_eq!((s[0], s[2]), (0, 1), "lifted, the offense kept: {s:?}");
    // the gateways' deny cache of the key's prefix is told
    let version: Option<i64> = redis::cmd("GET")
        .arg("rl:deny:version")
        .query(&mut con)
        .unwrap();
    assert_eq!(version, Some(1), "INCR rl:deny:version");
    // no box: exit 3, nothing changed, nothing recorded
    let o = rlctl(
        &cfg,
        &["release", key, "--reason", "typo?", "--by", "bob"],
        &[],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no active box; nothing changed"),
        "{}",
        stderr(&o)
    );
    assert_eq!(status(&mut con, key), s, "nothing changed");
    assert_eq!(audit_entries(&mut con).len(), 2, "nothing recorded");
    // no box, but offenses: --forget forgets them
    let o = rlctl(
        &cfg,
        &[
            "release", key, "--reason", "again", "--by", "bob", "--forget",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("forgotten"), "{}", stdout(&o));
    let s: Vec<i64> = status(&mut con, key);
    assert_eq!(s, [0, 0, 0, 0], "forgotten");
    let o = rlctl(
        &cfg,
        &["release", key, "--reason", "x", "--by", "bob", "--forget"],
        &[],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing to forget"), "{}", stderr(&o));

    let o = rlctl(&cfg, &["stats", "--json"], &[]);
    assert!(o.status.success(), "stats: {}", stderr(&o));
    let stats: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(stats["rl_box_trips_level2"], 1, "{stats}");
    assert_eq!(stats["rl_box_trips_level3"], 1);
    assert_eq!(stats["rl_box_trips_manual"], 2);
    assert_eq!(
        stats["rl_box_releases"], 1,
        "the FORGET release lifted nothing"
    );

    let audit = audit_entries(&mut con);
    assert_eq!(audit.len(), 3, "{audit:#?}");
    let t = &audit[0];
    assert_eq!(
        (t["type"].as_str(), t["key"].as_str(), t["by"].as_str()),
        ("manual_trip", key, "alice")
    );
    assert_eq!(
        (
            t["reason"].as_str(),
            t["level"].as_str(),
            t["duration_s"].as_str()
        ),
        ("leaked key", "2", "900.000")
    );
    let r = &audit[1];
    assert_eq!(
        (r["type"].as_str(), r["by"].as_str(), r["result"].as_str()),
        ("manual_release", "bob", "lifted")
    );
    assert_eq!(r["reason"], "customer fixed the retry loop");
    assert_eq!(
        (audit[2]["result"].as_str(), audit[2]["forget"].as_str()),
        ("forgotten", "true")
    );

    let o = rlctl(
        &cfg,
        &["audit", "--key", key, "--since", "10m", "--json"],
        &[],
    );
    assert!(o.status.success(), "audit: {}", stderr(&o));
    let entries: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(entries.as_array().unwrap().len(), 3);
    let lines = stdout(&rlctl(
        &cfg,
        &["audit", "--since", "2999-01-01T00:00:00Z"],
        &[],
    ));
    assert!(lines.is_empty(), "nothing after 2999: {lines}");
    let lines = stdout(&rlctl(&cfg, &["audit"], &[]));
    assert!(
        lines.contains("manual_trip") && lines.contains("by=\"alice\""),
        "{lines}"
    );

    // Refused before anything is done: the flag is named.
    for (args, needle) in [
        (
            vec![
                "trip", key, "--level", "4", "--for", "1m", "--reason", "x", "--by", "a",
            ],
            "--level",
        ),
        (
            vec![
                "trip", key, "--level", "1", "--for", "soon", "--reason", "x", "--by", "a",
            ],
            "--for",
        ),
        (
            vec![
                "trip", key, "--level", "1", "--for", "1m", "--reason", " ", "--by", "a",
            ],
            "--reason",
        ),
        (vec!["release", key, "--reason", "x", "--by", ""], "--by"),
        (vec!["audit", "--since", "yesterday"], "--since"),
    ] {
        let o = rlctl(&cfg, &args, &[]);
        assert!(
            !o.status.success() && stderr(&o).contains(needle),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    assert_eq!(
        audit_entries(&mut con).len(),
        3,
        "refused commands write nothing"
    );
}

#[test]
fn a_release_that_cannot_be_audited_lifts_nothing() {
    let (server, cfg) = server_and_config("ops-oom");
    let key = "ledger:{tenant:t-1}:tier-key:key_id=k-1";
    let mut con = server.client();
    trip(&mut con, key, 2, 3600);
    let release = || {
        let args = [
            "release",
            key,
            "--reason",
            "support ticket",
            "--by",
            "carol",
        ];
        rlctl(&cfg, &args, &[])
    };
    let config_set = |con: &mut redis::Connection, name: &str, value: &str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query::<()>(con)
            .unwrap()
    };
    // full: every write that needs memory is refused (noeviction)
    for (name, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        config_set(&mut con, name, value);
    }
    let o = release();
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("not released (nothing changed)") && stderr(&o).contains("OOM"),
        "{}",
        stderr(&o)
    );
    assert_eq!(status(&mut con, key)[0], 2, "the box is still on");
    config_set(&mut con, "maxmemory", "0");
    assert!(audit_entries(&mut con).is_empty());
    let o = release();
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(status(&mut con, key)[0], 0);
    assert_eq!(audit_entries(&mut con).len(), 1);
    let version: i64 = redis::cmd("GET")
        .arg("ledger:deny:version")
        .query(&mut con)
        .unwrap();
    assert_eq!(version, 1, "the gateway prefix of the key");
}

#[test]
fn a_bad_configuration_is_refused_with_the_field_named() {
    let dir = fresh_dir("badconf");
    let good = config_text(
        &["redis://127.0.0.1:1".into()],
        false,
        "http://127.0.0.1:1",
        1,
        "",
    );
    let cfg = dir.join("rlctl.toml");
    std::fs::write(&cfg, &good).unwrap();
    let o = rlctl(&cfg, &["check-config"], &[]);
    assert!(
        o.status.success(),
        "the good configuration passes: {}",
        stderr(&o)
    );
    let o = rlctl(&cfg, &["check-config", "--secrets"], &secrets());
    assert!(o.status.success(), "with its secrets: {}", stderr(&o));
    let o = rlctl(&cfg, &["check-config", "--secrets"], &[]);
    assert!(
        !o.status.success() && stderr(&o).contains("tenants.t-ent.webhook_secret_env"),
        "{}",
        stderr(&o)
    );
    let o = rlctl(&cfg, &["watch"], &[]);
    assert!(
        !o.status.success() && stderr(&o).contains("environment variable"),
        "watch refuses: {}",
        stderr(&o)
    );

    let cases: Vec<(String, &str)> = vec![
        (
            good.replace("tier = \"growth\"", "tier = \"gold\""),
            "tenants.t-grow.tier",
        ),
        (
            good.replace("[tiers.growth]", "[tiers.growth]\nlevel2 = [\"sms\"]"),
            "sms",
        ),
        (
            good.replace("retry_for_ms = 10000", "retry_for_ms = 0"),
            "delivery.retry_for_ms",
        ),
        (
            good.replace("retry_for_ms = 10000", "retry_for_ms = \"long\""),
            "retry_for_ms",
        ),
        (
            good.replace("rate_per_second = 50", "rate_per_secnd = 50"),
            "rate_per_secnd",
        ),
        (
            good.replace("redis://127.0.0.1:1\"]", "http://x\"]"),
            "redis.urls[0]",
        ),
        (
            good.replace("redis://127.0.0.1:1\"]", "rediss://127.0.0.1:1\"]"),
            "redis.urls[0]",
        ),
        (
            good.replace(
                "contacts = [\"dev@sand.test\"]",
                "contacts = [\"not an address\"]",
            ),
            "tenants.t-sand.contacts[0]",
        ),
        (
            good.replace("contacts = [\"dev@sand.test\"]", "contacts = []"),
            "tenants.t-sand.contacts",
        ),
        (
            good.replace("account_owner = \"jane.owner@ops.test\"", ""),
            "tenants.t-ent.account_owner",
        ),
        (
            good.replace("account_owner_routing_key_env = \"PAGER_OWNER_KEY\"", ""),
            "tiers.enterprise.human_review",
        ),
        (
            good.replace(
                "webhook_url = \"http://127.0.0.1:1/internal\"",
                "webhook_url = \"ftp://x\"",
            ),
            "internal.webhook_url",
        ),
        (
            good.replace(
                "guidelines_url =",
                "box_subject = \"{nope}\"\nguidelines_url =",
            ),
            "templates.box_subject",
        ),
        (
            good.replace(
                "[tiers.sandbox]",
                "[tiers.sandbox]\nlevel3 = [\"page_account_owner\"]",
            ),
            "tiers.sandbox.level3",
        ),
        (
            good.clone() + "\n[tiers.unowned]\nlevel2 = [\"email\"]\n",
            "tiers.unowned.level2",
        ),
        (
            good.replace(
                "from = \"rl alerts <alerts@ops.test>\"",
                "from = \"nobody\"",
            ),
            "email.from",
        ),
        (
            good.clone() + "\n[identity]\nkey_patterns = [\"rl:<key_id>\"]\n",
            "identity.key_patterns[0]",
        ),
        (
            good.clone() + "\n[quota]\nthresholds = [80, 120]\n",
            "quota.thresholds[1]",
        ),
        (good.replace("[email]", "[emial]"), "emial"),
    ];
    for (i, (text, field)) in cases.iter().enumerate() {
        let path = dir.join(format!("bad-{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let o = rlctl(&path, &["check-config"], &[]);
        let err = stderr(&o);
        assert!(!o.status.success(), "case {i} ({field}) accepted");
        assert!(
            err.contains(field),
            "case {i}: the error names {field}: {err}"
        );
        assert!(
            err.contains(&format!("bad-{i}.toml")),
            "case {i}: the error names the file: {err}"
        );
    }
    let o = rlctl(&dir.join("missing.toml"), &["boxes"], &[]);
    assert!(
        !o.status.success() && stderr(&o).contains("missing.toml"),
        "{}",
        stderr(&o)
    );
}
