//! End-to-end harness for the gateway (`gateway/`): a real nginx (Debian's
//! `nginx-extras` with the Lua module, or OpenResty) in front of a local
//! upstream, talking to a real `redis-server` with the module, driven with
//! real HTTP. Included by the gateway test files with `#[path =
//! "common/gateway.rs"] mod gateway;` (next to `mod common;`). One [`Nginx`] runs one master and two workers with a generated
//! configuration in a fresh temp directory, on free loopback ports:
//! * `main`: the nginx front end (`resty.rl.nginx`) with the test policy
//!   (`gateway/test/policy.lua`);
//! * `legacy`: the same with `legacy_headers = true`;
//! * `shadow`: the same in shadow mode (its own key prefix);
//! * `kong`: the Kong plugin's handler under the PDK shim
//!   (`gateway/test/kong_shim.lua`), its own key prefix;
//! * `upstream`: `gateway/test/upstream.lua`.
//!
//! Dropping it stops nginx (TERM to the process group, then KILL) and
//! removes the directory (unless `RL_KEEP_TEST_DIRS` is set). Environment: `NGINX` (binary, default `nginx`), `NGINX_MODULES`
//! (directory of `ngx_http_lua_module.so`, default `/usr/lib/nginx/modules`;
//! when it is not there, the Lua module is assumed to be built in, as in
//! OpenResty).

#![allow(dead_code)]

use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use super::common::{free_port, fresh_dir, tail};

/// Longest wait for nginx to answer after it was started.
pub const NGINX_READY: Duration = Duration::from_secs(15);
/// Attempts of [`Nginx::start`] when a port was taken meanwhile.
pub const START_ATTEMPTS: usize = 3;
/// Timeout of one HTTP request of the tests.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(20);

/// The `gateway/` directory of the repository, or the copy named by the
/// environment variable `RL_GATEWAY_DIR` (a test of a checkout the
/// workers cannot read sets it).
pub fn gateway_dir() -> PathBuf {
    std::env::var_os("RL_GATEWAY_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("gateway"))
}

/// The nginx binary: env `NGINX`, else `nginx` from `PATH`. Panics with a
/// clear message when it cannot run or has no Lua module.
pub fn nginx_bin() -> String {
    let bin = std::env::var("NGINX").unwrap_or_else(|_| "nginx".to_string());
    let out = Command::new(&bin).arg("-V").output().unwrap_or_else(|e| {
        panic!(
            "cannot run `{bin} -V` ({e}): the gateway tests need nginx with the Lua module; \
             install Debian's nginx-extras, lua-nginx-redis and lua-cjson (`make deps` does)"
        )
    });
    assert!(out.status.success(), "`{bin} -V` failed");
    // -V prints the build (with a built-in Lua module, as OpenResty's) on stderr
    let built_in = String::from_utf8_lossy(&out.stderr).contains("lua");
    assert!(
        built_in || !load_modules().is_empty(),
        "{bin} has no Lua module (neither built in nor in {}): install Debian's \
         nginx-extras (libnginx-mod-http-lua), lua-nginx-redis and lua-cjson (`make deps` does)",
        modules_dir().display()
    );
    bin
}

/// The directory of nginx's dynamic modules: env `NGINX_MODULES`, else
/// Debian's `/usr/lib/nginx/modules`.
fn modules_dir() -> PathBuf {
    PathBuf::from(
        std::env::var("NGINX_MODULES").unwrap_or_else(|_| "/usr/lib/nginx/modules".into()),
    )
}

/// `load_module` lines for the Lua module (and NDK) when they are dynamic
/// modules, nothing when they are not found (built in).
pub fn load_modules() -> String {
    let dir = modules_dir();
    let lua = dir.join("ngx_http_lua_module.so");
    if !lua.is_file() {
        return String::new();
    }
    let mut s = String::new();
    let ndk = dir.join("ndk_http_module.so");
    if ndk.is_file() {
        s += &format!("load_module {};\n", ndk.display());
    }
    s += &format!("load_module {};\n", lua.display());
    s
}

/// The `http {}` lines every test nginx shares: temp paths inside its
/// directory, the Lua path (library, Kong plugin, test helpers) and the
/// shared dicts (counters, the deny cache and the local allowances of rule
/// policies); bodies up to 4 MiB (above the 1 MiB the gateway reads the
/// arguments of, so that its own refusal can be tested).
pub fn http_common() -> String {
    let gw = gateway_dir();
    let gw = gw.display();
    format!(
        r#"    access_log off;
    client_max_body_size 4m;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    lua_package_path "{gw}/lib/?.lua;{gw}/kong/?.lua;{gw}/test/?.lua;/usr/share/lua/5.1/?.lua;;";
    lua_shared_dict rl_metrics 1m;
    lua_shared_dict rl_deny 1m;
    lua_shared_dict rl_allowance 1m;
    lua_shared_dict rl_redis 1m;
    lua_shared_dict rl_usage 1m;
    lua_socket_log_errors off;
"#
    )
}

/// Ports of the servers of one [`Nginx`].
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub main: u16,
    pub legacy: u16,
    pub shadow: u16,
    pub kong: u16,
    pub upstream: u16,
}

/// A running nginx with the gateway configuration.
pub struct Nginx {
    pub dir: PathBuf,
    pub ports: Ports,
    child: Option<Child>,
}

/// The generated nginx.conf: the four front ends and the upstream.
fn nginx_conf(ports: Ports, redis_port: u16) -> String {
    let gw = gateway_dir();
    let gw = gw.display();
    let lua_init = format!(
        r#"
        local policy = dofile("{gw}/test/policy.lua")
        local front = require "resty.rl.nginx"
        local redis = {{ port = {redis_port} }}
        front.configure("main", policy({{ redis = redis }}))
        front.configure("legacy", policy({{ redis = redis, legacy_headers = true }}))
        front.configure("shadow", policy({{ redis = redis, shadow = true, key_prefix = "shadow" }}))
        local shim = require "kong_shim"
        shim.install()
        shim.configure(policy({{ redis = redis, key_prefix = "kong" }}))
        -- everything is loaded by the master: workers run as another user
        -- (nobody) when the tests run as root, and may not read the sources
        require "kong.plugins.rl.handler"
        require "upstream"
"#
    );
    let front = |name: &str, port: u16| {
        format!(
            r#"
    server {{
        listen 127.0.0.1:{port};
        location = /metrics {{
            content_by_lua_block {{ require("resty.rl.observe.metrics").serve("rl_metrics") }}
        }}
        location = /_rl/usage {{ content_by_lua_block {{ require("resty.rl.nginx").usage("{name}") }} }}
        location / {{
            # which worker answered (the local limiter is per worker)
            add_header X-Worker $pid always;
            access_by_lua_block {{ require("resty.rl.nginx").access("{name}") }}
            header_filter_by_lua_block {{ require("resty.rl.nginx").header_filter("{name}") }}
            log_by_lua_block {{ require("resty.rl.nginx").log("{name}") }}
            proxy_pass http://127.0.0.1:{up};
        }}
    }}"#,
            up = ports.upstream
        )
    };
    format!(
        r#"{modules}
worker_processes 2;
daemon off;
master_process on;
pid logs/nginx.pid;
error_log logs/error.log warn;
events {{ worker_connections 512; }}
http {{
{common}    init_by_lua_block {{ {lua_init} }}
{main}
{legacy}
{shadow}
    server {{
        listen 127.0.0.1:{kong};
        location / {{
            access_by_lua_block {{ require("kong_shim").run("access") }}
            header_filter_by_lua_block {{ require("kong_shim").run("header_filter") }}
            log_by_lua_block {{ require("kong_shim").run("log") }}
            proxy_pass http://127.0.0.1:{up};
        }}
    }}
    server {{
        listen 127.0.0.1:{up};
        location / {{
            content_by_lua_block {{ require("upstream").serve() }}
        }}
    }}
}}
"#,
        modules = load_modules(),
        common = http_common(),
        main = front("main", ports.main),
        legacy = front("legacy", ports.legacy),
        shadow = front("shadow", ports.shadow),
        kong = ports.kong,
        up = ports.upstream,
    )
}

impl Nginx {
    /// Starts nginx with the gateway configuration against Redis on
    /// `redis_port`, and waits (bounded) until it answers. A port taken
    /// between [`free_port`] and nginx's bind ("Address already in use")
    /// is retried with new ports, [`START_ATTEMPTS`] times at most.
    pub fn start(redis_port: u16) -> Nginx {
        // fails with a clear message before anything is created
        nginx_bin();
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            let dir = fresh_dir("nginx");
            for sub in ["logs", "tmp"] {
                std::fs::create_dir_all(dir.join(sub)).expect("create nginx dirs");
            }
            let ports = Ports {
                main: free_port(),
                legacy: free_port(),
                shadow: free_port(),
                kong: free_port(),
                upstream: free_port(),
            };
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(ports, redis_port)).expect("write nginx.conf");
            match Nginx::launch(dir, &conf, &[], &[], ports) {
                Ok(nginx) => return nginx,
                Err(e) if e.contains("Address already in use") => last = e,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("nginx: no free ports after {START_ATTEMPTS} attempts: {last}")
    }

    /// Runs `nginx -p dir -c conf [args...] -e dir/logs/error.log` in its
    /// own process group with `env` added (`dir/logs` must exist), and waits
    /// (bounded) until the main, kong and upstream ports of `ports` accept
    /// connections. An error (nginx exited during startup, or never
    /// answered) carries nginx's output and the tail of its error.log.
    pub fn launch(
        dir: PathBuf,
        conf: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        ports: Ports,
    ) -> Result<Nginx, String> {
        let bin = nginx_bin();
        let out = std::fs::File::create(dir.join("logs/stdout.log")).expect("stdout.log");
        let err = out.try_clone().expect("clone file");
        let child = Command::new(&bin)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(conf)
            .args(args)
            .arg("-e")
            .arg(dir.join("logs/error.log"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let mut nginx = Nginx {
            dir,
            ports,
            child: Some(child),
        };
        // on an error, dropping `nginx` stops it and removes the directory
        nginx.wait_ready().map(|()| nginx)
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + NGINX_READY;
        loop {
            let exited = match self.child.as_mut() {
                Some(child) => child.try_wait().ok().flatten(),
                None => None,
            };
            let why = if let Some(status) = exited {
                format!("nginx exited during startup ({status})")
            } else if [self.ports.main, self.ports.kong, self.ports.upstream]
                .iter()
                .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
            {
                return Ok(());
            } else if Instant::now() >= deadline {
                format!("nginx did not answer within {NGINX_READY:?}")
            } else {
                sleep(Duration::from_millis(50));
                continue;
            };
            return Err(format!(
                "{why}\n--- stdout ---\n{}\n--- error.log ---\n{}",
                std::fs::read_to_string(self.dir.join("logs/stdout.log")).unwrap_or_default(),
                tail(&self.error_log(), 40)
            ));
        }
    }

    /// The base URL of a front end port.
    pub fn url(&self, port: u16) -> String {
        format!("http://127.0.0.1:{port}")
    }

    /// Contents of nginx's error.log (where the structured lines go).
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("logs/error.log")).unwrap_or_default()
    }

    /// The structured `rl_event` log lines, parsed.
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.error_log()
            .lines()
            .filter_map(|l| {
                let start = l.find("rl_event {")? + "rl_event ".len();
                // the JSON object, then nginx's " while logging request, client: ..."
                serde_json::Deserializer::from_str(&l[start..])
                    .into_iter::<serde_json::Value>()
                    .next()?
                    .ok()
            })
            .collect()
    }

    /// Errors in error.log (Lua errors, nginx alerts, writes to Lua
    /// globals) other than the
    /// socket errors nginx itself logs when Redis dies under a pooled
    /// connection (a test asserts there are none).
    pub fn lua_errors(&self) -> Vec<String> {
        self.error_log()
            .lines()
            .filter(|l| {
                ["[error]", "[alert]", "[crit]", "global variable"]
                    .iter()
                    .any(|s| l.contains(s))
            })
            .filter(|l| {
                !["recv() failed", "send() failed", "connect() failed"]
                    .iter()
                    .any(|s| l.contains(s))
            })
            .map(str::to_string)
            .collect()
    }

    /// Panics with them when [`Nginx::lua_errors`] finds any.
    pub fn assert_no_lua_errors(&self) {
        let errors = self.lua_errors();
        assert!(errors.is_empty(), "errors in error.log: {errors:#?}");
    }

    /// Stops nginx gracefully: QUIT to the master (the workers finish their
    /// requests and run their exit timers), waiting at most `within`;
    /// false when it is still running then (drop stops it for good).
    pub fn quit(&mut self, within: Duration) -> bool {
        let Some(child) = self.child.as_mut() else {
            return true;
        };
        let _ = Command::new("kill")
            .args(["-QUIT", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                self.child = None;
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// Stops nginx: TERM to its process group (the master and its
    /// workers), then KILL after 5 s; every wait is bounded. The shell's
    /// `kill` needs no procps (dash's takes `-PGID`, not `-- -PGID`).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let group = child.id();
        let signal = |sig: &str| {
            let _ = Command::new("sh")
                .args(["-c", &format!("kill -{sig} -{group} 2>/dev/null")])
                .status();
        };
        let exited = |child: &mut Child, within: Duration| {
            let deadline = Instant::now() + within;
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    return true;
                }
                if Instant::now() >= deadline {
                    return false;
                }
                sleep(Duration::from_millis(20));
            }
        };
        signal("TERM");
        let _ = exited(&mut child, Duration::from_secs(5));
        // workers that outlive their master, or a master that ignored TERM
        signal("KILL");
        let _ = child.kill();
        let _ = exited(&mut child, Duration::from_secs(5));
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- tail of nginx error.log ({}) ---\n{}",
                self.dir.display(),
                tail(&self.error_log(), 30)
            );
        }
        self.stop();
        if std::env::var_os("RL_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[path = "gateway_http.rs"]
mod http;
pub use http::*;
