//! Metrics of CRI calls, with the kubelet's names, help texts, label and buckets
//! (`pkg/kubelet/metrics/metrics.go`: `RuntimeOperations`, `RuntimeOperationsDuration`,
//! `RuntimeOperationsErrors`, recorded as `instrumented_services.go` does): every call counts
//! once and is timed; a failed one also counts as an error. `operation_type` takes the bounded
//! set of [`Operation::metric_label`] values.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use super::Operation;

#[derive(Clone)]
pub struct RuntimeMetrics {
    operations: IntCounterVec,
    duration: HistogramVec,
    errors: IntCounterVec,
}

impl RuntimeMetrics {
    pub fn register(registry: &Registry) -> Result<RuntimeMetrics, prometheus::Error> {
        let metrics = RuntimeMetrics::unregistered()?;
        registry.register(Box::new(metrics.operations.clone()))?;
        registry.register(Box::new(metrics.duration.clone()))?;
        registry.register(Box::new(metrics.errors.clone()))?;
        Ok(metrics)
    }

    /// Metrics that are recorded but exposed nowhere (tools and tests that have no registry).
    pub fn unregistered() -> Result<RuntimeMetrics, prometheus::Error> {
        let operations = IntCounterVec::new(
            Opts::new(
                "kubelet_runtime_operations_total",
                "Cumulative number of runtime operations by operation type.",
            ),
            &["operation_type"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "kubelet_runtime_operations_duration_seconds",
                "Duration in seconds of runtime operations. Broken down by operation type.",
            )
            // The kubelet's ExponentialBuckets(.005, 2.5, 14): 5 ms to ~4.4 h.
            .buckets(prometheus::exponential_buckets(0.005, 2.5, 14)?),
            &["operation_type"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "kubelet_runtime_operations_errors_total",
                "Cumulative number of runtime operation errors by operation type.",
            ),
            &["operation_type"],
        )?;
        Ok(RuntimeMetrics {
            operations,
            duration,
            errors,
        })
    }

    /// Records one finished call.
    pub fn observe(&self, operation: Operation, elapsed: Duration, failed: bool) {
        let label = [operation.metric_label()];
        self.operations.with_label_values(&label).inc();
        self.duration
            .with_label_values(&label)
            .observe(elapsed.as_secs_f64());
        if failed {
            self.errors.with_label_values(&label).inc();
        }
    }

    /// Calls of `operation` so far (tests and the status page).
    pub fn operations(&self, operation: Operation) -> u64 {
        self.operations
            .with_label_values(&[operation.metric_label()])
            .get()
    }

    /// Failed calls of `operation` so far.
    pub fn errors(&self, operation: Operation) -> u64 {
        self.errors
            .with_label_values(&[operation.metric_label()])
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder as _, TextEncoder};

    #[test]
    fn calls_are_counted_timed_and_failures_counted_with_kubelet_names() {
        let registry = Registry::new();
        let m = RuntimeMetrics::register(&registry).unwrap();
        m.observe(Operation::RunPodSandbox, Duration::from_millis(200), false);
        m.observe(Operation::RunPodSandbox, Duration::from_millis(300), true);
        assert_eq!(m.operations(Operation::RunPodSandbox), 2);
        assert_eq!(m.errors(Operation::RunPodSandbox), 1);
        assert_eq!(m.errors(Operation::Version), 0);

        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains(r#"kubelet_runtime_operations_total{operation_type="run_podsandbox"} 2"#)
        );
        assert!(text.contains(
            r#"kubelet_runtime_operations_errors_total{operation_type="run_podsandbox"} 1"#
        ));
        assert!(text.contains(
            r#"kubelet_runtime_operations_duration_seconds_bucket{operation_type="run_podsandbox",le="0.005"} 0"#
        ));
        assert!(text.contains(
            r#"kubelet_runtime_operations_duration_seconds_count{operation_type="run_podsandbox"} 2"#
        ));
    }

    #[test]
    fn registering_twice_in_one_registry_fails() {
        let registry = Registry::new();
        RuntimeMetrics::register(&registry).unwrap();
        assert!(RuntimeMetrics::register(&registry).is_err());
    }
}
