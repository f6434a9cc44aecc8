use std::{collections::HashSet, sync::Mutex};

use super::*;
use crate::cri::fake::{
    FakeRuntime,
    fixtures::{IMAGE, container_config, pod_sandbox_config},
};

/// Pods whose content (and runtime) may go.
#[derive(Default)]
struct Pods {
    gone: Mutex<HashSet<String>>,
    terminated: Mutex<HashSet<String>>,
}

impl PodStateProvider for Pods {
    fn should_pod_content_be_removed(&self, uid: &PodUid) -> bool {
        self.gone.lock().expect("lock").contains(&uid.0)
    }
    fn should_pod_runtime_be_removed(&self, uid: &PodUid) -> bool {
        self.should_pod_content_be_removed(uid)
            || self.terminated.lock().expect("lock").contains(&uid.0)
    }
}

struct Pod {
    sandbox: String,
    config: cri::PodSandboxConfig,
}

async fn pod(fake: &FakeRuntime, uid: &str, logs: &Path) -> Pod {
    let mut config = pod_sandbox_config(uid, &format!("pod-{uid}"), "ns", 0);
    config.log_directory = logs
        .join(format!("ns_pod-{uid}_{uid}"))
        .display()
        .to_string();
    std::fs::create_dir_all(&config.log_directory).expect("mkdir");
    let sandbox = fake
        .run_pod_sandbox(config.clone(), "")
        .await
        .expect("sandbox");
    Pod { sandbox, config }
}

/// Starts instance `attempt` of container `name`, with a log file; exits it unless `keep_running`.
async fn instance(
    fake: &FakeRuntime,
    pod: &Pod,
    name: &str,
    attempt: u32,
    keep_running: bool,
) -> String {
    fake.add_image(IMAGE);
    let config = container_config(&pod.config, name, IMAGE, attempt, 0);
    let log = Path::new(&pod.config.log_directory).join(&config.log_path);
    std::fs::create_dir_all(log.parent().expect("dir")).expect("mkdir");
    std::fs::write(&log, "output\n").expect("log");
    std::fs::write(format!("{}.20240101-000000.gz", log.display()), "old").expect("rotated");
    let id = fake
        .create_container(&pod.sandbox, config, pod.config.clone())
        .await
        .expect("create");
    fake.start_container(&id).await.expect("start");
    if !keep_running {
        fake.exit_container(&id, 1);
    }
    id
}

fn gc(
    fake: &Arc<FakeRuntime>,
    pods: &Arc<Pods>,
    policy: ContainerGcPolicy,
    logs: &Path,
) -> ContainerGc {
    let clock = {
        let fake = fake.clone();
        Arc::new(move || fake.now())
    };
    ContainerGc::new(fake.clone(), pods.clone(), policy, logs.to_owned()).with_clock(clock)
}

#[tokio::test]
async fn a_crash_looping_container_keeps_its_newest_dead_instance_and_its_logs() {
    let fake = Arc::new(FakeRuntime::new());
    let logs = tempfile::tempdir().expect("tmp");
    let p = pod(&fake, "u1", logs.path()).await;
    let mut ids = Vec::new();
    for attempt in 0..3 {
        ids.push(instance(&fake, &p, "app", attempt, false).await);
    }
    let running = instance(&fake, &p, "app", 3, true).await;
    let other = instance(&fake, &p, "sidecar", 0, false).await;
    let pods = Arc::new(Pods::default());
    let outcome = gc(&fake, &pods, ContainerGcPolicy::default(), logs.path())
        .collect(true, false)
        .await
        .expect("gc");
    assert_eq!(outcome.containers, 2);
    assert_eq!(outcome.sandboxes, 0);
    assert_eq!(outcome.log_dirs, 0);
    let left: HashSet<String> = fake.container_ids().into_iter().collect();
    assert_eq!(left, HashSet::from([ids[2].clone(), running, other]));
    let app_logs = Path::new(&p.config.log_directory).join("app");
    let mut files: Vec<String> = std::fs::read_dir(&app_logs)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    // Instances 0 and 1 went with their rotated files; 2 (the `previous` one) and 3 stay.
    assert_eq!(
        files,
        [
            "2.log",
            "2.log.20240101-000000.gz",
            "3.log",
            "3.log.20240101-000000.gz"
        ]
    );
}

#[tokio::test]
async fn a_removed_pod_loses_its_containers_sandboxes_and_log_directory() {
    let fake = Arc::new(FakeRuntime::new());
    let logs = tempfile::tempdir().expect("tmp");
    let p = pod(&fake, "u1", logs.path()).await;
    instance(&fake, &p, "app", 0, false).await;
    fake.stop_pod_sandbox(&p.sandbox).await.expect("stop");
    let pods = Arc::new(Pods::default());
    pods.gone.lock().expect("lock").insert("u1".into());
    // Until the sources are ready nothing is known to be gone.
    let collector = gc(&fake, &pods, ContainerGcPolicy::default(), logs.path());
    let outcome = collector.collect(false, false).await.expect("gc");
    assert_eq!(
        (outcome.containers, outcome.sandboxes, outcome.log_dirs),
        (0, 0, 0)
    );
    let outcome = collector.collect(true, false).await.expect("gc");
    assert_eq!(
        (outcome.containers, outcome.sandboxes, outcome.log_dirs),
        (1, 1, 1)
    );
    assert!(fake.container_ids().is_empty());
    assert!(fake.sandbox_ids().is_empty());
    assert!(!Path::new(&p.config.log_directory).exists());
}

#[tokio::test]
async fn a_live_pod_keeps_its_newest_sandbox_and_any_with_containers() {
    let fake = Arc::new(FakeRuntime::new());
    let logs = tempfile::tempdir().expect("tmp");
    let first = pod(&fake, "u1", logs.path()).await;
    fake.stop_pod_sandbox(&first.sandbox).await.expect("stop");
    let mut second_config = first.config.clone();
    if let Some(m) = second_config.metadata.as_mut() {
        m.attempt = 1;
    }
    let second = fake
        .run_pod_sandbox(second_config.clone(), "")
        .await
        .expect("run");
    let second = Pod {
        sandbox: second,
        config: second_config.clone(),
    };
    instance(&fake, &second, "app", 0, false).await;
    fake.stop_pod_sandbox(&second.sandbox).await.expect("stop");
    let mut third_config = second_config;
    if let Some(m) = third_config.metadata.as_mut() {
        m.attempt = 2;
    }
    let third = fake.run_pod_sandbox(third_config, "").await.expect("run");
    fake.stop_pod_sandbox(&third).await.expect("stop");
    let pods = Arc::new(Pods::default());
    let outcome = gc(&fake, &pods, ContainerGcPolicy::default(), logs.path())
        .collect(true, false)
        .await
        .expect("gc");
    // The first has no container and is not the newest; the second still has its dead
    // container; the third is the newest.
    assert_eq!(outcome.sandboxes, 1);
    let left: HashSet<String> = fake.sandbox_ids().into_iter().collect();
    assert_eq!(left, HashSet::from([second.sandbox, third]));
}

#[tokio::test]
async fn the_node_wide_limit_shares_out_then_cuts_the_oldest() {
    let fake = Arc::new(FakeRuntime::new());
    let logs = tempfile::tempdir().expect("tmp");
    let a = pod(&fake, "ua", logs.path()).await;
    let b = pod(&fake, "ub", logs.path()).await;
    let mut a_ids = Vec::new();
    let mut b_ids = Vec::new();
    for attempt in 0..3 {
        a_ids.push(instance(&fake, &a, "app", attempt, false).await);
        b_ids.push(instance(&fake, &b, "app", attempt, false).await);
    }
    let pods = Arc::new(Pods::default());
    let policy = ContainerGcPolicy {
        min_age: Duration::ZERO,
        max_per_pod_container: -1,
        max_containers: 3,
    };
    let outcome = gc(&fake, &pods, policy, logs.path())
        .collect(true, false)
        .await
        .expect("gc");
    // 3 / 2 units = 1 each: the newest of each unit stays.
    assert_eq!(outcome.containers, 4);
    let left: HashSet<String> = fake.container_ids().into_iter().collect();
    assert_eq!(left, HashSet::from([a_ids[2].clone(), b_ids[2].clone()]));

    let policy = ContainerGcPolicy {
        max_containers: 1,
        ..policy
    };
    gc(&fake, &pods, policy, logs.path())
        .collect(true, false)
        .await
        .expect("gc");
    // Still one per unit, then the oldest overall go.
    assert_eq!(fake.container_ids(), [b_ids[2].clone()]);
}

#[tokio::test]
async fn young_dead_containers_and_terminated_pods_wait() {
    let fake = Arc::new(FakeRuntime::new());
    let logs = tempfile::tempdir().expect("tmp");
    let p = pod(&fake, "u1", logs.path()).await;
    for attempt in 0..3 {
        instance(&fake, &p, "app", attempt, false).await;
    }
    let pods = Arc::new(Pods::default());
    let policy = ContainerGcPolicy {
        min_age: Duration::from_secs(60),
        ..ContainerGcPolicy::default()
    };
    let collector = gc(&fake, &pods, policy, logs.path());
    assert_eq!(
        collector.collect(true, false).await.expect("gc").containers,
        0
    );
    fake.advance_clock(Duration::from_secs(61));
    assert_eq!(
        collector.collect(true, false).await.expect("gc").containers,
        2
    );
    // A terminated pod's (its sandbox stopped) last instance goes only under disk pressure.
    fake.stop_pod_sandbox(&p.sandbox).await.expect("stop");
    pods.terminated.lock().expect("lock").insert("u1".into());
    assert_eq!(
        collector.collect(true, false).await.expect("gc").containers,
        0
    );
    assert_eq!(
        collector.collect(true, true).await.expect("gc").containers,
        1
    );
    assert!(fake.container_ids().is_empty());
}

#[test]
fn log_directory_names_give_the_pod_uid() {
    assert_eq!(
        pod_uid_of_log_dir("kube-system_coredns-abc_1234-5678"),
        Some(PodUid("1234-5678".into()))
    );
    assert_eq!(pod_uid_of_log_dir("nounderscore"), None);
    assert_eq!(pod_uid_of_log_dir("ns_name_"), None);
}

#[tokio::test]
async fn a_pod_the_runtime_still_runs_is_never_gone() {
    let fake = Arc::new(FakeRuntime::new());
    let logs = tempfile::tempdir().expect("tmp");
    let p = pod(&fake, "u1", logs.path()).await;
    let dead = instance(&fake, &p, "init", 0, false).await;
    let running = instance(&fake, &p, "app", 0, true).await;
    // The kubelet does not know the pod (yet): only the running container protects it.
    let pods = Arc::new(Pods::default());
    pods.gone.lock().expect("lock").insert("u1".into());
    let collector = gc(&fake, &pods, ContainerGcPolicy::default(), logs.path());
    let outcome = collector.collect(true, true).await.expect("gc");
    assert_eq!(outcome, GcOutcome::default());
    assert_eq!(fake.container_ids().len(), 2);
    assert!(Path::new(&p.config.log_directory).exists());
    // Once it stops, it goes.
    fake.stop_pod_sandbox(&p.sandbox).await.expect("stop");
    let outcome = collector.collect(true, false).await.expect("gc");
    assert_eq!(
        (outcome.containers, outcome.sandboxes, outcome.log_dirs),
        (2, 1, 1)
    );
    assert!(!fake.container_ids().contains(&dead));
    assert!(!fake.container_ids().contains(&running));
}
