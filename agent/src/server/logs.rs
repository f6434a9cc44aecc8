//! `GET /containerLogs/{namespace}/{pod}/{container}` (upstream `getContainerLogs` in
//! `pkg/kubelet/server/server.go`, with the kubelet's `GetKubeletContainerLogs` and
//! `validateContainerLogStatus`): a container's log, read by `logs::read`.
//!
//! The query is a `v1.PodLogOptions`: `tailLines` (or the older `tail`, where `all` means all),
//! `sinceSeconds` or `sinceTime`, `timestamps`, `previous`, `follow`, `limitBytes`. As upstream: a
//! value that does not decode is 400, a decoded one that is invalid is 422 (both name the
//! parameter), an unknown pod or container is 404, and a container with no log to show (waiting
//! to start, or no previous instance for `previous`) is 400 with upstream's message. Booleans
//! decode as Kubernetes query parameters do: absent, `false` or `0` is false, anything else true.
//!
//! The kubelet serves this only on its authenticated port; [`router`] is mounted wherever the app
//! decides. Memory per request is bounded whatever the log holds (`logs::read`): a few chunks in
//! flight to the client.

use std::{collections::HashMap, convert::Infallible, sync::Arc};

use axum::{
    Router,
    body::Body,
    extract::{Path, Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use bytes::Bytes;
use k8s_openapi::{
    api::core::v1::{ContainerStatus, Pod},
    jiff::{SignedDuration, Timestamp},
};
use tokio_stream::wrappers::ReceiverStream;

use crate::{
    cri::RuntimeService,
    logs::{FollowTiming, LogOptions, read_logs},
};

/// Chunks of a log read ahead of the client.
const LOG_CHUNKS_IN_FLIGHT: usize = 4;

/// The pod named `name` in `namespace`, with its latest status.
pub type PodByName = Arc<dyn Fn(&str, &str) -> Option<Pod> + Send + Sync>;

#[derive(Clone)]
pub struct LogsState {
    pub pods: PodByName,
    pub runtime: Arc<dyn RuntimeService>,
    pub timing: FollowTiming,
}

/// The `/containerLogs` routes.
pub fn router(state: LogsState) -> Router {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        .with_state(state)
}

/// A refusal: status and a plain-text message.
struct Refusal(StatusCode, String);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        (self.0, format!("{}\n", self.1)).into_response()
    }
}

fn bad_request(message: impl Into<String>) -> Refusal {
    Refusal(StatusCode::BAD_REQUEST, message.into())
}

/// The request's options, and whether the previous instance is wanted.
#[derive(Debug, PartialEq, Eq)]
struct LogRequest {
    options: LogOptions,
    previous: bool,
}

/// Decodes and validates the query (upstream `DecodeParameters` then `ValidatePodLogOptions`).
fn parse_query(query: &[(String, String)], now: Timestamp) -> Result<LogRequest, Refusal> {
    let mut params: HashMap<&str, &str> = query
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    // The older `tail` parameter; `all` is the same as none.
    if let Some(tail) = params.remove("tail")
        && tail != "all"
    {
        params.insert("tailLines", tail);
    }
    let flag = |name: &str| {
        params
            .get(name)
            .is_some_and(|v| *v != "0" && !v.eq_ignore_ascii_case("false"))
    };
    let integer = |name: &'static str| -> Result<Option<i64>, Refusal> {
        params
            .get(name)
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    bad_request(format!(
                        "unable to decode query: {name}: {v:?} is not an integer"
                    ))
                })
            })
            .transpose()
    };
    let invalid = |message: String| Refusal(StatusCode::UNPROCESSABLE_ENTITY, message);
    let tail_lines = integer("tailLines")?;
    let since_seconds = integer("sinceSeconds")?;
    let limit_bytes = integer("limitBytes")?;
    let since_time = params
        .get("sinceTime")
        .map(|v| {
            v.parse::<Timestamp>().map_err(|_| {
                bad_request(format!(
                    "unable to decode query: sinceTime: {v:?} is not an RFC 3339 time"
                ))
            })
        })
        .transpose()?;
    if let Some(n) = tail_lines.filter(|n| *n < 0) {
        return Err(invalid(format!(
            "tailLines: Invalid value: {n}: must be greater than or equal to 0"
        )));
    }
    if let Some(n) = limit_bytes.filter(|n| *n < 1) {
        return Err(invalid(format!(
            "limitBytes: Invalid value: {n}: must be greater than 0"
        )));
    }
    if let Some(n) = since_seconds.filter(|n| *n < 1) {
        return Err(invalid(format!(
            "sinceSeconds: Invalid value: {n}: must be greater than 0"
        )));
    }
    if since_seconds.is_some() && since_time.is_some() {
        return Err(invalid(
            "at most one of `sinceTime` or `sinceSeconds` may be specified".to_owned(),
        ));
    }
    let since = since_time
        .or_else(|| since_seconds.and_then(|s| now.checked_sub(SignedDuration::from_secs(s)).ok()));
    Ok(LogRequest {
        options: LogOptions {
            tail_lines: tail_lines.and_then(|n| u64::try_from(n).ok()),
            since,
            timestamps: flag("timestamps"),
            limit_bytes: limit_bytes.and_then(|n| u64::try_from(n).ok()),
            follow: flag("follow"),
        },
        previous: flag("previous"),
    })
}

/// The container instance whose log is wanted (upstream `validateContainerLogStatus`), as the
/// runtime's id without its `containerd://` prefix.
fn container_to_read(pod: &Pod, container: &str, previous: bool) -> Result<String, Refusal> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.as_ref();
    let found: Option<&ContainerStatus> = status.and_then(|s| {
        [
            s.container_statuses.as_ref(),
            s.init_container_statuses.as_ref(),
            s.ephemeral_container_statuses.as_ref(),
        ]
        .into_iter()
        .flatten()
        .flatten()
        .find(|c| c.name == container)
    });
    let Some(found) = found else {
        return Err(bad_request(format!(
            "container {container:?} in pod {pod_name:?} is not available"
        )));
    };
    let state = found.state.clone().unwrap_or_default();
    let last_terminated = found
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref());
    let last_id = last_terminated
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    let terminated_message =
        || format!("container {container:?} in pod {pod_name:?} is terminated");
    let id = if previous {
        last_id.ok_or_else(|| {
            bad_request(format!(
                "previous terminated container {container:?} in pod {pod_name:?} not found"
            ))
        })?
    } else if state.running.is_some() {
        found.container_id.clone().unwrap_or_default()
    } else if let Some(terminated) = &state.terminated {
        match terminated.container_id.clone().filter(|id| !id.is_empty()) {
            Some(id) => id,
            None => last_id.ok_or_else(|| bad_request(terminated_message()))?,
        }
    } else if last_terminated.is_some() {
        last_id.ok_or_else(|| bad_request(terminated_message()))?
    } else if let Some(waiting) = &state.waiting {
        let reason = waiting.reason.as_deref().unwrap_or_default();
        let why = match reason {
            "ErrImagePull" => "image can't be pulled".to_owned(),
            "ImagePullBackOff" => "trying and failing to pull image".to_owned(),
            other => other.to_owned(),
        };
        return Err(bad_request(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start: {why}"
        )));
    } else {
        return Err(bad_request(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start - no logs yet"
        )));
    };
    let id = id.split_once("://").map_or(id.as_str(), |(_, id)| id);
    if id.is_empty() {
        return Err(bad_request(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start - no logs yet"
        )));
    }
    Ok(id.to_owned())
}

fn has_container(pod: &Pod, name: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers.iter().any(|c| c.name == name)
            || s.init_containers.iter().flatten().any(|c| c.name == name)
            || s.ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == name)
    })
}

async fn container_logs(
    State(state): State<LogsState>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Response, Refusal> {
    let request = parse_query(&query, Timestamp::now())?;
    let Some(pod) = (state.pods)(&namespace, &pod_name) else {
        return Err(Refusal(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        ));
    };
    if !has_container(&pod, &container) {
        return Err(Refusal(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        ));
    }
    let id = container_to_read(&pod, &container, request.previous)?;
    let status = state
        .runtime
        .container_status(&id)
        .await
        .map_err(|e| bad_request(format!("failed to get container status {id:?}: {e}")))?;
    let path = std::path::PathBuf::from(&status.log_path);
    if let Err(e) = tokio::fs::metadata(&path).await {
        return Err(bad_request(format!(
            "failed to open log file {:?}: {e}",
            path.display().to_string()
        )));
    }
    // A few chunks in flight (each about 64 KiB): the reader waits for a slow client rather
    // than reading ahead.
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(LOG_CHUNKS_IN_FLIGHT);
    let runtime = state.runtime.clone();
    let timing = state.timing;
    tokio::spawn(async move {
        if let Err(e) = read_logs(&path, &id, &request.options, runtime.as_ref(), tx, timing).await
        {
            tracing::warn!(container = id, error = %e, "serving a container log");
        }
    });
    let chunks = futures::StreamExt::map(ReceiverStream::new(rx), Ok::<_, Infallible>);
    let body = Body::from_stream(chunks);
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response())
}

#[cfg(test)]
mod tests;
