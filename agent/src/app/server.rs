//! Building the kubelet server (`port`): its TLS configuration, authentication and authorization
//! (with the API server's reviews when a kubeconfig is given), the Summary API provider (also
//! served on the read-only port) and container streaming through the CRI.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::SystemTime};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{Error, listeners::ServerRuntime, node::NodeFacts, pods::Pods};
use crate::{
    cm::{CgroupLayout, pod_cgroups::PodCgroups},
    config::Config,
    cri::RuntimeService,
    eviction::observe::NodeObserver,
    logs::FollowTiming,
    server::{
        HttpState,
        auth::{Auth, Reviewer},
        connections::Tracker,
        full::{self, FullState},
        listener::{self, HttpTimeouts},
        logs::LogsState,
        stats::SummaryProvider,
        streaming::Streaming,
        tls,
        webhook::KubeReviewer,
    },
    status::StatusManager,
};

/// The Summary API of this node.
pub async fn summary_provider(
    config: &Config,
    pods: &Pods,
    cgroups: &Arc<PodCgroups>,
) -> Result<Arc<SummaryProvider>, Error> {
    let layout = CgroupLayout::detect().map_err(|e| Error::Cgroups(e.to_string()))?;
    let (nodefs, imagefs) = super::eviction::node_filesystems(config, pods.runtime.as_ref()).await;
    let memory_capacity = NodeFacts::memory_total().unwrap_or(0);
    let observer = NodeObserver {
        layout,
        pods_cgroup: config.pod_cgroups().pods_parent().to_owned(),
        pod_cgroups: config.pod_cgroups(),
        memory_capacity,
        allocatable_memory: memory_capacity - config.reserved.memory_bytes(),
        nodefs,
        imagefs,
        proc: PathBuf::from("/proc"),
        psi: Vec::new(),
    };
    let status = pods.status.clone();
    let cgroups = cgroups.clone();
    Ok(Arc::new(SummaryProvider::new(
        config.node_name.clone(),
        config.logs.pod_logs_dir.clone(),
        observer,
        Arc::new(move || status.pods().into_iter().map(|p| p.pod).collect()),
        Arc::new(move |pod| cgroups.pod_path(pod).ok()),
        Arc::new(SystemTime::now),
    )))
}

/// Binds and starts the kubelet server on the server runtime when `port` is not 0; returns its
/// address.
#[expect(
    clippy::too_many_arguments,
    reason = "the composition root hands the server each part it serves"
)]
pub async fn start(
    config: &Config,
    http: HttpState,
    pods: &Pods,
    summary: Arc<SummaryProvider>,
    serving: Option<crate::server::serving_cert::ServingCertificate>,
    servers: &ServerRuntime,
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
) -> Result<Option<SocketAddr>, Error> {
    let settings = &config.server;
    let Some(addr) = settings.address else {
        return Ok(None);
    };
    if settings.authentication.anonymous_turned_off {
        tracing::warn!(
            "AnonymousAuth is not allowed with the AlwaysAllow authorizer: anonymous requests \
             to the kubelet server stay refused (401). Use Webhook authorization \
             (--authorization-mode Webhook, with --kubeconfig) to let anonymous requests be \
             authorized"
        );
    }
    // serverTLSBootstrap: the certificate the cluster issues, swapped in as it rotates; the
    // client CA file is still watched.
    let (tls, reloader) = match serving {
        Some(serving) => tls::ServerTls::with_certificate(settings, serving),
        None => tls::ServerTls::load(settings, &config.node_name),
    }
    .map_err(Error::Tls)?;
    let reloader = match crate::server::tls_reload::ReloadMetrics::register(&http.metrics.registry)
    {
        Ok(metrics) => reloader.with_metrics(metrics),
        Err(error) => {
            tracing::warn!(%error, "kubelet server: certificate reload metrics not registered");
            reloader
        }
    };
    // Changed certificate and client CA files are taken up while the server runs.
    let watching = shutdown.clone();
    tasks.spawn_on(
        async move {
            reloader.run(watching).await;
            Ok(())
        },
        &servers.handle,
    );
    // Upstream's `BuildAuth` reviews with the kubelet's main client, under its rate limit.
    let reviewer: Option<Arc<dyn Reviewer>> = match &pods.api {
        Some(clients)
            if settings.authentication.webhook
                || settings.authorization.mode == crate::config::AuthorizationMode::Webhook =>
        {
            Some(Arc::new(KubeReviewer::new(
                clients.main.clone(),
                settings.authentication.webhook_cache_ttl,
                settings.authorization.cache_authorized_ttl,
                settings.authorization.cache_unauthorized_ttl,
            )))
        }
        _ => None,
    };
    let auth = Arc::new(Auth {
        node_name: config.node_name.clone(),
        anonymous: settings.authentication.anonymous,
        token_webhook: settings.authentication.webhook,
        mode: settings.authorization.mode,
        reviewer,
    });
    let status = pods.status.clone();
    let streaming = settings.enable_debugging_handlers.then(|| {
        Arc::new(Streaming {
            runtime: pods.runtime.clone(),
            streams: pods.runtime.clone(),
            pods: Arc::new(move || status.pods().into_iter().map(|p| p.pod).collect()),
            run_timeout: config.runtime_request_timeout,
        })
    });
    let http_metrics = http.metrics.server.clone();
    let router = full::router(FullState {
        http,
        summary: Some(summary),
        streaming,
        logs: Some(pods.logs.clone()),
        auth,
        configz: settings
            .enable_debugging_handlers
            .then(|| Arc::new(config.configz.clone())),
    });
    let listener = {
        let _in_servers = servers.handle.enter();
        listener::bind(addr).map_err(|source| Error::ServerAddress { addr, source })?
    };
    let bound = listener.local_addr().unwrap_or(addr);
    let shutdown = shutdown.clone();
    let tracker = Tracker::new("kubelet", servers.max_connections, http_metrics);
    let task = async move {
        listener::serve(
            listener,
            router,
            Some(tls),
            tracker,
            HttpTimeouts::KUBELET,
            shutdown,
        )
        .await
        .map_err(|e| Error::Stopped {
            component: "kubelet server",
            reason: e.to_string(),
        })
    };
    tasks.spawn_on(task, &servers.handle);
    tracing::info!(
        address = %bound,
        authorization = %settings.authorization.mode,
        anonymous = settings.authentication.anonymous,
        client_ca = ?settings.authentication.client_ca_file,
        "kubelet server (TLS) listening"
    );
    Ok(Some(bound))
}

/// The plain-HTTP listeners: healthz, and the read-only port when it is configured.
pub fn serve_local_http(
    config: &Config,
    state: &HttpState,
    summary: &Arc<SummaryProvider>,
    servers: &ServerRuntime,
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
) -> Result<Vec<SocketAddr>, Error> {
    let mut wanted = Vec::new();
    if let Some(addr) = config.healthz_address {
        wanted.push((
            "healthz",
            addr,
            crate::server::http::healthz_router(state.health.clone()),
        ));
    }
    if let Some(addr) = config.read_only_address {
        super::listeners::warn_if_exposed(addr);
        let router = crate::server::http::read_only_router(state.clone())
            .merge(crate::server::stats::router(summary.clone()));
        wanted.push(("read-only", addr, router));
    }
    let mut listening = Vec::new();
    for (name, addr, router) in wanted {
        listening.push(super::listeners::serve_http(
            name,
            addr,
            router,
            servers,
            &state.metrics.server,
            tasks,
            shutdown,
        )?);
    }
    Ok(listening)
}

/// What `/containerLogs` reads: pods and statuses from the status manager, log paths from the
/// runtime.
pub fn logs_state(status: Arc<StatusManager>, runtime: Arc<dyn RuntimeService>) -> LogsState {
    LogsState {
        pods: Arc::new(move |namespace, name| {
            status.pods().into_iter().map(|p| p.pod).find(|p| {
                p.metadata.namespace.as_deref().unwrap_or("default") == namespace
                    && p.metadata.name.as_deref() == Some(name)
            })
        }),
        runtime,
        timing: FollowTiming::default(),
    }
}
