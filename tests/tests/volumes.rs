//! Pod volumes over the real container runtime and the node's real mounts: emptyDir on disk
//! and in memory, hostPath type checks, read-only mounts, subPath, and nothing of a pod left
//! mounted or on disk once it is deleted. Needs root and the private containerd.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::path::Path;

use swiftlet_tests::{
    eventually,
    manifest::{self, PodManifest},
    node::{Node, status},
};

fn node(test: &str, name: &str) -> Option<Node> {
    Node::for_test(test, name, &[])
}

/// A container entry (under `containers:`) running `command` with `mounts` lines.
fn container(name: &str, command: &str, mounts: &str) -> String {
    manifest::container(name, command, &format!("      volumeMounts:\n{mounts}"))
}

/// A readiness probe (container level, after `volumeMounts`) passing once `/tmp/checked` exists.
const READY_WHEN_CHECKED: &str = "      readinessProbe:
        exec:
          command: [\"cat\", \"/tmp/checked\"]
        periodSeconds: 1
        failureThreshold: 1
";

fn manifest(name: &str, restart: &str, containers: &[String], volumes: &str) -> String {
    containers
        .iter()
        .fold(
            PodManifest::new(name).restart(restart).grace(1),
            |pod, c| pod.container(c.clone()),
        )
        .volumes(volumes)
        .yaml()
}

/// Mount points of this (the agent's) mount namespace below `dir`, with their type and options.
fn host_mounts_below(dir: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let prefix = dir.to_string_lossy().into_owned();
    text.lines()
        .filter_map(|l| {
            let (before, after) = l.split_once(" - ")?;
            let point = before.split(' ').nth(4)?.to_owned();
            let mut rest = after.split(' ');
            let fs = rest.next()?.to_owned();
            let options = rest.nth(1)?.to_owned();
            point.starts_with(&prefix).then_some((point, fs, options))
        })
        .collect()
}

/// Deletes the pod and checks nothing of it stays: no mount below its directory, no directory.
fn delete_and_check_gone(node: &Node, file: &str, name: &str, uid: &str) {
    node.remove_manifest(file);
    node.wait_gone(name);
    let dir = node.pod_dir(uid);
    eventually("the pod's directory is removed", || !dir.exists());
    assert_eq!(host_mounts_below(&dir), Vec::new(), "left mounted");
}

#[test]
fn an_empty_dir_is_shared_between_containers_and_removed_with_the_pod() {
    let Some(node) = node(
        "an_empty_dir_is_shared_between_containers_and_removed_with_the_pod",
        "vol-share",
    ) else {
        return;
    };
    let mount = "        - name: shared\n          mountPath: /shared\n";
    node.write_manifest(
        "share.yaml",
        &manifest(
            "share",
            "Never",
            &[
                container("writer", "echo hello > /shared/msg; exec sleep 3600", mount),
                container(
                    "reader",
                    "for i in $(seq 300); do [ \"$(cat /shared/msg 2>/dev/null)\" = hello ] \
                     && echo seen > /shared/seen && exit 0; sleep 0.1; done; exit 1",
                    mount,
                ),
            ],
            "    - name: shared\n      emptyDir: {}\n",
        ),
    );
    let pod = node.wait_pod("share", "the reader saw the writer's file", |p| {
        status::terminated(status::container(p, "reader")).is_some()
    });
    assert_eq!(
        status::terminated(status::container(&pod, "reader")),
        Some(("Completed".to_owned(), 0))
    );
    let uid = node.pod_uid("share");
    let volume = node
        .pod_dir(&uid)
        .join("volumes/kubernetes.io~empty-dir/shared");
    assert_eq!(
        std::fs::read_to_string(volume.join("msg")).expect("msg on the node"),
        "hello\n"
    );
    assert_eq!(
        std::fs::read_to_string(volume.join("seen")).expect("seen on the node"),
        "seen\n"
    );
    delete_and_check_gone(&node, "share.yaml", "share", &uid);
}

#[test]
fn a_memory_empty_dir_is_a_sized_tmpfs_unmounted_with_the_pod() {
    let Some(node) = node(
        "a_memory_empty_dir_is_a_sized_tmpfs_unmounted_with_the_pod",
        "vol-mem",
    ) else {
        return;
    };
    // The container checks its own view: /mem is a tmpfs.
    node.write_manifest(
        "mem.yaml",
        &manifest(
            "mem",
            "Never",
            &[container(
                "app",
                "grep -q ' /mem .* - tmpfs ' /proc/self/mountinfo || exit 3; \
                 echo x > /mem/f; exec sleep 3600",
                "        - name: mem\n          mountPath: /mem\n",
            )],
            "    - name: mem\n      emptyDir:\n        medium: Memory\n        sizeLimit: 16Mi\n",
        ),
    );
    node.wait_pod("mem", "the container running", |p| {
        status::running(status::container(p, "app"))
    });
    let uid = node.pod_uid("mem");
    let volume = node
        .pod_dir(&uid)
        .join("volumes/kubernetes.io~empty-dir/mem");
    eventually("the container wrote into the tmpfs", || {
        volume.join("f").exists()
    });
    let mounts = host_mounts_below(&node.pod_dir(&uid));
    let at_volume: Vec<_> = mounts
        .iter()
        .filter(|(point, _, _)| Path::new(point) == volume)
        .collect();
    assert_eq!(at_volume.len(), 1, "{mounts:?}");
    let (_, fs, options) = at_volume[0];
    assert_eq!(fs, "tmpfs");
    assert!(options.contains("size=16384k"), "{options}");
    // Still running: it passed its own tmpfs check.
    assert!(status::running(status::container(
        &node.pod("mem").expect("listed"),
        "app"
    )));
    delete_and_check_gone(&node, "mem.yaml", "mem", &uid);
}

#[test]
fn a_host_path_of_the_wrong_type_keeps_the_pod_from_running_and_says_why() {
    let Some(node) = node(
        "a_host_path_of_the_wrong_type_keeps_the_pod_from_running_and_says_why",
        "vol-hosttype",
    ) else {
        return;
    };
    let file = node.dir().join("not-a-dir");
    std::fs::write(&file, "x").expect("write");
    node.write_manifest(
        "hp.yaml",
        &manifest(
            "hp",
            "Always",
            &[container(
                "app",
                "exec sleep 3600",
                "        - name: data\n          mountPath: /data\n",
            )],
            &format!(
                "    - name: data\n      hostPath:\n        path: {}\n        type: Directory\n",
                file.display()
            ),
        ),
    );
    let want = format!(
        "hostPath type check failed: {} is not a directory",
        file.display()
    );
    let pod = node.wait_pod("hp", "a status naming the failed check", |p| {
        status::container(p, "app")
            .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
            .is_some_and(|m| m.contains(&want))
    });
    assert_eq!(status::phase(&pod), "Pending");
    assert_eq!(
        status::waiting_reason(status::container(&pod, "app")).as_deref(),
        Some("ContainerCreating")
    );
    let message = status::container(&pod, "app")
        .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
        .unwrap_or_default();
    assert!(
        message.starts_with("Unable to attach or mount volumes: unmounted volumes=[data]"),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "MountVolume.SetUp failed for volume \"data\" : {want}"
        )),
        "{message}"
    );
    // The check failed before any container was made.
    assert!(status::container(&pod, "app").is_some_and(|c| c.container_id.is_none()));
    let uid = node.pod_uid("hp");
    delete_and_check_gone(&node, "hp.yaml", "hp", &uid);
}

#[test]
fn read_only_mounts_refuse_writes_and_sub_paths_land_below_the_volume() {
    let Some(node) = node(
        "read_only_mounts_refuse_writes_and_sub_paths_land_below_the_volume",
        "vol-ro",
    ) else {
        return;
    };
    let host = node.dir().join("host-data");
    // The container checks, then says so through its readiness and keeps running: the test
    // reads the subPath file while the pod runs (after it terminated, the volume's teardown
    // raced the read: "the subPath file: NotFound").
    node.write_manifest(
        "ro.yaml",
        &manifest(
            "ro",
            "Never",
            &[container(
                "app",
                "if touch /ro/x 2>/dev/null; then exit 4; fi; \
                 echo in-sub > /sub/file || exit 5; \
                 [ \"$(ls /sub)\" = file ] || exit 6; touch /tmp/checked; exec sleep 3600",
                &format!(
                    "        - name: data\n          mountPath: /ro\n          readOnly: true\n\
                     \x20       - name: scratch\n          mountPath: /sub\n          subPath: a/b\n\
                     {READY_WHEN_CHECKED}"
                ),
            )],
            &format!(
                "    - name: data\n      hostPath:\n        path: {}\n        type: DirectoryOrCreate\n\
                 \x20   - name: scratch\n      emptyDir: {{}}\n",
                host.display()
            ),
        ),
    );
    let pod = node.wait_pod("ro", "the container's checks passed", |p| {
        status::container(p, "app").is_some_and(|c| c.ready)
            || status::terminated(status::container(p, "app")).is_some()
    });
    // 4: the read-only mount took a write; 5/6: the subPath mount was wrong.
    assert_eq!(status::terminated(status::container(&pod, "app")), None);
    assert!(status::running(status::container(&pod, "app")));
    assert!(host.is_dir(), "DirectoryOrCreate made the node's directory");
    assert!(!host.join("x").exists());
    let uid = node.pod_uid("ro");
    let scratch = node
        .pod_dir(&uid)
        .join("volumes/kubernetes.io~empty-dir/scratch");
    assert_eq!(
        std::fs::read_to_string(scratch.join("a/b/file")).expect("the subPath file"),
        "in-sub\n"
    );
    // The runtime was handed the bind below volume-subpaths, not a path into the volume.
    let bind = node.pod_dir(&uid).join("volume-subpaths/scratch/app/1");
    assert!(
        host_mounts_below(&node.pod_dir(&uid))
            .iter()
            .any(|(point, _, _)| Path::new(point) == bind),
        "the subPath's bind"
    );
    delete_and_check_gone(&node, "ro.yaml", "ro", &uid);
    assert!(host.is_dir(), "a hostPath outlives its pod");
}

#[test]
fn a_disk_empty_dir_over_its_size_limit_gets_the_pod_evicted() {
    let Some(node) = node(
        "a_disk_empty_dir_over_its_size_limit_gets_the_pod_evicted",
        "vol-limit",
    ) else {
        return;
    };
    node.write_manifest(
        "full.yaml",
        &manifest(
            "full",
            "Always",
            &[container(
                "app",
                "dd if=/dev/zero of=/scratch/f bs=1048576 count=4; exec sleep 3600",
                "        - name: scratch\n          mountPath: /scratch\n",
            )],
            "    - name: scratch\n      emptyDir:\n        sizeLimit: 1Mi\n",
        ),
    );
    let pod = node.wait_pod("full", "evicted", |p| status::phase(p) == "Failed");
    let s = pod.status.clone().unwrap_or_default();
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        s.message.as_deref(),
        Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ")
    );
    let uid = node.pod_uid("full");
    // Evicted pods stay listed until deleted; their volumes are already torn down.
    let volume = node
        .pod_dir(&uid)
        .join("volumes/kubernetes.io~empty-dir/scratch");
    eventually("the evicted pod's emptyDir is removed", || !volume.exists());
    delete_and_check_gone(&node, "full.yaml", "full", &uid);
}

/// Resource lines (under a container entry) limiting `ephemeral-storage`.
fn ephemeral_limit(limit: &str) -> String {
    format!("      resources:\n        limits:\n          ephemeral-storage: {limit}\n")
}

#[test]
fn a_container_over_its_ephemeral_storage_limit_gets_the_pod_evicted() {
    let Some(node) = node(
        "a_container_over_its_ephemeral_storage_limit_gets_the_pod_evicted",
        "eph-limit",
    ) else {
        return;
    };
    // `big` writes 8 MiB into its writable layer against 2Mi; `roomy` keeps the pod's sum
    // (102Mi) above what the pod writes, so the container's own limit is what is exceeded.
    node.write_manifest(
        "big.yaml",
        &PodManifest::new("big")
            .restart("Always")
            .grace(1)
            .container(manifest::container(
                "big",
                "dd if=/dev/zero of=/filler bs=1048576 count=8; exec sleep 3600",
                &ephemeral_limit("2Mi"),
            ))
            .container(manifest::container(
                "roomy",
                "exec sleep 3600",
                &ephemeral_limit("100Mi"),
            ))
            .yaml(),
    );
    // The neighbour writes as much, without a limit.
    node.write_manifest(
        "calm.yaml",
        &PodManifest::new("calm")
            .restart("Always")
            .grace(1)
            .container(manifest::container(
                "calm",
                "dd if=/dev/zero of=/filler bs=1048576 count=8; exec sleep 3600",
                "",
            ))
            .yaml(),
    );
    node.wait_pod("calm", "running", |p| {
        status::running(status::container(p, "calm"))
    });
    let pod = node.wait_pod("big", "evicted", |p| status::phase(p) == "Failed");
    let s = pod.status.clone().unwrap_or_default();
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        s.message.as_deref(),
        Some("Container big exceeded its local ephemeral storage limit \"2Mi\". ")
    );
    let calm = node.wait_pod("calm", "still running", |p| {
        status::running(status::container(p, "calm"))
    });
    assert_eq!(status::phase(&calm), "Running");
    assert_eq!(
        status::container(&calm, "calm").map(|c| c.restart_count),
        Some(0)
    );
    let uid = node.pod_uid("big");
    delete_and_check_gone(&node, "big.yaml", "big", &uid);
}

#[test]
fn downward_api_files_carry_the_pods_fields_read_only() {
    let Some(node) = node(
        "downward_api_files_carry_the_pods_fields_read_only",
        "vol-downward",
    ) else {
        return;
    };
    let full = format!("info-{}", node.name);
    node.write_manifest(
        "info.yaml",
        &PodManifest::new("info")
            .metadata("  labels:\n    tier: front\n")
            .restart("Never")
            .grace(1)
            .shell(
                "app",
                &format!(
                    "[ \"$(cat /info/name)\" = {full} ] || exit 3; \
                     grep -qx 'tier=\"front\"' /info/labels || exit 4; \
                     [ \"$(cat /info/mem)\" = 32 ] || exit 5; \
                     if touch /info/x 2>/dev/null; then exit 6; fi; exit 0"
                ),
                "      resources:
        limits:
          memory: 32Mi
      volumeMounts:
        - name: info
          mountPath: /info
",
            )
            .volumes(
                "    - name: info
      downwardAPI:
        items:
          - path: name
            fieldRef:
              fieldPath: metadata.name
          - path: labels
            fieldRef:
              fieldPath: metadata.labels
          - path: mem
            resourceFieldRef:
              containerName: app
              resource: limits.memory
              divisor: 1Mi
",
            )
            .yaml(),
    );
    let pod = node.wait_pod("info", "the container done", |p| {
        status::terminated(status::container(p, "app")).is_some()
    });
    // 3, 4, 5: a file was wrong; 6: the volume took a write.
    assert_eq!(
        status::terminated(status::container(&pod, "app")),
        Some(("Completed".to_owned(), 0))
    );
    let uid = node.pod_uid("info");
    let volume = node
        .pod_dir(&uid)
        .join("volumes/kubernetes.io~downward-api/info");
    let data = std::fs::read_link(volume.join("..data")).expect("the ..data symlink");
    assert!(data.to_string_lossy().starts_with(".."), "{data:?}");
    assert_eq!(
        std::fs::read_link(volume.join("name")).expect("name is a symlink"),
        Path::new("..data/name")
    );
    delete_and_check_gone(&node, "info.yaml", "info", &uid);
}

#[test]
fn a_restarted_agent_keeps_a_running_pods_tmpfs_and_mounts_it_once() {
    let Some(mut node) = node(
        "a_restarted_agent_keeps_a_running_pods_tmpfs_and_mounts_it_once",
        "vol-restart",
    ) else {
        return;
    };
    node.write_manifest(
        "keep.yaml",
        &manifest(
            "keep",
            "Always",
            &[container(
                "app",
                "echo kept > /mem/f; exec sleep 3600",
                "        - name: mem\n          mountPath: /mem\n",
            )],
            "    - name: mem\n      emptyDir:\n        medium: Memory\n",
        ),
    );
    let before = node.wait_pod("keep", "running", |p| {
        status::running(status::container(p, "app"))
    });
    let id = status::container(&before, "app").and_then(|c| c.container_id.clone());
    let uid = node.pod_uid("keep");
    let volume = node
        .pod_dir(&uid)
        .join("volumes/kubernetes.io~empty-dir/mem");
    eventually("the container wrote into the tmpfs", || {
        volume.join("f").exists()
    });
    node.restart();
    // The restarted agent syncs the pod again (its volumes included) and keeps the container.
    let after = node.wait_pod("keep", "running after the restart", |p| {
        status::running(status::container(p, "app"))
    });
    assert_eq!(
        status::container(&after, "app").and_then(|c| c.container_id.clone()),
        id
    );
    // The restarted agent has set the volume up again (idempotently) by now.
    eventually("the restarted agent set the volume up", || {
        node.metric(
            "storage_operation_duration_seconds_count{operation_name=\"volume_mount\",\
             status=\"success\",volume_plugin=\"kubernetes.io/empty-dir\"}",
        ) >= 1.0
    });
    let at_volume = host_mounts_below(&node.pod_dir(&uid))
        .into_iter()
        .filter(|(point, _, _)| Path::new(point) == volume)
        .count();
    assert_eq!(at_volume, 1, "one tmpfs, not a second one over it");
    assert_eq!(
        std::fs::read_to_string(volume.join("f")).expect("the file survived"),
        "kept\n"
    );
    delete_and_check_gone(&node, "keep.yaml", "keep", &uid);
}
