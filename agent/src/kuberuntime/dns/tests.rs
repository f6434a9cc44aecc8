//! Upstream `dns_test.go`'s cases, as tables: the pod's DNS for each policy, with and without
//! cluster DNS and a resolv.conf, the pod's `dnsConfig` merged, the limits and their warnings.

use k8s_openapi::api::core::v1::{PodDNSConfig, PodDNSConfigOption};

use super::*;

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|&s| s.to_owned()).collect()
}

fn host() -> cri::DnsConfig {
    cri::DnsConfig {
        servers: strings(&["192.0.2.53", "192.0.2.54"]),
        searches: strings(&["corp.example", "example"]),
        options: strings(&["timeout:2", "rotate"]),
    }
}

fn settings() -> DnsSettings {
    DnsSettings {
        cluster_dns: vec!["10.96.0.10".parse().unwrap()],
        cluster_domain: Some("cluster.local".into()),
        resolv_conf: Some("/etc/resolv.conf".into()),
        node_ips: vec!["10.0.0.1".parse().unwrap()],
    }
}

fn pod(policy: &str, host_network: bool, dns_config: Option<PodDNSConfig>) -> Pod {
    let mut pod = crate::testing::pod()
        .named("prod", "web", "u1")
        .host_network(host_network)
        .build();
    if let Some(spec) = pod.spec.as_mut() {
        spec.dns_policy = Some(policy.into());
        spec.dns_config = dns_config;
    }
    pod
}

fn option(name: &str, value: Option<&str>) -> PodDNSConfigOption {
    PodDNSConfigOption {
        name: Some(name.into()),
        value: value.map(str::to_owned),
    }
}

#[test]
fn each_policy_gets_its_resolver() {
    let cluster = cri::DnsConfig {
        servers: strings(&["10.96.0.10"]),
        searches: strings(&[
            "prod.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local",
            "corp.example",
            "example",
        ]),
        options: strings(&["ndots:5"]),
    };
    let cases = [
        ("ClusterFirst", false, cluster.clone()),
        ("ClusterFirstWithHostNet", true, cluster.clone()),
        ("ClusterFirstWithHostNet", false, cluster),
        // On the host network, ClusterFirst is the host's resolver.
        ("ClusterFirst", true, host()),
        ("Default", false, host()),
        ("None", false, cri::DnsConfig::default()),
    ];
    for (policy, host_network, want) in cases {
        let got = settings()
            .form(&pod(policy, host_network, None), host())
            .expect("dns");
        assert_eq!(got.config, want, "{policy} host_network={host_network}");
        assert!(got.warnings.is_empty(), "{policy}: {:?}", got.warnings);
    }
}

#[test]
fn cluster_first_without_cluster_dns_falls_back_to_the_host_with_a_warning() {
    let settings = DnsSettings {
        cluster_dns: Vec::new(),
        ..settings()
    };
    let got = settings
        .form(&pod("ClusterFirst", false, None), host())
        .expect("dns");
    assert_eq!(got.config, host());
    assert_eq!(got.warnings, vec![DnsWarning::MissingClusterDns]);
    assert_eq!(got.warnings[0].reason(), "MissingClusterDNS");
    assert!(got.warnings[0].to_string().starts_with(
        "kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\""
    ));
}

#[test]
fn without_a_cluster_domain_cluster_first_keeps_the_host_searches() {
    let settings = DnsSettings {
        cluster_domain: None,
        ..settings()
    };
    let got = settings
        .form(&pod("ClusterFirst", false, None), host())
        .expect("dns");
    assert_eq!(got.config.searches, host().searches);
    assert_eq!(got.config.servers, strings(&["10.96.0.10"]));
}

#[test]
fn without_a_resolv_conf_the_host_resolver_is_the_loopback() {
    let cases = [
        (vec!["10.0.0.1"], vec!["127.0.0.1"]),
        (vec!["fd00::1"], vec!["::1"]),
        (vec!["10.0.0.1", "fd00::1"], vec!["127.0.0.1", "::1"]),
        (vec![], vec!["127.0.0.1"]),
    ];
    for (node_ips, want) in cases {
        let settings = DnsSettings {
            resolv_conf: None,
            node_ips: node_ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            ..settings()
        };
        let got = settings
            .form(&pod("Default", false, None), cri::DnsConfig::default())
            .expect("dns");
        assert_eq!(got.config.servers, strings(&want), "{node_ips:?}");
        assert_eq!(got.config.searches, strings(&["."]));
        assert!(got.config.options.is_empty());
    }
}

#[test]
fn the_pods_dns_config_is_merged_without_duplicates_options_by_name() {
    let given = PodDNSConfig {
        nameservers: Some(strings(&["192.0.2.54", "192.0.2.99"])),
        searches: Some(strings(&["example", "extra.example"])),
        options: Some(vec![
            option("timeout", Some("5")),
            option("edns0", None),
            option("rotate", Some("")),
        ]),
    };
    let got = settings()
        .form(&pod("Default", false, Some(given.clone())), host())
        .expect("dns");
    assert_eq!(
        got.config,
        cri::DnsConfig {
            servers: strings(&["192.0.2.53", "192.0.2.54", "192.0.2.99"]),
            searches: strings(&["corp.example", "example", "extra.example"]),
            options: strings(&["timeout:5", "rotate", "edns0"]),
        }
    );
    // None: the pod's dnsConfig alone.
    let got = settings()
        .form(&pod("None", false, Some(given)), host())
        .expect("dns");
    assert_eq!(
        got.config,
        cri::DnsConfig {
            servers: strings(&["192.0.2.54", "192.0.2.99"]),
            searches: strings(&["example", "extra.example"]),
            options: strings(&["timeout:5", "edns0", "rotate"]),
        }
    );
}

#[test]
fn limits_trim_nameservers_and_searches_with_a_warning() {
    let given = PodDNSConfig {
        nameservers: Some(strings(&[
            "192.0.2.1",
            "192.0.2.2",
            "192.0.2.3",
            "192.0.2.4",
        ])),
        searches: None,
        options: None,
    };
    let got = settings()
        .form(&pod("None", false, Some(given)), host())
        .expect("dns");
    assert_eq!(
        got.config.servers,
        strings(&["192.0.2.1", "192.0.2.2", "192.0.2.3"])
    );
    assert_eq!(
        got.warnings,
        vec![DnsWarning::NameserversOmitted(got.config.servers.clone())]
    );
    assert_eq!(
        got.warnings[0].to_string(),
        "Nameserver limits were exceeded, some nameservers have been omitted, the applied \
         nameserver line is: 192.0.2.1 192.0.2.2 192.0.2.3"
    );

    // 40 paths: the first 32 are kept.
    let many: Vec<String> = (0..40).map(|i| format!("s{i}.example")).collect();
    let mut config = cri::DnsConfig {
        searches: many.clone(),
        ..Default::default()
    };
    let mut warnings = Vec::new();
    fit_limits(&mut config, &mut warnings);
    assert_eq!(config.searches, many[..32].to_vec());
    assert_eq!(warnings.len(), 1);

    // A path over 253 characters is dropped; the line is cut from its end to 2048 characters.
    let long = "a".repeat(254);
    let part = "b".repeat(200);
    let mut searches = vec![long, "short.example".to_owned()];
    searches.extend((0..12).map(|i| format!("{part}{i:02}")));
    let mut config = cri::DnsConfig {
        searches,
        ..Default::default()
    };
    let mut warnings = Vec::new();
    fit_limits(&mut config, &mut warnings);
    assert_eq!(config.searches[0], "short.example");
    let line = config.searches.join(" ");
    assert!(line.len() <= MAX_DNS_SEARCH_LIST_CHARS, "{}", line.len());
    // "short.example" and ten paths of 202 characters: 13 + 10 × 203 = 2043; an eleventh is past.
    assert_eq!(config.searches.len(), 11);
    assert_eq!(
        warnings,
        vec![DnsWarning::SearchesOmitted(config.searches.clone())]
    );
    assert!(warnings[0].to_string().starts_with(
        "Search Line limits were exceeded, some search paths have been omitted, the applied \
         search line is: short.example bbb"
    ));
}

#[test]
fn pod_values_that_would_write_other_lines_fail_naming_the_field() {
    let cases = [
        (
            PodDNSConfig {
                nameservers: Some(strings(&["192.0.2.1", "not-an-ip"])),
                ..Default::default()
            },
            "spec.dnsConfig.nameservers[1]: invalid value \"not-an-ip\": must be a valid IP address",
        ),
        (
            PodDNSConfig {
                searches: Some(strings(&["ok.example", "a\nnameserver 6.6.6.6"])),
                ..Default::default()
            },
            "spec.dnsConfig.searches[1]: invalid value \"a\\nnameserver 6.6.6.6\": must be one \
             word without control characters",
        ),
        (
            PodDNSConfig {
                options: Some(vec![option("ndots", Some("2 rotate"))]),
                ..Default::default()
            },
            "spec.dnsConfig.options[0].value: invalid value \"2 rotate\": must be one word \
             without control characters",
        ),
    ];
    for (given, want) in cases {
        let err = settings()
            .form(&pod("None", false, Some(given)), host())
            .expect_err("refused");
        assert_eq!(err.to_string(), want);
    }
}

#[test]
fn an_unknown_policy_is_cluster_first_with_a_warning() {
    let got = settings()
        .form(&pod("Sideways", false, None), host())
        .expect("dns");
    assert_eq!(got.config.servers, strings(&["10.96.0.10"]));
    assert_eq!(
        got.warnings,
        vec![DnsWarning::UnknownPolicy("Sideways".into())]
    );
}

#[test]
fn resolv_conf_parsing_follows_upstream() {
    let text = "# generated\nnameserver 192.0.2.1\n  nameserver 192.0.2.2 extra\nsearch a.example. b\n\
                search c.example d.\noptions ndots:2\noptions timeout:1 attempts:3\nsortlist x\n";
    let dns = parse_resolv_conf(text).expect("parsed");
    assert_eq!(dns.servers, strings(&["192.0.2.1", "192.0.2.2"]));
    assert_eq!(dns.searches, strings(&["c.example", "d"]));
    assert_eq!(dns.options, strings(&["timeout:1", "attempts:3"]));
    assert_eq!(parse_resolv_conf("nameserver\n"), None);
    assert_eq!(parse_resolv_conf(""), Some(cri::DnsConfig::default()));
}

#[test]
fn the_resolv_conf_is_read_within_its_bound() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("resolv.conf");
    std::fs::write(&path, "nameserver 192.0.2.7\nsearch example\n").expect("write");
    let settings = DnsSettings {
        cluster_dns: Vec::new(),
        resolv_conf: Some(path.clone()),
        ..settings()
    };
    let got = settings.pod_dns(&pod("Default", false, None)).expect("dns");
    assert_eq!(got.config.servers, strings(&["192.0.2.7"]));

    let file = std::fs::File::create(&path).expect("create");
    file.set_len(MAX_RESOLV_CONF_BYTES + 1).expect("grow");
    let err = settings
        .pod_dns(&pod("Default", false, None))
        .expect_err("too long");
    assert!(matches!(err, DnsError::TooLong { .. }), "{err}");

    let missing = DnsSettings {
        resolv_conf: Some(dir.path().join("missing")),
        ..settings
    };
    let err = missing
        .pod_dns(&pod("Default", false, None))
        .expect_err("missing");
    assert!(err.to_string().contains("missing"), "{err}");
}
