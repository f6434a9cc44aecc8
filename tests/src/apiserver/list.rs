//! list and watch: selectors, `limit`/`continue` pages, the list's resourceVersion, and the
//! watch response streaming [`super::watch`]'s events
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks>,
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#semantics-for-get-and-list>).

use std::{convert::Infallible, sync::Arc, time::Duration};

use axum::{
    body::Body,
    http::{Response, StatusCode, header},
};
use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_stream::StreamExt as _;

use super::{
    ApiServer,
    http::Params,
    resources::Resource,
    selector::{FieldSelector, LabelSelector},
    status::{ApiError, ApiResult},
    store::Key,
    watch::{self, WatchRequest},
};

/// How long a watch from a version the store has not reached waits for it before failing
/// (the watch cache's `blockTimeout`).
const TOO_LARGE_WAIT: Duration = Duration::from_secs(3);

/// Upstream's default watch timeout when the client gives none (`--min-request-timeout`).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

pub(super) fn with_type(resource: &Resource, object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(map) = object.as_object_mut() {
        map.insert("kind".to_owned(), json!(resource.kind));
        map.insert("apiVersion".to_owned(), json!(resource.api_version()));
    }
    object
}

/// The continue token: the list's revision and the last key returned, hex-encoded JSON
/// (upstream's is base64 JSON of the same two things).
fn encode_continue(revision: u64, key: &Key) -> String {
    hex::encode(
        json!({"rv": revision, "r": key.resource, "ns": key.namespace, "n": key.name}).to_string(),
    )
}

fn decode_continue(token: &str) -> ApiResult<(u64, Key)> {
    let invalid = || ApiError::bad_request("continue key is not valid");
    let bytes = hex::decode(token).map_err(|_| invalid())?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    let text = |k: &str| {
        value
            .get(k)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(invalid)
    };
    Ok((
        value
            .get("rv")
            .and_then(Value::as_u64)
            .ok_or_else(invalid)?,
        Key {
            resource: text("r")?,
            namespace: text("ns")?,
            name: text("n")?,
        },
    ))
}

fn parse_version(text: &str) -> ApiResult<u64> {
    text.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version {text:?}")))
}

/// A list's resourceVersion semantics
/// (<https://kubernetes.io/docs/reference/using-api/api-concepts/#semantics-for-get-and-list>):
/// unset or "0" — the current state; `NotOlderThan` — the current state, unless the version is
/// in the future; `Exact` — only the current version (no snapshots are kept: an older one is
/// 410 Expired).
fn check_list_version(query: &Params, current: u64) -> ApiResult<()> {
    let Some(text) = query.get("resourceVersion").filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let version = parse_version(text)?;
    match query.get("resourceVersionMatch").map(String::as_str) {
        Some("Exact") if version != current => Err(ApiError::expired(format!(
            "too old resource version: {version} ({current})"
        ))),
        Some("Exact" | "NotOlderThan") | None if version > current => Err(ApiError {
            code: 504,
            reason: "Timeout",
            message: format!("Too large resource version: {version}, current: {current}"),
            details: None,
        }),
        Some("Exact" | "NotOlderThan" | "") | None => Ok(()),
        Some(other) => Err(ApiError::bad_request(format!(
            "unknown resourceVersionMatch {other:?}"
        ))),
    }
}

pub(super) fn list(
    server: &ApiServer,
    resource: &'static Resource,
    namespace: Option<&str>,
    query: &Params,
) -> ApiResult<Value> {
    let fields = FieldSelector::parse(
        resource,
        query.get("fieldSelector").map_or("", String::as_str),
    )?;
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?;
    let limit = query
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0);
    let store = server.store();
    let (revision, after) = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let (revision, key) = decode_continue(token)?;
            if revision < store.compacted() {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter.",
                ));
            }
            (revision, Some(key))
        }
        None => {
            check_list_version(query, store.revision())?;
            (store.revision(), None)
        }
    };
    let mut items = Vec::new();
    let mut last: Option<Key> = None;
    let mut more = false;
    for (key, object) in store.list(resource, namespace, after.as_ref()) {
        if !fields.matches(object) || !labels.matches(object) {
            continue;
        }
        if limit.is_some_and(|l| items.len() >= l) {
            more = true;
            break;
        }
        items.push(with_type(resource, object));
        last = Some(key.clone());
    }
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if more && let Some(last) = &last {
        metadata["continue"] = json!(encode_continue(revision, last));
    }
    Ok(json!({
        "kind": format!("{}List", resource.kind),
        "apiVersion": resource.api_version(),
        "metadata": metadata,
        "items": items,
    }))
}

pub(super) fn watch_response(
    server: &Arc<ApiServer>,
    resource: &'static Resource,
    namespace: Option<&str>,
    query: &Params,
) -> ApiResult<Response<Body>> {
    let flag = |k: &str| matches!(query.get(k).map(String::as_str), Some("true" | "1"));
    let after = match query.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(text) => Some(parse_version(text)?),
    };
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
    let request = WatchRequest {
        resource,
        namespace: namespace.map(str::to_owned),
        fields: FieldSelector::parse(
            resource,
            query.get("fieldSelector").map_or("", String::as_str),
        )?,
        labels: LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))?,
        after,
        send_initial_events: flag("sendInitialEvents"),
        bookmarks: flag("allowWatchBookmarks"),
        timeout,
    };
    let (out, events) = tokio::sync::mpsc::channel::<Bytes>(64);
    let dropped = server.faults.watch_dropped();
    let server = server.clone();
    tokio::spawn(async move {
        let started = match wait_for_version(&server, &request).await {
            Ok(()) => watch::start(&server.store(), &request),
            Err(error) => Err(error),
        };
        match started {
            Ok(start) => {
                watch::run(
                    request,
                    start,
                    out,
                    dropped,
                    server.config.bookmark_interval,
                )
                .await;
            }
            // One ERROR event, then the stream ends.
            Err(error) => {
                let _ = out.send(watch::error_event(&error)).await;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(events).map(Ok::<_, Infallible>);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A watch from a version newer than the store's waits for the store to reach it, then fails
/// with 504 `Timeout` and the cause `ResourceVersionTooLarge`, as the watch cache does
/// (`waitUntilFreshAndBlock`, `storage.NewTooLargeResourceVersionError`).
async fn wait_for_version(server: &ApiServer, request: &WatchRequest) -> ApiResult<()> {
    let Some(after) = request.after.filter(|_| !request.send_initial_events) else {
        return Ok(());
    };
    let mut changes = {
        let store = server.store();
        if store.revision() >= after {
            return Ok(());
        }
        store.subscribe()
    };
    let caught_up = tokio::time::timeout(TOO_LARGE_WAIT, async {
        loop {
            match changes.recv().await {
                Ok(change) if change.revision >= after => return true,
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return false,
            }
        }
    })
    .await
    .unwrap_or(false);
    if caught_up {
        return Ok(());
    }
    let current = server.store().revision();
    Err(ApiError {
        code: 504,
        reason: "Timeout",
        message: format!("Too large resource version: {after}, current: {current}"),
        details: Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        })),
    })
}
