//! Test certificates and in-process TLS handshakes for the kubelet server's TLS tests: a CA,
//! leaves it signs (serving for `localhost`, or client), and one real handshake over a loopback
//! TCP socket with tokio-rustls, reporting what each side saw.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::{ClientConfig, RootCertStore, ServerConfig, crypto::ring, sign::CertifiedKey};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};

/// A CA that signs leaves.
pub struct Ca {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A leaf: its chain PEM (leaf only), key PEM and DER.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-signed");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A serving certificate for `localhost` named `cn`.
    pub fn serving(&self, cn: &str) -> Leaf {
        self.leaf(
            cn,
            vec!["localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn leaf(&self, cn: &str, names: Vec<String>, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).expect("signed");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }
}

impl Leaf {
    pub fn certified_key(&self) -> Arc<CertifiedKey> {
        super::serving_cert::certified_key_from_pem(
            self.cert_pem.as_bytes(),
            self.key_pem.as_bytes(),
            &ring::default_provider(),
        )
        .expect("pair")
    }
}

/// What one handshake showed: the leaf the client was served, or why it failed.
pub type Handshake = Result<CertificateDer<'static>, String>;

/// One handshake against `server`, the client trusting `ca` for `localhost` and presenting
/// `client` if given; the server side also completes (or fails) before this returns.
pub async fn handshake(server: Arc<ServerConfig>, ca: &Ca, client: Option<&Leaf>) -> Handshake {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    let served = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.expect("accept");
        match acceptor.accept(tcp).await {
            Ok(mut stream) => {
                use tokio::io::AsyncWriteExt as _;
                // The client learns of a refused certificate only from the server's alert,
                // which TLS 1.3 sends after the client thinks it is done: a byte proves both
                // sides agreed.
                let _ = stream.write_all(b"k").await;
                let _ = stream.shutdown().await;
            }
            Err(e) => drop(e),
        }
    });
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
        roots.add(cert.expect("ca pem")).expect("root");
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let config = match client {
        Some(leaf) => builder
            .with_client_auth_cert(
                vec![leaf.der.clone()],
                PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).expect("key"),
            )
            .expect("client auth"),
        None => builder.with_no_client_auth(),
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let result = async {
        let mut stream = connector
            .connect(ServerName::try_from("localhost").expect("name"), tcp)
            .await
            .map_err(|e| e.to_string())?;
        let leaf = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first().cloned())
            .ok_or("no server certificate")?;
        use tokio::io::AsyncReadExt as _;
        let mut byte = [0u8; 1];
        stream
            .read_exact(&mut byte)
            .await
            .map_err(|e| e.to_string())?;
        Ok(leaf)
    }
    .await;
    served.await.expect("server side");
    result
}
