//! Serving over HTTPS as a real API server does: a test CA, a server certificate for
//! `127.0.0.1`, `::1` and `localhost` signed by it (rcgen), rustls with HTTP/1.1, and a
//! kubeconfig naming the server, the CA file and the bearer token — the file `swiftlet run
//! --kubeconfig` and `kube::Config::from_custom_kubeconfig` read unchanged
//! (<https://kubernetes.io/docs/concepts/configuration/organize-cluster-access-kubeconfig/>).
//! The CA is also the client CA (kube-apiserver's `--client-ca-file` is the cluster CA in a
//! kubeadm cluster) and the CSR signer's: a client may present a certificate it signed, and
//! each connection's verified certificate goes into its requests as an
//! [`super::authn::PeerCertificate`].

use std::{net::SocketAddr, path::Path, sync::Arc};

use hyper_util::{rt::TokioIo, service::TowerToHyperService};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::{RootCertStore, ServerConfig as TlsConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use super::{
    ApiServer,
    authn::{ClientCertVerifier, ClientRoots, PeerCertificate},
    signer::Ca,
};

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("making the test certificates: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// How long the test CA is valid (kubeadm's CA: ten years).
const CA_DAYS: i64 = 3650;

/// The CA and the server's certificate and key.
pub struct Certificates {
    pub ca_pem: String,
    /// The CA with its key, for the CSR signer.
    pub ca: Ca,
    chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
}

/// A fresh CA and a server certificate signed by it.
pub fn certificates() -> Result<Certificates, Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "swiftlet-test-apiserver-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    ca.not_before = now;
    ca.not_after = now + time::Duration::days(CA_DAYS);
    let ca_cert = ca.self_signed(&ca_key)?;
    let ca = Ca::new(ca_cert.der().clone(), ca, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
        "kubernetes.default.svc".to_owned(),
    ])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, ca.issuer())?;
    Ok(Certificates {
        ca_pem: ca_cert.pem(),
        ca,
        chain: vec![cert.der().clone(), ca_cert.der().clone()],
        key: key.serialize_der(),
    })
}

/// rustls serving `certificates`, HTTP/1.1 only (what kube-rs speaks without its http2
/// feature), asking for an optional client certificate signed by the CA.
pub fn tls_config(certificates: &Certificates) -> Result<Arc<TlsConfig>, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = TlsConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(ClientCertVerifier::new(&client_roots(&certificates.ca)?))
        .with_single_cert(
            certificates.chain.clone(),
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certificates.key.clone())),
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The CA as the client CA.
pub fn client_roots(ca: &Ca) -> Result<ClientRoots, Error> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.der.clone())?;
    Ok(ClientRoots::new(roots)?)
}

/// The kubeconfig for `server` (an `https://` URL), trusting the CA in `ca_file`, with
/// `token`. JSON, which is YAML too.
pub fn kubeconfig(server: &str, ca_file: &Path, token: &str) -> String {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "swiftlet-test", "cluster": {
            "server": server,
            "certificate-authority": ca_file,
        }}],
        "users": [{"name": "swiftlet-test", "user": {"token": token}}],
        "contexts": [{"name": "swiftlet-test", "context": {"cluster": "swiftlet-test", "user": "swiftlet-test"}}],
        "current-context": "swiftlet-test",
    });
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

/// Accepts connections on `listener` forever, each served over TLS by `router`; during an
/// outage ([`super::Faults::go_down`]) the port is closed and every connection cut.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<TlsConfig>,
    router: axum::Router,
    server: Arc<ApiServer>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let Ok(address) = listener.local_addr() else {
        return;
    };
    let mut listener = listener;
    let mut outages = server.faults.outages();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            changed = outages.changed() => {
                if changed.is_err() {
                    return;
                }
                drop(listener);
                tokio::time::sleep(server.faults.outage()).await;
                listener = rebind(address).await;
                continue;
            }
        };
        let (tcp, _peer): (_, SocketAddr) = match accepted {
            Ok(accepted) => accepted,
            // Out of descriptors and the like: the next accept may work.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        let mut cut = server.faults.outages();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let peer = PeerCertificate(
                stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .filter(|chain| !chain.is_empty())
                    .map(|chain| Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect())),
            );
            let service = router.map_request(move |mut request: axum::http::Request<_>| {
                request.extensions_mut().insert(peer.clone());
                request
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
            // A connection that ends in an error (the client went away) ends only itself; an
            // outage ends them all (dropping the connection closes the socket).
            tokio::select! {
                _ = connection => {}
                _ = cut.changed() => {}
            }
        });
    }
}

/// The same address again after an outage (retried: the port is ours, but a bind can race
/// the kernel's clean-up).
async fn rebind(address: SocketAddr) -> TcpListener {
    loop {
        if let Ok(listener) = TcpListener::bind(address).await {
            return listener;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
