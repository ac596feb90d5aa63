//! The tokio runtime and the gRPC server that `rl-envoy` and the
//! benchmark's floor service (examples/floor.rs) share, so that the floor
//! differs from the service only by not deciding.

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

/// The gRPC server with the service's settings (tonic's builder: TCP_NODELAY on).
pub fn grpc_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
}
