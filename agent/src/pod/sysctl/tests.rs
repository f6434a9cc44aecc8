use super::*;
use crate::testing;
use k8s_openapi::api::core::v1::{PodSecurityContext, Sysctl};

fn pod(sysctls: &[&str], host_network: bool, host_ipc: bool) -> Pod {
    testing::pod()
        .host_network(host_network)
        .spec(|s| s.host_ipc = Some(host_ipc))
        .security_context(Some(PodSecurityContext {
            sysctls: Some(
                sysctls
                    .iter()
                    .map(|n| Sysctl {
                        name: (*n).to_owned(),
                        value: "1".into(),
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
        .build()
}

fn allowlist(unsafe_patterns: &[&str]) -> Allowlist {
    let patterns: Vec<String> = unsafe_patterns.iter().map(|p| (*p).to_owned()).collect();
    Allowlist::new(Some((6, 18)), &patterns).expect("valid patterns")
}

#[test]
fn safe_sysctls_pass_unsafe_ones_are_forbidden_with_upstreams_message() {
    let list = allowlist(&[]);
    let cases: &[(&[&str], bool, bool, Option<&str>)] = &[
        (&[], false, false, None),
        (&["net.ipv4.ip_local_port_range"], false, false, None),
        (
            &["kernel.shm_rmid_forced", "net.ipv4.tcp_syncookies"],
            false,
            false,
            None,
        ),
        // The slash form is the same sysctl.
        (&["net/ipv4/ip_local_port_range"], false, false, None),
        (
            &["kernel.msgmax"],
            false,
            false,
            Some("forbidden sysctl: \"kernel.msgmax\" not allowlisted"),
        ),
        (
            &["net.ipv4.ip_local_port_range", "vm.overcommit_memory"],
            false,
            false,
            Some("forbidden sysctl: \"vm.overcommit_memory\" not allowlisted"),
        ),
        // A safe sysctl of a namespace shared with the node would change the node.
        (
            &["net.ipv4.ip_local_port_range"],
            true,
            false,
            Some(
                "forbidden sysctl: \"net.ipv4.ip_local_port_range\" not allowed with host Net enabled",
            ),
        ),
        (
            &["kernel.shm_rmid_forced"],
            false,
            true,
            Some("forbidden sysctl: \"kernel.shm_rmid_forced\" not allowed with host IPC enabled"),
        ),
        (&["kernel.shm_rmid_forced"], true, false, None),
    ];
    for (sysctls, host_network, host_ipc, want) in cases {
        let got = list.admit(&pod(sysctls, *host_network, *host_ipc)).err();
        assert_eq!(
            got.as_ref().map(|r| r.message.as_str()),
            *want,
            "{sysctls:?} hostNetwork={host_network} hostIPC={host_ipc}"
        );
        if let Some(r) = got {
            assert_eq!(r.reason, "SysctlForbidden");
        }
    }
}

#[test]
fn allowed_unsafe_sysctls_by_name_and_pattern() {
    let cases: &[(&[&str], &str, bool)] = &[
        (&["kernel.msg*"], "kernel.msgmax", true),
        (&["kernel.msg*"], "kernel.msgmnb", true),
        (&["kernel.msg*"], "kernel.sem", false),
        (&["kernel.sem"], "kernel.sem", true),
        (&["kernel.sem"], "kernel.semx", false),
        (&["net.core.*"], "net.core.somaxconn", true),
        (&["net.core.*"], "net.ipv4.tcp_rmem", true),
        (&["net.core.*"], "net.ipv6.conf.all.forwarding", false),
        (&["fs.mqueue.*"], "fs.mqueue.msg_max", true),
        (&["net/ipv6/conf/*"], "net.ipv6.conf.eth0.forwarding", true),
    ];
    for (patterns, sysctl, allowed) in cases {
        let list = allowlist(patterns);
        assert_eq!(
            list.check(sysctl, false, false).is_ok(),
            *allowed,
            "{patterns:?} {sysctl}"
        );
    }
    // Even allowed, an IPC sysctl is refused in the node's IPC namespace.
    assert!(
        allowlist(&["kernel.msg*"])
            .check("kernel.msgmax", false, true)
            .is_err()
    );
}

#[test]
fn bad_patterns_are_refused_with_upstreams_messages() {
    let cases = [
        (
            "kernel.*msg",
            "must have at most 253 characters and match regex",
        ),
        (
            "Kernel.msgmax",
            "must have at most 253 characters and match regex",
        ),
        (
            "kernel..msgmax",
            "must have at most 253 characters and match regex",
        ),
        ("*", "the sysctls \"\" are not known to be namespaced"),
        ("", "must have at most 253 characters and match regex"),
        (
            "vm.swappiness",
            "the sysctls \"vm.swappiness\" are not known to be namespaced",
        ),
        (
            "kernel.*",
            "the sysctls \"kernel.\" are not known to be namespaced",
        ),
    ];
    for (pattern, want) in cases {
        let err = Allowlist::new(Some((6, 18)), &[pattern.to_owned()])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(want), "{pattern:?}: {err}");
    }
    let long = format!("net.{}", "a".repeat(SYSCTL_MAX_LENGTH));
    assert!(!is_valid_pattern(&long));
}

#[test]
fn the_safe_set_follows_the_kernel() {
    let all = safe_sysctls(Some((6, 18)));
    assert_eq!(all.len(), 12);
    let old = safe_sysctls(Some((4, 5)));
    assert!(old.contains(&"net.ipv4.tcp_keepalive_time".to_owned()));
    assert!(!old.contains(&"net.ipv4.tcp_fin_timeout".to_owned()));
    assert!(!old.contains(&"net.ipv4.tcp_rmem".to_owned()));
    assert_eq!(safe_sysctls(None).len(), 5);
    assert_eq!(parse_kernel_release("6.18.44-fc-v657\n"), Some((6, 18)));
    assert_eq!(parse_kernel_release("4.15"), Some((4, 15)));
    assert_eq!(parse_kernel_release("garbage"), None);
}

#[test]
fn names_are_normalized_as_upstream() {
    assert_eq!(
        normalize_name("net.ipv4.conf.eno2/100.rp_filter"),
        "net.ipv4.conf.eno2/100.rp_filter"
    );
    assert_eq!(
        normalize_name("net/ipv4/conf/eno2.100/rp_filter"),
        "net.ipv4.conf.eno2/100.rp_filter"
    );
    assert_eq!(normalize_name("kernel"), "kernel");
}
