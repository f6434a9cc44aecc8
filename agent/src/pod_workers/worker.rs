//! The loop each pod's worker runs: take the pending update, wait for a fresh enough status, call
//! the syncer for the worker's phase, then move the phase and schedule the next look.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::{
    PodSyncer, PodWorkers, UpdateType, WorkerPhase,
    state::{self, Transition},
};
use crate::container::{PodStatus, PodUid, RunningPod};

/// What one sync produced: a phase transition, and when to look again if sooner than usual.
#[derive(Default)]
struct Step {
    transition: Option<Transition>,
    retry_after: Option<Duration>,
}

/// Why one iteration did not complete.
#[derive(Debug, thiserror::Error)]
enum WorkError<E> {
    /// The PLEG's last look at the pod failed (the runtime unreachable, typically): acting on no
    /// status would take the pod for one with nothing running, and start a second sandbox beside
    /// the one that runs (upstream `podWorkerLoop`: "error determining status").
    #[error("unable to fetch pod status from cache: {0}")]
    Status(String),
    #[error(transparent)]
    Sync(E),
}

/// What one iteration works on, copied out of the shared state.
struct Work {
    phase: WorkerPhase,
    update_type: UpdateType,
    pod: Option<Arc<Pod>>,
    running_pod: Option<RunningPod>,
    synced_at: Option<SystemTime>,
    grace: Duration,
    cancel: CancellationToken,
}

impl<S: PodSyncer> PodWorkers<S> {
    pub(super) async fn worker_loop(self: Arc<Self>, uid: PodUid, wake: Arc<Notify>) {
        loop {
            wake.notified().await;
            while let Some(work) = self.take_work(&uid) {
                let started = Instant::now();
                let outcome = self.run(&uid, &work).await;
                if let Some(duration) = &self.duration {
                    duration
                        .with_label_values(&[operation_type(&work)])
                        .observe(started.elapsed().as_secs_f64());
                }
                self.complete(&uid, &work, outcome);
                if let Some(on_synced) = &self.on_synced {
                    on_synced(&uid);
                }
            }
        }
    }

    /// Takes the pending update, if the worker may act on it now.
    fn take_work(&self, uid: &PodUid) -> Option<Work> {
        let mut inner = self.lock();
        let (phase, full_name, is_static) = {
            let status = inner.pods.get(uid)?;
            (status.phase, status.full_name.clone(), status.is_static)
        };
        if phase == WorkerPhase::Finished {
            if let Some(status) = inner.pods.get_mut(uid) {
                status.pending = None;
            }
            return None;
        }
        // A static pod starts only once no other UID of the same full name runs.
        if phase == WorkerPhase::Syncing && is_static {
            match inner.started_static.get(&full_name) {
                Some(other) if other != uid => {
                    tracing::info!(pod = %uid, full_name, "waiting for the previous static pod of this name to terminate");
                    return None;
                }
                Some(_) => {}
                None => {
                    inner.started_static.insert(full_name, uid.clone());
                }
            }
        }
        let status = inner.pods.get_mut(uid)?;
        let update = status.pending.take()?;
        if status.phase == WorkerPhase::Syncing && status.cancel.is_cancelled() {
            status.cancel = CancellationToken::new();
        }
        Some(Work {
            phase: status.phase,
            update_type: update.update_type,
            pod: update.pod.or_else(|| status.pod.clone()),
            running_pod: update.running_pod.or_else(|| status.running_pod.clone()),
            synced_at: status.synced_at,
            grace: Duration::from_secs(status.grace_period_secs.unwrap_or(0).max(0) as u64),
            cancel: status.cancel.clone(),
        })
    }

    async fn run(&self, uid: &PodUid, work: &Work) -> Result<Step, WorkError<S::Error>> {
        // The first sync waits too: until the PLEG has listed the runtime once, an empty cache
        // would look like a pod with nothing running, and a restarted agent would start
        // duplicates of what already runs instead of adopting it.
        let since = work.synced_at.unwrap_or(SystemTime::UNIX_EPOCH);
        let cached = self
            .cache
            .get_newer_than(uid, since, self.config.status_wait_limit)
            .await;
        // A runtime pod alone (an orphan being stopped) needs no status, as upstream.
        if let (Some(_), None, Some(error)) = (&work.pod, &cached.status, &cached.error) {
            return Err(WorkError::Status(error.clone()));
        }
        let status = |pod: &Pod| {
            cached.status.clone().unwrap_or_else(|| {
                PodStatus::empty(
                    uid.clone(),
                    pod.metadata.name.as_deref().unwrap_or_default(),
                    pod.metadata.namespace.as_deref().unwrap_or("default"),
                )
            })
        };
        let span = tracing::info_span!("pod_sync", pod = %uid, phase = ?work.phase);
        self.dispatch(work, status)
            .instrument(span)
            .await
            .map_err(WorkError::Sync)
    }

    async fn dispatch(
        &self,
        work: &Work,
        status: impl Fn(&Pod) -> PodStatus,
    ) -> Result<Step, S::Error> {
        let step = |transition| Step {
            transition: Some(transition),
            retry_after: None,
        };
        match (work.phase, work.pod.as_deref()) {
            (WorkerPhase::Syncing, Some(pod)) => {
                let outcome = self
                    .syncer
                    .sync_pod(work.update_type, pod, &status(pod), &work.cancel)
                    .await?;
                Ok(Step {
                    transition: outcome.terminal.then_some(Transition::SyncedToTerminal),
                    retry_after: outcome.retry_after,
                })
            }
            (WorkerPhase::Terminating, Some(pod)) => {
                self.syncer
                    .sync_terminating_pod(pod, &status(pod), work.grace)
                    .await?;
                Ok(step(Transition::TerminatingDone))
            }
            (WorkerPhase::Terminating, None) => {
                if let Some(running) = &work.running_pod {
                    self.syncer.sync_terminating_runtime_pod(running).await?;
                }
                Ok(step(Transition::TerminatingDone))
            }
            (WorkerPhase::Terminated, Some(pod)) => {
                self.syncer.sync_terminated_pod(pod, &status(pod)).await?;
                Ok(step(Transition::TerminatedDone))
            }
            (WorkerPhase::Terminated, None) => Ok(step(Transition::TerminatedDone)),
            (WorkerPhase::Syncing | WorkerPhase::Finished, _) => Ok(Step::default()),
        }
    }

    /// Applies a sync's outcome: the next phase, waiters told, the next look scheduled.
    fn complete(&self, uid: &PodUid, work: &Work, outcome: Result<Step, WorkError<S::Error>>) {
        let now = Instant::now();
        let mut inner = self.lock();
        let Some(status) = inner.pods.get_mut(uid) else {
            return;
        };
        status.synced_at = Some(SystemTime::now());
        match outcome {
            Err(error) => {
                if work.cancel.is_cancelled() && status.phase != work.phase {
                    // The sync was cut short by a termination: go on with terminating at once.
                    tracing::debug!(pod = %uid, %error, "sync interrupted by termination");
                    requeue_now(status);
                    return;
                }
                tracing::warn!(pod = %uid, phase = ?work.phase, %error, "error syncing pod; will retry");
                self.queue.enqueue(uid, now, self.config.backoff_period);
            }
            Ok(step) => {
                let before = status.phase;
                if let Some(transition) = step.transition {
                    // A termination requested during the sync already moved the phase.
                    if before == work.phase {
                        status.phase = state::next(before, transition);
                        if status.phase == WorkerPhase::Terminating
                            && status.terminating_at.is_none()
                        {
                            status.terminating_at = Some(now);
                            let pod = status.pod.as_deref();
                            status.grace_period_secs = Some(super::effective_grace_period(
                                pod,
                                None,
                                status.grace_period_secs,
                            ));
                        }
                    }
                }
                let after = status.phase;
                if after == WorkerPhase::Terminated && before != WorkerPhase::Terminated {
                    for waiter in status.kill_waiters.drain(..) {
                        let _ = waiter.send(());
                    }
                }
                let mut freed_static_name = None;
                match after {
                    WorkerPhase::Syncing if before == WorkerPhase::Syncing => {
                        let resync = self.config.resync_interval;
                        let after = step.retry_after.map_or(resync, |r| r.min(resync));
                        self.queue.enqueue(uid, now, after);
                    }
                    WorkerPhase::Finished => freed_static_name = Some(status.full_name.clone()),
                    // A phase change, or a termination that came in: continue at once.
                    _ => {
                        if before != after || after != work.phase {
                            requeue_now(status);
                        }
                    }
                }
                if let Some(full_name) = freed_static_name
                    && inner.started_static.get(&full_name) == Some(uid)
                {
                    inner.started_static.remove(&full_name);
                    wake_static_successors(&inner, &full_name, uid);
                }
            }
        }
    }
}

/// The kubelet's `operation_type` label for a sync.
fn operation_type(work: &Work) -> &'static str {
    match (work.phase, work.update_type) {
        (WorkerPhase::Syncing, UpdateType::Create) => "create",
        (WorkerPhase::Syncing, UpdateType::Update) => "update",
        (WorkerPhase::Syncing, _) => "sync",
        (WorkerPhase::Terminating, _) => "terminating",
        (WorkerPhase::Terminated | WorkerPhase::Finished, _) => "terminated",
    }
}

/// Makes the worker run again at once (the loop sees a pending update).
fn requeue_now(status: &mut super::PodSyncStatus) {
    if status.pending.is_none() {
        status.pending = Some(super::UpdatePodOptions {
            update_type: UpdateType::Sync,
            pod: status.pod.clone(),
            running_pod: status.running_pod.clone(),
            kill: None,
        });
    }
}

/// Wakes the workers of static pods waiting for `full_name` to be free.
fn wake_static_successors(inner: &super::Inner, full_name: &str, finished: &PodUid) {
    for (uid, status) in inner.pods.iter() {
        if uid != finished
            && status.full_name == full_name
            && status.phase == WorkerPhase::Syncing
            && status.pending.is_some()
        {
            status.wake.notify_one();
        }
    }
}
