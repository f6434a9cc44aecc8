//! Fresh figures at the moment of a decision, read straight from the kernel (never a cached
//! summary: upstream k/k#51745 woke on a memcg event and decided on 10 s old stats).
//!
//! - `memory.available` = capacity − working set of the root, where working set = usage −
//!   inactive file: on a v1 memory controller the root's `memory.usage_in_bytes` and
//!   `total_inactive_file`; on cgroup v2, which has no root `memory.current`, `/proc/meminfo`
//!   (MemTotal − MemFree − Inactive(file)), as runc's cgroup v2 root stats do.
//! - `allocatableMemory.available` = allocatable − working set of the pods' cgroup.
//! - `nodefs.*` from `statvfs` of the root dir; `imagefs.*` from `statvfs` of the runtime's image
//!   filesystem (its mountpoint from CRI `ImageFsInfo`, else the same as nodefs).
//! - `pid.available` = min(`pid_max`, `threads-max`) − the tasks running (`/proc/loadavg`).
//! - PSI signals from the pods' cgroup's `*.pressure`.
//!
//! Not here: what is done with them (`logic.rs`, `manager.rs`). Upstream:
//! `pkg/kubelet/eviction/helpers.go` `makeSignalObservations` over the Summary API.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::api::core::v1::Pod;

use super::{
    logic::{Observation, Observations, PSI_CAPACITY},
    rank::{PodUsage, UsageByPod},
    thresholds::{PsiSignalResource, PsiWindow, Signal},
};
use crate::{
    cgroup::PodCgroupLayout,
    cm::{
        CgroupLayout,
        psi::{Psi, PsiResource},
    },
    pod_workers::pod_uid,
};

/// Where the node's figures are read from.
#[derive(Clone, Debug)]
pub struct NodeObserver {
    pub layout: CgroupLayout,
    /// The cgroup all pods are below, relative to the cgroup root: `kubepods`, or `cgroupRoot`
    /// without `cgroupsPerQOS` (upstream `GetPodCgroupRoot`).
    pub pods_cgroup: String,
    /// How container cgroups are named below a pod's: the container's id with cgroupfs, the
    /// runtime's scope (`cri-containerd-<id>.scope`) with systemd.
    pub pod_cgroups: PodCgroupLayout,
    pub memory_capacity: i64,
    /// Memory capacity minus kube and system reservations (what the pods' cgroup may use).
    pub allocatable_memory: i64,
    /// The filesystem of `nodefs` (the root dir).
    pub nodefs: PathBuf,
    /// The filesystem of `imagefs`.
    pub imagefs: PathBuf,
    pub proc: PathBuf,
    /// The PSI signals some threshold uses (only those are read).
    pub psi: Vec<Signal>,
}

impl NodeObserver {
    /// The memory controller's directory of a cgroup (`path` relative to the root, "" for it).
    pub fn memory_dir(&self, path: &str) -> Option<PathBuf> {
        match &self.layout {
            CgroupLayout::Unified { root } => Some(root.join(path)),
            other => other.v1_controller("memory").map(|d| d.join(path)),
        }
    }

    /// The cgroup of container `id` below its pod's cgroup `pod_path` (relative to the root):
    /// the first of the driver's names that exists, else the first.
    pub fn container_cgroup(&self, pod_path: &str, id: &str) -> String {
        let names = self.pod_cgroups.container_dir_names(id);
        let path = |name: &String| format!("{pod_path}/{name}");
        names
            .iter()
            .map(path)
            .find(|p| self.memory_dir(p).is_some_and(|d| d.is_dir()))
            .or_else(|| names.first().map(path))
            .unwrap_or_else(|| format!("{pod_path}/{id}"))
    }

    fn cgroup2_dir(&self, path: &str) -> Option<PathBuf> {
        self.layout.cgroup2_root().ok().map(|r| r.join(path))
    }

    /// The working set of a cgroup: usage minus inactive file.
    pub fn working_set(&self, path: &str) -> Option<i64> {
        let dir = self.memory_dir(path)?;
        let v1 = !matches!(self.layout, CgroupLayout::Unified { .. });
        if !v1 && path.is_empty() {
            return self.root_working_set_from_meminfo();
        }
        let (usage_file, inactive_key) = if v1 {
            ("memory.usage_in_bytes", "total_inactive_file")
        } else {
            ("memory.current", "inactive_file")
        };
        let usage: i64 = read_trimmed(&dir.join(usage_file))?.parse().ok()?;
        let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
        let inactive = stat_value(&stat, inactive_key).unwrap_or(0);
        Some((usage - inactive).max(0))
    }

    fn root_working_set_from_meminfo(&self) -> Option<i64> {
        let text = std::fs::read_to_string(self.proc.join("meminfo")).ok()?;
        let kib = |key: &str| {
            text.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<i64>().ok())
                .map(|v| v * 1024)
        };
        let usage = kib("MemTotal:")? - kib("MemFree:")?;
        Some((usage - kib("Inactive(file):").unwrap_or(0)).max(0))
    }

    /// Every signal that can be read now. A figure that cannot be read is left out (its
    /// thresholds are then not met), and logged.
    pub fn observe(&self) -> Observations {
        let mut out = Observations::new();
        match self.working_set("") {
            Some(ws) => {
                out.insert(
                    Signal::MemoryAvailable,
                    Observation {
                        available: self.memory_capacity - ws,
                        capacity: self.memory_capacity,
                    },
                );
            }
            None => tracing::debug!("eviction: the node's memory working set is unreadable"),
        }
        if let Some(ws) = self.working_set(&self.pods_cgroup) {
            out.insert(
                Signal::AllocatableMemoryAvailable,
                Observation {
                    available: self.allocatable_memory - ws,
                    capacity: self.allocatable_memory,
                },
            );
        }
        for (path, bytes, inodes) in [
            (
                &self.nodefs,
                Signal::NodeFsAvailable,
                Signal::NodeFsInodesFree,
            ),
            (
                &self.imagefs,
                Signal::ImageFsAvailable,
                Signal::ImageFsInodesFree,
            ),
        ] {
            match nix::sys::statvfs::statvfs(path.as_path()) {
                Ok(s) => {
                    let frsize = s.fragment_size() as i64;
                    out.insert(
                        bytes,
                        Observation {
                            available: s.blocks_available() as i64 * frsize,
                            capacity: s.blocks() as i64 * frsize,
                        },
                    );
                    // Filesystems without a fixed inode table (btrfs) report 0 files.
                    if s.files() > 0 {
                        out.insert(
                            inodes,
                            Observation {
                                available: s.files_free() as i64,
                                capacity: s.files() as i64,
                            },
                        );
                    }
                }
                Err(e) => tracing::debug!(path = %path.display(), error = %e, "eviction: statvfs"),
            }
        }
        if let Some(o) = self.pids() {
            out.insert(Signal::PidAvailable, o);
        }
        for signal in &self.psi {
            let Signal::Pressure(p) = signal else {
                continue;
            };
            let resource = match p.resource {
                PsiSignalResource::Memory => PsiResource::Memory,
                PsiSignalResource::Io => PsiResource::Io,
            };
            let Some(dir) = self.cgroup2_dir(&self.pods_cgroup) else {
                continue;
            };
            let Ok(psi) = Psi::read_cgroup(&dir, resource) else {
                continue;
            };
            let line = if p.full { psi.full } else { Some(psi.some) };
            let Some(line) = line else {
                continue;
            };
            let avg = match p.window {
                PsiWindow::Avg10 => line.avg10,
                PsiWindow::Avg60 => line.avg60,
                PsiWindow::Avg300 => line.avg300,
            };
            out.insert(
                *signal,
                Observation {
                    available: (avg * 100.0).round() as i64,
                    capacity: PSI_CAPACITY,
                },
            );
        }
        out
    }

    fn pids(&self) -> Option<Observation> {
        let read = |name: &str| -> Option<i64> {
            read_trimmed(&self.proc.join("sys/kernel").join(name))?
                .parse()
                .ok()
        };
        let capacity = match (read("pid_max"), read("threads-max")) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        // "0.00 0.01 0.05 1/123 4567": runnable/total scheduling entities.
        let loadavg = read_trimmed(&self.proc.join("loadavg"))?;
        let total: i64 = loadavg
            .split_whitespace()
            .nth(3)?
            .split_once('/')?
            .1
            .parse()
            .ok()?;
        Some(Observation {
            available: capacity - total,
            capacity,
        })
    }

    /// What each pod uses, for ranking: `paths` gives each pod's cgroup (relative to the root)
    /// and `names` maps container ids to names.
    pub fn pod_usage(
        &self,
        pods: &[Arc<Pod>],
        path_of: &dyn Fn(&Pod) -> Option<String>,
        container_names: &dyn Fn(&Pod) -> HashMap<String, String>,
        log_root: &Path,
    ) -> UsageByPod {
        let mut out = UsageByPod::new();
        for pod in pods {
            let Some(path) = path_of(pod) else {
                continue;
            };
            let names = container_names(pod);
            let mut containers = Vec::new();
            if let Some(dir) = self.memory_dir(&path)
                && let Ok(entries) = std::fs::read_dir(&dir)
            {
                for entry in entries.flatten() {
                    // The directory is named by the driver: the id itself, or a scope.
                    let dir_name = entry.file_name().to_string_lossy().into_owned();
                    let Some(id) = self.pod_cgroups.container_id_of_dir(&dir_name) else {
                        continue;
                    };
                    if let Some(name) = names.get(&id)
                        && let Some(ws) = self.working_set(&format!("{path}/{dir_name}"))
                    {
                        containers.push((name.clone(), ws));
                    }
                }
            }
            containers.sort();
            let processes = self.pids_of(&path);
            let meta = &pod.metadata;
            let log_dir = log_root.join(format!(
                "{}_{}_{}",
                meta.namespace.as_deref().unwrap_or("default"),
                meta.name.as_deref().unwrap_or_default(),
                meta.uid.as_deref().unwrap_or_default()
            ));
            out.insert(
                pod_uid(pod),
                PodUsage {
                    memory_working_set: self.working_set(&path),
                    containers,
                    processes,
                    disk_bytes: Some(dir_bytes(&log_dir)),
                },
            );
        }
        out
    }

    fn pids_of(&self, path: &str) -> Option<i64> {
        let dir = match &self.layout {
            CgroupLayout::Unified { root } => root.join(path),
            other => other.v1_controller("pids")?.join(path),
        };
        read_trimmed(&dir.join("pids.current"))?.parse().ok()
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// A key's value in a `memory.stat` text.
pub fn stat_value(stat: &str, key: &str) -> Option<i64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Bytes of the regular files below `dir` (0 when it does not exist).
pub fn dir_bytes(dir: &Path) -> i64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len() as i64),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn reads_working_sets_on_cgroup_v2_and_meminfo() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("cgroup");
        let proc = dir.path().join("proc");
        write(
            &proc.join("meminfo"),
            "MemTotal:       1048576 kB\nMemFree:         262144 kB\nInactive(file):  131072 kB\n",
        );
        write(&proc.join("sys/kernel/pid_max"), "4194304\n");
        write(&proc.join("sys/kernel/threads-max"), "1000\n");
        write(&proc.join("loadavg"), "0.00 0.01 0.05 2/150 4567\n");
        write(&root.join("kubepods/memory.current"), "314572800\n");
        write(
            &root.join("kubepods/memory.stat"),
            "anon 1\ninactive_file 104857600\nactive_file 5\n",
        );
        write(
            &root.join("kubepods/memory.pressure"),
            "some avg10=42.50 avg60=1.00 avg300=0.00 total=10\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        );
        let psi = Signal::Pressure(crate::eviction::thresholds::PsiSignal {
            resource: PsiSignalResource::Memory,
            full: false,
            window: PsiWindow::Avg10,
        });
        let o = NodeObserver {
            layout: CgroupLayout::Unified { root },
            pods_cgroup: "kubepods".into(),
            pod_cgroups: PodCgroupLayout::new(Path::new("/"), true),
            memory_capacity: 1 << 30,
            allocatable_memory: 512 << 20,
            nodefs: dir.path().to_owned(),
            imagefs: dir.path().to_owned(),
            proc,
            psi: vec![psi],
        }
        .observe();
        const MI: i64 = 1 << 20;
        // (1024 − 256 − 128) MiB working set of 1 GiB.
        assert_eq!(
            o[&Signal::MemoryAvailable],
            Observation {
                available: 384 * MI,
                capacity: 1024 * MI
            }
        );
        // 300 MiB used, 100 MiB of it inactive file: 200 MiB of 512 MiB.
        assert_eq!(
            o[&Signal::AllocatableMemoryAvailable],
            Observation {
                available: 312 * MI,
                capacity: 512 * MI
            }
        );
        assert_eq!(
            o[&Signal::PidAvailable],
            Observation {
                available: 850,
                capacity: 1000
            }
        );
        assert_eq!(
            o[&psi],
            Observation {
                available: 4250,
                capacity: PSI_CAPACITY
            }
        );
        assert!(o[&Signal::NodeFsAvailable].capacity > 0);
    }

    /// With the systemd driver a container's cgroup is the runtime's scope below the pod's
    /// slice: the eviction message's per-container usage must find it there.
    #[test]
    fn container_usage_is_found_under_either_driver() {
        use crate::cgroup::pods::CgroupDriver;
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "hog", "namespace": "default", "uid": "u-1"},
        }))
        .expect("a pod");
        let pods = vec![Arc::new(pod)];
        for (driver, pod_path, dir) in [
            (CgroupDriver::Cgroupfs, "kubepods/besteffort/podu-1", "c1"),
            (
                CgroupDriver::Systemd,
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu_1.slice",
                "cri-containerd-c1.scope",
            ),
        ] {
            let tmp = tempfile::tempdir().expect("tempdir");
            let root = tmp.path().join("cgroup");
            let container = root.join(pod_path).join(dir);
            write(&container.join("memory.current"), "300\n");
            write(&container.join("memory.stat"), "inactive_file 100\n");
            let observer = NodeObserver {
                layout: CgroupLayout::Unified { root },
                pods_cgroup: "kubepods".into(),
                pod_cgroups: PodCgroupLayout::for_driver(driver, Path::new("/"), true),
                memory_capacity: 1 << 30,
                allocatable_memory: 512 << 20,
                nodefs: tmp.path().to_owned(),
                imagefs: tmp.path().to_owned(),
                proc: tmp.path().join("proc"),
                psi: Vec::new(),
            };
            let usage = observer.pod_usage(
                &pods,
                &|_| Some(pod_path.to_owned()),
                &|_| HashMap::from([("c1".to_owned(), "main".to_owned())]),
                tmp.path(),
            );
            let containers = usage.values().next().map(|u| u.containers.clone());
            assert_eq!(containers, Some(vec![("main".to_owned(), 200)]), "{driver}");
            assert_eq!(
                observer.container_cgroup(pod_path, "c1"),
                format!("{pod_path}/{dir}"),
                "{driver}"
            );
        }
    }

    #[test]
    fn memory_stat_values() {
        assert_eq!(
            stat_value("cache 1\ntotal_inactive_file 42\n", "total_inactive_file"),
            Some(42)
        );
        assert_eq!(stat_value("inactive_file_x 1\n", "inactive_file"), None);
    }
}
