use crate::testing;
use std::sync::atomic::{AtomicI64, Ordering};

use k8s_openapi::{
    api::core::v1::{Container, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity,
};

use super::*;
use crate::eviction::{
    local_storage,
    logic::Observation,
    rank::PodUsage,
    thresholds::{Operator, ThresholdValue, Wakeups},
};

const MI: i64 = 1 << 20;

fn pod(name: &str, memory: Option<&str>, priority_class: Option<&str>) -> Arc<Pod> {
    let limits = memory.map(|m| {
        std::collections::BTreeMap::from([
            ("memory".to_owned(), Quantity(m.into())),
            ("cpu".to_owned(), Quantity("100m".into())),
        ])
    });
    testing::pod()
        .named("default", name, &format!("uid-{name}"))
        .spec(|s| s.priority_class_name = priority_class.map(Into::into))
        .grace_period(30)
        .container(Container {
            resources: Some(ResourceRequirements {
                requests: limits.clone(),
                limits,
                ..Default::default()
            }),
            ..testing::container("main")
        })
        .arc()
}

#[derive(Default)]
struct Recorder {
    evicted: Mutex<Vec<(String, i64, String)>>,
}

impl Evictor for Recorder {
    fn evict(&self, pod: &Arc<Pod>, grace_secs: i64, message: String) -> oneshot::Receiver<()> {
        self.evicted.lock().expect("lock").push((
            pod.metadata.name.clone().unwrap_or_default(),
            grace_secs,
            message,
        ));
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(());
        rx
    }
}

struct Fixture {
    manager: Arc<EvictionManager>,
    available: Arc<AtomicI64>,
    recorder: Arc<Recorder>,
}

fn threshold(value: i64, grace: Duration) -> Threshold {
    Threshold {
        signal: Signal::AllocatableMemoryAvailable,
        operator: Operator::LessThan,
        value: ThresholdValue::Quantity(value),
        grace_period: grace,
        min_reclaim: None,
        text: format!("allocatableMemory.available<{}Mi", value / MI),
    }
}

fn fixture(thresholds: Vec<Threshold>, transition: Duration, pods: Vec<Arc<Pod>>) -> Fixture {
    let available = Arc::new(AtomicI64::new(900 * MI));
    let recorder = Arc::new(Recorder::default());
    let observe = {
        let available = available.clone();
        move || {
            Observations::from([(
                Signal::AllocatableMemoryAvailable,
                Observation {
                    available: available.load(Ordering::SeqCst),
                    capacity: 1024 * MI,
                },
            )])
        }
    };
    let usage = |pods: &[Arc<Pod>]| {
        pods.iter()
            .map(|p| {
                let ws = match p.metadata.name.as_deref() {
                    Some("besteffort") => 150 * MI,
                    _ => 100 * MI,
                };
                (
                    pod_uid(p),
                    PodUsage {
                        memory_working_set: Some(ws),
                        containers: vec![("main".into(), ws)],
                        processes: Some(1),
                        disk_bytes: Some(0),
                    },
                )
            })
            .collect()
    };
    let (manager, _waker, _rx) = EvictionManager::new(
        EvictionConfig {
            thresholds,
            max_pod_grace_period_secs: 10,
            pressure_transition_period: transition,
            monitoring_period: Duration::from_secs(10),
            wakeups: Wakeups::ALL,
        },
        Sources {
            observe: Box::new(observe),
            active_pods: Box::new(move || pods.clone()),
            pod_usage: Box::new(usage),
            reclaim_disk: Box::new(|| {}),
            // Every emptyDir holds 2 MiB.
            empty_dir_usage: Box::new(|pod: &Pod| {
                pod.spec
                    .iter()
                    .flat_map(|s| s.volumes.iter().flatten())
                    .map(|v| (v.name.clone(), 2 << 20))
                    .collect()
            }),
            // Every container has a 3 MiB writable layer and 1 MiB of logs.
            container_storage: Box::new(|pods: Vec<Arc<Pod>>| {
                let measured = pods
                    .iter()
                    .map(|p| {
                        let containers = crate::pod::spec::containers(p)
                            .iter()
                            .map(|c| local_storage::ContainerStorage {
                                name: c.name.clone(),
                                rootfs_bytes: Some(3 << 20),
                                logs_bytes: 1 << 20,
                            })
                            .collect();
                        (pod_uid(p), containers)
                    })
                    .collect();
                Box::pin(async move { measured })
            }),
            evictor: recorder.clone(),
        },
        EvictionMetrics::register(&Registry::new()).expect("metrics"),
    );
    Fixture {
        manager,
        available,
        recorder,
    }
}

fn wake() -> Wake {
    Wake {
        source: WakeSource::Memcg,
        at: Instant::now(),
    }
}

#[test]
fn a_hard_threshold_evicts_the_best_effort_pod_first_at_once() {
    let f = fixture(
        vec![threshold(200 * MI, Duration::ZERO)],
        Duration::from_secs(300),
        vec![
            pod("guaranteed", Some("300Mi"), None),
            pod("besteffort", None, None),
        ],
    );
    assert!(f.manager.synchronize(wake()).is_none(), "no pressure yet");
    assert!(f.manager.conditions().borrow().is_empty());
    f.available.store(150 * MI, Ordering::SeqCst);
    let mut decisions = f.manager.decisions();
    assert!(f.manager.synchronize(wake()).is_some());
    let evicted = f.recorder.evicted.lock().expect("lock").clone();
    assert_eq!(evicted.len(), 1, "one pod per round");
    let (name, grace, message) = &evicted[0];
    assert_eq!(name, "besteffort");
    assert_eq!(*grace, 0, "hard thresholds grant no grace period");
    assert!(
        message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 200Mi, available: 150Mi. "
        ),
        "{message}"
    );
    assert!(
        f.manager
            .conditions()
            .borrow()
            .contains(&NodeCondition::MemoryPressure)
    );
    let d = decisions.try_recv().expect("a decision was published");
    assert_eq!(d.source, WakeSource::Memcg);
    assert_eq!(d.signal, Some(Signal::AllocatableMemoryAvailable));
    assert!(d.woke <= d.decided);
}

#[test]
fn a_soft_threshold_waits_its_grace_period_and_caps_the_pod_grace() {
    let grace = Duration::from_millis(300);
    let f = fixture(
        vec![threshold(200 * MI, grace)],
        Duration::from_secs(300),
        vec![pod("besteffort", None, None)],
    );
    f.available.store(150 * MI, Ordering::SeqCst);
    assert!(
        f.manager.synchronize(wake()).is_none(),
        "within the grace period"
    );
    // The condition is reported at once, before any eviction.
    assert!(
        f.manager
            .conditions()
            .borrow()
            .contains(&NodeCondition::MemoryPressure)
    );
    std::thread::sleep(grace);
    assert!(f.manager.synchronize(wake()).is_some(), "grace period over");
    let evicted = f.recorder.evicted.lock().expect("lock").clone();
    assert_eq!(
        evicted[0].1, 10,
        "min(pod's 30 s, evictionMaxPodGracePeriod 10 s)"
    );
}

#[test]
fn pressure_that_ends_within_the_grace_period_evicts_nothing_and_the_condition_lingers() {
    let grace = Duration::from_millis(300);
    let transition = Duration::from_millis(600);
    let f = fixture(
        vec![threshold(200 * MI, grace)],
        transition,
        vec![pod("besteffort", None, None)],
    );
    f.available.store(150 * MI, Ordering::SeqCst);
    assert!(f.manager.synchronize(wake()).is_none());
    f.available.store(900 * MI, Ordering::SeqCst);
    std::thread::sleep(grace);
    assert!(f.manager.synchronize(wake()).is_none(), "relieved in time");
    assert!(f.recorder.evicted.lock().expect("lock").is_empty());
    assert!(
        f.manager
            .conditions()
            .borrow()
            .contains(&NodeCondition::MemoryPressure),
        "kept for the transition period"
    );
    std::thread::sleep(transition);
    assert!(f.manager.synchronize(wake()).is_none());
    assert!(
        f.manager.conditions().borrow().is_empty(),
        "cleared after it"
    );
    // A new episode starts its grace period afresh.
    f.available.store(150 * MI, Ordering::SeqCst);
    assert!(f.manager.synchronize(wake()).is_none());
}

#[test]
fn critical_pods_are_never_evicted() {
    let f = fixture(
        vec![threshold(200 * MI, Duration::ZERO)],
        Duration::from_secs(300),
        vec![pod("besteffort", None, Some("system-node-critical"))],
    );
    f.available.store(10 * MI, Ordering::SeqCst);
    assert!(f.manager.synchronize(wake()).is_none());
    assert!(f.recorder.evicted.lock().expect("lock").is_empty());
}

#[test]
fn minimum_reclaim_keeps_evicting_until_enough_is_back() {
    let mut t = threshold(200 * MI, Duration::ZERO);
    t.min_reclaim = Some(ThresholdValue::Quantity(100 * MI));
    let f = fixture(
        vec![t],
        Duration::from_secs(300),
        vec![pod("besteffort", None, None)],
    );
    f.available.store(150 * MI, Ordering::SeqCst);
    assert!(f.manager.synchronize(wake()).is_some());
    // Above the threshold but short of threshold + minimum reclaim: still met.
    f.available.store(250 * MI, Ordering::SeqCst);
    assert!(f.manager.synchronize(wake()).is_some());
    f.available.store(301 * MI, Ordering::SeqCst);
    assert!(f.manager.synchronize(wake()).is_none());
    assert_eq!(f.recorder.evicted.lock().expect("lock").len(), 2);
}

#[test]
fn an_empty_dir_over_its_size_limit_is_evicted_without_pressure() {
    let with_limit = |name: &str, limit: &str| {
        let mut p = (*pod(name, Some("300Mi"), None)).clone();
        if let Some(spec) = p.spec.as_mut() {
            spec.volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
                name: "scratch".into(),
                empty_dir: Some(k8s_openapi::api::core::v1::EmptyDirVolumeSource {
                    size_limit: Some(Quantity(limit.into())),
                    ..Default::default()
                }),
                ..Default::default()
            }]);
        }
        Arc::new(p)
    };
    let f = fixture(
        vec![threshold(200 * MI, Duration::ZERO)],
        Duration::from_secs(300),
        vec![with_limit("roomy", "4Mi"), with_limit("cramped", "1Mi")],
    );
    let mut decisions = f.manager.decisions();
    assert!(f.manager.synchronize(wake()).is_some());
    let evicted = f.recorder.evicted.lock().expect("lock").clone();
    assert_eq!(
        evicted,
        vec![(
            "cramped".to_owned(),
            0,
            "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ".to_owned()
        )]
    );
    assert!(
        f.manager.conditions().borrow().is_empty(),
        "no node pressure"
    );
    let d = decisions.try_recv().expect("a decision was published");
    assert_eq!(d.signal, None);
    assert_eq!(d.pod.map(|p| p.1), Some("cramped".to_owned()));
}

/// A pod whose containers each have `ephemeral-storage` limit of the given text (`None`: none).
fn with_ephemeral_limits(name: &str, limits: &[(&str, Option<&str>)]) -> Arc<Pod> {
    let mut p = (*pod(name, Some("300Mi"), None)).clone();
    if let Some(spec) = p.spec.as_mut() {
        spec.containers = limits
            .iter()
            .map(|(container, limit)| Container {
                resources: limit.map(|l| ResourceRequirements {
                    limits: Some(std::collections::BTreeMap::from([(
                        "ephemeral-storage".to_owned(),
                        Quantity(l.into()),
                    )])),
                    ..Default::default()
                }),
                ..testing::container(container)
            })
            .collect();
    }
    Arc::new(p)
}

#[tokio::test]
async fn containers_over_their_ephemeral_storage_limits_are_evicted_without_pressure() {
    // Each container writes 4 MiB (3 MiB layer, 1 MiB logs).
    let cases: [(Arc<Pod>, Option<&str>); 4] = [
        (
            with_ephemeral_limits("roomy", &[("main", Some("8Mi"))]),
            None,
        ),
        (with_ephemeral_limits("unlimited", &[("main", None)]), None),
        (
            with_ephemeral_limits(
                "one-over",
                &[("main", Some("2Mi")), ("side", Some("100Mi"))],
            ),
            Some("Container main exceeded its local ephemeral storage limit \"2Mi\". "),
        ),
        // 4 + 4 MiB against 3 + 4: the pod's sum goes first (upstream's order), though
        // `main` is over its own too.
        (
            with_ephemeral_limits("sum-over", &[("main", Some("3Mi")), ("side", Some("4Mi"))]),
            Some("Pod ephemeral local storage usage exceeds the total limit of containers 7Mi. "),
        ),
    ];
    for (pod, want) in cases {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let f = fixture(
            vec![threshold(200 * MI, Duration::ZERO)],
            Duration::from_secs(300),
            vec![pod],
        );
        // Without a measurement nothing is known over its limit.
        assert!(f.manager.synchronize(wake()).is_none(), "{name}");
        f.manager.measure_container_storage().await;
        let decided = f.manager.synchronize(wake());
        let evicted = f.recorder.evicted.lock().expect("lock").clone();
        match want {
            None => {
                assert!(decided.is_none(), "{name}");
                assert!(evicted.is_empty(), "{name}: {evicted:?}");
            }
            Some(message) => {
                assert!(decided.is_some(), "{name}");
                assert_eq!(
                    evicted,
                    vec![(name.clone(), 0, message.to_owned())],
                    "{name}"
                );
                // The measurement that evicted it is spent: no second eviction from it.
                assert!(f.manager.synchronize(wake()).is_none(), "{name}");
                assert_eq!(f.recorder.evicted.lock().expect("lock").len(), 1);
            }
        }
        assert!(
            f.manager.conditions().borrow().is_empty(),
            "no node pressure"
        );
    }
}
