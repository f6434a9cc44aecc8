//! The composition root of `swiftlet run`: builds every component, connects them, and owns
//! shutdown (one cancellation token, one task set). The only place that knows all concrete types.
//!
//! Today the agent is the kernel event pipeline and its API: kernel programs → pump (metrics,
//! bus) → gRPC watchers; `/healthz` and `/metrics` over HTTP.

use std::{io, path::PathBuf, sync::Arc};

use tokio::{net::UnixListener, sync::broadcast, task::JoinSet};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use crate::{
    config::RunArgs,
    kernel::{self, KernelEvents, StreamItem},
    metrics::{KernelCountersCollector, Metrics},
    server::{self, EventsService, Health, HttpState},
};

/// Capacity of the event bus; a subscriber further behind than this is told what it missed.
const BUS_CAPACITY: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kernel(#[from] kernel::Error),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("--grpc-socket {}: {source}", path.display())]
    GrpcSocket {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--http-address {addr}: {source}")]
    HttpAddress {
        addr: std::net::SocketAddr,
        #[source]
        source: io::Error,
    },
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
            Error::GrpcSocket { .. } => {
                Some("pick a writable path, or stop the swiftlet already using it".into())
            }
            Error::HttpAddress { .. } => {
                Some("pick a free address, e.g. --http-address 127.0.0.1:0".into())
            }
            Error::Metrics(_) | Error::Stopped { .. } => None,
        }
    }
}

pub async fn run(args: RunArgs) -> Result<(), Error> {
    let events = KernelEvents::load(&args.kernel.load_options())?;
    let metrics = Metrics::new()?;
    metrics
        .registry
        .register(Box::new(KernelCountersCollector::new(events.counters())?))?;
    let health = Health::default();
    let (bus, _) = broadcast::channel(BUS_CAPACITY);

    let grpc = bind_unix(&args.grpc_socket)?;
    let http = tokio::net::TcpListener::bind(args.http_address)
        .await
        .map_err(|source| Error::HttpAddress {
            addr: args.http_address,
            source,
        })?;
    let http_addr = http.local_addr().unwrap_or(args.http_address);

    let shutdown = CancellationToken::new();
    let mut tasks: JoinSet<Result<(), Error>> = JoinSet::new();
    tasks.spawn(pump(
        events,
        bus.clone(),
        metrics.clone(),
        health.clone(),
        shutdown.clone(),
    ));
    tasks.spawn({
        let shutdown = shutdown.clone();
        let service = swiftlet_proto::v1::events_server::EventsServer::new(EventsService::new(bus));
        async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(UnixListenerStream::new(grpc), shutdown.cancelled())
                .await
                .map_err(|e| Error::Stopped {
                    component: "grpc server",
                    reason: e.to_string(),
                })
        }
    });
    tasks.spawn({
        let shutdown = shutdown.clone();
        let router = server::http::router(HttpState { metrics, health });
        async move {
            axum::serve(http, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
                .map_err(|e| Error::Stopped {
                    component: "http server",
                    reason: e.to_string(),
                })
        }
    });
    tracing::info!(
        grpc_socket = %args.grpc_socket.display(),
        http = %http_addr,
        "swiftlet is running"
    );

    let mut result = Ok(());
    tokio::select! {
        () = shutdown_signal() => tracing::info!("shutting down"),
        Some(done) = tasks.join_next() => {
            result = match done {
                Ok(Ok(())) => Err(Error::Stopped { component: "a task", reason: "ended early".into() }),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(Error::Stopped { component: "a task", reason: e.to_string() }),
            };
        }
    }
    shutdown.cancel();
    while let Some(done) = tasks.join_next().await {
        if let Ok(Err(e)) = done {
            tracing::warn!(error = %e, "while shutting down");
        }
    }
    let _ = std::fs::remove_file(&args.grpc_socket);
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

fn bind_unix(path: &std::path::Path) -> Result<UnixListener, Error> {
    let err = |source| Error::GrpcSocket {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    // A socket file left by a previous run that no one listens on any more.
    if path.exists() && std::os::unix::net::UnixStream::connect(path).is_err() {
        std::fs::remove_file(path).map_err(err)?;
    }
    UnixListener::bind(path).map_err(err)
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
