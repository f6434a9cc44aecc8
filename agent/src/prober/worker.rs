//! One probe worker (upstream `prober/worker.go`): probes one container's probe of one kind every
//! period, from the container's start plus the initial delay, and records a result once a run of
//! equal verdicts reaches the success or failure threshold. A liveness or startup failure puts the
//! worker on hold until a new instance of the container exists (the old one is being killed).
//! Every failed probe (not only the one that reaches the threshold) is an `Unhealthy` event
//! about the container, a warning a `ProbeWarning`, as upstream's `prober.probe` reports them.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::ProbeOutcome;
use super::{
    ProbeKind,
    manager::{Key, Shared},
    probe::{self, Target},
};
use crate::events::{Action, Event, container_ref, reasons};

pub(super) struct Worker {
    pub key: Key,
    pub pod: Arc<Pod>,
    pub container: Container,
    pub spec: Probe,
    pub shared: Arc<Shared>,
    pub stop: CancellationToken,
    pub trigger: Arc<Notify>,
    generation: u64,
    /// The instance being probed (`containerd://<id>`).
    container_id: Option<String>,
    on_hold: bool,
    last: Option<bool>,
    run_length: i32,
}

impl Worker {
    #[expect(
        clippy::too_many_arguments,
        reason = "a worker's parts, handed over once"
    )]
    pub fn new(
        key: Key,
        pod: Arc<Pod>,
        container: Container,
        spec: Probe,
        shared: Arc<Shared>,
        stop: CancellationToken,
        trigger: Arc<Notify>,
        generation: u64,
    ) -> Worker {
        Worker {
            key,
            pod,
            container,
            spec,
            shared,
            stop,
            trigger,
            generation,
            container_id: None,
            on_hold: false,
            last: None,
            run_length: 0,
        }
    }

    fn kind(&self) -> ProbeKind {
        self.key.kind
    }

    pub async fn run(mut self) {
        let period = Duration::from_secs(
            u64::try_from(self.spec.period_seconds.unwrap_or(10).max(1)).unwrap_or(10),
        );
        // Right after an agent start every worker would probe at once: spread them over a period
        // (upstream does the same).
        if self.shared.started_at.elapsed() < period {
            let jitter = period.mul_f64(fastrand::f64());
            tokio::select! {
                () = tokio::time::sleep(jitter) => {}
                () = self.stop.cancelled() => {}
            }
        }
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        while !self.stop.is_cancelled() && self.probe_once().await {
            tokio::select! {
                () = self.stop.cancelled() => break,
                _ = ticker.tick() => {}
                () = self.trigger.notified() => {}
            }
        }
        if let Some(id) = &self.container_id {
            self.shared.results.remove(self.kind(), id);
        }
        self.shared.forget_worker(&self.key, self.generation);
        self.delete_series();
    }

    fn labels(&self) -> [&str; 4] {
        [
            self.kind().as_str(),
            self.container.name.as_str(),
            self.pod.metadata.name.as_deref().unwrap_or_default(),
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
        ]
    }

    fn count(&self, result: &str) {
        let [kind, container, pod, namespace] = self.labels();
        let uid = self.key.pod.0.as_str();
        self.shared
            .metrics
            .probe_total
            .with_label_values(&[kind, result, container, pod, namespace, uid])
            .inc();
    }

    fn delete_series(&self) {
        let [kind, container, pod, namespace] = self.labels();
        let uid = self.key.pod.0.as_str();
        for result in ["successful", "failed", "unknown"] {
            let _ = self
                .shared
                .metrics
                .probe_total
                .remove_label_values(&[kind, result, container, pod, namespace, uid]);
        }
        let _ = self
            .shared
            .metrics
            .probe_duration
            .remove_label_values(&[kind, container, pod, namespace]);
    }

    /// A warning event about the probed container.
    fn report(&self, reason: &str, note: String) {
        self.shared.events.record(Event::warning(
            container_ref(&self.pod, &self.container.name),
            reason,
            Action::ProbeContainer,
            note,
        ));
    }

    /// A new instance of the container (a restart, a first start): its results start over.
    fn follow(&mut self, id: &str) {
        if self.container_id.as_deref() == Some(id) {
            return;
        }
        if let Some(old) = &self.container_id {
            self.shared.results.remove(self.kind(), old);
        }
        if let Some(initial) = self.kind().initial() {
            self.shared
                .results
                .set(self.kind(), &self.key.pod, id, initial);
        }
        self.container_id = Some(id.to_owned());
        self.on_hold = false;
    }

    /// Counts a verdict and publishes the result once the same verdict reached its threshold.
    fn record(&mut self, id: &str, verdict: &probe::Verdict, started: Instant) {
        let passed = verdict.passed();
        if passed {
            self.count("successful");
            let [kind, container, pod, namespace] = self.labels();
            self.shared
                .metrics
                .probe_duration
                .with_label_values(&[kind, container, pod, namespace])
                .observe(started.elapsed().as_secs_f64());
        } else {
            self.count("failed");
        }
        if let probe::Verdict::Failure(output) | probe::Verdict::Warning(output) = verdict {
            let (reason, what) = if passed {
                (reasons::CONTAINER_PROBE_WARNING, "warning")
            } else {
                (reasons::CONTAINER_UNHEALTHY, "failed")
            };
            self.report(
                reason,
                format!("{} probe {what}: {output}", self.kind().as_str()),
            );
            tracing::info!(
                pod = self.pod.metadata.name.as_deref().unwrap_or_default(),
                namespace = self.pod.metadata.namespace.as_deref().unwrap_or("default"),
                container = self.container.name,
                "{} probe {}: {output}",
                self.kind().as_str(),
                if passed { "warning" } else { "failed" }
            );
        }
        if self.last == Some(passed) {
            self.run_length = self.run_length.saturating_add(1);
        } else {
            self.last = Some(passed);
            self.run_length = 1;
        }
        let threshold = if passed {
            self.spec.success_threshold.unwrap_or(1)
        } else {
            self.spec.failure_threshold.unwrap_or(3)
        };
        if self.run_length < threshold {
            return;
        }
        let outcome = if passed {
            ProbeOutcome::Success
        } else {
            ProbeOutcome::Failure
        };
        self.shared
            .results
            .set(self.kind(), &self.key.pod, id, outcome);
        if !passed && matches!(self.kind(), ProbeKind::Liveness | ProbeKind::Startup) {
            // The container is about to be killed; probing it meanwhile only races the kill.
            self.on_hold = true;
            self.run_length = 0;
        }
    }

    /// One round (upstream `doProbe`); false when the worker should end.
    async fn probe_once(&mut self) -> bool {
        let Some(status) = self
            .shared
            .target
            .status(&self.key.pod, &self.container.name)
        else {
            // The pod has no status yet, or no longer.
            return true;
        };
        if status.terminal {
            return false;
        }
        let Some(c) = status.container else {
            return true;
        };
        self.follow(&c.id);
        if self.on_hold {
            return true;
        }
        let Some(running_since) = c.running_since else {
            self.shared
                .results
                .set(self.kind(), &self.key.pod, &c.id, ProbeOutcome::Failure);
            let never = self
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.restart_policy.as_deref())
                == Some("Never");
            return !c.terminated || !never;
        };
        if self.pod.metadata.deletion_timestamp.is_some()
            && matches!(self.kind(), ProbeKind::Liveness | ProbeKind::Startup)
        {
            // A pod on its way out is not restarted over a probe.
            self.shared
                .results
                .set(self.kind(), &self.key.pod, &c.id, ProbeOutcome::Success);
            return false;
        }
        let delay = Duration::from_secs(
            u64::try_from(self.spec.initial_delay_seconds.unwrap_or(0).max(0)).unwrap_or(0),
        );
        let since = SystemTime::now()
            .duration_since(running_since)
            .unwrap_or_default();
        if since.as_secs() < delay.as_secs() {
            return true;
        }
        // Startup probes until the container has started; the others only after.
        if c.started == (self.kind() == ProbeKind::Startup) {
            return true;
        }
        let started = Instant::now();
        let raw_id = c.id.split_once("://").map_or(c.id.as_str(), |(_, id)| id);
        let target = Target {
            runtime: self.shared.runtime.as_ref(),
            container: &self.container,
            container_id: raw_id,
            pod_ip: status.pod_ip.as_deref(),
            name: &self.container.name,
        };
        let verdict = match probe::run(&self.spec, &target).await {
            Ok(verdict) => verdict,
            Err(e) => {
                tracing::warn!(pod = %self.key.pod, container = self.container.name, probe = self.kind().as_str(), error = %e, "probe errored");
                self.report(
                    reasons::CONTAINER_UNHEALTHY,
                    format!(
                        "{} probe errored and resulted in unknown state: {e}",
                        self.kind().as_str()
                    ),
                );
                self.count("unknown");
                return true;
            }
        };
        self.record(&c.id, &verdict, started);
        true
    }
}
