//! logind over the system bus: the real [`Inhibitor`] (upstream `nodeshutdown/systemd/
//! inhibit_linux.go`). `InhibitDelayMaxUSec` is read from `org.freedesktop.login1.Manager`; it is
//! raised with a drop-in of swiftlet's own (`/etc/systemd/logind.conf.d/99-swiftlet.conf`,
//! upstream's is `99-kubelet.conf`) and a SIGHUP to logind through systemd's `KillUnit`; the lock
//! is `Inhibit("shutdown", "swiftlet", …, "delay")`'s fd, kept open while held.
//!
//! Differences from upstream, each for a reason: the drop-in's directory is opened and the file
//! replaced through descriptors (no link followed, mode 0644 whatever the umask); after the
//! SIGHUP the delay is read again for up to [`RELOAD_WAIT`] (logind handles the signal after the
//! call that sent it returns, so one immediate read can still see the old value); every call is
//! bounded by [`CALL_TIMEOUT`].

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
    time::Duration,
};

use futures::StreamExt as _;
use zbus::{Connection, proxy::CacheProperties, zvariant::OwnedFd};

use super::{Error, InhibitLock, Inhibitor, ShutdownSignals};
use crate::lock::MutexExt as _;

/// Where logind reads drop-ins (upstream `logindConfigDirectory`).
pub const LOGIND_CONF_DIR: &str = "/etc/systemd/logind.conf.d";
/// swiftlet's drop-in: sorts last with upstream's `99-kubelet.conf` among the usual names.
pub const DROP_IN: &str = "99-swiftlet.conf";
/// How long logind gets to apply a reloaded configuration.
pub const RELOAD_WAIT: Duration = Duration::from_secs(5);
/// The longest one D-Bus call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

const WHO: &str = "swiftlet";
const WHY: &str = "Swiftlet needs time to gracefully shut down pods";

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1",
    gen_blocking = false
)]
trait Logind {
    /// `Inhibit(in s what, in s who, in s why, in s mode, out h pipe_fd)`.
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<OwnedFd>;

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;

    /// `PrepareForShutdown(b start)`.
    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
trait Systemd {
    /// `KillUnit(in s name, in s whom, in i signal)`.
    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;
}

/// logind on the system bus, with the drop-in written below `conf_dir`.
pub struct LogindInhibitor {
    conf_dir: PathBuf,
    connection: Mutex<Option<Connection>>,
}

impl LogindInhibitor {
    pub fn new(conf_dir: &Path) -> LogindInhibitor {
        LogindInhibitor {
            conf_dir: conf_dir.to_owned(),
            connection: Mutex::new(None),
        }
    }

    fn connection(&self) -> Result<Connection, Error> {
        self.connection
            .lock_unpoisoned()
            .clone()
            .ok_or(Error::NotConnected)
    }

    async fn logind(&self) -> Result<LogindProxy<'static>, Error> {
        let connection = self.connection()?;
        // Uncached: the delay is read again after a reload.
        LogindProxy::builder(&connection)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| logind_error("proxy", e))
    }
}

fn logind_error(call: &'static str, e: zbus::Error) -> Error {
    Error::Logind {
        call,
        source: Box::new(e),
    }
}

/// `call` within [`CALL_TIMEOUT`].
async fn bounded<T>(
    call: &'static str,
    fut: impl std::future::Future<Output = zbus::Result<T>>,
) -> Result<T, Error> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(result) => result.map_err(|e| logind_error(call, e)),
        Err(_) => Err(logind_error(
            call,
            zbus::Error::Failure(format!("no answer within {CALL_TIMEOUT:?}")),
        )),
    }
}

/// The drop-in's text: `InhibitDelayMaxSec` in whole seconds, rounded up.
pub fn drop_in_text(delay: Duration) -> String {
    let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
    format!(
        "# Written by swiftlet: the node's graceful shutdown (shutdownGracePeriod) needs logind\n\
         # to wait this long for its delay inhibitor lock.\n\
         [Login]\n\
         InhibitDelayMaxSec={secs}\n"
    )
}

/// Writes the drop-in below `conf_dir` (made 0755 when missing), replacing any file or link of
/// its name, with mode 0644.
pub fn write_drop_in(conf_dir: &Path, delay: Duration) -> Result<(), Error> {
    let to_error = |source| Error::DropIn {
        path: conf_dir.join(DROP_IN).display().to_string(),
        source,
    };
    let dir = crate::hostfs::ensure_dir(conf_dir, 0o755).map_err(to_error)?;
    dir.replace_file(DROP_IN.as_ref(), drop_in_text(delay).as_bytes(), 0o644)
        .map_err(to_error)
}

#[tonic::async_trait]
impl Inhibitor for LogindInhibitor {
    async fn connect(&self) -> Result<(), Error> {
        let connection = match tokio::time::timeout(CALL_TIMEOUT, Connection::system()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(Error::Connect(Box::new(e))),
            Err(_) => {
                return Err(Error::Connect(Box::new(zbus::Error::Failure(format!(
                    "no answer within {CALL_TIMEOUT:?}"
                )))));
            }
        };
        *self.connection.lock_unpoisoned() = Some(connection);
        Ok(())
    }

    async fn current_inhibit_delay(&self) -> Result<Duration, Error> {
        let logind = self.logind().await?;
        let usec = bounded("InhibitDelayMaxUSec", logind.inhibit_delay_max_usec()).await?;
        Ok(Duration::from_micros(usec))
    }

    async fn override_inhibit_delay(&self, delay: Duration) -> Result<(), Error> {
        // A few hundred bytes, once at start: not worth a blocking thread.
        write_drop_in(&self.conf_dir, delay)
    }

    async fn reload_logind(&self) -> Result<(), Error> {
        let connection = self.connection()?;
        let systemd = SystemdProxy::new(&connection)
            .await
            .map_err(|e| Error::Reload(Box::new(e)))?;
        match tokio::time::timeout(
            CALL_TIMEOUT,
            systemd.kill_unit("systemd-logind.service", "all", libc::SIGHUP),
        )
        .await
        {
            Ok(result) => result.map_err(|e| Error::Reload(Box::new(e))),
            Err(_) => Err(Error::Reload(Box::new(zbus::Error::Failure(format!(
                "no answer within {CALL_TIMEOUT:?}"
            ))))),
        }
    }

    async fn inhibit_shutdown(&self) -> Result<InhibitLock, Error> {
        let logind = self.logind().await?;
        let fd = bounded("Inhibit", logind.inhibit("shutdown", WHO, WHY, "delay")).await?;
        Ok(InhibitLock::new(fd))
    }

    async fn monitor_shutdown(&self) -> Result<ShutdownSignals, Error> {
        let logind = self.logind().await?;
        let signals = bounded(
            "AddMatch PrepareForShutdown",
            logind.receive_prepare_for_shutdown(),
        )
        .await?;
        Ok(signals
            .filter_map(|signal| async move {
                match signal.args() {
                    Ok(args) => Some(args.start),
                    Err(e) => {
                        tracing::warn!(error = %e, "a PrepareForShutdown signal without its boolean; ignored");
                        None
                    }
                }
            })
            .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    #[test]
    fn the_drop_in_raises_the_delay_in_whole_seconds() {
        let text = drop_in_text(Duration::from_secs(30));
        assert!(
            text.contains("\n[Login]\nInhibitDelayMaxSec=30\n"),
            "{text}"
        );
        assert!(drop_in_text(Duration::from_millis(30_500)).contains("InhibitDelayMaxSec=31\n"));
    }

    #[test]
    fn the_drop_in_replaces_a_link_and_never_follows_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let conf = root.path().join("logind.conf.d");
        std::fs::create_dir(&conf).expect("mkdir");
        let victim = root.path().join("victim");
        std::fs::write(&victim, "untouched").expect("write");
        std::os::unix::fs::symlink(&victim, conf.join(DROP_IN)).expect("symlink");

        write_drop_in(&conf, Duration::from_secs(30)).expect("drop-in");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "untouched");
        let meta = std::fs::symlink_metadata(conf.join(DROP_IN)).expect("stat");
        assert!(meta.is_file());
        assert_eq!(meta.mode() & 0o7777, 0o644);
        assert!(
            std::fs::read_to_string(conf.join(DROP_IN))
                .expect("read")
                .contains("InhibitDelayMaxSec=30")
        );
    }

    #[test]
    fn a_missing_directory_is_made_0755() {
        let root = tempfile::tempdir().expect("tempdir");
        let conf = root.path().join("systemd").join("logind.conf.d");
        write_drop_in(&conf, Duration::from_secs(5)).expect("drop-in");
        let mode = std::fs::metadata(&conf).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
    }

    #[test]
    fn a_linked_directory_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let elsewhere = root.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        let conf = root.path().join("logind.conf.d");
        std::os::unix::fs::symlink(&elsewhere, &conf).expect("symlink");
        let err = write_drop_in(&conf, Duration::from_secs(5)).expect_err("a link");
        assert!(err.to_string().contains(DROP_IN), "{err}");
        assert!(!elsewhere.join(DROP_IN).exists());
    }
}
