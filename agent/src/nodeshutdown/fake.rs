//! An in-memory logind and pod side for the manager's unit tests: the [`FakeInhibitor`] counts
//! the locks held (a lock is a guard that counts itself out when dropped), lets the test send
//! `PrepareForShutdown` and drop the connection, and records every call; the [`FakeTerminator`]
//! records the pods killed, in order, with their grace, and stops them at once unless told to
//! hang.

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::{Error, InhibitLock, Inhibitor, PodTerminator, ShutdownSignals};
use crate::lock::MutexExt as _;

/// Counts itself out of `held` when dropped (the lock's fd closing).
struct LockGuard(Arc<AtomicUsize>);

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
pub struct FakeInhibitor {
    /// logind's delay; a reload sets it to what the drop-in asked, unless `ignore_drop_in`.
    pub delay: Mutex<Duration>,
    pub ignore_drop_in: bool,
    pub fail_connect: bool,
    pub(super) written: Mutex<Option<Duration>>,
    pub(super) held: Arc<AtomicUsize>,
    pub(super) taken: AtomicUsize,
    pub(super) calls: Mutex<Vec<&'static str>>,
    pub(super) signals: Mutex<Option<mpsc::UnboundedSender<bool>>>,
}

impl FakeInhibitor {
    pub fn with_delay(delay: Duration) -> Arc<FakeInhibitor> {
        Arc::new(FakeInhibitor {
            delay: Mutex::new(delay),
            ..FakeInhibitor::default()
        })
    }

    /// Locks held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Locks taken so far.
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::SeqCst)
    }

    pub fn calls(&self) -> Vec<&'static str> {
        self.calls.lock_unpoisoned().clone()
    }

    /// Whether `PrepareForShutdown` is watched.
    pub fn watched(&self) -> bool {
        self.signals.lock_unpoisoned().is_some()
    }

    /// logind sends `PrepareForShutdown(start)`.
    pub fn announce(&self, start: bool) {
        if let Some(tx) = self.signals.lock_unpoisoned().as_ref() {
            let _ = tx.send(start);
        }
    }

    /// The connection ends (the signal stream with it).
    pub fn disconnect(&self) {
        self.signals.lock_unpoisoned().take();
    }

    fn call(&self, name: &'static str) {
        self.calls.lock_unpoisoned().push(name);
    }
}

#[tonic::async_trait]
impl Inhibitor for FakeInhibitor {
    async fn connect(&self) -> Result<(), Error> {
        self.call("connect");
        if self.fail_connect {
            return Err(Error::NotConnected);
        }
        Ok(())
    }

    async fn current_inhibit_delay(&self) -> Result<Duration, Error> {
        self.call("current_inhibit_delay");
        Ok(*self.delay.lock_unpoisoned())
    }

    async fn override_inhibit_delay(&self, delay: Duration) -> Result<(), Error> {
        self.call("override_inhibit_delay");
        *self.written.lock_unpoisoned() = Some(delay);
        Ok(())
    }

    async fn reload_logind(&self) -> Result<(), Error> {
        self.call("reload_logind");
        if !self.ignore_drop_in
            && let Some(delay) = *self.written.lock_unpoisoned()
        {
            *self.delay.lock_unpoisoned() = delay;
        }
        Ok(())
    }

    async fn inhibit_shutdown(&self) -> Result<InhibitLock, Error> {
        self.call("inhibit_shutdown");
        self.held.fetch_add(1, Ordering::SeqCst);
        self.taken.fetch_add(1, Ordering::SeqCst);
        Ok(InhibitLock::new(LockGuard(self.held.clone())))
    }

    async fn monitor_shutdown(&self) -> Result<ShutdownSignals, Error> {
        self.call("monitor_shutdown");
        let (tx, rx) = mpsc::unbounded_channel();
        *self.signals.lock_unpoisoned() = Some(tx);
        Ok(UnboundedReceiverStream::new(rx).boxed())
    }
}

/// One kill the manager asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kill {
    pub pod: String,
    pub grace_secs: i64,
}

#[derive(Default)]
pub struct FakeTerminator {
    pub pods: Mutex<Vec<Arc<Pod>>>,
    /// Pods whose containers never stop.
    pub hang: HashSet<String>,
    pub(super) kills: Mutex<Vec<Kill>>,
    /// The hung pods' completions, kept so that they never fire.
    pub(super) pending: Mutex<Vec<oneshot::Sender<()>>>,
}

impl FakeTerminator {
    pub fn kills(&self) -> Vec<Kill> {
        self.kills.lock_unpoisoned().clone()
    }
}

impl PodTerminator for FakeTerminator {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.pods.lock_unpoisoned().clone()
    }

    fn terminate(&self, pod: &Arc<Pod>, grace_secs: i64) -> oneshot::Receiver<()> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.kills.lock_unpoisoned().push(Kill {
            pod: name.clone(),
            grace_secs,
        });
        let (tx, rx) = oneshot::channel();
        if self.hang.contains(&name) {
            self.pending.lock_unpoisoned().push(tx);
        } else {
            let _ = tx.send(());
        }
        // Killed pods are no longer active.
        self.pods
            .lock_unpoisoned()
            .retain(|p| p.metadata.name.as_deref() != Some(&name));
        rx
    }
}
