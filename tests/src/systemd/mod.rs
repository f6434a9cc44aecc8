//! A real systemd for the tests of the systemd cgroup driver: `/lib/systemd/systemd --system`
//! as PID 1 of a private PID, mount and cgroup namespace, the way systemd-nspawn runs one in a
//! container, without touching the host's services. It owns a fresh cgroup in every hierarchy
//! the host mounts under `/sys/fs/cgroup` (the namespace's cgroup root), a private `/run`, and a
//! unit directory of its own (`SYSTEMD_UNIT_PATH`; no generators, `SYSTEMD_GENERATOR_PATH`)
//! holding only a default target and the system bus (`dbus.socket`, `dbus.service`), so the
//! manager starts nothing of the host's. Tests reach the manager on that system bus, as the
//! agent does on a node (zbus cannot use the private socket: see [`SystemdNamespace::connect`]).
//! Not here: journald, logind or any other unit.
//!
//! Upstream counterparts: systemd's container interface
//! (<https://systemd.io/CONTAINER_INTERFACE/>: `container=` in PID 1's environment, the cgroup
//! tree mounted by the container manager, `SIGRTMIN+13` to halt at once) and systemd-nspawn's
//! `mount_all`/`mount_cgroups`, which this follows for the hybrid and unified layouts.

mod hierarchies;
mod init;
mod inside;
#[cfg(test)]
mod tests;

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use zbus::{AuthMechanism, Connection, connection::Builder};

pub use hierarchies::{Hierarchy, HierarchyKind};
use hierarchies::{cgroup_hierarchies, make_cgroup, v1_controllers};
use init::{make_work_dir, remove_stale, spawn};

/// Where the host's cgroup hierarchies are mounted (and where they are inside the namespace).
const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
const SYSTEMD: &str = "/lib/systemd/systemd";
const DBUS_DAEMON: &str = "/usr/bin/dbus-daemon";
/// The manager's default target: it pulls in the system bus and nothing else.
const TARGET: &str = "swiftlet-test.target";
/// How long the manager may take to answer on the system bus after the start.
const START_WAIT: Duration = Duration::from_secs(30);
/// How long the manager may take to exit after the halt signal before it is killed.
const HALT_WAIT: Duration = Duration::from_secs(5);

static NEXT: AtomicU32 = AtomicU32::new(0);
/// Names of the namespaces' cgroups and work directories: `<PREFIX><test pid>-<n>-<name>`.
const PREFIX: &str = "swiftlet-systemd-";

#[derive(Debug, thiserror::Error)]
pub enum SystemdNamespaceError {
    #[error("{0} is not installed")]
    NotInstalled(&'static str),
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no cgroup hierarchy is mounted under {CGROUP_MOUNT}")]
    NoCgroups,
    #[error("start unshare: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the namespace's init exited ({status}) before systemd answered; its output: {log}")]
    Exited { status: String, log: String },
    #[error(
        "systemd did not answer on the system bus within {START_WAIT:?}: {last}; its log: {log}"
    )]
    NotReady { last: String, log: String },
    #[error("connect to the namespace's system bus {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: Box<zbus::Error>,
    },
}

impl SystemdNamespaceError {
    fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.to_owned();
        move |source| SystemdNamespaceError::Io {
            action,
            path,
            source,
        }
    }
}

/// A systemd running as PID 1 of namespaces of its own; stopped, and its cgroups removed, on
/// drop. It is killed (`--kill-child`, and the parent-death signal of `unshare`) if the thread
/// that started it ends first: start it on the test's own thread.
pub struct SystemdNamespace {
    /// `unshare --fork`, whose one child is the namespace's PID 1.
    unshare: Child,
    /// systemd's PID on the host.
    pid: i32,
    hierarchies: Vec<Hierarchy>,
    /// The namespace's cgroup root in each hierarchy, as seen from the host (same order).
    cgroups: Vec<PathBuf>,
    work: PathBuf,
    startup: Duration,
}

impl SystemdNamespace {
    /// Starts systemd and waits (bounded) until its manager answers on the system bus with its
    /// start-up finished.
    pub async fn start(name: &str) -> Result<SystemdNamespace, SystemdNamespaceError> {
        for program in [SYSTEMD, DBUS_DAEMON] {
            if !Path::new(program).exists() {
                return Err(SystemdNamespaceError::NotInstalled(program));
            }
        }
        let mountinfo_path = Path::new("/proc/self/mountinfo");
        let mountinfo = fs::read_to_string(mountinfo_path)
            .map_err(SystemdNamespaceError::io("read", mountinfo_path))?;
        let proc_cgroups = Path::new("/proc/cgroups");
        let controllers = fs::read_to_string(proc_cgroups)
            .map_err(SystemdNamespaceError::io("read", proc_cgroups))?;
        let hierarchies = cgroup_hierarchies(&mountinfo, &v1_controllers(&controllers));
        if hierarchies.is_empty() {
            return Err(SystemdNamespaceError::NoCgroups);
        }
        remove_stale(&hierarchies);
        let unique = format!(
            "{PREFIX}{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let work = std::env::temp_dir().join(&unique);
        let started = Instant::now();
        // From here on, the guard owns what exists so far: an error drops it and cleans up.
        let mut guard = Cleanup {
            cgroups: Vec::new(),
            work: None,
        };
        guard.work = Some(work.clone());
        make_work_dir(&work)?;
        for hierarchy in &hierarchies {
            let dir = Path::new(CGROUP_MOUNT).join(&hierarchy.dir).join(&unique);
            guard.cgroups.push(dir.clone());
            make_cgroup(hierarchy, &dir)?;
        }
        let unshare = spawn(&work, &hierarchies, &guard.cgroups)?;
        let mut namespace = SystemdNamespace {
            unshare,
            pid: 0,
            hierarchies,
            cgroups: std::mem::take(&mut guard.cgroups),
            work: guard.work.take().unwrap_or_default(),
            startup: Duration::ZERO,
        };
        namespace.pid = namespace.wait_for_init().await?;
        namespace.wait_until_running().await?;
        namespace.startup = started.elapsed();
        Ok(namespace)
    }

    /// systemd's PID on the host.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// How long it took from the start until the manager answered with its start-up done.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// The manager's private socket (`systemctl` as root inside uses it), as seen from the host.
    pub fn private_socket(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root/run/systemd/private", self.pid))
    }

    /// Whether systemd there sees a pure cgroup v2 tree (and takes v2 properties).
    pub fn unified(&self) -> bool {
        self.hierarchies
            .iter()
            .any(|h| h.kind == HierarchyKind::V2 && h.dir.as_os_str().is_empty())
    }

    /// The namespace's cgroup root, on the host, of the hierarchy holding `controller` (`cpu`,
    /// `memory`, `pids`, or `systemd` for the one systemd tracks its units in).
    pub fn cgroup_root(&self, controller: &str) -> Option<&Path> {
        self.hierarchies
            .iter()
            .position(|h| h.holds(controller))
            .and_then(|i| self.cgroups.get(i))
            .map(PathBuf::as_path)
    }

    /// The system bus socket of the namespace's dbus-daemon, as seen from the host.
    pub fn bus_socket(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/root/run/dbus/system_bus_socket",
            self.pid
        ))
    }

    /// A connection to the namespace's system bus, on which the manager is
    /// `org.freedesktop.systemd1` (what `SystemdSlices::connect` reaches on a node).
    ///
    /// Not peer-to-peer on the private socket, as go-systemd's `NewSystemdConnection` would:
    /// systemd names its direct connections' messages `Sender=org.freedesktop.systemd1`
    /// (`bus_on_connection` → `sd_bus_set_sender`), not a unique name, and zbus 5.19 accepts
    /// such a message but then panics in its reader task ("Invalid field reconstruction:
    /// InvalidName(\"Invalid unique name…\")", `message/fields.rs`), so every call hangs.
    pub async fn connect(&self) -> Result<Connection, SystemdNamespaceError> {
        let path = self.bus_socket();
        let error = |source| SystemdNamespaceError::Connect {
            path: path.clone(),
            source: Box::new(source),
        };
        let stream = inside::connect(self.pid, &path)
            .and_then(|s| {
                s.set_nonblocking(true)?;
                tokio::net::UnixStream::from_std(s)
            })
            .map_err(|e| error(zbus::Error::InputOutput(e.into())))?;
        Builder::unix_stream(stream)
            .auth_mechanism(AuthMechanism::External)
            .build()
            .await
            .map_err(error)
    }

    /// `program` run inside the namespace's mount, PID and cgroup namespaces (through
    /// `nsenter`), e.g. `systemctl`.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--target={}", self.pid))
            .args(["--mount", "--pid", "--cgroup", "--"])
            .arg(program);
        command
    }

    /// What systemd (and the init script before it) wrote so far.
    pub fn log(&self) -> String {
        read_log(&self.work)
    }

    /// The PID of `unshare`'s one child, once it is forked.
    async fn wait_for_init(&mut self) -> Result<i32, SystemdNamespaceError> {
        let id = self.unshare.id();
        let children = PathBuf::from(format!("/proc/{id}/task/{id}/children"));
        let deadline = Instant::now() + START_WAIT;
        loop {
            self.check_running()?;
            if let Some(pid) = fs::read_to_string(&children)
                .ok()
                .as_deref()
                .and_then(first_child)
            {
                return Ok(pid);
            }
            if Instant::now() >= deadline {
                return Err(SystemdNamespaceError::NotReady {
                    last: format!("{} names no child", children.display()),
                    log: self.log(),
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Polls the system bus until the manager is on it and says its start-up is done.
    async fn wait_until_running(&mut self) -> Result<(), SystemdNamespaceError> {
        let deadline = Instant::now() + START_WAIT;
        loop {
            self.check_running()?;
            let last = match self.system_state().await {
                Ok(state) if state == "running" || state == "degraded" => return Ok(()),
                Ok(state) => format!("SystemState is {state:?}"),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(SystemdNamespaceError::NotReady {
                    last,
                    log: self.log(),
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The manager's `SystemState` property (`initializing`, `starting`, `running`, ...).
    async fn system_state(&self) -> Result<String, SystemdNamespaceError> {
        let connection = self.connect().await?;
        let error = |source| SystemdNamespaceError::Connect {
            path: self.bus_socket(),
            source: Box::new(source),
        };
        let reply = connection
            .call_method(
                Some("org.freedesktop.systemd1"),
                "/org/freedesktop/systemd1",
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &("org.freedesktop.systemd1.Manager", "SystemState"),
            )
            .await
            .map_err(error)?;
        let value: zbus::zvariant::OwnedValue = reply.body().deserialize().map_err(error)?;
        String::try_from(value).map_err(|e| error(e.into()))
    }

    fn check_running(&mut self) -> Result<(), SystemdNamespaceError> {
        match self.unshare.try_wait() {
            Ok(Some(status)) => Err(SystemdNamespaceError::Exited {
                status: status.to_string(),
                log: self.log(),
            }),
            Ok(None) => Ok(()),
            Err(source) => Err(SystemdNamespaceError::Io {
                action: "wait for",
                path: PathBuf::from(format!("/proc/{}", self.unshare.id())),
                source,
            }),
        }
    }

    /// Halts systemd (`SIGRTMIN+13`, its immediate halt, which needs no units: in a container
    /// it exits), or kills it after [`HALT_WAIT`]. Killing the namespace's PID 1 kills every
    /// process in it, and the mounts go with the mount namespace.
    fn stop(&mut self) {
        if self.pid > 0 && matches!(self.unshare.try_wait(), Ok(None)) {
            // SAFETY: kill(2) with a PID that is still reserved: systemd is the child of the
            // running `unshare`, which has not reaped it.
            unsafe {
                libc::kill(self.pid, libc::SIGRTMIN() + 13);
            }
            let deadline = Instant::now() + HALT_WAIT;
            while matches!(self.unshare.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if matches!(self.unshare.try_wait(), Ok(None)) {
                eprintln!(
                    "warning: systemd {} did not halt within {HALT_WAIT:?}: killing it",
                    self.pid
                );
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if matches!(self.unshare.try_wait(), Ok(None)) {
            let _ = self.unshare.kill();
        }
        let _ = self.unshare.wait();
    }
}

impl Drop for SystemdNamespace {
    fn drop(&mut self) {
        self.stop();
        drop(Cleanup {
            cgroups: std::mem::take(&mut self.cgroups),
            work: Some(std::mem::take(&mut self.work)),
        });
    }
}

/// Removes the namespace's cgroups (after killing what is left in them) and its work directory.
struct Cleanup {
    cgroups: Vec<PathBuf>,
    work: Option<PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for dir in &self.cgroups {
            crate::cgroup::remove_tree(dir);
        }
        if let Some(work) = self.work.as_deref().filter(|w| !w.as_os_str().is_empty()) {
            let _ = fs::remove_dir_all(work);
        }
    }
}

/// The first PID in a `/proc/<pid>/task/<tid>/children` list.
fn first_child(children: &str) -> Option<i32> {
    children.split_whitespace().next()?.parse().ok()
}

fn read_log(work: &Path) -> String {
    let mut log = String::new();
    for file in ["init.log", "kmsg", "dbus.log"] {
        let text = fs::read_to_string(work.join(file)).unwrap_or_default();
        // A failing start's report stays readable: the end is what says why.
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        for line in tail.into_iter().rev() {
            log.push_str(line);
            log.push('\n');
        }
    }
    log
}
