//! The static policy's `distribute-cpus-across-numa` option: when a request needs more than one
//! NUMA node, spread it evenly over the fewest nodes that can hold it instead of filling one node
//! before the next. Upstream `takeByTopologyNUMADistributed` in
//! `pkg/kubelet/cm/cpumanager/cpu_assignment.go` (KEP-2902), selected by
//! `DistributeCPUsAcrossNUMA` in `policy_options.go`; the policy passes the CPUs per core as the
//! group size under `full-pcpus-only` and 1 otherwise. Each node's share is still chosen by the
//! packed algorithm of `allocate.rs`. Not here: `align-by-socket`, which upstream layers on top
//! of this choice of nodes, and in-place resize.

use super::allocate::{AllocateError, numa_nodes_by_free, take_by_topology};
use super::cpuset::CpuSet;
use super::topology::Topology;

/// Takes `n` CPUs out of `available`, spread evenly in groups of `cpu_group_size` CPUs over the
/// fewest NUMA nodes that can hold them. Among the sets of nodes of that size, the winner leaves
/// the free CPUs of all nodes most even afterwards (lowest variance), ties to the earlier set in
/// packed order. When `n` is not a whole number of groups, or no set of nodes can take an even
/// share, this is plain `take_by_topology`. A group size of 0 counts as 1.
pub fn take_by_topology_numa_distributed(
    topo: &Topology,
    available: &CpuSet,
    n: usize,
    cpu_group_size: usize,
) -> Result<CpuSet, AllocateError> {
    let group = cpu_group_size.max(1);
    // Shares of whole groups cannot add up to `n`, so there is nothing to distribute.
    if !n.is_multiple_of(group) {
        return take_by_topology(topo, available, n);
    }
    if n == 0 {
        return Ok(CpuSet::new());
    }
    let free = topo.keep_only(available);
    if n > free.num_cpus() {
        return Err(AllocateError::NotEnough {
            requested: n,
            available: free.num_cpus(),
        });
    }

    let nodes = numa_nodes_by_free(topo, available);
    let free_per_node: Vec<usize> = nodes
        .iter()
        .map(|&node| free.cpus_in_numa_node(node).len())
        .collect();
    let (fewest, most) = numa_count_range(topo, nodes.len(), n, group);
    for k in fewest..=most {
        if let Some(plan) = best_plan(&free_per_node, k, n, group) {
            return plan.take(topo, &free.all_cpus(), &nodes, group);
        }
    }
    take_by_topology(topo, available, n)
}

/// How many NUMA nodes to try, fewest first (upstream `rangeNUMANodesNeededToSatisfy`). The lower
/// bound assumes nodes the size of an average whole node, so a node with some CPUs in use can
/// make it too low; the combinations of that size are then simply all rejected. More nodes than
/// groups would leave a node with an empty share.
fn numa_count_range(
    topo: &Topology,
    nodes_with_free_cpus: usize,
    n: usize,
    group: usize,
) -> (usize, usize) {
    let groups_per_node = topo
        .num_cpus()
        .div_ceil(group)
        .div_ceil(topo.num_numa_nodes().max(1))
        .max(1);
    let groups_needed = n.div_ceil(group);
    (
        groups_needed.div_ceil(groups_per_node),
        groups_needed.min(nodes_with_free_cpus),
    )
}

/// Which nodes give what, as indexes into the packed-order node list.
#[derive(Debug)]
struct Plan {
    nodes: Vec<usize>,
    /// What every node in `nodes` gives.
    share: usize,
    /// The nodes giving one more group each, in the order they give it; a node may appear more
    /// than once when the remainder outnumbers the nodes able to give it.
    extra: Vec<usize>,
    score: u128,
}

impl Plan {
    /// Takes each node's share and then each extra group with the packed algorithm, restricted to
    /// the node's still-free CPUs, in the order upstream takes them: a packed pick of a whole share
    /// can differ from a pick of the same size made group by group.
    fn take(
        &self,
        topo: &Topology,
        free: &CpuSet,
        node_ids: &[u32],
        group: usize,
    ) -> Result<CpuSet, AllocateError> {
        let takes = self
            .nodes
            .iter()
            .map(|&node| (node, self.share))
            .chain(self.extra.iter().map(|&node| (node, group)));
        let mut left = free.clone();
        let mut result = CpuSet::new();
        for (node, count) in takes {
            let in_node = topo.cpus_in_numa_node(node_ids[node]).intersection(&left);
            let cpus = take_by_topology(topo, &in_node, count)?;
            left = left.difference(&cpus);
            result = result.union(&cpus);
        }
        Ok(result)
    }
}

/// The best way to spread `n` over exactly `k` nodes, if any set of `k` nodes can take it.
fn best_plan(free: &[usize], k: usize, n: usize, group: usize) -> Option<Plan> {
    let mut best: Option<Plan> = None;
    for nodes in Combinations::new(free.len(), k) {
        let Some(plan) = plan_for(free, nodes, n, group) else {
            continue;
        };
        if best.as_ref().is_none_or(|b| plan.score < b.score) {
            let balanced = plan.score == 0;
            best = Some(plan);
            if balanced {
                break;
            }
        }
    }
    best
}

/// An even share of `n` from every node in `nodes`, plus the remainder from whichever subset of
/// them keeps the free CPUs most even; `None` when the nodes cannot hold that.
fn plan_for(free: &[usize], nodes: Vec<usize>, n: usize, group: usize) -> Option<Plan> {
    let total: usize = nodes.iter().map(|&i| free[i]).sum();
    let groups: usize = nodes.iter().map(|&i| free[i] / group).sum();
    if total < n || groups * group < n {
        return None;
    }
    let share = n / nodes.len() / group * group;
    if nodes.iter().any(|&i| free[i] < share) {
        return None;
    }
    let mut after = free.to_vec();
    for &i in &nodes {
        after[i] -= share;
    }
    let remainder = n - share * nodes.len();
    if remainder == 0 {
        return Some(Plan {
            score: imbalance(&after),
            nodes,
            share,
            extra: Vec::new(),
        });
    }

    let can_give: Vec<usize> = nodes
        .iter()
        .copied()
        .filter(|&i| after[i] >= group)
        .collect();
    // Larger subsets first, and only a strictly better score replaces the best so far, so on a
    // tie the remainder stays spread over as many nodes as possible.
    let mut best: Option<(u128, Vec<usize>)> = None;
    for size in (1..=can_give.len()).rev() {
        for picks in Combinations::new(can_give.len(), size) {
            let subset: Vec<usize> = picks.iter().map(|&j| can_give[j]).collect();
            let Some((left, extra)) = hand_out(&after, &subset, remainder, group) else {
                continue;
            };
            let score = imbalance(&left);
            if best.as_ref().is_none_or(|(b, _)| score < *b) {
                best = Some((score, extra));
            }
        }
    }
    best.map(|(score, extra)| Plan {
        nodes,
        share,
        extra,
        score,
    })
}

/// Hands `remainder` out one group at a time, round-robin over `subset`, skipping nodes with less
/// than a group left. Returns the free counts afterwards and which node gave each group.
fn hand_out(
    after: &[usize],
    subset: &[usize],
    remainder: usize,
    group: usize,
) -> Option<(Vec<usize>, Vec<usize>)> {
    // Counted in whole groups: leftovers smaller than a group cannot be handed out, so a sum of
    // CPUs would accept subsets the round-robin below can never finish (upstream's later fix).
    let groups: usize = subset.iter().map(|&i| after[i] / group).sum();
    if groups * group < remainder {
        return None;
    }
    let mut left = after.to_vec();
    let mut extra = Vec::new();
    let mut remainder = remainder;
    while remainder > 0 {
        let before = remainder;
        for &i in subset {
            if remainder == 0 {
                break;
            }
            if left[i] >= group {
                left[i] -= group;
                remainder = remainder.saturating_sub(group);
                extra.push(i);
            }
        }
        // The group count above rules this out; it only guards against looping forever.
        if remainder == before {
            return None;
        }
    }
    Some((left, extra))
}

/// `len² × variance` of the free counts, exact in integers. Upstream compares standard deviations
/// rounded to three decimals; every candidate takes the same `n` CPUs, so the mean is the same
/// for all of them and this orders them the same way, without rounding making near-ties equal.
/// Zero means perfectly even.
fn imbalance(free: &[usize]) -> u128 {
    let len = free.len() as u128;
    let sum: u128 = free.iter().map(|&x| x as u128).sum();
    let squares: u128 = free.iter().map(|&x| (x as u128) * (x as u128)).sum();
    (len * squares).saturating_sub(sum * sum)
}

/// The `k`-element subsets of `0..n` as sorted index lists, in lexicographic order: the order of
/// upstream's `iterateCombinations`, which decides ties. Nothing for `k == 0` or `k > n`.
struct Combinations {
    n: usize,
    next: Option<Vec<usize>>,
}

impl Combinations {
    fn new(n: usize, k: usize) -> Self {
        Self {
            n,
            next: (1..=n).contains(&k).then(|| (0..k).collect()),
        }
    }
}

impl Iterator for Combinations {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        let current = self.next.take()?;
        let k = current.len();
        // The rightmost index that can still move right; everything after it restarts packed
        // behind it.
        if let Some(pos) = (0..k).rev().find(|&p| current[p] < self.n - k + p) {
            let mut following = current.clone();
            following[pos] += 1;
            for q in pos + 1..k {
                following[q] = following[q - 1] + 1;
            }
            self.next = Some(following);
        }
        Some(current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(text: &str) -> CpuSet {
        CpuSet::parse(text).unwrap()
    }

    /// 2 sockets x 8 cores x 2 threads, one NUMA node per socket: node 0 is CPUs 0-7,16-23 and
    /// node 1 is 8-15,24-31 (CPU c and c+16 share a core).
    fn two_nodes() -> Topology {
        Topology::described(2, 8, 2, 1)
    }

    /// The same machine with two NUMA nodes per socket: node 0 is 0-3,16-19, node 1 4-7,20-23,
    /// node 2 8-11,24-27 and node 3 12-15,28-31.
    fn four_nodes() -> Topology {
        Topology::described(2, 8, 2, 2)
    }

    fn take(topo: &Topology, available: &str, n: usize, group: usize) -> CpuSet {
        take_by_topology_numa_distributed(topo, &cpus(available), n, group).unwrap()
    }

    #[test]
    fn combinations_in_lexicographic_order() {
        let all: Vec<Vec<usize>> = Combinations::new(4, 2).collect();
        assert_eq!(
            all,
            vec![
                vec![0, 1],
                vec![0, 2],
                vec![0, 3],
                vec![1, 2],
                vec![1, 3],
                vec![2, 3]
            ]
        );
        assert_eq!(Combinations::new(3, 3).count(), 1);
        assert_eq!(Combinations::new(3, 0).count(), 0);
        assert_eq!(Combinations::new(2, 3).count(), 0);
    }

    #[test]
    fn imbalance_is_zero_only_when_even() {
        assert_eq!(imbalance(&[6, 6]), 0);
        assert_eq!(imbalance(&[5, 6]), 1);
        assert_eq!(imbalance(&[0, 2, 8, 8]), 4 * 132 - 18 * 18);
    }

    #[test]
    fn request_that_fits_one_node_is_packed_into_it() {
        // Both nodes leave the same imbalance, so the first in packed order (node 0) wins and
        // its packed pick is the packed pick from the whole machine.
        let topo = two_nodes();
        let got = take(&topo, "0-31", 4, 1);
        assert_eq!(got, cpus("0-1,16-17"));
        assert_eq!(Ok(got), take_by_topology(&topo, &cpus("0-31"), 4));
        assert_eq!(take(&four_nodes(), "0-31", 8, 1), cpus("0-3,16-19"));
    }

    #[test]
    fn request_is_spread_evenly_over_two_nodes() {
        // Packed would take socket 0 and two cores of socket 1 (0-9,16-25).
        assert_eq!(
            take(&two_nodes(), "0-31", 20, 1),
            cpus("0-4,8-12,16-20,24-28")
        );
        // Twelve need two of the four nodes; every pair leaves the same imbalance, so the first
        // pair (nodes 0 and 1, socket 0) gets six each. Packed: node 0 then two cores of node 1.
        assert_eq!(
            take(&four_nodes(), "0-31", 12, 1),
            cpus("0-2,4-6,16-18,20-22")
        );
        // Ten: five from each of nodes 0 and 1, two whole cores and one thread each.
        assert_eq!(
            take(&four_nodes(), "0-31", 10, 1),
            cpus("0-2,4-6,16-17,20-21")
        );
    }

    #[test]
    fn odd_request_gives_the_remainder_to_the_first_node() {
        // Ten from each node, then the 21st: giving it to either node leaves 5 and 6 free, so the
        // two-node subset (tried first) keeps it and node 0 gives it from its next core.
        assert_eq!(
            take(&two_nodes(), "0-31", 21, 1),
            cpus("0-5,8-12,16-20,24-28")
        );
        // 27 over all four nodes: six each (three whole cores), then one more from nodes 0, 1 and 2
        // in turn, each the first thread of its node's last core.
        assert_eq!(
            take(&four_nodes(), "0-31", 27, 1),
            cpus("0-14,16-18,20-22,24-26,28-30")
        );
    }

    #[test]
    fn group_size_of_a_core_keeps_whole_cores() {
        let topo = two_nodes();
        // With single-CPU groups 22 split 11 and 11, leaving cores 5 and 13 half used.
        assert_eq!(take(&topo, "0-31", 22, 1), cpus("0-5,8-13,16-20,24-28"));
        // With core-sized groups each node gets five cores and the remaining core comes from
        // node 0 whole.
        assert_eq!(take(&topo, "0-31", 22, 2), cpus("0-5,8-12,16-21,24-28"));
        // An odd count is not a whole number of groups: plain packed.
        let packed = take_by_topology(&topo, &cpus("0-31"), 21);
        assert_eq!(packed, Ok(cpus("0-10,16-25")));
        assert_eq!(
            take_by_topology_numa_distributed(&topo, &cpus("0-31"), 21, 2),
            packed
        );
    }

    #[test]
    fn remainder_counts_whole_groups_only() {
        // Every node has a whole core and one thread of another in use, leaving 5 free CPUs:
        // two whole cores and a lone thread. Fourteen CPUs in cores need all four nodes (three
        // nodes hold only six whole cores). Each node gives one core, and three more cores come
        // from nodes 0, 1 and 2. A subset of two nodes, left with 3 free CPUs each, holds six
        // CPUs but only two whole cores: counting CPUs instead of groups would accept it and
        // never finish handing out the remainder.
        let available = "2-3,6-7,10-11,14-15,17-19,21-23,25-27,29-31";
        assert_eq!(
            take(&four_nodes(), available, 14, 2),
            cpus("2-3,6-7,10-11,14,18-19,22-23,26-27,30")
        );
    }

    #[test]
    fn not_enough_cpus_is_the_packed_error() {
        let too_many = AllocateError::NotEnough {
            requested: 33,
            available: 32,
        };
        let all = cpus("0-31");
        assert_eq!(
            take_by_topology_numa_distributed(&two_nodes(), &all, 33, 1),
            Err(too_many.clone())
        );
        assert_eq!(take_by_topology(&two_nodes(), &all, 33), Err(too_many));
        // An odd count with core-sized groups goes to the packed algorithm, same error.
        assert_eq!(
            take_by_topology_numa_distributed(&two_nodes(), &cpus("0-2"), 5, 2),
            take_by_topology(&two_nodes(), &cpus("0-2"), 5)
        );
    }

    #[test]
    fn two_cpu_machine() {
        let topo = Topology::described(1, 2, 1, 1);
        assert_eq!(take(&topo, "0-1", 0, 1), CpuSet::new());
        assert_eq!(take(&topo, "0-1", 1, 1), cpus("0"));
        assert_eq!(take(&topo, "0-1", 2, 1), cpus("0-1"));
        assert_eq!(take(&topo, "1", 1, 1), cpus("1"));
        assert_eq!(
            take_by_topology_numa_distributed(&topo, &cpus("0-1"), 3, 1),
            Err(AllocateError::NotEnough {
                requested: 3,
                available: 2
            })
        );
    }

    #[test]
    fn balance_prefers_the_node_with_more_free_cpus() {
        // Two cores of node 0 are in use (12 free against 16). Taking four from node 0 would leave
        // 8 and 16 free, from node 1 12 and 12: node 1 wins, where packed fills node 0.
        let topo = two_nodes();
        let available = "2-15,18-31";
        assert_eq!(take(&topo, available, 4, 1), cpus("8-9,24-25"));
        assert_eq!(
            take_by_topology(&topo, &cpus(available), 4),
            Ok(cpus("2-3,18-19"))
        );
    }

    #[test]
    fn balance_avoids_the_busier_node_among_pairs() {
        // Core 0 is in use, so node 0 has 6 free and the others 8. Twelve need two nodes at six
        // each. A pair with node 0 would leave (0, 2, 8, 8) free; a pair without it (6, 2, 2, 8)
        // or a permutation, which is more even. The first such pair is nodes 1 and 2, across
        // the sockets: upstream's balance does not look at sockets.
        assert_eq!(
            take(&four_nodes(), "1-15,17-31", 12, 1),
            cpus("4-6,8-10,20-22,24-26")
        );
    }
}
