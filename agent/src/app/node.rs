//! Facts about this node the agent needs at start: memory and CPU capacity, its IPs (`--node-ip`
//! checked against the host, or chosen by `crate::node::addresses`), and whether this process may
//! lower OOM scores. (Its resolv.conf is read for each sandbox: `kuberuntime::dns`.)

use std::{net::IpAddr, path::Path};

pub use crate::sys::has_capability;
use crate::{
    config::Config,
    node::{
        NodeIpError,
        addresses::{HostNetwork, choose_node_ips, resolve_name},
    },
};

#[derive(Clone, Debug)]
pub struct NodeFacts {
    pub memory_bytes: u64,
    pub cpu_millis: i64,
    /// The node's `InternalIP`s: the primary (the pods' `hostIP`), then one of the other family.
    pub node_ips: Vec<IpAddr>,
    /// The primary node IP.
    pub host_ip: Option<IpAddr>,
    /// CAP_SYS_RESOURCE is needed to write negative oom_score_adj values.
    pub has_cap_sys_resource: bool,
    /// The huge page sizes and pages the kernel has (read once, as upstream's container
    /// manager reads them at start).
    pub hugepages: crate::cm::hugepages::NodeHugePages,
}

impl NodeFacts {
    /// The node's memory capacity in bytes (MemTotal).
    pub fn memory_total() -> Option<i64> {
        mem_total(Path::new("/proc/meminfo")).and_then(|b| i64::try_from(b).ok())
    }

    /// Reads the host; a `--node-ip` the host does not have is an error.
    pub fn detect(config: &Config) -> Result<NodeFacts, NodeIpError> {
        let node_ips = choose_node_ips(
            &config.node_ip,
            &config.node_name,
            &HostNetwork::read(),
            resolve_name,
        )?;
        if node_ips.is_empty() {
            tracing::warn!("no usable IP address on this host: the node reports no InternalIP");
        }
        Ok(NodeFacts {
            memory_bytes: mem_total(Path::new("/proc/meminfo")).unwrap_or(0),
            cpu_millis: std::thread::available_parallelism()
                .map_or(1000, |n| n.get() as i64 * 1000),
            host_ip: node_ips.first().copied(),
            node_ips,
            has_cap_sys_resource: has_capability(24),
            hugepages: crate::cm::hugepages::NodeHugePages::read(Path::new(
                crate::cm::hugepages::SYSFS_HUGEPAGES,
            )),
        })
    }
}

fn mem_total(meminfo: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(meminfo).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_node() {
        let crate::config::Command::Run(args) =
            <crate::config::Args as clap::Parser>::parse_from(["swiftlet", "run"]).command
        else {
            panic!("not run");
        };
        let config = Config::load_with(&args, &|| Ok("swiftlet-unresolvable.invalid".into()))
            .expect("defaults");
        let facts = NodeFacts::detect(&config).expect("no --node-ip to refuse");
        assert!(facts.memory_bytes > 0);
        assert!(facts.cpu_millis >= 1000);
        assert!(facts.host_ip.is_none_or(|ip| !ip.is_loopback()));
    }
}
