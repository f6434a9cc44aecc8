//! crun for the private containerd's `crun` handler, built from Debian trixie's source into
//! `target/crun/`. Bookworm's crun 1.8 refuses every OCI spec whose `ociVersion` is not 1.0.x
//! ("unknown version specified"): containerd 1.7 writes 1.1.0 and 2.x writes 1.2.x. Trixie's
//! crun binary needs glibc 2.38, which bookworm lacks; its source builds against bookworm's own
//! libraries (yajl, seccomp, libcap, systemd) in well under a minute.
//!
//! Integrity is apt's, as in `fetch.rs`: a private `deb-src` source for trixie, whose signed
//! index gives the upstream tarball's SHA-256, checked here before the tarball is unpacked
//! (`apt-get source --download-only` fails on this mirror for the signature and Debian files
//! the build does not need, so its exit status is not what says the tarball is good).

use std::{
    fs::{self, File},
    io::Read as _,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};
use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest as _, Sha256};

use super::fetch;
use crate::sh;

const SUITE: &str = "trixie";

/// `target/crun/`: the built binary, and apt's private files.
fn dir() -> PathBuf {
    sh::root().join("target").join("crun")
}

/// The built crun, which the `crun` handler runs.
pub fn binary() -> PathBuf {
    dir().join("crun")
}

/// The first line of `crun --version` of the built binary, if it runs.
fn built_version() -> Option<String> {
    let out = sh::output(Command::new(binary()).arg("--version"))?;
    out.lines().next().map(str::to_owned)
}

/// The built crun, built first unless one is there and runs.
pub fn ensure() -> anyhow::Result<PathBuf> {
    if built_version().is_some() {
        return Ok(binary());
    }
    fs::create_dir_all(dir()).with_context(|| format!("creating {}", dir().display()))?;
    // Two xtasks starting containerd at once would otherwise build into one folder.
    let lock_path = dir().join("build.lock");
    let lock_file =
        File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| errno)
        .with_context(|| format!("locking {}", lock_path.display()))?;
    if built_version().is_some() {
        return Ok(binary());
    }
    let started = Instant::now();
    println!(
        "xtask: crun: building crun from Debian {SUITE}'s source into {} (bookworm's crun cannot \
         run the OCI specs of containerd 1.7 and 2.x)",
        dir().display()
    );
    let tarball = download()?;
    let build = dir().join("build");
    fetch::remove_dir_if_there(&build)?;
    fs::create_dir_all(&build).with_context(|| format!("creating {}", build.display()))?;
    let file = File::open(&tarball).with_context(|| format!("opening {}", tarball.display()))?;
    tar::Archive::new(flate2::read::GzDecoder::new(file))
        .unpack(&build)
        .with_context(|| format!("unpacking {}", tarball.display()))?;
    let source = fs::read_dir(&build)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("configure").is_file())
        .with_context(|| {
            format!(
                "no crun source folder with a configure script in {}",
                build.display()
            )
        })?;
    // CRIU (checkpoints) is not on these machines and nothing here checkpoints.
    sh::run(
        Command::new("./configure")
            .arg("--disable-criu")
            .current_dir(&source),
    )?;
    let jobs = std::thread::available_parallelism().map_or(1, usize::from);
    sh::run(
        // The whole default target: it generates the headers (git-version.h) `crun` needs.
        Command::new("make")
            .arg(format!("-j{jobs}"))
            .current_dir(&source),
    )?;
    let fresh = dir().join("crun.new");
    fs::copy(source.join("crun"), &fresh)
        .with_context(|| format!("copying the built crun to {}", fresh.display()))?;
    fs::rename(&fresh, binary())
        .with_context(|| format!("renaming {} to {}", fresh.display(), binary().display()))?;
    fetch::remove_dir_if_there(&build)?;
    let _ = fs::remove_file(&tarball);
    let version = built_version()
        .with_context(|| format!("the built {} does not run", binary().display()))?;
    println!(
        "xtask: crun: built {version} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(binary())
}

/// The upstream tarball of trixie's crun source package, its SHA-256 checked against the signed
/// index.
fn download() -> anyhow::Result<PathBuf> {
    let apt = dir().join("apt");
    let lists = apt.join("lists");
    let cache = apt.join("cache");
    let downloads = apt.join("downloads");
    for folder in [
        lists.join("partial"),
        cache.join("archives").join("partial"),
    ] {
        fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    }
    fetch::remove_dir_if_there(&downloads)?;
    fs::create_dir_all(&downloads).with_context(|| format!("creating {}", downloads.display()))?;
    let sources = apt.join("sources.list");
    let line = fetch::source_line(&fetch::system_mirror()?, SUITE);
    fs::write(&sources, line.replacen("deb ", "deb-src ", 1))
        .with_context(|| format!("writing {}", sources.display()))?;
    let mut update = Command::new("apt-get");
    update.arg("-q");
    fetch::private_apt(&mut update, &apt);
    sh::run(update.arg("update"))?;
    let mut showsrc = Command::new("apt-cache");
    fetch::private_apt(&mut showsrc, &apt);
    let record = sh::output(showsrc.args(["showsrc", "crun"]))
        .context("apt-cache showsrc crun gave nothing")?;
    let (name, sha256) = orig_tarball(&record)
        .with_context(|| format!("no upstream tarball in Debian {SUITE}'s crun source record"))?;
    let mut get = Command::new("apt-get");
    get.arg("-q").current_dir(&downloads);
    fetch::private_apt(&mut get, &apt);
    // Judged by the tarball's hash below, not the exit status (see the module's docs).
    let _ = get.args(["source", "--download-only", "crun"]).status();
    let tarball = downloads.join(&name);
    let actual = sha256_of(&tarball)?;
    if actual != sha256 {
        bail!(
            "{} has SHA-256 {actual}, but Debian {SUITE}'s signed index says {sha256}",
            tarball.display()
        );
    }
    Ok(tarball)
}

/// (file name, SHA-256) of the `.orig.tar.gz` in an `apt-cache showsrc` record.
fn orig_tarball(record: &str) -> Option<(String, String)> {
    let mut in_sha256 = false;
    for line in record.lines() {
        if !line.starts_with(' ') {
            in_sha256 = line.starts_with("Checksums-Sha256:");
            continue;
        }
        if in_sha256 {
            let mut fields = line.split_whitespace();
            let (Some(hash), Some(_size), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if name.ends_with(".orig.tar.gz") {
                return Some((name.to_owned(), hash.to_owned()));
            }
        }
    }
    None
}

fn sha256_of(path: &Path) -> anyhow::Result<String> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0_u8; 64 * 1024];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_tarball_and_its_hash_are_read_from_the_sha256_field_only() {
        let record = "Package: crun\nFiles:\n 0123 1788933 crun_1.21.orig.tar.gz\n\
            Checksums-Sha256:\n f513 2425 crun_1.21-1.dsc\n 4bfb 1788933 crun_1.21.orig.tar.gz\n \
            5817 484 crun_1.21.orig.tar.gz.asc\nChecksums-Sha512:\n ffff 1788933 crun_1.21.orig.tar.gz\n";
        assert_eq!(
            orig_tarball(record),
            Some(("crun_1.21.orig.tar.gz".to_owned(), "4bfb".to_owned()))
        );
        assert_eq!(orig_tarball("Package: crun\n"), None);
    }
}
