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

/// Serves `/healthcheck` and `/metrics` on `listener`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    store: Store,
    metrics_: Arc<Metrics>,
    timeout: Duration,
) {
    let app = Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .with_state(Shared {
            store,
            metrics: metrics_,
            timeout,
        });
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "http server stopped");
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
