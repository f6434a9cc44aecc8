//! One Prometheus registry for the agent, with one metrics struct per subsystem registered in it.
//! Labels are bounded (event kinds; pods and containers, whose series go with them; never pids or
//! paths).

mod kernel;
mod psi;
mod server;

pub use kernel::{KernelCountersCollector, KernelMetrics};
use prometheus::{Encoder as _, Registry, TextEncoder};
pub use psi::{PressureLister, PsiCollector};
pub use server::ServerMetrics;

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub kernel: KernelMetrics,
    pub server: ServerMetrics,
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let kernel = KernelMetrics::register(&registry)?;
        let server = ServerMetrics::register(&registry)?;
        Ok(Metrics {
            registry,
            kernel,
            server,
        })
    }

    /// `swiftlet_pleg_mode{mode}` = 1 for the PLEG in use.
    pub fn pleg_mode(&self, mode: &str) -> Result<(), prometheus::Error> {
        let gauge = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "swiftlet_pleg_mode",
                "The PLEG in use (1): ebpf, evented, or relist (chosen, or fallen back to).",
            ),
            &["mode"],
        )?;
        gauge.with_label_values(&[mode]).set(1);
        self.registry.register(Box::new(gauge))
    }

    /// `swiftlet_oom_score_adj`: the agent's own oom_score_adj in force (absent if unreadable).
    pub fn oom_score_adj(&self, value: Option<i32>) -> Result<(), prometheus::Error> {
        let gauge = prometheus::IntGauge::new(
            "swiftlet_oom_score_adj",
            "The agent's own oom_score_adj in force (upstream's default -999; lowering it needs \
             CAP_SYS_RESOURCE).",
        )?;
        if let Some(value) = value {
            gauge.set(i64::from(value));
            self.registry.register(Box::new(gauge))?;
        }
        Ok(())
    }

    /// The Prometheus text exposition of everything registered.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}
