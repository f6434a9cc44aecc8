//! The kubelet server's TLS: its certificate (the configured `tlsCertFile`/`tlsPrivateKeyFile`,
//! else a self-signed pair generated once into the cert directory and reused on every restart),
//! the lowest version (`tlsMinVersion`), and the client certificates it asks for when
//! `authentication.x509.clientCAFile` is set: optional (a request may authenticate otherwise or
//! be refused with 401 later), but one that does not chain to those CAs fails the handshake, as
//! Go's `VerifyClientCertIfGiven` does upstream.
//!
//! Not here: what a verified certificate means (`authn.rs`). Upstream:
//! `cmd/kubelet/app/server.go` `InitializeTLS` and client-go `certutil.GenerateSelfSignedCertKey`
//! (a CA `<host>-ca@<unix time>` and a serving certificate `<host>@<unix time>` for the host name,
//! valid one year, written as `kubelet.crt`, chain included, and `kubelet.key`). The keys here
//! are ECDSA P-256 rather than upstream's RSA 2048.

use std::{
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use rustls::{
    RootCertStore, ServerConfig,
    crypto::{CryptoProvider, ring},
    server::WebPkiClientVerifier,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use crate::config::{ServerConfig as Settings, TlsVersion};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{field} {}: {source}", path.display())]
    Read {
        field: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{field} {}: {problem}", path.display())]
    Parse {
        field: &'static str,
        path: PathBuf,
        problem: String,
    },
    #[error("writing the self-signed certificate to {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("generating a self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("authentication.x509.clientCAFile {}: {problem}", path.display())]
    ClientCa { path: PathBuf, problem: String },
}

/// How long a generated certificate is valid (upstream: one year).
const SELF_SIGNED_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The rustls configuration of the full server.
pub fn server_config(settings: &Settings, host: &str) -> Result<Arc<ServerConfig>, TlsError> {
    let (cert_path, key_path, self_signed) = settings.cert_and_key();
    if self_signed {
        ensure_self_signed(&cert_path, &key_path, host)?;
    }
    let (cert_field, key_field) = if self_signed {
        ("self-signed certificate", "self-signed key")
    } else {
        ("tlsCertFile", "tlsPrivateKeyFile")
    };
    let chain = read_certs(cert_field, &cert_path)?;
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| TlsError::Parse {
        field: key_field,
        path: key_path.clone(),
        problem: format!("expected a PEM private key: {e}"),
    })?;
    let mut provider = ring::default_provider();
    if !settings.tls_cipher_suites.is_empty() {
        // TLS 1.3 suites are always on (Go ignores the list for 1.3 as well).
        provider.cipher_suites.retain(|suite| {
            let name = format!("{:?}", suite.suite());
            matches!(suite, rustls::SupportedCipherSuite::Tls13(_))
                || settings.tls_cipher_suites.contains(&name.as_str())
        });
    }
    let provider = Arc::new(provider);
    let versions: &[&rustls::SupportedProtocolVersion] = match settings.tls_min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder =
        ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(versions)?;
    let builder = match &settings.authentication.client_ca_file {
        Some(path) => builder.with_client_cert_verifier(client_verifier(path, provider)?),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key)?;
    // The kubelet API (and its SPDY/WebSocket upgrades) is HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn client_verifier(
    path: &Path,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs("authentication.x509.clientCAFile", path)? {
        roots.add(cert).map_err(|e| TlsError::ClientCa {
            path: path.to_owned(),
            problem: e.to_string(),
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::ClientCa {
            path: path.to_owned(),
            problem: e.to_string(),
        })
}

fn read_certs(field: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let text = fs::read(path).map_err(|source| TlsError::Read {
        field,
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Parse {
            field,
            path: path.to_owned(),
            problem: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Parse {
            field,
            path: path.to_owned(),
            problem: "no PEM CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// Generates `cert`/`key` unless both exist (a pair from an earlier start is reused as is).
pub fn ensure_self_signed(cert: &Path, key: &Path, host: &str) -> Result<(), TlsError> {
    if cert.exists() && key.exists() {
        // A key an older agent left readable by others is narrowed to its owner.
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(meta) = fs::symlink_metadata(key)
            && meta.is_file()
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::info!(key = %key.display(), "narrowing the serving key's mode to 0600");
            fs::set_permissions(key, fs::Permissions::from_mode(0o600)).map_err(|source| {
                TlsError::Write {
                    path: key.to_owned(),
                    source,
                }
            })?;
        }
        return Ok(());
    }
    let (cert_pem, key_pem) = generate_self_signed(host)?;
    let write = |path: &Path, text: &str, mode: u32| -> Result<(), TlsError> {
        use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
        let err = |source| TlsError::Write {
            path: path.to_owned(),
            source,
        };
        // The certificate directory is root's alone (0700), whatever the umask.
        if let Some(dir) = path.parent() {
            crate::hostfs::ensure_dir(dir, 0o700).map_err(|e| err(std::io::Error::other(e)))?;
        }
        // Written aside and renamed in: a crash never leaves half a key to be reused.
        let tmp = path.with_extension("tmp");
        {
            use std::io::Write as _;
            let mut file = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(mode)
                .open(&tmp)
                .map_err(err)?;
            file.write_all(text.as_bytes()).map_err(err)?;
            file.sync_all().map_err(err)?;
        }
        fs::set_permissions(&tmp, fs::Permissions::from_mode(mode)).map_err(err)?;
        fs::rename(&tmp, path).map_err(err)
    };
    write(key, &key_pem, 0o600)?;
    write(cert, &cert_pem, 0o644)?;
    tracing::info!(cert = %cert.display(), key = %key.display(), "generated a self-signed serving certificate");
    Ok(())
}

/// A CA and a serving certificate for `host` signed by it: (certificate chain PEM, key PEM).
pub fn generate_self_signed(host: &str) -> Result<(String, String), rcgen::Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose, SanType,
    };
    let now = time::OffsetDateTime::now_utc();
    let not_before = now - time::Duration::hours(1);
    let not_after = now + SELF_SIGNED_VALIDITY;
    let stamp = now.unix_timestamp();

    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, format!("{host}-ca@{stamp}"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{host}@{stamp}"));
    params.subject_alt_names = vec![match host.parse::<IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(host.try_into()?),
    }];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((
        format!("{}{}", cert.pem(), ca_cert.pem()),
        key.serialize_pem(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_pair_is_made_once_and_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (
            dir.path().join("pki/kubelet.crt"),
            dir.path().join("pki/kubelet.key"),
        );
        ensure_self_signed(&cert, &key, "node-1").expect("generates");
        let first = fs::read_to_string(&cert).expect("cert");
        assert_eq!(first.matches("BEGIN CERTIFICATE").count(), 2, "leaf and CA");
        ensure_self_signed(&cert, &key, "node-1").expect("reuses");
        assert_eq!(fs::read_to_string(&cert).expect("cert"), first);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = fs::metadata(&key).expect("key").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn cipher_suites_restrict_tls12_only() {
        use crate::config::{Authentication, Authorization, AuthorizationMode};
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = Settings {
            address: None,
            tls_cert_file: None,
            tls_private_key_file: None,
            cert_directory: dir.path().join("pki"),
            tls_min_version: TlsVersion::Tls12,
            tls_cipher_suites: vec!["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
            enable_debugging_handlers: true,
            authentication: Authentication {
                anonymous: false,
                anonymous_turned_off: false,
                webhook: false,
                webhook_cache_ttl: Duration::from_secs(120),
                client_ca_file: None,
            },
            authorization: Authorization {
                mode: AuthorizationMode::AlwaysAllow,
                cache_authorized_ttl: Duration::from_secs(300),
                cache_unauthorized_ttl: Duration::from_secs(30),
            },
        };
        let config = server_config(&settings, "node-1").expect("builds");
        let mut names: Vec<String> = config
            .crypto_provider()
            .cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec![
                "TLS13_AES_128_GCM_SHA256",
                "TLS13_AES_256_GCM_SHA384",
                "TLS13_CHACHA20_POLY1305_SHA256",
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            ]
        );
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);
    }

    #[test]
    fn a_bad_client_ca_file_names_the_field() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.crt");
        fs::write(&ca, "not a certificate").expect("write");
        let err = client_verifier(&ca, Arc::new(ring::default_provider()))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("authentication.x509.clientCAFile"), "{err}");
    }
}
