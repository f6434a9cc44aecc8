//! Tests of [`Config::load`]: defaults, file, flags over file, and the errors.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Parser as _;

use super::*;
use crate::config::{Args, Command};

fn run_args(extra: &[&str]) -> RunArgs {
    let argv = ["swiftlet", "run"].iter().chain(extra).copied();
    match Args::try_parse_from(argv).expect("flags parse").command {
        Command::Run(run) => run,
        Command::Events(_) => panic!("not run"),
    }
}

fn host() -> Result<String, ConfigError> {
    Ok(" Node-A\n".to_owned())
}

/// Writes `yaml` to a config file in a temp dir and loads it with `flags`.
fn load(yaml: &str, flags: &[&str]) -> (tempfile::TempDir, Result<Config, ConfigError>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("swiftlet.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let path_arg = path.to_str().expect("utf-8 path").to_owned();
    let mut argv = vec!["--config", path_arg.as_str()];
    argv.extend(flags);
    let result = Config::load_with(&run_args(&argv), &host);
    (dir, result)
}

fn err(yaml: &str, flags: &[&str]) -> String {
    let (dir, result) = load(yaml, flags);
    match result {
        Ok(config) => panic!("accepted: {config:?}"),
        // The temp path varies; tests compare the rest.
        Err(e) => e
            .to_string()
            .replace(&dir.path().display().to_string(), "DIR"),
    }
}

#[test]
fn defaults_without_file_or_flags() {
    let config = Config::load_with(&run_args(&[]), &host).expect("loads");
    assert_eq!(config.file, None);
    assert_eq!(config.node_name, "node-a");
    assert_eq!(config.static_pod_path, None);
    assert_eq!(config.sync_frequency, Duration::from_secs(60));
    assert_eq!(config.file_check_frequency, Duration::from_secs(20));
    assert_eq!(config.max_pods, 110);
    assert_eq!(config.pod_pids_limit, -1);
    assert_eq!(config.runtime_request_timeout, Duration::from_secs(120));
    assert_eq!(
        config.container_runtime_endpoint,
        "unix:///run/containerd/containerd.sock"
    );
    assert_eq!(
        config.read_only_address,
        Some("127.0.0.1:10255".parse::<SocketAddr>().expect("addr"))
    );
    assert_eq!(
        config.healthz_address,
        Some("127.0.0.1:10248".parse::<SocketAddr>().expect("addr"))
    );
    assert_eq!(config.cgroup_root, PathBuf::from("/"));
    assert!(config.cgroups_per_qos);
    assert_eq!(config.cgroup_driver, CgroupDriver::Cgroupfs);
    assert_eq!(config.pod_cidr, None);
    assert!(config.cluster_dns.is_empty());
    assert_eq!(config.cluster_domain, None);
    assert_eq!(config.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(config.node_lease_duration_seconds, 40);
    assert_eq!(config.pleg, PlegMode::Ebpf);
    assert!(!config.pleg_explicit);
    assert_eq!(config.pleg_relist_period, Duration::from_secs(300));
    assert_eq!(config.root_dir, PathBuf::from("/var/lib/swiftlet"));
    assert_eq!(
        config.grpc_socket,
        PathBuf::from("/run/swiftlet/swiftlet.sock")
    );
    assert_eq!(config.kubeconfig, None);
}

const FULL: &str = r#"
kind: KubeletConfiguration
apiVersion: kubelet.config.k8s.io/v1beta1
staticPodPath: /etc/kubernetes/manifests
syncFrequency: 1m30s
fileCheckFrequency: 5m
maxPods: 50
podPidsLimit: 4096
runtimeRequestTimeout: 30s
containerRuntimeEndpoint: unix:///run/crio/crio.sock
readOnlyPort: 0
address: 0.0.0.0
healthzPort: 11248
healthzBindAddress: 0.0.0.0
cgroupRoot: /kube
cgroupsPerQOS: false
cgroupDriver: cgroupfs
podCIDR: 10.244.1.0/24
clusterDNS: [10.96.0.10, "fd00::a"]
clusterDomain: cluster.local
nodeStatusUpdateFrequency: 20s
nodeLeaseDurationSeconds: 60
nodeName: worker-7
pleg: relist
plegRelistPeriod: 500ms
rootDir: state
grpcSocket: /run/s.sock
"#;

#[test]
fn file_values_replace_defaults() {
    let (dir, result) = load(FULL, &[]);
    let config = result.expect("loads");
    assert_eq!(config.file, Some(dir.path().join("swiftlet.yaml")));
    assert_eq!(config.node_name, "worker-7");
    assert_eq!(
        config.static_pod_path.as_deref(),
        Some(Path::new("/etc/kubernetes/manifests"))
    );
    assert_eq!(config.sync_frequency, Duration::from_secs(90));
    assert_eq!(config.file_check_frequency, Duration::from_secs(300));
    assert_eq!(config.max_pods, 50);
    assert_eq!(config.pod_pids_limit, 4096);
    assert_eq!(config.runtime_request_timeout, Duration::from_secs(30));
    assert_eq!(
        config.container_runtime_endpoint,
        "unix:///run/crio/crio.sock"
    );
    assert_eq!(config.read_only_address, None);
    assert_eq!(
        config.healthz_address,
        Some("0.0.0.0:11248".parse::<SocketAddr>().expect("addr"))
    );
    assert_eq!(config.cgroup_root, PathBuf::from("/kube"));
    assert!(!config.cgroups_per_qos);
    assert_eq!(
        config.pod_cidr.map(|c| c.to_string()).as_deref(),
        Some("10.244.1.0/24")
    );
    assert_eq!(
        config.cluster_dns,
        vec![
            "10.96.0.10".parse::<IpAddr>().expect("ip"),
            "fd00::a".parse::<IpAddr>().expect("ip")
        ]
    );
    assert_eq!(config.cluster_domain.as_deref(), Some("cluster.local"));
    assert_eq!(config.node_status_update_frequency, Duration::from_secs(20));
    assert_eq!(config.node_lease_duration_seconds, 60);
    assert_eq!(config.pleg, PlegMode::Relist);
    assert_eq!(config.pleg_relist_period, Duration::from_millis(500));
    // Relative to the file's directory, as the kubelet resolves paths in its file.
    assert_eq!(config.root_dir, dir.path().join("state"));
    assert_eq!(config.grpc_socket, PathBuf::from("/run/s.sock"));
}

#[test]
fn flags_override_the_file() {
    let (_dir, result) = load(
        FULL,
        &[
            "--manifests",
            "/srv/manifests",
            "--runtime-endpoint",
            "/run/containerd/containerd.sock",
            "--hostname-override",
            "Other",
            "--pleg",
            "ebpf",
            "--pleg-relist-period",
            "2s",
            "--sync-frequency",
            "10s",
            "--max-pods",
            "7",
            "--read-only-port",
            "10255",
            "--address",
            "10.0.0.1",
            "--root-dir",
            "/var/lib/other",
            "--kubeconfig",
            "/etc/kubeconfig",
            "--grpc-socket",
            "/run/flag.sock",
            "--http-address",
            "127.0.0.1:9999",
        ],
    );
    let config = result.expect("loads");
    assert_eq!(
        config.static_pod_path.as_deref(),
        Some(Path::new("/srv/manifests"))
    );
    // A bare path is accepted, as the kubelet still does, and normalised.
    assert_eq!(
        config.container_runtime_endpoint,
        "unix:///run/containerd/containerd.sock"
    );
    assert_eq!(config.node_name, "other");
    assert_eq!(config.pleg, PlegMode::Ebpf);
    assert_eq!(config.pleg_relist_period, Duration::from_secs(2));
    assert_eq!(config.sync_frequency, Duration::from_secs(10));
    assert_eq!(config.max_pods, 7);
    assert_eq!(
        config.read_only_address,
        Some("10.0.0.1:10255".parse::<SocketAddr>().expect("addr"))
    );
    assert_eq!(config.root_dir, PathBuf::from("/var/lib/other"));
    assert_eq!(config.kubeconfig, Some(PathBuf::from("/etc/kubeconfig")));
    assert_eq!(config.grpc_socket, PathBuf::from("/run/flag.sock"));
    assert_eq!(
        config.healthz_address,
        Some("127.0.0.1:9999".parse::<SocketAddr>().expect("addr"))
    );
    // Values only in the file stay.
    assert_eq!(config.file_check_frequency, Duration::from_secs(300));
}

#[test]
fn empty_or_comment_only_file_is_all_defaults() {
    for yaml in ["", "\n# nothing yet\n"] {
        let (_dir, result) = load(yaml, &[]);
        assert_eq!(result.expect("loads").max_pods, 110);
    }
}

#[test]
fn unknown_field_is_rejected_by_name() {
    let msg = err("syncFrequency: 1m\nsyncFreqency: 2m\n", &[]);
    assert!(msg.starts_with("config file DIR/swiftlet.yaml: "), "{msg}");
    assert!(msg.contains("unknown field `syncFreqency`"), "{msg}");
}

#[test]
fn wrong_type_names_the_field() {
    let msg = err("maxPods: many\n", &[]);
    assert!(msg.contains("maxPods"), "{msg}");
}

#[test]
fn bad_values_name_field_and_value() {
    let cases: &[(&str, &str)] = &[
        (
            "syncFrequency: 1x",
            "config file DIR/swiftlet.yaml: field `syncFrequency`: invalid duration \"1x\": expected e.g. 1m30s",
        ),
        (
            "fileCheckFrequency: 0s",
            "config file DIR/swiftlet.yaml: field `fileCheckFrequency`: invalid duration \"0s\": must be greater than 0",
        ),
        (
            "runtimeRequestTimeout: -2m",
            "config file DIR/swiftlet.yaml: field `runtimeRequestTimeout`: invalid duration \"-2m\": must not be negative",
        ),
        (
            "cgroupDriver: systemd",
            "config file DIR/swiftlet.yaml: field `cgroupDriver`: invalid value \"systemd\": not supported yet: only \"cgroupfs\" is",
        ),
        (
            "cgroupDriver: cgroupsfs",
            "config file DIR/swiftlet.yaml: field `cgroupDriver`: invalid value \"cgroupsfs\": expected \"cgroupfs\"",
        ),
        (
            "readOnlyPort: 70000",
            "config file DIR/swiftlet.yaml: field `readOnlyPort`: invalid port \"70000\": must be between 0 (off) and 65535",
        ),
        (
            "healthzBindAddress: localhost",
            "config file DIR/swiftlet.yaml: field `healthzBindAddress`: invalid address \"localhost\": expected an IP address, e.g. 127.0.0.1",
        ),
        (
            "maxPods: 0",
            "config file DIR/swiftlet.yaml: field `maxPods`: invalid value \"0\": must be at least 1",
        ),
        (
            "nodeLeaseDurationSeconds: -1",
            "config file DIR/swiftlet.yaml: field `nodeLeaseDurationSeconds`: invalid value \"-1\": must be at least 1",
        ),
        (
            "podCIDR: 10.0.0.0/40",
            "config file DIR/swiftlet.yaml: field `podCIDR`: invalid CIDR \"10.0.0.0/40\": the prefix length is out of range",
        ),
        (
            "clusterDNS: [10.96.0]",
            "config file DIR/swiftlet.yaml: field `clusterDNS`: invalid IP address \"10.96.0\": expected e.g. 10.96.0.10",
        ),
        (
            "pleg: evented",
            "config file DIR/swiftlet.yaml: field `pleg`: invalid value \"evented\": expected \"relist\" or \"ebpf\"",
        ),
        (
            "containerRuntimeEndpoint: tcp://1.2.3.4:5",
            "config file DIR/swiftlet.yaml: field `containerRuntimeEndpoint`: invalid endpoint \"tcp://1.2.3.4:5\": only unix sockets are supported, e.g. unix:///run/containerd/containerd.sock",
        ),
        (
            "cgroupRoot: kubepods",
            "config file DIR/swiftlet.yaml: field `cgroupRoot`: invalid cgroup \"kubepods\": must be absolute in the cgroup hierarchy, e.g. / or /kubepods",
        ),
        (
            "nodeName: Under_Score",
            "config file DIR/swiftlet.yaml: field `nodeName`: invalid node name \"Under_Score\": must be a DNS subdomain (lowercase letters, digits, '-' and '.'), e.g. node-1",
        ),
        (
            "nodeName: a\nhostnameOverride: b",
            "config file DIR/swiftlet.yaml: field `nodeName`: invalid value \"a\": conflicts with hostnameOverride \"b\"; set one of them",
        ),
        (
            "kind: Pod",
            "config file DIR/swiftlet.yaml: field `kind`: invalid value \"Pod\": expected \"KubeletConfiguration\"",
        ),
    ];
    for (yaml, want) in cases {
        assert_eq!(err(yaml, &[]), *want, "{yaml}");
    }
}

#[test]
fn bad_flag_values_name_the_flag() {
    let msg = err("", &["--sync-frequency", "0s"]);
    assert_eq!(
        msg,
        "flag --sync-frequency: field `syncFrequency`: invalid duration \"0s\": must be greater than 0"
    );
    let parse = Args::try_parse_from(["swiftlet", "run", "--pleg-relist-period", "1x"])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(parse.contains("--pleg-relist-period"), "{parse}");
    assert!(parse.contains("expected e.g. 1m30s"), "{parse}");
}

#[test]
fn missing_file_is_reported_with_its_path() {
    let args = run_args(&["--config", "/nonexistent/swiftlet.yaml"]);
    let msg = Config::load_with(&args, &host)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        msg.starts_with("config file /nonexistent/swiftlet.yaml: cannot read it:"),
        "{msg}"
    );
}

#[test]
fn negative_pid_limit_means_none() {
    let (_dir, result) = load("podPidsLimit: -5", &[]);
    assert_eq!(result.expect("loads").pod_pids_limit, -1);
}
