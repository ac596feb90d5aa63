//! rlctl's test harness: real `redis-server` processes with the rl module
//! (one server, or a cluster made by `redis-cli --cluster create`), the
//! `rlctl` binary as a child process, and loopback receivers (`receivers`).
//! Every wait is bounded in time.

#![allow(dead_code)]

pub mod cluster;
pub mod receivers;
pub mod regions;

pub use cluster::Cluster;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The `redis-server` binary to run: env `REDIS_SERVER`, else
/// `redis-server` from `PATH` (`make test` runs the region tests again on
/// Redis 7.4 and Valkey this way).
pub fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// The `redis-cli` binary to run: env `REDIS_CLI`, else `redis-cli`.
pub fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

/// The release module: `RL_MODULE`, else `target/release/librl.so` at the workspace root.
pub fn module_path() -> PathBuf {
    let path = std::env::var_os("RL_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/librl.so")
        });
    assert!(
        path.exists(),
        "the rl module is not built: {} (run `cargo build --release` at the workspace root)",
        path.display()
    );
    path
}

/// A fresh directory under the system temp dir.
pub fn fresh_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rlctl-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create test dir");
    dir
}

/// Polls `cond` every 50 ms until it holds; panics after `timeout` naming `what`.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A port `p` with `p + 10000` (the cluster bus) free too.
fn free_port(cluster: bool) -> u16 {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let p = l.local_addr().expect("addr").port();
        if !cluster {
            return p;
        }
        if p <= 55535 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair after 200 attempts");
}

/// One redis-server with the module, killed on drop.
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
    /// The arguments after the module path (module arguments first).
    extra: Vec<String>,
}

impl Server {
    /// A standalone server.
    pub fn start() -> Server {
        Server::launch(false, &[])
    }

    /// A server with `extra` after the module path: the module's load
    /// arguments first (`region eu ...`), then `--options`.
    pub fn launch(cluster: bool, extra: &[&str]) -> Server {
        let port = free_port(cluster);
        let dir = fresh_dir(&format!("redis-{port}"));
        let mut server = Server {
            port,
            dir,
            child: None,
            extra: extra.iter().map(|a| a.to_string()).collect(),
        };
        server.spawn();
        server
    }

    /// Starts the process on the server's port and directory (what it
    /// persisted is loaded) and waits until it answers.
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .expect("log file");
        let mut cmd = Command::new(redis_server_bin());
        cmd.args([
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&self.dir)
        .arg("--loadmodule")
        .arg(module_path())
        .args(&self.extra)
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
        self.child = Some(
            cmd.spawn()
                .expect("spawn redis-server (is it installed? make deps)"),
        );
        let port = self.port;
        wait_until(
            Duration::from_secs(15),
            &format!("redis-server on {port}"),
            || {
                self.try_client()
                    .is_some_and(|mut c| redis::cmd("PING").query::<String>(&mut c).is_ok())
            },
        );
    }

    /// SIGKILL, then the same server again from what it persisted.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn try_client(&self) -> Option<redis::Connection> {
        let client = redis::Client::open(self.url()).ok()?;
        client
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()
    }

    /// A connection (2 s timeouts).
    pub fn client(&self) -> redis::Connection {
        let c = self
            .try_client()
            .unwrap_or_else(|| panic!("connect to {}", self.url()));
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        c
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The rlctl binary.
pub fn rlctl_bin() -> &'static str {
    env!("CARGO_BIN_EXE_rlctl")
}

/// Runs `rlctl --config <config> <args>` to completion (bounded: 60 s).
pub fn rlctl(config: &Path, args: &[&str], env: &[(&str, String)]) -> Output {
    let mut child = Command::new(rlctl_bin())
        .arg("--config")
        .arg(config)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rlctl");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait rlctl").is_some() {
            return child.wait_with_output().expect("rlctl output");
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("rlctl {args:?} did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `rlctl watch` as a child process, its stderr in `dir/watch-<n>.log`.
pub struct Worker {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Worker {
    /// Starts the worker and waits until it has subscribed to `primaries`
    /// nodes and reconciled them.
    pub fn start(dir: &Path, config: &Path, env: &[(&str, String)], primaries: usize) -> Worker {
        Worker::run(dir, config, env, &["watch"], |log| {
            log.matches("reconciled").count() >= primaries
        })
    }

    /// Starts `rlctl --config <config> <args>` and waits (30 s at most)
    /// until its log satisfies `ready`.
    pub fn run(
        dir: &Path,
        config: &Path,
        env: &[(&str, String)],
        args: &[&str],
        ready: impl Fn(&str) -> bool,
    ) -> Worker {
        static N: AtomicU32 = AtomicU32::new(0);
        let log = dir.join(format!(
            "{}-{}.log",
            args.join("-"),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let file = std::fs::File::create(&log).expect("worker log");
        let child = Command::new(rlctl_bin())
            .arg("--config")
            .arg(config)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("RLCTL_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("spawn rlctl");
        let w = Worker {
            child: Some(child),
            log,
        };
        wait_until(
            Duration::from_secs(30),
            &format!("rlctl {args:?} to be ready"),
            || ready(&w.log_text()),
        );
        w
    }

    /// The worker's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The secrets of the test configuration, as environment variables.
pub fn secrets() -> Vec<(&'static str, String)> {
    vec![
        ("T_GROWTH_SECRET", "growth-secret".into()),
        ("T_ENT_SECRET", "ent-secret".into()),
        ("T_SAND_SECRET", "sand-secret".into()),
        ("INTERNAL_SECRET", "internal-secret".into()),
        ("PAGER_KEY", "oncall-routing-key".into()),
        ("PAGER_OWNER_KEY", "owners-routing-key".into()),
    ]
}

/// A configuration for the receivers: three tenants (sandbox, growth,
/// enterprise), every destination, fast retries; `extra` is appended.
pub fn config_text(
    urls: &[String],
    cluster: bool,
    web: &str,
    smtp_port: u16,
    extra: &str,
) -> String {
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    format!(
        r#"
[redis]
urls = [{urls}]
cluster = {cluster}
topology_refresh_ms = 300
timeout_ms = 2000

[delivery]
queue = 200
rate_per_second = 50
concurrency = 2
retry_for_ms = 10000
backoff_ms = 50
backoff_max_ms = 200
timeout_ms = 2000

[internal]
webhook_url = "{web}/internal"
secret_env = "INTERNAL_SECRET"

[pager]
url = "{web}/pager"
routing_key_env = "PAGER_KEY"
account_owner_routing_key_env = "PAGER_OWNER_KEY"

[email]
smtp_host = "127.0.0.1"
smtp_port = {smtp_port}
tls = "none"
from = "rl alerts <alerts@ops.test>"

[templates]
guidelines_url = "https://docs.test/backoff"

[tiers.sandbox]
[tiers.growth]
[tiers.enterprise]
human_review = true

[tenants.t-sand]
tier = "sandbox"
contacts = ["dev@sand.test"]
webhook_url = "{web}/tenant/t-sand"
webhook_secret_env = "T_SAND_SECRET"

[tenants.t-grow]
name = "Growth Co"
tier = "growth"
contacts = ["ops@grow.test", "cto@grow.test"]
webhook_url = "{web}/tenant/t-grow"
webhook_secret_env = "T_GROWTH_SECRET"

[tenants.t-ent]
name = "Big Bank"
tier = "enterprise"
contacts = ["noc@bank.test"]
webhook_url = "{web}/tenant/t-ent"
webhook_secret_env = "T_ENT_SECRET"
account_owner = "jane.owner@ops.test"
{extra}
"#,
        urls = urls.join(", ")
    )
}

/// `RL.BOX TRIP key level seconds` through `con`.
pub fn trip(con: &mut impl redis::ConnectionLike, key: &str, level: u8, seconds: u64) -> Vec<i64> {
    redis::cmd("RL.BOX")
        .arg("TRIP")
        .arg(key)
        .arg(level)
        .arg(seconds)
        .query(con)
        .expect("RL.BOX TRIP")
}

/// The audit stream's entries as field maps.
pub fn audit_entries(
    con: &mut impl redis::ConnectionLike,
) -> Vec<std::collections::HashMap<String, String>> {
    let v: Vec<(String, std::collections::HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg("rlctl:audit")
        .arg("-")
        .arg("+")
        .query(con)
        .expect("XRANGE audit");
    v.into_iter().map(|(_, f)| f).collect()
}

/// Checks `x-rlctl-signature` (`t=<secs>,v1=<hex HMAC-SHA256("<t>.<body>")>`) with `secret`.
pub fn signature_ok(req: &receivers::Request, secret: &str) -> bool {
    use hmac::Mac;
    let Some(sig) = req.headers.get("x-rlctl-signature") else {
        return false;
    };
    let Some((t, v1)) = sig.strip_prefix("t=").and_then(|s| s.split_once(",v1=")) else {
        return false;
    };
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("hmac");
    mac.update(format!("{t}.{}", req.body).as_bytes());
    hex::encode(mac.finalize().into_bytes()) == v1
}

/// `RL.BOX STATUS key`: `[level, ttl_ms, offenses, strikes]`.
pub fn status(con: &mut impl redis::ConnectionLike, key: &str) -> Vec<i64> {
    redis::cmd("RL.BOX")
        .arg("STATUS")
        .arg(key)
        .query(con)
        .expect("RL.BOX STATUS")
}

/// One server, the receivers and a configuration file for them.
pub struct Single {
    pub server: Server,
    pub web: receivers::Webhooks,
    pub smtp: receivers::Smtp,
    pub dir: PathBuf,
    pub cfg: PathBuf,
}

impl Single {
    /// Starts them; `edit` replaces one text of `config_text` (`("", "")`: none).
    pub fn start(tag: &str, edit: (&str, &str)) -> Single {
        let server = Server::start();
        let web = receivers::Webhooks::start();
        let smtp = receivers::Smtp::start();
        let dir = fresh_dir(tag);
        let cfg = dir.join("rlctl.toml");
        let text = config_text(&[server.url()], false, &web.base, smtp.port, "");
        let text = if edit.0.is_empty() {
            text
        } else {
            text.replace(edit.0, edit.1)
        };
        std::fs::write(&cfg, text).expect("write the configuration");
        Single {
            server,
            web,
            smtp,
            dir,
            cfg,
        }
    }

    /// Starts `rlctl watch` with the test secrets.
    pub fn worker(&self) -> Worker {
        Worker::start(&self.dir, &self.cfg, &secrets(), 1)
    }
}
