//! The host's cgroup hierarchies, read from mountinfo, and the namespace's root cgroup in each.

use std::{
    fs,
    path::{Path, PathBuf},
};

use super::{CGROUP_MOUNT, SystemdNamespaceError};

/// One cgroup hierarchy of the host under `/sys/fs/cgroup`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    /// Relative to `/sys/fs/cgroup`; empty when cgroup2 is `/sys/fs/cgroup` itself.
    pub dir: PathBuf,
    pub kind: HierarchyKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HierarchyKind {
    /// cgroup v1 with these mount options: its controllers, or `none,name=<name>`.
    V1 {
        options: String,
    },
    V2,
}

impl Hierarchy {
    /// Whether this hierarchy holds `controller` (any cgroup2 one when `/sys/fs/cgroup` is
    /// cgroup2), or is the named hierarchy `name=<controller>`.
    pub fn holds(&self, controller: &str) -> bool {
        match &self.kind {
            HierarchyKind::V1 { options } => options
                .split(',')
                .any(|o| o == controller || o.strip_prefix("name=") == Some(controller)),
            HierarchyKind::V2 => self.dir.as_os_str().is_empty(),
        }
    }
}

/// The namespace's root cgroup in one hierarchy; v1 cpusets start empty and must be given
/// their parent's CPUs and memory nodes before a process may join.
pub(super) fn make_cgroup(hierarchy: &Hierarchy, dir: &Path) -> Result<(), SystemdNamespaceError> {
    fs::create_dir(dir).map_err(SystemdNamespaceError::io("create", dir))?;
    if matches!(hierarchy.kind, HierarchyKind::V1 { .. }) && hierarchy.holds("cpuset") {
        let parent = dir.parent().unwrap_or(dir);
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let from = parent.join(file);
            let value =
                fs::read_to_string(&from).map_err(SystemdNamespaceError::io("read", &from))?;
            let to = dir.join(file);
            fs::write(&to, value.trim()).map_err(SystemdNamespaceError::io("write", &to))?;
        }
    }
    if hierarchy.kind == HierarchyKind::V2 && hierarchy.dir.as_os_str().is_empty() {
        // systemd enables controllers for its units only among those its root cgroup has.
        delegate_controllers(dir)?;
    }
    Ok(())
}

/// On a pure cgroup v2 host, makes the controllers systemd needs available in `dir` (its
/// parent's `cgroup.subtree_control`), as `TestCgroup::with_memory_limit` does for memory.
fn delegate_controllers(dir: &Path) -> Result<(), SystemdNamespaceError> {
    let parent = dir.parent().unwrap_or(dir);
    let available = parent.join("cgroup.controllers");
    let available =
        fs::read_to_string(&available).map_err(SystemdNamespaceError::io("read", &available))?;
    let control = parent.join("cgroup.subtree_control");
    let enabled =
        fs::read_to_string(&control).map_err(SystemdNamespaceError::io("read", &control))?;
    for controller in ["cpu", "memory", "pids", "io"] {
        let has = |list: &str| list.split_whitespace().any(|c| c == controller);
        if has(&available) && !has(&enabled) {
            fs::write(&control, format!("+{controller}"))
                .map_err(SystemdNamespaceError::io("write", &control))?;
        }
    }
    Ok(())
}

/// The symbolic links directly under `root` (distributions link `cpu` and `cpuacct` to a
/// co-mounted `cpu,cpuacct`), which systemd looks controllers up by.
pub(super) fn cgroup_links(root: &Path) -> Vec<(String, String)> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let mut links: Vec<(String, String)> = entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_symlink()).unwrap_or(false))
        .filter_map(|e| {
            let target = fs::read_link(e.path()).ok()?;
            Some((
                e.file_name().to_str()?.to_owned(),
                target.to_str()?.to_owned(),
            ))
        })
        .collect();
    links.sort();
    links
}

/// The v1 controllers the kernel has enabled, from `/proc/cgroups`.
pub(super) fn v1_controllers(proc_cgroups: &str) -> Vec<String> {
    proc_cgroups
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let name = fields.next()?;
            (fields.nth(2)? == "1").then(|| name.to_owned())
        })
        .collect()
}

/// The cgroup hierarchies mounted at or directly under `/sys/fs/cgroup`, from a mountinfo
/// text: for v1, the mount options that select the same hierarchy again (its controllers, or
/// `none,name=…`), without flags such as `rw` or `xattr`.
pub(super) fn cgroup_hierarchies(mountinfo: &str, controllers: &[String]) -> Vec<Hierarchy> {
    let mut hierarchies = Vec::new();
    for line in mountinfo.lines() {
        // "<id> <parent> <maj:min> <root> <mount point> <opts> [optional...] - <fstype> <src> <super opts>"
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4).map(unescape) else {
            continue;
        };
        let mut right = right.split(' ');
        let (Some(fstype), Some(_source), Some(super_options)) =
            (right.next(), right.next(), right.next())
        else {
            continue;
        };
        let Ok(dir) = Path::new(&mount_point).strip_prefix(CGROUP_MOUNT) else {
            continue;
        };
        if dir.components().count() > 1 {
            continue;
        }
        let kind = match fstype {
            "cgroup2" => HierarchyKind::V2,
            "cgroup" => {
                let mut selected: Vec<&str> = super_options
                    .split(',')
                    .filter(|o| o.starts_with("name=") || controllers.iter().any(|c| c == o))
                    .collect();
                if selected.is_empty() {
                    continue;
                }
                if selected.iter().all(|o| o.starts_with("name=")) {
                    selected.insert(0, "none");
                }
                HierarchyKind::V1 {
                    options: selected.join(","),
                }
            }
            _ => continue,
        };
        let hierarchy = Hierarchy {
            dir: dir.to_owned(),
            kind,
        };
        // A later mount on the same point hides an earlier one.
        hierarchies.retain(|h: &Hierarchy| h.dir != hierarchy.dir);
        hierarchies.push(hierarchy);
    }
    hierarchies
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = bytes
                .get(i + 1..i + 4)
                .and_then(|o| std::str::from_utf8(o).ok())
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
