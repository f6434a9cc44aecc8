//! Facts about this node the agent needs at start: memory and CPU capacity, its IP, and whether
//! this process may lower OOM scores. (Its resolv.conf is read for each sandbox:
//! `kuberuntime::dns`.)

use std::{net::IpAddr, path::Path};

pub use crate::sys::has_capability;

#[derive(Clone, Debug)]
pub struct NodeFacts {
    pub memory_bytes: u64,
    pub cpu_millis: i64,
    /// The first non-loopback IPv4 address, else the first non-loopback IPv6 one.
    pub host_ip: Option<IpAddr>,
    /// CAP_SYS_RESOURCE is needed to write negative oom_score_adj values.
    pub has_cap_sys_resource: bool,
}

impl NodeFacts {
    /// The node's memory capacity in bytes (MemTotal).
    pub fn memory_total() -> Option<i64> {
        mem_total(Path::new("/proc/meminfo")).and_then(|b| i64::try_from(b).ok())
    }

    pub fn detect() -> NodeFacts {
        NodeFacts {
            memory_bytes: mem_total(Path::new("/proc/meminfo")).unwrap_or(0),
            cpu_millis: std::thread::available_parallelism()
                .map_or(1000, |n| n.get() as i64 * 1000),
            host_ip: host_ip(),
            has_cap_sys_resource: has_capability(24),
        }
    }
}

fn mem_total(meminfo: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(meminfo).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn host_ip() -> Option<IpAddr> {
    let addrs: Vec<IpAddr> = nix::ifaddrs::getifaddrs()
        .ok()?
        .filter_map(|a| {
            let addr = a.address?;
            if let Some(v4) = addr.as_sockaddr_in() {
                return Some(IpAddr::V4(v4.ip()));
            }
            addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
        })
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .collect();
    addrs
        .iter()
        .find(|ip| ip.is_ipv4())
        .or_else(|| {
            addrs
                .iter()
                .find(|ip| matches!(ip, IpAddr::V6(v6) if !v6.is_unicast_link_local()))
        })
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_node() {
        let facts = NodeFacts::detect();
        assert!(facts.memory_bytes > 0);
        assert!(facts.cpu_millis >= 1000);
        assert!(facts.host_ip.is_none_or(|ip| !ip.is_loopback()));
    }
}
