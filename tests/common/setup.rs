//! What a test needs before a server starts: the binaries, the module,
//! free ports and fresh directories.

use std::collections::HashSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

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
            let status = cargo()
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

/// A `cargo` command as a shell would run it: without the variables cargo
/// sets for the test process (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`,
/// `OUT_DIR`, ...). Some build scripts track those (ring tracks
/// `CARGO_MANIFEST_DIR`), so a build that inherited them would count as
/// changed and rebuild its dependencies, during the test and again at the
/// next build from a shell.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()));
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let set_by_cargo = [
            "CARGO_MANIFEST_",
            "CARGO_PKG_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
            || ["OUT_DIR", "CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR"].contains(&name);
        if set_by_cargo {
            cmd.env_remove(name);
        }
    }
    cmd
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
