//! The kernel-event PLEG: container exits, starts and OOM kills seen by swiftlet's eBPF programs
//! become pod lifecycle events at once, each after a targeted refresh of that one pod from the
//! runtime (so the event carries the status CRI reports: exit code, reason). The relist PLEG stays
//! underneath as the safety net, at a long period (300 s), and runs at once when the kernel says
//! it lost events or the event stream breaks — upstream's Evented PLEG shape, with the kernel as
//! the event source instead of the runtime.
//!
//! An exit is reported with the kernel's account of it. containerd shows a container as exited
//! only after its shim has reaped the init and `runc delete` has run, tens of milliseconds after
//! the kernel saw the exit, and a refresh costs several CRI round trips to a runtime busy with
//! that very exit. So the exit of a container's init is reported at once: the pod's last status
//! from CRI, with the dead container's state, exit code (or 128 + signal), reason and finish time
//! from the kernel's exit event, is cached and the `ContainerDied` sent. It is cached as old as
//! the status it amends (a pod worker must not take it for newer than what it did since, such as
//! creating the very container that died), and not at all when that status does not show the
//! container yet (it died before any refresh saw it: the refresh reports it). The refresh follows,
//! and follow-up refreshes run until CRI shows the exit; a disagreement on the exit code is
//! counted and logged, and CRI's word is kept. Starts, OOM kills and deaths known only from an
//! emptied cgroup wait for the refresh.
//!
//! Which kernel events matter: the exit that leaves a container's cgroup without processes (its
//! death), the exec of its init (the process that is pid 1 of its pid namespace: its start), and
//! OOM kills of any process of a container. Exits of other processes (runc's bootstrap, a
//! shell's children, exec probes) make no pod event. Processes outside pods never reach
//! userspace: the programs are filtered to the pods' cgroup (`kubepods`, or `cgroupRoot` without
//! QoS cgroups).
//!
//! The PLEG owns the cgroup index; what it learns of exits and OOM kills goes into the kernel's
//! facts of the pod records ([`PodRecords`], which every observation goes through), and it asks the
//! relist for what only the runtime can say. No behaviour is injected into the relist.

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use prometheus::{HistogramOpts, IntCounterVec, Opts, Registry};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::{
    Health, Pleg, PodCache,
    facts::{FactsMetrics, KernelExit},
    index::{ContainerCgroup, ContainerIndex, is_empty_cgroup, is_runtime_bootstrap},
    records::{Observation, PodRecords},
    relist::{Expect, RelistPleg},
};
use crate::{
    cgroup::PodCgroupLayout,
    container::PodUid,
    kernel::{EventBody, KernelEvent, StreamItem},
    lock::MutexExt as _,
};

/// The safety-net relist period under kernel events (upstream `eventedPlegRelistPeriod`).
pub const RELIST_PERIOD: Duration = Duration::from_secs(300);
/// Unhealthy past this without a relist (upstream `eventedPlegRelistThreshold`).
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(600);
/// The pauses before each repeat of the relist after a loss, for what the runtime had not caught
/// up with: an exit among the lost events has no kernel account to wait for, and under load
/// (thousands of exits at once) containerd can take seconds to show it. 1, 2, 4 and 8 s after.
const FOLLOW_UP_RELISTS: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];
/// How long a targeted refresh waits for the runtime to catch up with the kernel.
const PATIENCE: Duration = Duration::from_secs(2);
/// How long follow-up refreshes wait for the runtime to confirm an exit the kernel reported.
const CONFIRM_PATIENCE: Duration = Duration::from_secs(10);
/// The first and the longest pause between two follow-up refreshes.
const CONFIRM_PAUSES: (Duration, Duration) = (Duration::from_millis(5), Duration::from_millis(200));

#[derive(Clone)]
pub struct EbpfPlegMetrics {
    /// Kernel timestamp → pod lifecycle event sent.
    pub event_latency: prometheus::Histogram,
    /// Kernel events that triggered a refresh, by kind.
    pub triggers: IntCounterVec,
    /// Full relists asked for, by reason (`lost`, `lagged`, `stream`).
    pub relists: IntCounterVec,
    /// OOM kills by pod (series removed with the pod).
    pub oom_kills: IntCounterVec,
    /// Exits the runtime reported with another exit code than the kernel did.
    pub exit_disagreements: prometheus::IntCounter,
}

impl EbpfPlegMetrics {
    pub fn register(registry: &Registry) -> Result<EbpfPlegMetrics, prometheus::Error> {
        let latency = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "swiftlet_pleg_event_latency_seconds",
                "From the kernel seeing a container change to the PLEG's event with the \
                 runtime's refreshed status.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
        )?;
        let triggers = IntCounterVec::new(
            Opts::new(
                "swiftlet_pleg_kernel_triggers_total",
                "Kernel events that made the PLEG refresh a pod, by kind.",
            ),
            &["kind"],
        )?;
        let relists = IntCounterVec::new(
            Opts::new(
                "swiftlet_pleg_forced_relists_total",
                "Full relists the kernel-event PLEG asked for, by reason.",
            ),
            &["reason"],
        )?;
        let oom_kills = IntCounterVec::new(
            Opts::new(
                "swiftlet_oom_kills_total",
                "OOM kills of processes of a pod's containers.",
            ),
            &["namespace", "pod"],
        )?;
        let exit_disagreements = prometheus::IntCounter::new(
            "swiftlet_pleg_exit_code_disagreements_total",
            "Container exits the runtime reported with another exit code than the kernel's exit \
             event carried (the runtime's is kept).",
        )?;
        registry.register(Box::new(exit_disagreements.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(triggers.clone()))?;
        registry.register(Box::new(relists.clone()))?;
        registry.register(Box::new(oom_kills.clone()))?;
        Ok(EbpfPlegMetrics {
            event_latency: latency,
            triggers,
            relists,
            oom_kills,
            exit_disagreements,
        })
    }
}

impl EbpfPlegMetrics {
    /// The counters the kernel's facts keep, for [`KernelFacts::new`](super::facts::KernelFacts::new).
    pub fn facts(&self) -> FactsMetrics {
        FactsMetrics {
            exit_disagreements: self.exit_disagreements.clone(),
            oom_kills: self.oom_kills.clone(),
        }
    }
}

/// How the PLEG looks at a container's processes (tests have no containers).
#[derive(Clone, Copy)]
pub struct Processes {
    /// Whether a host pid is pid 1 of its pid namespace.
    pub is_init: fn(u32) -> bool,
    /// Whether the exit of a process left its container's cgroup (the directory, if it still
    /// exists) empty.
    pub is_last_process: fn(Option<&Path>, u32) -> bool,
}

impl Default for Processes {
    fn default() -> Self {
        Processes {
            is_init: super::index::is_namespace_init,
            // A cgroup already removed (the runtime cleans up fast) is empty too.
            is_last_process: |dir, _| dir.is_none_or(is_empty_cgroup),
        }
    }
}

/// The kernel-event PLEG. It owns the cgroup index and reads the kernel's events; what it learns
/// goes into the pod records ([`PodRecords`]: exits and OOM kills as facts, exits reported at
/// once), and it asks the relist for what only the runtime can say.
pub struct EbpfPleg {
    relist: Arc<RelistPleg>,
    records: Arc<PodRecords>,
    index: Mutex<ContainerIndex>,
    cgroup2_root: PathBuf,
    metrics: EbpfPlegMetrics,
    stream_alive: AtomicBool,
    processes: Processes,
}

impl EbpfPleg {
    /// Wraps `relist` (which should run at [`RELIST_PERIOD`] and record into `records`) and
    /// indexes the containers that already run in the pods' cgroups below `cgroup2_root`.
    pub fn new(
        relist: Arc<RelistPleg>,
        records: Arc<PodRecords>,
        cgroup2_root: PathBuf,
        pods: PodCgroupLayout,
        metrics: EbpfPlegMetrics,
        processes: Processes,
    ) -> Arc<Self> {
        let mut index = ContainerIndex::under(pods);
        index.scan(&cgroup2_root);
        tracing::info!(
            containers = index.len(),
            "kernel-event PLEG: indexed running containers"
        );
        Arc::new(EbpfPleg {
            relist,
            records,
            index: Mutex::new(index),
            cgroup2_root,
            metrics,
            stream_alive: AtomicBool::new(true),
            processes,
        })
    }

    fn index(&self) -> std::sync::MutexGuard<'_, ContainerIndex> {
        self.index.lock_unpoisoned()
    }

    /// Consumes kernel events until shut down or the stream ends (then the PLEG reports itself
    /// unhealthy and the relist goes on alone).
    pub async fn run(
        self: Arc<Self>,
        mut events: broadcast::Receiver<Arc<StreamItem>>,
        shutdown: CancellationToken,
    ) {
        loop {
            let item = tokio::select! {
                item = events.recv() => item,
                () = shutdown.cancelled() => return,
            };
            match item {
                Ok(item) => self.handle(&item),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "kernel-event PLEG fell behind: relisting");
                    self.force_relist("lagged");
                }
                // At shutdown the pump closes the stream while this task is told to stop: both
                // are ready at once, and an ended stream then is no failure.
                Err(broadcast::error::RecvError::Closed) if shutdown.is_cancelled() => return,
                Err(broadcast::error::RecvError::Closed) => {
                    tracing::error!(
                        "the kernel event stream ended: the PLEG falls back to its relist"
                    );
                    self.stream_alive.store(false, Ordering::Release);
                    self.force_relist("stream");
                    return;
                }
            }
        }
    }

    /// A relist now, and again over the next seconds: what the lost events were about may not
    /// have reached the runtime yet when the first one lists it (it learns of an exit after the
    /// kernel does).
    fn force_relist(&self, reason: &str) {
        self.metrics.relists.with_label_values(&[reason]).inc();
        self.relist.request_full_relist();
        let relist = self.relist.clone();
        tokio::spawn(async move {
            for pause in FOLLOW_UP_RELISTS {
                tokio::time::sleep(pause).await;
                relist.request_full_relist();
            }
        });
    }

    /// One kernel event (public for tests).
    pub fn handle(self: &Arc<Self>, item: &StreamItem) {
        let event = match item {
            StreamItem::Lost { count } => {
                tracing::warn!(count, "the kernel lost events: relisting");
                self.force_relist("lost");
                return;
            }
            StreamItem::Event(event) => event,
        };
        if let Some((uid, container, expect)) = self.interpret(event) {
            self.metrics
                .triggers
                .with_label_values(&[event.body.kind().as_str()])
                .inc();
            let pid = match &event.body {
                EventBody::Exec(e) => e.pid,
                EventBody::Exit(e) => e.pid,
                EventBody::Oom(e) => e.pid,
                _ => 0,
            };
            tracing::debug!(pod = %uid, container, ?expect, pid, kind = event.body.kind().as_str(), "kernel event: refreshing the pod");
            // An exit the kernel gave an account of is reported now, from the cached status;
            // the refresh below brings the runtime's view of the rest of the pod.
            if expect == Expect::Stopped && self.records.facts().exit_pending(&container) {
                self.records.record(
                    &uid,
                    Some(&container),
                    Observation::KernelExit {
                        kernel_ts_ns: event.ts_ns,
                    },
                );
            }
            let pleg = self.clone();
            let ts = event.ts_ns;
            tokio::spawn(async move {
                pleg.relist
                    .refresh_pod_expecting(&uid, &container, expect, ts, PATIENCE)
                    .await;
                pleg.confirm_exit(&uid, &container).await;
            });
        }
    }

    /// Updates the index from `event`, and says which pod to refresh for it, if any.
    fn interpret(&self, event: &KernelEvent) -> Option<(PodUid, String, Expect)> {
        let mut index = self.index();
        match &event.body {
            EventBody::CgroupMkdir(c) => {
                index.insert_path(c.cgroup_id, &c.path.display().to_string());
                None
            }
            EventBody::CgroupRmdir(c) => {
                let entry = index.remove(c.cgroup_id)?;
                drop(index);
                // A container without an init of its own (one sharing the pod's pid namespace,
                // or an ephemeral container in its target's) is judged dead by its cgroup
                // emptying, which an exit can read too early (the exiting process is still
                // counted); the runtime removing its cgroup is the kernel's last word on it.
                let judged_by_emptying = entry.started
                    && entry.init_pid.is_none()
                    && !self.records.is_sandbox(&entry.pod, &entry.container_id);
                judged_by_emptying.then_some((entry.pod, entry.container_id, Expect::Stopped))
            }
            EventBody::Exec(exec) => {
                let entry = index.get_mut(exec.cgroup_id)?;
                if is_runtime_bootstrap(&exec.comm, &exec.filename) {
                    return None;
                }
                // The container's own program starts: its init is the process that is pid 1 of
                // its pid namespace (pods sharing one pid namespace have none of their own).
                if entry.init_pid.is_none() && (self.processes.is_init)(exec.pid) {
                    entry.init_pid = Some(exec.pid);
                }
                if entry.started {
                    return None;
                }
                entry.started = true;
                Some((
                    entry.pod.clone(),
                    entry.container_id.clone(),
                    Expect::Running,
                ))
            }
            EventBody::Exit(exit) => {
                // Before the container's program started, exits are the runtime's bootstrap,
                // unless one leaves the cgroup empty: a container that never ran, or one whose
                // start the kernel lost (a full ring buffer) — its death must not be missed.
                // After, the container is dead when its init exits, or when no process is left
                // in its cgroup (no init of its own, or the init's death took the rest of its pid
                // namespace with it after its own exit was read).
                let entry = index.get(exit.cgroup_id)?.clone();
                drop(index);
                let init = entry.started && entry.init_pid == Some(exit.pid);
                // The init's exit status is the container's; the last process of a cgroup
                // without an init of its own says nothing about the container's, and a
                // sandbox's pause process is the runtime's to report.
                if init && !self.records.is_sandbox(&entry.pod, &entry.container_id) {
                    self.records.facts().record_exit(
                        entry.container_id.clone(),
                        KernelExit {
                            pod: entry.pod.clone(),
                            exit_code: exit.container_exit_code(),
                            finished_at: crate::kernel::wall_clock_of(event.ts_ns),
                        },
                    );
                }
                let dead = init
                    || (self.processes.is_last_process)(
                        self.cgroup_dir(&entry).as_deref(),
                        exit.pid,
                    );
                dead.then_some((entry.pod, entry.container_id, Expect::Stopped))
            }
            EventBody::Oom(oom) => {
                let entry = index.get_mut(oom.cgroup_id)?;
                entry.oom_killed = true;
                let (pod, container) = (entry.pod.clone(), entry.container_id.clone());
                drop(index);
                self.record_oom(&pod, &container);
                Some((pod, container, Expect::Any))
            }
            // Memory pressure changes no container's state: the eviction manager's business.
            EventBody::Pressure(_) | EventBody::MemcgLevel(_) => None,
        }
    }

    /// Refreshes `pod` until the runtime shows the exit of `container` the kernel reported (the
    /// amender then forgets it), so that the cache soon holds the runtime's own account.
    async fn confirm_exit(&self, pod: &PodUid, container: &str) {
        let give_up = tokio::time::Instant::now() + CONFIRM_PATIENCE;
        let mut pause = CONFIRM_PAUSES.0;
        while self.records.facts().exit_pending(container) {
            if tokio::time::Instant::now() >= give_up {
                tracing::warn!(pod = %pod, container, "the runtime has not shown the exit the kernel reported within {CONFIRM_PATIENCE:?}; the status keeps the kernel's account");
                return;
            }
            tokio::time::sleep(pause).await;
            self.relist.relist_pod(pod).await;
            pause = (pause * 2).min(CONFIRM_PAUSES.1);
        }
    }

    /// The container's cgroup directory, if it still exists (the index must not be locked).
    fn cgroup_dir(&self, entry: &ContainerCgroup) -> Option<PathBuf> {
        self.index()
            .container_dirs(&self.cgroup2_root, entry)
            .into_iter()
            .find(|d| d.exists())
    }

    fn record_oom(&self, pod: &PodUid, container: &str) {
        let (name, namespace) = self.records.identity(pod).unwrap_or_default();
        self.records
            .facts()
            .record_oom(pod, container, &namespace, &name);
    }

    /// Whether an OOM kill hit the container (for its status).
    pub fn oom_killed(&self, container_id: &str) -> bool {
        self.records.facts().oom_killed(container_id)
    }

    pub fn relist(&self) -> &Arc<RelistPleg> {
        &self.relist
    }
}

impl Pleg for EbpfPleg {
    fn health(&self) -> Health {
        if !self.stream_alive.load(Ordering::Acquire) {
            return Health::Unhealthy("the kernel event stream ended".into());
        }
        self.relist.health()
    }

    fn cache(&self) -> Arc<PodCache> {
        self.records.cache()
    }

    fn request_relist(&self, pod: &PodUid) {
        self.relist.request_relist(pod);
    }
}

#[cfg(test)]
mod tests;
