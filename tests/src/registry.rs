//! An image registry for the system tests, so that images are pulled as nodes pull them instead
//! of imported: Debian's `docker-registry` (the CNCF distribution registry 2.8) on a free
//! loopback port, with its storage in a folder of its own, serving TLS with a certificate from a
//! test CA and asking for htpasswd (bcrypt) basic authentication. The private containerd trusts
//! that CA through a `hosts.toml` in its registries' hosts folder
//! (`$SWIFTLET_TEST_CONTAINERD_STATE/certs.d/127.0.0.1:<port>/`, containerd's `docs/hosts.md`;
//! `cargo xtask` points the CRI plugin's `config_path` there), which containerd reads at every
//! pull. The local images that `cargo xtask` builds (`target/images/<stem>.tar`, OCI image
//! layouts) are pushed with the OCI distribution API (distribution-spec "Pushing blobs": a
//! `POST` opening an upload, a `PUT` closing it with the digest; then a manifest `PUT`) from
//! here rather than with `ctr images push`, so that pushing needs neither an import into
//! containerd first nor a `ctr` whose flags differ between containerd releases. Each pushed
//! image carries a label naming its registry in its config, so its image ID differs from the
//! imported image's: containerd's CRI `RemoveImage` removes every name of an image ID, and
//! removing a pulled image must never remove the `localhost/swiftlet/*` images other tests run.
//! The process, its files and the `hosts.toml` go when the guard is dropped, also on a panic.
//! Not here: anything about the agent's credentials (`tests/tests/registry.rs`).

use std::{
    collections::HashMap,
    io::Read as _,
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use base64::Engine as _;
use rustls::ClientConfig;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::{
    EVENT_WAIT,
    process::Running,
    tls::{self, Answer, TestCa},
};

/// Debian's `docker-registry` package installs it here (`cargo xtask setup`).
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// The user the registry accepts.
pub const USER: &str = "swiftlet-puller";

/// The label on each pushed image's config naming the registry it was pushed to.
pub const REGISTRY_LABEL: &str = "io.swiftlet.test.registry";

/// bcrypt's lowest cost (Go's `bcrypt.MinCost`): the registry checks the hash at every request,
/// and a test password needs no protection against guessing.
const BCRYPT_COST: u32 = 4;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// A running registry; stopped and cleaned up on drop.
pub struct TestRegistry {
    /// `127.0.0.1:<port>`: the registry host of image references.
    pub host: String,
    pub port: u16,
    /// The password of [`USER`].
    pub password: String,
    /// The CA the serving certificate is signed by, as PEM.
    pub ca_pem: String,
    dir: PathBuf,
    ca_file: PathBuf,
    /// `certs.d/<host>` of the private containerd, when this registry wrote one.
    hosts_dir: Option<PathBuf>,
    client: Arc<ClientConfig>,
    process: Running,
}

/// An image pushed to a [`TestRegistry`].
#[derive(Debug, Clone)]
pub struct PushedImage {
    /// `127.0.0.1:<port>/<repository>:<tag>`.
    pub reference: String,
    /// The manifest's digest (`sha256:…`).
    pub manifest_digest: String,
    /// The config's digest: the image ID the runtime reports once it is pulled.
    pub config_digest: String,
}

/// What went wrong talking to the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{method} {path}: {reason}")]
    Request {
        method: String,
        path: String,
        reason: String,
    },
    #[error("{method} {path}: status {status}, want {want}: {body}")]
    Status {
        method: String,
        path: String,
        status: u16,
        want: u16,
        body: String,
    },
    #[error("{method} {path}: no Location header in {head:?}")]
    NoLocation {
        method: String,
        path: String,
        head: String,
    },
    #[error("{path}: {reason}")]
    Layout { path: PathBuf, reason: String },
}

impl TestRegistry {
    /// The registry of test `test`, or `None` when it cannot run here: not root outside CI, no
    /// `SWIFTLET_TEST_CONTAINERD_STATE` (the private containerd whose hosts folder makes it
    /// trust the CA) outside CI. In CI both are failures.
    pub fn for_test(test: &str) -> Option<TestRegistry> {
        if !crate::privileged(test) {
            return None;
        }
        let Some(state) = std::env::var_os("SWIFTLET_TEST_CONTAINERD_STATE") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "{test}: CI runs against the private containerd, which sets \
                 SWIFTLET_TEST_CONTAINERD_STATE"
            );
            eprintln!(
                "skipped {test}: SWIFTLET_TEST_CONTAINERD_STATE is not set (the private \
                 containerd of `cargo xtask containerd start`, whose certs.d makes it trust the \
                 registry's CA)"
            );
            return None;
        };
        Some(TestRegistry::start(Some(Path::new(&state))))
    }

    /// Starts a registry; with `containerd_state`, that containerd trusts its CA.
    pub fn start(containerd_state: Option<&Path>) -> TestRegistry {
        assert!(
            Path::new(REGISTRY_BIN).exists(),
            "{REGISTRY_BIN} is missing: `cargo xtask setup` installs Debian's docker-registry"
        );
        let dir = std::env::temp_dir().join(format!(
            "swiftlet-registry-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        create_private_dir(&dir);
        let ca = TestCa::new("swiftlet test registry CA");
        let (cert, key) = ca.serving("swiftlet test registry");
        let ca_file = dir.join("ca.crt");
        write(&ca_file, ca.pem.as_bytes());
        write(&dir.join("server.crt"), cert.as_bytes());
        write(&dir.join("server.key"), key.as_bytes());
        let password = random_word(24);
        let hash = bcrypt::hash(&password, BCRYPT_COST)
            .unwrap_or_else(|e| panic!("bcrypt hash of the test password: {e}"));
        write(&dir.join("htpasswd"), format!("{USER}:{hash}\n").as_bytes());
        let client = tls::client_config(&ca_file, None);

        // A free port can be taken between asking for it and the registry binding it: then the
        // registry exits, and another port is tried.
        let mut failures = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let config = dir.join("config.yml");
            write(&config, registry_config(&dir, port).as_bytes());
            let mut process = Running::start(Command::new(REGISTRY_BIN).arg("serve").arg(&config));
            match wait_ready(&mut process, port, &client) {
                Ok(()) => {
                    let host = format!("127.0.0.1:{port}");
                    let hosts_dir = containerd_state.map(|state| trust(state, &host, &ca_file));
                    return TestRegistry {
                        host,
                        port,
                        password,
                        ca_pem: ca.pem.clone(),
                        dir,
                        ca_file,
                        hosts_dir,
                        client,
                        process,
                    };
                }
                Err(log) => failures.push(format!("port {port}: {log}")),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!("the registry did not start: {failures:#?}");
    }

    /// The reference of `repository:tag` in this registry.
    pub fn image(&self, repository: &str, tag: &str) -> String {
        format!("{}/{repository}:{tag}", self.host)
    }

    /// The CA file containerd was pointed at.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The `certs.d/<host>` folder of the private containerd, when there is one.
    pub fn hosts_dir(&self) -> Option<&Path> {
        self.hosts_dir.as_deref()
    }

    /// A `.dockerconfigjson` (the `kubernetes.io/dockerconfigjson` secret's data) for this
    /// registry with `user` and `password`, in the form `docker login` writes.
    pub fn docker_config_json(&self, user: &str, password: &str) -> String {
        docker_config_json(&self.host, user, password)
    }

    /// One request to the registry, as `credentials` (user, password) or anonymously.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        credentials: Option<(&str, &str)>,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Result<Answer, RegistryError> {
        let authorization = credentials.map(|(u, p)| format!("Basic {}", basic(u, p)));
        let mut all: Vec<(&str, &str)> = headers.to_vec();
        if let Some(value) = &authorization {
            all.push(("Authorization", value));
        }
        tls::request_with_body(
            self.port,
            "127.0.0.1",
            self.client.clone(),
            method,
            path,
            &all,
            body,
        )
        .map_err(|reason| RegistryError::Request {
            method: method.to_owned(),
            path: path.to_owned(),
            reason,
        })
    }

    /// A request as [`USER`] that must answer `want`.
    fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        want: u16,
    ) -> Result<Answer, RegistryError> {
        let answer = self.request(method, path, Some((USER, &self.password)), headers, body)?;
        if answer.status != want {
            return Err(RegistryError::Status {
                method: method.to_owned(),
                path: path.to_owned(),
                status: answer.status,
                want,
                body: answer.body,
            });
        }
        Ok(answer)
    }

    /// Pushes the local image `target/images/<stem>.tar` (`busybox` or `pause`, built by
    /// `cargo xtask`) as `<repository>:<tag>`.
    pub fn push_local(&self, stem: &str, repository: &str, tag: &str) -> PushedImage {
        let tar = local_image_tar(stem);
        self.push_layout(&tar, repository, tag)
            .unwrap_or_else(|e| panic!("pushing {} as {repository}:{tag}: {e}", tar.display()))
    }

    /// Pushes the one-manifest OCI image layout tarball `tar` as `<repository>:<tag>`, its
    /// config labelled with this registry's host.
    pub fn push_layout(
        &self,
        tar: &Path,
        repository: &str,
        tag: &str,
    ) -> Result<PushedImage, RegistryError> {
        let layout = read_layout(tar)?;
        let layout_error = |reason: String| RegistryError::Layout {
            path: tar.to_owned(),
            reason,
        };
        let index: Value = serde_json::from_slice(layout.file("index.json").map_err(layout_error)?)
            .map_err(|e| layout_error(format!("index.json: {e}")))?;
        let manifest_digest = index["manifests"][0]["digest"]
            .as_str()
            .ok_or_else(|| layout_error("index.json names no manifest".to_owned()))?;
        let mut manifest: Value =
            serde_json::from_slice(layout.blob(manifest_digest).map_err(layout_error)?)
                .map_err(|e| layout_error(format!("manifest: {e}")))?;
        let config_digest = manifest["config"]["digest"]
            .as_str()
            .ok_or_else(|| layout_error("the manifest names no config".to_owned()))?;
        let mut config: Value =
            serde_json::from_slice(layout.blob(config_digest).map_err(layout_error)?)
                .map_err(|e| layout_error(format!("config: {e}")))?;
        config["config"]["Labels"][REGISTRY_LABEL] = json!(self.host);
        let config =
            serde_json::to_vec(&config).map_err(|e| layout_error(format!("config: {e}")))?;
        let config_digest = digest(&config);
        manifest["config"]["digest"] = json!(config_digest);
        manifest["config"]["size"] = json!(config.len());
        let layers: Vec<String> = manifest["layers"]
            .as_array()
            .ok_or_else(|| layout_error("the manifest has no layers".to_owned()))?
            .iter()
            .filter_map(|l| l["digest"].as_str().map(str::to_owned))
            .collect();
        for layer in &layers {
            self.push_blob(repository, layer, layout.blob(layer).map_err(layout_error)?)?;
        }
        self.push_blob(repository, &config_digest, &config)?;
        let manifest =
            serde_json::to_vec(&manifest).map_err(|e| layout_error(format!("manifest: {e}")))?;
        let manifest_digest = digest(&manifest);
        let media_type = manifest_media_type(&manifest);
        self.call(
            "PUT",
            &format!("/v2/{repository}/manifests/{tag}"),
            &[("Content-Type", &media_type)],
            Some(&manifest),
            201,
        )?;
        Ok(PushedImage {
            reference: self.image(repository, tag),
            manifest_digest,
            config_digest,
        })
    }

    /// Uploads one blob unless the repository has it (distribution-spec: `POST` an upload,
    /// `PUT` its location with `digest`).
    fn push_blob(
        &self,
        repository: &str,
        blob_digest: &str,
        data: &[u8],
    ) -> Result<(), RegistryError> {
        let blob = format!("/v2/{repository}/blobs/{blob_digest}");
        if self.call("HEAD", &blob, &[], None, 200).is_ok() {
            return Ok(());
        }
        let start = format!("/v2/{repository}/blobs/uploads/");
        let opened = self.call("POST", &start, &[], Some(&[]), 202)?;
        let location =
            header(&opened.head, "location").ok_or_else(|| RegistryError::NoLocation {
                method: "POST".to_owned(),
                path: start.clone(),
                head: opened.head.clone(),
            })?;
        // The registry answers an absolute URL built from the request's Host; only the path
        // and query are ours to follow.
        let location = location
            .find("/v2/")
            .map_or(location.as_str(), |at| &location[at..]);
        let separator = if location.contains('?') { '&' } else { '?' };
        self.call(
            "PUT",
            &format!("{location}{separator}digest={blob_digest}"),
            &[("Content-Type", "application/octet-stream")],
            Some(data),
            201,
        )?;
        Ok(())
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
        if let Some(hosts_dir) = &self.hosts_dir {
            let _ = std::fs::remove_dir_all(hosts_dir);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The registry's configuration (distribution's `docs/configuration.md`): loopback only, TLS,
/// htpasswd, storage in `dir`.
fn registry_config(dir: &Path, port: u16) -> String {
    let d = dir.display();
    format!(
        "version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {d}/storage
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
  # One instance: a fixed secret only silences the warning about a random one.
  secret: swiftlet-test-registry
  tls:
    certificate: {d}/server.crt
    key: {d}/server.key
auth:
  htpasswd:
    realm: swiftlet-test-registry
    path: {d}/htpasswd
health:
  storagedriver:
    enabled: false
"
    )
}

/// Waits until the registry answers `/v2/` with 401 (TLS and authentication in place); its log
/// lines when it exits or never answers.
fn wait_ready(process: &mut Running, port: u16, client: &Arc<ClientConfig>) -> Result<(), String> {
    let deadline = Instant::now() + EVENT_WAIT;
    let log = |process: &Running| -> String {
        let lines: Vec<String> = process
            .stderr
            .try_iter()
            .chain(process.stdout.try_iter())
            .collect();
        lines.join("\n")
    };
    while Instant::now() < deadline {
        if let Ok(Some(status)) = process.child.try_wait() {
            return Err(format!("exited with {status}: {}", log(&*process)));
        }
        if let Ok(answer) = tls::request(port, "127.0.0.1", client.clone(), "GET", "/v2/", &[])
            && answer.status == 401
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = process.child.kill();
    Err(format!(
        "no answer on /v2/ within {EVENT_WAIT:?}: {}",
        log(&*process)
    ))
}

/// Writes `<state>/certs.d/<host>/hosts.toml` (containerd's `docs/hosts.md`): pull from this
/// host over HTTPS, trusting `ca_file`. The folder, to remove on drop.
fn trust(state: &Path, host: &str, ca_file: &Path) -> PathBuf {
    let dir = state.join("certs.d").join(host);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    write(
        &dir.join("hosts.toml"),
        hosts_toml(host, ca_file).as_bytes(),
    );
    dir
}

/// The `hosts.toml` of one HTTPS registry with a CA of its own.
pub fn hosts_toml(host: &str, ca_file: &Path) -> String {
    format!(
        "server = \"https://{host}\"\n\n[host.\"https://{host}\"]\n  ca = {ca:?}\n  \
         capabilities = [\"pull\", \"resolve\"]\n",
        ca = ca_file.display().to_string(),
    )
}

/// `target/images/<stem>.tar` of the workspace.
pub fn local_image_tar(stem: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("images")
        .join(format!("{stem}.tar"));
    assert!(
        path.exists(),
        "{} is missing: `cargo xtask containerd start` builds the local images",
        path.display()
    );
    path
}

/// The files of an OCI image layout tarball.
struct Layout {
    files: HashMap<String, Vec<u8>>,
}

impl Layout {
    fn file(&self, path: &str) -> Result<&[u8], String> {
        self.files
            .get(path)
            .map(Vec::as_slice)
            .ok_or_else(|| format!("no {path}"))
    }

    fn blob(&self, blob_digest: &str) -> Result<&[u8], String> {
        let hex = blob_digest
            .strip_prefix("sha256:")
            .ok_or_else(|| format!("{blob_digest} is not a sha256 digest"))?;
        let data = self.file(&format!("blobs/sha256/{hex}"))?;
        if digest(data) != blob_digest {
            return Err(format!("blob {blob_digest} does not match its digest"));
        }
        Ok(data)
    }
}

fn read_layout(tar: &Path) -> Result<Layout, RegistryError> {
    let error = |reason: String| RegistryError::Layout {
        path: tar.to_owned(),
        reason,
    };
    let file = std::fs::File::open(tar).map_err(|e| error(e.to_string()))?;
    let mut files = HashMap::new();
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries().map_err(|e| error(e.to_string()))? {
        let mut entry = entry.map_err(|e| error(e.to_string()))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry
            .path()
            .map_err(|e| error(e.to_string()))?
            .display()
            .to_string();
        let mut data = Vec::new();
        entry
            .read_to_end(&mut data)
            .map_err(|e| error(format!("{path}: {e}")))?;
        files.insert(path.trim_start_matches("./").to_owned(), data);
    }
    Ok(Layout { files })
}

/// The manifest's own `mediaType`, or the OCI one.
fn manifest_media_type(manifest: &[u8]) -> String {
    serde_json::from_slice::<Value>(manifest)
        .ok()
        .and_then(|m| m["mediaType"].as_str().map(str::to_owned))
        .unwrap_or_else(|| OCI_MANIFEST.to_owned())
}

/// The value of header `name` (lower case) in a response head.
pub fn header(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

/// A `.dockerconfigjson` with one entry: `host` with `user` and `password`.
pub fn docker_config_json(host: &str, user: &str, password: &str) -> String {
    json!({ "auths": { host: {
        "username": user,
        "password": password,
        "auth": basic(user, password),
    }}})
    .to_string()
}

fn basic(user: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

fn digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

fn random_word(len: usize) -> String {
    (0..len)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[fastrand::usize(..36)]))
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("a free loopback port: {e}"))
}

fn create_private_dir(dir: &Path) {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
}

fn write(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;

    #[test]
    fn hosts_toml_names_the_server_its_ca_and_pull_only() {
        let toml = hosts_toml("127.0.0.1:5123", Path::new("/tmp/r/ca.crt"));
        assert_eq!(
            toml,
            "server = \"https://127.0.0.1:5123\"\n\n[host.\"https://127.0.0.1:5123\"]\n  \
             ca = \"/tmp/r/ca.crt\"\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
    }

    #[test]
    fn headers_are_found_whatever_their_case() {
        let head = "HTTP/1.1 202 Accepted\r\nLocation: https://127.0.0.1/v2/a/blobs/uploads/x?_state=y\r\nDocker-Upload-UUID: x";
        assert_eq!(
            header(head, "location").as_deref(),
            Some("https://127.0.0.1/v2/a/blobs/uploads/x?_state=y")
        );
        assert_eq!(header(head, "docker-upload-uuid").as_deref(), Some("x"));
        assert_eq!(header(head, "etag"), None);
        // The status line is no header.
        assert_eq!(header("HTTP/1.1: 200", "HTTP/1.1"), None);
    }

    #[test]
    fn the_password_is_checked_against_the_bcrypt_hash_the_registry_reads() {
        let hash = bcrypt::hash("secret", BCRYPT_COST).unwrap();
        assert!(hash.starts_with("$2"), "{hash}");
        assert!(bcrypt::verify("secret", &hash).unwrap());
        assert!(!bcrypt::verify("wrong", &hash).unwrap());
    }

    #[test]
    fn a_docker_config_names_the_registry_host_with_basic_auth() {
        let config: Value =
            serde_json::from_str(&docker_config_json("127.0.0.1:5123", "u", "p:w")).unwrap();
        let entry = &config["auths"]["127.0.0.1:5123"];
        assert_eq!(entry["username"], "u");
        assert_eq!(entry["password"], "p:w");
        let auth = base64::engine::general_purpose::STANDARD
            .decode(entry["auth"].as_str().unwrap())
            .unwrap();
        assert_eq!(auth, b"u:p:w");
    }

    #[test]
    fn a_layout_blob_must_match_its_digest() {
        let mut files = HashMap::new();
        files.insert(format!("blobs/sha256/{}", "0".repeat(64)), b"x".to_vec());
        let good = digest(b"y");
        files.insert(
            format!("blobs/sha256/{}", good.trim_start_matches("sha256:")),
            b"y".to_vec(),
        );
        let layout = Layout { files };
        assert_eq!(layout.blob(&good).unwrap(), b"y");
        let bad = format!("sha256:{}", "0".repeat(64));
        assert!(layout.blob(&bad).unwrap_err().contains("does not match"));
        assert!(layout.blob("md5:00").is_err());
        assert!(layout.blob(&digest(b"z")).unwrap_err().contains("no blobs"));
    }
}
