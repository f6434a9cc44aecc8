//! Service environment variables: which services a pod sees (upstream `getServiceEnvVarMap` in
//! `kubelet_pods.go`: the `kubernetes` service of `default` always, and with
//! `enableServiceLinks` every service of the pod's own namespace, which wins over a master
//! service of the same name) and the variables each gives (upstream
//! `pkg/kubelet/envvars/envvars.go` `FromServices`: `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT`,
//! one `<NAME>_SERVICE_PORT_<PORT NAME>` per named port, and Docker's link variables
//! `<NAME>_PORT`, `<NAME>_PORT_<port>_<PROTO>{,_PROTO,_PORT,_ADDR}`). Only services with a
//! cluster IP count (not headless `None`, not empty).
//!
//! The services come from [`ServiceLister`] (the node's watch of them, `sources::apiserver`);
//! what it keeps of each is a [`ServiceInfo`], checked as it arrives ([`ServiceInfo::from_service`]):
//! a name that is not a DNS-1035 label, a cluster IP that is not an IP, a port name or protocol
//! the API server would refuse makes the service ignored rather than written into containers'
//! environments.

use k8s_openapi::api::core::v1::Service;

/// Upstream `metav1.NamespaceDefault`: where the master services live.
pub const MASTER_SERVICE_NAMESPACE: &str = "default";
/// Upstream `masterServices`.
pub const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// One port of a service, as its variables need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// Empty for the one unnamed port a service may have.
    pub name: String,
    pub port: i32,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: &'static str,
}

/// What the node keeps of one service with a cluster IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    pub name: String,
    pub cluster_ip: String,
    pub ports: Vec<ServicePort>,
}

/// Why a service from the API server is not kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServiceRejected {
    #[error("metadata.name is not a DNS-1035 label")]
    Name,
    #[error("spec.clusterIP is not an IP address")]
    ClusterIp,
    #[error("spec.ports: a port name is not an IANA service name")]
    PortName,
    #[error("spec.ports: a protocol is not TCP, UDP or SCTP")]
    Protocol,
    #[error("spec.ports: a port is not between 1 and 65535")]
    Port,
}

impl ServiceInfo {
    /// The service's variables' facts; `Ok(None)` for one without a cluster IP (upstream
    /// `IsServiceIPSet`).
    pub fn from_service(service: &Service) -> Result<Option<ServiceInfo>, ServiceRejected> {
        let spec = service.spec.clone().unwrap_or_default();
        let cluster_ip = spec.cluster_ip.unwrap_or_default();
        if cluster_ip.is_empty() || cluster_ip == "None" {
            return Ok(None);
        }
        let name = service.metadata.name.clone().unwrap_or_default();
        if !is_dns1035_label(&name) {
            return Err(ServiceRejected::Name);
        }
        if cluster_ip.parse::<std::net::IpAddr>().is_err() {
            return Err(ServiceRejected::ClusterIp);
        }
        let mut ports = Vec::new();
        for port in spec.ports.unwrap_or_default() {
            let port_name = port.name.unwrap_or_default();
            if !port_name.is_empty() && !is_iana_service_name(&port_name) {
                return Err(ServiceRejected::PortName);
            }
            let protocol = match port.protocol.as_deref().unwrap_or("TCP") {
                "TCP" => "TCP",
                "UDP" => "UDP",
                "SCTP" => "SCTP",
                _ => return Err(ServiceRejected::Protocol),
            };
            if !(1..=65535).contains(&port.port) {
                return Err(ServiceRejected::Port);
            }
            ports.push(ServicePort {
                name: port_name,
                port: port.port,
                protocol,
            });
        }
        Ok(Some(ServiceInfo {
            name,
            cluster_ip,
            ports,
        }))
    }
}

/// The node's services, as upstream's service lister holds them.
pub trait ServiceLister: Send + Sync {
    /// Whether the services have been listed completely at least once (upstream
    /// `serviceHasSynced`).
    fn synced(&self) -> bool;
    /// The services of `namespace` that have a cluster IP.
    fn services(&self, namespace: &str) -> Vec<ServiceInfo>;
}

/// The service variables a pod in `namespace` gets, sorted by name (upstream
/// `getServiceEnvVarMap`).
pub fn service_env(
    lister: &dyn ServiceLister,
    namespace: &str,
    enable_service_links: bool,
) -> Vec<(String, String)> {
    let mut chosen: std::collections::BTreeMap<String, ServiceInfo> = lister
        .services(MASTER_SERVICE_NAMESPACE)
        .into_iter()
        .filter(|s| MASTER_SERVICES.contains(&s.name.as_str()))
        .map(|s| (s.name.clone(), s))
        .collect();
    if enable_service_links {
        for service in lister.services(namespace) {
            chosen.insert(service.name.clone(), service);
        }
    }
    let mut vars: Vec<(String, String)> = chosen.values().flat_map(from_service).collect();
    vars.sort();
    vars.dedup_by(|a, b| a.0 == b.0);
    vars
}

/// Upstream `FromServices` for one service.
pub fn from_service(service: &ServiceInfo) -> Vec<(String, String)> {
    let prefix = env_name(&service.name);
    let ip = &service.cluster_ip;
    let mut vars = vec![(format!("{prefix}_SERVICE_HOST"), ip.clone())];
    let Some(first) = service.ports.first() else {
        // The API server refuses a service with a cluster IP and no port; nothing to say of one.
        return vars;
    };
    let port_var = format!("{prefix}_SERVICE_PORT");
    vars.push((port_var.clone(), first.port.to_string()));
    for port in service.ports.iter().filter(|p| !p.name.is_empty()) {
        vars.push((
            format!("{port_var}_{}", env_name(&port.name)),
            port.port.to_string(),
        ));
    }
    // Docker's link variables.
    for (i, port) in service.ports.iter().enumerate() {
        let proto = port.protocol.to_ascii_lowercase();
        let url = format!("{proto}://{}", join_host_port(ip, port.port));
        if i == 0 {
            vars.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", port.port, port.protocol);
        vars.push((format!("{port_prefix}_PROTO"), proto));
        vars.push((format!("{port_prefix}_PORT"), port.port.to_string()));
        vars.push((format!("{port_prefix}_ADDR"), ip.clone()));
        vars.push((port_prefix, url));
    }
    vars
}

/// Upstream `makeEnvVariableName`.
fn env_name(name: &str) -> String {
    name.replace('-', "_").to_ascii_uppercase()
}

/// Go's `net.JoinHostPort`: an IPv6 address in brackets.
fn join_host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A lowercase letter, then lowercase letters, digits and '-', ending alphanumeric, at most 63.
fn is_dns1035_label(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Upstream `IsValidPortName`: at most 15 lowercase alphanumerics and '-', a letter among them,
/// no '-' at either end or twice in a row.
fn is_iana_service_name(s: &str) -> bool {
    s.len() <= 15
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && s.bytes().any(|b| b.is_ascii_lowercase())
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{ServicePort as ApiPort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn service(name: &str, ip: &str, ports: &[(&str, i32, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|&(n, port, proto)| ApiPort {
                            name: (!n.is_empty()).then(|| n.to_owned()),
                            port,
                            protocol: (!proto.is_empty()).then(|| proto.to_owned()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn info(s: &Service) -> ServiceInfo {
        ServiceInfo::from_service(s)
            .expect("valid")
            .expect("with a cluster IP")
    }

    #[test]
    fn a_service_gives_upstreams_variables() {
        let s = info(&service(
            "my-db",
            "10.96.3.4",
            &[("", 5432, ""), ("metrics", 9187, "TCP"), ("dns", 53, "UDP")],
        ));
        let vars: BTreeMap<String, String> = from_service(&s).into_iter().collect();
        let want: BTreeMap<String, String> = [
            ("MY_DB_SERVICE_HOST", "10.96.3.4"),
            ("MY_DB_SERVICE_PORT", "5432"),
            ("MY_DB_SERVICE_PORT_METRICS", "9187"),
            ("MY_DB_SERVICE_PORT_DNS", "53"),
            ("MY_DB_PORT", "tcp://10.96.3.4:5432"),
            ("MY_DB_PORT_5432_TCP", "tcp://10.96.3.4:5432"),
            ("MY_DB_PORT_5432_TCP_PROTO", "tcp"),
            ("MY_DB_PORT_5432_TCP_PORT", "5432"),
            ("MY_DB_PORT_5432_TCP_ADDR", "10.96.3.4"),
            ("MY_DB_PORT_9187_TCP", "tcp://10.96.3.4:9187"),
            ("MY_DB_PORT_9187_TCP_PROTO", "tcp"),
            ("MY_DB_PORT_9187_TCP_PORT", "9187"),
            ("MY_DB_PORT_9187_TCP_ADDR", "10.96.3.4"),
            ("MY_DB_PORT_53_UDP", "udp://10.96.3.4:53"),
            ("MY_DB_PORT_53_UDP_PROTO", "udp"),
            ("MY_DB_PORT_53_UDP_PORT", "53"),
            ("MY_DB_PORT_53_UDP_ADDR", "10.96.3.4"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(vars, want);

        let v6 = info(&service("web", "fd00::10", &[("http", 80, "TCP")]));
        let vars: BTreeMap<String, String> = from_service(&v6).into_iter().collect();
        assert_eq!(vars["WEB_PORT"], "tcp://[fd00::10]:80");
        assert_eq!(vars["WEB_PORT_80_TCP_ADDR"], "fd00::10");
    }

    #[test]
    fn headless_and_hostile_services() {
        assert_eq!(
            ServiceInfo::from_service(&service("h", "None", &[])),
            Ok(None)
        );
        assert_eq!(ServiceInfo::from_service(&service("h", "", &[])), Ok(None));
        let cases = [
            (service("Bad", "10.0.0.1", &[]), ServiceRejected::Name),
            (service("1abc", "10.0.0.1", &[]), ServiceRejected::Name),
            (
                service("ok", "10.0.0.1\nX=1", &[]),
                ServiceRejected::ClusterIp,
            ),
            (
                service("ok", "10.0.0.1", &[("a=b", 80, "")]),
                ServiceRejected::PortName,
            ),
            (
                service("ok", "10.0.0.1", &[("", 80, "tcp ")]),
                ServiceRejected::Protocol,
            ),
            (
                service("ok", "10.0.0.1", &[("", 0, "")]),
                ServiceRejected::Port,
            ),
        ];
        for (s, want) in cases {
            assert_eq!(ServiceInfo::from_service(&s), Err(want), "{s:?}");
        }
    }

    struct Fixed(Vec<(&'static str, ServiceInfo)>);

    impl ServiceLister for Fixed {
        fn synced(&self) -> bool {
            true
        }
        fn services(&self, namespace: &str) -> Vec<ServiceInfo> {
            self.0
                .iter()
                .filter(|(ns, _)| *ns == namespace)
                .map(|(_, s)| s.clone())
                .collect()
        }
    }

    #[test]
    fn master_services_always_the_namespaces_with_links() {
        let lister = Fixed(vec![
            (
                "default",
                info(&service(
                    "kubernetes",
                    "10.96.0.1",
                    &[("https", 443, "TCP")],
                )),
            ),
            (
                "default",
                info(&service("other", "10.96.0.2", &[("", 80, "")])),
            ),
            (
                "app",
                info(&service("cache", "10.96.0.3", &[("", 6379, "")])),
            ),
            (
                "shadow",
                info(&service("kubernetes", "10.96.9.9", &[("", 8443, "")])),
            ),
        ]);
        let names = |vars: Vec<(String, String)>| -> Vec<String> {
            vars.into_iter()
                .filter(|(k, _)| k.ends_with("_SERVICE_HOST"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        };
        assert_eq!(
            names(service_env(&lister, "app", true)),
            [
                "CACHE_SERVICE_HOST=10.96.0.3",
                "KUBERNETES_SERVICE_HOST=10.96.0.1"
            ]
        );
        assert_eq!(
            names(service_env(&lister, "app", false)),
            ["KUBERNETES_SERVICE_HOST=10.96.0.1"]
        );
        assert_eq!(
            names(service_env(&lister, "default", false)),
            ["KUBERNETES_SERVICE_HOST=10.96.0.1"]
        );
        assert_eq!(
            names(service_env(&lister, "default", true)),
            [
                "KUBERNETES_SERVICE_HOST=10.96.0.1",
                "OTHER_SERVICE_HOST=10.96.0.2"
            ]
        );
        // A namespace's own `kubernetes` service wins over the master one, with links.
        assert_eq!(
            names(service_env(&lister, "shadow", true)),
            ["KUBERNETES_SERVICE_HOST=10.96.9.9"]
        );
        let vars = service_env(&lister, "app", true);
        let mut sorted = vars.clone();
        sorted.sort();
        assert_eq!(vars, sorted);
    }
}
