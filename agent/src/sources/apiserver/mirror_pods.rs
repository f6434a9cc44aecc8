//! Mirror pods: the API server's copies of the node's static pods, so the cluster sees them and
//! the scheduler counts them (upstream `pkg/kubelet/pod/mirror_client.go`, the mirror-pod part
//! of the kubelet's `SyncPod`, and `deleteOrphanedMirrorPods` of `HandlePodCleanups`).
//!
//! The pod watch (`pods.rs`) sets the mirror pods bound to this node apart ([`split_mirrors`]):
//! they never reach the merge, so they are never run (upstream `IsMirrorPod`). This controller
//! compares them with the static pods the kubelet runs ([`StaticPods`]) whenever either may have
//! changed (a watch event, or every [`CHECK_PERIOD`]), as upstream's rules say ([`plan`]):
//! - a static pod that runs (the started one of its full name, syncing) and has no mirror pod
//!   gets one: its name, namespace, labels, annotations and spec (`spec.nodeName` is this node,
//!   as the static source sets it), with `kubernetes.io/config.mirror` set to its
//!   `kubernetes.io/config.hash` and the Node as controlling owner (`CreateMirrorPod`);
//! - a mirror pod that is being deleted, or whose hash is not the running static pod's (the
//!   manifest changed), is deleted with grace 0 and its UID as precondition (`DeleteMirrorPod`)
//!   and created again;
//! - a mirror pod whose full name no static pod has, and whose static pod is not still
//!   terminating, is an orphan and deleted — at start once every source has sent its pods, and
//!   from then on whenever it is seen.
//!
//! The status of a static pod goes to its mirror pod (`status_sync.rs`), only to one whose hash
//! is the static pod's.
//!
//! Deviation: upstream deletes an orphan without a UID precondition; here the precondition is
//! the UID the watch showed, so a mirror pod created meanwhile under the name is never deleted
//! unseen. Upstream also skips creating mirror pods while the Node is being deleted.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Pod, PodStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams, Preconditions},
};
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{Error, is_already_exists, is_conflict, is_not_found};
use crate::{
    pod::{full_name, spec::is_mirror_pod},
    sources::{CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION},
};

/// How often the static pods are compared with their mirrors without a watch event (upstream's
/// housekeeping period, which deletes orphans).
pub const CHECK_PERIOD: Duration = Duration::from_secs(2);
/// How long a failed create or delete waits before it is tried again.
pub const RETRY_PERIOD: Duration = Duration::from_secs(10);

/// A mirror pod as the pod watch last showed it.
#[derive(Clone, Debug, PartialEq)]
pub struct MirrorPod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `kubernetes.io/config.mirror`: the hash of the static pod it was made from.
    pub hash: String,
    /// The API server is deleting it (`deletionTimestamp`).
    pub deleting: bool,
    /// Its status on the API server, where the first status patch starts from.
    pub status: Option<PodStatus>,
}

/// The mirror pods bound to this node by full name; `None` until the pod watch's first list.
pub type MirrorPods = Option<BTreeMap<String, MirrorPod>>;

/// What the kubelet runs of its static pods, as their mirror pods need it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StaticPods {
    /// Static pods whose mirror pod must exist: admitted, the started one of their full name,
    /// and still syncing (upstream creates mirror pods in `SyncPod`).
    pub running: Vec<Arc<Pod>>,
    /// The full names of every static pod the sources want: their mirror pods are no orphans.
    pub wanted: HashSet<String>,
    /// Full names whose started static pod is terminating: its mirror pod stays until it has
    /// stopped (upstream `IsPodForMirrorPodTerminatingByFullName`).
    pub terminating: HashSet<String>,
}

/// The kubelet's static pods; `None` until every source has sent its pods and the kubelet has
/// taken them (before, every mirror pod would look like an orphan).
pub type StaticPodsCheck = Arc<dyn Fn() -> Option<StaticPods> + Send + Sync>;

/// Sets the mirror pods of `pods` apart: the other pods, and the mirrors by full name.
pub fn split_mirrors(pods: Vec<Pod>) -> (Vec<Pod>, BTreeMap<String, MirrorPod>) {
    let mut mirrors = BTreeMap::new();
    let mut others = Vec::with_capacity(pods.len());
    for pod in pods {
        if !is_mirror_pod(&pod) {
            others.push(pod);
            continue;
        }
        let meta = &pod.metadata;
        let mirror = MirrorPod {
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            hash: annotation(&pod, CONFIG_MIRROR_ANNOTATION).unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
            status: pod.status.clone(),
        };
        mirrors.insert(full_name(&pod), mirror);
    }
    (others, mirrors)
}

fn annotation(pod: &Pod, key: &str) -> Option<String> {
    pod.metadata.annotations.as_ref()?.get(key).cloned()
}

/// A static pod's hash (`kubernetes.io/config.hash`; its UID, which equals it, when missing).
pub fn static_pod_hash(pod: &Pod) -> String {
    annotation(pod, CONFIG_HASH_ANNOTATION)
        .or_else(|| pod.metadata.uid.clone())
        .unwrap_or_default()
}

/// Upstream `IsMirrorPodOf`: same name and namespace, and the mirror's hash is the pod's.
pub fn is_mirror_of(mirror: &MirrorPod, pod: &Pod) -> bool {
    pod.metadata.name.as_deref() == Some(mirror.name.as_str())
        && pod.metadata.namespace.as_deref() == Some(mirror.namespace.as_str())
        && !mirror.hash.is_empty()
        && mirror.hash == static_pod_hash(pod)
}

/// One step towards the mirror pods the static pods call for.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Delete this mirror pod (grace 0, its UID as precondition); then create `replace`'s, if
    /// the delete went through.
    Delete {
        mirror: Box<MirrorPod>,
        replace: Option<Arc<Pod>>,
    },
    /// Create the mirror pod of this static pod.
    Create(Arc<Pod>),
}

/// What brings `mirrors` in line with `statics` (pure; upstream's rules, see the module).
pub fn plan(statics: &StaticPods, mirrors: &BTreeMap<String, MirrorPod>) -> Vec<Action> {
    let mut actions = Vec::new();
    for pod in &statics.running {
        match mirrors.get(&full_name(pod)) {
            None => actions.push(Action::Create(pod.clone())),
            Some(mirror) if mirror.deleting || !is_mirror_of(mirror, pod) => {
                actions.push(Action::Delete {
                    mirror: Box::new(mirror.clone()),
                    replace: Some(pod.clone()),
                });
            }
            Some(_) => {}
        }
    }
    for (name, mirror) in mirrors {
        if !statics.wanted.contains(name) && !statics.terminating.contains(name) {
            actions.push(Action::Delete {
                mirror: Box::new(mirror.clone()),
                replace: None,
            });
        }
    }
    actions
}

/// The mirror pod of static pod `pod` (upstream `CreateMirrorPod`'s copy).
pub fn mirror_of(pod: &Pod, node_name: &str, node_uid: &str) -> Pod {
    let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(CONFIG_MIRROR_ANNOTATION.to_owned(), static_pod_hash(pod));
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name.to_owned(),
                uid: node_uid.to_owned(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: pod.spec.clone(),
        status: None,
    }
}

pub(super) struct MirrorPodController {
    client: Client,
    node_name: String,
    node_uid: watch::Receiver<Option<String>>,
    statics: StaticPodsCheck,
    mirrors: watch::Receiver<MirrorPods>,
    /// Created and not yet seen in the watch: full name → (hash, when).
    created: HashMap<String, (String, Instant)>,
    /// Deleted and not yet gone from the watch: UIDs.
    deleted: HashSet<String>,
    /// After a failed call, by full name: not tried again before then.
    not_before: HashMap<String, Instant>,
}

impl MirrorPodController {
    pub(super) fn new(
        client: Client,
        node_name: String,
        node_uid: watch::Receiver<Option<String>>,
        statics: StaticPodsCheck,
        mirrors: watch::Receiver<MirrorPods>,
    ) -> Self {
        MirrorPodController {
            client,
            node_name,
            node_uid,
            statics,
            mirrors,
            created: HashMap::new(),
            deleted: HashSet::new(),
            not_before: HashMap::new(),
        }
    }

    pub(super) async fn run(mut self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(CHECK_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                changed = self.mirrors.changed() => if changed.is_err() { return },
                _ = tick.tick() => {}
            }
            self.sync().await;
        }
    }

    /// One comparison, and the calls it calls for.
    pub(super) async fn sync(&mut self) {
        let Some(statics) = (self.statics)() else {
            return;
        };
        let Some(mirrors) = self.mirrors.borrow_and_update().clone() else {
            return;
        };
        let now = Instant::now();
        // What the watch has caught up with needs no more waiting for.
        self.created.retain(|name, (hash, at)| {
            now.duration_since(*at) < RETRY_PERIOD
                && mirrors.get(name).is_none_or(|m| &m.hash != hash)
        });
        self.deleted
            .retain(|uid| mirrors.values().any(|m| &m.uid == uid));
        self.not_before.retain(|_, at| *at > now);
        for action in plan(&statics, &mirrors) {
            match action {
                Action::Create(pod) => {
                    let name = full_name(&pod);
                    let hash = static_pod_hash(&pod);
                    if self.waiting(&name)
                        || self.created.get(&name).is_some_and(|(h, _)| *h == hash)
                    {
                        continue;
                    }
                    self.create(&name, &pod, now).await;
                }
                Action::Delete { mirror, replace } => {
                    let name = format!("{}_{}", mirror.name, mirror.namespace);
                    if self.waiting(&name) || self.deleted.contains(&mirror.uid) {
                        continue;
                    }
                    let deleted = self.delete(&name, &mirror, replace.is_some(), now).await;
                    if let (true, Some(pod)) = (deleted, replace) {
                        self.create(&name, &pod, now).await;
                    }
                }
            }
        }
    }

    fn waiting(&self, name: &str) -> bool {
        self.not_before.contains_key(name)
    }

    async fn create(&mut self, name: &str, pod: &Pod, now: Instant) {
        let Some(node_uid) = self.node_uid.borrow().clone() else {
            tracing::debug!(pod = name, "no mirror pod yet: the Node is not registered");
            return;
        };
        let mirror = mirror_of(pod, &self.node_name, &node_uid);
        let namespace = mirror.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), &mirror).await {
            Ok(created) => {
                tracing::info!(
                    pod = name,
                    uid = created.metadata.uid.as_deref().unwrap_or_default(),
                    "created a mirror pod for the static pod"
                );
                self.created
                    .insert(name.to_owned(), (static_pod_hash(pod), now));
            }
            // Another copy is there already: the watch shows it, and the next look decides.
            Err(error) if is_already_exists(&error) => {
                tracing::debug!(pod = name, "a mirror pod exists already");
            }
            Err(source) => {
                let error = Error::Api {
                    what: format!("POST namespaces/{namespace}/pods (mirror of {name})"),
                    source,
                };
                tracing::warn!(%error, "failed creating a mirror pod");
                self.not_before.insert(name.to_owned(), now + RETRY_PERIOD);
            }
        }
    }

    /// Upstream `DeleteMirrorPod`: whether it was deleted (a pod gone already, or replaced under
    /// the name, is not).
    async fn delete(
        &mut self,
        name: &str,
        mirror: &MirrorPod,
        outdated: bool,
        now: Instant,
    ) -> bool {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &mirror.namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(mirror.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&mirror.name, &params).await {
            Ok(_) => {
                let why = if outdated {
                    "it is outdated"
                } else {
                    "no static pod has its name"
                };
                tracing::info!(
                    pod = name,
                    uid = mirror.uid,
                    "deleted a mirror pod because {why}"
                );
                self.deleted.insert(mirror.uid.clone());
                true
            }
            Err(error) if is_not_found(&error) || is_conflict(&error) => {
                tracing::debug!(pod = name, %error, "mirror pod not deleted: gone or replaced");
                false
            }
            Err(source) => {
                let error = Error::Api {
                    what: format!(
                        "DELETE namespaces/{}/pods/{}",
                        mirror.namespace, mirror.name
                    ),
                    source,
                };
                tracing::warn!(%error, "failed deleting a mirror pod");
                self.not_before.insert(name.to_owned(), now + RETRY_PERIOD);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests;
