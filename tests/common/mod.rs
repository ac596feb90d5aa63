//! Integration-test harness for the `rl` Redis module (the index: each
//! concern lives in its own file, re-exported here).
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
//!
//! Files:
//! * `setup.rs` — binaries, the module, free ports, fresh directories.
//! * `wait.rs` — the one bounded wait loop (`poll_for`, `wait_until`).
//! * `server.rs` — `Server`: one `redis-server` process, started, restarted, killed.
//! * `process.rs` — killing a process tree, pids.
//! * `replica.rs` — replicas of a `Server`, `WAIT`, the AOF configuration.
//! * `cluster.rs` — `Cluster`: a Redis Cluster of local nodes.
//! * `values.rs` — reply helpers (`Value` to integers, strings, arrays; errors).
//! * `decision.rs` — `Decision`: the limiter reply by name.
//! * `clock.rs` — `TimeShift`: a server clock moved by the test.
//! * `calls.rs` — calling the rl commands as text lines; whole-dataset snapshots.
//! * `calendar.rs` — UTC dates as epoch ms, counted independently of the module.
//! * `faults.rs` — the reliability suite: figures, signals, DUMP trailers, raw RESP.
//! * `mutations.rs` — keys of every kind of value, mutations of their bytes.
//! * `fake_master.rs` — a fake master serving RDBs and a stream to a replica.

// Each test binary uses a different subset of this harness.
#![allow(dead_code)]

mod setup;
#[allow(unused_imports)]
pub use self::setup::*;

mod wait;
#[allow(unused_imports)]
pub use self::wait::*;

mod server;
#[allow(unused_imports)]
pub use self::server::*;

mod process;
#[allow(unused_imports)]
pub use self::process::*;

mod replica;
#[allow(unused_imports)]
pub use self::replica::*;

mod cluster;
#[allow(unused_imports)]
pub use self::cluster::*;

mod values;
#[allow(unused_imports)]
pub use self::values::*;

mod decision;
#[allow(unused_imports)]
pub use self::decision::*;

mod clock;
#[allow(unused_imports)]
pub use self::clock::*;

mod calls;
#[allow(unused_imports)]
pub use self::calls::*;

mod calendar;
#[allow(unused_imports)]
pub use self::calendar::*;

mod faults;
#[allow(unused_imports)]
pub use self::faults::*;

mod mutations;
#[allow(unused_imports)]
pub use self::mutations::*;

mod fake_master;
#[allow(unused_imports)]
pub use self::fake_master::*;
