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

use std::{
    fs,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{fs::DirBuilderExt as _, net::UnixStream, process::CommandExt as _},
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use zbus::{AuthMechanism, Connection, connection::Builder};

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

/// Runs as PID 1 of the new namespaces, before it becomes systemd: a private `/run`, files of
/// the work directory as `/dev/console` (which PID 1 reopens to log to, and the host's must
/// stay untouched; not being a terminal, it is not written) and as `/dev/kmsg` (the log
/// target, so that a failing start can say why), and the cgroup hierarchies mounted afresh,
/// so that their roots are the namespace's cgroups. Its arguments: the work directory, `unified` or `tmpfs` for what is at
/// `/sys/fs/cgroup`, then triples `v1 <dir> <options>`, `v2 <dir> -` or `link <name> <target>`.
const INIT_SCRIPT: &str = r#"set -eu
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

/// One cgroup hierarchy of the host under `/sys/fs/cgroup`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    /// Relative to `/sys/fs/cgroup`; empty when cgroup2 is `/sys/fs/cgroup` itself.
    pub dir: PathBuf,
    pub kind: HierarchyKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HierarchyKind {
    /// cgroup v1 with these mount options: its controllers, or `none,name=<name>`.
    V1 {
        options: String,
    },
    V2,
}

impl Hierarchy {
    /// Whether this hierarchy holds `controller` (any cgroup2 one when `/sys/fs/cgroup` is
    /// cgroup2), or is the named hierarchy `name=<controller>`.
    pub fn holds(&self, controller: &str) -> bool {
        match &self.kind {
            HierarchyKind::V1 { options } => options
                .split(',')
                .any(|o| o == controller || o.strip_prefix("name=") == Some(controller)),
            HierarchyKind::V2 => self.dir.as_os_str().is_empty(),
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
        let stream = self
            .connect_from_inside(&path)
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

    /// A stream connected to `path` by a short-lived child forked into systemd's PID namespace.
    /// The manager refuses a private connection whose peer it cannot see (`bus_on_connection`
    /// → `bus_check_peercred` → `getpeercred`: `SO_PEERCRED` names PID 0, `-ENODATA`, for a
    /// peer outside its PID namespace), and `SO_PEERCRED` is whoever called connect(2); the
    /// socket itself is shared with the child, so it stays here, connected.
    fn connect_from_inside(&self, path: &Path) -> std::io::Result<UnixStream> {
        let address = socket_address(path)?;
        // SAFETY: socket(2) has no memory effects; the fd is owned at once.
        let socket = unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        let fd = socket.as_raw_fd();
        let mut child = Command::new("/bin/true");
        child.stdin(Stdio::null()).stdout(Stdio::null());
        // SAFETY: the closure runs between fork and exec and only calls connect(2) with an
        // address built before the fork, which is async-signal-safe.
        unsafe {
            child.pre_exec(move || {
                let length = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                if libc::connect(fd, (&raw const address).cast(), length) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let status = {
            let _inside = PidNamespaceForChildren::enter(self.pid)?;
            child.status()?
        };
        if !status.success() {
            return Err(std::io::Error::other(format!(
                "the connecting child exited with {status}"
            )));
        }
        Ok(UnixStream::from(socket))
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

/// This thread's children are forked into another PID namespace until the guard drops
/// (`setns(2)` with `CLONE_NEWPID` changes only `pid_for_children`, and only this thread's).
struct PidNamespaceForChildren {
    original: fs::File,
}

impl PidNamespaceForChildren {
    fn enter(pid: i32) -> std::io::Result<PidNamespaceForChildren> {
        let original = fs::File::open("/proc/thread-self/ns/pid_for_children")?;
        let target = fs::File::open(format!("/proc/{pid}/ns/pid"))?;
        // SAFETY: setns(2) on an open namespace fd; no memory effects.
        if unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(PidNamespaceForChildren { original })
    }
}

impl Drop for PidNamespaceForChildren {
    fn drop(&mut self) {
        // SAFETY: as in `enter`; back to this thread's own namespace, which is always allowed.
        if unsafe { libc::setns(self.original.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            panic!(
                "cannot return to the test's own PID namespace: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// A `sockaddr_un` for a path socket.
fn socket_address(path: &Path) -> std::io::Result<libc::sockaddr_un> {
    use std::os::unix::ffi::OsStrExt as _;
    // SAFETY: sockaddr_un is plain data, valid all zeros.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= address.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} cannot be a socket address", path.display()),
        ));
    }
    for (to, from) in address.sun_path.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    Ok(address)
}

/// Removes the cgroups and work directories a killed test process left (its drop never ran;
/// its systemd died with it, by the parent-death signals).
fn remove_stale(hierarchies: &[Hierarchy]) {
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
fn owner(name: &str) -> Option<u32> {
    let (pid, _) = name.strip_prefix(PREFIX)?.split_once('-')?;
    pid.parse().ok()
}

/// The work directory (root only): the unit directory with the target, an empty generator
/// directory, the console log.
fn make_work_dir(work: &Path) -> Result<(), SystemdNamespaceError> {
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
fn units(work: &Path) -> [(&'static str, String); 3] {
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

/// The namespace's root cgroup in one hierarchy; v1 cpusets start empty and must be given
/// their parent's CPUs and memory nodes before a process may join.
fn make_cgroup(hierarchy: &Hierarchy, dir: &Path) -> Result<(), SystemdNamespaceError> {
    fs::create_dir(dir).map_err(SystemdNamespaceError::io("create", dir))?;
    if matches!(hierarchy.kind, HierarchyKind::V1 { .. }) && hierarchy.holds("cpuset") {
        let parent = dir.parent().unwrap_or(dir);
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let from = parent.join(file);
            let value =
                fs::read_to_string(&from).map_err(SystemdNamespaceError::io("read", &from))?;
            let to = dir.join(file);
            fs::write(&to, value.trim()).map_err(SystemdNamespaceError::io("write", &to))?;
        }
    }
    if hierarchy.kind == HierarchyKind::V2 && hierarchy.dir.as_os_str().is_empty() {
        // systemd enables controllers for its units only among those its root cgroup has.
        delegate_controllers(dir)?;
    }
    Ok(())
}

/// On a pure cgroup v2 host, makes the controllers systemd needs available in `dir` (its
/// parent's `cgroup.subtree_control`), as `TestCgroup::with_memory_limit` does for memory.
fn delegate_controllers(dir: &Path) -> Result<(), SystemdNamespaceError> {
    let parent = dir.parent().unwrap_or(dir);
    let available = parent.join("cgroup.controllers");
    let available =
        fs::read_to_string(&available).map_err(SystemdNamespaceError::io("read", &available))?;
    let control = parent.join("cgroup.subtree_control");
    let enabled =
        fs::read_to_string(&control).map_err(SystemdNamespaceError::io("read", &control))?;
    for controller in ["cpu", "memory", "pids", "io"] {
        let has = |list: &str| list.split_whitespace().any(|c| c == controller);
        if has(&available) && !has(&enabled) {
            fs::write(&control, format!("+{controller}"))
                .map_err(SystemdNamespaceError::io("write", &control))?;
        }
    }
    Ok(())
}

/// `unshare` with systemd's environment; the child moves itself into the namespace's cgroups
/// between fork and exec, so the namespaces' roots are those cgroups.
fn spawn(
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
fn init_args(hierarchies: &[Hierarchy], links: &[(String, String)]) -> Vec<String> {
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

/// The symbolic links directly under `root` (distributions link `cpu` and `cpuacct` to a
/// co-mounted `cpu,cpuacct`), which systemd looks controllers up by.
fn cgroup_links(root: &Path) -> Vec<(String, String)> {
    let Ok(entries) = fs::read_dir(root) else {
        return Vec::new();
    };
    let mut links: Vec<(String, String)> = entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_symlink()).unwrap_or(false))
        .filter_map(|e| {
            let target = fs::read_link(e.path()).ok()?;
            Some((
                e.file_name().to_str()?.to_owned(),
                target.to_str()?.to_owned(),
            ))
        })
        .collect();
    links.sort();
    links
}

/// The v1 controllers the kernel has enabled, from `/proc/cgroups`.
fn v1_controllers(proc_cgroups: &str) -> Vec<String> {
    proc_cgroups
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let name = fields.next()?;
            (fields.nth(2)? == "1").then(|| name.to_owned())
        })
        .collect()
}

/// The cgroup hierarchies mounted at or directly under `/sys/fs/cgroup`, from a mountinfo
/// text: for v1, the mount options that select the same hierarchy again (its controllers, or
/// `none,name=…`), without flags such as `rw` or `xattr`.
fn cgroup_hierarchies(mountinfo: &str, controllers: &[String]) -> Vec<Hierarchy> {
    let mut hierarchies = Vec::new();
    for line in mountinfo.lines() {
        // "<id> <parent> <maj:min> <root> <mount point> <opts> [optional...] - <fstype> <src> <super opts>"
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4).map(unescape) else {
            continue;
        };
        let mut right = right.split(' ');
        let (Some(fstype), Some(_source), Some(super_options)) =
            (right.next(), right.next(), right.next())
        else {
            continue;
        };
        let Ok(dir) = Path::new(&mount_point).strip_prefix(CGROUP_MOUNT) else {
            continue;
        };
        if dir.components().count() > 1 {
            continue;
        }
        let kind = match fstype {
            "cgroup2" => HierarchyKind::V2,
            "cgroup" => {
                let mut selected: Vec<&str> = super_options
                    .split(',')
                    .filter(|o| o.starts_with("name=") || controllers.iter().any(|c| c == o))
                    .collect();
                if selected.is_empty() {
                    continue;
                }
                if selected.iter().all(|o| o.starts_with("name=")) {
                    selected.insert(0, "none");
                }
                HierarchyKind::V1 {
                    options: selected.join(","),
                }
            }
            _ => continue,
        };
        let hierarchy = Hierarchy {
            dir: dir.to_owned(),
            kind,
        };
        // A later mount on the same point hides an earlier one.
        hierarchies.retain(|h: &Hierarchy| h.dir != hierarchy.dir);
        hierarchies.push(hierarchy);
    }
    hierarchies
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = bytes
                .get(i + 1..i + 4)
                .and_then(|o| std::str::from_utf8(o).ok())
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    fn controllers() -> Vec<String> {
        ["cpu", "cpuacct", "cpuset", "memory", "pids"]
            .map(String::from)
            .to_vec()
    }

    fn v1(dir: &str, options: &str) -> Hierarchy {
        Hierarchy {
            dir: PathBuf::from(dir),
            kind: HierarchyKind::V1 {
                options: options.to_owned(),
            },
        }
    }

    #[test]
    fn hybrid_hierarchies_keep_only_the_options_that_select_them() {
        let found = cgroup_hierarchies(HYBRID, &controllers());
        assert_eq!(
            found,
            vec![
                v1("cpu", "cpu"),
                v1("cpuset", "cpuset"),
                v1("memory", "memory"),
                v1("pids", "pids"),
                v1("systemd", "none,name=systemd"),
                Hierarchy {
                    dir: PathBuf::from("unified"),
                    kind: HierarchyKind::V2
                },
            ]
        );
        let args = init_args(&found, &[]);
        assert_eq!(args.first().map(String::as_str), Some("tmpfs"));
        assert_eq!(args.len(), 1 + 3 * found.len());
        assert!(args.windows(3).any(|w| w == ["v2", "unified", "-"]));
        assert!(
            args.windows(3)
                .any(|w| w == ["v1", "systemd", "none,name=systemd"])
        );
    }

    #[test]
    fn a_pure_v2_host_is_one_hierarchy_mounted_over_the_tmpfs() {
        let mountinfo = "\
25 21 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
        let found = cgroup_hierarchies(mountinfo, &controllers());
        assert_eq!(
            found,
            vec![Hierarchy {
                dir: PathBuf::new(),
                kind: HierarchyKind::V2
            }]
        );
        assert!(found[0].holds("memory"));
        assert!(found[0].holds("systemd"));
        let links = [("cpu".to_owned(), "cpu,cpuacct".to_owned())];
        assert_eq!(init_args(&found, &links), vec!["unified"]);
    }

    #[test]
    fn co_mounted_controllers_are_one_hierarchy_and_links_are_kept() {
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
31 25 0:27 / /sys/fs/cgroup/net_cls,net_prio rw - cgroup cgroup rw,net_cls,net_prio
";
        let found = cgroup_hierarchies(mountinfo, &controllers());
        // net_cls and net_prio are not among the enabled controllers given: not mounted.
        assert_eq!(found, vec![v1("cpu,cpuacct", "cpu,cpuacct")]);
        assert!(found[0].holds("cpuacct"));
        assert!(!found[0].holds("cpuset"));
        let links = [("cpu".to_owned(), "cpu,cpuacct".to_owned())];
        let args = init_args(&found, &links);
        assert_eq!(
            args,
            vec![
                "tmpfs",
                "v1",
                "cpu,cpuacct",
                "cpu,cpuacct",
                "link",
                "cpu",
                "cpu,cpuacct"
            ]
        );
    }

    #[test]
    fn mounts_elsewhere_or_deeper_are_not_hierarchies_to_mount() {
        let mountinfo = "\
50 25 0:40 / /tmp/cg rw - cgroup2 cgroup2 rw
51 25 0:41 / /sys/fs/cgroup/memory/nested rw - cgroup cgroup rw,memory
52 25 0:42 / /sys/fs/cgroupx rw - cgroup2 cgroup2 rw
53 25 0:43 / /sys/fs/cgroup/unknown rw - cgroup cgroup rw,bogus
";
        assert!(cgroup_hierarchies(mountinfo, &controllers()).is_empty());
    }

    #[test]
    fn the_later_of_two_mounts_on_one_point_wins_and_escapes_are_decoded() {
        let mountinfo = "\
35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory,xattr
37 31 0:34 / /sys/fs/cgroup/my\\040pids rw - cgroup cgroup rw,pids
";
        assert_eq!(
            cgroup_hierarchies(mountinfo, &controllers()),
            vec![v1("memory", "memory"), v1("my pids", "pids")]
        );
    }

    #[test]
    fn only_enabled_controllers_count() {
        let proc_cgroups = "\
#subsys_name\thierarchy\tnum_cgroups\tenabled
cpuset\t3\t103\t1
memory\t4\t406\t0
pids\t8\t124\t1
";
        assert_eq!(v1_controllers(proc_cgroups), vec!["cpuset", "pids"]);
    }

    #[test]
    fn stale_leftovers_are_known_by_their_owners_pid() {
        assert_eq!(owner("swiftlet-systemd-4242-0-driver"), Some(4242));
        assert_eq!(owner("swiftlet-systemd-x-0-driver"), None);
        assert_eq!(owner("swiftlet-test-4242-0-x"), None);
        assert_eq!(owner("swiftlet-systemd-4242"), None);
    }

    #[test]
    fn the_units_start_the_bus_without_the_hosts_targets() {
        let units = units(Path::new("/tmp/w"));
        let names: Vec<&str> = units.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, [TARGET, "dbus.socket", "dbus.service"]);
        assert!(units[0].1.contains("Wants=dbus.socket dbus.service"));
        for (name, text) in &units[1..] {
            assert!(
                text.contains("DefaultDependencies=no"),
                "{name} would need sysinit.target"
            );
        }
        assert!(
            units[1]
                .1
                .contains("ListenStream=/run/dbus/system_bus_socket")
        );
        assert!(
            units[2]
                .1
                .contains("ExecStart=/usr/bin/dbus-daemon --system")
        );
        assert!(units[2].1.contains("StandardError=append:/tmp/w/dbus.log"));
    }

    #[test]
    fn socket_addresses_fit_or_are_refused() {
        let address = socket_address(Path::new("/proc/1/root/run/dbus/system_bus_socket"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(address.sun_family, libc::AF_UNIX as libc::sa_family_t);
        assert_eq!(address.sun_path[0], b'/' as libc::c_char);
        let long = format!("/{}", "x".repeat(200));
        assert!(socket_address(Path::new(&long)).is_err());
    }

    #[test]
    fn the_init_is_the_first_child() {
        assert_eq!(first_child("4242 4250 "), Some(4242));
        assert_eq!(first_child(""), None);
        assert_eq!(first_child("x"), None);
    }

    #[test]
    fn the_init_script_execs_systemd_last() {
        let last = INIT_SCRIPT.trim_end().lines().last().unwrap_or_default();
        assert!(last.starts_with("exec \"$SWIFTLET_SYSTEMD\" --system"));
        assert!(INIT_SCRIPT.starts_with("set -eu"));
    }
}
