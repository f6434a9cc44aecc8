//! The node's IPs (`InternalIP`): `--node-ip` parsed as upstream's
//! `component-helpers/node/util` `ParseNodeIPArgument` (one IP, or one per family), checked as
//! `validateNodeIP` checks them, and when none is given chosen as the `NodeAddress` setter of
//! `pkg/kubelet/nodestatus/setters.go` chooses: the node name when it is an IP, else the first
//! valid address the node name resolves to (IPv4 preferred unless `--node-ip ::`), else the
//! global address of the interface of the default route (apimachinery `util/net`
//! `ResolveBindAddress`/`chooseHostInterfaceFromRoute`). The first IP is the pods' `hostIP`
//! (upstream `nodeutil.GetNodeHostIPs`); a second, of the other family, is the node's other
//! `InternalIP`.
//!
//! Deliberate differences: a given IP that is not the host's stops the agent at start (upstream
//! logs it at every status update and reports no address), and when no default route leads to
//! an address any up interface's global address is taken (upstream does that only without
//! `/proc/net/route`), so a node without a default route still has an address. The choice is
//! made once, at start.
//!
//! The host's facts ([`HostNetwork`]) are read by [`HostNetwork::read`]; the choice itself is
//! pure. Not here: how the addresses appear in the Node's status (`sources::apiserver`).

use std::{
    net::{IpAddr, Ipv4Addr, ToSocketAddrs as _},
    path::Path,
};

/// Why the node's IPs could not be taken as given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NodeIpError {
    #[error("could not parse {value:?} as an IP address")]
    Parse { value: String },
    #[error("must contain either a single IP or a dual-stack pair of IPs")]
    Count,
    #[error("dual-stack node IP cannot include '0.0.0.0' or '::'")]
    DualStackUnspecified,
    /// Upstream `validateNodeIP`'s reasons (`nodeIP can't be loopback address`, ...).
    #[error("node IP {ip}: {reason}")]
    Invalid { ip: IpAddr, reason: &'static str },
    #[error("node IP {ip} not found in the host's network interfaces")]
    NotOnHost { ip: IpAddr },
}

/// Upstream `parseNodeIP` (strict: every item must parse): at most two IPs, two only of
/// different families and neither unspecified.
pub fn parse_node_ips<S: AsRef<str>>(items: &[S]) -> Result<Vec<IpAddr>, NodeIpError> {
    let ips = items
        .iter()
        .map(|item| {
            let item = item.as_ref().trim();
            item.parse::<IpAddr>().map_err(|_| NodeIpError::Parse {
                value: item.to_owned(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    match ips.as_slice() {
        [a, b] if a.is_ipv6() == b.is_ipv6() => Err(NodeIpError::Count),
        [a, b] if a.is_unspecified() || b.is_unspecified() => {
            Err(NodeIpError::DualStackUnspecified)
        }
        [_, _, _, ..] => Err(NodeIpError::Count),
        _ => Ok(ips),
    }
}

/// An address of one of the host's interfaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceAddress {
    pub interface: String,
    pub up: bool,
    pub ip: IpAddr,
}

/// What the choice needs to know about the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostNetwork {
    pub addresses: Vec<InterfaceAddress>,
    /// Interfaces of the IPv4 and IPv6 default routes, in the routing tables' order.
    pub default_routes_v4: Vec<String>,
    pub default_routes_v6: Vec<String>,
}

impl HostNetwork {
    /// Reads the host's interfaces (`getifaddrs`) and default routes (`/proc/net/route`,
    /// `/proc/net/ipv6_route`). Unreadable parts are empty: the choice falls back.
    pub fn read() -> HostNetwork {
        let addresses = nix::ifaddrs::getifaddrs()
            .map(|all| {
                all.filter_map(|a| {
                    let address = a.address?;
                    let ip = address
                        .as_sockaddr_in()
                        .map(|v4| IpAddr::V4(v4.ip()))
                        .or_else(|| address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))?;
                    Some(InterfaceAddress {
                        interface: a.interface_name,
                        up: a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP),
                        ip,
                    })
                })
                .collect()
            })
            .unwrap_or_default();
        let read = |path: &str| std::fs::read_to_string(Path::new(path)).unwrap_or_default();
        HostNetwork {
            addresses,
            default_routes_v4: default_routes_v4(&read("/proc/net/route")),
            default_routes_v6: default_routes_v6(&read("/proc/net/ipv6_route")),
        }
    }

    fn has(&self, ip: IpAddr) -> bool {
        self.addresses.iter().any(|a| a.ip == ip)
    }

    /// The first global address of `family` on interface `name`, if it is up (upstream
    /// `getIPFromInterface`).
    fn global_on(&self, name: &str, v6: bool) -> Option<IpAddr> {
        self.addresses
            .iter()
            .find(|a| a.interface == name && a.up && a.ip.is_ipv6() == v6 && is_global(a.ip))
            .map(|a| a.ip)
    }
}

/// The interfaces of the IPv4 default routes in `/proc/net/route` (destination and mask 0).
pub fn default_routes_v4(table: &str) -> Vec<String> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (iface, destination, mask) = (fields.first()?, fields.get(1)?, fields.get(7)?);
            (*destination == "00000000" && *mask == "00000000").then(|| (*iface).to_owned())
        })
        .collect()
}

/// The interfaces of the IPv6 default routes in `/proc/net/ipv6_route` (`::/0`).
pub fn default_routes_v6(table: &str) -> Vec<String> {
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (destination, prefix, iface) = (fields.first()?, fields.get(1)?, fields.get(9)?);
            let any = destination.len() == 32 && destination.bytes().all(|b| b == b'0');
            (any && *prefix == "00" && *iface != "lo").then(|| (*iface).to_owned())
        })
        .collect()
}

/// Go's `IP.IsGlobalUnicast`: not loopback, multicast, link-local, unspecified or broadcast
/// (private ranges count as global).
pub fn is_global(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_multicast()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4 == Ipv4Addr::BROADCAST)
        }
        IpAddr::V6(v6) => {
            !(v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unicast_link_local()
                || v6.is_unspecified())
        }
    }
}

/// Upstream `validateNodeIP`: a usable address that one of the host's interfaces has.
pub fn validate_node_ip(ip: IpAddr, host: &HostNetwork) -> Result<(), NodeIpError> {
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    let reason = if ip.is_loopback() {
        Some("nodeIP can't be loopback address")
    } else if ip.is_multicast() {
        Some("nodeIP can't be a multicast address")
    } else if link_local {
        Some("nodeIP can't be a link-local unicast address")
    } else if ip.is_unspecified() {
        Some("nodeIP can't be an all zeros address")
    } else {
        None
    };
    if let Some(reason) = reason {
        return Err(NodeIpError::Invalid { ip, reason });
    }
    if !host.has(ip) {
        return Err(NodeIpError::NotOnHost { ip });
    }
    Ok(())
}

/// The node's IPs: the primary first, then one of the other family when `--node-ip` gave two.
/// Empty when nothing usable was found. `resolve` looks the node name up (only called when
/// neither `given` nor the name itself is an IP).
pub fn choose_node_ips(
    given: &[IpAddr],
    node_name: &str,
    host: &HostNetwork,
    resolve: impl FnOnce(&str) -> Vec<IpAddr>,
) -> Result<Vec<IpAddr>, NodeIpError> {
    let specified: Vec<IpAddr> = given
        .iter()
        .copied()
        .filter(|ip| !ip.is_unspecified())
        .collect();
    for ip in &specified {
        validate_node_ip(*ip, host)?;
    }
    if let Some(primary) = given.first().filter(|ip| !ip.is_unspecified()) {
        let mut ips = vec![*primary];
        ips.extend(given.get(1).filter(|ip| !ip.is_unspecified()));
        return Ok(ips);
    }
    // `--node-ip ::` asks for IPv6 first.
    let prefer_v6 = given.first().is_some_and(IpAddr::is_ipv6);
    if let Ok(ip) = node_name.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let mut fallback = None;
    for ip in resolve(node_name) {
        if validate_node_ip(ip, host).is_err() {
            continue;
        }
        if ip.is_ipv6() == prefer_v6 {
            return Ok(vec![ip]);
        }
        fallback.get_or_insert(ip);
    }
    if let Some(ip) = fallback {
        return Ok(vec![ip]);
    }
    Ok(from_default_route(host, prefer_v6)
        .or_else(|| from_any_interface(host, prefer_v6))
        .into_iter()
        .collect())
}

/// Upstream `chooseHostInterfaceFromRoute`: per family, preferred first, each default route's
/// interface's global address, else a global address on the loopback interface.
fn from_default_route(host: &HostNetwork, prefer_v6: bool) -> Option<IpAddr> {
    [prefer_v6, !prefer_v6].into_iter().find_map(|v6| {
        let routes = if v6 {
            &host.default_routes_v6
        } else {
            &host.default_routes_v4
        };
        routes.iter().find_map(|iface| {
            host.global_on(iface, v6)
                .or_else(|| host.global_on("lo", v6))
        })
    })
}

/// Upstream `chooseIPFromHostInterfaces`: the first global address of an up interface.
fn from_any_interface(host: &HostNetwork, prefer_v6: bool) -> Option<IpAddr> {
    [prefer_v6, !prefer_v6].into_iter().find_map(|v6| {
        host.addresses
            .iter()
            .find(|a| a.up && a.ip.is_ipv6() == v6 && is_global(a.ip))
            .map(|a| a.ip)
    })
}

/// What the node name resolves to (`net.LookupIP`), through the system's resolver.
pub fn resolve_name(name: &str) -> Vec<IpAddr> {
    (name, 0)
        .to_socket_addrs()
        .map(|addrs| addrs.map(|a| a.ip()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }

    fn host() -> HostNetwork {
        let address = |iface: &str, up: bool, s: &str| InterfaceAddress {
            interface: iface.into(),
            up,
            ip: ip(s),
        };
        HostNetwork {
            addresses: vec![
                address("lo", true, "127.0.0.1"),
                address("lo", true, "::1"),
                address("br0", false, "10.88.0.1"),
                address("eth0", true, "fe80::1"),
                address("eth0", true, "192.0.2.2"),
                address("eth0", true, "fd00::2"),
                address("eth1", true, "198.51.100.7"),
            ],
            default_routes_v4: vec!["eth0".into()],
            default_routes_v6: vec!["eth0".into()],
        }
    }

    fn nothing(_: &str) -> Vec<IpAddr> {
        Vec::new()
    }

    #[test]
    fn node_ip_flags_as_upstream_parses_them() {
        assert_eq!(parse_node_ips(&["10.0.0.1"]), Ok(vec![ip("10.0.0.1")]));
        assert_eq!(
            parse_node_ips(&["10.0.0.1", " fd00::1"]),
            Ok(vec![ip("10.0.0.1"), ip("fd00::1")])
        );
        assert_eq!(parse_node_ips(&["::"]), Ok(vec![ip("::")]));
        assert_eq!(
            parse_node_ips(&["10.0.0.1", "10.0.0.2"]),
            Err(NodeIpError::Count)
        );
        assert_eq!(
            parse_node_ips(&["10.0.0.1", "fd00::1", "10.0.0.2"]),
            Err(NodeIpError::Count)
        );
        assert_eq!(
            parse_node_ips(&["0.0.0.0", "fd00::1"]),
            Err(NodeIpError::DualStackUnspecified)
        );
        assert_eq!(
            parse_node_ips(&["10.0.0.300"]),
            Err(NodeIpError::Parse {
                value: "10.0.0.300".into()
            })
        );
    }

    #[test]
    fn given_ips_must_be_the_hosts() {
        let host = host();
        assert_eq!(
            choose_node_ips(&[ip("198.51.100.7"), ip("fd00::2")], "n", &host, nothing),
            Ok(vec![ip("198.51.100.7"), ip("fd00::2")])
        );
        assert_eq!(
            choose_node_ips(&[ip("203.0.113.9")], "n", &host, nothing),
            Err(NodeIpError::NotOnHost {
                ip: ip("203.0.113.9")
            })
        );
        for (bad, reason) in [
            ("127.0.0.1", "nodeIP can't be loopback address"),
            ("fe80::1", "nodeIP can't be a link-local unicast address"),
            ("224.0.0.1", "nodeIP can't be a multicast address"),
        ] {
            assert_eq!(
                choose_node_ips(&[ip(bad)], "n", &host, nothing),
                Err(NodeIpError::Invalid {
                    ip: ip(bad),
                    reason
                })
            );
        }
    }

    #[test]
    fn without_a_given_ip_the_name_then_its_resolution_then_the_default_route() {
        let host = host();
        // A node named by an IP is that IP.
        assert_eq!(
            choose_node_ips(&[], "203.0.113.5", &host, nothing),
            Ok(vec![ip("203.0.113.5")])
        );
        // The name's resolution: loopback and foreign addresses skipped, IPv4 preferred.
        let resolves = |_: &str| vec![ip("127.0.0.1"), ip("fd00::2"), ip("198.51.100.7")];
        assert_eq!(
            choose_node_ips(&[], "n", &host, resolves),
            Ok(vec![ip("198.51.100.7")])
        );
        // `--node-ip ::` prefers IPv6 everywhere.
        assert_eq!(
            choose_node_ips(&[ip("::")], "n", &host, resolves),
            Ok(vec![ip("fd00::2")])
        );
        let only_v6 = |_: &str| vec![ip("fd00::2")];
        assert_eq!(
            choose_node_ips(&[], "n", &host, only_v6),
            Ok(vec![ip("fd00::2")])
        );
        // Nothing resolves: the default route's interface, not eth1 or the bridge.
        assert_eq!(
            choose_node_ips(&[], "n", &host, nothing),
            Ok(vec![ip("192.0.2.2")])
        );
        assert_eq!(
            choose_node_ips(&[ip("::")], "n", &host, nothing),
            Ok(vec![ip("fd00::2")])
        );
        // No default route: any up interface's global address.
        let routeless = HostNetwork {
            default_routes_v4: Vec::new(),
            default_routes_v6: Vec::new(),
            ..host.clone()
        };
        assert_eq!(
            choose_node_ips(&[], "n", &routeless, nothing),
            Ok(vec![ip("192.0.2.2")])
        );
        assert_eq!(
            choose_node_ips(&[], "n", &HostNetwork::default(), nothing),
            Ok(vec![])
        );
    }

    #[test]
    fn default_routes_from_the_kernels_tables() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  br0\t0000580A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";
        assert_eq!(default_routes_v4(v4), ["eth0"]);
        let v6 = "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n";
        assert_eq!(default_routes_v6(v6), ["eth0"]);
        assert!(is_global(ip("10.88.0.1")));
        assert!(!is_global(ip("169.254.1.1")));
    }

    #[test]
    fn this_hosts_network_reads() {
        let host = HostNetwork::read();
        // Every Linux host has its loopback addresses.
        assert!(host.addresses.iter().any(|a| a.ip.is_loopback()));
        let chosen = choose_node_ips(&[], "swiftlet-unresolvable.invalid", &host, nothing);
        assert!(chosen.is_ok_and(|ips| ips.iter().all(|ip| is_global(*ip))));
    }
}
