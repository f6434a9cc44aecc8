//! The QoS cgroup hierarchy and per-pod cgroups (upstream `pkg/kubelet/cm`
//! `qos_container_manager_linux.go`, `pod_container_manager_linux.go`) at the paths
//! `cgroup::pods` defines for the configured driver (`kubepods[/burstable|/besteffort]/pod<uid>`,
//! or systemd's nested `kubepods.slice/...`); the besteffort level gets cpu shares 2.
//!
//! Pod cgroups carry the pod-level limits (CPU shares from requests, CPU quota and memory limit
//! when every container sets one, pids.max from `podPidsLimit`); the runtime creates the
//! container cgroups below them (the sandbox's `cgroup_parent`).
//!
//! Two ways to make them, as upstream's `cgroupManagerImpl` has: with cgroupfs they are written
//! through cgroups-rs for the cpu, memory and pids controllers (on a hybrid layout the same paths
//! are also made on the cgroup2 mount, where the kernel event programs watch them); with
//! systemd they are transient slices started, limited and stopped through systemd
//! (`cm::systemd::SystemdSlices`), which makes and removes the directories itself — writing
//! them behind its back would be undone at its next reload. Either way a removed pod's
//! directories are gone from every hierarchy afterwards.

use std::path::PathBuf;

use cgroups_rs::fs::{
    Cgroup, MaxValue, cpu::CpuController, hierarchies, memory::MemController, pid::PidController,
};
use k8s_openapi::api::core::v1::Pod;

use super::{
    CgroupLayout,
    pressure_targets::{self, PodCgroupDir},
    qos::{QosClass, QosError, pod_qos},
    quantity::{self, QuantityError},
    systemd::{SliceResources, SystemdError, SystemdSlices},
};
use crate::{cgroup::PodCgroupLayout, container::PodUid};

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
        source: QuantityError,
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
}

impl Default for PodCgroupConfig {
    fn default() -> Self {
        PodCgroupConfig {
            pods: PodCgroupLayout::with_kubepods("kubepods", true),
            pod_pids_limit: -1,
            allocatable_memory: None,
        }
    }
}

pub struct PodCgroups {
    config: PodCgroupConfig,
    layout: CgroupLayout,
    pods: PodCgroupLayout,
    /// The slices' manager with the systemd driver; `None` writes the cgroups directly.
    systemd: Option<SystemdSlices>,
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
                cpu_shares: (path == best_effort).then_some(2),
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
                set(&path, cpu(&cg)?.set_shares(2))?;
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

    /// Creates the pod's cgroup with its pod-level limits (idempotent; limits are rewritten).
    pub async fn ensure_pod(&self, pod: &Pod) -> Result<(), CgroupError> {
        if !self.pods.per_qos() {
            return Ok(());
        }
        let path = self.pod_path(pod)?;
        let limits = PodLimits::of(pod).map_err(|source| CgroupError::Limits {
            pod: path.clone(),
            source,
        })?;
        match &self.systemd {
            Some(slices) => {
                let resources = SliceResources {
                    cpu_shares: Some(limits.cpu_shares),
                    cpu_quota_us: limits.cpu_quota_us,
                    memory_bytes: limits.memory_bytes,
                    pids_max: (self.config.pod_pids_limit > 0)
                        .then_some(self.config.pod_pids_limit),
                };
                Ok(slices.ensure_slice(&path, &resources).await?)
            }
            None => self.write_pod_dir(&path, &limits),
        }
    }

    fn write_pod_dir(&self, path: &str, limits: &PodLimits) -> Result<(), CgroupError> {
        let cg = self.create(path)?;
        let cpu = cpu(&cg)?;
        set(path, cpu.set_shares(limits.cpu_shares))?;
        if let Some(quota) = limits.cpu_quota_us {
            set(
                path,
                cpu.set_cfs_quota_and_period(Some(quota), Some(100_000)),
            )?;
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
    pub async fn remove_pod(&self, uid: &PodUid) -> Result<(), CgroupError> {
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
    let mut dir = root.clone();
    for (i, component) in components.iter().enumerate() {
        let control = dir.join("cgroup.subtree_control");
        let enabled = std::fs::read_to_string(&control).unwrap_or_default();
        for controller in CONTROLLERS {
            if !enabled.split_whitespace().any(|c| c == controller) {
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

/// Pod-level limits as upstream computes them (`ResourceConfigForPod`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLimits {
    pub cpu_shares: u64,
    pub cpu_quota_us: Option<i64>,
    pub memory_bytes: Option<i64>,
}

impl PodLimits {
    pub fn of(pod: &Pod) -> Result<PodLimits, QuantityError> {
        let spec = pod.spec.clone().unwrap_or_default();
        let (mut cpu_requests, mut cpu_limits, mut memory_limits) = (0i64, 0i64, 0i64);
        let (mut all_cpu_limited, mut all_memory_limited) = (true, true);
        for c in &spec.containers {
            let r = c.resources.clone().unwrap_or_default();
            let get = |m: &Option<
                std::collections::BTreeMap<
                    String,
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity,
                >,
            >,
                       k: &str| {
                m.as_ref().and_then(|m| m.get(k)).map(|q| q.0.clone())
            };
            let cpu_limit = get(&r.limits, "cpu")
                .map(|q| quantity::cpu_millis(&q))
                .transpose()?;
            let cpu_request = get(&r.requests, "cpu")
                .map(|q| quantity::cpu_millis(&q))
                .transpose()?
                .or(cpu_limit);
            let memory_limit = get(&r.limits, "memory")
                .map(|q| quantity::memory_bytes(&q))
                .transpose()?;
            cpu_requests += cpu_request.unwrap_or(0);
            match cpu_limit {
                Some(l) => cpu_limits += l,
                None => all_cpu_limited = false,
            }
            match memory_limit {
                Some(l) => memory_limits += l,
                None => all_memory_limited = false,
            }
        }
        let has_containers = !spec.containers.is_empty();
        Ok(PodLimits {
            cpu_shares: super::helpers::milli_cpu_to_shares(cpu_requests) as u64,
            cpu_quota_us: (has_containers && all_cpu_limited)
                .then(|| super::helpers::milli_cpu_to_quota(cpu_limits)),
            memory_bytes: (has_containers && all_memory_limited).then_some(memory_limits),
        })
    }
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

    #[test]
    fn pod_limits_sum_containers_and_need_every_container_limited() {
        let guaranteed = pod(&[
            (&[], &[("cpu", "500m"), ("memory", "64Mi")]),
            (&[], &[("cpu", "1"), ("memory", "64Mi")]),
        ]);
        assert_eq!(
            PodLimits::of(&guaranteed),
            Ok(PodLimits {
                cpu_shares: 1536,
                cpu_quota_us: Some(150_000),
                memory_bytes: Some(128 << 20)
            })
        );
        let partly = pod(&[(&[("cpu", "100m")], &[("memory", "32Mi")]), (&[], &[])]);
        assert_eq!(
            PodLimits::of(&partly),
            Ok(PodLimits {
                cpu_shares: 102,
                cpu_quota_us: None,
                memory_bytes: None
            })
        );
        let best_effort = pod(&[(&[], &[])]);
        assert_eq!(PodLimits::of(&best_effort).map(|l| l.cpu_shares), Ok(2));
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
