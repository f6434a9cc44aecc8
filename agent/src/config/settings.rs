//! The settings table: every setting of `swiftlet run` defined once — its help text, its flag,
//! its file key (and the file field's written type), the rule that checks it, its default — and
//! the three views generated from it: the clap flags ([`RunArgs`]), the serde file form
//! ([`FileConfig`]) and the resolved values ([`Settings`], flag over file over default, each
//! checked by its rule). `load.rs` turns the resolved values into [`Config`](super::Config): the
//! table's `config` settings become its fields as they are; the `section` ones are read by the
//! sections (`server.rs`, `eviction.rs`, ...), which check what needs several settings at once.
//!
//! Adding a KubeletConfiguration field is one entry here (and its row in
//! `docs/configuration.md`); one with its own `Config` field is marked `config`. The upstream
//! fields accepted without effect are rows of `no_effect.rs`'s table, which the file form
//! includes after this table's fields.
//!
//! An entry reads:
//! ```text
//! /// Help text of the flag (and the field's documentation).
//! config|section|cli name: [resolved type] = "fileKey"
//!     , flag "flag-name" [clap type] (clap attributes)   -- optional
//!     , file [written type]                              -- optional: top-level file field
//!     , within authentication.webhook.cache_ttl          -- optional: a nested file field
//!     => rule, default expression;                        -- `default` optional
//! ```
//! The rule gets an [`Input`](super::input::Input) (the flag's value and name, the file's value,
//! the key) and returns `Result<Option<T>, ConfigError>`; with `default`, the setting's type is
//! `T`, else `Option<T>`. Flags keep the table's order in `--help`.
//!
//! Not here: the generic rules (`input.rs`), one-setting rules (`rules.rs`), checks across
//! settings (the sections), reading the file (`load.rs`). Upstream: `cmd/kubelet/app/options`
//! (flags) and `KubeletConfiguration` (file), which upstream keeps as two lists.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use k8s_openapi::api::core::v1::Taint;
use serde::Deserialize;

use super::{
    defaults,
    duration::GoDuration,
    error::{ConfigError, Origin},
    file::{FileAuthentication, FileAuthorization},
    input::{
        Given, Input, MapField, changed_flag, duration, flag, flag_over_file, given, int, ip, list,
        map, optional_path, parsed, plain, port, positive_duration, runtime_endpoint,
    },
    kernel::KernelArgs,
    logging::FileLogging,
    no_effect::{DurationText, with_no_effect},
    registration::{FileTaint, node_ips, node_labels, register_with_taints},
    rules::{
        absolute_path, cgroup_driver, cgroup_root, cluster_dns, cluster_domain, cpu_list,
        log_monitor_interval, log_size, pleg_mode, pod_cidr, pod_pids_limit, reserved_cgroup,
        resolv_conf, root_dir, unsafe_sysctls,
    },
    shutdown::FileShutdownGrace,
    types::{
        CgroupDriver, ChangeDetectionStrategy, Cidr, CpuApply, CpuManagerPolicy, PlegMode,
        TlsVersion,
    },
};
use crate::{
    cm::cpumanager::CpuSet,
    eviction::thresholds::ThresholdError,
    kuberuntime::{gc::ContainerGcPolicy, image_gc::ImageGcPolicy},
    logs::LogRotatePolicy,
};

/// Passes the settings table to the generator `$generator` (after `$extra`, tokens of its own):
/// `settings.rs` generates the flags, the file form and the resolution; `load.rs` the `Config`.
macro_rules! with_settings {
    ($generator:ident { $($extra:tt)* }) => {
        $generator! {
            { $($extra)* }

            /// Unix socket of swiftlet's gRPC API (swiftlet.v1). Overrides `grpcSocket` unless left at
            /// its default.
            config grpc_socket: [PathBuf] = "grpcSocket",
                flag "grpc-socket" [PathBuf] (value_name = "PATH", default_value = defaults::GRPC_SOCKET),
                file [PathBuf]
                => |i| flag_over_file(i, &PathBuf::from(defaults::GRPC_SOCKET)),
                default PathBuf::from(defaults::GRPC_SOCKET);
            /// Address of the HTTP endpoints /healthz and /metrics. Overrides `healthzBindAddress` and
            /// `healthzPort` unless left at its default.
            section http_address: [Option<SocketAddr>] = "healthzBindAddress",
                flag "http-address" [SocketAddr] (value_name = "ADDR", default_value = defaults::HTTP_ADDRESS)
                => |i| changed_flag(i, defaults::HTTP_ADDRESS);
            // Checked by `load.rs` only when `--http-address` leaves them in use.
            section healthz_port: [Option<i64>] = "healthzPort", file [i64] => plain;
            section healthz_bind_address: [Option<String>] = "healthzBindAddress", file [String] => plain;
            /// Configuration file (YAML, KubeletConfiguration field names); flags override it.
            cli config = "config", flag "config" [Option<PathBuf>] (value_name = "FILE");
            /// Directory of static pod manifests (`staticPodPath`).
            config static_pod_path: [Option<PathBuf>] = "staticPodPath",
                flag "manifests" [Option<PathBuf>] (value_name = "DIR", alias = "pod-manifest-path"),
                file [PathBuf]
                => optional_path;
            /// The CRI runtime's socket (`containerRuntimeEndpoint`), e.g.
            /// unix:///run/containerd/containerd.sock.
            config container_runtime_endpoint: [String] = "containerRuntimeEndpoint",
                flag "runtime-endpoint" [Option<String>] (value_name = "ENDPOINT", alias = "container-runtime-endpoint"),
                file [String]
                => runtime_endpoint, default defaults::CONTAINER_RUNTIME_ENDPOINT.to_owned();
            /// This node's name (`nodeName`); defaults to the hostname, lowercased.
            section node_name: [Option<Given<String>>] = "nodeName",
                flag "node-name" [Option<String>] (value_name = "NAME", visible_alias = "hostname-override"),
                file [String]
                => given;
            /// A kubelet flag upstream, accepted in the file here (same meaning as `nodeName`).
            section hostname_override: [Option<String>] = "hostnameOverride", file [String] => plain;
            /// How container changes are detected (`pleg`).
            section pleg: [Option<PlegMode>] = "pleg",
                flag "pleg" [Option<PlegMode>] (value_enum, value_name = "MODE"),
                file [String]
                => pleg_mode;
            /// Period of the runtime relist (`plegRelistPeriod`), e.g. 1s.
            section pleg_relist_period: [Option<Duration>] = "plegRelistPeriod",
                flag "pleg-relist-period" [Option<GoDuration>] (value_name = "DURATION"),
                file [String]
                => positive_duration;
            /// Period of the full pod resync (`syncFrequency`), e.g. 1m.
            config sync_frequency: [Duration] = "syncFrequency",
                flag "sync-frequency" [Option<GoDuration>] (value_name = "DURATION"),
                file [String]
                => positive_duration, default defaults::SYNC_FREQUENCY;
            config file_check_frequency: [Duration] = "fileCheckFrequency", file [String]
                => positive_duration, default defaults::FILE_CHECK_FREQUENCY;
            config runtime_request_timeout: [Duration] = "runtimeRequestTimeout", file [String]
                => positive_duration, default defaults::RUNTIME_REQUEST_TIMEOUT;
            config node_status_update_frequency: [Duration] = "nodeStatusUpdateFrequency", file [String]
                => positive_duration, default defaults::NODE_STATUS_UPDATE_FREQUENCY;
            /// Most pods this node runs (`maxPods`).
            config max_pods: [u32] = "maxPods",
                flag "max-pods" [Option<u32>] (value_name = "N"),
                file [i64]
                => |i| int(i, 1..=i64::from(i32::MAX), "must be at least 1"),
                default defaults::MAX_PODS;
            /// Whether CPU limits become CFS quotas of containers and pod cgroups (`cpuCFSQuota`).
            section cpu_cfs_quota: [bool] = "cpuCFSQuota", file [bool] => plain, default true;
            /// The CFS period of containers and pod cgroups (`cpuCFSQuotaPeriod`, default 100ms);
            /// another value needs the feature gate `CustomCPUCFSQuotaPeriod` (`cfs.rs`).
            section cpu_cfs_quota_period: [Option<Duration>] = "cpuCFSQuotaPeriod", file [String]
                => duration;
            /// The share of the higher QoS levels' memory requests kept from the lower levels
            /// (`qosReserved`, e.g. `memory: 50%`; feature gate `QOSReserved`, `qos_reserved.rs`).
            section qos_reserved: [Option<BTreeMap<String, String>>] = "qosReserved",
                file [BTreeMap<String, String>] => plain;
            /// Per-pod PID limit; `-1` means no pod-level limit.
            config pod_pids_limit: [i64] = "podPidsLimit", file [i64]
                => pod_pids_limit, default defaults::POD_PIDS_LIMIT;
            config node_lease_duration_seconds: [u32] = "nodeLeaseDurationSeconds", file [i64]
                => |i| int::<i64, u32>(i, 1..=i64::from(i32::MAX), "must be at least 1"),
                default defaults::NODE_LEASE_DURATION_SECONDS;
            /// Labels the node registers with (a flag only, as upstream), comma-separated `key=value`;
            /// `kubernetes.io` and `k8s.io` labels only from the kubelet's own set (so not
            /// `node-role.kubernetes.io/*`). Set when the Node is created.
            config node_labels: [BTreeMap<String, String>] = "nodeLabels",
                flag "node-labels" [Vec<String>] (value_name = "KEY=VALUE,...")
                => node_labels, default BTreeMap::new();
            /// Taints the node registers with (`registerWithTaints`), comma-separated
            /// `<key>=<value>:<effect>` or `<key>:<effect>`. Set when the Node is created.
            config register_with_taints: [Vec<Taint>] = "registerWithTaints",
                flag "register-with-taints" [Vec<String>] (value_name = "TAINTS"),
                file [Vec<FileTaint>]
                => register_with_taints, default Vec::new();
            /// The node's IP (a flag only, as upstream), or an IPv4 and an IPv6 one, comma-separated;
            /// each must be the host's. `0.0.0.0` or `::` picks one, that family first. Default: the
            /// node name's address, else the default route's interface's.
            config node_ip: [Vec<IpAddr>] = "nodeIP",
                flag "node-ip" [Vec<String>] (value_name = "IP[,IP]")
                => node_ips, default Vec::new();
            /// Create the Node if it does not exist (`registerNode`, default true); with false the agent
            /// only updates the status of a Node created by someone else.
            config register_node: [bool] = "registerNode",
                flag "register-node" [Option<bool>] (value_name = "BOOL", num_args = 0..=1, default_missing_value = "true"),
                file [bool]
                => plain, default true;
            // Its default depends on whether `nodeStatusUpdateFrequency` was written (`load.rs`).
            section node_status_report_frequency: [Option<Duration>] = "nodeStatusReportFrequency", file [String]
                => positive_duration;
            /// Requests a second the agent makes to the API server (`kubeAPIQPS`); its heartbeats (the
            /// Lease and the Node status) are not limited. 0 means client-go's default of 5.
            config kube_api_qps: [u32] = "kubeAPIQPS",
                flag "kube-api-qps" [Option<u32>] (value_name = "QPS"),
                file [i64]
                => |i| int(i, 0..=i64::from(i32::MAX), "must be 0 or more"),
                default defaults::KUBE_API_QPS;
            /// Requests the agent may make at once above `kubeAPIQPS` (`kubeAPIBurst`).
            config kube_api_burst: [u32] = "kubeAPIBurst",
                flag "kube-api-burst" [Option<u32>] (value_name = "N"),
                file [i64]
                => |i| int(i, 0..=i64::from(i32::MAX), "must be 0 or more"),
                default defaults::KUBE_API_BURST;
            /// Most Kubernetes Events written to the API server per second (`eventRecordQPS`); 0
            /// means no limit.
            config event_record_qps: [u32] = "eventRecordQPS",
                flag "event-qps" [Option<i64>] (value_name = "N"),
                file [i64]
                => |i| int(i, 0..=i64::from(i32::MAX), "must not be a negative number"),
                default defaults::EVENT_RECORD_QPS;
            /// How many Events may be written at once above `eventRecordQPS` (`eventBurst`; only
            /// with a limit).
            config event_burst: [u32] = "eventBurst",
                flag "event-burst" [Option<i64>] (value_name = "N"),
                file [i64]
                => |i| int(i, 0..=i64::from(i32::MAX), "must not be a negative number"),
                default defaults::EVENT_BURST;
            /// Port of the unauthenticated read-only endpoint (`readOnlyPort`); 0 disables it.
            section read_only_port: [Option<u16>] = "readOnlyPort",
                flag "read-only-port" [Option<u16>] (value_name = "PORT"),
                file [i64]
                => port;
            /// Bind address of the read-only endpoint (`readOnlyAddress`, default 127.0.0.1). Only this,
            /// or `--address` together with an explicit `--read-only-port`, puts the unauthenticated port
            /// beyond loopback.
            section read_only_address: [Option<IpAddr>] = "readOnlyAddress",
                flag "read-only-address" [Option<IpAddr>] (value_name = "IP"),
                file [String]
                => ip;
            /// Bind address of the kubelet server (`address`, default 0.0.0.0); also of the read-only
            /// endpoint when its port is given explicitly.
            section address: [Option<IpAddr>] = "address",
                flag "address" [Option<IpAddr>] (value_name = "IP"),
                file [String]
                => ip;
            /// Whether the kubelet server runs at all (`enableServer`, default true; a file key only,
            /// as upstream).
            section enable_server: [bool] = "enableServer", file [bool] => plain, default true;
            /// Port of the kubelet server, TLS and authenticated (`port`, default 10250); 0 disables it.
            section port: [u16] = "port",
                flag "port" [Option<u16>] (value_name = "PORT"),
                file [i64]
                => port, default defaults::PORT;
            /// The kubelet server's certificate (`tlsCertFile`), PEM, with its chain.
            section tls_cert_file: [Option<Given<PathBuf>>] = "tlsCertFile",
                flag "tls-cert-file" [Option<PathBuf>] (value_name = "FILE"),
                file [PathBuf]
                => given;
            /// The kubelet server's private key (`tlsPrivateKeyFile`), PEM.
            section tls_private_key_file: [Option<Given<PathBuf>>] = "tlsPrivateKeyFile",
                flag "tls-private-key-file" [Option<PathBuf>] (value_name = "FILE"),
                file [PathBuf]
                => given;
            /// Lowest TLS version of the kubelet server (`tlsMinVersion`): VersionTLS12 or VersionTLS13.
            section tls_min_version: [TlsVersion] = "tlsMinVersion",
                flag "tls-min-version" [Option<String>] (value_name = "VERSION"),
                file [String]
                => parsed, default TlsVersion::Tls12;
            /// TLS 1.2 cipher suites of the kubelet server (`tlsCipherSuites`), comma-separated Go names,
            /// e.g. `TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`.
            section tls_cipher_suites: [Option<Given<Vec<String>>>] = "tlsCipherSuites",
                flag "tls-cipher-suites" [Vec<String>] (value_name = "LIST"),
                file [Vec<String>]
                => list;
            /// Where a self-signed certificate is kept when no --tls-cert-file is given (default
            /// `<root-dir>/pki`).
            section cert_dir: [Option<PathBuf>] = "certDir",
                flag "cert-dir" [Option<PathBuf>] (value_name = "DIR")
                => plain;
            /// Serve exec, attach, port-forward, run and container logs on the kubelet server
            /// (`enableDebuggingHandlers`, default true).
            section enable_debugging_handlers: [bool] = "enableDebuggingHandlers",
                flag "enable-debugging-handlers" [Option<bool>] (value_name = "BOOL", num_args = 0..=1, default_missing_value = "true"),
                file [bool]
                => plain, default true;
            /// CA bundle of the client certificates the kubelet server accepts
            /// (`authentication.x509.clientCAFile`): CN is the user, O the groups.
            section client_ca_file: [Option<PathBuf>] = "authentication.x509.clientCAFile",
                flag "client-ca-file" [Option<PathBuf>] (value_name = "FILE"),
                within authentication.x509.client_ca_file
                => optional_path;
            /// Let requests without credentials in as `system:anonymous`
            /// (`authentication.anonymous.enabled`, default false).
            section anonymous_auth: [bool] = "authentication.anonymous.enabled",
                flag "anonymous-auth" [Option<bool>] (value_name = "BOOL", num_args = 0..=1, default_missing_value = "true"),
                within authentication.anonymous.enabled
                => plain, default false;
            /// Check bearer tokens with a TokenReview (`authentication.webhook.enabled`; default: on with
            /// --kubeconfig).
            section authentication_token_webhook: [Option<Given<bool>>] = "authentication.webhook.enabled",
                flag "authentication-token-webhook" [Option<bool>] (value_name = "BOOL", num_args = 0..=1, default_missing_value = "true"),
                within authentication.webhook.enabled
                => given;
            /// How long TokenReview answers are kept (`authentication.webhook.cacheTTL`, default 2m).
            section authentication_token_webhook_cache_ttl: [Duration] = "authentication.webhook.cacheTTL",
                flag "authentication-token-webhook-cache-ttl" [Option<GoDuration>] (value_name = "DURATION"),
                within authentication.webhook.cache_ttl
                => positive_duration, default defaults::TOKEN_CACHE_TTL;
            /// `AlwaysAllow` or `Webhook` (SubjectAccessReview) (`authorization.mode`; default: Webhook
            /// with --kubeconfig, else AlwaysAllow).
            section authorization_mode: [Option<Given<String>>] = "authorization.mode",
                flag "authorization-mode" [Option<String>] (value_name = "MODE"),
                within authorization.mode
                => given;
            section cache_authorized_ttl: [Duration] = "authorization.webhook.cacheAuthorizedTTL",
                within authorization.webhook.cache_authorized_ttl
                => positive_duration, default defaults::AUTHORIZED_TTL;
            section cache_unauthorized_ttl: [Duration] = "authorization.webhook.cacheUnauthorizedTTL",
                within authorization.webhook.cache_unauthorized_ttl
                => positive_duration, default defaults::UNAUTHORIZED_TTL;
            /// swiftlet's state directory (`rootDir`).
            config root_dir: [PathBuf] = "rootDir",
                flag "root-dir" [Option<PathBuf>] (value_name = "DIR"),
                file [PathBuf]
                => root_dir, default PathBuf::from(defaults::ROOT_DIR);
            /// The agent's own oom_score_adj (`oomScoreAdj`, -1000 to 1000, default -999); lowering it
            /// needs CAP_SYS_RESOURCE.
            config oom_score_adj: [i32] = "oomScoreAdj",
                flag "oom-score-adj" [Option<i32>] (value_name = "N", allow_negative_numbers = true),
                file [i64]
                => |i| int(i, -1000..=1000, "must be between -1000 and 1000, inclusive"),
                default defaults::OOM_SCORE_ADJ;
            /// kubeconfig of the API server; without it swiftlet runs standalone.
            config kubeconfig: [Option<PathBuf>] = "kubeconfig",
                flag "kubeconfig" [Option<PathBuf>] (value_name = "FILE")
                => plain;
            /// kubeconfig with bootstrap credentials (upstream `--bootstrap-kubeconfig`, a flag only):
            /// when --kubeconfig is missing or its client certificate expired, a client certificate is
            /// requested with them and --kubeconfig written to use it.
            config bootstrap_kubeconfig: [Option<PathBuf>] = "bootstrapKubeconfig",
                flag "bootstrap-kubeconfig" [Option<PathBuf>] (value_name = "FILE")
                => plain;
            /// Image credential provider plugins' configuration, a CredentialProviderConfig file or a
            /// directory of them (upstream `--image-credential-provider-config`, a flag only); needs
            /// --image-credential-provider-bin-dir.
            config image_credential_provider_config: [Option<PathBuf>] = "imageCredentialProviderConfig",
                flag "image-credential-provider-config" [Option<PathBuf>] (value_name = "PATH")
                => plain;
            /// Directory of the image credential provider plugins' binaries (upstream
            /// `--image-credential-provider-bin-dir`, a flag only).
            config image_credential_provider_bin_dir: [Option<PathBuf>] = "imageCredentialProviderBinDir",
                flag "image-credential-provider-bin-dir" [Option<PathBuf>] (value_name = "DIR")
                => plain;
            /// Renew the client certificate before it expires (`rotateCertificates`, default false).
            config rotate_certificates: [bool] = "rotateCertificates",
                flag "rotate-certificates" [Option<bool>] (value_name = "BOOL", num_args = 0..=1, default_missing_value = "true"),
                file [bool]
                => plain, default false;
            /// Request the kubelet server's certificate from the cluster (`serverTLSBootstrap`, default
            /// false): a `kubernetes.io/kubelet-serving` CSR, renewed before it expires.
            config server_tls_bootstrap: [bool] = "serverTLSBootstrap", file [bool]
                => plain, default false;
            config cgroup_root: [PathBuf] = "cgroupRoot", file [String]
                => cgroup_root, default PathBuf::from(defaults::CGROUP_ROOT);
            config cgroups_per_qos: [bool] = "cgroupsPerQOS", file [bool] => plain, default true;
            config cgroup_driver: [CgroupDriver] = "cgroupDriver", file [String]
                => cgroup_driver, default CgroupDriver::Cgroupfs;
            config pod_cidr: [Option<Cidr>] = "podCIDR", file [String] => pod_cidr;
            config cluster_dns: [Vec<IpAddr>] = "clusterDNS", file [Vec<String>]
                => cluster_dns, default Vec::new();
            config cluster_domain: [Option<String>] = "clusterDomain", file [String] => cluster_domain;
            /// The resolver pods with `dnsPolicy: Default` get, and whose searches cluster-first pods
            /// append (`resolvConf`); empty for none (the node's loopback, search `.`).
            config resolv_conf: [Option<PathBuf>] = "resolvConf", file [PathBuf]
                => resolv_conf, default Some(PathBuf::from(defaults::RESOLV_CONF));
            /// How ConfigMaps and Secrets of volumes are kept current: Watch (one watch per
            /// object), Cache (read at most once a minute) or Get (read at every sync).
            config config_map_and_secret_change_detection_strategy: [ChangeDetectionStrategy] = "configMapAndSecretChangeDetectionStrategy", file [String]
                => parsed, default ChangeDetectionStrategy::Watch;
            /// Hard eviction thresholds (`evictionHard`), comma-separated, e.g.
            /// `memory.available<100Mi,nodefs.available<10%` or swiftlet's
            /// `memory.pressure.some.avg10>40`. Repeatable; replaces the file's.
            section eviction_hard: [Option<MapField>] = "evictionHard",
                flag "eviction-hard" [Vec<String>] (value_name = "THRESHOLDS"),
                file [BTreeMap<String, String>]
                => |i| map(i, "threshold", &['<', '>'], &ThresholdError::Syntax.to_string());
            /// Soft eviction thresholds (`evictionSoft`), as `--eviction-hard`; each needs a grace period.
            section eviction_soft: [Option<MapField>] = "evictionSoft",
                flag "eviction-soft" [Vec<String>] (value_name = "THRESHOLDS"),
                file [BTreeMap<String, String>]
                => |i| map(i, "threshold", &['<', '>'], &ThresholdError::Syntax.to_string());
            /// Grace periods of the soft thresholds (`evictionSoftGracePeriod`), e.g.
            /// `memory.available=1m30s`.
            section eviction_soft_grace_period: [Option<MapField>] = "evictionSoftGracePeriod",
                flag "eviction-soft-grace-period" [Vec<String>] (value_name = "SIGNAL=DURATION,..."),
                file [BTreeMap<String, String>]
                => |i| map(i, "grace period", &['='], "expected <signal>=<duration>, e.g. memory.available=1m30s");
            /// Minimum reclaims (`evictionMinimumReclaim`), e.g.
            /// `memory.available=0Mi,nodefs.available=500Mi`.
            section eviction_minimum_reclaim: [Option<MapField>] = "evictionMinimumReclaim",
                flag "eviction-minimum-reclaim" [Vec<String>] (value_name = "SIGNAL=VALUE,..."),
                file [BTreeMap<String, String>]
                => |i| map(i, "minimum reclaim", &['='], "expected <signal>=<quantity or percentage>, e.g. memory.available=500Mi");
            /// Most grace a soft eviction grants a pod, in seconds (`evictionMaxPodGracePeriod`).
            section eviction_max_pod_grace_period: [i64] = "evictionMaxPodGracePeriod",
                flag "eviction-max-pod-grace-period" [Option<i32>] (value_name = "SECONDS", allow_negative_numbers = true),
                file [i64]
                => |i| int(i, i64::from(i32::MIN)..=i64::from(i32::MAX), "must fit in 32 bits (seconds)"),
                default defaults::EVICTION_MAX_POD_GRACE_PERIOD_SECS;
            /// How long a pressure condition outlives its threshold (`evictionPressureTransitionPeriod`).
            section eviction_pressure_transition_period: [Duration] = "evictionPressureTransitionPeriod",
                flag "eviction-pressure-transition-period" [Option<GoDuration>] (value_name = "DURATION"),
                file [String]
                => positive_duration, default defaults::EVICTION_PRESSURE_TRANSITION_PERIOD;
            section merge_default_eviction_settings: [bool] = "mergeDefaultEvictionSettings",
                file [bool]
                => plain, default false;
            /// Resources reserved for Kubernetes daemons (`kubeReserved`), e.g. `cpu=100m,memory=1Gi`.
            section kube_reserved: [Option<MapField>] = "kubeReserved",
                flag "kube-reserved" [Vec<String>] (value_name = "RESOURCE=QUANTITY,..."),
                file [BTreeMap<String, String>]
                => |i| map(i, "reservation", &['='], "expected <resource>=<quantity>, e.g. cpu=100m,memory=1Gi");
            /// Resources reserved for the OS (`systemReserved`), as `--kube-reserved`.
            section system_reserved: [Option<MapField>] = "systemReserved",
                flag "system-reserved" [Vec<String>] (value_name = "RESOURCE=QUANTITY,..."),
                file [BTreeMap<String, String>]
                => |i| map(i, "reservation", &['='], "expected <resource>=<quantity>, e.g. cpu=100m,memory=1Gi");
            /// The existing cgroup `system-reserved` is enforced on (`systemReservedCgroup`), e.g.
            /// `/system.slice`: absolute in the cgroup hierarchy.
            section system_reserved_cgroup: [Option<Given<String>>] = "systemReservedCgroup",
                flag "system-reserved-cgroup" [Option<String>] (value_name = "CGROUP"),
                file [String]
                => reserved_cgroup;
            /// The existing cgroup `kube-reserved` is enforced on (`kubeReservedCgroup`), as
            /// `--system-reserved-cgroup`.
            section kube_reserved_cgroup: [Option<Given<String>>] = "kubeReservedCgroup",
                flag "kube-reserved-cgroup" [Option<String>] (value_name = "CGROUP"),
                file [String]
                => reserved_cgroup;
            /// What node allocatable is enforced on (`enforceNodeAllocatable`): `pods`,
            /// `system-reserved`, `kube-reserved` (or their `-compressible` forms, CPU only), or
            /// `none`.
            section enforce_node_allocatable: [Option<Given<Vec<String>>>] = "enforceNodeAllocatable",
                flag "enforce-node-allocatable" [Vec<String>] (value_name = "LIST"),
                file [Vec<String>]
                => list;
            /// Period of the eviction manager's safety-net check (`evictionMonitoringPeriod`).
            section eviction_monitoring_period: [Duration] = "evictionMonitoringPeriod",
                flag "eviction-monitoring-period" [Option<GoDuration>] (value_name = "DURATION"),
                file [String]
                => positive_duration, default defaults::EVICTION_MONITORING_PERIOD;
            /// Kernel signals that wake the eviction manager between checks (`evictionWakeups`): any of
            /// `psi`, `kernel`, `memcg`, `level`, `poll` (default all but `poll`); empty or `none`
            /// for the periodic check alone.
            section eviction_wakeups: [Option<Given<Vec<String>>>] = "evictionWakeups",
                flag "eviction-wakeups" [Vec<String>] (value_name = "LIST"),
                file [Vec<String>]
                => list;
            /// CPU manager policy (`cpuManagerPolicy`): `none` or `static` (exclusive CPUs for
            /// Guaranteed containers with whole CPUs).
            section cpu_manager_policy: [CpuManagerPolicy] = "cpuManagerPolicy",
                flag "cpu-manager-policy" [Option<String>] (value_name = "POLICY"),
                file [String]
                => parsed, default CpuManagerPolicy::None;
            /// Options of the static policy (`cpuManagerPolicyOptions`), e.g. `full-pcpus-only=true`,
            /// `distribute-cpus-across-numa=true`.
            section cpu_manager_policy_options: [Option<MapField>] = "cpuManagerPolicyOptions",
                flag "cpu-manager-policy-options" [Vec<String>] (value_name = "OPTION=BOOL,..."),
                file [BTreeMap<String, String>]
                => |i| map(i, "option", &['='], "expected <option>=<true|false>, e.g. full-pcpus-only=true");
            /// CPUs kept for the system and Kubernetes daemons (`reservedSystemCPUs`), e.g. `0` or
            /// `0-1,4`; replaces the cpu of `--kube-reserved`/`--system-reserved`.
            section reserved_system_cpus: [Option<CpuSet>] = "reservedSystemCPUs",
                flag "reserved-cpus" [Option<String>] (value_name = "CPULIST"),
                file [String]
                => cpu_list;
            /// Period of the CPU manager's safety-net reconcile (`cpuManagerReconcilePeriod`).
            section cpu_manager_reconcile_period: [Duration] = "cpuManagerReconcilePeriod",
                flag "cpu-manager-reconcile-period" [Option<GoDuration>] (value_name = "DURATION"),
                file [String]
                => positive_duration, default defaults::CPU_MANAGER_RECONCILE_PERIOD;
            /// When CPU assignments reach containers (`cpuManagerApply`): `events` (at once) or
            /// `reconcile` (only every reconcile period, as the kubelet).
            section cpu_manager_apply: [CpuApply] = "cpuManagerApply",
                flag "cpu-manager-apply" [Option<String>] (value_name = "MODE"),
                file [String]
                => parsed, default CpuApply::Events;
            /// Move a corrupt or other-policy CPU manager checkpoint aside and start with fresh
            /// assignments, instead of refusing to start. Drain the node first: running containers'
            /// exclusive CPUs are forgotten.
            section cpu_manager_reset_state: [bool] = "cpuManagerResetState",
                flag "cpu-manager-reset-state" [bool]
                => flag, default false;
            /// How long the node's shutdown waits for its pods (`shutdownGracePeriod`): logind is held
            /// back that long with a delay inhibitor lock; 0 (the default) shuts down at once.
            section shutdown_grace_period: [Option<Duration>] = "shutdownGracePeriod", file [String]
                => duration;
            /// The part of `shutdownGracePeriod` kept for critical pods (priority at least
            /// 2000000000), killed after the others (`shutdownGracePeriodCriticalPods`).
            section shutdown_grace_period_critical_pods: [Option<Duration>] = "shutdownGracePeriodCriticalPods", file [String]
                => duration;
            /// Shutdown grace by pod priority (`shutdownGracePeriodByPodPriority`), instead of the two
            /// above: a list of `priority` and `shutdownGracePeriodSeconds`, killed lowest first.
            section shutdown_grace_period_by_pod_priority: [Option<Vec<FileShutdownGrace>>] = "shutdownGracePeriodByPodPriority",
                file [Vec<FileShutdownGrace>]
                => plain;
            /// Size at which a container's log is rotated (`containerLogMaxSize`), a quantity such as
            /// `10Mi`; negative disables rotation.
            section container_log_max_size: [i64] = "containerLogMaxSize",
                flag "container-log-max-size" [Option<String>] (value_name = "QUANTITY", allow_negative_numbers = true),
                file [String]
                => log_size, default LogRotatePolicy::default().max_size;
            /// Most log files kept per container, the current one included (`containerLogMaxFiles`);
            /// at least 2.
            section container_log_max_files: [usize] = "containerLogMaxFiles",
                flag "container-log-max-files" [Option<i32>] (value_name = "N", allow_negative_numbers = true),
                file [i64]
                => |i| int(i, 2..=i64::MAX, "must be greater than 1"),
                default LogRotatePolicy::default().max_files;
            section container_log_monitor_interval: [Duration] = "containerLogMonitorInterval",
                file [String]
                => log_monitor_interval, default LogRotatePolicy::default().monitor_interval;
            /// Where pods' container logs go (`podLogsDir`), e.g. /var/log/pods. Garbage collection
            /// removes the directories there of pods this agent does not run: agents sharing a machine
            /// need one each.
            section pod_logs_dir: [PathBuf] = "podLogsDir",
                flag "pod-logs-dir" [Option<PathBuf>] (value_name = "DIR"),
                file [PathBuf]
                => absolute_path, default PathBuf::from(defaults::POD_LOGS_DIR);
            /// Dead containers younger than this are not collected (`minimumContainerTTLDuration`).
            section minimum_container_ttl_duration: [Duration] = "minimumContainerTTLDuration",
                flag "minimum-container-ttl-duration" [Option<GoDuration>] (value_name = "DURATION"),
                file [String]
                => duration, default ContainerGcPolicy::default().min_age;
            /// Dead instances kept per container of a pod; negative for no limit
            /// (`maximumDeadContainersPerContainer`).
            section maximum_dead_containers_per_container: [i32] = "maximumDeadContainersPerContainer",
                flag "maximum-dead-containers-per-container" [Option<i32>] (value_name = "N", allow_negative_numbers = true),
                file [i32]
                => plain, default ContainerGcPolicy::default().max_per_pod_container;
            /// Dead containers kept on the node; negative for no limit (`maximumDeadContainers`).
            section maximum_dead_containers: [i32] = "maximumDeadContainers",
                flag "maximum-dead-containers" [Option<i32>] (value_name = "N", allow_negative_numbers = true),
                file [i32]
                => plain, default ContainerGcPolicy::default().max_containers;
            /// Image filesystem usage (percent) at which unused images are removed
            /// (`imageGCHighThresholdPercent`); 100 disables image GC.
            section image_gc_high_threshold_percent: [Option<Given<i64>>] = "imageGCHighThresholdPercent",
                flag "image-gc-high-threshold" [Option<i32>] (value_name = "PERCENT", allow_negative_numbers = true),
                file [i64]
                => given;
            /// Usage (percent) image GC frees down to (`imageGCLowThresholdPercent`).
            section image_gc_low_threshold_percent: [Option<Given<i64>>] = "imageGCLowThresholdPercent",
                flag "image-gc-low-threshold" [Option<i32>] (value_name = "PERCENT", allow_negative_numbers = true),
                file [i64]
                => given;
            /// Images first seen less than this ago are not collected (`imageMinimumGCAge`).
            section image_minimum_gc_age: [Duration] = "imageMinimumGCAge",
                flag "minimum-image-ttl-duration" [Option<GoDuration>] (value_name = "DURATION"),
                file [String]
                => duration, default ImageGcPolicy::default().min_age;
            /// Pull images one at a time, node-wide (`serializeImagePulls`; default true, false when
            /// `maxParallelImagePulls` is 2 or more).
            section serialize_image_pulls: [Option<Given<bool>>] = "serializeImagePulls",
                flag "serialize-image-pulls" [Option<bool>] (value_name = "BOOL", num_args = 0..=1, default_missing_value = "true"),
                file [bool]
                => given;
            // A file key only, as upstream.
            section max_parallel_image_pulls: [Option<Given<i64>>] = "maxParallelImagePulls", file [i64]
                => given::<i64, i64>;
            /// Image pulls a second (`registryPullQPS`, default 5); 0 for no limit.
            section registry_pull_qps: [Option<Given<i64>>] = "registryPullQPS",
                flag "registry-qps" [Option<i32>] (value_name = "QPS", allow_negative_numbers = true),
                file [i64]
                => given;
            /// Image pulls that may start at once above `registryPullQPS` (`registryBurst`, default 10).
            section registry_burst: [Option<Given<i64>>] = "registryBurst",
                flag "registry-burst" [Option<i32>] (value_name = "N", allow_negative_numbers = true),
                file [i64]
                => given;
            /// Give containers that ask for no seccomp profile the runtime's default (`seccompDefault`,
            /// default false: none, as upstream).
            section seccomp_default: [bool] = "seccompDefault",
                flag "seccomp-default" [Option<bool>] (value_name = "BOOL", num_args = 0..=1, default_missing_value = "true"),
                file [bool]
                => plain, default false;
            /// Unsafe sysctls pods may set beyond the safe set (`allowedUnsafeSysctls`), comma-separated
            /// names or `prefix*` patterns of namespaced sysctls, e.g. `kernel.msg*,net.core.somaxconn`.
            /// Repeatable; replaces the file's.
            section allowed_unsafe_sysctls: [Vec<String>] = "allowedUnsafeSysctls",
                flag "allowed-unsafe-sysctls" [Vec<String>] (value_name = "LIST"),
                file [Vec<String>]
                => unsafe_sysctls, default Vec::new();
            /// The runtime's sandbox image, which image GC never removes (default
            /// `registry.k8s.io/pause:3.10`; empty for none). The runtime's own setting decides which
            /// image sandboxes use.
            section pod_infra_container_image: [Option<String>] = "podInfraContainerImage",
                flag "pod-infra-container-image" [Option<String>] (value_name = "IMAGE")
                => plain;
        }
    };
}
pub(super) use with_settings;

/// Generates [`RunArgs`], [`FileConfig`] and [`Settings`] from the table. The flags and the
/// resolved values are accumulated entry by entry (`@args`, `@settings`) because entries without
/// a flag, or without a resolved value, are left out.
macro_rules! generate {
    // Entry point: the table.
    ({} $($table:tt)*) => {
        generate!(@args [] $($table)*);
        with_no_effect!(generate { @file $($table)* });
        // The names the accumulated resolution code and the function share (hygiene).
        generate!(@settings [args file origin] [] [] [] $($table)*);
    };

    // The flags of `swiftlet run`.
    (@args [$($acc:tt)*]) => {
        /// Flags of `swiftlet run`. Those that also exist in the configuration file override it; see
        /// [`Config::load`] for the merged, validated result.
        #[derive(Debug, clap::Args)]
        pub struct RunArgs {
            #[command(flatten)]
            pub kernel: KernelArgs,
            $($acc)*
        }
    };
    (@args [$($acc:tt)*]
        $(#[doc = $doc:literal])*
        $dest:ident $name:ident $(: [$($out:tt)*])? = $field:literal,
        flag $long:literal [$($fty:tt)*] $(($($farg:tt)*))?
        $(, file [$($gty:tt)*])? $(, within $($path:ident).+)?
        $(=> $resolve:expr $(, default $default:expr)?)?;
        $($rest:tt)*
    ) => {
        generate!(@args [$($acc)*
            $(#[doc = $doc])*
            #[arg(long = $long $(, $($farg)*)?)]
            pub $name: $($fty)*,
        ] $($rest)*);
    };
    (@args [$($acc:tt)*]
        $(#[doc = $doc:literal])*
        $dest:ident $name:ident $(: [$($out:tt)*])? = $field:literal
        $(, file [$($gty:tt)*])? $(, within $($path:ident).+)?
        $(=> $resolve:expr $(, default $default:expr)?)?;
        $($rest:tt)*
    ) => {
        generate!(@args [$($acc)*] $($rest)*);
    };

    // The file's top-level fields, as written: the table's, then those accepted without effect
    // (`no_effect.rs`).
    ({ @file $(
        $(#[doc = $doc:literal])*
        $dest:ident $name:ident $(: [$($out:tt)*])? = $field:literal
        $(, flag $long:literal [$($fty:tt)*] $(($($farg:tt)*))?)?
        $(, file [$($gty:tt)*])? $(, within $($path:ident).+)?
        $(=> $resolve:expr $(, default $default:expr)?)?;
    )* } $(
        $uname:ident : [$($uty:tt)*] = $ukey:literal => $neutral:expr, $why:literal;
    )*) => {
        /// The configuration file as written: a YAML mapping in the style of the kubelet's
        /// `KubeletConfiguration` (the kubelet's field names where one exists), plus swiftlet's
        /// own fields. Every field is optional and kept in its written form, so the rules can name
        /// the field and the bad value in one message; unknown fields are rejected by serde.
        #[derive(Clone, Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        pub struct FileConfig {
            pub kind: Option<String>,
            pub api_version: Option<String>,
            pub authentication: Option<FileAuthentication>,
            pub authorization: Option<FileAuthorization>,
            /// Gate name to its value, kept as written so a non-bool names its gate
            /// (`feature_gates.rs`).
            pub feature_gates: Option<BTreeMap<String, serde_yaml_ng::Value>>,
            pub logging: Option<FileLogging>,
            $($(
                #[serde(rename = $field)]
                pub $name: Option<$($gty)*>,
            )?)*
            $(
                #[doc = $why]
                #[serde(rename = $ukey)]
                pub $uname: Option<$($uty)*>,
            )*
        }
    };

    // The resolved values.
    (@settings [$args:ident $file:ident $origin:ident] [$($fields:tt)*] [$($values:tt)*]
        [$(($key:literal $setting:ident))*]) => {
        /// Every setting resolved (flag over file over default) and checked by its rule.
        pub(super) struct Settings {
            $($fields)*
        }

        impl Settings {
            /// Each setting under its file key, as `/configz` shows it (`configz.rs`).
            pub(super) fn configz(&self) -> serde_json::Map<String, serde_json::Value> {
                use super::configz::ConfigzValue as _;
                let mut document = serde_json::Map::new();
                $(super::configz::insert(&mut document, $key, self.$setting.configz());)*
                document
            }

            pub(super) fn resolve(
                $args: &RunArgs,
                $file: &FileConfig,
                $origin: &Origin,
            ) -> Result<Settings, ConfigError> {
                Ok(Settings { $($values)* })
            }
        }
    };
    (@settings [$args:ident $file:ident $origin:ident] [$($fields:tt)*] [$($values:tt)*] [$($keys:tt)*]
        $(#[doc = $doc:literal])*
        cli $name:ident = $field:literal
        $(, flag $long:literal [$($fty:tt)*] $(($($farg:tt)*))?)?;
        $($rest:tt)*
    ) => {
        generate!(@settings [$args $file $origin] [$($fields)*] [$($values)*] [$($keys)*] $($rest)*);
    };
    (@settings [$args:ident $file:ident $origin:ident] [$($fields:tt)*] [$($values:tt)*] [$($keys:tt)*]
        $(#[doc = $doc:literal])*
        $dest:ident $name:ident : [$($out:tt)*] = $field:literal
        $(, flag $long:literal [$($fty:tt)*] $(($($farg:tt)*))?)?
        $(, file [$($gty:tt)*])? $(, within $($path:ident).+)?
        => $resolve:expr $(, default $default:expr)?;
        $($rest:tt)*
    ) => {
        generate!(@settings [$args $file $origin]
            [$($fields)* pub(super) $name: $($out)*,]
            [$($values)* $name: {
                let input = Input {
                    field: $field,
                    flag: generate!(@flag $args $name $($long)?),
                    file: generate!(@in $file $name [$($($gty)*)?] $($($path).+)?),
                    file_origin: $origin,
                };
                let value = ($resolve)(input)?;
                $(let value = value.unwrap_or_else(|| $default);)?
                value
            },]
            [$($keys)* ($field $name)]
            $($rest)*);
    };

    // Where a setting's value is in the flags and in the file.
    (@flag $args:ident $name:ident $long:literal) => {
        Some((&$args.$name, concat!("--", $long)))
    };
    (@flag $args:ident $name:ident) => { None };
    (@in $file:ident $name:ident [$($gty:tt)+]) => { $file.$name.as_ref() };
    (@in $file:ident $name:ident [] $first:ident $(. $next:ident)*) => {
        $file.$first.as_ref()$(.and_then(|v| v.$next.as_ref()))*
    };
    (@in $file:ident $name:ident []) => { None };
}

with_settings!(generate {});
