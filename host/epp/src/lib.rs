//! Switchyard as an endpoint picker (EPP) for the Gateway API Inference Extension: Envoy's
//! `ext_proc` gRPC service in front of the gateway's own decision. Envoy streams each request's
//! headers and body here; the picker decodes, tokenizes, admits and routes it exactly as
//! `switchyard serve` would (the same [`Picker`]), answers with the chosen endpoint in the
//! `x-gateway-destination-endpoint` header and in the `envoy.lb` dynamic metadata, streams the
//! body back unchanged, and watches the response go by so that the request's booking lasts as
//! long as the request does. Only the transport differs from the gateway.
//!
//! Also served: gRPC health (`liveness`, `readiness` and the ext_proc service name), readiness
//! following whether any worker is healthy.

#![forbid(unsafe_code)]

mod envoy;
mod processor;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use std::net::SocketAddr;
use std::time::Duration;
pub use switchyard_gateway::proxy::Picker;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;

pub use processor::Processor;

/// The header (and `envoy.lb` metadata key) naming the picked endpoints, best first.
pub const DESTINATION_ENDPOINT: &str = "x-gateway-destination-endpoint";
/// The metadata key, in namespace [`SUBSET_NAMESPACE`], of the endpoints the proxy allows.
pub const DESTINATION_SUBSET: &str = "x-gateway-destination-endpoint-subset";
/// The metadata namespace of the subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The response header the proxy reports the endpoint that served in.
pub const DESTINATION_SERVED: &str = "x-gateway-destination-endpoint-served";
/// The namespace of the dynamic metadata the picked endpoints go in.
pub const LB_NAMESPACE: &str = "envoy.lb";

/// The gRPC service name of ext_proc, as health checks name it.
const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// Why the picker could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listener could not bind.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("grpc server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Bind the picker's gRPC listener (port 0: any free port).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Serve ext_proc and gRPC health on `listener` until `shutdown`; streams in flight then end.
pub async fn serve(
    listener: TcpListener,
    picker: Picker,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("liveness", ServingStatus::Serving)
        .await;
    let readiness = tokio::spawn(follow_readiness(reporter, picker.clone(), shutdown.clone()));
    let result = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(ExternalProcessorServer::new(Processor::new(picker)))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown.cancelled_owned())
        .await;
    readiness.abort();
    Ok(result?)
}

/// Readiness (and the ext_proc service's status) is "some worker is healthy", checked each second.
async fn follow_readiness(
    reporter: tonic_health::server::HealthReporter,
    picker: Picker,
    shutdown: CancellationToken,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = ticker.tick() => {}
        }
        let status = if picker.ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in ["readiness", "", EXT_PROC_SERVICE] {
            reporter.set_service_status(service, status).await;
        }
    }
    for service in ["liveness", "readiness", "", EXT_PROC_SERVICE] {
        reporter
            .set_service_status(service, ServingStatus::NotServing)
            .await;
    }
}
