//! The `swiftlet` binary as a user runs it: `events` (text and JSON, bad input, no privileges,
//! program logs) and `run` (the gRPC event stream, /metrics on the read-only port checked by
//! promtool, /healthz; an upstream KubeletConfiguration's warnings).
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    io::Write as _,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::PathBuf,
    process::Command,
};

use swiftlet_proto::v1::{self, events_client::EventsClient};
use swiftlet_tests::{
    TestCgroup, http_get_status, privileged, process::Running, swiftlet_bin, testproc,
    trusted::TrustedDir,
};

#[test]
fn events_rejects_a_missing_cgroup_naming_it() {
    // Bad input is reported before anything privileged happens, so this runs as anyone.
    let out = Command::new(swiftlet_bin())
        .args(["events", "--cgroup", "/does/not/exist"])
        .output()
        .expect("run swiftlet");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("error: --cgroup /does/not/exist: no such cgroup")),
        "{stderr}"
    );
    assert!(lines.iter().any(|l| l.starts_with("hint: ")), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn events_rejects_a_bad_ring_size() {
    let out = Command::new(swiftlet_bin())
        .args(["events", "--ring-buffer-bytes", "5000"])
        .output()
        .expect("run swiftlet");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("ring buffer size 5000 is not a power of two"),
        "{stderr}"
    );
}

#[test]
fn run_rejects_a_bad_eviction_threshold_quoting_it() {
    // The configuration is validated before anything privileged, so this runs as anyone.
    let out = Command::new(swiftlet_bin())
        .args(["run", "--eviction-hard", "memory.available<abc"])
        .output()
        .expect("run swiftlet");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with("error: ")
            && l.contains("flag --eviction-hard")
            && l.contains("\"memory.available<abc\"")),
        "{stderr}"
    );
    assert!(stderr.contains("hint: "), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn events_without_privileges_says_why_and_how() {
    if !privileged("events_without_privileges_says_why_and_how") {
        return;
    }
    // As root, drop to the `nobody` user to see what an unprivileged user sees. The binary is
    // copied where `nobody` may execute it (a checkout under /root is not traversable).
    let dir = std::env::temp_dir().join(format!("swiftlet-test-nobody-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let binary = dir.join("swiftlet");
    std::fs::copy(swiftlet_bin(), &binary).expect("copy the binary");
    for path in [&dir, &binary] {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
    }
    let out = Command::new(&binary)
        .arg("events")
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run swiftlet");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("error: loading eBPF programs needs privileges"),
        "{stderr}"
    );
    assert!(stderr.contains("hint: run as root"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn events_json_prints_one_object_per_event() {
    if !privileged("events_json_prints_one_object_per_event") {
        return;
    }
    let cgroup = TestCgroup::new("cli-json");
    let swiftlet = Running::start(Command::new(swiftlet_bin()).args([
        "events",
        "--json",
        "--cgroup",
        &cgroup.path,
    ]));
    swiftlet.wait_stderr("kernel event programs attached");
    let mut child = cgroup.spawn(Command::new(testproc()).args(["exit", "7"]));
    let _ = child.wait();
    let pid = child.id();

    let exec = swiftlet.wait_stdout(|l| l.contains(r#""kind":"exec""#));
    let exec: serde_json::Value = serde_json::from_str(&exec).expect("JSON line");
    assert_eq!(exec["pid"], pid);
    assert_eq!(exec["cgroup_id"], cgroup.id());
    assert!(
        exec["filename"]
            .as_str()
            .is_some_and(|f| f.ends_with("swiftlet-testproc"))
    );
    let exit = swiftlet.wait_stdout(|l| l.contains(r#""kind":"exit""#));
    let exit: serde_json::Value = serde_json::from_str(&exit).expect("JSON line");
    assert_eq!(exit["pid"], pid);
    assert_eq!(exit["exit_code"], 7);
    assert_eq!(exit["signal"], serde_json::Value::Null);
    assert!(exit["ts_ns"].as_u64().is_some_and(|t| t > 0));
    assert!(
        exit["comm"]
            .as_str()
            .is_some_and(|c| c.starts_with("swiftlet-testpr"))
    );
}

#[test]
fn program_logs_reach_the_agent_log() {
    if !privileged("program_logs_reach_the_agent_log") {
        return;
    }
    let cgroup = TestCgroup::new("cli-logs");
    let swiftlet = Running::start(Command::new(swiftlet_bin()).args([
        "events",
        "--log-level",
        "debug",
        "--cgroup",
        &cgroup.path,
    ]));
    swiftlet.wait_stderr("kernel event programs attached");
    let child = cgroup.child("logged");
    let id = child.id();
    swiftlet.wait_stdout(|l| l.starts_with("cgroup_mkdir"));
    // aya-log records from the cgroup program, forwarded through `log` into `tracing`.
    let line = swiftlet.wait_stderr(&format!("cgroup event kind=4 id={id}"));
    assert!(line.contains("DEBUG"), "{line}");
}

/// The seed's example KubeletConfiguration: the fields it sets without effect in swiftlet are
/// warned about once each, in the format of `--log-format` (which wins over the file's
/// `logging.format: text`), before the agent goes on. The configuration is loaded and its warnings
/// written before anything privileged, and the missing kubeconfig stops the agent right after, so
/// this runs as anyone and needs no runtime.
#[test]
fn run_warns_once_per_config_field_without_effect() {
    let fixture =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/kubelet-config/seed-example.yaml");
    let dir = std::env::temp_dir().join(format!("swiftlet-test-config-{}", std::process::id()));
    let swiftlet = Running::start(Command::new(swiftlet_bin()).args([
        "run",
        "--config",
        &fixture.display().to_string(),
        "--kubeconfig",
        &dir.join("missing.kubeconfig").display().to_string(),
        "--log-format",
        "json",
        "--root-dir",
        &dir.join("root").display().to_string(),
        "--grpc-socket",
        &dir.join("swiftlet.sock").display().to_string(),
    ]));
    let lines = swiftlet.wait_stderr_lines("configuration loaded");
    drop(swiftlet);
    assert!(lines.iter().all(|l| l.starts_with('{')), "{lines:#?}");
    for field in [
        "featureGates.CSIMigration",
        "featureGates.LocalStorageCapacityIsolation",
    ] {
        let tag = format!("\"field\":\"{field}\"");
        let count = lines.iter().filter(|l| l.contains(&tag)).count();
        assert_eq!(count, 1, "{field}: {lines:#?}");
    }
    // The seed's graceful node shutdown fields take effect now (the node shutdown manager).
    for field in ["shutdownGracePeriod", "shutdownGracePeriodCriticalPods"] {
        let tag = format!("\"field\":\"{field}\"");
        assert!(
            !lines.iter().any(|l| l.contains(&tag)),
            "{field}: {lines:#?}"
        );
    }
    let warnings = lines
        .iter()
        .filter(|l| l.contains("has no effect in swiftlet"))
        .count();
    assert_eq!(warnings, 2, "{lines:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

async fn grpc_client(socket: PathBuf) -> EventsClient<tonic::transport::Channel> {
    let channel = swiftlet_tests::unix_channel(socket)
        .await
        .expect("connect to the gRPC socket");
    EventsClient::new(channel)
}

#[tokio::test]
async fn run_streams_events_over_grpc_and_serves_metrics() {
    if !privileged("run_streams_events_over_grpc_and_serves_metrics") {
        return;
    }
    let Some(endpoint) =
        swiftlet_tests::runtime_endpoint("run_streams_events_over_grpc_and_serves_metrics")
    else {
        return;
    };
    let cgroup = TestCgroup::new("cli-run");
    let dir = std::env::temp_dir().join(format!("swiftlet-test-run-{}", std::process::id()));
    let socket = dir.join("swiftlet.sock");
    let port = free_port();
    let read_only_port = free_port();
    let swiftlet = Running::start(Command::new(swiftlet_bin()).args([
        "run",
        "--cgroup",
        &cgroup.path,
        "--grpc-socket",
        &socket.display().to_string(),
        "--http-address",
        &format!("127.0.0.1:{port}"),
        "--read-only-port",
        &read_only_port.to_string(),
        "--port",
        "0",
        "--runtime-endpoint",
        &endpoint,
        "--root-dir",
        &dir.join("root").display().to_string(),
        // As every test agent: memory thresholds only (the kubelet's disk thresholds put this
        // machine under DiskPressure, whose reclaim removes every unused image, busybox
        // included, and no registry could bring it back), no image GC, the sandbox image named,
        // pod logs of its own.
        "--eviction-hard",
        "memory.available<100Mi",
        "--image-gc-high-threshold",
        "100",
        "--minimum-container-ttl-duration",
        "24h",
        "--pod-infra-container-image",
        "localhost/swiftlet/pause:latest",
        "--pod-logs-dir",
        &dir.join("pods").display().to_string(),
    ]));
    let started = swiftlet.wait_stderr_lines("swiftlet is running");
    // The runtime is asked for its cgroup driver once: containerd 1.6 and 1.7 do not implement
    // RuntimeConfig (the configured driver stays, with upstream's gauge), 2.x answer.
    let unimplemented = started
        .iter()
        .filter(|l| l.contains("does not implement CRI RuntimeConfig"))
        .count();
    let answered = started
        .iter()
        .filter(|l| {
            l.contains("received from the CRI runtime") || l.contains("as the kubelet does")
        })
        .count();
    assert_eq!(unimplemented + answered, 1, "{started:#?}");

    let mut client = grpc_client(socket.clone()).await;
    let mut stream = client
        .watch(v1::WatchRequest {
            kinds: vec!["exit".into()],
            cgroup_ids: vec![],
        })
        .await
        .expect("watch")
        .into_inner();
    let mut child = cgroup.spawn(Command::new(testproc()).args(["exit", "7"]));
    let _ = child.wait();
    let event = tokio::time::timeout(swiftlet_tests::EVENT_WAIT, stream.message())
        .await
        .expect("an event in time")
        .expect("stream ok")
        .expect("stream open");
    assert_eq!(event.cgroup_id, cgroup.id());
    let Some(v1::event::Kind::Exit(exit)) = event.kind else {
        panic!("only exits were asked for: {event:?}")
    };
    assert_eq!(exit.pid, child.id());
    assert_eq!(exit.exit_code, Some(7));

    let (status, health) = http_get_status(port, "/healthz");
    assert_eq!((status, health.as_str()), (200, "ok\n"));
    // The healthz address serves /healthz only; metrics are on the read-only port.
    assert_eq!(http_get_status(port, "/metrics").0, 404);
    let (status, metrics) = http_get_status(read_only_port, "/metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.contains(r#"swiftlet_kernel_events_received_total{kind="exit"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"swiftlet_kernel_events_lost_total{kind="exit"} 0"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("swiftlet_kernel_event_delivery_seconds_bucket"),
        "{metrics}"
    );
    assert_eq!(
        metrics.contains(r#"kubelet_cri_losing_support{version="1.38.0"} 1"#),
        unimplemented == 1,
        "{metrics}"
    );
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed by `cargo xtask setup`");
    promtool
        .stdin
        .take()
        .expect("stdin")
        .write_all(metrics.as_bytes())
        .expect("write metrics");
    let checked = promtool.wait_with_output().expect("promtool runs");
    // The text must parse, and lint clean but for one finding: upstream's own name
    // `kubelet_pleg_discard_events` (kept for compatibility) lacks the `_total` suffix.
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    let unexpected: Vec<&str> = report
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !l.starts_with("kubelet_pleg_discard_events counter metrics should have"))
        .collect();
    assert!(unexpected.is_empty(), "promtool check metrics: {report}");
    drop(swiftlet);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn run_with_the_systemd_cgroup_driver_needs_systemd() {
    // Checked right after the configuration, before anything privileged, so this runs as anyone.
    let config = std::env::temp_dir().join(format!("swiftlet-systemd-{}.yaml", std::process::id()));
    let run = |yaml: &str| {
        std::fs::write(&config, yaml).expect("write config");
        let out = Command::new(swiftlet_bin())
            .arg("run")
            .arg("--config")
            .arg(&config)
            .output()
            .expect("run swiftlet");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("hint: "), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };
    let stderr = run("cgroupDriver: systemd\ncgroupRoot: /kubepods\n");
    assert!(
        stderr.lines().any(|l| l.starts_with(
            "error: cgroupRoot \"/kubepods\" with cgroupDriver: systemd: not a slice"
        )),
        "{stderr}"
    );
    if std::path::Path::new("/run/systemd/system").is_dir() {
        std::fs::remove_file(&config).expect("remove config");
        eprintln!("systemd is the init system here: the not-booted refusal is not observable");
        return;
    }
    let pid1 = std::fs::read_to_string("/proc/1/comm").expect("/proc/1/comm");
    let stderr = run("cgroupDriver: systemd\n");
    let want = format!(
        "error: cgroupDriver: systemd needs systemd as the init system (PID 1 is {:?} and /run/systemd/system does not exist)",
        pid1.trim_end()
    );
    assert!(stderr.lines().any(|l| l.starts_with(&want)), "{stderr}");
    std::fs::remove_file(&config).expect("remove config");
}

/// `swiftlet run` with `flags` (and a root dir and socket in `dir`), which must fail at start:
/// its stderr.
fn run_refused(dir: &std::path::Path, flags: &[(&str, &std::path::Path)]) -> String {
    let mut command = Command::new(swiftlet_bin());
    command.arg("run");
    for (flag, value) in flags {
        command.arg(flag).arg(value);
    }
    let out = command
        .arg("--root-dir")
        .arg(dir.join("root"))
        .arg("--grpc-socket")
        .arg(dir.join("swiftlet.sock"))
        .output()
        .expect("run swiftlet");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// A bad image credential provider configuration stops the agent at start, before anything
/// privileged, with an error naming the file and each bad field; one of the two flags without
/// the other is refused too. (Root only: the files must be in a directory only root may write.)
#[test]
fn run_refuses_a_bad_credential_provider_config() {
    let Some(trusted) = TrustedDir::new(
        "run_refuses_a_bad_credential_provider_config",
        "cred-config",
    ) else {
        return;
    };
    let dir = trusted.path();
    std::fs::create_dir_all(dir.join("bin")).expect("the bin dir");
    let config = dir.join("providers.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
         - name: ../../bin/sh\n  matchImages: [\"*.example.com\"]\n  defaultCacheDuration: 1m\n  \
         apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
    )
    .expect("write config");
    let bin = dir.join("bin");
    let stderr = run_refused(
        dir,
        &[
            ("--image-credential-provider-config", &config),
            ("--image-credential-provider-bin-dir", &bin),
        ],
    );
    let want = format!(
        "error: image credential providers: failed to validate credential provider config {}: \
         [providers[0].name: Invalid value: \"../../bin/sh\": provider name cannot contain '/']",
        config.display()
    );
    assert!(stderr.lines().any(|l| l == want), "{stderr}");
    let stderr = run_refused(dir, &[("--image-credential-provider-bin-dir", &bin)]);
    assert!(
        stderr.contains("--image-credential-provider-config and --image-credential-provider-bin-dir must be given together"),
        "{stderr}"
    );
}

/// The agent runs credential provider plugins as root, so a file a local user could have
/// written stops it at start, naming the path, its owner and mode, and what was expected —
/// before any plugin runs: (a) a group-writable config, (b) a bin dir owned by uid 65534,
/// (c) a plugin that is a link to `/bin/sh`. Each plugin would leave a marker file if it ran.
#[test]
fn run_refuses_credential_provider_files_a_local_user_could_write() {
    let test = "run_refuses_credential_provider_files_a_local_user_could_write";
    let Some(trusted) = TrustedDir::new(test, "cred-perm") else {
        return;
    };
    let dir = trusted.path();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("the bin dir");
    let marker = dir.join("ran");
    let plugin = bin.join("plugin");
    std::fs::write(&plugin, format!("#!/bin/sh\ntouch {}\n", marker.display()))
        .expect("the plugin");
    let chmod = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    chmod(&plugin, 0o755);
    let config = dir.join("providers.yaml");
    // Were `/bin/sh` run in the plugin's place, these arguments would leave the marker too.
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
             - name: plugin\n  matchImages: [\"*.example.com\"]\n  defaultCacheDuration: 1m\n  \
             apiVersion: credentialprovider.kubelet.k8s.io/v1\n  args: [\"-c\", \"touch {}\"]\n",
            marker.display()
        ),
    )
    .expect("write config");
    chmod(&config, 0o644);
    let flags = [
        ("--image-credential-provider-config", config.as_path()),
        ("--image-credential-provider-bin-dir", bin.as_path()),
    ];
    let refused = |want: String| {
        let stderr = run_refused(dir, &flags);
        let want = format!("error: image credential providers: {want}");
        assert!(stderr.lines().any(|l| l == want), "{stderr}");
        assert!(!marker.exists(), "a plugin ran: {stderr}");
    };

    // (a) The config writable by its group.
    chmod(&config, 0o664);
    refused(format!(
        "credential provider config {}: mode 0664 (owner uid 0) is writable by its group; \
         expected writable by its owner only",
        config.display()
    ));
    chmod(&config, 0o644);

    // (b) The bin dir another user's.
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    nix::unistd::chown(&bin, nobody, None).expect("chown");
    refused(format!(
        "credential provider bin dir {}: owned by uid 65534 (mode 0755); expected owned by root",
        bin.display()
    ));
    nix::unistd::chown(&bin, Some(nix::unistd::Uid::from_raw(0)), None).expect("chown");

    // (c) The plugin a link to a shell.
    std::fs::remove_file(&plugin).expect("remove the plugin");
    std::os::unix::fs::symlink("/bin/sh", &plugin).expect("link");
    refused(format!(
        "credential provider plugin {}: a symbolic link (owner uid 0); expected no symbolic \
         link on the path (links are not followed)",
        plugin.display()
    ));
}
