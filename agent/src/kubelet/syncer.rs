//! The sync functions the pod workers call (upstream `Kubelet.SyncPod`, `SyncTerminatingPod`,
//! `SyncTerminatingRuntimePod`, `SyncTerminatedPod` in `kubelet.go`): generate and record the
//! pod's status, make its cgroup, and hand the runtime work to `kuberuntime`.

use crate::lock::MutexExt as _;
use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use super::{
    active_deadline::{self, DeadlineTimers},
    pod_manager::PodManager,
};
use crate::{
    cm::pod_cgroups::PodCgroups,
    container::{PodStatus, PodUid, RunningPod},
    events::{Action, Event, Events, pod_ref, reasons},
    kuberuntime::manager::KubeRuntimeManager,
    pod_workers::{PodSyncer, SyncPodOutcome, UpdateType, pod_uid},
    prober::ProbeManager,
    status::{
        ReasonCache, StartFailure, StartFailureReason, StatusManager, generate_api_pod_status,
        generate_terminal_api_pod_status,
    },
    volume::VolumeManager,
};

/// How long orphans (pods no source knows) get to stop (upstream uses 1 s, raised to the
/// runtime minimum).
const ORPHAN_GRACE: Duration = Duration::from_secs(1);

pub struct KubeletSyncer {
    pub metrics: super::metrics::KubeletMetrics,
    /// Pods already seen running (each counted once in the start-duration histogram).
    pub started: Mutex<std::collections::HashSet<PodUid>>,
    pub runtime: Arc<KubeRuntimeManager>,
    pub status: Arc<StatusManager>,
    pub cgroups: Arc<PodCgroups>,
    pub reasons: Arc<Mutex<ReasonCache>>,
    pub pods: Arc<PodManager>,
    pub host_ip: Option<String>,
    pub probes: ProbeManager,
    pub volumes: Arc<VolumeManager>,
    /// A pod whose volumes are not set up in time is reported here (`FailedMount`).
    pub events: Events,
    /// One timer per pod with an `activeDeadlineSeconds`, set from each status generated.
    pub deadlines: Arc<DeadlineTimers>,
}

impl KubeletSyncer {
    fn record_status(&self, pod: &Pod, runtime: &PodStatus, terminal: bool) -> bool {
        let previous = self.status.with_status(pod);
        let reasons = self.reasons.lock_unpoisoned();
        let generate = if terminal {
            generate_terminal_api_pod_status
        } else {
            generate_api_pod_status
        };
        let now = SystemTime::now();
        let mut api = generate(
            &previous,
            runtime,
            &reasons,
            &self.probes,
            self.host_ip.as_deref(),
            now,
        );
        drop(reasons);
        self.enforce_active_deadline(pod, &mut api, now);
        let done = matches!(api.phase.as_deref(), Some("Succeeded" | "Failed"));
        if api.phase.as_deref() == Some("Running") {
            self.observe_start(pod);
        }
        let handle = self
            .pods
            .get(&pod_uid(pod))
            .unwrap_or_else(|| Arc::new(pod.clone()));
        self.status.set_pod_status(&handle, api);
        done
    }
}

impl KubeletSyncer {
    /// Upstream `generateAPIPodStatus`'s `ShouldEvict` of the active deadline handler: a pod
    /// past its deadline is Failed with `DeadlineExceeded` (the event is recorded as the phase
    /// turns). A pod that is not yet past it, nor terminal, has its timer at the deadline; a
    /// terminal one has none.
    fn enforce_active_deadline(
        &self,
        pod: &Pod,
        api: &mut k8s_openapi::api::core::v1::PodStatus,
        now: SystemTime,
    ) {
        let uid = pod_uid(pod);
        let start = api.start_time.as_ref().map(|t| SystemTime::from(t.0));
        let terminal = matches!(api.phase.as_deref(), Some("Succeeded" | "Failed"));
        // A terminal phase sticks, so this happens once per pod.
        if !terminal && active_deadline::past_active_deadline(pod, start, now) {
            tracing::info!(pod = %uid, "pod past its active deadline; failing it");
            self.events.record(Event::normal(
                pod_ref(pod),
                active_deadline::REASON,
                Action::KillContainer,
                active_deadline::MESSAGE,
            ));
            api.phase = Some("Failed".into());
            api.reason = Some(active_deadline::REASON.into());
            api.message = Some(active_deadline::MESSAGE.into());
        }
        if matches!(api.phase.as_deref(), Some("Succeeded" | "Failed")) {
            self.deadlines.cancel(&uid);
        } else {
            self.deadlines
                .set(&uid, active_deadline::deadline(pod, start), now);
        }
    }

    /// The first time a pod runs: how long since the agent first saw it (its `config.seen`).
    fn observe_start(&self, pod: &Pod) {
        let uid = pod_uid(pod);
        if !self.started.lock_unpoisoned().insert(uid) {
            return;
        }
        let seen = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::sources::CONFIG_FIRST_SEEN_ANNOTATION))
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(SystemTime::from);
        if let Some(elapsed) = seen.and_then(|s| SystemTime::now().duration_since(s).ok()) {
            self.metrics
                .pod_start_duration
                .observe(elapsed.as_secs_f64());
        }
    }
}

/// Why a sync of the kubelet core failed, by the component that failed it.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Cgroups(#[from] crate::cm::pod_cgroups::CgroupError),
    #[error(transparent)]
    Volumes(#[from] crate::volume::Error),
    /// A step of the runtime manager's plan (the first that failed).
    #[error(transparent)]
    Runtime(#[from] crate::kuberuntime::manager::SyncError),
    #[error(transparent)]
    Cri(#[from] crate::cri::Error),
}

impl KubeletSyncer {
    /// Upstream `WaitForAttachAndMount` in `SyncPod`. On failure the pod's containers wait as
    /// `ContainerCreating` with upstream's `FailedMount` event text as their message, and the
    /// sync fails (the worker retries after its back-off).
    async fn wait_for_volumes(
        &self,
        pod: &Pod,
        status: &PodStatus,
        cancel: &CancellationToken,
    ) -> Result<(), SyncError> {
        let uid = pod_uid(pod);
        let handle = self.pods.get(&uid).unwrap_or_else(|| Arc::new(pod.clone()));
        let result = self.volumes.wait_for_attach_and_mount(handle, cancel).await;
        let mut reasons = self.reasons.lock_unpoisoned();
        reasons.remove_reason(&uid, StartFailureReason::ContainerCreating);
        let e = match result {
            Ok(()) => return Ok(()),
            // A termination came in: nothing to report, the worker goes on terminating.
            Err(e @ crate::volume::Error::Cancelled) => return Err(e.into()),
            Err(e) => e,
        };
        let message = format!("Unable to attach or mount volumes: {e}");
        tracing::warn!(pod = %uid, error = %e, "FailedMount");
        self.events.record(Event::warning(
            pod_ref(pod),
            reasons::FAILED_MOUNT_VOLUME,
            Action::MountVolume,
            message.clone(),
        ));
        let spec = pod.spec.as_ref();
        for c in spec
            .into_iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        {
            reasons.add(
                &uid,
                &c.name,
                StartFailure::new(StartFailureReason::ContainerCreating, message.clone()),
            );
        }
        drop(reasons);
        self.record_status(pod, status, false);
        Err(e.into())
    }
}

#[tonic::async_trait]
impl PodSyncer for KubeletSyncer {
    type Error = SyncError;

    async fn sync_pod(
        &self,
        _update: UpdateType,
        pod: &Pod,
        status: &PodStatus,
        cancel: &CancellationToken,
    ) -> Result<SyncPodOutcome, SyncError> {
        if self.record_status(pod, status, false) {
            return Ok(SyncPodOutcome {
                terminal: true,
                retry_after: None,
            });
        }
        self.cgroups.ensure_pod(pod).await?;
        let parent = self.cgroups.cgroup_parent(pod)?;
        let handle = self
            .pods
            .get(&pod_uid(pod))
            .unwrap_or_else(|| Arc::new(pod.clone()));
        self.probes.add_pod(&handle);
        if !cancel.is_cancelled() {
            self.wait_for_volumes(pod, status, cancel).await?;
        }
        let outcome = self
            .runtime
            .sync_pod(pod, status, &parent, &self.probes, cancel)
            .await;
        if !outcome.errors.is_empty() || outcome.retry_in.is_some() {
            // The sync has just put why a container is not running into the reason cache
            // (CrashLoopBackOff, ImagePullBackOff, a failed start). The kubelet shows it only from
            // the next sync, which for a back-off is when the back-off ends: for the whole window
            // the status would say the container merely terminated. Show it now.
            self.record_status(pod, status, false);
        }
        if let Some(first) = outcome.errors.into_iter().next() {
            return Err(first.into());
        }
        Ok(SyncPodOutcome {
            terminal: false,
            retry_after: outcome.retry_in,
        })
    }

    async fn sync_terminating_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        grace: Duration,
    ) -> Result<(), SyncError> {
        self.probes.stop_liveness_and_startup(&pod_uid(pod));
        self.record_status(pod, status, false);
        self.runtime
            .kill_pod_status(Some(pod), status, grace)
            .await?;
        let uid = pod_uid(pod);
        let after = self
            .runtime
            .pod_status(
                &uid,
                pod.metadata.name.as_deref().unwrap_or_default(),
                pod.metadata.namespace.as_deref().unwrap_or("default"),
            )
            .await?;
        self.record_status(pod, &after, true);
        Ok(())
    }

    async fn sync_terminating_runtime_pod(&self, running: &RunningPod) -> Result<(), SyncError> {
        self.probes.remove_pod(&running.uid);
        self.runtime.kill_running_pod(running, ORPHAN_GRACE).await?;
        let status = self
            .runtime
            .pod_status(&running.uid, &running.name, &running.namespace)
            .await?;
        self.runtime.remove_pod(&status).await?;
        self.cgroups.remove_pod(&running.uid).await?;
        Ok(())
    }

    async fn sync_terminated_pod(&self, pod: &Pod, status: &PodStatus) -> Result<(), SyncError> {
        let uid: PodUid = pod_uid(pod);
        self.deadlines.cancel(&uid);
        self.probes.remove_pod(&uid);
        self.started.lock_unpoisoned().remove(&uid);
        // Upstream `WaitForUnmount`: a terminated pod's volumes are torn down.
        self.volumes
            .wait_for_unmount(&uid, &CancellationToken::new())
            .await?;
        let known = self.pods.get(&uid).is_some();
        if !known {
            // Gone from every source: nothing of it stays on the node.
            self.runtime.remove_pod(status).await?;
            self.volumes.remove_pod_dir(&uid)?;
            self.status.remove(&uid);
        }
        self.cgroups.remove_pod(&uid).await?;
        if known {
            // Its final status (upstream `TerminatePod`): a pod the API server is deleting may
            // now go from it (the status syncer sends the final DELETE).
            self.status.terminate_pod(pod);
        }
        Ok(())
    }
}
