//! The CRI sandbox of a pod (upstream `kuberuntime_sandbox.go` `generatePodSandboxConfig`): its
//! metadata and labels, hostname, log directory, DNS (formed by `dns.rs`), host ports, cgroup
//! parent, namespaces, sysctls and the sandbox's security context (`security_context.rs`).

use std::{collections::HashMap, path::Path};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;

use super::security_context::{SecurityContextError, namespace_options, sandbox_security_context};
use crate::container::{LABEL_MANAGED, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};

/// What the sandbox config needs besides the pod.
#[derive(Clone, Debug)]
pub struct SandboxParams<'a> {
    pub attempt: u32,
    /// The pod's cgroup, as the runtime's cgroup driver names it.
    pub cgroup_parent: &'a str,
    /// Where pod logs go (`/var/log/pods`).
    pub log_root: &'a Path,
    /// The pod's resolver (`dns::DnsSettings::pod_dns`).
    pub dns: Option<cri::DnsConfig>,
    /// The pod's user namespace (`hostUsers`), as the user-namespace manager chose it.
    pub userns: Option<cri::UserNamespace>,
}

/// `/var/log/pods/<namespace>_<name>_<uid>` (upstream `BuildPodLogsDirectory`).
pub fn pod_log_directory(log_root: &Path, pod: &Pod) -> std::path::PathBuf {
    let meta = &pod.metadata;
    log_root.join(format!(
        "{}_{}_{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default()
    ))
}

/// The labels every sandbox and container of the pod carries.
pub fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    let meta = &pod.metadata;
    let mut labels: HashMap<String, String> = meta
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    labels.insert(LABEL_POD_NAME.into(), meta.name.clone().unwrap_or_default());
    labels.insert(
        LABEL_POD_NAMESPACE.into(),
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
    );
    labels.insert(LABEL_POD_UID.into(), meta.uid.clone().unwrap_or_default());
    labels.insert(LABEL_MANAGED.into(), "true".into());
    labels
}

pub fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

pub fn sandbox_config(
    pod: &Pod,
    params: &SandboxParams<'_>,
) -> Result<cri::PodSandboxConfig, SecurityContextError> {
    let meta = &pod.metadata;
    let spec = pod.spec.clone().unwrap_or_default();
    let host_network = spec.host_network.unwrap_or(false);
    // containerd rejects a hostname for a sandbox in the node's network namespace.
    let hostname = if host_network {
        String::new()
    } else {
        spec.hostname
            .clone()
            .or_else(|| meta.name.clone())
            .unwrap_or_default()
    };
    let port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.clone().unwrap_or_default())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| cri::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => cri::Protocol::Udp as i32,
                Some("SCTP") => cri::Protocol::Sctp as i32,
                _ => cri::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or_default(),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();
    let security_context =
        sandbox_security_context(pod, namespace_options(pod, params.userns.clone()))?;
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
            attempt: params.attempt,
        }),
        hostname,
        log_directory: pod_log_directory(params.log_root, pod)
            .display()
            .to_string(),
        dns_config: params.dns.clone(),
        port_mappings,
        labels: pod_labels(pod),
        annotations: meta
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: params.cgroup_parent.to_owned(),
            security_context: Some(security_context),
            sysctls: spec
                .security_context
                .and_then(|s| s.sysctls)
                .unwrap_or_default()
                .into_iter()
                .map(|s| (s.name, s.value))
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, ContainerPort};

    fn pod(host_network: bool) -> Pod {
        crate::testing::pod()
            .named("prod", "web", "u1")
            .label("app", "web")
            .host_network(host_network)
            .container(Container {
                ports: Some(vec![ContainerPort {
                    container_port: 80,
                    host_port: Some(8080),
                    ..Default::default()
                }]),
                ..crate::testing::container("c")
            })
            .build()
    }

    fn params(root: &Path) -> SandboxParams<'_> {
        SandboxParams {
            attempt: 2,
            cgroup_parent: "/kubepods/besteffort/podu1",
            log_root: root,
            dns: Some(cri::DnsConfig {
                servers: vec!["10.0.0.2".into()],
                searches: vec!["a".into(), "b".into()],
                options: vec!["ndots:2".into()],
            }),
            userns: None,
        }
    }

    #[test]
    fn a_pod_network_sandbox_has_hostname_ports_labels_and_cgroup() {
        let root = Path::new("/var/log/pods");
        let c = sandbox_config(&pod(false), &params(root)).expect("config");
        let meta = c.metadata.clone().unwrap_or_default();
        assert_eq!(
            (meta.name.as_str(), meta.namespace.as_str(), meta.attempt),
            ("web", "prod", 2)
        );
        assert_eq!(c.hostname, "web");
        assert_eq!(c.log_directory, "/var/log/pods/prod_web_u1");
        assert_eq!(c.port_mappings.len(), 1);
        assert_eq!(c.port_mappings[0].host_port, 8080);
        assert_eq!(c.labels.get(LABEL_POD_UID).map(String::as_str), Some("u1"));
        assert_eq!(c.labels.get("app").map(String::as_str), Some("web"));
        let linux = c.linux.unwrap_or_default();
        assert_eq!(linux.cgroup_parent, "/kubepods/besteffort/podu1");
        let ns = linux
            .security_context
            .and_then(|s| s.namespace_options)
            .unwrap_or_default();
        assert_eq!(ns.network, cri::NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, cri::NamespaceMode::Container as i32);
        let dns = c.dns_config.unwrap_or_default();
        assert_eq!(dns.servers, vec!["10.0.0.2".to_owned()]);
        assert_eq!(dns.searches, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(dns.options, vec!["ndots:2".to_owned()]);
    }

    #[test]
    fn a_host_network_sandbox_has_no_hostname() {
        let c = sandbox_config(&pod(true), &params(Path::new("/x"))).expect("config");
        assert_eq!(c.hostname, "");
        let ns = c
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options)
            .unwrap_or_default();
        assert_eq!(ns.network, cri::NamespaceMode::Node as i32);
    }
}
