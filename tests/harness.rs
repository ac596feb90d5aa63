//! Self-tests of the integration-test harness in `tests/common`, run against a
//! plain `redis-server` (no module), so they pass whatever state `src/` is in.

mod common;

use common::*;
use redis::Commands;
use std::time::Duration;

#[test]
fn start_ping_set_get() {
    let server = Server::start_plain(&[]);
    assert!(server.is_alive());
    let mut con = server.client();
    let pong: String = redis::cmd("PING").query(&mut con).expect("PING");
    assert_eq!(pong, "PONG");
    let _: () = con.set("k", "v").expect("SET");
    let v: String = con.get("k").expect("GET");
    assert_eq!(v, "v");
    // The harness defaults are in force and `dir` is the server's dir.
    let dir: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("dir")
        .query(&mut con)
        .expect("CONFIG GET dir");
    let expected = std::fs::canonicalize(&server.dir).expect("canonicalize dir");
    assert_eq!(std::path::PathBuf::from(&dir[1]), expected);
    assert_eq!(
        server.info_get("persistence", "aof_enabled").as_deref(),
        Some("0")
    );
    assert!(server.log().contains("Ready to accept connections"));
}

#[test]
fn extra_args_override_defaults() {
    let server = Server::start_plain(&["--appendonly", "yes", "--maxmemory", "12345678"]);
    assert_eq!(
        server.info_get("persistence", "aof_enabled").as_deref(),
        Some("1")
    );
    let v = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query::<Vec<String>>(&mut server.client())
        .expect("CONFIG GET");
    assert_eq!(v, vec!["maxmemory".to_string(), "12345678".to_string()]);
}

#[test]
fn kill9_and_restart_replays_aof() {
    let server = Server::start_plain(&["--appendonly", "yes", "--appendfsync", "always"]);
    let port = server.port;
    {
        let mut con = server.client();
        for i in 0..100 {
            let _: () = con.set(format!("k{i}"), i).expect("SET");
        }
    }
    server.kill9();
    assert!(!server.is_alive());
    server.kill9(); // idempotent
    server.restart();
    assert!(server.is_alive());
    assert_eq!(server.port, port);
    let mut con = server.client();
    let n: i64 = redis::cmd("DBSIZE").query(&mut con).expect("DBSIZE");
    assert_eq!(n, 100);
    let v: i64 = con.get("k42").expect("GET");
    assert_eq!(v, 42);
}

#[test]
fn shutdown_save_and_restart_loads_rdb() {
    let server = Server::start_plain(&[]);
    let _: () = server.client().set("persisted", "yes").expect("SET");
    server.shutdown(true);
    assert!(!server.is_alive());
    assert!(server.dir.join("dump.rdb").is_file());
    server.restart();
    let v: String = server.client().get("persisted").expect("GET");
    assert_eq!(v, "yes");
}

#[test]
fn replica_replicates_set() {
    let master = Server::start_plain(&[]);
    let replica = start_replica(&master);
    let mut m = master.client();
    let _: () = m.set("rk", "rv").expect("SET on master");
    assert_eq!(wait_replica(&mut m, 1, 5000), 1);
    let v: String = replica.client().get("rk").expect("GET on replica");
    assert_eq!(v, "rv");
    assert_eq!(
        replica.info_get("replication", "role").as_deref(),
        Some("slave")
    );
}

/// Unix time in seconds, by this (unshifted) process.
/// The server's clock in whole seconds.
fn server_secs(server: &Server) -> i64 {
    server_time_us(&mut server.client()) / 1_000_000
}

#[test]
fn timeshift_moves_server_clock_and_expires_keys() {
    let clock = TimeShift::new();
    let server = Server::launch(&clock.prefix(), Flavor::Plain, &[]);
    let skew = server_secs(&server) - now_ms() / 1000;
    assert!(skew.abs() <= 2, "offset 0 but server is {skew} s off");

    clock.advance(Duration::from_secs(2 * 86400));
    let ahead = server_secs(&server) - now_ms() / 1000;
    assert!(
        (2 * 86400 - 5..=2 * 86400 + 5).contains(&ahead),
        "server clock is {ahead} s ahead, expected ~2 days"
    );

    // Key expiry follows the shifted clock.
    let mut con = server.client();
    let _: () = redis::cmd("SET")
        .arg("ttl")
        .arg("v")
        .arg("EX")
        .arg(100)
        .query(&mut con)
        .expect("SET EX");
    clock.advance_ms(101_000);
    let v: Option<String> = con.get("ttl").expect("GET");
    assert_eq!(v, None, "key should have expired after a 101 s jump");

    // The shift survives a restart while `clock` lives; it can go backwards.
    server.restart();
    clock.set_ms(-3_600_000);
    assert_eq!(clock.offset_ms(), -3_600_000);
    let behind = now_ms() / 1000 - server_secs(&server);
    assert!(
        (3600 - 5..=3600 + 5).contains(&behind),
        "behind by {behind} s"
    );
}

#[test]
fn forking_wrapper_is_killed_completely() {
    // `sh -c '...; :'` forks redis-server instead of exec'ing it, like
    // `faketime` does: kill9 must reach redis-server itself.
    let wrapper = ["sh", "-c", "\"$@\"; :", "sh"];
    let server = Server::launch(&wrapper, Flavor::Plain, &[]);
    let pid: u32 = server
        .info_get("server", "process_id")
        .expect("process_id")
        .parse()
        .expect("pid");
    assert!(pid_alive(pid));
    server.kill9();
    assert!(!pid_alive(pid), "redis-server (pid {pid}) survived kill9");
    server.restart();
    assert!(server.is_alive());
}

#[test]
fn cluster_set_get_and_crossslot() {
    let cluster = Cluster::start_plain(3, 0);
    assert_eq!(cluster.nodes.len(), 3);
    assert_eq!(cluster.masters().len(), 3);

    let mut c = cluster.client();
    for key in ["a", "b", "c", "{user1}x"] {
        let _: () = c.set(key, format!("v-{key}")).expect("cluster SET");
    }
    for key in ["a", "b", "c", "{user1}x"] {
        let v: String = c.get(key).expect("cluster GET");
        assert_eq!(v, format!("v-{key}"));
    }

    // `a` and `b` hash to different slots: a node rejects a multi-key write.
    assert_ne!(key_slot(b"a"), key_slot(b"b"));
    let mut node = cluster.nodes[0].client();
    let r: redis::RedisResult<()> = redis::cmd("MSET")
        .arg("a")
        .arg(1)
        .arg("b")
        .arg(2)
        .query(&mut node);
    let e = expect_err(r, "CROSSSLOT");
    assert_eq!(e.kind(), redis::ErrorKind::CrossSlot);

    // The owner of a key's slot serves it directly.
    let owner = cluster.master_for_key(b"a");
    let v: String = owner.client().get("a").expect("GET on owner");
    assert_eq!(v, "v-a");
}

#[test]
fn cluster_with_replicas() {
    let cluster = Cluster::start_plain(3, 1);
    assert_eq!(cluster.nodes.len(), 6);
    assert_eq!(cluster.masters().len(), 3);
    for range in cluster.slots() {
        assert_eq!(range.3.len(), 1, "one replica per master: {range:?}");
    }
    let mut c = cluster.client();
    let _: () = c.set("k", "v").expect("cluster SET");
    let owner = cluster.master_for_key(b"k");
    assert_eq!(wait_replica(&mut owner.client(), 1, 5000), 1);
}

#[test]
fn reply_helpers() {
    use redis::Value;
    let v = Value::Array(vec![Value::Int(1), Value::BulkString(b"-2".to_vec())]);
    assert_eq!(int_array(v), vec![1, -2]);
    let v = Value::Array(vec![Value::Okay, Value::SimpleString("x".into())]);
    assert_eq!(str_array(v), vec!["OK".to_string(), "x".to_string()]);
    let v = Value::Array(vec![Value::BulkString(b"k".to_vec()), Value::Int(7)]);
    let p = pairs(v);
    assert_eq!(p[0].0, "k");
    assert_eq!(value_i64(&p[0].1), 7);
    assert_eq!(
        info_field("a:1\r\nrole:master\r\n", "role").as_deref(),
        Some("master")
    );
    assert_eq!(tail("1\n2\n3", 2), "2\n3");
    let mut waited = 0;
    wait_until(Duration::from_secs(1), "counter", || {
        waited += 1;
        waited >= 3
    });
}
