//! Harness of the usage dashboard tests (`tests/gateway_usage.rs`): Redis
//! command counters, headless Chromium (Debian's `chromium`, which
//! `.ci/deps` installs: a missing browser fails the test, it never skips),
//! and the tests' policy, gateway, traffic and usage reports.
//!
//! Included next to `common/gateway.rs` and `common/gateway_policy.rs`:
//! `#[path = "common/gateway_usage.rs"] mod gateway_usage;`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::common::{fresh_dir, poll_for, Server};
use super::gateway::{agent, get, Resp};
use super::gateway_policy::{start, Front, PolicyGateway};

/// Longest run of one headless Chromium (start, page, script, exit).
pub const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(60);
/// Virtual time the page's script gets (several of its 2 s polls).
const VIRTUAL_TIME_MS: u32 = 6000;

/// `INFO commandstats` as command name -> calls; subcommands
/// (`rl.box|status`) are summed under their command (`rl.box`).
pub fn commandstats(redis: &Server) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for line in redis.info("commandstats").lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let name = name.split('|').next().unwrap_or(name).to_string();
        *out.entry(name).or_insert(0) += calls;
    }
    out
}

/// An integer field of `INFO <section>`.
pub fn info_int(redis: &Server, section: &str, field: &str) -> i64 {
    redis
        .info_get(section, field)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no integer {field}"))
}

/// The `data-value` attribute (empty when absent) and the text of the
/// element with `id` in a serialized DOM (the text up to the next tag).
pub fn element(dom: &str, id: &str) -> Option<(String, String)> {
    let at = dom.find(&format!(" id=\"{id}\""))?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    let tag = &dom[start..end];
    let value = tag
        .split("data-value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or("")
        .to_string();
    let text = dom[end + 1..].split('<').next().unwrap_or("").to_string();
    Some((value, text))
}

/// The Chromium binary: env `CHROMIUM`, else `chromium`. Panics (the
/// test fails) when it cannot run.
fn chromium_bin() -> String {
    let bin = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".to_string());
    let ok = Command::new(&bin)
        .arg("--version")
        .stderr(Stdio::null())
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "cannot run `{bin} --version`: the dashboard test needs headless Chromium; \
         install Debian's chromium (`make deps` / .ci/deps does)"
    );
    bin
}

/// Runs headless Chromium on `url` with `extra` arguments, in its own
/// profile directory and process group, killed after [`CHROMIUM_TIMEOUT`];
/// returns its stdout.
fn chromium(url: &str, extra: &[String]) -> String {
    let bin = chromium_bin();
    let profile = fresh_dir("chromium");
    let mut child = Command::new(&bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--disable-extensions",
            "--disable-background-networking",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--virtual-time-budget={VIRTUAL_TIME_MS}"),
        ])
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("start {bin}: {e}"));
    let mut stdout = child.stdout.take().expect("chromium stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CHROMIUM_TIMEOUT;
    let status = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break Some(st);
        }
        if Instant::now() >= deadline {
            break None;
        }
        sleep(Duration::from_millis(50));
    };
    // the browser's helpers, whether it exited or not
    let _ = Command::new("sh")
        .args(["-c", &format!("kill -KILL -{} 2>/dev/null", child.id())])
        .status();
    let _ = child.kill();
    let _ = child.wait();
    let out = reader.join().unwrap_or_default();
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        status.is_some(),
        "chromium did not finish within {CHROMIUM_TIMEOUT:?} on {url}"
    );
    out
}

/// The DOM of `url` after its scripts ran (`--dump-dom`).
pub fn chromium_dom(url: &str) -> String {
    chromium(url, &["--dump-dom".to_string()])
}

/// A PNG screenshot of `url` in a window `width` x `height` pixels, kept as
/// `target/test-artifacts/<name>.png` (asserted to be a PNG); its path.
pub fn chromium_screenshot(url: &str, name: &str, width: u32, height: u32) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&dir).expect("create target/test-artifacts");
    let png = dir.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&png);
    chromium(
        url,
        &[
            format!("--screenshot={}", png.display()),
            format!("--window-size={width},{height}"),
            "--hide-scrollbars".to_string(),
        ],
    );
    let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
    assert!(
        bytes.len() > 1000 && bytes.starts_with(b"\x89PNG"),
        "{} is not a PNG screenshot",
        png.display()
    );
    png
}

// ---------------------------------------------------------------------------
// The usage tests' policy and gateway
// ---------------------------------------------------------------------------

/// The policy under test: a monthly quota per tenant, a bucket per key
/// (burst 20, refilled 1 an hour: counts are exact; strikes counted, box
/// far away) with the tenant's bucket (burst 30) in the same command, and
/// a window per client IP, which is not the key's own and is never shown.
pub const POLICY: &str = r#"return {
    redis = { port = tonumber(os.getenv("RL_REDIS_PORT")), timeout_ms = 1000 },
    key_prefix = "use",
    identity = { required = true, api_key = { keys = {
        ["key-a"] = { key_id = "a1", tenant = "ta", tier = "dev" },
        ["key-b"] = { key_id = "b1", tenant = "tb", tier = "dev" },
        ["key-c"] = { key_id = "c1", tenant = "tc", tier = "dev" },
    } } },
    tiers = { dev = { monthly = 1000, burst = 20, rate = 1 } },
    rules = {
        { name = "{tier}-monthly", scope = { "tenant" },
          limiter = { kind = "quota", limit = "tier.monthly", period = "MONTH" } },
        { name = "{tier}-key", scope = { "tenant", "key_id" },
          limiter = { kind = "bucket", rate = "tier.rate", burst = "tier.burst", period = 3600,
                      strikes = { threshold = 100, window = 60 },
                      also = { { name = "{tier}-tenant", scope = { "tenant" }, rate = 1,
                                 burst = 30, period = 3600 } } } },
        { name = "per-ip", scope = { "ip" }, limiter = { kind = "window", limit = 10000, window = 60 } },
    },
}"#;

/// The policy with `usage` set to `usage` (Lua) and the key prefix `prefix`.
pub fn variant(usage: &str, prefix: &str) -> Front {
    Front::Nginx(format!(
        "(function() local p = dofile(DIR .. \"/usage_policy.lua\"); p.usage = {usage}; \
         p.key_prefix = \"{prefix}\"; return p end)()"
    ))
}

/// Front end 0: the policy; 1: the same with `usage = false`; 2: with a
/// counters dict that is not declared; 3: without the monthly quota.
pub fn usage_gateway(redis: &Server) -> PolicyGateway {
    let front = Front::Nginx("dofile(DIR .. \"/usage_policy.lua\")".into());
    start(
        redis.port,
        &[
            front,
            variant("false", "off"),
            variant(
                "{ dict = \"undeclared\", reports_per_second = 10 }",
                "nodict",
            ),
            Front::Nginx(
                "(function() local p = dofile(DIR .. \"/usage_policy.lua\"); \
                 table.remove(p.rules, 1); p.key_prefix = \"noquota\"; return p end)()"
                    .into(),
            ),
        ],
        &[("usage_policy.lua", POLICY)],
    )
    .expect("nginx starts")
}

pub fn usage(gw: &PolicyGateway, key: Option<&str>, query: &str) -> Resp {
    let headers: Vec<(&str, &str)> = key.map(|k| ("X-Api-Key", k)).into_iter().collect();
    get(
        &agent(),
        &format!("{}/_rl/usage{query}", gw.url(0)),
        &headers,
    )
}

/// `n` ordinary requests of `key` on front end `front`, their statuses.
pub fn traffic_on(gw: &PolicyGateway, front: usize, key: &str, n: usize) -> Vec<u16> {
    let a = agent();
    let url = format!("{}/v1/things", gw.url(front));
    (0..n)
        .map(|_| get(&a, &url, &[("X-Api-Key", key)]).status)
        .collect()
}

/// `n` ordinary requests of `key` on the policy's front end.
pub fn traffic(gw: &PolicyGateway, key: &str, n: usize) -> Vec<u16> {
    traffic_on(gw, 0, key, n)
}

/// The sum of a per-second series of a report (`admitted`, `refused`).
pub fn series_total(u: &Value, which: &str) -> u64 {
    u["rate"]["series"][which]
        .as_array()
        .map(|l| l.iter().filter_map(Value::as_u64).sum())
        .unwrap_or(0)
}

/// The report of `key` once this node's counters show `admitted` and
/// `refused` requests (they are written in the log phase, just after each
/// response is sent), polled within 5 s (below the report cap).
pub fn settled(gw: &PolicyGateway, key: &str, admitted: u64, refused: u64) -> Value {
    let mut last = Value::Null;
    let got = poll_for(Duration::from_secs(5), Duration::from_millis(150), || {
        let r = usage(gw, Some(key), "");
        assert_eq!(r.status, 200, "{}", r.body);
        last = r.json();
        let seen = (
            series_total(&last, "admitted"),
            series_total(&last, "refused"),
        );
        (seen == (admitted, refused)).then(|| last.clone())
    });
    got.unwrap_or_else(|| panic!("the counters never showed {admitted} + {refused}: {last}"))
}

pub fn policy_names(u: &Value) -> Vec<String> {
    u["policies"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|p| p["name"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}
