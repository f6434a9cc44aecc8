//! Which CPUs the static policy hands out: the topology-aware "packed" best fit of upstream
//! `pkg/kubelet/cm/cpumanager/cpu_assignment.go` (`takeByTopologyNUMAPacked`, formerly
//! `takeByTopology`), the `full-pcpus-only` policy option and the choice of reserved CPUs from
//! `policy_static.go`. Pure functions over a `Topology` and a free `CpuSet`; the assignment state,
//! the checkpoint and the cgroup writes are elsewhere. The `distribute-cpus-across-numa` option is
//! in `distribute.rs`. Not here: the `align-by-uncore-cache` option and topology-manager hints.

use super::cpuset::CpuSet;
use super::topology::Topology;

/// Why CPUs could not be allocated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error(
        "not enough cpus available to satisfy request: requested={requested}, available={available}"
    )]
    NotEnough { requested: usize, available: usize },
    /// Upstream's `SMTAlignmentError`, with its wording.
    #[error(
        "SMT Alignment Error: requested {requested} cpus not multiple cpus per core = {cpus_per_core}"
    )]
    SmtAlignment {
        requested: usize,
        cpus_per_core: usize,
    },
}

/// Takes `n` CPUs out of `available`, packed: whole NUMA nodes and sockets (the larger of the two
/// first) while `n` needs at least one, then whole cores, then single CPUs. At every level the
/// candidate with the fewest free CPUs wins (filling what is already in use keeps whole units free
/// for later requests), ties to the lowest id. CPUs of `available` not in `topo` are ignored.
pub fn take_by_topology(
    topo: &Topology,
    available: &CpuSet,
    n: usize,
) -> Result<CpuSet, AllocateError> {
    let mut acc = Accumulator::new(topo, available, n);
    if acc.is_satisfied() {
        return Ok(acc.result);
    }
    if acc.is_failed() {
        return Err(acc.not_enough());
    }
    // A NUMA node spanning sockets is the bigger unit, so it is tried first (upstream `numaFirst`).
    if acc.numa_first {
        acc.take_full_numa_nodes();
        acc.take_full_sockets();
    } else {
        acc.take_full_sockets();
        acc.take_full_numa_nodes();
    }
    acc.take_full_cores();
    acc.take_remaining_cpus();
    if acc.is_satisfied() {
        Ok(acc.result)
    } else {
        Err(acc.not_enough())
    }
}

/// `take_by_topology` under the `full-pcpus-only` option: `n` must fill whole cores, and only
/// cores whose every thread is in `available` are candidates, so no container shares a physical
/// core with another.
pub fn take_full_physical_cores(
    topo: &Topology,
    available: &CpuSet,
    n: usize,
) -> Result<CpuSet, AllocateError> {
    take_by_topology(topo, &whole_free_cores(topo, available, n)?, n)
}

/// What `full-pcpus-only` leaves to choose from: `n` must fill whole cores (upstream's
/// `SMTAlignmentError` otherwise), and only cores whose every thread is in `available` count.
pub(super) fn whole_free_cores(
    topo: &Topology,
    available: &CpuSet,
    n: usize,
) -> Result<CpuSet, AllocateError> {
    let cpus_per_core = topo.cpus_per_core();
    if cpus_per_core == 0 || !n.is_multiple_of(cpus_per_core) {
        return Err(AllocateError::SmtAlignment {
            requested: n,
            cpus_per_core,
        });
    }
    Ok(topo
        .cores()
        .into_iter()
        .map(|core| topo.cpus_in_core(core))
        .filter(|cpus| cpus.is_subset(available))
        .flat_map(|cpus| cpus.iter().collect::<Vec<_>>())
        .collect())
}

/// The CPUs the static policy reserves for system daemons when only a CPU quantity
/// (kube-reserved + system-reserved, in millicores) is configured: ceil(millis / 1000) CPUs packed
/// from all CPUs, so they land on the first cores of the first socket.
pub fn reserved_cpus(topo: &Topology, millis: u64) -> Result<CpuSet, AllocateError> {
    let n = usize::try_from(millis.div_ceil(1000)).unwrap_or(usize::MAX);
    take_by_topology(topo, &topo.all_cpus(), n)
}

/// The NUMA nodes holding at least one CPU of `available`, in the order the packed algorithm
/// visits them (upstream `sortAvailableNUMANodes`); the distributed option walks its combinations of
/// nodes in this order, so ties go the same way packing would go.
pub(super) fn numa_nodes_by_free(topo: &Topology, available: &CpuSet) -> Vec<u32> {
    Accumulator::new(topo, available, 0).sorted_numa_nodes()
}

/// Upstream's `cpuAccumulator`: the request being filled and what is still free.
struct Accumulator<'a> {
    topo: &'a Topology,
    /// The free CPUs not yet taken, with their topology.
    free: Topology,
    needed: usize,
    result: CpuSet,
    numa_first: bool,
}

impl<'a> Accumulator<'a> {
    fn new(topo: &'a Topology, available: &CpuSet, n: usize) -> Self {
        Self {
            topo,
            free: topo.keep_only(available),
            needed: n,
            result: CpuSet::new(),
            numa_first: topo.num_sockets() >= topo.num_numa_nodes(),
        }
    }

    fn take(&mut self, cpus: &CpuSet) {
        self.result = self.result.union(cpus);
        self.free = self
            .free
            .keep_only(&self.free.all_cpus().difference(&self.result));
        self.needed = self.needed.saturating_sub(cpus.len());
    }

    fn needs(&self, n: usize) -> bool {
        self.needed >= n
    }

    fn is_satisfied(&self) -> bool {
        self.needed == 0
    }

    fn is_failed(&self) -> bool {
        self.needed > self.free.num_cpus()
    }

    fn not_enough(&self) -> AllocateError {
        AllocateError::NotEnough {
            requested: self.needed + self.result.len(),
            available: self.free.num_cpus() + self.result.len(),
        }
    }

    fn sorted_numa_nodes(&self) -> Vec<u32> {
        if self.numa_first {
            let mut nodes: Vec<u32> = self.free.numa_nodes().into_iter().collect();
            sort_by_free(&mut nodes, |n| self.free.cpus_in_numa_node(n).len());
            nodes
        } else {
            let mut nodes = Vec::new();
            for socket in self.sorted_sockets() {
                let mut in_socket: Vec<u32> =
                    self.free.numa_nodes_in_socket(socket).into_iter().collect();
                sort_by_free(&mut in_socket, |n| self.free.cpus_in_numa_node(n).len());
                nodes.extend(in_socket);
            }
            nodes
        }
    }

    fn sorted_sockets(&self) -> Vec<u32> {
        if self.numa_first {
            let mut sockets: Vec<u32> = Vec::new();
            for numa in self.sorted_numa_nodes() {
                let mut in_numa: Vec<u32> =
                    self.free.sockets_in_numa_node(numa).into_iter().collect();
                sort_by_free(&mut in_numa, |s| self.free.cpus_in_socket(s).len());
                // Upstream can list a socket twice if it spans NUMA nodes; taking it twice would
                // count its CPUs twice, so keep the first place only.
                in_numa.retain(|s| !sockets.contains(s));
                sockets.extend(in_numa);
            }
            sockets
        } else {
            let mut sockets: Vec<u32> = self.free.sockets().into_iter().collect();
            sort_by_free(&mut sockets, |s| self.free.cpus_in_socket(s).len());
            sockets
        }
    }

    /// Cores grouped under the lower of socket and NUMA node, in that unit's order.
    fn sorted_cores(&self) -> Vec<u32> {
        let groups: Vec<_> = if self.numa_first {
            self.sorted_sockets()
                .into_iter()
                .map(|s| self.free.cores_in_socket(s))
                .collect()
        } else {
            self.sorted_numa_nodes()
                .into_iter()
                .map(|n| self.free.cores_in_numa_node(n))
                .collect()
        };
        let mut cores = Vec::new();
        for group in groups {
            let mut group: Vec<u32> = group.into_iter().filter(|c| !cores.contains(c)).collect();
            sort_by_free(&mut group, |c| self.free.cpus_in_core(c).len());
            cores.extend(group);
        }
        cores
    }

    fn sorted_cpus(&self) -> Vec<u32> {
        self.sorted_cores()
            .into_iter()
            .flat_map(|core| self.free.cpus_in_core(core).iter().collect::<Vec<_>>())
            .collect()
    }

    fn take_full_numa_nodes(&mut self) {
        let units = self.sorted_numa_nodes();
        self.take_whole(units, Topology::cpus_in_numa_node);
    }

    fn take_full_sockets(&mut self) {
        let units = self.sorted_sockets();
        self.take_whole(units, Topology::cpus_in_socket);
    }

    fn take_full_cores(&mut self) {
        let units = self.sorted_cores();
        self.take_whole(units, Topology::cpus_in_core);
    }

    /// Takes, in `units`' order, each unit (NUMA node, socket or core) whose CPUs are all free,
    /// while the request still needs at least that many.
    fn take_whole(&mut self, units: Vec<u32>, cpus_of: fn(&Topology, u32) -> CpuSet) {
        let whole: Vec<u32> = units
            .into_iter()
            .filter(|&u| cpus_of(&self.free, u).len() == cpus_of(self.topo, u).len())
            .collect();
        for unit in whole {
            let cpus = cpus_of(self.topo, unit);
            if self.needs(cpus.len()) {
                self.take(&cpus);
            }
        }
    }

    fn take_remaining_cpus(&mut self) {
        for cpu in self.sorted_cpus() {
            if self.is_satisfied() {
                return;
            }
            self.take(&std::iter::once(cpu).collect());
        }
    }
}

/// Fewest free CPUs first, then lowest id: upstream's `cpuAccumulator.sort`.
fn sort_by_free(ids: &mut [u32], free_cpus: impl Fn(u32) -> usize) {
    ids.sort_by_key(|&id| (free_cpus(id), id));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::cpumanager::topology::CpuInfo;

    fn cpus(text: &str) -> CpuSet {
        CpuSet::parse(text).unwrap()
    }

    /// Upstream's `topoDualSocketHT`: 12 CPUs, even ids on socket 0, odd on socket 1, a core's
    /// siblings 6 apart, one NUMA node per socket.
    fn topo_dual_socket_ht() -> Topology {
        Topology {
            cpus: (0..12)
                .map(|id| CpuInfo {
                    id,
                    core_id: id % 6,
                    socket_id: id % 2,
                    numa_node: id % 2,
                })
                .collect(),
        }
    }

    struct Case {
        name: &'static str,
        topo: Topology,
        available: &'static str,
        n: usize,
        expected: Result<&'static str, AllocateError>,
    }

    fn case(
        name: &'static str,
        topo: Topology,
        available: &'static str,
        n: usize,
        expected: Result<&'static str, AllocateError>,
    ) -> Case {
        Case {
            name,
            topo,
            available,
            n,
            expected,
        }
    }

    fn check(
        cases: Vec<Case>,
        take: fn(&Topology, &CpuSet, usize) -> Result<CpuSet, AllocateError>,
    ) {
        for case in cases {
            let got = take(&case.topo, &cpus(case.available), case.n);
            let expected = case.expected.map(cpus);
            assert_eq!(got, expected, "{}", case.name);
        }
    }

    /// Mirrors upstream `cpu_assignment_test.go`: `commonTakeByTopologyTestCases` (the
    /// single-socket-HT, dual-socket-HT and multi-NUMA-per-socket rows) and the extra rows of
    /// `TestTakeByTopologyNUMAPacked`. `topoSingleSocketHT` is `described(1, 4, 2, 1)` and
    /// `topoDualSocketMultiNumaPerSocketHT` is `described(2, 20, 2, 2)`.
    #[test]
    fn upstream_take_by_topology_single_socket_cases() {
        let single = || Topology::described(1, 4, 2, 1);
        check(
            vec![
                case(
                    "take more cpus than are available from single socket with HT",
                    single(),
                    "0,2,4,6",
                    5,
                    Err(AllocateError::NotEnough {
                        requested: 5,
                        available: 4,
                    }),
                ),
                case(
                    "take zero cpus from single socket with HT",
                    single(),
                    "0-7",
                    0,
                    Ok(""),
                ),
                case(
                    "take one cpu from single socket with HT",
                    single(),
                    "0-7",
                    1,
                    Ok("0"),
                ),
                case(
                    "take one cpu from single socket with HT, some cpus are taken",
                    single(),
                    "1,3,5-7",
                    1,
                    Ok("6"),
                ),
                case(
                    "take two cpus from single socket with HT",
                    single(),
                    "0-7",
                    2,
                    Ok("0,4"),
                ),
                case(
                    "take all cpus from single socket with HT",
                    single(),
                    "0-7",
                    8,
                    Ok("0-7"),
                ),
                case(
                    "take two cpus from single socket with HT, only one core totally free",
                    single(),
                    "0-3,6",
                    2,
                    Ok("2,6"),
                ),
            ],
            take_by_topology,
        );
    }

    /// The dual-socket and multi-NUMA rows of the same upstream table.
    #[test]
    fn upstream_take_by_topology_multi_socket_cases() {
        let multi_numa = || Topology::described(2, 20, 2, 2);
        check(
            vec![
                case(
                    "take one cpu from dual socket with HT - core from Socket 0",
                    topo_dual_socket_ht(),
                    "1-5,7-11",
                    1,
                    Ok("2"),
                ),
                case(
                    "take a socket of cpus from dual socket with HT",
                    topo_dual_socket_ht(),
                    "0-11",
                    6,
                    Ok("0,2,4,6,8,10"),
                ),
                case(
                    "allocate 4 full cores with 3 coming from the first NUMA node and 1 from the second",
                    topo_dual_socket_ht(),
                    "0-11",
                    8,
                    Ok("0-2,4,6-8,10"),
                ),
                case(
                    "take a NUMA node of cpus from dual socket with multi-numa-per-socket with HT",
                    multi_numa(),
                    "0-79",
                    20,
                    Ok("0-9,40-49"),
                ),
                case(
                    "take a NUMA node ..., with 1 NUMA node already taken",
                    multi_numa(),
                    "10-39,50-79",
                    20,
                    Ok("10-19,50-59"),
                ),
                case(
                    "take a socket and a NUMA node of cpus from dual socket with multi-numa-per-socket with HT",
                    multi_numa(),
                    "0-79",
                    60,
                    Ok("0-29,40-69"),
                ),
                case(
                    "take a socket and a NUMA node ..., a core taken",
                    multi_numa(),
                    "1-39,41-79",
                    60,
                    Ok("10-39,50-79"),
                ),
                case(
                    "allocate 32 full cores with 30 coming from the first 3 NUMA nodes and 2 from the fourth",
                    multi_numa(),
                    "0-79",
                    64,
                    Ok("0-31,40-71"),
                ),
            ],
            take_by_topology,
        );
    }

    /// Our own rows on 2 sockets x 8 cores x 2 threads (CPU n and n+16 share a core).
    #[test]
    fn packed_on_two_sockets_of_eight_cores() {
        let topo = || Topology::described(2, 8, 2, 1);
        let case = |name, available, n, expected| Case {
            name,
            topo: topo(),
            available,
            n,
            expected,
        };
        check(
            vec![
                case("two CPUs are one whole core", "0-31", 2, Ok("0,16")),
                case("sixteen CPUs are socket 0", "0-31", 16, Ok("0-7,16-23")),
                case(
                    "a socket then whole cores on the other",
                    "0-31",
                    20,
                    Ok("0-9,16-25"),
                ),
                case(
                    "three with core 1 half used: a whole core, then the half-used core's sibling",
                    "2-15,17-31",
                    3,
                    Ok("2,17-18"),
                ),
                case("the fuller socket wins", "0-7,9-23,25-31", 2, Ok("9,25")),
                case("one CPU fills a half-used core", "1-31", 1, Ok("16")),
                case(
                    "more than available",
                    "0-31",
                    33,
                    Err(AllocateError::NotEnough {
                        requested: 33,
                        available: 32,
                    }),
                ),
            ],
            take_by_topology,
        );
    }

    #[test]
    fn full_physical_cores_only() {
        let topo = || Topology::described(2, 8, 2, 1);
        let case = |name, available, n, expected| Case {
            name,
            topo: topo(),
            available,
            n,
            expected,
        };
        check(
            vec![
                case(
                    "odd request is not SMT aligned",
                    "0-31",
                    3,
                    Err(AllocateError::SmtAlignment {
                        requested: 3,
                        cpus_per_core: 2,
                    }),
                ),
                case(
                    "whole cores after a half-used one",
                    "1-31",
                    4,
                    Ok("1-2,17-18"),
                ),
                case(
                    "half-free cores do not count",
                    "2,16-18",
                    4,
                    Err(AllocateError::NotEnough {
                        requested: 4,
                        available: 2,
                    }),
                ),
                case("zero is aligned", "0-31", 0, Ok("")),
            ],
            take_full_physical_cores,
        );
        // Without SMT every count is a multiple of one thread per core.
        let no_smt = Topology::described(1, 2, 1, 1);
        assert_eq!(
            take_full_physical_cores(&no_smt, &cpus("0-1"), 1),
            Ok(cpus("0"))
        );
    }

    #[test]
    fn reserved_cpus_round_up_and_pack() {
        let topo = Topology::described(2, 8, 2, 1);
        assert_eq!(reserved_cpus(&topo, 0), Ok(CpuSet::new()));
        assert_eq!(reserved_cpus(&topo, 500), Ok(cpus("0")));
        assert_eq!(reserved_cpus(&topo, 1000), Ok(cpus("0")));
        assert_eq!(reserved_cpus(&topo, 1001), Ok(cpus("0,16")));
        assert_eq!(reserved_cpus(&topo, 3000), Ok(cpus("0-1,16")));
        let two = Topology::described(1, 2, 1, 1);
        assert_eq!(reserved_cpus(&two, 1500), Ok(cpus("0-1")));
        assert_eq!(
            reserved_cpus(&two, 2001),
            Err(AllocateError::NotEnough {
                requested: 3,
                available: 2
            })
        );
    }
}
