//! Tests of loading upstream's KubeletConfiguration as operators write it: kubeadm's file and the
//! seed's example (`tests/fixtures/kubelet-config/`), every upstream field accepted, the fields
//! without effect reported once each, zero values as upstream's defaults, and the documentation
//! listing every field.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use super::tests::{err, load};
use crate::config::{AuthorizationMode, CgroupDriver, LogFormat, no_effect::NO_EFFECT};

const KUBECONFIG: &[&str] = &["--kubeconfig", "/etc/kubernetes/kubelet.conf"];

fn fixture(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/kubelet-config")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn no_effect_fields(config: &super::Config) -> Vec<&str> {
    config.no_effect.iter().map(|n| n.field.as_str()).collect()
}

/// What kubeadm writes loads as it is, `cgroupDriver: systemd` and `rotateCertificates: true`
/// included.
#[test]
fn kubeadm_file_loads_with_zero_values_as_upstream_defaults() {
    let kubeadm = fixture("kubeadm.yaml");
    // kubeadm's kubelet gets `--kubeconfig` on its command line (its webhook authentication needs it).
    let (_dir, config) = load(&kubeadm, KUBECONFIG);
    let config = config.expect("kubeadm's file loads");
    assert_eq!(config.cgroup_driver, CgroupDriver::Systemd);
    assert!(config.rotate_certificates);
    // Every `0s` is upstream's default.
    assert_eq!(config.sync_frequency, Duration::from_secs(60));
    assert_eq!(config.file_check_frequency, Duration::from_secs(20));
    assert_eq!(config.runtime_request_timeout, Duration::from_secs(120));
    assert_eq!(config.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(
        config.node_status_report_frequency,
        Duration::from_secs(300)
    );
    assert_eq!(config.gc.images.min_age, Duration::from_secs(120));
    assert_eq!(
        config.eviction.pressure_transition_period,
        Duration::from_secs(300)
    );
    assert_eq!(config.cpu_manager.reconcile_period, Duration::from_secs(10));
    let server = &config.server;
    assert_eq!(
        server.authentication.webhook_cache_ttl,
        Duration::from_secs(120)
    );
    assert_eq!(server.authorization.mode, AuthorizationMode::Webhook);
    assert_eq!(
        server.authorization.cache_authorized_ttl,
        Duration::from_secs(300)
    );
    assert_eq!(
        server.authorization.cache_unauthorized_ttl,
        Duration::from_secs(30)
    );
    // `containerRuntimeEndpoint: ""` is the default endpoint.
    assert_eq!(
        config.container_runtime_endpoint,
        "unix:///run/containerd/containerd.sock"
    );
    assert_eq!(
        config.static_pod_path,
        Some(PathBuf::from("/etc/kubernetes/manifests"))
    );
    assert_eq!(
        config.resolv_conf,
        Some(PathBuf::from("/run/systemd/resolve/resolv.conf"))
    );
    assert_eq!(config.logging.level(), Some("info"));
    assert_eq!(config.logging.format, None);
    // kubeadm writes only defaults: nothing to warn about.
    assert!(config.no_effect.is_empty(), "{:?}", config.no_effect);
}

#[test]
fn seed_example_loads_and_reports_what_has_no_effect() {
    let seed = fixture("seed-example.yaml");
    let (_dir, config) = load(&seed, KUBECONFIG);
    let config = config.expect("the seed's example loads");
    assert_eq!(config.max_pods, 110);
    assert_eq!(
        config.shutdown,
        crate::nodeshutdown::ShutdownConfig::from_periods(
            Duration::from_secs(60),
            Duration::from_secs(20)
        )
    );
    assert_eq!((config.event_record_qps, config.event_burst), (50, 100));
    assert_eq!((config.kube_api_qps, config.kube_api_burst), (50, 100));
    assert_eq!(config.sync_frequency, Duration::from_secs(60));
    assert_eq!(config.read_only_address, None);
    assert_eq!(
        config.healthz_address,
        Some(SocketAddr::from(([127, 0, 0, 1], 10248)))
    );
    assert_eq!(
        config.server.address,
        Some(SocketAddr::from(([0, 0, 0, 0], 10250)))
    );
    assert_eq!(config.server.tls_cipher_suites.len(), 6);
    assert!(
        config
            .feature_gates
            .enabled("RotateKubeletServerCertificate")
    );
    assert_eq!(config.logging.format, Some(LogFormat::Text));
    assert_eq!(config.logging.verbosity, Some(2));
    assert_eq!(
        no_effect_fields(&config),
        [
            "featureGates.CSIMigration",
            "featureGates.LocalStorageCapacityIsolation",
        ]
    );
    // The seed's one key that is no v1beta1 field.
    let msg = err(&format!("{seed}babysitDaemons: false\n"), KUBECONFIG);
    assert!(msg.contains("unknown field `babysitDaemons`"), "{msg}");
}

/// Every accepted field, set away from upstream's default: the file loads and each field is
/// reported exactly once, in the table's order.
#[test]
fn every_upstream_field_without_effect_is_accepted_and_reported_once() {
    let yaml = "\
enableContentionProfiling: true
httpCheckFrequency: 10s
staticPodURL: http://example.com/pods
staticPodURLHeader:
  a: [b, c]
tlsCurvePreferences: [23, 29]
imagePullCredentialsVerificationPolicy: AlwaysVerify
preloadedImagesVerificationAllowlist: [registry.k8s.io/pause]
streamingConnectionIdleTimeout: 1h
imageMaximumGCAge: 72h
volumeStatsAggPeriod: 2m
kubeletCgroups: /kubelet
systemCgroups: /system
singleProcessOOMKill: true
draManagerReconcilePeriod: 30s
memoryManagerPolicy: Static
topologyManagerPolicy: single-numa-node
topologyManagerScope: pod
topologyManagerPolicyOptions:
  prefer-closest-numa-nodes: \"true\"
hairpinMode: hairpin-veth
runOnce: true
nodeStatusMaxImages: -1
maxOpenFiles: 4096
contentType: application/json
podsPerCore: 10
enableControllerAttachDetach: false
protectKernelDefaults: true
makeIPTablesUtilChains: false
iptablesMasqueradeBit: 13
iptablesDropBit: 16
failSwapOn: false
memorySwap:
  swapBehavior: LimitedSwap
containerLogMaxWorkers: 4
showHiddenMetricsForVersion: \"1.34\"
systemReservedCgroup: /system.slice
kubeReservedCgroup: /kube.slice
volumePluginDir: /opt/plugins
providerID: aws:///eu-west-1a/i-0123
kernelMemcgNotification: true
enableSystemLogHandler: false
enableSystemLogQuery: true
crashLoopBackOff:
  maxContainerRestartPeriod: 1m
reservedMemory:
- numaNode: 0
  limits:
    memory: 1Gi
enableProfilingHandler: false
enableDebugFlagsHandler: false
memoryThrottlingFactor: 0.8
memoryReservationPolicy: TieredReservation
tracing:
  endpoint: localhost:4317
  samplingRatePerMillion: 100
localStorageCapacityIsolation: false
imageServiceEndpoint: unix:///run/images.sock
failCgroupV1: true
userNamespaces:
  idsPerPod: 131072
podHousekeepingPeriod: 5s
";
    let (_dir, config) = load(yaml, &[]);
    let config = config.expect("every upstream field loads");
    let table: Vec<&str> = NO_EFFECT.iter().map(|(key, _)| *key).collect();
    assert_eq!(no_effect_fields(&config), table);
}

#[test]
fn fields_without_effect_still_have_upstream_types() {
    let cases: &[(&str, &str)] = &[
        (
            "httpCheckFrequency: 20\n",
            "field `httpCheckFrequency`: invalid duration \"20\": expected e.g. 1m30s",
        ),
        (
            "httpCheckFrequency: soon\n",
            "field `httpCheckFrequency`: invalid duration \"soon\": expected e.g. 1m30s",
        ),
        ("runOnce: maybe\n", "runOnce: invalid type"),
        ("podsPerCore: many\n", "podsPerCore: invalid type"),
        ("memorySwap:\n  swap: yes\n", "unknown field `swap`"),
        (
            "featureGates:\n  KubeletTracing: 1\n",
            "`featureGates.KubeletTracing`",
        ),
        ("logging:\n  format: xml\n", "`logging.format`"),
    ];
    for (yaml, want) in cases {
        let msg = err(yaml, &[]);
        assert!(msg.contains(want), "{yaml}: {msg}");
    }
}

#[test]
fn zero_values_are_defaults_in_the_file_only() {
    let (_dir, config) = load(
        "maxPods: 0\nnodeLeaseDurationSeconds: 0\nkubeAPIBurst: 0\neventBurst: 0\nport: 0\n\
         eventRecordQPS: 0\nhealthzPort: 0\naddress: \"\"\ncpuManagerPolicy: \"\"\n",
        &[],
    );
    let config = config.expect("loads");
    assert_eq!(config.max_pods, 110);
    assert_eq!(config.node_lease_duration_seconds, 40);
    assert_eq!((config.kube_api_burst, config.event_burst), (100, 100));
    // A zero that means something upstream keeps its meaning: no event limit, no healthz.
    assert_eq!(config.event_record_qps, 0);
    assert_eq!(config.healthz_address, None);
    assert_eq!(
        config.server.address,
        Some(SocketAddr::from(([0, 0, 0, 0], 10250)))
    );
    let (_dir, off) = load("enableServer: false\n", &[]);
    assert_eq!(off.expect("loads").server.address, None);
    // On the command line a zero is still checked.
    let msg = err("", &["--sync-frequency", "0s"]);
    assert!(msg.contains("must be greater than 0"), "{msg}");
}

#[test]
fn flags_override_the_file_for_upstream_fields() {
    let (_dir, config) = load(
        "kubeAPIQPS: 10\neventRecordQPS: 5\nmaxPods: 20\n",
        &[
            "--kube-api-qps",
            "30",
            "--event-qps",
            "7",
            "--max-pods",
            "40",
        ],
    );
    let config = config.expect("loads");
    assert_eq!(
        (
            config.kube_api_qps,
            config.event_record_qps,
            config.max_pods
        ),
        (30, 7, 40)
    );
}

/// The shutdown fields as upstream validates them, into the rows the manager runs by.
#[test]
fn graceful_shutdown_settings() {
    use crate::nodeshutdown::{PriorityGrace, ShutdownConfig};
    let (_dir, config) = load(
        "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n",
        &[],
    );
    assert_eq!(
        config.expect("loads").shutdown,
        ShutdownConfig::from_periods(Duration::from_secs(30), Duration::from_secs(10))
    );
    let (_dir, config) = load(
        "shutdownGracePeriodByPodPriority:\n- priority: 100000\n  shutdownGracePeriodSeconds: 10\n\
         - priority: 0\n  shutdownGracePeriodSeconds: 20\n",
        &[],
    );
    assert_eq!(
        config.expect("loads").shutdown.by_priority,
        [
            PriorityGrace {
                priority: 0,
                grace_seconds: 20
            },
            PriorityGrace {
                priority: 100_000,
                grace_seconds: 10
            }
        ]
    );
    let (_dir, config) = load("shutdownGracePeriod: 0s\n", &[]);
    assert!(!config.expect("loads").shutdown.is_enabled());
    // The gate off and nothing asked: no shutdown manager, no error.
    let (_dir, config) = load("featureGates:\n  GracefulNodeShutdown: false\n", &[]);
    assert!(!config.expect("loads").shutdown.is_enabled());

    let cases: &[(&str, &str)] = &[
        (
            "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n",
            "field `shutdownGracePeriodCriticalPods`: invalid duration \"20s\": must be <= \
             shutdownGracePeriod 10s",
        ),
        (
            "shutdownGracePeriod: 500ms\n",
            "field `shutdownGracePeriod`: invalid duration \"500ms\": must be either zero or \
             otherwise >= 1 sec",
        ),
        (
            "shutdownGracePeriod: -5s\n",
            "field `shutdownGracePeriod`: invalid duration \"-5s\": must not be negative",
        ),
        (
            "shutdownGracePeriod: 30s\nshutdownGracePeriodByPodPriority:\n- priority: 1\n  \
             shutdownGracePeriodSeconds: 5\n",
            "Cannot specify both shutdownGracePeriodByPodPriority and shutdownGracePeriod at the \
             same time",
        ),
        (
            "shutdownGracePeriodByPodPriority:\n- priority: 1\n  shutdownGracePeriodSeconds: -5\n",
            "field `shutdownGracePeriodByPodPriority`: invalid shutdownGracePeriodSeconds \"-5\": \
             must not be negative (priority 1)",
        ),
        (
            "shutdownGracePeriodByPodPriority:\n- priority: 1\n  seconds: 5\n",
            "unknown field `seconds`",
        ),
        (
            "featureGates:\n  GracefulNodeShutdown: false\nshutdownGracePeriod: 30s\n",
            "requires feature gate GracefulNodeShutdown",
        ),
        (
            "featureGates:\n  GracefulNodeShutdownBasedOnPodPriority: false\n\
             shutdownGracePeriodByPodPriority:\n- priority: 1\n  shutdownGracePeriodSeconds: 5\n",
            "requires feature gate GracefulNodeShutdownBasedOnPodPriority",
        ),
    ];
    for (yaml, want) in cases {
        let msg = err(yaml, &[]);
        assert!(msg.contains(want), "{yaml}: {msg}");
    }
}

/// docs/configuration.md lists every field the file accepts.
#[test]
fn documentation_lists_every_accepted_field() {
    let docs = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md"),
    )
    .expect("docs/configuration.md");
    let missing: Vec<&str> = NO_EFFECT
        .iter()
        .map(|(key, _)| *key)
        .chain(["featureGates", "logging", "enableServer"])
        .filter(|key| !docs.contains(&format!("`{key}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/configuration.md: {missing:?}"
    );
}
