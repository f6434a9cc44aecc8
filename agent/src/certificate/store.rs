//! Where the agent's certificates live: `<certDir>/kubelet-{client,server}-current.pem` (the
//! certificate chain followed by its private key, as upstream's `FileStore` writes them), the
//! bootstrap's pending key `kubelet-client.key.tmp`, and the kubeconfig the bootstrap writes.
//!
//! Every write goes through a descriptor of the directory: a new file under a temporary name
//! (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600) renamed over the old one, so a reader sees the
//! old pair or the new one, never half of one, and a link planted at either name is replaced,
//! never followed. Reads refuse links too. The cert dir is made 0700 when missing.
//!
//! Upstream: client-go `util/certificate/certificate_store.go` (`FileStore`); upstream keeps
//! timestamped files and points the `-current` name at the newest with a symbolic link, swiftlet
//! replaces the `-current` file itself (no link for anyone to swap).
//! Not here: what goes into the files (`csr.rs`), when they are renewed (`manager.rs`).

use std::{
    ffi::OsStr,
    io::Read as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use rustls::{pki_types::CertificateDer, sign::CertifiedKey};
use rustls_pki_types::{PrivateKeyDer, pem::PemObject as _};

use super::{Error, template::Names};
use crate::hostfs::{self, Dir};

/// The client certificate's file (upstream `kubelet-client-current.pem`).
pub const CLIENT_PEM: &str = "kubelet-client-current.pem";
/// The serving certificate's file (upstream `kubelet-server-current.pem`).
pub const SERVER_PEM: &str = "kubelet-server-current.pem";
/// The bootstrap's key while its CSR is pending, so a restart asks again with the same key and
/// so under the same CSR name (upstream `tmpPrivateKeyFile`).
pub const PENDING_KEY: &str = "kubelet-client.key.tmp";

const FILE_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;
/// Upstream's mode for the directories of `setupDataDirs`.
const PARENT_MODE: u32 = 0o750;
/// Certificate files are a few kilobytes; anything far larger is not one.
const MAX_PEM: u64 = 1 << 20;

/// A certificate with its key, as read from or written to the store.
#[derive(Clone)]
pub struct Pair {
    /// The chain (leaf first) and the key, PEM, as written.
    pub pem: Vec<u8>,
    pub certified: Arc<CertifiedKey>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// The leaf's serial number, hex (for logs and tests).
    pub serial: String,
    /// What the leaf names (whether it still covers a request: `template.rs`).
    pub names: Names,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("serial", &self.serial)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Pair {
    /// A pair from PEM text holding the chain and the key; `origin` names it in errors.
    pub fn from_pem(pem: Vec<u8>, origin: &Path) -> Result<Pair, Error> {
        let bad = |reason: String| Error::BadPem {
            path: origin.to_owned(),
            reason,
        };
        let chain = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(format!("certificate: {e}")))?;
        let Some(leaf) = chain.first() else {
            return Err(bad("no certificate".into()));
        };
        let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| bad(format!("key: {e}")))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf)
            .map_err(|e| bad(format!("certificate: {e}")))?;
        let validity = parsed.validity();
        let not_before = unix(validity.not_before.timestamp());
        let not_after = unix(validity.not_after.timestamp());
        let serial = parsed.raw_serial_as_string();
        let names = Names::of(&parsed);
        let provider = rustls::crypto::ring::default_provider();
        let certified = CertifiedKey::from_der(chain, key, &provider)
            .map_err(|e| bad(format!("the key does not fit the certificate: {e}")))?;
        Ok(Pair {
            pem,
            certified: Arc::new(certified),
            not_before,
            not_after,
            serial,
            names,
        })
    }

    /// The pair from a certificate PEM and a key PEM given apart.
    pub fn from_parts(cert_pem: &[u8], key_pem: &[u8], origin: &Path) -> Result<Pair, Error> {
        let mut pem = cert_pem.to_vec();
        if !pem.ends_with(b"\n") {
            pem.push(b'\n');
        }
        pem.extend_from_slice(key_pem);
        Pair::from_pem(pem, origin)
    }

    /// Whether the certificate is valid at `now` (upstream checks only expiry; swiftlet also
    /// waits out a certificate not valid yet, which no API server would take).
    pub fn valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now < self.not_after
    }
}

fn unix(seconds: i64) -> SystemTime {
    if seconds >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds.unsigned_abs())
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs())
    }
}

/// The cert dir: made 0700 when missing, opened without following a link at its last component.
#[derive(Debug)]
pub struct Store {
    dir: Dir,
}

impl Store {
    pub fn open(path: &Path) -> Result<Store, Error> {
        // Missing parents (a fresh root dir) get the agent's data dir mode; existing ones are
        // the operator's and stay as they are.
        if let Some(parent) = path.parent()
            && !parent.as_os_str().is_empty()
            && !parent.exists()
        {
            hostfs::ensure_dir(parent, PARENT_MODE).map_err(Error::Store)?;
        }
        let dir = hostfs::ensure_dir(path, DIR_MODE).map_err(Error::Store)?;
        Ok(Store { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The full path of `name` in the store (for the kubeconfig and messages).
    pub fn file_path(&self, name: &str) -> PathBuf {
        self.dir.child_path(OsStr::new(name))
    }

    /// The pair in `name`; `None` when there is none.
    pub fn load(&self, name: &str) -> Result<Option<Pair>, Error> {
        let Some(pem) = self.read(name)? else {
            return Ok(None);
        };
        Pair::from_pem(pem, &self.file_path(name)).map(Some)
    }

    /// Replaces `name` with `pem` (mode 0600), all at once.
    pub fn write(&self, name: &str, pem: &[u8]) -> Result<(), Error> {
        self.dir
            .replace_file(OsStr::new(name), pem, FILE_MODE)
            .map_err(Error::Store)
    }

    /// The bytes of `name`; `None` when missing. A link is an error, never followed.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, Error> {
        let file = match self.dir.open_file(Path::new(name)) {
            Ok(file) => file,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(Error::Store(e)),
        };
        let mut data = Vec::new();
        file.take(MAX_PEM + 1)
            .read_to_end(&mut data)
            .map_err(|source| Error::Read {
                path: self.file_path(name),
                source,
            })?;
        if data.len() as u64 > MAX_PEM {
            return Err(Error::BadPem {
                path: self.file_path(name),
                reason: format!("larger than {MAX_PEM} bytes"),
            });
        }
        Ok(Some(data))
    }

    pub fn remove(&self, name: &str) -> Result<(), Error> {
        self.dir.remove_file(OsStr::new(name)).map_err(Error::Store)
    }
}

/// The kubeconfig the bootstrap writes (upstream `writeKubeconfigFromBootstrapping`, the same
/// names): the bootstrap kubeconfig's server and CA, and the client certificate and key both in
/// `pem_path`.
pub fn kubeconfig_yaml(server: &str, ca: &ClusterCa, pem_path: &Path) -> String {
    let ca_line = match ca {
        ClusterCa::File(path) => format!(
            "    certificate-authority: {}\n",
            yaml_str(&path.to_string_lossy())
        ),
        ClusterCa::Data(base64) => format!("    certificate-authority-data: {base64}\n"),
        ClusterCa::Insecure => "    insecure-skip-tls-verify: true\n".to_owned(),
        ClusterCa::System => String::new(),
    };
    let pem = yaml_str(&pem_path.to_string_lossy());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n{ca_line}    server: {server}\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n    namespace: default\n    user: default-auth\n  name: default-context\ncurrent-context: default-context\npreferences: {{}}\nusers:\n- name: default-auth\n  user:\n    client-certificate: {pem}\n    client-key: {pem}\n",
        server = yaml_str(server),
    )
}

/// How the written kubeconfig trusts the API server: as the bootstrap kubeconfig did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterCa {
    File(PathBuf),
    /// Base64 of the PEM, as it stood in the bootstrap kubeconfig.
    Data(String),
    Insecure,
    System,
}

/// A YAML double-quoted scalar (paths and URLs are an operator's, not to be trusted to be plain).
fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// Writes the kubeconfig at `path` (mode 0600, through its directory: replaced, never followed).
pub fn write_kubeconfig(path: &Path, yaml: &str) -> Result<(), Error> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Error::KubeconfigPath(path.to_owned()));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    // The kubeconfig's directory is the operator's (often /etc/kubernetes): opened as it is,
    // made only when missing.
    let dir = match Dir::open(parent) {
        Ok(dir) => dir,
        Err(e) if e.is_not_found() => hostfs::ensure_dir(parent, 0o755).map_err(Error::Store)?,
        Err(e) => return Err(Error::Store(e)),
    };
    dir.replace_file(name, yaml.as_bytes(), FILE_MODE)
        .map_err(Error::Store)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    use super::*;
    use crate::certificate::csr::tests::self_signed_pem;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).expect("stat").mode() & 0o7777
    }

    #[test]
    fn the_store_makes_its_dir_0700_and_files_0600() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("pki");
        let store = Store::open(&dir).expect("store");
        assert_eq!(mode(&dir), 0o700);
        let pem = self_signed_pem("system:node:a", 3600);
        store.write(CLIENT_PEM, &pem).expect("write");
        assert_eq!(mode(&dir.join(CLIENT_PEM)), 0o600);
        let pair = store.load(CLIENT_PEM).expect("load").expect("present");
        assert_eq!(pair.pem, pem);
        assert!(pair.valid_at(SystemTime::now()));
        assert!(!pair.valid_at(SystemTime::now() + Duration::from_secs(7200)));
        assert!(store.load(SERVER_PEM).expect("load").is_none());
    }

    #[test]
    fn a_link_planted_at_the_current_name_is_replaced_not_followed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("pki");
        let store = Store::open(&dir).expect("store");
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"precious").expect("victim");
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::os::unix::fs::symlink(&victim, dir.join(CLIENT_PEM)).expect("plant");

        assert!(store.load(CLIENT_PEM).is_err(), "a link is not read");
        let pem = self_signed_pem("system:node:a", 3600);
        store.write(CLIENT_PEM, &pem).expect("write");
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
        assert_eq!(mode(&victim), 0o644);
        let meta = std::fs::symlink_metadata(dir.join(CLIENT_PEM)).expect("stat");
        assert!(
            meta.file_type().is_file(),
            "the link was replaced by a file"
        );
        assert_eq!(std::fs::read(dir.join(CLIENT_PEM)).expect("read"), pem);
    }

    #[test]
    fn a_link_planted_at_the_temporary_name_is_not_followed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("pki");
        let store = Store::open(&dir).expect("store");
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"precious").expect("victim");
        std::os::unix::fs::symlink(&victim, dir.join(format!(".{CLIENT_PEM}.swiftlet-tmp")))
            .expect("plant");
        let pem = self_signed_pem("system:node:a", 3600);
        store.write(CLIENT_PEM, &pem).expect("write");
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
        assert_eq!(std::fs::read(dir.join(CLIENT_PEM)).expect("read"), pem);
    }

    #[test]
    fn a_linked_cert_dir_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let real = tmp.path().join("elsewhere");
        std::fs::create_dir(&real).expect("dir");
        let dir = tmp.path().join("pki");
        std::os::unix::fs::symlink(&real, &dir).expect("plant");
        assert!(Store::open(&dir).is_err());
    }

    #[test]
    fn the_kubeconfig_has_upstreams_shape_and_mode() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("kubelet.conf");
        let yaml = kubeconfig_yaml(
            "https://10.0.0.1:6443",
            &ClusterCa::File(PathBuf::from("/etc/kubernetes/pki/ca.crt")),
            Path::new("/var/lib/swiftlet/pki/kubelet-client-current.pem"),
        );
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        write_kubeconfig(&path, &yaml).expect("write");
        assert_eq!(mode(&path), 0o600);
        assert_eq!(
            mode(tmp.path()),
            0o777,
            "the operator's directory is left as it is"
        );
        let config = kube::config::Kubeconfig::read_from(&path).expect("parses");
        assert_eq!(config.current_context.as_deref(), Some("default-context"));
        let cluster = &config.clusters[0];
        assert_eq!(cluster.name, "default-cluster");
        let cluster = cluster.cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some("/etc/kubernetes/pki/ca.crt")
        );
        let context = config.contexts[0].context.as_ref().expect("context");
        assert_eq!(context.cluster, "default-cluster");
        assert_eq!(context.user.as_deref(), Some("default-auth"));
        assert_eq!(context.namespace.as_deref(), Some("default"));
        let user = config.auth_infos[0].auth_info.as_ref().expect("user");
        let pem = "/var/lib/swiftlet/pki/kubelet-client-current.pem";
        assert_eq!(user.client_certificate.as_deref(), Some(pem));
        assert_eq!(user.client_key.as_deref(), Some(pem));
        assert!(user.token.is_none());
    }
}
