//! The kernel-event PLEG: container exits, starts and OOM kills seen by swiftlet's eBPF programs
//! become pod lifecycle events at once, each after a targeted refresh of that one pod from the
//! runtime (so the event carries the status CRI reports: exit code, reason). The relist PLEG stays
//! underneath as the safety net, at a long period (300 s), and runs at once when the kernel says
//! it lost events or the event stream breaks — upstream's Evented PLEG shape, with the kernel as
//! the event source instead of the runtime.
//!
//! Which kernel events matter: the exit that leaves a container's cgroup without processes (its
//! death), the exec of its init (the process that is pid 1 of its pid namespace: its start), and
//! OOM kills of any process of a container. Exits of other processes (runc's bootstrap, a
//! shell's children, exec probes) make no pod event. Processes outside pods never reach
//! userspace: the programs are filtered to the `kubepods` subtree.

use std::{
    path::PathBuf,
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
    index::{ContainerCgroup, ContainerIndex, is_empty_cgroup, is_runtime_bootstrap},
    relist::{Expect, RelistPleg},
};
use crate::{
    container::PodUid,
    kernel::{EventBody, KernelEvent, StreamItem},
};

/// The safety-net relist period under kernel events (upstream `eventedPlegRelistPeriod`).
pub const RELIST_PERIOD: Duration = Duration::from_secs(300);
/// Unhealthy past this without a relist (upstream `eventedPlegRelistThreshold`).
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(600);
/// When the relist after a loss is repeated, for what the runtime had not caught up with.
const FOLLOW_UP_RELIST: Duration = Duration::from_secs(1);
/// How long a targeted refresh waits for the runtime to catch up with the kernel.
const PATIENCE: Duration = Duration::from_secs(2);

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
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(triggers.clone()))?;
        registry.register(Box::new(relists.clone()))?;
        registry.register(Box::new(oom_kills.clone()))?;
        Ok(EbpfPlegMetrics {
            event_latency: latency,
            triggers,
            relists,
            oom_kills,
        })
    }
}

pub struct EbpfPleg {
    relist: Arc<RelistPleg>,
    index: Mutex<ContainerIndex>,
    cgroup2_root: PathBuf,
    metrics: EbpfPlegMetrics,
    stream_alive: AtomicBool,
    /// Containers an OOM kill hit, kept after their cgroup is gone (their exited status stays
    /// in the runtime); bounded.
    oom_killed: Arc<Mutex<std::collections::VecDeque<String>>>,
    /// Pods with an OOM series, to drop it with the pod.
    oom_series: OomSeries,
    /// Whether a host pid is pid 1 of its pid namespace (injected: tests have no containers).
    is_init: fn(u32) -> bool,
    /// Whether the exit of a process left its container's cgroup empty (injected likewise).
    is_last_process: fn(&EbpfPleg, &ContainerCgroup, u32) -> bool,
}

/// Pod → (namespace, name) of its `swiftlet_oom_kills_total` series.
type OomSeries = Arc<Mutex<std::collections::HashMap<PodUid, (String, String)>>>;

/// How many OOM-killed container ids are remembered.
const OOM_MEMORY: usize = 4096;

impl EbpfPleg {
    /// Wraps `relist` (which should run at [`RELIST_PERIOD`]) and indexes the containers that
    /// already run below `cgroup2_root/kubepods`.
    pub fn new(
        relist: Arc<RelistPleg>,
        cgroup2_root: PathBuf,
        metrics: EbpfPlegMetrics,
    ) -> Arc<Self> {
        relist.set_event_latency(metrics.event_latency.clone());
        let oom_killed: Arc<Mutex<std::collections::VecDeque<String>>> = Arc::default();
        {
            // containerd may not have seen the OOM kill when it reports the exit; the kernel has.
            let oom_killed = oom_killed.clone();
            relist.set_amender(Arc::new(move |status| {
                let killed = oom_killed.lock().unwrap_or_else(|p| p.into_inner());
                for c in &mut status.containers {
                    if c.state == crate::container::ContainerState::Exited
                        && c.reason != "OOMKilled"
                        && killed.contains(&c.id.id)
                    {
                        c.reason = "OOMKilled".into();
                    }
                }
            }));
        }
        // The OOM series of a pod lives as long as the pod does in the runtime: a Failed pod
        // still shows why it failed, a deleted one leaves no stale series.
        let oom_series: OomSeries = Arc::default();
        {
            let oom_series = oom_series.clone();
            let counter = metrics.oom_kills.clone();
            relist.set_on_gone(Arc::new(move |uid| {
                let series = oom_series
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(uid);
                if let Some((namespace, name)) = series {
                    let _ = counter.remove_label_values(&[namespace.as_str(), name.as_str()]);
                }
            }));
        }
        let mut index = ContainerIndex::default();
        index.scan(&cgroup2_root);
        tracing::info!(
            containers = index.len(),
            "kernel-event PLEG: indexed running containers"
        );
        Arc::new(EbpfPleg {
            relist,
            index: Mutex::new(index),
            cgroup2_root,
            metrics,
            stream_alive: AtomicBool::new(true),
            oom_killed,
            oom_series,
            is_init: super::index::is_namespace_init,
            is_last_process: |pleg, entry, _| {
                // A cgroup already removed (the runtime cleans up fast) is empty too.
                pleg.cgroup_dir(entry).is_none_or(|d| is_empty_cgroup(&d))
            },
        })
    }

    fn index(&self) -> std::sync::MutexGuard<'_, ContainerIndex> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
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

    /// A relist now, and another a moment later: what the lost events were about may not have
    /// reached the runtime yet when the first one lists it (it learns of an exit after the
    /// kernel does).
    fn force_relist(&self, reason: &str) {
        self.metrics.relists.with_label_values(&[reason]).inc();
        self.relist.request_full_relist();
        let relist = self.relist.clone();
        tokio::spawn(async move {
            tokio::time::sleep(FOLLOW_UP_RELIST).await;
            relist.request_full_relist();
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
            let relist = self.relist.clone();
            let ts = event.ts_ns;
            tokio::spawn(async move {
                relist
                    .refresh_pod_expecting(&uid, &container, expect, ts, PATIENCE)
                    .await;
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
                index.remove(c.cgroup_id);
                None
            }
            EventBody::Exec(exec) => {
                let entry = index.get_mut(exec.cgroup_id)?;
                if is_runtime_bootstrap(&exec.comm, &exec.filename) {
                    return None;
                }
                // The container's own program starts: its init is the process that is pid 1 of
                // its pid namespace (pods sharing one pid namespace have none of their own).
                if entry.init_pid.is_none() && (self.is_init)(exec.pid) {
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
                // Before the container's program started, exits are the runtime's bootstrap.
                // After, the container is dead when its init exits, or when no process is left
                // in its cgroup (no init of its own, or the init's death took the rest of its pid
                // namespace with it after its own exit was read).
                let entry = index.get(exit.cgroup_id)?;
                if !entry.started {
                    return None;
                }
                let dead = entry.init_pid == Some(exit.pid)
                    || (self.is_last_process)(self, entry, exit.pid);
                dead.then(|| {
                    (
                        entry.pod.clone(),
                        entry.container_id.clone(),
                        Expect::Stopped,
                    )
                })
            }
            EventBody::Oom(oom) => {
                let entry = index.get_mut(oom.cgroup_id)?;
                entry.oom_killed = true;
                let (pod, container) = (entry.pod.clone(), entry.container_id.clone());
                drop(index);
                self.record_oom(&pod, &container);
                Some((pod, container, Expect::Any))
            }
        }
    }

    fn cgroup_dir(&self, entry: &ContainerCgroup) -> Option<PathBuf> {
        // Containers sit below a pod cgroup in one of the QoS levels.
        ["kubepods", "kubepods/burstable", "kubepods/besteffort"]
            .iter()
            .map(|parent| {
                self.cgroup2_root
                    .join(parent)
                    .join(format!("pod{}", entry.pod))
                    .join(&entry.container_id)
            })
            .find(|d| d.exists())
    }

    fn record_oom(&self, pod: &PodUid, container: &str) {
        {
            let mut killed = self.oom_killed.lock().unwrap_or_else(|p| p.into_inner());
            if !killed.iter().any(|c| c == container) {
                if killed.len() >= OOM_MEMORY {
                    killed.pop_front();
                }
                killed.push_back(container.to_owned());
            }
        }
        let (name, namespace) = self.relist.identity(pod).unwrap_or_default();
        self.metrics
            .oom_kills
            .with_label_values(&[namespace.as_str(), name.as_str()])
            .inc();
        self.oom_series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pod.clone(), (namespace, name));
    }

    /// Whether an OOM kill hit the container (for its status).
    pub fn oom_killed(&self, container_id: &str) -> bool {
        self.oom_killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|c| c == container_id)
    }

    /// Uses `is_init` and `is_last_process` instead of looking at /proc and the cgroup (tests).
    pub fn with_process_checks(
        self: Arc<Self>,
        is_init: fn(u32) -> bool,
        is_last_process: fn(&EbpfPleg, &ContainerCgroup, u32) -> bool,
    ) -> Arc<Self> {
        match Arc::try_unwrap(self) {
            Ok(mut pleg) => {
                pleg.is_init = is_init;
                pleg.is_last_process = is_last_process;
                Arc::new(pleg)
            }
            Err(shared) => shared,
        }
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
        self.relist.cache()
    }

    fn request_relist(&self, pod: &PodUid) {
        self.relist.request_relist(pod);
    }
}

#[cfg(test)]
mod tests;
