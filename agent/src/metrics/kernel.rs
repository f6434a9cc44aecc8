//! Metrics of the kernel event pipeline: what userspace received and how late, and — read from the
//! programs' own per-CPU counters at scrape time — what the kernel submitted, lost and failed on.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
    core::{Collector, Desc},
    proto::MetricFamily,
};
use swiftlet_common::EventKind;

use crate::kernel::{CounterReader, EventBody, KernelEvent};

#[derive(Clone)]
pub struct KernelMetrics {
    pub received: IntCounterVec,
    pub latency: HistogramVec,
    pub lost_notified: IntCounter,
    /// Reclaim calls the programs' rate limit skipped, as the pressure records report them.
    pub pressure_suppressed: IntCounterVec,
}

impl KernelMetrics {
    pub fn register(registry: &Registry) -> Result<KernelMetrics, prometheus::Error> {
        let received = IntCounterVec::new(
            Opts::new(
                "swiftlet_kernel_events_received_total",
                "Kernel events decoded by the agent, by kind.",
            ),
            &["kind"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "swiftlet_kernel_event_delivery_seconds",
                "Time from the kernel seeing an event to the agent decoding it, by kind.",
            )
            .buckets(vec![
                10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 50e-3,
                0.25, 1.0,
            ]),
            &["kind"],
        )?;
        let lost_notified = IntCounter::new(
            "swiftlet_kernel_events_lost_notified_total",
            "Losses the agent learnt of from the ring buffer records themselves.",
        )?;
        let pressure_suppressed = IntCounterVec::new(
            Opts::new(
                "swiftlet_kernel_pressure_suppressed_total",
                "Memory reclaim calls the eBPF programs' rate limit folded into the next pressure \
                 event (not losses), by source.",
            ),
            &["source"],
        )?;
        registry.register(Box::new(received.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(lost_notified.clone()))?;
        registry.register(Box::new(pressure_suppressed.clone()))?;
        Ok(KernelMetrics {
            received,
            latency,
            lost_notified,
            pressure_suppressed,
        })
    }

    pub fn observe(&self, event: &KernelEvent) {
        let kind = event.body.kind().as_str();
        self.received.with_label_values(&[kind]).inc();
        let seconds = event.received_ns.saturating_sub(event.ts_ns) as f64 / 1e9;
        self.latency.with_label_values(&[kind]).observe(seconds);
        if let EventBody::Pressure(pressure) = &event.body {
            self.pressure_suppressed
                .with_label_values(&[pressure.source.as_str()])
                .inc_by(pressure.suppressed);
        }
    }
}

/// Exposes the programs' counters (`swiftlet_kernel_events_{submitted,lost}_total`,
/// `swiftlet_kernel_event_errors_total`) by reading the per-CPU map when scraped.
pub struct KernelCountersCollector {
    reader: CounterReader,
    descs: Vec<Desc>,
}

const COUNTER_NAMES: [(&str, &str); 3] = [
    (
        "swiftlet_kernel_events_submitted_total",
        "Events the eBPF programs wrote to the ring buffer, by kind.",
    ),
    (
        "swiftlet_kernel_events_lost_total",
        "Events the eBPF programs could not fit into the ring buffer, by kind.",
    ),
    (
        "swiftlet_kernel_event_errors_total",
        "Events the eBPF programs gave up on because a kernel read failed, by kind.",
    ),
];

impl KernelCountersCollector {
    pub fn new(reader: CounterReader) -> Result<Self, prometheus::Error> {
        let descs = COUNTER_NAMES
            .iter()
            .map(|(name, help)| {
                Desc::new(
                    (*name).to_owned(),
                    (*help).to_owned(),
                    vec!["kind".to_owned()],
                    Default::default(),
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(KernelCountersCollector { reader, descs })
    }
}

impl Collector for KernelCountersCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let counters = match self.reader.read() {
            Ok(counters) => counters,
            Err(error) => {
                tracing::warn!(%error, "cannot read the kernel event counters");
                return Vec::new();
            }
        };
        let mut families = Vec::new();
        for (i, (name, help)) in COUNTER_NAMES.iter().enumerate() {
            let Ok(vec) = IntCounterVec::new(Opts::new(*name, *help), &["kind"]) else {
                continue;
            };
            for kind in EventKind::ALL {
                let c = counters.get(kind);
                let value = [c.submitted, c.lost, c.errors][i];
                vec.with_label_values(&[kind.as_str()]).inc_by(value);
            }
            families.extend(vec.collect());
        }
        families
    }
}
