//! A pod's DNS resolver configuration, the CRI sandbox's `dns_config` (containerd writes the
//! sandbox's `/etc/resolv.conf` from it). Upstream: `pkg/kubelet/network/dns/dns.go`
//! (`Configurer.GetPodDNS`, `getPodDNSType`, `parseResolvConf`, `appendDNSConfig`,
//! `formDNSConfigFitsLimits`), with the limits of `pkg/apis/core/validation` (3 nameservers, 32
//! search paths, 2048 characters of search line, since `ExpandedDNSConfig` went GA).
//!
//! - `ClusterFirst` (off the host network) and `ClusterFirstWithHostNet`: `clusterDNS` are the
//!   only nameservers, the searches are `<ns>.svc.<domain> svc.<domain> <domain>` and then the
//!   host's, the options `ndots:5`. Without `clusterDNS` the pod falls back to `Default`, with
//!   upstream's `MissingClusterDNS` warning.
//! - `Default` (and `ClusterFirst` on the host network): the node's `resolvConf`; with
//!   `resolvConf: ""`, the node's loopback (127.0.0.1 or ::1 per node IP) and the search `.`.
//! - `None`: nothing but the pod's `dnsConfig`.
//!
//! The pod's `dnsConfig` is then merged in (duplicates dropped, options by name) and the result
//! trimmed to the limits, with upstream's `DNSConfigForming` warning naming what was applied.
//! The warnings are returned for the caller to log (upstream records them as Events).
//!
//! Hostile input: the node's resolv.conf is read once per sandbox, at most
//! [`MAX_RESOLV_CONF_BYTES`] (upstream's `maxResolveConfLength`); the pod's own values are
//! checked before they reach the runtime (the API server validates them, a static pod's
//! validation does too, but a nameserver that is not an IP or a value with whitespace or control
//! characters would write other lines into the pod's resolv.conf): such a value fails the
//! sandbox with an error naming the field.
//!
//! Deviation: upstream merges options through a Go map (their order is random); here they keep
//! the order they were first given in, an override taking the place of the option it replaces.

use std::{
    io::Read as _,
    net::IpAddr,
    path::{Path, PathBuf},
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Pod, PodDNSConfig};

/// Upstream `validation.MaxDNSNameservers`.
pub const MAX_DNS_NAMESERVERS: usize = 3;
/// Upstream `validation.MaxDNSSearchPaths` (the expanded limit).
pub const MAX_DNS_SEARCH_PATHS: usize = 32;
/// Upstream `validation.MaxDNSSearchListChars`: the search line, spaces included.
pub const MAX_DNS_SEARCH_LIST_CHARS: usize = 2048;
/// A longer search path makes some resolvers abort (upstream drops it).
const MAX_SEARCH_PATH_CHARS: usize = 253;
/// Upstream `maxResolveConfLength`: 10 MiB.
pub const MAX_RESOLV_CONF_BYTES: u64 = 10 << 20;
/// Upstream `defaultDNSOptions`.
const CLUSTER_FIRST_OPTIONS: &[&str] = &["ndots:5"];

/// The node's DNS settings (`clusterDNS`, `clusterDomain`, `resolvConf`) and its IPs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DnsSettings {
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: Option<String>,
    /// The resolv.conf `Default` pods get; `None` for `resolvConf: ""`.
    pub resolv_conf: Option<PathBuf>,
    /// The node's IPs, for the loopback nameservers without a resolv.conf.
    pub node_ips: Vec<IpAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("resolvConf {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("resolvConf {}: longer than {MAX_RESOLV_CONF_BYTES} bytes", path.display())]
    TooLong { path: PathBuf },
    /// Upstream's `parseResolvConf` fails on a `nameserver` line without an address.
    #[error("resolvConf {}: nameserver list is empty", path.display())]
    EmptyNameserver { path: PathBuf },
    #[error("{field}: invalid value {value:?}: {reason}")]
    Invalid {
        field: String,
        value: String,
        reason: &'static str,
    },
}

/// What upstream records as an Event while forming a pod's DNS (here: logged by the caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsWarning {
    /// `MissingClusterDNS`: a cluster-first pod without `clusterDNS` gets `Default`.
    MissingClusterDns,
    /// `DNSConfigForming`: more than three nameservers; the applied ones.
    NameserversOmitted(Vec<String>),
    /// `DNSConfigForming`: the search line past its limits; the applied one.
    SearchesOmitted(Vec<String>),
    /// An unknown `dnsPolicy` (the API server refuses one): cluster-first is used. Upstream only
    /// logs it; `InvalidDNSPolicy` is swiftlet's reason.
    UnknownPolicy(String),
}

impl DnsWarning {
    /// The Event reason upstream gives it.
    pub fn reason(&self) -> &'static str {
        match self {
            DnsWarning::MissingClusterDns => "MissingClusterDNS",
            DnsWarning::NameserversOmitted(_) | DnsWarning::SearchesOmitted(_) => {
                "DNSConfigForming"
            }
            DnsWarning::UnknownPolicy(_) => "InvalidDNSPolicy",
        }
    }
}

impl std::fmt::Display for DnsWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DnsWarning::MissingClusterDns => f.write_str(
                "kubelet does not have ClusterDNS IP configured and cannot create Pod using \
                 \"ClusterFirst\" policy. Falling back to \"Default\" policy.",
            ),
            DnsWarning::NameserversOmitted(applied) => write!(
                f,
                "Nameserver limits were exceeded, some nameservers have been omitted, the \
                 applied nameserver line is: {}",
                applied.join(" ")
            ),
            DnsWarning::SearchesOmitted(applied) => write!(
                f,
                "Search Line limits were exceeded, some search paths have been omitted, the \
                 applied search line is: {}",
                applied.join(" ")
            ),
            DnsWarning::UnknownPolicy(policy) => write!(
                f,
                "invalid DNSPolicy={policy}. Falling back to DNSClusterFirst policy."
            ),
        }
    }
}

/// A pod's resolver configuration and what upstream would have said about it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodDns {
    pub config: cri::DnsConfig,
    pub warnings: Vec<DnsWarning>,
}

/// Upstream `podDNSType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PodDnsType {
    Cluster,
    Host,
    None,
}

impl DnsSettings {
    /// The pod's DNS (upstream `GetPodDNS`), reading the node's resolv.conf now: an edit of it
    /// reaches the next sandbox, as upstream.
    pub fn pod_dns(&self, pod: &Pod) -> Result<PodDns, DnsError> {
        let host = match &self.resolv_conf {
            Some(path) => read_resolv_conf(path)?,
            None => cri::DnsConfig::default(),
        };
        self.form(pod, host)
    }

    /// [`DnsSettings::pod_dns`] with the node's resolv.conf already read (pure).
    pub fn form(&self, pod: &Pod, host: cri::DnsConfig) -> Result<PodDns, DnsError> {
        let spec = pod.spec.as_ref();
        let mut warnings = Vec::new();
        let policy = spec.and_then(|s| s.dns_policy.as_deref()).unwrap_or("");
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let kind = match policy {
            "None" => PodDnsType::None,
            "ClusterFirstWithHostNet" => PodDnsType::Cluster,
            "ClusterFirst" if !host_network => PodDnsType::Cluster,
            "ClusterFirst" | "Default" => PodDnsType::Host,
            other => {
                warnings.push(DnsWarning::UnknownPolicy(other.to_owned()));
                PodDnsType::Cluster
            }
        };
        let mut config = host;
        match kind {
            PodDnsType::None => config = cri::DnsConfig::default(),
            PodDnsType::Cluster if !self.cluster_dns.is_empty() => {
                config.servers = self.cluster_dns.iter().map(IpAddr::to_string).collect();
                config.searches = self.cluster_searches(&config.searches, pod);
                config.options = CLUSTER_FIRST_OPTIONS
                    .iter()
                    .map(|&o| o.to_owned())
                    .collect();
            }
            PodDnsType::Cluster | PodDnsType::Host => {
                if kind == PodDnsType::Cluster {
                    warnings.push(DnsWarning::MissingClusterDns);
                }
                if self.resolv_conf.is_none() {
                    // As the bind documentation says of no nameserver: the local machine's.
                    config.servers.extend(
                        self.node_ips
                            .iter()
                            .map(|ip| if ip.is_ipv6() { "::1" } else { "127.0.0.1" }.to_owned()),
                    );
                    if config.servers.is_empty() {
                        config.servers.push("127.0.0.1".to_owned());
                    }
                    config.searches = vec![".".to_owned()];
                }
            }
        }
        if let Some(given) = spec.and_then(|s| s.dns_config.as_ref()) {
            check_pod_dns_config(given)?;
            append_dns_config(&mut config, given);
        }
        fit_limits(&mut config, &mut warnings);
        Ok(PodDns { config, warnings })
    }

    /// Upstream `generateSearchesForDNSClusterFirst`.
    fn cluster_searches(&self, host: &[String], pod: &Pod) -> Vec<String> {
        let Some(domain) = self.cluster_domain.as_deref().filter(|d| !d.is_empty()) else {
            return host.to_vec();
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let cluster = [
            format!("{namespace}.svc.{domain}"),
            format!("svc.{domain}"),
            domain.to_owned(),
        ];
        omit_duplicates(cluster.into_iter().chain(host.iter().cloned()))
    }
}

fn omit_duplicates(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// What of a pod's `dnsConfig` would not survive being written into a resolv.conf.
fn check_pod_dns_config(given: &PodDNSConfig) -> Result<(), DnsError> {
    let invalid = |field: String, value: &str, reason| DnsError::Invalid {
        field,
        value: value.to_owned(),
        reason,
    };
    for (i, server) in given.nameservers.iter().flatten().enumerate() {
        if server.parse::<IpAddr>().is_err() {
            let field = format!("spec.dnsConfig.nameservers[{i}]");
            return Err(invalid(field, server, "must be a valid IP address"));
        }
    }
    let words = |s: &str| !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control());
    for (i, search) in given.searches.iter().flatten().enumerate() {
        if !words(search) {
            let field = format!("spec.dnsConfig.searches[{i}]");
            return Err(invalid(
                field,
                search,
                "must be one word without control characters",
            ));
        }
    }
    for (i, option) in given.options.iter().flatten().enumerate() {
        let name = option.name.as_deref().unwrap_or_default();
        if !words(name) {
            let field = format!("spec.dnsConfig.options[{i}].name");
            return Err(invalid(
                field,
                name,
                "must be one word without control characters",
            ));
        }
        if let Some(value) = option.value.as_deref()
            && !value.is_empty()
            && !words(value)
        {
            let field = format!("spec.dnsConfig.options[{i}].value");
            return Err(invalid(
                field,
                value,
                "must be one word without control characters",
            ));
        }
    }
    Ok(())
}

/// Upstream `appendDNSConfig` and `mergeDNSOptions`: the pod's options override those of the
/// same name.
fn append_dns_config(config: &mut cri::DnsConfig, given: &PodDNSConfig) {
    let servers = std::mem::take(&mut config.servers);
    config.servers = omit_duplicates(
        servers
            .into_iter()
            .chain(given.nameservers.iter().flatten().cloned()),
    );
    let searches = std::mem::take(&mut config.searches);
    config.searches = omit_duplicates(
        searches
            .into_iter()
            .chain(given.searches.iter().flatten().cloned()),
    );
    let mut options: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: &str| match options.iter_mut().find(|(n, _)| n == name) {
        Some(existing) => existing.1 = value.to_owned(),
        None => options.push((name.to_owned(), value.to_owned())),
    };
    for option in &config.options {
        match option.split_once(':') {
            Some((name, value)) => set(name, value),
            None => set(option, ""),
        }
    }
    for option in given.options.iter().flatten() {
        set(
            option.name.as_deref().unwrap_or_default(),
            option.value.as_deref().unwrap_or_default(),
        );
    }
    config.options = options
        .into_iter()
        .map(|(name, value)| {
            if value.is_empty() {
                name
            } else {
                format!("{name}:{value}")
            }
        })
        .collect();
}

/// Upstream `formDNSConfigFitsLimits`: at most three nameservers; at most 32 search paths, none
/// over 253 characters, the line within 2048 characters (cut from its end).
fn fit_limits(config: &mut cri::DnsConfig, warnings: &mut Vec<DnsWarning>) {
    if config.servers.len() > MAX_DNS_NAMESERVERS {
        config.servers.truncate(MAX_DNS_NAMESERVERS);
        warnings.push(DnsWarning::NameserversOmitted(config.servers.clone()));
    }
    let mut exceeded = false;
    if config.searches.len() > MAX_DNS_SEARCH_PATHS {
        config.searches.truncate(MAX_DNS_SEARCH_PATHS);
        exceeded = true;
    }
    let before = config.searches.len();
    config.searches.retain(|s| s.len() <= MAX_SEARCH_PATH_CHARS);
    exceeded |= config.searches.len() != before;
    let line_len =
        |s: &[String]| s.iter().map(String::len).sum::<usize>() + s.len().saturating_sub(1);
    while line_len(&config.searches) > MAX_DNS_SEARCH_LIST_CHARS {
        config.searches.pop();
        exceeded = true;
    }
    if exceeded {
        warnings.push(DnsWarning::SearchesOmitted(config.searches.clone()));
    }
}

/// Reads and parses the node's resolv.conf, at most [`MAX_RESOLV_CONF_BYTES`] of it.
pub fn read_resolv_conf(path: &Path) -> Result<cri::DnsConfig, DnsError> {
    let read = |source| DnsError::Read {
        path: path.to_owned(),
        source,
    };
    // The administrator's file, often a link into /run (systemd-resolved): followed, as upstream.
    let file = std::fs::File::open(path).map_err(read)?;
    let mut bytes = Vec::new();
    file.take(MAX_RESOLV_CONF_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_RESOLV_CONF_BYTES {
        return Err(DnsError::TooLong {
            path: path.to_owned(),
        });
    }
    parse_resolv_conf(&String::from_utf8_lossy(&bytes)).ok_or_else(|| DnsError::EmptyNameserver {
        path: path.to_owned(),
    })
}

/// Upstream `parseResolvConf`: `nameserver` lines accumulate, the last `search` and `options`
/// lines win, `#` comments are skipped, a search's trailing dot is dropped. `None` when a
/// `nameserver` line names no address (upstream's error).
pub fn parse_resolv_conf(text: &str) -> Option<cri::DnsConfig> {
    let mut dns = cri::DnsConfig::default();
    let mut empty_nameserver = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("nameserver") => match fields.next() {
                Some(server) => dns.servers.push(server.to_owned()),
                None => empty_nameserver = true,
            },
            Some("search") => {
                dns.searches = fields
                    .map(|s| s.strip_suffix('.').unwrap_or(s).to_owned())
                    .collect();
            }
            Some("options") => dns.options = fields.map(str::to_owned).collect(),
            _ => {}
        }
    }
    (!empty_nameserver).then_some(dns)
}

#[cfg(test)]
mod tests;
