//! The full server's container access: `/exec`, `/attach` and `/portForward` ask the runtime
//! (CRI `Exec`/`Attach`/`PortForward`) for a session on its streaming server and proxy the
//! client's upgraded connection (SPDY or WebSocket) to it byte for byte; `/run` runs a command
//! and answers its output (CRI `ExecSync`, bounded by `runtimeRequestTimeout`: the runtime kills
//! the command then); `/runningpods/` lists the pods with running containers. Never on the
//! read-only port.
//!
//! Deviation: upstream's `/run` passes no timeout to `ExecSync` and relies on the request's
//! context (the kubelet server's 4 h write timeout, or the client hanging up); swiftlet gives the
//! command `runtimeRequestTimeout` (default 2 min), so a command that never ends cannot hold a
//! connection and a runtime call forever.
//!
//! Not here: the streaming protocols themselves (the runtime's streaming server speaks them;
//! the proxy only carries bytes, `stream_proxy.rs`). Upstream: `pkg/kubelet/server/server.go`
//! (`getExec`, `getAttach`, `getPortForward`, `getRun`, `getRunningPods`, `proxyStream` —
//! upstream proxies since the redirect option was removed) and `remotecommand.NewOptions`.

use std::{sync::Arc, time::Duration};

use axum::{
    Router,
    extract::{Path, Request, State},
    http::{StatusCode, Uri, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;

use super::{stats::PodLister, stream_proxy::proxy_stream};
use crate::{
    container::LABEL_POD_UID,
    cri::{RuntimeService, StreamingService},
};

pub struct Streaming {
    pub runtime: Arc<dyn RuntimeService>,
    pub streams: Arc<dyn StreamingService>,
    pub pods: PodLister,
    /// How long `/run` lets a command take (`runtimeRequestTimeout`): the runtime kills it
    /// then, and the call itself gives up shortly after.
    pub run_timeout: Duration,
}

pub fn router(streaming: Arc<Streaming>) -> Router {
    Router::new()
        .route("/exec/{namespace}/{pod}/{container}", get(exec).post(exec))
        .route(
            "/exec/{namespace}/{pod}/{uid}/{container}",
            get(exec_uid).post(exec_uid),
        )
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(attach).post(attach),
        )
        .route(
            "/attach/{namespace}/{pod}/{uid}/{container}",
            get(attach_uid).post(attach_uid),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            get(port_forward).post(port_forward),
        )
        .route(
            "/portForward/{namespace}/{pod}/{uid}",
            get(port_forward_uid).post(port_forward_uid),
        )
        .route("/run/{namespace}/{pod}/{container}", post(run))
        .route("/run/{namespace}/{pod}/{uid}/{container}", post(run_uid))
        .route("/runningpods/", get(running_pods))
        .with_state(streaming)
}

/// The stream options of an exec or attach request (upstream `remotecommand.NewOptions`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
    /// `command` values, in order (exec only).
    pub command: Vec<String>,
}

/// A stream request that asks for no stream at all (upstream's message).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("you must specify at least 1 of stdin, stdout, stderr")]
pub struct NoStreams;

impl StreamOptions {
    pub fn from_query(query: &str) -> Result<StreamOptions, NoStreams> {
        let pairs = query_pairs(query);
        let flag = |key: &str| pairs.iter().any(|(k, v)| k == key && v == "1");
        let tty = flag("tty");
        // A terminal merges stderr into stdout; upstream drops stderr rather than refusing.
        let stderr = flag("stderr") && !tty;
        let options = StreamOptions {
            stdin: flag("stdin"),
            stdout: flag("stdout"),
            stderr,
            tty,
            command: pairs
                .iter()
                .filter(|(k, _)| k == "command")
                .map(|(_, v)| v.clone())
                .collect(),
        };
        if !options.stdin && !options.stdout && !options.stderr {
            return Err(NoStreams);
        }
        Ok(options)
    }
}

/// The decoded `key=value` pairs of a query string.
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(b)) => {
                out.push(b);
                i += 2;
            }
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn error(code: StatusCode, message: impl Into<String>) -> Response {
    (code, message.into()).into_response()
}

/// A request refused before any session: its status and message.
#[derive(Debug)]
struct Refused(StatusCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        error(self.0, self.1)
    }
}

impl Streaming {
    /// The pod `namespace/name` (and `uid` when given), else 404.
    fn pod(&self, namespace: &str, name: &str, uid: Option<&str>) -> Result<Pod, Refused> {
        (self.pods)()
            .into_iter()
            .find(|p| {
                p.metadata.namespace.as_deref() == Some(namespace)
                    && p.metadata.name.as_deref() == Some(name)
                    && uid.is_none_or(|u| p.metadata.uid.as_deref() == Some(u))
            })
            .ok_or_else(|| Refused(StatusCode::NOT_FOUND, "pod does not exist".into()))
    }

    /// The running container's runtime id, else 404.
    fn container_id(&self, pod: &Pod, container: &str) -> Result<String, Refused> {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|statuses| {
                statuses.iter().find(|s| {
                    s.name == container && s.state.as_ref().is_some_and(|st| st.running.is_some())
                })
            })
            .and_then(|s| s.container_id.as_deref())
            .map(|id| id.split_once("://").map_or(id, |(_, id)| id).to_owned())
            .ok_or_else(|| {
                Refused(
                    StatusCode::NOT_FOUND,
                    format!("container not found ({container:?})"),
                )
            })
    }

    async fn sandbox_id(&self, pod: &Pod) -> Result<String, Refused> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let filter = cri::PodSandboxFilter {
            state: Some(cri::PodSandboxStateValue {
                state: cri::PodSandboxState::SandboxReady as i32,
            }),
            label_selector: [(LABEL_POD_UID.to_owned(), uid)].into(),
            ..cri::PodSandboxFilter::default()
        };
        let sandboxes = self
            .runtime
            .list_pod_sandbox(Some(filter))
            .await
            .map_err(|e| Refused(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        sandboxes
            .into_iter()
            .next()
            .map(|s| s.id)
            .ok_or_else(|| Refused(StatusCode::NOT_FOUND, "pod sandbox not found".into()))
    }
}

async fn exec(
    State(s): State<Arc<Streaming>>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    stream_session(
        &s,
        Session::Exec,
        &namespace,
        &pod,
        None,
        &container,
        request,
    )
    .await
}

async fn exec_uid(
    State(s): State<Arc<Streaming>>,
    Path((namespace, pod, uid, container)): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    stream_session(
        &s,
        Session::Exec,
        &namespace,
        &pod,
        Some(&uid),
        &container,
        request,
    )
    .await
}

async fn attach(
    State(s): State<Arc<Streaming>>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    stream_session(
        &s,
        Session::Attach,
        &namespace,
        &pod,
        None,
        &container,
        request,
    )
    .await
}

async fn attach_uid(
    State(s): State<Arc<Streaming>>,
    Path((namespace, pod, uid, container)): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    stream_session(
        &s,
        Session::Attach,
        &namespace,
        &pod,
        Some(&uid),
        &container,
        request,
    )
    .await
}

#[derive(Clone, Copy)]
enum Session {
    Exec,
    Attach,
}

async fn stream_session(
    s: &Streaming,
    session: Session,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    container: &str,
    request: Request,
) -> Response {
    let options = match StreamOptions::from_query(request.uri().query().unwrap_or_default()) {
        Ok(o) => o,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let pod = match s.pod(namespace, name, uid) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let container_id = match s.container_id(&pod, container) {
        Ok(id) => id,
        Err(r) => return r.into_response(),
    };
    let url = match session {
        Session::Exec => {
            s.streams
                .exec(cri::ExecRequest {
                    container_id,
                    cmd: options.command,
                    tty: options.tty,
                    stdin: options.stdin,
                    stdout: options.stdout,
                    stderr: options.stderr,
                })
                .await
        }
        Session::Attach => {
            s.streams
                .attach(cri::AttachRequest {
                    container_id,
                    stdin: options.stdin,
                    tty: options.tty,
                    stdout: options.stdout,
                    stderr: options.stderr,
                })
                .await
        }
    };
    match url {
        Ok(url) => proxy_stream(&url, request).await,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn port_forward(
    State(s): State<Arc<Streaming>>,
    Path((namespace, pod)): Path<(String, String)>,
    request: Request,
) -> Response {
    forward(&s, &namespace, &pod, None, request).await
}

async fn port_forward_uid(
    State(s): State<Arc<Streaming>>,
    Path((namespace, pod, uid)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    forward(&s, &namespace, &pod, Some(&uid), request).await
}

async fn forward(
    s: &Streaming,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    request: Request,
) -> Response {
    let pod = match s.pod(namespace, name, uid) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let sandbox = match s.sandbox_id(&pod).await {
        Ok(id) => id,
        Err(r) => return r.into_response(),
    };
    // WebSocket clients name their ports in the query; SPDY ones per stream, later.
    let mut ports = Vec::new();
    for (k, v) in query_pairs(request.uri().query().unwrap_or_default()) {
        if k == "port" {
            match v.parse::<u16>() {
                Ok(p) if p > 0 => ports.push(i32::from(p)),
                _ => return error(StatusCode::BAD_REQUEST, format!("invalid port {v:?}")),
            }
        }
    }
    match s
        .streams
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: sandbox,
            port: ports,
        })
        .await
    {
        Ok(url) => proxy_stream(&url, request).await,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn run(
    State(s): State<Arc<Streaming>>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    uri: Uri,
) -> Response {
    run_in_container(&s, &namespace, &pod, None, &container, &uri).await
}

async fn run_uid(
    State(s): State<Arc<Streaming>>,
    Path((namespace, pod, uid, container)): Path<(String, String, String, String)>,
    uri: Uri,
) -> Response {
    run_in_container(&s, &namespace, &pod, Some(&uid), &container, &uri).await
}

/// Upstream `getRun`: `cmd` split on spaces, the combined output answered.
async fn run_in_container(
    s: &Streaming,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
    container: &str,
    uri: &Uri,
) -> Response {
    let pod = match s.pod(namespace, name, uid) {
        Ok(p) => p,
        Err(r) => return r.into_response(),
    };
    let id = match s.container_id(&pod, container) {
        Ok(id) => id,
        Err(r) => return r.into_response(),
    };
    let cmd: Vec<String> = query_pairs(uri.query().unwrap_or_default())
        .into_iter()
        .find(|(k, _)| k == "cmd")
        .map(|(_, v)| v.split(' ').map(str::to_owned).collect())
        .unwrap_or_default();
    match s.runtime.exec_sync(&id, cmd, s.run_timeout).await {
        Ok(out) => {
            let mut body = out.stdout;
            body.extend(out.stderr);
            (StatusCode::OK, body).into_response()
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Upstream `getRunningPods`: a PodList of the pods with a running container, each with only
/// its name, namespace, UID and containers' names and images.
async fn running_pods(State(s): State<Arc<Streaming>>) -> Response {
    let items: Vec<serde_json::Value> = (s.pods)()
        .into_iter()
        .filter_map(|pod| {
            let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
            let running: Vec<serde_json::Value> = statuses
                .iter()
                .filter(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
                .map(|c| serde_json::json!({ "name": c.name, "image": c.image }))
                .collect();
            (!running.is_empty()).then(|| {
                serde_json::json!({
                    "metadata": {
                        "name": pod.metadata.name,
                        "namespace": pod.metadata.namespace,
                        "uid": pod.metadata.uid,
                    },
                    "spec": { "containers": running },
                    "status": {},
                })
            })
        })
        .collect();
    let list = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items,
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        list.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests;
