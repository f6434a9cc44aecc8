//! The node's certificates from the cluster: the TLS bootstrap (`bootstrap.rs`: a client
//! certificate requested with the bootstrap kubeconfig's credentials, and the kubeconfig that
//! uses it), the managers that renew the client and serving certificates before they expire, or
//! at once when one no longer covers what the node would request (`manager.rs`, `template.rs`),
//! the requests themselves (`csr.rs`), their files (`store.rs`), the API clients' transport that
//! presents the current client certificate and drops every connection when it changes
//! (`transport.rs`), and the managers' metrics (`metrics.rs`).
//!
//! Upstream: `pkg/kubelet/certificate` (`bootstrap/bootstrap.go` `LoadClientCert`,
//! `kubelet.go` `NewKubeletServerCertificateManager`, `transport.go` `UpdateTransport`) and
//! client-go `util/certificate` (the manager, the store, `csr/csr.go`); the flow is
//! <https://kubernetes.io/docs/reference/access-authn-authz/kubelet-tls-bootstrapping/>.
//! Not here: the kubelet server's TLS configuration (`server/tls.rs`), which takes the serving
//! certificate through its handle.

pub mod bootstrap;
pub mod csr;
pub mod manager;
pub mod metrics;
pub mod store;
pub mod template;
pub mod transport;

use std::path::PathBuf;

/// What went wrong with a certificate, naming the file or CSR it concerned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cert dir: {0}")]
    Store(#[source] crate::hostfs::Error),
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a certificate and key in PEM: {reason}")]
    BadPem { path: PathBuf, reason: String },
    #[error("--kubeconfig {0}: not a file path")]
    KubeconfigPath(PathBuf),
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("kubeconfig {path}: {reason}")]
    KubeconfigContent { path: PathBuf, reason: String },
    #[error("API client from {path}: {source}")]
    Client {
        path: PathBuf,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("generating a key or request: {0}")]
    Generate(#[source] rcgen::Error),
    #[error("certificate signing request {name}: {source}")]
    Api {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "certificate signing request {name} exists and asks for a different key or signer; \
         delete it to request again"
    )]
    Incompatible { name: String },
    #[error("certificate signing request {name} was deleted while waiting for it")]
    Deleted { name: String },
    #[error("certificate signing request {name} is {condition}: {reason}: {message}")]
    NotIssued {
        name: String,
        condition: String,
        reason: String,
        message: String,
    },
    #[error("certificate signing request {name}: not issued within {seconds} s")]
    Timeout { name: String, seconds: u64 },
    #[error("certificate signing request {name}: the issued certificate does not fit: {reason}")]
    BadIssued { name: String, reason: String },
}
