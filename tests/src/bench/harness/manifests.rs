//! Static pod manifests written so that each appears in the watched directory whole, by a rename,
//! at an instant the benchmark records.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use anyhow::{Context as _, Result};

/// Writes every `(file name, text)` into `staging` first, then renames each into `manifests` (the
/// same file system, so each appears whole and at once) and returns the instant each rename
/// returned. The renames follow one another with nothing in between: the batch is written "at
/// once".
pub fn write_all(
    files: &[(String, String)],
    staging: &Path,
    manifests: &Path,
) -> Result<Vec<Instant>> {
    let mut staged: Vec<(PathBuf, PathBuf)> = Vec::with_capacity(files.len());
    for (name, text) in files {
        let from = staging.join(name);
        std::fs::write(&from, text).with_context(|| format!("writing {}", from.display()))?;
        staged.push((from, manifests.join(name)));
    }
    let mut written = Vec::with_capacity(staged.len());
    for (from, to) in &staged {
        std::fs::rename(from, to)
            .with_context(|| format!("renaming {} to {}", from.display(), to.display()))?;
        written.push(Instant::now());
    }
    Ok(written)
}

/// Removes the files `names` from `manifests` (those already gone are fine).
pub fn remove_all(names: &[String], manifests: &Path) -> Result<()> {
    for name in names {
        let path = manifests.join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", path.display()));
            }
            _ => {}
        }
    }
    Ok(())
}
