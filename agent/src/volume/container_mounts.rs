//! A container's mounts (upstream `makeMounts`, `makeHostsMount` in `kubelet_pods.go`, and the
//! termination-message mount of `kuberuntime_container.go`): each volumeMount bound from its
//! set-up volume (with `subPath`, `readOnly` and `mountPropagation`), the pod's managed
//! `/etc/hosts` when the pod has an IP and no container mount covers it, and a fresh
//! termination-message file per container instance.
//!
//! Files and directories made here have upstream's modes, set explicitly: `etc-hosts` 0644, the
//! container's directory 0750, its termination-message files 0666 (the container's user, whoever
//! it is, writes its message through the bind; local accounts cannot reach it through 0750
//! parents). A subPath is bound by [`subpath::prepare`], never handed over as a path.

use std::{
    ffi::OsStr,
    fs,
    sync::atomic::{AtomicU32, Ordering},
    time::SystemTime,
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, HostAlias, Pod};

use super::{Error, Plugin, Result, VolumeManager, error::io, subpath};
use crate::{
    kuberuntime::{ContainerMounts, MountsError},
    pod_workers::pod_uid,
};

const ETC_HOSTS: &str = "/etc/hosts";
/// Upstream `managedHostsHeader`.
const MANAGED_HOSTS_HEADER: &str = "# Kubernetes-managed hosts file.\n";

impl ContainerMounts for VolumeManager {
    fn mounts(
        &self,
        pod: &Pod,
        container: &Container,
        pod_ips: &[String],
        env: &[cri::KeyValue],
    ) -> std::result::Result<Vec<cri::Mount>, MountsError> {
        Ok(self.make_mounts(pod, container, pod_ips, env)?)
    }
}

impl VolumeManager {
    fn make_mounts(
        &self,
        pod: &Pod,
        container: &Container,
        pod_ips: &[String],
        env: &[cri::KeyValue],
    ) -> Result<Vec<cri::Mount>> {
        let uid = pod_uid(pod);
        let volumes = self.mounted_volumes(&uid);
        let privileged = container
            .security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false);
        let mut mounts = Vec::new();
        let mut covers_etc_hosts = false;
        for (index, m) in container.volume_mounts.iter().flatten().enumerate() {
            let volume = volumes.get(&m.name).ok_or_else(|| Error::VolumeNotFound {
                volume: m.name.clone(),
                container: container.name.clone(),
            })?;
            let sub_path = match m.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
                Some(expr) => Some(subpath::expand(expr, env)?),
                None => m.sub_path.clone().filter(|s| !s.is_empty()),
            };
            let host_path = match sub_path.as_deref() {
                Some(sub) => subpath::prepare(
                    self.dirs(),
                    subpath::SubPath {
                        uid: &uid,
                        volume: &m.name,
                        volume_path: &volume.path,
                        host_path: volume.plugin == Plugin::HostPath,
                        container: &container.name,
                        index,
                        sub_path: sub,
                    },
                )?,
                None => volume.path.clone(),
            };
            covers_etc_hosts |= m.mount_path == ETC_HOSTS;
            mounts.push(cri::Mount {
                container_path: m.mount_path.clone(),
                host_path: host_path.to_string_lossy().into_owned(),
                // Downward API, ConfigMap and Secret files are never writable from the
                // container (upstream's `mustMountRO` attribute).
                readonly: m.read_only.unwrap_or(false) || volume.plugin.read_only(),
                propagation: propagation(m.mount_propagation.as_deref(), privileged)? as i32,
                ..Default::default()
            });
        }
        if !pod_ips.is_empty() && !covers_etc_hosts {
            mounts.push(self.hosts_mount(pod, pod_ips)?);
        }
        if let Some(path) = container
            .termination_message_path
            .as_deref()
            .filter(|p| !p.is_empty())
        {
            mounts.push(self.termination_message_mount(pod, container, path)?);
        }
        Ok(mounts)
    }

    /// Writes the pod's managed hosts file and mounts it (upstream `makeHostsMount`).
    fn hosts_mount(&self, pod: &Pod, pod_ips: &[String]) -> Result<cri::Mount> {
        let uid = pod_uid(pod);
        let path = self.dirs().etc_hosts(&uid);
        let spec = pod.spec.clone().unwrap_or_default();
        let aliases = spec.host_aliases.clone().unwrap_or_default();
        let content = if spec.host_network.unwrap_or(false) {
            // Upstream `nodeHostsFileContent`: the node's own file, plus the aliases.
            let node = fs::read_to_string(ETC_HOSTS).map_err(io("reading", ETC_HOSTS))?;
            format!("{node}{}", host_aliases(&aliases))
        } else {
            let (hostname, domain) = hostname_and_domain(pod, self.cluster_domain());
            managed_hosts(pod_ips, &hostname, domain.as_deref(), &aliases)
        };
        // Upstream writes it 0644; replaced whole, never through a link.
        self.dirs().ensure_in_pod(&uid, &[])?.replace_file(
            OsStr::new("etc-hosts"),
            content.as_bytes(),
            0o644,
        )?;
        Ok(cri::Mount {
            container_path: ETC_HOSTS.into(),
            host_path: path.to_string_lossy().into_owned(),
            ..Default::default()
        })
    }

    /// A new empty file any user may write, for this container instance's termination message.
    fn termination_message_mount(
        &self,
        pod: &Pod,
        container: &Container,
        container_path: &str,
    ) -> Result<cri::Mount> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let uid = pod_uid(pod);
        let dir = self
            .dirs()
            .ensure_in_pod(&uid, &["containers", &container.name])?;
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "{:08x}",
            nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(16)
        );
        // Upstream: created, then chmod 0666 whatever the umask.
        dir.write_new_file(OsStr::new(&name), b"", 0o666)?;
        let file = dir.child_path(OsStr::new(&name));
        Ok(cri::Mount {
            container_path: container_path.to_owned(),
            host_path: file.to_string_lossy().into_owned(),
            ..Default::default()
        })
    }
}

/// Upstream `translateMountPropagation`.
fn propagation(value: Option<&str>, privileged: bool) -> Result<cri::MountPropagation> {
    match value {
        None | Some("None") => Ok(cri::MountPropagation::PropagationPrivate),
        Some("HostToContainer") => Ok(cri::MountPropagation::PropagationHostToContainer),
        Some("Bidirectional") if privileged => Ok(cri::MountPropagation::PropagationBidirectional),
        Some("Bidirectional") => Err(Error::BidirectionalUnprivileged),
        Some(other) => Err(Error::BadPropagation(other.to_owned())),
    }
}

/// The pod's hostname and, with a subdomain and a cluster domain, its domain (upstream
/// `GeneratePodHostNameAndDomain`; the name is cut to 63 characters).
pub fn hostname_and_domain(pod: &Pod, cluster_domain: Option<&str>) -> (String, Option<String>) {
    let spec = pod.spec.as_ref();
    let hostname = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| {
            let name = pod.metadata.name.clone().unwrap_or_default();
            let cut: String = name.chars().take(63).collect();
            cut.trim_end_matches(['-', '.']).to_owned()
        });
    let domain = match (spec.and_then(|s| s.subdomain.as_deref()), cluster_domain) {
        (Some(sub), Some(cluster)) if !sub.is_empty() && !cluster.is_empty() => Some(format!(
            "{sub}.{}.svc.{cluster}",
            pod.metadata.namespace.as_deref().unwrap_or("default")
        )),
        _ => None,
    };
    (hostname, domain)
}

/// Upstream `managedHostsFileContent`.
pub fn managed_hosts(
    pod_ips: &[String],
    hostname: &str,
    domain: Option<&str>,
    aliases: &[HostAlias],
) -> String {
    let mut out = String::from(MANAGED_HOSTS_HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in pod_ips {
        match domain {
            Some(domain) => out.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n")),
            None => out.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    out.push_str(&host_aliases(aliases));
    out
}

/// Upstream `hostsEntriesFromHostAliases`.
fn host_aliases(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for alias in aliases {
        out.push_str(&format!(
            "{}\t{}\n",
            alias.ip,
            alias.hostnames.clone().unwrap_or_default().join("\t")
        ));
    }
    out
}
