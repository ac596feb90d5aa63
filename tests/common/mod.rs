//! Integration-test harness for the `rl` Redis module.
//!
//! Every integration test file does `mod common;` and then starts real
//! `redis-server` processes through this module:
//!
//! ```ignore
//! mod common;
//! use common::*;
//!
//! #[test]
//! fn something() {
//!     let server = Server::start(&[]);
//!     let mut con = server.client();
//!     let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).expect("SET");
//! }
//! ```
//!
//! Design rules:
//! * Each server gets a free port on 127.0.0.1 and a fresh temporary
//!   directory (its `dir`, where `redis.log`, RDB and AOF files live).
//! * Every wait loop is bounded in time (and therefore in iterations).
//! * Dropping a [`Server`] SIGKILLs it and removes its directory (set
//!   `RL_KEEP_TEST_DIRS=1` to keep the directories for post-mortems).
//! * When a test panics, each dropped server prints the tail of its log to
//!   stderr, which cargo shows next to the failure.
//! * Time travel: start a server under [`TimeShift`] to move its wall clock
//!   (`faketime` deadlocks with Debian's jemalloc-linked `redis-server`).
//!
//! Environment variables:
//! * `RL_MODULE` — path of the module `.so` to load (see [`module_path`]).
//! * `RL_KEEP_TEST_DIRS` — keep server directories after the test.
//! * `REDIS_SERVER` / `REDIS_CLI` — alternative binaries (default: from `PATH`).
//! * `CC` — C compiler for the `TimeShift` shim (default: `cc`).

// Each test binary uses a different subset of this harness.
#![allow(dead_code)]

use std::collections::HashSet;
use std::fmt::Debug;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::{RedisError, RedisResult, Value};

/// Longest wait for a freshly started `redis-server` to answer `PING`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a replica to finish its initial sync.
pub const REPLICA_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest wait for a cluster to become consistent after `--cluster create`.
pub const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Read/write timeout installed on every client connection handed out here,
/// so that a hung server fails a test instead of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between two polls in the wait loops.
const POLL: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------
// Binaries, module and ports
// ---------------------------------------------------------------------------

/// The `redis-server` binary to run: env `REDIS_SERVER`, else `redis-server`.
pub fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// The `redis-cli` binary to run: env `REDIS_CLI`, else `redis-cli`.
pub fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_string())
}

/// Path of the module shared object that [`Server::start`] loads.
///
/// Env `RL_MODULE` if set (`make test` sets it to the release build it just
/// made). Otherwise the module is built from the current sources first
/// (`cargo build`, once per test process: a plain `cargo test` builds the
/// test binaries but not the `cdylib`, and a stale module would test old
/// code) and `target/debug/librl.so` is used.
pub fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os("RL_MODULE") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "RL_MODULE={} does not exist: run `cargo build` (or `cargo build --release`) first",
            p.display()
        );
        return p;
    }
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
            let status = Command::new(cargo)
                .args(["build", "--lib", "--quiet"])
                .current_dir(root)
                .status()
                .expect("run cargo build");
            assert!(status.success(), "cargo build of the module failed");
            let module = root.join("target/debug/librl.so");
            assert!(module.is_file(), "module {} not found", module.display());
            module
        })
        .clone()
}

/// Ports already handed out by this test process; never handed out twice,
/// which avoids two parallel tests racing for the same port.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// Records `port` as handed out; false if it already was.
fn claim_port(port: u16) -> bool {
    let mut guard = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    guard.get_or_insert_with(HashSet::new).insert(port)
}

/// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read
/// the port, drop the listener). Never returns the same port twice within one
/// test process.
pub fn free_port() -> u16 {
    for _ in 0..100 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        drop(listener);
        if claim_port(port) {
            return port;
        }
    }
    panic!("free_port: no fresh port after 100 attempts");
}

/// A port `p <= 55535` such that both `p` and its cluster-bus port `p + 10000`
/// were free a moment ago (both are bound to check). Bounded retries.
pub fn free_cluster_port() -> u16 {
    for _ in 0..200 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if port > 55535 {
            continue;
        }
        let bus = match TcpListener::bind(("127.0.0.1", port + 10000)) {
            Ok(bus) => bus,
            Err(_) => continue,
        };
        drop(bus);
        drop(listener);
        if claim_port(port) && claim_port(port + 10000) {
            return port;
        }
    }
    panic!("free_cluster_port: no port pair (p, p+10000) free after 200 attempts");
}

/// A fresh, empty, uniquely named directory under `std::env::temp_dir()`.
pub fn fresh_dir(tag: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    for _ in 0..100 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("rl-test-{tag}-{}-{n}-{nanos}", std::process::id()));
        if std::fs::create_dir(&dir).is_ok() {
            return dir;
        }
    }
    panic!("fresh_dir: could not create a unique directory under the temp dir");
}

/// Polls `cond` every 50 ms until it returns true; panics with `what` when
/// `timeout` has passed.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        sleep(POLL);
    }
}

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// Whether a started server loads the `rl` module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `--loadmodule <module_path()>`.
    Module,
    /// Plain `redis-server`, no module (used by the harness self-tests).
    Plain,
}

/// The live process behind a [`Server`].
struct Proc {
    /// The process we spawned: `redis-server` itself, or a wrapper from the
    /// program prefix (which may fork and wait for `redis-server`, as
    /// `faketime` and `sh -c '...; :'` do).
    child: Child,
    /// `redis-server`'s own pid, from `INFO server` (differs from the child's
    /// pid under a forking wrapper).
    redis_pid: Option<u32>,
}

/// A `redis-server` process on 127.0.0.1 with its own temp directory.
///
/// All methods take `&self`, so a `Server` can be shared between threads
/// (e.g. `std::thread::scope`). Dropping it SIGKILLs the process and removes
/// `dir` (unless `RL_KEEP_TEST_DIRS` is set).
pub struct Server {
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// The server's `--dir`: holds `redis.log`, RDB and AOF files.
    pub dir: PathBuf,
    flavor: Flavor,
    prefix: Vec<String>,
    extra: Vec<String>,
    /// `None` while the server is not running (between `kill9` and
    /// `restart`, or before the first start).
    proc: Mutex<Option<Proc>>,
}

impl Server {
    /// Starts `redis-server` with the `rl` module loaded and `extra` config
    /// arguments appended (e.g. `&["--appendonly", "yes"]`; later arguments
    /// override the harness defaults). Waits until it answers `PING`.
    pub fn start(extra: &[&str]) -> Server {
        Server::launch(&[], Flavor::Module, extra)
    }

    /// Like [`Server::start`], but runs the server under `program_prefix`,
    /// e.g. `&TimeShift::new().prefix()` or `&["env", "VAR=1"]`.
    ///
    /// Note: `faketime` does NOT work with Debian's `redis-server` (it
    /// deadlocks with jemalloc at startup); use [`TimeShift`] instead.
    pub fn start_with(program_prefix: &[&str], extra: &[&str]) -> Server {
        Server::launch(program_prefix, Flavor::Module, extra)
    }

    /// Like [`Server::start`], but without loading the module.
    pub fn start_plain(extra: &[&str]) -> Server {
        Server::launch(&[], Flavor::Plain, extra)
    }

    /// The general form behind all `start*` functions.
    ///
    /// Command line: `[prefix...] redis-server --port P --bind 127.0.0.1
    /// --dir DIR --logfile DIR/redis.log --daemonize no --save ""
    /// --appendonly no --enable-debug-command yes --enable-module-command yes
    /// --repl-diskless-sync-delay 0 [--loadmodule MODULE] [extra...]`.
    ///
    /// Note: bare words at the start of `extra` (not beginning with `--`)
    /// become arguments of `--loadmodule`, i.e. module arguments.
    pub fn launch(prefix: &[&str], flavor: Flavor, extra: &[&str]) -> Server {
        Server::launch_on(free_port, prefix, flavor, extra)
    }

    /// Like [`Server::launch`] with ports from `pick_port`; retries (up to 3
    /// times, new port and directory) when the port turned out to be taken.
    fn launch_on(
        pick_port: fn() -> u16,
        prefix: &[&str],
        flavor: Flavor,
        extra: &[&str],
    ) -> Server {
        let mut last_err = String::new();
        for _ in 0..3 {
            let port = pick_port();
            let dir = fresh_dir(&port.to_string());
            let server = Server {
                port,
                dir,
                flavor,
                prefix: prefix.iter().map(|s| s.to_string()).collect(),
                extra: extra.iter().map(|s| s.to_string()).collect(),
                proc: Mutex::new(None),
            };
            match server.spawn_and_wait() {
                Ok(proc) => {
                    *server.lock() = Some(proc);
                    return server;
                }
                Err(e) if e.contains("Address already in use") => {
                    last_err = e;
                    // `server` is dropped here: its dir is removed.
                }
                Err(e) => panic!("{e}"),
            }
        }
        panic!("redis-server could not get a free port after 3 attempts:\n{last_err}");
    }

    /// The full command line: program prefix, `redis-server`, arguments.
    fn command_line(&self) -> Vec<String> {
        let dir = self.dir.to_str().expect("temp dir path is not UTF-8");
        let log = self.log_path();
        let mut args: Vec<String> = vec![
            redis_server_bin(),
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.into(),
            "--logfile".into(),
            log.to_str().expect("log path is not UTF-8").into(),
            "--daemonize".into(),
            "no".into(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--enable-debug-command".into(),
            "yes".into(),
            "--enable-module-command".into(),
            "yes".into(),
            "--repl-diskless-sync-delay".into(),
            "0".into(),
        ];
        if self.flavor == Flavor::Module {
            let module = module_path();
            args.push("--loadmodule".into());
            args.push(module.to_str().expect("module path is not UTF-8").into());
        }
        args.extend(self.extra.iter().cloned());
        let mut full = self.prefix.clone();
        full.extend(args);
        full
    }

    /// Spawns the process and waits (bounded by [`READY_TIMEOUT`]) for `PING`
    /// to answer `PONG`. On failure the child is killed and the error text
    /// carries the command line and the tail of `redis.log`.
    fn spawn_and_wait(&self) -> Result<Proc, String> {
        let cmdline = self.command_line();
        // stdout/stderr (normally empty: redis logs to redis.log) are kept
        // for wrapper programs and early startup errors.
        let out = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("stdout.log"))
            .map_err(|e| format!("cannot create stdout.log: {e}"))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("cannot clone file handle: {e}"))?;
        let child = Command::new(&cmdline[0])
            .args(&cmdline[1..])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot spawn {:?}: {e}", cmdline[0]))?;
        let mut proc = Proc {
            child,
            redis_pid: None,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        let fail = |why: String, proc: &mut Proc| -> String {
            kill_proc(proc);
            let shown: Vec<String> = cmdline
                .iter()
                .map(|a| {
                    if a.is_empty() {
                        "\"\"".to_string()
                    } else {
                        a.clone()
                    }
                })
                .collect();
            format!(
                "redis-server on port {} {why}\ncommand: {}\n--- stdout/stderr ---\n{}\n--- tail of {} ---\n{}",
                self.port,
                shown.join(" "),
                tail(
                    &std::fs::read_to_string(self.dir.join("stdout.log")).unwrap_or_default(),
                    20
                ),
                self.log_path().display(),
                tail(&self.log(), 40)
            )
        };
        loop {
            if let Ok(Some(status)) = proc.child.try_wait() {
                return Err(fail(format!("exited during startup ({status})"), &mut proc));
            }
            if let Some(pid) = self.try_ping() {
                proc.redis_pid = Some(pid);
                return Ok(proc);
            }
            if Instant::now() >= deadline {
                return Err(fail(
                    format!("did not answer PING within {READY_TIMEOUT:?}"),
                    &mut proc,
                ));
            }
            sleep(POLL);
        }
    }

    /// One readiness probe: `Some(pid)` when PING answers PONG (not LOADING).
    fn try_ping(&self) -> Option<u32> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut con = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        con.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let pong: String = redis::cmd("PING").query(&mut con).ok()?;
        if pong != "PONG" {
            return None;
        }
        let info: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
        info_field(&info, "process_id")?.parse().ok()
    }

    fn lock(&self) -> MutexGuard<'_, Option<Proc>> {
        self.proc.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// Whether the server loads the module.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A new synchronous connection, with [`IO_TIMEOUT`] read/write timeouts.
    pub fn client(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).expect("valid redis URL");
        let con = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.addr()));
        con.set_read_timeout(Some(IO_TIMEOUT))
            .expect("set read timeout");
        con.set_write_timeout(Some(IO_TIMEOUT))
            .expect("set write timeout");
        con
    }

    /// Contents of `DIR/redis.log` (empty if it cannot be read).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn is_alive(&self) -> bool {
        match self.lock().as_mut() {
            Some(proc) => matches!(proc.child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// `INFO <section>` as text.
    pub fn info(&self, section: &str) -> String {
        redis::cmd("INFO")
            .arg(section)
            .query(&mut self.client())
            .unwrap_or_else(|e| panic!("INFO {section} on {}: {e}", self.addr()))
    }

    /// One `field:value` of `INFO <section>`, e.g. `("replication", "role")`.
    pub fn info_get(&self, section: &str, field: &str) -> Option<String> {
        info_field(&self.info(section), field)
    }

    /// SIGKILLs the server (no chance to write anything) and waits until it
    /// is gone. Idempotent.
    pub fn kill9(&self) {
        if let Some(mut proc) = self.lock().take() {
            kill_proc(&mut proc);
        }
    }

    /// `SHUTDOWN SAVE` (when `save`) or `SHUTDOWN NOSAVE`, then waits
    /// (bounded, 10 s) for the process to exit. Use with [`Server::restart`]
    /// to test RDB loading.
    pub fn shutdown(&self, save: bool) {
        let mode = if save { "SAVE" } else { "NOSAVE" };
        // The connection drops while the server exits: an error is expected.
        let _: RedisResult<Value> = redis::cmd("SHUTDOWN").arg(mode).query(&mut self.client());
        let deadline = Instant::now() + Duration::from_secs(10);
        let Some(mut proc) = self.lock().take() else {
            return;
        };
        loop {
            if let Ok(Some(_)) = proc.child.try_wait() {
                break;
            }
            if Instant::now() >= deadline {
                kill_proc(&mut proc);
                panic!(
                    "SHUTDOWN {mode}: {} did not exit within 10 s\n{}",
                    self.addr(),
                    tail(&self.log(), 40)
                );
            }
            sleep(POLL);
        }
        wait_pid_gone(proc.redis_pid);
    }

    /// Starts the server again on the same port and dir with the same
    /// arguments (AOF is replayed / RDB is loaded as configured). A server
    /// that is still running is SIGKILLed first. Waits until ready.
    pub fn restart(&self) {
        self.kill9();
        let proc = self
            .spawn_and_wait()
            .unwrap_or_else(|e| panic!("restart: {e}"));
        *self.lock() = Some(proc);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "--- {} ({}) tail of redis.log ---\n{}",
                self.addr(),
                self.dir.display(),
                tail(&self.log(), 20)
            );
        }
        if std::env::var_os("RL_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// SIGKILLs the redis process and everything the spawned child started (a
/// wrapper such as `sh -c` may fork `redis-server` and hang on to it, or, if
/// it never got ready, leave us without its pid), reaps the child and waits
/// (bounded) until those processes are gone.
fn kill_proc(proc: &mut Proc) {
    let child_pid = proc.child.id();
    let mut victims = descendants(child_pid);
    if let Some(pid) = proc.redis_pid {
        if pid != child_pid && !victims.contains(&pid) {
            victims.push(pid);
        }
    }
    victims.retain(|&pid| pid_alive(pid));
    if !victims.is_empty() {
        let pids: Vec<String> = victims.iter().map(u32::to_string).collect();
        // `sh -c kill` needs no extra crate and no procps.
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -9 {} 2>/dev/null", pids.join(" "))])
            .status();
    }
    let _ = proc.child.kill();
    let _ = proc.child.wait();
    for pid in victims {
        wait_pid_gone(Some(pid));
    }
    wait_pid_gone(proc.redis_pid);
}

/// The pids of all live descendants of `root` (from `/proc/*/stat`).
fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // After the parenthesised command name: state, then ppid.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for &(pid, ppid) in &parent_of {
            if ppid == parent && !found.contains(&pid) {
                found.push(pid);
            }
        }
        i += 1;
    }
    found.remove(0);
    found
}

/// Whether `pid` is a running (non-zombie) process (reads `/proc`).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3, after the parenthesised command name, is the state.
        Ok(stat) => match stat.rsplit_once(')') {
            Some((_, rest)) => !matches!(rest.trim_start().chars().next(), Some('Z' | 'X')),
            None => false,
        },
        Err(_) => false,
    }
}

/// Waits (bounded, 5 s) until `pid` is dead or a zombie.
fn wait_pid_gone(pid: Option<u32>) {
    if let Some(pid) = pid {
        let deadline = Instant::now() + Duration::from_secs(5);
        while pid_alive(pid) && Instant::now() < deadline {
            sleep(Duration::from_millis(10));
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The value of `field` in `INFO` output (`field:value` lines).
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (k, v) = line.trim_end().split_once(':')?;
        (k == field).then(|| v.to_string())
    })
}

// ---------------------------------------------------------------------------
// Replication
// ---------------------------------------------------------------------------

/// Starts a replica of `master` (same [`Flavor`]), and waits (bounded, 15 s)
/// until the replica reports `master_link_status:up` with no sync in progress
/// and the master lists it as `state=online`.
pub fn start_replica(master: &Server) -> Server {
    start_replica_with(&[], master)
}

/// [`start_replica`] with the replica run under `program_prefix` (e.g.
/// `&TimeShift::new().prefix()`, a replica whose clock differs).
pub fn start_replica_with(program_prefix: &[&str], master: &Server) -> Server {
    let port = master.port.to_string();
    let replica = Server::launch(
        program_prefix,
        master.flavor,
        &["--replicaof", "127.0.0.1", &port],
    );
    let needle = format!("port={},state=online", replica.port);
    let deadline = Instant::now() + REPLICA_TIMEOUT;
    loop {
        let r = replica.info("replication");
        let synced = info_field(&r, "master_link_status").as_deref() == Some("up")
            && info_field(&r, "master_sync_in_progress").as_deref() == Some("0");
        if synced && master.info("replication").contains(&needle) {
            return replica;
        }
        if Instant::now() >= deadline {
            panic!(
                "replica {} of {} not in sync after {REPLICA_TIMEOUT:?}\n\
                 --- replica INFO replication ---\n{r}\n--- replica log ---\n{}\n\
                 --- master log ---\n{}",
                replica.addr(),
                master.addr(),
                tail(&replica.log(), 30),
                tail(&master.log(), 30)
            );
        }
        sleep(POLL);
    }
}

/// `WAIT n_replicas timeout_ms` on `master_conn`, asserting that at least
/// `n_replicas` replicas acknowledged. Returns the acknowledged count.
pub fn wait_replica(
    master_conn: &mut redis::Connection,
    n_replicas: usize,
    timeout_ms: u64,
) -> usize {
    let acked: usize = redis::cmd("WAIT")
        .arg(n_replicas)
        .arg(timeout_ms)
        .query(master_conn)
        .expect("WAIT");
    assert!(
        acked >= n_replicas,
        "WAIT {n_replicas} {timeout_ms}: only {acked} replica(s) acknowledged"
    );
    acked
}

/// Config arguments for an AOF written on every write, without an RDB
/// preamble (so the AOF holds the replicated commands themselves).
pub const AOF_EVERY_WRITE: &[&str] = &[
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--aof-use-rdb-preamble",
    "no",
];

// ---------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------

/// One slot range of `CLUSTER SLOTS`: (start, end, master port, sorted
/// replica ports).
pub type SlotRange = (i64, i64, i64, Vec<i64>);

/// A Redis Cluster of local nodes, created with `redis-cli --cluster create`.
/// Dropping it drops (kills) every node.
pub struct Cluster {
    /// All nodes, in the order given to `redis-cli --cluster create` (the
    /// first `masters` are normally the masters; use [`Cluster::masters`]).
    pub nodes: Vec<Server>,
}

impl Cluster {
    /// A cluster of `masters` (>= 3) masters, each with
    /// `replicas_per_master` replicas, with the module loaded.
    pub fn start(masters: usize, replicas_per_master: usize) -> Cluster {
        Cluster::launch(Flavor::Module, masters, replicas_per_master, &[])
    }

    /// Like [`Cluster::start`], without the module.
    pub fn start_plain(masters: usize, replicas_per_master: usize) -> Cluster {
        Cluster::launch(Flavor::Plain, masters, replicas_per_master, &[])
    }

    /// The general form: nodes run with `--cluster-enabled yes
    /// --cluster-config-file nodes.conf --cluster-node-timeout 15000
    /// --repl-ping-replica-period 1` plus `extra` (which can override them);
    /// then `redis-cli --cluster create ... --cluster-yes`; then waits
    /// (bounded, [`CLUSTER_TIMEOUT`]) until every node reports
    /// `cluster_state:ok`, all nodes agree on a complete `CLUSTER SLOTS`
    /// (every master with all its replicas listed), and every replica's link
    /// to its master is up and synced.
    pub fn launch(
        flavor: Flavor,
        masters: usize,
        replicas_per_master: usize,
        extra: &[&str],
    ) -> Cluster {
        assert!(
            masters >= 3,
            "redis-cli --cluster create needs at least 3 masters"
        );
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "15000",
            // CLUSTER SLOTS lists a replica only once its replication offset
            // is non-zero, and an idle master moves it only by pinging its
            // replicas (every 10 s by default): 1 s cuts the wait for a
            // freshly created cluster with replicas from ~12 s to ~3 s.
            "--repl-ping-replica-period",
            "1",
        ];
        args.extend_from_slice(extra);
        let total = masters * (1 + replicas_per_master);
        let nodes: Vec<Server> = (0..total)
            .map(|_| Server::launch_on(free_cluster_port, &[], flavor, &args))
            .collect();
        let cluster = Cluster { nodes };
        cluster.create(replicas_per_master);
        cluster.wait_consistent(masters, replicas_per_master);
        cluster
    }

    /// Runs `redis-cli --cluster create` (bounded, 60 s).
    fn create(&self, replicas_per_master: usize) {
        let out_path = self.nodes[0].dir.join("cluster-create.out");
        let out = std::fs::File::create(&out_path).expect("create cluster-create.out");
        let mut cmd = Command::new(redis_cli_bin());
        cmd.arg("--cluster").arg("create");
        for n in &self.nodes {
            cmd.arg(n.addr());
        }
        cmd.arg("--cluster-replicas")
            .arg(replicas_per_master.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone file handle"))
            .stderr(out);
        let mut child = cmd.spawn().expect("spawn redis-cli --cluster create");
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for redis-cli") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-cli --cluster create timed out:\n{}",
                    std::fs::read_to_string(&out_path).unwrap_or_default()
                );
            }
            sleep(POLL);
        };
        let output = std::fs::read_to_string(&out_path).unwrap_or_default();
        assert!(
            status.success() && output.contains("[OK] All 16384 slots covered"),
            "redis-cli --cluster create failed ({status}):\n{output}"
        );
    }

    /// See [`Cluster::launch`].
    fn wait_consistent(&self, masters: usize, replicas_per_master: usize) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let why = match self.check_consistent(masters, replicas_per_master) {
                Ok(()) => return,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                panic!("cluster not consistent after {CLUSTER_TIMEOUT:?}: {why}");
            }
            sleep(Duration::from_millis(100));
        }
    }

    fn check_consistent(&self, masters: usize, replicas_per_master: usize) -> Result<(), String> {
        let mut first: Option<Vec<SlotRange>> = None;
        for node in &self.nodes {
            let mut con = node.client();
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut con)
                .map_err(|e| e.to_string())?;
            if info_field(&info, "cluster_state").as_deref() != Some("ok") {
                return Err(format!("{} cluster_state is not ok", node.addr()));
            }
            let slots = cluster_slots(&mut con).map_err(|e| e.to_string())?;
            let covered: i64 = slots.iter().map(|r| r.1 - r.0 + 1).sum();
            if covered != 16384 {
                return Err(format!("{} covers {covered} slots", node.addr()));
            }
            let masters_seen: HashSet<i64> = slots.iter().map(|r| r.2).collect();
            if masters_seen.len() != masters
                || slots.iter().any(|r| r.3.len() != replicas_per_master)
            {
                return Err(format!(
                    "{} CLUSTER SLOTS incomplete: {slots:?}",
                    node.addr()
                ));
            }
            match &first {
                None => first = Some(slots),
                Some(f) if *f != slots => {
                    return Err(format!(
                        "{} disagrees on CLUSTER SLOTS: {slots:?} vs {f:?}",
                        node.addr()
                    ))
                }
                Some(_) => {}
            }
            let repl: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut con)
                .map_err(|e| e.to_string())?;
            if info_field(&repl, "role").as_deref() == Some("slave")
                && (info_field(&repl, "master_link_status").as_deref() != Some("up")
                    || info_field(&repl, "master_sync_in_progress").as_deref() != Some("0"))
            {
                return Err(format!("replica {} not in sync yet", node.addr()));
            }
        }
        Ok(())
    }

    /// A cluster-aware client over all nodes (`ClusterClient::new`), with
    /// [`IO_TIMEOUT`] read/write timeouts.
    pub fn client(&self) -> redis::cluster::ClusterConnection {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.url()).collect();
        let con = redis::cluster::ClusterClient::new(urls)
            .expect("ClusterClient::new")
            .get_connection()
            .expect("cluster get_connection");
        con.set_read_timeout(Some(IO_TIMEOUT))
            .expect("set read timeout");
        con.set_write_timeout(Some(IO_TIMEOUT))
            .expect("set write timeout");
        con
    }

    /// `CLUSTER SLOTS` as seen by the first node, normalised and sorted.
    pub fn slots(&self) -> Vec<SlotRange> {
        cluster_slots(&mut self.nodes[0].client()).expect("CLUSTER SLOTS")
    }

    /// The node with the given port.
    pub fn node(&self, port: u16) -> &Server {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// The nodes that currently are masters (per `CLUSTER SLOTS`).
    pub fn masters(&self) -> Vec<&Server> {
        let ports: HashSet<i64> = self.slots().iter().map(|r| r.2).collect();
        self.nodes
            .iter()
            .filter(|n| ports.contains(&i64::from(n.port)))
            .collect()
    }

    /// The master node currently serving `key`'s hash slot.
    pub fn master_for_key(&self, key: &[u8]) -> &Server {
        let slot = i64::from(key_slot(key));
        let range = self
            .slots()
            .into_iter()
            .find(|r| r.0 <= slot && slot <= r.1)
            .unwrap_or_else(|| panic!("slot {slot} not served"));
        let port = u16::try_from(range.2).expect("port fits u16");
        self.node(port)
    }
}

/// The cluster hash slot of `key` (honours `{hash tags}`).
pub fn key_slot(key: &[u8]) -> u16 {
    redis::cluster_routing::get_slot(key)
}

/// `CLUSTER SLOTS` on `con`, normalised to sorted [`SlotRange`]s.
pub fn cluster_slots(con: &mut redis::Connection) -> RedisResult<Vec<SlotRange>> {
    let v: Value = redis::cmd("CLUSTER").arg("SLOTS").query(con)?;
    let Value::Array(ranges) = v else {
        panic!("CLUSTER SLOTS: unexpected reply {v:?}");
    };
    let mut out: Vec<SlotRange> = ranges
        .into_iter()
        .map(|r| {
            let Value::Array(items) = r else {
                panic!("CLUSTER SLOTS range: unexpected {r:?}");
            };
            let int = |v: &Value| value_i64(v);
            let port_of = |v: &Value| match v {
                Value::Array(node) => int(&node[1]),
                other => panic!("CLUSTER SLOTS node: unexpected {other:?}"),
            };
            let mut replicas: Vec<i64> = items[3..].iter().map(port_of).collect();
            replicas.sort_unstable();
            (int(&items[0]), int(&items[1]), port_of(&items[2]), replicas)
        })
        .collect();
    out.sort();
    Ok(out)
}

// ---------------------------------------------------------------------------
// Reply helpers
// ---------------------------------------------------------------------------

/// An integer reply, or a string that parses as one; panics otherwise.
pub fn value_i64(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an integer: {v:?}")),
        Value::SimpleString(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("not an integer: {s:?}")),
        other => panic!("not an integer: {other:?}"),
    }
}

/// A string-ish reply (bulk, simple, OK, verbatim, integer, double) as text;
/// panics on arrays, nil and errors.
pub fn value_str(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_string(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::Int(i) => i.to_string(),
        Value::Double(d) => d.to_string(),
        other => panic!("not a string reply: {other:?}"),
    }
}

/// The elements of an array (or set) reply; panics otherwise.
pub fn array(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) | Value::Set(items) => items,
        other => panic!("not an array reply: {other:?}"),
    }
}

/// An array reply of integers (or numeric strings) as `Vec<i64>`.
pub fn int_array(v: Value) -> Vec<i64> {
    array(v).iter().map(value_i64).collect()
}

/// An array reply of strings as `Vec<String>` (see [`value_str`]).
pub fn str_array(v: Value) -> Vec<String> {
    array(v).iter().map(value_str).collect()
}

/// A flat `[k1, v1, k2, v2, ...]` array or a RESP3 map, as `(key, value)`
/// pairs with string keys.
pub fn pairs(v: Value) -> Vec<(String, Value)> {
    match v {
        Value::Map(m) => m.into_iter().map(|(k, v)| (value_str(&k), v)).collect(),
        other => {
            let items = array(other);
            assert!(
                items.len().is_multiple_of(2),
                "odd-length key/value array: {items:?}"
            );
            let mut out = Vec::with_capacity(items.len() / 2);
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((value_str(&k), v));
            }
            out
        }
    }
}

/// Asserts that `r` is an error whose text (code + detail) contains `needle`
/// (case-sensitive), and returns the error.
pub fn expect_err<T: Debug>(r: RedisResult<T>, needle: &str) -> RedisError {
    match r {
        Ok(v) => panic!("expected an error containing {needle:?}, got Ok({v:?})"),
        Err(e) => {
            let text = err_text(&e);
            assert!(
                text.contains(needle),
                "expected an error containing {needle:?}, got {text:?}"
            );
            e
        }
    }
}

/// An error as the server sent it: `CODE detail` (e.g. `CROSSSLOT Keys in
/// request don't hash to the same slot`), falling back to `Display`.
pub fn err_text(e: &RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Time travel
// ---------------------------------------------------------------------------

/// The real wall clock (this process is not under a [`TimeShift`]), in
/// Unix milliseconds.
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(since.as_millis()).expect("ms fit i64")
}

/// Path of the `timeshift` LD_PRELOAD shim, compiled (once per test process,
/// with `cc`) from `tests/common/timeshift.c` into
/// `target/rl-test-support/libtimeshift.so`.
pub fn timeshift_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let src = root.join("tests/common/timeshift.c");
        let out_dir = root.join("target/rl-test-support");
        std::fs::create_dir_all(&out_dir).expect("create target/rl-test-support");
        let lib = out_dir.join("libtimeshift.so");
        // Build under a unique name, then rename: safe against concurrent
        // test processes and against servers still mapping an older copy.
        let tmp = out_dir.join(format!("libtimeshift.so.{}", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let output = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("cannot run C compiler {cc:?}: {e}"));
        assert!(
            output.status.success(),
            "compiling {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::rename(&tmp, &lib).expect("rename libtimeshift.so");
        lib
    })
    .clone()
}

/// A controllable wall-clock offset for servers started under it.
///
/// ```ignore
/// let clock = TimeShift::new();
/// let server = Server::start_with(&clock.prefix(), &[]);
/// clock.advance(Duration::from_secs(3600)); // the server is now 1 h ahead
/// ```
///
/// Servers see `CLOCK_REALTIME`, `gettimeofday()` and `time()` shifted by
/// the current offset (so key expiry, `TIME` and module time calls follow
/// it); monotonic clocks are untouched. The offset applies to every server
/// started with this prefix, takes effect immediately, and survives
/// [`Server::restart`] while the `TimeShift` lives.
pub struct TimeShift {
    dir: PathBuf,
    file: std::fs::File,
    offset_ns: Mutex<i64>,
    preload: String,
    file_env: String,
}

impl TimeShift {
    /// A new clock with offset 0.
    pub fn new() -> TimeShift {
        let lib = timeshift_lib();
        let dir = fresh_dir("timeshift");
        let path = dir.join("offset");
        let file = std::fs::File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("create timeshift offset file");
        let clock = TimeShift {
            preload: format!("LD_PRELOAD={}", lib.display()),
            file_env: format!("RL_TIMESHIFT_FILE={}", path.display()),
            dir,
            file,
            offset_ns: Mutex::new(0),
        };
        clock.write(0);
        clock
    }

    /// The program prefix for [`Server::start_with`] / [`Server::launch`]:
    /// `env LD_PRELOAD=... RL_TIMESHIFT_FILE=...` (env execs, no fork).
    pub fn prefix(&self) -> Vec<&str> {
        vec!["env", &self.preload, &self.file_env]
    }

    fn write(&self, ns: i64) {
        use std::os::unix::fs::FileExt;
        self.file
            .write_all_at(&ns.to_ne_bytes(), 0)
            .expect("write timeshift offset");
        *self.offset_ns.lock().unwrap_or_else(|e| e.into_inner()) = ns;
    }

    /// Sets the offset from real time, in milliseconds (may be negative).
    pub fn set_ms(&self, ms: i64) {
        self.write(ms.checked_mul(1_000_000).expect("offset overflows i64 ns"));
    }

    /// Moves the clock forward by `d` (relative to the current offset).
    pub fn advance(&self, d: Duration) {
        let cur = *self.offset_ns.lock().unwrap_or_else(|e| e.into_inner());
        let add = i64::try_from(d.as_nanos()).expect("duration fits i64 ns");
        self.write(cur.checked_add(add).expect("offset overflows i64 ns"));
    }

    /// Moves the clock forward by `ms` milliseconds (negative: backward).
    pub fn advance_ms(&self, ms: i64) {
        let cur = *self.offset_ns.lock().unwrap_or_else(|e| e.into_inner());
        self.write(cur + ms * 1_000_000);
    }

    /// Sets the offset so that a server under this clock reads `at_ms`
    /// (Unix ms) now; its clock then runs on from there.
    pub fn set_now_ms(&self, at_ms: i64) {
        self.set_ms(at_ms - now_ms());
    }

    /// The current offset in milliseconds.
    pub fn offset_ms(&self) -> i64 {
        *self.offset_ns.lock().unwrap_or_else(|e| e.into_inner()) / 1_000_000
    }
}

impl Default for TimeShift {
    fn default() -> Self {
        TimeShift::new()
    }
}

impl Drop for TimeShift {
    fn drop(&mut self) {
        if std::env::var_os("RL_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

mod calls;
#[allow(unused_imports)]
pub use self::calls::*;

mod faults;
#[allow(unused_imports)]
pub use self::faults::*;

mod decision;
#[allow(unused_imports)]
pub use self::decision::*;
