//! The tokio runtime and the gRPC server that `rl-envoy` and the
//! benchmark's floor service (examples/floor.rs) share, so that the floor
//! differs from the service only by not deciding.

use std::time::Duration;

use tokio::runtime::{Builder, Runtime};

/// A runtime of `worker_threads` threads. `1` runs every task on the
/// calling thread (tokio's current-thread scheduler): requests that arrive
/// together are all handled before the Redis connection's task runs, which
/// then writes their commands in one pipeline, and no task is woken across
/// threads. `0` means one worker per core.
pub fn build(worker_threads: usize) -> std::io::Result<Runtime> {
    let mut builder = if worker_threads == 1 {
        Builder::new_current_thread()
    } else {
        let mut b = Builder::new_multi_thread();
        if worker_threads > 1 {
            b.worker_threads(worker_threads);
        }
        b
    };
    builder.enable_all().build()
}

/// The gRPC server with the service's settings: TCP_NODELAY on (tonic's
/// default), an HTTP/2 ping every 30 s on each connection, closed when
/// unanswered for 10 s, and a call that runs longer than 30 s answered with
/// an error.
pub fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .timeout(Duration::from_secs(30))
}
