//! Why the last start of each container failed (upstream `pkg/kubelet/reason_cache.go`): the pod
//! worker records the outcome of every start attempt, the status generator shows it as the
//! container's waiting reason (`CrashLoopBackOff`, `ImagePullBackOff`, ...). Bounded like
//! upstream's LRU (1000 entries); the oldest entry goes first.

use std::{collections::HashMap, fmt};

use crate::container::PodUid;

/// Upstream `maxReasonCacheEntries`.
pub const MAX_ENTRIES: usize = 1000;

/// The failure reasons a container start can end with, spelled as the API shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StartFailureReason {
    /// Restart held back by the crash-loop back-off.
    CrashLoopBackOff,
    /// The image pull failed.
    ErrImagePull,
    /// Image pull held back by its back-off.
    ImagePullBackOff,
    /// `imagePullPolicy: Never` and the image is not on the node.
    ErrImageNeverPull,
    InvalidImageName,
    /// A referenced ConfigMap, Secret or key is missing.
    CreateContainerConfigError,
    CreateContainerError,
    RunContainerError,
    PreStartHookError,
    PostStartHookError,
    /// The pod's volumes are not set up: the container waits as upstream's `ContainerCreating`,
    /// with the mount failure as its message (upstream says it only in a `FailedMount` event).
    ContainerCreating,
}

impl StartFailureReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StartFailureReason::CrashLoopBackOff => "CrashLoopBackOff",
            StartFailureReason::ErrImagePull => "ErrImagePull",
            StartFailureReason::ImagePullBackOff => "ImagePullBackOff",
            StartFailureReason::ErrImageNeverPull => "ErrImageNeverPull",
            StartFailureReason::InvalidImageName => "InvalidImageName",
            StartFailureReason::CreateContainerConfigError => "CreateContainerConfigError",
            StartFailureReason::CreateContainerError => "CreateContainerError",
            StartFailureReason::RunContainerError => "RunContainerError",
            StartFailureReason::PreStartHookError => "PreStartHookError",
            StartFailureReason::PostStartHookError => "PostStartHookError",
            StartFailureReason::ContainerCreating => "ContainerCreating",
        }
    }
}

impl fmt::Display for StartFailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a start attempt failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartFailure {
    pub reason: StartFailureReason,
    /// Details for humans, e.g. "back-off 20s restarting failed container=app pod=web_default(uid)".
    pub message: String,
}

impl StartFailure {
    pub fn new(reason: StartFailureReason, message: impl Into<String>) -> Self {
        StartFailure {
            reason,
            message: message.into(),
        }
    }
}

/// The last start failure per (pod, container).
#[derive(Debug)]
pub struct ReasonCache {
    entries: HashMap<(PodUid, String), (u64, StartFailure)>,
    capacity: usize,
    /// Insertion counter, to find the oldest entry when full.
    clock: u64,
}

impl Default for ReasonCache {
    fn default() -> Self {
        ReasonCache::with_capacity(MAX_ENTRIES)
    }
}

impl ReasonCache {
    pub fn new() -> Self {
        ReasonCache::default()
    }

    /// A cache of at most `capacity` entries (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        ReasonCache {
            entries: HashMap::new(),
            capacity: capacity.max(1),
            clock: 0,
        }
    }

    /// Records that the last start of `container` failed.
    pub fn add(&mut self, pod: &PodUid, container: &str, failure: StartFailure) {
        let key = (pod.clone(), container.to_owned());
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.clock += 1;
        self.entries.insert(key, (self.clock, failure));
    }

    /// Records that the last start of `container` succeeded.
    pub fn remove(&mut self, pod: &PodUid, container: &str) {
        self.entries.remove(&(pod.clone(), container.to_owned()));
    }

    /// Forgets the failures of `pod` with `reason` (e.g. its volumes are set up now).
    pub fn remove_reason(&mut self, pod: &PodUid, reason: StartFailureReason) {
        self.entries
            .retain(|(uid, _), (_, f)| uid != pod || f.reason != reason);
    }

    /// Forgets a pod that is gone.
    pub fn remove_pod(&mut self, pod: &PodUid) {
        self.entries.retain(|(uid, _), _| uid != pod);
    }

    pub fn get(&self, pod: &PodUid, container: &str) -> Option<&StartFailure> {
        // Borrowed lookups need an owned key: the map is small and this is not a hot path.
        self.entries
            .get(&(pod.clone(), container.to_owned()))
            .map(|(_, f)| f)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_get_remove_and_bound() {
        let (a, b) = (PodUid::from("a"), PodUid::from("b"));
        let mut cache = ReasonCache::with_capacity(2);
        let backoff = StartFailure::new(StartFailureReason::CrashLoopBackOff, "back-off 10s");
        cache.add(&a, "app", backoff.clone());
        assert_eq!(cache.get(&a, "app"), Some(&backoff));
        assert_eq!(cache.get(&a, "other"), None);
        assert_eq!(cache.get(&b, "app"), None);

        cache.add(
            &a,
            "app",
            StartFailure::new(StartFailureReason::ErrImagePull, "404"),
        );
        assert_eq!(
            cache.get(&a, "app").unwrap().reason.as_str(),
            "ErrImagePull"
        );
        cache.add(&a, "side", backoff.clone());
        cache.add(&b, "app", backoff.clone());
        // Full at two: the oldest (a/app) went.
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&a, "app"), None);

        cache.remove(&a, "side");
        assert_eq!(cache.get(&a, "side"), None);
        cache.add(&b, "side", backoff);
        cache.remove_pod(&b);
        assert!(cache.is_empty());
    }
}
