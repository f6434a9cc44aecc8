//! The kubelet server's settings: the full (TLS) server's `port` and `address`, its certificate
//! (`tlsCertFile`/`tlsPrivateKeyFile`, else a self-signed pair in `--cert-dir`), `tlsMinVersion`,
//! and who may use it: `authentication` (x509 client certificates, bearer tokens through a
//! TokenReview webhook, anonymous) and `authorization` (`AlwaysAllow` or a SubjectAccessReview
//! webhook).
//!
//! Not here: the server (`server/`). Upstream: `KubeletConfiguration`'s `port`, `address`,
//! `tls*`, `authentication`, `authorization`, the `--cert-dir` flag, and
//! `cmd/kubelet/app/auth.go` (`BuildAuthn`/`BuildAuthz`, which refuse a webhook without a client).
//!
//! Defaults: upstream has two sets. A `KubeletConfiguration` file defaults to webhook
//! authentication and `Webhook` authorization, which need an API server; the command line alone
//! keeps the legacy `--authentication-token-webhook=false --authorization-mode=AlwaysAllow`.
//! swiftlet picks by what it can do: with `--kubeconfig` the webhooks, standalone `AlwaysAllow`
//! and no token webhook. Anonymous requests are refused by default (upstream's file default), and
//! turned off with a warning when asked for with `AlwaysAllow` (the kube-apiserver's rule; the
//! kubelet accepts the pair only for its legacy command-line defaults).
//! Asking for a webhook without an API server is an error naming the field, as upstream's
//! "no client provided, cannot use webhook authorization".

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use serde::Deserialize;

use super::{
    RunArgs,
    error::{ConfigError, Origin, invalid},
    fields::Resolver,
    file::FileConfig,
};

/// Upstream's `KubeletPort`.
pub const DEFAULT_PORT: u16 = 10250;
/// Upstream's `authentication.webhook.cacheTTL`.
pub const DEFAULT_TOKEN_CACHE_TTL: Duration = Duration::from_secs(120);
/// Upstream's `authorization.webhook.cacheAuthorizedTTL`.
pub const DEFAULT_AUTHORIZED_TTL: Duration = Duration::from_secs(300);
/// Upstream's `authorization.webhook.cacheUnauthorizedTTL`.
pub const DEFAULT_UNAUTHORIZED_TTL: Duration = Duration::from_secs(30);

/// `authentication` as written in the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileAuthentication {
    pub x509: Option<FileX509>,
    pub webhook: Option<FileAuthnWebhook>,
    pub anonymous: Option<FileEnabled>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileX509 {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthnWebhook {
    pub enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEnabled {
    pub enabled: Option<bool>,
}

/// `authorization` as written in the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthorization {
    pub mode: Option<String>,
    pub webhook: Option<FileAuthzWebhook>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthzWebhook {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<String>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<String>,
}

/// The TLS 1.2 suites rustls (with ring) implements, by their Go names; the TLS 1.3 ones are
/// accepted and, as in Go, always on. CBC, RSA key exchange and 3DES suites are not implemented.
pub const CIPHER_SUITES: [&str; 9] = [
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// A suite's canonical name (Go also accepts the ChaCha20 ones without `_SHA256`).
fn cipher_suite(name: &str) -> Option<&'static str> {
    let name = name.trim();
    CIPHER_SUITES
        .iter()
        .find(|s| **s == name || s.strip_suffix("_SHA256") == Some(name))
        .copied()
}

/// The lowest TLS version the full server accepts (rustls speaks only 1.2 and 1.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsVersion {
    #[default]
    Tls12,
    Tls13,
}

impl FromStr for TlsVersion {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "VersionTLS12" => Ok(TlsVersion::Tls12),
            "VersionTLS13" => Ok(TlsVersion::Tls13),
            "VersionTLS10" | "VersionTLS11" => {
                Err("TLS 1.0 and 1.1 are not supported: use VersionTLS12 or VersionTLS13")
            }
            _ => Err("expected VersionTLS12 or VersionTLS13"),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AuthorizationMode {
    /// Every authenticated request is allowed.
    #[default]
    AlwaysAllow,
    /// A SubjectAccessReview to the API server decides.
    Webhook,
}

impl fmt::Display for AuthorizationMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuthorizationMode::AlwaysAllow => "AlwaysAllow",
            AuthorizationMode::Webhook => "Webhook",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authentication {
    /// Requests without credentials are `system:anonymous` instead of refused with 401.
    pub anonymous: bool,
    /// Anonymous requests were asked for with `AlwaysAllow` authorization and turned off (the
    /// agent says so at start).
    pub anonymous_turned_off: bool,
    /// Bearer tokens are checked with a TokenReview.
    pub webhook: bool,
    pub webhook_cache_ttl: Duration,
    /// Client certificates signed by these CAs authenticate as CN (user) and O (groups).
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authorization {
    pub mode: AuthorizationMode,
    pub cache_authorized_ttl: Duration,
    pub cache_unauthorized_ttl: Duration,
}

/// The full server's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// `address:port`; `None` when `port` is 0.
    pub address: Option<SocketAddr>,
    /// Both or neither; neither means a self-signed pair in `cert_directory`.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// `--cert-dir`, default `<rootDir>/pki`.
    pub cert_directory: PathBuf,
    pub tls_min_version: TlsVersion,
    /// `tlsCipherSuites` by canonical name; empty: rustls's defaults.
    pub tls_cipher_suites: Vec<&'static str>,
    /// `/exec`, `/attach`, `/portForward`, `/run`, `/runningpods/`, `/containerLogs` (upstream's
    /// debugging handlers); off, they answer 405.
    pub enable_debugging_handlers: bool,
    pub authentication: Authentication,
    pub authorization: Authorization,
}

impl ServerConfig {
    /// The certificate and key files the server uses: the configured pair, else the
    /// self-signed `kubelet.crt`/`kubelet.key` in the cert directory.
    pub fn cert_and_key(&self) -> (PathBuf, PathBuf, bool) {
        match (&self.tls_cert_file, &self.tls_private_key_file) {
            (Some(cert), Some(key)) => (cert.clone(), key.clone(), false),
            _ => (
                self.cert_directory.join("kubelet.crt"),
                self.cert_directory.join("kubelet.key"),
                true,
            ),
        }
    }
}

pub(super) fn resolve(
    r: &Resolver,
    args: &RunArgs,
    file: &FileConfig,
    root_dir: &Path,
) -> Result<ServerConfig, ConfigError> {
    let port = match (args.port, file.port) {
        (Some(p), _) => p,
        (None, Some(p)) => r.port("port", p)?,
        (None, None) => DEFAULT_PORT,
    };
    let ip = match (args.address, &file.address) {
        (Some(ip), _) => ip,
        (None, Some(s)) => r.ip("address", s)?,
        (None, None) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    let pick = |flag: &Option<PathBuf>, file: &Option<PathBuf>| {
        flag.clone()
            .or_else(|| file.clone())
            .filter(|p| !p.as_os_str().is_empty())
    };
    let tls_cert_file = pick(&args.tls_cert_file, &file.tls_cert_file);
    let tls_private_key_file = pick(&args.tls_private_key_file, &file.tls_private_key_file);
    match (&tls_cert_file, &tls_private_key_file) {
        (Some(cert), None) => {
            return Err(invalid(
                &origin_of(r, args.tls_cert_file.is_some(), "--tls-cert-file"),
                "tlsPrivateKeyFile",
                "path",
                "",
                format!(
                    "tlsCertFile {} is set: its key must be set too",
                    cert.display()
                ),
            ));
        }
        (None, Some(key)) => {
            return Err(invalid(
                &origin_of(
                    r,
                    args.tls_private_key_file.is_some(),
                    "--tls-private-key-file",
                ),
                "tlsCertFile",
                "path",
                "",
                format!(
                    "tlsPrivateKeyFile {} is set: its certificate must be set too",
                    key.display()
                ),
            ));
        }
        _ => {}
    }
    let tls_min_version = match (&args.tls_min_version, &file.tls_min_version) {
        (Some(v), _) => v.parse().map_err(|why| {
            invalid(
                &Origin::Flag("--tls-min-version"),
                "tlsMinVersion",
                "value",
                v,
                why,
            )
        })?,
        (None, Some(v)) => v
            .parse()
            .map_err(|why| invalid(r.file, "tlsMinVersion", "value", v, why))?,
        (None, None) => TlsVersion::Tls12,
    };
    let tls_cipher_suites = match r.list_field(
        (&args.tls_cipher_suites, "--tls-cipher-suites"),
        &file.tls_cipher_suites,
    ) {
        None => Vec::new(),
        Some((origin, names)) => names
            .iter()
            .map(|name| {
                cipher_suite(name).ok_or_else(|| {
                    invalid(
                        &origin,
                        "tlsCipherSuites",
                        "cipher suite",
                        name,
                        format!(
                            "not one of the suites this server implements: {}",
                            CIPHER_SUITES.join(", ")
                        ),
                    )
                })
            })
            .collect::<Result<_, _>>()?,
    };
    let cert_directory = args
        .cert_dir
        .clone()
        .unwrap_or_else(|| root_dir.join("pki"));

    let api_server = args.kubeconfig.is_some();
    let authn = file.authentication.clone().unwrap_or_default();
    let authz = file.authorization.clone().unwrap_or_default();
    let anonymous = args
        .anonymous_auth
        .or(authn.anonymous.as_ref().and_then(|a| a.enabled))
        .unwrap_or(false);
    let (webhook, webhook_origin) = match (
        args.authentication_token_webhook,
        authn.webhook.as_ref().and_then(|w| w.enabled),
    ) {
        (Some(on), _) => (on, Origin::Flag("--authentication-token-webhook")),
        (None, Some(on)) => (on, r.file.clone()),
        (None, None) => (api_server, Origin::Default),
    };
    if webhook && !api_server {
        return Err(invalid(
            &webhook_origin,
            "authentication.webhook.enabled",
            "value",
            "true",
            "token webhook authentication needs an API server: set --kubeconfig, or disable it",
        ));
    }
    let webhook_cache_ttl = r.duration(
        "authentication.webhook.cacheTTL",
        (
            args.authentication_token_webhook_cache_ttl,
            "--authentication-token-webhook-cache-ttl",
        ),
        &authn.webhook.as_ref().and_then(|w| w.cache_ttl.clone()),
        DEFAULT_TOKEN_CACHE_TTL,
    )?;
    let client_ca_file = pick(
        &args.client_ca_file,
        &authn.x509.as_ref().and_then(|x| x.client_ca_file.clone()),
    );

    let (mode, mode_origin) = match (&args.authorization_mode, &authz.mode) {
        (Some(m), _) => (m.clone(), Origin::Flag("--authorization-mode")),
        (None, Some(m)) => (m.clone(), r.file.clone()),
        (None, None) if api_server => ("Webhook".to_owned(), Origin::Default),
        (None, None) => ("AlwaysAllow".to_owned(), Origin::Default),
    };
    let mode = match mode.as_str() {
        "AlwaysAllow" => AuthorizationMode::AlwaysAllow,
        "Webhook" if api_server => AuthorizationMode::Webhook,
        "Webhook" => {
            return Err(invalid(
                &mode_origin,
                "authorization.mode",
                "value",
                mode,
                "Webhook authorization needs an API server: set --kubeconfig, or use AlwaysAllow",
            ));
        }
        _ => {
            return Err(invalid(
                &mode_origin,
                "authorization.mode",
                "value",
                mode,
                "expected \"AlwaysAllow\" or \"Webhook\"",
            ));
        }
    };
    // As the kube-apiserver: anonymous requests with AlwaysAllow would let anyone who reaches
    // the port exec into every container.
    let anonymous_turned_off = anonymous && mode == AuthorizationMode::AlwaysAllow;
    let anonymous = anonymous && !anonymous_turned_off;
    let webhook_file = authz.webhook.unwrap_or_default();
    let cache_authorized_ttl = r.duration(
        "authorization.webhook.cacheAuthorizedTTL",
        (None, ""),
        &webhook_file.cache_authorized_ttl,
        DEFAULT_AUTHORIZED_TTL,
    )?;
    let cache_unauthorized_ttl = r.duration(
        "authorization.webhook.cacheUnauthorizedTTL",
        (None, ""),
        &webhook_file.cache_unauthorized_ttl,
        DEFAULT_UNAUTHORIZED_TTL,
    )?;

    Ok(ServerConfig {
        address: (port != 0).then_some(SocketAddr::new(ip, port)),
        tls_cert_file,
        tls_private_key_file,
        cert_directory,
        tls_min_version,
        tls_cipher_suites,
        enable_debugging_handlers: args
            .enable_debugging_handlers
            .or(file.enable_debugging_handlers)
            .unwrap_or(true),
        authentication: Authentication {
            anonymous,
            anonymous_turned_off,
            webhook,
            webhook_cache_ttl,
            client_ca_file,
        },
        authorization: Authorization {
            mode,
            cache_authorized_ttl,
            cache_unauthorized_ttl,
        },
    })
}

fn origin_of(r: &Resolver, from_flag: bool, flag: &'static str) -> Origin {
    if from_flag {
        Origin::Flag(flag)
    } else {
        r.file.clone()
    }
}
