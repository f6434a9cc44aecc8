//! `cargo xtask deb`: swiftlet as a Debian package, `target/deb/swiftlet_<version>_amd64.deb`,
//! built with Debian's own `dpkg-deb` from a staged tree (no cargo-deb): the binary
//! (`/usr/bin/swiftlet`, stripped of its debug info), the systemd unit
//! (`/lib/systemd/system/swiftlet.service`) and the default configuration
//! (`/etc/swiftlet/config.yaml`, a conffile: an upgrade keeps the admin's edits), from
//! `packaging/`. Nothing else: no maintainer scripts (enabling the service is the admin's
//! `systemctl enable --now swiftlet`, as with kubeadm's kubelet package, whose unit is enabled by
//! kubeadm, not by the package). Modes are set here, not taken from the checkout.
//! Upstream counterpart: the kubelet's .deb (kubernetes/release, `cmd/krel` packaging templates).

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::sh;

/// What swiftlet needs on the machine, as Debian names it: the C library it links (glibc 2.36
/// is Debian 12's, the oldest this is built and tested on), systemd (the unit, the systemd cgroup
/// driver over D-Bus) and a CRI runtime with the CNI plugins its pods' network uses.
const DEPENDS: &str = "libc6 (>= 2.36), systemd, dbus, containerd (>= 1.7) | containerd.io (>= 1.7), \
     containernetworking-plugins";

/// The files of the package: path in the package, source under the workspace (`None`: the
/// binary), mode.
const FILES: [(&str, Option<&str>, u32); 3] = [
    ("usr/bin/swiftlet", None, 0o755),
    (
        "lib/systemd/system/swiftlet.service",
        Some("packaging/swiftlet.service"),
        0o644,
    ),
    (
        "etc/swiftlet/config.yaml",
        Some("packaging/config.yaml"),
        0o644,
    ),
];

/// Builds the debug binary and packages it; returns the `.deb`.
pub fn run() -> anyhow::Result<PathBuf> {
    crate::setup::ensure()?;
    sh::run(sh::cmd("cargo").args(["build", "-p", "swiftlet", "--bin", "swiftlet"]))?;
    package()
}

/// Packages the debug binary as built (by [`run`], or by the suite's build).
pub fn package() -> anyhow::Result<PathBuf> {
    let binary = crate::tasks::profile_dir(false).join("swiftlet");
    if !binary.exists() {
        bail!("{} was not built", binary.display());
    }
    let deb = build(&binary, &sh::root().join("target").join("deb"))?;
    println!("xtask: {} built {}", sh::elapsed(), deb.display());
    Ok(deb)
}

/// The workspace's version (`[workspace.package] version`), which is the package's.
pub fn version() -> anyhow::Result<String> {
    let manifest = fs::read_to_string(sh::root().join("Cargo.toml"))?;
    manifest
        .lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .find_map(|l| l.trim().strip_prefix("version = "))
        .map(|v| v.trim_matches('"').to_owned())
        .context("Cargo.toml has no [workspace.package] version")
}

/// Packages `binary` into `out_dir/swiftlet_<version>_amd64.deb`.
pub fn build(binary: &Path, out_dir: &Path) -> anyhow::Result<PathBuf> {
    let version = version()?;
    let stage = out_dir.join("stage");
    let _ = fs::remove_dir_all(&stage);
    fs::create_dir_all(stage.join("DEBIAN"))?;
    for (path, source, mode) in FILES {
        let dest = stage.join(path);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        match source {
            None => {
                sh::run(
                    Command::new("objcopy")
                        .arg("--strip-debug")
                        .arg(binary)
                        .arg(&dest),
                )?;
            }
            Some(source) => {
                fs::copy(sh::root().join(source), &dest)
                    .with_context(|| format!("copying {source}"))?;
            }
        }
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode))?;
    }
    // Every directory 0755 whatever the umask made it; dpkg-deb refuses group-writable ones.
    set_dir_modes(&stage)?;
    let installed_kib = du_kib(&stage)?;
    fs::write(
        stage.join("DEBIAN/control"),
        control(&version, installed_kib),
    )?;
    fs::write(
        stage.join("DEBIAN/conffiles"),
        "/etc/swiftlet/config.yaml\n",
    )?;
    for file in ["DEBIAN/control", "DEBIAN/conffiles"] {
        fs::set_permissions(stage.join(file), fs::Permissions::from_mode(0o644))?;
    }
    let deb = out_dir.join(format!("swiftlet_{version}_amd64.deb"));
    sh::run(
        Command::new("dpkg-deb")
            // gzip: xz takes over a minute on the 90 MB debug binary, for little.
            .args(["--root-owner-group", "-Zgzip", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    let listing = sh::output(Command::new("dpkg-deb").arg("--contents").arg(&deb))
        .context("dpkg-deb --contents")?;
    for (path, _, _) in FILES {
        if !listing.contains(&format!("./{path}")) {
            bail!("{} lacks {path}:\n{listing}", deb.display());
        }
    }
    Ok(deb)
}

fn control(version: &str, installed_kib: u64) -> String {
    format!(
        "Package: swiftlet\n\
         Version: {version}\n\
         Architecture: amd64\n\
         Maintainer: swiftlet developers <swiftlet@localhost>\n\
         Installed-Size: {installed_kib}\n\
         Depends: {DEPENDS}\n\
         Section: admin\n\
         Priority: optional\n\
         Description: Kubernetes node agent driven by kernel events\n \
         swiftlet does the kubelet's job on a node: it runs the node's pods (static\n \
         manifests, or from an API server) through a CRI runtime and learns what\n \
         happens to their containers from eBPF programs in the kernel.\n"
    )
}

fn set_dir_modes(dir: &Path) -> anyhow::Result<()> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    for entry in fs::read_dir(dir)?.flatten() {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            set_dir_modes(&path)?;
        }
    }
    Ok(())
}

fn du_kib(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)?.flatten() {
        let meta = entry.metadata()?;
        if meta.is_dir() {
            if entry.file_name() != "DEBIAN" {
                total += du_kib(&entry.path())?;
            }
        } else {
            total += meta.len().div_ceil(1024);
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_file_names_the_package_and_what_it_needs() {
        let control = control("0.1.0", 12345);
        assert!(control.starts_with("Package: swiftlet\nVersion: 0.1.0\n"));
        assert!(control.contains("\nInstalled-Size: 12345\n"));
        assert!(control.contains("\nDepends: libc6 (>= 2.36), systemd, dbus, containerd"));
        // Description continuation lines start with one space; a blank line would end the stanza.
        assert!(!control.contains("\n\n"));
        assert!(control.lines().skip(9).all(|l| l.starts_with(' ')));
    }

    #[test]
    fn the_packaged_unit_and_config_are_what_the_node_vm_checks() {
        let unit =
            fs::read_to_string(sh::root().join("packaging/swiftlet.service")).unwrap_or_default();
        for line in [
            "Type=notify",
            "NotifyAccess=main",
            "Restart=always",
            "StartLimitIntervalSec=0",
            "OOMScoreAdjust=-999",
            "KillMode=control-group",
            "ExecStart=/usr/bin/swiftlet run --config /etc/swiftlet/config.yaml",
        ] {
            assert!(unit.lines().any(|l| l == line), "{line}");
        }
        assert!(version().is_ok_and(|v| !v.is_empty()));
    }
}
