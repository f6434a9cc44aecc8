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
    path::PathBuf,
    time::Duration,
};

use super::{
    error::{ConfigError, Origin, invalid},
    input::Given,
    settings::Settings,
    types::TlsVersion,
};

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
    /// `address:port`; `None` when `port` is 0 or `enableServer` is false.
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

/// The full server's settings, from the table's: the certificate pair, the cipher suites, and
/// the authentication and authorization that depend on whether there is an API server.
pub(super) fn resolve(settings: &Settings) -> Result<ServerConfig, ConfigError> {
    let nonempty =
        |given: &Option<Given<PathBuf>>| given.clone().filter(|g| !g.value.as_os_str().is_empty());
    let tls_cert_file = nonempty(&settings.tls_cert_file);
    let tls_private_key_file = nonempty(&settings.tls_private_key_file);
    match (&tls_cert_file, &tls_private_key_file) {
        (Some(cert), None) => {
            return Err(invalid(
                &cert.origin,
                "tlsPrivateKeyFile",
                "path",
                "",
                format!(
                    "tlsCertFile {} is set: its key must be set too",
                    cert.value.display()
                ),
            ));
        }
        (None, Some(key)) => {
            return Err(invalid(
                &key.origin,
                "tlsCertFile",
                "path",
                "",
                format!(
                    "tlsPrivateKeyFile {} is set: its certificate must be set too",
                    key.value.display()
                ),
            ));
        }
        _ => {}
    }
    let tls_cipher_suites = match &settings.tls_cipher_suites {
        None => Vec::new(),
        Some(Given { value, origin }) => value
            .iter()
            .map(|name| {
                cipher_suite(name).ok_or_else(|| {
                    invalid(
                        origin,
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
    let cert_directory = settings
        .cert_dir
        .clone()
        .unwrap_or_else(|| settings.root_dir.join("pki"));
    let ip = settings
        .address
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let port = settings.port;

    Ok(ServerConfig {
        address: (settings.enable_server && port != 0).then_some(SocketAddr::new(ip, port)),
        tls_cert_file: tls_cert_file.map(|g| g.value),
        tls_private_key_file: tls_private_key_file.map(|g| g.value),
        cert_directory,
        tls_min_version: settings.tls_min_version,
        tls_cipher_suites,
        enable_debugging_handlers: settings.enable_debugging_handlers,
        authentication: authentication(settings)?,
        authorization: authorization(settings)?,
    })
}

/// Upstream refuses a token webhook without an API server ("no client provided").
fn authentication(settings: &Settings) -> Result<Authentication, ConfigError> {
    let api_server = settings.kubeconfig.is_some();
    let (webhook, webhook_origin) = match &settings.authentication_token_webhook {
        Some(Given { value, origin }) => (*value, origin.clone()),
        None => (api_server, Origin::Default),
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
    // As the kube-apiserver: anonymous requests with AlwaysAllow would let anyone who reaches
    // the port exec into every container.
    let anonymous_turned_off =
        settings.anonymous_auth && authorization_mode(settings)? == AuthorizationMode::AlwaysAllow;
    Ok(Authentication {
        anonymous: settings.anonymous_auth && !anonymous_turned_off,
        anonymous_turned_off,
        webhook,
        webhook_cache_ttl: settings.authentication_token_webhook_cache_ttl,
        client_ca_file: settings.client_ca_file.clone(),
    })
}

fn authorization(settings: &Settings) -> Result<Authorization, ConfigError> {
    Ok(Authorization {
        mode: authorization_mode(settings)?,
        cache_authorized_ttl: settings.cache_authorized_ttl,
        cache_unauthorized_ttl: settings.cache_unauthorized_ttl,
    })
}

/// `Webhook` with an API server, else `AlwaysAllow`, unless asked for.
fn authorization_mode(settings: &Settings) -> Result<AuthorizationMode, ConfigError> {
    let api_server = settings.kubeconfig.is_some();
    let (mode, origin) = match &settings.authorization_mode {
        Some(Given { value, origin }) => (value.as_str(), origin.clone()),
        None if api_server => ("Webhook", Origin::Default),
        None => ("AlwaysAllow", Origin::Default),
    };
    let bad = |reason| invalid(&origin, "authorization.mode", "value", mode, reason);
    match mode {
        "AlwaysAllow" => Ok(AuthorizationMode::AlwaysAllow),
        "Webhook" if api_server => Ok(AuthorizationMode::Webhook),
        "Webhook" => Err(bad(
            "Webhook authorization needs an API server: set --kubeconfig, or use AlwaysAllow",
        )),
        _ => Err(bad("expected \"AlwaysAllow\" or \"Webhook\"")),
    }
}
