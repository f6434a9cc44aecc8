//! The composition root of `swiftlet run`: builds every component, connects them, and owns
//! shutdown (one cancellation token, one task set). The only place that knows all concrete types.
//!
//! Two halves: the kernel event pipeline (programs → pump → metrics and the gRPC watchers) and the
//! pods (`pods.rs`: CRI, PLEG, pod workers, sync loop, sources, and the kubelet's
//! housekeeping: log rotation and garbage collection). The healthz address serves `/healthz` only; the read-only port
//! `/healthz`, `/metrics`, `/pods`, `/node` and `/stats/summary`; the kubelet server (`server.rs`,
//! TLS and authenticated) all of these, `/containerLogs` and container streaming
//! (`listeners.rs` binds the plain ones and the gRPC socket). First of all the process raises its
//! open files limit and sets its own oom_score_adj (`process.rs`).

mod certificates;
mod cpumanager;
mod events;
mod eviction;
mod listeners;
mod node;
mod pods;
mod process;
mod psi;
mod runtime_driver;
mod server;
mod shutdown;

use std::{io, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use tokio::{sync::broadcast, task::JoinSet};
use tokio_util::sync::CancellationToken;

use crate::{
    config::{Config, ConfigError, PlegMode, defaults},
    kernel::{self, KernelEvents, StreamItem},
    metrics::{KernelCountersCollector, Metrics},
    server::{EventsService, Health, HttpState},
};

/// The pod-resources socket, below the root dir.
pub const POD_RESOURCES_SOCKET: &str = "pod-resources/kubelet.sock";

/// How long shutdown waits for the tasks to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Capacity of the event bus; a subscriber further behind than this is told what it missed.
const BUS_CAPACITY: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Kernel(#[from] kernel::Error),
    #[error("container runtime: {0}")]
    Runtime(#[source] crate::cri::Error),
    #[error("cgroups: {0}")]
    Cgroups(String),
    #[error(transparent)]
    ReservedCgroup(#[from] crate::cm::reserved_cgroups::ReservedCgroupError),
    #[error(transparent)]
    EventedPleg(#[from] crate::pleg::evented::Error),
    #[error(transparent)]
    CgroupDriver(#[from] crate::cm::systemd::preflight::PreflightError),
    #[error(transparent)]
    RuntimeCgroupDriver(#[from] runtime_driver::Error),
    #[error("CPU manager: {0}")]
    CpuManager(String),
    #[error("user namespaces: {0}")]
    UserNamespaces(#[source] crate::kuberuntime::userns::UsernsError),
    #[error("image credential providers: {0}")]
    CredentialProviders(#[source] crate::kuberuntime::credentials::provider::config::ConfigError),
    #[error("allowedUnsafeSysctls: {0}")]
    Sysctls(#[source] crate::kubelet::sysctl::PatternError),
    #[error("API server: {0}")]
    ApiServer(#[source] crate::sources::ApiServerError),
    #[error("--node-ip: {0}")]
    NodeIp(#[source] crate::node::NodeIpError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// Upstream `setupDataDirs`: the root dir, its `pods` and the pod log directory.
    #[error("data directories (--root-dir / --pod-logs-dir): {0}")]
    DataDirs(#[source] crate::hostfs::Error),
    #[error("--grpc-socket {}: {source}", path.display())]
    GrpcSocket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("listening on {addr} (--http-address / --read-only-port): {source}")]
    HttpAddress {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("kubelet server: {0}")]
    Tls(#[source] crate::server::tls::TlsError),
    #[error("listening on {addr} (--address / --port): {source}")]
    ServerAddress {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("certificates: {0}")]
    Certificate(#[source] crate::certificate::Error),
    #[error("{component} stopped: {reason}")]
    Stopped {
        component: &'static str,
        reason: String,
    },
}

impl Error {
    pub fn hint(&self) -> Option<String> {
        match self {
            Error::Kernel(e) => e.hint(),
            Error::Config(_) => Some("see `swiftlet run --help` and the configuration table in docs/configuration.md".into()),
            Error::Runtime(_) => Some(
                "start a CRI runtime or point --runtime-endpoint at one (`cargo xtask run` starts a \
                 private containerd)"
                    .into(),
            ),
            Error::ApiServer(_) => Some(
                "check the file given with --kubeconfig: its current context, server and \
                 credentials"
                    .into(),
            ),
            Error::CpuManager(_) => Some(
                "check cpuManagerPolicy, reservedSystemCPUs and the reservations; a checkpoint \
                 swiftlet refuses can be set aside with --cpu-manager-reset-state after draining \
                 the node"
                    .into(),
            ),
            Error::CgroupDriver(_) => Some(
                "cgroupDriver: systemd is for nodes booted with systemd; the runtime's cgroup driver must match (containerd: SystemdCgroup in the runc options)".into(),
            ),
            Error::RuntimeCgroupDriver(e) => e.hint(),
            Error::Cgroups(_) => Some("swiftlet runs as root and needs the cpu, memory and pids cgroup controllers".into()),
            Error::ReservedCgroup(_) => Some(
                "create the reserved cgroup (in the cpu, memory and pids hierarchies) before \
                 swiftlet starts, or leave its reservation out of enforceNodeAllocatable"
                    .into(),
            ),
            Error::GrpcSocket { .. } => {
                Some("pick a writable path, or stop the swiftlet already using it".into())
            }
            Error::HttpAddress { .. } => Some(
                "pick a free address, e.g. --http-address 127.0.0.1:0 or --read-only-port 0".into(),
            ),
            Error::Tls(_) => Some(
                "check --tls-cert-file, --tls-private-key-file and --client-ca-file (PEM), or \
                 leave the first two unset for a self-signed certificate in --cert-dir"
                    .into(),
            ),
            Error::ServerAddress { .. } => {
                Some("pick a free port with --port, or --port 0 to disable the kubelet server".into())
            }
            Error::UserNamespaces(_) => Some(
                "the checkpoint of the pods' user-namespace ranges is unreadable: drain the node, \
                 remove the file and start again"
                    .into(),
            ),
            Error::CredentialProviders(_) => Some(
                "check the file of --image-credential-provider-config (a CredentialProviderConfig) \
                 and the binaries in --image-credential-provider-bin-dir"
                    .into(),
            ),
            Error::Sysctls(_) => Some("see the configuration table in docs/configuration.md".into()),
            Error::NodeIp(_) => Some(
                "give one of this host's addresses (`ip address`), one per family at most, or \
                 leave --node-ip out to have one chosen"
                    .into(),
            ),
            Error::DataDirs(_) => Some(
                "swiftlet runs as root and owns its root dir: check that --root-dir and \
                 --pod-logs-dir are directories (not links) on a writable filesystem"
                    .into(),
            ),
            Error::Certificate(_) => Some(
                "check --cert-dir (a directory swiftlet owns, not a link), --kubeconfig and \
                 --bootstrap-kubeconfig"
                    .into(),
            ),
            Error::EventedPleg(_) => Some(
                "point --runtime-endpoint at containerd 1.7 or later (`cargo xtask run \
                 --containerd 2.1` starts one), or leave --pleg out for the kernel-event PLEG"
                    .into(),
            ),
            Error::Metrics(_) | Error::Stopped { .. } => None,
        }
    }
}

pub async fn run(mut config: Config) -> Result<(), Error> {
    let notifier = crate::notify::Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "not notifying the service manager");
        crate::notify::Notifier::default()
    });
    notifier.tell(&[crate::notify::State::Status(
        "starting: connecting to the runtime".to_owned(),
    )]);
    let systemd = crate::cm::systemd::preflight::check(
        config.cgroup_driver,
        &config.cgroup_root,
        &Default::default(),
    )
    .await?;
    let credential_providers = pods::credential_providers(&config)?;
    let open_files = process::raise_open_files_limit();
    let oom =
        process::set_own_oom_score_adj(std::path::Path::new("/proc/self"), config.oom_score_adj);
    let metrics = Metrics::new()?;
    credential_providers.register_metrics(&metrics.registry)?;
    metrics.oom_score_adj(match &oom {
        process::OomScoreAdj::Set(value) => Some(*value),
        process::OomScoreAdj::Refused { current, .. } => *current,
    })?;
    let (server_runtime, servers) =
        listeners::ServerRuntime::new(listeners::per_listener(open_files)).map_err(|e| {
            Error::Stopped {
                component: "server runtime",
                reason: e.to_string(),
            }
        })?;
    let health = Health::default();
    let (bus, _) = broadcast::channel(BUS_CAPACITY);
    let shutdown = CancellationToken::new();
    let mut tasks: JoinSet<Result<(), Error>> = JoinSet::new();

    let node = node::NodeFacts::detect(&config).map_err(Error::NodeIp)?;
    let certificates::Certificates { api, serving } =
        certificates::start(&config, &node, &metrics, &mut tasks, &shutdown).await?;
    let runtime = pods::connect_cri(&config, &metrics).await?;
    if config.pleg == PlegMode::Evented {
        crate::pleg::evented::check_runtime(&runtime).await?;
    }
    let systemd = runtime_driver::resolve(&mut config, &metrics, &runtime, systemd).await?;
    let cgroups = pods::cgroups(&config, &node, systemd).await?;
    let (source, kernel_bus, memcg_trigger) =
        kernel_events(&config, &metrics, &health, &bus, &mut tasks, &shutdown)?;
    let (published, _) = broadcast::channel(BUS_CAPACITY);
    let (kube_events, _) = broadcast::channel(BUS_CAPACITY);
    let source = match config.pleg {
        PlegMode::Evented => pods::PlegSource::Evented {
            period: config.pleg_relist_period,
        },
        _ => source,
    };
    let mode = match &source {
        pods::PlegSource::Kernel { .. } => "ebpf",
        pods::PlegSource::Relist { .. } => "relist",
        pods::PlegSource::Evented { .. } => "evented",
    };
    metrics.pleg_mode(mode)?;
    tracing::info!(pleg = mode, "pod lifecycle events from the {mode} PLEG");

    let pods = pods::start(
        &mut pods::App {
            config: &config,
            api: api.as_ref(),
            metrics: &metrics,
            health: &health,
            tasks: &mut tasks,
            shutdown: &shutdown,
        },
        pods::PodsInput {
            node,
            runtime,
            cgroups: cgroups.clone(),
            source,
            published: published.clone(),
            kernel_bus,
            memcg_trigger,
            kube_events: kube_events.clone(),
            credential_providers,
        },
    )
    .await?;

    listeners::serve_grpc(
        &config.grpc_socket,
        swiftlet_proto::v1::events_server::EventsServer::new(
            EventsService::new(bus, published)
                .with_evictions(pods.evictions.clone())
                .with_kube_events(kube_events),
        ),
        &servers,
        &metrics.server,
        &mut tasks,
        &shutdown,
    )?;
    // Upstream's fixed place under the root dir (`podresources.GetPodResourcesSocket`).
    listeners::serve_grpc(
        &config.root_dir.join(POD_RESOURCES_SOCKET),
        swiftlet_proto::podresources::pod_resources_lister_server::PodResourcesListerServer::new(
            crate::server::podresources::PodResourcesService::new(
                pods.pod_resources.clone(),
                config
                    .feature_gates
                    .enabled(crate::server::podresources::GET_GATE),
            ),
        ),
        &servers,
        &metrics.server,
        &mut tasks,
        &shutdown,
    )?;
    let state = HttpState {
        metrics,
        health,
        pods: Some(pods.status.clone()),
        annotate: pods.annotate.clone(),
        node: Some(pods.node.clone()),
    };
    let summary = server::summary_provider(&config, &pods, &cgroups).await?;
    let kubelet_server = server::start(
        &config,
        state.clone(),
        &pods,
        summary.clone(),
        serving,
        &servers,
        &mut tasks,
        &shutdown,
    )
    .await?;
    let listening =
        server::serve_local_http(&config, &state, &summary, &servers, &mut tasks, &shutdown)?;
    tracing::info!(
        node = config.node_name,
        grpc_socket = %config.grpc_socket.display(),
        http = ?listening,
        kubelet_server = ?kubelet_server,
        "swiftlet is running"
    );
    notify_ready(&notifier, &state.health, &mut tasks, &shutdown);

    let result = wait_then_shut_down(&mut tasks, &shutdown).await;
    notifier.tell(&[crate::notify::State::Stopping]);
    let _ = std::fs::remove_file(&config.grpc_socket);
    drop(server_runtime);
    result
}

/// Tells systemd the agent serves (runtime, PLEG and servers up), then keeps its status line
/// current and pets its watchdog when the unit has one, on the same health `/healthz` reports
/// (see `crate::notify`): every [`crate::notify::STATUS_PERIOD`], or half the watchdog's timeout
/// if that is shorter.
fn notify_ready(
    notifier: &crate::notify::Notifier,
    health: &Health,
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
) {
    notifier.tell(&[
        crate::notify::State::Ready,
        crate::notify::State::Status("running".to_owned()),
    ]);
    if !notifier.enabled() {
        return;
    }
    let watchdog = crate::notify::watchdog_interval_from_env();
    if let Some(interval) = watchdog {
        tracing::info!(?interval, "petting the systemd watchdog");
    }
    let period = watchdog.map_or(crate::notify::STATUS_PERIOD, |interval| {
        interval.min(crate::notify::STATUS_PERIOD)
    });
    let (notifier, shutdown) = (notifier.clone(), shutdown.clone());
    let (failing, conditions) = (health.clone(), health.clone());
    tasks.spawn(async move {
        crate::notify::watchdog(
            notifier,
            period,
            watchdog.is_some(),
            move || failing.problems(),
            move || conditions.conditions(),
            shutdown.clone(),
        )
        .await;
        // Ending is only for shutdown; the task set takes an early end as the agent's failure.
        shutdown.cancelled().await;
        Ok(())
    });
}

/// A subscription to the kernel events the pump publishes.
type KernelBus = broadcast::Receiver<Arc<StreamItem>>;

/// Loads the kernel programs and starts pumping their events onto `bus`; what drives the PLEG
/// follows (the kernel events, or a relist alone when they are unavailable and not required),
/// and the eviction manager's subscription to the bus and its memory level trigger when there is
/// one.
fn kernel_events(
    config: &Config,
    metrics: &Metrics,
    health: &Health,
    bus: &broadcast::Sender<Arc<StreamItem>>,
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
) -> Result<
    (
        pods::PlegSource,
        Option<KernelBus>,
        Option<kernel::MemcgTrigger>,
    ),
    Error,
> {
    let want_kernel_pleg = config.pleg == PlegMode::Ebpf;
    let mut load = config.kernel.load_options();
    // The charge programs cost a trampoline on every memory charge: only when they wake someone.
    load.memcg_level = config.eviction.wakeups.level;
    if want_kernel_pleg {
        // The kernel-event PLEG needs the pods' events, and only those. Without QoS cgroups and
        // with `cgroupRoot: /`, pods sit at the top of the hierarchy next to everything else:
        // the whole machine is watched.
        let pods = config.pod_cgroups();
        load.watch.push(format!("/{}", pods.pods_parent()).into());
    }
    let mut kernel_bus = None;
    let mut memcg_trigger = None;
    let source = match KernelEvents::load(&load) {
        Ok(events) => {
            memcg_trigger = events.memcg_trigger();
            metrics
                .registry
                .register(Box::new(KernelCountersCollector::new(events.counters())?))?;
            let cgroup2_root = events.info().cgroup2_root.clone();
            let pleg_events = bus.subscribe();
            kernel_bus = Some(bus.subscribe());
            tasks.spawn(pump(
                events,
                bus.clone(),
                metrics.clone(),
                health.clone(),
                shutdown.clone(),
            ));
            if want_kernel_pleg {
                pods::PlegSource::Kernel {
                    events: pleg_events,
                    cgroup2_root,
                    period: config.pleg_relist_period,
                }
            } else {
                pods::PlegSource::Relist {
                    period: config.pleg_relist_period,
                }
            }
        }
        Err(e) if want_kernel_pleg && config.pleg_explicit => return Err(e.into()),
        Err(e) => {
            let why = format!("{e}");
            if want_kernel_pleg {
                tracing::warn!(
                    error = why,
                    hint = e.hint().unwrap_or_default(),
                    "kernel events are unavailable: falling back to the relist PLEG"
                );
                health.set_note("pleg", format!("relist (kernel events unavailable: {why})"));
            } else {
                tracing::warn!(
                    error = why,
                    "kernel events are unavailable: swiftlet.v1.Events/Watch streams no kernel events"
                );
            }
            // The default period belongs to the kernel-event PLEG; alone, the relist runs at 1 s.
            let period = if config.pleg_relist_period == defaults::EBPF_PLEG_RELIST_PERIOD {
                defaults::PLEG_RELIST_PERIOD
            } else {
                config.pleg_relist_period
            };
            pods::PlegSource::Relist { period }
        }
    };
    Ok((source, kernel_bus, memcg_trigger))
}

/// Runs until a signal or until a task ends (an error of the agent), then cancels everything
/// and gives the tasks [`SHUTDOWN_GRACE`] to finish.
async fn wait_then_shut_down(
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let mut result = Ok(());
    tokio::select! {
        () = shutdown_signal() => tracing::info!("shutting down (pods keep running)"),
        Some(done) = tasks.join_next() => {
            result = match done {
                Ok(Ok(())) => Err(Error::Stopped { component: "a task", reason: "ended early".into() }),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(Error::Stopped { component: "a task", reason: e.to_string() }),
            };
        }
    }
    shutdown.cancel();
    // Shutdown is bounded: a gRPC watcher that never hangs up must not keep the agent alive.
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while let Some(done) = tasks.join_next().await {
            if let Ok(Err(e)) = done {
                tracing::warn!(error = %e, "while shutting down");
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            left = tasks.len(),
            "tasks still running after {SHUTDOWN_GRACE:?}; stopping them"
        );
        tasks.abort_all();
    }
    result
}

/// Reads the kernel stream, records metrics, and publishes to the bus.
async fn pump(
    mut events: KernelEvents,
    bus: broadcast::Sender<Arc<StreamItem>>,
    metrics: Metrics,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    loop {
        let item = tokio::select! {
            item = events.next() => item,
            () = shutdown.cancelled() => return Ok(()),
        };
        match item {
            Ok(item) => {
                match &item {
                    StreamItem::Event(event) => metrics.kernel.observe(event),
                    StreamItem::Lost { count } => {
                        metrics.kernel.lost_notified.inc_by(*count);
                        tracing::warn!(count, "the kernel dropped events (ring buffer full)");
                    }
                }
                // No subscriber is not an error: events are then only counted.
                let _ = bus.send(Arc::new(item));
            }
            Err(e) => {
                health.set_unhealthy("kernel events", e.to_string());
                return Err(Error::Kernel(e));
            }
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
