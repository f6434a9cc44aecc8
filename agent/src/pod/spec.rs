//! Read-only views of the parts of a `v1.Pod` spec the runtime decisions need, with the API
//! defaults applied (a missing `restartPolicy` is `Always`, a missing `hostNetwork` is false).
//! Upstream spreads these over `pkg/api/v1/pod` (`IsRestartableInitContainer`) and
//! `pkg/kubelet/container/helpers.go` (`IsHostNetworkPod`).

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};

/// A pod's `restartPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

/// The pod's restart policy; anything but `OnFailure`/`Never` counts as `Always`, the API default
/// (validation rejects other values before a pod reaches a node).
pub fn restart_policy(pod: &Pod) -> RestartPolicy {
    parse_policy(pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()))
}

/// The policy for one container: its own `restartPolicy` when set (a sidecar's `Always`, or a
/// regular container's under `ContainerRestartRules`), else the pod's.
pub fn container_restart_policy(pod: &Pod, container: &Container) -> RestartPolicy {
    match container.restart_policy.as_deref() {
        Some(policy) => parse_policy(Some(policy)),
        None => restart_policy(pod),
    }
}

fn parse_policy(policy: Option<&str>) -> RestartPolicy {
    match policy {
        Some("OnFailure") => RestartPolicy::OnFailure,
        Some("Never") => RestartPolicy::Never,
        _ => RestartPolicy::Always,
    }
}

/// The regular containers, in spec order.
pub fn containers(pod: &Pod) -> &[Container] {
    pod.spec.as_ref().map_or(&[], |s| &s.containers)
}

/// The init containers (sidecars included), in spec order.
pub fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[])
}

/// The ephemeral containers (`kubectl debug`), in spec order.
pub fn ephemeral_containers(pod: &Pod) -> &[EphemeralContainer] {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or(&[])
}

/// An ephemeral container as the container it runs as (upstream casts its
/// `EphemeralContainerCommon` to a `v1.Container`). What the API server's
/// `validateEphemeralContainers` forbids is dropped rather than trusted: an ephemeral container
/// is never probed, restarted, resized or hooked, and exposes no ports, whatever the object says.
pub fn ephemeral_as_container(ephemeral: &EphemeralContainer) -> Container {
    let e = ephemeral.clone();
    Container {
        name: e.name,
        image: e.image,
        image_pull_policy: e.image_pull_policy,
        command: e.command,
        args: e.args,
        working_dir: e.working_dir,
        env: e.env,
        env_from: e.env_from,
        volume_mounts: e.volume_mounts,
        volume_devices: e.volume_devices,
        security_context: e.security_context,
        stdin: e.stdin,
        stdin_once: e.stdin_once,
        tty: e.tty,
        termination_message_path: e.termination_message_path,
        termination_message_policy: e.termination_message_policy,
        ..Container::default()
    }
}

/// A sidecar: an init container with `restartPolicy: Always` (upstream
/// `IsRestartableInitContainer`). Only meaningful for entries of [`init_containers`].
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// Whether the pod uses the node's network namespace.
pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Whether the API server has marked the pod for deletion: nothing is restarted any more.
pub fn is_deleted(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Where the kubelet records which source a pod came from (`file`, `http`, `api`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Present on mirror pods, the API copies of static pods.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// A pod from a file or URL rather than the API server (upstream `kubetypes.IsStaticPod`).
pub fn is_static_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|source| source != "api")
}

/// The API server's copy of a static pod (upstream `kubetypes.IsMirrorPod`).
pub fn is_mirror_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION))
}
