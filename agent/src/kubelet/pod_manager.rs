//! The desired pods (upstream `pkg/kubelet/pod/pod_manager.go`): what the sources say should run
//! on this node, by UID and by full name. Everyone else reads it; only the sync loop writes it.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use k8s_openapi::api::core::v1::Pod;

use crate::{container::PodUid, pod::pod_uid};

#[derive(Default)]
pub struct PodManager {
    pods: RwLock<HashMap<PodUid, Arc<Pod>>>,
}

impl PodManager {
    /// Adds or replaces a pod; returns the stored handle.
    pub fn upsert(&self, pod: Pod) -> Arc<Pod> {
        let pod = Arc::new(pod);
        self.pods
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pod_uid(&pod), pod.clone());
        pod
    }

    pub fn remove(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.pods
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid)
    }

    pub fn get(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.pods
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(uid)
            .cloned()
    }

    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.pods.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
