//! Graceful node shutdown (upstream `pkg/kubelet/nodeshutdown`): while the node runs, a `delay`
//! inhibitor lock is held with logind; when logind announces the shutdown
//! (`PrepareForShutdown(true)`), pods are no longer admitted, the node reports not ready, and the
//! active pods are killed by priority group, lowest first, each group within its share of
//! `shutdownGracePeriod` (or of `shutdownGracePeriodByPodPriority`); then the lock is released
//! and the shutdown goes on. A cancelled shutdown (`PrepareForShutdown(false)`) takes the lock
//! again and admits pods again; the pods already killed stay ended, as upstream.
//!
//! The seams: [`Inhibitor`] (logind over the system bus: `logind.rs`; a fake beside it for the
//! unit tests) and [`PodTerminator`] (the kubelet's pods and its pod workers, handed in by the
//! app). [`ShutdownState`] is what the rest reads: admission (`kubelet`) and the node's Ready
//! condition (`app`). The groups and each pod's grace are pure (`groups.rs`); the lock and
//! admission follow one transition function (`state.rs`); `manager.rs` runs the loop.
//!
//! Not here: setting a pod's status or killing it (the kubelet's status manager and pod workers),
//! reading the configuration (`config/shutdown.rs`). Upstream: `nodeshutdown_manager_linux.go`,
//! `nodeshutdown_manager.go`, `systemd/inhibit_linux.go`, `storage.go`.

#[cfg(test)]
pub mod fake;
pub mod groups;
pub mod logind;
pub mod manager;
pub mod metrics;
pub mod state;
#[cfg(test)]
mod tests;

use std::{
    any::Any,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::oneshot;

pub use groups::{PriorityGrace, ShutdownConfig};
pub use manager::NodeShutdownManager;
pub use metrics::ShutdownMetrics;

/// A killed pod's status reason (upstream `nodeShutdownReason`).
pub const SHUTDOWN_REASON: &str = "Terminated";
/// A killed pod's status message, also its `DisruptionTarget` condition's (upstream
/// `nodeShutdownMessage`).
pub const SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// Why a pod is refused while the node shuts down (upstream `nodeShutdownNotAdmittedReason`).
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
/// Upstream `nodeShutdownNotAdmittedMessage`.
pub const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// Why the node is not ready meanwhile (upstream `ShutdownStatus`'s error).
pub const NOT_READY_MESSAGE: &str = "node is shutting down";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the system bus: {0}")]
    Connect(#[source] Box<zbus::Error>),
    #[error("logind {call}: {source}")]
    Logind {
        call: &'static str,
        #[source]
        source: Box<zbus::Error>,
    },
    #[error("systemd KillUnit systemd-logind.service (reloading logind.conf): {0}")]
    Reload(#[source] Box<zbus::Error>),
    #[error("writing the logind drop-in {path}: {source}")]
    DropIn {
        path: String,
        #[source]
        source: crate::hostfs::Error,
    },
    #[error(
        "logind's InhibitDelayMaxSec is {current:?} after swiftlet's drop-in asked for {requested:?} \
         (the shutdown grace period): another logind.conf drop-in sorting after it may override it"
    )]
    DelayNotRaised {
        requested: Duration,
        current: Duration,
    },
    #[error("no connection to the system bus")]
    NotConnected,
}

/// A `delay` inhibitor lock: held while this value lives, released when it is dropped (the fd
/// logind gave is closed).
pub struct InhibitLock {
    _held: Box<dyn Any + Send + Sync>,
}

impl InhibitLock {
    pub fn new(held: impl Any + Send + Sync) -> InhibitLock {
        InhibitLock {
            _held: Box::new(held),
        }
    }
}

impl std::fmt::Debug for InhibitLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InhibitLock")
    }
}

/// `PrepareForShutdown`'s argument, each time logind sends it; the stream ends with the
/// connection.
pub type ShutdownSignals = BoxStream<'static, bool>;

/// logind as the manager uses it (upstream `dbusInhibiter`). Calls go over the connection the
/// latest [`Inhibitor::connect`] made.
#[tonic::async_trait]
pub trait Inhibitor: Send + Sync {
    /// Connects (again) to the system bus.
    async fn connect(&self) -> Result<(), Error>;
    /// logind's `InhibitDelayMaxUSec`: the longest a `delay` lock holds a shutdown back.
    async fn current_inhibit_delay(&self) -> Result<Duration, Error>;
    /// Writes swiftlet's logind.conf drop-in raising `InhibitDelayMaxSec` to `delay`.
    async fn override_inhibit_delay(&self, delay: Duration) -> Result<(), Error>;
    /// Has logind read its configuration again (SIGHUP through systemd, as upstream).
    async fn reload_logind(&self) -> Result<(), Error>;
    /// Takes a `delay` lock on `shutdown`.
    async fn inhibit_shutdown(&self) -> Result<InhibitLock, Error>;
    /// Subscribes to `PrepareForShutdown`.
    async fn monitor_shutdown(&self) -> Result<ShutdownSignals, Error>;
}

/// How the manager reaches the pods (upstream `GetPodsFunc` and `KillPodFunc`): implemented by
/// the kubelet.
pub trait PodTerminator: Send + Sync {
    /// The pods to shut down: admitted, not done, not already terminating.
    fn active_pods(&self) -> Vec<Arc<Pod>>;
    /// Marks `pod` terminated by the shutdown ([`SHUTDOWN_REASON`], [`SHUTDOWN_MESSAGE`]) and
    /// kills it within `grace_secs`, its preStop hooks running; the receiver is told when its
    /// containers have stopped.
    fn terminate(&self, pod: &Arc<Pod>, grace_secs: i64) -> oneshot::Receiver<()>;
}

/// Whether the node is shutting down, for admission and the Ready condition (upstream
/// `ShutdownStatus`). Only the manager changes it.
#[derive(Clone, Debug, Default)]
pub struct ShutdownState(Arc<AtomicBool>);

impl ShutdownState {
    pub fn is_shutting_down(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn set(&self, shutting_down: bool) {
        self.0.store(shutting_down, Ordering::Release);
    }

    /// Upstream's `Admit`: the reason and message a pod is refused with, while shutting down.
    pub fn admission(&self) -> Result<(), (&'static str, &'static str)> {
        if self.is_shutting_down() {
            Err((NOT_ADMITTED_REASON, NOT_ADMITTED_MESSAGE))
        } else {
            Ok(())
        }
    }

    /// Why the node is not ready, while shutting down (upstream's Ready setter reads
    /// `ShutdownStatus` after the runtime's, the network's and the storage's errors).
    pub fn not_ready(&self) -> Option<&'static str> {
        self.is_shutting_down().then_some(NOT_READY_MESSAGE)
    }
}
