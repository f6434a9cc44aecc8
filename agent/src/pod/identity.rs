//! Who a pod is: its UID, the key of everything the node keeps per pod.

use k8s_openapi::api::core::v1::Pod;

use crate::container::PodUid;

/// The pod's `metadata.uid` (empty when it has none; sources validate it before a pod gets here).
pub fn pod_uid(pod: &Pod) -> PodUid {
    PodUid(pod.metadata.uid.clone().unwrap_or_default())
}
