//! Why a volume could not be set up, torn down or mounted into a container. The texts of the
//! hostPath and subPath failures are upstream's, so users find them where they would look.

use std::{io, path::PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("volume {volume:?}: {kind} volumes are not supported by swiftlet")]
    Unsupported { volume: String, kind: String },
    #[error("volume {volume:?}: {field}: {reason}")]
    BadSpec {
        volume: String,
        field: &'static str,
        reason: String,
    },
    /// Upstream `checkTypeInternal`'s message.
    #[error("hostPath type check failed: {path} is not a {expected}")]
    HostPathType {
        path: String,
        expected: &'static str,
    },
    #[error("{kind} is an invalid volume type")]
    InvalidHostPathType { kind: String },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Anything done through the node's filesystem with [`crate::hostfs`].
    #[error(transparent)]
    HostFs(#[from] crate::hostfs::Error),
    #[error("{op} {path}: {source}")]
    Mount {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("downwardAPI volume {volume:?}: item {path:?}: {reason}")]
    DownwardApi {
        volume: String,
        path: String,
        reason: String,
    },
    #[error("volume {volume:?}: {reason}")]
    Object { volume: String, reason: String },
    /// Upstream `makeMounts`' messages, for a container's volumeMounts.
    #[error("cannot find volume {volume:?} to mount into container {container:?}")]
    VolumeNotFound { volume: String, container: String },
    #[error("error SubPath `{sub_path}` must not be an absolute path")]
    AbsoluteSubPath { sub_path: String },
    #[error("unable to provision SubPath `{sub_path}`: must not contain '..'")]
    SubPathBacksteps { sub_path: String },
    #[error("missing value for {names}")]
    SubPathExprMissing { names: String },
    #[error("failed to prepare subPath for volumeMount {volume:?} of container {container:?}")]
    SubPathPrepare { volume: String, container: String },
    #[error("subPathExpr: {source}")]
    SubPathExprTooLong {
        #[source]
        source: crate::kuberuntime::env::ExpansionTooLong,
    },
    #[error(
        "failed to create subPath directory for volumeMount {volume:?} of container {container:?}"
    )]
    SubPathCreate { volume: String, container: String },
    #[error("Bidirectional mount propagation is available only to privileged containers")]
    BidirectionalUnprivileged,
    #[error("invalid mountPropagation {0:?}")]
    BadPropagation(String),
    /// Upstream `WaitForAttachAndMount`'s message (none of swiftlet's volumes needs attaching),
    /// with what the last set-up attempts said.
    #[error(
        "unmounted volumes=[{}], unattached volumes=[], failed to process volumes=[]: timed out waiting for the condition{}",
        unmounted.join(" "),
        failures.iter().map(|f| format!("; {f}")).collect::<String>()
    )]
    Timeout {
        unmounted: Vec<String>,
        failures: Vec<String>,
    },
    #[error("volumes [{}] of the pod are still set up: timed out waiting for the condition", mounted.join(" "))]
    UnmountTimeout { mounted: Vec<String> },
    #[error("waiting for volumes was cancelled")]
    Cancelled,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An I/O error at `path`.
pub(super) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}
