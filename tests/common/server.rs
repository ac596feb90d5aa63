//! [`Server`]: one `redis-server` process on 127.0.0.1 with its own
//! directory; started (retrying when its port was taken meanwhile),
//! restarted, shut down, SIGKILLed.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redis::{RedisResult, Value};

use super::process::{kill_proc, wait_pid_gone, Proc};
use super::{
    free_port, fresh_dir, info_field, module_path, poll_for, redis_server_bin, tail, POLL,
};

/// Longest wait for a freshly started `redis-server` to answer `PING`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Read/write timeout installed on every client connection handed out here,
/// so that a hung server fails a test instead of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a started server loads the `rl` module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// `--loadmodule <module_path()>`.
    Module,
    /// Plain `redis-server`, no module (used by the harness self-tests).
    Plain,
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
    /// deadlocks with jemalloc at startup); use
    /// [`TimeShift`](super::TimeShift) instead.
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
    pub(super) fn launch_on(
        pick_port: fn() -> u16,
        prefix: &[&str],
        flavor: Flavor,
        extra: &[&str],
    ) -> Server {
        let mut last_err = String::new();
        for _ in 0..3 {
            let server = Server::stopped(pick_port(), prefix, flavor, extra);
            match server.spawn_and_wait() {
                Ok(proc) => {
                    *server.lock() = Some(proc);
                    return server;
                }
                // `server` is dropped here: its dir is removed.
                Err(e) if e.contains("Address already in use") => last_err = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("redis-server could not get a free port after 3 attempts:\n{last_err}");
    }

    /// A server on `port` with a fresh directory, not running yet.
    fn stopped(port: u16, prefix: &[&str], flavor: Flavor, extra: &[&str]) -> Server {
        Server {
            port,
            dir: fresh_dir(&port.to_string()),
            flavor,
            prefix: prefix.iter().map(|s| s.to_string()).collect(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            proc: Mutex::new(None),
        }
    }

    /// The full command line: program prefix, `redis-server`, the harness
    /// defaults, the module, the caller's arguments.
    fn command_line(&self) -> Vec<String> {
        let mut full = self.prefix.clone();
        full.push(redis_server_bin());
        full.extend(self.default_args());
        if self.flavor == Flavor::Module {
            let module = module_path();
            full.push("--loadmodule".into());
            full.push(module.to_str().expect("module path is not UTF-8").into());
        }
        full.extend(self.extra.iter().cloned());
        full
    }

    /// The harness defaults (see [`Server::launch`]).
    fn default_args(&self) -> Vec<String> {
        let dir = self.dir.to_str().expect("temp dir path is not UTF-8");
        let log = self.log_path();
        let log = log.to_str().expect("log path is not UTF-8");
        let port = self.port.to_string();
        [
            ("--port", port.as_str()),
            ("--bind", "127.0.0.1"),
            ("--dir", dir),
            ("--logfile", log),
            ("--daemonize", "no"),
            ("--save", ""),
            ("--appendonly", "no"),
            ("--enable-debug-command", "yes"),
            ("--enable-module-command", "yes"),
            ("--repl-diskless-sync-delay", "0"),
        ]
        .into_iter()
        .flat_map(|(name, value)| [name.to_string(), value.to_string()])
        .collect()
    }

    /// Spawns the process and waits (bounded by [`READY_TIMEOUT`]) for `PING`
    /// to answer `PONG`. On failure the process is killed and the error text
    /// carries the command line and the tail of `redis.log`.
    fn spawn_and_wait(&self) -> Result<Proc, String> {
        let mut proc = self.spawn()?;
        match self.wait_ready(&mut proc) {
            Ok(pid) => {
                proc.redis_pid = Some(pid);
                Ok(proc)
            }
            Err(why) => {
                kill_proc(&mut proc);
                Err(self.startup_failure(&why))
            }
        }
    }

    /// Spawns the command line, its stdout/stderr (normally empty: redis
    /// logs to redis.log) going to `DIR/stdout.log`, kept for wrapper
    /// programs and early startup errors.
    fn spawn(&self) -> Result<Proc, String> {
        let cmdline = self.command_line();
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
        Ok(Proc {
            child,
            redis_pid: None,
        })
    }

    /// Waits until the server answers `PING`: its pid, or why not.
    fn wait_ready(&self, proc: &mut Proc) -> Result<u32, String> {
        poll_for(READY_TIMEOUT, POLL, || {
            if let Ok(Some(status)) = proc.child.try_wait() {
                return Some(Err(format!("exited during startup ({status})")));
            }
            self.try_ping().map(Ok)
        })
        .unwrap_or_else(|| Err(format!("did not answer PING within {READY_TIMEOUT:?}")))
    }

    /// Why a start failed, with the command line and the logs' tails.
    fn startup_failure(&self, why: &str) -> String {
        let shown: Vec<String> = self
            .command_line()
            .into_iter()
            .map(|a| if a.is_empty() { "\"\"".to_string() } else { a })
            .collect();
        let stdout = std::fs::read_to_string(self.dir.join("stdout.log")).unwrap_or_default();
        format!(
            "redis-server on port {} {why}\ncommand: {}\n--- stdout/stderr ---\n{}\n--- tail of {} ---\n{}",
            self.port,
            shown.join(" "),
            tail(&stdout, 20),
            self.log_path().display(),
            tail(&self.log(), 40)
        )
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

    /// How many times `command` (as Redis names it, e.g. `rl.window`) ran
    /// since the start or the last `CONFIG RESETSTAT` (`INFO commandstats`).
    pub fn command_calls(&self, command: &str) -> u64 {
        self.info_get("commandstats", &format!("cmdstat_{command}"))
            .and_then(|stats| {
                let calls = stats.split(',').find_map(|f| f.strip_prefix("calls="))?;
                calls.parse().ok()
            })
            .unwrap_or(0)
    }

    /// `CONFIG RESETSTAT`: the command counters start again from 0.
    pub fn reset_stats(&self) {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut self.client())
            .unwrap_or_else(|e| panic!("CONFIG RESETSTAT on {}: {e}", self.addr()));
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
        let Some(mut proc) = self.lock().take() else {
            return;
        };
        let exited = poll_for(Duration::from_secs(10), POLL, || {
            matches!(proc.child.try_wait(), Ok(Some(_))).then_some(())
        });
        if exited.is_none() {
            kill_proc(&mut proc);
            panic!(
                "SHUTDOWN {mode}: {} did not exit within 10 s\n{}",
                self.addr(),
                tail(&self.log(), 40)
            );
        }
        wait_pid_gone(proc.redis_pid);
    }

    /// Starts the server again on the same port and dir with the same
    /// arguments (AOF is replayed / RDB is loaded as configured). A server
    /// that is still running is SIGKILLed first. Waits until ready.
    pub fn restart(&self) {
        self.kill9();
        // The port is ours again once the old server is gone, but another
        // process may hold it for a moment in between (an outgoing
        // connection's ephemeral port, a free-port probe): a few tries.
        let mut tries = 0;
        let proc = loop {
            match self.spawn_and_wait() {
                Ok(proc) => break proc,
                Err(e) if tries < 4 && e.contains("Address already in use") => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(250));
                }
                Err(e) => panic!("restart: {e}"),
            }
        };
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
