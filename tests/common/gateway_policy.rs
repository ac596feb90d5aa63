//! Harness for gateways running a rule policy (`gateway/examples/`,
//! policies written by a test): one nginx (master + 2 workers) with one
//! front end per policy, each on its own free loopback port, over the test
//! upstream (`gateway/test/upstream.lua`), against a real redis-server.
//!
//! Included next to `common/gateway.rs`:
//! `#[path = "common/gateway_policy.rs"] mod gateway_policy;`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::common::{free_port, fresh_dir};
use super::gateway::{gateway_dir, http_common, load_modules, Nginx, Ports, Resp, START_ATTEMPTS};

/// The JWT secret the tests give nginx (`RL_JWT_SECRET`).
pub const JWT_SECRET: &str = "test-jwt-secret";

/// One front end: a Lua expression that evaluates to the policy (`GW` is
/// the gateway directory, `DIR` the test's nginx directory), run by the
/// nginx front end or by the Kong plugin under the PDK shim (whose
/// `policy` field carries the policy as JSON through the plugin schema).
#[derive(Clone, Debug)]
pub enum Front {
    Nginx(String),
    /// The nginx front end in a location without `body_filter_by_lua`.
    NginxWithoutBodyFilter(String),
    Kong(String),
}

/// A running nginx with rule-policy front ends.
pub struct PolicyGateway {
    pub nginx: Nginx,
    /// One port per front end, in the order given.
    pub ports: Vec<u16>,
}

impl PolicyGateway {
    /// The base URL of front end `i`.
    pub fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    /// Sends SIGHUP to the nginx master (a reload: init_by_lua runs again
    /// with the policy files as they are now).
    pub fn reload(&self) {
        let pid =
            std::fs::read_to_string(self.nginx.dir.join("logs/nginx.pid")).expect("nginx.pid");
        let st = Command::new("kill")
            .args(["-HUP", pid.trim()])
            .status()
            .expect("kill -HUP");
        assert!(st.success(), "kill -HUP {pid}");
    }
}

fn conf_text(fronts: &[Front], ports: &[u16], upstream: u16, dir: &Path) -> String {
    let gw = gateway_dir();
    let gw = gw.display();
    let mut init = format!(
        "GW = \"{gw}\"\nDIR = \"{}\"\nlocal front = require \"resty.rl.nginx\"\n",
        dir.display()
    );
    let mut servers = String::new();
    for (i, f) in fronts.iter().enumerate() {
        let port = ports[i];
        // the usage dashboard's locations (resty.rl.report.usage), nginx front ends only
        let mut usage = String::new();
        let handler = match f {
            Front::Nginx(expr) | Front::NginxWithoutBodyFilter(expr) => {
                init += &format!("front.configure(\"f{i}\", {expr})\n");
                let h = |phase: &str| format!("require(\"resty.rl.nginx\").{phase}(\"f{i}\")");
                for page in ["usage", "dashboard"] {
                    usage += &format!(
                        "        location = /_rl/{page} {{ content_by_lua_block {{ {} }} }}\n",
                        h(page)
                    );
                }
                let body = match f {
                    Front::Nginx(_) => {
                        format!("body_filter_by_lua_block {{ {} }}", h("body_filter"))
                    }
                    _ => String::new(),
                };
                (h("access"), h("header_filter"), h("log"), body)
            }
            Front::Kong(expr) => {
                init += &format!(
                    "local shim = require \"kong_shim\"\nshim.install()\n\
                     shim.configure({{ policy = require(\"cjson\").encode({expr}) }})\n\
                     require \"kong.plugins.rl.handler\"\n"
                );
                let h = |phase: &str| format!("require(\"kong_shim\").run(\"{phase}\")");
                let body = format!("body_filter_by_lua_block {{ {} }}", h("body_filter"));
                (h("access"), h("header_filter"), h("log"), body)
            }
        };
        servers += &format!(
            r#"
    server {{
        listen 127.0.0.1:{port};
        location = /metrics {{
            content_by_lua_block {{ require("resty.rl.observe.metrics").serve("rl_metrics") }}
        }}
{usage}        location / {{
            access_by_lua_block {{ {} }}
            header_filter_by_lua_block {{ {} }}
            {}
            log_by_lua_block {{ {} }}
            proxy_pass http://127.0.0.1:{upstream};
        }}
    }}"#,
            handler.0, handler.1, handler.3, handler.2
        );
    }
    init += "require \"upstream\"\n";
    format!(
        r#"{modules}
worker_processes 2;
daemon off;
master_process on;
pid logs/nginx.pid;
error_log logs/error.log warn;
env RL_REDIS_HOST;
env RL_REDIS_PORT;
env RL_REDIS_MODE;
env RL_REDIS_NODES;
env RL_REDIS_SENTINELS;
env RL_REDIS_MASTER_NAME;
env RL_JWT_SECRET;
env RL_REDIS_TIMEOUT_MS;
env RL_REGIONS;
events {{ worker_connections 512; }}
http {{
{common}    init_by_lua_block {{
{init}    }}
{servers}
    server {{
        listen 127.0.0.1:{upstream};
        location / {{ content_by_lua_block {{ require("upstream").serve() }} }}
    }}
}}
"#,
        modules = load_modules(),
        common = http_common(),
    )
}

/// Starts nginx with `fronts` against Redis on `redis_port` (given to the
/// policies as `RL_REDIS_PORT`, with `RL_JWT_SECRET` and a Redis budget of
/// 1000 ms, `RL_REDIS_TIMEOUT_MS`: no test here pauses Redis). `files` are written
/// into the nginx directory first (policies a test rewrites before a
/// reload). A port taken meanwhile is retried with new ports; any other
/// failure (a bad policy) is returned with nginx's output.
pub fn start(
    redis_port: u16,
    fronts: &[Front],
    files: &[(&str, &str)],
) -> Result<PolicyGateway, String> {
    start_with_env(redis_port, fronts, files, &[])
}

/// [`start`] with `extra` environment variables for the policies (each
/// one declared by an `env` line of the configuration, e.g. `RL_REGIONS`).
pub fn start_with_env(
    redis_port: u16,
    fronts: &[Front],
    files: &[(&str, &str)],
    extra: &[(&str, &str)],
) -> Result<PolicyGateway, String> {
    let mut last = String::new();
    for _ in 0..START_ATTEMPTS {
        let dir = fresh_dir("nginx-policy");
        for sub in ["logs", "tmp"] {
            std::fs::create_dir_all(dir.join(sub)).expect("create nginx dirs");
        }
        for (name, text) in files {
            std::fs::write(dir.join(name), text).expect("write policy file");
        }
        let ports: Vec<u16> = fronts.iter().map(|_| free_port()).collect();
        let upstream = free_port();
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, conf_text(fronts, &ports, upstream, &dir)).expect("nginx.conf");
        let redis = redis_port.to_string();
        let mut env = vec![
            ("RL_REDIS_HOST", "127.0.0.1"),
            ("RL_REDIS_PORT", redis.as_str()),
            ("RL_JWT_SECRET", JWT_SECRET),
            // a loaded 2-core machine must not time out by accident
            ("RL_REDIS_TIMEOUT_MS", "1000"),
        ];
        env.extend_from_slice(extra);
        let wait = Ports {
            main: ports[0],
            legacy: ports[0],
            shadow: ports[0],
            kong: *ports.last().expect("a front end"),
            upstream,
        };
        match Nginx::launch(dir, &conf, &[], &env, wait) {
            Ok(nginx) => return Ok(PolicyGateway { nginx, ports }),
            Err(e) if e.contains("Address already in use") => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(format!(
        "no free ports after {START_ATTEMPTS} attempts: {last}"
    ))
}

/// The rlctl binary of the build the module under test comes from (built
/// now if missing or stale: `cargo build [--release] -p rlctl`).
pub fn rlctl_bin() -> PathBuf {
    let module = super::common::module_path();
    let dir = module.parent().expect("the module's directory");
    let mut build = super::common::cargo();
    build
        .args(["build", "-p", "rlctl", "--quiet"])
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if dir.ends_with("release") {
        build.arg("--release");
    }
    assert!(
        build.status().expect("cargo build -p rlctl").success(),
        "cargo build -p rlctl failed"
    );
    let bin = dir.join("rlctl");
    assert!(bin.is_file(), "{} not found", bin.display());
    bin
}

/// The nginx front end of an example of `gateway/examples/`, as shipped.
pub fn example(name: &str) -> Front {
    Front::Nginx(format!("dofile(GW .. \"/examples/{name}.lua\")"))
}

/// A path inside the gateway directory.
pub fn gateway_path(rel: &str) -> PathBuf {
    gateway_dir().join(rel)
}

/// An HS256 JWT with `claims` (and an `exp` an hour from now), signed
/// with `secret`.
pub fn jwt(claims: serde_json::Value, secret: &str) -> String {
    let mut claims = claims;
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
    claims["exp"] = exp.into();
    let head = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("hmac key");
    mac.update(format!("{head}.{body}").as_bytes());
    let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{head}.{body}.{sig}")
}

/// `POST url` with `headers` and a JSON body.
pub fn post_json(
    agent: &ureq::Agent,
    url: &str,
    headers: &[(&str, &str)],
    body: serde_json::Value,
) -> Resp {
    let mut req = agent.post(url).set("Content-Type", "application/json");
    for (k, v) in headers {
        req = req.set(k, v);
    }
    super::gateway::into_resp(req.send_string(&body.to_string()))
}

/// A login attempt at `url` (the token endpoint) for `who` with `secret`
/// from client `ip` (`X-Forwarded-For`, behind a trusted proxy).
pub fn login(agent: &ureq::Agent, url: &str, who: &str, secret: &str, ip: &str) -> Resp {
    super::gateway::post_form(
        agent,
        url,
        &[("X-Forwarded-For", ip)],
        &[("client_id", who), ("client_secret", secret)],
    )
}

/// The SHA-1 hex of an API key: its identity store record is
/// `<prefix>:id:key:<this>`.
pub fn key_record(prefix: &str, api_key: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("printf %s '{api_key}' | sha1sum")])
        .output()
        .expect("sha1sum");
    let hex = String::from_utf8_lossy(&out.stdout);
    format!(
        "{prefix}:id:key:{}",
        hex.split_whitespace().next().unwrap_or("")
    )
}

/// `HSET key f1 v1 ...` (identity store records).
pub fn hset(con: &mut redis::Connection, key: &str, fields: &[(&str, &str)]) {
    let mut c = redis::cmd("HSET");
    c.arg(key);
    for (f, v) in fields {
        c.arg(*f).arg(*v);
    }
    let _: i64 = c.query(con).expect("HSET");
}

/// The entries of the alert stream, as field maps.
pub fn alerts(
    con: &mut redis::Connection,
    stream: &str,
) -> Vec<std::collections::HashMap<String, String>> {
    let v: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(con)
        .expect("XRANGE");
    v.into_iter()
        .map(|(_, kv)| {
            kv.chunks(2)
                .filter(|c| c.len() == 2)
                .map(|c| (c[0].clone(), c[1].clone()))
                .collect()
        })
        .collect()
}
