//! End to end: a gateway whose library nginx's workers cannot read. A
//! checkout in a directory only its owner can read (root's home is 0700)
//! is read by nginx's master, which loads the library in `init_by_lua`,
//! and not by its workers (another user, `nobody` when the tests run as
//! root). The library must load everything it needs in the master.
//!
//! The test copies `gateway/` into a 0700 directory, starts nginx from the
//! copy (`RL_GATEWAY_DIR`, read by the harness), then removes the copy, so
//! that a worker reading anything of the library after the start fails
//! whatever user the workers run as; and drives the paths that loaded
//! code or files on first use: the usage dashboard's page, the rule
//! engine of a Kong plugin configuration (built in a worker), Redis
//! Cluster mode. One test in this binary: it sets the environment.

mod common;
#[path = "common/gateway.rs"]
mod gateway;
#[path = "common/gateway_policy.rs"]
mod gateway_policy;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{fresh_dir, Server};
use gateway::{agent, gateway_dir, get};
use gateway_policy::{start, Front};

/// Copies directory `from` to `to` (`cp -a`: modes kept).
fn copy_dir(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(st.success(), "cp -a {} {}", from.display(), to.display());
}

#[test]
fn a_library_the_workers_cannot_read_is_loaded_by_the_master() {
    let private = fresh_dir("private");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod 700");
    let copy = private.join("gateway");
    copy_dir(&gateway_dir(), &copy);
    std::env::set_var("RL_GATEWAY_DIR", &copy);

    let redis = Server::start(&[]);
    let tiered = "dofile(GW .. \"/examples/tiered.lua\")";
    let cluster = format!(
        "(function() local p = {tiered}; \
         p.redis = {{ mode = \"cluster\", nodes = {{ \"127.0.0.1:{}\" }}, timeout_ms = 1000 }}; \
         return p end)()",
        redis.port
    );
    let gw = start(
        redis.port,
        &[
            Front::Nginx(tiered.into()),
            Front::Kong(tiered.into()),
            Front::Nginx(cluster),
        ],
        &[],
    )
    .expect("start");
    // nothing of the library can be read from now on
    std::fs::remove_dir_all(&private).expect("remove the copy");

    let a = agent();
    let free = [("X-Api-Key", "demo-free-key")];
    // the usage dashboard's page
    let r = get(&a, &format!("{}/_rl/dashboard", gw.url(0)), &[]);
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(r.body.contains("<html"), "{}", r.body);
    // a rule policy of the Kong plugin, built in a worker
    let r = get(&a, &format!("{}/v1/things", gw.url(1)), &free);
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(
        r.must("RateLimit-Policy")
            .contains(r#""free-rate";q=1;w=1"#),
        "{r:#?}"
    );
    // Redis Cluster mode (this Redis is no cluster: without a slot map the
    // commands go to the seed)
    let r = get(&a, &format!("{}/v1/things", gw.url(2)), &free);
    assert_eq!(r.status, 200, "{r:#?}");
    assert!(r.header("RateLimit").is_some(), "{r:#?}");
    let log = gw.nginx.error_log();
    assert!(
        !log.contains("not found:"),
        "a module was loaded late: {log}"
    );
    assert!(!log.contains("Permission denied"), "{log}");
}
