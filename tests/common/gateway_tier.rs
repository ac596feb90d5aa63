//! Shared by the end-to-end tests of the tier form (`tests/gateway.rs`,
//! `gateway_routes.rs`, `gateway_logins.rs`, `gateway_modes.rs`): the API
//! keys of the test policy (`gateway/test/policy.lua`), its figures, and
//! one Redis with one nginx (four front ends) per test.
//!
//! Included next to `common/gateway.rs`:
//! `#[path = "common/gateway_tier.rs"] mod gateway_tier;`.

#![allow(dead_code)]

use std::time::Duration;

use super::common::Server;
use super::gateway::Nginx;

pub const SANDBOX: (&str, &str) = ("X-Api-Key", "k-sandbox");
pub const GROWTH: (&str, &str) = ("X-Api-Key", "k-growth");
pub const GROWTH_2: (&str, &str) = ("X-Api-Key", "k-growth-2");
pub const ENTERPRISE: (&str, &str) = ("X-Api-Key", "k-ent");
/// Long enough for a log-phase timer on a loaded machine.
pub const ASYNC: Duration = Duration::from_secs(10);

/// How long the "slow Redis" test pauses Redis (the test waits for the
/// pause to end).
pub const PAUSE_MS: u64 = 5_000;
/// The test policy's growth key burst and the local limiter's share.
pub const GROWTH_KEY_BURST: u64 = 100;
pub const FALLBACK_RATIO: f64 = 0.25;
/// Seconds a box may have run when a test looks at it.
pub const BOX_SLACK: u64 = 5;

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// A Redis with the module and an nginx with the test policy over it.
pub fn setup() -> (Server, Nginx) {
    let redis = Server::start(&[]);
    let nginx = Nginx::start(redis.port);
    (redis, nginx)
}
