//! The node's CPU topology: which logical CPU sits on which core, socket and NUMA node, read from
//! sysfs (`discover`) or built from a shape for tests (`described`). Upstream
//! `pkg/kubelet/cm/cpumanager/topology/topology.go` (`CPUTopology`, `CPUDetails`, `Discover`),
//! which reads the same facts through cAdvisor. Uncore (L3) caches and CPU frequency are not
//! modelled.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use super::cpuset::{CpuSet, CpuSetError};

/// Where one logical CPU sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuInfo {
    pub id: u32,
    /// Unique across sockets: sysfs `core_id` repeats on every socket, so (as upstream's
    /// `getUniqueCoreID`) a core is named by the lowest CPU id among its threads.
    pub core_id: u32,
    pub socket_id: u32,
    pub numa_node: u32,
}

/// Why the topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parsing {path}")]
    CpuList {
        path: PathBuf,
        #[source]
        source: CpuSetError,
    },
    #[error("{path} holds {text:?}, not an integer")]
    NotAnInteger { path: PathBuf, text: String },
    #[error("no online CPUs listed in {path}")]
    NoCpus { path: PathBuf },
}

/// The logical CPUs of a node; upstream's `CPUTopology` and `CPUDetails` in one, since every
/// count is derived from the CPU list. Kept sorted by CPU id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    pub cpus: Vec<CpuInfo>,
}

impl Topology {
    /// Reads the topology under a sysfs root (`/sys` on a node; a temp tree in tests).
    pub fn discover(sys: &Path) -> Result<Topology, TopologyError> {
        let cpu_dir = sys.join("devices/system/cpu");
        let online_path = cpu_dir.join("online");
        let online = read_cpu_list(&online_path)?;
        if online.is_empty() {
            return Err(TopologyError::NoCpus { path: online_path });
        }
        let numa_of = read_numa_nodes(&sys.join("devices/system/node"))?;

        // (socket, sysfs core_id) -> lowest CPU id, to make core ids unique across sockets.
        let mut raw = Vec::with_capacity(online.len());
        let mut core_names: BTreeMap<(u32, i64), u32> = BTreeMap::new();
        for id in online.iter() {
            let topo_dir = cpu_dir.join(format!("cpu{id}/topology"));
            // Some platforms report -1 for an unknown package; treat them as one socket.
            let socket =
                u32::try_from(read_integer(&topo_dir.join("physical_package_id"))?).unwrap_or(0);
            let core = read_integer(&topo_dir.join("core_id"))?;
            core_names
                .entry((socket, core))
                .and_modify(|lowest| *lowest = (*lowest).min(id))
                .or_insert(id);
            raw.push((id, socket, core));
        }
        let cpus = raw
            .into_iter()
            .map(|(id, socket_id, core)| CpuInfo {
                id,
                core_id: core_names.get(&(socket_id, core)).copied().unwrap_or(id),
                socket_id,
                numa_node: numa_of.get(&id).copied().unwrap_or(0),
            })
            .collect();
        Ok(Topology { cpus })
    }

    /// A regular machine numbered as Linux usually numbers it: the first thread of every core
    /// (`0..sockets*cores_per_socket`, socket by socket), then the second threads in the same
    /// order, and so on. NUMA nodes split each socket's cores into equal consecutive groups.
    pub fn described(
        sockets: u32,
        cores_per_socket: u32,
        threads_per_core: u32,
        numa_per_socket: u32,
    ) -> Topology {
        let cores = sockets * cores_per_socket;
        let cores_per_numa = (cores_per_socket / numa_per_socket.max(1)).max(1);
        let mut cpus = Vec::with_capacity((cores * threads_per_core) as usize);
        for thread in 0..threads_per_core {
            for core in 0..cores {
                let socket_id = core / cores_per_socket;
                let numa_in_socket =
                    ((core % cores_per_socket) / cores_per_numa).min(numa_per_socket.max(1) - 1);
                cpus.push(CpuInfo {
                    id: thread * cores + core,
                    core_id: core,
                    socket_id,
                    numa_node: socket_id * numa_per_socket.max(1) + numa_in_socket,
                });
            }
        }
        Topology { cpus }
    }

    /// Only the CPUs in `cpus`: upstream's `CPUDetails.KeepOnly`, used to ask the same questions
    /// of the free CPUs.
    pub fn keep_only(&self, cpus: &CpuSet) -> Topology {
        Topology {
            cpus: self
                .cpus
                .iter()
                .filter(|c| cpus.contains(c.id))
                .copied()
                .collect(),
        }
    }

    pub fn num_cpus(&self) -> usize {
        self.cpus.len()
    }

    pub fn num_cores(&self) -> usize {
        self.cores().len()
    }

    pub fn num_sockets(&self) -> usize {
        self.sockets().len()
    }

    pub fn num_numa_nodes(&self) -> usize {
        self.numa_nodes().len()
    }

    /// Threads per core (1 without SMT); 0 for an empty topology.
    pub fn cpus_per_core(&self) -> usize {
        self.num_cpus().checked_div(self.num_cores()).unwrap_or(0)
    }

    pub fn cpus_per_socket(&self) -> usize {
        self.num_cpus().checked_div(self.num_sockets()).unwrap_or(0)
    }

    pub fn all_cpus(&self) -> CpuSet {
        self.cpus.iter().map(|c| c.id).collect()
    }

    pub fn cores(&self) -> BTreeSet<u32> {
        self.cpus.iter().map(|c| c.core_id).collect()
    }

    pub fn sockets(&self) -> BTreeSet<u32> {
        self.cpus.iter().map(|c| c.socket_id).collect()
    }

    pub fn numa_nodes(&self) -> BTreeSet<u32> {
        self.cpus.iter().map(|c| c.numa_node).collect()
    }

    pub fn cpus_in_core(&self, core: u32) -> CpuSet {
        self.cpus_where(|c| c.core_id == core)
    }

    pub fn cpus_in_socket(&self, socket: u32) -> CpuSet {
        self.cpus_where(|c| c.socket_id == socket)
    }

    pub fn cpus_in_numa_node(&self, numa: u32) -> CpuSet {
        self.cpus_where(|c| c.numa_node == numa)
    }

    pub fn cores_in_socket(&self, socket: u32) -> BTreeSet<u32> {
        self.ids_where(|c| c.socket_id == socket, |c| c.core_id)
    }

    pub fn cores_in_numa_node(&self, numa: u32) -> BTreeSet<u32> {
        self.ids_where(|c| c.numa_node == numa, |c| c.core_id)
    }

    pub fn sockets_in_numa_node(&self, numa: u32) -> BTreeSet<u32> {
        self.ids_where(|c| c.numa_node == numa, |c| c.socket_id)
    }

    pub fn numa_nodes_in_socket(&self, socket: u32) -> BTreeSet<u32> {
        self.ids_where(|c| c.socket_id == socket, |c| c.numa_node)
    }

    fn cpus_where(&self, keep: impl Fn(&CpuInfo) -> bool) -> CpuSet {
        self.cpus.iter().filter(|c| keep(c)).map(|c| c.id).collect()
    }

    fn ids_where(
        &self,
        keep: impl Fn(&CpuInfo) -> bool,
        id: impl Fn(&CpuInfo) -> u32,
    ) -> BTreeSet<u32> {
        self.cpus.iter().filter(|c| keep(c)).map(id).collect()
    }
}

fn read(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path).map_err(|source| TopologyError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_cpu_list(path: &Path) -> Result<CpuSet, TopologyError> {
    CpuSet::parse(&read(path)?).map_err(|source| TopologyError::CpuList {
        path: path.to_owned(),
        source,
    })
}

fn read_integer(path: &Path) -> Result<i64, TopologyError> {
    let text = read(path)?;
    text.trim()
        .parse()
        .map_err(|_| TopologyError::NotAnInteger {
            path: path.to_owned(),
            text,
        })
}

/// CPU id -> NUMA node from `node<M>/cpulist`; empty when the kernel has no NUMA support (no
/// `node` directory), in which case every CPU is on node 0.
fn read_numa_nodes(node_dir: &Path) -> Result<BTreeMap<u32, u32>, TopologyError> {
    let entries = match std::fs::read_dir(node_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(source) => {
            return Err(TopologyError::Read {
                path: node_dir.to_owned(),
                source,
            });
        }
    };
    let mut numa_of = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|source| TopologyError::Read {
            path: node_dir.to_owned(),
            source,
        })?;
        let name = entry.file_name();
        let Some(node) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            // Siblings such as `online`, `possible` and `has_cpu` are not nodes.
            continue;
        };
        for cpu in read_cpu_list(&entry.path().join("cpulist"))?.iter() {
            numa_of.insert(cpu, node);
        }
    }
    Ok(numa_of)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn described_dual_socket_ht() {
        let topo = Topology::described(2, 8, 2, 1);
        assert_eq!(topo.num_cpus(), 32);
        assert_eq!(topo.num_cores(), 16);
        assert_eq!(topo.num_sockets(), 2);
        assert_eq!(topo.num_numa_nodes(), 2);
        assert_eq!(topo.cpus_per_core(), 2);
        assert_eq!(topo.cpus_per_socket(), 16);
        assert_eq!(topo.cpus_in_core(0).to_string(), "0,16");
        assert_eq!(topo.cpus_in_core(9).to_string(), "9,25");
        assert_eq!(topo.cpus_in_socket(0).to_string(), "0-7,16-23");
        assert_eq!(topo.cpus_in_socket(1).to_string(), "8-15,24-31");
        assert_eq!(topo.cpus_in_numa_node(1).to_string(), "8-15,24-31");
        assert_eq!(topo.cores_in_socket(1), (8..16).collect());
    }

    #[test]
    fn described_numa_split_within_socket() {
        let topo = Topology::described(2, 10, 2, 2);
        assert_eq!(topo.num_numa_nodes(), 4);
        assert_eq!(topo.cpus_in_numa_node(0).to_string(), "0-4,20-24");
        assert_eq!(topo.cpus_in_numa_node(3).to_string(), "15-19,35-39");
        assert_eq!(topo.numa_nodes_in_socket(1), [2, 3].into_iter().collect());
    }

    #[test]
    fn described_two_cpus_without_smt() {
        let topo = Topology::described(1, 2, 1, 1);
        assert_eq!(topo.num_cpus(), 2);
        assert_eq!(topo.num_cores(), 2);
        assert_eq!(topo.num_sockets(), 1);
        assert_eq!(topo.num_numa_nodes(), 1);
        assert_eq!(topo.cpus_per_core(), 1);
        assert_eq!(topo.cpus_per_socket(), 2);
        assert_eq!(topo.cpus_in_core(1).to_string(), "1");
    }

    #[test]
    fn empty_topology_counts_zero() {
        let topo = Topology::default();
        assert_eq!(topo.cpus_per_core(), 0);
        assert_eq!(topo.cpus_per_socket(), 0);
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// Two sockets, two cores each, two threads; sysfs core_id repeats per socket.
    fn fake_sysfs(with_numa: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "devices/system/cpu/online", "0-7\n");
        for cpu in 0..8u32 {
            let socket = (cpu / 2) % 2;
            let core = cpu % 2;
            let base = format!("devices/system/cpu/cpu{cpu}/topology");
            write(
                root,
                &format!("{base}/physical_package_id"),
                &format!("{socket}\n"),
            );
            write(root, &format!("{base}/core_id"), &format!("{core}\n"));
        }
        if with_numa {
            write(root, "devices/system/node/online", "0-1\n");
            write(root, "devices/system/node/node0/cpulist", "0-1,4-5\n");
            write(root, "devices/system/node/node1/cpulist", "2-3,6-7\n");
        }
        dir
    }

    #[test]
    fn discovers_fake_sysfs() {
        let dir = fake_sysfs(true);
        let topo = Topology::discover(dir.path()).unwrap();
        assert_eq!(topo.num_cpus(), 8);
        assert_eq!(topo.num_sockets(), 2);
        assert_eq!(topo.num_cores(), 4);
        assert_eq!(topo.num_numa_nodes(), 2);
        assert_eq!(topo.cpus_per_core(), 2);
        // sysfs core 0 exists on both sockets; unique ids are the lowest thread.
        assert_eq!(topo.cpus_in_core(0).to_string(), "0,4");
        assert_eq!(topo.cpus_in_core(2).to_string(), "2,6");
        assert_eq!(topo.cpus_in_socket(1).to_string(), "2-3,6-7");
        assert_eq!(topo.cpus_in_numa_node(1).to_string(), "2-3,6-7");
    }

    #[test]
    fn discovers_without_numa_dir_as_node_zero() {
        let dir = fake_sysfs(false);
        let topo = Topology::discover(dir.path()).unwrap();
        assert_eq!(topo.numa_nodes(), [0].into_iter().collect());
    }

    #[test]
    fn discover_names_the_missing_file() {
        let dir = fake_sysfs(false);
        std::fs::remove_file(dir.path().join("devices/system/cpu/cpu3/topology/core_id")).unwrap();
        let err = Topology::discover(dir.path()).unwrap_err();
        assert!(
            matches!(&err, TopologyError::Read { path, .. } if path.ends_with("cpu3/topology/core_id")),
            "{err:?}"
        );
    }

    #[test]
    fn discovers_this_machine() {
        let topo = Topology::discover(Path::new("/sys")).unwrap();
        let expected = std::thread::available_parallelism().unwrap().get();
        assert_eq!(topo.num_cpus(), expected);
        assert!(topo.cpus_per_core() >= 1);
    }
}
