//! The static policy's bookkeeping (upstream `policy_static.go`): which containers get exclusive
//! CPUs (those of Guaranteed pods with an integer CPU request), which CPUs they get (packed by
//! topology, never the reserved ones), init containers' CPUs handed on to the pod's later
//! containers, the shared pool everyone else runs on, and the checks a restored checkpoint must
//! pass against this node. It works on [`Assignments`] in memory; saving them is the caller's.
//!
//! Not here: applying cpusets to containers and admission wiring (`manager.rs`). Not supported:
//! topology-manager hints.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    allocate::{AllocateError, take_by_topology, take_full_physical_cores, whole_free_cores},
    cpuset::CpuSet,
    distribute::take_by_topology_numa_distributed,
    state::Assignments,
    topology::Topology,
};
use crate::cm::{
    qos::{QosClass, pod_qos},
    quantity::cpu_millis,
};

/// The policy's name in the checkpoint.
pub const STATIC: &str = "static";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error(
        "the static CPU manager policy needs reserved CPUs: set reservedSystemCPUs, or a cpu in \
         kubeReserved or systemReserved"
    )]
    NoReservedCpus,
    #[error("reserved CPUs {reserved} are not all on this node (CPUs {all})")]
    ReservedNotOnNode { reserved: CpuSet, all: CpuSet },
    #[error(
        "the checkpoint does not match this node: {why}; drain the node, delete the checkpoint and \
         start again"
    )]
    StateMismatch { why: String },
    #[error("container {container}: {source}")]
    Allocate {
        container: String,
        #[source]
        source: AllocateError,
    },
}

/// The static policy's options (upstream `StaticPolicyOptions`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyOptions {
    /// `full-pcpus-only`: exclusive CPUs come as whole physical cores (SMT siblings together).
    pub full_pcpus_only: bool,
    /// `distribute-cpus-across-numa`: a request that needs more than one NUMA node is spread
    /// evenly over the fewest nodes that fit it.
    pub distribute_cpus_across_numa: bool,
}

pub struct StaticPolicy {
    topology: Topology,
    reserved: CpuSet,
    options: PolicyOptions,
}

impl StaticPolicy {
    pub fn new(
        topology: Topology,
        reserved: CpuSet,
        options: PolicyOptions,
    ) -> Result<StaticPolicy, PolicyError> {
        if reserved.is_empty() {
            return Err(PolicyError::NoReservedCpus);
        }
        let all = topology.all_cpus();
        if !reserved.is_subset(&all) {
            return Err(PolicyError::ReservedNotOnNode { reserved, all });
        }
        Ok(StaticPolicy {
            topology,
            reserved,
            options,
        })
    }

    pub fn reserved(&self) -> &CpuSet {
        &self.reserved
    }

    /// The CPUs containers may be given (upstream `GetAllocatableCPUs`): all but the reserved.
    pub fn allocatable(&self) -> CpuSet {
        self.topology.all_cpus().difference(&self.reserved)
    }

    /// A fresh state (every CPU shared), or a restored one checked against this node: the
    /// shared pool and the assignments must cover the node's CPUs exactly, without overlap, and
    /// the reserved CPUs must be shared (upstream `validateState`).
    pub fn start(&self, restored: Option<Assignments>) -> Result<Assignments, PolicyError> {
        let all = self.topology.all_cpus();
        let Some(state) = restored else {
            return Ok(Assignments {
                policy: STATIC.into(),
                default_set: all,
                entries: BTreeMap::new(),
            });
        };
        let mismatch = |why: String| PolicyError::StateMismatch { why };
        if !self.reserved.is_subset(&state.default_set) {
            return Err(mismatch(format!(
                "reserved CPUs {} are not all in the shared pool {}",
                self.reserved, state.default_set
            )));
        }
        let mut covered = state.default_set.clone();
        for (pod, containers) in &state.entries {
            for (name, set) in containers {
                if !covered.intersection(set).is_empty() {
                    return Err(mismatch(format!(
                        "{pod}/{name}'s CPUs {set} are also assigned elsewhere"
                    )));
                }
                covered = covered.union(set);
            }
        }
        if covered != all {
            return Err(mismatch(format!(
                "the checkpoint accounts for CPUs {covered}, this node has {all}"
            )));
        }
        Ok(state)
    }

    /// The exclusive CPUs `container` of `pod` needs: its CPU request when the pod is Guaranteed
    /// and the request a whole number of CPUs, else none (it runs in the shared pool).
    pub fn guaranteed_cpus(pod: &Pod, container: &Container) -> Option<usize> {
        if !matches!(pod_qos(pod), Ok(QosClass::Guaranteed)) {
            return None;
        }
        let resources = container.resources.as_ref()?;
        let request = resources
            .requests
            .as_ref()
            .and_then(|r| r.get("cpu"))
            .or_else(|| resources.limits.as_ref().and_then(|l| l.get("cpu")))?;
        let millis = cpu_millis(&request.0).ok()?;
        if millis <= 0 || millis % 1000 != 0 {
            return None;
        }
        usize::try_from(millis / 1000).ok()
    }

    /// Gives `container` of pod `pod_uid` its exclusive CPUs (upstream `Allocate`); `None` when
    /// it runs in the shared pool. Idempotent. `reusable` are CPUs of this pod's init containers
    /// that have finished, which its later containers may take first.
    pub fn allocate(
        &self,
        state: &mut Assignments,
        pod_uid: &str,
        container: &str,
        cpus: Option<usize>,
        reusable: &CpuSet,
    ) -> Result<Option<CpuSet>, PolicyError> {
        let Some(n) = cpus else {
            return Ok(None);
        };
        if let Some(set) = state.entries.get(pod_uid).and_then(|c| c.get(container)) {
            return Ok(Some(set.clone()));
        }
        let free = state.default_set.difference(&self.reserved).union(reusable);
        let set = self
            .take(&free, n)
            .map_err(|source| PolicyError::Allocate {
                container: container.to_owned(),
                source,
            })?;
        // CPUs reused from an init container leave its entry: one owner per CPU.
        for assigned in state
            .entries
            .entry(pod_uid.to_owned())
            .or_default()
            .values_mut()
        {
            *assigned = assigned.difference(&set);
        }
        let containers = state.entries.entry(pod_uid.to_owned()).or_default();
        containers.retain(|_, s| !s.is_empty());
        containers.insert(container.to_owned(), set.clone());
        state.default_set = state.default_set.difference(&set);
        Ok(Some(set))
    }

    /// Upstream `allocateCPUs`: the SMT check of `full-pcpus-only` first, then the packed or the
    /// NUMA-distributed choice.
    fn take(&self, free: &CpuSet, n: usize) -> Result<CpuSet, AllocateError> {
        match (
            self.options.full_pcpus_only,
            self.options.distribute_cpus_across_numa,
        ) {
            (false, false) => take_by_topology(&self.topology, free, n),
            (true, false) => take_full_physical_cores(&self.topology, free, n),
            (full, true) => {
                let (free, group) = if full {
                    let whole = whole_free_cores(&self.topology, free, n)?;
                    (whole, self.topology.cpus_per_core().max(1))
                } else {
                    (free.clone(), 1)
                };
                take_by_topology_numa_distributed(&self.topology, &free, n, group)
            }
        }
    }

    /// Returns a container's exclusive CPUs to the shared pool (upstream `RemoveContainer`).
    pub fn remove_container(&self, state: &mut Assignments, pod_uid: &str, container: &str) {
        let Some(containers) = state.entries.get_mut(pod_uid) else {
            return;
        };
        if let Some(set) = containers.remove(container) {
            state.default_set = state.default_set.union(&set);
        }
        if containers.is_empty() {
            state.entries.remove(pod_uid);
        }
    }

    /// The CPUs a container runs on: its own, or the shared pool.
    pub fn cpus_of(state: &Assignments, pod_uid: &str, container: &str) -> CpuSet {
        state
            .entries
            .get(pod_uid)
            .and_then(|c| c.get(container))
            .cloned()
            .unwrap_or_else(|| state.default_set.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::ResourceRequirements, apimachinery::pkg::api::resource::Quantity,
    };

    fn set(text: &str) -> CpuSet {
        CpuSet::parse(text).expect("cpuset")
    }

    fn container(cpu: &str, memory: &str, limits: bool) -> Container {
        let r = std::collections::BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.into())),
            ("memory".to_owned(), Quantity(memory.into())),
        ]);
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some(r.clone()),
                limits: limits.then_some(r),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(c: &Container) -> Pod {
        crate::testing::pod().container(c.clone()).build()
    }

    #[test]
    fn only_guaranteed_integer_requests_are_exclusive() {
        let whole = container("2", "64Mi", true);
        assert_eq!(StaticPolicy::guaranteed_cpus(&pod(&whole), &whole), Some(2));
        let fraction = container("1500m", "64Mi", true);
        assert_eq!(
            StaticPolicy::guaranteed_cpus(&pod(&fraction), &fraction),
            None
        );
        let burstable = container("2", "64Mi", false);
        assert_eq!(
            StaticPolicy::guaranteed_cpus(&pod(&burstable), &burstable),
            None
        );
    }

    /// This machine's shape: CPU 0 reserved, a `cpu: 1` Guaranteed container gets CPU 1, which
    /// leaves the shared pool; deleting it gives it back; a second one does not fit.
    #[test]
    fn on_two_cpus_with_cpu_0_reserved() {
        let policy = StaticPolicy::new(
            Topology::described(1, 2, 1, 1),
            set("0"),
            PolicyOptions::default(),
        )
        .expect("policy");
        let mut state = policy.start(None).expect("fresh");
        assert_eq!(state.default_set, set("0-1"));
        let got = policy
            .allocate(&mut state, "a", "app", Some(1), &CpuSet::new())
            .expect("fits");
        assert_eq!(got, Some(set("1")));
        assert_eq!(state.default_set, set("0"), "the shared pool shrank");
        assert_eq!(StaticPolicy::cpus_of(&state, "b", "other"), set("0"));
        assert_eq!(
            policy.allocate(&mut state, "a", "app", Some(1), &CpuSet::new()),
            Ok(Some(set("1"))),
            "idempotent"
        );
        let second = policy.allocate(&mut state, "b", "app", Some(1), &CpuSet::new());
        assert!(
            matches!(second, Err(PolicyError::Allocate { .. })),
            "{second:?}"
        );
        policy.remove_container(&mut state, "a", "app");
        assert_eq!(state.default_set, set("0-1"));
        assert!(state.entries.is_empty());
    }

    #[test]
    fn distribute_across_numa_spreads_what_one_node_cannot_hold() {
        // 2 sockets (one NUMA node each) × 4 cores × 2 threads; core 0 (CPUs 0 and 8) reserved:
        // node 0 has 6 free CPUs, node 1 has 8.
        let topo = Topology::described(2, 4, 2, 1);
        let options = PolicyOptions {
            full_pcpus_only: true,
            distribute_cpus_across_numa: true,
        };
        let policy = StaticPolicy::new(topo.clone(), set("0,8"), options).expect("policy");
        let mut state = policy.start(None).expect("state");
        let got = policy
            .allocate(&mut state, "p", "c", Some(12), &CpuSet::new())
            .expect("allocates")
            .expect("exclusive");
        let on = |node: u32| got.intersection(&topo.cpus_in_numa_node(node)).len();
        assert_eq!(
            (on(0), on(1)),
            (6, 6),
            "evenly, not node 1 filled first: {got}"
        );
        // Whole cores only: every CPU's sibling comes with it.
        assert!(got.iter().all(|cpu| got.contains((cpu + 8) % 16)));
        let packed =
            StaticPolicy::new(topo.clone(), set("0,8"), PolicyOptions::default()).expect("policy");
        let mut state = packed.start(None).expect("state");
        let got = packed
            .allocate(&mut state, "p", "c", Some(12), &CpuSet::new())
            .expect("allocates")
            .expect("exclusive");
        assert_eq!(got.intersection(&topo.cpus_in_numa_node(1)).len(), 8);
        let mut state = policy.start(None).expect("state");
        assert!(matches!(
            policy.allocate(&mut state, "p", "c", Some(3), &CpuSet::new()),
            Err(PolicyError::Allocate {
                source: AllocateError::SmtAlignment { .. },
                ..
            })
        ));
    }

    #[test]
    fn init_containers_cpus_pass_to_the_app_container() {
        let policy = StaticPolicy::new(
            Topology::described(1, 4, 2, 1),
            set("0,4"),
            PolicyOptions::default(),
        )
        .expect("policy");
        let mut state = policy.start(None).expect("fresh");
        let init = policy
            .allocate(&mut state, "p", "init", Some(2), &CpuSet::new())
            .expect("init")
            .expect("exclusive");
        let app = policy
            .allocate(&mut state, "p", "app", Some(2), &init)
            .expect("app")
            .expect("exclusive");
        assert_eq!(app, init, "the finished init container's CPUs are reused");
        assert_eq!(state.entries["p"].len(), 1, "one owner per CPU");
        assert_eq!(
            state.default_set.union(&app),
            Topology::described(1, 4, 2, 1).all_cpus()
        );
    }

    #[test]
    fn restored_state_must_match_the_node() {
        let policy = StaticPolicy::new(
            Topology::described(1, 2, 1, 1),
            set("0"),
            PolicyOptions::default(),
        )
        .expect("policy");
        let good = Assignments {
            policy: STATIC.into(),
            default_set: set("0"),
            entries: BTreeMap::from([(
                "a".to_owned(),
                BTreeMap::from([("app".to_owned(), set("1"))]),
            )]),
        };
        assert_eq!(policy.start(Some(good.clone())), Ok(good.clone()));
        let mut missing = good.clone();
        missing.entries.clear();
        assert!(matches!(
            policy.start(Some(missing)),
            Err(PolicyError::StateMismatch { .. })
        ));
        let mut reserved_taken = good;
        reserved_taken.default_set = set("1");
        reserved_taken
            .entries
            .insert("b".into(), BTreeMap::from([("x".to_owned(), set("0"))]));
        assert!(matches!(
            policy.start(Some(reserved_taken)),
            Err(PolicyError::StateMismatch { .. })
        ));
        assert_eq!(
            StaticPolicy::new(
                Topology::described(1, 2, 1, 1),
                CpuSet::new(),
                PolicyOptions::default()
            )
            .err(),
            Some(PolicyError::NoReservedCpus)
        );
    }
}
