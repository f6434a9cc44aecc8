//! Per-pod and per-container pressure (PSI), read from the cgroups when scraped, under the names
//! KEP-4205 gives them (cAdvisor's): `container_pressure_{cpu,memory,io}_waiting_seconds_total`
//! from each cgroup's `some` total (some task waited) and `..._stalled_seconds_total` from its
//! `full` total (every task waited), labelled `namespace`, `pod`, `container` — `container=""` for
//! the pod's own cgroup. A cgroup without a `full` line (cpu on older kernels) has no stalled
//! series; series go with their cgroups.
//!
//! Not here: which cgroups to read (handed in as a lister, see `cm::pressure_targets`).

use prometheus::{
    CounterVec, Opts,
    core::{Collector, Desc},
    proto::MetricFamily,
};

use crate::cm::{
    pressure_targets::PressureTarget,
    psi::{Psi, PsiResource},
};

/// The cgroups to read at each scrape.
pub type PressureLister = Box<dyn Fn() -> Vec<PressureTarget> + Send + Sync>;

const LABELS: [&str; 3] = ["namespace", "pod", "container"];

/// (resource, stalled?, name, help) of each family.
const FAMILIES: [(PsiResource, bool, &str, &str); 6] = [
    (
        PsiResource::Cpu,
        false,
        "container_pressure_cpu_waiting_seconds_total",
        "Total time duration tasks in the container have waited due to CPU congestion.",
    ),
    (
        PsiResource::Cpu,
        true,
        "container_pressure_cpu_stalled_seconds_total",
        "Total time duration no tasks in the container could make progress due to CPU \
         congestion.",
    ),
    (
        PsiResource::Memory,
        false,
        "container_pressure_memory_waiting_seconds_total",
        "Total time duration tasks in the container have waited due to memory congestion.",
    ),
    (
        PsiResource::Memory,
        true,
        "container_pressure_memory_stalled_seconds_total",
        "Total time duration no tasks in the container could make progress due to memory \
         congestion.",
    ),
    (
        PsiResource::Io,
        false,
        "container_pressure_io_waiting_seconds_total",
        "Total time duration tasks in the container have waited due to I/O congestion.",
    ),
    (
        PsiResource::Io,
        true,
        "container_pressure_io_stalled_seconds_total",
        "Total time duration no tasks in the container could make progress due to I/O \
         congestion.",
    ),
];

/// Reads `{cpu,memory,io}.pressure` of every listed cgroup when scraped.
pub struct PsiCollector {
    lister: PressureLister,
    descs: Vec<Desc>,
}

impl PsiCollector {
    pub fn new(lister: PressureLister) -> Result<PsiCollector, prometheus::Error> {
        let descs = FAMILIES
            .iter()
            .map(|(_, _, name, help)| {
                Desc::new(
                    (*name).to_owned(),
                    (*help).to_owned(),
                    LABELS.iter().map(|l| (*l).to_owned()).collect(),
                    Default::default(),
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(PsiCollector { lister, descs })
    }
}

impl Collector for PsiCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut vecs = Vec::with_capacity(FAMILIES.len());
        for (_, _, name, help) in FAMILIES {
            match CounterVec::new(Opts::new(name, help), &LABELS) {
                Ok(vec) => vecs.push(vec),
                Err(error) => {
                    tracing::warn!(%error, name, "cannot build a pressure metric");
                    return Vec::new();
                }
            }
        }
        for target in (self.lister)() {
            let labels = [
                target.namespace.as_str(),
                target.pod.as_str(),
                target.container.as_str(),
            ];
            for resource in PsiResource::ALL {
                let psi = match Psi::read_cgroup(&target.dir, resource) {
                    Ok(psi) => psi,
                    // Removed since it was listed: the pod or container is gone.
                    Err(error) if error.is_not_found() => continue,
                    Err(error) => {
                        tracing::debug!(%error, "cannot read a cgroup's pressure");
                        continue;
                    }
                };
                for ((r, stalled, _, _), vec) in FAMILIES.iter().zip(&vecs) {
                    if *r != resource {
                        continue;
                    }
                    let line = if *stalled { psi.full } else { Some(psi.some) };
                    if let Some(line) = line {
                        vec.with_label_values(&labels)
                            .inc_by(line.total_us as f64 / 1e6);
                    }
                }
            }
        }
        vecs.iter().flat_map(Collector::collect).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use prometheus::{Encoder as _, Registry, TextEncoder};

    use super::*;

    fn write(dir: &Path, file: &str, some_us: u64, full_us: Option<u64>) {
        std::fs::create_dir_all(dir).expect("mkdir");
        let mut text = format!("some avg10=1.00 avg60=0.50 avg300=0.10 total={some_us}\n");
        if let Some(full) = full_us {
            text += &format!("full avg10=0.00 avg60=0.00 avg300=0.00 total={full}\n");
        }
        std::fs::write(dir.join(file), text).expect("write");
    }

    fn target(container: &str, dir: &Path) -> PressureTarget {
        PressureTarget {
            namespace: "default".into(),
            pod: "web".into(),
            container: container.into(),
            dir: dir.to_owned(),
        }
    }

    /// The exposition's sample lines (no comments).
    fn samples(registry: &Registry) -> Vec<String> {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut buf)
            .expect("encode");
        String::from_utf8(buf)
            .expect("utf-8")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn exposes_waiting_and_stalled_seconds_per_pod_and_container() {
        let root = tempfile::tempdir().expect("tempdir");
        let pod = root.path().join("kubepods/burstable/poduid");
        let main = pod.join("c0ffee");
        write(&pod, "cpu.pressure", 2_000_000, Some(0));
        write(&pod, "memory.pressure", 1_500_000, Some(250_000));
        write(&pod, "io.pressure", 3, Some(1));
        // No `full` line for cpu (older kernels): no stalled series.
        write(&main, "cpu.pressure", 1_000_000, None);
        write(&main, "memory.pressure", 1_250_000, Some(125_000));
        write(&main, "io.pressure", 0, Some(0));
        let targets = vec![
            target("", &pod),
            target("main", &main),
            // Removed between listing and reading: nothing, and no error.
            target("gone", &pod.join("gone")),
        ];
        let registry = Registry::new();
        registry
            .register(Box::new(
                PsiCollector::new(Box::new(move || targets.clone())).expect("collector"),
            ))
            .expect("register");
        let pod_labels = r#"{container="",namespace="default",pod="web"}"#;
        let main_labels = r#"{container="main",namespace="default",pod="web"}"#;
        let want: Vec<String> = [
            ("cpu_stalled", pod_labels, "0"),
            ("cpu_waiting", pod_labels, "2"),
            ("cpu_waiting", main_labels, "1"),
            ("io_stalled", pod_labels, "0.000001"),
            ("io_stalled", main_labels, "0"),
            ("io_waiting", pod_labels, "0.000003"),
            ("io_waiting", main_labels, "0"),
            ("memory_stalled", pod_labels, "0.25"),
            ("memory_stalled", main_labels, "0.125"),
            ("memory_waiting", pod_labels, "1.5"),
            ("memory_waiting", main_labels, "1.25"),
        ]
        .iter()
        .map(|(family, labels, value)| {
            format!("container_pressure_{family}_seconds_total{labels} {value}")
        })
        .collect();
        assert_eq!(samples(&registry), want);

        // Read at each scrape: a new total shows at once.
        write(&main, "memory.pressure", 4_000_000, Some(125_000));
        assert!(samples(&registry).contains(&format!(
            "container_pressure_memory_waiting_seconds_total{main_labels} 4"
        )));
    }

    #[test]
    fn nothing_to_read_exposes_nothing() {
        let registry = Registry::new();
        registry
            .register(Box::new(
                PsiCollector::new(Box::new(Vec::new)).expect("collector"),
            ))
            .expect("register");
        assert!(samples(&registry).is_empty());
    }
}
