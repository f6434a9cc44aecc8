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
    cgroup::PodCgroupLayout,
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
            cgroup_id_of: cgroup_id_of(cgroup2, &config.pod_cgroups()),
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

/// A container's cgroup2 directory is below its pod's in one of the pod parents, named as the
/// driver names it (`cgroup::pods`); its inode number is the id the kernel programs see.
fn cgroup_id_of(cgroup2: Option<PathBuf>, pods: &PodCgroupLayout) -> CgroupIdOf {
    let pods = pods.clone();
    Arc::new(move |pod: &PodUid, container_id: &str| {
        let root = cgroup2.as_ref()?;
        let names = pods.container_dir_names(container_id);
        pods.pod_parents().iter().find_map(|parent| {
            let dir = root.join(pods.pod_dir_in(parent, &pod.0));
            names
                .iter()
                .find_map(|name| crate::kernel::cgroup_id_of(&dir.join(name)).ok())
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

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    /// Where cgroup2 is mounted (`/sys/fs/cgroup`, or `unified` below it on a hybrid host).
    fn cgroup2_mount() -> Option<PathBuf> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        mounts
            .lines()
            .filter(|l| l.contains(" - cgroup2 "))
            .find_map(|l| l.split(' ').nth(4).map(PathBuf::from))
    }

    /// The id of a container's cgroup is found where the layout puts pods: in `cgroupRoot`
    /// itself without `cgroupsPerQOS`, in a QoS level with it, and not across the two.
    #[test]
    fn container_cgroup_ids_follow_the_pod_layout() {
        let test = "container_cgroup_ids_follow_the_pod_layout";
        if !crate::testing::privileged(test, "make cgroups") {
            return;
        }
        let Some(mount) = cgroup2_mount() else {
            panic!("{test}: no cgroup2 mount on this host");
        };
        let root = format!("swiftlet-unit-ids-{}", std::process::id());
        let flat = mount.join(&root).join("poduid-a").join("c1");
        let qos = mount.join(&root).join("kubepods/burstable/poduid-b/c2");
        for dir in [&flat, &qos] {
            std::fs::create_dir_all(dir).expect("make the cgroups");
        }
        let id = |dir: &Path| crate::kernel::cgroup_id_of(dir).expect("a cgroup id");
        let without_qos = cgroup_id_of(
            Some(mount.clone()),
            &PodCgroupLayout::new(Path::new(&format!("/{root}")), false),
        );
        let with_qos = cgroup_id_of(
            Some(mount.clone()),
            &PodCgroupLayout::new(Path::new(&format!("/{root}")), true),
        );
        let expected = [Some(id(&flat)), None, Some(id(&qos)), None];
        let found = [
            without_qos(&PodUid::from("uid-a"), "c1"),
            without_qos(&PodUid::from("uid-b"), "c2"),
            with_qos(&PodUid::from("uid-b"), "c2"),
            with_qos(&PodUid::from("uid-a"), "c1"),
        ];
        for dir in [
            qos.clone(),
            mount.join(&root).join("kubepods/burstable/poduid-b"),
            mount.join(&root).join("kubepods/burstable"),
            mount.join(&root).join("kubepods"),
            flat.clone(),
            mount.join(&root).join("poduid-a"),
            mount.join(&root),
        ] {
            let _ = std::fs::remove_dir(dir);
        }
        assert_eq!(found, expected);
        assert_ne!(expected[0], expected[2]);
    }
}
