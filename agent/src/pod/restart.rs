//! Whether a container that is not running should be started again (upstream
//! `kubecontainer.ShouldContainerBeRestarted` in `pkg/kubelet/container/helpers.go`): the runtime
//! decisions (`kuberuntime::compute_pod_actions`) and the status generator (`status`) ask the same
//! question.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::spec::{self, RestartPolicy};
use crate::container::{ContainerState, ContainerStatus, PodStatus};

/// Whether an instance of a spec container that is not running should be started (upstream
/// `kubecontainer.ShouldContainerBeRestarted`): never for a deleted pod; always when it never ran,
/// is only created or in an unknown state; otherwise as the container's restart policy says (its
/// own when set, so a sidecar always restarts, else the pod's).
pub fn should_container_be_restarted(container: &Container, pod: &Pod, status: &PodStatus) -> bool {
    if spec::is_deleted(pod) {
        return false;
    }
    let Some(latest) = status.latest(&container.name) else {
        return true;
    };
    match latest.state {
        ContainerState::Running => false,
        ContainerState::Unknown | ContainerState::Created => true,
        ContainerState::Exited => match spec::container_restart_policy(pod, container) {
            RestartPolicy::Never => false,
            RestartPolicy::OnFailure => exit_code(latest) != 0,
            RestartPolicy::Always => true,
        },
    }
}

/// The exit code of an exited instance; a missing one reads as 0, the CRI's zero value.
pub fn exit_code(instance: &ContainerStatus) -> i32 {
    instance.exit_code.unwrap_or(0)
}
