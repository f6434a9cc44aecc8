//! Watch streams: newline-delimited `{"type": …, "object": …}` events
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>),
//! from a resourceVersion or from the current state (synthetic ADDED events), filtered by the
//! selectors the way the watch cache filters (`storage/cacher/cache_watcher.go`
//! `convertToWatchEvent`: an object that starts matching is ADDED, one that stops matching is
//! DELETED with its previous content), with bookmarks (`allowWatchBookmarks`,
//! <https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks>), the initial-
//! events-end bookmark of `sendInitialEvents`, and `timeoutSeconds`.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use super::{
    meta::meta_str,
    resources::Resource,
    selector::{FieldSelector, LabelSelector},
    status::ApiError,
    store::{Change, ChangeType, Store},
};

/// A watch as the query asked for it.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    pub resource: &'static Resource,
    pub namespace: Option<String>,
    pub fields: FieldSelector,
    pub labels: LabelSelector,
    /// `None`: "Start at most recent" — the current objects as ADDED, then changes (a
    /// resourceVersion of "0" or none); `Some(rv)`: the changes after `rv`.
    pub after: Option<u64>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Duration,
}

impl WatchRequest {
    fn matches(&self, object: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| meta_str(object, "namespace") == Some(ns))
            && self.fields.matches(object)
            && self.labels.matches(object)
    }

    /// The event a change is to this watch, if any (`convertToWatchEvent`).
    pub fn event(&self, change: &Change) -> Option<Value> {
        if !std::ptr::eq(change.resource, self.resource) {
            return None;
        }
        let now = change.change != ChangeType::Deleted && self.matches(&change.object);
        let before = change.previous.as_ref().is_some_and(|p| self.matches(p));
        let (kind, object) = match (now, before) {
            (true, false) => ("ADDED", change.object.clone()),
            (true, true) => ("MODIFIED", change.object.clone()),
            (false, true) => {
                // The previous content, at the version of this change.
                let mut gone = change.previous.clone().unwrap_or(Value::Null);
                super::meta::set_meta(
                    &mut gone,
                    "resourceVersion",
                    Value::String(change.revision.to_string()),
                );
                ("DELETED", gone)
            }
            (false, false) => return None,
        };
        Some(json!({"type": kind, "object": object}))
    }

    fn bookmark(&self, revision: u64, initial_end: bool) -> Value {
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({
            "type": "BOOKMARK",
            "object": {
                "kind": self.resource.kind,
                "apiVersion": self.resource.api_version(),
                "metadata": metadata,
            },
        })
    }
}

/// What a watch starts from, taken under the store's lock.
pub struct WatchStart {
    /// Events to send first.
    events: Vec<Value>,
    backlog: Vec<Arc<Change>>,
    receiver: broadcast::Receiver<Arc<Change>>,
    /// Every change up to this revision has been considered.
    progress: u64,
}

/// Starts `request` on `store`: 410 Expired when its version was compacted.
pub fn start(store: &Store, request: &WatchRequest) -> Result<WatchStart, ApiError> {
    let revision = store.revision();
    match request.after {
        Some(after) if !request.send_initial_events => {
            let (backlog, receiver) = store.watch_from(after)?;
            Ok(WatchStart {
                events: Vec::new(),
                backlog,
                receiver,
                progress: after,
            })
        }
        _ => {
            let mut events: Vec<Value> = store
                .list(request.resource, request.namespace.as_deref(), None)
                .filter(|(_, o)| request.matches(o))
                .map(|(_, o)| json!({"type": "ADDED", "object": o}))
                .collect();
            if request.send_initial_events {
                events.push(request.bookmark(revision, true));
            }
            Ok(WatchStart {
                events,
                backlog: Vec::new(),
                receiver: store.subscribe(),
                progress: revision,
            })
        }
    }
}

/// The single-event stream of a watch that cannot start: an ERROR event with the `Status`
/// (upstream's cacher answers an expired version this way, with HTTP 200).
pub fn error_event(error: &ApiError) -> Bytes {
    line(&json!({"type": "ERROR", "object": error.to_status()}))
}

fn line(event: &Value) -> Bytes {
    let mut text = event.to_string();
    text.push('\n');
    Bytes::from(text)
}

/// Sends the watch's events to `out` until the timeout, the client going away, a lagging
/// subscription (the client re-watches) or `dropped` changing (the injected fault).
pub async fn run(
    request: WatchRequest,
    start: WatchStart,
    out: mpsc::Sender<Bytes>,
    mut dropped: watch::Receiver<u64>,
    bookmark_interval: Duration,
) {
    let WatchStart {
        events,
        backlog,
        mut receiver,
        mut progress,
    } = start;
    for event in events {
        if out.send(line(&event)).await.is_err() {
            return;
        }
    }
    for change in backlog {
        progress = progress.max(change.revision);
        if let Some(event) = request.event(&change)
            && out.send(line(&event)).await.is_err()
        {
            return;
        }
    }
    let deadline = tokio::time::sleep(request.timeout);
    tokio::pin!(deadline);
    let mut bookmarks = tokio::time::interval_at(
        tokio::time::Instant::now() + bookmark_interval,
        bookmark_interval,
    );
    loop {
        tokio::select! {
            () = &mut deadline => return,
            // Dropped by the fault switch (or the server is going away).
            _ = dropped.changed() => return,
            _ = bookmarks.tick() => {
                if request.bookmarks && out.send(line(&request.bookmark(progress, false))).await.is_err() {
                    return;
                }
            }
            received = receiver.recv() => {
                let change = match received {
                    Ok(change) => change,
                    // Too slow, or the store went away: end; the client resumes from its version.
                    Err(_) => return,
                };
                // Changes already in the backlog or before the start.
                if change.revision <= progress {
                    continue;
                }
                progress = change.revision;
                if let Some(event) = request.event(&change)
                    && out.send(line(&event)).await.is_err()
                {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
