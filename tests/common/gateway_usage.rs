//! Harness of the usage dashboard tests (`tests/gateway_usage.rs`): Redis
//! command counters, and headless Chromium (Debian's `chromium`, which
//! `.ci/deps` installs: a missing browser fails the test, it never skips).
//!
//! Included next to `common/gateway.rs`:
//! `#[path = "common/gateway_usage.rs"] mod gateway_usage;`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::common::{fresh_dir, Server};

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
