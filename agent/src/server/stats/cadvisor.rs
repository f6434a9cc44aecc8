//! `/metrics/cadvisor`: cAdvisor's container series as the kubelet serves them, for the node's
//! root cgroup (`id="/"`), each pod's cgroup (`container=""`, `image=""`, `name=""`) and each
//! running container, with the machine's `machine_cpu_cores` and `machine_memory_bytes`. Read at
//! each scrape from the cgroups `/stats/summary` reads (`cgroup.rs`), never a walk of a cgroup
//! tree: a container may create cgroups below its own and those are not looked at.
//!
//! Names, help texts, types and units are cAdvisor's (`metrics/prometheus.go`,
//! `metrics/prometheus_machine.go`); the base labels are the kubelet's
//! (`containerPrometheusLabelsFunc`, `pkg/kubelet/server/server.go`): `container`, `id` (the
//! cgroup path), `image`, `name` (the runtime's id, cAdvisor's first alias of a containerd
//! container), `namespace`, `pod`. As cAdvisor, the figures read from the cgroup's counters carry
//! the scrape's time as their timestamp; the spec and machine series carry none. A series whose
//! file is missing is left out, never reported as zero.
//!
//! Left out: network and filesystem series (the pods' network namespaces are the CNI's), the
//! sandbox (pause) containers' own cgroups, `container_processes` (it lists `cgroup.procs`, a
//! file a container can grow) and the load average.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use super::{
    SummaryProvider,
    cgroup::{CgroupReader, CpuFigures, CpuSpec, MemoryExtra, MemoryFigures, read_capped},
    running_containers,
};

/// The most of `/proc/stat` read to count CPUs: their lines come first.
const MAX_PROC_STAT_BYTES: u64 = 1 << 20;

/// The base labels of one cgroup's series.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    pub container: String,
    pub id: String,
    pub image: String,
    pub name: String,
    pub namespace: String,
    pub pod: String,
}

/// What one scrape read of one cgroup.
#[derive(Clone, Debug, Default)]
pub struct CgroupSample {
    pub labels: Labels,
    pub start: Option<SystemTime>,
    pub cpu: CpuFigures,
    pub cpu_spec: CpuSpec,
    pub memory: Option<MemoryFigures>,
    pub memory_extra: MemoryExtra,
    /// Tasks (threads) in the cgroup, `pids.current`.
    pub threads: Option<u64>,
}

/// The machine's figures and the labels cAdvisor's machine collector puts on them.
#[derive(Clone, Debug, Default)]
pub struct Machine {
    pub cores: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub boot_id: String,
    pub machine_id: String,
    pub system_uuid: String,
}

struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    metrics: Vec<Metric>,
}

/// The families of one scrape, in the order they are first named; empty ones are not written.
#[derive(Default)]
struct Families(Vec<Family>);

impl Families {
    fn add(
        &mut self,
        (name, kind, help): (&'static str, MetricType, &'static str),
        labels: &[(&str, &str)],
        value: f64,
        at: Option<i64>,
    ) {
        let family = match self.0.iter().position(|f| f.name == name) {
            Some(i) => &mut self.0[i],
            None => {
                self.0.push(Family {
                    name,
                    help,
                    kind,
                    metrics: Vec::new(),
                });
                let last = self.0.len() - 1;
                &mut self.0[last]
            }
        };
        let mut pairs: Vec<LabelPair> = labels
            .iter()
            .map(|(k, v)| {
                let mut pair = LabelPair::default();
                pair.set_name((*k).to_owned());
                pair.set_value((*v).to_owned());
                pair
            })
            .collect();
        // The Go client writes label pairs sorted by name.
        pairs.sort_by(|a, b| a.name().cmp(b.name()));
        let mut metric = Metric::from_label(pairs);
        match kind {
            MetricType::COUNTER => {
                let mut counter = Counter::default();
                counter.set_value(value);
                metric.set_counter(counter);
            }
            _ => {
                let mut gauge = Gauge::default();
                gauge.set_value(value);
                metric.set_gauge(gauge);
            }
        }
        if let Some(at) = at {
            metric.set_timestamp_ms(at);
        }
        family.metrics.push(metric);
    }

    /// Sorted as the Go registry gathers: families by name, series by label values.
    fn into_proto(self) -> Vec<MetricFamily> {
        let mut out: Vec<MetricFamily> = self
            .0
            .into_iter()
            .filter(|f| !f.metrics.is_empty())
            .map(|f| {
                let mut metrics = f.metrics;
                metrics.sort_by(|a, b| {
                    let values = |m: &Metric| -> Vec<String> {
                        m.get_label().iter().map(|l| l.value().to_owned()).collect()
                    };
                    values(a).cmp(&values(b))
                });
                let mut family = MetricFamily::default();
                family.set_name(f.name.to_owned());
                family.set_help(f.help.to_owned());
                family.set_field_type(f.kind);
                family.set_metric(metrics);
                family
            })
            .collect();
        out.sort_by(|a, b| a.name().cmp(b.name()));
        out
    }
}

type Desc = (&'static str, MetricType, &'static str);
const fn counter(name: &'static str, help: &'static str) -> Desc {
    (name, MetricType::COUNTER, help)
}
const fn gauge(name: &'static str, help: &'static str) -> Desc {
    (name, MetricType::GAUGE, help)
}

const CPU_USAGE: Desc = counter(
    "container_cpu_usage_seconds_total",
    "Cumulative cpu time consumed in seconds.",
);
const CPU_USER: Desc = counter(
    "container_cpu_user_seconds_total",
    "Cumulative user cpu time consumed in seconds.",
);
const CPU_SYSTEM: Desc = counter(
    "container_cpu_system_seconds_total",
    "Cumulative system cpu time consumed in seconds.",
);
const CFS_PERIODS: Desc = counter(
    "container_cpu_cfs_periods_total",
    "Number of elapsed enforcement period intervals.",
);
const CFS_THROTTLED_PERIODS: Desc = counter(
    "container_cpu_cfs_throttled_periods_total",
    "Number of throttled period intervals.",
);
const CFS_THROTTLED_SECONDS: Desc = counter(
    "container_cpu_cfs_throttled_seconds_total",
    "Total time duration the container has been throttled.",
);
const MEMORY_CACHE: Desc = gauge(
    "container_memory_cache",
    "Number of bytes of page cache memory.",
);
const MEMORY_RSS: Desc = gauge("container_memory_rss", "Size of RSS in bytes.");
const MEMORY_MAPPED: Desc = gauge(
    "container_memory_mapped_file",
    "Size of memory mapped files in bytes.",
);
const MEMORY_SWAP: Desc = gauge("container_memory_swap", "Container swap usage in bytes.");
const MEMORY_USAGE: Desc = gauge(
    "container_memory_usage_bytes",
    "Current memory usage in bytes, including all memory regardless of when it was accessed",
);
const MEMORY_MAX_USAGE: Desc = gauge(
    "container_memory_max_usage_bytes",
    "Maximum memory usage recorded in bytes",
);
const MEMORY_WORKING_SET: Desc = gauge(
    "container_memory_working_set_bytes",
    "Current working set in bytes.",
);
const OOM_EVENTS: Desc = counter(
    "container_oom_events_total",
    "Count of out of memory events observed for the container",
);
const THREADS: Desc = gauge(
    "container_threads",
    "Number of threads running inside the container",
);
const LAST_SEEN: Desc = gauge(
    "container_last_seen",
    "Last time a container was seen by the exporter",
);
const START_TIME: Desc = gauge(
    "container_start_time_seconds",
    "Start time of the container since unix epoch in seconds.",
);
const SPEC_CPU_PERIOD: Desc = gauge("container_spec_cpu_period", "CPU period of the container.");
const SPEC_CPU_QUOTA: Desc = gauge("container_spec_cpu_quota", "CPU quota of the container.");
const SPEC_CPU_SHARES: Desc = gauge("container_spec_cpu_shares", "CPU share of the container.");
const SPEC_MEMORY_LIMIT: Desc = gauge(
    "container_spec_memory_limit_bytes",
    "Memory limit for the container.",
);
const SCRAPE_ERROR: Desc = gauge(
    "container_scrape_error",
    "1 if there was an error while getting container metrics, 0 otherwise",
);
const MACHINE_CORES: Desc = gauge("machine_cpu_cores", "Number of logical CPU cores.");
const MACHINE_MEMORY: Desc = gauge(
    "machine_memory_bytes",
    "Amount of memory installed on the machine.",
);

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The series of `samples` and `machine`, read at `now`. Upstream: cAdvisor's
/// `PrometheusCollector.collectContainersInfo` and `PrometheusMachineCollector.collectMachineInfo`.
pub fn families(samples: &[CgroupSample], machine: &Machine, now: SystemTime) -> Vec<MetricFamily> {
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let at = Some(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX));
    let mut out = Families::default();
    for sample in samples {
        let l = &sample.labels;
        let base = [
            ("container", l.container.as_str()),
            ("id", l.id.as_str()),
            ("image", l.image.as_str()),
            ("name", l.name.as_str()),
            ("namespace", l.namespace.as_str()),
            ("pod", l.pod.as_str()),
        ];
        let mut put = |desc: Desc, value: Option<f64>, at: Option<i64>| {
            if let Some(value) = value {
                out.add(desc, &base, value, at);
            }
        };

        put(START_TIME, sample.start.map(unix_seconds), None);
        let spec = &sample.cpu_spec;
        put(SPEC_CPU_PERIOD, spec.period_us.map(|v| v as f64), None);
        put(SPEC_CPU_QUOTA, spec.quota_us.map(|v| v as f64), None);
        put(SPEC_CPU_SHARES, spec.shares.map(|v| v as f64), None);
        put(
            SPEC_MEMORY_LIMIT,
            sample.memory_extra.spec_limit.map(|v| v as f64),
            None,
        );

        put(LAST_SEEN, Some(since_epoch.as_secs() as f64), at);
        let cpu = &sample.cpu;
        put(CPU_USER, cpu.user_ns.map(seconds), at);
        put(CPU_SYSTEM, cpu.system_ns.map(seconds), at);
        // cAdvisor's CFS series exist only for a cgroup with a quota.
        if spec.quota_us.is_some() {
            put(CFS_PERIODS, cpu.periods.map(|v| v as f64), at);
            put(
                CFS_THROTTLED_PERIODS,
                cpu.throttled_periods.map(|v| v as f64),
                at,
            );
            put(CFS_THROTTLED_SECONDS, cpu.throttled_ns.map(seconds), at);
        }
        if let Some(m) = &sample.memory {
            put(MEMORY_CACHE, m.cache.map(|v| v as f64), at);
            put(MEMORY_RSS, m.rss.map(|v| v as f64), at);
            put(MEMORY_MAPPED, m.mapped_file.map(|v| v as f64), at);
            put(MEMORY_USAGE, m.usage.map(|v| v as f64), at);
            put(MEMORY_WORKING_SET, m.working_set.map(|v| v as f64), at);
        }
        let extra = &sample.memory_extra;
        put(MEMORY_SWAP, extra.swap.map(|v| v as f64), at);
        put(MEMORY_MAX_USAGE, extra.max_usage.map(|v| v as f64), at);
        put(OOM_EVENTS, extra.oom_kills.map(|v| v as f64), at);
        put(THREADS, sample.threads.map(|v| v as f64), at);

        // Without per-CPU figures (the kubelet does not collect them) cAdvisor writes the total
        // under `cpu="total"`, and nothing while it is still zero.
        if let Some(usage) = cpu.usage_ns.filter(|u| *u > 0) {
            let mut labels = base.to_vec();
            labels.push(("cpu", "total"));
            out.add(CPU_USAGE, &labels, seconds(usage), at);
        }
    }

    let machine_labels = [
        ("boot_id", machine.boot_id.as_str()),
        ("machine_id", machine.machine_id.as_str()),
        ("system_uuid", machine.system_uuid.as_str()),
    ];
    if let Some(cores) = machine.cores {
        out.add(MACHINE_CORES, &machine_labels, cores as f64, None);
    }
    if let Some(bytes) = machine.memory_bytes {
        out.add(MACHINE_MEMORY, &machine_labels, bytes as f64, None);
    }
    out.add(SCRAPE_ERROR, &[], 0.0, None);
    out.into_proto()
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64().floor())
}

/// The Prometheus text of `families` (label values escaped by the encoder).
pub fn render(families: &[MetricFamily]) -> Result<String, prometheus::Error> {
    prometheus::TextEncoder::new().encode_to_string(families)
}

/// Online CPUs: the `cpuN` lines that open `/proc/stat`, read no further than those.
fn cpu_cores(proc: &Path) -> Option<u64> {
    let file = std::fs::File::open(proc.join("stat")).ok()?;
    let mut cores = 0;
    for line in BufReader::new(file.take(MAX_PROC_STAT_BYTES)).lines() {
        let line = line.ok()?;
        let Some(rest) = line.strip_prefix("cpu") else {
            break;
        };
        if rest.starts_with(|c: char| c.is_ascii_digit()) {
            cores += 1;
        }
    }
    (cores > 0).then_some(cores)
}

fn first_line(path: &Path) -> String {
    read_capped(path)
        .and_then(|s| s.lines().next().map(|l| l.trim().to_owned()))
        .unwrap_or_default()
}

impl SummaryProvider {
    /// One scrape of `/metrics/cadvisor`: the pods are listed once (a copy, no lock held while
    /// the files are read), then each known cgroup is read.
    pub fn cadvisor(&self) -> Result<String, prometheus::Error> {
        let now = (self.clock)();
        let reader = CgroupReader {
            observer: &self.observer,
        };
        let root = Labels {
            id: "/".into(),
            ..Labels::default()
        };
        let mut samples = vec![self.sample(&reader, "", root, self.boot_time())];
        for pod in (self.pods)() {
            let Some(path) = (self.pod_path)(&pod) else {
                continue;
            };
            if !self.observer.memory_dir(&path).is_some_and(|d| d.is_dir()) {
                continue;
            }
            let meta = &pod.metadata;
            let pod_name = meta.name.clone().unwrap_or_default();
            let namespace = meta.namespace.clone().unwrap_or_default();
            for running in running_containers(&pod) {
                let cgroup = self.observer.container_cgroup(&path, &running.id);
                if !self
                    .observer
                    .memory_dir(&cgroup)
                    .is_some_and(|d| d.is_dir())
                {
                    continue;
                }
                let labels = Labels {
                    container: running.name,
                    id: format!("/{cgroup}"),
                    image: running.image,
                    name: running.id,
                    namespace: namespace.clone(),
                    pod: pod_name.clone(),
                };
                let start = running.started.or_else(|| self.created(&cgroup));
                samples.push(self.sample(&reader, &cgroup, labels, start));
            }
            let labels = Labels {
                id: format!("/{path}"),
                namespace,
                pod: pod_name,
                ..Labels::default()
            };
            let start = self.created(&path);
            samples.push(self.sample(&reader, &path, labels, start));
        }
        render(&families(&samples, &self.machine(), now))
    }

    fn sample(
        &self,
        reader: &CgroupReader,
        path: &str,
        labels: Labels,
        start: Option<SystemTime>,
    ) -> CgroupSample {
        CgroupSample {
            labels,
            start,
            cpu: reader.cpu(path),
            cpu_spec: reader.cpu_spec(path),
            memory: reader.memory(path),
            memory_extra: reader.memory_extra(path),
            threads: reader.pids(path),
        }
    }

    fn machine(&self) -> Machine {
        let proc = &self.observer.proc;
        Machine {
            cores: cpu_cores(proc),
            memory_bytes: u64::try_from(self.observer.memory_capacity)
                .ok()
                .filter(|m| *m > 0),
            boot_id: first_line(&proc.join("sys/kernel/random/boot_id")),
            machine_id: first_line(Path::new("/etc/machine-id")),
            system_uuid: first_line(Path::new("/sys/class/dmi/id/product_uuid")),
        }
    }
}

#[cfg(test)]
mod tests;
