//! The index from a cgroup2 id to the container it belongs to, so that a kernel event (which
//! carries only a cgroup id) is mapped to its pod and container in O(1).
//!
//! The cgroupfs driver names container cgroups after their pod and id:
//! `/kubepods[/burstable|/besteffort]/pod<uid>/<container or sandbox id>` (`cgroup::pods` says where
//! exactly: below `cgroupRoot`, without QoS levels). The index is filled by
//! a walk of that tree at start (containers created before swiftlet started) and kept current from
//! cgroup mkdir/rmdir events. Each entry also remembers the container's init process — the first
//! process that exec'd in the cgroup, or, for containers found running, the process that is pid 1
//! in its pid namespace — because only its exit is the container's death.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use crate::{cgroup::PodCgroupLayout, container::PodUid};

/// What a cgroup is, in pod terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerCgroup {
    pub pod: PodUid,
    /// The runtime's id of the container (or of the sandbox: the pause container).
    pub container_id: String,
    /// The host pid of the container's init process, once known.
    pub init_pid: Option<u32>,
    /// The container's own program has started (the runtime's bootstrap is over): from now on
    /// its cgroup emptying means its death.
    pub started: bool,
    /// An OOM kill hit a process of this container.
    pub oom_killed: bool,
}

/// Pod cgroups by id, and the containers below them.
#[derive(Debug)]
pub struct ContainerIndex {
    containers: HashMap<u64, ContainerCgroup>,
    /// Where pod cgroups live.
    pods: PodCgroupLayout,
}

impl Default for ContainerIndex {
    fn default() -> Self {
        ContainerIndex::under(PodCgroupLayout::new(Path::new("/"), true))
    }
}

impl ContainerIndex {
    /// An index of the containers of the pods laid out as `pods` says.
    pub fn under(pods: PodCgroupLayout) -> ContainerIndex {
        ContainerIndex {
            containers: HashMap::new(),
            pods,
        }
    }

    /// Where the cgroup of `entry` may be below `cgroup2_root`: below its pod's cgroup in any of
    /// the directories pod cgroups are made in.
    pub fn container_dirs(&self, cgroup2_root: &Path, entry: &ContainerCgroup) -> Vec<PathBuf> {
        let names = self.pods.container_dir_names(&entry.container_id);
        self.pods
            .pod_parents()
            .iter()
            .flat_map(|parent| {
                let pod = cgroup2_root.join(self.pods.pod_dir_in(parent, &entry.pod.0));
                names.iter().map(move |name| pod.join(name))
            })
            .collect()
    }

    pub fn get(&self, cgroup_id: u64) -> Option<&ContainerCgroup> {
        self.containers.get(&cgroup_id)
    }

    pub fn get_mut(&mut self, cgroup_id: u64) -> Option<&mut ContainerCgroup> {
        self.containers.get_mut(&cgroup_id)
    }

    /// Records a new cgroup if it is a container's. A cgroup already known (found by the start
    /// scan, then reported again by its buffered mkdir) keeps what was learnt of it.
    pub fn insert_path(&mut self, cgroup_id: u64, path: &str) -> Option<&ContainerCgroup> {
        let (pod, container_id) = self.pods.parse_container(path)?;
        if self
            .containers
            .get(&cgroup_id)
            .is_some_and(|e| e.pod == pod && e.container_id == container_id)
        {
            return self.containers.get(&cgroup_id);
        }
        self.containers.insert(
            cgroup_id,
            ContainerCgroup {
                pod,
                container_id,
                init_pid: None,
                started: false,
                oom_killed: false,
            },
        );
        self.containers.get(&cgroup_id)
    }

    pub fn remove(&mut self, cgroup_id: u64) -> Option<ContainerCgroup> {
        self.containers.remove(&cgroup_id)
    }

    pub fn len(&self) -> usize {
        self.containers.len()
    }

    pub fn containers(&self) -> impl Iterator<Item = &ContainerCgroup> {
        self.containers.values()
    }

    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
    }

    /// Fills the index from the cgroup2 tree below where pod cgroups live, finding each running
    /// container's init process (pid 1 in its pid namespace) among the cgroup's processes.
    pub fn scan(&mut self, cgroup2_root: &Path) {
        let mut stack: Vec<PathBuf> = vec![cgroup2_root.join(self.pods.pods_parent())];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
            let Ok(rel) = dir.strip_prefix(cgroup2_root) else {
                continue;
            };
            let path = format!("/{}", rel.display());
            let Ok(meta) = std::fs::metadata(&dir) else {
                continue;
            };
            if self.insert_path(meta.ino(), &path).is_some() {
                let init = find_init(&dir);
                let running = !is_empty_cgroup(&dir);
                if let Some(e) = self.containers.get_mut(&meta.ino()) {
                    e.init_pid = init;
                    e.started = running;
                }
            }
        }
    }
}

/// The process of a container cgroup that is pid 1 of its pid namespace (`NSpid: <host> 1`).
pub fn find_init(cgroup_dir: &Path) -> Option<u32> {
    let procs = std::fs::read_to_string(cgroup_dir.join("cgroup.procs")).ok()?;
    procs
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .find(|pid| is_namespace_init(*pid))
}

/// Whether host process `pid` is pid 1 of its own pid namespace — a container's init (not so for
/// pods sharing one pid namespace or using the host's; their containers are judged by their
/// cgroup emptying instead). False once the process is gone.
pub fn is_namespace_init(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .map(|ns| {
                    let ids: Vec<&str> = ns.split_whitespace().collect();
                    ids.len() > 1 && ids.last() == Some(&"1")
                })
        })
        .unwrap_or(false)
}

/// Whether no process is left in a cgroup or below it (`populated 0` in its `cgroup.events`):
/// crun runs a container's processes in a sub-cgroup of the scope it was given, so the scope's
/// own `cgroup.procs` is empty while the container runs. A cgroup gone, or unreadable, is empty.
pub fn is_empty_cgroup(cgroup_dir: &Path) -> bool {
    std::fs::read_to_string(cgroup_dir.join("cgroup.events"))
        .map(|events| !events.lines().any(|l| l.trim() == "populated 1"))
        .unwrap_or(true)
}

/// Whether an exec is the OCI runtime's own bootstrap rather than the container's program: runc
/// re-executes itself from a sealed copy (`/dev/fd/N`, `/proc/self/fd/N`, a memfd) inside the
/// container's cgroup before the container's program starts.
pub fn is_runtime_bootstrap(comm: &str, filename: &str) -> bool {
    comm.starts_with("runc")
        || filename.starts_with("/dev/fd/")
        || filename.starts_with("/proc/self/fd/")
        || filename.starts_with("/memfd:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_and_go_by_cgroup_id() {
        let mut index = ContainerIndex::default();
        assert!(index.insert_path(7, "/kubepods/pods").is_none());
        let entry = index
            .insert_path(8, "/kubepods/besteffort/podu/cid")
            .cloned();
        assert_eq!(entry.map(|e| e.container_id), Some("cid".to_owned()));
        assert_eq!(index.len(), 1);
        if let Some(e) = index.get_mut(8) {
            e.init_pid = Some(42);
        }
        assert_eq!(index.get(8).and_then(|e| e.init_pid), Some(42));
        assert!(index.remove(8).is_some());
        assert!(index.is_empty());
    }

    #[test]
    fn a_cgroup_is_empty_when_nothing_below_it_is_populated() {
        let dir = tempfile::tempdir().expect("tempdir");
        // What the kernel writes: a scope whose processes sit in crun's sub-cgroup has an
        // empty `cgroup.procs` and is populated all the same.
        std::fs::write(dir.path().join("cgroup.procs"), "").expect("write");
        std::fs::write(dir.path().join("cgroup.events"), "populated 1\nfrozen 0\n").expect("write");
        assert!(!is_empty_cgroup(dir.path()));
        std::fs::write(dir.path().join("cgroup.events"), "populated 0\nfrozen 0\n").expect("write");
        assert!(is_empty_cgroup(dir.path()));
        assert!(is_empty_cgroup(&dir.path().join("gone")));
    }

    #[test]
    fn cruns_sub_cgroup_maps_to_its_container_beside_the_scope() {
        let layout = PodCgroupLayout::for_driver(
            crate::cgroup::pods::CgroupDriver::Systemd,
            Path::new("/"),
            true,
        );
        let mut index = ContainerIndex::under(layout);
        let pod = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu.slice";
        let scope = format!("{pod}/cri-containerd-cid.scope");
        assert!(index.insert_path(8, &scope).is_some());
        let sub = index.insert_path(9, &format!("{scope}/container")).cloned();
        assert_eq!(
            sub.map(|e| (e.pod, e.container_id)),
            Some((PodUid::from("u"), "cid".to_owned()))
        );
        assert!(
            index
                .insert_path(10, &format!("{scope}/container/x"))
                .is_none()
        );
        assert_eq!(index.len(), 2);
    }

    #[test]
    fn runc_bootstrap_execs_are_not_the_containers_program() {
        assert!(is_runtime_bootstrap("runc:[2:INIT]", "/usr/bin/runc"));
        assert!(is_runtime_bootstrap("5", "/dev/fd/5"));
        assert!(is_runtime_bootstrap("x", "/proc/self/fd/7"));
        assert!(!is_runtime_bootstrap("sleep", "/bin/sleep"));
        assert!(!is_runtime_bootstrap("sh", "/bin/sh"));
    }
}
