//! The QoS cgroup hierarchy and per-pod cgroups (upstream `pkg/kubelet/cm`
//! `qos_container_manager_linux.go`, `pod_container_manager_linux.go`) at the paths
//! `cgroup::pods` defines for the configured driver (`kubepods[/burstable|/besteffort]/pod<uid>`,
//! or systemd's nested `kubepods.slice/...`); the besteffort level gets cpu shares 2, the
//! burstable level the shares of its pods' CPU requests summed (upstream `setCPUCgroupConfig`),
//! updated as pods start and go and rewritten every [`QOS_REPAIR_PERIOD`] (`UpdateCgroups`).
//!
//! Pod cgroups carry the pod-level limits (upstream `ResourceConfigForPod`: CPU shares from
//! requests, CPU quota in the configured period and memory limit when every container sets one,
//! each with `spec.overhead`; hugetlb limits per node page size; pids.max from `podPidsLimit`);
//! the runtime creates the container cgroups below them (the sandbox's `cgroup_parent`). On
//! cgroup v2 shares are written as `cpu.weight` (runc's conversion, `helpers::shares_to_weight`).
//!
//! Two ways to make them, as upstream's `cgroupManagerImpl` has: with cgroupfs they are written
//! through cgroups-rs for the cpu, memory and pids controllers (on a hybrid layout the same paths
//! are also made on the cgroup2 mount, where the kernel event programs watch them); with
//! systemd they are transient slices started, limited and stopped through systemd
//! (`cm::systemd::SystemdSlices`), which makes and removes the directories itself — writing
//! them behind its back would be undone at its next reload. Either way a removed pod's
//! directories are gone from every hierarchy afterwards.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use cgroups_rs::fs::{
    Cgroup, MaxValue, cpu::CpuController, hierarchies, memory::MemController, pid::PidController,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use super::{
    CgroupLayout,
    helpers::{CfsQuota, MIN_SHARES, milli_cpu_to_shares, shares_to_weight},
    hugepages::{self, HugePagesError},
    pressure_targets::{self, PodCgroupDir},
    qos::{QosClass, QosError, pod_qos},
    quantity::{self, QuantityError},
    systemd::{SliceResources, SystemdError, SystemdSlices},
};
use crate::{
    cgroup::PodCgroupLayout,
    container::PodUid,
    pod::resources::{OverheadError, RequestError, pod_overhead, pod_requests},
};

/// The controllers swiftlet writes pod-level limits to.
const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup {path}: {reason}")]
    Cgroup { path: String, reason: String },
    #[error("pod {pod}: {source}")]
    Qos {
        pod: String,
        #[source]
        source: QosError,
    },
    #[error("pod {pod}: {source}")]
    Limits {
        pod: String,
        #[source]
        source: LimitsError,
    },
    #[error(transparent)]
    Systemd(#[from] SystemdError),
}

#[derive(Clone, Debug)]
pub struct PodCgroupConfig {
    /// Where the pods' cgroups are: below `kubepods` and its QoS levels, or without
    /// `cgroupsPerQOS` directly in `cgroupRoot`.
    pub pods: PodCgroupLayout,
    /// `podPidsLimit`; -1 means none.
    pub pod_pids_limit: i64,
    /// Node allocatable memory enforced on the pods' cgroup (`enforceNodeAllocatable: [pods]`
    /// with reservations): capacity minus kube and system reserved. `None` leaves it unlimited.
    pub allocatable_memory: Option<i64>,
    /// `cpuCFSQuota` and `cpuCFSQuotaPeriod`, for the pods' CPU quota.
    pub cfs_quota: CfsQuota,
    /// The node's huge page sizes in bytes: each gets a hugetlb limit in every pod cgroup.
    pub hugepage_sizes: Vec<u64>,
    /// `qosReserved` for memory (feature gate `QOSReserved`): the lower QoS levels' memory
    /// limits keep this share of the higher levels' requests free.
    pub qos_memory_reserve: Option<QosMemoryReserve>,
}

/// `qosReserved: {memory: <percent>%}` and what it is taken from: the node's allocatable memory
/// as upstream enforces it (`GetNodeAllocatableAbsolute`: capacity less the reservations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QosMemoryReserve {
    pub percent: i64,
    pub allocatable: i64,
}

impl QosMemoryReserve {
    /// Upstream `setMemoryReserve`: the Burstable level gets the allocatable memory less the
    /// reserved share of the Guaranteed pods' requests, the BestEffort level the Burstable
    /// limit less the reserved share of the Burstable pods' requests.
    pub fn limits(&self, guaranteed: i64, burstable: i64) -> (i64, i64) {
        let share = |requests: i64| requests.saturating_mul(self.percent) / 100;
        let burstable_limit = self.allocatable.saturating_sub(share(guaranteed));
        (
            burstable_limit,
            burstable_limit.saturating_sub(share(burstable)),
        )
    }
}

impl Default for PodCgroupConfig {
    fn default() -> Self {
        PodCgroupConfig {
            pods: PodCgroupLayout::with_kubepods("kubepods", true),
            pod_pids_limit: -1,
            allocatable_memory: None,
            cfs_quota: CfsQuota::default(),
            hugepage_sizes: Vec::new(),
            qos_memory_reserve: None,
        }
    }
}

/// How often the Burstable level's weight is rewritten from the active pods even when their
/// requests did not change (upstream's `periodicQOSCgroupUpdateInterval`): it repairs what
/// something else wrote there.
pub const QOS_REPAIR_PERIOD: Duration = Duration::from_secs(60);

/// The Burstable pods' CPU requests behind the burstable level's weight.
#[derive(Debug, Default)]
struct BurstableCpu {
    /// Millis (overhead included) by pod UID.
    requests: BTreeMap<String, i64>,
    /// The shares last written, `None` before the first write.
    written: Option<u64>,
    /// When the level was last rewritten from the whole set of active pods.
    repaired: Option<Instant>,
    /// With `qosReserved`: the memory requests (overhead included) of the Guaranteed and
    /// Burstable pods, by pod UID, and the (Burstable, BestEffort) limits last written.
    memory: BTreeMap<String, (QosClass, i64)>,
    memory_written: Option<(i64, i64)>,
}

impl BurstableCpu {
    /// The levels' memory limits for the tracked requests.
    fn memory_limits(&self, reserve: &QosMemoryReserve) -> (i64, i64) {
        let sum = |class: QosClass| {
            self.memory
                .values()
                .filter(|(c, _)| *c == class)
                .fold(0i64, |s, (_, r)| s.saturating_add(*r))
        };
        reserve.limits(sum(QosClass::Guaranteed), sum(QosClass::Burstable))
    }
}

pub struct PodCgroups {
    config: PodCgroupConfig,
    layout: CgroupLayout,
    pods: PodCgroupLayout,
    /// The slices' manager with the systemd driver; `None` writes the cgroups directly.
    systemd: Option<SystemdSlices>,
    /// Held across the write, so that concurrent pod syncs write the sums in the order they
    /// computed them.
    burstable: tokio::sync::Mutex<BurstableCpu>,
}

impl PodCgroups {
    /// With the cgroupfs driver.
    pub fn new(config: PodCgroupConfig, layout: CgroupLayout) -> Self {
        let pods = config.pods.clone();
        PodCgroups {
            config,
            layout,
            pods,
            systemd: None,
            burstable: tokio::sync::Mutex::new(BurstableCpu::default()),
        }
    }

    /// With the systemd driver: every pod cgroup a slice made through `slices`.
    pub fn with_systemd(
        config: PodCgroupConfig,
        layout: CgroupLayout,
        slices: SystemdSlices,
    ) -> Self {
        PodCgroups {
            systemd: Some(slices),
            ..PodCgroups::new(config, layout)
        }
    }

    /// Creates `kubepods`, `kubepods/burstable` and `kubepods/besteffort` (idempotent).
    pub async fn ensure_qos_hierarchy(&self) -> Result<(), CgroupError> {
        match &self.systemd {
            Some(slices) => self.ensure_qos_slices(slices).await,
            None => self.ensure_qos_dirs(),
        }
    }

    /// The QoS levels as slices (upstream's `qosContainerManagerImpl.Start` through the
    /// systemd cgroup manager): kubepods carries node allocatable, besteffort the least weight.
    async fn ensure_qos_slices(&self, slices: &SystemdSlices) -> Result<(), CgroupError> {
        if !self.pods.per_qos() {
            let parent = self.pods.pods_parent();
            if !parent.is_empty() {
                slices
                    .ensure_slice(&parent, &SliceResources::default())
                    .await?;
            }
            return Ok(());
        }
        let best_effort = self.pods.qos_dir(QosClass::BestEffort);
        let kubepods = self.pods.kubepods();
        for path in self.pods.qos_dirs() {
            let resources = SliceResources {
                cpu_shares: (path == best_effort).then_some(MIN_SHARES as u64),
                memory_bytes: self.config.allocatable_memory.filter(|_| path == kubepods),
                ..SliceResources::default()
            };
            slices.ensure_slice(&path, &resources).await?;
        }
        Ok(())
    }

    fn ensure_qos_dirs(&self) -> Result<(), CgroupError> {
        if !self.pods.per_qos() {
            // Pods go straight into `cgroupRoot`, made here unless it is the root itself.
            let parent = self.pods.pods_parent();
            if !parent.is_empty() {
                self.create(&parent)?;
            }
            return Ok(());
        }
        let best_effort = self.pods.qos_dir(QosClass::BestEffort);
        for path in self.pods.qos_dirs() {
            let cg = self.create(&path)?;
            if path == best_effort {
                self.set_shares(&path, &cg, MIN_SHARES as u64)?;
            }
            if path == self.pods.kubepods()
                && let Some(limit) = self.config.allocatable_memory
            {
                let mem: &MemController =
                    cg.controller_of().ok_or_else(|| missing(&path, "memory"))?;
                set(&path, mem.set_limit(limit))?;
            }
        }
        Ok(())
    }

    /// The pod's cgroup relative to the root, e.g. `kubepods/burstable/pod<uid>`.
    pub fn pod_path(&self, pod: &Pod) -> Result<String, CgroupError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        Ok(self.pods.pod_dir(self.class_of(pod)?, uid))
    }

    /// The pod's QoS class where its cgroup depends on it. Without QoS cgroups the class does
    /// not matter, so a spec it cannot be computed from is no error here.
    fn class_of(&self, pod: &Pod) -> Result<QosClass, CgroupError> {
        if !self.pods.per_qos() {
            return Ok(QosClass::BestEffort);
        }
        pod_qos(pod).map_err(|source| CgroupError::Qos {
            pod: pod.metadata.uid.clone().unwrap_or_default(),
            source,
        })
    }

    /// The sandbox's `cgroup_parent` (cgroupfs driver: an absolute cgroup path; systemd: the
    /// pod slice's unit name).
    pub fn cgroup_parent(&self, pod: &Pod) -> Result<String, CgroupError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        Ok(self.pods.cgroup_parent(self.class_of(pod)?, uid))
    }

    /// Creates the pod's cgroup with its pod-level limits (idempotent; limits are rewritten),
    /// after the Burstable level's weight has taken the pod's request in (upstream `SyncPod`
    /// calls `UpdateQOSCgroups` before `EnsureExists`, so the level grows before the pod runs).
    pub async fn ensure_pod(&self, pod: &Pod) -> Result<(), CgroupError> {
        if !self.pods.per_qos() {
            return Ok(());
        }
        let path = self.pod_path(pod)?;
        let bad = |source| CgroupError::Limits {
            pod: path.clone(),
            source,
        };
        let request = burstable_cpu_request(pod).map_err(bad)?;
        let memory = memory_request(pod).map_err(bad)?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.track_burstable(&uid, request).await?;
        self.track_memory(&uid, memory).await?;
        let limits = PodLimits::of(pod, &self.config.cfs_quota).map_err(bad)?;
        match &self.systemd {
            Some(slices) => {
                let resources = SliceResources {
                    cpu_shares: Some(limits.cpu_shares),
                    cpu_quota_us: limits.cpu_quota_us,
                    cpu_period_us: limits.cpu_period_us,
                    memory_bytes: limits.memory_bytes,
                    pids_max: (self.config.pod_pids_limit > 0)
                        .then_some(self.config.pod_pids_limit),
                };
                slices.ensure_slice(&path, &resources).await?;
            }
            None => self.write_pod_dir(&path, &limits)?,
        }
        // systemd has no hugetlb property: written directly under either driver, as runc's
        // systemd manager leaves the controllers systemd does not know to its fs manager.
        self.write_hugetlb(&path, &limits.hugepages)
    }

    /// Upstream `HugePageLimit` of the pod's `ResourceConfig`: each size the node has gets
    /// the pod's request of it, 0 where it requests none. Nothing on a node whose kernel has
    /// no hugetlb controller (nor without huge pages).
    fn write_hugetlb(&self, path: &str, requested: &BTreeMap<u64, i64>) -> Result<(), CgroupError> {
        if self.config.hugepage_sizes.is_empty() {
            return Ok(());
        }
        let (dir, suffix) = match &self.layout {
            CgroupLayout::Unified { root } => {
                // What the parents delegate to the pod (systemd does not delegate hugetlb to
                // its slices).
                if !has_controller(&root.join(path), "hugetlb") {
                    return Ok(());
                }
                (root.join(path), "max")
            }
            // Only a mounted hierarchy: the layout names `<v1 root>/hugetlb` whether or not
            // the controller is mounted there, and on the cgroup tmpfs a directory would just
            // be made.
            other => match other.v1_controller("hugetlb") {
                Some(mount) if mount.join("cgroup.procs").exists() => {
                    (mount.join(path), "limit_in_bytes")
                }
                _ => return Ok(()),
            },
        };
        let failed = |file: &std::path::Path, e: std::io::Error| CgroupError::Cgroup {
            path: file.display().to_string(),
            reason: e.to_string(),
        };
        // The runtime makes the path in every v1 hierarchy only for the containers, later.
        std::fs::create_dir_all(&dir).map_err(|e| failed(&dir, e))?;
        for size in &self.config.hugepage_sizes {
            let Some(unit) = super::hugepages::unit_size(*size) else {
                continue;
            };
            let file = dir.join(format!("hugetlb.{unit}.{suffix}"));
            let limit = requested.get(size).copied().unwrap_or(0).max(0);
            std::fs::write(&file, limit.to_string()).map_err(|e| failed(&file, e))?;
        }
        Ok(())
    }

    /// Records pod `uid`'s share of the Burstable level (`None`: none) and writes the level's
    /// weight when the sum changed.
    async fn track_burstable(&self, uid: &str, request: Option<i64>) -> Result<(), CgroupError> {
        let mut burstable = self.burstable.lock().await;
        match request {
            Some(millis) => burstable.requests.insert(uid.to_owned(), millis),
            None => burstable.requests.remove(uid),
        };
        let shares = burstable_shares(burstable.requests.values().copied());
        if burstable.written != Some(shares) {
            self.write_burstable(shares).await?;
            burstable.written = Some(shares);
        }
        Ok(())
    }

    /// Records pod `uid`'s memory request at its level (`None`: none) and, with `qosReserved`,
    /// writes the levels' memory limits when they changed.
    async fn track_memory(
        &self,
        uid: &str,
        request: Option<(QosClass, i64)>,
    ) -> Result<(), CgroupError> {
        let Some(reserve) = self.config.qos_memory_reserve else {
            return Ok(());
        };
        let mut levels = self.burstable.lock().await;
        match request {
            Some(request) => levels.memory.insert(uid.to_owned(), request),
            None => levels.memory.remove(uid),
        };
        let limits = levels.memory_limits(&reserve);
        if levels.memory_written != Some(limits) {
            levels.memory_written = None;
            self.write_memory_reserve(limits).await?;
            levels.memory_written = Some(limits);
        }
        Ok(())
    }

    /// Limits the Burstable and BestEffort levels' memory (upstream `UpdateCgroups` with
    /// `QOSReserved`). A level already using more than its new limit cannot take it (cgroup v1
    /// refuses; v2 would reclaim hard): it is limited to its usage instead, which stops its
    /// growth (upstream `retrySetMemoryReserve`).
    async fn write_memory_reserve(
        &self,
        (burstable, best_effort): (i64, i64),
    ) -> Result<(), CgroupError> {
        for (class, limit) in [
            (QosClass::Burstable, burstable),
            (QosClass::BestEffort, best_effort),
        ] {
            let path = self.pods.qos_dir(class);
            let limit = limit.max(0);
            match &self.systemd {
                Some(slices) => {
                    let resources = SliceResources {
                        memory_bytes: Some(limit),
                        ..SliceResources::default()
                    };
                    slices.ensure_slice(&path, &resources).await?;
                }
                None => {
                    let cg = self.create(&path)?;
                    let mem: &MemController =
                        cg.controller_of().ok_or_else(|| missing(&path, "memory"))?;
                    if mem.set_limit(limit).is_err() {
                        let usage =
                            i64::try_from(mem.memory_stat().usage_in_bytes).unwrap_or(i64::MAX);
                        tracing::warn!(level = %path, limit, usage, "the QoS level uses more memory than qosReserved leaves it: limited to its usage");
                        set(&path, mem.set_limit(usage.max(limit)))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Upstream `UpdateCgroups` on its period: the Burstable level's weight recomputed from the
    /// active pods (admitted and not terminated), written when it changed or when
    /// [`QOS_REPAIR_PERIOD`] has passed since the last rewrite. A pod whose spec cannot be read
    /// counts nothing (its sync reports why).
    pub async fn update_qos_cgroups(
        &self,
        active: &[&Pod],
        now: Instant,
    ) -> Result<(), CgroupError> {
        if !self.pods.per_qos() {
            return Ok(());
        }
        let requests: BTreeMap<String, i64> = active
            .iter()
            .filter_map(|pod| {
                let millis = burstable_cpu_request(pod).ok().flatten()?;
                Some((pod.metadata.uid.clone().unwrap_or_default(), millis))
            })
            .collect();
        let memory: BTreeMap<String, (QosClass, i64)> = active
            .iter()
            .filter_map(|pod| {
                let request = memory_request(pod).ok().flatten()?;
                Some((pod.metadata.uid.clone().unwrap_or_default(), request))
            })
            .collect();
        let mut burstable = self.burstable.lock().await;
        let shares = burstable_shares(requests.values().copied());
        burstable.requests = requests;
        burstable.memory = memory;
        let due = burstable
            .repaired
            .is_none_or(|at| now.saturating_duration_since(at) >= QOS_REPAIR_PERIOD);
        if due || burstable.written != Some(shares) {
            // Marked first: a failing write is retried on the next period, not every call.
            burstable.repaired = Some(now);
            burstable.written = None;
            self.write_burstable(shares).await?;
            burstable.written = Some(shares);
        }
        if let Some(reserve) = self.config.qos_memory_reserve {
            let limits = burstable.memory_limits(&reserve);
            if due || burstable.memory_written != Some(limits) {
                burstable.memory_written = None;
                self.write_memory_reserve(limits).await?;
                burstable.memory_written = Some(limits);
            }
        }
        Ok(())
    }

    /// Sets the Burstable level's CPU weight (shares on cgroup v1).
    async fn write_burstable(&self, shares: u64) -> Result<(), CgroupError> {
        let path = self.pods.qos_dir(QosClass::Burstable);
        match &self.systemd {
            Some(slices) => {
                let resources = SliceResources {
                    cpu_shares: Some(shares),
                    ..SliceResources::default()
                };
                Ok(slices.ensure_slice(&path, &resources).await?)
            }
            None => {
                let cg = self.create(&path)?;
                self.set_shares(&path, &cg, shares)
            }
        }
    }

    /// Writes CPU shares, as `cpu.weight` where the cpu controller is cgroup v2's (cgroups-rs
    /// leaves the conversion to its caller).
    fn set_shares(&self, path: &str, cg: &Cgroup, shares: u64) -> Result<(), CgroupError> {
        let value = if cg.v2() {
            shares_to_weight(shares)
        } else {
            shares
        };
        set(path, cpu(cg)?.set_shares(value))
    }

    fn write_pod_dir(&self, path: &str, limits: &PodLimits) -> Result<(), CgroupError> {
        let cg = self.create(path)?;
        self.set_shares(path, &cg, limits.cpu_shares)?;
        let cpu = cpu(&cg)?;
        if let Some(quota) = limits.cpu_quota_us {
            if cg.v2() {
                set(
                    path,
                    cpu.set_cfs_quota_and_period(Some(quota), limits.cpu_period_us),
                )?;
            } else {
                // v1 checks every write against the children's quota-to-period ratio: the
                // period first, so that a shorter one raises the ratio before the quota
                // lowers it to where the children already are.
                if let Some(period) = limits.cpu_period_us {
                    set(path, cpu.set_cfs_period(period))?;
                }
                set(path, cpu.set_cfs_quota(quota))?;
            }
        }
        if let Some(memory) = limits.memory_bytes {
            let mem: &MemController = cg.controller_of().ok_or_else(|| missing(path, "memory"))?;
            set(path, mem.set_limit(memory))?;
        }
        if self.config.pod_pids_limit > 0 {
            let pids: &PidController = cg.controller_of().ok_or_else(|| missing(path, "pids"))?;
            set(
                path,
                pids.set_pid_max(MaxValue::Value(self.config.pod_pids_limit)),
            )?;
        }
        Ok(())
    }

    /// Removes a pod's cgroup wherever it is (its QoS class may have been computed differently
    /// by an earlier run). Missing cgroups are fine.
    /// The Burstable level's weight drops the pod's request first.
    pub async fn remove_pod(&self, uid: &PodUid) -> Result<(), CgroupError> {
        if self.pods.per_qos() {
            self.track_burstable(&uid.0, None).await?;
            self.track_memory(&uid.0, None).await?;
        }
        for parent in self.pods.pod_parents() {
            // Relative also below an empty parent (`cgroupRoot: /` without QoS cgroups): joined
            // to a mount point, an absolute path would replace it.
            let path = self.pods.pod_dir_in(&parent, &uid.0);
            if let Some(slices) = &self.systemd {
                slices.stop_slice(&path).await?;
                // What systemd does not manage stays behind it: runc's v1 controllers of the
                // containers' scopes (runc's `Destroy` removes those paths after `StopUnit`).
                for root in self.all_hierarchies() {
                    remove_tree(&root.join(&path))?;
                }
                continue;
            }
            let cg = Cgroup::load_with_specified_controllers(
                hierarchies::auto(),
                &path,
                CONTROLLERS.iter().map(|c| (*c).to_owned()).collect(),
            );
            if cg.exists() {
                set(&path, cg.delete())?;
            }
            // The runtime made the same path in every other hierarchy (v1 controllers swiftlet
            // does not write, and cgroup2 on a hybrid layout); each goes with the pod.
            for root in self.other_hierarchies() {
                remove_tree(&root.join(&path))?;
            }
        }
        Ok(())
    }

    /// Mount points of every hierarchy: each v1 one and cgroup2.
    fn all_hierarchies(&self) -> Vec<PathBuf> {
        let (v1_root, unified) = match &self.layout {
            CgroupLayout::Unified { root } => return vec![root.clone()],
            CgroupLayout::Hybrid { unified, v1_root } => (v1_root, Some(unified)),
            CgroupLayout::Legacy { v1_root } => (v1_root, None),
        };
        let mut roots = v1_hierarchies(v1_root);
        if let Some(unified) = unified
            && !roots.contains(unified)
        {
            roots.push(unified.clone());
        }
        roots
    }

    /// Mount points of the hierarchies besides the ones cgroups-rs manages for swiftlet.
    fn other_hierarchies(&self) -> Vec<PathBuf> {
        let (v1_root, unified) = match &self.layout {
            CgroupLayout::Unified { .. } => return Vec::new(),
            CgroupLayout::Hybrid { unified, v1_root } => (v1_root, Some(unified)),
            CgroupLayout::Legacy { v1_root } => (v1_root, None),
        };
        let mut roots: Vec<PathBuf> = v1_hierarchies(v1_root)
            .into_iter()
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                !CONTROLLERS.contains(&name)
            })
            .collect();
        if let Some(unified) = unified
            && !roots.contains(unified)
        {
            roots.push(unified.clone());
        }
        roots
    }

    /// UIDs of the pod cgroups that exist (housekeeping removes those of unknown pods).
    pub fn existing_pods(&self) -> Vec<PodUid> {
        let Some(base) = self.any_mount() else {
            return Vec::new();
        };
        let mut uids = Vec::new();
        for parent in self.pods.pod_parents() {
            let Ok(entries) = std::fs::read_dir(base.join(&parent)) else {
                continue;
            };
            for entry in entries.flatten() {
                uids.extend(
                    self.pods
                        .uid_of_pod_dir_in(&parent, &entry.file_name().to_string_lossy()),
                );
            }
        }
        uids
    }

    /// The pod cgroups on the cgroup2 mount, with the directories below them (the containers'
    /// and the sandbox's); none on a node without cgroup2.
    pub fn cgroup2_pod_dirs(&self) -> Vec<PodCgroupDir> {
        let Ok(root) = self.layout.cgroup2_root() else {
            return Vec::new();
        };
        pressure_targets::pod_dirs(root, &self.pods)
    }

    /// A mount where pod cgroups can be listed: the memory controller's, or cgroup2.
    fn any_mount(&self) -> Option<PathBuf> {
        match &self.layout {
            CgroupLayout::Unified { root } => Some(root.clone()),
            other => other.v1_controller("memory"),
        }
    }

    fn hybrid_unified_dir(&self, path: &str) -> Option<PathBuf> {
        match &self.layout {
            CgroupLayout::Hybrid { unified, .. } => Some(unified.join(path)),
            _ => None,
        }
    }

    fn create(&self, path: &str) -> Result<Cgroup, CgroupError> {
        if matches!(self.layout, CgroupLayout::Unified { .. }) {
            enable_v2_controllers(&self.layout, path)?;
        }
        let cg = Cgroup::new_with_specified_controllers(
            hierarchies::auto(),
            path,
            Some(CONTROLLERS.iter().map(|c| (*c).to_owned()).collect()),
        )
        .map_err(|e| CgroupError::Cgroup {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        if let Some(dir) = self.hybrid_unified_dir(path) {
            std::fs::create_dir_all(&dir).map_err(|e| CgroupError::Cgroup {
                path: dir.display().to_string(),
                reason: e.to_string(),
            })?;
        }
        Ok(cg)
    }
}

/// The v1 hierarchies mounted below `v1_root` (`/sys/fs/cgroup`): its directories that are
/// cgroups.
fn v1_hierarchies(v1_root: &std::path::Path) -> Vec<PathBuf> {
    std::fs::read_dir(v1_root)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").exists())
                .collect()
        })
        .unwrap_or_default()
}

/// On cgroup v2 a child only gets controllers its parents delegate: enable cpu, memory and pids
/// in `cgroup.subtree_control` of the root and of every ancestor of `path`.
fn enable_v2_controllers(layout: &CgroupLayout, path: &str) -> Result<(), CgroupError> {
    let CgroupLayout::Unified { root } = layout else {
        return Ok(());
    };
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    // hugetlb where the kernel has it: a node without huge pages may lack it.
    let mut controllers = CONTROLLERS.to_vec();
    if has_controller(root, "hugetlb") {
        controllers.push("hugetlb");
    }
    let mut dir = root.clone();
    for (i, component) in components.iter().enumerate() {
        let control = dir.join("cgroup.subtree_control");
        let enabled = std::fs::read_to_string(&control).unwrap_or_default();
        for controller in &controllers {
            if !enabled.split_whitespace().any(|c| c == *controller) {
                std::fs::write(&control, format!("+{controller}")).map_err(|e| {
                    CgroupError::Cgroup {
                        path: control.display().to_string(),
                        reason: format!("enabling {controller}: {e}"),
                    }
                })?;
            }
        }
        dir = dir.join(component);
        // The last component is the cgroup itself, which the caller creates.
        if i + 1 < components.len() {
            std::fs::create_dir_all(&dir).map_err(|e| CgroupError::Cgroup {
                path: dir.display().to_string(),
                reason: e.to_string(),
            })?;
        }
    }
    Ok(())
}

/// Whether cgroup2 directory `dir` has `controller` (its `cgroup.controllers`).
fn has_controller(dir: &std::path::Path, controller: &str) -> bool {
    std::fs::read_to_string(dir.join("cgroup.controllers"))
        .is_ok_and(|list| list.split_whitespace().any(|c| c == controller))
}

/// Removes an empty cgroup and the empty cgroups below it, deepest first (a cgroup directory
/// goes with `rmdir` once it has no processes and no children). A missing one is fine.
fn remove_tree(dir: &std::path::Path) -> Result<(), CgroupError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CgroupError::Cgroup {
            path: dir.display().to_string(),
            reason: e.to_string(),
        }),
        _ => Ok(()),
    }
}

fn cpu(cg: &Cgroup) -> Result<&CpuController, CgroupError> {
    cg.controller_of().ok_or_else(|| missing(cg.path(), "cpu"))
}

fn missing(path: &str, controller: &str) -> CgroupError {
    CgroupError::Cgroup {
        path: path.to_owned(),
        reason: format!("the {controller} controller is not available"),
    }
}

fn set(path: &str, result: cgroups_rs::fs::error::Result<()>) -> Result<(), CgroupError> {
    result.map_err(|e| CgroupError::Cgroup {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Why a pod's cgroup values cannot be computed.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    #[error(transparent)]
    Quantity(#[from] QuantityError),
    #[error(transparent)]
    Requests(#[from] RequestError),
    #[error(transparent)]
    Overhead(#[from] OverheadError),
    #[error(transparent)]
    Qos(#[from] QosError),
    #[error(transparent)]
    HugePages(#[from] HugePagesError),
}

/// Pod-level limits as upstream computes them (`ResourceConfigForPod`): CPU shares from the
/// pod's requests, CPU quota and memory limit from its limits where every container declares
/// one, `spec.overhead` added to each (the pod cgroup holds the runtime's overhead processes
/// too, as the scheduler and admission count them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLimits {
    pub cpu_shares: u64,
    /// The CFS quota in µs per [`PodLimits::cpu_period_us`]; -1 (none) with `cpuCFSQuota: false`.
    pub cpu_quota_us: Option<i64>,
    /// The CFS period the quota is for (`cpuCFSQuotaPeriod`), set with the quota.
    pub cpu_period_us: Option<u64>,
    pub memory_bytes: Option<i64>,
    /// Bytes of huge pages by page size: the pod's requests.
    pub hugepages: BTreeMap<u64, i64>,
}

impl PodLimits {
    pub fn of(pod: &Pod, cfs: &CfsQuota) -> Result<PodLimits, LimitsError> {
        let class = pod_qos(pod)?;
        let hugepages = hugepages::pod_requests(pod)?;
        if class == QosClass::BestEffort {
            // Upstream: BestEffort pods get the least weight, whatever their overhead.
            return Ok(PodLimits {
                cpu_shares: MIN_SHARES as u64,
                cpu_quota_us: None,
                cpu_period_us: None,
                memory_bytes: None,
                hugepages,
            });
        }
        let spec = pod.spec.clone().unwrap_or_default();
        let cpu_limits = declared_limit(&spec, "cpu", quantity::cpu_millis)?;
        let memory_limits = declared_limit(&spec, "memory", quantity::memory_bytes)?;
        let (cpu_requests, _) = pod_requests(pod)?;
        let (cpu_overhead, memory_overhead) = pod_overhead(pod)?;
        let has_containers = !spec.containers.is_empty();
        let cpu_limits = cpu_limits.filter(|_| has_containers);
        let quota = |millis: i64| cfs.quota_for(millis).unwrap_or(-1);
        Ok(PodLimits {
            cpu_shares: milli_cpu_to_shares(cpu_requests.saturating_add(cpu_overhead)) as u64,
            cpu_quota_us: cpu_limits.map(|l| quota(l.saturating_add(cpu_overhead))),
            cpu_period_us: cpu_limits.map(|_| cfs.period_us as u64),
            memory_bytes: memory_limits
                .filter(|_| has_containers)
                .map(|l| l.saturating_add(memory_overhead)),
            hugepages,
        })
    }
}

/// The pod's limit of one resource as upstream's `PodLimits` sums it for
/// `ResourceConfigForPod`: the regular containers' and sidecars' limits together, or, if more,
/// what the largest init container needs beside the sidecars started before it. `None` when a
/// container (an init container counted with those sidecars) declares none: the pod then has
/// no limit of it (upstream's `ContainerFn` marking the limit undeclared on a zero).
fn declared_limit(
    spec: &PodSpec,
    resource: &str,
    parse: impl Fn(&str) -> Result<i64, QuantityError>,
) -> Result<Option<i64>, QuantityError> {
    let limit = |c: &Container| -> Result<i64, QuantityError> {
        let value = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(resource));
        Ok(value.map(|q| parse(&q.0)).transpose()?.unwrap_or(0))
    };
    let mut declared = true;
    let mut sum = 0i64;
    for c in &spec.containers {
        let l = limit(c)?;
        declared &= l != 0;
        sum = sum.saturating_add(l);
    }
    let (mut sidecars, mut init_max) = (0i64, 0i64);
    for c in spec.init_containers.iter().flatten() {
        let l = limit(c)?;
        let needs = if crate::pod::spec::is_sidecar(c) {
            sum = sum.saturating_add(l);
            sidecars = sidecars.saturating_add(l);
            sidecars
        } else {
            l.saturating_add(sidecars)
        };
        declared &= needs != 0;
        init_max = init_max.max(needs);
    }
    Ok(declared.then_some(sum.max(init_max)))
}

/// The CPU request a pod adds to its QoS level's weight (upstream `setCPUCgroupConfig`:
/// `PodRequests`, overhead included, of the Burstable pods); `None` for the other classes.
pub fn burstable_cpu_request(pod: &Pod) -> Result<Option<i64>, LimitsError> {
    if pod_qos(pod)? != QosClass::Burstable {
        return Ok(None);
    }
    let (cpu, _) = pod_requests(pod)?;
    let (overhead, _) = pod_overhead(pod)?;
    Ok(Some(cpu.saturating_add(overhead)))
}

/// The memory request (overhead included) a Guaranteed or Burstable pod adds to its level, for
/// `qosReserved` (upstream `getQoSMemoryRequests`); `None` for BestEffort.
pub fn memory_request(pod: &Pod) -> Result<Option<(QosClass, i64)>, LimitsError> {
    let class = pod_qos(pod)?;
    if class == QosClass::BestEffort {
        return Ok(None);
    }
    let (_, memory) = pod_requests(pod)?;
    let (_, overhead) = pod_overhead(pod)?;
    Ok(Some((class, memory.saturating_add(overhead))))
}

/// The Burstable level's CPU shares for the pods' requests (upstream `setCPUCgroupConfig`).
pub fn burstable_shares(requests: impl IntoIterator<Item = i64>) -> u64 {
    let sum = requests.into_iter().fold(0i64, i64::saturating_add);
    milli_cpu_to_shares(sum) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{Container, PodSpec, ResourceRequirements},
        apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
    };

    /// (name, value) pairs of requests, then of limits, per container.
    type Resources<'a> = (&'a [(&'a str, &'a str)], &'a [(&'a str, &'a str)]);

    fn pod(resources: &[Resources<'_>]) -> Pod {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect()
            })
        };
        Pod {
            metadata: ObjectMeta {
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: resources
                    .iter()
                    .enumerate()
                    .map(|(i, (requests, limits))| Container {
                        name: format!("c{i}"),
                        resources: Some(ResourceRequirements {
                            requests: map(requests),
                            limits: map(limits),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn with_overhead(mut pod: Pod, overhead: &[(&str, &str)]) -> Pod {
        if let Some(spec) = pod.spec.as_mut() {
            spec.overhead = Some(
                overhead
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect(),
            );
        }
        pod
    }

    fn limits(pod: &Pod) -> Option<PodLimits> {
        PodLimits::of(pod, &CfsQuota::default()).ok()
    }

    #[test]
    fn pod_limits_sum_containers_and_need_every_container_limited() {
        let guaranteed = pod(&[
            (&[], &[("cpu", "500m"), ("memory", "64Mi")]),
            (&[], &[("cpu", "1"), ("memory", "64Mi")]),
        ]);
        assert_eq!(
            limits(&guaranteed),
            Some(PodLimits {
                cpu_shares: 1536,
                cpu_quota_us: Some(150_000),
                cpu_period_us: Some(100_000),
                memory_bytes: Some(128 << 20),
                hugepages: BTreeMap::new(),
            })
        );
        let partly = pod(&[(&[("cpu", "100m")], &[("memory", "32Mi")]), (&[], &[])]);
        assert_eq!(
            limits(&partly),
            Some(PodLimits {
                cpu_shares: 102,
                cpu_quota_us: None,
                cpu_period_us: None,
                memory_bytes: None,
                hugepages: BTreeMap::new(),
            })
        );
        let best_effort = pod(&[(&[], &[])]);
        assert_eq!(limits(&best_effort).map(|l| l.cpu_shares), Some(2));
    }

    /// Upstream `PodLimits`: an init container's limit counts when it is larger than the
    /// regular containers' sum, with the sidecars started before it; sidecars also join the sum.
    #[test]
    fn init_containers_and_sidecars_count_as_upstreams_pod_limits() {
        let init = |name: &str, sidecar: bool, limits: &[(&str, &str)]| Container {
            name: name.into(),
            restart_policy: sidecar.then(|| "Always".to_owned()),
            resources: Some(ResourceRequirements {
                limits: Some(
                    limits
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let with_init = |inits: Vec<Container>| {
            let mut p = pod(&[(&[], &[("cpu", "1"), ("memory", "64Mi")])]);
            if let Some(spec) = p.spec.as_mut() {
                spec.init_containers = Some(inits);
            }
            limits(&p)
        };
        // A larger init container sets the limits.
        let big = with_init(vec![init("i0", false, &[("cpu", "2"), ("memory", "32Mi")])]);
        assert_eq!(
            big.map(|l| (l.cpu_quota_us, l.memory_bytes)),
            Some((Some(200_000), Some(64 << 20)))
        );
        // A sidecar joins the sum, and the init container after it runs beside it.
        let sidecar = with_init(vec![
            init("s0", true, &[("cpu", "500m"), ("memory", "16Mi")]),
            init("i1", false, &[("cpu", "1"), ("memory", "128Mi")]),
        ]);
        assert_eq!(
            sidecar.map(|l| (l.cpu_quota_us, l.memory_bytes)),
            Some((Some(150_000), Some(144 << 20)))
        );
        // An init container without a memory limit leaves the pod without one.
        let unlimited = with_init(vec![init("i0", false, &[("cpu", "1")])]);
        assert_eq!(
            unlimited.map(|l| (l.cpu_quota_us, l.memory_bytes)),
            Some((Some(100_000), None))
        );
    }

    /// Upstream `setMemoryReserve` with 50%: 10Gi allocatable, 2Gi of Guaranteed and 1Gi of
    /// Burstable requests leave the Burstable level 9Gi and the BestEffort level 8.5Gi.
    #[test]
    fn qos_reserved_limits_the_lower_levels() {
        const GI: i64 = 1 << 30;
        let reserve = QosMemoryReserve {
            percent: 50,
            allocatable: 10 * GI,
        };
        assert_eq!(reserve.limits(2 * GI, GI), (9 * GI, 17 * GI / 2));
        assert_eq!(reserve.limits(0, 0), (10 * GI, 10 * GI));
        let none = QosMemoryReserve {
            percent: 0,
            ..reserve
        };
        assert_eq!(none.limits(2 * GI, GI), (10 * GI, 10 * GI));
        // Hostile sums saturate rather than wrap into a huge limit.
        assert!(reserve.limits(i64::MAX, i64::MAX).1 <= 10 * GI);
        let mut levels = BurstableCpu::default();
        let guaranteed = pod(&[(&[], &[("cpu", "1"), ("memory", "2Gi")])]);
        let burstable = pod(&[(&[("memory", "1Gi")], &[])]);
        let best_effort = pod(&[(&[], &[])]);
        for (uid, p) in [("g", &guaranteed), ("b", &burstable), ("e", &best_effort)] {
            if let Some(request) = memory_request(p).expect("valid") {
                levels.memory.insert(uid.into(), request);
            }
        }
        assert_eq!(levels.memory.len(), 2, "BestEffort requests nothing");
        assert_eq!(levels.memory_limits(&reserve), (9 * GI, 17 * GI / 2));
    }

    #[test]
    fn overhead_is_charged_to_the_pod_cgroup() {
        // ResourceConfigForPod over PodRequests/PodLimits: overhead joins the requests, and
        // the limits where the pod has them.
        let guaranteed = with_overhead(
            pod(&[(&[], &[("cpu", "500m"), ("memory", "64Mi")])]),
            &[("cpu", "250m"), ("memory", "16Mi")],
        );
        assert_eq!(
            limits(&guaranteed),
            Some(PodLimits {
                cpu_shares: 768,
                cpu_quota_us: Some(75_000),
                cpu_period_us: Some(100_000),
                memory_bytes: Some(80 << 20),
                hugepages: BTreeMap::new(),
            })
        );
        // No memory limit on every container: none for the pod, overhead or not.
        let burstable = with_overhead(
            pod(&[(&[("cpu", "100m")], &[("cpu", "200m")]), (&[], &[])]),
            &[("cpu", "100m"), ("memory", "16Mi")],
        );
        assert_eq!(
            limits(&burstable),
            Some(PodLimits {
                cpu_shares: 204,
                cpu_quota_us: None,
                cpu_period_us: None,
                memory_bytes: None,
                hugepages: BTreeMap::new(),
            })
        );
        // BestEffort keeps the least weight whatever its overhead.
        let best_effort = with_overhead(pod(&[(&[], &[])]), &[("cpu", "1")]);
        assert_eq!(limits(&best_effort).map(|l| l.cpu_shares), Some(2));
        let bad = with_overhead(pod(&[(&[("cpu", "1")], &[])]), &[("memory", "lots")]);
        let err = PodLimits::of(&bad, &CfsQuota::default())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("spec.overhead[memory]"), "{err}");
    }

    #[test]
    fn the_cfs_settings_shape_the_pod_quota() {
        let limited = pod(&[(&[], &[("cpu", "500m"), ("memory", "64Mi")])]);
        let short = CfsQuota {
            enforce: true,
            period_us: 50_000,
        };
        let got = PodLimits::of(&limited, &short).ok();
        assert_eq!(
            got.map(|l| (l.cpu_quota_us, l.cpu_period_us)),
            Some((Some(25_000), Some(50_000)))
        );
        // cpuCFSQuota: false: the quota is lifted (-1), not left as it was.
        let off = CfsQuota {
            enforce: false,
            period_us: 100_000,
        };
        let got = PodLimits::of(&limited, &off).ok();
        assert_eq!(
            got.map(|l| (l.cpu_quota_us, l.cpu_shares)),
            Some((Some(-1), 512))
        );
    }

    #[test]
    fn the_burstable_level_weighs_its_pods_requests() {
        let burstable = with_overhead(
            pod(&[(&[("cpu", "100m")], &[]), (&[("cpu", "150m")], &[])]),
            &[("cpu", "50m")],
        );
        let guaranteed = pod(&[(&[], &[("cpu", "1"), ("memory", "1Gi")])]);
        let best_effort = pod(&[(&[], &[])]);
        assert_eq!(burstable_cpu_request(&burstable).ok(), Some(Some(300)));
        assert_eq!(burstable_cpu_request(&guaranteed).ok(), Some(None));
        assert_eq!(burstable_cpu_request(&best_effort).ok(), Some(None));
        // setCPUCgroupConfig: MilliCPUToShares of the sum; no Burstable pods is the minimum.
        assert_eq!(burstable_shares([300, 200]), 512);
        assert_eq!(burstable_shares([]), 2);
        assert_eq!(burstable_shares([i64::MAX, 1]), 262_144);
    }

    #[test]
    fn pod_paths_follow_the_qos_class() {
        let cgroups = PodCgroups::new(
            PodCgroupConfig::default(),
            CgroupLayout::Unified {
                root: "/sys/fs/cgroup".into(),
            },
        );
        let cases = [
            (
                pod(&[(&[], &[("cpu", "1"), ("memory", "1Gi")])]),
                "kubepods/podu1",
            ),
            (pod(&[(&[("cpu", "1")], &[])]), "kubepods/burstable/podu1"),
            (pod(&[(&[], &[])]), "kubepods/besteffort/podu1"),
        ];
        for (p, want) in cases {
            assert_eq!(cgroups.pod_path(&p).ok().as_deref(), Some(want));
        }
        assert_eq!(
            cgroups.cgroup_parent(&cases_last()).ok().as_deref(),
            Some("/kubepods/besteffort/podu1")
        );
    }

    fn cases_last() -> Pod {
        pod(&[(&[], &[])])
    }
}
