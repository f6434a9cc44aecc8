//! Building the pod half of the agent: the CRI client, cgroups, runtime manager, PLEG, pod workers,
//! the kubelet core and its sources, each task spawned into the app's task set.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use tokio::{sync::broadcast, task::JoinSet};
use tokio_util::sync::CancellationToken;

use super::{Error, node::NodeFacts};
use crate::{
    cm::{
        CgroupLayout,
        pod_cgroups::{PodCgroupConfig, PodCgroups},
    },
    config::Config,
    cri::{GrpcRuntime, GrpcRuntimeConfig, RuntimeMetrics, RuntimeService},
    kernel::StreamItem,
    kubelet::{
        Kubelet,
        admission::NodeCapacity,
        metrics::KubeletMetrics,
        pod_manager::PodManager,
        security_admission::{AppArmorHost, SecurityAdmission},
        sync_loop,
        syncer::KubeletSyncer,
        sysctl::{Allowlist, parse_kernel_release},
    },
    kuberuntime::{
        manager::{KubeRuntimeManager, RuntimeManagerConfig},
        security_context::SecurityOptions,
        userns::UsernsManager,
    },
    metrics::Metrics,
    pleg::{
        Health as PlegHealth, Pleg, PlegConfig, PublishedEvent,
        ebpf::{self, EbpfPleg, EbpfPlegMetrics},
        relist::{PlegMetrics, RelistPleg},
    },
    pod_workers::{OnSynced, PodWorkers, WorkerConfig},
    prober::{ProbeManager, metrics::ProberMetrics},
    server::Health,
    sources::{
        ApiServerOptions, ApiServerSource, ImagesCheck, LocalNode, NodeDescription, PodConfig,
        PressureCheck, ReadinessCheck, Source, StaticPodOptions, StaticPodSource, WallClock,
        client_from_kubeconfig, go_arch, os_image,
    },
    status::{ReasonCache, StatusManager},
    volume::{
        KubeObjects, NodeResources, PodDirs, VolumeManager, VolumeManagerConfig, VolumeMetrics,
        default_wait_budget,
    },
};

/// What the rest of the app needs from the pod half.
pub struct Pods {
    pub status: Arc<StatusManager>,
    /// The Node object, for `/node`.
    pub node: Arc<LocalNode>,
    /// `/pods` annotations of the CPU manager, under the static policy.
    pub annotate: Option<crate::server::http::Annotator>,
    pub evictions: broadcast::Sender<crate::eviction::manager::Decision>,
    /// The CRI client, for the kubelet server's streaming and the Summary API.
    pub runtime: Arc<GrpcRuntime>,
    /// What `/containerLogs` reads.
    pub logs: crate::server::logs::LogsState,
}

/// How the pod half learns of container changes.
pub enum PlegSource {
    /// Relisting the runtime every `period`.
    Relist { period: Duration },
    /// Kernel events from `events`, with a relist every `period` as the safety net.
    Kernel {
        events: broadcast::Receiver<Arc<StreamItem>>,
        cgroup2_root: PathBuf,
        period: Duration,
    },
}

/// The `kubepods` cgroup hierarchy, made before anything else needs it (the kernel programs
/// watch it from their first event).
pub fn cgroups(config: &Config) -> Result<Arc<PodCgroups>, Error> {
    let layout = CgroupLayout::detect().map_err(|e| Error::Cgroups(e.to_string()))?;
    let reserved = config.reserved.memory_bytes();
    let allocatable_memory = match super::node::NodeFacts::memory_total() {
        // As upstream: the pods' cgroup is limited to allocatable whenever `pods` is enforced
        // (to the whole capacity without reservations, which also undoes a stale limit).
        Some(total) if config.reserved.enforce_pods => {
            if reserved >= total {
                return Err(Error::Cgroups(format!(
                    "kubeReserved + systemReserved memory ({reserved} bytes) is not below the                      node's memory ({total} bytes): nothing would be left for pods"
                )));
            }
            Some(total - reserved)
        }
        _ => None,
    };
    let cgroups = Arc::new(PodCgroups::new(
        PodCgroupConfig {
            per_qos: config.cgroups_per_qos,
            root: kubepods_path(config),
            pod_pids_limit: config.pod_pids_limit,
            allocatable_memory,
        },
        layout,
    ));
    cgroups
        .ensure_qos_hierarchy()
        .map_err(|e| Error::Cgroups(e.to_string()))?;
    Ok(cgroups)
}

/// `kubepods` below `cgroupRoot`, relative to the cgroup root.
pub fn kubepods_path(config: &Config) -> String {
    config
        .cgroup_root
        .join("kubepods")
        .strip_prefix("/")
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "kubepods".into())
}

#[expect(
    clippy::too_many_arguments,
    reason = "the composition root hands every part in"
)]
pub async fn start(
    config: &Config,
    metrics: &Metrics,
    health: &Health,
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
    cgroups: Arc<PodCgroups>,
    source: PlegSource,
    published: broadcast::Sender<Arc<PublishedEvent>>,
    kernel_bus: Option<broadcast::Receiver<Arc<StreamItem>>>,
) -> Result<Pods, Error> {
    let node = NodeFacts::detect();
    let runtime = GrpcRuntime::connect(
        GrpcRuntimeConfig {
            endpoint: config.container_runtime_endpoint.clone(),
            request_timeout: config.runtime_request_timeout,
            pull_image_timeout: None,
        },
        RuntimeMetrics::register(&metrics.registry)?,
    )
    .await
    .map_err(Error::Runtime)?;
    let runtime = Arc::new(runtime);
    let runtime_name = runtime.runtime_name().to_owned();
    let runtime_version = format!(
        "{}://{}",
        runtime.version_info().runtime_name,
        runtime.version_info().runtime_version
    );
    tracing::info!(
        endpoint = config.container_runtime_endpoint,
        runtime = runtime_name,
        "connected to the container runtime"
    );

    // The runtime's features decide admission from the first pod on: asked once now, then kept
    // current by the runtime health check.
    let features = match runtime.status().await {
        Ok(status) => Some(crate::cri::convert::runtime_features(&status)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the runtime's features yet (CRI Status)");
            None
        }
    };
    tracing::info!(
        supplemental_groups_policy = features
            .as_ref()
            .is_some_and(|f| f.supplemental_groups_policy),
        user_namespaces = features
            .as_ref()
            .is_some_and(|f| f.handler_supports_user_namespaces("")),
        "the container runtime's features"
    );
    let (features_tx, features) = tokio::sync::watch::channel(features);

    if !node.has_cap_sys_resource {
        tracing::info!(
            "no CAP_SYS_RESOURCE: containers' negative oom_score_adj values will be written as 0"
        );
    }

    let cpu_manager = super::cpumanager::start(config, metrics, runtime.clone(), tasks, shutdown)?;
    let reasons = Arc::new(Mutex::new(ReasonCache::new()));
    let mut manager = KubeRuntimeManager::new(
        runtime.clone(),
        runtime.clone(),
        reasons.clone(),
        RuntimeManagerConfig {
            node_name: config.node_name.clone(),
            log_root: config.logs.pod_logs_dir.clone(),
            memory_capacity: node.memory_bytes,
            cpu_capacity_millis: node.cpu_millis,
            has_cap_sys_resource: node.has_cap_sys_resource,
            host_dns: node.dns.clone(),
            host_ip: node.host_ip.map(|ip| ip.to_string()),
            runtime_handler: String::new(),
            security: SecurityOptions::new(&config.root_dir, config.security.seccomp_default),
        },
    );
    if let Some(cpus) = &cpu_manager {
        manager = manager.with_lifecycle(Arc::new(super::cpumanager::CpuLifecycle(cpus.clone())));
    }
    let volumes = volume_manager(config, &node, metrics, tasks, shutdown)?;
    manager = manager.with_mounts(volumes.clone());
    let userns =
        UsernsManager::load(&config.root_dir, features.clone()).map_err(Error::UserNamespaces)?;
    manager = manager.with_userns(Arc::new(userns));
    let manager = Arc::new(manager);
    let period = match &source {
        PlegSource::Relist { period } | PlegSource::Kernel { period, .. } => *period,
    };
    let (relist, pleg_events) = RelistPleg::new(
        manager.clone(),
        &runtime_name,
        PlegConfig {
            relist_period: period,
            relist_threshold: match source {
                PlegSource::Relist { .. } => PlegConfig::default().relist_threshold,
                PlegSource::Kernel { .. } => ebpf::RELIST_THRESHOLD,
            },
        },
        PlegMetrics::register(&metrics.registry)?,
    );
    let gc_events = published.subscribe();
    relist.set_observer(published);
    tasks.spawn({
        let relist = relist.clone();
        let shutdown = shutdown.clone();
        async move {
            relist.run(shutdown).await;
            Ok(())
        }
    });
    let pleg: Arc<dyn Pleg> = match source {
        PlegSource::Relist { .. } => relist,
        PlegSource::Kernel {
            events,
            cgroup2_root,
            ..
        } => {
            let ebpf = EbpfPleg::new(
                relist,
                cgroup2_root,
                kubepods_path(config),
                EbpfPlegMetrics::register(&metrics.registry)?,
            );
            let shutdown = shutdown.clone();
            let runner = ebpf.clone();
            tasks.spawn(async move {
                runner.run(events, shutdown).await;
                Ok(())
            });
            ebpf
        }
    };
    {
        let pleg = pleg.clone();
        health.add_check(
            "pleg",
            Arc::new(move || match pleg.health() {
                PlegHealth::Healthy => None,
                PlegHealth::Unhealthy(why) => Some(why),
            }),
        );
    }

    let status = Arc::new(StatusManager::default());
    super::psi::register_psi_metrics(&metrics.registry, &cgroups, pleg.cache(), &status)?;
    let pod_manager = Arc::new(PodManager::default());
    let kubelet_metrics = KubeletMetrics::register(&metrics.registry)?;
    let (probes, probe_updates) = ProbeManager::new(
        runtime.clone(),
        status.clone(),
        ProberMetrics::register(&metrics.registry)?,
    );
    let syncer = Arc::new(KubeletSyncer {
        metrics: kubelet_metrics.clone(),
        started: Mutex::new(Default::default()),
        runtime: manager.clone(),
        status: status.clone(),
        cgroups: cgroups.clone(),
        reasons,
        pods: pod_manager.clone(),
        host_ip: node.host_ip.map(|ip| ip.to_string()),
        probes: probes.clone(),
        volumes: volumes.clone(),
    });
    let on_synced: OnSynced = {
        let pleg = pleg.clone();
        Arc::new(move |uid| pleg.request_relist(uid))
    };
    let workers = PodWorkers::with_metrics(
        syncer,
        pleg.cache(),
        WorkerConfig {
            resync_interval: config.sync_frequency,
            ..WorkerConfig::default()
        },
        Some(on_synced),
        kubelet_metrics.pod_worker_duration,
    );
    let kubelet = Arc::new(Kubelet::new(
        config.node_name.clone(),
        pod_manager,
        workers,
        pleg.cache(),
        status.clone(),
        manager.clone(),
        cgroups.clone(),
        {
            // Admission fits pods into allocatable, as upstream's does.
            let (cpu_millis, memory_bytes) = allocatable(config, &node);
            NodeCapacity {
                max_pods: config.max_pods as usize,
                cpu_millis,
                memory_bytes,
            }
        },
        security_admission(config, features.clone())?,
    ));

    let annotate = cpu_manager.clone().map(|cpus| {
        Arc::new(move |uid: &str| cpus.pod_annotations(uid)) as crate::server::http::Annotator
    });
    if let Some(cpus) = cpu_manager {
        kubelet.set_cpu_manager(cpus);
    }
    kubelet.set_probes(probes);
    kubelet.set_volume_manager(volumes.clone());

    let eviction = super::eviction::start(
        config,
        i64::try_from(node.memory_bytes).unwrap_or(i64::MAX),
        &kubelet,
        &cgroups,
        pleg.cache(),
        &manager,
        runtime.as_ref(),
        kernel_bus,
        metrics,
        health,
        tasks,
        shutdown,
    )
    .await?;

    let (mut pod_config, updates) = PodConfig::new(Box::new(SystemTime::now));
    if let Some(dir) = &config.static_pod_path {
        let source = StaticPodSource::new(
            StaticPodOptions::new(
                dir.clone(),
                config.node_name.clone(),
                config.file_check_frequency,
            ),
            pod_config.channel(Source::File),
        );
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            source.run(shutdown).await;
            Ok(())
        });
        tracing::info!(dir = %dir.display(), "static pods from this folder");
    }
    let node_changed = Arc::new(tokio::sync::Notify::new());
    let runtime_health = super::runtime_health::RuntimeHealth::default();
    tasks.spawn({
        let health = runtime_health.clone();
        let runtime: Arc<dyn crate::cri::RuntimeService> = runtime.clone();
        let changed = node_changed.clone();
        let shutdown = shutdown.clone();
        async move {
            health.run(runtime, changed, features_tx, shutdown).await;
            Ok(())
        }
    });
    tasks.spawn({
        // A pressure condition set or cleared is posted at once.
        let mut conditions = eviction.conditions();
        let changed = node_changed.clone();
        let shutdown = shutdown.clone();
        async move {
            loop {
                tokio::select! {
                    seen = conditions.changed() => {
                        if seen.is_err() {
                            break;
                        }
                        changed.notify_one();
                    }
                    () = shutdown.cancelled() => break,
                }
            }
            // Without an eviction manager nothing changes; a task that ends stops the agent.
            shutdown.cancelled().await;
            Ok(())
        }
    });
    // Upstream's image list cache is refreshed every 30 s too.
    let images_seen = Arc::new(Mutex::new(Vec::new()));
    tasks.spawn({
        let images = runtime.clone();
        let seen = images_seen.clone();
        let changed = node_changed.clone();
        let shutdown = shutdown.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = shutdown.cancelled() => return Ok(()),
                }
                match crate::cri::ImageService::list_images(images.as_ref(), None).await {
                    Ok(list) => {
                        let listed = crate::sources::node_images(&list, crate::sources::MAX_IMAGES);
                        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                        if *seen != listed {
                            *seen = listed;
                            changed.notify_one();
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot list the node's images"),
                }
            }
        }
    });
    let images: ImagesCheck = {
        let seen = images_seen.clone();
        Arc::new(move || seen.lock().unwrap_or_else(|p| p.into_inner()).clone())
    };
    let readiness: ReadinessCheck = {
        let pleg = pleg.clone();
        Arc::new(move || {
            // Upstream's order: the runtime's problems, then the PLEG's.
            let mut problems: Vec<String> = runtime_health.problem().into_iter().collect();
            if let PlegHealth::Unhealthy(why) = pleg.health() {
                problems.push(format!("PLEG is not healthy: {why}"));
            }
            (!problems.is_empty()).then(|| problems.join(", "))
        })
    };
    let pressure: PressureCheck = {
        let conditions = eviction.conditions();
        Arc::new(move || {
            conditions
                .borrow()
                .iter()
                .map(|c| c.as_str().to_owned())
                .collect()
        })
    };
    let description = describe_node(config, &node, runtime_version);
    // The Node object as the API server would get it, served locally too (`/node`).
    let local_node = Arc::new(LocalNode::new(
        config.node_name.clone(),
        description.clone(),
        readiness.clone(),
        pressure.clone(),
        images.clone(),
        Arc::new(SystemTime::now) as WallClock,
    ));
    if let Some(kubeconfig) = &config.kubeconfig {
        let client = client_from_kubeconfig(kubeconfig)
            .await
            .map_err(Error::ApiServer)?;
        volumes.set_object_source(Arc::new(KubeObjects(client.clone())));
        let source = ApiServerSource {
            client,
            options: ApiServerOptions::new(
                config.node_name.clone(),
                config.node_status_update_frequency,
                config.node_lease_duration_seconds,
            ),
            node: description,
            status: status.clone(),
            readiness,
            pressure,
            node_changed,
            images,
            pods: pod_config.channel(Source::Api),
            clock: Arc::new(SystemTime::now) as WallClock,
        };
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            source.run(shutdown).await;
            Ok(())
        });
        tracing::info!(kubeconfig = %kubeconfig.display(), "pods from the API server");
    }
    super::housekeeping::start(
        config,
        runtime.clone(),
        runtime.clone(),
        &kubelet,
        pod_config.sources_ready(),
        pod_config.sources_ready(),
        gc_events,
        eviction.conditions(),
        &metrics.registry,
        tasks,
        shutdown,
    )?;
    let ready = pod_config.sources_ready();
    tasks.spawn({
        let shutdown = shutdown.clone();
        async move {
            // With no source registered the merge has nothing to do and returns at once: that is
            // not a failure of the agent, so the task lives on until shutdown.
            pod_config.run(shutdown.clone()).await;
            shutdown.cancelled().await;
            Ok(())
        }
    });
    tasks.spawn({
        let shutdown = shutdown.clone();
        async move {
            sync_loop::run(
                kubelet,
                updates,
                pleg_events,
                probe_updates,
                ready,
                shutdown,
            )
            .await;
            Ok(())
        }
    });
    Ok(Pods {
        logs: super::housekeeping::logs_state(status.clone(), runtime.clone()),
        status,
        node: local_node,
        annotate,
        evictions: eviction.decision_sender(),
        runtime,
    })
}

/// Admission's security checks: the safe sysctls of the running kernel plus
/// `allowedUnsafeSysctls`, whether the host has AppArmor, the runtime's features.
fn security_admission(
    config: &Config,
    features: tokio::sync::watch::Receiver<Option<crate::container::RuntimeFeatures>>,
) -> Result<SecurityAdmission, Error> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok();
    let release = release.as_deref().and_then(parse_kernel_release);
    if release.is_none() {
        tracing::warn!(
            "cannot read the kernel release: only the sysctls every kernel namespaces are safe"
        );
    }
    let sysctls =
        Allowlist::new(release, &config.security.allowed_unsafe_sysctls).map_err(Error::Sysctls)?;
    let apparmor = AppArmorHost::detect();
    if let AppArmorHost::Unavailable(why) = &apparmor {
        tracing::info!("{why}: pods that need an AppArmor profile will be refused");
    }
    Ok(SecurityAdmission {
        sysctls,
        apparmor,
        features,
        runtime_handler: String::new(),
    })
}

/// The volume manager, its reconciler running, with pod directories below `rootDir`.
fn volume_manager(
    config: &Config,
    node: &NodeFacts,
    metrics: &Metrics,
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
) -> Result<Arc<VolumeManager>, Error> {
    let (_, allocatable_memory) = allocatable(config, node);
    // Upstream `setupDataDirs`: the root dir, `pods` and the pod log directory 0750, before any
    // pod's directory is made below them (wider ones an older agent left are narrowed).
    let dirs = PodDirs::new(config.root_dir.clone());
    dirs.setup().map_err(Error::DataDirs)?;
    crate::hostfs::ensure_dir(&config.logs.pod_logs_dir, crate::volume::DIR_MODE)
        .map_err(Error::DataDirs)?;
    let volumes = VolumeManager::new(
        VolumeManagerConfig {
            dirs,
            node_allocatable_memory: allocatable_memory,
            node: NodeResources {
                cpu_millis: node.cpu_millis,
                memory_bytes: allocatable_memory,
            },
            cluster_domain: config.cluster_domain.clone(),
            wait_budget: default_wait_budget(),
        },
        VolumeMetrics::register(&metrics.registry)?,
    );
    let runner = volumes.clone();
    let shutdown = shutdown.clone();
    tasks.spawn(async move {
        runner.run(shutdown).await;
        Ok(())
    });
    Ok(volumes)
}

/// Node allocatable CPU (millicores) and memory (bytes), as upstream computes it: capacity minus
/// kube and system reservations, and for memory also the hard `memory.available` threshold.
fn allocatable(config: &Config, node: &NodeFacts) -> (i64, i64) {
    let memory = i64::try_from(node.memory_bytes).unwrap_or(i64::MAX);
    let eviction = config
        .eviction
        .thresholds
        .iter()
        .filter(|t| t.is_hard() && t.signal == crate::eviction::thresholds::Signal::MemoryAvailable)
        .map(|t| crate::eviction::logic::quantity(t.value, memory))
        .max()
        .unwrap_or(0);
    (
        (node.cpu_millis - config.reserved.cpu_millis()).max(0),
        (memory - config.reserved.memory_bytes() - eviction).max(0),
    )
}

/// `ephemeral-storage` capacity and allocatable: the size of the filesystem holding the root dir,
/// minus the kube and system reservations and the hard `nodefs.available` threshold (upstream
/// `GetNodeAllocatableAbsolute`). `None` when the filesystem cannot be read.
fn ephemeral_storage(config: &Config) -> Option<(u64, u64)> {
    let dir = config
        .root_dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(std::path::Path::new("/"));
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    #[allow(
        clippy::useless_conversion,
        reason = "the field widths differ by platform"
    )]
    let capacity = u64::from(stat.blocks()).saturating_mul(u64::from(stat.fragment_size()));
    let capacity_i = i64::try_from(capacity).unwrap_or(i64::MAX);
    let eviction = config
        .eviction
        .thresholds
        .iter()
        .filter(|t| t.is_hard() && t.signal == crate::eviction::thresholds::Signal::NodeFsAvailable)
        .map(|t| crate::eviction::logic::quantity(t.value, capacity_i))
        .max()
        .unwrap_or(0);
    let allocatable = (capacity_i - config.reserved.ephemeral_storage_bytes() - eviction).max(0);
    Some((capacity, u64::try_from(allocatable).unwrap_or(0)))
}

/// What the Node object says about this machine.
fn describe_node(config: &Config, node: &NodeFacts, runtime_version: String) -> NodeDescription {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let (allocatable_cpu_millis, allocatable_memory_bytes) = allocatable(config, node);
    let (ephemeral_storage_bytes, allocatable_ephemeral_storage_bytes) =
        ephemeral_storage(config).unzip();
    NodeDescription {
        hostname: config.node_name.clone(),
        internal_ip: node.host_ip,
        cpu_millis: node.cpu_millis,
        memory_bytes: node.memory_bytes,
        allocatable_cpu_millis,
        allocatable_memory_bytes: u64::try_from(allocatable_memory_bytes).unwrap_or(0),
        ephemeral_storage_bytes,
        allocatable_ephemeral_storage_bytes,
        max_pods: config.max_pods,
        // `uname -r`.
        kernel_version: read("/proc/sys/kernel/osrelease"),
        os_image: os_image(&read("/etc/os-release")).unwrap_or_else(|| "Linux".into()),
        container_runtime_version: runtime_version,
        architecture: go_arch(std::env::consts::ARCH).to_owned(),
        machine_id: read("/etc/machine-id"),
        boot_id: read("/proc/sys/kernel/random/boot_id"),
    }
}
