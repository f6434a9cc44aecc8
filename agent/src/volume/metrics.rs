//! The volume manager's metrics, with upstream's names: volumes in the desired and actual state
//! of world per plugin, and how long each set-up and tear-down took.

use prometheus::{HistogramOpts, HistogramVec, IntGaugeVec, Opts, Registry};

use super::paths::Plugin;

#[derive(Clone)]
pub struct VolumeMetrics {
    /// Upstream `volume_manager_total_volumes{plugin_name, state}`.
    pub total_volumes: IntGaugeVec,
    /// Upstream `storage_operation_duration_seconds{operation_name, volume_plugin, status}`.
    pub operation_duration: HistogramVec,
}

impl VolumeMetrics {
    pub fn register(registry: &Registry) -> Result<VolumeMetrics, prometheus::Error> {
        let total_volumes = IntGaugeVec::new(
            Opts::new(
                "volume_manager_total_volumes",
                "Number of volumes in Volume Manager",
            ),
            &["plugin_name", "state"],
        )?;
        let operation_duration = HistogramVec::new(
            HistogramOpts::new(
                "storage_operation_duration_seconds",
                "Storage operation duration",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0,
            ]),
            &["operation_name", "volume_plugin", "status"],
        )?;
        registry.register(Box::new(total_volumes.clone()))?;
        registry.register(Box::new(operation_duration.clone()))?;
        Ok(VolumeMetrics {
            total_volumes,
            operation_duration,
        })
    }

    /// One set-up (`volume_mount`) or tear-down (`volume_unmount`).
    pub fn operation(&self, name: &str, plugin: Plugin, ok: bool, seconds: f64) {
        self.operation_duration
            .with_label_values(&[
                name,
                plugin.name(),
                if ok { "success" } else { "fail-unknown" },
            ])
            .observe(seconds);
    }

    /// The counts of both states, per plugin.
    pub fn totals(&self, desired: &[Plugin], actual: &[Plugin]) {
        for plugin in Plugin::ALL {
            for (state, list) in [
                ("desired_state_of_world", desired),
                ("actual_state_of_world", actual),
            ] {
                let n = list.iter().filter(|p| **p == plugin).count();
                self.total_volumes
                    .with_label_values(&[plugin.name(), state])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }
}
