//! The floor of `make bench-envoy` (bench/envoy.sh): the same gRPC stack as
//! rl-envoy (tonic, envoy-types, the runtime and server of
//! `envoy_ratelimit::runtime`), answering `OK` to every ShouldRateLimit
//! without asking Redis.
//!
//! Usage: `floor 127.0.0.1:PORT [WORKER_THREADS]` (threads as rl-envoy's
//! `--worker-threads`, default 0: one per core).

use envoy_ratelimit::runtime;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

struct Floor;

#[tonic::async_trait]
impl RateLimitService for Floor {
    async fn should_rate_limit(
        &self,
        _request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        }))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: floor 127.0.0.1:PORT [WORKER_THREADS]";
    let mut args = std::env::args().skip(1);
    let addr = args.next().ok_or(usage)?.parse()?;
    let threads = args.next().map(|t| t.parse()).transpose()?.unwrap_or(0);
    runtime::build(threads)?.block_on(async {
        runtime::grpc_server()
            .add_service(RateLimitServiceServer::new(Floor))
            .serve(addr)
            .await
    })?;
    Ok(())
}
