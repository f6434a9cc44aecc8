//! Image credential provider plugins (upstream `pkg/credentialprovider/plugin`, the kubelet's
//! `--image-credential-provider-config` and `--image-credential-provider-bin-dir`): binaries
//! the node's administrator configures that are asked, for an image matching one of their
//! `matchImages`, for the registry credentials to pull it with.
//!
//! [`CredentialProviders::from_flags`] reads and checks the configuration at start-up as
//! upstream's `RegisterCredentialProviderPlugins` (the bin dir and every binary must exist; a
//! bad file stops the agent).
//!
//! The agent runs as root and executes what the configuration names, so more is checked than
//! upstream does (`trust.rs`, as sshd's `StrictModes`): the configuration (a file, or a
//! directory and every file merged from it), the bin dir and each plugin, and every directory
//! above them up to `/`, must not be symbolic links, must be owned by root (or the agent's
//! uid) and writable by no one else (a sticky `/tmp` is refused); a plugin must be a regular
//! file with an execute bit. A path that fails stops the agent at start with an error naming
//! it, its owner and mode, and what was expected. The plugin is checked again before each exec
//! and the checked file is what is executed (through its descriptor); one that became unsafe
//! fails that lookup, counted in `kubelet_credential_provider_plugin_errors_total`
//! (`metrics.rs`, upstream's plugin metrics). [`CredentialProviders::lookup`] is upstream's
//! `externalCredentialProviderKeyring.Lookup`: every provider's credentials for the image
//! (from its cache, or from one exec shared by the pulls of the same image at the same time,
//! upstream's singleflight) go into one keyring, matched to the image as a docker config's
//! entries are (`keyring.rs`). A plugin that fails gives no credentials and the pull goes on
//! without them, as upstream; its error is logged and returned so that the pull's failure can
//! say why no credentials were presented.
//!
//! Not here: the config file's decoding and validation (`config.rs`), the exec (`exec.rs`), the
//! cache (`cache.rs`); the pull and the order of the keyrings (`images.rs`: the pod's pull
//! secrets first, then the providers', as upstream's `MakeDockerKeyring` union). Service account
//! tokens for plugins (`tokenAttributes`) are not supported.

pub mod cache;
pub mod config;
pub mod duration;
pub mod exec;
pub mod metrics;
pub mod trust;

use std::{
    collections::HashMap,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use self::{
    cache::{CacheKey, ExpiringCache},
    config::{ConfigError, ProviderConfig},
    exec::{AuthConfig, CacheKeyType, ExecError, ExecPlugin, Response},
    metrics::PluginMetrics,
    trust::{Trust, TrustError, What},
};
use super::keyring::{self, Credential, Keyring};
use crate::lock::MutexExt as _;

/// The most cached responses per provider (upstream: unbounded).
pub const MAX_CACHE_ENTRIES: usize = 256;
/// The most execs of one provider's plugin at a time (upstream: unbounded); the pulls of
/// other images wait for a slot.
pub const MAX_CONCURRENT_EXECS: usize = 4;
/// The longest a response is cached: a plugin's duration may be anything up to Go's ~292
/// years, which a monotonic clock cannot always add.
const MAX_CACHE_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

type Auth = Arc<Vec<(String, AuthConfig)>>;
type Flight = Arc<tokio::sync::OnceCell<Result<Response, ExecError>>>;

/// The configured providers, in the config's order; none without the flags.
#[derive(Default)]
pub struct CredentialProviders {
    providers: Vec<PluginProvider>,
    /// Absent without providers: nothing to record.
    metrics: Option<PluginMetrics>,
}

/// The providers' credentials for an image, and the providers that failed.
#[derive(Debug, Default)]
pub struct Provided {
    pub credentials: Vec<Credential>,
    pub failures: Vec<ExecError>,
}

impl Provided {
    /// `message` (a failed pull's) with why the providers gave no credentials, if any failed.
    pub fn explain(&self, message: String) -> String {
        if self.failures.is_empty() {
            return message;
        }
        let failures: Vec<String> = self.failures.iter().map(ToString::to_string).collect();
        format!("{message}; {}", failures.join("; "))
    }
}

impl CredentialProviders {
    /// No providers.
    pub fn none() -> Self {
        CredentialProviders::default()
    }

    /// The providers of `--image-credential-provider-config` with binaries in
    /// `--image-credential-provider-bin-dir` (both or neither, as upstream: one alone fails
    /// upstream's registration), every path checked as `trust.rs` says.
    pub fn from_flags(config: Option<&Path>, bin_dir: Option<&Path>) -> Result<Self, ConfigError> {
        match (config, bin_dir) {
            (None, None) => Ok(CredentialProviders::none()),
            (Some(config), Some(bin_dir)) => Self::load(config, bin_dir, &Trust::system()),
            _ => Err(ConfigError::OnlyOne),
        }
    }

    /// Upstream `RegisterCredentialProviderPlugins`, each path checked against `trust`.
    pub fn load(config_path: &Path, bin_dir: &Path, trust: &Trust) -> Result<Self, ConfigError> {
        // The path itself missing keeps upstream's words; anything else is the check's.
        let missing = |error: TrustError, what: What, missing: ConfigError| match error {
            TrustError::NotFound { what: noun, .. } if noun == what.noun() => missing,
            error => ConfigError::Untrusted(error),
        };
        trust.open(bin_dir, What::BinDir).map_err(|e| {
            missing(
                e,
                What::BinDir,
                ConfigError::NoBinDir {
                    path: bin_dir.to_owned(),
                },
            )
        })?;
        let configs = config::read(config_path, trust)?;
        let metrics = PluginMetrics::new().map_err(ConfigError::Metrics)?;
        let mut providers = Vec::with_capacity(configs.len());
        for provider in &configs {
            let plugin = ExecPlugin::new(bin_dir, provider, trust.clone());
            // Upstream's `exec.LookPath`, without following links and with the ownership checks.
            trust.open(&plugin.path, What::Plugin).map_err(|e| {
                missing(
                    e,
                    What::Plugin,
                    ConfigError::NoBinary {
                        path: plugin.path.clone(),
                    },
                )
            })?;
            tracing::info!(provider = %provider.name, path = %plugin.path.display(), "registered credential provider");
            providers.push(PluginProvider::new(plugin, provider, metrics.clone()));
        }
        Ok(CredentialProviders {
            providers,
            metrics: Some(metrics),
        })
    }

    /// Puts the plugins' metrics in `registry` (nothing without providers).
    pub fn register_metrics(
        &self,
        registry: &prometheus::Registry,
    ) -> Result<(), prometheus::Error> {
        match &self.metrics {
            Some(metrics) => metrics.register(registry),
            None => Ok(()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// The credentials the providers give for `repository` (an image without tag or digest,
    /// as [`keyring::repository_of`] makes it; upstream passes the same to plugins), most
    /// specific match first, at most [`keyring::MAX_CREDENTIALS`].
    pub async fn lookup(&self, repository: &str) -> Provided {
        let mut provided = Provided::default();
        if self.providers.is_empty() {
            return provided;
        }
        let mut keyring = Keyring::default();
        for provider in &self.providers {
            match provider.provide(repository).await {
                Ok(auth) => {
                    for (location, auth) in auth.iter() {
                        keyring.add(
                            location,
                            Credential {
                                username: auth.username.clone(),
                                password: auth.password.clone(),
                                source: format!("credential provider {}", provider.plugin.name),
                            },
                        );
                    }
                }
                Err(error) => {
                    tracing::warn!(
                        provider = %provider.plugin.name,
                        image = repository,
                        %error,
                        "Failed getting credential from external registry credential provider"
                    );
                    provided.failures.push(error);
                }
            }
        }
        provided.credentials = keyring.lookup(repository);
        provided
    }
}

/// One configured provider (upstream `pluginProvider`).
struct PluginProvider {
    plugin: ExecPlugin,
    match_images: Vec<String>,
    default_cache_duration: Duration,
    cache: Mutex<ExpiringCache<Auth>>,
    /// The exec under way per image, shared by the pulls asking meanwhile.
    in_flight: Mutex<HashMap<String, Flight>>,
    execs: tokio::sync::Semaphore,
    metrics: PluginMetrics,
}

impl PluginProvider {
    fn new(plugin: ExecPlugin, config: &ProviderConfig, metrics: PluginMetrics) -> Self {
        PluginProvider {
            plugin,
            match_images: config.match_images.clone(),
            default_cache_duration: config.default_cache_duration,
            cache: Mutex::new(ExpiringCache::new(MAX_CACHE_ENTRIES)),
            in_flight: Mutex::new(HashMap::new()),
            execs: tokio::sync::Semaphore::new(MAX_CONCURRENT_EXECS),
            metrics,
        }
    }

    /// Upstream `isImageAllowed`.
    fn matches(&self, image: &str) -> bool {
        self.match_images
            .iter()
            .any(|glob| keyring::urls_match(glob, image))
    }

    /// Upstream `pluginProvider.provide`: nothing for an image outside `matchImages`, else
    /// the cached credentials or the plugin's.
    async fn provide(&self, image: &str) -> Result<Auth, ExecError> {
        if !self.matches(image) {
            return Ok(Auth::default());
        }
        let keys = CacheKey::lookup_order(image);
        if let Some(auth) = self.cache.lock_unpoisoned().get(&keys, Instant::now()) {
            return Ok(auth);
        }
        let flight = self
            .in_flight
            .lock_unpoisoned()
            .entry(image.to_owned())
            .or_default()
            .clone();
        let landed = Landed {
            in_flight: &self.in_flight,
            image,
            flight: &flight,
        };
        let result = flight
            .get_or_init(|| async {
                let _slot = self.execs.acquire().await.ok();
                let started = Instant::now();
                let result = self.plugin.run(image).await;
                self.metrics
                    .observe(&self.plugin.name, started.elapsed(), &result);
                result
            })
            .await
            .clone();
        drop(landed);
        let response = result?;
        let auth: Auth = Arc::new(response.auth);
        let duration = response
            .cache_duration
            .unwrap_or(self.default_cache_duration)
            .min(MAX_CACHE_DURATION);
        if !duration.is_zero() {
            let key = match response.cache_key_type {
                CacheKeyType::Image => CacheKey::Image(image.to_owned()),
                CacheKeyType::Registry => CacheKey::Registry(cache::registry_of(image).to_owned()),
                CacheKeyType::Global => CacheKey::Global,
            };
            let now = Instant::now();
            self.cache
                .lock_unpoisoned()
                .insert(key, auth.clone(), now + duration, now);
        }
        Ok(auth)
    }
}

/// Takes an image's exec out of the in-flight map when its first waiter is done with it (or
/// was cancelled), so that the map holds only the execs under way.
struct Landed<'a> {
    in_flight: &'a Mutex<HashMap<String, Flight>>,
    image: &'a str,
    flight: &'a Flight,
}

impl Drop for Landed<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock_unpoisoned();
        if in_flight
            .get(self.image)
            .is_some_and(|f| Arc::ptr_eq(f, self.flight))
        {
            in_flight.remove(self.image);
        }
    }
}

#[cfg(test)]
mod tests;
