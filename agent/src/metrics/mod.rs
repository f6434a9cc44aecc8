//! One Prometheus registry for the agent, with one metrics struct per subsystem registered in it.
//! Labels are bounded (event kinds, never pids or paths).

mod kernel;

pub use kernel::{KernelCountersCollector, KernelMetrics};
use prometheus::{Encoder as _, Registry, TextEncoder};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub kernel: KernelMetrics,
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let kernel = KernelMetrics::register(&registry)?;
        Ok(Metrics { registry, kernel })
    }

    /// The Prometheus text exposition of everything registered.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}
