//! Pods over the real container runtime: static manifests in, `swiftlet run` driving containerd
//! over CRI, statuses read back through `/pods` as a user reads them. Needs root and the private
//! containerd that `cargo xtask test` starts.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{collections::HashMap, process::Command};

use swiftlet_tests::{
    manifest::{self, PodManifest},
    node::{BUSYBOX, Node, status},
    privileged, runtime_endpoint,
};

/// A one-container pod manifest; `extra_spec` lines go under `spec:`. A short grace period
/// unless one is given: a shell or `sleep` as a container's pid 1 ignores SIGTERM, and the
/// default 30 s would make every teardown wait for the SIGKILL.
fn pod(name: &str, restart: &str, command: &str, extra_spec: &str) -> String {
    let pod = PodManifest::new(name).restart(restart);
    let pod = if extra_spec.contains("terminationGracePeriodSeconds") {
        pod
    } else {
        pod.grace(1)
    };
    pod.spec(extra_spec).shell("main", command, "").yaml()
}

fn node(test: &str, name: &str) -> Option<Node> {
    Node::for_test(test, name, &[])
}

#[test]
fn init_containers_then_main_with_upstream_statuses() {
    let Some(node) = node("init_containers_then_main_with_upstream_statuses", "init") else {
        return;
    };
    node.write_manifest(
        "web.yaml",
        &PodManifest::new("web")
            .grace(1)
            .init_container(manifest::container("first", "echo one", ""))
            .init_container(manifest::container("second", "echo two", ""))
            .shell("app", "exec sleep 3600", "")
            .yaml(),
    );
    let pod = node.wait_pod("web", "Running with app running", |p| {
        status::phase(p) == "Running" && status::running(status::container(p, "app"))
    });
    for init in ["first", "second"] {
        assert_eq!(
            status::terminated(status::init_container(&pod, init)),
            Some(("Completed".to_owned(), 0)),
            "{init}"
        );
    }
    for condition in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert_eq!(
            status::condition(&pod, condition).as_deref(),
            Some("True"),
            "{condition}"
        );
    }
    let s = pod.status.clone().unwrap_or_default();
    assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
    assert!(
        s.pod_ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("10.88.")),
        "a pod on the CNI bridge gets its address: {:?}",
        s.pod_ip
    );
    let app = status::container(&pod, "app").cloned().unwrap_or_default();
    assert!(
        app.container_id
            .is_some_and(|id| id.starts_with("containerd://"))
    );
    assert_eq!(app.restart_count, 0);
    assert!(app.ready);
}

#[test]
fn exit_codes_and_restart_policies() {
    let Some(node) = node("exit_codes_and_restart_policies", "exits") else {
        return;
    };
    exit_codes_and_restart_policies_on(&node);
}

/// The same with the relist PLEG (the kubelet's baseline) instead of kernel events.
#[test]
fn exit_codes_and_restart_policies_with_the_relist_pleg() {
    let test = "exit_codes_and_restart_policies_with_the_relist_pleg";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let node = Node::start_with("relist", &endpoint, &["--pleg", "relist"]);
    assert_eq!(node.metric(r#"swiftlet_pleg_mode{mode="relist"}"#), 1.0);
    exit_codes_and_restart_policies_on(&node);
}

fn exit_codes_and_restart_policies_on(node: &Node) {
    node.write_manifest("never.yaml", &pod("never", "Never", "exit 3", ""));
    node.write_manifest(
        "onfailure.yaml",
        &pod("onfailure", "OnFailure", "exit 0", ""),
    );
    node.write_manifest("always.yaml", &pod("always", "Always", "exit 1", ""));

    let never = node.wait_pod("never", "Failed", |p| status::phase(p) == "Failed");
    assert_eq!(
        status::terminated(status::container(&never, "main")),
        Some(("Error".to_owned(), 3))
    );
    assert_eq!(
        status::container(&never, "main").map(|c| c.restart_count),
        Some(0)
    );

    let done = node.wait_pod("onfailure", "Succeeded", |p| {
        status::phase(p) == "Succeeded"
    });
    assert_eq!(
        status::terminated(status::container(&done, "main")),
        Some(("Completed".to_owned(), 0))
    );

    // Always: restarted, then held back by the crash-loop back-off, which the status says.
    let looping = node.wait_pod("always", "CrashLoopBackOff", |p| {
        status::waiting_reason(status::container(p, "main")).as_deref() == Some("CrashLoopBackOff")
    });
    let main = status::container(&looping, "main")
        .cloned()
        .unwrap_or_default();
    assert!(main.restart_count >= 1, "{main:?}");
    let last = main
        .last_state
        .and_then(|s| s.terminated)
        .map(|t| (t.reason.unwrap_or_default(), t.exit_code));
    assert_eq!(last, Some(("Error".to_owned(), 1)));
    assert_eq!(status::phase(&looping), "Running");
}

#[test]
fn images_that_cannot_be_had_say_why() {
    let Some(node) = node("images_that_cannot_be_had_say_why", "images") else {
        return;
    };
    let missing = "localhost/swiftlet/missing:1";
    node.write_manifest(
        "never.yaml",
        &pod("never", "Always", "true", "").replace(BUSYBOX, missing),
    );
    node.write_manifest(
        "pull.yaml",
        &pod("pull", "Always", "true", "")
            .replace(BUSYBOX, missing)
            .replace("imagePullPolicy: Never", "imagePullPolicy: IfNotPresent"),
    );
    let never = node.wait_pod("never", "ErrImageNeverPull", |p| {
        status::waiting_reason(status::container(p, "main")).as_deref() == Some("ErrImageNeverPull")
    });
    let message = status::container(&never, "main")
        .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
        .unwrap_or_default();
    assert!(message.contains(missing), "{message}");
    assert_eq!(status::phase(&never), "Pending");
    // A pull that fails is ErrImagePull, then ImagePullBackOff while it backs off.
    node.wait_pod("pull", "an image pull failure", |p| {
        matches!(
            status::waiting_reason(status::container(p, "main")).as_deref(),
            Some("ErrImagePull" | "ImagePullBackOff")
        )
    });
    node.wait_pod("pull", "ImagePullBackOff", |p| {
        status::waiting_reason(status::container(p, "main")).as_deref() == Some("ImagePullBackOff")
    });
    // The agent itself is fine.
    assert!(node.agent.as_ref().is_some_and(|a| a.child.id() > 0));
}

#[test]
fn manifests_added_changed_and_removed_while_running() {
    let Some(node) = node("manifests_added_changed_and_removed_while_running", "edits") else {
        return;
    };
    node.write_manifest("app.yaml", &pod("app", "Always", "exec sleep 3600", ""));
    let first = node.wait_pod("app", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let first_uid = first.metadata.uid.clone().unwrap_or_default();
    let first_id = status::container(&first, "main").and_then(|c| c.container_id.clone());

    // A changed spec is a new static pod (its UID comes from its content): the old one is
    // replaced, not restarted in place.
    node.write_manifest("app.yaml", &pod("app", "Always", "exec sleep 3601", ""));
    let second = node.wait_pod("app", "the new version running", |p| {
        p.metadata.uid.as_deref() != Some(first_uid.as_str())
            && status::running(status::container(p, "main"))
    });
    assert_ne!(
        status::container(&second, "main").and_then(|c| c.container_id.clone()),
        first_id
    );
    assert_eq!(
        node.pods().len(),
        1,
        "the old version is gone: {:?}",
        node.pods()
            .iter()
            .map(|p| p.metadata.uid.clone())
            .collect::<Vec<_>>()
    );

    node.remove_manifest("app.yaml");
    node.wait_gone("app");
    // Nothing of either version stays in any cgroup hierarchy.
    for uid in [first_uid, second.metadata.uid.clone().unwrap_or_default()] {
        let leftovers = || {
            walk(std::path::Path::new("/sys/fs/cgroup"))
                .into_iter()
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy() == format!("pod{uid}"))
                })
                .collect::<Vec<_>>()
        };
        let deadline = std::time::Instant::now() + swiftlet_tests::event_wait();
        while !leftovers().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert_eq!(
            leftovers(),
            Vec::<std::path::PathBuf>::new(),
            "pod cgroups of {uid}"
        );
    }
}

#[test]
fn deletion_waits_the_grace_period_then_kills() {
    let Some(node) = node("deletion_waits_the_grace_period_then_kills", "grace") else {
        return;
    };
    // `stubborn` ignores SIGTERM: the runtime kills it when the 2 s grace period ends.
    // `polite` exits on SIGTERM at once.
    node.write_manifest(
        "stubborn.yaml",
        &pod(
            "stubborn",
            "Always",
            "trap '' TERM; while true; do sleep 1; done",
            "  terminationGracePeriodSeconds: 2\n",
        ),
    );
    node.write_manifest(
        "polite.yaml",
        &pod(
            "polite",
            "Always",
            "trap 'exit 0' TERM; while true; do sleep 1; done",
            "  terminationGracePeriodSeconds: 30\n",
        ),
    );
    let stubborn = node.wait_pod("stubborn", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let polite = node.wait_pod("polite", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let id = |p: &k8s_openapi::api::core::v1::Pod| {
        status::container(p, "main")
            .and_then(|c| c.container_id.clone())
            .map(|id| id.trim_start_matches("containerd://").to_owned())
            .unwrap_or_default()
    };
    let (stubborn_id, polite_id) = (id(&stubborn), id(&polite));

    // Watch the containers' exits from the kernel's side while the manifests go away.
    let exits = exit_statuses(&[&stubborn_id, &polite_id], || {
        node.remove_manifest("stubborn.yaml");
        node.remove_manifest("polite.yaml");
    });
    assert_eq!(
        exits.get(&polite_id),
        Some(&Some(0)),
        "polite exits 0 on SIGTERM: {exits:?}"
    );
    assert_eq!(
        exits.get(&stubborn_id),
        Some(&None),
        "stubborn is killed (SIGKILL) when the grace period ends: {exits:?}"
    );
    node.wait_gone("stubborn");
    node.wait_gone("polite");
}

/// Runs `act`, then waits for the init process of each container to exit, reading the exits
/// from swiftlet's own kernel events (the containers' cgroups are named after their ids).
/// Returns each container's exit code (`None` when a signal killed it).
fn exit_statuses(ids: &[&str], act: impl FnOnce()) -> HashMap<String, Option<i32>> {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        use swiftlet::kernel::{EventBody, KernelEvents, LoadOptions, StreamItem};
        let mut events = KernelEvents::load(&LoadOptions::default()).expect("kernel events");
        // Which cgroup ids belong to which container: the container's cgroup dir ends with its id.
        let root = events.info().cgroup2_root.clone();
        let mut cgroups: HashMap<u64, String> = HashMap::new();
        for id in ids {
            let found = Command::new("find")
                .arg(&root)
                .args(["-type", "d", "-name", id])
                .output()
                .expect("find");
            let path = String::from_utf8_lossy(&found.stdout)
                .lines()
                .next()
                .map(str::to_owned);
            let path = path.unwrap_or_else(|| panic!("no cgroup2 directory for container {id}"));
            let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).expect("stat"));
            cgroups.insert(ino, (*id).to_owned());
        }
        act();
        let mut exits = HashMap::new();
        let wait = tokio::time::timeout(swiftlet_tests::event_wait(), async {
            while exits.len() < ids.len() {
                if let StreamItem::Event(e) = events.next().await.expect("stream")
                    && let EventBody::Exit(exit) = &e.body
                    && let Some(id) = cgroups.get(&exit.cgroup_id)
                {
                    // The container's init (pid 1 inside) is the last of its processes to go.
                    if exit.comm == "sh" {
                        exits.insert(id.clone(), exit.exit_code);
                    }
                }
            }
        })
        .await;
        assert!(wait.is_ok(), "not every container exited: {exits:?}");
        exits
    })
}

/// A pod whose sidecars `s1`, `s2` (declared in that order) and main container share their PID
/// namespace and a host folder `order` (mounted at `/order`): each container writes its PID
/// there as it starts, and the sidecars, on SIGTERM, append a line to `/order/log` saying whether
/// `main` and the other sidecar are still alive, then take a second to exit. What happened is
/// read from that log's line order and from what each sidecar saw: no clock involved.
fn sidecar_pod(
    name: &str,
    restart: &str,
    grace: u32,
    order: &std::path::Path,
    main: &str,
) -> String {
    // `st NAME`: whether NAME's process still exists (its PID as it wrote it at start). `$$$$`
    // is the shell's `$$`: the kubelet expands `$(VAR)` in commands, `$$` escaping a `$`.
    let st = "st() { if [ -d /proc/$(cat /order/$1.pid) ]; then echo alive; else echo gone; fi; };";
    let mount = "      volumeMounts:
      - name: order
        mountPath: /order
";
    let sidecar = |me: &str, other: &str| {
        manifest::container(
            me,
            &format!(
                "{st} echo $$$$ > /order/{me}.pid; \
                 trap 'echo \"{me}-term main=$(st main) {other}=$(st {other})\" >> /order/log; \
                 sleep 1; echo {me}-exit >> /order/log; exit 0' TERM; \
                 while true; do sleep 0.2; done"
            ),
            &format!("      restartPolicy: Always\n{mount}"),
        )
    };
    PodManifest::new(name)
        .restart(restart)
        .grace(grace)
        .spec("  shareProcessNamespace: true\n")
        .init_container(sidecar("s1", "s2"))
        .init_container(sidecar("s2", "s1"))
        .shell(
            "main",
            &format!("echo $$$$ > /order/main.pid; {main}"),
            mount,
        )
        .volumes(&format!(
            "    - name: order
      hostPath:
        path: {}
        type: Directory
",
            order.display()
        ))
        .yaml()
}

/// A fresh folder for [`sidecar_pod`]'s `order` volume.
fn order_dir(node: &Node, name: &str) -> std::path::PathBuf {
    let dir = node.dir().join(format!("order-{name}"));
    std::fs::create_dir_all(&dir).expect("order folder");
    dir
}

/// Waits until the containers named `pids` have written their PIDs into `order`.
fn wait_pids(order: &std::path::Path, pids: &[&str]) {
    let deadline = std::time::Instant::now() + swiftlet_tests::event_wait();
    while !pids.iter().all(|p| order.join(format!("{p}.pid")).exists()) {
        assert!(
            std::time::Instant::now() < deadline,
            "not every container of {pids:?} started in {}",
            order.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The lines of `order/log` once every line of `want` is in it (bounded: the grace periods
/// involved are well under the event wait).
fn wait_log(order: &std::path::Path, want: &[&str]) -> Vec<String> {
    let path = order.join("log");
    let deadline = std::time::Instant::now() + 2 * swiftlet_tests::event_wait();
    loop {
        let lines: Vec<String> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        let has = |w: &str| lines.iter().any(|l| l.starts_with(w));
        if want.iter().all(|w| has(w)) {
            return lines;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} never got all of {want:?}: {lines:?}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Where the first line starting with `prefix` is, and the line.
fn line<'a>(lines: &'a [String], prefix: &str) -> (usize, &'a str) {
    lines
        .iter()
        .enumerate()
        .find(|(_, l)| l.starts_with(prefix))
        .map(|(i, l)| (i, l.as_str()))
        .unwrap_or_else(|| panic!("no line {prefix:?} in {lines:?}"))
}

/// Issue 20: when a pod is deleted, its sidecars are stopped only once the main containers have
/// terminated, in reverse order, within the grace period (upstream `killContainersWithSyncResult`
/// with its termination ordering); the same when the main container of a `Never` pod finishes by
/// itself (upstream's `KillPod` of a pod whose main containers are all done).
#[test]
fn sidecars_outlive_the_main_containers_in_reverse_order() {
    let Some(node) = node(
        "sidecars_outlive_the_main_containers_in_reverse_order",
        "sidecar",
    ) else {
        return;
    };
    // `deleted`: main takes 2 s to exit after SIGTERM.
    let deleted = order_dir(&node, "deleted");
    node.write_manifest(
        "deleted.yaml",
        &sidecar_pod(
            "deleted",
            "Always",
            20,
            &deleted,
            "trap 'echo main-term >> /order/log; sleep 2; echo main-exit >> /order/log; exit 0' TERM; \
             while true; do sleep 0.2; done",
        ),
    );
    // `done`: main exits by itself once the sidecars are up.
    let done = order_dir(&node, "done");
    node.write_manifest(
        "done.yaml",
        &sidecar_pod(
            "done",
            "Never",
            20,
            &done,
            "while [ ! -f /order/s2.pid ]; do sleep 0.2; done; sleep 1; echo main-exit >> /order/log",
        ),
    );
    node.wait_pod("deleted", "main running", |p| {
        status::running(status::container(p, "main"))
    });
    wait_pids(&deleted, &["s1", "s2", "main"]);
    node.remove_manifest("deleted.yaml");

    let lines = wait_log(&deleted, &["main-exit", "s2-exit", "s1-exit"]);
    let (term, _) = line(&lines, "main-term");
    let (main_exit, _) = line(&lines, "main-exit");
    let (s2, s2_saw) = line(&lines, "s2-term");
    let (s2_exit, _) = line(&lines, "s2-exit");
    let (s1, s1_saw) = line(&lines, "s1-term");
    assert!(
        term < main_exit && main_exit < s2 && s2 < s2_exit && s2_exit < s1,
        "main stops first, then s2, then s1: {lines:?}"
    );
    // What each sidecar saw as its SIGTERM came: the containers it outlives were gone.
    assert_eq!(s2_saw, "s2-term main=gone s1=alive", "{lines:?}");
    assert_eq!(s1_saw, "s1-term main=gone s2=gone", "{lines:?}");
    node.wait_gone("deleted");

    let lines = wait_log(&done, &["main-exit", "s2-exit", "s1-exit"]);
    let (main_exit, _) = line(&lines, "main-exit");
    let (s2, s2_saw) = line(&lines, "s2-term");
    let (s2_exit, _) = line(&lines, "s2-exit");
    let (s1, s1_saw) = line(&lines, "s1-term");
    assert!(
        main_exit < s2 && s2 < s2_exit && s2_exit < s1,
        "main done, then s2, then s1: {lines:?}"
    );
    assert_eq!(s2_saw, "s2-term main=gone s1=alive", "{lines:?}");
    assert_eq!(s1_saw, "s1-term main=gone s2=gone", "{lines:?}");
    let pod = node.wait_pod("done", "Succeeded", |p| status::phase(p) == "Succeeded");
    for sidecar in ["s1", "s2"] {
        assert_eq!(
            status::terminated(status::init_container(&pod, sidecar)),
            Some(("Completed".to_owned(), 0)),
            "{sidecar} exited by its SIGTERM trap: {:#?}",
            pod.status
        );
    }
    node.remove_manifest("done.yaml");
    node.wait_gone("done");
}

/// A main container that ignores SIGTERM holds the sidecars back only for the grace period:
/// then they are stopped too, still with SIGTERM and a window to exit in (upstream's minimum of
/// 2 s when nothing is left of the grace period).
#[test]
fn sidecars_still_get_a_grace_period_when_main_ignores_sigterm() {
    let Some(node) = node(
        "sidecars_still_get_a_grace_period_when_main_ignores_sigterm",
        "stubbornmain",
    ) else {
        return;
    };
    let order = order_dir(&node, "stubborn");
    node.write_manifest(
        "stubborn.yaml",
        &sidecar_pod(
            "stubborn",
            "Always",
            4,
            &order,
            // Once told to stop, it says so at every turn of its loop until it is killed.
            "trap 'echo main-term >> /order/log; t=1' TERM; \
             while true; do sleep 0.2; if [ -n \"$t\" ]; then echo main-still-here >> /order/log; fi; done",
        ),
    );
    node.wait_pod("stubborn", "main running", |p| {
        status::running(status::container(p, "main"))
    });
    wait_pids(&order, &["s1", "s2", "main"]);
    node.remove_manifest("stubborn.yaml");
    let lines = wait_log(&order, &["s2-exit", "s1-exit"]);
    let (term, _) = line(&lines, "main-term");
    let (still_here, _) = line(&lines, "main-still-here");
    let (s2, _) = line(&lines, "s2-term");
    let (s1, _) = line(&lines, "s1-term");
    // The sidecars' SIGTERM came after main had been told, and had gone on running; each then
    // had the time to finish its trap (a second) before exiting.
    assert!(
        term < still_here && still_here < s2 && still_here < s1,
        "the sidecars outlive main's SIGTERM: {lines:?}"
    );
    for sidecar in ["s1", "s2"] {
        let (term, _) = line(&lines, &format!("{sidecar}-term"));
        let (exit, _) = line(&lines, &format!("{sidecar}-exit"));
        assert!(term < exit, "{sidecar} finished its trap: {lines:?}");
    }
    node.wait_gone("stubborn");
}

#[test]
fn a_restarted_agent_adopts_the_running_pods() {
    let Some(mut node) = node("a_restarted_agent_adopts_the_running_pods", "adopt") else {
        return;
    };
    node.write_manifest("keep.yaml", &pod("keep", "Always", "exec sleep 3600", ""));
    let before = node.wait_pod("keep", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let id = status::container(&before, "main").and_then(|c| c.container_id.clone());
    node.restart();
    let after = node.wait_pod("keep", "Running again after the restart", |p| {
        status::running(status::container(p, "main"))
    });
    assert_eq!(
        status::container(&after, "main").and_then(|c| c.container_id.clone()),
        id,
        "the same container, adopted rather than started again"
    );
    assert_eq!(
        status::container(&after, "main").map(|c| c.restart_count),
        Some(0)
    );
    assert_eq!(after.metadata.uid, before.metadata.uid);
}

#[test]
fn a_bad_manifest_is_reported_and_the_others_run() {
    let Some(node) = node("a_bad_manifest_is_reported_and_the_others_run", "bad") else {
        return;
    };
    node.write_manifest(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [not, a, map\n",
    );
    node.write_manifest(
        "quantity.yaml",
        &pod("quantity", "Always", "true", "").replace(
            "      command:",
            "      resources:\n        limits:\n          memory: lots\n      command:",
        ),
    );
    node.write_manifest("good.yaml", &pod("good", "Always", "exec sleep 3600", ""));
    node.wait_pod("good", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    assert!(node.pod("quantity").is_none(), "an invalid pod is not run");
    let log = node.log_lines().join("\n");
    for file in ["broken.yaml", "quantity.yaml"] {
        assert!(log.contains(file), "the log names {file}:\n{log}");
    }
    assert!(log.contains("lots"), "and the bad value:\n{log}");
}

#[test]
fn admission_rejects_pods_beyond_max_pods_with_a_reason() {
    let test = "admission_rejects_pods_beyond_max_pods_with_a_reason";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let node = Node::start_with("admit", &endpoint, &["--max-pods", "1"]);
    node.write_manifest("first.yaml", &pod("first", "Always", "exec sleep 3600", ""));
    node.wait_pod("first", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    node.write_manifest(
        "second.yaml",
        &pod("second", "Always", "exec sleep 3600", ""),
    );
    let second = node.wait_pod("second", "Failed", |p| status::phase(p) == "Failed");
    let s = second.status.unwrap_or_default();
    assert_eq!(s.reason.as_deref(), Some("OutOfpods"));
    assert!(
        s.message
            .as_deref()
            .is_some_and(|m| m.contains("pods, requested: 1, used: 1, capacity: 1")),
        "{:?}",
        s.message
    );
    assert!(s.container_statuses.is_none(), "nothing of it was started");
}

#[test]
fn environment_arguments_and_working_dir_reach_the_container() {
    let Some(node) = node(
        "environment_arguments_and_working_dir_reach_the_container",
        "env",
    ) else {
        return;
    };
    node.write_manifest(
        "env.yaml",
        &PodManifest::new("env")
            .metadata("  labels:\n    tier: front\n")
            .grace(1)
            // Its own entry: `args` apart from `command`, which is where `$(VAR)` expands.
            .container(format!(
                "    - name: main
      image: {BUSYBOX}
      imagePullPolicy: Never
      workingDir: /tmp
      env:
        - name: POD
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        - name: TIER
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['tier']
        - name: GREETING
          value: hello $(POD)
      command: [\"sh\", \"-c\"]
      args: [\"echo \\\"$(GREETING) tier=$TIER dir=$(pwd)\\\"; exec sleep 3600\"]
"
            ))
            .yaml(),
    );
    let pod = node.wait_pod("env", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let log = node
        .pod_logs_dir()
        .join(format!("default_env-{}_{uid}/main/0.log", node.name));
    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(&log).unwrap_or_default();
        if !text.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        text.contains(&format!(
            "stdout F hello env-{} tier=front dir=/tmp",
            node.name
        )),
        "{}: {text:?}",
        log.display()
    );
}

#[test]
fn pods_run_in_their_qos_cgroups_with_their_limits() {
    let Some(node) = node("pods_run_in_their_qos_cgroups_with_their_limits", "qos") else {
        return;
    };
    let limited = pod("limited", "Always", "exec sleep 3600", "").replace(
        "      command:",
        "      resources:\n        requests:\n          memory: 32Mi\n          cpu: 100m\n        limits:\n          memory: 64Mi\n      command:",
    );
    node.write_manifest("limited.yaml", &limited);
    node.write_manifest("free.yaml", &pod("free", "Always", "exec sleep 3600", ""));
    let burstable = node.wait_pod("limited", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    let best_effort = node.wait_pod("free", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    assert_eq!(
        burstable
            .status
            .as_ref()
            .and_then(|s| s.qos_class.as_deref()),
        Some("Burstable")
    );
    assert_eq!(
        best_effort
            .status
            .as_ref()
            .and_then(|s| s.qos_class.as_deref()),
        Some("BestEffort")
    );

    let layout = swiftlet::cm::CgroupLayout::detect().expect("layout");
    let memory_root = layout
        .v1_controller("memory")
        .unwrap_or_else(|| layout.cgroup2_root().expect("cgroup2").to_owned());
    let uid = |p: &k8s_openapi::api::core::v1::Pod| p.metadata.uid.clone().unwrap_or_default();
    // Where the run's cgroup driver puts them (`kubepods/burstable/pod<uid>`, or the slices).
    let burstable_dir = swiftlet_tests::driver::pod_cgroup_in(
        &memory_root,
        swiftlet::pod::qos::QosClass::Burstable,
        &uid(&burstable),
    );
    let best_effort_dir = swiftlet_tests::driver::pod_cgroup_in(
        &memory_root,
        swiftlet::pod::qos::QosClass::BestEffort,
        &uid(&best_effort),
    );
    assert!(burstable_dir.is_dir(), "{}", burstable_dir.display());
    assert!(best_effort_dir.is_dir(), "{}", best_effort_dir.display());
    // The pod-level memory limit is the sum of its containers' (every container has one).
    let limit_file = ["memory.limit_in_bytes", "memory.max"]
        .iter()
        .map(|f| burstable_dir.join(f))
        .find(|f| f.exists())
        .expect("a memory limit file");
    let limit = std::fs::read_to_string(&limit_file).unwrap_or_default();
    assert_eq!(
        limit.trim(),
        (64u64 << 20).to_string(),
        "{}",
        limit_file.display()
    );

    // The container's processes sit in the pod's cgroup and carry the QoS's OOM score.
    let procs_of = |dir: &std::path::Path| -> Vec<String> {
        let mut pids = Vec::new();
        for entry in walk(dir) {
            if entry.ends_with("cgroup.procs") {
                pids.extend(
                    std::fs::read_to_string(&entry)
                        .unwrap_or_default()
                        .lines()
                        .map(str::to_owned),
                );
            }
        }
        pids
    };
    // (The sandbox's pause process shares the pod cgroup; its score is the runtime's business.)
    let container_id = status::container(&best_effort, "main")
        .and_then(|c| c.container_id.clone())
        .map(|id| id.trim_start_matches("containerd://").to_owned())
        .unwrap_or_default();
    let container_dir = swiftlet_tests::driver::container_cgroup(&uid(&best_effort), &container_id)
        .unwrap_or_else(|| panic!("no cgroup for container {container_id}"));
    let free_pids = procs_of(&container_dir);
    assert!(
        !free_pids.is_empty(),
        "processes in {}",
        container_dir.display()
    );
    for pid in free_pids {
        let adj = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap_or_default();
        assert_eq!(
            adj.trim(),
            "1000",
            "BestEffort processes are killed first (pid {pid})"
        );
    }
}

/// Every path below `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            }
            out.push(path);
        }
    }
    out
}

#[test]
fn a_container_over_its_memory_limit_is_oom_killed() {
    let Some(node) = node("a_container_over_its_memory_limit_is_oom_killed", "oom") else {
        return;
    };
    // `tail` keeps everything it reads when there is no newline: it grows until the limit.
    let hog = pod("hog", "Never", "head -c 1000m /dev/zero | tail", "").replace(
        "      command:",
        "      resources:\n        limits:\n          memory: 32Mi\n      command:",
    );
    node.write_manifest("hog.yaml", &hog);
    let pod = node.wait_pod("hog", "Failed", |p| status::phase(p) == "Failed");
    let (reason, code) = status::terminated(status::container(&pod, "main")).unwrap_or_default();
    assert_eq!(reason, "OOMKilled", "exit code {code}: {:#?}", pod.status);
}

#[test]
fn the_node_object_is_served_locally() {
    let Some(node) = node("the_node_object_is_served_locally", "nodeobj") else {
        return;
    };
    let deadline = std::time::Instant::now() + swiftlet_tests::event_wait();
    let object = loop {
        let body = swiftlet_tests::http_get(node.port, "/node");
        let object: serde_json::Value = serde_json::from_str(&body).expect("a Node as JSON");
        let ready = object["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
            .unwrap_or_default();
        // The first runtime check may not have answered yet.
        if ready["status"] == "True" || std::time::Instant::now() > deadline {
            break object;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let status = &object["status"];
    let ready = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or_default();
    assert_eq!(ready["status"], "True", "{ready}");
    assert_eq!(ready["reason"], "KubeletReady");
    let kinds: Vec<&str> = status["conditions"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["type"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        kinds,
        ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
    );
    for resource in ["cpu", "memory", "pods", "ephemeral-storage"] {
        assert!(
            status["capacity"][resource].is_string() && status["allocatable"][resource].is_string(),
            "{resource} missing: {status}"
        );
    }
    // Every huge page size the kernel offers, with the bytes of its pre-allocated pages (this
    // machine's sizes have none: "0"), in capacity and allocatable alike.
    let sizes: Vec<(String, u64)> = std::fs::read_dir("/sys/kernel/mm/hugepages")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let kb: u64 = name
                        .strip_prefix("hugepages-")?
                        .strip_suffix("kB")?
                        .parse()
                        .ok()?;
                    let pages: u64 = std::fs::read_to_string(e.path().join("nr_hugepages"))
                        .ok()?
                        .trim()
                        .parse()
                        .ok()?;
                    let unit = if kb.is_multiple_of(1024 * 1024) {
                        format!("{}Gi", kb / (1024 * 1024))
                    } else {
                        format!("{}Mi", kb / 1024)
                    };
                    Some((format!("hugepages-{unit}"), pages * kb * 1024))
                })
                .collect()
        })
        .unwrap_or_default();
    for (resource, bytes) in &sizes {
        for list in ["capacity", "allocatable"] {
            let shown = status[list][resource].as_str().unwrap_or("missing");
            if *bytes == 0 {
                assert_eq!(shown, "0", "{list} {resource}: {status}");
            } else {
                assert_ne!(shown, "missing", "{list} {resource}: {status}");
            }
        }
    }
    let info = &status["nodeInfo"];
    assert!(
        info["kubeletVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1.35.0+swiftlet."))
    );
    assert!(
        info["containerRuntimeVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("containerd://"))
    );
    assert_eq!(
        info["kernelVersion"].as_str(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .as_deref()
            .map(str::trim)
    );
}

/// The terminated state's message of container `main`, and the last state's.
fn messages(pod: &k8s_openapi::api::core::v1::Pod) -> (Option<String>, Option<String>) {
    let main = status::container(pod, "main").cloned().unwrap_or_default();
    let message = |s: Option<k8s_openapi::api::core::v1::ContainerState>| {
        s.and_then(|s| s.terminated).and_then(|t| t.message)
    };
    (message(main.state), message(main.last_state))
}

#[test]
fn termination_messages_come_from_the_file_or_the_log() {
    let Some(node) = node(
        "termination_messages_come_from_the_file_or_the_log",
        "termmsg",
    ) else {
        return;
    };
    let fallback = "      terminationMessagePolicy: FallbackToLogsOnError\n";
    let pods = [
        (
            "file",
            "Never",
            "printf 'disk full' > /dev/termination-log; exit 1",
            "",
        ),
        (
            "logs",
            "Never",
            "echo first; echo last words >&2; exit 1",
            fallback,
        ),
        ("logsok", "Never", "echo all good; exit 0", fallback),
        (
            "custom",
            "Never",
            "printf custom > /tmp/message; exit 0",
            "      terminationMessagePath: /tmp/message\n",
        ),
        (
            "restarts",
            "OnFailure",
            "printf crashed > /dev/termination-log; exit 1",
            "",
        ),
    ];
    for (name, restart, command, extra) in pods {
        node.write_manifest(
            &format!("{name}.yaml"),
            &PodManifest::new(name)
                .restart(restart)
                .grace(1)
                .shell("main", command, extra)
                .yaml(),
        );
    }
    // The kernel-event PLEG reports an exit before the runtime's view of it, which brings the
    // message: wait for both.
    let failed = |name: &str| {
        node.wait_pod(name, "Failed with a message", |p| {
            status::phase(p) == "Failed" && messages(p).0.is_some()
        })
    };
    assert_eq!(messages(&failed("file")).0.as_deref(), Some("disk full"));
    // The log's lines, both streams. containerd copies stdout and stderr from two pipes
    // concurrently, so which of the two lines its log file holds first is its race, not ours.
    let logs = messages(&failed("logs")).0.unwrap_or_default();
    let mut lines: Vec<&str> = logs.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        (lines, logs.ends_with('\n')),
        (vec!["first", "last words"], true),
        "{logs:?}"
    );
    let ok = node.wait_pod("logsok", "Succeeded", |p| status::phase(p) == "Succeeded");
    assert_eq!(messages(&ok).0, None, "a success reads no log");
    let custom = node.wait_pod("custom", "Succeeded with a message", |p| {
        status::phase(p) == "Succeeded" && messages(p).0.is_some()
    });
    assert_eq!(messages(&custom).0.as_deref(), Some("custom"));
    // In back-off, the instance that exited keeps its message as the last state. The kernel
    // reports the exit before containerd shows it, message and all: the runtime's confirmation
    // must reach the status without waiting for the back-off to end.
    let restarted = node.wait_pod("restarts", "a back-off with the message", |p| {
        let waiting = status::container(p, "main")
            .and_then(|c| c.state.clone())
            .and_then(|s| s.waiting)
            .and_then(|w| w.reason);
        waiting.as_deref() == Some("CrashLoopBackOff") && messages(p).1.is_some()
    });
    assert_eq!(messages(&restarted).1.as_deref(), Some("crashed"));
}

/// What a container can do to its message file: write as much as it likes (the status has the
/// last 4096 bytes), write bytes that are not UTF-8 (replaced), and try to swap the file for a
/// link to a host file — which it cannot: the file is a bind mount's target in its mount
/// namespace (`rm` fails with EBUSY) and the host's directory entry is in no mount it has. The
/// agent reads the host file through descriptors without following links anyway
/// (`kuberuntime::termination_message`, whose unit tests put a link and a FIFO in its place).
#[test]
fn a_container_cannot_make_its_termination_message_more_than_bounded_text() {
    let Some(node) = node(
        "a_container_cannot_make_its_termination_message_more_than_bounded_text",
        "termmsgattack",
    ) else {
        return;
    };
    let pods = [
        (
            "huge",
            "yes aaaaaaaaaaaaaaa | head -c 1048576 > /dev/termination-log; \
             printf END >> /dev/termination-log; exit 1",
        ),
        (
            "binary",
            "printf 'ok \\377\\376 end' > /dev/termination-log; exit 1",
        ),
        (
            "swap",
            "rm -f /dev/termination-log; ln -sf /etc/hostname /dev/termination-log; \
             printf 'still the file' >> /dev/termination-log; exit 1",
        ),
    ];
    for (name, command) in pods {
        node.write_manifest(&format!("{name}.yaml"), &pod(name, "Never", command, ""));
    }
    let failed = |name: &str| {
        node.wait_pod(name, "Failed with a message", |p| {
            status::phase(p) == "Failed" && messages(p).0.is_some()
        })
    };
    let huge_pod = failed("huge");
    let huge = messages(&huge_pod).0.unwrap_or_default();
    // 1 MiB of 16-byte lines, then "END": the message is the end of that.
    let written = format!("{}END", "aaaaaaaaaaaaaaa\n".repeat(65536));
    assert_eq!(huge.len(), 4096);
    assert_eq!(huge, written[written.len() - 4096..]);
    assert_eq!(
        messages(&failed("binary")).0.as_deref(),
        Some("ok \u{fffd}\u{fffd} end")
    );
    assert_eq!(
        messages(&failed("swap")).0.as_deref(),
        Some("still the file")
    );
}

/// A root of a test's own for its agent's pod cgroups, and where its driver puts them; on drop
/// (after the node, which is declared later) the empty cgroups left below it go from every
/// hierarchy, even when the test failed.
struct OwnRoot {
    pods: swiftlet::cgroup::PodCgroupLayout,
    root: String,
}

impl OwnRoot {
    fn new(name: &str) -> OwnRoot {
        let root = swiftlet_tests::driver::own_cgroup_root(name);
        let pods = swiftlet::cgroup::PodCgroupLayout::for_driver(
            swiftlet_tests::driver::cgroup_driver(),
            std::path::Path::new(&root),
            true,
        );
        OwnRoot { pods, root }
    }

    /// The mount of `controller` (v1), else cgroup2's.
    fn mount(controller: &str) -> std::path::PathBuf {
        let layout = swiftlet::cm::CgroupLayout::detect().expect("layout");
        layout
            .v1_controller(controller)
            .unwrap_or_else(|| layout.cgroup2_root().expect("cgroup2").to_owned())
    }

    /// An agent on this root, with `config` lines in its file.
    fn node(&self, test: &str, name: &str, config: &str) -> Option<Node> {
        if !swiftlet_tests::privileged(test) {
            return None;
        }
        let endpoint = runtime_endpoint(test)?;
        let file = self.config_file(name, config);
        Some(Node::start_with(name, &endpoint, &["--config", &file]))
    }

    /// A configuration file on this root with `config` lines, named after `name`.
    fn config_file(&self, name: &str, config: &str) -> String {
        let file =
            std::env::temp_dir().join(format!("swiftlet-{name}-{}.yaml", std::process::id()));
        std::fs::write(&file, format!("cgroupRoot: {}\n{config}", self.root)).expect("config");
        file.to_str().expect("utf-8 path").to_owned()
    }

    /// The cpu controller's directory of container `id` of pod `uid` (of QoS `class`).
    fn container_cpu_dir(
        &self,
        class: swiftlet::pod::qos::QosClass,
        uid: &str,
        id: &str,
    ) -> std::path::PathBuf {
        let pod = OwnRoot::mount("cpu").join(self.pods.pod_dir(class, uid));
        self.pods
            .container_dir_names(id)
            .into_iter()
            .map(|name| pod.join(name))
            .find(|dir| dir.is_dir())
            .unwrap_or_else(|| panic!("no cpu cgroup of container {id} in {}", pod.display()))
    }
}

impl Drop for OwnRoot {
    fn drop(&mut self) {
        let Ok(mounts) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        let mut hierarchies: Vec<std::path::PathBuf> = mounts.flatten().map(|e| e.path()).collect();
        hierarchies.push("/sys/fs/cgroup".into());
        for mount in hierarchies {
            let top = mount.join(self.root.trim_start_matches('/'));
            let mut dirs = walk(&top);
            dirs.push(top);
            for dir in dirs.iter().filter(|d| d.is_dir()) {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

/// The value of a cgroup file, trimmed.
fn read_trimmed(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Polls `path` until it reads `want`; fails with what it read last.
fn wait_reads(path: &std::path::Path, want: &str) {
    let deadline = std::time::Instant::now() + swiftlet_tests::event_wait();
    loop {
        let now = read_trimmed(path);
        if now == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} reads {now:?}, not {want:?}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The CPU weight file of a cgroup and the value it holds for `shares` (runc's conversion on
/// cgroup v2, the shares themselves on v1).
fn cpu_weight_file(dir: &std::path::Path, shares: u64) -> (std::path::PathBuf, String) {
    if dir.join("cpu.weight").exists() {
        (
            dir.join("cpu.weight"),
            swiftlet::cm::helpers::shares_to_weight(shares).to_string(),
        )
    } else {
        (dir.join("cpu.shares"), shares.to_string())
    }
}

fn with_resources(name: &str, resources: &str, spec: &str) -> String {
    PodManifest::new(name)
        .grace(1)
        .spec(spec)
        .shell("main", "exec sleep 3600", resources)
        .yaml()
}

#[test]
fn the_burstable_weight_follows_its_pods_and_overhead_reaches_the_pod_cgroup() {
    let own = OwnRoot::new("swiftlet-qos-weight");
    let Some(node) = own.node(
        "the_burstable_weight_follows_its_pods_and_overhead_reaches_the_pod_cgroup",
        "qosweight",
        "",
    ) else {
        return;
    };
    // 250m + 50m of overhead, and 200m: upstream's `setCPUCgroupConfig` sums 500m.
    let a = with_resources(
        "a",
        "      resources:\n        requests:\n          cpu: 250m\n        limits:\n          memory: 64Mi\n",
        "  overhead:\n    cpu: 50m\n    memory: 16Mi\n",
    );
    let b = with_resources(
        "b",
        "      resources:\n        requests:\n          cpu: 200m\n",
        "",
    );
    node.write_manifest("a.yaml", &a);
    node.write_manifest("b.yaml", &b);
    let pod_a = node.wait_pod("a", "Running", |p| {
        status::running(status::container(p, "main"))
    });
    node.wait_pod("b", "Running", |p| {
        status::running(status::container(p, "main"))
    });

    let burstable =
        OwnRoot::mount("cpu").join(own.pods.qos_dir(swiftlet::pod::qos::QosClass::Burstable));
    let (file, both) = cpu_weight_file(&burstable, 512);
    wait_reads(&file, &both);
    // The BestEffort level stays at the least weight.
    let best_effort =
        OwnRoot::mount("cpu").join(own.pods.qos_dir(swiftlet::pod::qos::QosClass::BestEffort));
    let (file_be, least) = cpu_weight_file(&best_effort, 2);
    assert_eq!(read_trimmed(&file_be), least, "{}", file_be.display());

    // The pod cgroup's memory limit holds the overhead: 64Mi + 16Mi.
    let uid = pod_a.metadata.uid.clone().unwrap_or_default();
    let pod_dir = OwnRoot::mount("memory").join(
        own.pods
            .pod_dir(swiftlet::pod::qos::QosClass::Burstable, &uid),
    );
    let limit_file = ["memory.limit_in_bytes", "memory.max"]
        .iter()
        .map(|f| pod_dir.join(f))
        .find(|f| f.exists())
        .expect("a memory limit file");
    assert_eq!(
        read_trimmed(&limit_file),
        (80u64 << 20).to_string(),
        "{}",
        limit_file.display()
    );
    // Its CPU weight too: 300m.
    let (pod_weight, want) = cpu_weight_file(
        &OwnRoot::mount("cpu").join(
            own.pods
                .pod_dir(swiftlet::pod::qos::QosClass::Burstable, &uid),
        ),
        307,
    );
    assert_eq!(read_trimmed(&pod_weight), want, "{}", pod_weight.display());

    // b goes: the level drops to a's 300m.
    node.remove_manifest("b.yaml");
    node.wait_gone("b");
    let (_, one) = cpu_weight_file(&burstable, 307);
    wait_reads(&file, &one);
    node.remove_manifest("a.yaml");
    node.wait_gone("a");
    let (_, none) = cpu_weight_file(&burstable, 2);
    wait_reads(&file, &none);
}

/// `qosReserved: {memory: 50%}` (gate on): the Burstable level's memory limit keeps half the
/// Guaranteed pods' requests free, the BestEffort level's half the Burstable pods' too, and the
/// limits follow the pods as they come and go.
#[test]
fn qos_reserved_limits_the_lower_levels_memory_as_pods_come_and_go() {
    let own = OwnRoot::new("swiftlet-qos-reserved");
    let Some(node) = own.node(
        "qos_reserved_limits_the_lower_levels_memory_as_pods_come_and_go",
        "qosreserved",
        "featureGates:\n  QOSReserved: true\nqosReserved:\n  memory: 50%\n",
    ) else {
        return;
    };
    let node_object: serde_json::Value =
        serde_json::from_str(&swiftlet_tests::http_get(node.port, "/node")).expect("the Node");
    let capacity_ki: u64 = node_object["status"]["capacity"]["memory"]
        .as_str()
        .and_then(|m| m.strip_suffix("Ki"))
        .and_then(|k| k.parse().ok())
        .expect("memory capacity in Ki");
    let capacity = capacity_ki * 1024;
    let level = |class| {
        let dir = OwnRoot::mount("memory").join(own.pods.qos_dir(class));
        ["memory.limit_in_bytes", "memory.max"]
            .iter()
            .map(|f| dir.join(f))
            .find(|f| f.exists())
            .expect("a memory limit file")
    };
    let burstable = level(swiftlet::pod::qos::QosClass::Burstable);
    let best_effort = level(swiftlet::pod::qos::QosClass::BestEffort);
    let guaranteed = with_resources(
        "g",
        "      resources:\n        limits:\n          cpu: 100m\n          memory: 64Mi\n",
        "",
    );
    let burst = with_resources(
        "b",
        "      resources:\n        requests:\n          memory: 32Mi\n",
        "",
    );
    node.write_manifest("g.yaml", &guaranteed);
    node.write_manifest("b.yaml", &burst);
    for name in ["g", "b"] {
        node.wait_pod(name, "Running", |p| {
            status::running(status::container(p, "main"))
        });
    }
    // The kernel keeps a limit in whole pages.
    let pages = |bytes: u64| (bytes / 4096 * 4096).to_string();
    // 64Mi Guaranteed: half of it kept from Burstable; 32Mi Burstable: half kept from BestEffort.
    let burstable_limit = capacity - (32 << 20);
    wait_reads(&burstable, &pages(burstable_limit));
    wait_reads(&best_effort, &pages(burstable_limit - (16 << 20)));
    // The Guaranteed pod goes: the Burstable level gets the whole of allocatable back.
    node.remove_manifest("g.yaml");
    node.wait_gone("g");
    wait_reads(&burstable, &pages(capacity));
    wait_reads(&best_effort, &pages(capacity - (16 << 20)));
}

/// The name (as `systemReservedCgroup` takes it) of a cgroup `leaf` below the test's own root,
/// and its directory below every hierarchy's mount: `<root>/<leaf>` with cgroupfs, the slice
/// `<root>.slice/<root>-<leaf>.slice` with systemd.
fn reserved_cgroup_below(own: &OwnRoot, leaf: &str) -> (String, String) {
    let driver = swiftlet_tests::driver::cgroup_driver();
    let name = match driver {
        swiftlet::cgroup::pods::CgroupDriver::Cgroupfs => format!("{}/{leaf}", own.root),
        swiftlet::cgroup::pods::CgroupDriver::Systemd => {
            let unit = own.root.trim_start_matches('/').trim_end_matches(".slice");
            format!("{}/{unit}-{leaf}.slice", own.root)
        }
    };
    let dir = swiftlet::cgroup::pods::existing_cgroup_dir(driver, &name);
    (name, dir)
}

/// Makes cgroup `dir` (below the test's own root) in the cpu, memory and pids hierarchies, with
/// the controllers enabled for it where they are cgroup v2's.
fn make_cgroup(own: &OwnRoot, dir: &str) {
    for controller in ["cpu", "memory", "pids"] {
        let mount = OwnRoot::mount(controller);
        let path = mount.join(dir);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        let parent = mount.join(own.root.trim_start_matches('/'));
        let control = parent.join("cgroup.subtree_control");
        if control.exists() {
            std::fs::write(&control, format!("+{controller}"))
                .unwrap_or_else(|e| panic!("enabling {controller} in {}: {e}", control.display()));
        }
    }
}

/// A cgroup's memory limit file (v1 or v2).
fn memory_limit_file(dir: &std::path::Path) -> std::path::PathBuf {
    ["memory.limit_in_bytes", "memory.max"]
        .iter()
        .map(|f| dir.join(f))
        .find(|f| f.exists())
        .unwrap_or_else(|| panic!("no memory limit file in {}", dir.display()))
}

#[test]
fn reserved_cgroups_are_limited_to_their_reservations_at_start() {
    let test = "reserved_cgroups_are_limited_to_their_reservations_at_start";
    if !swiftlet_tests::privileged(test) {
        return;
    }
    let own = OwnRoot::new("swiftlet-reserved");
    let (system, system_dir) = reserved_cgroup_below(&own, "sys");
    let (kube, kube_dir) = reserved_cgroup_below(&own, "kube");
    make_cgroup(&own, &system_dir);
    make_cgroup(&own, &kube_dir);
    let kube_memory = memory_limit_file(&OwnRoot::mount("memory").join(&kube_dir));
    let kube_pids = OwnRoot::mount("pids").join(&kube_dir).join("pids.max");
    let (kube_memory_before, kube_pids_before) =
        (read_trimmed(&kube_memory), read_trimmed(&kube_pids));

    let config = format!(
        "systemReserved:\n  cpu: 250m\n  memory: 100Mi\n  pid: \"300\"\n\
         kubeReserved:\n  cpu: 100m\n  memory: 64Mi\n  pid: \"50\"\n\
         systemReservedCgroup: {system}\nkubeReservedCgroup: {kube}\n\
         enforceNodeAllocatable: [pods, system-reserved, kube-reserved-compressible]\n"
    );
    let Some(_node) = own.node(test, "reserved", &config) else {
        return;
    };

    // system-reserved: weight (shares) of 250m, the memory limit, pids.max.
    let (weight, want) = cpu_weight_file(&OwnRoot::mount("cpu").join(&system_dir), 256);
    assert_eq!(read_trimmed(&weight), want, "{}", weight.display());
    let memory = memory_limit_file(&OwnRoot::mount("memory").join(&system_dir));
    assert_eq!(
        read_trimmed(&memory),
        (100u64 << 20).to_string(),
        "{}",
        memory.display()
    );
    let pids = OwnRoot::mount("pids").join(&system_dir).join("pids.max");
    assert_eq!(read_trimmed(&pids), "300", "{}", pids.display());

    // kube-reserved-compressible: the weight of 100m, nothing else.
    let (weight, want) = cpu_weight_file(&OwnRoot::mount("cpu").join(&kube_dir), 102);
    assert_eq!(read_trimmed(&weight), want, "{}", weight.display());
    assert_eq!(
        read_trimmed(&kube_memory),
        kube_memory_before,
        "{}",
        kube_memory.display()
    );
    assert_eq!(
        read_trimmed(&kube_pids),
        kube_pids_before,
        "{}",
        kube_pids.display()
    );
}

#[test]
fn a_missing_reserved_cgroup_stops_the_start_naming_it() {
    let test = "a_missing_reserved_cgroup_stops_the_start_naming_it";
    let Some(dir) = swiftlet_tests::trusted::TrustedDir::new(test, "reserved-missing") else {
        return;
    };
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let own = OwnRoot::new("swiftlet-reserved-missing");
    let (system, system_dir) = reserved_cgroup_below(&own, "absent");
    let file = own.config_file(
        "reserved-missing",
        &format!(
            "systemReserved:\n  memory: 10Mi\nsystemReservedCgroup: {system}\n\
             enforceNodeAllocatable: [pods, system-reserved]\n"
        ),
    );
    let output = Command::new(swiftlet_tests::swiftlet_bin())
        .args(["run", "--config", &file, "--runtime-endpoint", &endpoint])
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .args(["--read-only-port", "0", "--http-address", "127.0.0.1:0"])
        .arg("--grpc-socket")
        .arg(dir.path().join("grpc.sock"))
        .args(["--pleg", "relist"])
        .output()
        .expect("run swiftlet");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "started without its reserved cgroup: {stderr}"
    );
    assert!(stderr.contains("systemReservedCgroup"), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(stderr.contains(&system_dir), "{stderr}");
    // Nothing was made in its place.
    assert!(!OwnRoot::mount("memory").join(&system_dir).exists());
}

/// A cgroup's CFS quota and period as cgroup v2's `cpu.max` has them (`<quota|max> <period>`),
/// from v1's two files where the cpu controller is v1's.
fn cpu_max(dir: &std::path::Path) -> String {
    if dir.join("cpu.max").exists() {
        return read_trimmed(&dir.join("cpu.max"));
    }
    let quota = read_trimmed(&dir.join("cpu.cfs_quota_us"));
    let period = read_trimmed(&dir.join("cpu.cfs_period_us"));
    let quota = if quota == "-1" {
        "max".to_owned()
    } else {
        quota
    };
    format!("{quota} {period}")
}

/// The runtime id of container `name` of `pod`.
fn container_id(pod: &k8s_openapi::api::core::v1::Pod, name: &str) -> String {
    status::container(pod, name)
        .and_then(|c| c.container_id.clone())
        .map(|id| id.trim_start_matches("containerd://").to_owned())
        .unwrap_or_default()
}

#[test]
fn cpu_limits_become_quotas_in_the_configured_period_or_none() {
    let test = "cpu_limits_become_quotas_in_the_configured_period_or_none";
    let own = OwnRoot::new("swiftlet-qos-cfs");
    let Some(mut node) = own.node(
        test,
        "cfs",
        "featureGates:\n  CustomCPUCFSQuotaPeriod: true\ncpuCFSQuotaPeriod: 50ms\n",
    ) else {
        return;
    };
    let guaranteed = swiftlet::pod::qos::QosClass::Guaranteed;
    let running =
        |p: &k8s_openapi::api::core::v1::Pod| status::running(status::container(p, "main"));
    node.write_manifest(
        "limited.yaml",
        &with_resources("limited", &manifest::guaranteed("500m", "64Mi"), ""),
    );
    let limited = node.wait_pod("limited", "Running", running);
    let uid = limited.metadata.uid.clone().unwrap_or_default();
    // 500m of every 50ms: 25ms, for the container (CRI cpu_period/cpu_quota) and its pod.
    let container = own.container_cpu_dir(guaranteed, &uid, &container_id(&limited, "main"));
    assert_eq!(
        cpu_max(&container),
        "25000 50000",
        "{}",
        container.display()
    );
    let pod_dir = OwnRoot::mount("cpu").join(own.pods.pod_dir(guaranteed, &uid));
    assert_eq!(cpu_max(&pod_dir), "25000 50000", "{}", pod_dir.display());
    node.remove_manifest("limited.yaml");
    node.wait_gone("limited");

    // cpuCFSQuota: false: the same limit throttles nothing, in the container or its pod.
    let off = own.config_file("cfs-off", "cpuCFSQuota: false\n");
    node.restart_with(&["--config", &off]);
    node.write_manifest(
        "free.yaml",
        &with_resources("free", &manifest::guaranteed("500m", "64Mi"), ""),
    );
    let free = node.wait_pod("free", "Running", running);
    let uid = free.metadata.uid.clone().unwrap_or_default();
    let container = own.container_cpu_dir(guaranteed, &uid, &container_id(&free, "main"));
    let pod_dir = OwnRoot::mount("cpu").join(own.pods.pod_dir(guaranteed, &uid));
    for dir in [&container, &pod_dir] {
        let value = cpu_max(dir);
        assert!(value.starts_with("max "), "{}: {value}", dir.display());
    }
    node.remove_manifest("free.yaml");
    node.wait_gone("free");
}

#[test]
fn hugepages_beyond_the_nodes_pages_are_refused_and_containers_get_every_size_limited() {
    let test = "hugepages_beyond_the_nodes_pages_are_refused_and_containers_get_every_size_limited";
    let own = OwnRoot::new("swiftlet-qos-hugepages");
    let Some(node) = own.node(test, "hugepages", "") else {
        return;
    };
    let pages = swiftlet::cm::hugepages::NodeHugePages::read(std::path::Path::new(
        swiftlet::cm::hugepages::SYSFS_HUGEPAGES,
    ));
    // One 2 MiB page more than the node has (whatever it has, or a size it lacks): refused.
    let have = pages.bytes_by_size.get(&(2 << 20)).copied().unwrap_or(0);
    let want = format!("{}Mi", (have >> 20) + 2);
    let asking = format!(
        "      resources:\n        requests:\n          memory: 16Mi\n          hugepages-2Mi: {want}\n        \
         limits:\n          memory: 16Mi\n          hugepages-2Mi: {want}\n"
    );
    node.write_manifest("huge.yaml", &with_resources("huge", &asking, ""));
    let huge = node.wait_pod("huge", "Failed", |p| status::phase(p) == "Failed");
    let s = huge.status.unwrap_or_default();
    assert_eq!(
        s.reason.as_deref(),
        Some("OutOfhugepages-2Mi"),
        "{:?}",
        s.message
    );
    assert!(
        s.message
            .as_deref()
            .is_some_and(|m| m.contains(&format!("capacity: {have}"))),
        "{:?}",
        s.message
    );
    assert!(s.container_statuses.is_none(), "nothing of it was started");
    node.remove_manifest("huge.yaml");

    // A pod asking for none: every size the node has is limited to 0 in its container's
    // cgroup, where the kernel's hugetlb controller reaches it (cgroup2 with hugetlb).
    node.write_manifest(
        "plain.yaml",
        &with_resources("plain", &manifest::burstable("16Mi"), ""),
    );
    let running =
        |p: &k8s_openapi::api::core::v1::Pod| status::running(status::container(p, "main"));
    let plain = node.wait_pod("plain", "Running", running);
    let uid = plain.metadata.uid.clone().unwrap_or_default();
    let dir = swiftlet::cm::CgroupLayout::detect()
        .ok()
        .and_then(|l| l.cgroup2_root().ok().map(|r| r.to_owned()))
        .map(|root| {
            root.join(
                own.pods
                    .pod_dir(swiftlet::pod::qos::QosClass::Burstable, &uid),
            )
        });
    let limited: Vec<String> = dir
        .iter()
        .flat_map(|pod| {
            own.pods
                .container_dir_names(&container_id(&plain, "main"))
                .into_iter()
                .map(move |name| pod.join(name))
        })
        .flat_map(|container| {
            pages.sizes().into_iter().filter_map(move |size| {
                let unit = swiftlet::cm::hugepages::unit_size(size)?;
                let file = container.join(format!("hugetlb.{unit}.max"));
                file.exists().then(|| read_trimmed(&file))
            })
        })
        .collect();
    if limited.is_empty() {
        eprintln!(
            "{test}: no hugetlb controller on cgroup2 here: the containers' limits are not visible"
        );
    }
    assert!(limited.iter().all(|v| v == "0"), "{limited:?}");
    // Without a mounted v1 hugetlb hierarchy nothing is written where it would be: on the
    // cgroup tmpfs a directory would only be made, never a cgroup.
    let v1_hugetlb = std::path::Path::new("/sys/fs/cgroup/hugetlb");
    if !v1_hugetlb.join("cgroup.procs").exists() {
        let stray = v1_hugetlb.join(own.root.trim_start_matches('/'));
        assert!(!stray.exists(), "{} made", stray.display());
    }
    node.remove_manifest("plain.yaml");
    node.wait_gone("plain");
    node.wait_gone("huge");
}
