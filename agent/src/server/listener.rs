//! The agent's HTTP accept loop, shared by the healthz port, the read-only port and the kubelet
//! server (with TLS): each connection takes a slot under its listener's limit
//! ([`super::connections`]), then has [`HttpTimeouts::handshake`] to finish TLS and
//! [`HttpTimeouts::header`] to send each request's headers (hyper's header read timeout, which
//! also bounds the idle time between keep-alive requests), with request headers bounded in size.
//! Also the per-listener limits derived from the descriptors the process may open.
//!
//! Upstream: `http.Server` with the kubelet's `ReadTimeout`/`WriteTimeout`/`IdleTimeout`/
//! `MaxHeaderBytes` (`pkg/kubelet/server/server.go`); the limits are swiftlet's.

use std::{io, net::SocketAddr, sync::Arc, time::Duration};

use axum::{Router, extract::Request};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    net::{TcpListener, TcpSocket},
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::{
    auth::{PeerUser, UserInfo},
    connections::{ConnHandle, IoTimeouts, TrackedIo, Tracker},
    tls::ServerTls,
    track_requests::TrackRequests,
};

/// Most connections one listener holds, however many descriptors there are (each costs a task
/// and its buffers).
pub const MAX_CONNECTIONS: usize = 4096;
/// Fewest connections a listener is given, however few descriptors there are.
pub const MIN_CONNECTIONS: usize = 16;
/// Descriptors kept for everything but the listeners (CRI, cgroup, log and volume files, probes):
/// at least this many, or a quarter of the limit if more.
pub const RESERVED_DESCRIPTORS: u64 = 1024;
/// How long connections in flight get to finish at shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// The deadlines and bounds of one HTTP listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpTimeouts {
    /// To finish the TLS handshake (TLS listeners only).
    pub handshake: Duration,
    /// To send a request's headers, from the connection's start or the end of its previous
    /// response.
    pub header: Duration,
    /// A connection whose writes make no progress for this long is closed.
    pub write_stall: Duration,
    /// Largest request head (request line and headers); a larger one gets 431.
    pub max_header_bytes: usize,
}

impl HttpTimeouts {
    /// The healthz and read-only ports: small GETs from local scrapers and probes.
    pub const LOCAL: HttpTimeouts = HttpTimeouts {
        handshake: Duration::from_secs(10),
        header: Duration::from_secs(10),
        write_stall: Duration::from_secs(60),
        max_header_bytes: 16 * 1024,
    };
    /// The kubelet server: bearer tokens, exec commands in the query, log streams a client may
    /// pause.
    pub const KUBELET: HttpTimeouts = HttpTimeouts {
        handshake: Duration::from_secs(10),
        header: Duration::from_secs(30),
        write_stall: Duration::from_secs(240),
        max_header_bytes: 64 * 1024,
    };
}

/// Where the kernel caps listen backlogs; Go's listeners use it as their backlog.
const SOMAXCONN: &str = "/proc/sys/net/core/somaxconn";

/// Binds a TCP listener on `addr` as Go's `net.Listen` does: `SO_REUSEADDR`, and a backlog of
/// the kernel's `somaxconn` (tokio's default of 1024 overflows under a flood of connections
/// sooner, and an overflowing queue drops SYNs: the next client waits a second to retry).
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let backlog = std::fs::read_to_string(SOMAXCONN)
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(4096)
        .clamp(128, 65_535);
    socket.listen(backlog)
}

/// The connections each of `listeners` listeners may hold when the process may open `nofile`
/// descriptors: what is left after [`RESERVED_DESCRIPTORS`] (or a quarter of `nofile`),
/// shared evenly, within [`MIN_CONNECTIONS`]..=[`MAX_CONNECTIONS`].
pub fn connections_per_listener(nofile: u64, listeners: usize) -> usize {
    let reserve = RESERVED_DESCRIPTORS.max(nofile / 4);
    let shared = nofile.saturating_sub(reserve) / (listeners.max(1) as u64);
    usize::try_from(shared)
        .unwrap_or(MAX_CONNECTIONS)
        .clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

/// Serves `router` on `listener` (over TLS with `tls`, each connection taking its configuration
/// as it is when accepted) until `shutdown`, within `tracker`'s limit and `timeouts`;
/// connections in flight are closed gracefully, within a bound.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Option<ServerTls>,
    tracker: Arc<Tracker>,
    timeouts: HttpTimeouts,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let name = tracker.listener();
    let router = router.layer(TrackRequests);
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => break,
        };
        let (tcp, remote) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of descriptors and the like: transient, as Go's http.Server treats them.
                tracing::warn!(listener = name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = tracker.admit() else {
            tracing::trace!(listener = name, %remote, "at the connection limit, every connection busy: refused");
            continue;
        };
        let io = TrackedIo::new(
            tcp,
            slot,
            IoTimeouts {
                idle: None,
                write_stall: timeouts.write_stall,
            },
        );
        let conn = io.handle();
        let killed = conn.0.killed();
        let tls = tls.as_ref().map(|tls| TlsAcceptor::from(tls.config()));
        let router = router.clone();
        let shutdown = shutdown.clone();
        let tracker = tracker.clone();
        connections.spawn(async move {
            tokio::select! {
                () = connection(io, conn, router, tls, &tracker, timeouts, shutdown) => {}
                () = killed => {}
            }
        });
        while connections.try_join_next().is_some() {}
    }
    // Each connection finishes its request in flight (they were told to); a bound keeps a slow
    // client from holding the agent's exit.
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// One connection: the TLS handshake if any, then HTTP/1.1 until either side closes.
async fn connection(
    io: TrackedIo<tokio::net::TcpStream>,
    conn: ConnHandle,
    router: Router<()>,
    tls: Option<TlsAcceptor>,
    tracker: &Tracker,
    timeouts: HttpTimeouts,
    shutdown: CancellationToken,
) {
    let name = tracker.listener();
    match tls {
        None => http(io, conn, None, router, tracker, timeouts, shutdown).await,
        Some(acceptor) => {
            let stream = match tokio::time::timeout(timeouts.handshake, acceptor.accept(io)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::trace!(listener = name, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracker.timed_out();
                    return;
                }
            };
            let peer = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| UserInfo::from_certificate(leaf));
            http(stream, conn, peer, router, tracker, timeouts, shutdown).await;
        }
    }
}

async fn http<I>(
    io: I,
    conn: ConnHandle,
    peer: Option<UserInfo>,
    router: Router<()>,
    tracker: &Tracker,
    timeouts: HttpTimeouts,
    shutdown: CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = router.map_request(move |mut request: Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(conn.clone());
        if let Some(peer) = &peer {
            request
                .extensions_mut()
                .insert(PeerUser(Some(peer.clone())));
        }
        request
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header)
        .max_buf_size(timeouts.max_header_bytes.max(8192) * 2)
        .max_header_size(timeouts.max_header_bytes)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(service))
        .with_upgrades();
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        if e.is_timeout() {
            tracker.timed_out();
        }
        tracing::trace!(listener = tracker.listener(), error = %e, "connection ended");
    }
}

#[cfg(test)]
mod tests;
