//! Small value types of the validated configuration: the PLEG mode, the cgroup driver, a CIDR,
//! the TLS version, the CPU manager's policy and when its assignments apply. Each parses from the
//! text an operator writes (its error says what was expected) and prints back the same way.
//!
//! Not here: where values come from or their defaults (`settings.rs`). Upstream: the
//! string-typed fields `cgroupDriver`, `podCIDR`, `tlsMinVersion` and `cpuManagerPolicy` of
//! `KubeletConfiguration`.

use std::{fmt, net::IpAddr, str::FromStr};

use clap::ValueEnum;

/// How the agent learns that containers changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum PlegMode {
    /// List the runtime every `plegRelistPeriod`, as the kubelet's generic PLEG does.
    Relist,
    /// Kernel events (exit, OOM kill, cgroup changes) with a slow relist as the safety net. The
    /// default whenever the programs load.
    #[default]
    Ebpf,
    /// The runtime's CRI container events (`GetContainerEvents`, containerd >= 1.7) with a slow
    /// relist as the safety net: upstream's Evented PLEG.
    Evented,
}

impl PlegMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PlegMode::Relist => "relist",
            PlegMode::Ebpf => "ebpf",
            PlegMode::Evented => "evented",
        }
    }
}

impl FromStr for PlegMode {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "relist" => Ok(PlegMode::Relist),
            "ebpf" => Ok(PlegMode::Ebpf),
            "evented" => Ok(PlegMode::Evented),
            _ => Err(()),
        }
    }
}

impl fmt::Display for PlegMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The cgroup driver (`cgroupDriver`); named where the pods' cgroup paths are.
pub use crate::cgroup::pods::CgroupDriver;

/// An IP network such as `10.244.1.0/24` or `fd00::/64`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl FromStr for Cidr {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = s
            .split_once('/')
            .ok_or("expected an address and a prefix length, e.g. 10.244.1.0/24")?;
        let addr: IpAddr = addr.parse().map_err(|_| "not an IP address")?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or("the prefix length is out of range")?;
        Ok(Cidr { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The lowest TLS version the full server accepts (rustls speaks only 1.2 and 1.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsVersion {
    #[default]
    Tls12,
    Tls13,
}

impl FromStr for TlsVersion {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "VersionTLS12" => Ok(TlsVersion::Tls12),
            "VersionTLS13" => Ok(TlsVersion::Tls13),
            "VersionTLS10" | "VersionTLS11" => {
                Err("TLS 1.0 and 1.1 are not supported: use VersionTLS12 or VersionTLS13")
            }
            _ => Err("expected VersionTLS12 or VersionTLS13"),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuManagerPolicy {
    /// Every container runs on every CPU the pods may use (the kubelet's default).
    #[default]
    None,
    /// Guaranteed containers with a whole number of CPUs get them exclusively.
    Static,
}

impl CpuManagerPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuManagerPolicy::None => "none",
            CpuManagerPolicy::Static => "static",
        }
    }
}

impl FromStr for CpuManagerPolicy {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(CpuManagerPolicy::None),
            "static" => Ok(CpuManagerPolicy::Static),
            _ => Err("expected \"none\" or \"static\""),
        }
    }
}

/// When CPU assignments are written to the containers' cpusets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuApply {
    /// At once: the shared pool of every container when an assignment changes it, and a
    /// container's own set at creation and on its start event; the reconcile is the safety net.
    #[default]
    Events,
    /// Only on the periodic reconcile (and at creation), as the kubelet does: containers may
    /// share "exclusive" CPUs for up to one period. For comparison (`cargo xtask bench
    /// cpumanager`).
    Reconcile,
}

impl CpuApply {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuApply::Events => "events",
            CpuApply::Reconcile => "reconcile",
        }
    }
}

impl FromStr for CpuApply {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "events" => Ok(CpuApply::Events),
            "reconcile" => Ok(CpuApply::Reconcile),
            _ => Err("expected \"events\" or \"reconcile\""),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        assert_eq!(
            "10.244.1.0/24".parse::<Cidr>().map(|c| c.to_string()),
            Ok("10.244.1.0/24".to_owned())
        );
        assert!("fd00::/64".parse::<Cidr>().is_ok());
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("10.0.0.0".parse::<Cidr>().is_err());
        assert!("nope/8".parse::<Cidr>().is_err());
    }

    #[test]
    fn pleg_modes() {
        assert_eq!("ebpf".parse(), Ok(PlegMode::Ebpf));
        assert_eq!("relist".parse(), Ok(PlegMode::Relist));
        assert_eq!("evented".parse(), Ok(PlegMode::Evented));
        assert_eq!(PlegMode::Evented.to_string(), "evented");
        assert_eq!("generic".parse::<PlegMode>(), Err(()));
    }
}

/// How the ConfigMaps and Secrets pods reference are kept current
/// (`configMapAndSecretChangeDetectionStrategy`, upstream's `ResourceChangeDetectionStrategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChangeDetectionStrategy {
    /// A GET from the API server at every read.
    Get,
    /// A GET at most once per TTL (a minute), and when a pod newly references the object.
    Cache,
    /// One watch per referenced object (upstream's default).
    #[default]
    Watch,
}

impl FromStr for ChangeDetectionStrategy {
    type Err = &'static str;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Get" => Ok(ChangeDetectionStrategy::Get),
            "Cache" => Ok(ChangeDetectionStrategy::Cache),
            "Watch" => Ok(ChangeDetectionStrategy::Watch),
            _ => Err("must be one of: \"Watch\", \"Cache\", or \"Get\""),
        }
    }
}
