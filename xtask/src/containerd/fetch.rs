//! Fetching containerd 1.7 and 2.1 from Debian's trixie and sid suites without touching the
//! system's apt configuration or its installed packages: apt reads a private sources file, keeps
//! its lists and cache in private folders under `target/containerd-versions/apt/<suite>/`,
//! `apt-get download` fetches the `.deb`, and `dpkg -x` unpacks it (no dpkg database involved).
//! The mirror (and its keyring) is the one the system's own sources name for its release.
//!
//! Integrity is apt's: `apt-get update` checks the suite's `InRelease` signature against the
//! keyring (`signed-by`, the system's Debian archive keyring) and each index against the signed
//! `Release` hashes; `apt-get download` checks the `.deb`'s size and SHA256 against the signed
//! index and refuses an unauthenticated one. Upstream counterpart: none in the kubelet; the
//! node image builders (kind's `images/base`) install containerd the same way from packages.

use std::{
    fs::{self, File},
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};
use nix::fcntl::{Flock, FlockArg};

use super::version::{self, Version};
use crate::sh;

/// The Debian archive keyring, what apt trusts for a source naming no `signed-by`.
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// A Debian mirror named by the system's apt sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mirror {
    pub uri: String,
    /// The keyring that source is signed with, if it names one as a file.
    pub signed_by: Option<String>,
}

/// The unpacked `version`, fetched first unless a copy that says it is `version` is there.
/// The system's own 1.6 needs nothing.
pub fn ensure(version: Version) -> anyhow::Result<()> {
    let (Some(suite), Some(unpacked)) = (version.suite(), version.unpack_dir()) else {
        if let Some(out) = sh::output(Command::new("containerd").arg("--version"))
            && !version.matches(&out)
        {
            println!(
                "xtask: containerd: NOTE: the system's containerd is not {}: {}",
                version.label(),
                out.trim()
            );
        }
        return Ok(());
    };
    let containerd = version.program("containerd");
    if version::reusable(version, &containerd) {
        return Ok(());
    }
    // Two xtasks starting the same version would otherwise unpack into one folder at once.
    let lock_path = version::versions_dir().join(format!("{}.lock", version.label()));
    fs::create_dir_all(version::versions_dir())
        .with_context(|| format!("creating {}", version::versions_dir().display()))?;
    let lock_file =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| errno)
        .with_context(|| format!("locking {}", lock_path.display()))?;
    if version::reusable(version, &containerd) {
        return Ok(());
    }
    let started = Instant::now();
    println!(
        "xtask: containerd: fetching containerd {} from Debian {suite} into {}",
        version.label(),
        unpacked.display()
    );
    let mirror = system_mirror()?;
    let deb = download(suite, &mirror)?;
    let check = sh::output(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Version"))
        .with_context(|| format!("dpkg-deb -f {} Version failed", deb.display()))?;
    if !check.trim().starts_with(&format!("{}.", version.label())) {
        bail!(
            "Debian {suite}'s containerd is {} now, not {}: update xtask/src/containerd/version.rs",
            check.trim(),
            version.label()
        );
    }
    // Unpacked beside its final place and renamed, so that a failed unpack leaves no half copy
    // that a later run would try.
    let fresh = version::versions_dir().join(format!("{}.new", version.label()));
    remove_dir_if_there(&fresh)?;
    sh::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&fresh))?;
    remove_dir_if_there(&unpacked)?;
    fs::rename(&fresh, &unpacked)
        .with_context(|| format!("renaming {} to {}", fresh.display(), unpacked.display()))?;
    if !version::reusable(version, &containerd) {
        bail!(
            "{} --version does not say {} after unpacking {}",
            containerd.display(),
            version.label(),
            deb.display()
        );
    }
    // The unpacked copy is what is reused; the .deb would only take 30 MB.
    let _ = fs::remove_file(&deb);
    println!(
        "xtask: containerd: containerd {} unpacked in {:.1} s",
        version.label(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `version`'s own `.deb` (the node VM installs it with dpkg), downloaded as [`ensure`] downloads
/// it and kept in `dir`; `None` for the system's release, which has no suite of its own here.
pub fn deb(version: Version, dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let Some(suite) = version.suite() else {
        return Ok(None);
    };
    let kept = dir.join(format!("containerd-{}.deb", version.label()));
    if kept.exists() {
        return Ok(Some(kept));
    }
    let deb = download(suite, &system_mirror()?)?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    fs::copy(&deb, &kept).with_context(|| format!("copying {}", deb.display()))?;
    Ok(Some(kept))
}

/// `apt-get update` and `apt-get download containerd` from `suite` with private sources, lists
/// and cache; the `.deb`'s path.
fn download(suite: &str, mirror: &Mirror) -> anyhow::Result<PathBuf> {
    let apt = version::versions_dir().join("apt").join(suite);
    let lists = apt.join("lists");
    let cache = apt.join("cache");
    let debs = apt.join("debs");
    for dir in [
        lists.join("partial"),
        cache.join("archives").join("partial"),
    ] {
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Only this run's download is in it.
    remove_dir_if_there(&debs)?;
    fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
    let sources = apt.join("sources.list");
    fs::write(&sources, source_line(mirror, suite))
        .with_context(|| format!("writing {}", sources.display()))?;
    let mut update = Command::new("apt-get");
    update.arg("-q");
    private_apt(&mut update, &apt);
    sh::run(update.arg("update"))?;
    let mut get = Command::new("apt-get");
    get.arg("-q").current_dir(&debs);
    private_apt(&mut get, &apt);
    sh::run(get.args(["download", "containerd"]))?;
    let mut found: Vec<PathBuf> = fs::read_dir(&debs)
        .with_context(|| format!("reading {}", debs.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    match (found.pop(), found.is_empty()) {
        (Some(deb), true) => Ok(deb),
        _ => bail!(
            "apt-get download containerd left no single .deb in {}",
            debs.display()
        ),
    }
}

/// Points `command` (apt-get, apt-cache) at the private sources file, lists and cache in `apt`
/// (`sources.list`, `lists/`, `cache/`), never at the system's.
pub(super) fn private_apt(command: &mut Command, apt: &Path) {
    command
        .arg("-o")
        .arg(format!(
            "Dir::Etc::sourcelist={}",
            apt.join("sources.list").display()
        ))
        .args(["-o", "Dir::Etc::sourceparts=-"])
        .arg("-o")
        .arg(format!("Dir::State::Lists={}", apt.join("lists").display()))
        .arg("-o")
        .arg(format!("Dir::Cache={}", apt.join("cache").display()))
        // The package index is all this needs; no AppStream metadata or translations.
        .args([
            "-o",
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false",
        ])
        .args(["-o", "Acquire::Languages=none"])
        // The private folders are root's; apt's `_apt` user could not write them.
        .args(["-o", "APT::Sandbox::User=root"]);
}

/// The private sources file's one line.
pub fn source_line(mirror: &Mirror, suite: &str) -> String {
    let keyring = mirror.signed_by.as_deref().unwrap_or(DEBIAN_KEYRING);
    format!("deb [signed-by={keyring}] {} {suite} main\n", mirror.uri)
}

/// The mirror the system's apt sources name for its own release (`VERSION_CODENAME`).
pub fn system_mirror() -> anyhow::Result<Mirror> {
    let os_release = fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    let codename = os_release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim_matches('"').to_owned())
        .context("/etc/os-release names no VERSION_CODENAME")?;
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut parts: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        parts.sort();
        files.extend(parts);
    }
    let texts: Vec<(String, String)> = files
        .iter()
        .filter_map(|f| Some((f.display().to_string(), fs::read_to_string(f).ok()?)))
        .collect();
    mirror_in(&texts, &codename)
        .with_context(|| format!("no apt source in /etc/apt names a Debian mirror for {codename}"))
}

/// The first source in `files` (name, text) of type `deb` for suite `codename`, in either format:
/// one-line (`*.list`) or deb822 (`*.sources`).
pub fn mirror_in(files: &[(String, String)], codename: &str) -> Option<Mirror> {
    files.iter().find_map(|(name, text)| {
        if Path::new(name).extension().is_some_and(|e| e == "sources") {
            deb822_mirror(text, codename)
        } else {
            one_line_mirror(text, codename)
        }
    })
}

fn one_line_mirror(text: &str, codename: &str) -> Option<Mirror> {
    text.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace().peekable();
        if words.next()? != "deb" {
            return None;
        }
        let mut signed_by = None;
        if words.peek().is_some_and(|w| w.starts_with('[')) {
            for word in words.by_ref() {
                let option = word.trim_start_matches('[').trim_end_matches(']');
                if let Some(keyring) = option.strip_prefix("signed-by=") {
                    signed_by = Some(keyring.to_owned());
                }
                if word.ends_with(']') {
                    break;
                }
            }
        }
        let uri = words.next()?;
        (words.next()? == codename).then(|| Mirror {
            uri: uri.to_owned(),
            signed_by,
        })
    })
}

fn deb822_mirror(text: &str, codename: &str) -> Option<Mirror> {
    text.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                let (key, value) = l.split_once(':')?;
                key.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| value.trim().to_owned())
            })
        };
        let is_deb = field("Types")?.split_whitespace().any(|t| t == "deb");
        let for_codename = field("Suites")?.split_whitespace().any(|s| s == codename);
        let enabled = field("Enabled").is_none_or(|e| e != "no");
        if !(is_deb && for_codename && enabled) {
            return None;
        }
        let uri = field("URIs")?.split_whitespace().next()?.to_owned();
        // An inline key block starts on this line with nothing after the colon.
        let signed_by = field("Signed-By").filter(|k| k.starts_with('/'));
        Some(Mirror { uri, signed_by })
    })
}

pub(super) fn remove_dir_if_there(dir: &Path) -> anyhow::Result<()> {
    match fs::remove_dir_all(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(error).context(format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect()
    }

    #[test]
    fn the_mirror_is_the_systems_own_release_source_in_deb822() {
        let debian = "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
                      URIs: http://deb.debian.org/debian\nSuites: bookworm bookworm-updates\n\
                      Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
                      Types: deb\nURIs: http://deb.debian.org/debian-security\n\
                      Suites: bookworm-security\nComponents: main\n";
        let found = mirror_in(
            &files(&[
                ("/etc/apt/sources.list", ""),
                (
                    "/etc/apt/sources.list.d/google.list",
                    "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n",
                ),
                ("/etc/apt/sources.list.d/debian.sources", debian),
            ]),
            "bookworm",
        );
        assert_eq!(
            found,
            Some(Mirror {
                uri: "http://deb.debian.org/debian".to_owned(),
                signed_by: Some("/usr/share/keyrings/debian-archive-keyring.gpg".to_owned()),
            })
        );
        assert_eq!(
            source_line(found.as_ref().unwrap(), "sid"),
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
             http://deb.debian.org/debian sid main\n"
        );
    }

    #[test]
    fn the_mirror_is_found_in_one_line_sources_and_disabled_ones_are_skipped() {
        let list = "# deb http://old.example/debian bookworm main\n\
                    deb-src http://src.example/debian bookworm main\n\
                    deb [arch=amd64 signed-by=/k.gpg] http://ftp.de.debian.org/debian bookworm main\n";
        assert_eq!(
            mirror_in(&files(&[("/etc/apt/sources.list", list)]), "bookworm"),
            Some(Mirror {
                uri: "http://ftp.de.debian.org/debian".to_owned(),
                signed_by: Some("/k.gpg".to_owned()),
            })
        );
        let disabled = "Types: deb\nURIs: http://a/debian\nSuites: bookworm\nEnabled: no\n";
        assert_eq!(
            mirror_in(&files(&[("x.sources", disabled)]), "bookworm"),
            None
        );
        assert_eq!(
            mirror_in(&files(&[("/etc/apt/sources.list", list)]), "trixie"),
            None
        );
        // No signed-by: apt's default keyring stands in.
        let plain = Mirror {
            uri: "http://m/debian".to_owned(),
            signed_by: None,
        };
        assert!(source_line(&plain, "trixie").contains(DEBIAN_KEYRING));
    }
}
