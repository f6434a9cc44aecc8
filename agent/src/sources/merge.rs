//! The merge of pod sources (upstream `podStorage` in `pkg/kubelet/config/config.go`, in its
//! "incremental" notification mode): the last known pods of each source, keyed by UID, and the
//! diff of each incoming [`PodUpdate`] against them into the minimal ADD / UPDATE / DELETE /
//! REMOVE / RECONCILE updates, in upstream's order. Pure and synchronous; `pod_config.rs` runs it.
//!
//! Upstream's rules, kept exactly:
//! - a pod is the same pod if its UID is; within one batch a repeated `name_namespace` is dropped;
//! - ADD for a new UID (stamped `config.seen`), REMOVE for a UID a SET no longer has;
//! - UPDATE when spec, labels, `deletionTimestamp`, `deletionGracePeriodSeconds` or a non-local
//!   annotation changed (DELETE instead when the new version has a `deletionTimestamp`);
//! - RECONCILE when only the status changed; nothing when only local annotations changed;
//! - the stored pod keeps its other metadata and its local annotations across updates;
//! - a source's first SET with no ADD/UPDATE/DELETE still yields an (empty) ADD, so the sync loop
//!   learns the source is ready.
//!
//! Not here: validation of each pod (sources do it) and channels.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::Arc,
    time::SystemTime,
};

use k8s_openapi::{api::core::v1::Pod, jiff};

use super::{
    CONFIG_FIRST_SEEN_ANNOTATION, CONFIG_SOURCE_ANNOTATION, LOCAL_ANNOTATIONS, Op, PodUpdate,
    Source,
};
use crate::pod::{full_name, spec::is_mirror_pod};

// The wall clock is injected so tests can pin `config.seen`.
use crate::clock::Clock;

/// Per-source pod state and the diff.
pub struct PodStorage {
    /// Source → UID → the pod as last accepted.
    pods: BTreeMap<Source, BTreeMap<String, Pod>>,
    /// Sources that have sent at least one SET.
    seen: BTreeSet<Source>,
    clock: Clock,
}

impl std::fmt::Debug for PodStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodStorage")
            .field(
                "pods",
                &self.pods.values().map(BTreeMap::len).sum::<usize>(),
            )
            .field("seen", &self.seen)
            .finish()
    }
}

/// What comparing a new version of a pod with the stored one calls for.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    None,
    Update,
    Reconcile,
    GracefulDelete,
}

#[derive(Default)]
struct Changes {
    adds: Vec<Pod>,
    updates: Vec<Pod>,
    deletes: Vec<Pod>,
    removes: Vec<Pod>,
    reconciles: Vec<Pod>,
}

impl PodStorage {
    pub fn new(clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        PodStorage {
            pods: BTreeMap::new(),
            seen: BTreeSet::new(),
            clock: Arc::new(clock),
        }
    }

    /// Applies one update from a source and returns what changed, in upstream's order: REMOVE,
    /// ADD, UPDATE, DELETE, then RECONCILE. Empty batches are left out, except the readiness ADD.
    pub fn merge(&mut self, update: PodUpdate) -> Vec<PodUpdate> {
        let source = update.source;
        let seen_before = self.seen.contains(&source);
        let mut changes = Changes::default();
        let mut pods = self.pods.remove(&source).unwrap_or_default();
        let incoming = valid_pods(update.pods, source);

        match update.op {
            Op::Add | Op::Update | Op::Delete => {
                for pod in incoming {
                    let uid = uid_of(&pod).to_owned();
                    let existing = pods.remove(&uid);
                    pods.insert(uid, self.upsert(existing, pod, source, &mut changes));
                }
            }
            Op::Remove => {
                for pod in incoming {
                    if let Some(existing) = pods.remove(uid_of(&pod)) {
                        changes.removes.push(existing);
                    }
                }
            }
            Op::Set => {
                self.seen.insert(source);
                let mut old = std::mem::take(&mut pods);
                for pod in incoming {
                    let uid = uid_of(&pod).to_owned();
                    let existing = pods.remove(&uid).or_else(|| old.remove(&uid));
                    pods.insert(uid, self.upsert(existing, pod, source, &mut changes));
                }
                changes.removes.extend(old.into_values());
            }
            Op::Reconcile => {
                tracing::warn!(%source, "a source sent RECONCILE, which only the merge emits; ignored");
            }
        }
        self.pods.insert(source, pods);

        let first_set = !seen_before && self.seen.contains(&source);
        let batch = |pods: Vec<Pod>, op| PodUpdate { pods, op, source };
        let mut out = Vec::new();
        if !changes.removes.is_empty() {
            out.push(batch(changes.removes, Op::Remove));
        }
        let nothing_else =
            changes.adds.is_empty() && changes.updates.is_empty() && changes.deletes.is_empty();
        if !changes.adds.is_empty() || (first_set && nothing_else) {
            out.push(batch(changes.adds, Op::Add));
        }
        if !changes.updates.is_empty() {
            out.push(batch(changes.updates, Op::Update));
        }
        if !changes.deletes.is_empty() {
            out.push(batch(changes.deletes, Op::Delete));
        }
        if !changes.reconciles.is_empty() {
            out.push(batch(changes.reconciles, Op::Reconcile));
        }
        out
    }

    /// Stores `candidate` over `existing` (if any), records the change, returns what to store.
    fn upsert(
        &self,
        existing: Option<Pod>,
        mut candidate: Pod,
        source: Source,
        changes: &mut Changes,
    ) -> Pod {
        // Annotated before comparing, as upstream, so the source is part of every stored pod.
        annotations_mut(&mut candidate).insert(
            CONFIG_SOURCE_ANNOTATION.to_owned(),
            source.as_str().to_owned(),
        );
        let Some(mut existing) = existing else {
            let seen = jiff::Timestamp::try_from((self.clock)())
                .map(|t| t.to_string())
                .unwrap_or_default();
            annotations_mut(&mut candidate).insert(CONFIG_FIRST_SEEN_ANNOTATION.to_owned(), seen);
            changes.adds.push(candidate.clone());
            return candidate;
        };
        match check_and_update(&mut existing, candidate) {
            Change::None => {}
            Change::Update => changes.updates.push(existing.clone()),
            Change::Reconcile => changes.reconciles.push(existing.clone()),
            Change::GracefulDelete => changes.deletes.push(existing.clone()),
        }
        existing
    }

    /// Every pod of every source (upstream `MergedState`).
    pub fn merged_state(&self) -> Vec<Pod> {
        self.pods
            .values()
            .flat_map(|p| p.values().cloned())
            .collect()
    }

    /// The sources that have sent at least one SET.
    pub fn seen_sources(&self) -> &BTreeSet<Source> {
        &self.seen
    }
}

fn uid_of(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// Upstream `filterInvalidPods`: sources validate their pods; here only a repeated full name in
/// one batch (the later one is dropped) and, as swiftlet's own guards, a missing UID and a
/// mirror pod (upstream `IsMirrorPod`: never run; the API source sets them apart before).
fn valid_pods(pods: Vec<Pod>, source: Source) -> Vec<Pod> {
    let mut names = HashSet::new();
    pods.into_iter()
        .filter(|pod| {
            let name = full_name(pod);
            if uid_of(pod).is_empty() {
                tracing::warn!(%source, pod = %name, "pod without metadata.uid, ignoring");
                return false;
            }
            if is_mirror_pod(pod) {
                tracing::warn!(%source, pod = %name, "a mirror pod (kubernetes.io/config.mirror) is never run, ignoring");
                return false;
            }
            if !names.insert(name.clone()) {
                tracing::warn!(%source, pod = %name, "duplicate pod name in one update, ignoring");
                return false;
            }
            true
        })
        .collect()
}

fn annotations_mut(pod: &mut Pod) -> &mut BTreeMap<String, String> {
    pod.metadata.annotations.get_or_insert_with(BTreeMap::new)
}

fn is_local_annotation(key: &str) -> bool {
    LOCAL_ANNOTATIONS.contains(&key)
}

/// Upstream `isAnnotationMapEqual`: equal except for the agent's local annotations.
fn annotations_equal(
    existing: Option<&BTreeMap<String, String>>,
    candidate: Option<&BTreeMap<String, String>>,
) -> bool {
    let relevant = |m: Option<&BTreeMap<String, String>>| {
        m.into_iter()
            .flatten()
            .filter(|(k, _)| !is_local_annotation(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    relevant(existing) == relevant(candidate)
}

/// Upstream `podsDifferSemantically`.
fn differ_semantically(existing: &Pod, candidate: &Pod) -> bool {
    let (a, b) = (&existing.metadata, &candidate.metadata);
    existing.spec != candidate.spec
        || a.labels != b.labels
        || a.deletion_timestamp != b.deletion_timestamp
        || a.deletion_grace_period_seconds != b.deletion_grace_period_seconds
        || !annotations_equal(a.annotations.as_ref(), b.annotations.as_ref())
}

/// Upstream `checkAndUpdatePod`: folds `candidate` into `existing` and says what that was.
fn check_and_update(existing: &mut Pod, candidate: Pod) -> Change {
    if !differ_semantically(existing, &candidate) {
        // The agent is the source of truth for status: a source that reports another one gets
        // reconciled, without an update.
        if existing.status != candidate.status {
            existing.status = candidate.status;
            return Change::Reconcile;
        }
        return Change::None;
    }
    let Pod {
        metadata: new_meta,
        spec,
        status,
    } = candidate;
    existing.spec = spec;
    existing.status = status;
    let meta = &mut existing.metadata;
    meta.labels = new_meta.labels;
    meta.deletion_timestamp = new_meta.deletion_timestamp;
    meta.deletion_grace_period_seconds = new_meta.deletion_grace_period_seconds;
    // The new annotations, with the agent's local ones carried over from what it stored.
    let mut annotations = new_meta.annotations.unwrap_or_default();
    for key in LOCAL_ANNOTATIONS {
        if let Some(value) = meta.annotations.as_ref().and_then(|a| a.get(key)) {
            annotations.insert(key.to_owned(), value.clone());
        }
    }
    meta.annotations = Some(annotations);
    if meta.deletion_timestamp.is_some() {
        Change::GracefulDelete
    } else {
        Change::Update
    }
}

#[cfg(test)]
mod tests;
