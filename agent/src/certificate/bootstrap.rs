//! The TLS bootstrap: with `--bootstrap-kubeconfig`, make sure `--kubeconfig` holds a client
//! certificate that has not expired; otherwise request one with the bootstrap credentials and
//! write `--kubeconfig` to use it.
//!
//! Upstream: `pkg/kubelet/certificate/bootstrap/bootstrap.go` — `LoadClientCert` (keep a
//! kubeconfig whose certificates are all unexpired, `isClientConfigStillValid`; else a key kept
//! in `kubelet-client.key.tmp` until the certificate comes, so a restart asks again under the
//! same CSR name, `digestedName`; wait up to an hour; store the pair as
//! `kubelet-client-current.pem`) and `writeKubeconfigFromBootstrapping` (the kubeconfig's
//! shape, the bootstrap kubeconfig's server and CA). A CSR that is Denied or Failed is an
//! error; its key is dropped so the next try (the caller retries) asks afresh under a new name
//! (upstream keeps the key, so a restarted kubelet finds the same denied CSR until an
//! administrator deletes it).
//! Not here: renewing the certificate (`manager.rs`).

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use base64::Engine as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use rcgen::KeyPair;
use rustls::pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;

use super::{
    Error,
    csr::{self, Kind, Subject},
    store::{self, CLIENT_PEM, ClusterCa, PENDING_KEY, Pair, Store},
};

/// How long upstream's bootstrap waits for its CSR.
const WAIT_TIMEOUT: Duration = Duration::from_secs(3600);

/// What the bootstrap found or did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `--kubeconfig` has a client certificate still valid: used as it is.
    Kept,
    /// A certificate was issued and `--kubeconfig` written; the new serial.
    Issued { serial: String },
}

/// Upstream's `LoadClientCert`.
pub async fn load_client_cert(
    kubeconfig: &Path,
    bootstrap: &Path,
    store: &Store,
    node_name: &str,
    now: SystemTime,
) -> Result<Outcome, Error> {
    match client_certificate_valid(kubeconfig, now).await {
        Ok(true) => {
            tracing::info!(kubeconfig = %kubeconfig.display(), "the kubeconfig's client certificate is valid; no bootstrap");
            return Ok(Outcome::Kept);
        }
        Ok(false) => {}
        Err(error) => {
            tracing::info!(kubeconfig = %kubeconfig.display(), %error, "the kubeconfig is not usable; bootstrapping a client certificate");
        }
    }
    let (server, ca) = bootstrap_cluster(bootstrap)?;
    let mut bootstrap_config = load(bootstrap).await?;
    // No retries inside a call: the caller tries again on its own back-off.
    bootstrap_config.default_retry = false;
    if let Ok(agent) = http::HeaderValue::from_str(&user_agent()) {
        bootstrap_config
            .headers
            .push((http::header::USER_AGENT, agent));
    }
    let client = kube::Client::try_from(bootstrap_config).map_err(|e| Error::Client {
        path: bootstrap.to_owned(),
        source: Box::new(e),
    })?;
    let key = pending_key(store)?;
    let subject = Subject::node(node_name);
    let name = csr::digested_name(&key, &subject, &Kind::Client.usages());
    let request = csr::request_pem(&subject, &key)?;
    csr::create(&client, &csr::object(&name, Kind::Client, &request), &key).await?;
    tracing::info!(
        csr = name,
        "waiting for the client certificate signing request to be approved and signed"
    );
    let certificate =
        match tokio::time::timeout(WAIT_TIMEOUT, csr::wait_for_certificate(&client, &name)).await {
            Ok(Ok(certificate)) => certificate,
            Ok(Err(error)) => {
                if matches!(error, Error::NotIssued { .. } | Error::Deleted { .. }) {
                    store.remove(PENDING_KEY)?;
                }
                return Err(error);
            }
            Err(_) => {
                return Err(Error::Timeout {
                    name,
                    seconds: WAIT_TIMEOUT.as_secs(),
                });
            }
        };
    let pem_path = store.file_path(CLIENT_PEM);
    let pair =
        Pair::from_parts(&certificate, key.serialize_pem().as_bytes(), &pem_path).map_err(|e| {
            Error::BadIssued {
                name: name.clone(),
                reason: e.to_string(),
            }
        })?;
    store.write(CLIENT_PEM, &pair.pem)?;
    store::write_kubeconfig(kubeconfig, &store::kubeconfig_yaml(&server, &ca, &pem_path))?;
    store.remove(PENDING_KEY)?;
    tracing::info!(csr = name, serial = pair.serial, kubeconfig = %kubeconfig.display(), "client certificate issued; kubeconfig written");
    Ok(Outcome::Issued {
        serial: pair.serial,
    })
}

fn user_agent() -> String {
    format!("swiftlet/{} (bootstrap)", env!("CARGO_PKG_VERSION"))
}

/// The key of the pending request: the one kept from an earlier try, else a new one, kept.
fn pending_key(store: &Store) -> Result<KeyPair, Error> {
    if let Some(pem) = store.read(PENDING_KEY)? {
        match std::str::from_utf8(&pem).ok().map(KeyPair::from_pem) {
            Some(Ok(key)) => return Ok(key),
            _ => {
                tracing::warn!(file = %store.file_path(PENDING_KEY).display(), "the pending key is not a key; making a new one")
            }
        }
    }
    let key = csr::new_key()?;
    store.write(PENDING_KEY, key.serialize_pem().as_bytes())?;
    Ok(key)
}

/// Whether the kubeconfig at `path` presents client certificates, none expired at `now`
/// (upstream `isClientConfigStillValid`). `Ok(false)` when there is no file.
pub async fn client_certificate_valid(path: &Path, now: SystemTime) -> Result<bool, Error> {
    if !path.exists() {
        return Ok(false);
    }
    let Some(chain) = client_certificates(path).await? else {
        return Ok(false);
    };
    if chain.is_empty() {
        return Ok(false);
    }
    for der in &chain {
        let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| Error::BadPem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let not_after = cert.validity().not_after.timestamp();
        let now_s = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        if now_s > not_after {
            tracing::info!(kubeconfig = %path.display(), "the kubeconfig's client certificate expired");
            return Ok(false);
        }
    }
    Ok(true)
}

async fn client_certificates(path: &Path) -> Result<Option<Vec<CertificateDer<'static>>>, Error> {
    let config = load(path).await?;
    let auth = &config.auth_info;
    let pem = if let Some(data) = &auth.client_certificate_data {
        base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| content(path, format!("client-certificate-data: {e}")))?
    } else if let Some(file) = &auth.client_certificate {
        std::fs::read(file).map_err(|source| Error::Read {
            path: PathBuf::from(file),
            source,
        })?
    } else {
        return Ok(None);
    };
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| content(path, format!("client certificate: {e}")))?;
    Ok(Some(chain))
}

fn content(path: &Path, reason: String) -> Error {
    Error::KubeconfigContent {
        path: path.to_owned(),
        reason,
    }
}

async fn load(path: &Path) -> Result<kube::Config, Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
        path: path.to_owned(),
        source,
    })?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| Error::Kubeconfig {
            path: path.to_owned(),
            source,
        })
}

/// The server and CA of the bootstrap kubeconfig's current context, as written there (a
/// relative CA path made absolute against the kubeconfig's directory, as client-go resolves it).
pub fn bootstrap_cluster(path: &Path) -> Result<(String, ClusterCa), Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
        path: path.to_owned(),
        source,
    })?;
    let context_name = kubeconfig
        .current_context
        .clone()
        .ok_or_else(|| content(path, "no current-context".into()))?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| content(path, format!("no context {context_name:?}")))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| content(path, format!("no cluster {:?}", context.cluster)))?;
    let server = cluster
        .server
        .clone()
        .ok_or_else(|| content(path, format!("cluster {:?} has no server", context.cluster)))?;
    let ca = if let Some(data) = &cluster.certificate_authority_data {
        ClusterCa::Data(data.clone())
    } else if let Some(file) = &cluster.certificate_authority {
        let file = PathBuf::from(file);
        ClusterCa::File(if file.is_absolute() {
            file
        } else {
            path.parent().unwrap_or(Path::new("/")).join(file)
        })
    } else if cluster.insecure_skip_tls_verify == Some(true) {
        ClusterCa::Insecure
    } else {
        ClusterCa::System
    };
    Ok((server, ca))
}

/// Whether the kubeconfig at `path` is the bootstrap's shape: its user is the client
/// certificate and key in `pem_path` and nothing else (rotation replaces that file; a kubeconfig
/// of other credentials is the operator's to renew).
pub async fn written_by_bootstrap(path: &Path, pem_path: &Path) -> Result<bool, Error> {
    let config = load(path).await?;
    let auth = &config.auth_info;
    let pem = Some(pem_path.to_string_lossy().into_owned());
    Ok(auth.client_certificate == pem
        && auth.client_key == pem
        && auth.token.is_none()
        && auth.token_file.is_none()
        && auth.exec.is_none()
        && auth.auth_provider.is_none()
        && auth.username.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificate::csr::tests::self_signed_pem;

    fn write(path: &Path, text: &str) {
        std::fs::write(path, text).expect("write");
    }

    #[tokio::test]
    async fn a_kubeconfig_with_an_unexpired_certificate_is_kept_and_an_expired_one_is_not() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&tmp.path().join("pki")).expect("store");
        let pem_path = store.file_path(CLIENT_PEM);
        let kubeconfig = tmp.path().join("kubelet.conf");
        assert!(
            !client_certificate_valid(&kubeconfig, SystemTime::now())
                .await
                .expect("missing is not valid")
        );

        store
            .write(CLIENT_PEM, &self_signed_pem("system:node:n", 3600))
            .expect("pem");
        let yaml = store::kubeconfig_yaml("https://127.0.0.1:1", &ClusterCa::Insecure, &pem_path);
        write(&kubeconfig, &yaml);
        assert!(
            client_certificate_valid(&kubeconfig, SystemTime::now())
                .await
                .expect("valid")
        );
        let later = SystemTime::now() + Duration::from_secs(7200);
        assert!(
            !client_certificate_valid(&kubeconfig, later)
                .await
                .expect("expired")
        );
        assert!(
            written_by_bootstrap(&kubeconfig, &pem_path)
                .await
                .expect("reads")
        );

        let token = "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\nusers:\n- name: u\n  user:\n    token: t\n";
        write(&kubeconfig, token);
        assert!(
            !client_certificate_valid(&kubeconfig, SystemTime::now())
                .await
                .expect("no certificate")
        );
        assert!(
            !written_by_bootstrap(&kubeconfig, &pem_path)
                .await
                .expect("reads")
        );
    }

    #[test]
    fn the_bootstrap_kubeconfigs_server_and_ca_carry_over() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let bootstrap = tmp.path().join("bootstrap.conf");
        write(
            &bootstrap,
            "apiVersion: v1\nkind: Config\ncurrent-context: tls-bootstrap\nclusters:\n- name: k\n  cluster:\n    server: https://10.0.0.1:6443\n    certificate-authority: pki/ca.crt\ncontexts:\n- name: tls-bootstrap\n  context:\n    cluster: k\n    user: b\nusers:\n- name: b\n  user:\n    token: abcdef.0123456789abcdef\n",
        );
        let (server, ca) = bootstrap_cluster(&bootstrap).expect("reads");
        assert_eq!(server, "https://10.0.0.1:6443");
        assert_eq!(ca, ClusterCa::File(tmp.path().join("pki/ca.crt")));

        write(
            &bootstrap,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://h:1\n    certificate-authority-data: QUJD\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: b\nusers:\n- name: b\n  user:\n    token: t\n",
        );
        assert_eq!(
            bootstrap_cluster(&bootstrap).expect("reads").1,
            ClusterCa::Data("QUJD".into())
        );
        write(&bootstrap, "apiVersion: v1\nkind: Config\nclusters: []\n");
        let error = bootstrap_cluster(&bootstrap).expect_err("no context");
        assert!(error.to_string().contains("bootstrap.conf"), "{error}");
    }

    #[test]
    fn the_pending_key_is_kept_between_tries() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = Store::open(tmp.path()).expect("store");
        let first = pending_key(&store).expect("new");
        let again = pending_key(&store).expect("kept");
        assert_eq!(first.serialize_der(), again.serialize_der());
        store.write(PENDING_KEY, b"garbage").expect("write");
        let fresh = pending_key(&store).expect("replaced");
        assert_ne!(fresh.serialize_der(), first.serialize_der());
    }
}
