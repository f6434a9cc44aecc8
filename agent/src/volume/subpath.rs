//! `subPath` of a volumeMount (upstream `makeMounts` in `kubelet_pods.go` and
//! `mount-utils`' `SafeMakeDir`): relative, no `..`, made below the volume with the volume's mode
//! when missing, and never resolving (through a symlink a container left in the volume) to a
//! place outside it.
//!
//! Deviation: upstream then bind-mounts the resolved directory into
//! `pods/<uid>/volume-subpaths/` through an fd it opened without following symlinks, which also
//! closes the window between this check and the runtime's bind. swiftlet hands the resolved path
//! to the runtime directly.

use std::{
    fs,
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Component, Path, PathBuf},
};

use super::{Error, Result};

/// `subPathExpr` with the container's `$(VAR)`s expanded (upstream
/// `ExpandContainerVolumeMounts`): a variable that is undefined or empty is an error.
pub fn expand(expr: &str, env: &[k8s_cri::v1::KeyValue]) -> Result<String> {
    let defined: std::collections::HashMap<String, String> = env
        .iter()
        .filter(|kv| !kv.value.is_empty())
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    let mut missing: Vec<String> = referenced(expr)
        .into_iter()
        .filter(|name| !defined.contains_key(name))
        .collect();
    missing.sort();
    missing.dedup();
    if !missing.is_empty() {
        return Err(Error::SubPathExprMissing {
            names: missing.join(", "),
        });
    }
    crate::kuberuntime::env::expand(expr, &defined)
        .map_err(|source| Error::SubPathExprTooLong { source })
}

/// The names `$(NAME)` refers to in `input` (`$$` escapes a `$`).
fn referenced(input: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            names.push(inner[..end].to_owned());
            rest = &inner[end + 1..];
        } else {
            rest = after;
        }
    }
    names
}

/// Upstream `ValidatePathNoBacksteps` plus the absolute-path check.
pub fn validate(sub_path: &str) -> Result<()> {
    if Path::new(sub_path).is_absolute() {
        return Err(Error::AbsoluteSubPath {
            sub_path: sub_path.to_owned(),
        });
    }
    if sub_path.split('/').any(|part| part == "..") {
        return Err(Error::SubPathBacksteps {
            sub_path: sub_path.to_owned(),
        });
    }
    Ok(())
}

/// The host path of `sub_path` below `volume_path`, making missing directories (with the
/// volume's mode) one component at a time and following symlinks only while they stay inside
/// the volume.
pub fn resolve(volume: &str, volume_path: &Path, sub_path: &str) -> Result<PathBuf> {
    validate(sub_path)?;
    let escapes = || Error::SubPathEscapes {
        sub_path: sub_path.to_owned(),
        volume: volume.to_owned(),
    };
    let root = fs::canonicalize(volume_path).map_err(super::error::io("resolving", volume_path))?;
    let mode = fs::metadata(&root)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o755);
    let parts: Vec<&std::ffi::OsStr> = Path::new(sub_path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p),
            _ => None,
        })
        .collect();
    let mut current = root.clone();
    for (i, part) in parts.iter().enumerate() {
        let next = current.join(part);
        match fs::symlink_metadata(&next) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .mode(mode)
                    .create(&next)
                    .map_err(super::error::io("creating", &next))?;
                // The umask does not apply to the subPath either.
                fs::set_permissions(&next, fs::Permissions::from_mode(mode))
                    .map_err(super::error::io("setting the mode of", &next))?;
                current = next;
            }
            Err(e) => return Err(super::error::io("inspecting", &next)(e)),
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = fs::canonicalize(&next).map_err(|_| escapes())?;
                if !target.starts_with(&root) {
                    return Err(escapes());
                }
                current = target;
            }
            Ok(meta) if meta.is_dir() || i + 1 == parts.len() => current = next,
            Ok(_) => return Err(escapes()),
        }
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_and_backstepping_sub_paths_are_refused() {
        let cases = [
            (
                "/etc",
                Some("error SubPath `/etc` must not be an absolute path"),
            ),
            (
                "../x",
                Some("unable to provision SubPath `../x`: must not contain '..'"),
            ),
            (
                "a/../../x",
                Some("unable to provision SubPath `a/../../x`: must not contain '..'"),
            ),
            ("a/b", None),
            ("a..b/c", None),
            ("./a", None),
        ];
        for (sub, want) in cases {
            let got = validate(sub).err().map(|e| e.to_string());
            assert_eq!(got.as_deref(), want, "{sub}");
        }
    }

    #[test]
    fn sub_path_expr_expands_the_environment_and_names_what_is_missing() {
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| k8s_cri::v1::KeyValue {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect::<Vec<_>>()
        };
        let e = env(&[("POD", "web-1"), ("EMPTY", "")]);
        assert_eq!(expand("logs/$(POD)", &e).expect("expanded"), "logs/web-1");
        assert_eq!(expand("a$$(POD)", &e).expect("escaped"), "a$(POD)");
        let err = expand("$(EMPTY)/$(NOPE)/$(POD)", &e)
            .err()
            .map(|e| e.to_string());
        assert_eq!(err.as_deref(), Some("missing value for EMPTY, NOPE"));
    }

    #[test]
    fn missing_dirs_are_made_with_the_volume_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("vol");
        fs::create_dir(&volume).expect("mkdir");
        fs::set_permissions(&volume, fs::Permissions::from_mode(0o777)).expect("chmod");
        let got = resolve("vol", &volume, "a/b").expect("resolved");
        let want = fs::canonicalize(&volume).expect("canonical").join("a/b");
        assert_eq!(got, want);
        let mode = fs::metadata(&got).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o777);
        // Existing: the same answer.
        assert_eq!(resolve("vol", &volume, "a/b").expect("again"), want);
    }

    #[test]
    fn a_symlink_out_of_the_volume_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("vol");
        let outside = dir.path().join("outside");
        fs::create_dir(&volume).expect("mkdir");
        fs::create_dir(&outside).expect("mkdir");
        std::os::unix::fs::symlink(&outside, volume.join("out")).expect("symlink");
        std::os::unix::fs::symlink("inner", volume.join("in")).expect("symlink");
        fs::create_dir(volume.join("inner")).expect("mkdir");
        let err = resolve("vol", &volume, "out/new")
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("subPath `out/new` of volume \"vol\" resolves outside the volume")
        );
        assert!(!outside.join("new").exists(), "nothing made outside");
        let inside = resolve("vol", &volume, "in/x").expect("inside");
        assert!(inside.ends_with("vol/inner/x"), "{inside:?}");
    }
}
