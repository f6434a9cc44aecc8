//! Building the eviction manager: where its figures come from on this node, how it evicts
//! (through the kubelet's pod workers), and what wakes it (the kernel programs on the event bus,
//! PSI triggers, memory cgroup notifications, the pods' memory level on cgroup v2), each as asked
//! by `evictionWakeups`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use k8s_openapi::api::core::v1::Pod;
use tokio::{sync::broadcast, task::JoinSet};

use super::{Error, pods::App};
use crate::{
    cm::{CgroupLayout, pod_cgroups::PodCgroups},
    config::Config,
    cri::{ImageService, RuntimeService},
    eviction::{
        EvictionManager, EvictionMetrics, Sources, local_storage, observe::NodeObserver,
        thresholds::Signal, wakeups,
    },
    kernel::{MemcgTrigger, StreamItem},
    kubelet::{Kubelet, KubeletEvictor},
    kuberuntime::manager::KubeRuntimeManager,
    pleg::PodCache,
    pod_workers::pod_uid,
};

/// What the eviction manager is built from, besides the app's shared parts.
pub struct EvictionParts<'a> {
    pub memory_capacity: i64,
    pub kubelet: &'a Arc<Kubelet>,
    pub cgroups: &'a Arc<PodCgroups>,
    pub cache: Arc<PodCache>,
    pub runtime: &'a Arc<KubeRuntimeManager>,
    /// The CRI client, for the containers' writable layers.
    pub cri: Arc<dyn RuntimeService>,
    pub images: &'a dyn ImageService,
    /// The kernel programs' events, when they run.
    pub kernel: Option<broadcast::Receiver<Arc<StreamItem>>>,
    /// The kernel's memory cgroup level trigger, when attached.
    pub memcg_trigger: Option<MemcgTrigger>,
}

pub async fn start(
    app: &mut App<'_>,
    parts: EvictionParts<'_>,
) -> Result<Arc<EvictionManager>, Error> {
    let EvictionParts {
        memory_capacity,
        kubelet,
        cgroups,
        cache,
        runtime,
        cri,
        images,
        kernel,
        memcg_trigger,
    } = parts;
    let App {
        config,
        metrics,
        health,
        ref mut tasks,
        shutdown,
        api: _,
    } = *app;
    let layout = CgroupLayout::detect().map_err(|e| Error::Cgroups(e.to_string()))?;
    let (nodefs, imagefs) = node_filesystems(config, images).await;
    let eviction = &config.eviction;
    let observer = NodeObserver {
        layout,
        pods_cgroup: config.pod_cgroups().pods_parent().to_owned(),
        pod_cgroups: config.pod_cgroups(),
        memory_capacity,
        allocatable_memory: memory_capacity - config.reserved.memory_bytes(),
        nodefs,
        imagefs,
        proc: PathBuf::from("/proc"),
        psi: eviction
            .thresholds
            .iter()
            .map(|t| t.signal)
            .filter(|s| matches!(s, Signal::Pressure(_)))
            .collect(),
    };
    // Upstream counts a container's writable layer against its ephemeral-storage limit only
    // where the images share the node's filesystem (no dedicated imagefs).
    let count_rootfs = same_filesystem(&observer.nodefs, &observer.imagefs);
    let mut sources = sources(config, kubelet, cgroups, cache, runtime, &observer);
    sources.container_storage = Box::new({
        let log_root = config.logs.pod_logs_dir.clone();
        move |pods: Vec<Arc<Pod>>| {
            let cri = cri.clone();
            let log_root = log_root.clone();
            Box::pin(async move {
                local_storage::measure_containers(cri.as_ref(), &pods, &log_root, count_rootfs)
                    .await
            })
        }
    });
    let (manager, waker, wakes) = EvictionManager::new(
        eviction.clone(),
        sources,
        EvictionMetrics::register(&metrics.registry)?,
    );
    kubelet.set_pressure(manager.conditions());

    let mut wake_tasks = JoinSet::new();
    let mut woken_by = vec![format!("every {:?}", eviction.monitoring_period)];
    if eviction.wakeups.level || eviction.wakeups.poll {
        woken_by.extend(wakeups::spawn_level(
            observer.clone(),
            eviction.thresholds.clone(),
            manager.observations(),
            wakeups::LevelInputs {
                level: eviction.wakeups.level,
                poll: eviction.wakeups.poll,
                trigger: memcg_trigger,
                events: kernel.as_ref().map(|rx| rx.resubscribe()),
            },
            waker.clone(),
            &mut wake_tasks,
            shutdown.clone(),
        ));
    }
    if eviction.wakeups.kernel {
        match kernel {
            Some(events) => {
                wakeups::spawn_kernel(events, waker.clone(), &mut wake_tasks, shutdown.clone());
                woken_by.push("kernel OOM kills and reclaim".into());
            }
            None => health.set_note(
                "eviction",
                "kernel events unavailable: no OOM or reclaim wake-ups".into(),
            ),
        }
    }
    if eviction.wakeups.psi {
        woken_by.extend(wakeups::spawn_psi(
            &observer,
            &waker,
            &mut wake_tasks,
            shutdown,
        ));
    }
    if eviction.wakeups.memcg
        && let Some(what) = wakeups::spawn_memcg(
            observer,
            eviction.thresholds.clone(),
            manager.observations(),
            waker,
            &mut wake_tasks,
            shutdown.clone(),
        )
    {
        woken_by.push(what);
    }
    tracing::info!(
        thresholds = ?eviction.thresholds.iter().map(|t| t.text.clone()).collect::<Vec<_>>(),
        woken_by = ?woken_by,
        "eviction manager"
    );
    tasks.spawn({
        let manager = manager.clone();
        let shutdown = shutdown.clone();
        async move {
            manager.run(wakes, shutdown).await;
            // The wake-up tasks end with the token; wait for them so none outlives the agent.
            while wake_tasks.join_next().await.is_some() {}
            Ok(())
        }
    });
    Ok(manager)
}

/// Where the eviction manager's figures come from and how it acts: the node observer, the
/// kubelet's active pods and pod workers, the runtime's GC, the volume manager's emptyDirs.
fn sources(
    config: &Config,
    kubelet: &Arc<Kubelet>,
    cgroups: &Arc<PodCgroups>,
    cache: Arc<PodCache>,
    runtime: &Arc<KubeRuntimeManager>,
    observer: &NodeObserver,
) -> Sources {
    Sources {
        observe: Box::new({
            let observer = observer.clone();
            move || observer.observe()
        }),
        active_pods: Box::new({
            let kubelet = kubelet.clone();
            move || kubelet.pods_for_eviction()
        }),
        pod_usage: Box::new({
            let observer = observer.clone();
            let cgroups = cgroups.clone();
            // The pods' logs, measured for disk ranking.
            let log_root = config.logs.pod_logs_dir.clone();
            move |pods: &[Arc<Pod>]| {
                observer.pod_usage(
                    pods,
                    &|pod| cgroups.pod_path(pod).ok(),
                    &|pod| container_names(&cache, pod),
                    &log_root,
                )
            }
        }),
        reclaim_disk: Box::new({
            let runtime = runtime.clone();
            move || runtime.gc(SystemTime::now())
        }),
        empty_dir_usage: Box::new({
            let volumes = kubelet.volume_manager();
            move |pod: &Pod| {
                volumes
                    .empty_dir_usage(&crate::pod_workers::pod_uid(pod))
                    .into_iter()
                    .map(|u| (u.volume, u.bytes))
                    .collect()
            }
        }),
        // Set by `start`, which holds the CRI client.
        container_storage: Box::new(|_| Box::pin(async { HashMap::new() })),
        evictor: Arc::new(KubeletEvictor(kubelet.clone())),
    }
}

/// Whether two paths are on one filesystem (the same device); unknown counts as the same, as
/// a node without a separate image filesystem is the common case.
fn same_filesystem(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => true,
    }
}

/// Container ids of the pod to their names, from the PLEG cache.
fn container_names(cache: &PodCache, pod: &Pod) -> HashMap<String, String> {
    cache
        .get(&pod_uid(pod))
        .status
        .map(|s| {
            s.containers
                .iter()
                .map(|c| (c.id.id.clone(), c.name.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// `path`, or its nearest existing ancestor (the root dir may not exist yet).
/// `nodefs` (the root dir's filesystem) and `imagefs` (the runtime's image filesystem, as it
/// reports it; the root dir's when it does not say).
pub(super) async fn node_filesystems(
    config: &Config,
    images: &dyn ImageService,
) -> (PathBuf, PathBuf) {
    let nodefs = existing_ancestor(&config.root_dir);
    let imagefs = match images.image_fs_info().await {
        Ok(info) => info
            .image_filesystems
            .iter()
            .find_map(|fs| fs.fs_id.as_ref().map(|id| PathBuf::from(&id.mountpoint)))
            .filter(|p| p.exists())
            .unwrap_or_else(|| nodefs.clone()),
        Err(e) => {
            tracing::warn!(error = %e, "the runtime's image filesystem is unknown: imagefs figures read the root dir's");
            nodefs.clone()
        }
    };
    (nodefs, imagefs)
}

fn existing_ancestor(path: &Path) -> PathBuf {
    path.ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"))
        .to_owned()
}
