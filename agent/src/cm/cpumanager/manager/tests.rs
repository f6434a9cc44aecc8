use crate::testing;
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::{Container, Pod, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity,
};

use super::*;
use crate::{
    cm::cpumanager::{
        audit::{AuditError, AuditMaps},
        policy::PolicyOptions,
        topology::Topology,
    },
    cri::fake::FakeRuntime,
    kernel::{ForeignRun, RunqHistogram},
};

#[derive(Default)]
struct FakeAudit {
    owners: Mutex<BTreeMap<u32, u64>>,
    foreign: Mutex<Vec<ForeignRun>>,
}

impl AuditMaps for FakeAudit {
    fn set_owner(&self, cpu: u32, cgroup_id: u64) -> Result<(), AuditError> {
        let mut owners = self.owners.lock_unpoisoned();
        if cgroup_id == 0 {
            owners.remove(&cpu);
        } else {
            owners.insert(cpu, cgroup_id);
        }
        Ok(())
    }

    fn foreign(&self) -> Result<Vec<ForeignRun>, AuditError> {
        Ok(self.foreign.lock_unpoisoned().clone())
    }

    fn runqueue(&self) -> Result<HashMap<u64, RunqHistogram>, AuditError> {
        Ok(HashMap::new())
    }

    fn remove_cgroup(&self, cgroup_id: u64) -> Result<(), AuditError> {
        self.foreign
            .lock_unpoisoned()
            .retain(|r| r.owner != cgroup_id && r.intruder != cgroup_id);
        Ok(())
    }
}

fn set(text: &str) -> CpuSet {
    CpuSet::parse(text).expect("cpuset")
}

fn container(name: &str, cpu: &str) -> Container {
    let list = BTreeMap::from([
        ("cpu".to_owned(), Quantity(cpu.into())),
        ("memory".to_owned(), Quantity("64Mi".into())),
    ]);
    Container {
        name: name.into(),
        resources: Some(ResourceRequirements {
            requests: Some(list.clone()),
            limits: Some(list),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pod(uid: &str, containers: Vec<Container>) -> Pod {
    testing::pod()
        .named("default", &format!("pod-{uid}"), uid)
        .containers(containers)
        .build()
}

struct Fixture {
    dir: std::path::PathBuf,
    runtime: Arc<FakeRuntime>,
    audit: Arc<FakeAudit>,
}

impl Fixture {
    fn new(test: &str) -> Fixture {
        let dir =
            std::env::temp_dir().join(format!("swiftlet-cpumanager-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Fixture {
            dir,
            runtime: Arc::new(FakeRuntime::new()),
            audit: Arc::new(FakeAudit::default()),
        }
    }

    fn manager(&self, mode: ApplyMode, on_bad: OnBadCheckpoint) -> Result<CpuManager, Error> {
        let policy = StaticPolicy::new(
            Topology::described(1, 2, 1, 1),
            set("0"),
            PolicyOptions::default(),
        )
        .expect("policy");
        // Cgroup ids: a hash of the container id, stable across calls.
        let cgroup_id_of: CgroupIdOf = Arc::new(|_: &PodUid, id: &str| {
            Some(
                id.bytes()
                    .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))),
            )
        });
        CpuManager::new(
            policy,
            self.runtime.clone(),
            CpuManagerMetrics::register(&prometheus::Registry::new()).expect("metrics"),
            CpuManagerOptions {
                root_dir: self.dir.clone(),
                mode,
                reconcile_period: Duration::from_secs(10),
                on_bad_checkpoint: on_bad,
                cgroup_id_of,
                audit: Some(self.audit.clone()),
            },
        )
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts `pod`'s containers in the fake runtime the way the runtime manager would: created
/// with the cpuset the manager gives, then registered.
async fn run_pod(f: &Fixture, m: &CpuManager, pod: &Pod) -> Vec<String> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    let (_, ids) = f
        .runtime
        .start_pod(&uid, &name, "default", &names)
        .await
        .expect("start pod");
    for (c, id) in spec.containers.iter().zip(&ids) {
        let cpus = m.cpuset_for(pod, c);
        m.container_created(pod, c, id, cpus);
    }
    ids
}

/// A best-effort pod `be` admitted and running in the shared pool.
async fn best_effort_running(f: &Fixture, m: &CpuManager) -> (Pod, Vec<String>) {
    let shared = pod(
        "be",
        vec![Container {
            name: "c".into(),
            ..Default::default()
        }],
    );
    m.admit(&shared).expect("admit best-effort");
    let ids = run_pod(f, m, &shared).await;
    (shared, ids)
}

fn cpuset_of(f: &Fixture, id: &str) -> Option<String> {
    f.runtime
        .container_resources(id)
        .map(|r| r.cpuset_cpus)
        .filter(|s| !s.is_empty())
}

#[tokio::test]
async fn a_guaranteed_pod_gets_cpu_1_and_everyone_else_leaves_it_at_once() {
    let f = Fixture::new("exclusive");
    let m = f
        .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
        .expect("manager");
    let (shared, be_ids) = best_effort_running(&f, &m).await;
    assert_eq!(
        m.cpuset_for(&shared, &shared.spec.as_ref().expect("spec").containers[0]),
        set("0-1")
    );

    let guaranteed = pod("g", vec![container("main", "1")]);
    m.admit(&guaranteed).expect("admit guaranteed");
    let g_ids = run_pod(&f, &m, &guaranteed).await;
    assert_eq!(
        m.assignments().entries.get("g").and_then(|c| c.get("main")),
        Some(&set("1"))
    );
    // The event-driven apply moves the best-effort container off CPU 1.
    m.apply("event").await;
    assert_eq!(cpuset_of(&f, &be_ids[0]).as_deref(), Some("0"));
    // The guaranteed container was created on CPU 1 and is not updated again.
    assert_eq!(m.cpuset_for(&guaranteed, &container("main", "1")), set("1"));
    assert!(!f.runtime.calls().iter().any(
        |c| matches!(c, crate::cri::fake::Call::UpdateContainerResources { id } if id == &g_ids[0])
    ));
    // The audit owns CPU 1 for the guaranteed container's cgroup.
    let owner = m.containers().get(&g_ids[0]).and_then(|c| c.cgroup_id);
    assert_eq!(
        f.audit.owners.lock().expect("owners").get(&1).copied(),
        owner
    );

    // A second guaranteed pod does not fit: rejected whole, state untouched.
    let before = m.assignments();
    let second = pod("g2", vec![container("main", "1")]);
    let err = m
        .admit(&second)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(
        err,
        "Allocate failed due to not enough cpus available to satisfy request: requested=1, \
         available=0, which is unexpected"
    );
    assert_eq!(m.assignments(), before);

    // Deleting the pod returns CPU 1 to the shared pool, and to the best-effort container.
    m.remove_stale(&HashSet::from([PodUid("be".into())]));
    assert_eq!(m.assignments().default_set, set("0-1"));
    m.apply("event").await;
    assert_eq!(cpuset_of(&f, &be_ids[0]).as_deref(), Some("0-1"));
    assert!(f.audit.owners.lock().expect("owners").is_empty());
}

#[tokio::test]
async fn the_checkpoint_restores_assignments_and_a_bad_one_is_refused_or_set_aside() {
    let f = Fixture::new("checkpoint");
    {
        let m = f
            .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
            .expect("manager");
        m.admit(&pod("g", vec![container("main", "1")]))
            .expect("admit");
    }
    let m = f
        .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
        .expect("restart");
    assert_eq!(
        m.assignments().entries.get("g").and_then(|c| c.get("main")),
        Some(&set("1"))
    );
    drop(m);

    let path = f.dir.join(state::FILE_NAME);
    std::fs::write(
        &path,
        "{\"policyName\":\"static\",\"defaultCpuSet\":\"0-1\",\"checksum\":1}",
    )
    .expect("corrupt it");
    let refused = f
        .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains("is corrupt") && refused.contains("delete the file"),
        "{refused}"
    );
    let m = f
        .manager(ApplyMode::Events, OnBadCheckpoint::SetAside)
        .expect("reset");
    assert!(m.assignments().entries.is_empty());
    let aside = std::fs::read_dir(&f.dir)
        .expect("dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().contains("rejected-"))
        .count();
    assert_eq!(aside, 1);
}

#[tokio::test]
async fn reconcile_only_mode_waits_for_the_tick() {
    let f = Fixture::new("reconcile");
    let m = Arc::new(
        f.manager(ApplyMode::ReconcileOnly, OnBadCheckpoint::Refuse)
            .expect("manager"),
    );
    let (_, be_ids) = best_effort_running(&f, &m).await;
    let shutdown = CancellationToken::new();
    let runner = tokio::spawn(m.clone().run(shutdown.clone()));
    // The first tick is immediate; let it pass, then allocate.
    tokio::time::sleep(Duration::from_millis(50)).await;
    m.admit(&pod("g", vec![container("main", "1")]))
        .expect("admit");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_ne!(
        cpuset_of(&f, &be_ids[0]).as_deref(),
        Some("0"),
        "applied before the tick"
    );
    m.apply("reconcile").await;
    assert_eq!(cpuset_of(&f, &be_ids[0]).as_deref(), Some("0"));
    shutdown.cancel();
    let _ = runner.await;
}

#[tokio::test]
async fn foreign_pod_work_after_the_apply_is_a_violation() {
    let f = Fixture::new("violation");
    let m = f
        .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
        .expect("manager");
    let (_, be_ids) = best_effort_running(&f, &m).await;
    let g = pod("g", vec![container("main", "1")]);
    m.admit(&g).expect("admit");
    let g_ids = run_pod(&f, &m, &g).await;
    m.apply("event").await;
    let containers = m.containers();
    let owner = containers[&g_ids[0]].cgroup_id.expect("owner id");
    let intruder = containers[&be_ids[0]].cgroup_id.expect("intruder id");
    *f.audit.foreign.lock().expect("foreign") = vec![
        ForeignRun {
            cpu: 1,
            owner,
            intruder,
            ns: 2_000_000,
        },
        // A kernel thread: foreign, but not another pod's.
        ForeignRun {
            cpu: 1,
            owner,
            intruder: 1,
            ns: 10_000,
        },
    ];
    // The first look only learns that everything is settled: growth before it may be the
    // apply's delay.
    m.check_exclusivity();
    assert_eq!(m.metrics.violations.get(), 0);
    f.audit.foreign.lock().expect("foreign")[0].ns += 1_000_000;
    m.check_exclusivity();
    assert_eq!(m.metrics.violations.get(), 1);
    // No growth, no new violation.
    m.check_exclusivity();
    assert_eq!(m.metrics.violations.get(), 1);
}

#[tokio::test]
async fn the_sums_of_an_owner_that_is_gone_are_dropped_and_a_live_owners_kept() {
    let f = Fixture::new("past-owner");
    let m = f
        .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
        .expect("manager");
    let (_, be_ids) = best_effort_running(&f, &m).await;
    let g = pod("g", vec![container("main", "1")]);
    m.admit(&g).expect("admit");
    let g_ids = run_pod(&f, &m, &g).await;
    m.apply("event").await;
    let containers = m.containers();
    let owner = containers[&g_ids[0]].cgroup_id.expect("owner id");
    let intruder = containers[&be_ids[0]].cgroup_id.expect("intruder id");
    let run = |owner| ForeignRun {
        cpu: 1,
        owner,
        intruder,
        ns: 1_000,
    };
    // 4242: the cgroup of an exclusive container that exited before this agent started.
    *f.audit.foreign.lock_unpoisoned() = vec![run(owner), run(4242)];
    m.check_exclusivity();
    assert_eq!(*f.audit.foreign.lock_unpoisoned(), vec![run(owner)]);

    assert!(f.runtime.exit_container(&g_ids[0], 0));
    m.container_exited(&PodUid("g".into()), "main", &g_ids[0]);
    m.apply("event").await;
    assert!(f.audit.owners.lock_unpoisoned().is_empty());
    m.check_exclusivity();
    assert!(
        f.audit.foreign.lock_unpoisoned().is_empty(),
        "the exited owner's sums are dropped even with no CPU owned"
    );
}

#[tokio::test]
async fn a_pod_admitted_before_a_restart_is_admitted_again_without_new_cpus() {
    let f = Fixture::new("readmit");
    let mut with_init = pod("p", vec![container("main", "1")]);
    if let Some(spec) = with_init.spec.as_mut() {
        spec.init_containers = Some(vec![container("init", "1")]);
    }
    let first = {
        let m = f
            .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
            .expect("manager");
        m.admit(&with_init).expect("admit");
        m.assignments()
    };
    // The init container's CPU went on to `main`: one CPU for the pod, as upstream reuses it.
    assert_eq!(first.entries.get("p").map(|c| c.len()), Some(1));
    let m = f
        .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
        .expect("restart");
    m.admit(&with_init)
        .expect("admitted again after the restart");
    assert_eq!(m.assignments(), first);
}

#[tokio::test]
async fn allocate_releases_the_cpus_of_pods_no_longer_wanted_first() {
    let f = Fixture::new("stale");
    {
        // An earlier agent admitted `old` and was killed; its containers are gone.
        let m = f
            .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
            .expect("manager");
        m.admit(&pod("old", vec![container("main", "1")]))
            .expect("admit");
    }
    let m = f
        .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
        .expect("restart over the checkpoint");
    let new = pod("new", vec![container("main", "1")]);

    // While the sources have not all spoken, `old` may still be wanted: its CPU stays its own.
    let refused = m
        .allocate(&new, None)
        .expect_err("CPU 1 still held by `old`");
    assert!(
        refused.to_string().contains("not enough cpus available"),
        "{refused}"
    );
    let still_wanted = HashSet::from([PodUid("old".into()), PodUid("new".into())]);
    assert!(m.allocate(&new, Some(&still_wanted)).is_err());
    assert_eq!(
        m.assignments()
            .entries
            .get("old")
            .and_then(|c| c.get("main")),
        Some(&set("1"))
    );

    // Once no source wants `old`, its CPU is released before `new` is allocated.
    m.allocate(&new, Some(&HashSet::from([PodUid("new".into())])))
        .expect("allocated after the stale state is released");
    let assignments = m.assignments();
    assert!(!assignments.entries.contains_key("old"));
    assert_eq!(
        assignments.entries.get("new").and_then(|c| c.get("main")),
        Some(&set("1"))
    );
    let restored = f
        .manager(ApplyMode::Events, OnBadCheckpoint::Refuse)
        .expect("the checkpoint holds the result");
    assert_eq!(restored.assignments(), assignments);
}
