//! `/metrics/resource`: the few CPU and memory series metrics-server (and so `kubectl top` and
//! the HPA) scrapes from every kubelet, rendered from the cheap Summary (`only_cpu_and_memory`),
//! each sample stamped with the time its figures were read.
//!
//! Not here: the agent's own metrics (`/metrics`). Upstream:
//! `pkg/kubelet/metrics/collectors/resource_metrics.go` (names, help texts, labels).

use std::fmt::Write as _;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::types::{CpuStats, MemoryStats, Summary};

struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<(String, f64, i64)>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            kind,
            samples: Vec::new(),
        }
    }
}

fn millis(t: &Time) -> i64 {
    t.0.as_millisecond()
}

/// Label values escaped as the text format wants them.
fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn cpu_seconds(cpu: Option<&CpuStats>) -> Option<(f64, i64)> {
    let cpu = cpu?;
    Some((cpu.usage_core_nano_seconds? as f64 / 1e9, millis(&cpu.time)))
}

fn working_set(memory: Option<&MemoryStats>) -> Option<(f64, i64)> {
    let memory = memory?;
    Some((memory.working_set_bytes? as f64, millis(&memory.time)))
}

/// The Prometheus text of `summary`'s resource series.
pub fn render(summary: &Summary) -> String {
    let mut node_cpu = Family::new(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
    );
    let mut node_memory = Family::new(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
    );
    let mut pod_cpu = Family::new(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
    );
    let mut pod_memory = Family::new(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
    );
    let mut container_cpu = Family::new(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
    );
    let mut container_memory = Family::new(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
    );
    let mut container_start = Family::new(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
    );

    let node = &summary.node;
    if let Some((v, at)) = cpu_seconds(node.cpu.as_ref()) {
        node_cpu.samples.push((String::new(), v, at));
    }
    if let Some((v, at)) = working_set(node.memory.as_ref()) {
        node_memory.samples.push((String::new(), v, at));
    }
    for pod in &summary.pods {
        let (name, namespace) = (pod.pod_ref.name.as_str(), pod.pod_ref.namespace.as_str());
        let pod_labels = labels(&[("namespace", namespace), ("pod", name)]);
        if let Some((v, at)) = cpu_seconds(pod.cpu.as_ref()) {
            pod_cpu.samples.push((pod_labels.clone(), v, at));
        }
        if let Some((v, at)) = working_set(pod.memory.as_ref()) {
            pod_memory.samples.push((pod_labels, v, at));
        }
        for c in &pod.containers {
            let l = labels(&[
                ("container", &c.name),
                ("namespace", namespace),
                ("pod", name),
            ]);
            if let Some((v, at)) = cpu_seconds(c.cpu.as_ref()) {
                container_cpu.samples.push((l.clone(), v, at));
                container_start
                    .samples
                    .push((l.clone(), c.start_time.0.as_second() as f64, at));
            }
            if let Some((v, at)) = working_set(c.memory.as_ref()) {
                container_memory.samples.push((l, v, at));
            }
        }
    }

    let mut out = String::new();
    for family in [
        container_cpu,
        container_memory,
        container_start,
        node_cpu,
        node_memory,
        pod_cpu,
        pod_memory,
    ] {
        if family.samples.is_empty() {
            continue;
        }
        let _ = writeln!(out, "# HELP {} [STABLE] {}", family.name, family.help);
        let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind);
        for (labels, value, at) in &family.samples {
            let _ = writeln!(out, "{}{labels} {value} {at}", family.name);
        }
    }
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE resource_scrape_error gauge");
    let _ = writeln!(out, "resource_scrape_error 0");
    out
}
