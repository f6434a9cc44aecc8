//! The kubelet core's metrics, with the kubelet's names: how long pods take to start and how long
//! each pod worker sync takes.

use prometheus::{Histogram, HistogramOpts, HistogramVec, Registry};

#[derive(Clone)]
pub struct KubeletMetrics {
    /// From the agent first seeing a pod to the pod running.
    pub pod_start_duration: Histogram,
    /// One pod worker sync, by what it was (`sync`, `terminating`, `terminated`).
    pub pod_worker_duration: HistogramVec,
}

impl KubeletMetrics {
    pub fn register(registry: &Registry) -> Result<KubeletMetrics, prometheus::Error> {
        let pod_start_duration = Histogram::with_opts(
            HistogramOpts::new(
                "kubelet_pod_start_duration_seconds",
                "Duration in seconds from kubelet seeing a pod for the first time to the pod \
                 starting to run",
            )
            .buckets(vec![
                0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0,
                240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
            ]),
        )?;
        let pod_worker_duration = HistogramVec::new(
            HistogramOpts::new(
                "kubelet_pod_worker_duration_seconds",
                "Duration in seconds to sync a single pod. Broken down by operation type: \
                 create, update, or sync",
            ),
            &["operation_type"],
        )?;
        registry.register(Box::new(pod_start_duration.clone()))?;
        registry.register(Box::new(pod_worker_duration.clone()))?;
        Ok(KubeletMetrics {
            pod_start_duration,
            pod_worker_duration,
        })
    }
}
