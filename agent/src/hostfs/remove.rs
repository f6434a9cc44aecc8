//! Removing a directory tree a container may have written, through descriptors: links are
//! removed as links, never followed; a mount point anywhere in the tree stops the removal with
//! its name (nothing below a mount is touched); a tree of any depth is removed with at most
//! [`MAX_OPEN_DEPTH`] directories open at once (deeper ones are first moved up into the top of
//! the tree, on the same filesystem); and a tree something keeps refilling ends with an error
//! instead of a loop.

use std::{
    ffi::{OsStr, OsString},
    path::Path,
};

use super::{Dir, Error, FileKind, Result};

/// How many directories a removal holds open at once.
pub const MAX_OPEN_DEPTH: usize = 64;
/// Entries read from a directory per listing (memory stays bounded in a huge directory).
const BATCH: usize = 1024;
/// How often one directory may be found refilled after it was emptied.
const MAX_REFILLS: usize = 16;

/// Removes `name` in `parent` and everything below it (see the module doc). Gone already is
/// fine.
pub fn remove_all(parent: &Dir, name: &OsStr) -> Result<()> {
    let Some(stat) = parent.stat_at(name)? else {
        return Ok(());
    };
    if stat.kind != FileKind::Directory {
        return parent.remove_file(name);
    }
    let top = match parent.open_dir(name) {
        Ok(top) => top,
        Err(e) if e.is_not_found() => return Ok(()),
        // Swapped for a link since the stat: the link goes.
        Err(Error::Symlink { .. } | Error::NotADirectory { .. }) => {
            return parent.remove_file(name);
        }
        Err(e) => return Err(e),
    };
    empty_tree(top)?;
    parent.remove_empty_dir(name)
}

/// Removes the file or tree at `path`; its parent directories are the node's own.
pub fn remove_path(path: &Path) -> Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(Error::BadComponent {
            name: path.to_string_lossy().into_owned(),
        });
    };
    match Dir::open(parent) {
        Ok(parent) => remove_all(&parent, name),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// One directory being emptied: its descriptor, its name in the one above, how often it was
/// found refilled.
struct Level {
    dir: Dir,
    name: OsString,
    refills: usize,
    /// Listings of it, and entries removed from it: a directory refilled as fast as it is
    /// emptied is given up on.
    listings: usize,
    removed: usize,
}

impl Level {
    fn new(dir: Dir, name: OsString) -> Level {
        Level {
            dir,
            name,
            refills: 0,
            listings: 0,
            removed: 0,
        }
    }
}

/// Empties `top` (which stays).
fn empty_tree(top: Dir) -> Result<()> {
    let top_again = top.try_clone()?;
    let mut stack: Vec<Level> = vec![Level::new(top, OsString::new())];
    let mut moved = 0u64;
    loop {
        let depth = stack.len();
        let Some(level) = stack.last_mut() else { break };
        level.listings += 1;
        if level.listings > level.removed / BATCH + MAX_REFILLS {
            return Err(Error::Unstable {
                path: level.dir.path().to_owned(),
            });
        }
        let names = level.dir.entries(BATCH)?;
        let mut descend = None;
        for name in &names {
            let Some(stat) = level.dir.stat_at(name)? else {
                continue;
            };
            if stat.kind != FileKind::Directory {
                level.dir.remove_file(name)?;
                level.removed += 1;
                continue;
            }
            if depth >= MAX_OPEN_DEPTH {
                // Too deep to hold open: move it up into the top (same filesystem: no mount was
                // crossed to get here) and take it from there.
                let new_name = OsString::from(format!(".swiftlet-removing-{moved}"));
                moved += 1;
                match level.dir.move_to(name, &top_again, &new_name) {
                    Ok(()) => level.removed += 1,
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            match level.dir.open_dir(name) {
                Ok(dir) => {
                    descend = Some(Level::new(dir, name.clone()));
                    break;
                }
                Err(e) if e.is_not_found() => {}
                Err(Error::Symlink { .. } | Error::NotADirectory { .. }) => {
                    level.dir.remove_file(name)?;
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(child) = descend {
            stack.push(child);
            continue;
        }
        if !names.is_empty() {
            // Files removed; list again until the directory reads empty.
            continue;
        }
        let Some(done) = stack.pop() else { break };
        let Some(parent) = stack.last_mut() else {
            break;
        };
        match parent.dir.remove_empty_dir(&done.name) {
            Ok(()) => parent.removed += 1,
            Err(e) if e.errno() == Some(nix::Error::ENOTEMPTY) => {
                parent.refills += 1;
                if parent.refills > MAX_REFILLS {
                    return Err(Error::Unstable {
                        path: done.dir.path().to_owned(),
                    });
                }
            }
            // Busy: a mount point that appeared; the walk refuses it next time round.
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn victim() -> (tempfile::TempDir, PathBuf) {
        let outside = tempfile::tempdir().expect("tempdir");
        let file = outside.path().join("victim");
        std::fs::write(&file, "keep").expect("write");
        (outside, file)
    }

    #[test]
    fn a_tree_goes_and_links_in_it_go_as_links() {
        let root = tempfile::tempdir().expect("tempdir");
        let (outside, victim) = victim();
        let tree = root.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b/c")).expect("mkdir");
        std::fs::write(tree.join("a/b/c/f"), "x").expect("write");
        std::fs::write(tree.join("top"), "x").expect("write");
        std::os::unix::fs::symlink(outside.path(), tree.join("a/out")).expect("symlink");
        std::os::unix::fs::symlink(&victim, tree.join("a/b/file-link")).expect("symlink");
        remove_path(&tree).expect("removed");
        assert!(!tree.exists());
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep");
        // Gone already is fine; a link as the top is removed, not followed.
        remove_path(&tree).expect("again");
        std::os::unix::fs::symlink(outside.path(), &tree).expect("symlink");
        remove_path(&tree).expect("the link");
        assert!(std::fs::symlink_metadata(&tree).is_err());
        assert!(victim.exists());
    }

    #[test]
    fn a_tree_deeper_than_the_open_limit_goes() {
        let root = tempfile::tempdir().expect("tempdir");
        let tree = root.path().join("deep");
        let mut p = tree.clone();
        for _ in 0..(MAX_OPEN_DEPTH * 3) {
            p.push("d");
        }
        std::fs::create_dir_all(&p).expect("mkdir");
        std::fs::write(p.join("f"), "x").expect("write");
        remove_path(&tree).expect("removed");
        assert!(!tree.exists());
    }

    #[test]
    fn a_mount_point_in_the_tree_stops_the_removal_and_is_left_whole() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mounting a tmpfs needs root");
            return;
        }
        let root = tempfile::tempdir().expect("tempdir");
        let tree = root.path().join("tree");
        let point = tree.join("a/mnt");
        std::fs::create_dir_all(&point).expect("mkdir");
        nix::mount::mount(
            Some("tmpfs"),
            &point,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount a tmpfs");
        std::fs::write(point.join("precious"), "keep").expect("write");
        let result = remove_path(&tree);
        let kept = std::fs::read_to_string(point.join("precious"));
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
        assert!(
            matches!(result, Err(Error::MountPoint { ref path }) if path == &point),
            "{result:?}"
        );
        assert_eq!(kept.expect("still there"), "keep");
        remove_path(&tree).expect("removed once unmounted");
        assert!(!tree.exists());
    }
}
