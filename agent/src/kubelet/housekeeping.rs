//! What keeps the node's disk in check: container log rotation (every `containerLogMonitorInterval`), the container GC (soon after a container dies,
//! and every minute as the safety net) and the image GC (every five minutes, and at once when the
//! eviction manager reports DiskPressure, then reclaiming every unused image and dead container
//! as upstream's eviction manager does).
//!
//! Upstream: `StartGarbageCollection` in `pkg/kubelet/kubelet.go` and the eviction manager's
//! `reclaimNodeLevelResources`. The collectors' failures are events about the node, as upstream
//! reports them (`ContainerGCFailed`, `ImageGCFailed`, `InvalidDiskCapacity`,
//! `FreeDiskSpaceFailed`).

use std::{
    collections::BTreeSet,
    sync::Arc,
    time::{Duration, Instant},
};

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::Kubelet;
use crate::{
    container::PodUid,
    cri::{ImageService, RuntimeService},
    events::{Action, Event, Events, node_ref, reasons},
    eviction::NodeCondition,
    kuberuntime::{
        gc::{CONTAINER_GC_PERIOD, ContainerGc, ContainerGcPolicy, GcOutcome, PodStateProvider},
        image_gc::{IMAGE_GC_PERIOD, ImageGcError, ImageGcManager, ImageGcPolicy},
    },
    logs::{ContainerLogManager, LogRotatePolicy},
    pleg::{EventType, PublishedEvent},
    pod_workers::WorkerPhase,
    sources::SourcesReady,
};

/// How long the sources must have been ready before the container GC trusts that a pod the
/// kubelet does not know is gone (upstream waits for the pod workers' first `SyncKnownPods`):
/// the pods of a ready source reach the pod manager through the sync loop a moment later.
const SOURCES_SETTLE: Duration = Duration::from_secs(10);

/// How long the container GC waits after a container died for more to die (a pod stopping
/// ends all its containers at once).
const GC_DEBOUNCE: Duration = Duration::from_secs(2);

/// What the collectors did, for `/metrics`.
#[derive(Clone)]
struct HousekeepingMetrics {
    /// By `object`: `container`, `sandbox`, `log_dir`.
    gc_removed: IntCounterVec,
    image_gc_freed_bytes: IntCounter,
}

impl HousekeepingMetrics {
    fn register(
        registry: &Registry,
    ) -> Result<(HousekeepingMetrics, IntCounter), prometheus::Error> {
        let rotations = IntCounter::new(
            "swiftlet_container_log_rotations_total",
            "Container logs rotated because they reached containerLogMaxSize.",
        )?;
        let gc_removed = IntCounterVec::new(
            Opts::new(
                "swiftlet_container_gc_removed_total",
                "Dead containers, sandboxes and pod log directories the container GC removed.",
            ),
            &["object"],
        )?;
        let image_gc_freed_bytes = IntCounter::new(
            "swiftlet_image_gc_freed_bytes_total",
            "Bytes of unused images the image GC removed.",
        )?;
        registry.register(Box::new(rotations.clone()))?;
        registry.register(Box::new(gc_removed.clone()))?;
        registry.register(Box::new(image_gc_freed_bytes.clone()))?;
        Ok((
            HousekeepingMetrics {
                gc_removed,
                image_gc_freed_bytes,
            },
            rotations,
        ))
    }

    fn observe(&self, outcome: &GcOutcome) {
        for (object, n) in [
            ("container", outcome.containers),
            ("sandbox", outcome.sandboxes),
            ("log_dir", outcome.log_dirs),
        ] {
            self.gc_removed
                .with_label_values(&[object])
                .inc_by(n as u64);
        }
    }
}

/// The kubelet's view of which pods' leftovers may go.
struct KubeletPods(Arc<Kubelet>);

impl PodStateProvider for KubeletPods {
    fn should_pod_content_be_removed(&self, uid: &PodUid) -> bool {
        let kubelet = &self.0;
        if kubelet.workers.is_evicted(uid) {
            return true;
        }
        // A pod the sources still list keeps its dead containers' logs (a completed pod's too).
        if kubelet.pods.get(uid).is_some() {
            return false;
        }
        kubelet
            .workers
            .phase(uid)
            .is_none_or(|p| matches!(p, WorkerPhase::Terminated | WorkerPhase::Finished))
    }

    fn should_pod_runtime_be_removed(&self, uid: &PodUid) -> bool {
        self.0.workers.is_known_terminated(uid) || self.should_pod_content_be_removed(uid)
    }
}

/// What housekeeping is told: the log rotation policy, where pod logs live, both GC policies.
#[derive(Clone, Debug)]
pub struct HousekeepingConfig {
    pub rotation: LogRotatePolicy,
    pub pod_logs_dir: std::path::PathBuf,
    pub containers: ContainerGcPolicy,
    pub images: ImageGcPolicy,
}

/// What wakes the collectors besides their periods.
pub struct Triggers {
    /// The container GC trusts that a pod the kubelet does not know is gone only once these
    /// have been ready a while.
    pub sources_ready: SourcesReady,
    /// A container died: collect soon.
    pub pleg_events: broadcast::Receiver<Arc<PublishedEvent>>,
    /// The eviction manager's node conditions: DiskPressure reclaims at once.
    pub conditions: watch::Receiver<BTreeSet<NodeCondition>>,
}

/// Log rotation and both collectors (upstream `StartGarbageCollection`).
pub struct Housekeeping {
    rotation: Arc<ContainerLogManager>,
    container_gc: Arc<ContainerGc>,
    image_gc: Arc<ImageGcManager>,
    metrics: HousekeepingMetrics,
    reporter: GcReporter,
}

/// The collectors' failures as events about the node (upstream `StartGarbageCollection` and
/// the image GC manager's `GarbageCollect`).
#[derive(Clone)]
struct GcReporter {
    node: String,
    events: Events,
}

impl GcReporter {
    fn warn(&self, reason: &str, note: String) {
        self.events.record(Event::warning(
            node_ref(&self.node),
            reason,
            Action::CollectGarbage,
            note,
        ));
    }

    /// A container GC failure: each one (`ContainerGCFailed`).
    fn container_gc_failed(&self, error: &dyn std::fmt::Display) {
        self.warn(reasons::CONTAINER_GC_FAILED, error.to_string());
    }

    /// An image GC failure: a zero capacity (`InvalidDiskCapacity`) or too little to free
    /// (`FreeDiskSpaceFailed`) each time, with upstream's messages; any failure after another
    /// (`ImageGCFailed`: upstream reports only repeats, the first may be stats still warming up).
    fn image_gc_failed(&self, error: &ImageGcError, again: bool) {
        match error {
            ImageGcError::ZeroCapacity { .. } => self.warn(
                reasons::INVALID_DISK_CAPACITY,
                "invalid capacity 0 on image filesystem".into(),
            ),
            ImageGcError::NotEnough { wanted, freed } => self.warn(
                reasons::FREE_DISK_SPACE_FAILED,
                format!(
                    "Failed to garbage collect required amount of images. Attempted to free \
                     {wanted} bytes, but only found {freed} bytes eligible to free."
                ),
            ),
            _ => {}
        }
        if again {
            self.warn(reasons::IMAGE_GC_FAILED, error.to_string());
        }
    }
}

impl Housekeeping {
    pub fn new(
        config: HousekeepingConfig,
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        kubelet: &Arc<Kubelet>,
        registry: &Registry,
    ) -> Result<Self, prometheus::Error> {
        let (metrics, rotations) = HousekeepingMetrics::register(registry)?;
        let rotation = Arc::new(
            ContainerLogManager::new(runtime.clone(), config.rotation)
                .with_rotations_counter(rotations),
        );
        let container_gc = Arc::new(ContainerGc::new(
            runtime.clone(),
            Arc::new(KubeletPods(kubelet.clone())),
            config.containers,
            config.pod_logs_dir,
        ));
        let image_gc = Arc::new(ImageGcManager::new(images, runtime, config.images));
        Ok(Housekeeping {
            rotation,
            container_gc,
            image_gc,
            metrics,
            reporter: GcReporter {
                node: kubelet.node_name.clone(),
                events: kubelet.events().clone(),
            },
        })
    }

    /// Rotates logs and collects until `shutdown`.
    pub async fn run(self, triggers: Triggers, shutdown: CancellationToken) {
        tokio::join!(
            self.rotation.run(shutdown.clone()),
            run_container_gc(
                self.container_gc.clone(),
                triggers.sources_ready.clone(),
                triggers.pleg_events,
                (self.metrics.clone(), self.reporter.clone()),
                shutdown.clone(),
            ),
            run_image_gc(
                self.image_gc,
                self.container_gc,
                triggers.sources_ready,
                triggers.conditions,
                (self.metrics, self.reporter),
                shutdown,
            ),
        );
    }
}

/// Collects a minute after the last collection, or soon after a container died.
async fn run_container_gc(
    gc: Arc<ContainerGc>,
    ready: SourcesReady,
    mut events: broadcast::Receiver<Arc<PublishedEvent>>,
    (metrics, reporter): (HousekeepingMetrics, GcReporter),
    shutdown: CancellationToken,
) {
    let mut events_open = true;
    let mut ready_since: Option<Instant> = None;
    loop {
        let wait = tokio::time::sleep(CONTAINER_GC_PERIOD);
        tokio::pin!(wait);
        // Until a container dies (or events were missed), or the period ends.
        loop {
            let event = async {
                if events_open {
                    events.recv().await
                } else {
                    std::future::pending().await
                }
            };
            tokio::select! {
                () = &mut wait => break,
                () = shutdown.cancelled() => return,
                event = event => match event {
                    Ok(e) if e.event.kind != EventType::ContainerDied => continue,
                    Err(broadcast::error::RecvError::Closed) => {
                        // No more events: the period alone drives collections.
                        events_open = false;
                        continue;
                    }
                    _ => {
                        tokio::select! {
                            () = tokio::time::sleep(GC_DEBOUNCE) => {}
                            () = shutdown.cancelled() => return,
                        }
                        // What died meanwhile is collected now too.
                        events = events.resubscribe();
                        break;
                    }
                },
            }
        }
        let ready_now = ready.all_ready();
        if !ready_now {
            ready_since = None;
        }
        let settled =
            ready_now && ready_since.get_or_insert_with(Instant::now).elapsed() >= SOURCES_SETTLE;
        match gc.collect(settled, false).await {
            Ok(outcome) => {
                metrics.observe(&outcome);
                if outcome != GcOutcome::default() {
                    tracing::debug!(?outcome, "container GC");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "container GC failed");
                reporter.container_gc_failed(&e);
            }
        }
    }
}

/// Collects images every period while enabled, and reclaims at once when DiskPressure appears.
async fn run_image_gc(
    images: Arc<ImageGcManager>,
    containers: Arc<ContainerGc>,
    ready: SourcesReady,
    mut conditions: watch::Receiver<BTreeSet<NodeCondition>>,
    (metrics, reporter): (HousekeepingMetrics, GcReporter),
    shutdown: CancellationToken,
) {
    let enabled = images.policy().enabled();
    let mut failed_before = false;
    if !enabled {
        tracing::info!("imageGCHighThresholdPercent is 100: image GC is disabled");
    }
    let mut tick = tokio::time::interval(IMAGE_GC_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut under_pressure = false;
    let mut conditions_open = true;
    loop {
        let changed = async {
            if conditions_open {
                conditions.changed().await
            } else {
                std::future::pending().await
            }
        };
        tokio::select! {
            _ = tick.tick() => {
                if enabled {
                    match images.garbage_collect().await {
                        Ok(freed) => {
                            metrics.image_gc_freed_bytes.inc_by(freed);
                            failed_before = false;
                        }
                        Err(e) => {
                            if let ImageGcError::NotEnough { freed, .. } = e {
                                metrics.image_gc_freed_bytes.inc_by(freed);
                            }
                            tracing::warn!(error = %e, "image GC failed");
                            reporter.image_gc_failed(&e, failed_before);
                            failed_before = true;
                        }
                    }
                }
            }
            changed = changed => {
                if changed.is_err() {
                    // The eviction manager stopped: only the period is left.
                    conditions_open = false;
                    continue;
                }
                let pressure = conditions.borrow_and_update().contains(&NodeCondition::DiskPressure);
                if pressure && !under_pressure {
                    reclaim(&images, &containers, ready.all_ready(), &metrics).await;
                }
                under_pressure = pressure;
            }
            () = shutdown.cancelled() => return,
        }
    }
}

/// Under disk pressure: every dead container of a pod that will not run it again, then every
/// unused image (upstream `DeleteAllUnusedContainers`, `DeleteUnusedImages`).
async fn reclaim(
    images: &ImageGcManager,
    containers: &ContainerGc,
    sources_ready: bool,
    metrics: &HousekeepingMetrics,
) {
    tracing::info!("DiskPressure: removing dead containers and unused images");
    match containers.collect(sources_ready, true).await {
        Ok(outcome) => metrics.observe(&outcome),
        Err(e) => tracing::warn!(error = %e, "disk pressure: container GC failed"),
    }
    match images.delete_unused_images().await {
        Ok(freed) => {
            metrics.image_gc_freed_bytes.inc_by(freed);
            tracing::info!(freed, "disk pressure: unused images removed");
        }
        Err(e) => tracing::warn!(error = %e, "disk pressure: image GC failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::fake::FakeRecorder;

    #[test]
    fn gc_failures_are_reported_as_upstream_reports_them() {
        let recorder = FakeRecorder::new();
        let reporter = GcReporter {
            node: "n1".into(),
            events: recorder.clone(),
        };
        let not_enough = ImageGcError::NotEnough {
            wanted: 100,
            freed: 40,
        };
        reporter.image_gc_failed(&not_enough, false);
        reporter.image_gc_failed(
            &ImageGcError::ZeroCapacity {
                path: "/var/lib/containerd".into(),
            },
            true,
        );
        reporter.container_gc_failed(&"rpc error: unavailable");
        let summary = recorder.summary();
        let reasons: Vec<&str> = summary.iter().map(|(_, r, _)| r.as_str()).collect();
        // The first image GC failure is not one in a row: no ImageGCFailed for it.
        assert_eq!(
            reasons,
            [
                "FreeDiskSpaceFailed",
                "InvalidDiskCapacity",
                "ImageGCFailed",
                "ContainerGCFailed"
            ]
        );
        assert_eq!(
            summary[0].2,
            "Failed to garbage collect required amount of images. Attempted to free 100 bytes, \
             but only found 40 bytes eligible to free."
        );
        assert_eq!(summary[1].2, "invalid capacity 0 on image filesystem");
        assert!(
            recorder
                .events()
                .iter()
                .all(|e| e.type_ == crate::events::EventType::Warning
                    && e.regarding.kind.as_deref() == Some("Node"))
        );
    }
}
