//! Building the pod half of the agent, in start-up order: the CRI client, cgroups, the CPU
//! manager (restored from its checkpoint), the volume and runtime managers, the PLEG (relisting
//! the runtime), pod workers and the kubelet core, the eviction manager, the node's status, the
//! sources, and last the sync loop that admits pods. Each component comes from its own
//! constructor; this file only connects them and spawns their tasks into the app's task set.

use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::ContainerImage;
use tokio::{
    sync::{Notify, broadcast, mpsc, watch},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;

use super::{Error, node::NodeFacts};
use crate::{
    cm::{
        CgroupLayout,
        pod_cgroups::{PodCgroupConfig, PodCgroups, QosMemoryReserve},
        systemd::SystemdSlices,
    },
    config::{ChangeDetectionStrategy, Config},
    container::RuntimeFeatures,
    cri::{GrpcRuntime, GrpcRuntimeConfig, RuntimeMetrics, RuntimeService},
    eviction::{EvictionManager, NodeCondition},
    kernel::StreamItem,
    kubelet::{
        Kubelet, KubeletParts,
        active_deadline::DeadlineTimers,
        admission::NodeCapacity,
        allocatable,
        housekeeping::{Housekeeping, HousekeepingConfig, Triggers},
        metrics::KubeletMetrics,
        pod_manager::PodManager,
        runtime_health::RuntimeHealth,
        security_admission::{AppArmorHost, SecurityAdmission},
        sync_loop,
        syncer::KubeletSyncer,
        sysctl::{Allowlist, parse_kernel_release},
    },
    kuberuntime::{
        container_config::ResourceOptions,
        credentials::CredentialProviders,
        dns::DnsSettings,
        env::ClusterEnv,
        image_pulls::{ImagePullMetrics, PullGate},
        manager::{KubeRuntimeManager, RuntimeManagerConfig},
        runtime_class::{ApiRuntimeClasses, DefaultHandler, RuntimeClasses},
        security_context::SecurityOptions,
        userns::UsernsManager,
    },
    lock::MutexExt as _,
    metrics::Metrics,
    node::{Registration, labels::node_labels},
    nodeshutdown::ShutdownState,
    pleg::{
        Health as PlegHealth, Pleg, PlegConfig, PodLifecycleEvent, PublishedEvent,
        ebpf::{self, EbpfPleg, EbpfPlegMetrics},
        evented::{self, EventedPleg, EventedPlegMetrics},
        facts::KernelFacts,
        records::{Outputs, PodRecords},
        relist::{PlegMetrics, RelistPleg},
    },
    pod_workers::{OnSynced, PodWorkers, WorkerConfig},
    prober::{ProbeManager, ProbeUpdate, metrics::ProberMetrics},
    server::Health,
    sources::{
        ApiClients, ApiServerOptions, ApiServerSource, ImagesCheck, LocalNode, NodeDescription,
        PodConfig, PressureCheck, ReadinessCheck, Source, StaticPodOptions, StaticPodSource,
        WallClock,
        apiserver::{ServiceStore, watch_services},
        go_arch, os_image,
    },
    status::{ReasonCache, StatusManager},
    volume::{
        CachedObjects, KubeObjects, NodeResources, OBJECT_CACHE_TTL, ObjectSource, PodDirs,
        VolumeManager, VolumeManagerConfig, VolumeMetrics, WatchedObjects, default_wait_budget,
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
    /// The API server's clients, with `--kubeconfig` (the kubelet server's reviews use them).
    pub api: Option<ApiClients>,
    /// What the pod-resources API reports.
    pub pod_resources: Arc<crate::server::podresources::NodeSources>,
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
    /// The runtime's CRI container events, with a relist every `period` as the safety net.
    Evented { period: Duration },
}

/// The `kubepods` cgroup hierarchy, made before anything else needs it (the kernel programs
/// watch it from their first event): through systemd when the preflight connected to it
/// (`cgroupDriver: systemd`), else written directly.
pub async fn cgroups(
    config: &Config,
    node: &NodeFacts,
    systemd: Option<zbus::Connection>,
) -> Result<Arc<PodCgroups>, Error> {
    let layout = CgroupLayout::detect().map_err(|e| Error::Cgroups(e.to_string()))?;
    let reserved = config.reserved.memory_bytes();
    let allocatable_memory = match super::node::NodeFacts::memory_total() {
        // As upstream: the pods' cgroup is limited to allocatable whenever `pods` is enforced
        // (to the whole capacity without reservations, which also undoes a stale limit).
        Some(total) if config.reserved.enforce_pods => {
            if reserved >= total {
                return Err(Error::Cgroups(format!(
                    "kubeReserved + systemReserved memory ({reserved} bytes) is not below the \
                     node's memory ({total} bytes): nothing would be left for pods"
                )));
            }
            Some(total - reserved)
        }
        _ => None,
    };
    let pod_config = PodCgroupConfig {
        pods: config.pod_cgroups(),
        pod_pids_limit: config.pod_pids_limit,
        allocatable_memory,
        cfs_quota: config.cfs_quota,
        hugepage_sizes: node.hugepages.sizes(),
        // Upstream takes the levels' limits from `GetNodeAllocatableAbsolute`: capacity less
        // the reservations, whether or not allocatable is enforced.
        qos_memory_reserve: config.qos_reserved_memory.map(|percent| QosMemoryReserve {
            percent,
            allocatable: i64::try_from(node.memory_bytes)
                .unwrap_or(i64::MAX)
                .saturating_sub(config.reserved.memory_bytes()),
        }),
    };
    // Upstream `enforceNodeAllocatableCgroups`: the reserved cgroups are limited before any
    // pod runs, and one that cannot be is a failed start.
    for reserved in &config.reserved.cgroups {
        crate::cm::reserved_cgroups::enforce(&layout, config.cgroup_driver, reserved)?;
        tracing::info!(
            cgroup = %reserved.name,
            enforcement = reserved.enforcement,
            cpu_millis = ?reserved.cpu_millis,
            memory_bytes = ?reserved.memory_bytes,
            pids = ?reserved.pids,
            "limited the reserved cgroup"
        );
    }
    let cgroups = match systemd {
        Some(connection) => {
            // systemd takes cgroup v2's properties only where it runs the unified layout.
            let unified = matches!(layout, CgroupLayout::Unified { .. });
            let slices = SystemdSlices::on(&connection, unified)
                .await
                .map_err(|e| Error::Cgroups(e.to_string()))?;
            PodCgroups::with_systemd(pod_config, layout, slices)
        }
        None => PodCgroups::new(pod_config, layout),
    };
    cgroups
        .ensure_qos_hierarchy()
        .await
        .map_err(|e| Error::Cgroups(e.to_string()))?;
    Ok(Arc::new(cgroups))
}

/// What the pod half is built from, besides the app's shared parts.
pub struct PodsInput {
    /// The node's facts, detected once at start (the serving certificate names the same
    /// addresses as the Node status).
    pub node: NodeFacts,
    /// The CRI client made at start ([`connect_cri`]).
    pub runtime: GrpcRuntime,
    pub cgroups: Arc<PodCgroups>,
    pub source: PlegSource,
    pub published: broadcast::Sender<Arc<PublishedEvent>>,
    pub kernel_bus: Option<broadcast::Receiver<Arc<StreamItem>>>,
    /// The kernel's memory cgroup level trigger, when attached.
    pub memcg_trigger: Option<crate::kernel::MemcgTrigger>,
    /// The gRPC stream's bus of Kubernetes Events.
    pub kube_events: broadcast::Sender<Arc<crate::events::Published>>,
    /// The image credential provider plugins, loaded at start ([`credential_providers`]).
    pub credential_providers: Arc<CredentialProviders>,
}

/// The app's shared parts every builder hands tasks and registrations to.
pub struct App<'a> {
    pub config: &'a Config,
    /// The API server's clients, with `--kubeconfig`.
    pub api: Option<&'a ApiClients>,
    pub metrics: &'a Metrics,
    pub health: &'a Health,
    pub tasks: &'a mut JoinSet<Result<(), Error>>,
    pub shutdown: &'a CancellationToken,
}

impl App<'_> {
    /// Runs `task` in the app's task set until shutdown; a task that ends stops the agent.
    pub(super) fn spawn(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(async move {
            task.await;
            Ok(())
        });
    }
}

/// The CRI client and what start-up learns from it.
struct Runtime {
    client: Arc<GrpcRuntime>,
    name: String,
    /// `<name>://<version>`, for the Node object.
    version: String,
    features_tx: watch::Sender<Option<RuntimeFeatures>>,
    features: watch::Receiver<Option<RuntimeFeatures>>,
}

/// The PLEG and its outputs.
struct PlegParts {
    pleg: Arc<dyn Pleg>,
    events: mpsc::Receiver<PodLifecycleEvent>,
    /// Container deaths, for the container GC.
    gc_events: broadcast::Receiver<Arc<PublishedEvent>>,
}

/// Builds and starts the pod half. The start-up order (ARCHITECTURE.md): restore state (the CPU
/// manager's and user namespaces' checkpoints, in their constructors), reconcile with the
/// runtime (the PLEG relists it, the CPU manager reconciles) and with the sources (the sync
/// loop learns when their first sets are complete), then admit.
pub async fn start(app: &mut App<'_>, input: PodsInput) -> Result<Pods, Error> {
    let config = app.config;
    let node = input.node;
    let events = super::events::start(
        app,
        app.api.map(|c| c.events.clone()),
        input.kube_events.clone(),
    )?;
    let runtime = runtime_of(input.runtime).await;
    if !node.has_cap_sys_resource {
        tracing::info!(
            "no CAP_SYS_RESOURCE: containers' negative oom_score_adj values will be written as 0"
        );
    }
    let cpu_manager = super::cpumanager::start(
        config,
        app.metrics,
        runtime.client.clone(),
        app.tasks,
        app.shutdown,
    )?;
    let volumes = volume_manager(app, &node, events.clone())?;
    let reasons = Arc::new(Mutex::new(ReasonCache::new()));
    let manager = runtime_manager(
        app,
        &node,
        &runtime,
        ManagerParts {
            reasons: reasons.clone(),
            cpu_manager: cpu_manager.clone(),
            volumes: volumes.clone(),
            events: events.clone(),
            credential_providers: input.credential_providers,
        },
    )?;
    let pleg = start_pleg(app, &manager, &runtime, input.source, input.published)?;
    let status = Arc::new(StatusManager::default());
    super::psi::register_psi_metrics(
        &app.metrics.registry,
        &input.cgroups,
        pleg.pleg.cache(),
        &status,
    )?;
    let pod_resources = Arc::new(crate::server::podresources::NodeSources {
        status: status.clone(),
        cpus: cpu_manager.clone(),
    });
    let annotate = cpu_manager.clone().map(|cpus| {
        Arc::new(move |uid: &str| cpus.pod_annotations(uid)) as crate::server::http::Annotator
    });
    // Read by admission and the Ready condition; set by the node shutdown manager.
    let node_shutdown = ShutdownState::default();
    let (
        kubelet,
        KubeletInputs {
            probe_updates,
            deadlines,
        },
    ) = build_kubelet(
        app,
        &node,
        &runtime,
        &pleg.pleg,
        CoreParts {
            manager: manager.clone(),
            status: status.clone(),
            cgroups: input.cgroups.clone(),
            reasons,
            cpu_manager,
            volumes: volumes.clone(),
            events: events.clone(),
            node_shutdown: node_shutdown.clone(),
        },
    )?;
    super::events::watch_system_ooms(
        app,
        input.kernel_bus.as_ref().map(|rx| rx.resubscribe()),
        &events,
    );
    let eviction = super::eviction::start(
        app,
        super::eviction::EvictionParts {
            memory_capacity: i64::try_from(node.memory_bytes).unwrap_or(i64::MAX),
            kubelet: &kubelet,
            cgroups: &input.cgroups,
            cache: pleg.pleg.cache(),
            runtime: &manager,
            cri: runtime.client.clone(),
            images: runtime.client.as_ref(),
            kernel: input.kernel_bus,
            memcg_trigger: input.memcg_trigger,
        },
    )
    .await?;
    let (mut pod_config, updates) = PodConfig::new(Box::new(SystemTime::now));
    let reporting = node_status(
        app,
        &node,
        &runtime,
        &pleg.pleg,
        &eviction,
        node_shutdown.clone(),
    );
    super::shutdown::start(app, &kubelet, node_shutdown, reporting.changed.clone())?;
    start_sources(app, &mut pod_config, &reporting, &kubelet, &volumes, events)?;
    let housekeeping = Housekeeping::new(
        HousekeepingConfig {
            rotation: config.logs.rotation,
            pod_logs_dir: config.logs.pod_logs_dir.clone(),
            containers: config.gc.containers,
            images: config.gc.images.clone(),
        },
        runtime.client.clone(),
        runtime.client.clone(),
        &kubelet,
        &app.metrics.registry,
    )?;
    let triggers = Triggers {
        sources_ready: pod_config.sources_ready(),
        pleg_events: pleg.gc_events,
        conditions: eviction.conditions(),
    };
    let shutdown = app.shutdown.clone();
    app.spawn(housekeeping.run(triggers, shutdown));
    // Last: the merge, then the sync loop, which admits pods.
    let ready = pod_config.sources_ready();
    let shutdown = app.shutdown.clone();
    app.spawn(async move {
        // With no source registered the merge has nothing to do and returns at once: that is
        // not a failure of the agent, so the task lives on until shutdown.
        pod_config.run(shutdown.clone()).await;
        shutdown.cancelled().await;
    });
    // Upstream installs `syncloop` among the healthz checks of both servers.
    let monitor = sync_loop::SyncLoopMonitor::default();
    let checked = monitor.clone();
    let threshold = sync_loop::wedged_after(app.config.sync_frequency);
    app.health
        .add_check("syncloop", Arc::new(move || checked.check(threshold)));
    let shutdown = app.shutdown.clone();
    let inputs = sync_loop::Inputs {
        updates,
        pleg: pleg.events,
        probes: probe_updates,
        deadlines,
    };
    app.spawn(sync_loop::run(kubelet, inputs, ready, monitor, shutdown));
    Ok(Pods {
        logs: super::server::logs_state(status.clone(), runtime.client.clone()),
        status,
        node: reporting.local_node,
        annotate,
        evictions: eviction.decision_sender(),
        runtime: runtime.client,
        api: app.api.cloned(),
        pod_resources,
    })
}

/// What the kubelet core acts through, built before it.
struct CoreParts {
    manager: Arc<KubeRuntimeManager>,
    status: Arc<StatusManager>,
    cgroups: Arc<PodCgroups>,
    reasons: Arc<Mutex<ReasonCache>>,
    cpu_manager: Option<Arc<crate::cm::cpumanager::CpuManager>>,
    volumes: Arc<VolumeManager>,
    events: crate::events::Events,
    node_shutdown: ShutdownState,
}

/// The probe manager, the pod workers and the kubelet core, built once with all it needs
/// (upstream `NewMainKubelet`).
fn build_kubelet(
    app: &App<'_>,
    node: &NodeFacts,
    runtime: &Runtime,
    pleg: &Arc<dyn Pleg>,
    parts: CoreParts,
) -> Result<(Arc<Kubelet>, KubeletInputs), Error> {
    let config = app.config;
    let (deadlines, deadlines_due) = DeadlineTimers::new();
    let (probes, probe_updates) = ProbeManager::new(
        runtime.client.clone(),
        parts.status.clone(),
        ProberMetrics::register(&app.metrics.probes)?,
        parts.events.clone(),
    );
    let workers = pod_workers(
        app,
        pleg,
        KubeletSyncerParts {
            runtime: parts.manager.clone(),
            status: parts.status.clone(),
            cgroups: parts.cgroups.clone(),
            reasons: parts.reasons,
            host_ip: node.host_ip.map(|ip| ip.to_string()),
            probes: probes.clone(),
            volumes: parts.volumes.clone(),
            events: parts.events.clone(),
            deadlines: Arc::new(deadlines),
        },
    )?;
    // Admission fits pods into allocatable, as upstream's does.
    let (cpu_millis, memory_bytes) = allocatable::cpu_and_memory(
        config,
        node.cpu_millis,
        node.memory_bytes,
        node.hugepages.total_bytes(),
    );
    let kubelet = Kubelet::new(KubeletParts {
        node_name: config.node_name.clone(),
        pods: workers.pods,
        workers: workers.workers,
        cache: pleg.cache(),
        status: parts.status,
        runtime: parts.manager,
        cgroups: parts.cgroups,
        capacity: NodeCapacity {
            max_pods: config.max_pods as usize,
            cpu_millis,
            memory_bytes,
            hugepages: node.hugepages.bytes_by_size.clone(),
        },
        registration: registration(config),
        security: security_admission(config, runtime.features.clone())?,
        cpu_manager: parts.cpu_manager,
        node_shutdown: parts.node_shutdown,
        probes,
        volumes: parts.volumes,
        events: parts.events,
    });
    Ok((
        Arc::new(kubelet),
        KubeletInputs {
            probe_updates,
            deadlines: deadlines_due,
        },
    ))
}

/// What the sync loop hears from the kubelet's own parts besides the sources and the PLEG.
struct KubeletInputs {
    probe_updates: mpsc::UnboundedReceiver<ProbeUpdate>,
    /// Pods whose active deadline came.
    deadlines: mpsc::UnboundedReceiver<crate::container::PodUid>,
}

/// Connects to the CRI runtime, its calls counted in the app's registry: made once at start,
/// asked for the cgroup driver before anything is named, then what the pod half runs with.
pub async fn connect_cri(config: &Config, metrics: &Metrics) -> Result<GrpcRuntime, Error> {
    let client = GrpcRuntime::connect(
        GrpcRuntimeConfig {
            endpoint: config.container_runtime_endpoint.clone(),
            request_timeout: config.runtime_request_timeout,
            pull_image_timeout: None,
        },
        RuntimeMetrics::register(&metrics.registry)?,
    )
    .await
    .map_err(Error::Runtime)?;
    tracing::info!(
        endpoint = config.container_runtime_endpoint,
        runtime = client.runtime_name(),
        "connected to the container runtime"
    );
    Ok(client)
}

/// Reads the runtime's features once: admission decides from the first pod on with them, and
/// the runtime health check keeps them current.
async fn runtime_of(client: GrpcRuntime) -> Runtime {
    let client = Arc::new(client);
    let name = client.runtime_name().to_owned();
    let version = format!(
        "{}://{}",
        client.version_info().runtime_name,
        client.version_info().runtime_version
    );
    let (features_tx, features) =
        watch::channel(RuntimeHealth::features_now(client.as_ref()).await);
    Runtime {
        client,
        name,
        version,
        features_tx,
        features,
    }
}

/// What the runtime manager acts through besides the CRI client.
struct ManagerParts {
    reasons: Arc<Mutex<ReasonCache>>,
    cpu_manager: Option<Arc<crate::cm::cpumanager::CpuManager>>,
    volumes: Arc<VolumeManager>,
    events: crate::events::Events,
    credential_providers: Arc<CredentialProviders>,
}

/// The runtime manager, with the CPU manager's hooks, the volume manager's mounts, what
/// containers' environments read of the cluster, the pods' RuntimeClasses, where it reports
/// events, and the user namespace ranges (restored from their checkpoint).
fn runtime_manager(
    app: &mut App<'_>,
    node: &NodeFacts,
    runtime: &Runtime,
    parts: ManagerParts,
) -> Result<Arc<KubeRuntimeManager>, Error> {
    let config = app.config;
    let env = cluster_env(app);
    let classes = runtime_classes(app.api);
    let ManagerParts {
        reasons,
        cpu_manager,
        volumes,
        events,
        credential_providers,
    } = parts;
    let mut manager = KubeRuntimeManager::new(
        runtime.client.clone(),
        runtime.client.clone(),
        reasons,
        RuntimeManagerConfig {
            node_name: config.node_name.clone(),
            log_root: config.logs.pod_logs_dir.clone(),
            memory_capacity: node.memory_bytes,
            cpu_capacity_millis: node.cpu_millis,
            has_cap_sys_resource: node.has_cap_sys_resource,
            dns: DnsSettings {
                cluster_dns: config.cluster_dns.clone(),
                cluster_domain: config.cluster_domain.clone(),
                resolv_conf: config.resolv_conf.clone(),
                node_ips: node.node_ips.clone(),
            },
            host_ip: node.host_ip.map(|ip| ip.to_string()),
            runtime_handler: String::new(),
            security: SecurityOptions::new(&config.root_dir, config.security.seccomp_default),
            resources: ResourceOptions {
                cfs_quota: config.cfs_quota,
                hugepage_sizes: node.hugepages.sizes(),
            },
        },
    );
    if let Some(cpus) = cpu_manager {
        manager = manager.with_lifecycle(Arc::new(super::cpumanager::CpuLifecycle(cpus)));
    }
    manager = manager
        .with_mounts(volumes)
        .with_env(env)
        .with_runtime_classes(classes)
        .with_pull_secrets(pull_secrets(app.api))
        .with_image_pull_gate(
            PullGate::new(config.image_pulls)
                .with_metrics(ImagePullMetrics::register(&app.metrics.registry)?),
        )
        .with_credential_providers(credential_providers)
        .with_events(events);
    let userns = UsernsManager::load(&config.root_dir, runtime.features.clone())
        .map_err(Error::UserNamespaces)?;
    Ok(Arc::new(manager.with_userns(Arc::new(userns))))
}

/// Where pods' RuntimeClasses come from: the API server with `--kubeconfig` (through the main,
/// rate-limited client), else none, as upstream without a client: every pod then runs with the
/// runtime's default handler.
fn runtime_classes(api: Option<&ApiClients>) -> Arc<dyn RuntimeClasses> {
    match api {
        Some(clients) => Arc::new(ApiRuntimeClasses(clients.main.clone())),
        None => Arc::new(DefaultHandler),
    }
}

/// Where pods' `imagePullSecrets` are read: the API server with `--kubeconfig` (the main,
/// rate-limited client), else nowhere, and pulls go without them.
fn pull_secrets(api: Option<&ApiClients>) -> Arc<dyn crate::kuberuntime::credentials::PullSecrets> {
    use crate::kuberuntime::credentials::{ApiPullSecrets, NoPullSecrets};
    match api {
        Some(clients) => Arc::new(ApiPullSecrets(clients.main.clone())),
        None => Arc::new(NoPullSecrets),
    }
}

/// The image credential provider plugins of `--image-credential-provider-config` (none without
/// it); a bad configuration stops the agent, as upstream's `RegisterCredentialProviderPlugins`.
/// Loaded before anything privileged, so that a bad file is refused at once.
pub fn credential_providers(config: &Config) -> Result<Arc<CredentialProviders>, Error> {
    CredentialProviders::from_flags(
        config.image_credential_provider_config.as_deref(),
        config.image_credential_provider_bin_dir.as_deref(),
    )
    .map(Arc::new)
    .map_err(Error::CredentialProviders)
}

/// The relist PLEG, wrapped by the kernel-event PLEG when kernel events drive it; running, and
/// in the health checks.
fn start_pleg(
    app: &mut App<'_>,
    manager: &Arc<KubeRuntimeManager>,
    runtime: &Runtime,
    source: PlegSource,
    published: broadcast::Sender<Arc<PublishedEvent>>,
) -> Result<PlegParts, Error> {
    let runtime_name = runtime.name.as_str();
    let period = match &source {
        PlegSource::Relist { period }
        | PlegSource::Kernel { period, .. }
        | PlegSource::Evented { period } => *period,
    };
    let pleg_metrics = PlegMetrics::register(&app.metrics.registry)?;
    let kernel_metrics = match source {
        PlegSource::Kernel { .. } => Some(EbpfPlegMetrics::register(&app.metrics.registry)?),
        PlegSource::Relist { .. } | PlegSource::Evented { .. } => None,
    };
    let evented_metrics = match source {
        PlegSource::Evented { .. } => Some(EventedPlegMetrics::register(&app.metrics.registry)?),
        PlegSource::Relist { .. } | PlegSource::Kernel { .. } => None,
    };
    let gc_events = published.subscribe();
    let (records, events) = PodRecords::new(
        runtime_name,
        KernelFacts::new(kernel_metrics.as_ref().map(EbpfPlegMetrics::facts)),
        Outputs {
            observer: Some(published),
            event_latency: kernel_metrics.as_ref().map(|m| m.event_latency.clone()),
            discarded: pleg_metrics.discard_events.clone(),
        },
    );
    let relist = RelistPleg::new(
        manager.clone(),
        records.clone(),
        PlegConfig {
            relist_period: period,
            relist_threshold: match source {
                PlegSource::Relist { .. } => PlegConfig::default().relist_threshold,
                PlegSource::Kernel { .. } => ebpf::RELIST_THRESHOLD,
                PlegSource::Evented { .. } => evented::RELIST_THRESHOLD,
            },
        },
        pleg_metrics,
    );
    let runner = relist.clone();
    let shutdown = app.shutdown.clone();
    app.spawn(async move { runner.run(shutdown).await });
    if let Some(metrics) = evented_metrics {
        let evented = EventedPleg::new(runtime.client.clone(), relist, records, metrics);
        let runner = evented.clone();
        let shutdown = app.shutdown.clone();
        app.spawn(async move { runner.run(shutdown).await });
        return Ok(finish_pleg(app, evented, events, gc_events));
    }
    let pleg: Arc<dyn Pleg> = match (source, kernel_metrics) {
        (
            PlegSource::Kernel {
                events,
                cgroup2_root,
                ..
            },
            Some(kernel_metrics),
        ) => {
            let pods = app.config.pod_cgroups();
            let ebpf = EbpfPleg::new(
                relist,
                records,
                cgroup2_root,
                pods,
                kernel_metrics,
                ebpf::Processes::default(),
            );
            let runner = ebpf.clone();
            let shutdown = app.shutdown.clone();
            app.spawn(async move { runner.run(events, shutdown).await });
            ebpf
        }
        _ => relist,
    };
    Ok(finish_pleg(app, pleg, events, gc_events))
}

/// The PLEG in the health checks, with its outputs.
fn finish_pleg(
    app: &App<'_>,
    pleg: Arc<dyn Pleg>,
    events: mpsc::Receiver<PodLifecycleEvent>,
    gc_events: broadcast::Receiver<Arc<PublishedEvent>>,
) -> PlegParts {
    let checked = pleg.clone();
    app.health.add_check(
        "pleg",
        Arc::new(move || match checked.health() {
            PlegHealth::Healthy => None,
            PlegHealth::Unhealthy(why) => Some(why),
        }),
    );
    PlegParts {
        pleg,
        events,
        gc_events,
    }
}

/// What the pod workers' sync functions act through, besides the pod manager and metrics.
struct KubeletSyncerParts {
    runtime: Arc<KubeRuntimeManager>,
    status: Arc<StatusManager>,
    cgroups: Arc<PodCgroups>,
    reasons: Arc<Mutex<ReasonCache>>,
    host_ip: Option<String>,
    probes: ProbeManager,
    volumes: Arc<VolumeManager>,
    events: crate::events::Events,
    deadlines: Arc<DeadlineTimers>,
}

struct Workers {
    pods: Arc<PodManager>,
    workers: Arc<PodWorkers<KubeletSyncer>>,
}

/// The pod manager and the pod workers, which sync through [`KubeletSyncer`] and ask the PLEG
/// for a fresh status after each sync.
fn pod_workers(
    app: &App<'_>,
    pleg: &Arc<dyn Pleg>,
    parts: KubeletSyncerParts,
) -> Result<Workers, Error> {
    let pods = Arc::new(PodManager::default());
    let metrics = KubeletMetrics::register(&app.metrics.registry)?;
    let syncer = Arc::new(KubeletSyncer {
        metrics: metrics.clone(),
        started: Mutex::new(Default::default()),
        runtime: parts.runtime,
        status: parts.status,
        cgroups: parts.cgroups,
        reasons: parts.reasons,
        pods: pods.clone(),
        host_ip: parts.host_ip,
        probes: parts.probes,
        volumes: parts.volumes,
        events: parts.events,
        deadlines: parts.deadlines,
    });
    let on_synced: OnSynced = {
        let pleg = pleg.clone();
        Arc::new(move |uid| pleg.request_relist(uid))
    };
    let workers = PodWorkers::with_metrics(
        syncer,
        pleg.cache(),
        WorkerConfig {
            resync_interval: app.config.sync_frequency,
            ..WorkerConfig::default()
        },
        Some(on_synced),
        metrics.pod_worker_duration,
    );
    Ok(Workers { pods, workers })
}

/// What the node's status is made of, for `/node` and the API server source.
struct NodeReporting {
    local_node: Arc<LocalNode>,
    description: NodeDescription,
    readiness: ReadinessCheck,
    pressure: PressureCheck,
    images: ImagesCheck,
    /// Notified when something the Node object shows changed, so it is posted at once.
    changed: Arc<Notify>,
}

/// The node's status: the runtime health check, the pressure conditions and the image list
/// (refreshed every 30 s, as upstream's image cache), each waking the status update on change.
fn node_status(
    app: &mut App<'_>,
    node: &NodeFacts,
    runtime: &Runtime,
    pleg: &Arc<dyn Pleg>,
    eviction: &EvictionManager,
    node_shutdown: ShutdownState,
) -> NodeReporting {
    let changed = Arc::new(Notify::new());
    let runtime_health = RuntimeHealth::default();
    {
        let health = runtime_health.clone();
        let client: Arc<dyn crate::cri::RuntimeService> = runtime.client.clone();
        let (changed, features) = (changed.clone(), runtime.features_tx.clone());
        let shutdown = app.shutdown.clone();
        app.spawn(async move { health.run(client, changed, features, shutdown).await });
    }
    {
        // A pressure condition set or cleared is posted at once.
        let (conditions, changed) = (eviction.conditions(), changed.clone());
        let shutdown = app.shutdown.clone();
        app.spawn(notify_on_change(conditions, changed, shutdown));
    }
    let images_seen = Arc::new(Mutex::new(Vec::new()));
    {
        let (images, seen) = (runtime.client.clone(), images_seen.clone());
        let (changed, shutdown) = (changed.clone(), app.shutdown.clone());
        app.spawn(refresh_images(images, seen, changed, shutdown));
    }
    let images: ImagesCheck = Arc::new(move || images_seen.lock_unpoisoned().clone());
    let readiness: ReadinessCheck = {
        let pleg = pleg.clone();
        Arc::new(move || {
            // Upstream's order: the runtime's problems, then the PLEG's, then the shutdown's.
            let mut problems: Vec<String> = runtime_health.problem().into_iter().collect();
            if let PlegHealth::Unhealthy(why) = pleg.health() {
                problems.push(format!("PLEG is not healthy: {why}"));
            }
            problems.extend(node_shutdown.not_ready().map(str::to_owned));
            (!problems.is_empty()).then(|| problems.join(", "))
        })
    };
    // The node not ready shows in the unit's status line; it fails neither `/healthz` nor the
    // watchdog (`crate::notify::watchdog` says why).
    app.health
        .add_condition("node not ready", readiness.clone());
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
    let description = describe_node(app.config, node, runtime.version.clone());
    // The Node object as the API server would get it, served locally too (`/node`).
    let local_node = Arc::new(LocalNode::new(
        app.config.node_name.clone(),
        description.clone(),
        readiness.clone(),
        pressure.clone(),
        images.clone(),
        Arc::new(SystemTime::now) as WallClock,
    ));
    NodeReporting {
        local_node,
        description,
        readiness,
        pressure,
        images,
        changed,
    }
}

/// Notifies `changed` whenever the pressure conditions change, until shutdown.
async fn notify_on_change(
    mut conditions: watch::Receiver<BTreeSet<NodeCondition>>,
    changed: Arc<Notify>,
    shutdown: CancellationToken,
) {
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
}

/// Lists the node's images every 30 s (upstream's image list cache is refreshed as often);
/// `changed` is notified when the list the Node object shows changes.
async fn refresh_images(
    images: Arc<GrpcRuntime>,
    seen: Arc<Mutex<Vec<ContainerImage>>>,
    changed: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(30));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match crate::cri::ImageService::list_images(images.as_ref(), None).await {
            Ok(list) => {
                let listed = crate::sources::node_images(&list, crate::sources::MAX_IMAGES);
                let mut seen = seen.lock_unpoisoned();
                if *seen != listed {
                    *seen = listed;
                    changed.notify_one();
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the node's images"),
        }
    }
}

/// The pod sources: static pods from `staticPodPath`, and the API server's pods (which also
/// registers the node and posts its status, reporting its condition changes to the events) with
/// `--kubeconfig`.
fn start_sources(
    app: &mut App<'_>,
    pod_config: &mut PodConfig,
    node: &NodeReporting,
    kubelet: &Arc<Kubelet>,
    volumes: &Arc<VolumeManager>,
    events: crate::events::Events,
) -> Result<(), Error> {
    let config = app.config;
    if let Some(dir) = &config.static_pod_path {
        let source = StaticPodSource::new(
            StaticPodOptions::new(
                dir.clone(),
                config.node_name.clone(),
                config.file_check_frequency,
            ),
            pod_config.channel(Source::File),
        );
        let shutdown = app.shutdown.clone();
        app.spawn(async move { source.run(shutdown).await });
        tracing::info!(dir = %dir.display(), "static pods from this folder");
    }
    let (Some(kubeconfig), Some(clients)) = (&config.kubeconfig, app.api) else {
        return Ok(());
    };
    volumes.set_object_source(object_source(config, &clients.main, app.shutdown));
    let source = ApiServerSource {
        clients: clients.clone(),
        options: ApiServerOptions {
            node_status_report_frequency: config.node_status_report_frequency,
            register_node: config.register_node,
            ..ApiServerOptions::new(
                config.node_name.clone(),
                config.node_status_update_frequency,
                config.node_lease_duration_seconds,
            )
        },
        node: node.description.clone(),
        status: kubelet.status.clone(),
        readiness: node.readiness.clone(),
        pressure: node.pressure.clone(),
        node_changed: node.changed.clone(),
        images: node.images.clone(),
        pods: pod_config.channel(Source::Api),
        clock: Arc::new(SystemTime::now) as WallClock,
        static_pods: {
            let kubelet = kubelet.clone();
            Arc::new(move || kubelet.static_pods())
        },
        events,
    };
    let shutdown = app.shutdown.clone();
    app.spawn(async move { source.run(shutdown).await });
    tracing::info!(kubeconfig = %kubeconfig.display(), "pods from the API server");
    Ok(())
}

/// What containers' environments read of the cluster: with an API server, its ConfigMaps and
/// Secrets through the volume code's reader and its Services through a watch started here.
fn cluster_env(app: &mut App<'_>) -> ClusterEnv {
    let Some(client) = app.api.map(|c| c.main.clone()) else {
        return ClusterEnv::standalone();
    };
    let services = ServiceStore::new();
    let shutdown = app.shutdown.clone();
    app.spawn(watch_services(client.clone(), services.clone(), shutdown));
    ClusterEnv::new(Arc::new(KubeObjects(client.clone())), Arc::new(services))
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

/// Where configMap, secret and projected volumes read their objects
/// (`configMapAndSecretChangeDetectionStrategy`).
fn object_source(
    config: &Config,
    client: &kube::Client,
    shutdown: &CancellationToken,
) -> Arc<dyn ObjectSource> {
    match config.config_map_and_secret_change_detection_strategy {
        ChangeDetectionStrategy::Watch => {
            Arc::new(WatchedObjects::new(client.clone(), shutdown.clone()))
        }
        ChangeDetectionStrategy::Cache => Arc::new(CachedObjects::new(
            client.clone(),
            OBJECT_CACHE_TTL,
            crate::clock::system(),
        )),
        ChangeDetectionStrategy::Get => Arc::new(KubeObjects(client.clone())),
    }
}

/// The volume manager, its reconciler running, with pod directories below `rootDir`.
fn volume_manager(
    app: &mut App<'_>,
    node: &NodeFacts,
    events: crate::events::Events,
) -> Result<Arc<VolumeManager>, Error> {
    let config = app.config;
    let (_, allocatable_memory) = allocatable::cpu_and_memory(
        config,
        node.cpu_millis,
        node.memory_bytes,
        node.hugepages.total_bytes(),
    );
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
        VolumeMetrics::register(&app.metrics.registry)?,
        events,
    );
    let runner = volumes.clone();
    let shutdown = app.shutdown.clone();
    app.spawn(async move { runner.run(shutdown).await });
    Ok(volumes)
}

/// The labels (the well-known ones, then `--node-labels`) and taints (`--register-with-taints`)
/// the node registers with and admits pods against.
fn registration(config: &Config) -> Registration {
    Registration {
        labels: node_labels(
            &config.node_name,
            go_arch(std::env::consts::ARCH),
            &config.node_labels,
        ),
        taints: config.register_with_taints.clone(),
    }
}

/// What the Node object says about this machine.
fn describe_node(config: &Config, node: &NodeFacts, runtime_version: String) -> NodeDescription {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let (allocatable_cpu_millis, allocatable_memory_bytes) = allocatable::cpu_and_memory(
        config,
        node.cpu_millis,
        node.memory_bytes,
        node.hugepages.total_bytes(),
    );
    let (ephemeral_storage_bytes, allocatable_ephemeral_storage_bytes) =
        allocatable::ephemeral_storage(config).unzip();
    let Registration { labels, taints } = registration(config);
    NodeDescription {
        hostname: config.node_name.clone(),
        internal_ips: node.node_ips.clone(),
        labels,
        taints,
        cpu_millis: node.cpu_millis,
        memory_bytes: node.memory_bytes,
        allocatable_cpu_millis,
        allocatable_memory_bytes: u64::try_from(allocatable_memory_bytes).unwrap_or(0),
        ephemeral_storage_bytes,
        allocatable_ephemeral_storage_bytes,
        hugepages_bytes_by_size: node.hugepages.bytes_by_size.clone(),
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
