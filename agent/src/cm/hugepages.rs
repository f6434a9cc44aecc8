//! Huge pages: the sizes and counts the node has (`/sys/kernel/mm/hugepages`, as runc's
//! `HugePageSizes` and cAdvisor read them), the size in a `hugepages-<size>` resource name
//! (upstream `HugePageSizeFromResourceName`), the unit form the cgroup files and CRI name a
//! size by (`HugePageUnitSizeFromByteSize`: `2MB`, `1GB`), and a pod's hugepage requests (the
//! part of upstream `PodRequests` that `HugePageLimits` keeps). Pure but for [`NodeHugePages::read`].
//!
//! Not here: the containers' CRI `hugepage_limits` (`kuberuntime::container_config`), the pod
//! cgroups' hugetlb limits (`pod_cgroups`), admission (`kubelet::admission`).

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::pod::quantity::{self, Quantity, QuantityError};

/// Where the kernel lists its huge page sizes.
pub const SYSFS_HUGEPAGES: &str = "/sys/kernel/mm/hugepages";

/// The prefix of a huge pages resource name.
pub const RESOURCE_PREFIX: &str = "hugepages-";

/// More sizes than any architecture has (x86 2: 2MB, 1GB; arm64 4): what the read keeps.
const MAX_SIZES: usize = 16;

/// The huge pages of the node: page size in bytes to the bytes of pages it has.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeHugePages {
    pub bytes_by_size: BTreeMap<u64, u64>,
}

impl NodeHugePages {
    /// From `dir` (`/sys/kernel/mm/hugepages`): its `hugepages-<N>kB` directories and their
    /// `nr_hugepages`. A node without the directory has none; an entry that does not read is
    /// left out (its size then counts as absent, as for runc).
    pub fn read(dir: &Path) -> NodeHugePages {
        let mut bytes_by_size = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return NodeHugePages::default();
        };
        for entry in entries.flatten().take(MAX_SIZES * 4) {
            let name = entry.file_name();
            let Some(size) = name.to_str().and_then(size_of_sysfs_dir) else {
                continue;
            };
            // sysfs: a small file of the kernel's, not a FIFO or a link a user made.
            let count = std::fs::read_to_string(entry.path().join("nr_hugepages"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok());
            if let Some(count) = count
                && bytes_by_size.len() < MAX_SIZES
            {
                bytes_by_size.insert(size, count.saturating_mul(size));
            }
        }
        NodeHugePages { bytes_by_size }
    }

    /// The bytes of every size's pages together.
    pub fn total_bytes(&self) -> u64 {
        self.bytes_by_size
            .values()
            .fold(0, |sum, b| sum.saturating_add(*b))
    }

    /// The page sizes, smallest first.
    pub fn sizes(&self) -> Vec<u64> {
        self.bytes_by_size.keys().copied().collect()
    }
}

/// `hugepages-2048kB` → 2097152.
fn size_of_sysfs_dir(name: &str) -> Option<u64> {
    let kb = name.strip_prefix(RESOURCE_PREFIX)?.strip_suffix("kB")?;
    kb.parse::<u64>().ok()?.checked_mul(1024)
}

/// The page size of a `hugepages-<size>` resource name (`hugepages-2Mi` → 2097152); `None`
/// for other resources (upstream `HugePageSizeFromResourceName`).
pub fn size_of_resource(name: &str) -> Option<Result<u64, QuantityError>> {
    let size = name.strip_prefix(RESOURCE_PREFIX)?;
    Some(Quantity::parse(size).map(|q| u64::try_from(q.value()).unwrap_or(0)))
}

/// A page size as the cgroup files and CRI name it (upstream `HugePageUnitSizeFromByteSize`):
/// the largest 1024-based unit that divides it, `2MB`, `1GB`, `64KB`; `None` for a size no
/// unit divides into a whole number at most 1024.
pub fn unit_size(bytes: u64) -> Option<String> {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut size = bytes;
    let mut unit = 0;
    while size != 0 && size.is_multiple_of(1024) && unit < UNITS.len() - 1 {
        size /= 1024;
        unit += 1;
    }
    if size == 0 || (size > 1024 && unit < UNITS.len() - 1) {
        return None;
    }
    Some(format!("{size}{}", UNITS[unit]))
}

/// The resource name of a page size as the API writes it (`hugepages-2Mi`, `hugepages-1Gi`:
/// the quantity's canonical binary form, upstream `HugePageResourceName`).
pub fn resource_name(size: u64) -> String {
    const UNITS: [&str; 6] = ["", "Ki", "Mi", "Gi", "Ti", "Pi"];
    let mut value = size;
    let mut unit = 0;
    while value != 0 && value.is_multiple_of(1024) && unit < UNITS.len() - 1 {
        value /= 1024;
        unit += 1;
    }
    format!("{RESOURCE_PREFIX}{value}{}", UNITS[unit])
}

/// A `hugepages-<size>` quantity that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("container {container}: {resource}: {source}")]
pub struct HugePagesError {
    pub container: String,
    pub resource: String,
    #[source]
    pub source: QuantityError,
}

/// A container's huge pages by page size in bytes, from `list` (its limits, or its requests).
fn of_list(
    container: &Container,
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> Result<BTreeMap<u64, i64>, HugePagesError> {
    let mut out = BTreeMap::new();
    for (name, value) in list.into_iter().flatten() {
        let bad = |source| HugePagesError {
            container: container.name.clone(),
            resource: name.clone(),
            source,
        };
        let Some(size) = size_of_resource(name) else {
            continue;
        };
        let size = size.map_err(bad)?;
        let bytes = quantity::memory_bytes(&value.0).map_err(bad)?;
        out.insert(size, bytes);
    }
    Ok(out)
}

/// The container's hugepage limits (what upstream's `GetHugepageLimitsFromResources` reads).
pub fn container_limits(container: &Container) -> Result<BTreeMap<u64, i64>, HugePagesError> {
    of_list(
        container,
        container.resources.as_ref().and_then(|r| r.limits.as_ref()),
    )
}

/// The pod's hugepage requests by page size (upstream `PodRequests` then `HugePageLimits`):
/// the regular containers' summed, at least each init container's; a container's limit stands
/// for a request it does not make, as the API server defaults it.
pub fn pod_requests(pod: &Pod) -> Result<BTreeMap<u64, i64>, HugePagesError> {
    let spec = pod.spec.as_ref();
    let of = |c: &Container| -> Result<BTreeMap<u64, i64>, HugePagesError> {
        let resources = c.resources.as_ref();
        let mut wanted = container_limits(c)?;
        wanted.extend(of_list(c, resources.and_then(|r| r.requests.as_ref()))?);
        Ok(wanted)
    };
    let mut total: BTreeMap<u64, i64> = BTreeMap::new();
    for c in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
        for (size, bytes) in of(c)? {
            let sum = total.entry(size).or_default();
            *sum = sum.saturating_add(bytes);
        }
    }
    for c in spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
    {
        for (size, bytes) in of(c)? {
            let max = total.entry(size).or_default();
            *max = (*max).max(bytes);
        }
    }
    total.retain(|_, bytes| *bytes > 0);
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{PodSpec, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity as ApiQuantity,
    };

    fn container(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let map = |kv: &[(&str, &str)]| {
            (!kv.is_empty()).then(|| {
                kv.iter()
                    .map(|(k, v)| ((*k).to_owned(), ApiQuantity((*v).to_owned())))
                    .collect()
            })
        };
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: map(requests),
                limits: map(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn sizes_read_as_runc_and_upstream_name_them() {
        assert_eq!(size_of_sysfs_dir("hugepages-2048kB"), Some(2 << 20));
        assert_eq!(size_of_sysfs_dir("hugepages-1048576kB"), Some(1 << 30));
        assert_eq!(size_of_sysfs_dir("hugepages-2048"), None);
        assert_eq!(size_of_sysfs_dir("other"), None);
        // HugePageUnitSizeFromByteSize's cases.
        assert_eq!(unit_size(1024).as_deref(), Some("1KB"));
        assert_eq!(unit_size(33_554_432).as_deref(), Some("32MB"));
        assert_eq!(unit_size(2 << 20).as_deref(), Some("2MB"));
        assert_eq!(unit_size(1 << 30).as_deref(), Some("1GB"));
        assert_eq!(unit_size(64 << 10).as_deref(), Some("64KB"));
        assert_eq!(unit_size(1_000_000), None);
        assert_eq!(unit_size(0), None);
        assert_eq!(
            size_of_resource("hugepages-2Mi").and_then(Result::ok),
            Some(2 << 20)
        );
        assert_eq!(
            size_of_resource("hugepages-1Gi").and_then(Result::ok),
            Some(1 << 30)
        );
        assert!(size_of_resource("memory").is_none());
        assert_eq!(resource_name(2 << 20), "hugepages-2Mi");
        assert_eq!(resource_name(1 << 30), "hugepages-1Gi");
        assert_eq!(resource_name(64 << 10), "hugepages-64Ki");
        assert!(matches!(size_of_resource("hugepages-big"), Some(Err(_))));
    }

    #[test]
    fn the_node_is_read_from_its_sysfs_directories() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, count) in [("hugepages-2048kB", "4\n"), ("hugepages-1048576kB", "0\n")] {
            std::fs::create_dir(dir.path().join(name)).expect("mkdir");
            std::fs::write(dir.path().join(name).join("nr_hugepages"), count).expect("write");
        }
        std::fs::create_dir(dir.path().join("unrelated")).expect("mkdir");
        let node = NodeHugePages::read(dir.path());
        assert_eq!(node.sizes(), vec![2 << 20, 1 << 30]);
        assert_eq!(node.bytes_by_size.get(&(2 << 20)), Some(&(8 << 20)));
        assert_eq!(node.bytes_by_size.get(&(1 << 30)), Some(&0));
        assert_eq!(
            NodeHugePages::read(&dir.path().join("missing")),
            NodeHugePages::default()
        );
    }

    #[test]
    fn a_pods_requests_sum_its_containers_and_cover_its_init_containers() {
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![
                    container("a", &[], &[("hugepages-2Mi", "4Mi"), ("memory", "1Gi")]),
                    container(
                        "b",
                        &[("hugepages-2Mi", "2Mi")],
                        &[("hugepages-2Mi", "2Mi")],
                    ),
                ],
                init_containers: Some(vec![container("i", &[], &[("hugepages-1Gi", "1Gi")])]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let requests = pod_requests(&pod).expect("valid");
        assert_eq!(
            requests.into_iter().collect::<Vec<_>>(),
            vec![(2 << 20, 6 << 20), (1 << 30, 1 << 30)]
        );
        let bad = Pod {
            spec: Some(PodSpec {
                containers: vec![container("web", &[], &[("hugepages-2Mi", "lots")])],
                ..Default::default()
            }),
            ..Default::default()
        };
        let err = pod_requests(&bad)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("container web") && err.contains("hugepages-2Mi"),
            "{err}"
        );
    }

    /// A pod's author controls every name and quantity: sums that overflow saturate, a negative
    /// limit becomes "none may be used", and a size that is no quantity is an error naming it.
    #[test]
    fn hostile_hugepage_quantities_neither_overflow_nor_widen_a_limit() {
        let huge = || container("x", &[], &[("hugepages-2Mi", "8Ei")]);
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![huge(), huge(), huge()],
                ..Default::default()
            }),
            ..Default::default()
        };
        let requests = pod_requests(&pod).expect("valid quantities");
        assert_eq!(requests.get(&(2 << 20)), Some(&i64::MAX));

        let negative = container("n", &[], &[("hugepages-2Mi", "-4Mi")]);
        let limits = container_limits(&negative).expect("parses");
        assert_eq!(limits.get(&(2 << 20)), Some(&-(4 << 20)));
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![negative],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(pod_requests(&pod).expect("parses").is_empty());

        let garbage = container("g", &[], &[("hugepages-../../x", "1Gi")]);
        let err = container_limits(&garbage)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("hugepages-../../x"), "{err}");
    }
}
