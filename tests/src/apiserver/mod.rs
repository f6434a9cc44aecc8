//! A Kubernetes API server of the project's own, for system tests and benchmarks: swiftlet
//! reaches it exactly as it reaches a real one (HTTPS, a CA, a kubeconfig), because no
//! kube-apiserver, k3s or envtest can be installed where these tests run. It implements the
//! API semantics swiftlet relies on, as the API conventions document them
//! (<https://kubernetes.io/docs/reference/using-api/api-concepts/>): a store with monotonic
//! resourceVersions ([`store`]), list and watch with selectors, pages, bookmarks and 410 Gone
//! ([`list`], [`watch`], [`selector`]), the patch types ([`patch`], [`json_patch`]), the
//! resources' create/update strategies ([`strategy`], with the pods' `ephemeralcontainers`
//! subresource in [`ephemeral`]), graceful deletion ([`deletion`]), the
//! review and token resources ([`reviews`]), HTTP routing and discovery ([`http`],
//! [`discovery`]), TLS and the kubeconfig ([`serve`]), and fault injection for tests
//! ([`faults`], driven through [`control`]).
//!
//! For the kubelet's TLS bootstrap it authenticates admin and bootstrap tokens and client
//! certificates ([`authn`]), authorizes as a kubeadm cluster's RBAC does for nodes and
//! bootstrappers ([`authz`]), serves CertificateSigningRequests ([`csr`]) and runs the
//! approving and signing controllers ([`controllers`], [`signer`]) with its CA.
//!
//! It is not an API server: no admission beyond the namespace's existence, no validation
//! beyond what the tests need, no RBAC objects, no persistence, no server-side apply. Never shipped in
//! the agent. Upstream counterpart: `k8s.io/apiserver` with `pkg/registry`.

pub mod authn;
pub mod authz;
pub mod control;
pub mod controllers;
pub mod csr;
pub mod deletion;
pub mod discovery;
pub mod ephemeral;
pub mod faults;
pub mod http;
pub mod json_patch;
pub mod list;
pub mod meta;
pub mod patch;
pub mod resources;
pub mod reviews;
pub mod selector;
pub mod serve;
pub mod signer;
pub mod status;
pub mod store;
pub mod strategy;
pub mod watch;

use std::{
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use serde_json::json;

pub use faults::{Faults, LoggedRequest};
pub use reviews::{AccessRule, ReviewTable};

/// How the server behaves; the binary's flags.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The bearer token every request must carry (the kubeconfig's).
    pub token: String,
    /// How many changes the watch history keeps (older versions get 410 Gone).
    pub history: usize,
    /// How often a watch that asked for bookmarks gets one.
    pub bookmark_interval: Duration,
    /// The shortest TokenRequest expiration accepted, in seconds (upstream: 600).
    pub min_token_expiration_seconds: i64,
    /// The longest TokenRequest expiration granted, in seconds; 0 for no cap (kube-apiserver's
    /// `--service-account-max-token-expiration`).
    pub max_token_expiration_seconds: i64,
    /// The largest request body, in bytes (upstream: 3 MiB); larger ones get 413.
    pub max_body_bytes: usize,
    /// The bootstrap tokens (`<id>.<secret>`) that authenticate as `system:bootstrap:<id>`.
    pub bootstrap_tokens: Vec<String>,
    /// The longest certificate the CSR signer issues, in seconds
    /// (`--cluster-signing-duration`; upstream's default is a year).
    pub cluster_signing_seconds: i64,
    /// Whether node client CSRs are approved automatically (kube-controller-manager's
    /// csrapproving controller, on in kubeadm clusters).
    pub auto_approve: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            token: format!("swiftlet-test-{:016x}", fastrand::u64(..)),
            history: 10_000,
            bookmark_interval: Duration::from_secs(5),
            min_token_expiration_seconds: 600,
            max_token_expiration_seconds: 0,
            max_body_bytes: 3 * 1024 * 1024,
            bootstrap_tokens: Vec::new(),
            cluster_signing_seconds: 365 * 24 * 3600,
            auto_approve: true,
        }
    }
}

/// The server's state, shared by every connection.
pub struct ApiServer {
    pub config: ServerConfig,
    store: Mutex<store::Store>,
    reviews: Mutex<reviews::Reviews>,
    pub faults: Faults,
    /// The cluster CA the CSR signer signs with (the one serving TLS); none in unit tests of
    /// other parts.
    ca: Option<signer::Ca>,
    /// The CA as the client CA (kube-apiserver's `--client-ca-file`).
    client_roots: Option<authn::ClientRoots>,
}

/// The namespaces the API server itself makes (`pkg/controlplane` system namespaces).
pub const SYSTEM_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

impl ApiServer {
    /// A server with the system namespaces and the `default/kubernetes` Service pointing at
    /// `port` (what upstream's `controlplane` reconciler keeps; swiftlet's service environment
    /// variables come from it).
    pub fn new(config: ServerConfig, port: u16) -> ApiServer {
        let server = ApiServer {
            store: Mutex::new(store::Store::new(config.history)),
            reviews: Mutex::new(reviews::Reviews::default()),
            faults: Faults::default(),
            ca: None,
            client_roots: None,
            config,
        };
        let now = meta::now_seconds();
        let mut store = server.store();
        let seeds = SYSTEM_NAMESPACES
            .iter()
            .map(|ns| ("namespaces", None, json!({"metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})))
            .chain([(
                "services",
                Some("default"),
                json!({
                    "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
                    "spec": {
                        "type": "ClusterIP",
                        "clusterIP": "10.96.0.1",
                        "clusterIPs": ["10.96.0.1"],
                        "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": port}],
                        "sessionAffinity": "None",
                    },
                }),
            )]);
        for (plural, namespace, object) in seeds {
            let Some(resource) = resources::find("", "v1", plural) else {
                continue;
            };
            // Fixed, valid objects in an empty store: creating them cannot fail.
            let _ = strategy::prepare_create(resource, namespace, object, now)
                .and_then(|o| store.create(resource, o));
        }
        drop(store);
        server
    }

    /// The server signing CSRs with `ca` (run [`controllers::run`] to sign) and trusting the
    /// client certificates it signed.
    pub fn with_ca(mut self, ca: signer::Ca) -> Result<ApiServer, serve::Error> {
        self.client_roots = Some(serve::client_roots(&ca)?);
        self.ca = Some(ca);
        Ok(self)
    }

    pub fn client_roots(&self) -> Option<&authn::ClientRoots> {
        self.client_roots.as_ref()
    }

    pub fn ca(&self) -> Option<&signer::Ca> {
        self.ca.as_ref()
    }

    /// The store, locked (held only for the synchronous part of a request).
    pub fn store(&self) -> MutexGuard<'_, store::Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn reviews(&self) -> MutexGuard<'_, reviews::Reviews> {
        self.reviews.lock().unwrap_or_else(|p| p.into_inner())
    }
}
