//! Writing a volume's files all at once (upstream `pkg/volume/util/atomic_writer.go`): the
//! files go into a fresh hidden `..<timestamp>` directory, the `..data` symlink is swapped to it
//! with one rename, and each visible top-level name is a symlink through `..data`. A reader never
//! sees half an update; an unchanged payload writes nothing.
//!
//! Everything happens through the volume's directory descriptor, and nothing found in the
//! volume is trusted: `..data` is read with `readlinkat` and accepted as the old payload only
//! when it names a `..<timestamp>` entry (swiftlet's own name form) that is a real directory
//! directly in the volume; anything else there (a link planted to any other place, a directory
//! or file in the way) is replaced, and what it pointed at is never read, written or removed.
//! Removal goes through [`hostfs::remove_all`], which follows no link and crosses no mount.
//! Upstream trusts `..data` and relies on these volumes being read-only in containers; swiftlet
//! does not rely on that alone.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::{OsStr, OsString},
    io::Read as _,
    path::{Component, Path},
    time::SystemTime,
};

use super::{Error, Result};
use crate::hostfs::{self, Dir, FileKind};

/// The symlink to the current payload directory.
pub const DATA_DIR: &str = "..data";
const DATA_DIR_TMP: &str = "..data_tmp";
/// Upstream's mode of the payload directory and the directories in it: every user may
/// traverse, so a container user other than root reads the files its modes allow.
const PAYLOAD_DIR_MODE: u32 = 0o755;
/// How many entries the unchanged check reads from the old payload before giving up on it.
const MAX_COMPARED_ENTRIES: usize = 4096;

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

/// What [`write`] calls on the volume and the new payload directory before the swap (upstream's
/// `setPerms`, where fsGroup ownership is applied).
pub type SetPerms<'a> = &'a dyn Fn(&Dir, &Dir) -> Result<()>;

/// Writes `payload` into the volume open as `volume`, atomically. Returns whether anything
/// changed.
pub fn write(
    volume: &Dir,
    payload: &Payload,
    now: SystemTime,
    set_perms: SetPerms<'_>,
) -> Result<bool> {
    let payload = clean(payload)?;
    let old = old_payload_dir(volume)?;
    let wanted: BTreeSet<OsString> = payload.keys().filter_map(|p| top_level(p)).collect();
    if let Some(old) = &old
        && unchanged(volume, old, &payload)
        && visible_links_right(volume, &wanted)?
    {
        return Ok(false);
    }
    let (ts_name, ts_dir) = new_payload_dir(volume, now)?;
    for (path, file) in &payload {
        write_file(&ts_dir, path, file)?;
    }
    set_perms(volume, &ts_dir)?;

    // The swap: a fresh link under a temporary name, renamed over `..data` in one step.
    let tmp = OsStr::new(DATA_DIR_TMP);
    hostfs::remove_all(volume, tmp)?;
    volume.symlink(&ts_name, tmp)?;
    let data = OsStr::new(DATA_DIR);
    if let Err(e) = volume.rename(tmp, data) {
        // A directory planted as `..data` cannot be renamed over: it goes, and the swap again.
        if volume.stat_at(data)?.map(|s| s.kind) != Some(FileKind::Directory) {
            return Err(e.into());
        }
        hostfs::remove_all(volume, data)?;
        volume.rename(tmp, data)?;
    }

    // Visible names: one link per top-level element, through `..data`; whatever else holds a
    // wanted name is replaced, and names no longer wanted go.
    for name in &wanted {
        if !is_visible_link(volume, name)? {
            hostfs::remove_all(volume, name)?;
            volume.symlink(Path::new(DATA_DIR).join(name).as_os_str(), name)?;
        }
    }
    for name in volume.entries(MAX_COMPARED_ENTRIES)? {
        if !name.as_encoded_bytes().starts_with(b"..") && !wanted.contains(&name) {
            hostfs::remove_all(volume, &name)?;
        }
    }
    if let Some(old) = old
        && old != ts_name
    {
        hostfs::remove_all(volume, &old)?;
    }
    Ok(true)
}

/// The payload with its paths checked again (each caller validated them; the writer does not
/// depend on it).
fn clean(payload: &Payload) -> Result<Payload> {
    for path in payload.keys() {
        validate_path(path).map_err(|reason| Error::BadSpec {
            volume: String::new(),
            field: "path",
            reason: format!("{path:?} {reason}"),
        })?;
    }
    Ok(payload.clone())
}

/// The name `..data` points at, if it is one of swiftlet's payload directories: a `..<digits>_
/// <digits>[.<digits>]` entry directly in the volume that is a real directory.
fn old_payload_dir(volume: &Dir) -> Result<Option<OsString>> {
    let Some(target) = volume.read_link(OsStr::new(DATA_DIR))? else {
        return Ok(None);
    };
    if !is_payload_dir_name(&target) {
        tracing::warn!(volume = %volume.path().display(), target = %target.to_string_lossy(), "..data pointed at something swiftlet did not write; replacing it");
        return Ok(None);
    }
    let real_dir = volume
        .stat_at(&target)?
        .is_some_and(|s| s.kind == FileKind::Directory);
    Ok(real_dir.then_some(target))
}

/// `..<secs>_<nanos>` with an optional `.<n>` (see [`new_payload_dir`]).
fn is_payload_dir_name(name: &OsStr) -> bool {
    let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("..")) else {
        return false;
    };
    let (stamp, n) = match rest.split_once('.') {
        Some((stamp, n)) => (stamp, Some(n)),
        None => (rest, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    stamp
        .split_once('_')
        .is_some_and(|(secs, nanos)| digits(secs) && digits(nanos))
        && n.is_none_or(digits)
}

/// Makes the new payload directory, `..<secs>_<nanos>` (`.<n>` added when taken).
fn new_payload_dir(volume: &Dir, now: SystemTime) -> Result<(OsString, Dir)> {
    let stamp = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| format!("..{}_{:09}", d.as_secs(), d.subsec_nanos()))
        .unwrap_or_else(|_| "..0_000000000".into());
    for n in 0..1000 {
        let name = if n == 0 {
            OsString::from(&stamp)
        } else {
            OsString::from(format!("{stamp}.{n}"))
        };
        match volume.create_dir(&name, PAYLOAD_DIR_MODE, false) {
            Ok(dir) => return Ok((name, dir)),
            Err(e) if e.errno() == Some(nix::Error::EEXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Io {
        op: "creating",
        path: volume.child_path(OsStr::new(&stamp)),
        source: std::io::Error::other("no free name"),
    })
}

/// Writes one payload file below the (fresh, swiftlet's own) payload directory.
fn write_file(ts_dir: &Dir, path: &str, file: &FileProjection) -> Result<()> {
    let parts: Vec<&OsStr> = Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect();
    let Some((name, dirs)) = parts.split_last() else {
        return Ok(());
    };
    let mut opened: Option<Dir> = None;
    for part in dirs {
        let parent = opened.as_ref().unwrap_or(ts_dir);
        let next = parent.create_dir(part, PAYLOAD_DIR_MODE, true)?;
        opened = Some(next);
    }
    let parent = opened.as_ref().unwrap_or(ts_dir);
    parent.write_new_file(name, &file.data, file.mode)?;
    Ok(())
}

fn top_level(path: &str) -> Option<OsString> {
    Path::new(path).components().find_map(|c| match c {
        Component::Normal(n) => Some(n.to_owned()),
        _ => None,
    })
}

/// Whether `name` is the link swiftlet makes for it: `..data/<name>`.
fn is_visible_link(volume: &Dir, name: &OsStr) -> Result<bool> {
    Ok(volume
        .read_link(name)?
        .is_some_and(|t| Path::new(&t) == Path::new(DATA_DIR).join(name)))
}

fn visible_links_right(volume: &Dir, wanted: &BTreeSet<OsString>) -> Result<bool> {
    for name in wanted {
        if !is_visible_link(volume, name)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether old payload directory `old` holds exactly `payload` (contents and modes), read
/// through descriptors.
fn unchanged(volume: &Dir, old: &OsStr, payload: &Payload) -> bool {
    let Ok(dir) = volume.open_dir(old) else {
        return false;
    };
    let same_files = payload.iter().all(|(path, want)| {
        let Ok(mut file) = dir.open_file(Path::new(path)) else {
            return false;
        };
        let Ok(meta) = file.metadata() else {
            return false;
        };
        use std::os::unix::fs::PermissionsExt as _;
        if meta.permissions().mode() & 0o7777 != want.mode || meta.len() != want.data.len() as u64 {
            return false;
        }
        let mut data = Vec::with_capacity(want.data.len());
        file.read_to_end(&mut data).is_ok() && data == want.data
    });
    same_files && count_files(&dir, payload.len() + 1) == Some(payload.len())
}

/// Files (non-directories) below `dir`, counting no further than `limit`; `None` when it cannot
/// be read or holds too many entries.
fn count_files(dir: &Dir, limit: usize) -> Option<usize> {
    let mut files = 0;
    let mut seen = 0;
    let mut stack = vec![dir.try_clone().ok()?];
    while let Some(d) = stack.pop() {
        for name in d.entries(MAX_COMPARED_ENTRIES).ok()? {
            seen += 1;
            if seen > MAX_COMPARED_ENTRIES {
                return None;
            }
            match d.stat_at(&name).ok()??.kind {
                FileKind::Directory => stack.push(d.open_dir(&name).ok()?),
                _ => files += 1,
            }
            if files >= limit {
                return Some(files);
            }
        }
    }
    Some(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs, os::unix::fs::PermissionsExt as _, time::Duration};

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

    fn no_perms(_: &Dir, _: &Dir) -> Result<()> {
        Ok(())
    }

    fn write_at(dir: &Path, payload: &Payload, now: SystemTime) -> Result<bool> {
        write(&Dir::open(dir).expect("open"), payload, now, &no_perms)
    }

    /// A directory outside the volume with a file in it, as an attacker's target.
    fn victim() -> (tempfile::TempDir, std::path::PathBuf) {
        let outside = tempfile::tempdir().expect("tempdir");
        let file = outside.path().join("victim");
        fs::write(&file, "keep").expect("write");
        (outside, file)
    }

    fn t0() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    #[test]
    fn writes_through_data_symlink_and_swaps_atomically() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t0 = t0();
        let mut payload = Payload::new();
        payload.insert("name".into(), file("web"));
        payload.insert("sub/labels".into(), file("app=\"x\""));
        assert!(write_at(dir.path(), &payload, t0).expect("write"));
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
        let mode = |p: &str| {
            fs::metadata(dir.path().join(p))
                .expect("stat")
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("name"), 0o644);
        assert_eq!(mode(&format!("{}/sub", data.display())), 0o755);
        assert_eq!(mode(&data.to_string_lossy()), 0o755);
        // Unchanged: nothing is written.
        assert!(!write_at(dir.path(), &payload, t0 + Duration::from_secs(1)).expect("write"));
        // Changed: a new directory, the old one and a dropped name are gone.
        payload.remove("sub/labels");
        payload.insert("name".into(), file("api"));
        assert!(write_at(dir.path(), &payload, t0 + Duration::from_secs(2)).expect("write"));
        let new = fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        assert_ne!(new, data);
        assert!(!dir.path().join(&data).exists());
        assert!(!dir.path().join("sub").exists());
        assert_eq!(
            fs::read_to_string(dir.path().join("name")).expect("read"),
            "api"
        );
    }

    #[test]
    fn a_planted_data_link_is_replaced_and_its_target_untouched() {
        let (outside, victim) = victim();
        let mut payload = Payload::new();
        payload.insert("name".into(), file("web"));
        // To any directory, to a `..<timestamp>` name that is itself a link out, to a relative
        // path that climbs out.
        let targets = [
            outside.path().to_owned(),
            std::path::PathBuf::from("..1_000000001"),
            std::path::PathBuf::from("../../../../../../../..").join(outside.path()),
        ];
        for (i, target) in targets.iter().enumerate() {
            let dir = tempfile::tempdir().expect("tempdir");
            let now = t0() + Duration::from_secs(i as u64);
            assert!(write_at(dir.path(), &payload, now).expect("first write"));
            fs::remove_file(dir.path().join(DATA_DIR)).expect("rm ..data");
            std::os::unix::fs::symlink(outside.path(), dir.path().join("..1_000000001"))
                .expect("symlink");
            std::os::unix::fs::symlink(target, dir.path().join(DATA_DIR)).expect("plant");
            payload.insert("name".into(), file(&format!("v{i}")));
            assert!(write_at(dir.path(), &payload, now + Duration::from_secs(60)).expect("write"));
            assert_eq!(
                fs::read_to_string(&victim).expect("victim"),
                "keep",
                "{target:?}"
            );
            assert!(outside.path().is_dir());
            let data = fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
            assert!(is_payload_dir_name(data.as_os_str()), "{data:?}");
            assert_eq!(
                fs::read_to_string(dir.path().join("name")).expect("read"),
                format!("v{i}")
            );
        }
    }

    #[test]
    fn planted_names_and_links_in_the_volume_are_replaced_never_followed() {
        let (outside, victim) = victim();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut payload = Payload::new();
        payload.insert("name".into(), file("web"));
        assert!(write_at(dir.path(), &payload, t0()).expect("write"));
        let old = fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        // A visible name pointing out, a stray link out, a link out inside the old payload, and
        // a directory as `..data_tmp` with a link out in it.
        fs::remove_file(dir.path().join("name")).expect("rm");
        std::os::unix::fs::symlink(&victim, dir.path().join("name")).expect("plant");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("stray")).expect("plant");
        std::os::unix::fs::symlink(outside.path(), dir.path().join(&old).join("out"))
            .expect("plant");
        fs::create_dir(dir.path().join(DATA_DIR_TMP)).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), dir.path().join(DATA_DIR_TMP).join("out"))
            .expect("plant");
        payload.insert("name".into(), file("api"));
        assert!(write_at(dir.path(), &payload, t0() + Duration::from_secs(5)).expect("write"));
        assert_eq!(fs::read_to_string(&victim).expect("victim"), "keep");
        assert_eq!(
            fs::read_link(dir.path().join("name")).expect("link"),
            Path::new("..data/name")
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("name")).expect("read"),
            "api"
        );
        assert!(fs::symlink_metadata(dir.path().join("stray")).is_err());
        assert!(!dir.path().join(&old).exists());
        // A directory as `..data` goes too.
        let data = fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        fs::remove_file(dir.path().join(DATA_DIR)).expect("rm");
        fs::create_dir(dir.path().join(DATA_DIR)).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), dir.path().join(DATA_DIR).join("out"))
            .expect("plant");
        payload.insert("name".into(), file("db"));
        assert!(write_at(dir.path(), &payload, t0() + Duration::from_secs(9)).expect("write"));
        assert_eq!(fs::read_to_string(&victim).expect("victim"), "keep");
        assert_eq!(
            fs::read_to_string(dir.path().join("name")).expect("read"),
            "db"
        );
        // The payload `..data` named before it was replaced was not accepted: it stays.
        assert!(dir.path().join(&data).is_dir());
    }

    #[test]
    fn the_unchanged_check_does_not_follow_a_link_in_the_old_payload() {
        let (_outside, victim) = victim();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut payload = Payload::new();
        payload.insert("name".into(), file("keep"));
        assert!(write_at(dir.path(), &payload, t0()).expect("write"));
        let old = fs::read_link(dir.path().join(DATA_DIR)).expect("..data");
        // The file swapped for a link to a file with the same content: not "unchanged".
        fs::remove_file(dir.path().join(&old).join("name")).expect("rm");
        std::os::unix::fs::symlink(&victim, dir.path().join(&old).join("name")).expect("plant");
        assert!(write_at(dir.path(), &payload, t0() + Duration::from_secs(1)).expect("write"));
        assert_eq!(fs::read_to_string(&victim).expect("victim"), "keep");
        assert!(
            fs::symlink_metadata(dir.path().join(DATA_DIR).join("name"))
                .expect("stat")
                .is_file()
        );
    }
}
