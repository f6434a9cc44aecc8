//! Carrying out a pod's plan over CRI (upstream `kubeGenericRuntimeManager.SyncPod`, `KillPod`,
//! `startContainer`, `killContainer`): kill what must go, (re)create the sandbox, start init
//! containers one at a time, sidecars and regular containers, each start gated by the crash-loop
//! back-off and the image, with every failure recorded in the reason cache so the pod's status
//! says why, and reported as upstream's events (`Created`, `Started`, `Killing`, `BackOff`,
//! `Failed`, `FailedCreatePodSandBox`, `SandboxChanged`, the hooks'; the image's in `images.rs`).
//! The only component that changes what the runtime runs.

use crate::lock::MutexExt as _;
use std::{
    collections::HashMap,
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
    actions::{PodActions, compute_pod_actions},
    backoff::{ContainerBackoffKey, CrashLoopBackoff, last_finished_at},
    container_config::{ContainerKind, ContainerParams, container_config, target_pid_namespace},
    dns::DnsSettings,
    env::{ClusterEnv, EnvContext},
    images::ImagePuller,
    lifecycle::{ContainerLifecycle, NoLifecycle},
    mounts::{ContainerMounts, NoMounts},
    runtime_class::{DefaultHandler, RuntimeClassError, RuntimeClasses, lookup_runtime_handler},
    sandbox_config::{SandboxParams, sandbox_config},
    security_context::SecurityOptions,
    termination_order::{TerminationOrdering, Turn, grace_after_wait},
    userns::UsernsManager,
};
use crate::{
    cm::qos,
    container::{ContainerState, PodStatus, PodUid, RunningPod, SandboxState},
    cri::{ImageService, RuntimeService},
    events::{Action, Event, EventType, Events, container_ref, pod_ref, reasons},
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
    /// `clusterDNS`, `clusterDomain`, `resolvConf`: each sandbox's resolver.
    pub dns: DnsSettings,
    /// The node's IP, for hostNetwork pods and the downward API.
    pub host_ip: Option<String>,
    pub runtime_handler: String,
    /// Seccomp profiles' root and `seccompDefault`.
    pub security: SecurityOptions,
    /// `cpuCFSQuota`, `cpuCFSQuotaPeriod` and the node's huge page sizes.
    pub resources: super::container_config::ResourceOptions,
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
    /// The pod's RuntimeClass gave no handler (upstream `LookupRuntimeHandler` in
    /// `createPodSandbox`).
    #[error("creating the sandbox of {pod}: {source}")]
    RuntimeClass {
        pod: String,
        #[source]
        source: RuntimeClassError,
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

/// The sandbox a sync starts containers in.
struct SandboxReady {
    id: String,
    config: cri::PodSandboxConfig,
    /// The pod's IPs as its containers see them (the node's for a hostNetwork pod).
    pod_ips: Vec<String>,
}

/// What every container start of one sync borrows.
struct StartContext<'a> {
    pod: &'a Pod,
    uid: PodUid,
    status: &'a PodStatus,
    sandbox: &'a SandboxReady,
    cancel: &'a CancellationToken,
}

/// Why a container start stopped short.
enum StartStop {
    /// Recorded in the reason cache; a back-off says when to look again.
    Failed {
        failure: StartFailure,
        retry_in: Option<Duration>,
    },
    /// The pod is terminating: nothing to record.
    Cancelled,
}

impl From<StartFailure> for StartStop {
    fn from(failure: StartFailure) -> Self {
        StartStop::Failed {
            failure,
            retry_in: None,
        }
    }
}

fn sandbox_config_error(pod: &Pod, e: &dyn std::fmt::Display) -> SyncError {
    SyncError::SandboxConfig {
        pod: format_pod(pod),
        reason: e.to_string(),
    }
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
    env: ClusterEnv,
    runtime_classes: Arc<dyn RuntimeClasses>,
    events: Events,
    /// Each pod's exited containers' messages (runtime's and their own), by container id: read
    /// once when a container is first seen exited, forgotten with the container.
    termination_messages: Mutex<HashMap<PodUid, HashMap<String, String>>>,
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
            env: ClusterEnv::standalone(),
            runtime_classes: Arc::new(DefaultHandler),
            events: crate::events::none(),
            termination_messages: Mutex::new(HashMap::new()),
        }
    }

    /// Resolves pods' `runtimeClassName` through `classes` (the API server's RuntimeClasses).
    pub fn with_runtime_classes(mut self, classes: Arc<dyn RuntimeClasses>) -> Self {
        self.runtime_classes = classes;
        self
    }

    /// Reads pods' `imagePullSecrets` from `secrets` for image pulls.
    pub fn with_pull_secrets(mut self, secrets: Arc<dyn super::credentials::PullSecrets>) -> Self {
        self.images = self.images.with_pull_secrets(secrets);
        self
    }

    /// Lets image pulls start only as `gate` allows (the node-wide pull limits).
    pub fn with_image_pull_gate(mut self, gate: super::image_pulls::PullGate) -> Self {
        self.images = self.images.with_gate(gate);
        self
    }

    /// Asks the node's credential provider plugins for image pull credentials.
    pub fn with_credential_providers(
        mut self,
        providers: Arc<super::credentials::CredentialProviders>,
    ) -> Self {
        self.images = self.images.with_credential_providers(providers);
        self
    }

    /// Reports what it does to the runtime as events to `events`.
    pub fn with_events(mut self, events: Events) -> Self {
        self.events = events;
        self
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

    /// Reads the ConfigMaps, Secrets and services containers' environments refer to from `env`.
    pub fn with_env(mut self, env: ClusterEnv) -> Self {
        self.env = env;
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

    /// An event about `container` of `pod` (upstream `recordContainerEvent`): the container's id
    /// in a runtime's message becomes its name, so that repeats of one failure stay one series.
    fn container_event(
        &self,
        pod: &Pod,
        container: &str,
        id: Option<&str>,
        event: (EventType, &str, Action),
        note: String,
    ) {
        let note = match id {
            Some(id) if !id.is_empty() => note.replace(id, container),
            _ => note,
        };
        let (type_, reason, action) = event;
        self.events.record(Event::new(
            container_ref(pod, container),
            type_,
            reason,
            action,
            note,
        ));
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
        if actions.create_sandbox && actions.sandbox_id.is_some() {
            self.events.record(Event::normal(
                pod_ref(pod),
                reasons::SANDBOX_CHANGED,
                Action::CreatePodSandbox,
                "Pod sandbox changed, it will be killed and re-created.",
            ));
        }
        for refused in &actions.ephemeral_containers_refused {
            tracing::warn!(pod = %format_pod(pod), container = refused.name, "{}", refused.message);
            // About the pod: the name would resolve to the other container's field path.
            self.events.record(Event::warning(
                pod_ref(pod),
                reasons::FAILED_TO_CREATE_CONTAINER,
                Action::CreateContainer,
                format!("Error: {}", refused.message),
            ));
        }
        if let Err(e) = self.kill_for_sync(pod, status, &actions).await {
            outcome.errors.push(e);
            return outcome;
        }
        if !actions.create_sandbox
            && actions.init_containers_to_start.is_empty()
            && actions.containers_to_start.is_empty()
            && actions.ephemeral_containers_to_start.is_empty()
        {
            return outcome;
        }
        let sandbox = match self
            .ensure_sandbox(pod, status, &actions, cgroup_parent)
            .await
        {
            Ok(Some(sandbox)) => sandbox,
            Ok(None) => return outcome,
            Err(e) => {
                self.record_sandbox_failure(pod, &e);
                outcome.errors.push(e);
                return outcome;
            }
        };
        let start = StartContext {
            pod,
            uid: PodUid(pod.metadata.uid.clone().unwrap_or_default()),
            status,
            sandbox: &sandbox,
            cancel,
        };
        self.start_containers(&start, &actions, &mut outcome).await;
        outcome
    }

    /// The kills a sync begins with: the whole pod, or the containers the plan replaces.
    async fn kill_for_sync(
        &self,
        pod: &Pod,
        status: &PodStatus,
        actions: &PodActions,
    ) -> Result<(), SyncError> {
        let grace = pod_grace(pod);
        if actions.kill_pod {
            return self
                .kill_pod_status(Some(pod), status, grace)
                .await
                .map_err(|source| SyncError::KillPod {
                    pod: format_pod(pod),
                    source,
                });
        }
        for kill in &actions.containers_to_kill {
            let grace = kill_grace(pod, &kill.name, kill.reason, grace);
            self.kill_container(
                Some(pod),
                status,
                (&kill.id.id, &kill.name),
                Some(&kill.message),
                grace,
                None,
            )
            .await
            .map_err(|source| SyncError::KillContainer {
                pod: format_pod(pod),
                container: kill.name.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// The sandbox the plan's containers start in: a new one when the plan says so, else the
    /// running one (`None` when there is none to start in).
    async fn ensure_sandbox(
        &self,
        pod: &Pod,
        status: &PodStatus,
        actions: &PodActions,
        cgroup_parent: &str,
    ) -> Result<Option<SandboxReady>, SyncError> {
        // Only a new sandbox, or a pod's own user namespace, needs the class's handler: a sync of
        // a running pod reads no RuntimeClass.
        let host_users = pod.spec.as_ref().and_then(|s| s.host_users) != Some(false);
        let handler = if actions.create_sandbox || !host_users {
            lookup_runtime_handler(
                self.runtime_classes.as_ref(),
                pod,
                &self.config.runtime_handler,
            )
            .await
            .map_err(|source| SyncError::RuntimeClass {
                pod: format_pod(pod),
                source,
            })?
        } else {
            self.config.runtime_handler.clone()
        };
        let userns = self
            .userns
            .mappings(pod, &handler)
            .map_err(|e| sandbox_config_error(pod, &e))?;
        let dns = self
            .config
            .dns
            .pod_dns(pod)
            .map_err(|e| sandbox_config_error(pod, &e))?;
        if actions.create_sandbox {
            // Upstream records these as Events on the pod each time it forms the sandbox.
            for warning in &dns.warnings {
                tracing::warn!(pod = %format_pod(pod), reason = warning.reason(), "{warning}");
            }
        }
        let params = SandboxParams {
            attempt: actions.attempt,
            cgroup_parent,
            log_root: &self.config.log_root,
            dns: Some(dns.config),
            userns,
        };
        let config = sandbox_config(pod, &params).map_err(|e| sandbox_config_error(pod, &e))?;
        let (id, pod_ips) = if actions.create_sandbox {
            self.create_sandbox(pod, &config, &handler).await?
        } else {
            let Some(id) = actions.sandbox_id.clone() else {
                return Ok(None);
            };
            (id, status.ips().to_vec())
        };
        let pod_ips = if super::sandbox_config::host_network(pod) {
            self.config.host_ip.iter().cloned().collect()
        } else {
            pod_ips
        };
        Ok(Some(SandboxReady {
            id,
            config,
            pod_ips,
        }))
    }

    /// Runs a new sandbox and reads the IPs its network got.
    async fn create_sandbox(
        &self,
        pod: &Pod,
        config: &cri::PodSandboxConfig,
        handler: &str,
    ) -> Result<(String, Vec<String>), SyncError> {
        // Upstream makes it 0755 (below the 0750 pod log directory).
        if let Err(e) = crate::hostfs::ensure_dir(
            std::path::Path::new(&config.log_directory),
            POD_LOG_DIR_MODE,
        ) {
            tracing::warn!(dir = config.log_directory, error = %e, "cannot create the pod log directory");
        }
        let id = match self.runtime.run_pod_sandbox(config.clone(), handler).await {
            Ok(id) => id,
            Err(source) => {
                self.events.record(Event::warning(
                    pod_ref(pod),
                    reasons::FAILED_CREATE_POD_SANDBOX,
                    Action::CreatePodSandbox,
                    format!("Failed to create pod sandbox: {source}"),
                ));
                return Err(SyncError::CreateSandbox {
                    pod: format_pod(pod),
                    source,
                });
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
        Ok((id, ips))
    }

    /// The plan's starts in order: ephemeral containers (upstream starts them first, so that
    /// a pod whose init containers fail can still be debugged), init containers one at a time
    /// (a sidecar does not hold up the next), then the regular containers.
    async fn start_containers(
        &self,
        start: &StartContext<'_>,
        actions: &PodActions,
        outcome: &mut SyncOutcome,
    ) {
        let Some(spec) = start.pod.spec.as_ref() else {
            return;
        };
        let ephemerals = spec.ephemeral_containers.as_deref().unwrap_or_default();
        for &idx in &actions.ephemeral_containers_to_start {
            if start.cancel.is_cancelled() {
                return;
            }
            let Some(ephemeral) = ephemerals.get(idx) else {
                continue;
            };
            let container = super::spec::ephemeral_as_container(ephemeral);
            let target = ephemeral
                .target_container_name
                .as_deref()
                .filter(|t| !t.is_empty());
            self.start_container(start, &container, ContainerKind::Ephemeral, target, outcome)
                .await;
        }
        let inits = spec.init_containers.as_deref().unwrap_or_default();
        for &idx in &actions.init_containers_to_start {
            if start.cancel.is_cancelled() {
                return;
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
                .start_container(start, container, kind, None, outcome)
                .await;
            // A regular init container runs alone: the next waits for it to succeed.
            if kind == ContainerKind::Init || !started {
                return;
            }
        }
        for &idx in &actions.containers_to_start {
            if start.cancel.is_cancelled() {
                return;
            }
            if let Some(container) = spec.containers.get(idx) {
                self.start_container(start, container, ContainerKind::Regular, None, outcome)
                    .await;
            }
        }
    }

    /// One container start (upstream `startContainer` with `doBackOff` and `EnsureImageExists`).
    /// Returns whether it started; a failure is in the reason cache and `outcome`. A `postStart`
    /// hook runs until it ends or the sync is cancelled. `target` is an ephemeral container's
    /// `targetContainerName`.
    async fn start_container(
        &self,
        start: &StartContext<'_>,
        container: &Container,
        kind: ContainerKind,
        target: Option<&str>,
        outcome: &mut SyncOutcome,
    ) -> bool {
        match self
            .try_start_container(start, container, kind, target)
            .await
        {
            Ok(()) => {
                self.reasons().remove(&start.uid, &container.name);
                true
            }
            Err(StartStop::Failed { failure, retry_in }) => {
                if let Some(wait) = retry_in {
                    outcome.retry_in = Some(outcome.retry_in.map_or(wait, |r| r.min(wait)));
                }
                self.fail(&start.uid, container, failure, start.pod, outcome);
                false
            }
            Err(StartStop::Cancelled) => false,
        }
    }

    async fn try_start_container(
        &self,
        start: &StartContext<'_>,
        container: &Container,
        kind: ContainerKind,
        target: Option<&str>,
    ) -> Result<(), StartStop> {
        let now = (self.clock)();
        self.check_crash_backoff(start, container, now)?;
        let mut config = self
            .build_container_config(start, container, kind, now)
            .await?;
        if let Some(target) = target {
            let id = self.target_id(start, container, target)?;
            target_pid_namespace(&mut config, &id);
        }
        let id = self.create_and_start(start, container, config).await?;
        tracing::info!(pod = %format_pod(start.pod), container = container.name, id, "started container");
        self.run_post_start(start, container, &id).await
    }

    /// The runtime id of an ephemeral container's target (upstream `startSpec.getTargetID`: the
    /// target's newest instance). Only a regular or init container can be a target, as the API
    /// server's validation requires; anything else fails the start as a config error.
    fn target_id(
        &self,
        start: &StartContext<'_>,
        container: &Container,
        target: &str,
    ) -> Result<String, StartStop> {
        let in_spec = super::spec::containers(start.pod)
            .iter()
            .chain(super::spec::init_containers(start.pod))
            .any(|c| c.name == target);
        let found = in_spec
            .then(|| start.status.latest(target))
            .flatten()
            .map(|instance| instance.id.id.clone());
        found.ok_or_else(|| {
            self.config_error(
                start,
                container,
                format!("unable to find target container {target}"),
            )
        })
    }

    /// A container whose config cannot be made: its `Failed` event, and the start failure
    /// (`CreateContainerConfigError`) its status waits with.
    fn config_error(
        &self,
        start: &StartContext<'_>,
        container: &Container,
        message: String,
    ) -> StartStop {
        self.container_event(
            start.pod,
            &container.name,
            None,
            failed(Action::CreateContainer),
            format!("Error: {message}"),
        );
        StartStop::from(StartFailure::new(
            StartFailureReason::CreateContainerConfigError,
            message,
        ))
    }

    fn check_crash_backoff(
        &self,
        start: &StartContext<'_>,
        container: &Container,
        now: SystemTime,
    ) -> Result<(), StartStop> {
        let key = ContainerBackoffKey::new(&start.uid, container);
        let finished = last_finished_at(start.status, &container.name);
        let gate = self
            .crash_backoff
            .lock_unpoisoned()
            .check_restart(&key, finished, now);
        if gate.is_err() {
            self.container_event(
                start.pod,
                &container.name,
                None,
                (
                    EventType::Warning,
                    reasons::BACK_OFF_START_CONTAINER,
                    Action::StartContainer,
                ),
                format!(
                    "Back-off restarting failed container {} in pod {}",
                    container.name,
                    format_pod(start.pod)
                ),
            );
        }
        gate.map_err(|wait| StartStop::Failed {
            failure: StartFailure::new(
                StartFailureReason::CrashLoopBackOff,
                format!(
                    "back-off {}s restarting failed container={} pod={}",
                    wait.window.as_secs(),
                    container.name,
                    format_pod(start.pod)
                ),
            ),
            retry_in: Some(wait.remaining),
        })
    }

    /// The image, its user and the container's CRI config with its mounts.
    async fn build_container_config(
        &self,
        start: &StartContext<'_>,
        container: &Container,
        kind: ContainerKind,
        now: SystemTime,
    ) -> Result<cri::ContainerConfig, StartStop> {
        let sandbox = start.sandbox;
        let image_ref = self
            .images
            .ensure_image(
                start.pod,
                container,
                &sandbox.config,
                now,
                self.events.as_ref(),
            )
            .await
            .map_err(|failure| {
                // Upstream's `startContainer` adds the error's name as a `Failed` event.
                self.container_event(
                    start.pod,
                    &container.name,
                    None,
                    failed(Action::PullImage),
                    format!("Error: {}", failure.reason),
                );
                let retry_in = (failure.reason == StartFailureReason::ImagePullBackOff)
                    .then_some(Duration::from_secs(10));
                StartStop::Failed { failure, retry_in }
            })?;
        let config_error = |message: String| self.config_error(start, container, message);
        // Upstream `getImageUser`: runAsNonRoot is checked against it, and it is the user when
        // the pod names none.
        let image_user = self
            .images
            .image_user(&image_ref)
            .await
            .map_err(|e| config_error(e.to_string()))?;
        let cluster = self
            .env
            .gather(start.pod, container)
            .await
            .map_err(|e| config_error(e.to_string()))?;
        let params = ContainerParams {
            kind,
            restart_count: start
                .status
                .latest(&container.name)
                .map_or(0, |latest| latest.restart_count + 1),
            image_ref: &image_ref,
            env: EnvContext {
                node_name: &self.config.node_name,
                pod_ips: &sandbox.pod_ips,
                host_ip: self.config.host_ip.as_deref(),
                node_cpu_millis: self.config.cpu_capacity_millis,
                node_memory_bytes: i64::try_from(self.config.memory_capacity).unwrap_or(i64::MAX),
                cluster: Some(&cluster),
            },
            oom_score_adj: self.oom_score_adj(start.pod, container),
            image_user: &image_user,
            security: &self.config.security,
            // Every container shares its sandbox's user namespace.
            userns: sandbox
                .config
                .linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref())
                .and_then(|s| s.namespace_options.as_ref())
                .and_then(|n| n.userns_options.clone()),
            resources: &self.config.resources,
        };
        let config = container_config(start.pod, container, &params)
            .map_err(|e| config_error(e.to_string()))?;
        let mounts = self
            .mounts
            .mounts(start.pod, container, &sandbox.pod_ips, &config.envs)
            .map_err(|e| config_error(e.to_string()))?;
        Ok(cri::ContainerConfig { mounts, ..config })
    }

    /// Creates and starts the container, with the lifecycle's say over its resources (the CPU
    /// manager's cpuset) before each step.
    async fn create_and_start(
        &self,
        start: &StartContext<'_>,
        container: &Container,
        mut config: cri::ContainerConfig,
    ) -> Result<String, StartStop> {
        let resources = config
            .linux
            .get_or_insert_default()
            .resources
            .get_or_insert_default();
        self.lifecycle.pre_create(start.pod, container, resources);
        let resources = resources.clone();
        let name = container.name.as_str();
        let id = self
            .runtime
            .create_container(&start.sandbox.id, config, start.sandbox.config.clone())
            .await
            .map_err(|e| {
                let message = e.to_string();
                self.container_event(
                    start.pod,
                    name,
                    None,
                    failed(Action::CreateContainer),
                    format!("Error: {message}"),
                );
                StartFailure::new(StartFailureReason::CreateContainerError, message)
            })?;
        self.lifecycle
            .pre_start(start.pod, container, &id, &resources);
        let normal = |reason, action| (EventType::Normal, reason, action);
        self.container_event(
            start.pod,
            name,
            Some(&id),
            normal(reasons::CREATED_CONTAINER, Action::CreateContainer),
            format!("Created container: {name}"),
        );
        self.runtime.start_container(&id).await.map_err(|e| {
            let message = e.to_string();
            self.container_event(
                start.pod,
                name,
                Some(&id),
                failed(Action::StartContainer),
                format!("Error: {message}"),
            );
            StartFailure::new(StartFailureReason::RunContainerError, message)
        })?;
        self.container_event(
            start.pod,
            name,
            Some(&id),
            normal(reasons::STARTED_CONTAINER, Action::StartContainer),
            format!("Started container {name}"),
        );
        Ok(id)
    }

    /// The container's `postStart` hook, if it has one; a failed hook kills the container.
    async fn run_post_start(
        &self,
        start: &StartContext<'_>,
        container: &Container,
        id: &str,
    ) -> Result<(), StartStop> {
        let Some(handler) = container
            .lifecycle
            .as_ref()
            .and_then(|l| l.post_start.as_ref())
        else {
            return Ok(());
        };
        let pod = start.pod;
        let pod_ip = start.sandbox.pod_ips.first().map(String::as_str);
        let hook = super::hooks::run(self.runtime.as_ref(), handler, pod, container, id, pod_ip);
        // The hook has no deadline of its own, but the pod's termination cancels the sync
        // that runs it (upstream: the sync's context); dropping it cancels the runtime's
        // exec, which kills the command. The termination then stops the container.
        let result = tokio::select! {
            result = hook => result,
            () = start.cancel.cancelled() => {
                tracing::info!(pod = %format_pod(pod), container = container.name, "postStart hook cancelled: the pod is terminating");
                return Err(StartStop::Cancelled);
            }
        };
        let Err(message) = result else {
            return Ok(());
        };
        tracing::warn!(pod = %format_pod(pod), container = container.name, reason = "FailedPostStartHook", "{message}");
        // Not the hook's output: it may hold secrets (upstream keeps it out of the event too).
        self.container_event(
            pod,
            &container.name,
            Some(id),
            (
                EventType::Warning,
                reasons::FAILED_POST_START_HOOK,
                Action::RunHook,
            ),
            "PostStartHook failed".into(),
        );
        // Upstream kills it with the message "FailedPostStartHook", which its Killing event says.
        self.container_event(
            pod,
            &container.name,
            Some(id),
            (
                EventType::Normal,
                reasons::KILLING_CONTAINER,
                Action::KillContainer,
            ),
            "FailedPostStartHook".into(),
        );
        if let Err(e) = self.stop_container(id, pod_grace(pod)).await {
            tracing::warn!(pod = %format_pod(pod), container = container.name, error = %e, "cannot kill the container whose postStart hook failed");
        }
        Err(StartFailure::new(StartFailureReason::PostStartHookError, message.to_string()).into())
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

    /// A sandbox that could not be made leaves every container of the pod waiting as
    /// `ContainerCreating` with upstream's `FailedCreatePodSandBox` event text as the message (the
    /// volume manager's wait clears it at the next sync), so the status says why the pod does not
    /// start.
    fn record_sandbox_failure(&self, pod: &Pod, error: &SyncError) {
        let cause = match error {
            SyncError::RuntimeClass { source, .. } => source.to_string(),
            SyncError::CreateSandbox { source, .. } => source.to_string(),
            SyncError::SandboxConfig { reason, .. } => reason.clone(),
            _ => return,
        };
        let message = format!("Failed to create pod sandbox: {cause}");
        tracing::warn!(pod = %format_pod(pod), message, "FailedCreatePodSandBox");
        let uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
        let mut reasons = self.reasons();
        for container in pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        {
            reasons.add(
                &uid,
                &container.name,
                StartFailure::new(StartFailureReason::ContainerCreating, message.clone()),
            );
        }
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
    /// spec is known, within `grace`; then, in a whole-pod kill (`ordering`), its turn: a sidecar
    /// waits for the main containers and the later sidecars, within what is left of `grace`;
    /// then the stop signal with what is left after that (never less than [`MINIMUM_GRACE`]).
    /// A container of a known spec gets a `Killing` event saying `message` (by default
    /// `Stopping container <name>`); upstream cannot name one it only knows from the runtime,
    /// nor does this.
    async fn kill_container(
        &self,
        pod: Option<&Pod>,
        status: &PodStatus,
        (id, name): (&str, &str),
        message: Option<&str>,
        grace: Duration,
        ordering: Option<&TerminationOrdering>,
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
        if let (Some(pod), Some(_)) = (pod, container) {
            let note = message.map_or_else(|| format!("Stopping container {name}"), str::to_owned);
            self.container_event(
                pod,
                name,
                Some(id),
                (
                    EventType::Normal,
                    reasons::KILLING_CONTAINER,
                    Action::KillContainer,
                ),
                note,
            );
        }
        let mut grace = grace;
        if let (Some(pod), Some(container), Some(handler)) = (pod, container, hook)
            && !grace.is_zero()
        {
            // The hook's deadline is tokio's timer: its clock measures what the hook took.
            let began = tokio::time::Instant::now();
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
                    self.container_event(
                        pod,
                        name,
                        Some(id),
                        (
                            EventType::Warning,
                            reasons::FAILED_PRE_STOP_HOOK,
                            Action::RunHook,
                        ),
                        "PreStopHook failed".into(),
                    );
                }
                Err(_) => {
                    tracing::warn!(pod = %format_pod(pod), container = name, grace_secs = grace.as_secs(), "preStop hook did not complete within the grace period");
                }
            }
            grace = grace.saturating_sub(began.elapsed());
        }
        if let Some(ordering) = ordering
            && !grace.is_zero()
        {
            let waiting_for = ordering.pending(name);
            if !waiting_for.is_empty() {
                tracing::debug!(pod = ?pod.map(format_pod), container = name, ?waiting_for, "waiting for the containers that stop first");
            }
            let (turn, waited) = ordering.wait_for_turn(name, grace).await;
            if turn == Turn::GraceExpired {
                tracing::info!(pod = ?pod.map(format_pod), container = name, waiting_for = ?ordering.pending(name), "the grace period ended before the containers this one outlives stopped; stopping it now");
            }
            grace = grace_after_wait(grace, waited);
        }
        self.stop_container(id, grace).await?;
        // Only a container known to have stopped releases those that outlive it: after a failed
        // stop they wait out their grace period (as upstream).
        if let Some(ordering) = ordering {
            ordering.container_terminated(name);
        }
        Ok(())
    }

    /// Stops every running container of the pod (in parallel, each within `grace`, after its
    /// `preStop` hook when `pod` is given), then its sandboxes (upstream
    /// `killPodWithSyncResult` and `killContainersWithSyncResult`). All `preStop` hooks start at
    /// once; with a known spec, sidecars then stop only after the main containers, in reverse
    /// order ([`TerminationOrdering`]), within the same grace period. The node shutdown manager
    /// and a pod whose main containers are all done come through here too.
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
        let ordering = pod.and_then(|pod| {
            TerminationOrdering::new(pod, running.iter().map(|(_, name)| name.as_str()))
        });
        let stops = running.iter().map(|(id, name)| {
            self.kill_container(pod, status, (id, name), None, grace, ordering.as_ref())
        });
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

/// A `Failed` event (upstream gives failed creates, starts and pulls one reason).
fn failed(action: Action) -> (EventType, &'static str, Action) {
    (
        EventType::Warning,
        reasons::FAILED_TO_CREATE_CONTAINER,
        action,
    )
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
        let mut status =
            crate::cri::convert::get_pod_status(self.runtime.as_ref(), uid, name, namespace)
                .await?;
        self.fill_termination_messages(&mut status).await;
        Ok(status)
    }

    /// Gives each exited container its termination message (upstream `getPodContainerStatuses`
    /// reads it on every status; here it is read once, when the container is first seen exited,
    /// as what an exited container left does not change the message it reported). A container
    /// whose CRI status cannot be had keeps the runtime's message and is tried again next time.
    async fn fill_termination_messages(&self, status: &mut PodStatus) {
        let known = self
            .termination_messages
            .lock_unpoisoned()
            .get(&status.uid)
            .cloned()
            .unwrap_or_default();
        let mut current = HashMap::new();
        for c in status
            .containers
            .iter_mut()
            .filter(|c| c.state == ContainerState::Exited)
        {
            let message = match known.get(&c.id.id) {
                Some(message) => message.clone(),
                None => match self.runtime.container_status(&c.id.id).await {
                    Ok(cri) => {
                        super::termination_message::termination_message(&cri, self.runtime.as_ref())
                            .await
                    }
                    Err(error) => {
                        tracing::debug!(pod = %status.uid, id = %c.id.id, %error, "cannot read the container's status for its termination message; trying again later");
                        continue;
                    }
                },
            };
            c.message.clone_from(&message);
            current.insert(c.id.id.clone(), message);
        }
        let mut messages = self.termination_messages.lock_unpoisoned();
        if current.is_empty() {
            messages.remove(&status.uid);
        } else {
            messages.insert(status.uid.clone(), current);
        }
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
