//! Which cgroup layout this node has, detected from `/proc/self/mountinfo` at start:
//! - unified (pure cgroup v2): `/sys/fs/cgroup` is cgroup2 — what most nodes run today;
//! - hybrid: v1 controllers under `/sys/fs/cgroup/<controller>` and cgroup2 (without
//!   controllers) at `/sys/fs/cgroup/unified` — systemd's hybrid mode, these dev machines;
//! - legacy (v1 only): no cgroup2 mount at all.
//!
//! Kernel events identify cgroups by their cgroup2 id (`bpf_get_current_cgroup_id`), so the
//! cgroup2 mount is what matters to them in every layout that has one.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "no cgroup2 hierarchy is mounted (only cgroup v1): kernel events identify cgroups by \
         their cgroup2 id"
    )]
    NoCgroup2,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupLayout {
    /// Pure cgroup v2 at `root`.
    Unified { root: PathBuf },
    /// cgroup2 at `unified`, v1 controllers mounted under `v1_root/<controller>`.
    Hybrid { unified: PathBuf, v1_root: PathBuf },
    /// cgroup v1 only.
    Legacy { v1_root: PathBuf },
}

impl CgroupLayout {
    /// Detects the layout of the running system.
    pub fn detect() -> Result<CgroupLayout, LayoutError> {
        Self::detect_from(Path::new("/proc/self/mountinfo"))
    }

    pub fn detect_from(mountinfo: &Path) -> Result<CgroupLayout, LayoutError> {
        let text = fs::read_to_string(mountinfo).map_err(|source| LayoutError::Read {
            path: mountinfo.to_owned(),
            source,
        })?;
        Ok(Self::parse(&text))
    }

    /// Classifies the cgroup mounts listed in a mountinfo text.
    pub fn parse(mountinfo: &str) -> CgroupLayout {
        let mut cgroup2 = Vec::new();
        let mut v1 = Vec::new();
        for line in mountinfo.lines() {
            // "<id> <parent> <maj:min> <root> <mount point> <opts> [optional...] - <fstype> <src> <super opts>"
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let Some(mount_point) = left.split(' ').nth(4) else {
                continue;
            };
            let mount_point = PathBuf::from(unescape(mount_point));
            match right.split(' ').next() {
                Some("cgroup2") => cgroup2.push(mount_point),
                Some("cgroup") => v1.push(mount_point),
                _ => {}
            }
        }
        let v1_root = v1
            .first()
            .and_then(|p| p.parent())
            .map_or_else(|| PathBuf::from("/sys/fs/cgroup"), Path::to_path_buf);
        // Prefer the conventional places, then whatever cgroup2 mount exists.
        let conventional = Path::new("/sys/fs/cgroup");
        if cgroup2.iter().any(|p| p == conventional) {
            return CgroupLayout::Unified {
                root: conventional.to_owned(),
            };
        }
        let unified = cgroup2
            .iter()
            .find(|p| p.as_path() == Path::new("/sys/fs/cgroup/unified"))
            .or_else(|| cgroup2.first())
            .cloned();
        match (unified, v1.is_empty()) {
            (Some(unified), false) => CgroupLayout::Hybrid { unified, v1_root },
            (Some(root), true) => CgroupLayout::Unified { root },
            (None, _) => CgroupLayout::Legacy { v1_root },
        }
    }

    /// The cgroup2 mount point.
    pub fn cgroup2_root(&self) -> Result<&Path, LayoutError> {
        match self {
            CgroupLayout::Unified { root } => Ok(root),
            CgroupLayout::Hybrid { unified, .. } => Ok(unified),
            CgroupLayout::Legacy { .. } => Err(LayoutError::NoCgroup2),
        }
    }

    /// The directory of a v1 controller's hierarchy, if this layout has v1 controllers.
    pub fn v1_controller(&self, controller: &str) -> Option<PathBuf> {
        match self {
            CgroupLayout::Hybrid { v1_root, .. } | CgroupLayout::Legacy { v1_root } => {
                Some(v1_root.join(controller))
            }
            CgroupLayout::Unified { .. } => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            CgroupLayout::Unified { .. } => "unified",
            CgroupLayout::Hybrid { .. } => "hybrid",
            CgroupLayout::Legacy { .. } => "legacy",
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if let (b'\\', Some(digits)) = (bytes[i], octal) {
            let value = digits
                .iter()
                .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            out.push(value as u8);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 30 0:22 / /sys/fs/cgroup rw,relatime shared:9 - tmpfs tmpfs rw,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory
28 25 0:25 / /sys/fs/cgroup/cpu rw,relatime shared:12 - cgroup cgroup rw,cpu";

    const UNIFIED: &str = "\
30 1 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate";

    const LEGACY: &str = "\
27 25 0:24 / /sys/fs/cgroup/memory rw,relatime shared:11 - cgroup cgroup rw,memory";

    #[test]
    fn detects_each_layout() {
        assert_eq!(
            CgroupLayout::parse(HYBRID),
            CgroupLayout::Hybrid {
                unified: "/sys/fs/cgroup/unified".into(),
                v1_root: "/sys/fs/cgroup".into()
            }
        );
        assert_eq!(
            CgroupLayout::parse(UNIFIED),
            CgroupLayout::Unified {
                root: "/sys/fs/cgroup".into()
            }
        );
        let legacy = CgroupLayout::parse(LEGACY);
        assert!(matches!(legacy, CgroupLayout::Legacy { .. }));
        assert!(matches!(legacy.cgroup2_root(), Err(LayoutError::NoCgroup2)));
    }

    #[test]
    fn unescapes_mount_points() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn detects_this_machine() {
        // Every supported machine has some cgroup mount; the layout must be one of the three.
        let layout = CgroupLayout::detect().expect("mountinfo is readable");
        assert!(["unified", "hybrid", "legacy"].contains(&layout.name()));
    }
}
