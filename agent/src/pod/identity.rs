//! Who a pod is: its UID, the key of everything the node keeps per pod, and its full name, the
//! key of a pod across UIDs (a static pod's edits, the sources' merge) and of the logs.

use k8s_openapi::api::core::v1::Pod;

use crate::container::PodUid;

/// The pod's `metadata.uid` (empty when it has none; sources validate it before a pod gets here).
pub fn pod_uid(pod: &Pod) -> PodUid {
    PodUid(pod.metadata.uid.clone().unwrap_or_default())
}

/// `<name>_<namespace>`, the key upstream uses for a pod across UIDs
/// (`kubecontainer.GetPodFullName`). Sources default the namespace before a pod gets anywhere.
pub fn full_name(pod: &Pod) -> String {
    format!(
        "{}_{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default()
    )
}

/// `<name>_<namespace>(<uid>)`, how upstream names a pod in logs and errors (`format.Pod`).
pub fn format_pod(pod: &Pod) -> String {
    format!(
        "{}({})",
        full_name(pod),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}
