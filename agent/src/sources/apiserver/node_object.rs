//! The Node object the agent registers and the status it reports (upstream `initialNode` in
//! `kubelet_node_status.go` and the setters in `pkg/kubelet/nodestatus/setters.go`: labels and
//! taints, machine info, node info, addresses, the Ready condition). Pure: facts in, objects out.
//!
//! The pressure conditions (MemoryPressure, DiskPressure, PIDPressure) follow upstream's setters,
//! from what the eviction manager reports. Addresses are upstream's `NodeAddress` setter's: the
//! primary `InternalIP`, the `Hostname`, then a second `InternalIP` of the other family; a
//! status patch replaces the whole list (`$patch: replace`, as upstream's `PatchNodeStatus`
//! does), since the API merges `addresses` by `type` and would fold a dual-stack pair into one.
//!
//! `nodeInfo.kubeletVersion` is `v<Kubernetes API version>+swiftlet.<crate version>`: a semantic
//! version (what apimachinery's `version.ParseSemantic`/`ParseGeneric`, and so kubectl, kubeadm
//! and the control plane's version checks, accept), whose `+` build metadata is ignored in
//! comparisons, so a gate such as "kubelet at least v1.35" holds. A pre-release (`-swiftlet…`)
//! would sort below v1.35.0 and fail such gates (k3s's `+k3s1` makes the same choice).
//!
//! Not here: talking to the API server (`node.rs`), how the facts are detected (the app,
//! `crate::node`), images, volumes, daemon endpoints.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    time::{SystemTime, UNIX_EPOCH},
};

use k8s_openapi::{
    api::core::v1::{
        ContainerImage, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo,
        Taint,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, Time},
    },
    jiff::Timestamp,
};

use crate::node::labels::DEFAULT_LABELS;

/// `nodeInfo.kubeletVersion`: the Kubernetes API swiftlet implements (k8s-openapi's `v1_35`),
/// with swiftlet's own version as build metadata (see the module header).
pub const KUBELET_VERSION: &str = concat!("v1.35.0+swiftlet.", env!("CARGO_PKG_VERSION"));

pub(super) const READY: &str = "Ready";
const READY_REASON: &str = "KubeletReady";
const READY_MESSAGE: &str = "kubelet is posting ready status";
const NOT_READY_REASON: &str = "KubeletNotReady";

/// What the agent knows about its node, as the app detected it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeDescription {
    /// The `Hostname` address.
    pub hostname: String,
    /// The `InternalIP` addresses: the primary first, then one of the other family.
    pub internal_ips: Vec<IpAddr>,
    /// Every label of the Node as created: the well-known ones and `--node-labels`.
    pub labels: BTreeMap<String, String>,
    /// `--register-with-taints`: set only when the agent creates the Node.
    pub taints: Vec<Taint>,
    pub cpu_millis: i64,
    pub memory_bytes: u64,
    /// Allocatable (capacity minus kube and system reservations, and for memory the hard
    /// `memory.available` eviction threshold, as upstream computes it).
    pub allocatable_cpu_millis: i64,
    pub allocatable_memory_bytes: u64,
    /// Size of the filesystem holding the root dir (`ephemeral-storage`), when it could be read;
    /// allocatable subtracts the reservations and the hard `nodefs.available` threshold.
    pub ephemeral_storage_bytes: Option<u64>,
    pub allocatable_ephemeral_storage_bytes: Option<u64>,
    /// The pre-allocated huge pages, bytes by page size: `hugepages-<size>` in both capacity and
    /// allocatable (nothing reserves them), every size the kernel offers, 0 included.
    pub hugepages_bytes_by_size: BTreeMap<u64, u64>,
    /// `maxPods`: the `pods` capacity.
    pub max_pods: u32,
    /// `uname -r`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of `/etc/os-release`.
    pub os_image: String,
    /// `<runtime name>://<version>`, e.g. `containerd://2.1.0`.
    pub container_runtime_version: String,
    /// Go's name for the architecture (`amd64`, `arm64`): see [`go_arch`].
    pub architecture: String,
    pub machine_id: String,
    pub boot_id: String,
}

/// Go's `GOARCH` for a Rust `target_arch` (labels and nodeInfo use Go's names).
pub fn go_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// The `PRETTY_NAME` of an os-release file, as upstream's `osImage`.
pub fn os_image(os_release: &str) -> Option<String> {
    os_release.lines().find_map(|line| {
        let value = line.strip_prefix("PRETTY_NAME=")?.trim();
        Some(value.trim_matches(|c| c == '"' || c == '\'').to_owned())
    })
}

/// The labels upstream's `updateDefaultLabels` sets on a Node that already exists: those of
/// its default set that the initial Node has (a `--node-labels` value of one of them included).
pub(super) fn default_labels(node: &NodeDescription) -> BTreeMap<String, String> {
    node.labels
        .iter()
        .filter(|(key, value)| DEFAULT_LABELS.contains(&key.as_str()) && !value.is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Upstream `MaxNamesPerImageInNodeStatus`.
const MAX_NAMES_PER_IMAGE: usize = 5;
/// Upstream's default `nodeStatusMaxImages`.
pub const MAX_IMAGES: usize = 50;

/// `status.images` (upstream's `Images` setter): the largest images first, at most `max`, each
/// with its digests then its tags, at most five names.
pub fn node_images(images: &[k8s_cri::v1::Image], max: usize) -> Vec<ContainerImage> {
    let mut sorted: Vec<&k8s_cri::v1::Image> = images.iter().collect();
    sorted.sort_by_key(|i| std::cmp::Reverse(i.size));
    sorted
        .into_iter()
        .take(max)
        .map(|image| ContainerImage {
            names: Some(
                image
                    .repo_digests
                    .iter()
                    .chain(&image.repo_tags)
                    .take(MAX_NAMES_PER_IMAGE)
                    .cloned()
                    .collect(),
            ),
            size_bytes: i64::try_from(image.size).ok(),
        })
        .collect()
}

/// The Node to create (upstream `initialNode`, which also runs the status setters).
pub(super) fn initial_node(
    name: &str,
    node: &NodeDescription,
    ready: NodeCondition,
    pressure: Vec<NodeCondition>,
) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(node.labels.clone()),
            ..ObjectMeta::default()
        },
        spec: (!node.taints.is_empty()).then(|| NodeSpec {
            taints: Some(node.taints.clone()),
            ..NodeSpec::default()
        }),
        status: Some(node_status(node, ready, pressure)),
    }
}

/// The status the agent reports: capacity, allocatable, node info, addresses, the pressure
/// conditions and Ready (upstream's order).
pub(super) fn node_status(
    node: &NodeDescription,
    ready: NodeCondition,
    pressure: Vec<NodeCondition>,
) -> NodeStatus {
    // As real kubelets show them: capacity in Ki (cadvisor's binary quantity), allocatable a
    // plain byte count (the result of a subtraction).
    let storage =
        |bytes: Option<u64>| bytes.map(|b| ("ephemeral-storage".to_owned(), memory_quantity(b)));
    let allocatable_storage = node
        .allocatable_ephemeral_storage_bytes
        .map(|b| ("ephemeral-storage".to_owned(), Quantity(b.to_string())));
    // cadvisor's binary quantities, as in capacity and allocatable alike.
    let hugepages = node
        .hugepages_bytes_by_size
        .iter()
        .map(|(size, bytes)| {
            (
                crate::cm::hugepages::resource_name(*size),
                binary_quantity(*bytes),
            )
        })
        .collect::<Vec<_>>();
    let resources: BTreeMap<String, Quantity> = [
        ("cpu".to_owned(), cpu_quantity(node.cpu_millis)),
        ("memory".to_owned(), memory_quantity(node.memory_bytes)),
        ("pods".to_owned(), Quantity(node.max_pods.to_string())),
    ]
    .into_iter()
    .chain(storage(node.ephemeral_storage_bytes))
    .chain(hugepages.iter().cloned())
    .collect();
    let allocatable: BTreeMap<String, Quantity> = [
        ("cpu".to_owned(), cpu_quantity(node.allocatable_cpu_millis)),
        (
            "memory".to_owned(),
            memory_quantity(node.allocatable_memory_bytes),
        ),
        ("pods".to_owned(), Quantity(node.max_pods.to_string())),
    ]
    .into_iter()
    .chain(allocatable_storage)
    .chain(hugepages)
    .collect();
    let mut conditions = pressure;
    conditions.push(ready);
    let internal = |ip: &IpAddr| NodeAddress {
        type_: "InternalIP".into(),
        address: ip.to_string(),
    };
    let mut addresses: Vec<NodeAddress> = node
        .internal_ips
        .first()
        .map(internal)
        .into_iter()
        .collect();
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: node.hostname.clone(),
    });
    addresses.extend(node.internal_ips.get(1).map(internal));
    NodeStatus {
        allocatable: Some(allocatable),
        capacity: Some(resources),
        addresses: Some(addresses),
        conditions: Some(conditions),
        node_info: Some(NodeSystemInfo {
            architecture: node.architecture.clone(),
            boot_id: node.boot_id.clone(),
            container_runtime_version: node.container_runtime_version.clone(),
            kernel_version: node.kernel_version.clone(),
            kubelet_version: KUBELET_VERSION.to_owned(),
            machine_id: node.machine_id.clone(),
            operating_system: "linux".into(),
            os_image: node.os_image.clone(),
            ..NodeSystemInfo::default()
        }),
        ..NodeStatus::default()
    }
}

/// The body of a strategic merge patch of `nodes/<name>/status` that sets `status` (and
/// `labels`, when given): the address list is replaced whole (upstream
/// `fixupPatchForNodeStatusAddresses`), every other list merges by its key.
pub(super) fn status_patch(
    status: &NodeStatus,
    labels: Option<&BTreeMap<String, String>>,
) -> serde_json::Value {
    let mut status = serde_json::to_value(status).unwrap_or_default();
    if let Some(addresses) = status
        .get_mut("addresses")
        .and_then(serde_json::Value::as_array_mut)
    {
        addresses.push(serde_json::json!({ "$patch": "replace" }));
    }
    match labels {
        Some(labels) => serde_json::json!({ "metadata": { "labels": labels }, "status": status }),
        None => serde_json::json!({ "status": status }),
    }
}

/// Upstream's `ReadyCondition` setter: `problem` is why the node is not ready (`None`: ready).
/// The heartbeat is always `now`; the transition time moves only when the status flips.
pub(super) fn ready_condition(
    problem: Option<String>,
    now: SystemTime,
    previous: Option<&NodeCondition>,
) -> NodeCondition {
    let (status, reason, message) = match problem {
        None => ("True", READY_REASON, READY_MESSAGE.to_owned()),
        Some(why) => ("False", NOT_READY_REASON, why),
    };
    let now = time(now);
    let transition = previous
        .filter(|p| p.status == status)
        .and_then(|p| p.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: READY.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_heartbeat_time: Some(now),
        last_transition_time: Some(transition),
    }
}

/// The pressure condition types, in upstream's order, with their reasons and messages when
/// false and when true (`pkg/kubelet/nodestatus/setters.go`).
const PRESSURE: [(&str, [(&str, &str); 2]); 3] = [
    (
        "MemoryPressure",
        [
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
        ],
    ),
    (
        "DiskPressure",
        [
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("KubeletHasDiskPressure", "kubelet has disk pressure"),
        ],
    ),
    (
        "PIDPressure",
        [
            (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
        ],
    ),
];

/// Upstream's pressure condition setters: every type reported, `True` for those in `active`;
/// transition times kept from `previous` while the status holds.
pub(super) fn pressure_conditions(
    active: &[String],
    now: SystemTime,
    previous: Option<&NodeStatus>,
) -> Vec<NodeCondition> {
    let now = time(now);
    PRESSURE
        .iter()
        .map(|(type_, texts)| {
            let on = active.iter().any(|a| a == type_);
            let (reason, message) = texts[usize::from(on)];
            let status = if on { "True" } else { "False" };
            let transition = previous
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == *type_))
                .filter(|c| c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            NodeCondition {
                type_: (*type_).into(),
                status: status.into(),
                reason: Some(reason.into()),
                message: Some(message.into()),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: Some(transition),
            }
        })
        .collect()
}

/// The Ready condition in a status, if any.
pub(super) fn ready_of(status: Option<&NodeStatus>) -> Option<&NodeCondition> {
    status?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == READY)
}

/// Whether two statuses differ in more than their heartbeat times (upstream reports a changed
/// status at once, an unchanged one only when the report frequency is due).
pub(super) fn same_but_heartbeat(a: &NodeStatus, b: &NodeStatus) -> bool {
    let strip = |s: &NodeStatus| {
        let mut s = s.clone();
        for c in s.conditions.iter_mut().flatten() {
            c.last_heartbeat_time = None;
        }
        s
    };
    strip(a) == strip(b)
}

/// A Kubernetes `Time` from the wall clock (second precision, as the API stores it).
pub(super) fn time(at: SystemTime) -> Time {
    let seconds = at
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    Time(Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn cpu_quantity(millis: i64) -> Quantity {
    if millis % 1000 == 0 {
        Quantity((millis / 1000).to_string())
    } else {
        Quantity(format!("{millis}m"))
    }
}

/// Memory in `Ki` when whole (as upstream's cadvisor-derived capacity reads), else in bytes.
fn memory_quantity(bytes: u64) -> Quantity {
    if bytes.is_multiple_of(1024) {
        Quantity(format!("{}Ki", bytes / 1024))
    } else {
        Quantity(bytes.to_string())
    }
}

/// A byte count as a `BinarySI` quantity in canonical form: the largest binary suffix that
/// divides it (`2Gi`, `512Mi`, `0`).
fn binary_quantity(bytes: u64) -> Quantity {
    const UNITS: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let (mut value, mut unit) = (bytes, "");
    for next in UNITS {
        if value == 0 || !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        unit = next;
    }
    Quantity(format!("{value}{unit}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn quantities_read_as_upstream_writes_them() {
        assert_eq!(cpu_quantity(4000).0, "4");
        assert_eq!(cpu_quantity(3500).0, "3500m");
        assert_eq!(memory_quantity(16 * 1024 * 1024 * 1024).0, "16777216Ki");
        assert_eq!(memory_quantity(1000).0, "1000");
        assert_eq!(binary_quantity(0).0, "0");
        assert_eq!(binary_quantity(2 << 30).0, "2Gi");
        assert_eq!(binary_quantity(3 * (2 << 20)).0, "6Mi");
        assert_eq!(binary_quantity(1536).0, "1536");
        assert_eq!(binary_quantity(u64::MAX).0, u64::MAX.to_string());
    }

    #[test]
    fn os_image_and_arch() {
        let release = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\n";
        assert_eq!(
            os_image(release).as_deref(),
            Some("Debian GNU/Linux 13 (trixie)")
        );
        assert_eq!(os_image("NAME=x\n"), None);
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        assert_eq!(go_arch("riscv64"), "riscv64");
    }

    #[test]
    fn ready_transition_time_moves_only_when_the_status_flips() {
        let first = ready_condition(None, at(100), None);
        assert_eq!(first.status, "True");
        assert_eq!(first.reason.as_deref(), Some("KubeletReady"));
        assert_eq!(first.last_transition_time, Some(time(at(100))));

        let beat = ready_condition(None, at(110), Some(&first));
        assert_eq!(beat.last_heartbeat_time, Some(time(at(110))));
        assert_eq!(beat.last_transition_time, Some(time(at(100))));

        let down = ready_condition(Some("PLEG is not healthy".into()), at(120), Some(&beat));
        assert_eq!(down.status, "False");
        assert_eq!(down.reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(down.message.as_deref(), Some("PLEG is not healthy"));
        assert_eq!(down.last_transition_time, Some(time(at(120))));
    }

    #[test]
    fn images_largest_first_digests_then_tags_five_names_at_most() {
        let image = |size: u64, tags: &[&str], digests: &[&str]| k8s_cri::v1::Image {
            size,
            repo_tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            repo_digests: digests.iter().map(|d| (*d).to_owned()).collect(),
            ..Default::default()
        };
        let many: Vec<String> = (0..7).map(|i| format!("r/big:{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let images = [
            image(10, &["r/small:1"], &["r/small@sha256:aa"]),
            image(300, &many, &["r/big@sha256:bb"]),
            image(20, &["r/mid:1"], &[]),
        ];
        let listed = node_images(&images, 2);
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[0].size_bytes, Some(300));
        let names = listed[0].names.clone().unwrap_or_default();
        assert_eq!(names.len(), 5);
        assert_eq!(names[0], "r/big@sha256:bb");
        assert_eq!(names[1], "r/big:0");
        assert_eq!(listed[1].names, Some(vec!["r/mid:1".to_owned()]));
    }

    #[test]
    fn heartbeats_alone_are_not_a_change() {
        let node = NodeDescription {
            hostname: "n1".into(),
            ..NodeDescription::default()
        };
        let a = node_status(
            &node,
            ready_condition(None, at(100), None),
            pressure_conditions(&[], at(100), None),
        );
        let b = node_status(
            &node,
            ready_condition(None, at(110), ready_of(Some(&a))),
            pressure_conditions(&[], at(110), Some(&a)),
        );
        assert!(same_but_heartbeat(&a, &b));
        let c = node_status(
            &node,
            ready_condition(Some("x".into()), at(120), ready_of(Some(&b))),
            pressure_conditions(&[], at(120), Some(&b)),
        );
        assert!(!same_but_heartbeat(&b, &c));
    }

    /// Every size the kernel offers, in capacity and allocatable alike, 0 included.
    #[test]
    fn huge_pages_are_capacity_and_allocatable() {
        let node = NodeDescription {
            hugepages_bytes_by_size: [(2 << 20, 512 << 20), (1 << 30, 0)].into(),
            ..NodeDescription::default()
        };
        let status = node_status(
            &node,
            ready_condition(None, at(100), None),
            pressure_conditions(&[], at(100), None),
        );
        for list in [status.capacity, status.allocatable] {
            let list = list.unwrap_or_default();
            assert_eq!(
                list.get("hugepages-2Mi").map(|q| q.0.as_str()),
                Some("512Mi")
            );
            assert_eq!(list.get("hugepages-1Gi").map(|q| q.0.as_str()), Some("0"));
        }
    }

    #[test]
    fn pressure_conditions_as_upstream_sets_them() {
        let calm = pressure_conditions(&[], at(100), None);
        let types: Vec<&str> = calm.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["MemoryPressure", "DiskPressure", "PIDPressure"]);
        assert!(calm.iter().all(|c| c.status == "False"));
        assert_eq!(
            calm[0].reason.as_deref(),
            Some("KubeletHasSufficientMemory")
        );
        let status = NodeStatus {
            conditions: Some(calm),
            ..NodeStatus::default()
        };
        let pressed = pressure_conditions(&["MemoryPressure".into()], at(200), Some(&status));
        assert_eq!(pressed[0].status, "True");
        assert_eq!(
            pressed[0].reason.as_deref(),
            Some("KubeletHasInsufficientMemory")
        );
        assert_eq!(
            pressed[0].message.as_deref(),
            Some("kubelet has insufficient memory available")
        );
        assert_eq!(pressed[0].last_transition_time, Some(time(at(200))));
        // Unchanged ones keep their transition time; every heartbeat is now.
        assert_eq!(pressed[1].last_transition_time, Some(time(at(100))));
        assert_eq!(pressed[1].last_heartbeat_time, Some(time(at(200))));
    }
}
