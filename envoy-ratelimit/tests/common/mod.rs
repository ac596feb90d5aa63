//! Test harness: redis-server with the rl module, the `rl-envoy` service,
//! a loopback HTTP upstream and Envoy, each a real process (or thread) on
//! an ephemeral loopback port, killed on drop.
//!
//! `RL_MODULE` (default: the workspace's target/release/librl.so),
//! `REDIS_SERVER` (default: redis-server on PATH) and `ENVOY_BIN` (default:
//! ~/.cache/rl/envoy-1.40.0/bin/envoy, installed by .ci/get-envoy) say
//! which binaries run; a missing one fails the test.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{
    rate_limit_response::RateLimit, RateLimitRequest, RateLimitResponse,
};

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Polls `f` every 20 ms until it is true, at most `limit`; panics with `what`.
pub fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out after {limit:?} waiting for {what}");
}

/// A child process killed (SIGKILL) on drop.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    fn spawn(mut cmd: Command, log: PathBuf) -> Proc {
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Proc { child, log }
    }

    /// Starts `cmd` with its output in `log`.
    pub fn spawn_logged(cmd: Command, log: PathBuf) -> Proc {
        Proc::spawn(cmd, log)
    }

    /// The process's output so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A fresh temporary directory (removed on drop).
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("rl-test-envoy-")
        .tempdir()
        .expect("temp dir")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// redis-server with the rl module.
pub struct Redis {
    pub port: u16,
    pub proc: Proc,
}

impl Redis {
    /// Starts one on a free port and waits for PING.
    pub fn start(dir: &Path) -> Redis {
        Redis::start_on(dir, free_port())
    }

    /// Starts one on `port` (a restart after a kill).
    pub fn start_on(dir: &Path, port: u16) -> Redis {
        Redis::start_with(dir, port, &[])
    }

    /// Starts one on `port` with `extra` arguments.
    pub fn start_with(dir: &Path, port: u16, extra: &[&str]) -> Redis {
        let module = std::env::var_os("RL_MODULE")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace().join("target/release/librl.so"));
        assert!(module.exists(), "no rl module at {}", module.display());
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let mut cmd = Command::new(bin);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--loadmodule")
            .arg(&module)
            .args(extra);
        let proc = Proc::spawn(cmd, dir.join(format!("redis-{port}.log")));
        let r = Redis { port, proc };
        wait_until("redis PING", Duration::from_secs(10), || r.client().is_ok());
        r
    }

    /// A connection.
    pub fn client(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?
            .get_connection_with_timeout(Duration::from_secs(2))
    }
}

/// The `rl-envoy` service.
pub struct Service {
    pub grpc: u16,
    pub http: u16,
    pub proc: Proc,
}

impl Service {
    /// Starts it on `config_dir` against Redis on `redis_port` with `extra`
    /// arguments and waits for /healthcheck.
    pub fn start(dir: &Path, config_dir: &Path, redis_port: u16, extra: &[&str]) -> Service {
        let (grpc, http) = (free_port(), free_port());
        let mut cmd = Service::command(config_dir, redis_port, grpc, http);
        cmd.args(extra);
        Service::launch(dir, cmd, grpc, http)
    }

    /// Starts `cmd` (from [`Service::command`]) and waits for /healthcheck.
    pub fn launch(dir: &Path, cmd: Command, grpc: u16, http: u16) -> Service {
        let proc = Proc::spawn(cmd, dir.join(format!("rl-envoy-{grpc}.log")));
        let mut s = Service { grpc, http, proc };
        wait_until("rl-envoy /healthcheck", Duration::from_secs(20), || {
            if let Ok(Some(status)) = s.proc.child.try_wait() {
                panic!("rl-envoy exited ({status}): {}", s.proc.output());
            }
            http_get(s.http, "/healthcheck").is_some_and(|(code, _)| code == 200)
        });
        s
    }

    /// The command line of the service.
    pub fn command(config_dir: &Path, redis_port: u16, grpc: u16, http: u16) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-envoy"));
        cmd.arg("--config-dir")
            .arg(config_dir)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .args(["--redis-url", &format!("redis://127.0.0.1:{redis_port}/")])
            .args(["--reload-ms", "100"]);
        cmd
    }

    /// A gRPC client.
    pub async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", self.grpc))
                .expect("endpoint")
                .connect()
                .await
                .expect("grpc connect");
        RateLimitServiceClient::new(channel)
    }

    /// The Prometheus text.
    pub fn metrics(&self) -> String {
        http_get(self.http, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    }
}

/// A descriptor of `(key, value)` entries.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request of `domain` with `descriptors`.
pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// `overall_code` of a response within its limits.
pub const OK: i32 = 1;
/// `overall_code` of a response over a limit.
pub const OVER: i32 = 2;

/// ShouldRateLimit.
pub async fn ask(
    c: &mut RateLimitServiceClient<tonic::transport::Channel>,
    r: RateLimitRequest,
) -> RateLimitResponse {
    c.should_rate_limit(r)
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

/// The limit that status `i` of `r` carries (panics on none).
pub fn limit(r: &RateLimitResponse, i: usize) -> &RateLimit {
    r.statuses[i]
        .current_limit
        .as_ref()
        .expect("a current limit")
}

/// A response header's value.
pub fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// `GET path` on 127.0.0.1:`port` with `headers`: (status, body), None when
/// nothing answers.
pub fn http_get_with(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
    http_get_full(port, path, headers).map(|(s, _, b)| (s, b))
}

/// `GET path`: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_with(port, path, &[])
}

/// An HTTP answer: status, headers (names lower-cased), body.
pub type Answer = (u16, Vec<(String, String)>, String);

/// `GET path` with `headers`.
pub fn http_get_full(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<Answer> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let mut req = agent.get(&format!("http://127.0.0.1:{port}{path}"));
    for (k, v) in headers {
        req = req.set(k, v);
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(_) => return None,
    };
    let status = resp.status();
    let hs = resp
        .headers_names()
        .into_iter()
        .filter_map(|n| {
            let v = resp.header(&n)?.to_string();
            Some((n.to_ascii_lowercase(), v))
        })
        .collect();
    let body = resp.into_string().unwrap_or_default();
    Some((status, hs, body))
}

/// A loopback HTTP/1.1 upstream answering 200 `upstream` to every request
/// (keep-alive), on a thread that lives as long as the test process.
pub fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("upstream listener");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_upstream(stream));
        }
    });
    port
}

fn serve_upstream(stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let mut out = stream;
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        // the request line and headers
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let reply =
            "HTTP/1.1 200 OK\r\ncontent-length: 8\r\ncontent-type: text/plain\r\n\r\nupstream";
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// The Envoy binary.
pub fn envoy_bin() -> PathBuf {
    let bin = std::env::var_os("ENVOY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/rl/envoy-1.40.0/bin/envoy")
        });
    assert!(
        bin.exists(),
        "no envoy at {} (run bash .ci/get-envoy)",
        bin.display()
    );
    bin
}

/// Envoy running `config` (a bootstrap YAML); waits for its admin `/ready`.
pub struct Envoy {
    pub admin: u16,
    pub proc: Proc,
}

impl Envoy {
    /// Starts Envoy with `config`, whose `ADMIN_PORT` is replaced by a free port.
    pub fn start(dir: &Path, config: &str) -> Envoy {
        let admin = free_port();
        let path = dir.join(format!("envoy-{admin}.yaml"));
        std::fs::write(&path, config.replace("ADMIN_PORT", &admin.to_string())).expect("write");
        let mut cmd = Command::new(envoy_bin());
        cmd.arg("-c").arg(&path).args([
            "--concurrency",
            "2",
            "--disable-hot-restart",
            "-l",
            "warning",
        ]);
        let mut e = Envoy {
            admin,
            proc: Proc::spawn(cmd, dir.join(format!("envoy-{admin}.log"))),
        };
        wait_until("envoy /ready", Duration::from_secs(60), || {
            if let Ok(Some(status)) = e.proc.child.try_wait() {
                panic!("envoy exited ({status}): {}", e.proc.output());
            }
            http_get(e.admin, "/ready").is_some_and(|(code, _)| code == 200)
        });
        e
    }
}

/// Creates `dir/config` holding `text` as `name`; returns that folder.
pub fn config_dir(dir: &Path, name: &str, text: &str) -> PathBuf {
    let conf = dir.join("config");
    std::fs::create_dir(&conf).expect("config dir");
    write_config(&conf, name, text);
    conf
}

/// One service against one redis-server, its configuration one file.
pub struct Single {
    /// Holds the configuration folder and the processes' files.
    pub dir: tempfile::TempDir,
    /// The configuration folder the service watches.
    pub conf: PathBuf,
    /// The redis-server with the rl module.
    pub redis: Redis,
    /// The service, started with `extra` arguments.
    pub service: Service,
}

impl Single {
    /// Writes `text` as `name` in a new configuration folder, starts Redis
    /// and the service on it.
    pub fn start(name: &str, text: &str, extra: &[&str]) -> Single {
        let dir = tempdir();
        let conf = config_dir(dir.path(), name, text);
        let redis = Redis::start(dir.path());
        let service = Service::start(dir.path(), &conf, redis.port, extra);
        Single {
            dir,
            conf,
            redis,
            service,
        }
    }
}

/// Writes `text` as `name` in `dir` atomically (a rename), as a
/// configuration management tool would.
pub fn write_config(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("write config");
    std::fs::rename(&tmp, dir.join(name)).expect("rename config");
}

/// A Redis Cluster of three primaries with the rl module (slots spread by
/// `redis-cli --cluster create`).
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    /// Starts the nodes, creates the cluster, waits for `cluster_state:ok`.
    pub fn start(dir: &Path) -> Cluster {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let node_dir = dir.join(format!("node-{port}"));
            std::fs::create_dir_all(&node_dir).expect("node dir");
            nodes.push(Redis::start_with(
                &node_dir,
                port,
                &["--cluster-enabled", "yes"],
            ));
        }
        let cli = std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into());
        let mut cmd = Command::new(cli);
        cmd.arg("--cluster").arg("create");
        for n in &nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = cmd
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        wait_until("cluster_state:ok", Duration::from_secs(30), || {
            nodes.iter().all(|n| {
                n.client()
                    .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c))
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            })
        });
        Cluster { nodes }
    }

    /// `--redis-cluster` for the service.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }
}
