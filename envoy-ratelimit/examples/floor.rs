//! The floor of `make bench-envoy` (bench/envoy.sh): the same gRPC stack as
//! rl-envoy (tonic, envoy-types, the multi-threaded tokio runtime),
//! answering `OK` to every ShouldRateLimit without asking Redis.
//!
//! Usage: `floor 127.0.0.1:PORT`.

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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .ok_or("usage: floor 127.0.0.1:PORT")?
        .parse()?;
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Floor))
        .serve(addr)
        .await?;
    Ok(())
}
