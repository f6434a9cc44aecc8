//! Pushing pod statuses to the API server (upstream `status_manager.go`: `Start`, `syncBatch`,
//! `syncPod`, and `statusutil.PatchPodStatus`). The status manager's change signal coalesces like
//! upstream's one-slot `podStatusChannel`: on each wake-up the syncer reads every status, and for
//! each pod from the API server whose version is newer than the one last sent, sends one PATCH of
//! `pods/<name>/status`. So a pod gets at most one PATCH per change, however many changes piled
//! up meanwhile. A failed PATCH is tried again at the next change or the next sync period.
//!
//! The patch is a strategic merge patch, as upstream's: `metadata.uid` as a precondition (a pod
//! recreated under the same name is not overwritten: 409) and the status; conditions merge by
//! `type`, so those other components own (upstream's `mergePodStatus` keeps them) stay. Fields
//! the agent sent before and no longer sets are sent as `null`, which deletes them. A 404 means
//! the pod is gone: nothing to do.
//!
//! Not here: static pods (their status would go to mirror pods, which do not exist yet), deleting
//! a terminated pod with `deletionTimestamp` (upstream's `canBeDeleted`: needs the pod workers'
//! "finished" signal), holding back a terminal phase while containers may run, `needsReconcile`.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Error, is_not_found};
use crate::{
    sources::{CONFIG_SOURCE_ANNOTATION, Source},
    status::{PodWithStatus, StatusManager},
};

/// What was last accepted by the API server for one pod.
#[derive(Debug)]
struct Sent {
    version: u64,
    /// The status as sent, to null out fields the agent stops setting.
    status: Map<String, Value>,
}

pub(super) struct StatusSync {
    client: Client,
    status: Arc<StatusManager>,
    period: Duration,
    /// Pod UID → what the API server has from the agent (upstream `apiStatusVersions`).
    sent: HashMap<String, Sent>,
}

impl StatusSync {
    pub(super) fn new(client: Client, status: Arc<StatusManager>, period: Duration) -> Self {
        StatusSync {
            client,
            status,
            period,
            sent: HashMap::new(),
        }
    }

    pub(super) async fn run(mut self, cancel: CancellationToken) {
        let mut changes = self.status.subscribe();
        let mut resync = tokio::time::interval_at(Instant::now() + self.period, self.period);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Marked seen before reading, so a change made during the batch wakes the next one.
            changes.borrow_and_update();
            self.sync_batch().await;
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
                _ = resync.tick() => {}
            }
        }
    }

    /// Upstream `syncBatch`: every API pod whose status version is newer than the one sent.
    async fn sync_batch(&mut self) {
        let pods = self.status.pods();
        let live: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.pod.metadata.uid.as_deref())
            .collect();
        self.sent.retain(|uid, _| live.contains(uid.as_str()));
        for PodWithStatus { pod, version } in pods {
            if !is_api_pod(&pod) {
                continue;
            }
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let previous = self.sent.get(&uid);
            if previous.is_some_and(|s| s.version == version) {
                continue;
            }
            let status = status_object(&pod);
            let body = patch_body(&uid, &status, previous.map(|s| &s.status));
            match self.patch(&pod, &body).await {
                Ok(()) => {
                    self.sent.insert(uid, Sent { version, status });
                }
                Err(error) => tracing::warn!(%error, pod = uid, "failed to update the pod status"),
            }
        }
    }

    async fn patch(&self, pod: &Pod, body: &Value) -> Result<(), Error> {
        let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            return Ok(());
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(body))
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if is_not_found(&error) => {
                tracing::debug!(namespace, name, "pod was deleted; its status is not sent");
                Ok(())
            }
            Err(source) => Err(Error::Api {
                what: format!("PATCH namespaces/{namespace}/pods/{name}/status"),
                source,
            }),
        }
    }
}

/// Whether the pod came from the API server (`kubernetes.io/config.source: api`).
fn is_api_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s == Source::Api.as_str())
}

fn status_object(pod: &Pod) -> Map<String, Value> {
    match serde_json::to_value(&pod.status) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// `{"metadata":{"uid":…},"status":…}` with `null` for fields sent before and now unset.
fn patch_body(
    uid: &str,
    status: &Map<String, Value>,
    previous: Option<&Map<String, Value>>,
) -> Value {
    let mut patch = status.clone();
    for key in previous.into_iter().flat_map(Map::keys) {
        if !patch.contains_key(key) {
            patch.insert(key.clone(), Value::Null);
        }
    }
    json!({ "metadata": { "uid": uid }, "status": patch })
}

#[cfg(test)]
mod tests;
