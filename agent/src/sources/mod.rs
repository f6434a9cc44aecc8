//! Pod sources and their merge: where the desired pods come from (static manifests on disk here,
//! the API server elsewhere) and how their changes become one ordered stream of [`PodUpdate`]s
//! for the sync loop. Upstream: `pkg/kubelet/config` (`PodConfig`, `podStorage`, the file source)
//! and `pkg/kubelet/types/pod_update.go`.
//!
//! - `merge.rs` — per-source state and the diff into ADD/UPDATE/REMOVE/RECONCILE/DELETE (pure).
//! - `pod_config.rs` — the task around it: one channel per source in, one channel out, and
//!   [`SourcesReady`].
//! - `static_pods.rs` — the static pod directory, watched with inotify; `manifest_dir.rs` — its
//!   files as last read.
//! - `manifest.rs`, `defaults.rs`, `validation.rs`, `api_references.rs` — one
//!   manifest file to one defaulted, validated `Pod`.
//! - `apiserver/` — with `--kubeconfig`: the pods bound to this node (as SETs), and what the node
//!   reports back (registration, node status, lease, pod statuses).
//!
//! Not here: what the sync loop does with updates, mirror pods.

mod api_references;
pub(crate) mod apiserver;
mod defaults;
mod manifest;
mod manifest_dir;
mod merge;
mod pod_config;
mod static_pods;
mod validation;

use std::{fmt, path::PathBuf};

use k8s_openapi::api::core::v1::Pod;

pub use apiserver::{
    ApiClients, ApiServerOptions, ApiServerSource, ClientSettings, Error as ApiServerError,
    ImagesCheck, KUBELET_VERSION, LocalNode, MAX_IMAGES, NODE_LEASE_NAMESPACE, NodeDescription,
    PressureCheck, ReadinessCheck, WallClock, client_from_kubeconfig, go_arch, node_images,
    os_image,
};
pub use manifest::{MAX_MANIFEST_BYTES, ManifestError, decode_static_pod};
pub use merge::PodStorage;
pub use pod_config::{MergeStopped, PodConfig, SourceSender, SourcesReady};
pub use static_pods::{StaticPodOptions, StaticPodSource, is_manifest_name};
pub use validation::{
    FieldError, FieldErrorKind, ValidationErrors, is_valid_uid, validate_pod_identity,
    validate_static_pod,
};

pub use crate::pod::spec::{CONFIG_MIRROR_ANNOTATION, CONFIG_SOURCE_ANNOTATION};
/// When this agent first saw the pod (RFC 3339).
pub const CONFIG_FIRST_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// A static pod's content hash; equals its generated UID.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";

/// The annotations the agent itself manages: ignored when comparing two versions of a pod.
pub const LOCAL_ANNOTATIONS: [&str; 3] = [
    CONFIG_SOURCE_ANNOTATION,
    CONFIG_MIRROR_ANNOTATION,
    CONFIG_FIRST_SEEN_ANNOTATION,
];

/// A source of pods. Upstream names them by string; the names are kept for the annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    /// Static pod manifests in `staticPodPath`.
    File,
    /// The API server (pods bound to this node).
    Api,
}

impl Source {
    /// The value of `kubernetes.io/config.source`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Api => "api",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a [`PodUpdate`] means (upstream `kubetypes.PodOperation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// From a source: the complete set of its pods. Never emitted by the merge.
    Set,
    /// Pods new to this source.
    Add,
    /// Pods gracefully deleted (`deletionTimestamp` set) in this source.
    Delete,
    /// Pods gone from this source.
    Remove,
    /// Pods whose spec, labels or non-local annotations changed.
    Update,
    /// Pods whose status alone changed: the agent should reconcile its status with the source.
    Reconcile,
}

/// A batch of pods with one operation from one source (upstream `kubetypes.PodUpdate`).
#[derive(Clone, Debug, PartialEq)]
pub struct PodUpdate {
    pub pods: Vec<Pod>,
    pub op: Op,
    pub source: Source,
}

/// A manifest the static pod source could not use, and why. The other pods keep flowing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceProblem {
    pub file: PathBuf,
    pub reason: String,
}

impl fmt::Display for SourceProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.reason)
    }
}
