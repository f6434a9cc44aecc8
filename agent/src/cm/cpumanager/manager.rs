//! The CPU manager with the static policy (upstream `cpu_manager.go`): it allocates at
//! admission, writes each container's cpuset into its create request, and brings every other
//! container's cpuset up to date through CRI `UpdateContainerResources` as soon as an assignment
//! changes the shared pool, instead of waiting for the next reconcile. The reconcile remains, as
//! the safety net, and is all there is under `cpuManagerApply: reconcile` (the kubelet's model).
//!
//! It also keeps the scheduler audit's view of who owns which CPU (`audit.rs`) and reads it back:
//! foreign work on an exclusive CPU after its assignment is applied is an exclusivity violation,
//! logged and counted.
//!
//! Not here: which CPUs (`policy.rs`), the checkpoint format (`state.rs`), when the kubelet calls
//! it (`kubelet`, `kuberuntime` lifecycle hooks). Upstream counterparts: `Allocate` (through the
//! topology manager's admit handler), `GetCPUAffinity` / `AddContainer` (`PreCreateContainer`,
//! `PreStartContainer`), `RemoveContainer`, `removeStaleState`, `reconcileState`.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    audit::{AuditMaps, Exclusivity},
    cpuset::CpuSet,
    metrics::CpuManagerMetrics,
    policy::{PolicyError, StaticPolicy},
    state::{self, Assignments, StateError},
};
use crate::{
    container::{LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, PodUid},
    cri::RuntimeService,
    kernel::ForeignRun,
    lock::MutexExt as _,
};

/// How often foreign time on exclusive CPUs is checked (and past owners' sums dropped).
pub const AUDIT_PERIOD: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("moving the rejected CPU manager checkpoint aside to {}: {source}", path.display())]
    SetAside {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why a pod's CPUs could not be allocated; the pod is rejected with this message.
#[derive(Debug, thiserror::Error)]
#[error("Allocate failed due to {0}, which is unexpected")]
pub struct AdmitError(pub String);

/// Where a container's cgroup2 id comes from (the cgroup2 directory's inode); `None` when the
/// node has no cgroup2 hierarchy or the container's directory is not there.
pub type CgroupIdOf = Arc<dyn Fn(&PodUid, &str) -> Option<u64> + Send + Sync>;

/// When [`CpuManager`] writes assignments to the containers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyMode {
    Events,
    ReconcileOnly,
}

/// What the manager knows of one live container (upstream `containermap`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerRef {
    pub pod_uid: PodUid,
    pub namespace: String,
    pub pod_name: String,
    pub container: String,
    pub cgroup_id: Option<u64>,
}

struct Inner {
    state: Assignments,
    containers: HashMap<String, ContainerRef>,
    /// The cpuset each container was last given (upstream `lastUpdateState`).
    applied: HashMap<String, CpuSet>,
    /// What the audit map says about each CPU's owner.
    owners: BTreeMap<u32, u64>,
    /// When each CPU's owner was written: foreign work before that is expected.
    owned_since: BTreeMap<u32, Instant>,
}

pub struct CpuManager {
    policy: StaticPolicy,
    checkpoint: PathBuf,
    runtime: Arc<dyn RuntimeService>,
    mode: ApplyMode,
    reconcile_period: Duration,
    cgroup_id_of: CgroupIdOf,
    audit: Option<Arc<dyn AuditMaps>>,
    exclusivity: Mutex<Exclusivity>,
    metrics: CpuManagerMetrics,
    inner: Mutex<Inner>,
    kick: Notify,
    /// Bumped at every change of the assignments (see [`Exclusivity::window_settled`]).
    generation: std::sync::atomic::AtomicU64,
}

/// Opening the checkpoint: what to do with one that cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnBadCheckpoint {
    Refuse,
    /// Move it aside (`cpu_manager_state.rejected-<unix seconds>`) and start afresh.
    SetAside,
}

pub struct CpuManagerOptions {
    pub root_dir: PathBuf,
    pub mode: ApplyMode,
    pub reconcile_period: Duration,
    pub on_bad_checkpoint: OnBadCheckpoint,
    pub cgroup_id_of: CgroupIdOf,
    pub audit: Option<Arc<dyn AuditMaps>>,
}

impl CpuManager {
    /// Restores the checkpoint (or starts every CPU shared) and checks it against this node.
    pub fn new(
        policy: StaticPolicy,
        runtime: Arc<dyn RuntimeService>,
        metrics: CpuManagerMetrics,
        options: CpuManagerOptions,
    ) -> Result<CpuManager, Error> {
        let checkpoint = options.root_dir.join(state::FILE_NAME);
        let restored = match state::load(&checkpoint, super::policy::STATIC) {
            Ok(restored) => policy.start(restored).map_err(Error::from),
            Err(e) => Err(Error::from(e)),
        };
        let state = match (restored, options.on_bad_checkpoint) {
            (Ok(state), _) => state,
            (Err(e @ (Error::State(StateError::Read { .. }) | Error::SetAside { .. })), _)
            | (Err(e), OnBadCheckpoint::Refuse) => return Err(e),
            (Err(e), OnBadCheckpoint::SetAside) => {
                let aside = set_aside(&checkpoint)?;
                tracing::warn!(
                    error = %e,
                    moved_to = %aside.display(),
                    "--cpu-manager-reset-state: the CPU manager checkpoint was set aside; starting \
                     with every CPU shared"
                );
                policy.start(None)?
            }
        };
        state::store(&checkpoint, &state)?;
        tracing::info!(
            reserved = %policy.reserved(),
            shared = %state.default_set,
            exclusive = state.entries.values().map(BTreeMap::len).sum::<usize>(),
            "CPU manager started with the static policy"
        );
        let manager = CpuManager {
            policy,
            checkpoint,
            runtime,
            mode: options.mode,
            reconcile_period: options.reconcile_period,
            cgroup_id_of: options.cgroup_id_of,
            audit: options.audit,
            exclusivity: Mutex::new(Exclusivity::default()),
            metrics,
            inner: Mutex::new(Inner {
                state,
                containers: HashMap::new(),
                applied: HashMap::new(),
                owners: BTreeMap::new(),
                owned_since: BTreeMap::new(),
            }),
            kick: Notify::new(),
            generation: std::sync::atomic::AtomicU64::new(0),
        };
        manager.update_gauges(&manager.lock().state);
        Ok(manager)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock_unpoisoned()
    }

    /// A copy of the current assignments.
    pub fn assignments(&self) -> Assignments {
        self.lock().state.clone()
    }

    /// The CPUs container `name` of pod `pod_uid` holds exclusively (upstream
    /// `GetExclusiveCPUs`); empty when it runs in the shared pool.
    pub fn exclusive_cpus(&self, pod_uid: &str, name: &str) -> CpuSet {
        self.lock()
            .state
            .entries
            .get(pod_uid)
            .and_then(|containers| containers.get(name))
            .cloned()
            .unwrap_or_default()
    }

    /// The CPUs the manager may hand out exclusively.
    pub fn allocatable_cpus(&self) -> CpuSet {
        self.policy.allocatable()
    }

    /// The live containers the manager knows, by container id.
    pub fn containers(&self) -> HashMap<String, ContainerRef> {
        self.lock().containers.clone()
    }

    pub fn audit(&self) -> Option<&Arc<dyn AuditMaps>> {
        self.audit.as_ref()
    }

    /// Admission's call (upstream `Allocate`): first releases the CPUs of pods no longer wanted
    /// (`removeStaleState`), then allocates `pod`'s. `wanted` is every pod that may hold CPUs,
    /// `pod` included, or `None` while the sources have not all sent their first complete set
    /// (upstream's `sourcesReady` guard): a pod missing from a partial view is not stale.
    ///
    /// Releasing first is what lets an agent started over a checkpoint of killed pods (a node
    /// reboot, a killed agent whose containers were removed) admit a pod that needs their CPUs.
    pub fn allocate(&self, pod: &Pod, wanted: Option<&HashSet<PodUid>>) -> Result<(), AdmitError> {
        if let Some(wanted) = wanted {
            self.remove_stale(wanted);
        }
        self.admit(pod)
    }

    /// Allocates the exclusive CPUs of every container of `pod` (init containers first, their
    /// CPUs reusable by the later ones, as upstream), all or nothing.
    pub fn admit(&self, pod: &Pod) -> Result<(), AdmitError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let mut inner = self.lock();
        // Admitted before a restart (the checkpoint has it): its init containers' CPUs already
        // passed to the app containers, so allocating them again would ask for CPUs twice.
        if let Some(existing) = inner.state.entries.get(&uid)
            && spec.containers.iter().all(|c| {
                StaticPolicy::guaranteed_cpus(pod, c).is_none() || existing.contains_key(&c.name)
            })
        {
            return Ok(());
        }
        let mut state = inner.state.clone();
        let mut reusable = CpuSet::new();
        let mut requested = false;
        let inits = spec.init_containers.iter().flatten();
        for (container, is_init) in inits
            .map(|c| (c, true))
            .chain(spec.containers.iter().map(|c| (c, false)))
        {
            let cpus = StaticPolicy::guaranteed_cpus(pod, container);
            requested |= cpus.is_some();
            let set = self
                .policy
                .allocate(&mut state, &uid, &container.name, cpus, &reusable)
                .map_err(|e| {
                    self.metrics.pinning_errors.inc();
                    AdmitError(match e {
                        PolicyError::Allocate { source, .. } => source.to_string(),
                        other => other.to_string(),
                    })
                })?;
            let Some(set) = set else { continue };
            // A sidecar (restartable init container) keeps running: its CPUs stay its own.
            if is_init && !is_sidecar(container) {
                reusable = reusable.union(&set);
            } else {
                reusable = reusable.difference(&set);
            }
        }
        if requested {
            self.metrics.pinning_requests.inc();
        }
        if state == inner.state {
            return Ok(());
        }
        tracing::info!(pod = uid, exclusive = ?state.entries.get(&uid), shared = %state.default_set, "exclusive CPUs allocated");
        inner.state = state;
        self.saved(&inner);
        drop(inner);
        self.changed();
        Ok(())
    }

    /// The cpuset a container is created with (upstream `PreCreateContainer`): its exclusive
    /// CPUs or the shared pool.
    pub fn cpuset_for(&self, pod: &Pod, container: &Container) -> CpuSet {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        StaticPolicy::cpus_of(&self.lock().state, uid, &container.name)
    }

    /// A container was created with `cpuset` (upstream `PreStartContainer` / `AddContainer`).
    pub fn container_created(&self, pod: &Pod, container: &Container, id: &str, cpuset: CpuSet) {
        let pod_uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
        let cgroup_id = (self.cgroup_id_of)(&pod_uid, id);
        let reference = ContainerRef {
            pod_uid,
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            pod_name: pod.metadata.name.clone().unwrap_or_default(),
            container: container.name.clone(),
            cgroup_id,
        };
        let mut inner = self.lock();
        inner.containers.insert(id.to_owned(), reference);
        inner.applied.insert(id.to_owned(), cpuset);
        self.sync_owners(&mut inner);
    }

    /// The kernel (or a relist) saw the container start. Its cgroup exists only now (the
    /// runtime makes it when the container starts, not when it is created), so this is when the
    /// audit learns who owns its CPUs; and if the pool moved since its create request, it gets
    /// the current set.
    pub fn container_started(&self, id: &str) {
        let stale = {
            let mut inner = self.lock();
            let Some(c) = inner.containers.get(id).cloned() else {
                // Not created through this agent's create path (e.g. before a restart).
                drop(inner);
                self.kick.notify_one();
                return;
            };
            if c.cgroup_id.is_none()
                && let Some(found) = (self.cgroup_id_of)(&c.pod_uid, id)
                && let Some(entry) = inner.containers.get_mut(id)
            {
                entry.cgroup_id = Some(found);
                self.sync_owners(&mut inner);
            }
            let want = StaticPolicy::cpus_of(&inner.state, &c.pod_uid.0, &c.container);
            inner.applied.get(id) != Some(&want)
        };
        if stale {
            self.changed();
        }
    }

    /// A container exited for good (it will not be restarted, or its pod is going away): its
    /// exclusive CPUs go back to the shared pool (upstream `RemoveContainer`).
    pub fn container_exited(&self, pod_uid: &PodUid, container: &str, id: &str) {
        let mut inner = self.lock();
        inner.containers.remove(id);
        inner.applied.remove(id);
        let before = inner.state.clone();
        self.policy
            .remove_container(&mut inner.state, &pod_uid.0, container);
        if inner.state == before {
            self.sync_owners(&mut inner);
            return;
        }
        tracing::info!(pod = %pod_uid, container, shared = %inner.state.default_set, "exclusive CPUs released");
        self.saved(&inner);
        drop(inner);
        self.changed();
    }

    /// Releases the CPUs of pods no longer active (upstream `removeStaleState`).
    pub fn remove_stale(&self, active: &HashSet<PodUid>) {
        let mut inner = self.lock();
        let stale: Vec<String> = inner
            .state
            .entries
            .keys()
            .filter(|uid| !active.contains(&PodUid((*uid).clone())))
            .cloned()
            .collect();
        if stale.is_empty() {
            return;
        }
        for uid in &stale {
            let names: Vec<String> = inner
                .state
                .entries
                .get(uid)
                .map(|c| c.keys().cloned().collect())
                .unwrap_or_default();
            for name in names {
                self.policy.remove_container(&mut inner.state, uid, &name);
            }
        }
        tracing::info!(pods = ?stale, shared = %inner.state.default_set, "exclusive CPUs of pods no longer active released");
        self.saved(&inner);
        drop(inner);
        self.changed();
    }

    /// Runs the apply and reconcile loop until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut reconcile = tokio::time::interval(self.reconcile_period);
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut audit = tokio::time::interval(AUDIT_PERIOD);
        audit.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.kick.notified(), if self.mode == ApplyMode::Events => {
                    self.apply("event").await;
                }
                _ = reconcile.tick() => self.apply("reconcile").await,
                _ = audit.tick() => self.check_exclusivity(),
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// Something changed what containers should run on.
    fn changed(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.update_gauges(&self.lock().state);
        self.kick.notify_one();
    }

    /// Brings every running container's cpuset to what the assignments say (upstream
    /// `reconcileState`), learning containers it has not seen created (after a restart).
    pub async fn apply(&self, trigger: &'static str) {
        let started = Instant::now();
        let filter = cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerRunning as i32,
            }),
            ..Default::default()
        };
        let running = match self.runtime.list_containers(Some(filter)).await {
            Ok(running) => running,
            Err(e) => {
                tracing::warn!(error = %e, "CPU manager: listing containers failed; the next reconcile tries again");
                self.metrics.update_errors.inc();
                return;
            }
        };
        let mut work = Vec::new();
        {
            let mut inner = self.lock();
            let live: HashSet<&str> = running.iter().map(|c| c.id.as_str()).collect();
            inner.containers.retain(|id, _| live.contains(id.as_str()));
            inner.applied.retain(|id, _| live.contains(id.as_str()));
            for c in &running {
                let Some(reference) = self.reference_of(c) else {
                    continue;
                };
                let want =
                    StaticPolicy::cpus_of(&inner.state, &reference.pod_uid.0, &reference.container);
                let known = inner
                    .containers
                    .entry(c.id.clone())
                    .or_insert_with(|| reference.clone());
                if known.cgroup_id.is_none() {
                    known.cgroup_id = reference.cgroup_id;
                }
                if inner.applied.get(&c.id) != Some(&want) {
                    work.push((c.id.clone(), want));
                }
            }
        }
        for (id, want) in work {
            let resources = cri::LinuxContainerResources {
                cpuset_cpus: want.to_string(),
                ..Default::default()
            };
            match self
                .runtime
                .update_container_resources(&id, resources)
                .await
            {
                Ok(()) => {
                    self.metrics.updates.with_label_values(&[trigger]).inc();
                    self.lock().applied.insert(id, want);
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    self.metrics.update_errors.inc();
                    tracing::warn!(container = id, cpuset = %want, error = %e, "CPU manager: updating the cpuset failed; the next reconcile tries again");
                }
            }
        }
        let mut inner = self.lock();
        self.sync_owners(&mut inner);
        self.metrics
            .apply_duration
            .with_label_values(&[trigger])
            .observe(started.elapsed().as_secs_f64());
    }

    fn reference_of(&self, c: &cri::Container) -> Option<ContainerRef> {
        let label = |key: &str| c.labels.get(key).cloned();
        let pod_uid = PodUid(label(LABEL_POD_UID)?);
        let cgroup_id = (self.cgroup_id_of)(&pod_uid, &c.id);
        Some(ContainerRef {
            pod_uid,
            namespace: label(LABEL_POD_NAMESPACE).unwrap_or_default(),
            pod_name: label(LABEL_POD_NAME).unwrap_or_default(),
            container: label(LABEL_CONTAINER_NAME)?,
            cgroup_id,
        })
    }

    /// Points the audit's CPU owners at the containers whose exclusive set is applied.
    fn sync_owners(&self, inner: &mut Inner) {
        let Some(audit) = &self.audit else {
            return;
        };
        let mut want: BTreeMap<u32, u64> = BTreeMap::new();
        for (id, c) in &inner.containers {
            let Some(cgroup_id) = c.cgroup_id else {
                continue;
            };
            let Some(own) = inner
                .state
                .entries
                .get(&c.pod_uid.0)
                .and_then(|e| e.get(&c.container))
            else {
                continue;
            };
            if inner.applied.get(id) == Some(own) {
                want.extend(own.iter().map(|cpu| (cpu, cgroup_id)));
            }
        }
        let cpus: Vec<u32> = inner.owners.keys().chain(want.keys()).copied().collect();
        for cpu in cpus {
            let now = want.get(&cpu).copied().unwrap_or(0);
            if inner.owners.get(&cpu).copied().unwrap_or(0) == now {
                continue;
            }
            if let Err(e) = audit.set_owner(cpu, now) {
                tracing::warn!(cpu, error = %e, "CPU manager: updating the scheduler audit failed");
                continue;
            }
            if now == 0 {
                inner.owners.remove(&cpu);
                inner.owned_since.remove(&cpu);
            } else {
                inner.owners.insert(cpu, now);
                inner.owned_since.insert(cpu, Instant::now());
            }
        }
    }

    /// Reads foreign time on exclusive CPUs; a pod's container running on another container's
    /// exclusive CPU once its assignment is applied everywhere is a violation.
    pub fn check_exclusivity(&self) {
        let Some(audit) = &self.audit else {
            return;
        };
        let (owners, by_cgroup, applied_everywhere) = {
            let inner = self.lock();
            let by_cgroup: HashMap<u64, ContainerRef> = inner
                .containers
                .values()
                .filter_map(|c| Some((c.cgroup_id?, c.clone())))
                .collect();
            let everywhere = inner.containers.iter().all(|(id, c)| {
                inner.applied.get(id)
                    == Some(&StaticPolicy::cpus_of(
                        &inner.state,
                        &c.pod_uid.0,
                        &c.container,
                    ))
            });
            (inner.owners.clone(), by_cgroup, everywhere)
        };
        let runs = match audit.foreign() {
            Ok(runs) => runs,
            Err(e) => {
                tracing::debug!(error = %e, "reading the scheduler audit failed");
                return;
            }
        };
        self.forget_past_owners(audit.as_ref(), &runs, &owners, &by_cgroup);
        if owners.is_empty() {
            return;
        }
        let mut exclusivity = self.exclusivity.lock_unpoisoned();
        let generation = self.generation.load(std::sync::atomic::Ordering::Relaxed);
        let settled = exclusivity.window_settled(applied_everywhere, generation);
        for v in exclusivity.update(&runs, &owners) {
            let Some(intruder) = by_cgroup.get(&v.intruder) else {
                continue;
            };
            if !settled {
                continue;
            }
            let owner = by_cgroup.get(&v.owner);
            self.metrics.violations.inc();
            tracing::warn!(
                cpu = v.cpu,
                owner = owner.map(|o| format!("{}/{}/{}", o.namespace, o.pod_name, o.container)),
                intruder = format!(
                    "{}/{}/{}",
                    intruder.namespace, intruder.pod_name, intruder.container
                ),
                foreign_ms = v.delta_ns as f64 / 1e6,
                "exclusivity violation: another pod's container ran on an exclusive CPU"
            );
        }
    }

    /// Drops the kernel's sums of owners that are gone (their container exited or was removed).
    /// Nothing reads them any more, and the map of (owner, intruder) sums is a plain hash map of
    /// fixed size: left there, every exclusive container a node ever ran would keep its pairs, and
    /// once the map is full new pairs go uncounted (`foreign_full`).
    fn forget_past_owners(
        &self,
        audit: &dyn AuditMaps,
        runs: &[ForeignRun],
        owners: &BTreeMap<u32, u64>,
        known: &HashMap<u64, ContainerRef>,
    ) {
        let current: HashSet<u64> = owners.values().copied().collect();
        let past: BTreeSet<u64> = runs
            .iter()
            .map(|r| r.owner)
            .filter(|owner| !current.contains(owner) && !known.contains_key(owner))
            .collect();
        for owner in past {
            match audit.remove_cgroup(owner) {
                Ok(()) => tracing::debug!(owner, "scheduler audit: a past owner's sums dropped"),
                Err(e) => {
                    tracing::debug!(owner, error = %e, "scheduler audit: dropping a past owner's sums failed")
                }
            }
        }
    }

    /// What `/pods` shows of a pod's exclusive CPUs: `cpumanager.swiftlet.io/exclusive-cpus`
    /// (container → cpulist) and `cpumanager.swiftlet.io/foreign-seconds` (container → seconds
    /// other pods' and other tasks ran on them since the container started), as JSON.
    pub fn pod_annotations(&self, pod_uid: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let (cpus, owners) = {
            let inner = self.lock();
            let Some(entries) = inner.state.entries.get(pod_uid) else {
                return out;
            };
            let owners: HashMap<u64, String> = inner
                .containers
                .values()
                .filter(|c| c.pod_uid.0 == pod_uid)
                .filter_map(|c| Some((c.cgroup_id?, c.container.clone())))
                .collect();
            let intruders: HashSet<u64> = inner
                .containers
                .values()
                .filter_map(|c| c.cgroup_id)
                .collect();
            (entries.clone(), (owners, intruders))
        };
        let cpus: BTreeMap<String, String> = cpus
            .into_iter()
            .map(|(c, set)| (c, set.to_string()))
            .collect();
        out.insert(
            "cpumanager.swiftlet.io/exclusive-cpus".into(),
            serde_json::to_string(&cpus).unwrap_or_default(),
        );
        let (owners, pods) = owners;
        if let Some(Ok(runs)) = self.audit.as_ref().map(|a| a.foreign()) {
            let mut seconds: BTreeMap<String, BTreeMap<&str, f64>> = BTreeMap::new();
            for name in owners.values() {
                seconds.entry(name.clone()).or_default();
            }
            for run in runs {
                let Some(name) = owners.get(&run.owner) else {
                    continue;
                };
                let class = if pods.contains(&run.intruder) {
                    "pod"
                } else {
                    "other"
                };
                *seconds
                    .entry(name.clone())
                    .or_default()
                    .entry(class)
                    .or_default() += run.ns as f64 / 1e9;
            }
            out.insert(
                "cpumanager.swiftlet.io/foreign-seconds".into(),
                serde_json::to_string(&seconds).unwrap_or_default(),
            );
        }
        out
    }

    fn saved(&self, inner: &Inner) {
        if let Err(e) = state::store(&self.checkpoint, &inner.state) {
            // The assignments in memory stay right; a restart would lose them, so say so loudly.
            tracing::error!(error = %e, "CPU manager: the checkpoint could not be written");
            self.metrics.checkpoint_errors.inc();
        }
    }

    fn update_gauges(&self, state: &Assignments) {
        self.metrics
            .shared_pool_millicores
            .set(i64::try_from(state.default_set.len()).unwrap_or(i64::MAX) * 1000);
        let exclusive: usize = state
            .entries
            .values()
            .flat_map(|c| c.values())
            .map(CpuSet::len)
            .sum();
        self.metrics
            .exclusive_cpus
            .set(i64::try_from(exclusive).unwrap_or(i64::MAX));
    }
}

fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

fn set_aside(checkpoint: &Path) -> Result<PathBuf, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let aside = checkpoint.with_extension(format!("rejected-{secs}"));
    std::fs::rename(checkpoint, &aside).map_err(|source| Error::SetAside {
        path: aside.clone(),
        source,
    })?;
    Ok(aside)
}

#[cfg(test)]
mod tests;
