//! Pod volumes (upstream `pkg/kubelet/volumemanager` and the in-tree plugins of `pkg/volume`):
//! the [`VolumeManager`] with its desired and actual state and reconciler (`manager.rs`), the
//! plugins swiftlet has — emptyDir on disk or tmpfs (`empty_dir.rs`), hostPath with its type
//! checks (`host_path.rs`), downwardAPI files (`downward_api.rs`), configMap and secret files
//! read from the API server (`api_objects.rs`, whose reader also serves containers' environments:
//! `env_objects.rs`), projected volumes with service account tokens
//! (`projected.rs`), all written by `atomic_writer.rs` — the node's mounts (`mount.rs`), the pod directory layout
//! (`paths.rs`), `fsGroup` ownership (`ownership.rs`), and each container's CRI mounts with
//! `subPath` bound from a descriptor (`container_mounts.rs`, `subpath.rs`). Everything below a
//! volume is touched through [`crate::hostfs`]: no link a container left is followed, no mount
//! crossed.
//!
//! Not here: refreshing tokens and objects after set-up, PVCs, attach/detach
//! and CSI, SELinux relabelling, and eviction for `sizeLimit` of disk
//! emptyDirs (usage is measured, [`VolumeManager::empty_dir_usage`]).

mod api_objects;
mod atomic_writer;
mod container_mounts;
mod downward_api;
mod empty_dir;
mod env_objects;
mod error;
mod host_path;
mod manager;
mod metrics;
pub mod mount;
mod ownership;
mod paths;
mod projected;
mod spec;
mod subpath;

#[cfg(test)]
mod tests;

pub use api_objects::{KubeObjects, ObjectData, ObjectSource, TokenSpec};
pub use container_mounts::{hostname_and_domain, managed_hosts};
pub use downward_api::NodeResources;
pub use error::{Error, Result};
pub use manager::{
    EmptyDirUsage, MountedVolume, RECONCILE_PERIOD, VolumeManager, VolumeManagerConfig,
    default_wait_budget, wait_steps,
};
pub use metrics::VolumeMetrics;
pub use paths::{DIR_MODE, Plugin, PodDirs};
pub use spec::{Medium, ObjectKind, Source, VolumeSpec, pod_volumes};
