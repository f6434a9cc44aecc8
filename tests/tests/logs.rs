//! Container logs and garbage collection over the real container runtime: `/containerLogs` with
//! its options (tail, timestamps, since, limit, previous, follow) on what containerd wrote, log
//! rotation by size, the container GC of a crash-looping container, and the image GC never
//! taking an image in use. Each agent keeps its pods' logs in a directory of its own
//! (`--pod-logs-dir`, set by the harness), so collecting log directories cannot touch another
//! agent's. Needs root and the private containerd that `cargo xtask test` starts.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
    time::{Duration, Instant},
};

use k8s_openapi::jiff::Timestamp;
use swiftlet_tests::{
    EVENT_WAIT,
    manifest::PodManifest,
    node::{BUSYBOX, Node, status},
    privileged, runtime_endpoint,
    tls::{self, TestCa},
    with_cri,
};

const PAUSE: &str = "localhost/swiftlet/pause:latest";

/// A one-container pod manifest running `command` in busybox.
fn pod(name: &str, restart: &str, command: &str) -> String {
    PodManifest::new(name)
        .restart(restart)
        .grace(1)
        .shell("main", command, "")
        .yaml()
}

/// An agent with `config` as its config file (if not empty) and `flags`; also returns its pod
/// log directory (the harness gives each agent its own).
fn node(test: &str, name: &str, config: &str, flags: &[&str]) -> Option<(Node, PathBuf)> {
    if !privileged(test) {
        return None;
    }
    let endpoint = runtime_endpoint(test)?;
    let file =
        std::env::temp_dir().join(format!("swiftlet-logs-{}-{name}.yaml", std::process::id()));
    let file_arg = file.display().to_string();
    let mut args = Vec::new();
    if !config.is_empty() {
        std::fs::write(&file, config).expect("config");
        args.extend(["--config", file_arg.as_str()]);
    }
    let ca_file = ca().1.display().to_string();
    args.extend(["--client-ca-file", ca_file.as_str()]);
    args.extend(flags);
    let node = Node::start_with(name, &endpoint, &args);
    let _ = std::fs::remove_file(&file);
    let logs = node.pod_logs_dir();
    Some((node, logs))
}

/// The test CA whose client certificates the agents' kubelet servers trust (one per process),
/// and its certificate file.
fn ca() -> &'static (TestCa, PathBuf) {
    static CA: OnceLock<(TestCa, PathBuf)> = OnceLock::new();
    CA.get_or_init(|| {
        let ca = TestCa::new("swiftlet-logs-test-ca");
        let file = std::env::temp_dir().join(format!(
            "swiftlet-logs-{}-client-ca.crt",
            std::process::id()
        ));
        std::fs::write(&file, &ca.pem).expect("write the client CA");
        (ca, file)
    })
}

/// A GET on the agent's kubelet server (`/containerLogs` is served only there, behind TLS and
/// authentication): status and body, read to the end.
fn get(node: &Node, path: &str) -> (u16, String) {
    let config = tls::client_config(
        &node.cert_dir().join("kubelet.crt"),
        Some(&ca().0.client("log-reader", &[])),
    );
    match tls::request(node.kubelet_port, &node.name, config, "GET", path, &[]) {
        Ok(answer) => (answer.status, answer.body),
        Err(e) => (0, e),
    }
}

/// The logs path of container `main` of pod `name`.
fn logs_path(node: &Node, name: &str, query: &str) -> String {
    format!("/containerLogs/default/{name}-{}/main{query}", node.name)
}

/// Polls the log until `want` holds for its body (bounded).
fn wait_log(node: &Node, name: &str, query: &str, want: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + EVENT_WAIT;
    let mut last = String::new();
    while Instant::now() < deadline {
        let (code, body) = get(node, &logs_path(node, name, query));
        if code == 200 && want(&body) {
            return body;
        }
        last = format!("{code}: {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the log of {name} never got what was wanted; last answer: {last}");
}

fn restart_count(pod: &k8s_openapi::api::core::v1::Pod) -> i32 {
    status::container(pod, "main").map_or(0, |c| c.restart_count)
}

#[test]
fn container_logs_with_tail_timestamps_since_and_limits() {
    let Some((node, _)) = node(
        "container_logs_with_tail_timestamps_since_and_limits",
        "logs",
        "",
        &[],
    ) else {
        return;
    };
    node.write_manifest(
        "talk.yaml",
        &pod(
            "talk",
            "Always",
            // Pauses around the stderr line: containerd copies each stream on its own.
            "echo line 1; echo line 2; sleep 0.3; echo line 3 >&2; sleep 0.3; echo line 4; sleep 1; echo late; exec sleep 3600",
        ),
    );
    let all = wait_log(&node, "talk", "", |b| b.contains("late"));
    assert_eq!(all, "line 1\nline 2\nline 3\nline 4\nlate\n");
    let (code, tail) = get(&node, &logs_path(&node, "talk", "?tailLines=2"));
    assert_eq!((code, tail.as_str()), (200, "line 4\nlate\n"));
    let (_, limited) = get(&node, &logs_path(&node, "talk", "?limitBytes=8"));
    assert_eq!(limited, "line 1\nl");

    // Timestamps are containerd's, RFC 3339; `sinceTime` at the last line's keeps only it.
    let (_, stamped) = get(&node, &logs_path(&node, "talk", "?timestamps=true"));
    let stamps: Vec<Timestamp> = stamped
        .lines()
        .map(|l| {
            let (ts, _) = l.split_once(' ').expect("timestamp and line");
            ts.parse().unwrap_or_else(|e| panic!("{l}: {e}"))
        })
        .collect();
    assert_eq!(stamps.len(), 5);
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{stamped}");
    assert!(
        stamped
            .lines()
            .all(|l| l.contains(" line ") || l.ends_with(" late"))
    );
    let since = format!("?sinceTime={}", stamps[4]);
    let (code, body) = get(&node, &logs_path(&node, "talk", &since));
    assert_eq!((code, body.as_str()), (200, "late\n"));
    let (code, body) = get(&node, &logs_path(&node, "talk", "?sinceSeconds=3600"));
    assert_eq!((code, body), (200, all));

    // Bad requests name the parameter; unknown pods and containers are 404.
    let (code, body) = get(&node, &logs_path(&node, "talk", "?tailLines=many"));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("tailLines"), "{body}");
    let (code, body) = get(&node, &logs_path(&node, "talk", "?sinceSeconds=0"));
    assert_eq!(code, 422, "{body}");
    assert!(body.contains("sinceSeconds"), "{body}");
    let (code, body) = get(&node, &logs_path(&node, "talk", "?previous=true"));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("previous terminated container"), "{body}");
    let (code, body) = get(
        &node,
        &format!("/containerLogs/default/talk-{}/nope", node.name),
    );
    assert_eq!(code, 404, "{body}");
    let (code, body) = get(&node, "/containerLogs/default/nobody/main");
    assert_eq!(code, 404, "{body}");
}

#[test]
fn follow_streams_new_lines_until_the_container_exits() {
    let Some((node, _)) = node(
        "follow_streams_new_lines_until_the_container_exits",
        "follow",
        "",
        &[],
    ) else {
        return;
    };
    node.write_manifest(
        "ticks.yaml",
        &pod(
            "ticks",
            "Never",
            "for i in 1 2 3 4 5 6; do echo tick $i; sleep 1; done",
        ),
    );
    let before = wait_log(&node, "ticks", "", |b| b.contains("tick 1"));
    assert!(!before.contains("tick 6"), "{before}");
    // The request is made before the last ticks are written; the answer ends when the container
    // exits, with every tick.
    let (code, followed) = get(&node, &logs_path(&node, "ticks", "?follow=true"));
    assert_eq!(code, 200);
    assert_eq!(followed, "tick 1\ntick 2\ntick 3\ntick 4\ntick 5\ntick 6\n");
    let pod = node.wait_pod("ticks", "Succeeded", |p| status::phase(p) == "Succeeded");
    assert_eq!(status::phase(&pod), "Succeeded");
}

/// The runtime's containers of pod `name` (all states).
fn containers_of(node: &Node, name: &str) -> Vec<k8s_cri::v1::Container> {
    let full = format!("{name}-{}", node.name);
    with_cri("containers_of", |runtime| async move {
        use swiftlet::cri::RuntimeService as _;
        runtime.list_containers(None).await.expect("list")
    })
    .into_iter()
    .filter(|c| c.labels.get("io.kubernetes.pod.name") == Some(&full))
    .collect()
}

#[test]
fn previous_logs_and_gc_of_a_crash_looping_container() {
    let Some((node, logs)) = node(
        "previous_logs_and_gc_of_a_crash_looping_container",
        "crashloop",
        "",
        // This test is about the collector: upstream's default minimum age.
        &["--minimum-container-ttl-duration", "0s"],
    ) else {
        return;
    };
    node.write_manifest(
        "crash.yaml",
        &pod(
            "crash",
            "Always",
            "echo run $(cat /proc/sys/kernel/random/uuid); sleep 1; exit 3",
        ),
    );
    node.wait_pod("crash", "a restart", |p| restart_count(p) >= 1);
    let pod = node.wait_pod("crash", "a second restart", |p| restart_count(p) >= 2);
    let previous = wait_log(&node, "crash", "?previous=true", |b| b.starts_with("run "));
    assert_eq!(previous.lines().count(), 1, "{previous}");
    let current = wait_log(&node, "crash", "", |b| b.starts_with("run "));
    assert_eq!(current.lines().count(), 1, "{current}");

    // Three instances ran; the GC keeps the newest dead one (and the one running, if any).
    let deadline = Instant::now() + EVENT_WAIT;
    let mut instances = containers_of(&node, "crash");
    while Instant::now() < deadline {
        let dead = instances
            .iter()
            .filter(|c| c.state == k8s_cri::v1::ContainerState::ContainerExited as i32)
            .count();
        if dead <= 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        instances = containers_of(&node, "crash");
    }
    let dead: Vec<_> = instances
        .iter()
        .filter(|c| c.state == k8s_cri::v1::ContainerState::ContainerExited as i32)
        .collect();
    assert!(dead.len() <= 1, "dead instances left: {instances:#?}");
    assert!(instances.len() <= 2, "{instances:#?}");
    let newest_attempt = instances
        .iter()
        .filter_map(|c| c.metadata.as_ref().map(|m| m.attempt))
        .max()
        .expect("an instance");
    assert!(newest_attempt >= 2, "{instances:#?}");
    assert!(node.metric("swiftlet_container_gc_removed_total{object=\"container\"}") >= 1.0);
    // The first instance's log went with it; the kept ones' stay, and `previous` still answers.
    let uid = pod.metadata.uid.clone().expect("uid");
    let dir = logs.join(format!("default_crash-{}_{uid}/main", node.name));
    let files = log_files(&dir);
    assert!(!files.contains(&"0.log".to_owned()), "{files:?}");
    assert!(files.len() <= 2, "{files:?}");
    let (code, body) = get(&node, &logs_path(&node, "crash", "?previous=true"));
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("run "), "{body}");

    // Once the pod is gone, so is its log directory.
    node.remove_manifest("crash.yaml");
    node.wait_gone("crash");
    let pod_dir = dir.parent().expect("pod dir").to_owned();
    let deadline = Instant::now() + Duration::from_secs(90);
    while pod_dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(!pod_dir.exists(), "{} is still there", pod_dir.display());
}

fn log_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn rotation_keeps_at_most_max_files_and_the_log_stays_readable() {
    let Some((node, logs)) = node(
        "rotation_keeps_at_most_max_files_and_the_log_stays_readable",
        "rotate",
        "containerLogMaxFiles: 3\ncontainerLogMonitorInterval: 3s\n",
        &["--container-log-max-size", "1Ki"],
    ) else {
        return;
    };
    node.write_manifest(
        "chatty.yaml",
        &pod(
            "chatty",
            "Always",
            "i=0; while true; do i=$((i+1)); echo \"line $i 0123456789012345678901234567890123456789\"; sleep 0.02; done",
        ),
    );
    let pod = node.wait_pod("chatty", "running", |p| {
        status::container(p, "main")
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some())
    });
    let uid = pod.metadata.uid.clone().expect("uid");
    let dir = logs.join(format!("default_chatty-{}_{uid}/main", node.name));
    // At least two rotations (a compressed file exists), never more than three files.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut files = log_files(&dir);
    while Instant::now() < deadline && !files.iter().any(|f| f.ends_with(".gz")) {
        assert!(files.len() <= 3, "{files:?}");
        std::thread::sleep(Duration::from_millis(100));
        files = log_files(&dir);
    }
    assert!(files.iter().any(|f| f.ends_with(".gz")), "{files:?}");
    assert!(files.len() <= 3, "{files:?}");
    assert!(files.contains(&"0.log".to_owned()), "{files:?}");
    assert!(
        files
            .iter()
            .any(|f| f.starts_with("0.log.") && !f.ends_with(".gz")),
        "{files:?}"
    );
    // The endpoint reads the current file: consecutive lines, the first ones rotated away.
    let tail = wait_log(&node, "chatty", "?tailLines=3", |b| b.lines().count() == 3);
    let numbers: Vec<u64> = tail
        .lines()
        .map(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{l}"))
        })
        .collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{tail}");
    assert!(node.metric("swiftlet_container_log_rotations_total") >= 2.0);
    let (code, all) = get(&node, &logs_path(&node, "chatty", "?limitBytes=4096"));
    assert_eq!(code, 200);
    assert!(
        !all.starts_with("line 1 "),
        "{}",
        &all[..all.len().min(200)]
    );
}

fn images() -> Vec<String> {
    with_cri("images", |runtime| async move {
        use swiftlet::cri::ImageService as _;
        runtime.list_images(None).await.expect("list")
    })
    .into_iter()
    .flat_map(|i| i.repo_tags)
    .collect()
}

/// A tar of `files` (regular files, root-owned, mode 0644).
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut header = tar::Header::new_ustar();
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        header.set_cksum();
        builder
            .append_data(&mut header, path, *data)
            .expect("tar entry");
    }
    builder.into_inner().expect("tar")
}

fn digest(blob: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(blob)))
}

fn descriptor(media_type: &str, blob: &[u8]) -> serde_json::Value {
    serde_json::json!({ "mediaType": media_type, "digest": digest(blob), "size": blob.len() })
}

/// Imports a one-file image named `name` (unique content, so a new image id) into the CRI
/// namespace of the test containerd, as an OCI layout archive through `ctr`.
fn import_unused_image(name: &str) {
    let layer = tar_of(&[("hello", name.as_bytes())]);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": swiftlet::sources::go_arch(std::env::consts::ARCH),
        "os": "linux",
        "config": {},
        "rootfs": { "type": "layers", "diff_ids": [digest(&layer)] },
    }))
    .expect("config");
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", &layer)],
    }))
    .expect("manifest");
    let mut entry = descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    entry["annotations"] = serde_json::json!({ "io.containerd.image.name": name });
    let index =
        serde_json::to_vec(&serde_json::json!({ "schemaVersion": 2, "manifests": [entry] }))
            .expect("index");
    let blobs: Vec<(String, Vec<u8>)> = [config, layer, manifest]
        .into_iter()
        .map(|b| (format!("blobs/sha256/{}", &digest(&b)[7..]), b))
        .collect();
    let mut files: Vec<(&str, &[u8])> = vec![
        ("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#),
        ("index.json", &index),
    ];
    files.extend(blobs.iter().map(|(p, b)| (p.as_str(), b.as_slice())));
    let archive =
        std::env::temp_dir().join(format!("swiftlet-gc-victim-{}.tar", std::process::id()));
    std::fs::write(&archive, tar_of(&files)).expect("archive");
    let endpoint = runtime_endpoint("import_unused_image").expect("endpoint");
    let socket = endpoint.trim_start_matches("unix://");
    let out = std::process::Command::new("ctr")
        .args(["--address", socket, "-n", "k8s.io", "images", "import"])
        .arg(&archive)
        .output()
        .expect("ctr");
    let _ = std::fs::remove_file(&archive);
    assert!(
        out.status.success(),
        "ctr images import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn image_gc_removes_unused_images_but_never_one_in_use() {
    let Some((mut node, _)) = node(
        "image_gc_removes_unused_images_but_never_one_in_use",
        "imagegc",
        "",
        &[],
    ) else {
        return;
    };
    node.write_manifest("sleeper.yaml", &pod("sleeper", "Always", "exec sleep 3600"));
    node.wait_pod("sleeper", "running", |p| status::phase(p) == "Running");
    let victim = format!("localhost/swiftlet/gc-victim:{}", std::process::id());
    import_unused_image(&victim);
    let deadline = Instant::now() + EVENT_WAIT;
    while Instant::now() < deadline && !images().contains(&victim) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        images().contains(&victim),
        "the runtime never listed {victim}"
    );
    // Any usage is too much: the collection at start wants every unused image gone. What is
    // left is busybox (in use by the running pod) and pause (the sandbox image).
    node.restart_with(&[
        "--image-gc-high-threshold",
        "1",
        "--image-gc-low-threshold",
        "0",
        "--minimum-image-ttl-duration",
        "0s",
    ]);
    let deadline = Instant::now() + EVENT_WAIT;
    let mut seen = Vec::new();
    // Either line says a collection ran; the first may already have been read while the
    // restart waited for the agent to be up.
    let collected = |l: &String| {
        l.contains("over the high threshold") || l.contains("image GC: removed an unused image")
    };
    while Instant::now() < deadline && !seen.iter().any(collected) {
        seen.extend(node.log_lines());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(seen.iter().any(collected), "no image GC ran: {seen:#?}");
    let deadline = Instant::now() + EVENT_WAIT;
    while Instant::now() < deadline && images().contains(&victim) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let present = images();
    assert!(!present.contains(&victim), "{present:?}");
    assert!(node.metric("swiftlet_image_gc_freed_bytes_total") > 0.0);
    assert!(present.iter().any(|i| i == BUSYBOX), "{present:?}");
    assert!(present.iter().any(|i| i == PAUSE), "{present:?}");
    let pod = node.wait_pod("sleeper", "still running", |p| {
        status::phase(p) == "Running"
    });
    assert_eq!(restart_count(&pod), 0);
}
