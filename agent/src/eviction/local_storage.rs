//! Local storage limits of pods (upstream `localStorageEviction` in `eviction_manager.go`): a
//! pod is evicted at once, before any threshold is looked at, with upstream's message, when an
//! emptyDir holds more than its `sizeLimit` (`emptyDirLimitEviction`), when the pod writes more
//! than its containers' `ephemeral-storage` limits summed (`podEphemeralStorageLimitEviction`),
//! or when one container's writable layer and logs exceed its own limit
//! (`containerEphemeralStorageLimitEviction`) — checked in that order.
//!
//! Not here: measuring (the volume manager measures emptyDirs, handed in as [`EmptyDirUsageFn`];
//! the runtime's `ListContainerStats` and the log files the containers, [`ContainerStorageFn`]).

use std::{collections::HashMap, path::Path, sync::Arc};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::observe::dir_bytes;
use crate::{
    cm::quantity,
    container::{LABEL_CONTAINER_NAME, LABEL_POD_UID, PodUid},
    cri::RuntimeService,
    pod::{pod_uid, spec},
};

/// What one container writes on the node's filesystem: its writable layer (as the runtime
/// measures it) and its log files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerStorage {
    pub name: String,
    /// `None` when the runtime did not report it, or when it lives on a dedicated image
    /// filesystem (upstream counts the rootfs only when the images share the node's).
    pub rootfs_bytes: Option<u64>,
    pub logs_bytes: u64,
}

impl ContainerStorage {
    fn used(&self) -> u64 {
        self.logs_bytes
            .saturating_add(self.rootfs_bytes.unwrap_or(0))
    }
}

/// What the containers of the given pods write, by pod: measured before each decision, for the
/// pods with `ephemeral-storage` limits only.
pub type ContainerStorageFn = Box<
    dyn Fn(Vec<Arc<Pod>>) -> BoxFuture<'static, HashMap<PodUid, Vec<ContainerStorage>>>
        + Send
        + Sync,
>;

/// Measures the containers of `pods`: one `ListContainerStats` for the writable layers (when
/// `count_rootfs`, i.e. the images share the node's filesystem, as upstream counts them), and
/// each container's log directory below `log_root` (`<namespace>_<name>_<uid>/<container>`).
/// Where a container was restarted the runtime reports each instance; the largest counts (the
/// old one's layer is on the disk until it is removed). A failed call measures no writable
/// layer: logs still count, and the next decision asks again.
pub async fn measure_containers(
    runtime: &dyn RuntimeService,
    pods: &[Arc<Pod>],
    log_root: &Path,
    count_rootfs: bool,
) -> HashMap<PodUid, Vec<ContainerStorage>> {
    let mut rootfs: HashMap<(String, String), u64> = HashMap::new();
    if count_rootfs {
        match runtime.list_container_stats(None).await {
            Ok(stats) => {
                for stat in stats {
                    let Some(attributes) = stat.attributes else {
                        continue;
                    };
                    let (Some(uid), Some(name)) = (
                        attributes.labels.get(LABEL_POD_UID),
                        attributes.labels.get(LABEL_CONTAINER_NAME),
                    ) else {
                        continue;
                    };
                    let Some(bytes) = stat
                        .writable_layer
                        .and_then(|w| w.used_bytes)
                        .map(|v| v.value)
                    else {
                        continue;
                    };
                    let slot = rootfs.entry((uid.clone(), name.clone())).or_default();
                    *slot = (*slot).max(bytes);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot measure the containers' writable layers"),
        }
    }
    let mut out = HashMap::new();
    for pod in pods {
        let uid = pod_uid(pod);
        let meta = &pod.metadata;
        let log_dir = log_root.join(format!(
            "{}_{}_{}",
            meta.namespace.as_deref().unwrap_or("default"),
            meta.name.as_deref().unwrap_or_default(),
            uid.0
        ));
        let containers = spec::containers(pod)
            .iter()
            .chain(spec::init_containers(pod))
            .map(|c| ContainerStorage {
                name: c.name.clone(),
                rootfs_bytes: rootfs.get(&(uid.0.clone(), c.name.clone())).copied(),
                logs_bytes: dir_bytes(&log_dir.join(&c.name)).max(0).unsigned_abs(),
            })
            .collect();
        out.insert(uid, containers);
    }
    out
}

/// A container's `ephemeral-storage` limit: (as written, bytes), when positive.
fn ephemeral_limit(container: &Container) -> Option<(String, u64)> {
    let limit = container
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("ephemeral-storage")?;
    let bytes = quantity::memory_bytes(&limit.0).ok()?;
    (bytes > 0).then(|| (limit.0.clone(), bytes.unsigned_abs()))
}

/// Whether any container of `pod` has an `ephemeral-storage` limit (only those pods' containers
/// are measured).
pub fn has_ephemeral_limits(pod: &Pod) -> bool {
    spec::containers(pod)
        .iter()
        .chain(spec::init_containers(pod))
        .any(|c| ephemeral_limit(c).is_some())
}

/// The pod's `ephemeral-storage` limit as upstream's `PodLimits` sums it: the regular
/// containers' limits and the sidecars' (restartable init containers, which run alongside)
/// added up, at least what any one-shot init container needs with the sidecars before it,
/// plus `spec.overhead`'s.
fn pod_ephemeral_limit(pod: &Pod) -> Option<u64> {
    let limit_of = |c: &Container| ephemeral_limit(c).map(|(_, bytes)| bytes);
    let mut any = false;
    let mut regular: u64 = 0;
    for c in spec::containers(pod) {
        if let Some(bytes) = limit_of(c) {
            any = true;
            regular = regular.saturating_add(bytes);
        }
    }
    // Init containers run one at a time, next to the sidecars started before them.
    let mut sidecars: u64 = 0;
    let mut init_max: u64 = 0;
    for c in spec::init_containers(pod) {
        let Some(bytes) = limit_of(c) else {
            continue;
        };
        any = true;
        if spec::is_sidecar(c) {
            sidecars = sidecars.saturating_add(bytes);
        } else {
            init_max = init_max.max(sidecars.saturating_add(bytes));
        }
    }
    if !any {
        return None;
    }
    let sum = regular.saturating_add(sidecars);
    let overhead = pod
        .spec
        .as_ref()
        .and_then(|s| s.overhead.as_ref())
        .and_then(|o| o.get("ephemeral-storage"))
        .and_then(|q| quantity::memory_bytes(&q.0).ok())
        .map_or(0, |b| b.max(0).unsigned_abs());
    Some(sum.max(init_max).saturating_add(overhead))
}

/// Upstream `podEphemeralStorageLimitEviction`: the pod's containers (writable layers and logs)
/// and disk-backed emptyDirs together over its summed limit. The message names the limit as
/// upstream's `Quantity.String()` would for a whole number of bytes in binary units.
pub fn pod_ephemeral_violation(
    pod: &Pod,
    containers: &[ContainerStorage],
    empty_dirs: &[(String, u64)],
) -> Option<String> {
    let limit = pod_ephemeral_limit(pod)?;
    let disk_backed = disk_backed_empty_dirs(pod);
    let used = containers
        .iter()
        .map(ContainerStorage::used)
        .chain(
            empty_dirs
                .iter()
                .filter(|(name, _)| disk_backed.contains(name))
                .map(|(_, bytes)| *bytes),
        )
        .fold(0u64, u64::saturating_add);
    (used > limit).then(|| {
        format!(
            "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
            binary_si(limit)
        )
    })
}

/// Upstream `containerEphemeralStorageLimitEviction`: the first container (of the pod's regular
/// containers) whose writable layer and logs exceed its own limit.
pub fn container_ephemeral_violation(pod: &Pod, containers: &[ContainerStorage]) -> Option<String> {
    let limits: HashMap<&str, (String, u64)> = spec::containers(pod)
        .iter()
        .filter_map(|c| Some((c.name.as_str(), ephemeral_limit(c)?)))
        .collect();
    containers.iter().find_map(|c| {
        let (text, limit) = limits.get(c.name.as_str())?;
        (c.used() > *limit).then(|| {
            format!(
                "Container {} exceeded its local ephemeral storage limit {text:?}. ",
                c.name
            )
        })
    })
}

/// The emptyDirs of `pod` on the node's disk (not `medium: Memory`).
fn disk_backed_empty_dirs(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| {
            v.empty_dir
                .as_ref()
                .is_some_and(|e| e.medium.as_deref() != Some("Memory"))
        })
        .map(|v| v.name.clone())
        .collect()
}

/// Bytes as a Kubernetes quantity in binary units when they divide evenly (`2Mi`), else plain.
fn binary_si(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
    if bytes == 0 {
        return "0".to_owned();
    }
    for (i, unit) in UNITS.iter().enumerate() {
        let size = 1u64 << (10 * (6 - i));
        if bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

/// The bytes each set-up emptyDir of a pod holds, by volume name.
pub type EmptyDirUsageFn = Box<dyn Fn(&Pod) -> Vec<(String, u64)> + Send + Sync>;

/// Whether `pod` has an emptyDir with a positive `sizeLimit` (only those are measured).
pub fn has_size_limits(pod: &Pod) -> bool {
    !size_limits(pod).is_empty()
}

/// (volume, limit as written, limit in bytes) of the pod's emptyDirs with a positive limit.
fn size_limits(pod: &Pod) -> Vec<(String, String, u64)> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            let limit = v.empty_dir.as_ref()?.size_limit.as_ref()?;
            let bytes = quantity::memory_bytes(&limit.0).ok()?;
            (bytes > 0).then(|| (v.name.clone(), limit.0.clone(), bytes.unsigned_abs()))
        })
        .collect()
}

/// The eviction message when one of the pod's emptyDirs holds more than its limit (upstream
/// `emptyDirMessageFmt`).
pub fn empty_dir_violation(pod: &Pod, usage: &[(String, u64)]) -> Option<String> {
    size_limits(pod)
        .into_iter()
        .find_map(|(name, text, limit)| {
            let used = usage.iter().find(|(v, _)| *v == name)?.1;
            (used > limit)
                .then(|| format!("Usage of EmptyDir volume {name:?} exceeds the limit {text:?}. "))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{EmptyDirVolumeSource, Volume},
        apimachinery::pkg::api::resource::Quantity,
    };

    fn pod(limits: &[(&str, Option<&str>)]) -> Pod {
        crate::testing::pod()
            .volumes(
                limits
                    .iter()
                    .map(|(name, limit)| Volume {
                        name: (*name).into(),
                        empty_dir: Some(EmptyDirVolumeSource {
                            size_limit: limit.map(|l| Quantity(l.into())),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
            )
            .build()
    }

    fn limited(name: &str, containers: &[(&str, Option<&str>, bool)]) -> Pod {
        let container = |(c, limit, sidecar): &(&str, Option<&str>, bool)| Container {
            resources: limit.map(|l| k8s_openapi::api::core::v1::ResourceRequirements {
                limits: Some([("ephemeral-storage".to_owned(), Quantity(l.into()))].into()),
                ..Default::default()
            }),
            restart_policy: sidecar.then(|| "Always".to_owned()),
            ..crate::testing::container(c)
        };
        let mut pod = crate::testing::pod()
            .named("ns", name, &format!("uid-{name}"))
            .build();
        {
            let spec = pod.spec.get_or_insert_with(Default::default);
            spec.containers = containers
                .iter()
                .filter(|c| !c.0.starts_with("init"))
                .map(container)
                .collect();
            spec.init_containers = Some(
                containers
                    .iter()
                    .filter(|c| c.0.starts_with("init"))
                    .map(container)
                    .collect(),
            );
        }
        pod
    }

    fn used(name: &str, rootfs: Option<u64>, logs: u64) -> ContainerStorage {
        ContainerStorage {
            name: name.into(),
            rootfs_bytes: rootfs,
            logs_bytes: logs,
        }
    }

    const MI: u64 = 1 << 20;

    #[test]
    fn the_pod_limit_sums_containers_and_sidecars_and_covers_one_shot_inits() {
        let pod = limited(
            "p",
            &[
                ("main", Some("2Mi"), false),
                ("free", None, false),
                ("init-side", Some("1Mi"), true),
                ("init-big", Some("10Mi"), false),
            ],
        );
        // max(2 + 1, 1 + 10) = 11 MiB.
        assert_eq!(pod_ephemeral_limit(&pod), Some(11 * MI));
        assert!(has_ephemeral_limits(&pod));
        assert_eq!(
            pod_ephemeral_limit(&limited("q", &[("main", None, false)])),
            None
        );
        assert!(!has_ephemeral_limits(&limited(
            "q",
            &[("main", None, false)]
        )));
    }

    #[test]
    fn a_container_over_its_own_limit_is_named_with_the_limit_as_written() {
        let pod = limited(
            "p",
            &[("main", Some("2Mi"), false), ("side", Some("100Mi"), false)],
        );
        assert_eq!(
            container_ephemeral_violation(&pod, &[used("main", Some(MI), MI)]),
            None,
            "exactly at the limit is within it"
        );
        assert_eq!(
            container_ephemeral_violation(
                &pod,
                &[
                    used("side", Some(50 * MI), 0),
                    used("main", Some(2 * MI), 1)
                ]
            )
            .as_deref(),
            Some("Container main exceeded its local ephemeral storage limit \"2Mi\". ")
        );
        // Logs count without a measured layer (a dedicated image filesystem).
        assert!(container_ephemeral_violation(&pod, &[used("main", None, 3 * MI)]).is_some());
    }

    #[test]
    fn the_pod_sum_counts_disk_backed_empty_dirs_only() {
        let mut pod = limited("p", &[("main", Some("4Mi"), false)]);
        {
            let spec = pod.spec.get_or_insert_with(Default::default);
            spec.volumes = Some(vec![
                Volume {
                    name: "disk".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
                Volume {
                    name: "ram".into(),
                    empty_dir: Some(EmptyDirVolumeSource {
                        medium: Some("Memory".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]);
        }
        let containers = [used("main", Some(MI), MI)];
        assert_eq!(
            pod_ephemeral_violation(&pod, &containers, &[("ram".into(), 100 * MI)]),
            None
        );
        assert_eq!(
            pod_ephemeral_violation(&pod, &containers, &[("disk".into(), 3 * MI)]).as_deref(),
            Some("Pod ephemeral local storage usage exceeds the total limit of containers 4Mi. ")
        );
        assert_eq!(binary_si(3 * 1024), "3Ki");
        assert_eq!(binary_si(1500), "1500");
    }

    #[tokio::test]
    async fn measures_writable_layers_and_log_files_per_container() {
        use crate::cri::fake::FakeRuntime;
        let fake = FakeRuntime::new();
        let (_, ids) = fake
            .start_pod("uid-p", "p", "ns", &["main", "side"])
            .await
            .expect("pod");
        fake.set_writable_layer(&ids[0], 3 * MI);
        let logs = tempfile::tempdir().expect("tempdir");
        let main_logs = logs.path().join("ns_p_uid-p/main");
        std::fs::create_dir_all(&main_logs).expect("mkdir");
        std::fs::write(main_logs.join("0.log"), vec![b'x'; 1000]).expect("log");
        let pod = Arc::new(limited(
            "p",
            &[("main", Some("1Mi"), false), ("side", None, false)],
        ));
        let measured =
            measure_containers(&fake, std::slice::from_ref(&pod), logs.path(), true).await;
        assert_eq!(
            measured.get(&pod_uid(&pod)),
            Some(&vec![
                used("main", Some(3 * MI), 1000),
                used("side", None, 0)
            ])
        );
        // With a dedicated image filesystem the layers are not asked for.
        let measured =
            measure_containers(&fake, std::slice::from_ref(&pod), logs.path(), false).await;
        assert_eq!(
            measured.get(&pod_uid(&pod)),
            Some(&vec![used("main", None, 1000), used("side", None, 0)])
        );
    }

    #[test]
    fn only_usage_over_a_positive_limit_violates() {
        let p = pod(&[("free", None), ("zero", Some("0")), ("small", Some("1Mi"))]);
        assert!(has_size_limits(&p));
        assert!(!has_size_limits(&pod(&[("free", None)])));
        let usage = |small| {
            vec![
                ("free".to_owned(), 1u64 << 40),
                ("zero".to_owned(), 1 << 40),
                ("small".to_owned(), small),
            ]
        };
        assert_eq!(empty_dir_violation(&p, &usage(1 << 20)), None);
        assert_eq!(
            empty_dir_violation(&p, &usage((1 << 20) + 1)).as_deref(),
            Some("Usage of EmptyDir volume \"small\" exceeds the limit \"1Mi\". ")
        );
        // Not measured (not set up): nothing to say.
        assert_eq!(empty_dir_violation(&p, &[]), None);
    }
}
