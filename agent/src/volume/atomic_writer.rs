//! Writing a volume's files all at once (upstream `pkg/volume/util/atomic_writer.go`): the
//! files go into a fresh hidden `..<timestamp>` directory, the `..data` symlink is swapped to it
//! with one rename, and each visible top-level name is a symlink through `..data`. A reader never
//! sees half an update; an unchanged payload writes nothing.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::unix::fs::PermissionsExt,
    path::{Component, Path},
    time::SystemTime,
};

use super::{Error, Result, error::io};

/// The symlink to the current payload directory.
pub const DATA_DIR: &str = "..data";
const DATA_DIR_TMP: &str = "..data_tmp";

/// One file: its content and mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Relative path → file.
pub type Payload = BTreeMap<String, FileProjection>;

/// Checks a payload path as upstream's `validatePath`: relative, no `..` element, not starting
/// with `..`.
pub fn validate_path(path: &str) -> std::result::Result<(), &'static str> {
    if path.is_empty() {
        return Err("must not be empty");
    }
    if Path::new(path).is_absolute() {
        return Err("must be a relative path");
    }
    if path.starts_with("..") {
        return Err("must not start with '..'");
    }
    if Path::new(path)
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err("must not contain '..'");
    }
    Ok(())
}

/// Writes `payload` into `target` atomically. Returns whether anything changed.
pub fn write(target: &Path, payload: &Payload, now: SystemTime) -> Result<bool> {
    fs::create_dir_all(target).map_err(io("creating", target))?;
    let data = target.join(DATA_DIR);
    let old_dir = fs::read_link(&data).ok();
    if let Some(old) = &old_dir
        && unchanged(&target.join(old), payload)
    {
        return Ok(false);
    }
    let stamp = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| format!("..{}_{:09}", d.as_secs(), d.subsec_nanos()))
        .unwrap_or_else(|_| "..0".into());
    let ts_dir = unique_dir(target, &stamp)?;
    for (path, file) in payload {
        let dest = ts_dir.join(path);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(io("creating", parent))?;
        }
        fs::write(&dest, &file.data).map_err(io("writing", &dest))?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(file.mode))
            .map_err(io("setting the mode of", &dest))?;
    }
    let ts_name = ts_dir.file_name().map(|n| n.to_owned()).unwrap_or_default();
    let tmp = target.join(DATA_DIR_TMP);
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&ts_name, &tmp).map_err(io("linking", &tmp))?;
    fs::rename(&tmp, &data).map_err(io("renaming", &tmp))?;

    // Visible names: one symlink per top-level element, through `..data`.
    let wanted: BTreeSet<String> = payload.keys().filter_map(|p| top_level(p)).collect();
    for name in &wanted {
        let link = target.join(name);
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA_DIR).join(name), &link)
                .map_err(io("linking", &link))?;
        }
    }
    if let Ok(entries) = fs::read_dir(target) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("..") && !wanted.contains(&name) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
    if let Some(old) = old_dir {
        let old = target.join(old);
        if old != ts_dir {
            let _ = fs::remove_dir_all(old);
        }
    }
    Ok(true)
}

fn top_level(path: &str) -> Option<String> {
    Path::new(path).components().find_map(|c| match c {
        Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
        _ => None,
    })
}

fn unique_dir(target: &Path, stamp: &str) -> Result<std::path::PathBuf> {
    for n in 0.. {
        let dir = if n == 0 {
            target.join(stamp)
        } else {
            target.join(format!("{stamp}.{n}"))
        };
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io("creating", &dir)(e)),
        }
    }
    Err(Error::Io {
        op: "creating",
        path: target.join(stamp),
        source: std::io::Error::other("no free name"),
    })
}

/// Whether `dir` holds exactly `payload` (contents and modes).
fn unchanged(dir: &Path, payload: &Payload) -> bool {
    let mut files = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            return false;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files += 1;
            }
        }
    }
    files == payload.len()
        && payload.iter().all(|(path, file)| {
            let p = dir.join(path);
            fs::read(&p).is_ok_and(|d| d == file.data)
                && fs::metadata(&p).is_ok_and(|m| m.permissions().mode() & 0o7777 == file.mode)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn file(data: &str) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode: 0o644,
        }
    }

    #[test]
    fn paths_are_checked_as_upstream() {
        assert!(validate_path("labels").is_ok());
        assert!(validate_path("a/b").is_ok());
        assert_eq!(validate_path("/abs"), Err("must be a relative path"));
        assert_eq!(validate_path("..x"), Err("must not start with '..'"));
        assert_eq!(validate_path("a/../b"), Err("must not contain '..'"));
        assert_eq!(validate_path(""), Err("must not be empty"));
    }

    #[test]
    fn writes_through_data_symlink_and_swaps_atomically() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut payload = Payload::new();
        payload.insert("name".into(), file("web"));
        payload.insert("sub/labels".into(), file("app=\"x\""));
        assert!(write(dir.path(), &payload, t0).expect("write"));
        let data = fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        assert!(
            data.to_string_lossy().starts_with("..1700000000_"),
            "{data:?}"
        );
        assert_eq!(
            fs::read_link(dir.path().join("name")).expect("link"),
            Path::new("..data/name")
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("name")).expect("read"),
            "web"
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("sub/labels")).expect("read"),
            "app=\"x\""
        );
        // Unchanged: nothing is written.
        assert!(!write(dir.path(), &payload, t0 + Duration::from_secs(1)).expect("write"));
        // Changed: a new directory, the old one and a dropped name are gone.
        payload.remove("sub/labels");
        payload.insert("name".into(), file("api"));
        assert!(write(dir.path(), &payload, t0 + Duration::from_secs(2)).expect("write"));
        let new = fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        assert_ne!(new, data);
        assert!(!dir.path().join(&data).exists());
        assert!(!dir.path().join("sub").exists());
        assert_eq!(
            fs::read_to_string(dir.path().join("name")).expect("read"),
            "api"
        );
    }
}
