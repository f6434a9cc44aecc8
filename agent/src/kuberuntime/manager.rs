//! Carrying out a pod's plan over CRI (upstream `kubeGenericRuntimeManager.SyncPod`, `KillPod`,
//! `startContainer`, `killContainer`): kill what must go, (re)create the sandbox, start init
//! containers one at a time, sidecars and regular containers, each start gated by the crash-loop
//! back-off and the image, with every failure recorded in the reason cache so the pod's status
//! says why. The only component that changes what the runtime runs.

use crate::lock::MutexExt as _;
use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio_util::sync::CancellationToken;

use super::{
    ContainerProbeResults,
    actions::compute_pod_actions,
    backoff::{ContainerBackoffKey, CrashLoopBackoff, last_finished_at},
    container_config::{ContainerKind, ContainerParams, container_config},
    env::EnvContext,
    images::ImagePuller,
    lifecycle::{ContainerLifecycle, NoLifecycle},
    mounts::{ContainerMounts, NoMounts},
    sandbox_config::{SandboxParams, sandbox_config},
    security_context::SecurityOptions,
    userns::UsernsManager,
};
use crate::{
    cm::qos,
    container::{ContainerState, PodStatus, PodUid, RunningPod, SandboxState},
    cri::{ImageService, RuntimeService},
    pod::format_pod,
    status::{ReasonCache, StartFailure, StartFailureReason},
};

/// A pod's log directory (upstream `createPodSandbox`: 0755).
const POD_LOG_DIR_MODE: u32 = 0o755;

/// Upstream `minimumGracePeriodInSeconds`: a container always gets at least this to stop.
pub const MINIMUM_GRACE: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct RuntimeManagerConfig {
    pub node_name: String,
    pub log_root: PathBuf,
    /// The node's memory, for Burstable oom_score_adj.
    pub memory_capacity: u64,
    pub cpu_capacity_millis: i64,
    /// Without CAP_SYS_RESOURCE negative oom_score_adj values cannot be written.
    pub has_cap_sys_resource: bool,
    pub host_dns: Option<cri::DnsConfig>,
    /// The node's IP, for hostNetwork pods and the downward API.
    pub host_ip: Option<String>,
    pub runtime_handler: String,
    /// Seccomp profiles' root and `seccompDefault`.
    pub security: SecurityOptions,
}

/// Why a sync did not complete; the worker logs it and retries after its back-off.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("killing pod {pod}: {source}")]
    KillPod {
        pod: String,
        #[source]
        source: crate::cri::Error,
    },
    #[error("killing container {container} of {pod}: {source}")]
    KillContainer {
        pod: String,
        container: String,
        #[source]
        source: crate::cri::Error,
    },
    #[error("creating the sandbox of {pod}: {source}")]
    CreateSandbox {
        pod: String,
        #[source]
        source: crate::cri::Error,
    },
    /// Upstream `CreatePodSandboxConfigError`-like: the pod's spec cannot become a sandbox config
    /// (an unknown `supplementalGroupsPolicy`, user namespaces the runtime lacks).
    #[error("generating the sandbox config of {pod}: {reason}")]
    SandboxConfig { pod: String, reason: String },
    #[error("{pod}: container {container}: {failure}")]
    Start {
        pod: String,
        container: String,
        failure: String,
    },
}

/// The outcome of one sync: what failed (also in the reason cache) and when to look again.
#[derive(Debug, Default)]
pub struct SyncOutcome {
    pub errors: Vec<SyncError>,
    /// A start is held back by a back-off that ends in this long.
    pub retry_in: Option<Duration>,
}

// Back-offs compare the manager's clock with the runtime's timestamps.
pub use crate::clock::Clock;

pub struct KubeRuntimeManager {
    clock: Clock,
    runtime: Arc<dyn RuntimeService>,
    images: ImagePuller,
    crash_backoff: Mutex<CrashLoopBackoff>,
    reasons: Arc<Mutex<ReasonCache>>,
    config: RuntimeManagerConfig,
    oom_clamp_logged: AtomicBool,
    lifecycle: Arc<dyn ContainerLifecycle>,
    mounts: Arc<dyn ContainerMounts>,
    userns: Arc<UsernsManager>,
}

impl KubeRuntimeManager {
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        images: Arc<dyn ImageService>,
        reasons: Arc<Mutex<ReasonCache>>,
        config: RuntimeManagerConfig,
    ) -> Self {
        KubeRuntimeManager {
            clock: Arc::new(SystemTime::now),
            runtime,
            images: ImagePuller::new(images),
            crash_backoff: Mutex::new(CrashLoopBackoff::crash_loop()),
            reasons,
            config,
            oom_clamp_logged: AtomicBool::new(false),
            lifecycle: Arc::new(NoLifecycle),
            mounts: Arc::new(NoMounts),
            userns: Arc::new(UsernsManager::host_only()),
        }
    }

    /// Gives `hostUsers: false` pods their user namespace from `userns`.
    pub fn with_userns(mut self, userns: Arc<UsernsManager>) -> Self {
        self.userns = userns;
        self
    }

    /// Calls `lifecycle` around every container creation (the resource managers' hooks).
    pub fn with_lifecycle(mut self, lifecycle: Arc<dyn ContainerLifecycle>) -> Self {
        self.lifecycle = lifecycle;
        self
    }

    /// Asks `mounts` for every container's mounts (the volume manager).
    pub fn with_mounts(mut self, mounts: Arc<dyn ContainerMounts>) -> Self {
        self.mounts = mounts;
        self
    }

    /// Uses `clock` instead of the system clock (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    pub fn runtime_name(&self) -> &str {
        self.runtime.runtime_name()
    }

    fn reasons(&self) -> std::sync::MutexGuard<'_, ReasonCache> {
        self.reasons.lock_unpoisoned()
    }

    /// Drives the pod's runtime state one step towards its spec.
    pub async fn sync_pod(
        &self,
        pod: &Pod,
        status: &PodStatus,
        cgroup_parent: &str,
        probes: &(dyn ContainerProbeResults + Sync),
        cancel: &CancellationToken,
    ) -> SyncOutcome {
        let mut outcome = SyncOutcome::default();
        let actions = compute_pod_actions(pod, status, probes);
        if actions.is_noop() {
            return outcome;
        }
        tracing::debug!(pod = %format_pod(pod), ?actions, "sync pod");
        let grace = pod_grace(pod);
        if actions.kill_pod {
            if let Err(e) = self.kill_pod_status(Some(pod), status, grace).await {
                outcome.errors.push(SyncError::KillPod {
                    pod: format_pod(pod),
                    source: e,
                });
                return outcome;
            }
        } else {
            for kill in &actions.containers_to_kill {
                let grace = kill_grace(pod, &kill.name, kill.reason, grace);
                if let Err(e) = self
                    .kill_container(Some(pod), status, &kill.id.id, &kill.name, grace)
                    .await
                {
                    outcome.errors.push(SyncError::KillContainer {
                        pod: format_pod(pod),
                        container: kill.name.clone(),
                        source: e,
                    });
                    return outcome;
                }
            }
        }
        if !actions.create_sandbox
            && actions.init_containers_to_start.is_empty()
            && actions.containers_to_start.is_empty()
        {
            return outcome;
        }
        let userns = match self.userns.mappings(pod, &self.config.runtime_handler) {
            Ok(userns) => userns,
            Err(e) => {
                outcome.errors.push(SyncError::SandboxConfig {
                    pod: format_pod(pod),
                    reason: e.to_string(),
                });
                return outcome;
            }
        };
        let params = SandboxParams {
            attempt: actions.attempt,
            cgroup_parent,
            log_root: &self.config.log_root,
            host_dns: self.config.host_dns.clone(),
            userns: userns.clone(),
        };
        let sandbox_cfg = match sandbox_config(pod, &params) {
            Ok(config) => config,
            Err(e) => {
                outcome.errors.push(SyncError::SandboxConfig {
                    pod: format_pod(pod),
                    reason: e.to_string(),
                });
                return outcome;
            }
        };
        let (sandbox_id, pod_ips) = if actions.create_sandbox {
            // Upstream makes it 0755 (below the 0750 pod log directory).
            if let Err(e) = crate::hostfs::ensure_dir(
                std::path::Path::new(&sandbox_cfg.log_directory),
                POD_LOG_DIR_MODE,
            ) {
                tracing::warn!(dir = sandbox_cfg.log_directory, error = %e, "cannot create the pod log directory");
            }
            let id = match self
                .runtime
                .run_pod_sandbox(sandbox_cfg.clone(), &self.config.runtime_handler)
                .await
            {
                Ok(id) => id,
                Err(e) => {
                    outcome.errors.push(SyncError::CreateSandbox {
                        pod: format_pod(pod),
                        source: e,
                    });
                    return outcome;
                }
            };
            let ips = match self.runtime.pod_sandbox_status(&id).await {
                Ok(s) => s
                    .network
                    .as_ref()
                    .map(crate::cri::convert::sandbox_ips)
                    .unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(pod = %format_pod(pod), error = %e, "cannot read the new sandbox's status");
                    Vec::new()
                }
            };
            (id, ips)
        } else {
            let Some(id) = actions.sandbox_id.clone() else {
                return outcome;
            };
            (id, status.ips().to_vec())
        };
        let pod_ips = if super::sandbox_config::host_network(pod) {
            self.config.host_ip.iter().cloned().collect()
        } else {
            pod_ips
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let inits = spec.init_containers.clone().unwrap_or_default();
        for &idx in &actions.init_containers_to_start {
            if cancel.is_cancelled() {
                return outcome;
            }
            let Some(container) = inits.get(idx) else {
                continue;
            };
            let kind = if super::spec::is_sidecar(container) {
                ContainerKind::Sidecar
            } else {
                ContainerKind::Init
            };
            let started = self
                .start_container(
                    pod,
                    container,
                    kind,
                    &sandbox_id,
                    &sandbox_cfg,
                    status,
                    &pod_ips,
                    &mut outcome,
                    cancel,
                )
                .await;
            // A regular init container runs alone: the next waits for it to succeed.
            if kind == ContainerKind::Init || !started {
                return outcome;
            }
        }
        for &idx in &actions.containers_to_start {
            if cancel.is_cancelled() {
                return outcome;
            }
            if let Some(container) = spec.containers.get(idx) {
                self.start_container(
                    pod,
                    container,
                    ContainerKind::Regular,
                    &sandbox_id,
                    &sandbox_cfg,
                    status,
                    &pod_ips,
                    &mut outcome,
                    cancel,
                )
                .await;
            }
        }
        outcome
    }

    /// One container start (upstream `startContainer` with `doBackOff` and `EnsureImageExists`).
    /// Returns whether it started; a failure is in the reason cache and `outcome`. A `postStart`
    /// hook runs until it ends or `cancel` fires.
    #[expect(
        clippy::too_many_arguments,
        reason = "the pieces of one start, all borrowed"
    )]
    async fn start_container(
        &self,
        pod: &Pod,
        container: &Container,
        kind: ContainerKind,
        sandbox_id: &str,
        sandbox_cfg: &cri::PodSandboxConfig,
        status: &PodStatus,
        pod_ips: &[String],
        outcome: &mut SyncOutcome,
        cancel: &CancellationToken,
    ) -> bool {
        let uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
        let now = (self.clock)();
        let key = ContainerBackoffKey::new(&uid, container);
        let finished = last_finished_at(status, &container.name);
        let gate = self
            .crash_backoff
            .lock_unpoisoned()
            .check_restart(&key, finished, now);
        if let Err(wait) = gate {
            let message = format!(
                "back-off {}s restarting failed container={} pod={}",
                wait.window.as_secs(),
                container.name,
                format_pod(pod)
            );
            self.fail(
                &uid,
                container,
                StartFailure::new(StartFailureReason::CrashLoopBackOff, message),
                pod,
                outcome,
            );
            outcome.retry_in = Some(
                outcome
                    .retry_in
                    .map_or(wait.remaining, |r| r.min(wait.remaining)),
            );
            return false;
        }
        let image_ref = match self
            .images
            .ensure_image(&uid, container, sandbox_cfg, now)
            .await
        {
            Ok(reference) => reference,
            Err(failure) => {
                if failure.reason == StartFailureReason::ImagePullBackOff {
                    outcome.retry_in = Some(Duration::from_secs(10));
                }
                self.fail(&uid, container, failure, pod, outcome);
                return false;
            }
        };
        // Upstream `getImageUser`: runAsNonRoot is checked against it, and it is the user when
        // the pod names none.
        let image_user = match self.images.image_user(&image_ref).await {
            Ok(user) => user,
            Err(e) => {
                self.fail(
                    &uid,
                    container,
                    StartFailure::new(
                        StartFailureReason::CreateContainerConfigError,
                        e.to_string(),
                    ),
                    pod,
                    outcome,
                );
                return false;
            }
        };
        let restart_count = status
            .latest(&container.name)
            .map_or(0, |latest| latest.restart_count + 1);
        let oom_score_adj = self.oom_score_adj(pod, container);
        let params = ContainerParams {
            kind,
            restart_count,
            image_ref: &image_ref,
            env: EnvContext {
                node_name: &self.config.node_name,
                pod_ips,
                host_ip: self.config.host_ip.as_deref(),
                node_cpu_millis: self.config.cpu_capacity_millis,
                node_memory_bytes: i64::try_from(self.config.memory_capacity).unwrap_or(i64::MAX),
            },
            oom_score_adj,
            image_user: &image_user,
            security: &self.config.security,
            // Every container shares its sandbox's user namespace.
            userns: sandbox_cfg
                .linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref())
                .and_then(|s| s.namespace_options.as_ref())
                .and_then(|n| n.userns_options.clone()),
        };
        let built = container_config(pod, container, &params)
            .map_err(|e| e.to_string())
            .and_then(|config| {
                let mounts = self
                    .mounts
                    .mounts(pod, container, pod_ips, &config.envs)
                    .map_err(|e| e.to_string())?;
                Ok(cri::ContainerConfig { mounts, ..config })
            });
        let mut config = match built {
            Ok(config) => config,
            Err(e) => {
                self.fail(
                    &uid,
                    container,
                    StartFailure::new(StartFailureReason::CreateContainerConfigError, e),
                    pod,
                    outcome,
                );
                return false;
            }
        };
        let resources = config
            .linux
            .get_or_insert_default()
            .resources
            .get_or_insert_default();
        self.lifecycle.pre_create(pod, container, resources);
        let resources = resources.clone();
        let id = match self
            .runtime
            .create_container(sandbox_id, config, sandbox_cfg.clone())
            .await
        {
            Ok(id) => id,
            Err(e) => {
                self.fail(
                    &uid,
                    container,
                    StartFailure::new(StartFailureReason::CreateContainerError, e.to_string()),
                    pod,
                    outcome,
                );
                return false;
            }
        };
        self.lifecycle.pre_start(pod, container, &id, &resources);
        if let Err(e) = self.runtime.start_container(&id).await {
            self.fail(
                &uid,
                container,
                StartFailure::new(StartFailureReason::RunContainerError, e.to_string()),
                pod,
                outcome,
            );
            return false;
        }
        tracing::info!(pod = %format_pod(pod), container = container.name, id, "started container");
        if let Some(handler) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
        {
            let pod_ip = pod_ips.first().map(String::as_str);
            let hook =
                super::hooks::run(self.runtime.as_ref(), handler, pod, container, &id, pod_ip);
            // The hook has no deadline of its own, but the pod's termination cancels the sync
            // that runs it (upstream: the sync's context); dropping it cancels the runtime's
            // exec, which kills the command. The termination then stops the container.
            let result = tokio::select! {
                result = hook => result,
                () = cancel.cancelled() => {
                    tracing::info!(pod = %format_pod(pod), container = container.name, "postStart hook cancelled: the pod is terminating");
                    return false;
                }
            };
            if let Err(message) = result {
                tracing::warn!(pod = %format_pod(pod), container = container.name, reason = "FailedPostStartHook", "{message}");
                if let Err(e) = self.stop_container(&id, pod_grace(pod)).await {
                    tracing::warn!(pod = %format_pod(pod), container = container.name, error = %e, "cannot kill the container whose postStart hook failed");
                }
                self.fail(
                    &uid,
                    container,
                    StartFailure::new(StartFailureReason::PostStartHookError, message.to_string()),
                    pod,
                    outcome,
                );
                return false;
            }
        }
        self.reasons().remove(&uid, &container.name);
        true
    }

    fn fail(
        &self,
        uid: &PodUid,
        container: &Container,
        failure: StartFailure,
        pod: &Pod,
        outcome: &mut SyncOutcome,
    ) {
        // Back-off waits are expected and not reported as sync errors (upstream filters them).
        if !matches!(
            failure.reason,
            StartFailureReason::CrashLoopBackOff | StartFailureReason::ImagePullBackOff
        ) {
            outcome.errors.push(SyncError::Start {
                pod: format_pod(pod),
                container: container.name.clone(),
                failure: format!("{}: {}", failure.reason, failure.message),
            });
        }
        self.reasons().add(uid, &container.name, failure);
    }

    fn oom_score_adj(&self, pod: &Pod, container: &Container) -> i64 {
        let capacity = std::num::NonZeroU64::new(self.config.memory_capacity.max(1))
            .unwrap_or(std::num::NonZeroU64::MIN);
        let wanted = qos::container_oom_score_adj(pod, container, capacity).unwrap_or(1000);
        let adj = qos::clamp_for_unprivileged(wanted, self.config.has_cap_sys_resource);
        if adj.clamped && !self.oom_clamp_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                wanted,
                written = adj.value,
                "this process lacks CAP_SYS_RESOURCE: negative oom_score_adj values are written \
                 as 0 (said once)"
            );
        }
        i64::from(adj.value)
    }

    async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), crate::cri::Error> {
        match self
            .runtime
            .stop_container(id, grace.max(MINIMUM_GRACE))
            .await
        {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }

    /// Stops one container (upstream `killContainer`): its `preStop` hook first, when the pod's
    /// spec is known, within `grace`; then the stop signal with what is left of it.
    async fn kill_container(
        &self,
        pod: Option<&Pod>,
        status: &PodStatus,
        id: &str,
        name: &str,
        grace: Duration,
    ) -> Result<(), crate::cri::Error> {
        let container = pod.and_then(|p| {
            p.spec.as_ref().and_then(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .find(|c| c.name == name)
            })
        });
        let hook = container.and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref());
        let mut grace = grace;
        if let (Some(pod), Some(container), Some(handler)) = (pod, container, hook)
            && !grace.is_zero()
        {
            let began = std::time::Instant::now();
            let host_ip = self.config.host_ip.as_deref();
            let pod_ip = if super::sandbox_config::host_network(pod) {
                host_ip
            } else {
                status.ips().first().map(String::as_str)
            };
            let run = super::hooks::run(self.runtime.as_ref(), handler, pod, container, id, pod_ip);
            match tokio::time::timeout(grace, run).await {
                Ok(Ok(())) => {}
                Ok(Err(message)) => {
                    tracing::warn!(pod = %format_pod(pod), container = name, reason = "FailedPreStopHook", "{message}");
                }
                Err(_) => {
                    tracing::warn!(pod = %format_pod(pod), container = name, grace_secs = grace.as_secs(), "preStop hook did not complete within the grace period");
                }
            }
            grace = grace.saturating_sub(began.elapsed());
        }
        self.stop_container(id, grace).await
    }

    /// Stops every running container of the pod (in parallel, each within `grace`, after its
    /// `preStop` hook when `pod` is given), then its sandboxes (upstream
    /// `killPodWithSyncResult`).
    pub async fn kill_pod_status(
        &self,
        pod: Option<&Pod>,
        status: &PodStatus,
        grace: Duration,
    ) -> Result<(), crate::cri::Error> {
        let running: Vec<(String, String)> = status
            .containers
            .iter()
            .filter(|c| {
                matches!(
                    c.state,
                    ContainerState::Running | ContainerState::Created | ContainerState::Unknown
                )
            })
            .map(|c| (c.id.id.clone(), c.name.clone()))
            .collect();
        let sandboxes: Vec<String> = status
            .sandboxes
            .iter()
            .filter(|s| s.state == SandboxState::Ready)
            .map(|s| s.id.clone())
            .collect();
        let stops = running
            .iter()
            .map(|(id, name)| self.kill_container(pod, status, id, name, grace));
        for result in futures::future::join_all(stops).await {
            result?;
        }
        self.stop_sandboxes(sandboxes).await
    }

    /// Stops what the runtime runs for a pod no source knows (orphans).
    pub async fn kill_running_pod(
        &self,
        running: &RunningPod,
        grace: Duration,
    ) -> Result<(), crate::cri::Error> {
        let containers = running
            .containers
            .iter()
            .filter(|(_, _, s)| *s != ContainerState::Exited)
            .map(|(id, _, _)| id.id.clone())
            .collect();
        let sandboxes = running
            .sandboxes
            .iter()
            .filter(|(_, s)| *s == SandboxState::Ready)
            .map(|(id, _)| id.clone())
            .collect();
        self.kill(containers, sandboxes, grace).await
    }

    async fn kill(
        &self,
        containers: Vec<String>,
        sandboxes: Vec<String>,
        grace: Duration,
    ) -> Result<(), crate::cri::Error> {
        let stops = containers.iter().map(|id| self.stop_container(id, grace));
        for result in futures::future::join_all(stops).await {
            result?;
        }
        self.stop_sandboxes(sandboxes).await
    }

    async fn stop_sandboxes(&self, sandboxes: Vec<String>) -> Result<(), crate::cri::Error> {
        for id in sandboxes {
            match self.runtime.stop_pod_sandbox(&id).await {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Removes every container and sandbox of a pod that is gone for good.
    pub async fn remove_pod(&self, status: &PodStatus) -> Result<(), crate::cri::Error> {
        for c in &status.containers {
            match self.runtime.remove_container(&c.id.id).await {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        for s in &status.sandboxes {
            match self.runtime.remove_pod_sandbox(&s.id).await {
                Err(e) if !e.is_not_found() => return Err(e),
                _ => {}
            }
        }
        self.crash_backoff
            .lock_unpoisoned()
            .retain(|k| k.pod_uid != status.uid);
        self.reasons().remove_pod(&status.uid);
        Ok(())
    }

    /// Frees the user-namespace ranges of pods `keep` rejects.
    pub fn release_user_namespaces(&self, keep: impl Fn(&PodUid) -> bool) {
        self.userns.retain(keep);
    }

    /// Housekeeping of the back-offs.
    pub fn gc(&self, now: SystemTime) {
        self.crash_backoff.lock_unpoisoned().gc(now);
        self.images.gc(now);
    }
}

/// The grace period of one kill: a failed liveness or startup probe may carry its own (upstream
/// `probe.terminationGracePeriodSeconds`).
fn kill_grace(pod: &Pod, name: &str, reason: super::KillReason, pod_grace: Duration) -> Duration {
    let container = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == name));
    let probe = match reason {
        super::KillReason::LivenessProbe => container.and_then(|c| c.liveness_probe.as_ref()),
        super::KillReason::StartupProbe => container.and_then(|c| c.startup_probe.as_ref()),
        _ => None,
    };
    probe
        .and_then(|p| p.termination_grace_period_seconds)
        .map_or(pod_grace, |s| {
            Duration::from_secs(u64::try_from(s).unwrap_or(0))
        })
}

/// The pod's grace period for stopping containers it replaces.
fn pod_grace(pod: &Pod) -> Duration {
    let secs = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    Duration::from_secs(secs.max(0) as u64)
}

impl KubeRuntimeManager {
    /// The full runtime status of one pod (upstream `GetPodStatus`).
    pub async fn pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, crate::cri::Error> {
        crate::cri::convert::get_pod_status(self.runtime.as_ref(), uid, name, namespace).await
    }
}

/// The PLEG's view of the runtime is this manager's CRI client.
#[tonic::async_trait]
impl crate::pleg::RuntimeView for KubeRuntimeManager {
    async fn list_pods(&self) -> Result<Vec<RunningPod>, crate::pleg::RuntimeViewError> {
        crate::cri::convert::get_pods(self.runtime.as_ref(), true)
            .await
            .map_err(|e| crate::pleg::RuntimeViewError {
                operation: "list_pods",
                message: e.to_string(),
            })
    }

    async fn pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, crate::pleg::RuntimeViewError> {
        KubeRuntimeManager::pod_status(self, uid, name, namespace)
            .await
            .map_err(|e| crate::pleg::RuntimeViewError {
                operation: "pod_status",
                message: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests;
