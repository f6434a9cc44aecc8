//! What a container mounts (upstream `makeMounts` in `kubelet_pods.go` and the runtime side in
//! `kuberuntime_container.go`): its volumeMounts, `/etc/hosts` and the termination-message file.
//! The runtime manager asks for them just before creating a container; `app` hands in the
//! implementation (the volume manager), so this module never imports it.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

/// Why the mounts of a container could not be made; the container waits with
/// `CreateContainerConfigError` and this message, as upstream.
pub type MountsError = Box<dyn std::error::Error + Send + Sync>;

pub trait ContainerMounts: Send + Sync {
    /// The CRI mounts of `container` in `pod`, whose sandbox has `pod_ips`; `env` is the
    /// container's environment (for `subPathExpr`).
    fn mounts(
        &self,
        pod: &Pod,
        container: &Container,
        pod_ips: &[String],
        env: &[cri::KeyValue],
    ) -> Result<Vec<cri::Mount>, MountsError>;
}

/// No volumes: nothing is mounted (unit tests of the runtime manager).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMounts;

impl ContainerMounts for NoMounts {
    fn mounts(
        &self,
        _: &Pod,
        _: &Container,
        _: &[String],
        _: &[cri::KeyValue],
    ) -> Result<Vec<cri::Mount>, MountsError> {
        Ok(Vec::new())
    }
}
