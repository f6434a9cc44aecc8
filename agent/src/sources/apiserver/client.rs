//! The agent's API clients, built from `--kubeconfig` as upstream's `buildKubeletClientConfig` and
//! `RunKubelet` build the kubelet's: the main client (pods, statuses, volumes' objects, reviews)
//! limited to `kubeAPIQPS`/`kubeAPIBurst` by one token bucket, and the heartbeat client (Lease
//! and Node status) with no rate limit and a timeout of `min(nodeStatusUpdateFrequency,
//! nodeLeaseDurationSeconds)`, so that a busy node's requests never delay its heartbeat; and the
//! events client, which the event writer limits to `eventRecordQPS`/`eventBurst` itself.
//!
//! Neither retries inside a call (kube's default retries a 429/503/504 up to 15 times with a
//! back-off growing to minutes): every loop tries again on its own period, as the kubelet's do.
//! Every request names the agent in its `User-Agent`, for the API server's audit log and its
//! priority-and-fairness rules.
//!
//! Not here: the rate limiter itself (`ratelimit.rs`), what the clients are used for.

use std::{path::Path, sync::Arc, time::Duration};

use crate::certificate::transport::{Identity, client_builder};
use http::{HeaderValue, header::USER_AGENT};
use kube::{
    Client,
    client::ClientBuilder,
    config::{KubeConfigOptions, Kubeconfig},
};

use super::{
    Error,
    ratelimit::{RateLimitLayer, TokenBucket},
};

/// How the agent's clients are limited (upstream `kubeAPIQPS`, `kubeAPIBurst`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientSettings {
    pub qps: u32,
    pub burst: u32,
    /// Upstream's heartbeat client timeout: `min(nodeStatusUpdateFrequency, lease duration)`.
    pub heartbeat_timeout: Duration,
}

/// The agent's two clients of one API server.
#[derive(Clone)]
pub struct ApiClients {
    /// Rate-limited: everything but the heartbeat.
    pub main: Client,
    /// Not rate-limited, with a timeout: the Lease and the Node status.
    pub heartbeat: Client,
    /// Not rate-limited here: Kubernetes Events, which their writer holds to `eventRecordQPS`
    /// itself (upstream's kubelet has a client of its own for events, with those limits).
    pub events: Client,
}

impl std::fmt::Debug for ApiClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClients").finish_non_exhaustive()
    }
}

impl ApiClients {
    /// Both clients from the kubeconfig at `path`.
    pub async fn connect(path: &Path, settings: &ClientSettings) -> Result<ApiClients, Error> {
        let bucket = Arc::new(TokenBucket::new(settings.qps, settings.burst));
        let config = kube_config(path).await?;
        let main = ClientBuilder::try_from(config.clone())
            .map_err(client_error(path))?
            .with_layer(&RateLimitLayer::new(bucket))
            .build();
        let events = Client::try_from(config.clone()).map_err(client_error(path))?;
        let mut heartbeat = config;
        heartbeat.connect_timeout = Some(settings.heartbeat_timeout);
        heartbeat.read_timeout = Some(settings.heartbeat_timeout);
        heartbeat.write_timeout = Some(settings.heartbeat_timeout);
        let heartbeat = Client::try_from(heartbeat).map_err(client_error(path))?;
        Ok(ApiClients {
            main,
            heartbeat,
            events,
        })
    }
}

impl ApiClients {
    /// The three clients of the kubeconfig at `path`, presenting `identity`'s client certificate
    /// (which rotates; `certificate::transport` closes their connections when it does) instead
    /// of the kubeconfig's own.
    pub async fn connect_rotating(
        path: &Path,
        settings: &ClientSettings,
        identity: &Arc<Identity>,
    ) -> Result<ApiClients, Error> {
        let bucket = Arc::new(TokenBucket::new(settings.qps, settings.burst));
        let config = kube_config(path).await?;
        let main = client_builder(&config, identity)
            .map_err(client_error(path))?
            .with_layer(&RateLimitLayer::new(bucket))
            .build();
        let events = client_builder(&config, identity)
            .map_err(client_error(path))?
            .build();
        let mut heartbeat = config;
        heartbeat.connect_timeout = Some(settings.heartbeat_timeout);
        heartbeat.read_timeout = Some(settings.heartbeat_timeout);
        heartbeat.write_timeout = Some(settings.heartbeat_timeout);
        let heartbeat = client_builder(&heartbeat, identity)
            .map_err(client_error(path))?
            .build();
        Ok(ApiClients {
            main,
            heartbeat,
            events,
        })
    }
}

/// A client from the kubeconfig at `path` (its current context), with no rate limit, naming
/// itself `user_agent`: for tools and tests. Nothing is inferred from the environment.
pub async fn client_from_kubeconfig(path: &Path, user_agent: &str) -> Result<Client, Error> {
    let mut config = kube_config(path).await?;
    if let Ok(agent) = HeaderValue::from_str(user_agent) {
        config.headers.retain(|(name, _)| name != USER_AGENT);
        config.headers.push((USER_AGENT, agent));
    }
    Client::try_from(config).map_err(client_error(path))
}

async fn kube_config(path: &Path) -> Result<kube::Config, Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
        path: path.to_owned(),
        source,
    })?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|source| Error::Kubeconfig {
                path: path.to_owned(),
                source,
            })?;
    config.default_retry = false;
    config.headers.push((USER_AGENT, user_agent()));
    Ok(config)
}

/// `swiftlet/<version> (linux/<arch>)`, in the shape of upstream's `kubelet/<version> (<os>/<arch>)`.
fn user_agent() -> HeaderValue {
    let arch = super::go_arch(std::env::consts::ARCH);
    HeaderValue::from_str(&format!(
        "swiftlet/{} (linux/{arch})",
        env!("CARGO_PKG_VERSION")
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("swiftlet"))
}

fn client_error(path: &Path) -> impl FnOnce(kube::Error) -> Error {
    let path = path.to_owned();
    move |source| Error::Client { path, source }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    #[test]
    fn the_user_agent_names_the_agent_and_platform() {
        let agent = user_agent();
        let agent = agent.to_str().expect("ascii");
        assert!(agent.starts_with("swiftlet/"), "{agent}");
        assert!(agent.contains("(linux/"), "{agent}");
    }

    #[tokio::test]
    async fn client_errors_name_the_kubeconfig() {
        let missing = Path::new("/nonexistent/swiftlet/kubeconfig");
        let Err(error) = client_from_kubeconfig(missing, "t").await else {
            panic!("a missing file is an error");
        };
        assert!(
            error
                .to_string()
                .contains("/nonexistent/swiftlet/kubeconfig"),
            "{error}"
        );

        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(b"apiVersion: v1\nkind: Config\nclusters: []\n")
            .expect("write");
        let Err(error) = client_from_kubeconfig(file.path(), "t").await else {
            panic!("a kubeconfig without a context is an error");
        };
        assert!(
            error
                .to_string()
                .contains(&file.path().display().to_string()),
            "{error}"
        );
    }

    #[tokio::test]
    async fn client_from_a_complete_kubeconfig() {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(
            b"apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n    namespace: ns1\nusers:\n- name: u\n  user:\n    token: t\n",
        )
        .expect("write");
        let client = client_from_kubeconfig(file.path(), "t")
            .await
            .expect("client");
        assert_eq!(client.default_namespace(), "ns1");
    }
}
