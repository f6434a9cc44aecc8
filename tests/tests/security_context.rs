//! The securityContext over the real container runtime and kernel: what each container's own
//! `/proc/self/status` and mounts say (capabilities, no_new_privs, seccomp, uid, masked and
//! read-only `/proc` paths, sysctls, a Localhost seccomp profile), `runAsNonRoot` against the
//! image's user, and the pods admission turns away because this node cannot enforce what they
//! ask for (unsafe sysctls, user namespaces on containerd 1.6, AppArmor on a host without it).
//! Needs root and the private containerd.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use swiftlet_tests::{
    EVENT_WAIT, manifest,
    node::{Node, status},
};

/// The line every test container prints once it has printed what the test reads.
const DONE: &str = "==done==";

/// A container that prints `command`'s output, then the marker, then sleeps (so its log stays
/// while the test reads it).
fn printing(name: &str, command: &str, extra: &str) -> String {
    manifest::container(
        name,
        &format!("{command}; echo {DONE}; exec sleep 3600"),
        extra,
    )
}

/// A pod of `containers` with `spec` lines (2-space indented) before them.
fn pod(name: &str, spec: &str, containers: &[String]) -> String {
    manifest::pod(
        name,
        &format!("  terminationGracePeriodSeconds: 1\n{spec}"),
        containers,
    )
}

/// What container `container` of pod `name` printed before the marker, read from its log file
/// (CRI format: `<time> <stream> <tag> <line>`), once the marker is there (bounded wait).
fn output(node: &Node, name: &str, container: &str) -> Vec<String> {
    let pod = node.wait_pod(name, "running", |p| {
        status::running(status::container(p, container))
    });
    let uid = pod.metadata.uid.clone().expect("uid");
    let file = node
        .pod_logs_dir()
        .join(format!("default_{name}-{}_{uid}", node.name))
        .join(container)
        .join("0.log");
    let deadline = Instant::now() + EVENT_WAIT;
    loop {
        let lines: Vec<String> = std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
            .collect();
        if let Some(end) = lines.iter().position(|l| l == DONE) {
            return lines[..end].to_vec();
        }
        assert!(
            Instant::now() < deadline,
            "{container} of {name} never printed its output; {} has: {lines:?}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of `field` in `/proc/<pid>/status` lines (`CapEff:\t0000000000000000`).
fn field<'a>(status: &'a [String], field: &str) -> &'a str {
    status
        .iter()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {field} in {status:?}"))
}

fn rejected(node: &Node, name: &str) -> (String, String) {
    let pod: Pod = node.wait_pod(name, "Failed", |p| status::phase(p) == "Failed");
    let s = pod.status.unwrap_or_default();
    (s.reason.unwrap_or_default(), s.message.unwrap_or_default())
}

#[test]
fn the_restricted_profile_capabilities_and_proc_masks_reach_the_kernel() {
    let Some(node) = Node::for_test(
        "the_restricted_profile_capabilities_and_proc_masks_reach_the_kernel",
        "secctx-kernel",
        &[],
    ) else {
        return;
    };
    // The Pod Security Standards "restricted" profile.
    node.write_manifest(
        "restricted.yaml",
        &pod(
            "restricted",
            "  securityContext:\n    runAsNonRoot: true\n    runAsUser: 1000\n    seccompProfile:\n      type: RuntimeDefault\n",
            &[printing(
                "main",
                "cat /proc/self/status",
                "      securityContext:\n        allowPrivilegeEscalation: false\n        capabilities:\n          drop: [ALL]\n",
            )],
        ),
    );
    // As root, everything dropped but one capability.
    node.write_manifest(
        "one-cap.yaml",
        &pod(
            "one-cap",
            "",
            &[printing(
                "main",
                "cat /proc/self/status",
                "      securityContext:\n        capabilities:\n          drop: [ALL]\n          add: [NET_BIND_SERVICE]\n",
            )],
        ),
    );
    // runAsNonRoot with the root busybox image and no runAsUser.
    node.write_manifest(
        "root-image.yaml",
        &pod(
            "root-image",
            "  securityContext:\n    runAsNonRoot: true\n",
            &[printing("main", "id", "")],
        ),
    );
    // The default procMount in a plain container: what the mount table and a write say.
    node.write_manifest(
        "proc.yaml",
        &pod(
            "proc",
            "",
            &[printing(
                "main",
                "grep -E ' /proc/(timer_list|sys|keys|acpi) ' /proc/self/mountinfo; \
                 (echo 1 > /proc/sys/net/ipv4/ip_forward) 2>&1; wc -c < /proc/timer_list",
                "",
            )],
        ),
    );

    // Privileged: its sandbox must be too (containerd refuses one otherwise), nothing masked.
    node.write_manifest(
        "privileged.yaml",
        &pod(
            "privileged",
            "",
            &[printing(
                "main",
                "grep -E ' /proc/(timer_list|sys) ' /proc/self/mountinfo; wc -c < /proc/timer_list",
                "      securityContext:\n        privileged: true\n",
            )],
        ),
    );

    let restricted = output(&node, "restricted", "main");
    assert_eq!(field(&restricted, "CapEff"), "0000000000000000");
    assert_eq!(field(&restricted, "CapPrm"), "0000000000000000");
    assert_eq!(field(&restricted, "CapBnd"), "0000000000000000");
    assert_eq!(field(&restricted, "NoNewPrivs"), "1");
    assert_eq!(field(&restricted, "Seccomp"), "2");
    let uid: Vec<&str> = field(&restricted, "Uid").split_whitespace().collect();
    assert_eq!(uid, ["1000"; 4], "real, effective, saved and fs uid");

    let one = output(&node, "one-cap", "main");
    // CAP_NET_BIND_SERVICE is bit 10: exactly that bit, in every set but the ambient one.
    assert_eq!(field(&one, "CapEff"), "0000000000000400");
    assert_eq!(field(&one, "CapBnd"), "0000000000000400");
    assert_eq!(field(&one, "NoNewPrivs"), "0");
    // Neither the pod nor the node (no --seccomp-default) asked for a profile: none, as upstream.
    assert_eq!(field(&one, "Seccomp"), "0");

    let proc = output(&node, "proc", "main");
    let mount_of = |point: &str| {
        proc.iter()
            .find(|l| l.split(' ').nth(4) == Some(point))
            .cloned()
            .unwrap_or_else(|| panic!("{point} is not a mount point in the container: {proc:?}"))
    };
    // Masked: /dev/null over a file, an empty read-only tmpfs over a directory. This VM's kernel
    // has no /proc/kcore (the runtime masks only what exists); /proc/timer_list is read here,
    // which the host shows non-empty.
    mount_of("/proc/keys");
    mount_of("/proc/timer_list");
    let acpi = mount_of("/proc/acpi");
    assert!(acpi.contains(" - tmpfs "), "{acpi}");
    let host_timer_list = std::fs::read_to_string("/proc/timer_list").expect("host timer_list");
    assert!(!host_timer_list.is_empty());
    assert_eq!(
        proc.last().map(|l| l.trim()),
        Some("0"),
        "/proc/timer_list reads empty in the container: {proc:?}"
    );
    let sys = mount_of("/proc/sys");
    let options = sys.split(' ').nth(5).unwrap_or_default();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "/proc/sys is not read-only: {sys}"
    );
    assert!(
        proc.iter().any(|l| l.contains("Read-only file system")),
        "a write to /proc/sys was not refused: {proc:?}"
    );

    let privileged = output(&node, "privileged", "main");
    assert!(
        !privileged
            .iter()
            .any(|l| l.contains(" /proc/timer_list ") || l.contains(" /proc/sys ro")),
        "a privileged container has masked or read-only /proc paths: {privileged:?}"
    );
    let unmasked = privileged.last().and_then(|l| l.trim().parse::<u64>().ok());
    assert!(
        unmasked.is_some_and(|bytes| bytes > 0),
        "/proc/timer_list is not readable in a privileged container: {privileged:?}"
    );

    let pod = node.wait_pod("root-image", "CreateContainerConfigError", |p| {
        status::waiting_reason(status::container(p, "main")).as_deref()
            == Some("CreateContainerConfigError")
    });
    let message = status::container(&pod, "main")
        .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
        .unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    assert_eq!(
        message,
        format!(
            "container has runAsNonRoot and image will run as root (pod: \
             \"root-image-{}_default({uid})\", container: main)",
            node.name
        )
    );
    // It never ran: the pod is still Pending with no container started, after the others ran.
    assert_eq!(status::phase(&pod), "Pending");
    assert!(status::container(&pod, "main").is_some_and(|c| c.container_id.is_none()));
}

#[test]
fn admission_refuses_what_this_node_cannot_enforce() {
    let Some(node) = Node::for_test(
        "admission_refuses_what_this_node_cannot_enforce",
        "secctx-admit",
        &[],
    ) else {
        return;
    };
    let sleeper = || printing("main", "true", "");
    node.write_manifest(
        "unsafe-sysctl.yaml",
        &pod(
            "unsafe-sysctl",
            "  securityContext:\n    sysctls:\n      - name: kernel.msgmax\n        value: \"65536\"\n",
            &[sleeper()],
        ),
    );
    node.write_manifest(
        "userns.yaml",
        &pod("userns", "  hostUsers: false\n", &[sleeper()]),
    );
    node.write_manifest(
        "apparmor.yaml",
        &pod(
            "apparmor",
            "  securityContext:\n    appArmorProfile:\n      type: RuntimeDefault\n",
            &[sleeper()],
        ),
    );
    // A safe sysctl in a pod-network pod runs and is what the container's kernel says.
    node.write_manifest(
        "safe-sysctl.yaml",
        &pod(
            "safe-sysctl",
            "  securityContext:\n    sysctls:\n      - name: net.ipv4.ip_local_port_range\n        value: \"40000 50000\"\n",
            &[printing("main", "cat /proc/sys/net/ipv4/ip_local_port_range", "")],
        ),
    );
    // The same sysctl with the node's network namespace would change the node.
    node.write_manifest(
        "host-net-sysctl.yaml",
        &pod(
            "host-net-sysctl",
            "  hostNetwork: true\n  securityContext:\n    sysctls:\n      - name: net.ipv4.ip_local_port_range\n        value: \"40000 50000\"\n",
            &[sleeper()],
        ),
    );

    assert_eq!(
        rejected(&node, "unsafe-sysctl"),
        (
            "SysctlForbidden".to_owned(),
            "forbidden sysctl: \"kernel.msgmax\" not allowlisted".to_owned()
        )
    );
    let (reason, message) = rejected(&node, "userns");
    assert_eq!(reason, "UserNamespacesNotSupported");
    assert!(
        message.contains("RuntimeClass handler \"\" does not support user namespaces"),
        "{message}"
    );
    if std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.starts_with('Y'))
    {
        // A host with AppArmor runs it; this project's machines have none.
        node.wait_pod("apparmor", "running", |p| {
            status::running(status::container(p, "main"))
        });
    } else {
        assert_eq!(
            rejected(&node, "apparmor"),
            (
                "AppArmor".to_owned(),
                "Cannot enforce AppArmor: AppArmor is not enabled on the host".to_owned()
            )
        );
    }
    assert_eq!(
        rejected(&node, "host-net-sysctl"),
        (
            "SysctlForbidden".to_owned(),
            "forbidden sysctl: \"net.ipv4.ip_local_port_range\" not allowed with host Net enabled"
                .to_owned()
        )
    );
    let range = output(&node, "safe-sysctl", "main");
    assert_eq!(
        range
            .first()
            .map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["40000", "50000"])
    );
    // Nothing of a refused pod reached the runtime: no container status, never started.
    for name in ["unsafe-sysctl", "userns", "host-net-sysctl"] {
        let pod = node.pod(name).expect("listed");
        assert!(
            pod.status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default()
                .iter()
                .all(|c| c.container_id.is_none()),
            "{name} started a container"
        );
    }
}

#[test]
fn allowed_unsafe_sysctls_seccomp_default_and_localhost_profiles() {
    let Some(node) = Node::for_test(
        "allowed_unsafe_sysctls_seccomp_default_and_localhost_profiles",
        "secctx-flags",
        &[
            "--allowed-unsafe-sysctls",
            "kernel.msg*",
            "--seccomp-default",
        ],
    ) else {
        return;
    };
    node.write_manifest(
        "msgmax.yaml",
        &pod(
            "msgmax",
            "  securityContext:\n    sysctls:\n      - name: kernel.msgmax\n        value: \"12345\"\n",
            &[printing("main", "cat /proc/sys/kernel/msgmax /proc/self/status", "")],
        ),
    );
    // Not matched by the pattern: still forbidden.
    node.write_manifest(
        "sem.yaml",
        &pod(
            "sem",
            "  securityContext:\n    sysctls:\n      - name: kernel.sem\n        value: \"250 32000 32 128\"\n",
            &[printing("main", "true", "")],
        ),
    );
    // A pod that turns seccomp off itself keeps it off under --seccomp-default.
    node.write_manifest(
        "unconfined.yaml",
        &pod(
            "unconfined",
            "  securityContext:\n    seccompProfile:\n      type: Unconfined\n",
            &[printing("main", "cat /proc/self/status", "")],
        ),
    );
    // A Localhost profile from <rootDir>/seccomp that refuses mkdir, and one that tries to
    // climb out of that directory.
    let profiles = node.dir().join("root/seccomp/profiles");
    std::fs::create_dir_all(&profiles).expect("mkdir seccomp");
    std::fs::write(
        profiles.join("no-mkdir.json"),
        r#"{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["mkdir","mkdirat"],"action":"SCMP_ACT_ERRNO"}]}"#,
    )
    .expect("write profile");
    let localhost = |name: &str, profile: &str| {
        pod(
            name,
            "",
            &[printing(
                "main",
                "mkdir /tmp/made 2>&1; cat /proc/self/status",
                &format!(
                    "      securityContext:\n        seccompProfile:\n          type: Localhost\n          localhostProfile: {profile}\n"
                ),
            )],
        )
    };
    node.write_manifest(
        "localhost.yaml",
        &localhost("localhost", "profiles/no-mkdir.json"),
    );
    node.write_manifest("escape.yaml", &localhost("escape", "../../../etc/passwd"));

    let msgmax = output(&node, "msgmax", "main");
    assert_eq!(msgmax.first().map(|l| l.trim()), Some("12345"));
    // The node's own value is untouched: the sysctl is the pod's IPC namespace's.
    let host = std::fs::read_to_string("/proc/sys/kernel/msgmax").expect("host msgmax");
    assert_ne!(host.trim(), "12345");
    // --seccomp-default: no profile asked for, the runtime's default applied.
    assert_eq!(field(&msgmax, "Seccomp"), "2");
    assert_eq!(field(&output(&node, "unconfined", "main"), "Seccomp"), "0");
    let confined = output(&node, "localhost", "main");
    assert_eq!(field(&confined, "Seccomp"), "2");
    assert!(
        confined
            .first()
            .is_some_and(|l| l.contains("Operation not permitted")),
        "the profile did not refuse mkdir: {confined:?}"
    );
    let pod = node.wait_pod("escape", "CreateContainerConfigError", |p| {
        status::waiting_reason(status::container(p, "main")).as_deref()
            == Some("CreateContainerConfigError")
    });
    let message = status::container(&pod, "main")
        .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
        .unwrap_or_default();
    assert!(message.contains("must not contain '..'"), "{message}");
    assert_eq!(
        rejected(&node, "sem").0,
        "SysctlForbidden",
        "kernel.sem is not kernel.msg*"
    );
}
