//! The in-kernel cgroup filter: resolving the subtrees a user names (`--cgroup PATH`) to cgroup2
//! ids, levels and paths, and writing them to the programs' `WATCHED`/`WATCH_COUNT` maps.

use crate::lock::MutexExt as _;
use std::{
    os::unix::fs::MetadataExt as _,
    path::{Component, Path, PathBuf},
    sync::{Arc, Mutex},
};

use aya::maps::{Array, MapData};
use swiftlet_common::{FILTER_ACTIVE, MAX_WATCHED, PATH_LEN, WatchedCgroup};

use super::Error;

/// A subtree resolved against the cgroup2 mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watch {
    /// The directory on the cgroup2 mount.
    pub dir: PathBuf,
    /// Relative to the mount, starting with `/`.
    pub path: String,
    pub id: u64,
    pub level: u32,
}

impl Watch {
    /// Resolves what a user gave: an absolute path on the cgroup2 mount, or a path relative to it
    /// (with or without a leading `/`).
    pub fn resolve(given: &Path, cgroup2_root: &Path) -> Result<Watch, Error> {
        let bad = |reason: String| Error::Watch {
            path: given.to_owned(),
            reason,
        };
        let dir = if given.starts_with(cgroup2_root) {
            given.to_owned()
        } else if given.is_absolute() && given.is_dir() && given.starts_with("/sys") {
            return Err(bad(format!(
                "this directory is not on the cgroup2 hierarchy (mounted at {}); kernel events \
                 identify cgroups by their cgroup2 id",
                cgroup2_root.display()
            )));
        } else {
            let relative: PathBuf = given
                .components()
                .filter(|c| !matches!(c, Component::RootDir))
                .collect();
            if relative
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
            {
                return Err(bad("expected a path without `.` or `..`".into()));
            }
            cgroup2_root.join(relative)
        };
        let meta = std::fs::metadata(&dir).map_err(|e| {
            bad(format!(
                "no such cgroup: {} ({e}); expected a cgroup directory on the cgroup2 mount {} \
                 or a path relative to it",
                dir.display(),
                cgroup2_root.display()
            ))
        })?;
        if !meta.is_dir() || !dir.join("cgroup.procs").exists() {
            return Err(bad(format!(
                "{} is not a cgroup directory on the cgroup2 mount {}",
                dir.display(),
                cgroup2_root.display()
            )));
        }
        let rel = dir.strip_prefix(cgroup2_root).unwrap_or(Path::new(""));
        let level = rel.components().count() as u32;
        let path = format!("/{}", rel.display());
        if path.len() >= PATH_LEN {
            return Err(bad(format!(
                "the path is longer than {} bytes",
                PATH_LEN - 1
            )));
        }
        Ok(Watch {
            dir: dir.clone(),
            path,
            id: meta.ino(),
            level,
        })
    }

    fn to_map_value(&self) -> WatchedCgroup {
        let mut value = WatchedCgroup::EMPTY;
        value.id = self.id;
        value.level = self.level;
        value.path_len = self.path.len() as u32;
        value.path[..self.path.len()].copy_from_slice(self.path.as_bytes());
        value
    }
}

/// The filter maps, shareable with whoever adds or removes watched subtrees while events flow.
#[derive(Clone)]
pub struct FilterHandle {
    inner: Arc<Mutex<FilterMaps>>,
}

struct FilterMaps {
    watched: Array<MapData, WatchedCgroup>,
    count: Array<MapData, u32>,
    current: Vec<Watch>,
}

impl FilterHandle {
    pub(super) fn new(watched: Array<MapData, WatchedCgroup>, count: Array<MapData, u32>) -> Self {
        FilterHandle {
            inner: Arc::new(Mutex::new(FilterMaps {
                watched,
                count,
                current: Vec::new(),
            })),
        }
    }

    /// Replaces the watched set. An empty set means the whole machine.
    pub fn set(&self, watches: &[Watch]) -> Result<(), Error> {
        if watches.len() > MAX_WATCHED as usize {
            return Err(Error::TooManyWatched {
                given: watches.len(),
                max: MAX_WATCHED as usize,
            });
        }
        let mut maps = self.inner.lock_unpoisoned();
        let map_err = |source| Error::Map {
            map: swiftlet_common::names::WATCHED,
            source,
        };
        // Entries that stay the same stay live; the rest are rewritten while not counted, so the
        // programs never read an entry mid-write. During the rewrite the filter matches less, never
        // more (FILTER_ACTIVE with a short count), and an empty set turns the filter off last.
        let unchanged = maps
            .current
            .iter()
            .zip(watches)
            .take_while(|(old, new)| old == new)
            .count();
        if !maps.current.is_empty() {
            maps.count
                .set(0, FILTER_ACTIVE | unchanged as u32, 0)
                .map_err(map_err)?;
        }
        for (i, watch) in watches.iter().enumerate().skip(unchanged) {
            maps.watched
                .set(i as u32, watch.to_map_value(), 0)
                .map_err(map_err)?;
        }
        let live = if watches.is_empty() {
            0
        } else {
            FILTER_ACTIVE | watches.len() as u32
        };
        maps.count.set(0, live, 0).map_err(map_err)?;
        maps.current = watches.to_vec();
        Ok(())
    }

    /// Adds one subtree to the watched set (no-op if present).
    pub fn add(&self, watch: Watch) -> Result<(), Error> {
        let mut next = self.current();
        if next.iter().any(|w| w.id == watch.id) {
            return Ok(());
        }
        next.push(watch);
        self.set(&next)
    }

    pub fn current(&self) -> Vec<Watch> {
        self.inner.lock_unpoisoned().current.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_root() -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        for dir in ["a/b", "a/bc"] {
            std::fs::create_dir_all(root.path().join(dir)).expect("mkdir");
            std::fs::write(root.path().join(dir).join("cgroup.procs"), "").expect("write");
        }
        root
    }

    #[test]
    fn resolves_relative_and_absolute_paths_to_the_same_watch() {
        let root = fake_root();
        let abs = Watch::resolve(&root.path().join("a/b"), root.path()).expect("absolute");
        let rel = Watch::resolve(Path::new("a/b"), root.path()).expect("relative");
        let slash = Watch::resolve(Path::new("/a/b"), root.path()).expect("leading slash");
        assert_eq!(abs, rel);
        assert_eq!(abs, slash);
        assert_eq!(abs.path, "/a/b");
        assert_eq!(abs.level, 2);
        let value = abs.to_map_value();
        assert_eq!(&value.path[..value.path_len as usize], b"/a/b");
    }

    #[test]
    fn rejects_missing_and_escaping_paths_naming_them() {
        let root = fake_root();
        let missing = Watch::resolve(Path::new("/does/not/exist"), root.path())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(missing.contains("/does/not/exist"), "{missing}");
        assert!(missing.contains("no such cgroup"), "{missing}");
        let escaping = Watch::resolve(Path::new("a/../../etc"), root.path());
        assert!(matches!(escaping, Err(Error::Watch { .. })));
        let plain_dir = root.path().join("a");
        let not_cgroup = Watch::resolve(&plain_dir, root.path());
        assert!(matches!(not_cgroup, Err(Error::Watch { .. })));
    }
}
