//! The cluster's Services, for containers' service environment variables (upstream: the
//! Services informer `NewMainKubelet` starts, read through `kl.serviceLister`, and
//! `serviceHasSynced`): a kube-runtime watcher over every namespace's Services, kept in a store
//! the runtime manager reads at each container start instead of listing them
//! (`kuberuntime::env::ServiceLister`). The store is synced once the first list is complete, and
//! stays so; a (re)list is buffered from `Init` to `InitDone` and replaces the store at once.
//!
//! What is kept of a service is only what its variables need ([`ServiceInfo`]): services without
//! a cluster IP are not kept, nor are ones the API server would have refused (a name that is not
//! a DNS-1035 label, a cluster IP that is not an IP...). Bounded: at most [`MAX_SERVICES`]
//! services and [`MAX_SERVICE_PORTS`] ports in all (upstream's scalability thresholds name
//! 10,000 services per cluster); past that a service is not kept, said in the log (the first
//! time, then every thousandth).
//!
//! Not here: which services a pod sees and their variables (`kuberuntime::env::services`).

use std::{
    collections::BTreeMap,
    pin::pin,
    sync::{Arc, Mutex},
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Service;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio_util::sync::CancellationToken;

use crate::{
    kuberuntime::env::{ServiceInfo, ServiceLister},
    lock::MutexExt as _,
};

/// The most services kept.
pub const MAX_SERVICES: usize = 10_000;
/// The most ports kept, over all services.
pub const MAX_SERVICE_PORTS: usize = 50_000;

/// Services by namespace and name, with their count and ports.
#[derive(Debug, Default)]
struct Services {
    by_namespace: BTreeMap<String, BTreeMap<String, ServiceInfo>>,
    count: usize,
    ports: usize,
}

/// Why a service is not kept.
#[derive(Debug)]
enum NotKept {
    Rejected(crate::kuberuntime::env::ServiceRejected),
    Full,
}

impl Services {
    fn remove(&mut self, namespace: &str, name: &str) {
        let Some(services) = self.by_namespace.get_mut(namespace) else {
            return;
        };
        if let Some(old) = services.remove(name) {
            self.count -= 1;
            self.ports -= old.ports.len();
        }
        if services.is_empty() {
            self.by_namespace.remove(namespace);
        }
    }

    /// Keeps `service` in place of what was kept under its name; a service that has no cluster
    /// IP now, or cannot be kept, takes the old one out.
    fn apply(&mut self, service: &Service) -> Result<(), NotKept> {
        let namespace = service.metadata.namespace.clone().unwrap_or_default();
        let name = service.metadata.name.clone().unwrap_or_default();
        self.remove(&namespace, &name);
        let info = match ServiceInfo::from_service(service) {
            Ok(Some(info)) => info,
            Ok(None) => return Ok(()),
            Err(why) => return Err(NotKept::Rejected(why)),
        };
        if self.count >= MAX_SERVICES || self.ports + info.ports.len() > MAX_SERVICE_PORTS {
            return Err(NotKept::Full);
        }
        self.count += 1;
        self.ports += info.ports.len();
        self.by_namespace
            .entry(namespace)
            .or_default()
            .insert(name, info);
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Inner {
    services: Services,
    /// The list in progress, if any.
    listing: Option<Services>,
    synced: bool,
    /// Services not kept, for the log's rate.
    not_kept: u64,
}

/// The watched services, shared by the watcher and the runtime manager.
#[derive(Clone, Debug, Default)]
pub struct ServiceStore(Arc<Mutex<Inner>>);

impl ServiceStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one watcher event.
    fn apply(&self, event: watcher::Event<Service>) {
        let mut inner = self.0.lock_unpoisoned();
        let inner = &mut *inner;
        let outcome = match event {
            watcher::Event::Init => {
                inner.listing = Some(Services::default());
                Ok(())
            }
            watcher::Event::InitApply(service) => inner
                .listing
                .get_or_insert_with(Services::default)
                .apply(&service)
                .map_err(|why| (service, why)),
            watcher::Event::InitDone => {
                inner.services = inner.listing.take().unwrap_or_default();
                if !inner.synced {
                    tracing::info!(
                        services = inner.services.count,
                        "the cluster's services are listed"
                    );
                }
                inner.synced = true;
                Ok(())
            }
            watcher::Event::Apply(service) => {
                inner.services.apply(&service).map_err(|why| (service, why))
            }
            watcher::Event::Delete(service) => {
                inner.services.remove(
                    service.metadata.namespace.as_deref().unwrap_or_default(),
                    service.metadata.name.as_deref().unwrap_or_default(),
                );
                Ok(())
            }
        };
        if let Err((service, why)) = outcome {
            inner.not_kept += 1;
            if inner.not_kept % 1000 == 1 {
                let key = format!(
                    "{}/{}",
                    service.metadata.namespace.as_deref().unwrap_or_default(),
                    service.metadata.name.as_deref().unwrap_or_default()
                );
                let reason = match why {
                    NotKept::Rejected(r) => r.to_string(),
                    NotKept::Full => format!(
                        "the node keeps at most {MAX_SERVICES} services and \
                         {MAX_SERVICE_PORTS} ports"
                    ),
                };
                tracing::warn!(
                    service = key,
                    not_kept = inner.not_kept,
                    "service not kept for containers' environment variables: {reason}"
                );
            }
        }
    }
}

impl ServiceLister for ServiceStore {
    fn synced(&self) -> bool {
        self.0.lock_unpoisoned().synced
    }

    fn services(&self, namespace: &str) -> Vec<ServiceInfo> {
        self.0
            .lock_unpoisoned()
            .services
            .by_namespace
            .get(namespace)
            .map(|s| s.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// Watches every namespace's Services into `store` until cancelled.
pub async fn watch_services(client: Client, store: ServiceStore, cancel: CancellationToken) {
    let api: Api<Service> = Api::all(client);
    let config = watcher::Config::default();
    let mut events = pin!(watcher(api.clone(), config.clone()).default_backoff());
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            event = events.next() => event,
        };
        match event {
            Some(Ok(event)) => store.apply(event),
            Some(Err(error)) if super::pods::is_too_large_resource_version(&error) => {
                tracing::warn!(%error, "the API server is behind the services' last resourceVersion (restarted?); listing them again");
                events.set(watcher(api.clone(), config.clone()).default_backoff());
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "watching the cluster's services failed; retrying");
            }
            // A watcher stream never ends.
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{ServicePort, ServiceSpec},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;

    fn service(namespace: &str, name: &str, ip: &str, ports: i32) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    (0..ports)
                        .map(|i| ServicePort {
                            name: Some(format!("p{i}")),
                            port: 1000 + i,
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn names(store: &ServiceStore, namespace: &str) -> Vec<String> {
        store
            .services(namespace)
            .into_iter()
            .map(|s| s.name)
            .collect()
    }

    #[test]
    fn synced_after_the_first_complete_list_which_replaces_the_store() {
        let store = ServiceStore::new();
        assert!(!store.synced());
        store.apply(watcher::Event::Init);
        store.apply(watcher::Event::InitApply(service(
            "a", "one", "10.0.0.1", 1,
        )));
        assert!(!store.synced(), "a partial list is not a sync");
        assert!(names(&store, "a").is_empty(), "nor is it visible");
        store.apply(watcher::Event::InitDone);
        assert!(store.synced());
        assert_eq!(names(&store, "a"), ["one"]);

        store.apply(watcher::Event::Apply(service("a", "two", "10.0.0.2", 1)));
        store.apply(watcher::Event::Apply(service("b", "three", "None", 1)));
        assert_eq!(names(&store, "a"), ["one", "two"]);
        assert!(
            names(&store, "b").is_empty(),
            "headless services are not kept"
        );
        // A service that lost its cluster IP is dropped.
        store.apply(watcher::Event::Apply(service("a", "two", "", 1)));
        store.apply(watcher::Event::Delete(service("a", "one", "10.0.0.1", 1)));
        assert!(names(&store, "a").is_empty());

        // A relist replaces everything, and the store stays synced meanwhile.
        store.apply(watcher::Event::Apply(service("a", "stale", "10.0.0.9", 1)));
        store.apply(watcher::Event::Init);
        store.apply(watcher::Event::InitApply(service(
            "c", "fresh", "10.0.0.3", 1,
        )));
        assert!(store.synced());
        assert_eq!(names(&store, "a"), ["stale"]);
        store.apply(watcher::Event::InitDone);
        assert!(names(&store, "a").is_empty());
        assert_eq!(names(&store, "c"), ["fresh"]);
    }

    #[test]
    fn hostile_and_excess_services_are_not_kept() {
        let store = ServiceStore::new();
        store.apply(watcher::Event::Init);
        store.apply(watcher::Event::InitDone);
        store.apply(watcher::Event::Apply(service("a", "BAD", "10.0.0.1", 1)));
        store.apply(watcher::Event::Apply(service("a", "ip", "10.0.0.x", 1)));
        assert!(names(&store, "a").is_empty());

        // Ports: the bound over all services.
        let per = 1000;
        for i in 0..(MAX_SERVICE_PORTS / per as usize) {
            store.apply(watcher::Event::Apply(service(
                "p",
                &format!("s{i}"),
                "10.0.0.1",
                per,
            )));
        }
        store.apply(watcher::Event::Apply(service("p", "over", "10.0.0.1", 1)));
        assert_eq!(store.services("p").len(), MAX_SERVICE_PORTS / per as usize);
        assert!(!names(&store, "p").contains(&"over".to_owned()));
        // Replacing one in place frees its ports first.
        store.apply(watcher::Event::Apply(service("p", "s0", "10.0.0.1", 2)));
        store.apply(watcher::Event::Apply(service("p", "over", "10.0.0.1", 1)));
        assert!(names(&store, "p").contains(&"over".to_owned()));

        // Services: the count bound.
        let store = ServiceStore::new();
        for i in 0..=MAX_SERVICES {
            store.apply(watcher::Event::Apply(service(
                "n",
                &format!("s{i}"),
                "10.0.0.1",
                0,
            )));
        }
        assert_eq!(store.services("n").len(), MAX_SERVICES);
        let inner = store.0.lock_unpoisoned();
        assert_eq!(inner.services.count, MAX_SERVICES);
        assert_eq!(inner.not_kept, 1);
    }
}
