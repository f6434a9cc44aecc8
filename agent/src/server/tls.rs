//! The kubelet server's TLS: its certificate (the configured `tlsCertFile`/`tlsPrivateKeyFile`,
//! else a self-signed pair generated once into the cert directory and reused on every restart),
//! the lowest version (`tlsMinVersion`), and the client certificates it asks for when
//! `authentication.x509.clientCAFile` is set: optional (a request may authenticate otherwise or
//! be refused with 401 later), but one that does not chain to those CAs fails the handshake, as
//! Go's `VerifyClientCertIfGiven` does upstream.
//!
//! The certificate is served through a [`ServingCertificate`] handle and the client CAs through a
//! configuration swapped whole ([`ServerTls`]), so both change without a restart
//! (`tls_reload.rs` watches the files; `serverTLSBootstrap` feeds the handle).
//!
//! Not here: what a verified certificate means (`auth.rs`). Upstream:
//! `cmd/kubelet/app/server.go` `InitializeTLS` and client-go `certutil.GenerateSelfSignedCertKey`
//! (a CA `<host>-ca@<unix time>` and a serving certificate `<host>@<unix time>` for the host name,
//! valid one year, written as `kubelet.crt`, chain included, and `kubelet.key`). The keys here
//! are ECDSA P-256 rather than upstream's RSA 2048.

use std::{
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use rustls::{
    RootCertStore, ServerConfig,
    crypto::{CryptoProvider, ring},
    server::WebPkiClientVerifier,
};
use rustls_pki_types::{CertificateDer, pem::PemObject};

use super::serving_cert::{CertificateError, ServingCertificate, certified_key_from_pem};
pub use super::tls_reload::Reloader;
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
    #[error("tlsCertFile {} and tlsPrivateKeyFile {}: {source}", cert.display(), key.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: CertificateError,
    },
}

/// How long a generated certificate is valid (upstream: one year).
const SELF_SIGNED_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// Largest certificate, key or CA file read (upstream reads them whole; these are a few KiB).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The full server's TLS: the serving certificate handle every handshake asks, and the rustls
/// configuration built around it and the current client CAs. Clones share both. A client CA
/// change builds a new configuration (a new verifier and a new session cache) that the next
/// accepted connection takes whole ([`ServerTls::config`]), rather than a verifier swapped
/// under a configuration: rustls borrows `root_hint_subjects` from the verifier for the
/// handshake, which a swappable verifier cannot lend, and a session resumed from the old
/// configuration's cache would skip the new CAs.
#[derive(Clone)]
pub struct ServerTls {
    serving: ServingCertificate,
    current: Arc<RwLock<Arc<ServerConfig>>>,
    provider: Arc<CryptoProvider>,
    versions: &'static [&'static rustls::SupportedProtocolVersion],
}

impl ServerTls {
    /// The server's TLS from the settings: the configured pair (or the self-signed one,
    /// generated once) and the client CA file; with the [`Reloader`] that watches those files.
    pub fn load(settings: &Settings, host: &str) -> Result<(ServerTls, Reloader), TlsError> {
        let (cert_path, key_path, self_signed) = settings.cert_and_key();
        if self_signed {
            ensure_self_signed(&cert_path, &key_path, host)?;
        }
        let provider = provider(settings);
        let fields = if self_signed {
            PairFields::SELF_SIGNED
        } else {
            PairFields::CONFIGURED
        };
        let pair = read_pair(fields, &cert_path, &key_path)?;
        let key = certified_key(fields, &cert_path, &key_path, &pair, &provider)?;
        let serving = ServingCertificate::new(key)
            .map_err(|e| pair_error(fields, &cert_path, &key_path, e))?;
        let (tls, client_ca) = ServerTls::build(settings, serving, provider)?;
        let watched_pair = (!self_signed).then_some((cert_path, key_path, pair));
        Ok((tls.clone(), Reloader::new(tls, watched_pair, client_ca)))
    }

    /// The server's TLS serving whatever `serving` holds (the cluster-issued certificate of
    /// `serverTLSBootstrap`; handshakes fail while it is empty), with the client CA file of the
    /// settings; the [`Reloader`] watches only that file.
    pub fn with_certificate(
        settings: &Settings,
        serving: ServingCertificate,
    ) -> Result<(ServerTls, Reloader), TlsError> {
        let (tls, client_ca) = ServerTls::build(settings, serving, provider(settings))?;
        Ok((tls.clone(), Reloader::new(tls, None, client_ca)))
    }

    fn build(
        settings: &Settings,
        serving: ServingCertificate,
        provider: Arc<CryptoProvider>,
    ) -> Result<(ServerTls, Option<FileBytes>), TlsError> {
        static TLS12_UP: [&rustls::SupportedProtocolVersion; 2] =
            [&rustls::version::TLS13, &rustls::version::TLS12];
        static TLS13_ONLY: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
        let versions: &'static [&'static rustls::SupportedProtocolVersion] =
            match settings.tls_min_version {
                TlsVersion::Tls12 => &TLS12_UP,
                TlsVersion::Tls13 => &TLS13_ONLY,
            };
        let client_ca = match &settings.authentication.client_ca_file {
            Some(path) => Some((path.clone(), read_bounded(CLIENT_CA, path)?)),
            None => None,
        };
        let roots = match &client_ca {
            Some((path, pem)) => Some((path.as_path(), client_roots(path, pem)?)),
            None => None,
        };
        let config = config(
            &serving,
            &provider,
            versions,
            roots.as_ref().map(|(path, roots)| (*path, roots)),
        )?;
        let tls = ServerTls {
            serving,
            current: Arc::new(RwLock::new(config)),
            provider,
            versions,
        };
        Ok((tls, client_ca))
    }

    /// The configuration for the next connection.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The serving certificate handle (a clone sharing the served slot).
    pub fn serving(&self) -> ServingCertificate {
        self.serving.clone()
    }

    /// The provider (cipher suites, key loading) the server uses.
    pub fn provider(&self) -> &CryptoProvider {
        &self.provider
    }

    /// Trusts the CAs of `pem` (the content of `path`) for client certificates from the next
    /// connection on; on an error the current CAs stay.
    pub fn set_client_ca(&self, path: &Path, pem: &[u8]) -> Result<(), TlsError> {
        let roots = client_roots(path, pem)?;
        let config = config(
            &self.serving,
            &self.provider,
            self.versions,
            Some((path, &roots)),
        )?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = config;
        Ok(())
    }
}

fn provider(settings: &Settings) -> Arc<CryptoProvider> {
    let mut provider = ring::default_provider();
    if !settings.tls_cipher_suites.is_empty() {
        // TLS 1.3 suites are always on (Go ignores the list for 1.3 as well).
        provider.cipher_suites.retain(|suite| {
            let name = format!("{:?}", suite.suite());
            matches!(suite, rustls::SupportedCipherSuite::Tls13(_))
                || settings.tls_cipher_suites.contains(&name.as_str())
        });
    }
    Arc::new(provider)
}

fn config(
    serving: &ServingCertificate,
    provider: &Arc<CryptoProvider>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    client_roots: Option<(&Path, &Arc<RootCertStore>)>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder =
        ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(versions)?;
    let builder = match client_roots {
        Some((path, roots)) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::ClientCa {
                    path: path.to_owned(),
                    problem: e.to_string(),
                })?,
        ),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(serving.clone()));
    // The kubelet API (and its SPDY/WebSocket upgrades) is HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

pub(super) const CLIENT_CA: &str = "authentication.x509.clientCAFile";

/// The names a certificate pair's errors give its two files.
#[derive(Clone, Copy)]
pub(super) struct PairFields {
    pub cert: &'static str,
    pub key: &'static str,
}

impl PairFields {
    pub(super) const CONFIGURED: PairFields = PairFields {
        cert: "tlsCertFile",
        key: "tlsPrivateKeyFile",
    };
    const SELF_SIGNED: PairFields = PairFields {
        cert: "self-signed certificate",
        key: "self-signed key",
    };
}

/// A file and its contents.
type FileBytes = (PathBuf, Vec<u8>);

/// The contents of a certificate file and its key file.
pub(super) type PairBytes = (Vec<u8>, Vec<u8>);

pub(super) fn read_pair(
    fields: PairFields,
    cert: &Path,
    key: &Path,
) -> Result<PairBytes, TlsError> {
    Ok((
        read_bounded(fields.cert, cert)?,
        read_bounded(fields.key, key)?,
    ))
}

pub(super) fn certified_key(
    fields: PairFields,
    cert: &Path,
    key: &Path,
    (cert_pem, key_pem): &PairBytes,
    provider: &CryptoProvider,
) -> Result<Arc<rustls::sign::CertifiedKey>, TlsError> {
    certified_key_from_pem(cert_pem, key_pem, provider)
        .map_err(|e| pair_error(fields, cert, key, e))
}

/// Names the file at fault: the certificate's, the key's, or both when they do not match.
fn pair_error(fields: PairFields, cert: &Path, key: &Path, e: CertificateError) -> TlsError {
    let (field, path) = match e {
        CertificateError::ChainPem(_) | CertificateError::NoCertificate => (fields.cert, cert),
        CertificateError::KeyPem(_) | CertificateError::Key(_) => (fields.key, key),
        CertificateError::KeyMismatch | CertificateError::Unverifiable(_) => {
            return TlsError::Pair {
                cert: cert.to_owned(),
                key: key.to_owned(),
                source: e,
            };
        }
    };
    TlsError::Parse {
        field,
        path: path.to_owned(),
        problem: e.to_string(),
    }
}

/// The client CAs of `pem`, every block a CA.
fn client_roots(path: &Path, pem: &[u8]) -> Result<Arc<RootCertStore>, TlsError> {
    let problem = |problem: String| TlsError::ClientCa {
        path: path.to_owned(),
        problem,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(e.to_string()))?;
    if certs.is_empty() {
        return Err(problem("no PEM CERTIFICATE block".into()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| problem(e.to_string()))?;
    }
    Ok(Arc::new(roots))
}

/// Reads an operator's file whole, by the path given: symlinks are followed, as upstream does
/// (these files are the operator's, not writable by containers, and Kubernetes' atomic writer
/// and cert-manager present them through symlinks), but only a regular file of at most
/// [`MAX_FILE_BYTES`] is read. The open does not block: a FIFO planted at the path would
/// otherwise hold the agent's start, or its reloader, until someone writes to it.
pub(super) fn read_bounded(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::{io::Read as _, os::unix::fs::OpenOptionsExt as _};
    let err = |source| TlsError::Read {
        field,
        path: path.to_owned(),
        source,
    };
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(err)?;
    let meta = file.metadata().map_err(err)?;
    if !meta.is_file() {
        return Err(err(io::Error::other("not a regular file")));
    }
    let mut bytes = Vec::new();
    // The bound holds even for a file that grows after the size was read.
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(err)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(err(io::Error::other(format!(
            "larger than {MAX_FILE_BYTES} bytes"
        ))));
    }
    Ok(bytes)
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
    fn a_fifo_at_the_path_is_refused_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("kubelet.crt");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        // A blocking open would never return: the read runs apart so a regression fails the
        // test instead of hanging the suite.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(read_bounded("tlsCertFile", &path).map_err(|e| e.to_string()));
        });
        let result = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the read returned instead of waiting for a writer");
        let error = result.expect_err("a FIFO is not a certificate file");
        assert!(error.contains("not a regular file"), "{error}");
    }

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
        let config = ServerTls::load(&settings, "node-1")
            .expect("builds")
            .0
            .config();
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
        let err = client_roots(&ca, &fs::read(&ca).expect("read"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("authentication.x509.clientCAFile"), "{err}");
    }
}
