//! `rl-envoy`: Envoy's rate-limit service on rl (see README.md).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use clap::Parser;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;

use envoy_ratelimit::config::Config;
use envoy_ratelimit::decide::{SentinelStore, Store};
use envoy_ratelimit::keys::HashTag;
use envoy_ratelimit::metrics::Metrics;
use envoy_ratelimit::service::{Options, RateLimiter};
use envoy_ratelimit::{http, listen, reload, runtime};

/// Envoy's rate-limit service (envoy.service.ratelimit.v3), deciding in
/// Redis with the rl module; reads envoyproxy/ratelimit's configuration.
#[derive(Parser, Debug)]
#[command(name = "rl-envoy", version, about)]
struct Args {
    /// Directory of YAML files (envoyproxy/ratelimit's format), reloaded on change.
    #[arg(long, env = "RL_ENVOY_CONFIG_DIR")]
    config_dir: std::path::PathBuf,
    /// gRPC listen address (ShouldRateLimit, grpc.health.v1).
    #[arg(long, env = "RL_ENVOY_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    grpc_addr: std::net::SocketAddr,
    /// HTTP listen address (/healthcheck, /metrics).
    #[arg(long, env = "RL_ENVOY_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: std::net::SocketAddr,
    /// Redis URL (redis://, rediss://, redis+unix://).
    #[arg(
        long,
        env = "RL_ENVOY_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    redis_url: String,
    /// Redis Cluster seed nodes, comma-separated URLs (instead of --redis-url).
    #[arg(long, env = "RL_ENVOY_REDIS_CLUSTER", value_delimiter = ',')]
    redis_cluster: Vec<String>,
    /// Redis Sentinel addresses, comma-separated URLs (instead of
    /// --redis-url): the service follows the primary they name.
    #[arg(long, env = "RL_ENVOY_REDIS_SENTINEL", value_delimiter = ',')]
    redis_sentinel: Vec<String>,
    /// The master name the sentinels monitor.
    #[arg(
        long,
        env = "RL_ENVOY_REDIS_SENTINEL_MASTER",
        default_value = "mymaster"
    )]
    redis_sentinel_master: String,
    /// The longest wait for Redis per request, in milliseconds; then the
    /// answer is the gRPC error UNAVAILABLE.
    #[arg(long, env = "RL_ENVOY_REDIS_TIMEOUT_MS", default_value_t = 250)]
    redis_timeout_ms: u64,
    /// Prefix of every Redis key.
    #[arg(long, env = "RL_ENVOY_KEY_PREFIX", default_value = "rl-envoy:")]
    key_prefix: String,
    /// How keys share Redis Cluster slots: `first-entry` or `domain`.
    #[arg(
        long,
        env = "RL_ENVOY_HASH_TAG",
        value_enum,
        default_value = "first-entry"
    )]
    hash_tag: HashTag,
    /// Requests with more descriptors are refused with INVALID_ARGUMENT.
    #[arg(long, env = "RL_ENVOY_MAX_DESCRIPTORS", default_value_t = 1000)]
    max_descriptors: usize,
    /// Also send X-RateLimit-Limit / -Remaining / -Reset (the peer's
    /// RESPONSE_HEADERS_ENABLED).
    #[arg(long, env = "RL_ENVOY_LEGACY_HEADERS")]
    legacy_headers: bool,
    /// How often the configuration directory is checked for changes, in ms.
    #[arg(long, env = "RL_ENVOY_RELOAD_MS", default_value_t = 1000)]
    reload_ms: u64,
    /// Threads of the service: 1 handles everything on one thread (the
    /// fewest CPU cycles per request: see README.md), 0 one per core.
    #[arg(long, env = "RL_ENVOY_WORKER_THREADS", default_value_t = 0)]
    worker_threads: usize,
    /// The most connections at once on the gRPC port; past that a new
    /// one is closed at once.
    #[arg(long, env = "RL_ENVOY_MAX_CONNECTIONS", default_value_t = 1024)]
    max_connections: usize,
    /// The most connections at once on the HTTP port.
    #[arg(long, env = "RL_ENVOY_HTTP_MAX_CONNECTIONS", default_value_t = 64)]
    http_max_connections: usize,
    /// How long a new connection (either port) may wait before its first
    /// bytes, and an HTTP request for its header, in ms; then it is closed.
    #[arg(long, env = "RL_ENVOY_CLIENT_TIMEOUT_MS", default_value_t = 10_000)]
    client_timeout_ms: u64,
    /// Logs as JSON lines instead of text.
    #[arg(long, env = "RL_ENVOY_LOG_JSON")]
    log_json: bool,
    /// The most detailed log level: error, warn, info, debug (one line per
    /// decision) or trace.
    #[arg(long, env = "RL_ENVOY_LOG_LEVEL", default_value = "info")]
    log_level: tracing::Level,
}

async fn connect(args: &Args, timeout: Duration) -> redis::RedisResult<Store> {
    if !args.redis_sentinel.is_empty() {
        let store = SentinelStore::new(
            args.redis_sentinel.clone(),
            args.redis_sentinel_master.clone(),
            timeout,
        )?;
        Ok(Store::Sentinel(std::sync::Arc::new(store)))
    } else if args.redis_cluster.is_empty() {
        let client = redis::Client::open(args.redis_url.as_str())?;
        let cfg = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_number_of_retries(1)
            .set_max_delay(100);
        let conn = redis::aio::ConnectionManager::new_with_config(client, cfg).await?;
        Ok(Store::Single(Box::new(conn)))
    } else {
        let client = redis::cluster::ClusterClientBuilder::new(args.redis_cluster.clone())
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(2)
            .build()?;
        Ok(Store::Cluster(client.get_async_connection().await?))
    }
}

fn main() {
    let args = Args::parse();
    let logs = tracing_subscriber::fmt().with_max_level(args.log_level);
    if args.log_json {
        logs.json().init();
    } else {
        logs.init();
    }
    let result = runtime::build(args.worker_threads)
        .map_err(|e| format!("cannot start the runtime: {e}").into())
        .and_then(|rt| rt.block_on(run(args)));
    if let Err(e) = result {
        tracing::error!("{e}");
        eprintln!("rl-envoy: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let timeout = Duration::from_millis(args.redis_timeout_ms);
    let metrics = Arc::new(Metrics::new());
    let files = reload::read_dir(&args.config_dir)?;
    let config = Config::load(&files)?;
    metrics.config_load_success.inc();
    let config = Arc::new(RwLock::new(Arc::new(config)));
    let store = connect(&args, timeout)
        .await
        .map_err(|e| format!("cannot connect to Redis: {e}"))?;
    if let Err(why) = store.ready(timeout).await {
        tracing::error!(
            "{why}: every decision fails and the health checks say so until it is fixed"
        );
    }
    tokio::spawn(reload::watch(
        args.config_dir.clone(),
        files,
        config.clone(),
        metrics.clone(),
        Duration::from_millis(args.reload_ms),
    ));
    let service = RateLimiter {
        config,
        store: store.clone(),
        metrics: metrics.clone(),
        options: Options {
            key_prefix: args.key_prefix.clone(),
            hash_tag: args.hash_tag,
            redis_timeout: timeout,
            max_descriptors: args.max_descriptors,
            legacy_headers: args.legacy_headers,
        },
    };
    let (reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(http::health_loop(store.clone(), reporter, timeout));
    let client_timeout = Duration::from_millis(args.client_timeout_ms);
    let listener = tokio::net::TcpListener::bind(args.http_addr).await?;
    let limits = http::Limits {
        max_connections: args.http_max_connections.max(1),
        header_timeout: client_timeout,
        max_age: Duration::from_secs(60),
    };
    tokio::spawn(http::serve(listener, store, metrics, timeout, limits));
    let grpc = tokio::net::TcpListener::bind(args.grpc_addr).await?;
    let incoming = listen::incoming(grpc, args.max_connections.max(1), client_timeout);
    tracing::info!(grpc = %args.grpc_addr, http = %args.http_addr, "serving");
    runtime::grpc_server()
        .add_service(health)
        .add_service(RateLimitServiceServer::new(service))
        .serve_with_incoming_shutdown(incoming, stop_signal())
        .await?;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (what a service manager or
/// Kubernetes sends): the gRPC server then finishes its calls in flight.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = async {
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = term => tracing::info!("SIGTERM: shutting down"),
    }
}
