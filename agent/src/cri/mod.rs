//! The Container Runtime Interface boundary: the only module that speaks CRI (upstream:
//! `k8s.io/cri-api/pkg/apis` `RuntimeService`/`ImageManagerService`, implemented by
//! `k8s.io/cri-client` `remote_runtime.go`/`remote_image.go` and instrumented by kuberuntime's
//! `instrumented_services.go`).
//!
//! It owns the two service traits, the real client over a unix socket ([`grpc`]), an in-memory
//! fake for unit tests of the components above it ([`fake`]), the runtime's metrics and the
//! conversion from CRI objects to the runtime-neutral model in [`crate::container`]
//! ([`convert`]). It does not decide anything: what to create, kill or pull is `kuberuntime`'s
//! business; this module only carries the calls and reports what the runtime said.
//!
//! # Why the traits use CRI messages
//! The traits take and return the `k8s-cri` (CRI v1) messages — `PodSandboxConfig`,
//! `ContainerConfig`, `ContainerStatus`, filters — exactly as upstream's `internalapi` does:
//! this *is* the CRI boundary, and a parallel set of wrapper types would have to follow every
//! field the API grows. Only the envelopes are thinned: a response that carries a single id is
//! returned as that id, a status response as its (required, verified) status, and the
//! `verbose` debug maps are not requested. Per-call deadlines depend on arguments (a stop's grace
//! period, an exec's timeout), which this shape keeps visible.

pub mod convert;
mod error;
#[cfg(any(test, feature = "fake-runtime"))]
pub mod fake;
pub mod grpc;
mod metrics;
mod streaming;

use std::{fmt, pin::Pin, time::Duration};

pub use error::{EndpointProblem, Error, Result};
pub use grpc::{GrpcRuntime, GrpcRuntimeConfig};
pub use metrics::RuntimeMetrics;
pub use streaming::StreamingService;

use k8s_cri::v1 as cri;

/// The runtime's container events (CRI `GetContainerEvents`), as long as the runtime keeps the
/// stream open: an item per event, an error when the stream broke, the end when it closed.
pub type ContainerEventStream =
    Pin<Box<dyn futures::Stream<Item = Result<cri::ContainerEventResponse>> + Send>>;

/// The runtime half of CRI (upstream `internalapi.RuntimeService`, without streaming, stats and
/// checkpointing, which swiftlet does not use yet).
#[tonic::async_trait]
pub trait RuntimeService: Send + Sync {
    /// The runtime's name as its `Version` answer gave it when the client was built (upstream
    /// caches it as `runtimeName` the same way); it prefixes every `containerID`
    /// (`containerd://…`).
    fn runtime_name(&self) -> &str;

    async fn version(&self) -> Result<cri::VersionResponse>;
    /// Runtime conditions (`RuntimeReady`, `NetworkReady`).
    async fn status(&self) -> Result<cri::StatusResponse>;
    /// The runtime's own configuration (CRI v1.28+, KEP-4033): its cgroup driver. Runtimes that
    /// predate the RPC (containerd before 2.0) answer Unimplemented, which callers tell by
    /// [`Error::code`].
    async fn runtime_config(&self) -> Result<cri::RuntimeConfigResponse>;

    /// Creates and starts a sandbox; returns its id.
    async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String>;
    /// Stops a sandbox, killing its containers. Idempotent for a stopped sandbox.
    async fn stop_pod_sandbox(&self, sandbox_id: &str) -> Result<()>;
    /// Removes a sandbox and its containers. Idempotent for a removed sandbox.
    async fn remove_pod_sandbox(&self, sandbox_id: &str) -> Result<()>;
    async fn pod_sandbox_status(&self, sandbox_id: &str) -> Result<cri::PodSandboxStatus>;
    async fn list_pod_sandbox(
        &self,
        filter: Option<cri::PodSandboxFilter>,
    ) -> Result<Vec<cri::PodSandbox>>;

    /// Creates a container in a sandbox; returns its id.
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String>;
    async fn start_container(&self, container_id: &str) -> Result<()>;
    /// Stops a container: the runtime signals it and kills it after `grace` (whole seconds, as
    /// CRI carries it). Idempotent for a stopped container.
    async fn stop_container(&self, container_id: &str, grace: Duration) -> Result<()>;
    /// Removes a container, killing it if it runs. Idempotent for a removed container.
    async fn remove_container(&self, container_id: &str) -> Result<()>;
    async fn list_containers(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<cri::Container>>;
    async fn container_status(&self, container_id: &str) -> Result<cri::ContainerStatus>;
    async fn update_container_resources(
        &self,
        container_id: &str,
        resources: cri::LinuxContainerResources,
    ) -> Result<()>;
    /// Runs a command in a container and waits for it (exec probes). A non-zero exit code is
    /// not an error here: the response carries it, and the prober judges it. `timeout` of zero
    /// means none.
    async fn exec_sync(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<cri::ExecSyncResponse>;
    /// Asks the runtime to reopen the container's log file (after the log manager renamed it
    /// away): new output goes to a fresh file at the container's log path. Only for a running
    /// container.
    async fn reopen_container_log(&self, container_id: &str) -> Result<()>;
    /// Subscribes to the runtime's container events (CRI v1 `GetContainerEvents`, containerd
    /// 1.7 and later). Runtimes without it (containerd 1.6) answer Unimplemented, which
    /// callers tell by [`Error::code`]. The subscription has no deadline: it lasts until the
    /// runtime ends it, the connection breaks or the stream is dropped.
    async fn get_container_events(&self) -> Result<ContainerEventStream>;
    /// What the runtime measures of the containers (CRI `ListContainerStats`): the writable
    /// layer's bytes are what local ephemeral storage limits count.
    async fn list_container_stats(
        &self,
        filter: Option<cri::ContainerStatsFilter>,
    ) -> Result<Vec<cri::ContainerStats>>;
}

/// The image half of CRI (upstream `internalapi.ImageManagerService`).
#[tonic::async_trait]
pub trait ImageService: Send + Sync {
    async fn list_images(&self, filter: Option<cri::ImageFilter>) -> Result<Vec<cri::Image>>;
    /// The image, or `None` when the runtime does not have it.
    async fn image_status(&self, image: cri::ImageSpec) -> Result<Option<cri::Image>>;
    /// Pulls an image; returns its reference (`sha256:…` or a digest reference).
    async fn pull_image(
        &self,
        image: cri::ImageSpec,
        auth: Option<cri::AuthConfig>,
        sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> Result<String>;
    /// Removes an image. Idempotent for a removed image.
    async fn remove_image(&self, image: cri::ImageSpec) -> Result<()>;
    async fn image_fs_info(&self) -> Result<cri::ImageFsInfoResponse>;
}

/// One CRI operation. [`Operation::metric_label`] is the kubelet's `operation_type` label value
/// (`instrumented_services.go`), so dashboards and alerts written for the kubelet keep working.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    Version,
    Status,
    RuntimeConfig,
    RunPodSandbox,
    StopPodSandbox,
    RemovePodSandbox,
    PodSandboxStatus,
    ListPodSandbox,
    CreateContainer,
    StartContainer,
    StopContainer,
    RemoveContainer,
    ListContainers,
    ContainerStatus,
    UpdateContainerResources,
    ExecSync,
    Exec,
    Attach,
    PortForward,
    ReopenContainerLog,
    GetContainerEvents,
    ListContainerStats,
    ListImages,
    ImageStatus,
    PullImage,
    RemoveImage,
    ImageFsInfo,
}

impl Operation {
    pub const ALL: [Operation; 27] = [
        Operation::Version,
        Operation::Status,
        Operation::RuntimeConfig,
        Operation::RunPodSandbox,
        Operation::StopPodSandbox,
        Operation::RemovePodSandbox,
        Operation::PodSandboxStatus,
        Operation::ListPodSandbox,
        Operation::CreateContainer,
        Operation::StartContainer,
        Operation::StopContainer,
        Operation::RemoveContainer,
        Operation::ListContainers,
        Operation::ContainerStatus,
        Operation::UpdateContainerResources,
        Operation::ExecSync,
        Operation::Exec,
        Operation::Attach,
        Operation::PortForward,
        Operation::ReopenContainerLog,
        Operation::GetContainerEvents,
        Operation::ListContainerStats,
        Operation::ListImages,
        Operation::ImageStatus,
        Operation::PullImage,
        Operation::RemoveImage,
        Operation::ImageFsInfo,
    ];

    /// The kubelet's `operation_type` label value.
    pub fn metric_label(self) -> &'static str {
        match self {
            Operation::Version => "version",
            Operation::Status => "status",
            Operation::RuntimeConfig => "runtime_config",
            Operation::RunPodSandbox => "run_podsandbox",
            Operation::StopPodSandbox => "stop_podsandbox",
            Operation::RemovePodSandbox => "remove_podsandbox",
            Operation::PodSandboxStatus => "podsandbox_status",
            Operation::ListPodSandbox => "list_podsandbox",
            Operation::CreateContainer => "create_container",
            Operation::StartContainer => "start_container",
            Operation::StopContainer => "stop_container",
            Operation::RemoveContainer => "remove_container",
            Operation::ListContainers => "list_containers",
            Operation::ContainerStatus => "container_status",
            Operation::UpdateContainerResources => "update_container",
            Operation::ExecSync => "exec_sync",
            Operation::Exec => "exec",
            Operation::Attach => "attach",
            Operation::PortForward => "port_forward",
            Operation::ReopenContainerLog => "reopen_container_log",
            Operation::GetContainerEvents => "get_container_events",
            Operation::ListContainerStats => "list_container_stats",
            Operation::ListImages => "list_images",
            Operation::ImageStatus => "image_status",
            Operation::PullImage => "pull_image",
            Operation::RemoveImage => "remove_image",
            Operation::ImageFsInfo => "image_fs_info",
        }
    }

    /// The CRI RPC name, for messages.
    pub fn rpc_name(self) -> &'static str {
        match self {
            Operation::Version => "Version",
            Operation::Status => "Status",
            Operation::RuntimeConfig => "RuntimeConfig",
            Operation::RunPodSandbox => "RunPodSandbox",
            Operation::StopPodSandbox => "StopPodSandbox",
            Operation::RemovePodSandbox => "RemovePodSandbox",
            Operation::PodSandboxStatus => "PodSandboxStatus",
            Operation::ListPodSandbox => "ListPodSandbox",
            Operation::CreateContainer => "CreateContainer",
            Operation::StartContainer => "StartContainer",
            Operation::StopContainer => "StopContainer",
            Operation::RemoveContainer => "RemoveContainer",
            Operation::ListContainers => "ListContainers",
            Operation::ContainerStatus => "ContainerStatus",
            Operation::UpdateContainerResources => "UpdateContainerResources",
            Operation::ExecSync => "ExecSync",
            Operation::Exec => "Exec",
            Operation::Attach => "Attach",
            Operation::PortForward => "PortForward",
            Operation::ReopenContainerLog => "ReopenContainerLog",
            Operation::GetContainerEvents => "GetContainerEvents",
            Operation::ListContainerStats => "ListContainerStats",
            Operation::ListImages => "ListImages",
            Operation::ImageStatus => "ImageStatus",
            Operation::PullImage => "PullImage",
            Operation::RemoveImage => "RemoveImage",
            Operation::ImageFsInfo => "ImageFsInfo",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.rpc_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn operation_labels_are_the_kubelets_and_unique() {
        let labels: HashSet<_> = Operation::ALL.iter().map(|o| o.metric_label()).collect();
        assert_eq!(labels.len(), Operation::ALL.len());
        assert_eq!(Operation::RunPodSandbox.metric_label(), "run_podsandbox");
        assert_eq!(
            Operation::UpdateContainerResources.metric_label(),
            "update_container"
        );
        assert_eq!(Operation::PodSandboxStatus.to_string(), "PodSandboxStatus");
    }
}
