//! Tests of [`Config::load`]: defaults, file, flags over file, and the errors.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use clap::Parser as _;

use super::*;
use crate::config::{Args, AuthorizationMode, Command, CpuApply, CpuManagerPolicy, TlsVersion};

pub(super) fn run_args(extra: &[&str]) -> RunArgs {
    let argv = ["swiftlet", "run"].iter().chain(extra).copied();
    match Args::try_parse_from(argv).expect("flags parse").command {
        Command::Run(run) => run,
        Command::Events(_) => panic!("not run"),
    }
}

pub(super) fn host() -> Result<String, ConfigError> {
    Ok(" Node-A\n".to_owned())
}

/// Writes `yaml` to a config file in a temp dir and loads it with `flags`.
pub(super) fn load(yaml: &str, flags: &[&str]) -> (tempfile::TempDir, Result<Config, ConfigError>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("swiftlet.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let path_arg = path.to_str().expect("utf-8 path").to_owned();
    let mut argv = vec!["--config", path_arg.as_str()];
    argv.extend(flags);
    let result = Config::load_with(&run_args(&argv), &host);
    (dir, result)
}

pub(super) fn err(yaml: &str, flags: &[&str]) -> String {
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
    assert_eq!(
        config.resolv_conf.as_deref(),
        Some(Path::new("/etc/resolv.conf"))
    );
    assert_eq!(config.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(config.node_lease_duration_seconds, 40);
    assert_eq!((config.event_record_qps, config.event_burst), (50, 100));
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
# Without the pods' cgroup there is nothing to enforce allocatable on (as upstream requires).
enforceNodeAllocatable: []
cgroupDriver: cgroupfs
podCIDR: 10.244.1.0/24
clusterDNS: [10.96.0.10, "fd00::a"]
clusterDomain: cluster.local
resolvConf: dns/resolv.conf
nodeStatusUpdateFrequency: 20s
nodeLeaseDurationSeconds: 60
eventRecordQPS: 0
eventBurst: 7
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
    assert_eq!(config.resolv_conf, Some(dir.path().join("dns/resolv.conf")));
    assert_eq!(config.node_status_update_frequency, Duration::from_secs(20));
    assert_eq!(config.node_lease_duration_seconds, 60);
    assert_eq!((config.event_record_qps, config.event_burst), (0, 7));
    assert_eq!(config.pleg, PlegMode::Relist);
    assert_eq!(config.pleg_relist_period, Duration::from_millis(500));
    // Relative to the file's directory, as the kubelet resolves paths in its file.
    assert_eq!(config.root_dir, dir.path().join("state"));
    assert_eq!(config.grpc_socket, PathBuf::from("/run/s.sock"));
}

#[test]
fn an_empty_resolv_conf_is_none() {
    let (_dir, result) = load("resolvConf: \"\"\n", &[]);
    assert_eq!(result.expect("loads").resolv_conf, None);
}

#[test]
fn the_evented_pleg_relists_at_upstreams_evented_period() {
    let (_dir, result) = load("pleg: evented\n", &[]);
    let config = result.expect("loads");
    assert_eq!(config.pleg, PlegMode::Evented);
    assert!(config.pleg_explicit);
    assert_eq!(config.pleg_relist_period, Duration::from_secs(300));
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
            "fileCheckFrequency: -20s",
            "config file DIR/swiftlet.yaml: field `fileCheckFrequency`: invalid duration \"-20s\": must not be negative",
        ),
        (
            "runtimeRequestTimeout: -2m",
            "config file DIR/swiftlet.yaml: field `runtimeRequestTimeout`: invalid duration \"-2m\": must not be negative",
        ),
        (
            "cgroupDriver: cgroupsfs",
            "config file DIR/swiftlet.yaml: field `cgroupDriver`: invalid value \"cgroupsfs\": expected \"cgroupfs\" or \"systemd\"",
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
            "maxPods: -1",
            "config file DIR/swiftlet.yaml: field `maxPods`: invalid value \"-1\": must be at least 1",
        ),
        (
            "nodeLeaseDurationSeconds: -1",
            "config file DIR/swiftlet.yaml: field `nodeLeaseDurationSeconds`: invalid value \"-1\": must be at least 1",
        ),
        (
            "eventRecordQPS: -1",
            "config file DIR/swiftlet.yaml: field `eventRecordQPS`: invalid value \"-1\": must not be a negative number",
        ),
        (
            "eventBurst: -5",
            "config file DIR/swiftlet.yaml: field `eventBurst`: invalid value \"-5\": must not be a negative number",
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
            "pleg: generic",
            "config file DIR/swiftlet.yaml: field `pleg`: invalid value \"generic\": expected \"relist\", \"ebpf\" or \"evented\"",
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

mod eviction {
    //! The eviction and node-allocatable settings.

    use std::time::Duration;

    use super::{err, host, load, run_args};
    use crate::{
        config::{Config, Reserved, ReservedResources},
        eviction::thresholds::{Signal, Threshold, ThresholdValue, Wakeups},
    };

    const MI: i64 = 1 << 20;
    const GI: i64 = 1 << 30;

    /// The thresholds as `text` (grace period), sorted, for compact comparisons.
    fn texts(config: &Config) -> Vec<String> {
        let mut texts: Vec<String> = config
            .eviction
            .thresholds
            .iter()
            .map(|t| match t.grace_period {
                Duration::ZERO => t.text.clone(),
                grace => format!("{} ({}s)", t.text, grace.as_secs()),
            })
            .collect();
        texts.sort();
        texts
    }

    fn find(config: &Config, signal: Signal, hard: bool) -> &Threshold {
        config
            .eviction
            .thresholds
            .iter()
            .find(|t| t.signal == signal && t.is_hard() == hard)
            .unwrap_or_else(|| panic!("no {signal} threshold in {:?}", texts(config)))
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let config = Config::load_with(&run_args(&[]), &host).expect("loads");
        assert_eq!(
            texts(&config),
            [
                "allocatableMemory.available<100Mi",
                "imagefs.available<15%",
                "imagefs.inodesFree<5%",
                "memory.available<100Mi",
                "nodefs.available<10%",
                "nodefs.inodesFree<5%",
            ]
        );
        assert_eq!(
            find(&config, Signal::MemoryAvailable, true).value,
            ThresholdValue::Quantity(100 * MI)
        );
        assert_eq!(
            find(&config, Signal::NodeFsAvailable, true).value,
            ThresholdValue::Percentage(0.1)
        );
        assert_eq!(config.eviction.max_pod_grace_period_secs, 0);
        assert_eq!(
            config.eviction.pressure_transition_period,
            Duration::from_secs(300)
        );
        assert_eq!(config.eviction.monitoring_period, Duration::from_secs(10));
        assert_eq!(config.eviction.wakeups, Wakeups::ALL);
        assert_eq!(
            config.reserved,
            Reserved {
                kube: ReservedResources::default(),
                system: ReservedResources::default(),
                enforce_pods: true,
                cgroups: Vec::new(),
            }
        );
    }

    const FILE: &str = r#"
evictionHard:
  memory.available: 200Mi
evictionSoft:
  memory.available: 500Mi
  memory.pressure.some.avg10: 40
evictionSoftGracePeriod:
  memory.available: 1m30s
  memory.pressure.some.avg10: 30s
  nodefs.available: 1m
evictionMinimumReclaim:
  memory.available: 50Mi
evictionMaxPodGracePeriod: 60
evictionPressureTransitionPeriod: 1m
evictionMonitoringPeriod: 5s
evictionWakeups: [psi, memcg]
kubeReserved:
  cpu: 100m
  memory: 1Gi
systemReserved:
  cpu: "0.5"
  memory: 512Mi
  ephemeral-storage: 1Gi
  pid: 1000
enforceNodeAllocatable: [pods]
"#;

    #[test]
    fn file_values_replace_defaults() {
        let (_dir, result) = load(FILE, &[]);
        let config = result.expect("loads");
        // A set evictionHard replaces the defaults whole; a grace period without soft
        // threshold (nodefs.available) is ignored, as upstream.
        assert_eq!(
            texts(&config),
            [
                "allocatableMemory.available<200Mi",
                "memory.available<200Mi",
                "memory.available<500Mi (90s)",
                "memory.pressure.some.avg10>40 (30s)",
            ]
        );
        let psi = find(
            &config,
            "memory.pressure.some.avg10".parse().expect("signal"),
            false,
        );
        assert_eq!(psi.value, ThresholdValue::Percentage(0.4));
        // The minimum reclaim goes to every threshold of its signal, the copy included.
        for (signal, hard) in [
            (Signal::MemoryAvailable, true),
            (Signal::MemoryAvailable, false),
            (Signal::AllocatableMemoryAvailable, true),
        ] {
            assert_eq!(
                find(&config, signal, hard).min_reclaim,
                Some(ThresholdValue::Quantity(50 * MI))
            );
        }
        assert_eq!(config.eviction.max_pod_grace_period_secs, 60);
        assert_eq!(
            config.eviction.pressure_transition_period,
            Duration::from_secs(60)
        );
        assert_eq!(config.eviction.monitoring_period, Duration::from_secs(5));
        assert_eq!(
            config.eviction.wakeups,
            Wakeups {
                psi: true,
                kernel: false,
                memcg: true,
                level: false,
                poll: false,
            }
        );
        assert_eq!(
            config.reserved.kube,
            ReservedResources {
                cpu_millis: 100,
                memory_bytes: GI,
                ephemeral_storage_bytes: 0,
                pids: 0,
            }
        );
        assert_eq!(
            config.reserved.system,
            ReservedResources {
                cpu_millis: 500,
                memory_bytes: 512 * MI,
                ephemeral_storage_bytes: GI,
                pids: 1000,
            }
        );
        assert_eq!(config.reserved.cpu_millis(), 600);
        assert_eq!(config.reserved.memory_bytes(), GI + 512 * MI);
        assert_eq!(config.reserved.ephemeral_storage_bytes(), GI);
        assert_eq!(config.reserved.pids(), 1000);
        assert!(config.reserved.enforce_pods);
    }

    #[test]
    fn flags_replace_the_files_fields_whole() {
        let (_dir, result) = load(
            FILE,
            &[
                "--eviction-hard",
                "memory.available<1Gi,nodefs.available<5%",
                "--eviction-hard",
                "memory.available<2Gi",
                "--eviction-soft",
                "io.pressure.full.avg60>25.5",
                "--eviction-soft-grace-period",
                "io.pressure.full.avg60=10s",
                "--eviction-minimum-reclaim",
                "nodefs.available=1%",
                "--eviction-max-pod-grace-period",
                "-1",
                "--eviction-pressure-transition-period",
                "30s",
                "--eviction-monitoring-period",
                "1s",
                "--eviction-wakeups=",
                "--kube-reserved",
                "cpu=200m",
                "--system-reserved=memory=1Gi,pid=10",
                "--enforce-node-allocatable",
                "none",
            ],
        );
        let config = result.expect("loads");
        // Repeated flags add up, a later signal replacing an earlier one; no pods enforcement,
        // so no allocatable copy.
        assert_eq!(
            texts(&config),
            [
                "io.pressure.full.avg60>25.5 (10s)",
                "memory.available<2Gi",
                "nodefs.available<5%",
            ]
        );
        assert_eq!(
            find(&config, Signal::NodeFsAvailable, true).min_reclaim,
            Some(ThresholdValue::Percentage(0.01))
        );
        assert_eq!(
            find(&config, Signal::MemoryAvailable, true).min_reclaim,
            None
        );
        assert_eq!(config.eviction.max_pod_grace_period_secs, -1);
        assert_eq!(
            config.eviction.pressure_transition_period,
            Duration::from_secs(30)
        );
        assert_eq!(config.eviction.monitoring_period, Duration::from_secs(1));
        assert_eq!(config.eviction.wakeups, Wakeups::NONE);
        assert_eq!(config.reserved.kube.cpu_millis, 200);
        assert_eq!(config.reserved.kube.memory_bytes, 0);
        assert_eq!(config.reserved.system.memory_bytes, GI);
        assert_eq!(config.reserved.system.pids, 10);
        assert!(!config.reserved.enforce_pods);

        // An empty --eviction-hard means no hard threshold at all; `none` means no wakeups.
        let (_dir, result) = load("", &["--eviction-hard=", "--eviction-wakeups", "none"]);
        let config = result.expect("loads");
        assert!(config.eviction.thresholds.is_empty());
        assert_eq!(config.eviction.wakeups, Wakeups::NONE);

        // The v2 memory level by the kernel's trigger and by the poll, side by side.
        let (_dir, result) = load("", &["--eviction-wakeups", "level,poll"]);
        let config = result.expect("loads");
        assert_eq!(
            config.eviction.wakeups,
            Wakeups {
                level: true,
                poll: true,
                ..Wakeups::NONE
            }
        );
    }

    #[test]
    fn merge_default_eviction_settings_fills_in_unset_signals() {
        let yaml = "evictionHard:\n  memory.available: 1Gi\n  nodefs.available: 0%\n";
        let (_dir, result) = load(yaml, &[]);
        assert_eq!(
            texts(&result.expect("loads")),
            ["allocatableMemory.available<1Gi", "memory.available<1Gi"]
        );

        let merged = format!("{yaml}mergeDefaultEvictionSettings: true\n");
        let (_dir, result) = load(&merged, &[]);
        // nodefs.available was turned off by the operator and stays off.
        assert_eq!(
            texts(&result.expect("loads")),
            [
                "allocatableMemory.available<1Gi",
                "imagefs.available<15%",
                "imagefs.inodesFree<5%",
                "memory.available<1Gi",
                "nodefs.inodesFree<5%",
            ]
        );
        // Into the flag's thresholds too.
        let (_dir, result) = load(
            "mergeDefaultEvictionSettings: true\nenforceNodeAllocatable: [none]\n",
            &["--eviction-hard", "imagefs.available<20%"],
        );
        assert_eq!(
            texts(&result.expect("loads")),
            [
                "imagefs.available<20%",
                "imagefs.inodesFree<5%",
                "memory.available<100Mi",
                "nodefs.available<10%",
                "nodefs.inodesFree<5%",
            ]
        );
    }

    #[test]
    fn an_allocatable_threshold_the_operator_set_is_kept_alone() {
        let (_dir, result) = load(
            "evictionHard:\n  memory.available: 100Mi\n  allocatableMemory.available: 300Mi\n",
            &[],
        );
        assert_eq!(
            texts(&result.expect("loads")),
            [
                "allocatableMemory.available<300Mi",
                "memory.available<100Mi"
            ]
        );
    }

    #[test]
    fn bad_flag_text_is_quoted_naming_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--eviction-hard", "memory.available<abc"],
                "flag --eviction-hard: field `evictionHard`: invalid threshold \"memory.available<abc\": expected a quantity (e.g. 100Mi) or a percentage (e.g. 10%): no digits",
            ),
            (
                &["--eviction-hard", "memory.available<100Mi,nodefs.available"],
                "flag --eviction-hard: field `evictionHard`: invalid threshold \"nodefs.available\": expected <signal><operator><value>, e.g. memory.available<100Mi or memory.pressure.some.avg10>40",
            ),
            (
                &["--eviction-hard", "memory.available>100Mi"],
                "flag --eviction-hard: field `evictionHard`: invalid threshold \"memory.available>100Mi\": memory.available takes the operator \"<\"",
            ),
            (
                &["--eviction-soft", "cpu.pressure.some.avg10>40"],
                "flag --eviction-soft: field `evictionSoft`: invalid threshold \"cpu.pressure.some.avg10>40\": cpu pressure is not an eviction signal: CPU is compressible",
            ),
            (
                &["--eviction-hard", "nodefs.available<110%"],
                "flag --eviction-hard: field `evictionHard`: invalid threshold \"nodefs.available<110%\": a percentage must be between 0% and 100%",
            ),
            (
                &["--eviction-hard", "memory.available<-1Gi"],
                "flag --eviction-hard: field `evictionHard`: invalid threshold \"memory.available<-1Gi\": must be positive (to turn a threshold off, leave it out or write 0%)",
            ),
            (
                &["--eviction-soft-grace-period", "memory.available:1m"],
                "flag --eviction-soft-grace-period: field `evictionSoftGracePeriod`: invalid grace period \"memory.available:1m\": expected <signal>=<duration>, e.g. memory.available=1m30s",
            ),
            (
                &["--eviction-soft-grace-period", "memory.available=-1m"],
                "flag --eviction-soft-grace-period: field `evictionSoftGracePeriod`: invalid grace period \"memory.available=-1m\": must not be negative",
            ),
            (
                &["--eviction-minimum-reclaim", "memory.available=-5Mi"],
                "flag --eviction-minimum-reclaim: field `evictionMinimumReclaim`: invalid minimum reclaim \"memory.available=-5Mi\": must not be negative",
            ),
            (
                &["--kube-reserved", "gpu=1"],
                "flag --kube-reserved: field `kubeReserved`: invalid reservation \"gpu=1\": cannot reserve \"gpu\": expected cpu, memory, ephemeral-storage or pid",
            ),
            (
                &["--system-reserved", "memory=lots"],
                "flag --system-reserved: field `systemReserved`: invalid reservation \"memory=lots\": \"memory\": not a quantity (no digits), expected e.g. 100m or 1Gi",
            ),
            (
                &["--enforce-node-allocatable", "pods,system-reserved"],
                "flag --enforce-node-allocatable: field `enforceNodeAllocatable`: invalid value \"system-reserved\": systemReservedCgroup (--system-reserved-cgroup) must name the cgroup when \"system-reserved\" or \"system-reserved-compressible\" is enforced",
            ),
            (
                &["--system-reserved-cgroup", "system.slice"],
                "flag --system-reserved-cgroup: field `systemReservedCgroup`: invalid cgroup \"system.slice\": must be absolute in the cgroup hierarchy, e.g. /system.slice",
            ),
            (
                &["--kube-reserved-cgroup", "/kube.slice/../../etc"],
                "flag --kube-reserved-cgroup: field `kubeReservedCgroup`: invalid cgroup \"/kube.slice/../../etc\": must not contain \".\" or \"..\" components",
            ),
            (
                &["--eviction-wakeups", "psi,bpf"],
                "flag --eviction-wakeups: field `evictionWakeups`: invalid value \"bpf\": expected \"psi\", \"kernel\", \"memcg\", \"level\", \"poll\" or \"none\"",
            ),
            (
                &["--eviction-monitoring-period", "0s"],
                "flag --eviction-monitoring-period: field `evictionMonitoringPeriod`: invalid duration \"0s\": must be greater than 0",
            ),
        ];
        for (flags, want) in cases {
            assert_eq!(err("", flags), *want, "{flags:?}");
        }
    }

    #[test]
    fn a_soft_threshold_needs_a_grace_period() {
        assert_eq!(
            err(
                "",
                &[
                    "--eviction-soft",
                    "memory.available<1Gi,nodefs.available<15%",
                    "--eviction-soft-grace-period",
                    "memory.available=1m",
                ]
            ),
            "flag --eviction-soft: field `evictionSoft`: invalid threshold \"nodefs.available<15%\": grace period must be specified for the soft eviction threshold nodefs.available"
        );
    }

    #[test]
    fn bad_file_values_name_field_and_entry() {
        let cases: &[(&str, &str)] = &[
            (
                "evictionHard:\n  memory.availabe: 100Mi",
                "config file DIR/swiftlet.yaml: field `evictionHard`: invalid threshold \"memory.availabe: 100Mi\": unknown eviction signal \"memory.availabe\": expected memory.available, allocatableMemory.available, nodefs.available, nodefs.inodesFree, imagefs.available, imagefs.inodesFree, pid.available, or <memory|io>.pressure.<some|full>.<avg10|avg60|avg300>",
            ),
            (
                "evictionSoft:\n  memory.pressure.full.avg10: 140",
                "config file DIR/swiftlet.yaml: field `evictionSoft`: invalid threshold \"memory.pressure.full.avg10: 140\": a pressure threshold is a percentage between 0 and 100, e.g. 40 or 25.5%",
            ),
            (
                "evictionSoft:\n  memory.available: 1Gi",
                "config file DIR/swiftlet.yaml: field `evictionSoft`: invalid threshold \"memory.available: 1Gi\": grace period must be specified for the soft eviction threshold memory.available",
            ),
            (
                "evictionSoftGracePeriod:\n  memory.available: soon",
                "config file DIR/swiftlet.yaml: field `evictionSoftGracePeriod`: invalid grace period \"memory.available: soon\": expected e.g. 1m30s",
            ),
            (
                "evictionMinimumReclaim:\n  memory.pressure.some.avg10: 5",
                "config file DIR/swiftlet.yaml: field `evictionMinimumReclaim`: invalid minimum reclaim \"memory.pressure.some.avg10: 5\": a pressure signal takes no minimum reclaim",
            ),
            (
                "evictionMaxPodGracePeriod: 9999999999",
                "config file DIR/swiftlet.yaml: field `evictionMaxPodGracePeriod`: invalid value \"9999999999\": must fit in 32 bits (seconds)",
            ),
            (
                "evictionPressureTransitionPeriod: -5m",
                "config file DIR/swiftlet.yaml: field `evictionPressureTransitionPeriod`: invalid duration \"-5m\": must not be negative",
            ),
            (
                "kubeReserved:\n  cpu: -100m",
                "config file DIR/swiftlet.yaml: field `kubeReserved`: invalid reservation \"cpu: -100m\": \"cpu\" must not be negative",
            ),
            (
                "enforceNodeAllocatable: [kube-reserved]",
                "config file DIR/swiftlet.yaml: field `enforceNodeAllocatable`: invalid value \"kube-reserved\": kubeReservedCgroup (--kube-reserved-cgroup) must name the cgroup when \"kube-reserved\" or \"kube-reserved-compressible\" is enforced",
            ),
            (
                "enforceNodeAllocatable: [kube-reserved-compressible]\nkubeReservedCgroup: \"\"",
                "config file DIR/swiftlet.yaml: field `enforceNodeAllocatable`: invalid value \"kube-reserved-compressible\": kubeReservedCgroup (--kube-reserved-cgroup) must name the cgroup when \"kube-reserved\" or \"kube-reserved-compressible\" is enforced",
            ),
            (
                "systemReservedCgroup: /system.slice\nenforceNodeAllocatable: [system-reserved, pods, system-reserved-compressible]",
                "config file DIR/swiftlet.yaml: field `enforceNodeAllocatable`: invalid value \"system-reserved-compressible\": cannot be combined with \"system-reserved\": the cgroup is limited either fully or in CPU only",
            ),
            (
                "kubeReservedCgroup: /kube.slice\nenforceNodeAllocatable: [kube-reserved-compressible, kube-reserved]",
                "config file DIR/swiftlet.yaml: field `enforceNodeAllocatable`: invalid value \"kube-reserved\": cannot be combined with \"kube-reserved-compressible\": the cgroup is limited either fully or in CPU only",
            ),
            (
                "cgroupsPerQOS: false\nkubeReservedCgroup: /kube.slice\nenforceNodeAllocatable: [kube-reserved]",
                "config file DIR/swiftlet.yaml: field `enforceNodeAllocatable`: invalid value \"kube-reserved\": needs cgroupsPerQOS: true; without the pods' cgroup, set enforceNodeAllocatable to [] or [none]",
            ),
            (
                "systemReservedCgroup: /\nenforceNodeAllocatable: [system-reserved]",
                "config file DIR/swiftlet.yaml: field `systemReservedCgroup`: invalid cgroup \"/\": names the root cgroup, which takes no limits; name a cgroup below it",
            ),
            (
                "systemReservedCgroup: /system.slice\nreservedSystemCPUs: \"0\"",
                "config file DIR/swiftlet.yaml: field `systemReservedCgroup`: invalid cgroup \"/system.slice\": cannot be used with reservedSystemCPUs (--reserved-cpus)",
            ),
            (
                "enforceNodeAllocatable: [pods, system-reserved, none]\nsystemReservedCgroup: /s",
                "config file DIR/swiftlet.yaml: field `enforceNodeAllocatable`: invalid value \"none\": \"none\" cannot be combined with other values",
            ),
            (
                "enforceNodeAllocatable: [pods, pods]",
                "config file DIR/swiftlet.yaml: field `enforceNodeAllocatable`: invalid value \"pods\": listed twice",
            ),
            (
                "enforceNodeAllocatable: [pods, none]",
                "config file DIR/swiftlet.yaml: field `enforceNodeAllocatable`: invalid value \"none\": \"none\" cannot be combined with other values",
            ),
            (
                "enforceNodeAllocatable: [everything]",
                "config file DIR/swiftlet.yaml: field `enforceNodeAllocatable`: invalid value \"everything\": expected \"pods\", \"system-reserved\", \"system-reserved-compressible\", \"kube-reserved\", \"kube-reserved-compressible\" or \"none\"",
            ),
            (
                "cgroupsPerQOS: false",
                "built-in default: field `enforceNodeAllocatable`: invalid value \"pods\": needs cgroupsPerQOS: true; without the pods' cgroup, set enforceNodeAllocatable to [] or [none]",
            ),
            (
                "evictionWakeups: [none, psi]",
                "config file DIR/swiftlet.yaml: field `evictionWakeups`: invalid value \"none\": \"none\" cannot be combined with other values",
            ),
        ];
        for (yaml, want) in cases {
            assert_eq!(err(yaml, &[]), *want, "{yaml}");
        }
    }

    #[test]
    fn an_empty_file_map_means_none() {
        let (_dir, result) = load("evictionHard: {}\nevictionWakeups: []\n", &[]);
        let config = result.expect("loads");
        assert!(config.eviction.thresholds.is_empty());
        assert_eq!(config.eviction.wakeups, Wakeups::NONE);
    }
}

#[test]
fn reserved_cgroups_get_what_their_reservation_names() {
    use crate::config::ReservedCgroup;
    let (_dir, config) = load(
        "systemReserved:\n  cpu: 250m\n  memory: 100Mi\n  pid: \"300\"\n\
         kubeReserved:\n  cpu: \"1\"\n  memory: 1Gi\n  pid: \"50\"\n\
         systemReservedCgroup: /system.slice\nkubeReservedCgroup: /kube.slice\n\
         enforceNodeAllocatable: [pods, kube-reserved-compressible, system-reserved]\n",
        &[],
    );
    let reserved = config.expect("loads").reserved;
    assert!(reserved.enforce_pods);
    assert_eq!(
        reserved.cgroups,
        vec![
            ReservedCgroup {
                field: "systemReservedCgroup",
                enforcement: "system-reserved",
                name: "/system.slice".into(),
                cpu_millis: Some(250),
                memory_bytes: Some(100 << 20),
                pids: Some(300),
            },
            // Compressible: the CPU alone, whatever else is reserved.
            ReservedCgroup {
                field: "kubeReservedCgroup",
                enforcement: "kube-reserved-compressible",
                name: "/kube.slice".into(),
                cpu_millis: Some(1000),
                memory_bytes: None,
                pids: None,
            },
        ]
    );

    // A reservation without memory sets no memory limit; a named cgroup that is not enforced
    // is left alone; the flags name the cgroups as the file does.
    let (_dir, config) = load(
        "systemReserved:\n  cpu: 100m\n",
        &[
            "--system-reserved-cgroup",
            "/sys.slice",
            "--kube-reserved-cgroup",
            "/kube.slice",
            "--enforce-node-allocatable",
            "system-reserved",
        ],
    );
    let reserved = config.expect("loads").reserved;
    assert!(!reserved.enforce_pods);
    assert_eq!(reserved.cgroups.len(), 1);
    assert_eq!(reserved.cgroups[0].name, "/sys.slice");
    assert_eq!(reserved.cgroups[0].cpu_millis, Some(100));
    assert_eq!(reserved.cgroups[0].memory_bytes, None);
    assert_eq!(reserved.cgroups[0].pids, None);

    // An empty name is upstream's "none".
    let (_dir, config) = load("systemReservedCgroup: \"\"\n", &[]);
    assert!(config.expect("loads").reserved.cgroups.is_empty());
}

#[test]
fn cpu_manager_settings_from_file_and_flags() {
    let config = Config::load_with(&run_args(&[]), &host).expect("defaults");
    assert_eq!(config.cpu_manager, CpuManagerConfig::default());
    assert_eq!(config.cpu_manager.reconcile_period, Duration::from_secs(10));

    let (_dir, config) = load(
        "cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\ncpuManagerReconcilePeriod: 5s\n\
         cpuManagerPolicyOptions:\n  full-pcpus-only: \"true\"\nkubeReserved:\n  cpu: 500m\n",
        &["--cpu-manager-apply", "reconcile"],
    );
    let config = config.expect("loads");
    let cpus = &config.cpu_manager;
    assert_eq!(cpus.policy, CpuManagerPolicy::Static);
    assert_eq!(
        cpus.reserved_system_cpus.as_ref().map(ToString::to_string),
        Some("0".into())
    );
    assert_eq!(cpus.reconcile_period, Duration::from_secs(5));
    assert!(cpus.options.full_pcpus_only && !cpus.options.distribute_cpus_across_numa);
    assert_eq!(cpus.apply, CpuApply::Reconcile);
    // As upstream, the reserved CPUs replace the cpu of both reservations.
    assert_eq!(config.reserved.kube.cpu_millis, 0);
    assert_eq!(config.reserved.cpu_millis(), 1000);

    let flags = Config::load_with(
        &run_args(&[
            "--cpu-manager-policy",
            "static",
            "--reserved-cpus",
            "0-1",
            "--cpu-manager-policy-options",
            "distribute-cpus-across-numa=true",
            "--cpu-manager-reset-state",
        ]),
        &host,
    )
    .expect("flags");
    assert_eq!(
        flags.cpu_manager.reserved_system_cpus.map(|c| c.len()),
        Some(2)
    );
    assert!(flags.cpu_manager.options.distribute_cpus_across_numa);
    assert!(flags.cpu_manager.reset_state);
}

#[test]
fn cpu_manager_errors_name_the_field_and_value() {
    for (yaml, flags, want) in [
        (
            "",
            &["--cpu-manager-policy", "dynamic"][..],
            "flag --cpu-manager-policy: field `cpuManagerPolicy`: invalid value \"dynamic\": expected \"none\" or \"static\"",
        ),
        (
            "reservedSystemCPUs: \"0-x\"\n",
            &[][..],
            "config file DIR/swiftlet.yaml: field `reservedSystemCPUs`: invalid CPU list \"0-x\"",
        ),
        (
            "cpuManagerPolicyOptions:\n  full-pcpus-only: \"true\"\n",
            &[][..],
            "config file DIR/swiftlet.yaml: field `cpuManagerPolicyOptions`: invalid option \"full-pcpus-only: true\": policy options need cpuManagerPolicy \"static\" (it is \"none\")",
        ),
        (
            "cpuManagerPolicy: static\n",
            &["--cpu-manager-policy-options", "align-by-socket=true"][..],
            "flag --cpu-manager-policy-options: field `cpuManagerPolicyOptions`: invalid option \"align-by-socket=true\": unknown option \"align-by-socket\"",
        ),
        (
            "",
            &["--cpu-manager-apply", "sometimes"][..],
            "flag --cpu-manager-apply: field `cpuManagerApply`: invalid value \"sometimes\": expected \"events\" or \"reconcile\"",
        ),
    ] {
        let got = err(yaml, flags);
        assert!(
            got.starts_with(want),
            "{got}\nwanted it to start with\n{want}"
        );
    }
}

#[test]
fn kubelet_server_defaults_standalone_and_with_an_api_server() {
    let config = Config::load_with(&run_args(&["--root-dir", "/srv/s"]), &host).expect("loads");
    let server = &config.server;
    assert_eq!(
        server.address,
        Some("0.0.0.0:10250".parse::<SocketAddr>().expect("addr"))
    );
    assert_eq!(server.cert_directory, PathBuf::from("/srv/s/pki"));
    assert_eq!(
        server.cert_and_key(),
        (
            PathBuf::from("/srv/s/pki/kubelet.crt"),
            PathBuf::from("/srv/s/pki/kubelet.key"),
            true
        )
    );
    assert_eq!(server.tls_min_version, TlsVersion::Tls12);
    assert!(!server.authentication.anonymous);
    assert!(!server.authentication.webhook);
    assert_eq!(
        server.authentication.webhook_cache_ttl,
        Duration::from_secs(120)
    );
    assert_eq!(server.authentication.client_ca_file, None);
    assert_eq!(server.authorization.mode, AuthorizationMode::AlwaysAllow);
    assert!(server.enable_debugging_handlers);
    // The read-only port stays on loopback unless --address is given.
    assert_eq!(
        config.read_only_address,
        Some("127.0.0.1:10255".parse::<SocketAddr>().expect("addr"))
    );

    let config =
        Config::load_with(&run_args(&["--kubeconfig", "/etc/kubeconfig"]), &host).expect("loads");
    assert!(config.server.authentication.webhook);
    assert_eq!(config.server.authorization.mode, AuthorizationMode::Webhook);
    assert_eq!(
        config.server.authorization.cache_authorized_ttl,
        Duration::from_secs(300)
    );
    assert_eq!(
        config.server.authorization.cache_unauthorized_ttl,
        Duration::from_secs(30)
    );
}

#[test]
fn kubelet_server_from_file_and_flags() {
    let yaml = "port: 11250\naddress: 10.0.0.5\ntlsCertFile: pki/my.crt\ntlsPrivateKeyFile: pki/my.key\n\
                tlsMinVersion: VersionTLS13\nauthentication:\n  anonymous:\n    enabled: true\n  \
                x509:\n    clientCAFile: ca.crt\n  webhook:\n    enabled: false\n    cacheTTL: 10s\n\
                authorization:\n  mode: AlwaysAllow\n  webhook:\n    cacheAuthorizedTTL: 1m\n";
    let (dir, config) = load(yaml, &[]);
    let server = config.expect("loads").server;
    assert_eq!(
        server.address,
        Some("10.0.0.5:11250".parse::<SocketAddr>().expect("addr"))
    );
    assert_eq!(server.tls_cert_file, Some(dir.path().join("pki/my.crt")));
    assert_eq!(
        server.tls_private_key_file,
        Some(dir.path().join("pki/my.key"))
    );
    assert_eq!(server.tls_min_version, TlsVersion::Tls13);
    // Anonymous with AlwaysAllow is turned off (and said at start), as the kube-apiserver does.
    assert!(!server.authentication.anonymous);
    assert!(server.authentication.anonymous_turned_off);
    assert_eq!(
        server.authentication.client_ca_file,
        Some(dir.path().join("ca.crt"))
    );
    assert_eq!(
        server.authentication.webhook_cache_ttl,
        Duration::from_secs(10)
    );
    assert_eq!(
        server.authorization.cache_authorized_ttl,
        Duration::from_secs(60)
    );

    let (_dir, config) = load(
        yaml,
        &[
            "--port",
            "0",
            "--anonymous-auth=false",
            "--client-ca-file",
            "/etc/ca.pem",
            "--cert-dir",
            "/tmp/pki",
        ],
    );
    let server = config.expect("loads").server;
    assert_eq!(server.address, None);
    assert!(!server.authentication.anonymous);
    assert_eq!(
        server.authentication.client_ca_file,
        Some(PathBuf::from("/etc/ca.pem"))
    );
    assert_eq!(server.cert_directory, PathBuf::from("/tmp/pki"));
    let (_dir, config) = load("enableDebuggingHandlers: false\n", &[]);
    assert!(!config.expect("loads").server.enable_debugging_handlers);
    // A bare --anonymous-auth means true; standalone (AlwaysAllow) it is turned off.
    let (_dir, config) = load("", &["--anonymous-auth"]);
    let authn = config.expect("loads").server.authentication;
    assert!(!authn.anonymous && authn.anonymous_turned_off);
    // With Webhook authorization anonymous requests stay, to be authorized one by one.
    let (_dir, config) = load("", &["--anonymous-auth", "--kubeconfig", "/etc/kubeconfig"]);
    let authn = config.expect("loads").server.authentication;
    assert!(authn.anonymous && !authn.anonymous_turned_off);
}

#[test]
fn the_read_only_port_leaves_loopback_only_when_named() {
    let addr = |s: &str| Some(s.parse::<SocketAddr>().expect("addr"));
    for (yaml, flags, want) in [
        // `address` is the kubelet server's; alone it does not move the read-only port.
        ("", &["--address", "10.0.0.5"][..], addr("127.0.0.1:10255")),
        ("address: 10.0.0.5\n", &[][..], addr("127.0.0.1:10255")),
        // Both named: the kubelet's binding.
        (
            "",
            &["--address", "10.0.0.5", "--read-only-port", "10255"][..],
            addr("10.0.0.5:10255"),
        ),
        (
            "address: 10.0.0.5\nreadOnlyPort: 10266\n",
            &[][..],
            addr("10.0.0.5:10266"),
        ),
        // swiftlet's own field names it directly.
        (
            "",
            &["--read-only-address", "0.0.0.0"][..],
            addr("0.0.0.0:10255"),
        ),
        (
            "readOnlyAddress: \"::1\"\naddress: 10.0.0.5\nreadOnlyPort: 10255\n",
            &[][..],
            addr("[::1]:10255"),
        ),
        ("", &["--read-only-port", "0"][..], None),
    ] {
        let (_dir, config) = load(yaml, flags);
        assert_eq!(
            config.expect("loads").read_only_address,
            want,
            "{yaml:?} {flags:?}"
        );
    }
    assert_eq!(
        err("readOnlyAddress: everywhere\n", &[]),
        "config file DIR/swiftlet.yaml: field `readOnlyAddress`: invalid address \"everywhere\": \
         expected an IP address, e.g. 127.0.0.1"
    );
}

#[test]
fn the_agents_own_oom_score_adj() {
    let (_dir, config) = load("", &[]);
    assert_eq!(config.expect("loads").oom_score_adj, -999);
    let (_dir, config) = load("oomScoreAdj: -500\n", &[]);
    assert_eq!(config.expect("loads").oom_score_adj, -500);
    let (_dir, config) = load("oomScoreAdj: -500\n", &["--oom-score-adj", "0"]);
    assert_eq!(config.expect("loads").oom_score_adj, 0);
    let message = err("oomScoreAdj: 2000\n", &[]);
    assert!(
        message.contains("oomScoreAdj") && message.contains("between -1000 and 1000"),
        "{message}"
    );
}

#[test]
fn kubelet_server_errors_name_the_field() {
    for (yaml, flags, want) in [
        (
            "authorization:\n  mode: Webhook\n",
            &[][..],
            "config file DIR/swiftlet.yaml: field `authorization.mode`: invalid value \"Webhook\": \
             Webhook authorization needs an API server: set --kubeconfig, or use AlwaysAllow",
        ),
        (
            "",
            &["--authorization-mode", "RBAC"][..],
            "flag --authorization-mode: field `authorization.mode`: invalid value \"RBAC\": \
             expected \"AlwaysAllow\" or \"Webhook\"",
        ),
        (
            "authentication:\n  webhook:\n    enabled: true\n",
            &[][..],
            "config file DIR/swiftlet.yaml: field `authentication.webhook.enabled`: invalid value \
             \"true\": token webhook authentication needs an API server: set --kubeconfig, or \
             disable it",
        ),
        (
            "tlsCertFile: /a.crt\n",
            &[][..],
            "config file DIR/swiftlet.yaml: field `tlsPrivateKeyFile`: invalid path \"\": \
             tlsCertFile /a.crt is set: its key must be set too",
        ),
        (
            "tlsMinVersion: VersionTLS10\n",
            &[][..],
            "config file DIR/swiftlet.yaml: field `tlsMinVersion`: invalid value \"VersionTLS10\": \
             TLS 1.0 and 1.1 are not supported: use VersionTLS12 or VersionTLS13",
        ),
        (
            "port: 70000\n",
            &[][..],
            "config file DIR/swiftlet.yaml: field `port`: invalid port \"70000\": must be between \
             0 (off) and 65535",
        ),
    ] {
        assert_eq!(err(yaml, flags), want, "{yaml} {flags:?}");
    }
    assert_eq!(
        err("tlsCipherSuites: [TLS_RSA_WITH_AES_128_CBC_SHA]\n", &[]),
        "config file DIR/swiftlet.yaml: field `tlsCipherSuites`: invalid cipher suite \
         \"TLS_RSA_WITH_AES_128_CBC_SHA\": not one of the suites this server implements: \
         TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, \
         TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, \
         TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256, \
         TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256"
    );
    // The seeds' six ECDHE suites, Go spelling (ChaCha20 without `_SHA256`).
    let (_dir, config) = load(
        "tlsCipherSuites:\n  - TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256\n  - TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305\n",
        &[],
    );
    assert_eq!(
        config.expect("loads").server.tls_cipher_suites,
        vec![
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"
        ]
    );
    // An unknown field inside `authentication` is refused by name.
    let message = err("authentication:\n  oidc: {}\n", &[]);
    assert!(message.contains("oidc"), "{message}");
}

#[test]
fn security_settings_from_file_and_flags() {
    let config = Config::load_with(&run_args(&[]), &host).expect("loads");
    assert_eq!(config.security, SecurityConfig::default());
    assert!(!config.security.seccomp_default);
    let (_dir, loaded) = load(
        "seccompDefault: true\nallowedUnsafeSysctls: [\"kernel.msg*\", net.core.somaxconn]\n",
        &[],
    );
    let config = loaded.expect("loads");
    assert!(config.security.seccomp_default);
    assert_eq!(
        config.security.allowed_unsafe_sysctls,
        vec!["kernel.msg*".to_owned(), "net.core.somaxconn".to_owned()]
    );
    // The flags replace the file's.
    let (_dir, loaded) = load(
        "seccompDefault: true\nallowedUnsafeSysctls: [\"kernel.msg*\"]\n",
        &[
            "--seccomp-default=false",
            "--allowed-unsafe-sysctls",
            "kernel.sem,fs.mqueue.*",
        ],
    );
    let config = loaded.expect("loads");
    assert!(!config.security.seccomp_default);
    assert_eq!(
        config.security.allowed_unsafe_sysctls,
        vec!["kernel.sem".to_owned(), "fs.mqueue.*".to_owned()]
    );
    let config = Config::load_with(&run_args(&["--seccomp-default"]), &host).expect("loads");
    assert!(config.security.seccomp_default);
}

#[test]
fn bad_unsafe_sysctls_name_the_field_and_value() {
    assert_eq!(
        err("allowedUnsafeSysctls: [vm.swappiness]\n", &[]),
        "config file DIR/swiftlet.yaml: field `allowedUnsafeSysctls`: invalid sysctl \
         \"vm.swappiness\": the sysctls \"vm.swappiness\" are not known to be namespaced"
    );
    let flag = err("", &["--allowed-unsafe-sysctls", "kernel.*msg"]);
    assert!(
        flag.starts_with(
            "flag --allowed-unsafe-sysctls: field `allowedUnsafeSysctls`: invalid sysctl \
             \"kernel.*msg\": sysctl \"kernel.*msg\" must have at most 253 characters"
        ),
        "{flag}"
    );
    assert!(err("seccompDefault: maybe\n", &[]).contains("seccompDefault"));
}

#[test]
fn registration_settings() {
    let config = Config::load_with(&run_args(&[]), &host).expect("loads");
    assert!(config.node_labels.is_empty());
    assert!(config.register_with_taints.is_empty());
    assert!(config.node_ip.is_empty());
    assert!(config.register_node);
    // Upstream's default once nodeStatusUpdateFrequency is left alone.
    assert_eq!(
        config.node_status_report_frequency,
        Duration::from_secs(300)
    );

    let (_dir, from_file) = load(
        "registerNode: false\nnodeStatusUpdateFrequency: 4s\nregisterWithTaints:\n- key: dedicated\n  value: gpu\n  effect: NoSchedule\n",
        &[
            "--node-labels",
            "node.kubernetes.io/pool=a,disk=ssd",
            "--node-ip",
            "10.0.0.1,fd00::1",
        ],
    );
    let config = from_file.expect("loads");
    assert!(!config.register_node);
    // nodeStatusUpdateFrequency written, nodeStatusReportFrequency not: the same (upstream's
    // backward compatibility).
    assert_eq!(config.node_status_report_frequency, Duration::from_secs(4));
    assert_eq!(
        config
            .register_with_taints
            .iter()
            .map(|t| (t.key.as_str(), t.value.as_deref(), t.effect.as_str()))
            .collect::<Vec<_>>(),
        [("dedicated", Some("gpu"), "NoSchedule")]
    );
    assert_eq!(
        config.node_labels.get("disk").map(String::as_str),
        Some("ssd")
    );
    assert_eq!(
        config.node_ip,
        [
            "10.0.0.1".parse::<IpAddr>().expect("ip"),
            "fd00::1".parse().expect("ip")
        ]
    );

    let (_dir, flags) = load(
        "registerNode: false\nnodeStatusReportFrequency: 1m\nregisterWithTaints:\n- key: a\n  effect: NoSchedule\n",
        &[
            "--register-node=true",
            "--register-with-taints",
            "b=1:NoExecute",
        ],
    );
    let config = flags.expect("loads");
    assert!(config.register_node);
    assert_eq!(config.node_status_report_frequency, Duration::from_secs(60));
    assert_eq!(config.register_with_taints.len(), 1);
    assert_eq!(config.register_with_taints[0].key, "b");

    assert_eq!(
        err(
            "",
            &["--node-labels", "node-role.kubernetes.io/control-plane="]
        ),
        "flag --node-labels: field `nodeLabels`: invalid label \
         \"node-role.kubernetes.io/control-plane=\": unknown 'kubernetes.io' or 'k8s.io' label \
         \"node-role.kubernetes.io/control-plane\": labels in the 'kubernetes.io' namespace must \
         begin with an allowed prefix (kubelet.kubernetes.io, node.kubernetes.io) or be in the \
         specifically allowed set (beta.kubernetes.io/arch, beta.kubernetes.io/instance-type, \
         beta.kubernetes.io/os, failure-domain.beta.kubernetes.io/region, \
         failure-domain.beta.kubernetes.io/zone, kubernetes.io/arch, kubernetes.io/hostname, \
         kubernetes.io/os, node.kubernetes.io/instance-type, topology.kubernetes.io/region, \
         topology.kubernetes.io/zone)"
    );
    assert_eq!(
        err("registerWithTaints:\n- key: a\n", &[]),
        "config file DIR/swiftlet.yaml: field `registerWithTaints`: invalid taint \"a=:\": \
         invalid taint spec: a:"
    );
    assert_eq!(
        err("", &["--node-ip", "10.0.0.1,10.0.0.2"]),
        "flag --node-ip: field `nodeIP`: invalid address \"10.0.0.1,10.0.0.2\": must contain \
         either a single IP or a dual-stack pair of IPs"
    );
    assert_eq!(
        err("nodeStatusReportFrequency: -1s\n", &[]),
        "config file DIR/swiftlet.yaml: field `nodeStatusReportFrequency`: invalid duration \
         \"-1s\": must not be negative"
    );
}

#[test]
fn change_detection_strategy_is_watch_unless_the_file_says_otherwise() {
    use crate::config::ChangeDetectionStrategy;
    let (_dir, config) = load("", &[]);
    assert_eq!(
        config
            .expect("loads")
            .config_map_and_secret_change_detection_strategy,
        ChangeDetectionStrategy::Watch
    );
    let (_dir, config) = load("configMapAndSecretChangeDetectionStrategy: Cache\n", &[]);
    assert_eq!(
        config
            .expect("loads")
            .config_map_and_secret_change_detection_strategy,
        ChangeDetectionStrategy::Cache
    );
    let msg = err("configMapAndSecretChangeDetectionStrategy: watch\n", &[]);
    assert!(
        msg.contains("configMapAndSecretChangeDetectionStrategy")
            && msg.contains("must be one of: \"Watch\", \"Cache\", or \"Get\""),
        "{msg}"
    );
}

#[test]
fn configz_shows_the_effective_configuration_under_upstream_names() {
    let yaml = format!(
        "{FULL}authentication:\n  webhook:\n    cacheTTL: 3m\nfeatureGates:\n  KubeletTracing: false\n\
         tlsCertFile: /etc/kubelet/tls.crt\ntlsPrivateKeyFile: /etc/kubelet/tls.key\n"
    );
    let (_dir, result) = load(&yaml, &["--sync-frequency", "2m", "--max-pods", "70"]);
    let config = result.expect("config loads");
    let configz = &config.configz;
    let kubelet = &configz["kubeletconfig"];
    assert_eq!(kubelet["kind"], "KubeletConfiguration");
    // Flags over the file, the file over defaults, defaults where nothing is written.
    assert_eq!(kubelet["syncFrequency"], "2m0s");
    assert_eq!(kubelet["maxPods"], 70);
    assert_eq!(kubelet["fileCheckFrequency"], "5m0s");
    assert_eq!(kubelet["runtimeRequestTimeout"], "30s");
    assert_eq!(kubelet["nodeName"], "worker-7");
    assert_eq!(kubelet["healthzPort"], 11248);
    assert_eq!(kubelet["healthzBindAddress"], "0.0.0.0");
    assert_eq!(
        kubelet["clusterDNS"],
        serde_json::json!(["10.96.0.10", "fd00::a"])
    );
    assert_eq!(kubelet["cgroupsPerQOS"], false);
    assert_eq!(kubelet["authentication"]["webhook"]["cacheTTL"], "3m0s");
    assert_eq!(kubelet["featureGates"]["KubeletTracing"], false);
    // A key file's path, as upstream shows it; never what the file holds.
    assert_eq!(kubelet["tlsPrivateKeyFile"], "/etc/kubelet/tls.key");
    assert!(kubelet.get("staticPodPath").is_some());
    assert!(
        kubelet.get("kubeconfig").is_none(),
        "unset fields are left out"
    );
}

#[test]
fn cfs_quota_settings_follow_upstreams_validation() {
    use crate::cm::helpers::CfsQuota;
    let (_dir, result) = load("cpuCFSQuota: false\n", &[]);
    assert_eq!(
        result.expect("loads").cfs_quota,
        CfsQuota {
            enforce: false,
            period_us: 100_000
        }
    );
    // 100ms is the default: no gate needed.
    let (_dir, result) = load("cpuCFSQuotaPeriod: 100ms\n", &[]);
    assert_eq!(result.expect("loads").cfs_quota, CfsQuota::default());
    let gated = "featureGates:\n  CustomCPUCFSQuotaPeriod: true\ncpuCFSQuotaPeriod: 50ms\n";
    let (_dir, result) = load(gated, &[]);
    assert_eq!(
        result.expect("loads").cfs_quota,
        CfsQuota {
            enforce: true,
            period_us: 50_000
        }
    );
    let without_gate = err("cpuCFSQuotaPeriod: 200ms\n", &[]);
    assert!(
        without_gate.contains("field `cpuCFSQuotaPeriod`")
            && without_gate.contains("\"200ms\"")
            && without_gate.contains("CustomCPUCFSQuotaPeriod"),
        "{without_gate}"
    );
    for (period, shown) in [("2s", "\"2s\""), ("500us", "\"500µs\""), ("0s", "\"0s\"")] {
        let out_of_range = err(
            &format!(
                "featureGates:\n  CustomCPUCFSQuotaPeriod: true\ncpuCFSQuotaPeriod: {period}\n"
            ),
            &[],
        );
        assert!(
            out_of_range.contains("between 1ms and 1s") && out_of_range.contains(shown),
            "{out_of_range}"
        );
    }
    // Both ends are in range.
    for period in ["1ms", "1s"] {
        let (_dir, result) = load(
            &format!(
                "featureGates:\n  CustomCPUCFSQuotaPeriod: true\ncpuCFSQuotaPeriod: {period}\n"
            ),
            &[],
        );
        assert!(result.is_ok(), "{period}: {result:?}");
    }
    assert!(err("cpuCFSQuotaPeriod: soon\n", &[]).contains("cpuCFSQuotaPeriod"));
}

/// `qosReserved` as upstream's `ParseQOSReserved` reads it, in force only with its gate.
#[test]
fn qos_reserved_is_a_memory_percentage_behind_its_gate() {
    let gated = |body: &str| format!("featureGates:\n  QOSReserved: true\nqosReserved:\n{body}");
    let (_dir, result) = load(&gated("  memory: 50%\n"), &[]);
    let config = result.expect("loads");
    assert_eq!(config.qos_reserved_memory, Some(50));
    assert!(config.no_effect.iter().all(|n| n.field != "qosReserved"));
    // Without the gate: checked, not in force, and said so once.
    let (_dir, result) = load("qosReserved:\n  memory: 50%\n", &[]);
    let config = result.expect("loads");
    assert_eq!(config.qos_reserved_memory, None);
    let unused: Vec<&str> = config.no_effect.iter().map(|n| n.field.as_str()).collect();
    assert_eq!(unused, ["qosReserved"]);
    for (body, says) in [
        ("  cpu: 50%\n", "only memory"),
        ("  memory: 50\n", "expected a percentage"),
        ("  memory: half%\n", "whole percentage"),
        ("  memory: 101%\n", "between 0% and 100%"),
        ("  memory: -1%\n", "between 0% and 100%"),
    ] {
        let message = load(&gated(body), &[])
            .1
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            message.contains("qosReserved") && message.contains(says),
            "{body}: {message}"
        );
    }
    let flat = load(
        &format!(
            "{}cgroupsPerQOS: false\nenforceNodeAllocatable: []\n",
            gated("  memory: 10%\n")
        ),
        &[],
    );
    let message = flat.1.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("cgroupsPerQOS"), "{message}");
}
