//! The credential provider configuration (`--image-credential-provider-config`): a
//! `CredentialProviderConfig` file, or a directory of them (`*.json`, `*.yaml`, `*.yml` in
//! lexicographic order, merged), decoded strictly and validated as upstream's
//! `readCredentialProviderConfig` and `validateCredentialProviderConfig`
//! (`pkg/credentialprovider/plugin/config.go`; the types of `k8s.io/kubelet/config/v1`).
//!
//! Not here: running the plugins (`exec.rs`) or their cache (`cache.rs`). `tokenAttributes`
//! (service account tokens for plugins, upstream's
//! `KubeletServiceAccountTokenForCredentialProviders`) is refused: swiftlet does not request
//! tokens for plugins.

use std::{
    fmt,
    io::Read as _,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use super::super::keyring;
use super::duration::{self, DurationError};
use super::trust::{self, Trust, TrustError, What};

/// The group of the config file's `apiVersion` (upstream `kubeletconfig.GroupName`).
pub const CONFIG_GROUP: &str = "kubelet.config.k8s.io";
const CONFIG_VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];
const CONFIG_KIND: &str = "CredentialProviderConfig";

/// The plugin API versions a provider may speak (upstream `apiVersions`), sorted as upstream
/// lists them in an error.
pub const PLUGIN_API_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
];

/// A config file larger than this is refused before it is parsed: a node's configuration,
/// not a place for data.
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The most config files a directory may hold.
const MAX_CONFIG_FILES: usize = 256;

/// Why the credential provider configuration was refused; the agent does not start with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "--image-credential-provider-config and --image-credential-provider-bin-dir must be given together"
    )]
    OnlyOne,
    #[error("unable to access path {}: {source}", path.display())]
    Access {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("unable to read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: larger than {MAX_CONFIG_BYTES} bytes", path.display())]
    TooLarge { path: PathBuf },
    #[error("no configuration files found in directory {}", path.display())]
    NoFiles { path: PathBuf },
    #[error("directory {} holds more than {MAX_CONFIG_FILES} configuration files", path.display())]
    TooManyFiles { path: PathBuf },
    #[error("error decoding config {}: {source}", path.display())]
    Decode {
        path: PathBuf,
        source: serde_yaml_ng::Error,
    },
    #[error("error decoding config {}: {reason}", path.display())]
    Kind { path: PathBuf, reason: String },
    #[error("duplicate provider name {name:?} found in configuration file(s) ({})", path.display())]
    DuplicateAcrossFiles { path: PathBuf, name: String },
    #[error("failed to validate credential provider config {}: [{}]", path.display(), join(errors))]
    Invalid {
        path: PathBuf,
        errors: Vec<FieldError>,
    },
    #[error("plugin binary directory {} did not exist", path.display())]
    NoBinDir { path: PathBuf },
    #[error("plugin binary executable {} did not exist", path.display())]
    NoBinary { path: PathBuf },
    #[error("credential provider plugin metrics: {0}")]
    Metrics(prometheus::Error),
    /// A path a local user other than root could have written (`trust.rs`).
    #[error(transparent)]
    Untrusted(#[from] TrustError),
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One invalid field, worded as upstream's `field.Error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub kind: FieldErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldErrorKind {
    Required(&'static str),
    Invalid { value: String, detail: String },
    Duplicate(String),
    NotSupported { value: String },
    Forbidden(&'static str),
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = &self.field;
        match &self.kind {
            FieldErrorKind::Required("") => write!(f, "{field}: Required value"),
            FieldErrorKind::Required(detail) => write!(f, "{field}: Required value: {detail}"),
            FieldErrorKind::Invalid { value, detail } => {
                write!(f, "{field}: Invalid value: {value:?}: {detail}")
            }
            FieldErrorKind::Duplicate(value) => write!(f, "{field}: Duplicate value: {value:?}"),
            FieldErrorKind::NotSupported { value } => write!(
                f,
                "{field}: Unsupported value: {value:?}: supported values: {}",
                PLUGIN_API_VERSIONS
                    .iter()
                    .map(|v| format!("{v:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            FieldErrorKind::Forbidden(detail) => write!(f, "{field}: Forbidden: {detail}"),
        }
    }
}

/// The file as written (`CredentialProviderConfig`, strict: an unknown field is an error, as
/// upstream's strict decoder).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileConfig {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    providers: Vec<FileProvider>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FileProvider {
    #[serde(default)]
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    #[serde(default)]
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    token_attributes: Option<serde_yaml_ng::Value>,
}

/// One variable of a plugin's environment (upstream `ExecEnvVar`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

/// A validated provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderConfig {
    /// The binary's file name in the bin dir: no `/`, no space, not `.` or `..`.
    pub name: String,
    pub match_images: Vec<String>,
    pub default_cache_duration: Duration,
    /// One of [`PLUGIN_API_VERSIONS`].
    pub api_version: String,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
}

/// Reads and validates the configuration at `path` (a file or a directory of files), each
/// file read through the descriptor [`Trust::open`] checked it on.
pub fn read(path: &Path, trust: &Trust) -> Result<Vec<ProviderConfig>, ConfigError> {
    let top = trust.open(path, What::Config)?;
    let meta = std::fs::metadata(trust::fd_path(&top)).map_err(|source| ConfigError::Access {
        path: path.to_owned(),
        source,
    })?;
    let files: Vec<(PathBuf, OwnedFd)> = if meta.is_dir() {
        let read_error = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let mut names = Vec::new();
        for entry in std::fs::read_dir(trust::fd_path(&top)).map_err(read_error)? {
            let entry = entry.map_err(read_error)?;
            let name = entry.file_name();
            let is_config = matches!(
                Path::new(&name).extension().and_then(|e| e.to_str()),
                Some("json" | "yaml" | "yml")
            );
            if is_config && !entry.file_type().is_ok_and(|t| t.is_dir()) {
                if names.len() == MAX_CONFIG_FILES {
                    return Err(ConfigError::TooManyFiles {
                        path: path.to_owned(),
                    });
                }
                names.push(name);
            }
        }
        names.sort();
        if names.is_empty() {
            return Err(ConfigError::NoFiles {
                path: path.to_owned(),
            });
        }
        let mut files = Vec::with_capacity(names.len());
        for name in names {
            let file = path.join(name);
            let fd = trust.open_in(&top, &file, What::ConfigFile)?;
            files.push((file, fd));
        }
        files
    } else {
        vec![(path.to_owned(), top)]
    };
    let mut providers: Vec<ProviderConfig> = Vec::new();
    for (file, fd) in files {
        for provider in parse(&file, &read_bounded(&file, &fd)?)? {
            if providers.iter().any(|p| p.name == provider.name) {
                return Err(ConfigError::DuplicateAcrossFiles {
                    path: file,
                    name: provider.name,
                });
            }
            providers.push(provider);
        }
    }
    Ok(providers)
}

/// The file `fd` holds (named `path` in errors), up to [`MAX_CONFIG_BYTES`].
fn read_bounded(path: &Path, fd: &OwnedFd) -> Result<Vec<u8>, ConfigError> {
    let read_error = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(trust::fd_path(fd)).map_err(read_error)?;
    let mut data = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(read_error)?;
    if data.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigError::TooLarge {
            path: path.to_owned(),
        });
    }
    Ok(data)
}

/// Decodes and validates one file's text; `path` names it in errors.
pub fn parse(path: &Path, data: &[u8]) -> Result<Vec<ProviderConfig>, ConfigError> {
    let file: FileConfig =
        serde_yaml_ng::from_slice(data).map_err(|source| ConfigError::Decode {
            path: path.to_owned(),
            source,
        })?;
    let kind_error = |reason: String| ConfigError::Kind {
        path: path.to_owned(),
        reason,
    };
    if file.kind != CONFIG_KIND {
        return Err(kind_error(format!(
            "failed to decode {:?} (wrong Kind)",
            file.kind
        )));
    }
    match file.api_version.split_once('/') {
        Some((CONFIG_GROUP, version)) if CONFIG_VERSIONS.contains(&version) => {}
        Some((CONFIG_GROUP, version)) => {
            return Err(kind_error(format!(
                "no kind {CONFIG_KIND:?} is registered for version \"{CONFIG_GROUP}/{version}\""
            )));
        }
        _ => {
            return Err(kind_error(format!(
                "failed to decode CredentialProviderConfig, unexpected Group: {}",
                file.api_version.split_once('/').map_or("", |(g, _)| g)
            )));
        }
    }
    validate(file.providers).map_err(|errors| ConfigError::Invalid {
        path: path.to_owned(),
        errors,
    })
}

/// Upstream `validateCredentialProviderConfig`, every error collected; the field paths name
/// the provider's index too (upstream's omit it, which leaves a long file hard to fix).
fn validate(providers: Vec<FileProvider>) -> Result<Vec<ProviderConfig>, Vec<FieldError>> {
    let mut errors = Vec::new();
    if providers.is_empty() {
        errors.push(FieldError {
            field: "providers".into(),
            kind: FieldErrorKind::Required("at least 1 item in plugins is required"),
        });
    }
    let mut valid = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for (i, provider) in providers.into_iter().enumerate() {
        let before = errors.len();
        let mut error = |field: &str, kind| {
            errors.push(FieldError {
                field: format!("providers[{i}].{field}"),
                kind,
            });
        };
        let invalid = |value: &str, detail: &str| FieldErrorKind::Invalid {
            value: value.to_owned(),
            detail: detail.to_owned(),
        };
        let name = &provider.name;
        if name.is_empty() {
            error("name", FieldErrorKind::Required(""));
        }
        if name.contains('/') {
            error("name", invalid(name, "provider name cannot contain '/'"));
        }
        if name.contains(' ') {
            error("name", invalid(name, "provider name cannot contain spaces"));
        }
        if name == "." {
            error("name", invalid(name, "provider name cannot be '.'"));
        }
        if name == ".." {
            error("name", invalid(name, "provider name cannot be '..'"));
        }
        if name.contains('\0') {
            error("name", invalid(name, "provider name cannot contain NUL"));
        }
        if seen.contains(name) {
            error("name", FieldErrorKind::Duplicate(name.clone()));
        }
        seen.push(name.clone());
        if provider.api_version.is_empty() {
            error("apiVersion", FieldErrorKind::Required(""));
        } else if !PLUGIN_API_VERSIONS.contains(&provider.api_version.as_str()) {
            error(
                "apiVersion",
                FieldErrorKind::NotSupported {
                    value: provider.api_version.clone(),
                },
            );
        }
        if provider.match_images.is_empty() {
            error(
                "matchImages",
                FieldErrorKind::Required("at least 1 item in matchImages is required"),
            );
        }
        for image in &provider.match_images {
            if !keyring::is_schemeless_url(image) {
                error(
                    "matchImages",
                    invalid(image, "match image is invalid: not a URL without a scheme"),
                );
            }
        }
        let default_cache_duration = match provider.default_cache_duration.as_deref() {
            None => {
                error("defaultCacheDuration", FieldErrorKind::Required(""));
                None
            }
            Some(text) => match duration::parse(text) {
                Ok(d) => Some(d),
                Err(DurationError::Negative) => {
                    error(
                        "defaultCacheDuration",
                        invalid(
                            text,
                            "defaultCacheDuration must be greater than or equal to 0",
                        ),
                    );
                    None
                }
                Err(e) => {
                    error("defaultCacheDuration", invalid(text, &e.to_string()));
                    None
                }
            },
        };
        for var in &provider.env {
            if var.name.is_empty() || var.name.contains(['=', '\0']) || var.value.contains('\0') {
                error(
                    "env",
                    invalid(
                        &var.name,
                        "an environment variable's name must be non-empty, without '=' or NUL",
                    ),
                );
            }
        }
        if provider.args.iter().any(|a| a.contains('\0')) {
            error(
                "args",
                FieldErrorKind::Forbidden("an argument cannot contain NUL"),
            );
        }
        if provider.token_attributes.is_some() {
            error(
                "tokenAttributes",
                FieldErrorKind::Forbidden(
                    "swiftlet does not request service account tokens for credential provider plugins",
                ),
            );
        }
        if let Some(default_cache_duration) = default_cache_duration
            && errors.len() == before
        {
            valid.push(ProviderConfig {
                name: provider.name,
                match_images: provider.match_images,
                default_cache_duration,
                api_version: provider.api_version,
                args: provider.args,
                env: provider.env,
            });
        }
    }
    if errors.is_empty() {
        Ok(valid)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> Result<Vec<ProviderConfig>, ConfigError> {
        parse(Path::new("/etc/swiftlet/providers.yaml"), text.as_bytes())
    }

    const VALID: &str = r#"
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: ecr-credential-provider
    matchImages:
      - "*.dkr.ecr.*.amazonaws.com"
      - "registry.example:5000/team"
    defaultCacheDuration: "12h"
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: ["get-credentials"]
    env:
      - name: AWS_PROFILE
        value: node
"#;

    #[test]
    fn a_valid_file_gives_its_providers() {
        let providers = parse_text(VALID).expect("valid");
        assert_eq!(
            providers,
            [ProviderConfig {
                name: "ecr-credential-provider".into(),
                match_images: vec![
                    "*.dkr.ecr.*.amazonaws.com".into(),
                    "registry.example:5000/team".into()
                ],
                default_cache_duration: Duration::from_secs(12 * 3600),
                api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
                args: vec!["get-credentials".into()],
                env: vec![EnvVar {
                    name: "AWS_PROFILE".into(),
                    value: "node".into()
                }],
            }]
        );
        // JSON is YAML too, and the older config versions are accepted.
        let json = r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"CredentialProviderConfig",
            "providers":[{"name":"p","matchImages":["r.io"],"defaultCacheDuration":"0s",
            "apiVersion":"credentialprovider.kubelet.k8s.io/v1alpha1"}]}"#;
        let providers = parse_text(json).expect("valid JSON");
        assert_eq!(providers[0].default_cache_duration, Duration::ZERO);
    }

    #[test]
    fn every_invalid_field_is_named_with_the_file() {
        let text = r#"
apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: ../evil
    matchImages: []
    defaultCacheDuration: "-1m"
    apiVersion: credentialprovider.kubelet.k8s.io/v2
  - name: ".."
    matchImages: ["bad host/x"]
    apiVersion: ""
  - name: ok
    matchImages: ["r.io"]
    defaultCacheDuration: "1m"
    apiVersion: credentialprovider.kubelet.k8s.io/v1
  - name: ok
    matchImages: ["r.io"]
    defaultCacheDuration: "1m"
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    tokenAttributes:
      serviceAccountTokenAudience: x
"#;
        let error = parse_text(text).expect_err("invalid");
        let ConfigError::Invalid { ref errors, .. } = error else {
            panic!("not a validation error: {error}");
        };
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "providers[0].name",
                "providers[0].apiVersion",
                "providers[0].matchImages",
                "providers[0].defaultCacheDuration",
                "providers[1].name",
                "providers[1].apiVersion",
                "providers[1].matchImages",
                "providers[1].defaultCacheDuration",
                "providers[3].name",
                "providers[3].tokenAttributes",
            ]
        );
        let text = error.to_string();
        assert!(text.starts_with(
            "failed to validate credential provider config /etc/swiftlet/providers.yaml: ["
        ));
        assert!(text.contains(
            r#"providers[0].name: Invalid value: "../evil": provider name cannot contain '/'"#
        ));
        assert!(
            text.contains(
                r#"providers[1].name: Invalid value: "..": provider name cannot be '..'"#
            )
        );
        assert!(text.contains("providers[0].defaultCacheDuration: Invalid value: \"-1m\": defaultCacheDuration must be greater than or equal to 0"));
        assert!(text.contains(r#"providers[3].name: Duplicate value: "ok""#));
        assert!(text.contains(
            r#"providers[0].apiVersion: Unsupported value: "credentialprovider.kubelet.k8s.io/v2""#
        ));
    }

    #[test]
    fn the_wrong_kind_or_group_or_an_unknown_field_is_refused() {
        let wrong_kind = VALID.replace(
            "kind: CredentialProviderConfig",
            "kind: KubeletConfiguration",
        );
        assert!(matches!(
            parse_text(&wrong_kind),
            Err(ConfigError::Kind { .. })
        ));
        let wrong_group = VALID.replace("kubelet.config.k8s.io/v1", "example.com/v1");
        assert!(matches!(
            parse_text(&wrong_group),
            Err(ConfigError::Kind { .. })
        ));
        let wrong_version =
            VALID.replace("kubelet.config.k8s.io/v1\n", "kubelet.config.k8s.io/v9\n");
        assert!(matches!(
            parse_text(&wrong_version),
            Err(ConfigError::Kind { .. })
        ));
        let unknown = VALID.replace("    args:", "    argz: [x]\n    args:");
        let error = parse_text(&unknown).expect_err("unknown field");
        assert!(matches!(error, ConfigError::Decode { .. }));
        assert!(error.to_string().contains("argz"), "{error}");
        let empty = "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n";
        assert!(
            parse_text(empty)
                .expect_err("no providers")
                .to_string()
                .contains("providers: Required value: at least 1 item in plugins is required")
        );
    }

    #[test]
    fn a_directory_merges_its_config_files_in_order_and_refuses_a_name_twice() {
        let dir = tempfile::tempdir().expect("tempdir");
        let provider = |name: &str| {
            format!(
                "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
                 - name: {name}\n  matchImages: [r.io]\n  defaultCacheDuration: 1m\n  \
                 apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
            )
        };
        std::fs::write(dir.path().join("b.yaml"), provider("second")).expect("write");
        std::fs::write(dir.path().join("a.json"), provider("first")).expect("write");
        std::fs::write(dir.path().join("notes.txt"), "not a config").expect("write");
        let trust = Trust::beneath(dir.path());
        let names: Vec<String> = read(dir.path(), &trust)
            .expect("valid dir")
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["first", "second"]);
        std::fs::write(dir.path().join("c.yml"), provider("first")).expect("write");
        assert!(matches!(
            read(dir.path(), &trust),
            Err(ConfigError::DuplicateAcrossFiles { ref name, .. }) if name == "first"
        ));
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            read(empty.path(), &Trust::beneath(empty.path())),
            Err(ConfigError::NoFiles { .. })
        ));
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b' '; MAX_CONFIG_BYTES as usize + 1]).expect("write");
        assert!(matches!(
            read(&big, &trust),
            Err(ConfigError::TooLarge { .. })
        ));
    }

    /// Every merged file is checked as the directory is: a link or a file others may write is
    /// refused, naming it.
    #[test]
    fn a_merged_file_that_is_a_link_or_writable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;

        let dir = tempfile::tempdir().expect("tempdir");
        let trust = Trust::beneath(dir.path());
        let valid = dir.path().join("a.yaml");
        std::fs::write(&valid, VALID).expect("write");
        std::fs::set_permissions(&valid, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(read(dir.path(), &trust).expect("valid").len(), 1);
        let elsewhere = tempfile::tempdir().expect("tempdir");
        std::fs::write(elsewhere.path().join("x.yaml"), VALID).expect("write");
        let link = dir.path().join("b.yaml");
        std::os::unix::fs::symlink(elsewhere.path().join("x.yaml"), &link).expect("link");
        let error = read(dir.path(), &trust).expect_err("a linked file");
        assert!(
            matches!(error, ConfigError::Untrusted(TrustError::Symlink { ref path, .. }) if *path == link),
            "{error}"
        );
        std::fs::remove_file(&link).expect("unlink");
        std::fs::set_permissions(&valid, std::fs::Permissions::from_mode(0o620)).expect("chmod");
        let error = read(dir.path(), &trust).expect_err("a group-writable file");
        assert!(
            error.to_string().contains(&format!(
                "credential provider config file {}: mode 0620",
                valid.display()
            )),
            "{error}"
        );
    }

    /// A provider's name is a plain file name in the bin dir, as upstream's
    /// `validateCredentialProviderConfig` requires: not empty, no '/', not '.' or '..'.
    #[test]
    fn a_name_that_is_not_a_plain_file_name_is_refused() {
        for (name, detail) in [
            ("\"\"", "providers[0].name: Required value"),
            ("\".\"", "provider name cannot be '.'"),
            ("\"..\"", "provider name cannot be '..'"),
            ("a/b", "provider name cannot contain '/'"),
            ("/bin/sh", "provider name cannot contain '/'"),
        ] {
            let text = VALID.replace("name: ecr-credential-provider", &format!("name: {name}"));
            let error = parse_text(&text).expect_err(name);
            assert!(error.to_string().contains(detail), "{name}: {error}");
        }
    }
}
