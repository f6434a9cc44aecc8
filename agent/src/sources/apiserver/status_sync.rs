//! Pushing pod statuses to the API server (upstream `status_manager.go`: `Start`, `syncBatch`,
//! `syncPod`, and `statusutil.PatchPodStatus`). The status manager's change signal coalesces like
//! upstream's one-slot `podStatusChannel`: on each wake-up the syncer reads every status, and for
//! each pod from the API server whose version is newer than the one last sent, sends one PATCH of
//! `pods/<name>/status`. So a pod gets at most one PATCH per change, however many changes piled
//! up meanwhile. A failed PATCH is tried again at the next change or the next sync period.
//!
//! The patch is a strategic merge patch, as upstream's: `metadata.uid` as a precondition (a pod
//! recreated under the same name is not overwritten) and the status as a two-way patch from what
//! the API server holds to the new status (upstream `CreateTwoWayMergePatch`): what the new
//! status no longer has is sent as `null` at any depth (a container that stopped running loses
//! its `running` state; a condition that became ready loses its reason), the lists that merge by
//! a key (conditions by `type`, container statuses by `name`, IPs by `ip`) are patched element by
//! element and an element gone is sent as `$patch: delete`. Conditions of other components are
//! not in either status, so they stay (upstream's `mergePodStatus`). What the API server holds is
//! the last status it accepted from the agent, or for the first patch the status the pod came
//! with. A 404 means the pod is gone: nothing to do.
//!
//! A pod the API server is deleting (`deletionTimestamp` set) is removed from it by the agent,
//! as upstream's `syncPod` does once `canBeDeleted`: its termination is finished (containers
//! stopped, volumes torn down: the status manager's `finished`, set as `SyncTerminatedPod` ends)
//! and the status it shows has a terminal phase. The DELETE has grace 0 and the pod's UID as a
//! precondition, so a pod recreated under the same name is never deleted by it. Until then the
//! pod stays `Terminating` on the API server, whatever its grace period said.
//!
//! A static pod's status goes to its mirror pod (upstream's `syncBatch` translates the static
//! pod's UID to the mirror pod's): the patch names the mirror pod's UID, and the first one
//! starts from the status the mirror pod has. Only a mirror pod whose `kubernetes.io/config.mirror`
//! is the static pod's hash gets it (not one of an older manifest, nor one being deleted); with
//! none, the status waits for the mirror pod to appear. A mirror pod is never sent the final
//! DELETE (upstream `canBeDeleted` excludes them).
//!
//! Not here: holding back a terminal phase while containers may run, `needsReconcile`.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    Error, is_conflict, is_invalid, is_not_found,
    mirror_pods::{MirrorPods, is_mirror_of},
};
use crate::{
    pod::{full_name, spec::is_static_pod},
    sources::{CONFIG_SOURCE_ANNOTATION, Source},
    status::{PodWithStatus, StatusManager},
};

/// What was last accepted by the API server for one pod.
#[derive(Debug)]
struct Sent {
    version: u64,
    /// The status as sent: what the API server holds, which the next patch starts from.
    status: Map<String, Value>,
}

pub(super) struct StatusSync {
    client: Client,
    status: Arc<StatusManager>,
    period: Duration,
    /// The mirror pods, where static pods' statuses go.
    mirrors: tokio::sync::watch::Receiver<MirrorPods>,
    /// UID on the API server (a mirror pod's for a static pod) → what the API server has from
    /// the agent (upstream `apiStatusVersions`, keyed by `MirrorPodUID`).
    sent: HashMap<String, Sent>,
    /// Pods the agent has sent the final DELETE for (until their status goes).
    deleted: HashSet<String>,
}

impl StatusSync {
    pub(super) fn new(
        client: Client,
        status: Arc<StatusManager>,
        period: Duration,
        mirrors: tokio::sync::watch::Receiver<MirrorPods>,
    ) -> Self {
        StatusSync {
            client,
            status,
            period,
            mirrors,
            sent: HashMap::new(),
            deleted: HashSet::new(),
        }
    }

    pub(super) async fn run(mut self, cancel: CancellationToken) {
        let mut changes = self.status.subscribe();
        let mut resync = tokio::time::interval_at(Instant::now() + self.period, self.period);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut mirrors_open = true;
        loop {
            // Marked seen before reading, so a change made during the batch wakes the next one.
            changes.borrow_and_update();
            self.sync_batch().await;
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
                // A mirror pod appeared (or went): a static pod's status may now be sent.
                changed = self.mirrors.changed(), if mirrors_open => mirrors_open = changed.is_ok(),
                _ = resync.tick() => {}
            }
        }
    }

    /// Upstream `syncBatch`: every API pod, and every static pod with its mirror pod, whose
    /// status version is newer than the one sent.
    async fn sync_batch(&mut self) {
        let pods = self.status.pods();
        let mirrors = self.mirrors.borrow_and_update().clone().unwrap_or_default();
        let targets: Vec<(String, PodWithStatus)> = pods
            .into_iter()
            .filter_map(|p| {
                let (uid, source_status) = api_target(&p, &mirrors)?;
                Some((uid, PodWithStatus { source_status, ..p }))
            })
            .collect();
        let live: HashSet<&str> = targets.iter().map(|(uid, _)| uid.as_str()).collect();
        self.sent.retain(|uid, _| live.contains(uid.as_str()));
        self.deleted.retain(|uid| live.contains(uid.as_str()));
        for (
            uid,
            PodWithStatus {
                pod,
                version,
                finished,
                source_status,
            },
        ) in targets
        {
            let previous = self.sent.get(&uid);
            if previous.is_none_or(|s| s.version != version) {
                let status = status_object(pod.status.as_ref());
                let held = match previous {
                    Some(sent) => sent.status.clone(),
                    None => status_object(source_status.as_ref()),
                };
                let body = patch_body(&uid, &status, &held);
                match self.patch(&pod, &body).await {
                    Ok(()) => {
                        self.sent.insert(uid.clone(), Sent { version, status });
                    }
                    // The same patch would be refused again: wait for the next change.
                    Err(error) if is_refused(&error) => {
                        tracing::warn!(%error, pod = uid, "the API server refused the pod status; not retried until it changes");
                        self.sent.insert(
                            uid.clone(),
                            Sent {
                                version,
                                status: held,
                            },
                        );
                    }
                    Err(error) => {
                        tracing::warn!(%error, pod = uid, "failed to update the pod status");
                        continue;
                    }
                }
            }
            if is_api_pod(&pod) && can_be_deleted(&pod, finished) && !self.deleted.contains(&uid) {
                match self.delete(&pod, &uid).await {
                    Ok(()) => {
                        self.deleted.insert(uid);
                    }
                    Err(error) => tracing::warn!(%error, pod = uid, "failed to delete the pod"),
                }
            }
        }
    }

    /// The final DELETE of a pod whose termination is finished (grace 0, UID precondition).
    async fn delete(&self, pod: &Pod, uid: &str) -> Result<(), Error> {
        let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            return Ok(());
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(
                    namespace,
                    name,
                    "pod fully terminated and removed from the API server"
                );
                Ok(())
            }
            // Gone already, or a new pod under the name: either way not this pod's to delete.
            Err(error) if is_not_found(&error) || is_conflict(&error) => {
                tracing::debug!(namespace, name, %error, "pod not deleted: gone or replaced");
                Ok(())
            }
            Err(source) => Err(Error::Api {
                what: format!("DELETE namespaces/{namespace}/pods/{name}"),
                source,
            }),
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

/// A PATCH the API server will never accept as it stands: 422 `Invalid` (among others, a pod
/// recreated under the name: the patch's `metadata.uid` is immutable on it) or 409.
fn is_refused(error: &Error) -> bool {
    matches!(error, Error::Api { source, .. } if is_invalid(source) || is_conflict(source))
}

/// Upstream `canBeDeleted`: the API server is deleting the pod, the status it shows is terminal,
/// and the kubelet has finished terminating it.
fn can_be_deleted(pod: &Pod, finished: bool) -> bool {
    let terminal = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| phase == "Succeeded" || phase == "Failed");
    pod.metadata.deletion_timestamp.is_some() && terminal && finished
}

/// Where the status of `p` goes on the API server: the UID there, and the status the API server
/// holds for the first patch to start from. An API pod is itself; a static pod goes to its
/// mirror pod, if one of its hash exists and is not being deleted; anything else nowhere.
fn api_target(
    p: &PodWithStatus,
    mirrors: &std::collections::BTreeMap<String, super::mirror_pods::MirrorPod>,
) -> Option<(String, Option<k8s_openapi::api::core::v1::PodStatus>)> {
    if is_api_pod(&p.pod) {
        return Some((p.pod.metadata.uid.clone()?, p.source_status.clone()));
    }
    if !is_static_pod(&p.pod) {
        return None;
    }
    let mirror = mirrors.get(&full_name(&p.pod))?;
    (!mirror.deleting && is_mirror_of(mirror, &p.pod))
        .then(|| (mirror.uid.clone(), mirror.status.clone()))
}

/// Whether the pod came from the API server (`kubernetes.io/config.source: api`).
fn is_api_pod(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_SOURCE_ANNOTATION))
        .is_some_and(|s| s == Source::Api.as_str())
}

fn status_object(status: Option<&k8s_openapi::api::core::v1::PodStatus>) -> Map<String, Value> {
    match serde_json::to_value(status) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}

/// `{"metadata":{"uid":…},"status":…}`, the status a two-way patch from `held` to `status`.
fn patch_body(uid: &str, status: &Map<String, Value>, held: &Map<String, Value>) -> Value {
    let patch = diff_map(held, status).unwrap_or_default();
    json!({ "metadata": { "uid": uid }, "status": patch })
}

/// The key a list of the pod status merges by (the `patchMergeKey`s of `PodStatus`); other
/// lists are replaced whole.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" => Some("type"),
        "containerStatuses"
        | "initContainerStatuses"
        | "ephemeralContainerStatuses"
        | "resourceClaimStatuses" => Some("name"),
        "podIPs" | "hostIPs" => Some("ip"),
        _ => None,
    }
}

/// The patch turning map `old` into `new`; `None` when they are equal.
fn diff_map(old: &Map<String, Value>, new: &Map<String, Value>) -> Option<Map<String, Value>> {
    let mut patch = Map::new();
    for (field, value) in new {
        match old.get(field) {
            Some(before) => {
                if let Some(change) = diff_value(field, before, value) {
                    patch.insert(field.clone(), change);
                }
            }
            None => {
                patch.insert(field.clone(), value.clone());
            }
        }
    }
    for field in old.keys() {
        if !new.contains_key(field) {
            patch.insert(field.clone(), Value::Null);
        }
    }
    (!patch.is_empty()).then_some(patch)
}

fn diff_value(field: &str, old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => diff_map(old, new).map(Value::Object),
        (Value::Array(old), Value::Array(new)) => match merge_key(field) {
            Some(key) => diff_list(old, new, key),
            None => (old != new).then(|| Value::Array(new.clone())),
        },
        _ => (old != new).then(|| new.clone()),
    }
}

/// A list merged by `key`: each changed element as its own patch with its key, a new one whole,
/// one gone as `{"$patch": "delete", key: …}`.
fn diff_list(old: &[Value], new: &[Value], key: &str) -> Option<Value> {
    // Indexed by the key's JSON text: the held status comes from the API server, whose lists a
    // client with write access may make long, so each side is looked up, not scanned.
    let (old_by_key, new_by_key) = (index_by(old, key), index_by(new, key));
    let mut patch = Vec::new();
    for element in new {
        let k = element.get(key);
        let before = k.and_then(|k| old_by_key.get(&k.to_string()));
        match (k, before, element) {
            (Some(k), Some(Value::Object(before)), Value::Object(after)) => {
                if let Some(mut change) = diff_map(before, after) {
                    change.insert(key.to_owned(), k.clone());
                    patch.push(Value::Object(change));
                }
            }
            (_, Some(before), after) if *before == after => {}
            _ => patch.push(element.clone()),
        }
    }
    for element in old {
        if let Some(k) = element.get(key)
            && !new_by_key.contains_key(&k.to_string())
        {
            let mut gone = Map::new();
            gone.insert("$patch".to_owned(), Value::from("delete"));
            gone.insert(key.to_owned(), k.clone());
            patch.push(Value::Object(gone));
        }
    }
    (!patch.is_empty()).then_some(Value::Array(patch))
}

/// A list's elements by the JSON text of their `key` (the first of duplicates).
fn index_by<'a>(list: &'a [Value], key: &str) -> HashMap<String, &'a Value> {
    let mut by_key = HashMap::new();
    for element in list {
        if let Some(k) = element.get(key) {
            by_key.entry(k.to_string()).or_insert(element);
        }
    }
    by_key
}

#[cfg(test)]
mod tests;
