//! `/stats/summary`: the node's, the pods' and their containers' CPU, memory, filesystem and
//! pressure figures in the Summary API's shape (`types.rs`), computed at each request from the
//! cgroups (`cgroup.rs`) and `statfs`, on both the full and the read-only server;
//! `/metrics/resource`, metrics-server's series of the same figures (`resource_metrics.rs`); and
//! `/metrics/cadvisor`, cAdvisor's series of the same cgroups (`cadvisor.rs`).
//!
//! The pods are those `/pods` lists; a pod's cgroup is where the pod cgroup manager put it, a
//! container's the directory named by its id below it (the cgroupfs driver's layout). Only
//! running containers are listed. `usageNanoCores` needs an earlier reading: the first summary
//! after a cgroup appears has none, as upstream's cadvisor-less provider.
//!
//! Not here: the numbers eviction decides on (`eviction/observe.rs`, read fresh there). Upstream:
//! `pkg/kubelet/server/stats/handler.go` and `summary.go`, `pkg/kubelet/stats/`.
//! Left out: network (the pods' network namespaces are the CNI's), per-container `rootfs`,
//! volume stats and so the pod's `ephemeral-storage` (only the containers' `logs` are measured),
//! image usage from CRI `ImageFsInfo` (`imageFs.usedBytes` is what the filesystem has in use).

pub mod cadvisor;
pub mod cgroup;
pub mod resource_metrics;
pub mod types;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    Router,
    extract::{Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::Time};

use self::{
    cgroup::{CgroupReader, CpuSampler},
    types::*,
};
use crate::{
    cm::psi::PsiResource,
    eviction::observe::{NodeObserver, dir_bytes},
    kuberuntime::sandbox_config::pod_log_directory,
};

/// The pods to report.
pub type PodLister = Arc<dyn Fn() -> Vec<Pod> + Send + Sync>;
/// A pod's cgroup, relative to the cgroup root.
pub type PodPath = Arc<dyn Fn(&Pod) -> Option<String> + Send + Sync>;
pub use crate::clock::Clock;

pub struct SummaryProvider {
    pub node_name: String,
    /// The pods' log directories' root (`/var/log/pods`), for the containers' `logs`.
    pub log_root: PathBuf,
    /// Where the node's figures are read: layout, the pods' cgroup, capacity, nodefs, imagefs, /proc.
    pub observer: NodeObserver,
    pub pods: PodLister,
    pub pod_path: PodPath,
    pub clock: Clock,
    sampler: CpuSampler,
}

#[derive(Debug, Default, serde::Deserialize)]
pub struct SummaryQuery {
    /// Upstream's `only_cpu_and_memory=true`: the cheap part only.
    #[serde(default)]
    only_cpu_and_memory: Option<String>,
}

pub fn router(provider: Arc<SummaryProvider>) -> Router {
    Router::new()
        .route("/stats/summary", get(summary))
        .route("/stats/summary/", get(summary))
        .route("/metrics/resource", get(resource_metrics))
        .route("/metrics/cadvisor", get(cadvisor_metrics))
        .with_state(provider)
}

async fn summary(
    State(provider): State<Arc<SummaryProvider>>,
    Query(query): Query<SummaryQuery>,
) -> Response {
    let only = query.only_cpu_and_memory.as_deref() == Some("true");
    // Many small file reads: off the async workers.
    match tokio::task::spawn_blocking(move || provider.summary(only)).await {
        Ok(summary) => match serde_json::to_string(&summary) {
            Ok(body) => (
                StatusCode::OK,
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        },
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `/metrics/resource`, from the cheap summary.
async fn resource_metrics(State(provider): State<Arc<SummaryProvider>>) -> Response {
    match tokio::task::spawn_blocking(move || resource_metrics::render(&provider.summary(true)))
        .await
    {
        Ok(text) => (
            StatusCode::OK,
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `/metrics/cadvisor`, read at each scrape off the async workers, as the summary.
async fn cadvisor_metrics(State(provider): State<Arc<SummaryProvider>>) -> Response {
    match tokio::task::spawn_blocking(move || provider.cadvisor()).await {
        Ok(Ok(text)) => (
            StatusCode::OK,
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn time(at: SystemTime) -> Time {
    Time(k8s_openapi::jiff::Timestamp::try_from(at).unwrap_or_default())
}

impl SummaryProvider {
    pub fn new(
        node_name: String,
        log_root: PathBuf,
        observer: NodeObserver,
        pods: PodLister,
        pod_path: PodPath,
        clock: Clock,
    ) -> Self {
        SummaryProvider {
            node_name,
            log_root,
            observer,
            pods,
            pod_path,
            clock,
            sampler: CpuSampler::default(),
        }
    }

    pub fn summary(&self, only_cpu_and_memory: bool) -> Summary {
        let now = (self.clock)();
        let reader = CgroupReader {
            observer: &self.observer,
        };
        let mut node_memory = self.memory("", now, &reader);
        if let Some(memory) = &mut node_memory {
            // The node's available memory is against its capacity, as eviction's.
            let capacity = u64::try_from(self.observer.memory_capacity).unwrap_or(0);
            memory.available_bytes = memory
                .working_set_bytes
                .map(|ws| capacity.saturating_sub(ws));
        }
        let pods_cgroup = self.observer.pods_cgroup.clone();
        let system_containers = vec![ContainerStats {
            name: "pods".into(),
            start_time: time(self.created(&pods_cgroup).unwrap_or(now)),
            cpu: self.cpu(&pods_cgroup, now, &reader),
            memory: self.memory(&pods_cgroup, now, &reader),
            logs: None,
            io: None,
        }];
        let mut node = NodeStats {
            node_name: self.node_name.clone(),
            system_containers,
            start_time: time(self.boot_time().unwrap_or(now)),
            cpu: self.cpu("", now, &reader),
            memory: node_memory,
            fs: None,
            runtime: None,
            rlimit: None,
            io: None,
        };
        if !only_cpu_and_memory {
            node.fs = fs_stats(&self.observer.nodefs, now);
            node.runtime = Some(RuntimeStats {
                image_fs: fs_stats(&self.observer.imagefs, now),
            });
            node.rlimit = Some(self.rlimit(now));
            node.io = io(&reader, "", now);
        }

        let mut seen = vec![String::new(), pods_cgroup];
        let mut pods = Vec::new();
        for pod in (self.pods)() {
            let Some(path) = (self.pod_path)(&pod) else {
                continue;
            };
            if !self.observer.memory_dir(&path).is_some_and(|d| d.exists()) {
                continue;
            }
            let log_dir = pod_log_directory(&self.log_root, &pod);
            let containers = running_containers(&pod)
                .into_iter()
                .map(|running| {
                    let Running {
                        name, id, started, ..
                    } = running;
                    let cgroup = self.observer.container_cgroup(&path, &id);
                    let logs = (!only_cpu_and_memory)
                        .then(|| self.logs(&log_dir.join(&name), now))
                        .flatten();
                    let stats = ContainerStats {
                        start_time: time(started.unwrap_or(now)),
                        cpu: self.cpu(&cgroup, now, &reader),
                        memory: self.memory(&cgroup, now, &reader),
                        logs,
                        io: io(&reader, &cgroup, now),
                        name,
                    };
                    seen.push(cgroup);
                    stats
                })
                .collect();
            let meta = &pod.metadata;
            let start = pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .map(|t| SystemTime::from(t.0));
            pods.push(PodStats {
                pod_ref: PodReference {
                    name: meta.name.clone().unwrap_or_default(),
                    namespace: meta.namespace.clone().unwrap_or_default(),
                    uid: meta.uid.clone().unwrap_or_default(),
                },
                start_time: time(start.unwrap_or(now)),
                containers,
                cpu: self.cpu(&path, now, &reader),
                memory: self.memory(&path, now, &reader),
                ephemeral_storage: None,
                process_stats: (!only_cpu_and_memory).then(|| ProcessStats {
                    process_count: reader.pids(&path),
                }),
                io: io(&reader, &path, now),
            });
            seen.push(path);
        }
        // Readings of cgroups gone are dropped, so the sampler stays as big as the node.
        self.sampler.retain(&|key| seen.iter().any(|s| s == key));
        Summary { node, pods }
    }

    fn cpu(&self, path: &str, now: SystemTime, reader: &CgroupReader) -> Option<CpuStats> {
        let usage = reader.cpu_usage_ns(path)?;
        Some(CpuStats {
            time: time(now),
            usage_nano_cores: self.sampler.nano_cores(path, now, usage),
            usage_core_nano_seconds: Some(usage),
            psi: psi(reader, path, PsiResource::Cpu),
        })
    }

    fn memory(&self, path: &str, now: SystemTime, reader: &CgroupReader) -> Option<MemoryStats> {
        let m = reader.memory(path)?;
        Some(MemoryStats {
            time: time(now),
            available_bytes: m
                .limit
                .zip(m.working_set)
                .map(|(limit, ws)| limit.saturating_sub(ws)),
            usage_bytes: m.usage,
            working_set_bytes: m.working_set,
            rss_bytes: m.rss,
            page_faults: m.page_faults,
            major_page_faults: m.major_page_faults,
            psi: psi(reader, path, PsiResource::Memory),
        })
    }

    /// A container's logs: the bytes of its log directory on the filesystem holding it.
    fn logs(&self, dir: &Path, now: SystemTime) -> Option<FsStats> {
        let mut fs =
            fs_stats(&self.log_root, now).or_else(|| fs_stats(&self.observer.nodefs, now))?;
        let used = u64::try_from(dir_bytes(dir)).unwrap_or(0);
        fs.used_bytes = Some(used);
        // Upstream counts the inodes of the log files too; the directory walk gives bytes only.
        fs.inodes_used = None;
        Some(fs)
    }

    fn rlimit(&self, now: SystemTime) -> RlimitStats {
        let read = |p: &str| std::fs::read_to_string(self.observer.proc.join(p)).ok();
        let maxpid = read("sys/kernel/pid_max").and_then(|s| s.trim().parse().ok());
        // "0.00 0.01 0.05 1/123 4567": the kernel's count of tasks, as sysinfo's procs.
        let curproc = read("loadavg")
            .and_then(|s| s.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok());
        RlimitStats {
            time: time(now),
            maxpid,
            curproc,
        }
    }

    /// The boot time (`btime` of /proc/stat): when the node's counters started.
    fn boot_time(&self) -> Option<SystemTime> {
        let stat = std::fs::read_to_string(self.observer.proc.join("stat")).ok()?;
        let secs: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(UNIX_EPOCH + Duration::from_secs(secs))
    }

    fn created(&self, path: &str) -> Option<SystemTime> {
        std::fs::metadata(self.observer.memory_dir(path)?)
            .and_then(|m| m.created().or_else(|_| m.modified()))
            .ok()
    }
}

/// A running container as its pod's status tells it.
struct Running {
    name: String,
    /// The runtime's id, without the `containerd://` scheme: its cgroup's name.
    id: String,
    image: String,
    started: Option<SystemTime>,
}

/// Each running container with an id fit to name a directory: the id is joined to the pod's
/// cgroup, so one with a `/` or a dot-name (never a runtime's) is left out rather than read.
fn running_containers(pod: &Pod) -> Vec<Running> {
    let Some(statuses) = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
    else {
        return Vec::new();
    };
    statuses
        .iter()
        .filter_map(|s| {
            let running = s.state.as_ref()?.running.as_ref()?;
            let id = s.container_id.as_deref()?;
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            if id.is_empty() || id == "." || id == ".." || id.contains('/') {
                return None;
            }
            Some(Running {
                name: s.name.clone(),
                id: id.to_owned(),
                image: s.image.clone(),
                started: running.started_at.as_ref().map(|t| SystemTime::from(t.0)),
            })
        })
        .collect()
}

fn psi(reader: &CgroupReader, path: &str, resource: PsiResource) -> Option<PsiStats> {
    let psi = reader.psi(path, resource)?;
    let data = |l: crate::cm::psi::PsiLine| PsiData {
        total: l.total_us,
        avg10: l.avg10,
        avg60: l.avg60,
        avg300: l.avg300,
    };
    Some(PsiStats {
        some: data(psi.some),
        full: psi.full.map(data).unwrap_or_default(),
    })
}

fn io(reader: &CgroupReader, path: &str, now: SystemTime) -> Option<IoStats> {
    psi(reader, path, PsiResource::Io).map(|psi| IoStats {
        time: time(now),
        psi: Some(psi),
    })
}

/// A filesystem's figures from `statvfs`.
fn fs_stats(path: &Path, now: SystemTime) -> Option<FsStats> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    let frsize = s.fragment_size();
    let (inodes, inodes_free) = (s.files(), s.files_free());
    Some(FsStats {
        time: time(now),
        available_bytes: Some(s.blocks_available() * frsize),
        capacity_bytes: Some(s.blocks() * frsize),
        used_bytes: Some(s.blocks().saturating_sub(s.blocks_free()) * frsize),
        // Filesystems without a fixed inode table (btrfs) report none.
        inodes_free: (inodes > 0).then_some(inodes_free),
        inodes: (inodes > 0).then_some(inodes),
        inodes_used: (inodes > 0).then(|| inodes.saturating_sub(inodes_free)),
    })
}

#[cfg(test)]
mod tests;
