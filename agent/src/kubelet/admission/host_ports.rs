//! Whether a pod's host ports are free on this node (upstream scheduler plugin `NodePorts`
//! `Fits`, with `framework.HostPortInfo`): the host ports of the pod's containers and of its
//! sidecars (init containers with `restartPolicy: Always`, upstream `GetHostPorts`) must not be
//! taken by an active pod. A port is its (host IP, protocol, port); an empty IP means `0.0.0.0`
//! and an empty protocol TCP. `0.0.0.0` conflicts with the same protocol and port on any IP;
//! another IP conflicts with itself and with `0.0.0.0` (an IPv6 `::` is an IP like any other, as
//! upstream).
//!
//! Not here: the pod's own ports conflicting with each other (the API server's validation).

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{ContainerPort, Pod};

/// Upstream `DefaultBindAllHostIP`.
const BIND_ALL: &str = "0.0.0.0";

/// The host ports the active pods hold: IP → (protocol, port).
#[derive(Debug, Default)]
pub struct UsedPorts(HashMap<String, HashSet<(String, i32)>>);

impl UsedPorts {
    /// The ports of every pod in `pods`.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> UsedPorts {
        let mut used = UsedPorts::default();
        for pod in pods {
            for port in host_ports(pod) {
                let (ip, protocol) = sanitize(port);
                used.0
                    .entry(ip)
                    .or_default()
                    .insert((protocol, port.host_port.unwrap_or(0)));
            }
        }
        used
    }

    /// Upstream `HostPortInfo.CheckConflict`.
    fn conflicts(&self, port: &ContainerPort) -> bool {
        let (ip, protocol) = sanitize(port);
        let wanted = (protocol, port.host_port.unwrap_or(0));
        if ip == BIND_ALL {
            return self.0.values().any(|ports| ports.contains(&wanted));
        }
        [BIND_ALL, ip.as_str()].iter().any(|key| {
            self.0
                .get(*key)
                .is_some_and(|ports| ports.contains(&wanted))
        })
    }

    /// Upstream `fitsPorts`: none of `pod`'s host ports is taken.
    pub fn fits(&self, pod: &Pod) -> bool {
        !host_ports(pod).any(|port| self.conflicts(port))
    }
}

/// Upstream `HostPortInfo.sanitize`.
fn sanitize(port: &ContainerPort) -> (String, String) {
    let ip = port
        .host_ip
        .clone()
        .filter(|ip| !ip.is_empty())
        .unwrap_or_else(|| BIND_ALL.to_owned());
    let protocol = port
        .protocol
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "TCP".to_owned());
    (ip, protocol)
}

/// Upstream `GetHostPorts`: ports with a host port, of the containers and of the init
/// containers that run for the pod's whole life.
fn host_ports(pod: &Pod) -> impl Iterator<Item = &ContainerPort> {
    let spec = pod.spec.as_ref();
    let sidecars = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let containers = spec.into_iter().flat_map(|s| s.containers.iter());
    sidecars
        .chain(containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
}
