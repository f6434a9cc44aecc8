//! hostPath volumes (upstream `pkg/volume/hostpath/host_path.go`): nothing is mounted by the
//! agent, the runtime binds the node's path; set-up only checks (and for the `...OrCreate`
//! types makes) what `type` asks for, with upstream's messages.

use std::{
    fs::{self, OpenOptions},
    os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt},
    path::Path,
};

use super::{Error, Result, error::io};

/// Checks `path` against the hostPath `kind` (upstream `checkTypeInternal`). `""` checks nothing;
/// `DirectoryOrCreate` makes a 0755 directory and `FileOrCreate` a 0644 file when nothing is there.
pub fn check_type(path: &str, kind: &str) -> Result<()> {
    let p = Path::new(path);
    // Upstream stats through symlinks.
    let file_type = || fs::metadata(p).ok().map(|m| m.file_type());
    let not_a = |expected| Error::HostPathType {
        path: path.to_owned(),
        expected,
    };
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" | "Directory" => {
            if kind == "DirectoryOrCreate" && fs::symlink_metadata(p).is_err() {
                fs::create_dir_all(p).map_err(io("creating", p))?;
                fs::set_permissions(p, fs::Permissions::from_mode(0o755))
                    .map_err(io("setting the mode of", p))?;
                return Ok(());
            }
            file_type()
                .is_some_and(|t| t.is_dir())
                .then_some(())
                .ok_or_else(|| not_a("directory"))
        }
        "FileOrCreate" | "File" => {
            if kind == "FileOrCreate" && fs::symlink_metadata(p).is_err() {
                // As upstream, the parent must exist.
                let file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o644)
                    .open(p)
                    .map_err(io("creating", p))?;
                // The umask does not decide.
                file.set_permissions(fs::Permissions::from_mode(0o644))
                    .map_err(io("setting the mode of", p))?;
                return Ok(());
            }
            file_type()
                .is_some_and(|t| t.is_file())
                .then_some(())
                .ok_or_else(|| not_a("file"))
        }
        "Socket" => file_type()
            .is_some_and(|t| t.is_socket())
            .then_some(())
            .ok_or_else(|| not_a("socket file")),
        "CharDevice" => file_type()
            .is_some_and(|t| t.is_char_device())
            .then_some(())
            .ok_or_else(|| not_a("character device")),
        "BlockDevice" => file_type()
            .is_some_and(|t| t.is_block_device())
            .then_some(())
            .ok_or_else(|| not_a("block device")),
        other => Err(Error::InvalidHostPathType {
            kind: other.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_checks_with_upstreams_message() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("file");
        fs::write(&file, "x").expect("write");
        let socket = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let d = dir.path().to_string_lossy().into_owned();
        let f = file.to_string_lossy().into_owned();
        let s = socket.to_string_lossy().into_owned();
        let missing = dir.path().join("missing").to_string_lossy().into_owned();
        let ok = [
            (d.as_str(), ""),
            (missing.as_str(), ""),
            (d.as_str(), "Directory"),
            (d.as_str(), "DirectoryOrCreate"),
            (f.as_str(), "File"),
            (f.as_str(), "FileOrCreate"),
            (s.as_str(), "Socket"),
            ("/dev/null", "CharDevice"),
        ];
        for (path, kind) in ok {
            assert!(check_type(path, kind).is_ok(), "{path} {kind}");
        }
        let failing = [
            (
                f.clone(),
                "Directory",
                format!("hostPath type check failed: {f} is not a directory"),
            ),
            (
                f.clone(),
                "DirectoryOrCreate",
                format!("hostPath type check failed: {f} is not a directory"),
            ),
            (
                d.clone(),
                "File",
                format!("hostPath type check failed: {d} is not a file"),
            ),
            (
                d.clone(),
                "FileOrCreate",
                format!("hostPath type check failed: {d} is not a file"),
            ),
            (
                missing.clone(),
                "File",
                format!("hostPath type check failed: {missing} is not a file"),
            ),
            (
                f.clone(),
                "Socket",
                format!("hostPath type check failed: {f} is not a socket file"),
            ),
            (
                f.clone(),
                "CharDevice",
                format!("hostPath type check failed: {f} is not a character device"),
            ),
            (
                "/dev/null".to_owned(),
                "BlockDevice",
                "hostPath type check failed: /dev/null is not a block device".to_owned(),
            ),
            (
                d.clone(),
                "Pipe",
                "Pipe is an invalid volume type".to_owned(),
            ),
        ];
        for (path, kind, want) in failing {
            let got = check_type(&path, kind).err().map(|e| e.to_string());
            assert_eq!(got.as_deref(), Some(want.as_str()), "{path} {kind}");
        }
    }

    #[test]
    fn or_create_types_make_what_is_missing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let new_dir = dir.path().join("a/b");
        check_type(&new_dir.to_string_lossy(), "DirectoryOrCreate").expect("made");
        let meta = fs::metadata(&new_dir).expect("stat");
        assert!(meta.is_dir());
        assert_eq!(meta.permissions().mode() & 0o777, 0o755);
        let new_file = dir.path().join("f");
        check_type(&new_file.to_string_lossy(), "FileOrCreate").expect("made");
        assert!(fs::metadata(&new_file).expect("stat").is_file());
        // The parent of a FileOrCreate must exist, as upstream.
        let orphan = dir.path().join("nope/f");
        assert!(check_type(&orphan.to_string_lossy(), "FileOrCreate").is_err());
    }
}
