//! Binding and serving the agent's plain listeners: the healthz address (`/healthz` only), the
//! read-only port (loopback unless asked for by name; a warning when it is not), and the gRPC
//! socket (mode 0600 in a directory swiftlet makes 0700: its event stream names every process
//! on the node). Each has a connection limit derived from the descriptors the process may open.
//!
//! Every listener runs on a runtime of its own ([`ServerRuntime`]): a flood of connections
//! queues tasks there, not in front of the probes and pod workers of the main runtime.
//!
//! Not here: the kubelet server (`server.rs`), the HTTP accept loop and the connection policy
//! (`server::listener`, `server::connections`).

use std::{
    io,
    net::SocketAddr,
    os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use axum::Router;
use tokio::{net::UnixListener, task::JoinSet};
use tokio_util::sync::CancellationToken;

use super::Error;
use crate::{
    metrics::ServerMetrics,
    server::{
        connections::{IoTimeouts, TrackedIo, Tracker},
        listener::{self, HttpTimeouts},
        track_requests::TrackRequests,
    },
};

/// The listeners sharing the descriptor budget: healthz, read-only, kubelet server, gRPC,
/// pod-resources.
pub const LISTENERS: usize = 5;
/// A gRPC connection with no call in flight for this long is closed (clients reconnect).
const GRPC_IDLE: Duration = Duration::from_secs(30);
/// A gRPC connection whose writes make no progress for this long is closed.
const GRPC_WRITE_STALL: Duration = Duration::from_secs(240);
/// Calls one gRPC connection may have open at once.
const GRPC_STREAMS_PER_CONNECTION: u32 = 64;

/// Where the listeners run: their own runtime, so that a flood of connections costs them and
/// not the pods' loops (probes, PLEG, pod workers) on the agent's main runtime.
#[derive(Clone, Debug)]
pub struct ServerRuntime {
    pub handle: tokio::runtime::Handle,
    pub max_connections: usize,
}

impl ServerRuntime {
    /// The listeners' runtime (two worker threads) and their connection limit.
    pub fn new(max_connections: usize) -> io::Result<(OwnedRuntime, ServerRuntime)> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("swiftlet-server")
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        Ok((
            OwnedRuntime(Some(runtime)),
            ServerRuntime {
                handle,
                max_connections,
            },
        ))
    }
}

/// A runtime owned from inside another one: dropped, it is shut down in the background (a
/// runtime may not be dropped, which joins its threads, in an async context).
pub struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Binds `addr` and serves `router` there on the server runtime, as listener `name`.
pub fn serve_http(
    name: &'static str,
    addr: SocketAddr,
    router: Router,
    servers: &ServerRuntime,
    metrics: &ServerMetrics,
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
) -> Result<SocketAddr, Error> {
    let listener = {
        // Registered with the server runtime's reactor, where it is polled.
        let _in_servers = servers.handle.enter();
        listener::bind(addr).map_err(|source| Error::HttpAddress { addr, source })?
    };
    let bound = listener.local_addr().unwrap_or(addr);
    let tracker = Tracker::new(name, servers.max_connections, metrics.clone());
    let shutdown = shutdown.clone();
    let task = async move {
        listener::serve(
            listener,
            router,
            None,
            tracker,
            HttpTimeouts::LOCAL,
            shutdown,
        )
        .await
        .map_err(|e| Error::Stopped {
            component: "http server",
            reason: e.to_string(),
        })
    };
    tasks.spawn_on(task, &servers.handle);
    Ok(bound)
}

/// Says, once, that the unauthenticated read-only port listens beyond loopback.
pub fn warn_if_exposed(read_only: SocketAddr) {
    if !read_only.ip().is_loopback() {
        tracing::warn!(
            address = %read_only,
            "the read-only port is unauthenticated and listens beyond loopback: anyone who can \
             reach it can read every pod's spec (environment values included) and the node's \
             metrics; bind it to loopback (leave --read-only-address unset) or disable it \
             (--read-only-port 0)"
        );
    }
}

/// Binds the gRPC socket at `path` so that only root can ever connect: bound in a private
/// directory, made 0600, then renamed into place (no moment where others could connect). A
/// missing parent directory is made 0700. A socket file left by a run that is gone is replaced;
/// anything else at `path` is an error.
pub fn bind_private_unix(path: &Path) -> Result<UnixListener, Error> {
    let err = |source| Error::GrpcSocket {
        path: path.to_owned(),
        source,
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    if !parent.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&parent)
            .map_err(err)?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "exists and is not a socket; swiftlet replaces only a socket a previous run left",
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "another process listens on it",
            )));
        }
    }
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "swiftlet.sock".into());
    let staging = parent.join(format!(".{file_name}.{}.bind", std::process::id()));
    if std::fs::symlink_metadata(&staging).is_ok() {
        // Our own leftover (the name has our pid): a directory holding at most the socket.
        let _ = std::fs::remove_file(staging.join(&file_name));
        std::fs::remove_dir(&staging).map_err(err)?;
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(err)?;
    let bound = staging.join(&file_name);
    let result = (|| {
        let listener = std::os::unix::net::UnixListener::bind(&bound)?;
        std::fs::set_permissions(&bound, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&bound, path)?;
        listener.set_nonblocking(true)?;
        UnixListener::from_std(listener)
    })();
    let _ = std::fs::remove_file(&bound);
    let _ = std::fs::remove_dir(&staging);
    result.map_err(err)
}

/// Binds the gRPC socket at `path` (as [`bind_private_unix`]) and serves `service` (tonic) there
/// on the server runtime: each connection may keep [`GRPC_STREAMS_PER_CONNECTION`] calls open
/// and is closed after [`GRPC_IDLE`] without one.
pub fn serve_grpc<S>(
    path: &Path,
    service: S,
    servers: &ServerRuntime,
    metrics: &ServerMetrics,
    tasks: &mut JoinSet<Result<(), Error>>,
    shutdown: &CancellationToken,
) -> Result<(), Error>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = {
        let _in_servers = servers.handle.enter();
        bind_private_unix(path)?
    };
    let tracker = Tracker::new("grpc", servers.max_connections, metrics.clone());
    let timeouts = IoTimeouts {
        idle: Some(GRPC_IDLE),
        write_stall: GRPC_WRITE_STALL,
    };
    let incoming =
        futures::stream::unfold((listener, tracker), move |(listener, tracker)| async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        if let Some(slot) = tracker.admit() {
                            let io = TrackedIo::new(stream, slot, timeouts);
                            return Some((Ok::<_, io::Error>(io), (listener, tracker)));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(listener = "grpc", error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });
    let shutdown = shutdown.clone();
    let task = async move {
        tonic::transport::Server::builder()
            .max_concurrent_streams(GRPC_STREAMS_PER_CONNECTION)
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .layer(TrackRequests)
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, shutdown.cancelled())
            .await
            .map_err(|e| Error::Stopped {
                component: "grpc server",
                reason: e.to_string(),
            })
    };
    tasks.spawn_on(task, &servers.handle);
    Ok(())
}

/// The connection limit of each listener, from the soft open files limit in force.
pub fn per_listener(nofile: u64) -> usize {
    let max = listener::connections_per_listener(nofile, LISTENERS);
    tracing::info!(
        open_files = nofile,
        per_listener = max,
        "connection limit of each listener"
    );
    max
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    #[tokio::test]
    async fn the_grpc_socket_is_root_only_in_a_private_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("run/swiftlet/swiftlet.sock");
        let listener = bind_private_unix(&path).expect("bind");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").mode() & 0o7777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.path().join("run/swiftlet")), 0o700);
        // Nothing is left beside it, and it accepts.
        let names: Vec<String> = std::fs::read_dir(dir.path().join("run/swiftlet"))
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["swiftlet.sock".to_owned()]);
        let client = tokio::net::UnixStream::connect(&path);
        let (accepted, connected) = tokio::join!(listener.accept(), client);
        assert!(accepted.is_ok() && connected.is_ok());

        // In use: refused; left behind by a run that is gone: replaced.
        let err = bind_private_unix(&path).expect_err("in use");
        assert!(err.to_string().contains("another process listens"), "{err}");
        drop(listener);
        let again = bind_private_unix(&path).expect("stale socket replaced");
        drop(again);

        // Never anything but a socket.
        let file = dir.path().join("file.sock");
        std::fs::write(&file, "x").expect("file");
        let err = bind_private_unix(&file).expect_err("a file");
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&file).expect("kept"), "x");
    }
}
