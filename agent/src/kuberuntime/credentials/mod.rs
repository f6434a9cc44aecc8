//! The credentials an image pull presents to its registry (upstream `pkg/credentialprovider`
//! and the kubelet's `getPullSecretsForPod`): the pod's `imagePullSecrets` read from the API
//! server ([`PullSecrets`]), made into a keyring (`keyring.rs`), and the keyring's matches for
//! the image tried in turn by the image puller (`images.rs`, as upstream's `PullImage` in
//! `kuberuntime_image.go`).
//!
//! The node's credential provider plugins (upstream's `pkg/credentialprovider/plugin`) are
//! `provider/`; their credentials follow the pull secrets' in a pull (`images.rs`).
//!
//! Not here: the pull itself, its back-off and events (`images.rs`).

pub mod keyring;
pub mod provider;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{Api, Client};

pub use keyring::{Credential, Keyring, KeyringError, repository_of};
pub use provider::CredentialProviders;

/// Why a pull secret could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PullSecretError {
    #[error("secret {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("reading secret {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("no API server to read secret {namespace}/{name} from")]
    NoApiServer { namespace: String, name: String },
}

/// Where pull secrets are read from.
#[tonic::async_trait]
pub trait PullSecrets: Send + Sync {
    async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, PullSecretError>;
}

/// No API server (static pods only): a pod naming pull secrets pulls without them, as
/// upstream's kubelet without a client, whose secret manager fails every read.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoPullSecrets;

#[tonic::async_trait]
impl PullSecrets for NoPullSecrets {
    async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, PullSecretError> {
        Err(PullSecretError::NoApiServer {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

/// The API server's secrets, read at each pull through kube's client (upstream's default
/// secret manager watches the pods' secrets; a read per pull sees the same objects, with
/// nothing cached to bound).
pub struct ApiPullSecrets(pub Client);

#[tonic::async_trait]
impl PullSecrets for ApiPullSecrets {
    async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, PullSecretError> {
        let api: Api<Secret> = Api::namespaced(self.0.clone(), namespace);
        match api.get(name).await {
            Ok(secret) => Ok(secret),
            Err(kube::Error::Api(status)) if status.code == 404 || status.reason == "NotFound" => {
                Err(PullSecretError::NotFound {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            Err(source) => Err(PullSecretError::Read {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source,
            }),
        }
    }
}

/// How many distinct pull secrets one pull reads at most. A pod's author controls the list, and
/// each name costs an API request on the node's shared, rate-limited client: thousands of names
/// would starve every other pod's API calls. Upstream reads them all; no real pod needs more.
pub const MAX_PULL_SECRETS: usize = 32;

/// The pod's pull secrets that could be read, and the names of those that could not (upstream
/// `getPullSecretsForPod`: an empty name is skipped, a failed read is reported, not fatal). A
/// name listed twice is read once, and at most [`MAX_PULL_SECRETS`] names are read; the rest
/// are left out with a warning.
pub async fn pull_secrets_for_pod(
    source: &dyn PullSecrets,
    pod: &Pod,
) -> (Vec<Secret>, Vec<String>) {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let names = pod
        .spec
        .as_ref()
        .and_then(|s| s.image_pull_secrets.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.name.as_str())
        .filter(|name| !name.is_empty());
    let mut seen = std::collections::HashSet::new();
    let mut unique = Vec::new();
    let mut left_out = 0_usize;
    for name in names {
        if !seen.contains(name) {
            if unique.len() < MAX_PULL_SECRETS {
                seen.insert(name);
                unique.push(name);
            } else {
                left_out += 1;
            }
        }
    }
    if left_out > 0 {
        tracing::warn!(
            pod = %format!("{namespace}/{}", pod.metadata.name.as_deref().unwrap_or_default()),
            read = MAX_PULL_SECRETS,
            left_out,
            "the pod names more image pull secrets than are read for one pull"
        );
    }
    let mut secrets = Vec::new();
    let mut failed = Vec::new();
    for name in unique {
        match source.secret(namespace, name).await {
            Ok(secret) => secrets.push(secret),
            Err(e) => {
                tracing::info!(
                    pod = %format!("{namespace}/{}", pod.metadata.name.as_deref().unwrap_or_default()),
                    error = %e,
                    "Unable to retrieve pull secret, the image pull may not succeed."
                );
                failed.push(name.to_owned());
            }
        }
    }
    (secrets, failed)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::LocalObjectReference;

    use super::*;

    struct Fixed(BTreeMap<(String, String), Secret>);

    #[tonic::async_trait]
    impl PullSecrets for Fixed {
        async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, PullSecretError> {
            self.0
                .get(&(namespace.to_owned(), name.to_owned()))
                .cloned()
                .ok_or_else(|| PullSecretError::NotFound {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
        }
    }

    /// Counts the reads a pull makes; every secret is missing.
    struct Counting(std::sync::atomic::AtomicUsize);

    #[tonic::async_trait]
    impl PullSecrets for Counting {
        async fn secret(&self, namespace: &str, name: &str) -> Result<Secret, PullSecretError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(PullSecretError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
        }
    }

    /// A pod naming thousands of pull secrets (and one name again and again) costs a bounded
    /// number of API reads, and the warning event names a bounded list.
    #[tokio::test]
    async fn a_pod_naming_thousands_of_pull_secrets_costs_a_bounded_number_of_reads() {
        let names: Vec<String> = (0..5000)
            .map(|i| format!("secret-{i}"))
            .chain(std::iter::repeat_n("secret-0".to_owned(), 5000))
            .collect();
        let pod = crate::testing::pod()
            .namespace("team")
            .spec(|s| {
                s.image_pull_secrets = Some(
                    names
                        .iter()
                        .map(|n| LocalObjectReference { name: n.clone() })
                        .collect(),
                );
            })
            .build();
        let source = Counting(std::sync::atomic::AtomicUsize::new(0));
        let (secrets, failed) = pull_secrets_for_pod(&source, &pod).await;
        assert!(secrets.is_empty());
        assert_eq!(
            source.0.load(std::sync::atomic::Ordering::Relaxed),
            MAX_PULL_SECRETS
        );
        assert_eq!(failed.len(), MAX_PULL_SECRETS);
        assert_eq!(failed[0], "secret-0");
    }

    #[tokio::test]
    async fn readable_secrets_are_used_and_the_others_named() {
        let known = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("there".into()),
                namespace: Some("team".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let source = Fixed([(("team".to_owned(), "there".to_owned()), known)].into());
        let pod = crate::testing::pod()
            .namespace("team")
            .spec(|s| {
                s.image_pull_secrets = Some(
                    ["there", "", "missing"]
                        .into_iter()
                        .map(|n| LocalObjectReference { name: n.into() })
                        .collect(),
                );
            })
            .build();
        let (secrets, failed) = pull_secrets_for_pod(&source, &pod).await;
        assert_eq!(secrets.len(), 1);
        assert_eq!(secrets[0].metadata.name.as_deref(), Some("there"));
        assert_eq!(failed, ["missing"]);
        let (none, failed) = pull_secrets_for_pod(&NoPullSecrets, &pod).await;
        assert!(none.is_empty());
        assert_eq!(failed, ["there", "missing"]);
    }
}
