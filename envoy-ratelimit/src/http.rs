//! The HTTP side: `/healthcheck` (200 `OK` while Redis answers and has
//! the rl module, 500 otherwise) and `/metrics` (Prometheus text); and the loop that keeps
//! grpc.health.v1's status in step with Redis.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tonic_health::server::HealthReporter;

use crate::decide::Store;
use crate::listen;
use crate::metrics::Metrics;
use crate::service::RateLimiter;

#[derive(Clone)]
struct Shared {
    store: Store,
    metrics: Arc<Metrics>,
    timeout: Duration,
}

async fn healthcheck(State(s): State<Shared>) -> (StatusCode, &'static str) {
    match s.store.ready(s.timeout).await {
        Ok(()) => (StatusCode::OK, "OK"),
        Err(why) => (StatusCode::INTERNAL_SERVER_ERROR, why),
    }
}

/// Rendered on a blocking thread: with many series it takes long enough
/// to hold up the requests of an async worker.
async fn metrics(State(s): State<Shared>) -> String {
    tokio::task::spawn_blocking(move || s.metrics.render())
        .await
        .unwrap_or_default()
}

/// How the HTTP port bounds its clients.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The most connections at once; past that a new one is closed.
    pub max_connections: usize,
    /// A request's header must arrive within this (else the connection is
    /// closed), as must a new connection's first bytes.
    pub header_timeout: Duration,
    /// A connection is closed (after its request in flight) this long
    /// after it was accepted, idle or not.
    pub max_age: Duration,
}

/// Serves `/healthcheck` and `/metrics` on `listener`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    store: Store,
    metrics_: Arc<Metrics>,
    timeout: Duration,
    limits: Limits,
) {
    let app = Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .with_state(Shared {
            store,
            metrics: metrics_,
            timeout,
        });
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        let conn = listen::accept(&listener, &slots, limits.header_timeout).await;
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let served = builder.serve_connection(hyper_util::rt::TokioIo::new(conn), service);
            tokio::pin!(served);
            tokio::select! {
                _ = &mut served => {}
                _ = tokio::time::sleep(limits.max_age) => {
                    served.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(limits.header_timeout, served).await;
                }
            }
        });
    }
}

/// Every second: SERVING (the whole server and the rate-limit service)
/// while Redis answers and has the rl module, NOT_SERVING otherwise.
pub async fn health_loop(store: Store, reporter: HealthReporter, timeout: Duration) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if store.ready(timeout).await.is_ok() {
            reporter
                .set_serving::<RateLimitServiceServer<RateLimiter>>()
                .await;
            reporter
                .set_service_status("", tonic_health::ServingStatus::Serving)
                .await;
        } else {
            reporter
                .set_not_serving::<RateLimitServiceServer<RateLimiter>>()
                .await;
            reporter
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
        }
    }
}
