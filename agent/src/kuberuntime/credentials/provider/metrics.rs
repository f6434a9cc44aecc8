//! The credential provider plugins' metrics, as upstream's
//! (`pkg/credentialprovider/plugin/metrics.go`): `kubelet_credential_provider_plugin_errors_total`
//! (a counter) and `kubelet_credential_provider_plugin_duration` (a histogram in seconds, the
//! default buckets 5ms–10s), both by `plugin_name` — a name from the node's configuration, so the
//! label is bounded by the providers configured. Upstream counts a failed run (the exec failed,
//! timed out or exited non-zero) and times each run; swiftlet counts as errors too a plugin
//! refused before its exec (`trust.rs`) and one stopped at the response bound.
//!
//! Not here: upstream's `kubelet_credential_provider_config_info` (the configuration's hash).

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::exec::ExecError;

#[derive(Clone)]
pub struct PluginMetrics {
    pub errors: IntCounterVec,
    pub duration: HistogramVec,
}

impl PluginMetrics {
    /// The metrics, not yet in a registry (the providers are loaded before the registry is).
    pub fn new() -> Result<PluginMetrics, prometheus::Error> {
        let errors = IntCounterVec::new(
            Opts::new(
                "kubelet_credential_provider_plugin_errors_total",
                "Number of errors from credential provider plugin",
            ),
            &["plugin_name"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "kubelet_credential_provider_plugin_duration",
                "Duration of execution in seconds for credential provider plugin",
            )
            .buckets(prometheus::DEFAULT_BUCKETS.to_vec()),
            &["plugin_name"],
        )?;
        Ok(PluginMetrics { errors, duration })
    }

    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.errors.clone()))?;
        registry.register(Box::new(self.duration.clone()))
    }

    /// Records one lookup's run of `plugin`: its duration if it ran, an error if it failed.
    pub fn observe<T>(&self, plugin: &str, took: Duration, result: &Result<T, ExecError>) {
        let ran = match result {
            Ok(_) => true,
            Err(error) => {
                if error.is_plugin_error() {
                    self.errors.with_label_values(&[plugin]).inc();
                }
                error.ran()
            }
        };
        if ran {
            self.duration
                .with_label_values(&[plugin])
                .observe(took.as_secs_f64());
        }
    }
}
