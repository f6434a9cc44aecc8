//! Whether `cgroupDriver: systemd` can work on this node, checked before anything is made:
//! systemd must be the init system (what `sd_booted()` checks: `/run/systemd/system` exists),
//! its manager must answer on the system bus, and `cgroupRoot` must be
//! a slice (upstream requires `/` or a `.slice` with the systemd driver). The agent refuses to
//! start otherwise, with the field and the reason, rather than writing systemd's names where
//! systemd does not manage them. The connection that answered is what the pods' slices are
//! made through. The runtime's own driver is compared where the CRI reports it.

use std::path::{Path, PathBuf};

use zbus::Connection;

use super::SystemdError;
use crate::cgroup::pods::{CgroupDriver, SliceRootError, validate_slice_root};

#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error(
        "cgroupDriver: systemd needs systemd as the init system (PID 1 is {pid1:?} and {} does not exist); use cgroupDriver: cgroupfs on this node",
        marker.display()
    )]
    NotBooted { pid1: String, marker: PathBuf },
    #[error(
        "cgroupDriver: systemd needs systemd's D-Bus API (org.freedesktop.systemd1) on the system bus, which does not answer: {0}"
    )]
    Bus(#[source] Box<zbus::Error>),
    #[error("cgroupDriver: systemd: {0}")]
    Connect(#[from] SystemdError),
    #[error(transparent)]
    Root(#[from] SliceRootError),
}

/// Where the facts are read (the host's `/run` and `/proc`, or a test's directory).
#[derive(Clone, Debug)]
pub struct Host {
    /// `/run/systemd/system`, which systemd creates early at boot.
    pub marker: PathBuf,
    /// `/proc/1/comm`.
    pub pid1_comm: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            marker: PathBuf::from("/run/systemd/system"),
            pid1_comm: PathBuf::from("/proc/1/comm"),
        }
    }
}

/// Checks `driver` can be served here and returns the connection to systemd's manager that
/// answered; nothing to check (and no connection) for cgroupfs.
pub async fn check(
    driver: CgroupDriver,
    cgroup_root: &Path,
    host: &Host,
) -> Result<Option<Connection>, PreflightError> {
    if driver != CgroupDriver::Systemd {
        return Ok(None);
    }
    validate_slice_root(cgroup_root)?;
    booted(host)?;
    let connection = super::connect().await?;
    ping(&connection).await?;
    Ok(Some(connection))
}

/// `sd_booted()`: `/run/systemd/system` is a directory (not followed if a symlink).
pub fn booted(host: &Host) -> Result<(), PreflightError> {
    if std::fs::symlink_metadata(&host.marker).is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    let pid1 = std::fs::read_to_string(&host.pid1_comm)
        .map(|comm| comm.trim_end().to_owned())
        .unwrap_or_else(|e| format!("unknown: {e}"));
    Err(PreflightError::NotBooted {
        pid1,
        marker: host.marker.clone(),
    })
}

/// Whether systemd's manager answers (`org.freedesktop.DBus.Peer.Ping` on its object).
pub async fn ping(connection: &Connection) -> Result<(), PreflightError> {
    let peer = zbus::fdo::PeerProxy::builder(connection)
        .destination("org.freedesktop.systemd1")
        .and_then(|b| b.path("/org/freedesktop/systemd1"))
        .map_err(|e| PreflightError::Bus(Box::new(e)))?
        .build()
        .await
        .map_err(|e| PreflightError::Bus(Box::new(e)))?;
    peer.ping()
        .await
        .map_err(|e| PreflightError::Bus(Box::new(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_systemd_as_init_the_error_names_the_field_and_pid_1() {
        let dir = tempfile::tempdir().expect("tempdir");
        let comm = dir.path().join("comm");
        std::fs::write(&comm, "tini\n").expect("write");
        let host = Host {
            marker: dir.path().join("run/systemd/system"),
            pid1_comm: comm,
        };
        let err = booted(&host).expect_err("no marker");
        let text = err.to_string();
        assert!(
            text.starts_with(
                "cgroupDriver: systemd needs systemd as the init system (PID 1 is \"tini\""
            ),
            "{text}"
        );
        std::fs::create_dir_all(&host.marker).expect("mkdir");
        assert!(booted(&host).is_ok());
    }

    #[test]
    fn a_symlinked_marker_is_not_systemd() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("real")).expect("mkdir");
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("system"))
            .expect("symlink");
        let host = Host {
            marker: dir.path().join("system"),
            pid1_comm: dir.path().join("missing"),
        };
        let text = booted(&host).expect_err("symlink").to_string();
        assert!(text.contains("PID 1 is \"unknown: "), "{text}");
    }

    #[tokio::test]
    async fn cgroupfs_needs_nothing_and_a_bad_slice_root_is_refused_first() {
        let host = Host {
            marker: PathBuf::from("/nonexistent/run/systemd/system"),
            pid1_comm: PathBuf::from("/nonexistent/comm"),
        };
        assert!(
            check(CgroupDriver::Cgroupfs, Path::new("/anything"), &host)
                .await
                .is_ok_and(|connection| connection.is_none())
        );
        let err = check(CgroupDriver::Systemd, Path::new("/kubepods"), &host)
            .await
            .expect_err("not a slice");
        assert!(matches!(err, PreflightError::Root(_)), "{err}");
        let err = check(CgroupDriver::Systemd, Path::new("/"), &host)
            .await
            .expect_err("not booted");
        assert!(matches!(err, PreflightError::NotBooted { .. }), "{err}");
    }
}
