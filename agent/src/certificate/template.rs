//! Whether a certificate still covers what its manager would ask for now: the same common name,
//! and none of the requested organizations, DNS names or IP addresses missing. Names the
//! certificate has beyond those do not matter (an address the node no longer has takes nothing
//! from a client that connects to a current one). A manager replaces a certificate that does not
//! cover its request at once instead of at its rotation deadline.
//!
//! Upstream: client-go `util/certificate/certificate_manager.go` `certSatisfiesTemplateLocked`
//! (the same four checks, subsets not equality) as `nextRotationDeadline` uses it; the serving
//! manager's template is the node's hostname and addresses (`pkg/kubelet/certificate/kubelet.go`
//! `NewKubeletServerCertificateManager`, `addressesToHostnamesAndIPs`).
//! Not here: when a manager asks (`manager.rs`), what it asks for (`csr.rs`).

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use x509_parser::{certificate::X509Certificate, extensions::GeneralName};

use super::csr::Subject;

/// What a certificate names: its subject's CN and O, its DNS and IP alternative names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
}

impl Names {
    /// The names of a parsed leaf. Attributes that are not UTF-8 strings and alternative names of
    /// other kinds are left out: a request never asks for them.
    pub fn of(leaf: &X509Certificate<'_>) -> Names {
        let subject = leaf.subject();
        let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
            attr.as_str().ok().map(str::to_owned)
        };
        let mut names = Names {
            common_name: subject
                .iter_common_name()
                .find_map(text)
                .unwrap_or_default(),
            organizations: subject.iter_organization().filter_map(text).collect(),
            ..Names::default()
        };
        if let Ok(Some(sans)) = leaf.subject_alternative_name() {
            for name in &sans.value.general_names {
                match name {
                    GeneralName::DNSName(dns) => names.dns_names.push((*dns).to_owned()),
                    GeneralName::IPAddress(bytes) => names.ips.extend(ip_of(bytes)),
                    _ => {}
                }
            }
        }
        names
    }
}

fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Some(IpAddr::V4(Ipv4Addr::from(v4)));
    }
    <[u8; 16]>::try_from(bytes)
        .ok()
        .map(|v6| IpAddr::V6(Ipv6Addr::from(v6)))
}

/// How a certificate falls short of a request (upstream's first failing check).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mismatch {
    CommonName { current: String, requested: String },
    DnsNames(Vec<String>),
    Ips(Vec<IpAddr>),
    Organizations(Vec<String>),
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::CommonName { current, requested } => {
                write!(f, "its CN is {current:?}, not {requested:?}")
            }
            Mismatch::DnsNames(missing) => write!(f, "it lacks the DNS names {missing:?}"),
            Mismatch::Ips(missing) => {
                let missing: Vec<String> = missing.iter().map(IpAddr::to_string).collect();
                write!(f, "it lacks the IP addresses {missing:?}")
            }
            Mismatch::Organizations(missing) => {
                write!(f, "it lacks the organizations {missing:?}")
            }
        }
    }
}

/// `None` when `names` cover `subject`; else the first shortfall, in upstream's order.
pub fn mismatch(names: &Names, subject: &Subject) -> Option<Mismatch> {
    if names.common_name != subject.common_name {
        return Some(Mismatch::CommonName {
            current: names.common_name.clone(),
            requested: subject.common_name.clone(),
        });
    }
    let missing_dns = missing(&subject.dns_names, &names.dns_names);
    if !missing_dns.is_empty() {
        return Some(Mismatch::DnsNames(missing_dns));
    }
    let missing_ips = missing(&subject.ips, &names.ips);
    if !missing_ips.is_empty() {
        return Some(Mismatch::Ips(missing_ips));
    }
    let missing_orgs = missing(
        std::slice::from_ref(&subject.organization),
        &names.organizations,
    );
    if !missing_orgs.is_empty() {
        return Some(Mismatch::Organizations(missing_orgs));
    }
    None
}

/// The wanted items `have` lacks, each once, in the wanted order.
fn missing<T: PartialEq + Clone>(wanted: &[T], have: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for item in wanted {
        if !have.contains(item) && !out.contains(item) {
            out.push(item.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn serving(ips: &[&str]) -> Subject {
        Subject {
            dns_names: vec!["n1".into()],
            ips: ips.iter().map(|s| ip(s)).collect(),
            ..Subject::node("n1")
        }
    }

    fn names(cn: &str, orgs: &[&str], dns: &[&str], ips: &[&str]) -> Names {
        Names {
            common_name: cn.into(),
            organizations: orgs.iter().map(|s| (*s).to_owned()).collect(),
            dns_names: dns.iter().map(|s| (*s).to_owned()).collect(),
            ips: ips.iter().map(|s| ip(s)).collect(),
        }
    }

    #[test]
    fn a_certificate_covers_a_request_when_nothing_requested_is_missing() {
        let cn = "system:node:n1";
        let nodes = ["system:nodes"];
        let subject = serving(&["10.0.0.5", "fd00::5"]);
        let cases: [(Names, Option<Mismatch>); 7] = [
            (names(cn, &nodes, &["n1"], &["10.0.0.5", "fd00::5"]), None),
            // An address the node no longer has does not matter.
            (
                names(
                    cn,
                    &nodes,
                    &["n1", "old"],
                    &["fd00::5", "10.0.0.9", "10.0.0.5"],
                ),
                None,
            ),
            // An address the node now has does.
            (
                names(cn, &nodes, &["n1"], &["10.0.0.9", "fd00::5"]),
                Some(Mismatch::Ips(vec![ip("10.0.0.5")])),
            ),
            (
                names(cn, &nodes, &["n1"], &[]),
                Some(Mismatch::Ips(vec![ip("10.0.0.5"), ip("fd00::5")])),
            ),
            (
                names(cn, &nodes, &["n2"], &["10.0.0.5", "fd00::5"]),
                Some(Mismatch::DnsNames(vec!["n1".into()])),
            ),
            (
                names("system:node:n2", &nodes, &["n1"], &["10.0.0.5", "fd00::5"]),
                Some(Mismatch::CommonName {
                    current: "system:node:n2".into(),
                    requested: cn.into(),
                }),
            ),
            (
                names(cn, &["other"], &["n1"], &["10.0.0.5", "fd00::5"]),
                Some(Mismatch::Organizations(vec!["system:nodes".into()])),
            ),
        ];
        for (have, want) in cases {
            assert_eq!(mismatch(&have, &subject), want, "{have:?}");
        }
        // A client request names no addresses: only CN and O count.
        assert_eq!(
            mismatch(&names(cn, &nodes, &[], &[]), &Subject::node("n1")),
            None
        );
        assert_eq!(
            Mismatch::Ips(vec![ip("10.0.0.5")]).to_string(),
            "it lacks the IP addresses [\"10.0.0.5\"]"
        );
    }

    #[test]
    fn the_names_are_read_from_a_certificate() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec!["n1".to_owned()]).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(ip("10.0.0.5")));
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(ip("fd00::5")));
        let cert = params.self_signed(&key).expect("sign");
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.der()).expect("parse");
        assert_eq!(
            Names::of(&parsed),
            names(
                "system:node:n1",
                &["system:nodes"],
                &["n1"],
                &["10.0.0.5", "fd00::5"]
            )
        );
    }
}
