//! The real CRI client: one tonic channel over the runtime's unix socket, shared by the runtime
//! and image services (upstream `k8s.io/cri-client/pkg` `remote_runtime.go` and
//! `remote_image.go`, with kuberuntime's `instrumented_services.go` metrics folded in).
//!
//! Every call carries a deadline, both as the `grpc-timeout` header (so the runtime can give up
//! too) and enforced here: `runtimeRequestTimeout` (default 2 min), twice that for
//! `RunPodSandbox`, plus the grace period for `StopContainer` and plus the command's timeout for
//! `ExecSync` (none when that is zero), as upstream. Upstream puts no deadline on `PullImage`
//! (only cancellation); [`GrpcRuntimeConfig::pull_image_timeout`] keeps that default and lets
//! the configuration bound it. Not here: retries and back-off (callers' policy), stats. The
//! streaming calls (`Exec`, `Attach`, `PortForward`) only get a URL here (`streaming.rs`).

mod image;
mod runtime;
mod streaming;

use std::{
    future::Future,
    path::PathBuf,
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    VersionResponse, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::{
    Error, Operation, Result, RuntimeMetrics, RuntimeService as _, error::EndpointProblem,
};

/// The kubelet's `maxMsgSize`: gRPC's default 4 MiB is too small for a `ListContainers` on a
/// busy node.
const MAX_MESSAGE_SIZE: usize = 16 * 1024 * 1024;

/// How to reach and talk to the runtime.
#[derive(Clone, Debug)]
pub struct GrpcRuntimeConfig {
    /// `unix:///path/to.sock` or a plain socket path (`--runtime-endpoint`).
    pub endpoint: String,
    /// The deadline of an ordinary call (the kubelet's `runtimeRequestTimeout`); also the
    /// deadline of the `Version` call that checks the connection.
    pub request_timeout: Duration,
    /// The deadline of `PullImage`; `None` (the default, as upstream) waits until the caller
    /// gives up.
    pub pull_image_timeout: Option<Duration>,
}

impl GrpcRuntimeConfig {
    pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
    /// The kubelet's default `runtimeRequestTimeout`.
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

    pub fn new(endpoint: impl Into<String>) -> Self {
        GrpcRuntimeConfig {
            endpoint: endpoint.into(),
            request_timeout: Self::DEFAULT_REQUEST_TIMEOUT,
            pull_image_timeout: None,
        }
    }
}

/// A connected CRI runtime; implements [`super::RuntimeService`] and [`super::ImageService`].
/// Cheap to share behind an `Arc`: the channel multiplexes concurrent calls.
pub struct GrpcRuntime {
    endpoint: String,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    request_timeout: Duration,
    pull_image_timeout: Option<Duration>,
    metrics: RuntimeMetrics,
    version: VersionResponse,
}

impl GrpcRuntime {
    /// Connects and checks the connection with a `Version` call (upstream
    /// `validateServiceConnection`): an endpoint that does not answer CRI v1 is an error here,
    /// not at the first pod.
    pub async fn connect(config: GrpcRuntimeConfig, metrics: RuntimeMetrics) -> Result<Self> {
        let path = socket_path(&config.endpoint)?;
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        });
        // The URI only supplies the HTTP/2 authority (upstream uses "localhost" too); the
        // connector ignores it. Lazy: the Version call below makes the first connection and
        // reports its failure with the runtime's own words.
        let channel =
            Endpoint::from_static("http://localhost").connect_with_connector_lazy(connector);
        let runtime = RuntimeServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        let images = ImageServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_MESSAGE_SIZE);
        let mut client = GrpcRuntime {
            endpoint: config.endpoint,
            runtime,
            images,
            request_timeout: config.request_timeout,
            pull_image_timeout: config.pull_image_timeout,
            metrics,
            version: VersionResponse::default(),
        };
        client.version = match client.version().await {
            Ok(version) => version,
            Err(Error::DeadlineExceeded { timeout, .. }) => {
                return Err(Error::no_answer(&client.endpoint, timeout));
            }
            // Something answers, but not CRI (an HTTP/1 socket gives "h2 protocol error").
            Err(Error::Runtime { message, .. }) => {
                return Err(Error::not_cri(&client.endpoint, message));
            }
            Err(e) => return Err(e),
        };
        tracing::info!(
            endpoint = %client.endpoint,
            runtime = %client.version.runtime_name,
            runtime_version = %client.version.runtime_version,
            api_version = %client.version.runtime_api_version,
            "connected to the container runtime"
        );
        Ok(client)
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The `Version` answer of the connection check.
    pub fn version_info(&self) -> &VersionResponse {
        &self.version
    }

    /// One call: deadline, status mapping, response check, metrics. `check` turns the response
    /// into the result or names the required field the runtime left out.
    async fn call<T, U>(
        &self,
        operation: Operation,
        id: &str,
        timeout: Option<Duration>,
        exchange: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
        check: impl FnOnce(T) -> Result<U, &'static str>,
    ) -> Result<U> {
        let start = Instant::now();
        let outcome = match timeout {
            Some(limit) => tokio::time::timeout(limit, exchange).await.ok(),
            None => Some(exchange.await),
        };
        let deadline_passed = timeout.is_some_and(|limit| start.elapsed() >= limit);
        let result = match outcome {
            Some(Ok(response)) => {
                check(response.into_inner()).map_err(|problem| Error::InvalidResponse {
                    operation,
                    id: id.to_owned(),
                    problem,
                })
            }
            Some(Err(status)) if !deadline_passed => Err(Error::from_status(
                operation,
                id,
                &self.endpoint,
                timeout,
                status,
            )),
            // Our timer fired, or tonic (which enforces the grpc-timeout header on its side too
            // and reports it as Cancelled) noticed first: either way the deadline passed.
            _ => Err(Error::DeadlineExceeded {
                operation,
                id: id.to_owned(),
                timeout,
                message: "the client's deadline passed".to_owned(),
            }),
        };
        self.metrics
            .observe(operation, start.elapsed(), result.is_err());
        if let Err(error) = &result {
            // Callers decide what a failure means (a NotFound is routine); keep it quiet here.
            tracing::debug!(%error, "CRI call failed");
        }
        result
    }
}

/// A request with its deadline in the `grpc-timeout` header.
fn request<M>(message: M, timeout: Option<Duration>) -> tonic::Request<M> {
    let mut request = tonic::Request::new(message);
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    request
}

/// CRI carries durations as whole seconds.
fn whole_seconds(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX)
}

/// The socket path of `--runtime-endpoint`: `unix:///path` or a plain path (upstream
/// `GetAddressAndDialer` falls back to unix for a scheme-less endpoint too).
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    let refuse = |problem| Error::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        problem,
    };
    let trimmed = endpoint.trim();
    if trimmed.is_empty() {
        return Err(refuse(EndpointProblem::Empty));
    }
    match trimmed.split_once("://") {
        Some(("unix", "")) => Err(refuse(EndpointProblem::MissingPath)),
        Some(("unix", path)) => Ok(PathBuf::from(path)),
        Some(_) => Err(refuse(EndpointProblem::UnsupportedScheme)),
        None => Ok(PathBuf::from(trimmed)),
    }
}

#[cfg(test)]
mod tests;
