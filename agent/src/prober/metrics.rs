//! The prober's metrics, with the kubelet's names and labels: `prober_probe_total` and
//! `prober_probe_duration_seconds` (the latter for probes that passed or could not be judged,
//! as upstream).

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

#[derive(Clone)]
pub struct ProberMetrics {
    pub probe_total: IntCounterVec,
    pub probe_duration: HistogramVec,
}

impl ProberMetrics {
    pub fn register(registry: &Registry) -> Result<ProberMetrics, prometheus::Error> {
        let metrics = ProberMetrics::unregistered()?;
        registry.register(Box::new(metrics.probe_total.clone()))?;
        registry.register(Box::new(metrics.probe_duration.clone()))?;
        Ok(metrics)
    }

    /// For tests that do not scrape.
    pub fn unregistered() -> Result<ProberMetrics, prometheus::Error> {
        Ok(ProberMetrics {
            probe_total: IntCounterVec::new(
                Opts::new(
                    "prober_probe_total",
                    "Cumulative number of a liveness, readiness or startup probe for a container \
                     by result.",
                ),
                &[
                    "probe_type",
                    "result",
                    "container",
                    "pod",
                    "namespace",
                    "pod_uid",
                ],
            )?,
            probe_duration: HistogramVec::new(
                HistogramOpts::new(
                    "prober_probe_duration_seconds",
                    "Duration in seconds for a probe response.",
                ),
                &["probe_type", "container", "pod", "namespace"],
            )?,
        })
    }
}
