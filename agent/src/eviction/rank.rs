//! Which pod goes first, and what its status says. Ranking is upstream's: for memory, pods whose
//! usage exceeds their requests, then lower priority, then usage above requests; for pids,
//! priority then process count; for disk, pods over their ephemeral-storage request, then
//! priority, then usage above request. A pod with no usage figures goes first (upstream: "evict
//! the pod for which no stats were found").
//!
//! Not here: where the usage figures come from (`observe.rs`). Upstream:
//! `pkg/kubelet/eviction/helpers.go` (`rankMemoryPressure`, `rankPIDPressure`,
//! `rankDiskPressureFunc`, `evictionMessage`).

use std::{cmp::Ordering, collections::HashMap, sync::Arc};

use k8s_openapi::api::core::v1::Pod;

use super::logic::{Observation, Resource, quantity};
use super::thresholds::{Operator, Threshold, ThresholdValue};
use crate::{
    container::PodUid,
    pod::{pod_uid, quantity::memory_bytes, resources::pod_requests},
};

/// What a pod uses, read at the moment of the decision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodUsage {
    /// Working set of the pod's cgroup (usage minus inactive file).
    pub memory_working_set: Option<i64>,
    /// Working set per container, by container name.
    pub containers: Vec<(String, i64)>,
    pub processes: Option<i64>,
    /// Bytes the pod writes on the node's filesystem (its logs).
    pub disk_bytes: Option<i64>,
}

pub type UsageByPod = HashMap<PodUid, PodUsage>;

/// The pod's priority (upstream: a pod without one counts as 0).
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn memory_request(pod: &Pod) -> i64 {
    pod_requests(pod).map(|(_, m)| m).unwrap_or(0)
}

fn ephemeral_request(pod: &Pod) -> i64 {
    let spec = pod.spec.clone().unwrap_or_default();
    spec.containers
        .iter()
        .filter_map(|c| {
            c.resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("ephemeral-storage")
                .and_then(|q| memory_bytes(&q.0).ok())
        })
        .sum()
}

/// Orders pods most-evictable first for `resource`.
pub fn rank(resource: Resource, pods: &mut [Arc<Pod>], usage: &UsageByPod) {
    let get = |p: &Pod| usage.get(&pod_uid(p));
    pods.sort_by(|a, b| {
        let (ua, ub) = (get(a), get(b));
        let by_priority = priority(a).cmp(&priority(b));
        match resource {
            Resource::Memory => {
                let used = |p: &Pod, u: Option<&PodUsage>| {
                    u.and_then(|u| u.memory_working_set)
                        .map(|m| m - memory_request(p))
                };
                let (xa, xb) = (used(a, ua), used(b, ub));
                missing_first(xa, xb)
                    .then_with(|| exceeds_first(xa, xb))
                    .then(by_priority)
                    .then_with(|| more_first(xa, xb))
            }
            Resource::Pids => {
                let (na, nb) = (ua.and_then(|u| u.processes), ub.and_then(|u| u.processes));
                missing_first(na, nb)
                    .then(by_priority)
                    .then_with(|| more_first(na, nb))
            }
            Resource::Disk | Resource::Inodes => {
                let used = |p: &Pod, u: Option<&PodUsage>| {
                    u.and_then(|u| u.disk_bytes)
                        .map(|d| d - ephemeral_request(p))
                };
                let (xa, xb) = (used(a, ua), used(b, ub));
                missing_first(xa, xb)
                    .then_with(|| exceeds_first(xa, xb))
                    .then(by_priority)
                    .then_with(|| more_first(xa, xb))
            }
        }
    });
}

fn missing_first(a: Option<i64>, b: Option<i64>) -> Ordering {
    // `false < true`: the pod whose figure is missing sorts first.
    a.is_some().cmp(&b.is_some())
}

/// Pods using more than they requested come first.
fn exceeds_first(a: Option<i64>, b: Option<i64>) -> Ordering {
    let over = |x: Option<i64>| x.is_some_and(|x| x > 0);
    over(b).cmp(&over(a))
}

fn more_first(a: Option<i64>, b: Option<i64>) -> Ordering {
    b.unwrap_or(0).cmp(&a.unwrap_or(0))
}

/// Upstream's quantity formatting for messages: binary suffixes for exact multiples.
pub fn format_bytes(v: i64) -> String {
    const UNITS: [(&str, i64); 4] = [("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10), ("", 1)];
    if v == 0 {
        return "0".into();
    }
    for (suffix, unit) in UNITS {
        if v % unit == 0 {
            return format!("{}{suffix}", v / unit);
        }
    }
    v.to_string()
}

fn format_value(resource: Resource, v: i64) -> String {
    match resource {
        Resource::Memory | Resource::Disk => format_bytes(v),
        Resource::Pids | Resource::Inodes => v.to_string(),
    }
}

/// The evicted pod's status message (upstream `evictionMessage`), e.g. "The node was low on
/// resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container main was using 300Mi,
/// request is 0, has larger consumption of memory. "
pub fn eviction_message(
    resource: Resource,
    threshold: &Threshold,
    observed: Option<&Observation>,
    pod: &Pod,
    usage: Option<&PodUsage>,
) -> String {
    let mut message = format!("The node was low on resource: {}. ", resource.as_str());
    if let Some(o) = observed {
        let bar = quantity(threshold.value, o.capacity);
        match (threshold.operator, threshold.value) {
            (Operator::GreaterThan, ThresholdValue::Percentage(p)) => {
                message += &format!(
                    "Threshold {} exceeded: {:.2} > {:.2}. ",
                    threshold.signal,
                    o.available as f64 / 100.0,
                    p * 100.0
                );
            }
            _ => {
                message += &format!(
                    "Threshold quantity: {}, available: {}. ",
                    format_value(resource, bar),
                    format_value(resource, o.available)
                );
            }
        }
    }
    if resource == Resource::Memory
        && let Some(u) = usage
    {
        let spec = pod.spec.clone().unwrap_or_default();
        for (name, used) in &u.containers {
            let request = spec
                .containers
                .iter()
                .find(|c| &c.name == name)
                .and_then(|c| {
                    let r = c.resources.as_ref()?;
                    r.requests
                        .as_ref()
                        .and_then(|m| m.get("memory"))
                        .or_else(|| r.limits.as_ref().and_then(|m| m.get("memory")))
                        .and_then(|q| memory_bytes(&q.0).ok())
                })
                .unwrap_or(0);
            if *used > request {
                message += &format!(
                    "Container {name} was using {}, request is {}, has larger consumption of {}. ",
                    format_bytes(*used),
                    format_bytes(request),
                    resource.as_str()
                );
            }
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{Container, ResourceRequirements},
        apimachinery::pkg::api::resource::Quantity,
    };

    const MI: i64 = 1 << 20;

    fn pod(uid: &str, request: Option<&str>, priority: Option<i32>) -> Arc<Pod> {
        let requests = request
            .map(|r| std::collections::BTreeMap::from([("memory".to_owned(), Quantity(r.into()))]));
        crate::testing::pod()
            .uid(uid)
            .name(uid)
            .spec(|s| s.priority = priority)
            .container(Container {
                resources: Some(ResourceRequirements {
                    requests: requests.clone(),
                    limits: requests,
                    ..Default::default()
                }),
                ..crate::testing::container("main")
            })
            .arc()
    }

    fn usage(ws: i64) -> PodUsage {
        PodUsage {
            memory_working_set: Some(ws),
            containers: vec![("main".into(), ws)],
            processes: Some(1),
            disk_bytes: Some(0),
        }
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<String> {
        pods.iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn memory_over_requests_goes_before_priority_and_size() {
        let mut pods = vec![
            pod("guaranteed-big", Some("300Mi"), None),
            pod("besteffort-small", None, Some(100)),
            pod("burstable-over", Some("10Mi"), None),
        ];
        let u = UsageByPod::from([
            (PodUid::from("guaranteed-big"), usage(250 * MI)),
            (PodUid::from("besteffort-small"), usage(50 * MI)),
            (PodUid::from("burstable-over"), usage(20 * MI)),
        ]);
        rank(Resource::Memory, &mut pods, &u);
        // Both over their requests: the lower priority first (0 < 100); the pod within its
        // request last, however large.
        assert_eq!(
            names(&pods),
            ["burstable-over", "besteffort-small", "guaranteed-big"]
        );
    }

    #[test]
    fn a_pod_without_figures_goes_first() {
        let mut pods = vec![pod("a", None, None), pod("b", None, None)];
        let u = UsageByPod::from([(PodUid::from("a"), usage(500 * MI))]);
        rank(Resource::Memory, &mut pods, &u);
        assert_eq!(names(&pods), ["b", "a"]);
    }

    #[test]
    fn pids_rank_by_priority_then_count() {
        let mut pods = vec![
            pod("many-high", None, Some(10)),
            pod("few", None, None),
            pod("many", None, None),
        ];
        let with = |n| PodUsage {
            processes: Some(n),
            ..usage(0)
        };
        let u = UsageByPod::from([
            (PodUid::from("many-high"), with(100)),
            (PodUid::from("few"), with(2)),
            (PodUid::from("many"), with(50)),
        ]);
        rank(Resource::Pids, &mut pods, &u);
        assert_eq!(names(&pods), ["many", "few", "many-high"]);
    }

    #[test]
    fn the_message_names_threshold_usage_and_container() {
        let t = Threshold {
            signal: crate::eviction::thresholds::Signal::MemoryAvailable,
            operator: Operator::LessThan,
            value: ThresholdValue::Quantity(100 * MI),
            grace_period: std::time::Duration::ZERO,
            min_reclaim: None,
            text: "memory.available<100Mi".into(),
        };
        let p = pod("x", None, None);
        let m = eviction_message(
            Resource::Memory,
            &t,
            Some(&Observation {
                available: 50 * MI,
                capacity: 1024 * MI,
            }),
            &p,
            Some(&usage(300 * MI)),
        );
        assert_eq!(
            m,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
             Container main was using 300Mi, request is 0, has larger consumption of memory. "
        );
    }
}
