//! The docker keyring (upstream `pkg/credentialprovider/keyring.go` `BasicDockerKeyring`,
//! `config.go` `DockerConfigEntry`, `secrets/secrets.go` `MakeDockerKeyring`): registry
//! credentials indexed by where they apply — a host, with a port, maybe a path prefix, maybe
//! glob characters in the host's labels — and the lookup of the ones that match an image's
//! repository, most specific first (the index is sorted in reverse). Pure: no I/O.
//!
//! Secrets count only with the right type and a non-empty key: `kubernetes.io/dockerconfigjson`
//! with `.dockerconfigjson` (`{"auths": {...}}`), or the legacy `kubernetes.io/dockercfg` with
//! `.dockercfg` (the entries alone). A secret that does not parse fails the lookup, as upstream
//! fails the pull; an entry whose location does not parse as a URL is skipped.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;

pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
pub const DOCKERCFG_TYPE: &str = "kubernetes.io/dockercfg";
pub const DOCKERCFG_KEY: &str = ".dockercfg";

/// Docker Hub's key in a keyring (upstream `defaultRegistryHost`).
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// The most credentials one lookup returns, so the most pulls one image start can cost.
/// Upstream tries every match; a pod author's secret of a megabyte could name thousands.
pub const MAX_CREDENTIALS: usize = 16;

/// Why the pull secrets gave no keyring.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("secret {namespace}/{name}: key {key:?} is not a docker config: {source}")]
    Parse {
        namespace: String,
        name: String,
        key: &'static str,
        source: serde_json::Error,
    },
    #[error(
        "secret {namespace}/{name}: the auth field of {location:?} is not base64(username:password): \
         {reason}"
    )]
    Auth {
        namespace: String,
        name: String,
        location: String,
        reason: &'static str,
    },
}

/// One username and password for a registry; the secret it came from, for logs (never the
/// password).
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
    /// `<namespace>/<name>` of the secret.
    pub source: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("username", &self.username)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// An entry of a docker config as it is written (`docker login` writes `auth`, others
/// `username` and `password`).
#[derive(Debug, Default, Deserialize)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

#[derive(Debug, Deserialize)]
struct DockerConfigJson {
    #[serde(default)]
    auths: Option<BTreeMap<String, Entry>>,
}

/// The credentials of the pod's pull secrets, by where they apply.
#[derive(Debug, Default)]
pub struct Keyring {
    /// Distinct keys; read in reverse order, so that `host/path` comes before `host`.
    index: BTreeSet<String>,
    creds: HashMap<String, Vec<Credential>>,
}

impl Keyring {
    /// The keyring of `secrets` (upstream `MakeDockerKeyring` with no default keyring): the
    /// secrets of other types, or without the key, add nothing.
    pub fn from_secrets(secrets: &[Secret]) -> Result<Keyring, KeyringError> {
        let mut keyring = Keyring::default();
        for secret in secrets {
            let namespace = secret.metadata.namespace.clone().unwrap_or_default();
            let name = secret.metadata.name.clone().unwrap_or_default();
            let data = |key: &str| {
                secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|b| b.0.as_slice())
                    .filter(|b| !b.is_empty())
            };
            let parse_error = |key: &'static str, source| KeyringError::Parse {
                namespace: namespace.clone(),
                name: name.clone(),
                key,
                source,
            };
            let entries = match secret.type_.as_deref() {
                Some(DOCKER_CONFIG_JSON_TYPE) => match data(DOCKER_CONFIG_JSON_KEY) {
                    Some(bytes) => serde_json::from_slice::<DockerConfigJson>(bytes)
                        .map_err(|e| parse_error(DOCKER_CONFIG_JSON_KEY, e))?
                        .auths
                        .unwrap_or_default(),
                    None => continue,
                },
                Some(DOCKERCFG_TYPE) => match data(DOCKERCFG_KEY) {
                    Some(bytes) => serde_json::from_slice::<BTreeMap<String, Entry>>(bytes)
                        .map_err(|e| parse_error(DOCKERCFG_KEY, e))?,
                    None => continue,
                },
                _ => continue,
            };
            let source = format!("{namespace}/{name}");
            for (location, entry) in entries {
                let (username, password) = if entry.auth.is_empty() {
                    (entry.username, entry.password)
                } else {
                    decode_auth(&entry.auth).map_err(|reason| KeyringError::Auth {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        location: location.clone(),
                        reason,
                    })?
                };
                keyring.add(
                    &location,
                    Credential {
                        username,
                        password,
                        source: source.clone(),
                    },
                );
            }
        }
        Ok(keyring)
    }

    /// Adds `credential` for `location` (upstream `BasicDockerKeyring.Add`): a scheme is
    /// optional, a `/v1/` or `/v2/` path means the host alone.
    pub fn add(&mut self, location: &str, credential: Credential) {
        let Some(url) = SchemelessUrl::parse(strip_scheme(location)) else {
            return;
        };
        let path = match url.path {
            p if p.starts_with("/v2/") || p.starts_with("/v1/") => &p[3..],
            p => p,
        };
        let key = if path.is_empty() || path == "/" {
            url.host.to_owned()
        } else {
            format!("{}{path}", url.host)
        };
        self.creds.entry(key.clone()).or_default().push(credential);
        self.index.insert(key);
    }

    /// The credentials for `repository` (an image without tag or digest, normalized as
    /// [`repository_of`] does), most specific location first; Docker Hub's for a Docker Hub
    /// image when nothing else matched (upstream `Lookup`); at most [`MAX_CREDENTIALS`].
    pub fn lookup(&self, repository: &str) -> Vec<Credential> {
        let mut found = Vec::new();
        for key in self.index.iter().rev() {
            if urls_match(key, repository) {
                found.extend(self.creds.get(key).into_iter().flatten().cloned());
            }
        }
        if found.is_empty()
            && is_default_registry_match(repository)
            && let Some(hub) = self.creds.get(DEFAULT_REGISTRY_HOST)
        {
            found.extend(hub.iter().cloned());
        }
        found.truncate(MAX_CREDENTIALS);
        found
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

fn strip_scheme(location: &str) -> &str {
    location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .unwrap_or(location)
}

/// `base64(username:password)`, padded or not (upstream `decodeDockerConfigFieldAuth`).
fn decode_auth(field: &str) -> Result<(String, String), &'static str> {
    let engine = if field.trim().ends_with('=') {
        &base64::engine::general_purpose::STANDARD
    } else {
        &base64::engine::general_purpose::STANDARD_NO_PAD
    };
    let decoded = engine.decode(field).map_err(|_| "not base64")?;
    let decoded = String::from_utf8(decoded).map_err(|_| "not UTF-8")?;
    let (username, password) = decoded
        .split_once(':')
        .ok_or("must be formatted as base64(username:password)")?;
    Ok((username.to_owned(), password.to_owned()))
}

/// A URL without its scheme, as upstream parses one after prefixing `https://`: the host
/// (with its port) and the path; user info, query and fragment dropped.
#[derive(Debug, PartialEq, Eq)]
struct SchemelessUrl<'a> {
    host: &'a str,
    path: &'a str,
}

impl<'a> SchemelessUrl<'a> {
    fn parse(text: &'a str) -> Option<SchemelessUrl<'a>> {
        let text = text.split(['?', '#']).next().unwrap_or_default();
        let (authority, path) = match text.find('/') {
            Some(at) => text.split_at(at),
            None => (text, ""),
        };
        let host = authority.rsplit('@').next().unwrap_or(authority);
        // What Go's url.Parse refuses in a host (`shouldEscape` in host mode), and in a path.
        let host_char = |c: char| {
            c.is_ascii_alphanumeric() || !c.is_ascii() || "-_.~!$&'()*+,;=:[]<>\"%".contains(c)
        };
        if !host.chars().all(host_char) || path.chars().any(|c| c.is_control() || c == ' ') {
            return None;
        }
        Some(SchemelessUrl { host, path })
    }

    /// The host's labels and the port (empty without one), as upstream `SplitURL`.
    fn labels_and_port(&self) -> (Vec<&'a str>, &'a str) {
        let (host, port) = split_host_port(self.host).unwrap_or((self.host, ""));
        (host.split('.').collect(), port)
    }
}

/// Go's `net.SplitHostPort`, for the shapes a registry host has: `host:port`, `[v6]:port`.
fn split_host_port(hostport: &str) -> Option<(&str, &str)> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        return Some((host, port));
    }
    let (host, port) = hostport.rsplit_once(':')?;
    if host.contains(':') {
        return None;
    }
    Some((host, port))
}

/// Whether `target` falls under the keyring key `glob` (upstream `URLsMatch`): the same port,
/// as many host labels with each matching its glob, and the key's path a prefix of the
/// target's.
pub(crate) fn urls_match(glob: &str, target: &str) -> bool {
    let (Some(glob), Some(target)) = (SchemelessUrl::parse(glob), SchemelessUrl::parse(target))
    else {
        return false;
    };
    let (glob_labels, glob_port) = glob.labels_and_port();
    let (target_labels, target_port) = target.labels_and_port();
    glob_port == target_port
        && glob_labels.len() == target_labels.len()
        && target.path.starts_with(glob.path)
        && glob_labels
            .iter()
            .zip(&target_labels)
            .all(|(g, t)| glob_match(g, t) == Some(true))
}

/// Whether `text` parses as a URL once `https://` is put before it (upstream
/// `ParseSchemelessURL`, which checks a provider's `matchImages`).
pub(crate) fn is_schemeless_url(text: &str) -> bool {
    SchemelessUrl::parse(text).is_some()
}

/// Whether `repository` is on Docker Hub (upstream `isDefaultRegistryMatch`).
fn is_default_registry_match(repository: &str) -> bool {
    let mut parts = repository.splitn(2, '/');
    let first = parts.next().unwrap_or_default();
    if first.is_empty() {
        return false;
    }
    if parts.next().is_none() {
        return true;
    }
    if first == "docker.io" || first == "index.docker.io" {
        return true;
    }
    !first.contains(['.', ':'])
}

/// Go's `filepath.Match` for one host label (which holds no `/`): `*`, `?`, `[...]` classes
/// with ranges and `^` negation, `\` escapes. `None` for a malformed pattern, which upstream
/// counts as no match.
fn glob_match(pattern: &str, name: &str) -> Option<bool> {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    // Iterative with one back-track point per star: linear in practice, no recursion for a
    // hostile pattern to blow up.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    loop {
        if p < pattern.len() {
            match pattern[p] {
                '*' => {
                    star = Some((p, n));
                    p += 1;
                    continue;
                }
                _ if n < name.len() => {
                    let (matched, width) = match_one(&pattern[p..], name[n])?;
                    if matched {
                        p += width;
                        n += 1;
                        continue;
                    }
                }
                _ => {
                    // The name is used up: what is left of the pattern must still be valid.
                    validate(&pattern[p..])?;
                }
            }
        } else if n == name.len() {
            return Some(true);
        }
        match star {
            Some((star_p, star_n)) if star_n < name.len() => {
                star = Some((star_p, star_n + 1));
                p = star_p + 1;
                n = star_n + 1;
            }
            _ => {
                validate(&pattern[p.min(pattern.len())..])?;
                return Some(false);
            }
        }
    }
}

/// Whether the pattern's first element (a character, `?`, an escape or a class) matches `c`,
/// and how many pattern characters it spans; `None` if it is malformed.
fn match_one(pattern: &[char], c: char) -> Option<(bool, usize)> {
    match pattern.first()? {
        '?' => Some((true, 1)),
        '\\' => Some((*pattern.get(1)? == c, 2)),
        '[' => {
            let mut i = 1;
            let negated = pattern.get(i) == Some(&'^');
            if negated {
                i += 1;
            }
            let mut matched = false;
            let mut ranges = 0;
            loop {
                if pattern.get(i) == Some(&']') && ranges > 0 {
                    i += 1;
                    break;
                }
                let lo = class_char(pattern, &mut i)?;
                let mut hi = lo;
                if pattern.get(i) == Some(&'-') {
                    i += 1;
                    hi = class_char(pattern, &mut i)?;
                }
                ranges += 1;
                if lo <= c && c <= hi {
                    matched = true;
                }
            }
            Some((matched != negated, i))
        }
        other => Some((*other == c, 1)),
    }
}

/// One character of a class at `*at`, escaped or not (Go's `getEsc`): a bare `-` or `]` there,
/// or the pattern's end, is malformed.
fn class_char(pattern: &[char], at: &mut usize) -> Option<char> {
    let mut c = *pattern.get(*at)?;
    if c == '-' || c == ']' {
        return None;
    }
    if c == '\\' {
        *at += 1;
        c = *pattern.get(*at)?;
    }
    *at += 1;
    Some(c)
}

/// `Some(())` if every element of `pattern` is well formed.
fn validate(pattern: &[char]) -> Option<()> {
    let mut i = 0;
    while i < pattern.len() {
        if pattern[i] == '*' {
            i += 1;
            continue;
        }
        let (_, width) = match_one(&pattern[i..], '\0')?;
        i += width;
    }
    Some(())
}

/// The repository of an image reference, normalized as upstream's `parsers.ParseImageName`
/// (distribution's `ParseNormalizedNamed`): tag and digest dropped, Docker Hub's domain and
/// `library/` made explicit (`busybox:1` → `docker.io/library/busybox`).
pub fn repository_of(image: &str) -> String {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last_slash = without_digest.rfind('/').map_or(0, |i| i + 1);
    let name = match without_digest[last_slash..].find(':') {
        Some(colon) => &without_digest[..last_slash + colon],
        None => without_digest,
    };
    let (domain, rest) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first != first.to_lowercase() =>
        {
            (first, rest)
        }
        _ => ("docker.io", name),
    };
    let domain = if domain == "index.docker.io" {
        "docker.io"
    } else {
        domain
    };
    if domain == "docker.io" && !rest.contains('/') {
        format!("{domain}/library/{rest}")
    } else {
        format!("{domain}/{rest}")
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use k8s_openapi::ByteString;

    use super::*;

    fn credential(user: &str) -> Credential {
        Credential {
            username: user.to_owned(),
            password: format!("{user}-password"),
            source: "ns/s".to_owned(),
        }
    }

    fn users(found: &[Credential]) -> Vec<&str> {
        found.iter().map(|c| c.username.as_str()).collect()
    }

    fn keyring(entries: &[(&str, &str)]) -> Keyring {
        let mut keyring = Keyring::default();
        for (location, user) in entries {
            keyring.add(location, credential(user));
        }
        keyring
    }

    #[test]
    fn repositories_are_normalized_as_upstream_parses_image_names() {
        let cases = [
            ("busybox", "docker.io/library/busybox"),
            ("busybox:1.36", "docker.io/library/busybox"),
            ("library/busybox@sha256:abc", "docker.io/library/busybox"),
            ("someone/app:v1", "docker.io/someone/app"),
            ("index.docker.io/someone/app", "docker.io/someone/app"),
            (
                "localhost/swiftlet/busybox:latest",
                "localhost/swiftlet/busybox",
            ),
            (
                "127.0.0.1:5000/swiftlet/busybox:latest",
                "127.0.0.1:5000/swiftlet/busybox",
            ),
            ("127.0.0.1:5000/busybox", "127.0.0.1:5000/busybox"),
            ("quay.io/coreos/etcd:v3@sha256:00", "quay.io/coreos/etcd"),
        ];
        for (image, want) in cases {
            assert_eq!(repository_of(image), want, "{image}");
        }
    }

    #[test]
    fn lookups_match_host_port_and_path_prefix_most_specific_first() {
        let keyring = keyring(&[
            ("quay.io", "host"),
            ("https://quay.io/coreos", "path"),
            ("http://quay.io/v2/", "v2-is-the-host"),
            ("127.0.0.1:5000", "with-port"),
            ("*.example.com", "glob"),
            ("reg[0-9].example.org", "class"),
            ("index.docker.io/v1/", "hub"),
        ]);
        let cases: &[(&str, &[&str])] = &[
            ("quay.io/coreos/etcd", &["path", "host", "v2-is-the-host"]),
            ("quay.io/other/etcd", &["host", "v2-is-the-host"]),
            // The port must be the same: none is not 5000.
            ("127.0.0.1:5000/swiftlet/busybox", &["with-port"]),
            ("127.0.0.1/swiftlet/busybox", &[]),
            ("127.0.0.1:5001/swiftlet/busybox", &[]),
            // A glob stands for one label, never several.
            ("registry.example.com/app", &["glob"]),
            ("a.registry.example.com/app", &[]),
            ("reg7.example.org/app", &["class"]),
            ("regx.example.org/app", &[]),
            // Docker Hub's credentials for Docker Hub images when nothing else matched.
            ("docker.io/library/busybox", &["hub"]),
            ("elsewhere.io/app", &[]),
        ];
        for (repository, want) in cases {
            // `quay.io` and `quay.io/v2/` are one key, its credentials in the order added.
            assert_eq!(&users(&keyring.lookup(repository)), want, "{repository}");
        }
    }

    #[test]
    fn one_location_keeps_every_credential_in_the_order_given() {
        let keyring = keyring(&[("127.0.0.1:5000", "first"), ("127.0.0.1:5000", "second")]);
        assert_eq!(
            users(&keyring.lookup("127.0.0.1:5000/a")),
            ["first", "second"]
        );
    }

    #[test]
    fn a_lookup_returns_a_bounded_number_of_credentials() {
        let mut keyring = Keyring::default();
        for i in 0..100 {
            keyring.add("r.io", credential(&format!("u{i}")));
        }
        let found = keyring.lookup("r.io/app");
        assert_eq!(found.len(), MAX_CREDENTIALS);
        assert_eq!(found[0].username, "u0");
    }

    #[test]
    fn the_path_of_a_key_is_a_plain_prefix_as_upstream() {
        let keyring = keyring(&[("registry.io/team", "team")]);
        assert_eq!(users(&keyring.lookup("registry.io/team/app")), ["team"]);
        assert_eq!(users(&keyring.lookup("registry.io/teammate/app")), ["team"]);
        assert!(keyring.lookup("registry.io/other/app").is_empty());
    }

    #[test]
    fn unparsable_locations_are_skipped() {
        let keyring = keyring(&[("bad host/x", "bad"), ("good.io", "good")]);
        assert_eq!(users(&keyring.lookup("good.io/app")), ["good"]);
        assert!(keyring.lookup("bad host/x").is_empty());
    }

    #[test]
    fn globs_follow_filepath_match() {
        let cases = [
            ("*", "anything", Some(true)),
            ("*", "", Some(true)),
            ("a*c", "abbbc", Some(true)),
            ("a*c", "abbbd", Some(false)),
            ("a?c", "abc", Some(true)),
            ("a?c", "ac", Some(false)),
            ("[a-c]x", "bx", Some(true)),
            ("[^a-c]x", "bx", Some(false)),
            ("[^a-c]x", "dx", Some(true)),
            ("\\*", "*", Some(true)),
            ("\\*", "a", Some(false)),
            ("[a-", "a", None),
            ("[a-]", "a", None),
            ("[]a]", "a", None),
            ("[\\]]", "]", Some(true)),
            ("ab[", "ab", None),
            ("*[", "x", None),
            ("**b", "aab", Some(true)),
        ];
        for (pattern, name, want) in cases {
            assert_eq!(glob_match(pattern, name), want, "{pattern} {name}");
        }
    }

    #[test]
    fn a_long_hostile_glob_is_answered_quickly() {
        let pattern = "*a".repeat(50);
        let name = "a".repeat(60) + "b";
        assert_eq!(glob_match(&pattern, &name), Some(false));
    }

    fn secret(type_: &str, key: &str, value: &str) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("pull".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            type_: Some(type_.into()),
            data: Some([(key.to_owned(), ByteString(value.as_bytes().to_vec()))].into()),
            ..Default::default()
        }
    }

    #[test]
    fn secrets_of_both_docker_types_become_credentials() {
        let auth = base64::engine::general_purpose::STANDARD.encode("from-auth:p:w");
        let json = format!(
            r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{auth}", "username": "ignored"}}}}}}"#
        );
        let legacy = r#"{"legacy.io": {"username": "old", "password": "pw", "email": "e"}}"#;
        let keyring = Keyring::from_secrets(&[
            secret(DOCKER_CONFIG_JSON_TYPE, DOCKER_CONFIG_JSON_KEY, &json),
            secret(DOCKERCFG_TYPE, DOCKERCFG_KEY, legacy),
            // The wrong type for its key, and an opaque secret: nothing.
            secret(DOCKERCFG_TYPE, DOCKER_CONFIG_JSON_KEY, &json),
            secret("Opaque", DOCKER_CONFIG_JSON_KEY, &json),
        ])
        .unwrap();
        let found = keyring.lookup("127.0.0.1:5000/swiftlet/busybox");
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].username.as_str(), found[0].password.as_str()),
            ("from-auth", "p:w")
        );
        assert_eq!(found[0].source, "ns/pull");
        assert_eq!(users(&keyring.lookup("legacy.io/app")), ["old"]);
        assert!(
            !format!("{:?}", found[0]).contains("p:w"),
            "Debug shows no password"
        );
    }

    #[test]
    fn unpadded_auth_decodes_and_bad_secrets_say_which_and_why() {
        let unpadded = base64::engine::general_purpose::STANDARD_NO_PAD.encode("u:pw");
        assert_eq!(
            decode_auth(&unpadded).unwrap(),
            ("u".to_owned(), "pw".to_owned())
        );
        let not_json = Keyring::from_secrets(&[secret(
            DOCKER_CONFIG_JSON_TYPE,
            DOCKER_CONFIG_JSON_KEY,
            "{not json",
        )])
        .unwrap_err();
        assert!(
            not_json.to_string().contains("ns/pull")
                && not_json.to_string().contains(".dockerconfigjson"),
            "{not_json}"
        );
        let no_colon = base64::engine::general_purpose::STANDARD.encode("nocolon");
        let bad_auth = Keyring::from_secrets(&[secret(
            DOCKER_CONFIG_JSON_TYPE,
            DOCKER_CONFIG_JSON_KEY,
            &format!(r#"{{"auths": {{"r.io": {{"auth": "{no_colon}"}}}}}}"#),
        )])
        .unwrap_err();
        assert!(bad_auth.to_string().contains("r.io"), "{bad_auth}");
        assert!(decode_auth("!!!").is_err());
    }
}
