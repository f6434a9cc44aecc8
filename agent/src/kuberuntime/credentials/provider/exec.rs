//! Running one credential provider plugin for one image (upstream `execPlugin.ExecPlugin`,
//! `pkg/credentialprovider/plugin/plugin.go`): `<bin-dir>/<name> args...` with the agent's
//! environment and the config's `env` on top, a `CredentialProviderRequest` on stdin, a
//! `CredentialProviderResponse` read from stdout and checked (its `apiVersion` must be the
//! provider's, its `kind` the response's, no unknown field — upstream's strict decoder), within
//! upstream's catch-all timeout of one minute.
//!
//! The plugin is treated as hostile: stdout is read up to a bound, stderr kept up to a smaller
//! one (the rest drained and dropped) for the error and the log, the plugin runs in its own
//! process group, which is killed when it overruns the time or the bound, so that a child it
//! left holding the pipes does not hold the pull. A response that does not decode is reported
//! without its text (it may hold credentials), as upstream does.
//!
//! Before each exec the plugin's path is checked again (`trust.rs`: not a link, owned by root,
//! writable by no one else, nor any directory above it) and the file checked is the one
//! executed, through its descriptor (`/proc/self/fd/N`, the descriptor kept open across the
//! exec so that a `#!` script's interpreter can open it too): a plugin swapped or made writable
//! after start fails that lookup instead of running.
//!
//! Not here: which images a plugin is asked about, caching, single flight (`mod.rs`).

use std::{os::fd::AsRawFd as _, path::PathBuf, process::Stdio, sync::Arc, time::Duration};

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};

use super::config::{EnvVar, ProviderConfig};
use super::duration;
use super::trust::{self, Trust, TrustError, What};

/// Upstream's timeout for every exec plugin.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// The most bytes of a response: a few registries' tokens fit many times over; a plugin
/// printing without end is stopped here.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// The most bytes of a plugin's stderr kept for the error and the log.
pub const MAX_STDERR_BYTES: usize = 4 * 1024;
/// How long the stderr of a plugin that was stopped or exited is still waited for.
const STDERR_GRACE: Duration = Duration::from_secs(1);

const REQUEST_KIND: &str = "CredentialProviderRequest";
const RESPONSE_KIND: &str = "CredentialProviderResponse";

/// Why a plugin gave no credentials. Every variant names the provider.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecError {
    #[error("credential provider plugin {provider} for image {image} not run: {source}")]
    Untrusted {
        provider: String,
        image: String,
        source: Arc<TrustError>,
    },
    #[error("error execing credential provider plugin {provider} for image {image}: {reason}")]
    Spawn {
        provider: String,
        image: String,
        reason: String,
    },
    #[error(
        "error execing credential provider plugin {provider} for image {image}: context deadline \
         exceeded (after {timeout:?}): {stderr}"
    )]
    Timeout {
        provider: String,
        image: String,
        timeout: Duration,
        stderr: String,
    },
    #[error(
        "credential provider plugin {provider} for image {image}: the response exceeds \
         {MAX_RESPONSE_BYTES} bytes"
    )]
    TooLarge { provider: String, image: String },
    #[error(
        "error execing credential provider plugin {provider} for image {image}: {status}: {stderr}"
    )]
    Exit {
        provider: String,
        image: String,
        status: String,
        stderr: String,
    },
    #[error(
        "credential provider plugin {provider}: apiVersion from credential plugin response did \
         not match expected apiVersion:{expected}, actual apiVersion:{actual}"
    )]
    ApiVersion {
        provider: String,
        expected: String,
        actual: String,
    },
    #[error(
        "credential provider plugin {provider}: error decoding credential provider plugin \
         response from stdout ({category} at line {line}, column {column})"
    )]
    Decode {
        provider: String,
        category: &'static str,
        line: usize,
        column: usize,
    },
    #[error(
        "credential provider plugin {provider}: failed to decode CredentialProviderResponse, \
         unexpected Kind: {kind:?}"
    )]
    Kind { provider: String, kind: String },
    #[error(
        "credential provider plugin {provider}: did not return a valid cacheKeyType: {value:?}"
    )]
    CacheKeyType { provider: String, value: String },
    #[error("credential provider plugin {provider}: cacheDuration {value:?}: {reason}")]
    CacheDuration {
        provider: String,
        value: String,
        reason: String,
    },
}

impl ExecError {
    /// Whether the plugin's exec was tried (upstream times every `runPlugin`, a failed start
    /// too); a plugin refused before it was not.
    pub fn ran(&self) -> bool {
        !matches!(self, ExecError::Untrusted { .. })
    }

    /// Whether this is one of upstream's plugin errors (`runPlugin`: the exec failed, timed
    /// out or exited non-zero; a response that does not decode is not one) or a plugin that
    /// was refused before its exec.
    pub fn is_plugin_error(&self) -> bool {
        matches!(
            self,
            ExecError::Untrusted { .. }
                | ExecError::Spawn { .. }
                | ExecError::Timeout { .. }
                | ExecError::TooLarge { .. }
                | ExecError::Exit { .. }
        )
    }
}

/// What the response's credentials are cached under (upstream `PluginCacheKeyType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKeyType {
    Image,
    Registry,
    Global,
}

/// A registry's username and password from a plugin (upstream `AuthConfig`).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub password: String,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// A checked response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub cache_key_type: CacheKeyType,
    /// `None`: the provider's default; zero: not cached.
    pub cache_duration: Option<Duration>,
    /// Match key (as a docker config's location) → credentials.
    pub auth: Vec<(String, AuthConfig)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WireResponse {
    #[serde(default)]
    #[allow(dead_code, reason = "checked before the strict decode")]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    cache_key_type: String,
    #[serde(default)]
    cache_duration: Option<String>,
    #[serde(default)]
    auth: Option<std::collections::BTreeMap<String, AuthConfig>>,
}

/// The request (upstream `CredentialProviderRequest`; the service account fields are not sent).
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    kind: &'static str,
    api_version: &'a str,
    image: &'a str,
}

/// Only the type of a response, read first (upstream `DefaultMetaFactory.Interpret`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    #[serde(default)]
    api_version: String,
}

/// How one provider's plugin is run.
#[derive(Clone, Debug)]
pub struct ExecPlugin {
    pub name: String,
    pub path: PathBuf,
    pub api_version: String,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    pub timeout: Duration,
    /// Who may own the plugin and the directories above it.
    pub trust: Trust,
}

impl ExecPlugin {
    pub fn new(bin_dir: &std::path::Path, config: &ProviderConfig, trust: Trust) -> Self {
        ExecPlugin {
            name: config.name.clone(),
            path: bin_dir.join(&config.name),
            api_version: config.api_version.clone(),
            args: config.args.clone(),
            env: config.env.clone(),
            timeout: EXEC_TIMEOUT,
            trust,
        }
    }

    /// Asks the plugin for `image`'s credentials.
    pub async fn run(&self, image: &str) -> Result<Response, ExecError> {
        let request = serde_json::to_vec(&Request {
            kind: REQUEST_KIND,
            api_version: &self.api_version,
            image,
        })
        .map_err(|e| ExecError::Spawn {
            provider: self.name.clone(),
            image: image.to_owned(),
            reason: e.to_string(),
        })?;
        let checked = self
            .trust
            .open(&self.path, What::Plugin)
            .map_err(|source| ExecError::Untrusted {
                provider: self.name.clone(),
                image: image.to_owned(),
                source: Arc::new(source),
            })?;
        let mut command = tokio::process::Command::new(trust::fd_path(&checked));
        crate::sys::keep_fd_across_exec(&mut command, checked.as_raw_fd());
        command
            .arg0(&self.path)
            .args(&self.args)
            .envs(self.env.iter().map(|v| (&v.name, &v.value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let spawn_error = |reason: String| ExecError::Spawn {
            provider: self.name.clone(),
            image: image.to_owned(),
            reason,
        };
        // A binary being replaced (or just written, with its descriptor inherited by a fork
        // elsewhere in the process) is briefly busy: that is worth a short retry, not a failed pull.
        let mut attempts = 0;
        let mut child = loop {
            match command.spawn() {
                Ok(child) => break child,
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempts < 5 => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(spawn_error(e.to_string())),
            }
        };
        drop(checked);
        let pid = child.id();
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            kill_group(pid);
            return Err(spawn_error("the plugin's pipes were not set up".into()));
        };
        let stderr = tokio::spawn(read_stderr(stderr));
        let exchange = async {
            let write = async {
                // A plugin that exits without reading its request may still answer: a broken
                // pipe is not an error by itself (nor is it in Go's exec).
                let _ = stdin.write_all(&request).await;
                drop(stdin);
            };
            let (_, out) = tokio::join!(write, read_bounded(stdout, MAX_RESPONSE_BYTES));
            match out {
                Ok(Some(out)) => Ok(child.wait().await.map(|status| (out, status))),
                Ok(None) => Err(Overrun::TooLarge),
                Err(e) => Ok(Err(e)),
            }
        };
        let outcome = tokio::time::timeout(self.timeout, exchange).await;
        let stderr_text = |stderr: tokio::task::JoinHandle<String>| async {
            tokio::time::timeout(STDERR_GRACE, stderr)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default()
        };
        let (out, status) = match outcome {
            Ok(Ok(Ok(done))) => done,
            Ok(Ok(Err(e))) => {
                kill_group(pid);
                return Err(spawn_error(e.to_string()));
            }
            Ok(Err(Overrun::TooLarge)) => {
                kill_group(pid);
                let _ = child.wait().await;
                let stderr = stderr_text(stderr).await;
                self.log_stderr(image, &stderr);
                return Err(ExecError::TooLarge {
                    provider: self.name.clone(),
                    image: image.to_owned(),
                });
            }
            Err(_elapsed) => {
                kill_group(pid);
                let _ = child.wait().await;
                return Err(ExecError::Timeout {
                    provider: self.name.clone(),
                    image: image.to_owned(),
                    timeout: self.timeout,
                    stderr: stderr_text(stderr).await,
                });
            }
        };
        let stderr = stderr_text(stderr).await;
        if !status.success() {
            return Err(ExecError::Exit {
                provider: self.name.clone(),
                image: image.to_owned(),
                status: status.to_string(),
                stderr,
            });
        }
        self.log_stderr(image, &stderr);
        self.decode(&out)
    }

    fn log_stderr(&self, image: &str, stderr: &str) {
        if !stderr.is_empty() {
            tracing::info!(provider = %self.name, image, stderr, "credential provider plugin wrote to stderr");
        }
    }

    /// Checks and decodes a response (upstream: the `apiVersion` first, then the strict decode).
    fn decode(&self, out: &[u8]) -> Result<Response, ExecError> {
        let decode_error = |e: serde_json::Error| ExecError::Decode {
            provider: self.name.clone(),
            category: match e.classify() {
                serde_json::error::Category::Io => "I/O",
                serde_json::error::Category::Syntax => "syntax error",
                serde_json::error::Category::Data => "unexpected field or type",
                serde_json::error::Category::Eof => "truncated",
            },
            line: e.line(),
            column: e.column(),
        };
        let meta: TypeMeta = serde_json::from_slice(out).map_err(decode_error)?;
        if meta.api_version != self.api_version {
            return Err(ExecError::ApiVersion {
                provider: self.name.clone(),
                expected: self.api_version.clone(),
                actual: meta.api_version,
            });
        }
        let wire: WireResponse = serde_json::from_slice(out).map_err(decode_error)?;
        if wire.kind != RESPONSE_KIND {
            return Err(ExecError::Kind {
                provider: self.name.clone(),
                kind: wire.kind,
            });
        }
        let cache_key_type = match wire.cache_key_type.as_str() {
            "Image" => CacheKeyType::Image,
            "Registry" => CacheKeyType::Registry,
            "Global" => CacheKeyType::Global,
            _ => {
                return Err(ExecError::CacheKeyType {
                    provider: self.name.clone(),
                    value: wire.cache_key_type,
                });
            }
        };
        let cache_duration = match wire.cache_duration {
            None => None,
            // Upstream adds a negative duration to now: the entry is expired at once.
            Some(text) if text.starts_with('-') => Some(Duration::ZERO),
            Some(text) => Some(
                duration::parse(&text).map_err(|e| ExecError::CacheDuration {
                    provider: self.name.clone(),
                    value: text.clone(),
                    reason: e.to_string(),
                })?,
            ),
        };
        Ok(Response {
            cache_key_type,
            cache_duration,
            auth: wire.auth.unwrap_or_default().into_iter().collect(),
        })
    }
}

enum Overrun {
    TooLarge,
}

/// Reads `pipe` to its end; `None` if it holds more than `limit` bytes.
async fn read_bounded(
    pipe: impl AsyncRead + Unpin,
    limit: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut out = Vec::new();
    pipe.take(limit as u64 + 1).read_to_end(&mut out).await?;
    Ok((out.len() <= limit).then_some(out))
}

/// The first [`MAX_STDERR_BYTES`] of `pipe`, lossily as text; the rest is read and dropped, so
/// that a plugin writing much to stderr does not block on it.
async fn read_stderr(mut pipe: impl AsyncRead + Unpin) -> String {
    let mut kept = Vec::new();
    let _ = (&mut pipe)
        .take(MAX_STDERR_BYTES as u64)
        .read_to_end(&mut kept)
        .await;
    let _ = tokio::io::copy(&mut pipe, &mut tokio::io::sink()).await;
    String::from_utf8_lossy(&kept).trim_end().to_owned()
}

/// Kills the plugin's process group (it was made the leader of its own).
fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    const V1: &str = "credentialprovider.kubelet.k8s.io/v1";

    /// A plugin written as a shell script in a fresh directory.
    fn plugin(script: &str) -> (tempfile::TempDir, ExecPlugin) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plugin");
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).expect("write plugin");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let plugin = ExecPlugin {
            name: "test-plugin".into(),
            path,
            api_version: V1.into(),
            args: vec!["--flag".into()],
            env: vec![EnvVar {
                name: "PLUGIN_USER".into(),
                value: "from-config".into(),
            }],
            timeout: Duration::from_secs(20),
            trust: Trust::beneath(dir.path()),
        };
        (dir, plugin)
    }

    #[tokio::test]
    async fn the_request_goes_on_stdin_and_the_response_is_decoded() {
        // The plugin echoes what it got: the request, its argument and its environment.
        let (_dir, plugin) = plugin(
            r#"request=$(cat)
expected='{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"r.io/app"}'
if [ "$request" != "$expected" ]; then echo "bad request: $request" >&2; exit 3; fi
echo 'something for the log' >&2
printf '{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Registry","cacheDuration":"5m","auth":{"r.io":{"username":"%s","password":"%s"}}}' "$PLUGIN_USER" "$1""#,
        );
        let response = plugin.run("r.io/app").await.expect("response");
        assert_eq!(response.cache_key_type, CacheKeyType::Registry);
        assert_eq!(response.cache_duration, Some(Duration::from_secs(300)));
        assert_eq!(
            response.auth,
            [(
                "r.io".to_owned(),
                AuthConfig {
                    username: "from-config".into(),
                    password: "--flag".into()
                }
            )]
        );
    }

    #[tokio::test]
    async fn a_failing_plugin_is_an_error_with_its_name_and_its_stderr() {
        let (_dir, plugin) = plugin("cat >/dev/null; echo 'no token for you' >&2; exit 2");
        let error = plugin.run("r.io/app").await.expect_err("exit 2");
        let text = error.to_string();
        assert!(matches!(error, ExecError::Exit { .. }), "{text}");
        assert!(text.contains("test-plugin"), "{text}");
        assert!(text.contains("no token for you"), "{text}");
    }

    #[tokio::test]
    async fn a_response_of_the_wrong_version_kind_or_shape_is_refused_without_its_text() {
        let cases = [
            (
                r#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1beta1","cacheKeyType":"Image"}"#,
                "did not match expected apiVersion",
            ),
            (
                r#"{"kind":"Secret","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Image"}"#,
                "unexpected Kind",
            ),
            (
                r#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Forever"}"#,
                "valid cacheKeyType",
            ),
            (
                r#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Image","auth":{"r.io":{"username":"u","password":"hunter2","extra":1}}}"#,
                "error decoding",
            ),
            ("hunter2 is not JSON", "error decoding"),
        ];
        for (response, expected) in cases {
            let (_dir, plugin) = plugin(&format!("cat >/dev/null; printf '%s' '{response}'"));
            let text = plugin
                .run("r.io/app")
                .await
                .expect_err(response)
                .to_string();
            assert!(text.contains(expected), "{response}: {text}");
            assert!(text.contains("test-plugin"), "{text}");
            assert!(!text.contains("hunter2"), "the response leaked: {text}");
        }
    }

    #[tokio::test]
    async fn endless_output_is_cut_at_the_bound_and_the_plugin_killed() {
        // A child of the plugin keeps stdout open too: the whole group is killed.
        let (_dir, plugin) = plugin("cat >/dev/null; (yes credential &); yes credential");
        let error = plugin.run("r.io/app").await.expect_err("too large");
        assert!(matches!(error, ExecError::TooLarge { .. }), "{error}");
    }

    #[tokio::test]
    async fn a_hanging_plugin_is_stopped_at_the_timeout() {
        let (_dir, mut plugin) = plugin("echo 'about to hang' >&2; sleep 1000 & wait");
        plugin.timeout = Duration::from_millis(300);
        let error = plugin.run("r.io/app").await.expect_err("timeout");
        let text = error.to_string();
        assert!(matches!(error, ExecError::Timeout { .. }), "{text}");
        assert!(text.contains("about to hang"), "{text}");
    }

    #[tokio::test]
    async fn a_missing_binary_is_an_error_naming_the_provider() {
        let (dir, mut plugin) = plugin("exit 0");
        plugin.path = dir.path().join("missing");
        let text = plugin
            .run("r.io/app")
            .await
            .expect_err("missing")
            .to_string();
        assert!(text.contains("test-plugin"), "{text}");
    }
}
