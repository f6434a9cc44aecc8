//! The certificate managers' metrics, by upstream's names: the time left on the client and
//! serving certificates (`kubelet_certificate_manager_{client,server}_ttl_seconds`, computed
//! when scraped, negative once expired) and the failed renewals
//! (`kubelet_certificate_manager_client_expiration_renew_errors`,
//! `kubelet_server_expiration_renew_errors`).
//!
//! Upstream: `pkg/kubelet/certificate/kubelet.go` and `cmd/kubelet/app/server.go`
//! (`buildClientCertificateManager`'s `certificateRenewFailure`).

use std::{
    sync::{Arc, Mutex},
    time::SystemTime,
};

use prometheus::{
    IntCounter, Registry,
    core::{Collector, Desc},
    proto::MetricFamily,
};

use super::csr::Kind;
use crate::clock::Clock;

#[derive(Clone)]
pub struct CertificateMetrics {
    pub renew_errors: IntCounter,
    ttl: TtlCollector,
}

impl CertificateMetrics {
    pub fn new(kind: Kind, clock: Clock) -> Result<CertificateMetrics, prometheus::Error> {
        let (errors, ttl) = match kind {
            Kind::Client => (
                "kubelet_certificate_manager_client_expiration_renew_errors",
                "kubelet_certificate_manager_client_ttl_seconds",
            ),
            Kind::Serving => (
                "kubelet_server_expiration_renew_errors",
                "kubelet_certificate_manager_server_ttl_seconds",
            ),
        };
        let renew_errors = IntCounter::new(errors, "Counter of certificate renewal errors.")?;
        let gauge = prometheus::Gauge::new(
            ttl,
            format!(
                "Gauge of the TTL (time-to-live) of the Kubelet's {} certificate. The value is in \
                 seconds until certificate expiry (negative if already expired).",
                kind.name()
            ),
        )?;
        let desc = gauge.desc().into_iter().cloned().collect();
        Ok(CertificateMetrics {
            renew_errors,
            ttl: TtlCollector {
                gauge,
                desc,
                not_after: Arc::new(Mutex::new(None)),
                clock,
            },
        })
    }

    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.renew_errors.clone()))?;
        registry.register(Box::new(self.ttl.clone()))
    }

    pub fn set_not_after(&self, not_after: SystemTime) {
        if let Ok(mut slot) = self.ttl.not_after.lock() {
            *slot = Some(not_after);
        }
    }

    /// Seconds until the current certificate expires (0 without one).
    pub fn ttl_seconds(&self) -> f64 {
        self.ttl.seconds().unwrap_or(0.0)
    }
}

#[derive(Clone)]
struct TtlCollector {
    gauge: prometheus::Gauge,
    desc: Vec<Desc>,
    not_after: Arc<Mutex<Option<SystemTime>>>,
    clock: Clock,
}

impl TtlCollector {
    fn seconds(&self) -> Option<f64> {
        let not_after = (*self.not_after.lock().ok()?)?;
        let now = (self.clock)();
        Some(match not_after.duration_since(now) {
            Ok(left) => left.as_secs_f64(),
            Err(past) => -past.duration().as_secs_f64(),
        })
    }
}

impl Collector for TtlCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.desc.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(seconds) = self.seconds() else {
            return Vec::new();
        };
        self.gauge.set(seconds);
        self.gauge.collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_ttl_is_read_at_scrape_time_and_goes_negative() {
        let now = Arc::new(Mutex::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1000),
        ));
        let clock_now = now.clone();
        let clock: Clock = Arc::new(move || *clock_now.lock().expect("clock"));
        let metrics = CertificateMetrics::new(Kind::Serving, clock).expect("metrics");
        let registry = Registry::new();
        metrics.register(&registry).expect("register");
        assert!(
            registry
                .gather()
                .iter()
                .all(|f| f.name() != "kubelet_certificate_manager_server_ttl_seconds")
        );
        metrics.set_not_after(SystemTime::UNIX_EPOCH + Duration::from_secs(1100));
        let ttl = |registry: &Registry| {
            registry
                .gather()
                .into_iter()
                .find(|f| f.name() == "kubelet_certificate_manager_server_ttl_seconds")
                .map(|f| f.get_metric()[0].get_gauge().get_value())
        };
        assert_eq!(ttl(&registry), Some(100.0));
        *now.lock().expect("clock") += Duration::from_secs(150);
        assert_eq!(ttl(&registry), Some(-50.0));
        metrics.renew_errors.inc();
        assert!(
            registry
                .gather()
                .iter()
                .any(|f| f.name() == "kubelet_server_expiration_renew_errors")
        );
    }
}
