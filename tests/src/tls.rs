//! A client of the kubelet server, as an API server or `curl --cert` would be: a test CA and
//! client certificates made with rcgen, and blocking HTTPS requests over rustls that trust the
//! server's own CA (the self-signed `kubelet.crt` chain in its cert dir) and check its name.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::Path,
    sync::Arc,
    time::Duration,
};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use rustls_pki_types::{
    CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, pem::PemObject,
};

/// A certificate authority for client certificates.
pub struct TestCa {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A client certificate and its key.
pub struct ClientIdentity {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: Vec<u8>,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let mut params = CertificateParams::new(Vec::<String>::new())
            .unwrap_or_else(|e| panic!("CA params: {e}"));
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .unwrap_or_else(|e| panic!("CA cert: {e}"));
        TestCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A client certificate for `user` in `groups` (CN and O).
    pub fn client(&self, user: &str, groups: &[&str]) -> ClientIdentity {
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("client key: {e}"));
        let mut params = CertificateParams::new(Vec::<String>::new())
            .unwrap_or_else(|e| panic!("client params: {e}"));
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("client cert: {e}"));
        ClientIdentity {
            chain: vec![cert.der().clone()],
            key: key.serialize_der(),
        }
    }
}

impl TestCa {
    /// A serving certificate for `localhost` and `127.0.0.1` signed by this CA, as an operator's
    /// `tlsCertFile`/`tlsPrivateKeyFile`: (certificate PEM, key PEM).
    pub fn serving(&self, name: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("serving key: {e}"));
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .unwrap_or_else(|e| panic!("serving params: {e}"));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("serving cert: {e}"));
        (cert.pem(), key.serialize_pem())
    }
}

/// A response: status code and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// The rustls client trusting the last certificate of `server_chain` (the kubelet.crt file).
pub fn client_config(server_chain: &Path, identity: Option<&ClientIdentity>) -> Arc<ClientConfig> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(server_chain)
        .unwrap_or_else(|e| panic!("{}: {e}", server_chain.display()))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{}: {e}", server_chain.display()));
    let mut roots = RootCertStore::empty();
    let ca = chain
        .last()
        .cloned()
        .unwrap_or_else(|| panic!("no certificate"));
    roots.add(ca).unwrap_or_else(|e| panic!("server CA: {e}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("versions: {e}"))
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => builder
            .with_client_auth_cert(
                id.chain.clone(),
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(id.key.clone())),
            )
            .unwrap_or_else(|e| panic!("client cert: {e}")),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// A TLS connection to `127.0.0.1:port`, checking the server's certificate names `server_name`.
pub fn connect(
    port: u16,
    server_name: &str,
    config: Arc<ClientConfig>,
) -> Result<StreamOwned<ClientConnection, TcpStream>, String> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let conn = ClientConnection::new(config, name).map_err(|e| e.to_string())?;
    let mut stream = StreamOwned::new(conn, tcp);
    // Drive the handshake now, so a refused certificate shows here.
    while stream.conn.is_handshaking() {
        stream
            .conn
            .complete_io(&mut stream.sock)
            .map_err(|e| format!("TLS handshake: {e}"))?;
    }
    Ok(stream)
}

/// One HTTPS request; `Err` when the connection or handshake fails (including when the server
/// refuses the client certificate, which TLS 1.3 reports at the first read).
pub fn request(
    port: u16,
    server_name: &str,
    config: Arc<ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<Answer, String> {
    request_with_body(port, server_name, config, method, path, headers, None)
}

/// One HTTPS request with a body (sent with its `Content-Length`) when `body` is given; as
/// [`request`] otherwise.
pub fn request_with_body(
    port: u16,
    server_name: &str,
    config: Arc<ClientConfig>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Result<Answer, String> {
    let mut stream = connect(port, server_name, config)?;
    let mut text =
        format!("{method} {path} HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n");
    for (k, v) in headers {
        text.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(body) = body {
        text.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    text.push_str("\r\n");
    stream
        .write_all(text.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    if let Some(body) = body {
        stream.write_all(body).map_err(|e| format!("write: {e}"))?;
    }
    let mut raw = Vec::new();
    match stream.read_to_end(&mut raw) {
        Ok(_) => {}
        // A peer that closes without close_notify after a complete answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(format!("read: {e}")),
    }
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP answer: {raw:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status: {head}"))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok(Answer {
        status,
        head: head.to_owned(),
        body,
    })
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Frames of a WebSocket stream from the server (unmasked), as (opcode, payload).
pub fn read_ws_frames(stream: &mut impl std::io::Read, limit: usize) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    while frames.len() < limit {
        let mut head = [0u8; 2];
        if stream.read_exact(&mut head).is_err() {
            break;
        }
        let opcode = head[0] & 0x0f;
        let mut len = u64::from(head[1] & 0x7f);
        if len == 126 {
            let mut ext = [0u8; 2];
            if stream.read_exact(&mut ext).is_err() {
                break;
            }
            len = u64::from(u16::from_be_bytes(ext));
        } else if len == 127 {
            let mut ext = [0u8; 8];
            if stream.read_exact(&mut ext).is_err() {
                break;
            }
            len = u64::from_be_bytes(ext);
        }
        let mut payload = vec![0u8; usize::try_from(len).unwrap_or(0)];
        if stream.read_exact(&mut payload).is_err() {
            break;
        }
        frames.push((opcode, payload));
        if opcode == 8 {
            break;
        }
    }
    frames
}
