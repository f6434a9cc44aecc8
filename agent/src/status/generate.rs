//! `v1.PodStatus` from the runtime's view of a pod (upstream `generateAPIPodStatus` and
//! `convertStatusToAPIStatus` in `kubelet_pods.go`, plus the condition transition times the
//! status manager stamps).
//!
//! The pod's current `.status` serves as the previous status: it keeps terminal phases terminal,
//! preserves the phase's reason and message, conditions the kubelet does not own, transition
//! times of unchanged conditions, `startTime`, and what the runtime has forgotten about vanished
//! containers.

use std::{net::IpAddr, time::SystemTime};

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus as ApiContainerStatus, HostIP, Pod, PodCondition, PodIP,
    PodStatus as ApiPodStatus,
};

use super::{
    ContainerReadiness, PodPhase, ReasonCache, api_time, conditions, containers, phase::pod_phase,
};
use crate::cm::qos;
use crate::container::{PodStatus, SandboxState};
use crate::pod::spec;

/// The API status of `pod` given the runtime's view of it, the last start failures, the probe
/// results (`readiness`), the node's IP and the current time.
pub fn generate_api_pod_status(
    pod: &Pod,
    runtime: &PodStatus,
    reasons: &ReasonCache,
    readiness: &dyn ContainerReadiness,
    host_ip: Option<&str>,
    now: SystemTime,
) -> ApiPodStatus {
    generate(pod, runtime, reasons, readiness, host_ip, now, false)
}

/// The same for a pod the pod worker has terminated: no container will run again, so a pod whose
/// containers all stopped is Succeeded or Failed whatever its restart policy.
pub fn generate_terminal_api_pod_status(
    pod: &Pod,
    runtime: &PodStatus,
    reasons: &ReasonCache,
    readiness: &dyn ContainerReadiness,
    host_ip: Option<&str>,
    now: SystemTime,
) -> ApiPodStatus {
    generate(pod, runtime, reasons, readiness, host_ip, now, true)
}

fn generate(
    pod: &Pod,
    runtime: &PodStatus,
    reasons: &ReasonCache,
    readiness: &dyn ContainerReadiness,
    host_ip: Option<&str>,
    now: SystemTime,
    pod_is_terminal: bool,
) -> ApiPodStatus {
    let old = pod.status.clone().unwrap_or_default();
    let (init_specs, specs) = (spec::init_containers(pod), spec::containers(pod));
    let previous = |l: &Option<Vec<ApiContainerStatus>>| l.clone().unwrap_or_default();
    let mut regular = containers::convert(
        pod,
        runtime,
        reasons,
        &previous(&old.container_statuses),
        specs,
        false,
    );
    let mut init = containers::convert(
        pod,
        runtime,
        reasons,
        &previous(&old.init_container_statuses),
        init_specs,
        true,
    );

    // Upstream `convertToAPIContainerStatuses` for the ephemeral containers, as regular ones
    // (never ready, no probes): they count for neither the phase nor the conditions.
    let ephemeral_specs: Vec<Container> = spec::ephemeral_containers(pod)
        .iter()
        .map(spec::ephemeral_as_container)
        .collect();
    let ephemeral = containers::convert(
        pod,
        runtime,
        reasons,
        &previous(&old.ephemeral_container_statuses),
        &ephemeral_specs,
        false,
    );

    let all: Vec<ApiContainerStatus> = regular.iter().chain(&init).cloned().collect();
    let mut phase = pod_phase(pod, &all, pod_is_terminal, has_initialized(pod, runtime));
    // Terminal phases stick, whatever the runtime shows now.
    if let Some(old_phase) = old.phase.as_deref().and_then(PodPhase::parse)
        && old_phase.is_terminal()
    {
        phase = old_phase;
    }
    let same_phase = old.phase.as_deref() == Some(phase.as_str());
    let (reason, message) = if same_phase {
        (old.reason.clone(), old.message.clone())
    } else {
        (None, None)
    };

    containers::apply_readiness(pod, runtime, readiness, &mut regular, specs);
    containers::apply_readiness(pod, runtime, readiness, &mut init, init_specs);

    let all: Vec<ApiContainerStatus> = init.iter().chain(&regular).cloned().collect();
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let mut conds: Vec<PodCondition> = old_conditions
        .iter()
        .filter(|c| !conditions::owned_by_kubelet(&c.type_))
        .cloned()
        .collect();
    conds.push(conditions::ready_to_start_containers(pod, runtime));
    conds.push(conditions::initialized(pod, &all, phase));
    let ready = conditions::ready(pod, &conds, &all, phase);
    conds.push(ready);
    conds.push(conditions::containers_ready(pod, &all, phase));
    conds.push(conditions::scheduled());
    let generation = pod.metadata.generation;
    for c in conds
        .iter_mut()
        .filter(|c| conditions::owned_by_kubelet(&c.type_))
    {
        stamp(c, &old_conditions, now, generation);
    }

    let (host_ip, host_ips) = match host_ip {
        Some(ip) => (
            Some(ip.to_owned()),
            Some(vec![HostIP { ip: ip.to_owned() }]),
        ),
        None => (old.host_ip.clone(), old.host_ips.clone()),
    };
    let mut pod_ips = pod_ips(runtime, host_ip.as_deref());
    if pod_ips.is_empty() && spec::host_network(pod) {
        // Host-network pods have the node's address.
        pod_ips.extend(host_ip.clone());
    }

    ApiPodStatus {
        phase: Some(phase.as_str().to_owned()),
        reason,
        message,
        conditions: Some(conds),
        host_ip,
        host_ips,
        pod_ip: pod_ips.first().cloned(),
        pod_ips: (!pod_ips.is_empty())
            .then(|| pod_ips.into_iter().map(|ip| PodIP { ip }).collect()),
        qos_class: qos::pod_qos(pod).ok().map(|c| c.as_str().to_owned()),
        start_time: old.start_time.clone().or_else(|| api_time(now)),
        init_container_statuses: (!init_specs.is_empty()).then_some(init),
        container_statuses: Some(regular),
        ephemeral_container_statuses: (!ephemeral_specs.is_empty()).then_some(ephemeral),
        observed_generation: generation,
        ..ApiPodStatus::default()
    }
}

/// A regular container exists in the current sandbox: the pod initialized in this sandbox
/// (upstream `HasAnyActiveRegularContainerStarted`).
fn has_initialized(pod: &Pod, runtime: &PodStatus) -> bool {
    let Some(sandbox) = runtime.sandboxes.first() else {
        return false;
    };
    spec::containers(pod).iter().any(|c| {
        runtime
            .instances(&c.name)
            .any(|i| i.sandbox_id == sandbox.id)
    })
}

/// Keeps the transition time of a condition whose status did not change, else sets `now`.
fn stamp(c: &mut PodCondition, old: &[PodCondition], now: SystemTime, generation: Option<i64>) {
    c.last_transition_time = match old.iter().find(|o| o.type_ == c.type_) {
        Some(o) if o.status == c.status && o.last_transition_time.is_some() => {
            o.last_transition_time.clone()
        }
        _ => api_time(now),
    };
    c.observed_generation = generation;
}

/// The newest sandbox's IPs if it is ready: the first of the node's IP family, then the first of
/// the other (upstream `sortPodIPs`).
fn pod_ips(runtime: &PodStatus, host_ip: Option<&str>) -> Vec<String> {
    let Some(sandbox) = runtime
        .sandboxes
        .first()
        .filter(|s| s.state == SandboxState::Ready)
    else {
        return Vec::new();
    };
    let node_v6 = host_ip
        .and_then(|ip| ip.parse::<IpAddr>().ok())
        .is_some_and(|ip| ip.is_ipv6());
    let first_of = |v6: bool| {
        sandbox
            .ips
            .iter()
            .find(|ip| ip.parse::<IpAddr>().is_ok_and(|a| a.is_ipv6() == v6))
            .cloned()
    };
    first_of(node_v6)
        .into_iter()
        .chain(first_of(!node_v6))
        .collect()
}
