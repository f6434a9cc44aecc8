//! What the namespace starts from: the work directory with the manager's units, the init
//! script that mounts the namespace's `/run`, devices and cgroup tree before it becomes systemd,
//! `unshare` with systemd's environment, and the removal of what killed tests left.

use std::{
    fs,
    os::{
        fd::AsRawFd as _,
        unix::{fs::DirBuilderExt as _, process::CommandExt as _},
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use super::{
    CGROUP_MOUNT, DBUS_DAEMON, PREFIX, SYSTEMD, SystemdNamespaceError, TARGET,
    hierarchies::{Hierarchy, HierarchyKind, cgroup_links},
};

/// Runs as PID 1 of the new namespaces, before it becomes systemd: a private `/run`, files of
/// the work directory as `/dev/console` (which PID 1 reopens to log to, and the host's must
/// stay untouched; not being a terminal, it is not written) and as `/dev/kmsg` (the log
/// target, so that a failing start can say why), and the cgroup hierarchies mounted afresh,
/// so that their roots are the namespace's cgroups. Its arguments: the work directory,
/// `unified` or `tmpfs` for what is at `/sys/fs/cgroup`, then triples `v1 <dir> <options>`,
/// `v2 <dir> -` or `link <name> <target>`.
pub(super) const INIT_SCRIPT: &str = r#"set -eu
work=$1
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /run
if [ -e /dev/console ]; then mount --bind "$work/console" /dev/console; fi
if [ -e /dev/kmsg ]; then mount --bind "$work/kmsg" /dev/kmsg; fi
if [ "$2" = unified ]; then
    mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup
else
    mount -t tmpfs -o mode=0755,nosuid,nodev,noexec tmpfs /sys/fs/cgroup
fi
shift 2
while [ $# -ge 3 ]; do
    case $1 in
    v1) mkdir -p "/sys/fs/cgroup/$2"; mount -t cgroup -o "nosuid,nodev,noexec,$3" cgroup "/sys/fs/cgroup/$2" ;;
    v2) mkdir -p "/sys/fs/cgroup/$2"; mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "/sys/fs/cgroup/$2" ;;
    link) ln -s "$3" "/sys/fs/cgroup/$2" ;;
    esac
    shift 3
done
exec "$SWIFTLET_SYSTEMD" --system --unit="$SWIFTLET_SYSTEMD_TARGET"
"#;

/// Removes the cgroups and work directories a killed test process left (its drop never ran;
/// its systemd died with it, by the parent-death signals).
pub(super) fn remove_stale(hierarchies: &[Hierarchy]) {
    let parents = hierarchies
        .iter()
        .map(|h| Path::new(CGROUP_MOUNT).join(&h.dir))
        .chain([std::env::temp_dir()]);
    for parent in parents {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let Some(owner) = entry.file_name().to_str().and_then(owner) else {
                continue;
            };
            if Path::new(&format!("/proc/{owner}")).exists() {
                continue;
            }
            let path = entry.path();
            if parent.starts_with(CGROUP_MOUNT) {
                crate::cgroup::remove_tree(&path);
            } else if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = fs::remove_dir_all(&path);
            }
        }
    }
}

/// The test process that made a namespace's cgroup or work directory, from its name.
pub(super) fn owner(name: &str) -> Option<u32> {
    let (pid, _) = name.strip_prefix(PREFIX)?.split_once('-')?;
    pid.parse().ok()
}

/// The work directory (root only): the unit directory, an empty generator directory, and the
/// files the init script binds over `/dev/console` and `/dev/kmsg`.
pub(super) fn make_work_dir(work: &Path) -> Result<(), SystemdNamespaceError> {
    let mut builder = fs::DirBuilder::new();
    builder.mode(0o700);
    for dir in [work.to_owned(), work.join("units"), work.join("generators")] {
        builder
            .create(&dir)
            .map_err(SystemdNamespaceError::io("create", &dir))?;
    }
    for (name, text) in units(work) {
        let path = work.join("units").join(name);
        fs::write(&path, text).map_err(SystemdNamespaceError::io("write", &path))?;
    }
    for file in ["console", "kmsg"] {
        let path = work.join(file);
        fs::write(&path, "").map_err(SystemdNamespaceError::io("write", &path))?;
    }
    Ok(())
}

/// The manager's only units: the default target and the system bus it wants, as Debian's
/// `dbus.socket` and `dbus.service` have it but without default dependencies (there is no
/// `sysinit.target` here), syslog or OOM score (`CAP_SYS_RESOURCE` may be missing); the bus
/// daemon's own messages go to a file in `work`.
pub(super) fn units(work: &Path) -> [(&'static str, String); 3] {
    let log = work.join("dbus.log");
    [
        (
            TARGET,
            "[Unit]\nDescription=swiftlet test: the manager and the system bus\n\
             Wants=dbus.socket dbus.service\n"
                .to_owned(),
        ),
        (
            "dbus.socket",
            "[Unit]\nDescription=D-Bus System Message Bus Socket\nDefaultDependencies=no\n\
             [Socket]\nListenStream=/run/dbus/system_bus_socket\n"
                .to_owned(),
        ),
        (
            "dbus.service",
            format!(
                "[Unit]\nDescription=D-Bus System Message Bus\nDefaultDependencies=no\n\
                 Requires=dbus.socket\nAfter=dbus.socket\n\
                 [Service]\nType=notify\nNotifyAccess=main\n\
                 ExecStart={DBUS_DAEMON} --system --address=systemd: --nofork --nopidfile \
                 --systemd-activation --nosyslog\n\
                 StandardOutput=append:{log}\nStandardError=append:{log}\n",
                log = log.display()
            ),
        ),
    ]
}

/// `unshare` with systemd's environment; the child moves itself into the namespace's cgroups
/// between fork and exec, so the namespaces' roots are those cgroups.
pub(super) fn spawn(
    work: &Path,
    hierarchies: &[Hierarchy],
    cgroups: &[PathBuf],
) -> Result<Child, SystemdNamespaceError> {
    let procs = cgroups
        .iter()
        .map(|dir| {
            let path = dir.join("cgroup.procs");
            fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(SystemdNamespaceError::io("open", &path))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let fds: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
    let log_path = work.join("init.log");
    let log =
        fs::File::create(&log_path).map_err(SystemdNamespaceError::io("create", &log_path))?;
    let log_err = log
        .try_clone()
        .map_err(SystemdNamespaceError::io("duplicate", &log_path))?;
    let links = cgroup_links(Path::new(CGROUP_MOUNT));
    let mut command = Command::new("unshare");
    command
        .args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount",
            "--cgroup",
            "--mount-proc",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            INIT_SCRIPT,
            "swiftlet-systemd-init",
        ])
        .arg(work)
        .args(init_args(hierarchies, &links))
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("container", "swiftlet-test")
        // The transient units' directory too, where a node's manager has it: without it a
        // transient unit's file is unknown to the lookup and the unit counts as changed on disk.
        .env("SYSTEMD_UNIT_PATH", {
            let mut path = work.join("units").into_os_string();
            path.push(":/run/systemd/transient");
            path
        })
        .env("SYSTEMD_GENERATOR_PATH", work.join("generators"))
        .env("SYSTEMD_LOG_TARGET", "kmsg")
        .env("SYSTEMD_LOG_LEVEL", "info")
        .env("SWIFTLET_SYSTEMD", SYSTEMD)
        .env("SWIFTLET_SYSTEMD_TARGET", TARGET)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    // SAFETY: the closure runs between fork and exec and only makes system calls (write(2) on
    // fds opened before the fork, prctl(2)), which are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for fd in &fds {
                if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(SystemdNamespaceError::Spawn)?;
    drop(procs);
    Ok(child)
}

/// The init script's arguments after the work directory: what `/sys/fs/cgroup` is, then one
/// triple per hierarchy and per symbolic link (e.g. `cpu -> cpu,cpuacct`).
pub(super) fn init_args(hierarchies: &[Hierarchy], links: &[(String, String)]) -> Vec<String> {
    let unified = hierarchies
        .iter()
        .any(|h| h.kind == HierarchyKind::V2 && h.dir.as_os_str().is_empty());
    let mut args = vec![if unified { "unified" } else { "tmpfs" }.to_owned()];
    for hierarchy in hierarchies {
        let dir = hierarchy.dir.to_string_lossy().into_owned();
        match &hierarchy.kind {
            HierarchyKind::V2 if dir.is_empty() => continue,
            HierarchyKind::V2 => args.extend([String::from("v2"), dir, String::from("-")]),
            HierarchyKind::V1 { options } => {
                args.extend([String::from("v1"), dir, options.clone()]);
            }
        }
    }
    if !unified {
        for (name, target) in links {
            args.extend([String::from("link"), name.clone(), target.clone()]);
        }
    }
    args
}
