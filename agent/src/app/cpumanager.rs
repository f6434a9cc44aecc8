//! Building the CPU manager under `cpuManagerPolicy: static`: the node's topology, the reserved
//! CPUs, the restored checkpoint, the scheduler audit programs (loaded only here, so the `none`
//! policy costs nothing in the scheduler), the metrics, and the hooks the runtime manager calls
//! around container creation.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Error;
use crate::{
    cm::{
        CgroupLayout,
        cpumanager::{
            ApplyMode, CpuManager, CpuManagerOptions, CpuSet, OnBadCheckpoint, StaticPolicy,
            Topology, audit::AuditMaps, manager::CgroupIdOf, metrics::CpuManagerMetrics,
            metrics::SchedCollector, reserved_cpus,
        },
    },
    config::{Config, CpuApply, CpuManagerPolicy},
    container::PodUid,
    cri::RuntimeService,
    kernel::{LoadOptions, SchedAudit},
    kuberuntime::ContainerLifecycle,
    metrics::Metrics,
};

/// The CPU manager, or `None` under the `none` policy.
pub fn start(
    config: &Config,
    metrics: &Metrics,
    runtime: Arc<dyn RuntimeService>,
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
) -> Result<Option<Arc<CpuManager>>, Error> {
    let settings = &config.cpu_manager;
    if settings.policy == CpuManagerPolicy::None {
        return Ok(None);
    }
    let fail = |e: &dyn std::fmt::Display| Error::CpuManager(e.to_string());
    let topology = Topology::discover(Path::new("/sys")).map_err(|e| fail(&e))?;
    let reserved = match &settings.reserved_system_cpus {
        Some(cpus) => cpus.clone(),
        None => {
            let millis = u64::try_from(config.reserved.cpu_millis()).unwrap_or(0);
            reserved_cpus(&topology, millis).map_err(|e| fail(&e))?
        }
    };
    let policy = StaticPolicy::new(topology, reserved, settings.options).map_err(|e| fail(&e))?;

    let defaults = LoadOptions::default();
    let audit: Option<Arc<dyn AuditMaps>> = match SchedAudit::load(&defaults.btf) {
        Ok(audit) => Some(Arc::new(audit)),
        Err(e) => {
            tracing::warn!(error = %e, hint = e.hint().unwrap_or_default(), "the scheduler audit of exclusive CPUs is unavailable: exclusivity is enforced but not measured");
            None
        }
    };
    let cgroup2 = CgroupLayout::detect()
        .ok()
        .and_then(|l| l.cgroup2_root().ok().map(Path::to_path_buf));
    let manager = CpuManager::new(
        policy,
        runtime,
        CpuManagerMetrics::register(&metrics.registry)?,
        CpuManagerOptions {
            root_dir: config.root_dir.clone(),
            mode: match settings.apply {
                CpuApply::Events => ApplyMode::Events,
                CpuApply::Reconcile => ApplyMode::ReconcileOnly,
            },
            reconcile_period: settings.reconcile_period,
            on_bad_checkpoint: if settings.reset_state {
                OnBadCheckpoint::SetAside
            } else {
                OnBadCheckpoint::Refuse
            },
            cgroup_id_of: cgroup_id_of(
                cgroup2,
                crate::cm::pod_cgroups::kubepods_path(&config.cgroup_root),
            ),
            audit,
        },
    )
    .map_err(|e| fail(&e))?;
    let manager = Arc::new(manager);
    metrics
        .registry
        .register(Box::new(SchedCollector::new(&manager)?))?;
    tasks.spawn({
        let manager = manager.clone();
        let shutdown = shutdown.clone();
        async move {
            manager.run(shutdown).await;
            Ok(())
        }
    });
    Ok(Some(manager))
}

/// A container's cgroup2 directory is `<kubepods>/<qos>/pod<uid>/<container id>` (cgroupfs
/// driver); its inode number is the id the kernel programs see.
fn cgroup_id_of(cgroup2: Option<PathBuf>, kubepods: String) -> CgroupIdOf {
    Arc::new(move |pod: &PodUid, container_id: &str| {
        let root = cgroup2.as_ref()?.join(&kubepods);
        ["", "burstable", "besteffort"].iter().find_map(|qos| {
            let dir = root.join(qos).join(format!("pod{pod}")).join(container_id);
            crate::kernel::cgroup_id_of(&dir).ok()
        })
    })
}

/// The runtime manager's hooks: the create request carries the container's cpuset, and the
/// manager learns the container's id before it starts.
pub struct CpuLifecycle(pub Arc<CpuManager>);

impl ContainerLifecycle for CpuLifecycle {
    fn pre_create(
        &self,
        pod: &Pod,
        container: &Container,
        resources: &mut cri::LinuxContainerResources,
    ) {
        let cpus = self.0.cpuset_for(pod, container);
        if !cpus.is_empty() {
            resources.cpuset_cpus = cpus.to_string();
        }
    }

    fn pre_start(
        &self,
        pod: &Pod,
        container: &Container,
        container_id: &str,
        resources: &cri::LinuxContainerResources,
    ) {
        let cpus = CpuSet::parse(&resources.cpuset_cpus).unwrap_or_default();
        self.0.container_created(pod, container, container_id, cpus);
    }
}
