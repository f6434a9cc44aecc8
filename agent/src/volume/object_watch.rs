//! ConfigMaps and Secrets kept current by one watch per referenced object (upstream
//! `pkg/kubelet/util/manager/watch_based_manager.go`, the `Watch` change-detection strategy and
//! the kubelet's default): a pod's references are registered when the volume manager takes the
//! pod and dropped when it lets it go; the first reference to an object starts a kube-runtime
//! watcher over its namespace with the field selector `metadata.name=<name>` (so the node asks
//! for, and is authorised for, nothing else), the last one stops it. Reads are served from what
//! the watch last delivered, waiting up to a second for its first list as upstream's `Get`
//! ("failed to sync configmaps cache"). An object seen `immutable` is not watched any more: its
//! last content is served until nobody references it.
//!
//! Bounded: one watch per distinct object the desired pods' volumes name, each holding one
//! object of at most [`MAX_OBJECT_BYTES`] (a larger one is refused, not kept).
//!
//! Deviations: an object no pod registered is read straight from the API server (upstream
//! answers "not registered"; env references of the pods are not registered here); upstream also
//! stops watches nobody read for five sync periods and restarts them on the next read, which
//! only matters for env references.

use crate::lock::MutexExt as _;
use std::{
    collections::{BTreeSet, HashMap},
    fmt::Debug,
    pin::pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{
    api_objects::{
        IssuedToken, KubeObjects, MAX_OBJECT_BYTES, ObjectData, ObjectRef, ObjectSource, TokenSpec,
        config_map_data, object_bytes, secret_data,
    },
    spec::ObjectKind,
};
use crate::container::PodUid;

/// Upstream's wait for a new watch's first list in `Get`.
pub const SYNC_WAIT: Duration = Duration::from_secs(1);

/// What one watch has delivered.
#[derive(Clone, Debug, PartialEq)]
enum Cached {
    /// Its first list has not come yet.
    Unsynced,
    Absent,
    Present {
        data: Arc<ObjectData>,
        immutable: bool,
    },
    /// Larger than [`MAX_OBJECT_BYTES`]: not kept.
    TooLarge {
        bytes: usize,
    },
}

struct Item {
    refs: usize,
    cached: watch::Receiver<Cached>,
    /// Ends the watch task when the item goes.
    _stop: DropGuard,
}

#[derive(Default)]
struct Registry {
    items: HashMap<ObjectRef, Item>,
    pods: HashMap<PodUid, BTreeSet<ObjectRef>>,
}

pub struct WatchedObjects {
    client: Client,
    /// For what no pod registered, and for tokens.
    direct: KubeObjects,
    registry: Mutex<Registry>,
    shutdown: CancellationToken,
}

impl WatchedObjects {
    /// Watches end with `shutdown` at the latest.
    pub fn new(client: Client, shutdown: CancellationToken) -> Self {
        WatchedObjects {
            direct: KubeObjects(client.clone()),
            client,
            registry: Mutex::new(Registry::default()),
            shutdown,
        }
    }

    /// How many objects are watched now.
    #[cfg(test)]
    pub fn watched(&self) -> usize {
        self.registry.lock_unpoisoned().items.len()
    }

    fn add_reference(&self, registry: &mut Registry, key: &ObjectRef) {
        if let Some(item) = registry.items.get_mut(key) {
            item.refs += 1;
            return;
        }
        let (tx, rx) = watch::channel(Cached::Unsynced);
        let stop = self.shutdown.child_token();
        let task = watch_object(self.client.clone(), key.clone(), tx, stop.clone());
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(task);
            }
            Err(e) => {
                tracing::error!(error = %e, object = ?key, "no runtime to watch the object on");
            }
        }
        tracing::debug!(object = ?key, "watching for changes");
        registry.items.insert(
            key.clone(),
            Item {
                refs: 1,
                cached: rx,
                _stop: stop.drop_guard(),
            },
        );
    }

    fn delete_reference(registry: &mut Registry, key: &ObjectRef) {
        let gone = registry.items.get_mut(key).is_some_and(|item| {
            item.refs = item.refs.saturating_sub(1);
            item.refs == 0
        });
        if gone {
            registry.items.remove(key);
            tracing::debug!(object = ?key, "no pod references it: not watched any more");
        }
    }
}

#[tonic::async_trait]
impl ObjectSource for WatchedObjects {
    async fn get(
        &self,
        kind: ObjectKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ObjectData>, String> {
        let key = ObjectRef {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        let cached = self
            .registry
            .lock_unpoisoned()
            .items
            .get(&key)
            .map(|i| i.cached.clone());
        let Some(mut cached) = cached else {
            return self.direct.get(kind, namespace, name).await;
        };
        let synced = tokio::time::timeout(
            SYNC_WAIT,
            cached.wait_for(|c| !matches!(c, Cached::Unsynced)),
        )
        .await;
        let state = match synced {
            Ok(Ok(state)) => state.clone(),
            // The watch ended before its first list (shutting down): as unsynced.
            Ok(Err(_)) | Err(_) => {
                return Err(format!(
                    "failed to sync {} cache: timed out waiting for the condition",
                    resource(kind)
                ));
            }
        };
        match state {
            Cached::Unsynced => Err(format!("failed to sync {} cache", resource(kind))),
            Cached::Absent => Ok(None),
            Cached::Present { data, .. } => Ok(Some((*data).clone())),
            Cached::TooLarge { bytes } => Err(format!(
                "{} {name:?} holds {bytes} bytes, more than the {MAX_OBJECT_BYTES} the node keeps",
                resource(kind)
            )),
        }
    }

    async fn token(&self, spec: &TokenSpec) -> Result<IssuedToken, String> {
        self.direct.token(spec).await
    }

    /// Upstream `RegisterPod`: the new references first, then the old ones dropped, so an
    /// object both name keeps its watch.
    fn register_pod(&self, pod: &PodUid, objects: &BTreeSet<ObjectRef>) {
        if objects.is_empty() {
            return self.unregister_pod(pod);
        }
        let mut registry = self.registry.lock_unpoisoned();
        if registry.pods.get(pod) == Some(objects) {
            return;
        }
        for key in objects {
            self.add_reference(&mut registry, key);
        }
        if let Some(previous) = registry.pods.insert(pod.clone(), objects.clone()) {
            for key in &previous {
                Self::delete_reference(&mut registry, key);
            }
        }
    }

    fn unregister_pod(&self, pod: &PodUid) {
        let mut registry = self.registry.lock_unpoisoned();
        if let Some(previous) = registry.pods.remove(pod) {
            for key in &previous {
                Self::delete_reference(&mut registry, key);
            }
        }
    }
}

/// The resource's name in upstream's messages.
fn resource(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::ConfigMap => "configmaps",
        ObjectKind::Secret => "secrets",
    }
}

async fn watch_object(
    client: Client,
    key: ObjectRef,
    tx: watch::Sender<Cached>,
    stop: CancellationToken,
) {
    match key.kind {
        ObjectKind::ConfigMap => {
            let api: Api<ConfigMap> = Api::namespaced(client, &key.namespace);
            run(api, &key, &tx, &stop, config_map_data).await;
        }
        ObjectKind::Secret => {
            let api: Api<Secret> = Api::namespaced(client, &key.namespace);
            run(api, &key, &tx, &stop, secret_data).await;
        }
    }
}

/// One object's watch until `stop`, or until the object is seen immutable.
async fn run<K>(
    api: Api<K>,
    key: &ObjectRef,
    tx: &watch::Sender<Cached>,
    stop: &CancellationToken,
    data: fn(K) -> (ObjectData, bool),
) where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={}", key.name));
    let mut events = pin!(watcher(api.clone(), config.clone()).default_backoff());
    // The list in progress: the object it held, if any.
    let mut listing: Option<Option<K>> = None;
    let named = |o: &K| o.meta().name.as_deref() == Some(key.name.as_str());
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = events.next() => event,
        };
        let state = match event {
            Some(Ok(watcher::Event::Init)) => {
                listing = Some(None);
                continue;
            }
            Some(Ok(watcher::Event::InitApply(o))) => {
                if named(&o) {
                    listing = Some(Some(o));
                }
                continue;
            }
            Some(Ok(watcher::Event::InitDone)) => cached(listing.take().flatten(), data),
            Some(Ok(watcher::Event::Apply(o))) if named(&o) => cached(Some(o), data),
            Some(Ok(watcher::Event::Delete(o))) if named(&o) => Cached::Absent,
            Some(Ok(_)) => continue,
            Some(Err(error)) => {
                if crate::sources::apiserver::is_too_large_resource_version(&error) {
                    events.set(watcher(api.clone(), config.clone()).default_backoff());
                }
                tracing::warn!(%error, object = ?key, "watching the object failed; retrying");
                continue;
            }
            None => return,
        };
        let immutable = matches!(
            state,
            Cached::Present {
                immutable: true,
                ..
            }
        );
        tx.send_replace(state);
        if immutable {
            tracing::debug!(object = ?key, "stopped watching for changes: the object is immutable");
            return;
        }
    }
}

fn cached<K>(object: Option<K>, data: fn(K) -> (ObjectData, bool)) -> Cached {
    let Some(object) = object else {
        return Cached::Absent;
    };
    let (data, immutable) = data(object);
    let bytes = object_bytes(&data);
    if bytes > MAX_OBJECT_BYTES {
        return Cached::TooLarge { bytes };
    }
    Cached::Present {
        data: Arc::new(data),
        immutable,
    }
}

#[cfg(test)]
mod tests;
