//! The CPU manager's metrics: upstream's (`kubelet_cpu_manager_pinning_requests_total`, ...
//! from `pkg/kubelet/metrics`), swiftlet's apply and exclusivity counters, and — read from the
//! scheduler audit's kernel maps at scrape time — foreign time on exclusive CPUs and run-queue
//! latency per container.

use std::{
    collections::BTreeMap,
    sync::{Arc, Weak},
};

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    core::{Collector, Desc},
    proto::{self, MetricFamily, MetricType},
};

use super::manager::{ContainerRef, CpuManager};
use crate::kernel::RunqHistogram;

#[derive(Clone)]
pub struct CpuManagerMetrics {
    pub pinning_requests: IntCounter,
    pub pinning_errors: IntCounter,
    pub shared_pool_millicores: IntGauge,
    pub exclusive_cpus: IntGauge,
    /// cpusets written through CRI, by what triggered the apply (`event`, `reconcile`).
    pub updates: IntCounterVec,
    pub update_errors: IntCounter,
    pub apply_duration: HistogramVec,
    pub violations: IntCounter,
    pub checkpoint_errors: IntCounter,
}

impl CpuManagerMetrics {
    pub fn register(registry: &Registry) -> Result<CpuManagerMetrics, prometheus::Error> {
        let m = CpuManagerMetrics {
            pinning_requests: IntCounter::new(
                "kubelet_cpu_manager_pinning_requests_total",
                "The number of cpu core allocations which required pinning.",
            )?,
            pinning_errors: IntCounter::new(
                "kubelet_cpu_manager_pinning_errors_total",
                "The number of cpu core allocations which required pinning failed.",
            )?,
            shared_pool_millicores: IntGauge::new(
                "kubelet_cpu_manager_shared_pool_size_millicores",
                "The size of the shared CPU pool for non-guaranteed QoS pods, in millicores.",
            )?,
            exclusive_cpus: IntGauge::new(
                "kubelet_cpu_manager_exclusive_cpu_allocation_count",
                "The total number of CPUs exclusively allocated to containers running on this \
                 node",
            )?,
            updates: IntCounterVec::new(
                Opts::new(
                    "swiftlet_cpu_manager_cpuset_updates_total",
                    "Container cpusets written through CRI UpdateContainerResources, by trigger \
                     (event: an assignment changed; reconcile: the periodic safety net).",
                ),
                &["trigger"],
            )?,
            update_errors: IntCounter::new(
                "swiftlet_cpu_manager_cpuset_update_errors_total",
                "Failed cpuset updates or container listings; the next reconcile retries.",
            )?,
            apply_duration: HistogramVec::new(
                HistogramOpts::new(
                    "swiftlet_cpu_manager_apply_duration_seconds",
                    "One pass bringing every running container's cpuset up to date, by trigger.",
                )
                .buckets(vec![
                    1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 0.1, 0.25, 0.5, 1.0,
                ]),
                &["trigger"],
            )?,
            violations: IntCounter::new(
                "swiftlet_cpu_manager_exclusivity_violations_total",
                "Audit periods in which another pod's container ran on an exclusive CPU after \
                 its assignment was applied everywhere.",
            )?,
            checkpoint_errors: IntCounter::new(
                "swiftlet_cpu_manager_checkpoint_errors_total",
                "Failed writes of the cpu_manager_state checkpoint.",
            )?,
        };
        registry.register(Box::new(m.pinning_requests.clone()))?;
        registry.register(Box::new(m.pinning_errors.clone()))?;
        registry.register(Box::new(m.shared_pool_millicores.clone()))?;
        registry.register(Box::new(m.exclusive_cpus.clone()))?;
        registry.register(Box::new(m.updates.clone()))?;
        registry.register(Box::new(m.update_errors.clone()))?;
        registry.register(Box::new(m.apply_duration.clone()))?;
        registry.register(Box::new(m.violations.clone()))?;
        registry.register(Box::new(m.checkpoint_errors.clone()))?;
        Ok(m)
    }
}

const FOREIGN: (&str, &str) = (
    "swiftlet_exclusive_cpu_foreign_seconds_total",
    "Time tasks of other cgroups ran on a container's exclusive CPU, by CPU and by intruder \
     (pod: another pod's container; other: system daemons and kernel threads).",
);
const RUNQ: (&str, &str) = (
    "swiftlet_runqueue_latency_seconds",
    "Time a container's tasks waited on a run queue between wakeup and running (log2 buckets).",
);
const CONTAINER_LABELS: [&str; 3] = ["namespace", "pod", "container"];

/// Reads the scheduler audit's maps at scrape time and names what it finds by container.
pub struct SchedCollector {
    manager: Weak<CpuManager>,
    descs: Vec<Desc>,
}

impl SchedCollector {
    pub fn new(manager: &Arc<CpuManager>) -> Result<SchedCollector, prometheus::Error> {
        let label = |names: &[&str]| names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let mut foreign_labels = label(&CONTAINER_LABELS);
        foreign_labels.extend(label(&["cpu", "intruder"]));
        let descs = vec![
            Desc::new(
                FOREIGN.0.into(),
                FOREIGN.1.into(),
                foreign_labels,
                Default::default(),
            )?,
            Desc::new(
                RUNQ.0.into(),
                RUNQ.1.into(),
                label(&CONTAINER_LABELS),
                Default::default(),
            )?,
        ];
        Ok(SchedCollector {
            manager: Arc::downgrade(manager),
            descs,
        })
    }
}

impl Collector for SchedCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Some(manager) = self.manager.upgrade() else {
            return Vec::new();
        };
        let Some(audit) = manager.audit() else {
            return Vec::new();
        };
        let by_cgroup: BTreeMap<u64, ContainerRef> = manager
            .containers()
            .into_values()
            .filter_map(|c| Some((c.cgroup_id?, c)))
            .collect();
        let mut families = Vec::new();
        match audit.foreign() {
            Ok(runs) => {
                let mut sums: BTreeMap<(u64, u32, &str), u64> = BTreeMap::new();
                for run in &runs {
                    let class = if by_cgroup.contains_key(&run.intruder) {
                        "pod"
                    } else {
                        "other"
                    };
                    *sums.entry((run.owner, run.cpu, class)).or_default() += run.ns;
                }
                let mut family = family(FOREIGN, MetricType::COUNTER);
                for ((owner, cpu, class), ns) in sums {
                    let Some(c) = by_cgroup.get(&owner) else {
                        continue;
                    };
                    let mut m = metric(c, &[("cpu", &cpu.to_string()), ("intruder", class)]);
                    let mut counter = proto::Counter::default();
                    counter.set_value(ns as f64 / 1e9);
                    m.set_counter(counter);
                    family.mut_metric().push(m);
                }
                families.push(family);
            }
            Err(e) => tracing::debug!(error = %e, "scheduler audit: foreign time unreadable"),
        }
        match audit.runqueue() {
            Ok(hists) => {
                let mut family = family(RUNQ, MetricType::HISTOGRAM);
                for (cgroup, hist) in &hists {
                    let Some(c) = by_cgroup.get(cgroup) else {
                        continue;
                    };
                    let mut m = metric(c, &[]);
                    m.set_histogram(histogram(hist));
                    family.mut_metric().push(m);
                }
                families.push(family);
            }
            Err(e) => tracing::debug!(error = %e, "scheduler audit: run-queue latency unreadable"),
        }
        families
    }
}

fn family((name, help): (&str, &str), kind: MetricType) -> MetricFamily {
    let mut f = MetricFamily::default();
    f.set_name(name.to_owned());
    f.set_help(help.to_owned());
    f.set_field_type(kind);
    f
}

fn metric(c: &ContainerRef, extra: &[(&str, &str)]) -> proto::Metric {
    let pairs = [
        ("namespace", c.namespace.as_str()),
        ("pod", c.pod_name.as_str()),
        ("container", c.container.as_str()),
    ];
    let mut m = proto::Metric::default();
    let labels = pairs
        .iter()
        .chain(extra)
        .map(|(k, v)| {
            let mut l = proto::LabelPair::default();
            l.set_name((*k).to_owned());
            l.set_value((*v).to_owned());
            l
        })
        .collect();
    m.set_label(labels);
    m
}

fn histogram(hist: &RunqHistogram) -> proto::Histogram {
    let mut h = proto::Histogram::default();
    let mut cumulative = 0;
    let mut buckets = Vec::new();
    for (count, bound) in hist
        .buckets
        .iter()
        .zip(RunqHistogram::upper_bounds_seconds())
    {
        cumulative += count;
        if bound.is_finite() {
            let mut b = proto::Bucket::default();
            b.set_cumulative_count(cumulative);
            b.set_upper_bound(bound);
            buckets.push(b);
        }
    }
    h.set_bucket(buckets);
    h.set_sample_count(hist.count());
    h.set_sample_sum(hist.sum_ns as f64 / 1e9);
    h
}
