//! What a container's environment needs from the cluster, read before its config is built
//! (upstream reads the same through `configMapManager.GetConfigMap`, `secretManager.GetSecret`
//! and the service lister inside `makeEnvironmentVariables`): the ConfigMaps and Secrets its
//! `envFrom` and `valueFrom` name, each read once per start, and its service variables.
//! [`ClusterEnv::gather`] does the reading; `env::environment` then decides, purely, from
//! what was read.
//!
//! Bounds: objects are read one at a time, and only what the environment can use is kept of
//! each (every key of an `envFrom` object, the named keys of the others), at most
//! [`MAX_EXPANDED_BYTES`] in all; past that the container fails with
//! `CreateContainerConfigError` naming the object.
//!
//! Without an API server ([`ClusterEnv::standalone`]) nothing is read: references fail the
//! container unless optional, and there are no service variables (upstream's kubelet without a
//! `kubeClient`).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    EnvError, MAX_EXPANDED_BYTES,
    services::{ServiceLister, service_env},
};

/// Why an object could not be read (the API server's answer or the connection's failure).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ReadError(pub Box<dyn std::error::Error + Send + Sync>);

/// Reads ConfigMaps and Secrets (the API server; a fake in tests).
#[tonic::async_trait]
pub trait EnvObjects: Send + Sync {
    /// The ConfigMap's `data` (upstream's environment reads no `binaryData`), `None` when it
    /// does not exist.
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, ReadError>;

    /// The Secret's `data`, `None` when it does not exist.
    async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, ReadError>;
}

/// What reading one object found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup<T> {
    Found(T),
    NotFound,
    /// The reason, as the API client gave it.
    Failed(String),
}

/// Everything a container's environment was read to need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterValues {
    /// Whether an API server was there to ask.
    pub connected: bool,
    /// The service variables, sorted by name.
    pub services: Vec<(String, String)>,
    pub config_maps: BTreeMap<String, Lookup<BTreeMap<String, String>>>,
    /// Values as text: Secrets hold bytes, containers get strings; bytes that are not UTF-8
    /// become U+FFFD, as the runtime's JSON config does with upstream's Go strings.
    pub secrets: BTreeMap<String, Lookup<BTreeMap<String, String>>>,
}

/// The kinds `env` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    ConfigMap,
    Secret,
}

/// The keys wanted of one object: all of them (`envFrom`), or some.
#[derive(Debug)]
enum Keys {
    All,
    Some(BTreeSet<String>),
}

/// The cluster a container's environment reads from (none, standalone).
#[derive(Clone, Default)]
pub struct ClusterEnv {
    objects: Option<Arc<dyn EnvObjects>>,
    services: Option<Arc<dyn ServiceLister>>,
}

impl std::fmt::Debug for ClusterEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterEnv")
            .field("connected", &self.objects.is_some())
            .finish_non_exhaustive()
    }
}

impl ClusterEnv {
    /// No API server: nothing to read.
    pub fn standalone() -> Self {
        Self::default()
    }

    /// Objects from `objects`, services from `services`.
    pub fn new(objects: Arc<dyn EnvObjects>, services: Arc<dyn ServiceLister>) -> Self {
        ClusterEnv {
            objects: Some(objects),
            services: Some(services),
        }
    }

    /// Reads what `container`'s environment refers to. Fails only when the services were never
    /// listed (an API pod waits for them, as upstream: `KUBERNETES_SERVICE_HOST` must not be
    /// missing just because the agent started a moment ago) or what is kept grows past its
    /// bound; a missing or unreadable object is recorded for `environment` to judge.
    pub async fn gather(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<ClusterValues, EnvError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut values = ClusterValues::default();
        if let Some(lister) = &self.services {
            if !lister.synced() && !crate::pod::spec::is_static_pod(pod) {
                return Err(EnvError::ServicesNotSynced);
            }
            let links = pod
                .spec
                .as_ref()
                .and_then(|s| s.enable_service_links)
                .unwrap_or(true);
            values.services = service_env(lister.as_ref(), namespace, links);
        }
        let Some(objects) = &self.objects else {
            return Ok(values);
        };
        values.connected = true;
        let mut kept = 0usize;
        for ((kind, name), keys) in wanted(container) {
            let lookup = match kind {
                Kind::ConfigMap => objects.config_map(namespace, &name).await,
                Kind::Secret => objects.secret(namespace, &name).await.map(|found| {
                    found.map(|data| {
                        data.into_iter()
                            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                            .collect()
                    })
                }),
            };
            let lookup = match lookup {
                Ok(Some(mut data)) => {
                    if let Keys::Some(keys) = &keys {
                        data.retain(|k, _| keys.contains(k));
                    }
                    kept += data.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
                    if kept > MAX_EXPANDED_BYTES {
                        return Err(EnvError::TooLarge {
                            container: container.name.clone(),
                            field: format!("{} {name:?}", kind.as_str()),
                            limit: MAX_EXPANDED_BYTES,
                        });
                    }
                    Lookup::Found(data)
                }
                Ok(None) => Lookup::NotFound,
                Err(e) => Lookup::Failed(e.to_string()),
            };
            match kind {
                Kind::ConfigMap => values.config_maps.insert(name, lookup),
                Kind::Secret => values.secrets.insert(name, lookup),
            };
        }
        Ok(values)
    }
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configMap",
            Kind::Secret => "secret",
        }
    }
}

/// Every object the environment names, once, with the keys it needs of it. A variable with a
/// `value` does not read its `valueFrom` (upstream looks at `value` first).
fn wanted(container: &Container) -> BTreeMap<(Kind, String), Keys> {
    let mut wanted: BTreeMap<(Kind, String), Keys> = BTreeMap::new();
    for from in container.env_from.iter().flatten() {
        if let Some(c) = &from.config_map_ref {
            wanted.insert((Kind::ConfigMap, c.name.clone()), Keys::All);
        }
        if let Some(s) = &from.secret_ref {
            wanted.insert((Kind::Secret, s.name.clone()), Keys::All);
        }
    }
    for var in container.env.iter().flatten() {
        if !var.value.as_deref().unwrap_or_default().is_empty() {
            continue;
        }
        let Some(from) = &var.value_from else {
            continue;
        };
        let refs = [
            from.config_map_key_ref
                .as_ref()
                .map(|r| (Kind::ConfigMap, &r.name, &r.key)),
            from.secret_key_ref
                .as_ref()
                .map(|r| (Kind::Secret, &r.name, &r.key)),
        ];
        for (kind, name, key) in refs.into_iter().flatten() {
            let keys = wanted
                .entry((kind, name.clone()))
                .or_insert_with(|| Keys::Some(BTreeSet::new()));
            if let Keys::Some(keys) = keys {
                keys.insert(key.clone());
            }
        }
    }
    wanted
}
