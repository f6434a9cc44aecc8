//! The object store: JSON objects keyed by (resource, namespace, name), one global monotonic
//! revision stamped into `metadata.resourceVersion` on every write (as etcd's revision is), and
//! a bounded history of changes that watches resume from — older versions are compacted and a
//! watch from one gets 410 Gone, as after etcd's compaction
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>).
//!
//! Writes publish each change on a broadcast channel while the store is locked, so a watch
//! that snapshots the history and subscribes under the same lock misses nothing and sees
//! nothing twice.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::{
    deletion::{DeleteOptions, Deletion, decide},
    meta::{finalizers, meta_str, rfc3339, set_meta},
    resources::Resource,
    status::{ApiError, ApiResult},
    strategy::delete_during_update,
};

/// The type of a change, as a watch event names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One write: the object after it (for a deletion, the last state with the deletion's
/// resourceVersion) and before it.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub revision: u64,
    pub resource: &'static Resource,
    pub change: ChangeType,
    pub object: Value,
    pub previous: Option<Value>,
}

/// (resource, namespace, name); the namespace is empty for cluster-scoped objects.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub resource: String,
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(resource: &Resource, namespace: Option<&str>, name: &str) -> Key {
        Key {
            resource: resource.group_resource(),
            namespace: namespace.unwrap_or_default().to_owned(),
            name: name.to_owned(),
        }
    }
}

/// Every change from a point on, as a watch receives them.
pub type Subscription = broadcast::Receiver<Arc<Change>>;

/// How many changes a watch subscriber may fall behind before it is ended (a slow watcher is
/// closed upstream too: the cacher's "Forcing watcher close due to unresponsiveness").
const SUBSCRIBER_BUFFER: usize = 4096;

/// The result of a DELETE.
#[derive(Debug, Clone, PartialEq)]
pub enum Deleted {
    /// Removed; the last state.
    Gone(Value),
    /// Still there (graceful deletion or finalizers); its current state.
    Remains(Value),
}

pub struct Store {
    objects: BTreeMap<Key, Value>,
    revision: u64,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// Every change after this revision is in `history`.
    compacted: u64,
    changes: broadcast::Sender<Arc<Change>>,
}

impl Store {
    /// An empty store keeping the last `history_limit` changes.
    pub fn new(history_limit: usize) -> Store {
        Store {
            objects: BTreeMap::new(),
            revision: 1,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted: 1,
            changes: broadcast::channel(SUBSCRIBER_BUFFER).0,
        }
    }

    /// The current revision (the resourceVersion of the latest write).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The oldest revision a watch may resume from.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    pub fn get(
        &self,
        resource: &'static Resource,
        namespace: Option<&str>,
        name: &str,
    ) -> ApiResult<Value> {
        self.objects
            .get(&Key::new(resource, namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))
    }

    /// The objects of `resource` (in `namespace`, or all), in key order, after `after`.
    pub fn list<'a>(
        &'a self,
        resource: &'static Resource,
        namespace: Option<&'a str>,
        after: Option<&'a Key>,
    ) -> impl Iterator<Item = (&'a Key, &'a Value)> + 'a {
        let group_resource = resource.group_resource();
        let start = Key {
            resource: group_resource.clone(),
            namespace: namespace.unwrap_or_default().to_owned(),
            name: String::new(),
        };
        let from = match after {
            Some(after) if *after > start => std::ops::Bound::Excluded(after.clone()),
            _ => std::ops::Bound::Included(start),
        };
        self.objects
            .range((from, std::ops::Bound::Unbounded))
            .take_while(move |(k, _)| {
                k.resource == group_resource && namespace.is_none_or(|ns| k.namespace == ns)
            })
    }

    /// Stores a new object (prepared by the strategy).
    pub fn create(&mut self, resource: &'static Resource, mut object: Value) -> ApiResult<Value> {
        let name = meta_str(&object, "name").unwrap_or_default().to_owned();
        let key = Key::new(resource, meta_str(&object, "namespace"), &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(resource, &name));
        }
        let revision = self.next_revision();
        set_meta(
            &mut object,
            "resourceVersion",
            Value::String(revision.to_string()),
        );
        self.objects.insert(key, object.clone());
        self.publish(revision, resource, ChangeType::Added, object.clone(), None);
        Ok(object)
    }

    /// Replaces the object with what `update` makes of it. A write that changes nothing is not
    /// stored and bumps no version (etcd3 store's `GuaranteedUpdate`); one that removes the
    /// last finalizer of an object being deleted with no grace left deletes it.
    pub fn update(
        &mut self,
        resource: &'static Resource,
        namespace: Option<&str>,
        name: &str,
        update: impl FnOnce(&Value) -> ApiResult<Value>,
    ) -> ApiResult<Value> {
        let key = Key::new(resource, namespace, name);
        let old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        let mut new = update(&old)?;
        set_meta(
            &mut new,
            "resourceVersion",
            old.get("metadata")
                .and_then(|m| m.get("resourceVersion"))
                .cloned()
                .unwrap_or(Value::Null),
        );
        if new == old {
            return Ok(old);
        }
        if delete_during_update(&old, &new) {
            return Ok(self.remove(resource, key, new));
        }
        let revision = self.next_revision();
        set_meta(
            &mut new,
            "resourceVersion",
            Value::String(revision.to_string()),
        );
        self.objects.insert(key, new.clone());
        self.publish(
            revision,
            resource,
            ChangeType::Modified,
            new.clone(),
            Some(old),
        );
        Ok(new)
    }

    /// A DELETE (see [`decide`]).
    pub fn delete(
        &mut self,
        resource: &'static Resource,
        namespace: Option<&str>,
        name: &str,
        options: &DeleteOptions,
        now: i64,
    ) -> ApiResult<Deleted> {
        let key = Key::new(resource, namespace, name);
        let old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        let pending_finalizers = !finalizers(&old).is_empty();
        match decide(resource, &old, options, now)? {
            Deletion::Pending => Ok(Deleted::Remains(old)),
            Deletion::Now if !pending_finalizers => {
                Ok(Deleted::Gone(self.remove(resource, key, old)))
            }
            Deletion::Now => {
                // Finalizers remain: mark it deleting (grace 0); the update that removes the
                // last finalizer removes it (`markAsDeleting`).
                let updated = self.update(resource, namespace, name, |o| {
                    let mut o = o.clone();
                    if o.get("metadata")
                        .and_then(|m| m.get("deletionTimestamp"))
                        .is_none()
                    {
                        set_meta(&mut o, "deletionTimestamp", json!(rfc3339(now)));
                    }
                    set_meta(&mut o, "deletionGracePeriodSeconds", json!(0));
                    Ok(o)
                })?;
                Ok(Deleted::Remains(updated))
            }
            Deletion::Graceful {
                deletion_timestamp,
                grace_period_seconds,
            } => {
                let first = old
                    .get("metadata")
                    .and_then(|m| m.get("deletionTimestamp"))
                    .is_none();
                let updated = self.update(resource, namespace, name, |o| {
                    let mut o = o.clone();
                    set_meta(
                        &mut o,
                        "deletionTimestamp",
                        json!(rfc3339(deletion_timestamp)),
                    );
                    set_meta(
                        &mut o,
                        "deletionGracePeriodSeconds",
                        json!(grace_period_seconds),
                    );
                    // The first graceful deletion bumps the generation, if the object has one.
                    let generation = o
                        .get("metadata")
                        .and_then(|m| m.get("generation"))
                        .and_then(Value::as_i64);
                    if let Some(generation) = generation.filter(|g| first && *g > 0) {
                        set_meta(&mut o, "generation", json!(generation + 1));
                    }
                    Ok(o)
                })?;
                Ok(Deleted::Remains(updated))
            }
        }
    }

    fn remove(&mut self, resource: &'static Resource, key: Key, last: Value) -> Value {
        let previous = self.objects.remove(&key).unwrap_or_else(|| last.clone());
        let revision = self.next_revision();
        let mut gone = last;
        set_meta(
            &mut gone,
            "resourceVersion",
            Value::String(revision.to_string()),
        );
        self.publish(
            revision,
            resource,
            ChangeType::Deleted,
            gone.clone(),
            Some(previous),
        );
        gone
    }

    fn next_revision(&mut self) -> u64 {
        self.revision += 1;
        self.revision
    }

    fn publish(
        &mut self,
        revision: u64,
        resource: &'static Resource,
        change: ChangeType,
        object: Value,
        previous: Option<Value>,
    ) {
        let change = Arc::new(Change {
            revision,
            resource,
            change,
            object,
            previous,
        });
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.revision;
            }
        }
        // No subscriber is not an error: nobody watches.
        let _ = self.changes.send(change);
    }

    /// The changes after `revision` and a subscription to every later one; 410 Expired when
    /// changes after `revision` were compacted.
    pub fn watch_from(&self, revision: u64) -> ApiResult<(Vec<Arc<Change>>, Subscription)> {
        if revision < self.compacted {
            return Err(ApiError::expired(format!(
                "too old resource version: {revision} ({})",
                self.compacted
            )));
        }
        let backlog = self
            .history
            .iter()
            .filter(|c| c.revision > revision)
            .cloned()
            .collect();
        Ok((backlog, self.changes.subscribe()))
    }

    /// A subscription to every change from now on.
    pub fn subscribe(&self) -> Subscription {
        self.changes.subscribe()
    }

    /// Forgets the history: every version before now is compacted (the test's "compact now").
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.revision;
    }

    /// As if restored with fresh versions: the revision jumps far ahead, every object gets a new
    /// resourceVersion, the history is gone, so any version a client holds is expired.
    pub fn renumber(&mut self) {
        self.revision += 1_000_000;
        let revision = self.revision;
        for object in self.objects.values_mut() {
            set_meta(
                object,
                "resourceVersion",
                Value::String(revision.to_string()),
            );
        }
        self.compact();
    }
}

#[cfg(test)]
mod tests;
