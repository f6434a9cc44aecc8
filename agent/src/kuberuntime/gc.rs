//! Container garbage collection (upstream `pkg/kubelet/kuberuntime/kuberuntime_gc.go` under
//! `pkg/kubelet/container/container_gc.go`): what the runtime keeps of containers that exited,
//! sandboxes that stopped, and log directories of pods that are gone.
//!
//! One collection, in upstream's order:
//! 1. **Containers.** Exited (or unknown) containers older than `minimum-container-ttl-duration`
//!    are grouped by (pod UID, container name). Once the sources are ready, every group of a pod
//!    whose content may be removed (deleted and terminated, or evicted) goes entirely; then each
//!    group keeps its newest `maximum-dead-containers-per-container`; then, if more than
//!    `maximum-dead-containers` remain node-wide, each group is cut to an equal share (at least
//!    one) and, if still too many, the oldest go regardless of group. Negative limits are none.
//!    A container's log files (the current one and its rotations) go with it, so `previous`
//!    logs exist exactly as long as the previous instance does.
//! 2. **Sandboxes.** A sandbox is active while ready or while any container refers to it.
//!    Inactive sandboxes of a removable pod all go; of any other pod all but the newest.
//! 3. **Log directories** of pods whose content may be removed, once the sources are ready.
//!
//! The selection is pure ([`select_containers`], [`select_sandboxes`]) and tested against the fake
//! runtime; [`ContainerGc::collect`] carries it out.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_cri::v1 as cri;

use crate::{
    container::{LABEL_CONTAINER_NAME, LABEL_POD_UID, PodUid},
    cri::RuntimeService,
};

/// Upstream `ContainerGCPeriod`.
pub const CONTAINER_GC_PERIOD: Duration = Duration::from_secs(60);

/// The container GC policy (upstream `GCPolicy`; flags `--minimum-container-ttl-duration`,
/// `--maximum-dead-containers-per-container`, `--maximum-dead-containers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContainerGcPolicy {
    /// A dead container younger than this (since its creation) is kept.
    pub min_age: Duration,
    /// Dead containers kept per (pod, container name); negative: no limit.
    pub max_per_pod_container: i32,
    /// Dead containers kept on the node; negative: no limit.
    pub max_containers: i32,
}

impl Default for ContainerGcPolicy {
    fn default() -> Self {
        ContainerGcPolicy {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}

/// What the collector needs to know about pods (upstream `PodStateProvider`).
pub trait PodStateProvider: Send + Sync {
    /// The pod is gone for good (deleted and terminated, evicted, or never known): its
    /// containers, sandboxes and logs may all go.
    fn should_pod_content_be_removed(&self, uid: &PodUid) -> bool;
    /// The pod's containers will not run again (terminated, or never known), though the pod
    /// may still be listed: under disk pressure its dead containers may go too.
    fn should_pod_runtime_be_removed(&self, uid: &PodUid) -> bool;
}

/// One dead container the collector may remove.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadContainer {
    pub id: String,
    pub created_at: i64,
}

/// The group of dead containers one (pod, container name) has, newest first.
pub type EvictUnits = BTreeMap<(PodUid, String), Vec<DeadContainer>>;

/// Dead containers created at least `min_age` before `now`, grouped, newest first (upstream
/// `evictableContainers`). Containers without the kubelet's labels are not swiftlet's: left alone.
pub fn evictable_containers(
    containers: &[cri::Container],
    now: SystemTime,
    min_age: Duration,
) -> EvictUnits {
    let newest = now
        .checked_sub(min_age)
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let created_cutoff = now
        .checked_sub(CONTAINER_GC_PERIOD)
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let mut units = EvictUnits::new();
    for c in containers {
        if c.state == cri::ContainerState::ContainerRunning as i32 || c.created_at > newest {
            continue;
        }
        // A container created but not started yet is usually one a sync is about to start
        // (the restart of the container whose death triggered this collection): counting it
        // as dead would make its previous instance, and with it the `previous` logs, go.
        // Upstream counts it; here it waits one GC period first.
        if c.state == cri::ContainerState::ContainerCreated as i32 && c.created_at > created_cutoff
        {
            continue;
        }
        let (Some(uid), Some(name)) = (
            c.labels.get(LABEL_POD_UID),
            c.labels.get(LABEL_CONTAINER_NAME),
        ) else {
            continue;
        };
        units
            .entry((PodUid(uid.clone()), name.clone()))
            .or_default()
            .push(DeadContainer {
                id: c.id.clone(),
                created_at: c.created_at,
            });
    }
    for unit in units.values_mut() {
        unit.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    }
    units
}

/// The ids of the dead containers to remove (upstream `evictContainers`).
pub fn select_containers(
    mut units: EvictUnits,
    policy: &ContainerGcPolicy,
    all_sources_ready: bool,
    evict_non_deleted_pods: bool,
    pods: &dyn PodStateProvider,
) -> Vec<String> {
    let mut remove = Vec::new();
    if all_sources_ready {
        units.retain(|(uid, _), unit| {
            let gone = pods.should_pod_content_be_removed(uid)
                || (evict_non_deleted_pods && pods.should_pod_runtime_be_removed(uid));
            if gone {
                remove.extend(unit.drain(..).map(|c| c.id));
            }
            !gone
        });
    }
    if policy.max_per_pod_container >= 0 {
        keep_per_unit(
            &mut units,
            policy.max_per_pod_container as usize,
            &mut remove,
        );
    }
    if policy.max_containers >= 0 {
        let max = policy.max_containers as usize;
        let count = |units: &EvictUnits| units.values().map(Vec::len).sum::<usize>();
        if count(&units) > max && !units.is_empty() {
            let share = (max / units.len()).max(1);
            keep_per_unit(&mut units, share, &mut remove);
            let left = count(&units);
            if left > max {
                let mut all: Vec<DeadContainer> = units.into_values().flatten().collect();
                all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
                remove.extend(all.drain(max..).map(|c| c.id));
            }
        }
    }
    remove
}

/// Cuts every unit to its newest `keep`, adding the rest to `remove`.
fn keep_per_unit(units: &mut EvictUnits, keep: usize, remove: &mut Vec<String>) {
    for unit in units.values_mut() {
        if unit.len() > keep {
            remove.extend(unit.drain(keep..).map(|c| c.id));
        }
    }
}

/// The ids of the sandboxes to remove (upstream `evictSandboxes`). `containers` is every
/// container the runtime has (after the containers' collection), `removed` those just removed.
pub fn select_sandboxes(
    sandboxes: &[cri::PodSandbox],
    containers: &[cri::Container],
    removed: &HashSet<String>,
    evict_non_deleted_pods: bool,
    pods: &dyn PodStateProvider,
) -> Vec<String> {
    let with_containers: HashSet<&str> = containers
        .iter()
        .filter(|c| !removed.contains(&c.id))
        .map(|c| c.pod_sandbox_id.as_str())
        .collect();
    let mut by_pod: BTreeMap<PodUid, Vec<&cri::PodSandbox>> = BTreeMap::new();
    for s in sandboxes {
        let Some(uid) = s
            .labels
            .get(LABEL_POD_UID)
            .cloned()
            .or_else(|| s.metadata.as_ref().map(|m| m.uid.clone()))
        else {
            continue;
        };
        by_pod.entry(PodUid(uid)).or_default().push(s);
    }
    let mut remove = Vec::new();
    for (uid, mut list) in by_pod {
        list.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
        let gone = pods.should_pod_content_be_removed(&uid)
            || (evict_non_deleted_pods && pods.should_pod_runtime_be_removed(&uid));
        // A live pod keeps its newest sandbox even when it is stopped: its restart reuses the
        // attempt count, and status reads the sandbox.
        let candidates = if gone {
            &list[..]
        } else {
            &list[1.min(list.len())..]
        };
        for s in candidates {
            let active = s.state == cri::PodSandboxState::SandboxReady as i32
                || with_containers.contains(s.id.as_str());
            if !active {
                remove.push(s.id.clone());
            }
        }
    }
    remove
}

/// The pod UID of a log directory named `<namespace>_<name>_<uid>` (upstream
/// `parsePodUIDFromLogsDirectory`).
pub fn pod_uid_of_log_dir(name: &str) -> Option<PodUid> {
    let (_, uid) = name.rsplit_once('_')?;
    (!uid.is_empty()).then(|| PodUid(uid.to_owned()))
}

/// What one collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcOutcome {
    pub containers: usize,
    pub sandboxes: usize,
    pub log_dirs: usize,
    /// Removals that failed (logged; the next collection tries again).
    pub failures: usize,
}

pub struct ContainerGc {
    runtime: Arc<dyn RuntimeService>,
    pods: Arc<dyn PodStateProvider>,
    policy: ContainerGcPolicy,
    pod_logs_dir: PathBuf,
    clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
}

impl ContainerGc {
    pub fn new(
        runtime: Arc<dyn RuntimeService>,
        pods: Arc<dyn PodStateProvider>,
        policy: ContainerGcPolicy,
        pod_logs_dir: PathBuf,
    ) -> Self {
        ContainerGc {
            runtime,
            pods,
            policy,
            pod_logs_dir,
            clock: Arc::new(SystemTime::now),
        }
    }

    /// Uses `clock` to age containers (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Fn() -> SystemTime + Send + Sync>) -> Self {
        self.clock = clock;
        self
    }

    /// One collection (upstream `GarbageCollect`). `evict_non_deleted_pods` also takes the dead
    /// containers of pods that are terminated but still listed (disk pressure).
    pub async fn collect(
        &self,
        all_sources_ready: bool,
        evict_non_deleted_pods: bool,
    ) -> Result<GcOutcome, crate::cri::Error> {
        let mut outcome = GcOutcome::default();
        let containers = self.runtime.list_containers(None).await?;
        let sandboxes = self.runtime.list_pod_sandbox(None).await?;
        let pods = AliveGuard {
            inner: self.pods.as_ref(),
            alive: alive_pods(&containers, &sandboxes),
        };
        let units = evictable_containers(&containers, (self.clock)(), self.policy.min_age);
        let doomed = select_containers(
            units,
            &self.policy,
            all_sources_ready,
            evict_non_deleted_pods,
            &pods,
        );
        let mut removed = HashSet::new();
        for id in doomed {
            match self.remove_container(&id).await {
                Ok(()) => {
                    outcome.containers += 1;
                    removed.insert(id);
                }
                Err(e) => {
                    outcome.failures += 1;
                    tracing::warn!(container = id, error = %e, "container GC: cannot remove a dead container");
                }
            }
        }
        let doomed = select_sandboxes(
            &sandboxes,
            &containers,
            &removed,
            evict_non_deleted_pods,
            &pods,
        );
        for id in doomed {
            match self.runtime.remove_pod_sandbox(&id).await {
                Ok(()) => outcome.sandboxes += 1,
                Err(e) => {
                    outcome.failures += 1;
                    tracing::warn!(sandbox = id, error = %e, "container GC: cannot remove a dead sandbox");
                }
            }
        }
        if all_sources_ready {
            let (removed, failed) = remove_pod_log_dirs(&self.pod_logs_dir, &pods);
            outcome.log_dirs = removed;
            outcome.failures += failed;
        }
        Ok(outcome)
    }

    /// Removes a container's log files, then the container (upstream `removeContainer`:
    /// `removeContainerLog` first, so no log outlives its container).
    async fn remove_container(&self, id: &str) -> Result<(), crate::cri::Error> {
        match self.runtime.container_status(id).await {
            Ok(status) if !status.log_path.is_empty() => {
                remove_container_logs(Path::new(&status.log_path));
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        }
        match self.runtime.remove_container(id).await {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }
}

/// Pods with a running container or a ready sandbox.
fn alive_pods(containers: &[cri::Container], sandboxes: &[cri::PodSandbox]) -> HashSet<PodUid> {
    let running = containers
        .iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .filter_map(|c| c.labels.get(LABEL_POD_UID));
    let ready = sandboxes
        .iter()
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        .filter_map(|s| s.labels.get(LABEL_POD_UID));
    running
        .chain(ready)
        .map(|uid| PodUid(uid.clone()))
        .collect()
}

/// A pod the runtime still runs is never gone, whatever the kubelet's view says: right after a
/// start the sources may be ready before their pods reached the pod manager, and removing a
/// live pod's log directory would make its next container fail to start.
struct AliveGuard<'a> {
    inner: &'a dyn PodStateProvider,
    alive: HashSet<PodUid>,
}

impl PodStateProvider for AliveGuard<'_> {
    fn should_pod_content_be_removed(&self, uid: &PodUid) -> bool {
        !self.alive.contains(uid) && self.inner.should_pod_content_be_removed(uid)
    }

    fn should_pod_runtime_be_removed(&self, uid: &PodUid) -> bool {
        !self.alive.contains(uid) && self.inner.should_pod_runtime_be_removed(uid)
    }
}

/// Removes `log` and its rotated files (upstream `ContainerLogManager.Clean`: `<log>*`).
fn remove_container_logs(log: &Path) {
    let mut files = vec![log.to_owned()];
    files.extend(crate::logs::rotate::rotated_logs(log).unwrap_or_default());
    for f in files {
        if let Err(e) = std::fs::remove_file(&f)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %f.display(), error = %e, "container GC: cannot remove a container log");
        }
    }
}

/// Removes the log directories of pods whose content may go; (removed, failed). Only entries
/// of `root` itself, through its descriptor: a link is removed as a link, a mount below stops
/// that directory's removal.
fn remove_pod_log_dirs(root: &Path, pods: &dyn PodStateProvider) -> (usize, usize) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return (0, 0);
    };
    let Ok(root_dir) = crate::hostfs::Dir::open(root) else {
        return (0, 0);
    };
    let (mut removed, mut failed) = (0, 0);
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(uid) = pod_uid_of_log_dir(&name) else {
            continue;
        };
        if !entry.file_type().is_ok_and(|t| t.is_dir()) || !pods.should_pod_content_be_removed(&uid)
        {
            continue;
        }
        match crate::hostfs::remove_all(&root_dir, &entry.file_name()) {
            Ok(()) => removed += 1,
            Err(e) => {
                failed += 1;
                tracing::warn!(dir = %entry.path().display(), error = %e, "container GC: cannot remove a pod's log directory");
            }
        }
    }
    (removed, failed)
}

#[cfg(test)]
mod tests;
