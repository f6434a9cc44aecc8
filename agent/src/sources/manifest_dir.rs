//! The static pod directory as last read: for every manifest file, its pod or why it was rejected,
//! and which file owns each pod name. Synchronous and driven by two transitions, a full
//! [`ManifestDir::rescan`] and a [`ManifestDir::refresh`] of named files, so tests (and the
//! watcher in `static_pods.rs`) control exactly when the disk is read. Upstream: the
//! `sourceFile` store in `pkg/kubelet/config/file.go`.
//!
//! Which files count: regular files (or symlinks to them) directly in the directory, not starting
//! with a dot, ending in `.yaml`, `.yml` or `.json`. Upstream reads every file not starting with a
//! dot; the extension filter is swiftlet's, so editor leftovers (`pod.yaml~`, `pod.yaml.swp`,
//! `pod.yaml.tmp`) are never run.
//!
//! Two files defining the same `name_namespace`: the file that already owned the name keeps it
//! (so adding a copy never disturbs a running pod); otherwise the first in path order wins. The
//! other is reported.

use std::{
    collections::{BTreeMap, HashMap},
    ffi::OsStr,
    io::{self, Read as _},
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::api::core::v1::Pod;

use super::{
    SourceProblem,
    manifest::{MAX_MANIFEST_BYTES, ManifestError, decode_static_pod},
};
use crate::pod::full_name;

/// Whether a directory entry's name is one the static pod source reads.
pub fn is_manifest_name(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    if name.starts_with('.') {
        return false;
    }
    let extension = Path::new(name)
        .extension()
        .and_then(OsStr::to_str)
        .map(str::to_ascii_lowercase);
    matches!(extension.as_deref(), Some("yaml" | "yml" | "json"))
}

/// What identifies one version of a file without reading it: a rescan reads again only files
/// whose fingerprint changed (a write changes mtime and ctime, a rename-over the inode), so the
/// safety-net rescan of a folder of unchanged manifests costs a `stat` per file, not a decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Fingerprint {
    fn of(meta: &std::fs::Metadata) -> Fingerprint {
        use std::os::unix::fs::MetadataExt as _;
        Fingerprint {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// What reading one path found.
enum Reading {
    /// No such file (any more).
    Gone,
    /// Empty and just created: a writer has it open; its close will bring the content.
    NotYetWritten,
    /// Boxed: a `Pod` is large and most readings are small. The fingerprint is taken before the
    /// content is read: a write in between makes the next rescan read it again.
    Done(Box<Result<Pod, ManifestError>>, Option<Fingerprint>),
}

#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    node_name: String,
    /// Every manifest file present, with its pod or the reason it was rejected.
    files: BTreeMap<PathBuf, Result<Pod, Arc<ManifestError>>>,
    /// The version of each file that `files` holds.
    fingerprints: HashMap<PathBuf, Fingerprint>,
    /// Files read and decoded so far (what the fingerprints save).
    reads: u64,
    /// `name_namespace` → the file whose pod is used.
    owners: HashMap<String, PathBuf>,
    /// How the last full listing went.
    listing: Listing,
    /// Whether a listing ever succeeded (a missing directory counts: it has no pods).
    ever_listed: bool,
}

/// The outcome of the last full listing of the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listing {
    Never,
    Listed,
    Missing,
    /// The directory exists but could not be listed; the last known files are kept.
    Failed(String),
}

impl ManifestDir {
    pub fn new(dir: PathBuf, node_name: String) -> Self {
        ManifestDir {
            dir,
            node_name,
            files: BTreeMap::new(),
            fingerprints: HashMap::new(),
            reads: 0,
            owners: HashMap::new(),
            listing: Listing::Never,
            ever_listed: false,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn listing(&self) -> &Listing {
        &self.listing
    }

    /// Whether the pods are known at all. Until then the source must not claim an (empty) set:
    /// as upstream, an unreadable directory never makes the source ready.
    pub fn has_listed(&self) -> bool {
        self.ever_listed
    }

    /// Reads the whole directory again. A missing directory has no pods (as upstream, which then
    /// reports the source as seen with an empty set). Other listing errors keep the last state and
    /// are reported as a problem of the directory.
    pub fn rescan(&mut self) {
        self.listing = match self.list() {
            Ok(Some(present)) => {
                self.files.retain(|path, _| {
                    path.file_name()
                        .is_some_and(|n| present.iter().any(|p| p == n))
                });
                let files = &self.files;
                self.fingerprints.retain(|path, _| files.contains_key(path));
                for name in present {
                    if !self.unchanged(&name) {
                        self.refresh(&name, false);
                    }
                }
                Listing::Listed
            }
            Ok(None) => {
                self.files.clear();
                Listing::Missing
            }
            Err(e) => Listing::Failed(e.to_string()),
        };
        if matches!(self.listing, Listing::Listed | Listing::Missing) {
            self.ever_listed = true;
        }
    }

    /// The manifest names in the directory; `None` if it does not exist.
    fn list(&self) -> io::Result<Option<Vec<std::ffi::OsString>>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut present = Vec::new();
        for entry in entries {
            let name = entry?.file_name();
            if is_manifest_name(&name) {
                present.push(name);
            }
        }
        Ok(Some(present))
    }
    /// Reads one file again. `just_created` marks a file whose only news is its creation: if it
    /// is still empty, a writer has it open and the read waits for its close.
    pub fn refresh(&mut self, name: &OsStr, just_created: bool) {
        if !is_manifest_name(name) {
            return;
        }
        let path = self.dir.join(name);
        self.reads += 1;
        match self.read(&path, just_created) {
            Reading::Gone => {
                self.files.remove(&path);
                self.fingerprints.remove(&path);
            }
            Reading::NotYetWritten => {}
            Reading::Done(result, fingerprint) => {
                match fingerprint {
                    Some(f) => self.fingerprints.insert(path.clone(), f),
                    None => self.fingerprints.remove(&path),
                };
                self.files.insert(path, (*result).map_err(Arc::new));
            }
        }
    }

    /// Whether the file `name` is the very version already read (by its fingerprint).
    fn unchanged(&self, name: &OsStr) -> bool {
        let path = self.dir.join(name);
        let Some(known) = self.fingerprints.get(&path) else {
            return false;
        };
        std::fs::metadata(&path).is_ok_and(|meta| Fingerprint::of(&meta) == *known)
    }

    fn read(&self, path: &Path, just_created: bool) -> Reading {
        let gone_or = |e: io::Error| {
            if e.kind() == io::ErrorKind::NotFound {
                Reading::Gone
            } else {
                Reading::Done(Box::new(Err(ManifestError::Read(e))), None)
            }
        };
        // Follows symlinks: a link to a manifest is a manifest; a dangling one is nothing.
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) => return gone_or(e),
        };
        if !meta.is_file() {
            return Reading::Done(Box::new(Err(ManifestError::NotAFile)), None);
        }
        let fingerprint = Some(Fingerprint::of(&meta));
        if just_created && meta.len() == 0 {
            return Reading::NotYetWritten;
        }
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) => return gone_or(e),
        };
        let mut data = Vec::new();
        if let Err(e) = file.take(MAX_MANIFEST_BYTES + 1).read_to_end(&mut data) {
            return Reading::Done(Box::new(Err(ManifestError::Read(e))), None);
        }
        if data.len() as u64 > MAX_MANIFEST_BYTES {
            return Reading::Done(Box::new(Err(ManifestError::TooLarge)), fingerprint);
        }
        Reading::Done(
            Box::new(decode_static_pod(path, &data, &self.node_name)),
            fingerprint,
        )
    }

    /// The pods to run, in file order, and every problem, in file order. Settles which file owns
    /// each pod name (see the module comment).
    pub fn snapshot(&mut self) -> (Vec<Pod>, Vec<SourceProblem>) {
        let mut by_name: BTreeMap<String, Vec<&PathBuf>> = BTreeMap::new();
        for (path, result) in &self.files {
            if let Ok(pod) = result {
                by_name.entry(full_name(pod)).or_default().push(path);
            }
        }
        let mut owners = HashMap::new();
        let mut duplicates = HashMap::new();
        for (name, paths) in by_name {
            let previous = self.owners.get(&name).filter(|p| paths.contains(p));
            let Some(owner) = previous.or(paths.first().copied()) else {
                continue;
            };
            for path in paths.into_iter().filter(|p| *p != owner) {
                duplicates.insert(path.clone(), (name.clone(), owner.clone()));
            }
            owners.insert(name, owner.clone());
        }
        self.owners = owners;

        let mut pods = Vec::new();
        let mut problems = Vec::new();
        if let Listing::Failed(error) = &self.listing {
            problems.push(SourceProblem {
                file: self.dir.clone(),
                reason: format!("cannot list the directory: {error}"),
            });
        }
        for (path, result) in &self.files {
            let reason = match (result, duplicates.remove(path)) {
                (Ok(_), Some((name, other))) => {
                    ManifestError::Duplicate { name, other }.to_string()
                }
                (Ok(pod), None) => {
                    pods.push(pod.clone());
                    continue;
                }
                (Err(e), _) => e.to_string(),
            };
            problems.push(SourceProblem {
                file: path.clone(),
                reason,
            });
        }
        (pods, problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n    - name: c\n      image: busybox\n";

    #[test]
    fn a_rescan_reads_only_files_that_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
        std::fs::write(&a, POD).expect("write a");
        std::fs::write(&b, POD.replace("web", "db")).expect("write b");
        let mut manifests = ManifestDir::new(dir.path().to_owned(), "node-1".into());
        manifests.rescan();
        assert_eq!(manifests.reads, 2);
        assert_eq!(manifests.snapshot().0.len(), 2);

        manifests.rescan();
        assert_eq!(manifests.reads, 2, "nothing changed: nothing read");

        // Rewritten behind the watcher's back (same length, another image): read again.
        std::fs::write(&b, POD.replace("web", "db").replace("busybox", "busyb0x"))
            .expect("rewrite b");
        manifests.rescan();
        assert_eq!(manifests.reads, 3);
        let (pods, _) = manifests.snapshot();
        let images: Vec<String> = pods
            .iter()
            .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
            .filter_map(|c| c.image.clone())
            .collect();
        assert!(images.contains(&"busyb0x".to_owned()), "{images:?}");

        // Removed, then back with the same content: a new file, read again.
        std::fs::remove_file(&a).expect("remove a");
        manifests.rescan();
        assert_eq!(manifests.snapshot().0.len(), 1);
        std::fs::write(&a, POD).expect("write a again");
        manifests.rescan();
        assert_eq!(manifests.reads, 4);
        assert_eq!(manifests.snapshot().0.len(), 2);
    }
}
