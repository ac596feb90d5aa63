//! rl as Envoy's rate-limit service: envoyproxy/ratelimit's API and
//! configuration, decided in Redis by the rl module (see README.md).

pub mod config;
pub mod decide;
pub mod headers;
pub mod http;
pub mod keys;
pub mod listen;
pub mod metrics;
pub mod reload;
pub mod runtime;
pub mod service;
