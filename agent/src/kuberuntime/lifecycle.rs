//! Hooks around a container's creation for the resource managers (upstream
//! `InternalContainerLifecycle`, `internal_container_lifecycle_linux.go`): the CPU manager writes
//! the container's cpuset into its create request and learns the container's id before it starts.
//!
//! Not here: what the managers decide. The runtime manager calls these; `app` hands the
//! implementation in, so this module never imports a manager.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

pub trait ContainerLifecycle: Send + Sync {
    /// May change the resources of the create request (upstream `PreCreateContainer`).
    fn pre_create(
        &self,
        pod: &Pod,
        container: &Container,
        resources: &mut cri::LinuxContainerResources,
    );
    /// The container exists with `resources` and is about to start (upstream
    /// `PreStartContainer`).
    fn pre_start(
        &self,
        pod: &Pod,
        container: &Container,
        container_id: &str,
        resources: &cri::LinuxContainerResources,
    );
}

/// No resource manager: the create request is left as it is.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoLifecycle;

impl ContainerLifecycle for NoLifecycle {
    fn pre_create(&self, _: &Pod, _: &Container, _: &mut cri::LinuxContainerResources) {}

    fn pre_start(&self, _: &Pod, _: &Container, _: &str, _: &cri::LinuxContainerResources) {}
}
