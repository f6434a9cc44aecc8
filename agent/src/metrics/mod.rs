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
    /// `/metrics/probes`: the prober's series, kept apart as upstream keeps them (`server.go`,
    /// `InstallDefaultHandlers`: its own registry with `process_start_time_seconds`).
    pub probes: Registry,
    pub kernel: KernelMetrics,
    pub server: ServerMetrics,
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let kernel = KernelMetrics::register(&registry)?;
        let server = ServerMetrics::register(&registry)?;
        // `process_*` (CPU, memory, descriptors, start time), as every Go binary exposes them.
        registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        registry.register(Box::new(build_info()?))?;
        let probes = Registry::new();
        probes.register(Box::new(StartTime(
            prometheus::process_collector::ProcessCollector::for_self(),
        )))?;
        Ok(Metrics {
            registry,
            probes,
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
        render(&self.registry)
    }

    /// `/metrics/probes`.
    pub fn render_probes(&self) -> Result<String, prometheus::Error> {
        render(&self.probes)
    }
}

fn render(registry: &Registry) -> Result<String, prometheus::Error> {
    let mut buf = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

const START_TIME: &str = "process_start_time_seconds";

/// The process collector's `process_start_time_seconds` alone (upstream
/// `RegisterProcessStartTime` on the probes registry).
struct StartTime(prometheus::process_collector::ProcessCollector);

impl prometheus::core::Collector for StartTime {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.0
            .desc()
            .into_iter()
            .filter(|d| d.fq_name == START_TIME)
            .collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.0
            .collect()
            .into_iter()
            .filter(|f| f.name() == START_TIME)
            .collect()
    }
}

/// The git commit the agent was built from (`unknown` from a tarball without one).
pub const GIT_COMMIT: &str = env!("SWIFTLET_GIT_COMMIT");
/// The compiler's version.
pub const RUST_VERSION: &str = env!("SWIFTLET_RUSTC_VERSION");

/// `swiftlet_build_info{version,git_commit,rust_version}` = 1, as the kubelet's
/// `kubernetes_build_info` (component-base `metrics/prometheus/version`, `RegisterBuildInfo`).
fn build_info() -> Result<prometheus::IntGaugeVec, prometheus::Error> {
    let gauge = prometheus::IntGaugeVec::new(
        prometheus::Opts::new(
            "swiftlet_build_info",
            "A metric with a constant '1' value labeled by the agent's version, the git commit \
             it was built from and the Rust compiler's version.",
        ),
        &["version", "git_commit", "rust_version"],
    )?;
    gauge
        .with_label_values(&[env!("CARGO_PKG_VERSION"), GIT_COMMIT, RUST_VERSION])
        .set(1);
    Ok(gauge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_has_process_and_build_info() {
        let text = Metrics::new().expect("metrics").render().expect("render");
        for family in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                text.lines().any(|l| l.starts_with(&format!("{family} "))),
                "{family} missing:\n{text}"
            );
        }
        let line = text
            .lines()
            .find(|l| l.starts_with("swiftlet_build_info{"))
            .expect("build info");
        assert!(line.ends_with("} 1"), "{line}");
        assert!(
            line.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
            "{line}"
        );
        assert!(
            line.contains(&format!("git_commit=\"{GIT_COMMIT}\"")),
            "{line}"
        );
        assert!(
            !RUST_VERSION.is_empty() && RUST_VERSION != "unknown",
            "{RUST_VERSION}"
        );
    }

    #[test]
    fn the_probes_registry_has_only_the_start_time_of_the_process() {
        let text = Metrics::new()
            .expect("metrics")
            .render_probes()
            .expect("render");
        let families: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split([' ', '{']).next())
            .collect();
        assert_eq!(families, [START_TIME], "{text}");
    }
}
