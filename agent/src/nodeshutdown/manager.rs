//! The node shutdown manager's loop (upstream `managerImpl.start` and its goroutine, and
//! `processShutdownEvent`/`killPods`): connect to logind and make sure its delay allows the
//! grace period, watch `PrepareForShutdown`, and carry out what [`transition`] says.
//!
//! Failures as upstream: when the first connection fails (no system bus, no logind, a delay
//! that cannot be raised) the agent runs on without graceful shutdown, saying why; a connection
//! lost later is made again every [`RECONNECT_PERIOD`].

use std::{sync::Arc, time::Duration};

use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    Error, InhibitLock, Inhibitor, PodTerminator, ShutdownMetrics, ShutdownSignals, ShutdownState,
    groups::{ShutdownConfig, group_by_priority, pod_grace},
    logind::RELOAD_WAIT,
    state::{Action, Input, Phase, transition},
};
use crate::events::{self, Event, Events, node_ref, reasons};

/// Upstream `dbusReconnectPeriod`.
pub const RECONNECT_PERIOD: Duration = Duration::from_secs(1);
/// How often the delay is read again while logind reloads.
const RELOAD_POLL: Duration = Duration::from_millis(200);

/// What the manager is built from; all of it handed in by the app.
pub struct NodeShutdownManager {
    pub config: ShutdownConfig,
    pub inhibitor: Arc<dyn Inhibitor>,
    pub terminator: Arc<dyn PodTerminator>,
    /// Published for admission and the Ready condition.
    pub state: ShutdownState,
    /// Notified to post the node's status at once (upstream `syncNodeStatus`).
    pub node_status: Arc<Notify>,
    pub events: Events,
    pub node_name: String,
    pub metrics: ShutdownMetrics,
}

/// The loop's own state: the phase and the lock it holds.
struct Running {
    phase: Phase,
    lock: Option<InhibitLock>,
}

impl NodeShutdownManager {
    /// Runs until `shutdown`; without a configured grace period it only waits for it.
    pub async fn run(self, shutdown: CancellationToken) {
        if !self.config.is_enabled() {
            tracing::info!("no graceful shutdown configured: node shutdown will be immediate");
            shutdown.cancelled().await;
            return;
        }
        tracing::info!(
            groups = ?self.config.by_priority.iter().map(|r| (r.priority, r.grace_seconds)).collect::<Vec<_>>(),
            period = ?self.config.period_requested(),
            "node shutdown manager: pods are shut down by priority, lowest first, each group within its seconds"
        );
        self.metrics.restore();
        let mut running = Running {
            phase: Phase::START,
            lock: None,
        };
        let mut first = true;
        loop {
            let signals = match self.connect(&mut running, &shutdown).await {
                Ok(signals) => signals,
                Err(e) if first => {
                    tracing::error!(error = %e, "unable to watch the node for shutdown events: node shutdown will not be graceful");
                    shutdown.cancelled().await;
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "watching the node for shutdown events again failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(RECONNECT_PERIOD) => continue,
                        () = shutdown.cancelled() => return,
                    }
                }
            };
            first = false;
            if !self.watch(&mut running, signals, &shutdown).await {
                return;
            }
            tracing::warn!("the watch for node shutdown events ended; watching again");
            tokio::select! {
                () = tokio::time::sleep(RECONNECT_PERIOD) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Connects, raises logind's delay when it is below the grace period, subscribes to
    /// `PrepareForShutdown`, then takes the lock (subscribed first, so that no announcement falls
    /// between the two).
    async fn connect(
        &self,
        running: &mut Running,
        shutdown: &CancellationToken,
    ) -> Result<ShutdownSignals, Error> {
        self.inhibitor.connect().await?;
        let requested = self.config.period_requested();
        let current = self.inhibitor.current_inhibit_delay().await?;
        if requested > current {
            tracing::info!(
                current = ?current,
                requested = ?requested,
                "raising logind's InhibitDelayMaxSec to the shutdown grace period"
            );
            self.inhibitor.override_inhibit_delay(requested).await?;
            self.inhibitor.reload_logind().await?;
            self.wait_for_delay(requested).await?;
        }
        let signals = self.inhibitor.monitor_shutdown().await?;
        self.apply(running, Input::Connected, shutdown).await;
        Ok(signals)
    }

    /// Reads the delay again until logind has applied the reload, for up to [`RELOAD_WAIT`].
    async fn wait_for_delay(&self, requested: Duration) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + RELOAD_WAIT;
        loop {
            let current = self.inhibitor.current_inhibit_delay().await?;
            if current >= requested {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::DelayNotRaised { requested, current });
            }
            tokio::time::sleep(RELOAD_POLL).await;
        }
    }

    /// Follows the signals until they end (`true`: connect again) or `shutdown` (`false`).
    async fn watch(
        &self,
        running: &mut Running,
        mut signals: ShutdownSignals,
        shutdown: &CancellationToken,
    ) -> bool {
        loop {
            let signal = tokio::select! {
                signal = signals.next() => signal,
                () = shutdown.cancelled() => return false,
            };
            match signal {
                Some(start) => {
                    tracing::info!(
                        event = if start { "shutdown" } else { "cancelled" },
                        "node shutdown manager detected a shutdown event"
                    );
                    self.apply(running, Input::PrepareForShutdown(start), shutdown)
                        .await;
                }
                None => {
                    self.apply(running, Input::Lost, shutdown).await;
                    return !shutdown.is_cancelled();
                }
            }
        }
    }

    /// One input through [`transition`], its actions carried out in order (and the input they
    /// lead to, after killing the pods).
    async fn apply(&self, running: &mut Running, input: Input, shutdown: &CancellationToken) {
        let mut next_input = Some(input);
        while let Some(input) = next_input.take() {
            let (phase, actions) = transition(running.phase, input);
            tracing::debug!(from = ?running.phase, ?input, to = ?phase, ?actions, "node shutdown manager");
            running.phase = phase;
            for action in actions {
                match action {
                    Action::TakeLock => match self.inhibitor.inhibit_shutdown().await {
                        // The older lock, if any, is closed once the new one is held.
                        Ok(lock) => {
                            running.lock = Some(lock);
                            tracing::info!(
                                "holding a delay inhibitor lock on shutdown (logind waits for swiftlet)"
                            );
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "cannot take logind's inhibitor lock: the next shutdown will not wait for pods")
                        }
                    },
                    Action::ReleaseLock => {
                        if running.lock.take().is_some() {
                            tracing::info!(
                                "released the inhibitor lock: the node will shut down shortly"
                            );
                        }
                    }
                    Action::PublishState => self.state.set(phase.shutting_down()),
                    Action::SyncNodeStatus => self.node_status.notify_one(),
                    Action::RecordEvent(start) => self.events.record(Event::normal(
                        node_ref(&self.node_name),
                        reasons::NODE_SHUTDOWN,
                        events::Action::ShutdownNode,
                        if start {
                            "Shutdown manager detected shutdown event"
                        } else {
                            "Shutdown manager detected shutdown cancellation"
                        },
                    )),
                    Action::KillPods => {
                        let began = Timestamp::now();
                        self.metrics.began(began);
                        self.kill_pods(shutdown).await;
                        self.metrics.ended(began, Timestamp::now());
                        next_input = Some(Input::PodsKilled);
                    }
                }
            }
        }
    }

    /// Kills the active pods group by group, lowest priority first; each group is waited for
    /// until its pods have stopped or its seconds are over (upstream `killPods`).
    async fn kill_pods(&self, shutdown: &CancellationToken) {
        let groups = group_by_priority(&self.config, self.terminator.active_pods());
        for group in groups.iter().filter(|g| !g.pods.is_empty()) {
            tracing::info!(
                priority = group.priority,
                grace_seconds = group.grace_seconds,
                pods = group.pods.len(),
                "shutting down the pods of a priority group"
            );
            let stopped = futures::future::join_all(group.pods.iter().map(|pod| {
                let grace = pod_grace(pod, group.grace_seconds);
                tracing::info!(
                    pod = %crate::pod::format_pod(pod),
                    grace_seconds = grace,
                    "node shutdown manager killing pod with gracePeriod"
                );
                self.terminator.terminate(pod, grace)
            }));
            let window = Duration::from_secs(u64::try_from(group.grace_seconds).unwrap_or(0));
            tokio::select! {
                waited = tokio::time::timeout(window, stopped) => match waited {
                    Ok(_) => tracing::info!(priority = group.priority, "done waiting for all pods in the group to terminate"),
                    Err(_) => tracing::info!(priority = group.priority, grace_seconds = group.grace_seconds, "pod killing timed out for the group; going on"),
                },
                () = shutdown.cancelled() => return,
            }
        }
    }
}
