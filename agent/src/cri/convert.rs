//! From CRI objects to the runtime-neutral model ([`crate::container`]): the pods on the node
//! ([`get_pods`], upstream `kubeGenericRuntimeManager.GetPods`) and everything the runtime knows
//! about one pod ([`get_pod_status`], upstream `GetPodStatus` with `getPodContainerStatuses`,
//! `toKubeContainerStatus`, `determinePodSandboxIPs`; `helpers.go`, `labels.go`).
//!
//! Rules kept from upstream: a pod's objects are found by the pod UID label; sandboxes and
//! containers are ordered newest first; a sandbox or container that vanishes between the list
//! and its status call is skipped, not an error; start time is reported once a container left
//! `Created`, exit code, reason, message and finish time only once it `Exited`; the image id is
//! CRI's `image_id`, falling back to `image_ref` for older runtimes; restart count and spec hash
//! come from the kubelet's annotations (decimal and hex, as upstream writes them), 0 when absent
//! or unreadable. Not here: reading termination-message files from the host (that needs the
//! pod's directories: `kuberuntime`), and any decision.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    time::{Duration, SystemTime},
};

use k8s_cri::v1 as cri;

use super::{Result, RuntimeService};
use crate::container::{
    ANNOTATION_CONTAINER_HASH, ANNOTATION_RESTART_COUNT, ContainerId, ContainerState,
    ContainerStatus, LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
    PodStatus, PodUid, RunningPod, RuntimeFeatures, RuntimeHandler, SandboxState, SandboxStatus,
};

/// The pods the runtime has, grouped by pod UID, the pod with the newest sandbox first (so a
/// pod re-created under the same name is found before its terminating predecessor, as
/// upstream). With `all == false` only ready sandboxes and running containers are listed (the
/// PLEG's and the housekeeping's view); `all == true` includes the dead (garbage collection).
///
/// Sandboxes are grouped by their metadata's UID, containers by their pod UID label; a
/// container without that label belongs to no pod the kubelet made and is left out.
pub async fn get_pods(rt: &dyn RuntimeService, all: bool) -> Result<Vec<RunningPod>> {
    let sandbox_filter = (!all).then(|| cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxReady.into(),
        }),
        ..Default::default()
    });
    let sandboxes = rt.list_pod_sandbox(sandbox_filter).await?;
    let container_filter = cri::ContainerFilter {
        state: (!all).then_some(cri::ContainerStateValue {
            state: cri::ContainerState::ContainerRunning.into(),
        }),
        ..Default::default()
    };
    let containers = rt.list_containers(Some(container_filter)).await?;

    // By UID, so the order of the result depends on creation times only (ties: by UID).
    let mut pods: BTreeMap<String, Grouped> = BTreeMap::new();
    for s in sandboxes {
        let Some(meta) = s.metadata else {
            tracing::debug!(sandbox = %s.id, "sandbox without metadata; skipped");
            continue;
        };
        let group = pods
            .entry(meta.uid.clone())
            .or_insert_with(|| Grouped::new(&meta.uid, &meta.name, &meta.namespace));
        group.newest = group.newest.max(s.created_at);
        group
            .sandboxes
            .push((s.created_at, s.id, to_sandbox_state(s.state)));
    }
    for c in containers {
        let Some(uid) = c.labels.get(LABEL_POD_UID).filter(|u| !u.is_empty()) else {
            tracing::debug!(container = %c.id, "container without a pod UID label; skipped");
            continue;
        };
        let group = pods.entry(uid.clone()).or_insert_with(|| {
            let label = |key: &str| c.labels.get(key).map_or("", String::as_str);
            Grouped::new(uid, label(LABEL_POD_NAME), label(LABEL_POD_NAMESPACE))
        });
        let name = container_name(&c.labels, c.metadata.as_ref());
        let id = ContainerId::new(rt.runtime_name(), &c.id);
        group
            .containers
            .push((c.created_at, id, name, to_container_state(c.state)));
    }

    let mut pods: Vec<Grouped> = pods.into_values().collect();
    pods.sort_by_key(|p| Reverse(p.newest));
    Ok(pods.into_iter().map(Grouped::finish).collect())
}

/// A pod being assembled by [`get_pods`]: its parts with their creation times (CRI
/// nanoseconds), sorted newest first when finished.
struct Grouped {
    pod: RunningPod,
    /// Creation time of the pod's newest sandbox (0 without one).
    newest: i64,
    sandboxes: Vec<(i64, String, SandboxState)>,
    containers: Vec<(i64, ContainerId, String, ContainerState)>,
}

impl Grouped {
    fn new(uid: &str, name: &str, namespace: &str) -> Self {
        Grouped {
            pod: RunningPod {
                uid: PodUid::from(uid),
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                sandboxes: Vec::new(),
                containers: Vec::new(),
            },
            newest: 0,
            sandboxes: Vec::new(),
            containers: Vec::new(),
        }
    }

    fn finish(mut self) -> RunningPod {
        self.sandboxes.sort_by_key(|s| Reverse(s.0));
        self.containers.sort_by_key(|c| Reverse(c.0));
        self.pod.sandboxes = self
            .sandboxes
            .into_iter()
            .map(|(_, id, s)| (id, s))
            .collect();
        self.pod.containers = self
            .containers
            .into_iter()
            .map(|(_, id, name, state)| (id, name, state))
            .collect();
        self.pod
    }
}

/// Everything the runtime knows about one pod: its sandboxes (newest first, with the pod IPs
/// on a ready one) and every container instance (newest first). A pod the runtime does not
/// know gives an empty status. `observed_at` is taken before the first call, so the status is
/// at least as new as it says (the PLEG cache relies on that).
pub async fn get_pod_status(
    rt: &dyn RuntimeService,
    uid: &PodUid,
    name: &str,
    namespace: &str,
) -> Result<PodStatus> {
    let observed_at = SystemTime::now();
    let selector = HashMap::from([(LABEL_POD_UID.to_owned(), uid.0.clone())]);

    let mut sandboxes = rt
        .list_pod_sandbox(Some(cri::PodSandboxFilter {
            label_selector: selector.clone(),
            ..Default::default()
        }))
        .await?;
    sandboxes.sort_by_key(|s| Reverse(s.created_at));
    let mut sandbox_statuses = Vec::with_capacity(sandboxes.len());
    for sandbox in &sandboxes {
        match rt.pod_sandbox_status(&sandbox.id).await {
            Ok(status) => sandbox_statuses.push(to_sandbox_status(status)),
            // Removed since the list: as if the list had not seen it.
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        }
    }

    let containers = rt
        .list_containers(Some(cri::ContainerFilter {
            label_selector: selector,
            ..Default::default()
        }))
        .await?;
    let mut container_statuses = Vec::with_capacity(containers.len());
    for container in &containers {
        match rt.container_status(&container.id).await {
            Ok(status) => container_statuses.push(to_container_status(
                status,
                &container.pod_sandbox_id,
                rt.runtime_name(),
            )),
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        }
    }
    container_statuses.sort_by_key(|c| Reverse(c.created_at));

    // A caller that knows the pod only by UID (a kernel event, an on-demand relist of a pod the
    // PLEG has not listed yet) learns its name from the sandbox.
    let meta = sandboxes.first().and_then(|s| s.metadata.as_ref());
    let name = match (name, meta) {
        ("", Some(m)) => m.name.clone(),
        _ => name.to_owned(),
    };
    let namespace = match (namespace, meta) {
        ("", Some(m)) => m.namespace.clone(),
        _ => namespace.to_owned(),
    };
    Ok(PodStatus {
        uid: uid.clone(),
        name,
        namespace,
        sandboxes: sandbox_statuses,
        containers: container_statuses,
        observed_at,
    })
}

/// A pod's status as one container event carries it (upstream `GeneratePodStatus`): the event's
/// sandbox and every container in it, newest first, observed when the runtime made the event.
/// `None` for an event without a sandbox status, or one that does not name its pod (upstream
/// ignores those: the runtime could not find the sandbox, e.g. it was just removed).
pub fn pod_status_of_event(
    event: &cri::ContainerEventResponse,
    runtime_name: &str,
) -> Option<PodStatus> {
    let sandbox = event.pod_sandbox_status.as_ref()?;
    let meta = sandbox.metadata.as_ref()?;
    if sandbox.id.is_empty() || meta.uid.is_empty() {
        return None;
    }
    let mut containers: Vec<ContainerStatus> = event
        .containers_statuses
        .iter()
        .filter(|c| !c.id.is_empty())
        .map(|c| to_container_status(c.clone(), &sandbox.id, runtime_name))
        .collect();
    containers.sort_by_key(|c| Reverse(c.created_at));
    Some(PodStatus {
        uid: PodUid::from(meta.uid.as_str()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        sandboxes: vec![to_sandbox_status(sandbox.clone())],
        containers,
        observed_at: time_from_nanos(event.created_at).unwrap_or(SystemTime::UNIX_EPOCH),
    })
}

/// One sandbox's status. Pod IPs are reported only for a ready sandbox (upstream takes them
/// from the newest sandbox when it is ready; [`PodStatus::ips`] reads the newest).
pub fn to_sandbox_status(status: cri::PodSandboxStatus) -> SandboxStatus {
    let state = to_sandbox_state(status.state);
    let host_network = status
        .linux
        .as_ref()
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .is_some_and(|o| o.network() == cri::NamespaceMode::Node);
    let ips = match (&status.network, state) {
        (Some(network), SandboxState::Ready) => sandbox_ips(network),
        _ => Vec::new(),
    };
    SandboxStatus {
        state,
        created_at: time_from_nanos(status.created_at).unwrap_or(SystemTime::UNIX_EPOCH),
        attempt: status.metadata.as_ref().map_or(0, |m| m.attempt),
        ips,
        host_network,
        labels: sorted(status.labels),
        annotations: sorted(status.annotations),
        id: status.id,
    }
}

/// The primary IP then the additional ones (upstream `determinePodSandboxIPs`); none at all if
/// any is unparseable, as upstream. Empty with host networking (the runtime reports no IP).
pub fn sandbox_ips(network: &cri::PodSandboxNetworkStatus) -> Vec<String> {
    let primary = (!network.ip.is_empty()).then_some(network.ip.as_str());
    let all: Vec<&str> = primary
        .into_iter()
        .chain(network.additional_ips.iter().map(|p| p.ip.as_str()))
        .collect();
    if let Some(bad) = all.iter().find(|ip| ip.parse::<IpAddr>().is_err()) {
        tracing::warn!(ip = %bad, "pod sandbox reported an unparseable IP; reporting none");
        return Vec::new();
    }
    all.into_iter().map(str::to_owned).collect()
}

/// One container instance's status (upstream `toKubeContainerStatus`). CRI's status does not
/// name the sandbox; the caller has it from the list.
pub fn to_container_status(
    status: cri::ContainerStatus,
    sandbox_id: &str,
    runtime_name: &str,
) -> ContainerStatus {
    let state = to_container_state(status.state);
    let exited = state == ContainerState::Exited;
    let image_ref = if status.image_id.is_empty() {
        status.image_ref
    } else {
        status.image_id
    };
    ContainerStatus {
        id: ContainerId::new(runtime_name, &status.id),
        name: container_name(&status.labels, status.metadata.as_ref()),
        state,
        created_at: time_from_nanos(status.created_at),
        // Once the container left Created, the runtime tried to start it.
        started_at: (state != ContainerState::Created)
            .then(|| time_from_nanos(status.started_at))
            .flatten(),
        finished_at: exited
            .then(|| time_from_nanos(status.finished_at))
            .flatten(),
        exit_code: exited.then_some(status.exit_code),
        reason: if exited { status.reason } else { String::new() },
        message: if exited {
            status.message
        } else {
            String::new()
        },
        image: status.image.map(|i| i.image).unwrap_or_default(),
        image_ref,
        restart_count: restart_count(&status.annotations),
        hash: container_hash_of(&status.annotations),
        sandbox_id: sandbox_id.to_owned(),
        labels: sorted(status.labels),
        annotations: sorted(status.annotations),
    }
}

/// A CRI container state (the wire value); one this client does not know is `Unknown`.
pub fn to_container_state(state: i32) -> ContainerState {
    match cri::ContainerState::try_from(state) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        Ok(cri::ContainerState::ContainerUnknown) | Err(_) => ContainerState::Unknown,
    }
}

/// A CRI sandbox state (the wire value); one this client does not know is `NotReady`, so no
/// container is started in it.
pub fn to_sandbox_state(state: i32) -> SandboxState {
    match cri::PodSandboxState::try_from(state) {
        Ok(cri::PodSandboxState::SandboxReady) => SandboxState::Ready,
        Ok(cri::PodSandboxState::SandboxNotready) | Err(_) => SandboxState::NotReady,
    }
}

/// CRI timestamps are nanoseconds since the epoch; 0 (or less) means "not set".
pub fn time_from_nanos(nanos: i64) -> Option<SystemTime> {
    let nanos = u64::try_from(nanos).ok().filter(|n| *n > 0)?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos))
}

/// The value of [`ANNOTATION_CONTAINER_HASH`] for a spec hash: lowercase hex, as upstream
/// writes it (`strconv.FormatUint(hash, 16)`), so both read each other's containers.
pub fn hash_annotation(hash: u64) -> String {
    format!("{hash:x}")
}

/// The spec hash a container was created with; 0 when absent or unreadable (upstream logs and
/// uses 0 too, which makes the container look changed and get replaced).
pub fn container_hash_of(annotations: &HashMap<String, String>) -> u64 {
    annotations
        .get(ANNOTATION_CONTAINER_HASH)
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .unwrap_or(0)
}

/// The restart count the kubelet recorded at creation; 0 when absent or unreadable.
pub fn restart_count(annotations: &HashMap<String, String>) -> u32 {
    annotations
        .get(ANNOTATION_RESTART_COUNT)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The runtime's features from its `Status` answer (upstream `toKubeRuntimeStatus`); a runtime
/// too old to report them (containerd 1.6) supports none.
pub fn runtime_features(status: &cri::StatusResponse) -> RuntimeFeatures {
    RuntimeFeatures {
        supplemental_groups_policy: status
            .features
            .as_ref()
            .is_some_and(|f| f.supplemental_groups_policy),
        handlers: status
            .runtime_handlers
            .iter()
            .map(|h| RuntimeHandler {
                name: h.name.clone(),
                user_namespaces: h.features.as_ref().is_some_and(|f| f.user_namespaces),
                recursive_read_only_mounts: h
                    .features
                    .as_ref()
                    .is_some_and(|f| f.recursive_read_only_mounts),
            })
            .collect(),
    }
}

/// The spec container's name: the kubelet's label, else the CRI metadata name (which the
/// kubelet sets to the same).
fn container_name(
    labels: &HashMap<String, String>,
    meta: Option<&cri::ContainerMetadata>,
) -> String {
    labels
        .get(LABEL_CONTAINER_NAME)
        .cloned()
        .or_else(|| meta.map(|m| m.name.clone()))
        .unwrap_or_default()
}

fn sorted(map: HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter().collect()
}

#[cfg(test)]
mod tests;
