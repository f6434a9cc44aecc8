//! The desired pods (upstream `pkg/kubelet/pod/pod_manager.go`): what the sources say should run
//! on this node, by UID and by full name. Everyone else reads it; only the sync loop writes it.

use crate::lock::RwLockExt as _;
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
            .write_unpoisoned()
            .insert(pod_uid(&pod), pod.clone());
        pod
    }

    pub fn remove(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.pods.write_unpoisoned().remove(uid)
    }

    pub fn get(&self, uid: &PodUid) -> Option<Arc<Pod>> {
        self.pods.read_unpoisoned().get(uid).cloned()
    }

    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.read_unpoisoned().values().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.pods.read_unpoisoned().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
