//! The pods bound to this node, from the API server (upstream `pkg/kubelet/config/apiserver.go`):
//! a kube-runtime watcher over all namespaces' Pods with the field selector
//! `spec.nodeName=<node>`, kept in a local store, and after every change the complete set sent to
//! the merge as a SET — exactly upstream's reflector into an `UndeltaStore`. The merge's diff then
//! turns each SET into the ADD / UPDATE / DELETE (`deletionTimestamp` set) / REMOVE / RECONCILE
//! the sync loop sees, with the same rules as for the static pods; sending only SETs keeps one
//! protocol for every source and lets a re-list after a lost watch replace the store atomically.
//!
//! A (re)list is buffered from `Init` to `InitDone` and sent once complete, so the merge never sees
//! a partial list (which it would read as removals). Watch errors are logged and retried with
//! kube-runtime's default backoff (0.8 s doubling to 30 s, jittered); the source never gives up.
//!
//! A pod whose UID, name, namespace, container or volume names could not name a path on the node
//! (`validate_pod_identity`: the API server never sends one, but the node does not depend on it)
//! is left out and logged, and the others keep flowing.
//!
//! Not here: validating the rest of a pod (the API server did), the merge, mirror pods.

use std::{collections::BTreeMap, pin::pin};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio_util::sync::CancellationToken;

use super::super::{MergeStopped, SourceSender};

/// The watched pods by `namespace/name` (upstream's `MetaNamespaceKeyFunc`), and the list in
/// progress, if any.
#[derive(Debug, Default)]
pub(super) struct PodStore {
    pods: BTreeMap<String, Pod>,
    listing: Option<BTreeMap<String, Pod>>,
}

impl PodStore {
    /// Applies one watcher event; returns the complete set to send when the store changed.
    pub(super) fn apply(&mut self, event: watcher::Event<Pod>) -> Option<Vec<Pod>> {
        match event {
            watcher::Event::Init => {
                self.listing = Some(BTreeMap::new());
                None
            }
            watcher::Event::InitApply(pod) => {
                let listing = self.listing.get_or_insert_with(BTreeMap::new);
                match checked(pod) {
                    Ok(pod) => listing.insert(key(&pod), pod),
                    Err(key) => listing.remove(&key),
                };
                None
            }
            watcher::Event::InitDone => {
                self.pods = self.listing.take().unwrap_or_default();
                Some(self.snapshot())
            }
            watcher::Event::Apply(pod) => {
                match checked(pod) {
                    Ok(pod) => self.pods.insert(key(&pod), pod),
                    Err(key) => self.pods.remove(&key),
                };
                Some(self.snapshot())
            }
            watcher::Event::Delete(pod) => {
                self.pods.remove(&key(&pod));
                Some(self.snapshot())
            }
        }
    }

    fn snapshot(&self) -> Vec<Pod> {
        self.pods.values().cloned().collect()
    }
}

/// The pod, or its key when its identity could not name a path (said in the log).
fn checked(pod: Pod) -> Result<Pod, String> {
    match crate::sources::validate_pod_identity(&pod) {
        Ok(()) => Ok(pod),
        Err(errors) => {
            let key = key(&pod);
            tracing::error!(pod = key, %errors, "pod from the API server ignored: its identity cannot name its directories on the node");
            Err(key)
        }
    }
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The field selector for the pods bound to `node_name`.
pub(super) fn node_selector(node_name: &str) -> String {
    format!("spec.nodeName={node_name}")
}

/// Watches and sends until cancelled or the merge stops.
pub(super) async fn run(
    client: Client,
    node_name: String,
    sender: SourceSender,
    cancel: CancellationToken,
) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&node_selector(&node_name));
    let mut events = pin!(watcher(api.clone(), config.clone()).default_backoff());
    let mut store = PodStore::default();
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            event = events.next() => event,
        };
        let pods = match event {
            Some(Ok(event)) => store.apply(event),
            Some(Err(error)) if is_too_large_resource_version(&error) => {
                tracing::warn!(%error, node = node_name, "the API server is behind the pods' last resourceVersion (restarted?); listing them again");
                events.set(watcher(api.clone(), config.clone()).default_backoff());
                None
            }
            Some(Err(error)) => {
                tracing::warn!(%error, node = node_name, "watching this node's pods failed; retrying");
                None
            }
            // A watcher stream never ends; if it did, there would be nothing more to send.
            None => return,
        };
        let Some(pods) = pods else { continue };
        tracing::debug!(pods = pods.len(), "API server pods changed");
        if let Err(MergeStopped) = sender.set(pods).await {
            tracing::debug!("pod config merge stopped; API server pod source ends");
            return;
        }
    }
}

/// A watch from a resourceVersion the API server has not reached: it was restarted with fresh
/// versions, or its cache lags. client-go's reflector lists again then
/// (`isTooLargeResourceVersionError`: the `ResourceVersionTooLarge` cause, or a 504 saying "Too
/// large resource version" from servers older than the cause); kube-runtime's watcher would ask
/// for the same version for ever.
pub(super) fn is_too_large_resource_version(error: &watcher::Error) -> bool {
    let status = match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status))
        | watcher::Error::WatchError(status) => status,
        _ => return false,
    };
    let has_cause = status.details.as_ref().is_some_and(|d| {
        d.causes
            .iter()
            .any(|c| c.reason == "ResourceVersionTooLarge")
    });
    has_cause || (status.code == 504 && status.message.contains("Too large resource version"))
}

#[cfg(test)]
mod tests;
