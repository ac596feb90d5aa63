//! End to end: the usage dashboard of a rule policy (`resty.rl.report.usage`,
//! gateway/README.md "The usage dashboard"): `GET /_rl/usage` after known
//! traffic (every field and value), only the calling key's usage (401
//! without a valid key, another key's numbers never shown), no Redis
//! command beyond the rules' own on ordinary requests and no write at all
//! from a usage report, and `/_rl/dashboard` in headless Chromium
//! (Debian's `chromium`, installed by `.ci/deps`; the test fails when it
//! is missing): the page's script runs, its numbers are the JSON's and its
//! SVG chart is drawn; a screenshot is kept in `target/test-artifacts/`.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;
#[path = "common/gateway_usage.rs"]
mod gateway_usage;

use common::Server;
use gateway::{agent, get, Resp};
use gateway_policy::start;
use gateway_usage::{
    chromium_dom, chromium_screenshot, commandstats, element, info_int, policy_names, series_total,
    settled, traffic, traffic_on, usage, usage_gateway, variant, POLICY,
};
use serde_json::Value;
use std::time::Duration;

#[test]
fn usage_reports_the_callers_numbers_and_only_its_own() {
    let redis = Server::start(&[]);
    let gw = usage_gateway(&redis);

    // 25 requests of key A: 20 admitted (the burst), 5 throttled
    let st = traffic(&gw, "key-a", 25);
    assert_eq!(st.iter().filter(|s| **s == 200).count(), 20, "{st:?}");
    assert_eq!(st.iter().filter(|s| **s == 429).count(), 5, "{st:?}");

    let u = settled(&gw, "key-a", 20, 5);
    let r = usage(&gw, Some("key-a"), "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.must("Cache-Control"), "no-store");
    assert_eq!(r.must("Content-Type"), "application/json");
    assert_eq!(u["key_id"], "a1");
    assert_eq!(u["tenant"], "ta");
    assert_eq!(u["tier"], "dev");
    // the per-IP window is not the key's: not shown
    assert_eq!(
        policy_names(&u),
        ["dev-monthly", "dev-key", "dev-tenant"],
        "{u}"
    );
    // each bucket of the command probed on its own
    assert_eq!(
        (&u["policies"][2]["used"], &u["policies"][2]["left"]),
        (&Value::from(20), &Value::from(10)),
        "{u}"
    );
    // all 25 within the last 10 s (they took well under 9 s)
    assert_eq!(u["rate"]["requests_per_second"].as_f64(), Some(2.5), "{u}");
    assert_eq!(u["rate"]["window_seconds"], 10);
    assert_eq!(u["rate"]["node"], true);
    // (settled: the series holds the 20 admitted and 5 refused)
    let series = &u["rate"]["series"];
    assert_eq!(series["admitted"].as_array().map(Vec::len), Some(60));
    assert_eq!(series["refused"].as_array().map(Vec::len), Some(60));
    assert_eq!(series["seconds"], 60);
    // the tightest bucket: the key's (0 of 20 left), not the tenant's (10 of 30)
    assert_eq!(u["burst"]["policy"], "dev-key");
    assert_eq!(
        (
            &u["burst"]["limit"],
            &u["burst"]["used"],
            &u["burst"]["left"]
        ),
        (&Value::from(20), &Value::from(20), &Value::from(0)),
        "{u}"
    );
    // the refused requests gave their quota point back (REFUND)
    let q = &u["quota"];
    assert_eq!(q["policy"], "dev-monthly");
    assert_eq!(q["period"], "MONTH");
    assert_eq!(
        (q["limit"].as_i64(), q["used"].as_i64()),
        (Some(1000), Some(20)),
        "{q}"
    );
    assert_eq!(q["left"], 980);
    // the month by day (the per-day counters, refunds included): every day
    // so far, today's 20 points, nothing before (a fresh Redis)
    let today = u["now"].as_str().expect("now")[..10].to_string();
    let days = q["days"].as_array().expect("days");
    assert_eq!(days[0]["date"].as_str().map(|d| &d[8..]), Some("01"), "{q}");
    assert_eq!(
        days.last().map(|d| &d["date"]),
        Some(&Value::from(today.clone()))
    );
    assert_eq!(
        days.last().map(|d| &d["used"]),
        Some(&Value::from(20)),
        "{q}"
    );
    let total: u64 = days.iter().filter_map(|d| d["used"].as_u64()).sum();
    assert_eq!(total, 20, "{q}");
    assert_eq!(q["started_at"], format!("{}01T00:00:00Z", &today[..8]));
    // the month's average pace (points a day)
    assert!(q["forecast"]["per_day"].as_u64().is_some(), "{q}");
    assert!(
        q["resets_in_seconds"].as_i64().is_some_and(|s| s > 0),
        "{q}"
    );
    // today's counter: in the quota key's hash slot, expiring with the month
    let mut con = redis.client();
    let day_key = format!("use:{{tenant:ta}}:tier-monthly:day={today}");
    let probe: Vec<i64> = redis::cmd("RL.QUOTA")
        .arg(&day_key)
        .arg("1000000000000000")
        .arg("MONTH")
        .arg("COST")
        .arg(0)
        .query(&mut con)
        .expect("probe the day counter");
    assert_eq!(probe[2], 1_000_000_000_000_000 - 20, "{probe:?}");
    let mut expiry = |k: &str| -> i64 {
        redis::cmd("PEXPIRETIME")
            .arg(k)
            .query(&mut con)
            .expect("PEXPIRETIME")
    };
    let month_end = expiry("use:{tenant:ta}:tier-monthly");
    assert!(month_end > 0);
    assert_eq!(expiry(&day_key), month_end);
    // 980 left at 20 admitted a minute: 2940 s, unless the month ends first
    let resets_in = u["policies"][0]["resets_in_seconds"]
        .as_i64()
        .expect("resets_in");
    if resets_in > 2940 {
        assert_eq!(q["seconds_to_exhaustion"], 2940, "{q}");
        assert!(q["exhausted_at"].is_string(), "{q}");
    } else {
        assert!(q["seconds_to_exhaustion"].is_null(), "{q}");
    }
    assert_eq!(u["refusals"]["total"], 5);
    assert_eq!(
        u["refusals"]["by_reason"],
        serde_json::json!({ "throttled": 5 })
    );
    assert_eq!(u["box"]["state"], "none");
    assert_eq!(u["box"]["level"], 0);
    assert_eq!(u["box"]["policy"], "dev-key");
    // the penalty state is the rule's first key's
    assert_eq!(u["policies"][1]["box"]["state"], "none", "{u}");
    assert!(u["policies"][2]["box"].is_null(), "{u}");

    // key B (another tenant) sees its own, untouched numbers, never A's,
    // whatever it asks for in the query string
    for query in ["", "?key_id=a1", "?tenant=ta&key=key-a"] {
        let b = usage(&gw, Some("key-b"), query).json();
        assert_eq!(b["key_id"], "b1", "{b}");
        assert_eq!(b["burst"]["used"], 0, "{b}");
        assert_eq!(b["quota"]["used"], 0, "{b}");
        assert_eq!(b["rate"]["requests_per_second"].as_f64(), Some(0.0), "{b}");
        assert_eq!(b["refusals"]["total"], 0, "{b}");
        assert!(
            !b.to_string().contains("a1") && !b.to_string().contains("\"ta\""),
            "{b}"
        );
    }
    // no key, an unknown key, a JWT-looking header: 401 and nothing of anyone's
    for key in [None, Some("nope"), Some("")] {
        let r = usage(&gw, key, "?key_id=a1");
        assert_eq!(r.status, 401, "{key:?}: {}", r.body);
        assert!(
            !r.body.contains("a1") && !r.body.contains("dev-"),
            "{}",
            r.body
        );
    }
    let r = get(
        &agent(),
        &format!("{}/_rl/usage", gw.url(0)),
        &[("Authorization", "Bearer a.b.c")],
    );
    assert_eq!(r.status, 401, "{}", r.body);

    // a box tripped by hand shows, with its level and end
    let _: Value = redis::cmd("RL.BOX")
        .arg("TRIP")
        .arg("use:{tenant:tc}:tier-key:key_id=c1")
        .arg(2)
        .arg(600)
        .query::<redis::Value>(&mut con)
        .map(|_| Value::Null)
        .expect("RL.BOX TRIP");
    let c = usage(&gw, Some("key-c"), "").json();
    assert_eq!(c["box"]["state"], "boxed", "{c}");
    assert_eq!(c["box"]["level"], 2, "{c}");
    let left = c["box"]["retry_after_seconds"]
        .as_i64()
        .expect("retry_after");
    assert!((590..=600).contains(&left), "{c}");
    assert!(c["box"]["ends_at"].is_string(), "{c}");
    assert_eq!(c["policies"][1]["boxed"], true, "{c}");

    // reports are capped per key and node: 10 a second
    let a = agent();
    let url = format!("{}/_rl/usage", gw.url(0));
    let burst: Vec<Resp> = (0..25)
        .map(|_| get(&a, &url, &[("X-Api-Key", "key-c")]))
        .collect();
    assert!(burst.iter().all(|r| r.status == 200 || r.status == 429));
    let capped: Vec<&Resp> = burst.iter().filter(|r| r.status == 429).collect();
    assert!(!capped.is_empty(), "25 reports in a burst, none capped");
    assert_eq!(capped[0].must("Retry-After"), "1");

    // usage = false: no endpoint, the policy itself unchanged
    for page in ["usage", "dashboard"] {
        let r = get(
            &a,
            &format!("{}/_rl/{page}", gw.url(1)),
            &[("X-Api-Key", "key-a")],
        );
        assert_eq!(r.status, 404, "{page}: {}", r.body);
    }
    assert_eq!(traffic_on(&gw, 1, "key-a", 1), [200]);
    // ... and no per-day counter
    let off: Vec<String> = redis::cmd("KEYS")
        .arg("off:*")
        .query(&mut con)
        .expect("KEYS");
    assert!(off.iter().any(|k| k.ends_with("tier-monthly")), "{off:?}");
    assert!(!off.iter().any(|k| k.contains(":day=")), "{off:?}");
    // no counters dict: the Redis numbers only, rate and refusals null
    assert_eq!(traffic_on(&gw, 2, "key-a", 1), [200]);
    let r = get(
        &a,
        &format!("{}/_rl/usage", gw.url(2)),
        &[("X-Api-Key", "key-a")],
    );
    let n = r.json();
    assert_eq!(r.status, 200, "{n}");
    assert!(n["rate"].is_null() && n["refusals"].is_null(), "{n}");
    assert_eq!(n["burst"]["used"], 1, "{n}");
    // a bad `usage` stops nginx with the option named
    let err = start(
        redis.port,
        &[variant("{ dict = 5 }", "bad")],
        &[("usage_policy.lua", POLICY)],
    )
    .err()
    .expect("a bad usage option is refused");
    assert!(err.contains("usage must be false or"), "{err}");
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

#[test]
fn ordinary_requests_send_only_their_rules_commands_and_usage_writes_nothing() {
    let redis = Server::start(&[]);
    let gw = usage_gateway(&redis);
    // warm up: connections, the deny cache pollers
    traffic(&gw, "key-b", 1);
    let before = commandstats(&redis);
    let dirty = info_int(&redis, "persistence", "rdb_changes_since_last_save");
    let offset = info_int(&redis, "replication", "master_repl_offset");
    let st = traffic(&gw, "key-b", 10);
    assert!(st.iter().all(|s| *s == 200), "{st:?}");
    let after = commandstats(&redis);
    let dirty_after = info_int(&redis, "persistence", "rdb_changes_since_last_save");
    // exactly one command per rule and request; reads and connection
    // setup aside (the test's INFO and CLIENT SETINFO, the deny cache's
    // version GET), nothing else reached Redis
    let ignored = ["info", "get", "client", "hello", "ping"];
    let mut changed: Vec<(String, u64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(k, d)| *d > 0 && !ignored.contains(&k.as_str()))
        .collect();
    changed.sort();
    let want: Vec<(String, u64)> = ["rl.quota", "rl.take", "rl.window"]
        .iter()
        .map(|c| (c.to_string(), 10))
        .collect();
    assert_eq!(changed, want);
    // the rules' own writes are seen by the counter used below
    assert!(dirty_after > dirty, "{dirty} -> {dirty_after}");

    // usage reports (and the dashboard page) write nothing at all
    let before = commandstats(&redis);
    let mut days = 0;
    for _ in 0..5 {
        let r = usage(&gw, Some("key-b"), "");
        assert_eq!(r.status, 200);
        days = r.json()["quota"]["days"].as_array().map_or(0, Vec::len) as u64;
    }
    assert!(days >= 1);
    let page = get(&agent(), &format!("{}/_rl/dashboard", gw.url(0)), &[]);
    assert_eq!(page.status, 200);
    let after = commandstats(&redis);
    assert_eq!(
        info_int(&redis, "persistence", "rdb_changes_since_last_save"),
        dirty_after
    );
    assert_eq!(
        info_int(&redis, "replication", "master_repl_offset"),
        offset
    );
    // the probes did run: 5 reports, two buckets, one quota and one per
    // day of the month so far, one box status each
    let delta = |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
    assert_eq!(
        (delta("rl.take"), delta("rl.quota"), delta("rl.box")),
        (10, 5 * (1 + days), 5)
    );
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

#[test]
fn the_dashboard_page_shows_the_usage_numbers_and_a_chart_in_chromium() {
    let redis = Server::start(&[]);
    let gw = usage_gateway(&redis);
    let st = traffic(&gw, "key-a", 23);
    assert_eq!(st.iter().filter(|s| **s == 429).count(), 3, "{st:?}");
    let before = settled(&gw, "key-a", 20, 3);
    // the key in the fragment: never sent to the server, dropped from the address bar
    let url = format!("{}/_rl/dashboard#key=key-a", gw.url(0));
    let dom = chromium_dom(&url);
    let after = usage(&gw, Some("key-a"), "").json();
    assert!(
        dom.contains("data-loaded=\"1\""),
        "the script did not load usage:\n{}",
        dom.split("<script>").next().unwrap_or(&dom)
    );
    let val = |id: &str| element(&dom, id).map(|(v, _)| v);
    let txt = |id: &str| element(&dom, id).map(|(_, t)| t);
    // each number's raw value, and its text in the browser's locale
    // (headless Chromium's: en-US, thousands separated by commas)
    for (id, want) in [
        ("burst-used", &after["burst"]["used"]),
        ("burst-left", &after["burst"]["left"]),
        ("burst-limit", &after["burst"]["limit"]),
        ("quota-used", &after["quota"]["used"]),
        ("quota-limit", &after["quota"]["limit"]),
        ("quota-left", &after["quota"]["left"]),
        ("refusals-total", &after["refusals"]["total"]),
    ] {
        let n = want.as_u64().unwrap_or_else(|| panic!("{id}: {want}"));
        assert_eq!(val(id), Some(n.to_string()), "{id}");
        assert_eq!(txt(id), Some(en_us(n)), "{id}");
    }
    assert_eq!(val("burst-used").as_deref(), Some("20"));
    assert_eq!(val("quota-used").as_deref(), Some("20"));
    assert_eq!(txt("quota-limit").as_deref(), Some("1,000"));
    assert_eq!(txt("quota-left").as_deref(), Some("980"));
    assert_eq!(txt("quota-share").as_deref(), Some("2%"));
    assert_eq!(val("refusals-total").as_deref(), Some("3"));
    assert_eq!(val("box-state").as_deref(), Some("none"));
    assert_eq!(txt("box-state").as_deref(), Some("Not boxed"));
    // words, not raw periods, ISO times or seconds
    assert!(dom.contains("data-quota=\"yes\""), "{dom}");
    assert!(dom.contains("Monthly quota \u{b7} dev-monthly"), "{dom}");
    let resets = txt("quota-resets").expect("resets shown");
    assert!(
        resets.contains("(in ") && !resets.contains("T00:00:00"),
        "{resets}"
    );
    let refill = txt("burst-refill").expect("refill shown");
    assert!(refill.starts_with("refills 1 per hour"), "{refill}");
    // the month by day: one bar per day so far, today's the JSON's
    let days = after["quota"]["days"].as_array().expect("days");
    assert!(
        dom.contains(&format!("data-days=\"{}\"", days.len())),
        "{dom}"
    );
    let today = days.last().expect("today");
    assert!(
        dom.contains(&format!(
            "data-date=\"{}\" data-value=\"{}\"",
            today["date"].as_str().expect("date"),
            today["used"]
        )),
        "{dom}"
    );
    // the live rate: the traffic has stopped (reports are not counted), so
    // what the page read lies between the reports just before and after
    let rps = val("rps").expect("rps shown");
    let shown: f64 = rps.parse().expect("rps is a number");
    let rate = |u: &Value| u["rate"]["requests_per_second"].as_f64().expect("rate");
    assert!(
        rate(&after) <= shown && shown <= rate(&before),
        "rps {rps} vs {before} / {after}"
    );
    assert_eq!(txt("rps"), Some(format!("{shown:.2}")));
    assert!(
        dom.contains("data-reason=\"throttled\" data-value=\"3\""),
        "refusal row:\n{dom}"
    );
    assert!(dom.contains("too fast (rate limit)"), "{dom}");
    // the SVG chart: 60 points per line, the admitted one not flat at zero
    assert!(dom.contains("<svg id=\"chart\""), "{dom}");
    assert!(dom.contains("data-points=\"60\""), "{dom}");
    let points = dom
        .split("id=\"chart-admitted\"")
        .nth(1)
        .and_then(|s| s.split("points=\"").nth(1))
        .and_then(|s| s.split('"').next())
        .expect("admitted polyline");
    let ys: Vec<f64> = points
        .split_whitespace()
        .filter_map(|p| p.split(',').nth(1)?.parse().ok())
        .collect();
    assert_eq!(ys.len(), 60, "{points}");
    assert!(ys.iter().any(|y| *y < 180.0), "a non-zero point: {points}");
    // the policies table lists the key's policies, not the IP's
    assert!(dom.contains("data-policy=\"dev-key\""), "{dom}");
    assert!(dom.contains("data-policy=\"dev-tenant\""), "{dom}");
    assert!(!dom.contains("data-policy=\"per-ip\""), "{dom}");

    // with a wrong key the page says so and shows no numbers
    let dom = chromium_dom(&format!("{}/_rl/dashboard#key=wrong", gw.url(0)));
    assert!(dom.contains("data-error=\"HTTP 401"), "{dom}");
    assert_eq!(val_of(&dom, "burst-used"), Some(String::new()));
    // another tenant's key sees its own page: nothing of key A's
    let dom = chromium_dom(&format!("{}/_rl/dashboard#key=key-b", gw.url(0)));
    assert!(dom.contains("data-loaded=\"1\""), "{dom}");
    for (id, want) in [
        ("burst-used", "0"),
        ("quota-used", "0"),
        ("refusals-total", "0"),
    ] {
        assert_eq!(val_of(&dom, id).as_deref(), Some(want), "{id}");
    }
    assert!(dom.contains("key b1, tenant tb"), "{dom}");

    // the page says there is no quota, rather than showing empty numbers
    let dom = chromium_dom(&format!("{}/_rl/dashboard#key=key-a", gw.url(3)));
    assert!(dom.contains("data-loaded=\"1\""), "{dom}");
    assert!(dom.contains("data-quota=\"none\""), "{dom}");
    let none = dom
        .split("id=\"quota-none\"")
        .nth(1)
        .expect("the no-quota block");
    assert!(
        !none.starts_with(" hidden") && none.contains("No usage quota"),
        "{dom}"
    );
    assert!(dom.contains("id=\"days-card\" hidden"), "{dom}");
    // at a desktop's and a phone's width
    let url = format!("{}/_rl/dashboard#key=key-a", gw.url(0));
    for (name, width, height) in [
        ("dashboard-desktop", 1280, 1300),
        ("dashboard-phone", 390, 2300),
    ] {
        let png = chromium_screenshot(&url, name, width, height);
        println!("dashboard screenshot: {}", png.display());
    }
    assert!(
        gw.nginx.lua_errors().is_empty(),
        "{:?}",
        gw.nginx.lua_errors()
    );
}

#[test]
fn the_tier_form_reports_its_key_and_tenant_buckets() {
    let redis = Server::start(&[]);
    let nginx = gateway::Nginx::start(redis.port);
    let base = nginx.url(nginx.ports.main);
    let a = agent();
    for _ in 0..5 {
        let r = get(
            &a,
            &format!("{base}/v1/ledgers"),
            &[("X-Api-Key", "k-growth")],
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let report = |key: &str| {
        let r = get(&a, &format!("{base}/_rl/usage"), &[("X-Api-Key", key)]);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    // the counters are written just after each response
    let mut u = Value::Null;
    let counted = common::poll_for(Duration::from_secs(5), Duration::from_millis(150), || {
        u = report("k-growth");
        (series_total(&u, "admitted") == 5).then_some(())
    });
    assert!(counted.is_some(), "{u}");
    assert_eq!(
        (&u["key_id"], &u["tenant"], &u["tier"]),
        (&"g1".into(), &"acme".into(), &"growth".into())
    );
    assert_eq!(policy_names(&u), ["growth-key", "growth-tenant"], "{u}");
    assert_eq!(u["policies"][0]["used"], 5, "{u}");
    assert_eq!(u["policies"][0]["left"], 95, "{u}");
    assert_eq!(u["policies"][1]["used"], 5, "{u}");
    assert_eq!(u["policies"][0]["unit"], "points");
    assert_eq!(u["burst"]["policy"], "growth-key");
    assert!(u["quota"].is_null(), "{u}");
    assert_eq!(u["box"]["state"], "none");
    assert_eq!(u["box"]["threshold"], 20);
    assert_eq!(u["rate"]["requests_per_second"].as_f64(), Some(0.5), "{u}");
    // the tenant's other key: its own key bucket untouched, the shared tenant's 5
    let other = report("k-growth-2");
    assert_eq!(other["key_id"], "g2");
    assert_eq!(other["policies"][0]["used"], 0, "{other}");
    assert_eq!(other["policies"][1]["used"], 5, "{other}");
    assert_eq!(other["rate"]["requests_per_second"].as_f64(), Some(0.0));
    for key in [None, Some("nope")] {
        let headers: Vec<(&str, &str)> = key.map(|k| ("X-Api-Key", k)).into_iter().collect();
        let r = get(&a, &format!("{base}/_rl/usage"), &headers);
        assert_eq!(r.status, 401, "{}", r.body);
    }

    assert!(nginx.lua_errors().is_empty(), "{:?}", nginx.lua_errors());
}

/// `n` as en-US writes it (1,000,000).
fn en_us(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn val_of(dom: &str, id: &str) -> Option<String> {
    element(dom, id).map(|(v, _)| v)
}
