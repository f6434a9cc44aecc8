//! Clearing what a private containerd left when it, or the xtask owning it, crashed or was
//! killed: the daemon itself, containers whose bundles lie under the state folder, shims, mounts,
//! the pod addresses its dead sandboxes hold, and containerd's `state` folder. Only ever things
//! that name the state folder or our sandboxes, and only with the instance's lock held, so the
//! instance is not another xtask's; a system containerd and other checkouts' instances are never
//! touched. Also used after every stop, since containerd leaves its shims and containers running
//! when it exits.

use std::{
    collections::HashSet,
    fs::{self, File},
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use nix::{
    fcntl::{Flock, FlockArg},
    mount::MntFlags,
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use super::{Paths, STOP_TIMEOUT};
use crate::sh;

/// Where runc keeps container state: our own root (the CRI runtime's `Root` option), and the
/// default one, which containers started with plain `ctr run` use; from the latter only
/// containers whose bundle is under our state folder are ours.
const DEFAULT_RUNC_ROOT: &str = "/run/containerd/runc";

/// host-local's reservations for the network `config.rs` names `swiftlet`.
const IPAM_DIR: &str = "/var/lib/cni/networks/swiftlet";

/// Removes every leftover of the instance in `paths`, in an order that leaves nothing behind:
/// the daemon first (it would restart what follows), then the containers (so their processes and
/// cgroups go), then the shims, then the mounts, and last containerd's `state` folder, which a
/// reboot would have cleared anyway.
pub(super) fn clear(paths: &Paths) -> anyhow::Result<()> {
    let daemons = pids_of(paths, |program| program == "containerd");
    if !daemons.is_empty() {
        println!("xtask: containerd: stopping a leftover containerd {daemons:?}");
        terminate(&daemons, STOP_TIMEOUT);
    }

    for (runtime, root, id) in containers(paths) {
        println!(
            "xtask: containerd: removing leftover container {id} ({})",
            runtime.display()
        );
        // Kills its processes and removes its cgroups.
        let _ = sh::output(
            Command::new(runtime)
                .arg("--root")
                .arg(&root)
                .args(["delete", "--force", &id]),
        );
    }

    let shims = pids_of(paths, |program| program.starts_with("containerd-shim"));
    if !shims.is_empty() {
        println!("xtask: containerd: stopping leftover shims {shims:?}");
        terminate(&shims, Duration::from_secs(5));
    }

    let mounts = mounts_under(&paths.state)?;
    if !mounts.is_empty() {
        println!(
            "xtask: containerd: unmounting {} leftover mounts under {}",
            mounts.len(),
            paths.state.display()
        );
    }
    for mount in &mounts {
        if nix::mount::umount2(mount, MntFlags::empty()).is_err() {
            nix::mount::umount2(mount, MntFlags::MNT_DETACH)
                .with_context(|| format!("unmounting {}", mount.display()))?;
        }
    }
    release_addresses(paths)?;
    // remove_dir_all would walk into a mount: `run` is cleared only when none is left.
    if !mounts_under(&paths.state)?.is_empty() {
        bail!(
            "mounts remain under {} after unmounting; not clearing it",
            paths.state.display()
        );
    }
    match fs::remove_dir_all(paths.run()) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(error).context(format!("clearing {}", paths.run().display()))
        }
        _ => Ok(()),
    }
}

/// Releases the pod addresses that host-local reserved for this instance's sandboxes, all dead
/// by now: killed without a CNI DEL, they would hold their addresses forever. The reservations
/// live in host-local's shared folder (see `config.rs`), one file per address holding the
/// sandbox id; only files naming one of our sandboxes (folders in our root) are removed, under
/// host-local's own lock.
fn release_addresses(paths: &Paths) -> anyhow::Result<()> {
    let sandboxes = paths
        .root()
        .join("io.containerd.grpc.v1.cri")
        .join("sandboxes");
    let ours: HashSet<String> = fs::read_dir(&sandboxes)
        .into_iter()
        .flat_map(|entries| entries.flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let dir = Path::new(IPAM_DIR);
    if ours.is_empty() || !dir.exists() {
        return Ok(());
    }
    let lock_file =
        File::open(dir.join("lock")).with_context(|| format!("opening {}/lock", dir.display()))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| errno)
        .with_context(|| format!("locking {}/lock", dir.display()))?;
    for entry in fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.parse::<IpAddr>().is_err() {
            continue;
        }
        let Ok(reservation) = fs::read_to_string(entry.path()) else {
            continue;
        };
        // `<sandbox id>\r\n<interface>`.
        if reservation
            .lines()
            .next()
            .is_some_and(|id| ours.contains(id.trim()))
        {
            println!("xtask: containerd: releasing leftover pod address {name}");
            fs::remove_file(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Containers (OCI runtime, its root, id) of this instance: all of those in our runc and crun
/// roots, and those in runc's default root whose bundle is under our state folder.
fn containers(paths: &Paths) -> Vec<(PathBuf, PathBuf, String)> {
    let inside = format!("{}/", paths.state.display());
    let roots = [
        (PathBuf::from("runc"), paths.runc_root()),
        (PathBuf::from("runc"), PathBuf::from(DEFAULT_RUNC_ROOT)),
        (super::crun::binary(), paths.crun_root()),
    ]
    .into_iter()
    .filter_map(|(runtime, dir)| fs::read_dir(dir).ok().map(|n| (runtime, n)))
    .flat_map(|(runtime, namespaces)| {
        namespaces
            .flatten()
            .map(move |n| (runtime.clone(), n.path()))
    });
    let mut found = Vec::new();
    for (runtime, root) in roots {
        let Some(listed) = sh::output(
            Command::new(&runtime)
                .arg("--root")
                .arg(&root)
                .args(["list", "--format", "json"]),
        ) else {
            continue;
        };
        // `null` when there are none.
        let listed: Vec<serde_json::Value> = serde_json::from_str(&listed).unwrap_or_default();
        let ours = root.starts_with(&paths.state);
        for container in listed {
            let bundle = container["bundle"].as_str().unwrap_or_default();
            if let Some(id) = container["id"].as_str()
                && (ours || bundle.starts_with(&inside))
            {
                found.push((runtime.clone(), root.clone(), id.to_owned()));
            }
        }
    }
    found
}

/// The pids of [`processes_referencing`] whose program matches.
fn pids_of(paths: &Paths, program: impl Fn(&str) -> bool) -> Vec<Pid> {
    processes_referencing(&paths.state)
        .into_iter()
        .filter(|(_, name)| program(name))
        .map(|(pid, _)| pid)
        .collect()
}

/// containerd and containerd-shim processes with a command-line argument naming `dir` or a path
/// in it, with their program's file name: our containerd (`--config <dir>/config.toml`) and its
/// shims (`-address <dir>/containerd.sock`). Other programs are never picked, even when they name
/// the folder (someone's `tail -f` of the log).
pub(super) fn processes_referencing(dir: &Path) -> Vec<(Pid, String)> {
    let dir = dir.display().to_string();
    let inside = format!("{dir}/");
    let me = std::process::id().to_string();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let program = args
            .first()
            .and_then(|a| Path::new(a).file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if program.starts_with("containerd")
            && args.iter().any(|a| *a == dir || a.starts_with(&inside))
            && let Ok(pid) = pid.parse()
        {
            found.push((Pid::from_raw(pid), program));
        }
    }
    found
}

/// SIGTERM, then SIGKILL for those still there after `grace`; waits until they are gone.
fn terminate(pids: &[Pid], grace: Duration) {
    let alive = |pid: &Pid| kill(*pid, None).is_ok() && !is_zombie(*pid);
    for pid in pids {
        let _ = kill(*pid, Signal::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while pids.iter().any(alive) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    for pid in pids.iter().filter(|p| alive(p)) {
        let _ = kill(*pid, Signal::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while pids.iter().any(alive) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
}

/// A zombie has exited but waits for its parent (perhaps us) to reap it.
fn is_zombie(pid: Pid) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Mount points under `dir` (not `dir` itself), the latest mounted first so that stacked and
/// nested mounts come off in order.
pub(super) fn mounts_under(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")?;
    let inside = format!("{}/", dir.display());
    let mut mounts: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|point| point.starts_with(&inside))
        .map(PathBuf::from)
        .collect();
    mounts.reverse();
    Ok(mounts)
}

/// mountinfo writes space, tab, newline and backslash in paths as octal escapes (`\040`).
fn unescape_mount_path(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped() {
        for (field, path) in [
            ("/plain/path", "/plain/path"),
            (r"/with\040space", "/with space"),
            (r"/tab\011and\012newline", "/tab\tand\nnewline"),
            (r"/back\134slash", r"/back\slash"),
            (r"/not\9an\escape\04", r"/not\9an\escape\04"),
        ] {
            assert_eq!(unescape_mount_path(field), path, "{field}");
        }
    }
}
