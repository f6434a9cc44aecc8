//! Pressure Stall Information on the real kernel: a trigger fires when a memory-limited cgroup
//! thrashes and ends when the cgroup goes; and a pod run through containerd shows up in the
//! agent's `/metrics` with its KEP-4205 `container_pressure_*` series, which go with the pod.
//! Needs root (and, for the pod, the private containerd `cargo xtask test` starts).
#![expect(clippy::print_stderr, reason = "tests say why they skip")]

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use swiftlet::cm::psi::{PsiError, PsiResource, PsiTrigger};
use swiftlet_tests::{
    EVENT_WAIT, TestCgroup, manifest::PodManifest, node::Node, privileged, runtime_endpoint,
};

/// A shell loop that thrashes the page cache of a memory limit smaller than its file: the file is
/// written from inside the cgroup (so its pages are charged there), then read over and over,
/// each read reclaiming what the previous one brought in.
fn thrash(file: &Path) -> String {
    format!(
        "dd if=/dev/zero of={f} bs=1M count=64 2>/dev/null; \
         while :; do cat {f} > /dev/null; done",
        f = file.display()
    )
}

fn psi_enabled(test: &str) -> bool {
    let enabled = PsiResource::Memory.proc_path().exists();
    if !enabled {
        eprintln!("skipped {test}: PSI is disabled on this kernel (boot with psi=1)");
    }
    enabled
}

#[tokio::test]
async fn a_memory_trigger_fires_on_thrashing_and_ends_with_its_cgroup() {
    let test = "a_memory_trigger_fires_on_thrashing_and_ends_with_its_cgroup";
    if !privileged(test) || !psi_enabled(test) {
        return;
    }
    let cgroup = TestCgroup::with_memory_limit("psi", 16 << 20);
    let mut trigger = PsiTrigger::new(
        &cgroup.dir.join(PsiResource::Memory.file_name()),
        false,
        Duration::from_millis(100),
        Duration::from_secs(2),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(trigger.window(), Duration::from_secs(2));
    assert_eq!(trigger.stall(), Duration::from_millis(100));

    // On disk, not tmpfs: page cache is reclaimable, shmem without swap is not.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("psi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut child = cgroup.spawn(Command::new("sh").args(["-c", &thrash(&dir.join("big"))]));

    let fired = tokio::time::timeout(EVENT_WAIT, trigger.fired()).await;
    let pressure = std::fs::read_to_string(cgroup.dir.join("memory.pressure")).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    match fired {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("the trigger failed: {e}"),
        Err(_) => {
            panic!("the trigger never fired within {EVENT_WAIT:?}; memory.pressure:\n{pressure}")
        }
    }

    // Removing the cgroup ends the trigger (POLLERR); a signal still pending may come first.
    drop(cgroup);
    let ended = tokio::time::timeout(EVENT_WAIT, async {
        loop {
            match trigger.fired().await {
                Ok(()) => continue,
                Err(e) => return e,
            }
        }
    })
    .await
    .expect("the trigger ends when its cgroup is removed");
    assert!(matches!(ended, PsiError::Ended { .. }), "{ended}");
    assert!(matches!(trigger.fired().await, Err(PsiError::Ended { .. })));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The value of the sample whose name and labels are exactly `series`, if exposed.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[test]
fn pods_and_containers_expose_their_pressure() {
    let test = "pods_and_containers_expose_their_pressure";
    if !privileged(test) || !psi_enabled(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    // Only a memory threshold: the default disk ones would evict the pod on a nearly full
    // development disk, which is not what this test is about.
    let node = Node::start_with(
        "psi",
        &endpoint,
        &["--eviction-hard", "memory.available<1Mi"],
    );
    // Limited to 16 MiB and thrashing its page cache, so its memory pressure is not zero.
    node.write_manifest(
        "thrash.yaml",
        &PodManifest::new("thrash")
            .grace(1)
            .shell(
                "main",
                &thrash(Path::new("/tmp/big")),
                "      resources:\n        limits:\n          memory: 16Mi\n",
            )
            .yaml(),
    );
    let pod_name = format!("thrash-{}", node.name);
    let labels = |container: &str| {
        format!(r#"{{container="{container}",namespace="default",pod="{pod_name}"}}"#)
    };
    let main = format!(
        "container_pressure_memory_waiting_seconds_total{}",
        labels("main")
    );
    let deadline = Instant::now() + EVENT_WAIT;
    let metrics = loop {
        let metrics = node.metrics();
        if sample(&metrics, &main).is_some_and(|v| v > 0.0) {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "no {main} above 0 within {EVENT_WAIT:?}; the pressure series:\n{}\nthe pod: {:#?}\n\
             the agent's log:\n{}",
            metrics
                .lines()
                .filter(|l| l.starts_with("container_pressure_"))
                .collect::<Vec<_>>()
                .join("\n"),
            node.pod("thrash").map(|p| p.status),
            node.log_lines().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    for resource in ["cpu", "memory", "io"] {
        for container in ["", "main"] {
            let series = format!(
                "container_pressure_{resource}_waiting_seconds_total{}",
                labels(container)
            );
            assert!(
                sample(&metrics, &series).is_some(),
                "{series} in\n{metrics}"
            );
        }
    }
    for resource in ["memory", "io"] {
        let series = format!(
            "container_pressure_{resource}_stalled_seconds_total{}",
            labels("main")
        );
        assert!(sample(&metrics, &series).is_some(), "{series}");
    }
    // The pod's cgroup holds the container's, whose stall is in the pod's total by the next
    // scrape.
    let pod_level = format!(
        "container_pressure_memory_waiting_seconds_total{}",
        labels("")
    );
    let pod_waiting = sample(&node.metrics(), &pod_level);
    assert!(
        pod_waiting.is_some_and(|v| v > 0.0),
        "{pod_level}: {pod_waiting:?}"
    );
    // Only the pod and its one container: the sandbox's pause container is no container.
    let series_of_pod = metrics
        .lines()
        .filter(|l| l.starts_with("container_pressure_memory_waiting_seconds_total{"))
        .filter(|l| l.contains(&format!("pod=\"{pod_name}\"")))
        .count();
    assert_eq!(series_of_pod, 2, "{metrics}");

    // The series go with the pod.
    node.remove_manifest("thrash.yaml");
    node.wait_gone("thrash");
    let deadline = Instant::now() + EVENT_WAIT;
    while node.metrics().contains(&format!("pod=\"{pod_name}\"")) {
        assert!(
            Instant::now() < deadline,
            "the pod's pressure series outlived it"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
