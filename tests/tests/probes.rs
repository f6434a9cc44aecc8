//! Probes and lifecycle hooks over the real container runtime: exec probes through CRI ExecSync,
//! httpGet and tcpSocket probes against a busybox `httpd` in a hostNetwork pod on 127.0.0.1,
//! liveness restarts with the crash-loop back-off, readiness flipping the Ready condition,
//! postStart failures and preStop ordering. Statuses are read through `/pods` as a user reads
//! them. Needs root and the private containerd that `cargo xtask test` starts.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use swiftlet_tests::{
    manifest::{container, pod},
    node::{Node, status},
};

fn node(test: &str, name: &str) -> Option<Node> {
    Node::for_test(test, name, &[])
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn ready(pod: &Pod, container: &str) -> bool {
    status::container(pod, container).is_some_and(|c| c.ready)
}

fn restarts(pod: &Pod, container: &str) -> i32 {
    status::container(pod, container).map_or(0, |c| c.restart_count)
}

/// The series of `prober_probe_total` for one container and result.
fn probe_count(node: &Node, pod: &Pod, container: &str, kind: &str, result: &str) -> f64 {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    node.probe_metrics()
        .lines()
        .filter(|l| {
            l.starts_with("prober_probe_total{")
                && l.contains(&format!("container=\"{container}\""))
                && l.contains(&format!("pod=\"{name}\""))
                && l.contains(&format!("probe_type=\"{kind}\""))
                && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn readiness(probe: &str) -> String {
    format!(
        "      readinessProbe:
{probe}        periodSeconds: 1
        failureThreshold: 1
"
    )
}

#[test]
fn each_probe_kind_passes_and_fails() {
    let Some(node) = node("each_probe_kind_passes_and_fails", "probes") else {
        return;
    };
    let port = free_port();
    let closed = free_port();
    let serve = format!(
        "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 127.0.0.1:{port} -h /www"
    );
    let sleep = "exec sleep 3600";
    let containers = [
        container(
            "server",
            &serve,
            &format!(
                "      ports:
        - name: web
          containerPort: {port}
{}",
                readiness(
                    "        httpGet:
          host: 127.0.0.1
          path: /index.html
          port: web
"
                )
            ),
        ),
        container(
            "http-missing",
            sleep,
            &readiness(&format!(
                "        httpGet:
          host: 127.0.0.1
          path: /missing
          port: {port}
"
            )),
        ),
        container(
            "tcp-open",
            sleep,
            &readiness(&format!(
                "        tcpSocket:
          host: 127.0.0.1
          port: {port}
"
            )),
        ),
        container(
            "tcp-closed",
            sleep,
            &readiness(&format!(
                "        tcpSocket:
          host: 127.0.0.1
          port: {closed}
"
            )),
        ),
        container(
            "exec-ok",
            sleep,
            &readiness(
                "        exec:
          command: [\"true\"]
",
            ),
        ),
        container(
            "exec-fail",
            sleep,
            &readiness(
                "        exec:
          command: [\"false\"]
",
            ),
        ),
        container(
            "exec-slow",
            sleep,
            &readiness(
                "        exec:
          command: [\"sleep\", \"10\"]
        timeoutSeconds: 1
",
            ),
        ),
    ];
    node.write_manifest(
        "probes.yaml",
        &pod(
            "probes",
            "  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n",
            &containers,
        ),
    );
    let passing = ["server", "tcp-open", "exec-ok"];
    let failing = ["http-missing", "tcp-closed", "exec-fail", "exec-slow"];
    node.wait_pod("probes", "the passing probes ready", |p| {
        passing.iter().all(|c| ready(p, c))
    });
    // Failing ones must have been probed and judged, not merely not probed yet.
    let p = node.wait_pod("probes", "every failing probe judged", |p| {
        failing
            .iter()
            .all(|c| probe_count(&node, p, c, "Readiness", "failed") >= 1.0)
    });
    for c in failing {
        assert!(
            !ready(&p, c),
            "{c} passed its failing probe: {:#?}",
            p.status
        );
        assert!(
            status::running(status::container(&p, c)),
            "{c} is not running"
        );
    }
    for c in passing {
        assert!(ready(&p, c), "{c} is no longer ready: {:#?}", p.status);
        assert!(probe_count(&node, &p, c, "Readiness", "successful") >= 1.0);
        assert_eq!(probe_count(&node, &p, c, "Readiness", "failed"), 0.0, "{c}");
    }
    assert_eq!(
        status::condition(&p, "ContainersReady").as_deref(),
        Some("False")
    );
    assert_eq!(status::condition(&p, "Ready").as_deref(), Some("False"));
    // Readiness never restarts anything.
    assert!(failing.iter().all(|c| restarts(&p, c) == 0));
    assert!(
        node.probe_metrics()
            .contains("prober_probe_duration_seconds_bucket{container=\"server\""),
        "no probe duration exported"
    );
}

#[test]
fn readiness_flips_the_ready_condition() {
    let Some(node) = node("readiness_flips_the_ready_condition", "ready") else {
        return;
    };
    node.write_manifest(
        "flip.yaml",
        &pod(
            "flip",
            "  terminationGracePeriodSeconds: 1\n",
            &[container(
                "main",
                "sleep 3; touch /tmp/ready; sleep 8; rm /tmp/ready; exec sleep 3600",
                &readiness(
                    "        exec:
          command: [\"test\", \"-f\", \"/tmp/ready\"]
",
                ),
            )],
        ),
    );
    let running = node.wait_pod("flip", "running", |p| {
        status::running(status::container(p, "main"))
    });
    if !ready(&running, "main") {
        assert_eq!(
            status::condition(&running, "Ready").as_deref(),
            Some("False")
        );
    }
    let up = node.wait_pod("flip", "Ready", |p| {
        status::condition(p, "Ready").as_deref() == Some("True")
    });
    assert!(ready(&up, "main"));
    assert_eq!(
        status::condition(&up, "ContainersReady").as_deref(),
        Some("True")
    );
    let down = node.wait_pod("flip", "not Ready again", |p| {
        status::condition(p, "Ready").as_deref() == Some("False")
    });
    assert!(!ready(&down, "main"));
    assert!(status::running(status::container(&down, "main")));
    assert_eq!(restarts(&down, "main"), 0);
}

#[test]
fn liveness_failure_restarts_the_container_with_back_off() {
    let Some(node) = node(
        "liveness_failure_restarts_the_container_with_back_off",
        "live",
    ) else {
        return;
    };
    node.write_manifest(
        "live.yaml",
        &pod(
            "live",
            "  terminationGracePeriodSeconds: 1\n",
            &[container(
                "main",
                "touch /tmp/alive; sleep 2; rm /tmp/alive; exec sleep 3600",
                "      livenessProbe:
        exec:
          command: [\"test\", \"-f\", \"/tmp/alive\"]
        periodSeconds: 1
        failureThreshold: 2
",
            )],
        ),
    );
    let first = node.wait_pod("live", "restarted after failing liveness", |p| {
        restarts(p, "main") >= 1
    });
    let last = status::container(&first, "main")
        .and_then(|c| c.last_state.as_ref()?.terminated.as_ref())
        .expect("the killed instance's state");
    // Killed, not exited: `sleep 3600` would have run on.
    assert_eq!(last.exit_code, 137, "{last:#?}");
    // Killed again, the next restart waits for the crash-loop back-off.
    let waiting = node.wait_pod("live", "in CrashLoopBackOff", |p| {
        status::waiting_reason(status::container(p, "main")).as_deref() == Some("CrashLoopBackOff")
    });
    assert!(restarts(&waiting, "main") >= 1);
    let again = node.wait_pod("live", "restarted twice", |p| restarts(p, "main") >= 2);
    assert!(probe_count(&node, &again, "main", "Liveness", "failed") >= 4.0);
}

#[test]
fn a_failing_post_start_hook_kills_the_container() {
    let Some(node) = node("a_failing_post_start_hook_kills_the_container", "poststart") else {
        return;
    };
    node.write_manifest(
        "hook.yaml",
        &pod(
            "hook",
            "  restartPolicy: Never\n  terminationGracePeriodSeconds: 1\n",
            &[container(
                "main",
                "exec sleep 3600",
                "      lifecycle:
        postStart:
          exec:
            command: [\"sh\", \"-c\", \"echo hook broke; exit 3\"]
",
            )],
        ),
    );
    let p = node.wait_pod("hook", "the container killed", |p| {
        status::terminated(status::container(p, "main")).is_some()
    });
    let (_, code) = status::terminated(status::container(&p, "main")).expect("terminated");
    assert_eq!(code, 137, "{:#?}", p.status);
    let done = node.wait_pod("hook", "Failed", |p| status::phase(p) == "Failed");
    assert_eq!(restarts(&done, "main"), 0);
    let log = node.log_lines().join("\n");
    assert!(
        log.contains("FailedPostStartHook") && log.contains("hook broke"),
        "the agent's log does not tell why: {log}"
    );
}

#[test]
fn pre_stop_runs_before_the_stop_signal() {
    let Some(node) = node("pre_stop_runs_before_the_stop_signal", "prestop") else {
        return;
    };
    node.write_manifest(
        "stop.yaml",
        &pod(
            "stop",
            "  terminationGracePeriodSeconds: 20\n",
            &[container(
                "main",
                "trap 'echo got-term; exit 0' TERM; echo started; while true; do sleep 0.2; done",
                "      lifecycle:
        preStop:
          exec:
            command: [\"sh\", \"-c\", \"echo pre-stop > /proc/1/fd/1\"]
",
            )],
        ),
    );
    let p = node.wait_pod("stop", "running", |p| {
        status::running(status::container(p, "main"))
    });
    let meta = &p.metadata;
    let log = node.pod_logs_dir().join(format!(
        "{}_{}_{}/main/0.log",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default()
    ));
    node.remove_manifest("stop.yaml");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lines = Vec::new();
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // CRI log lines: `<time> <stream> <P|F> <message>`.
        lines = text
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3).map(str::to_owned))
            .collect();
        if lines.iter().any(|l| l == "got-term") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let at = |what: &str| lines.iter().position(|l| l == what);
    assert!(
        matches!((at("started"), at("pre-stop"), at("got-term")), (Some(a), Some(b), Some(c)) if a < b && b < c),
        "expected started, pre-stop, got-term in that order in {}: {lines:?}",
        log.display()
    );
    node.wait_gone("stop");
}

#[test]
fn startup_gates_readiness_and_a_failed_startup_restarts() {
    let Some(node) = node(
        "startup_gates_readiness_and_a_failed_startup_restarts",
        "startup",
    ) else {
        return;
    };
    let startup = |file: &str| {
        format!(
            "      startupProbe:
        exec:
          command: [\"test\", \"-f\", \"{file}\"]
        periodSeconds: 1
        failureThreshold: 4
      readinessProbe:
        exec:
          command: [\"true\"]
        periodSeconds: 1
"
        )
    };
    node.write_manifest(
        "startup.yaml",
        &pod(
            "startup",
            "  terminationGracePeriodSeconds: 1\n",
            &[
                container(
                    "slow",
                    "sleep 3; touch /tmp/up; exec sleep 3600",
                    &startup("/tmp/up"),
                ),
                container("never", "exec sleep 3600", &startup("/tmp/never")),
            ],
        ),
    );
    let early = node.wait_pod("startup", "slow running", |p| {
        status::running(status::container(p, "slow"))
    });
    let c = status::container(&early, "slow").expect("slow");
    if c.started != Some(true) {
        assert!(!c.ready, "ready before started: {c:#?}");
    }
    let up = node.wait_pod("startup", "slow started and ready", |p| {
        status::container(p, "slow").is_some_and(|c| c.started == Some(true) && c.ready)
    });
    assert_eq!(restarts(&up, "slow"), 0);
    // Readiness never ran for a container that has not started.
    assert_eq!(
        probe_count(&node, &up, "never", "Readiness", "successful"),
        0.0
    );
    let never = node.wait_pod("startup", "never restarted", |p| restarts(p, "never") >= 1);
    let c = status::container(&never, "never").expect("never");
    assert!(!c.ready && c.started != Some(true), "{c:#?}");
    assert!(probe_count(&node, &never, "never", "Startup", "failed") >= 4.0);
}
