//! Container logs (upstream `pkg/kubelet/logs` and `pkg/kubelet/kuberuntime/logs`): the runtime
//! writes each container's output in the CRI log format to the file the kubelet named
//! (`<podLogsDir>/<namespace>_<name>_<uid>/<container>/<restartCount>.log`); this module rotates
//! those files ([`rotate`]), parses the format ([`format`], as a stream of bytes in
//! [`records`]) and reads a log for a client ([`read`], from the end with [`tail`]), which
//! `server::logs` serves as `/containerLogs`, in bounded memory whatever the lines.
//!
//! Not here: where a pod's log directory is (`kuberuntime::sandbox_config`), and removing the
//! logs of removed containers and pods (`kuberuntime::gc`).

pub mod format;
pub mod read;
pub mod records;
pub mod rotate;
pub mod tail;

#[cfg(test)]
pub(crate) mod testing;

pub use read::{FollowTiming, LogOptions, ReadError, read_logs};
pub use rotate::{ContainerLogManager, LogRotatePolicy};
