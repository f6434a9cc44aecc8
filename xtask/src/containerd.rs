//! The private containerd that `cargo xtask run` and `cargo xtask test` give swiftlet when the
//! user names no runtime: its own config, root, state, sockets, runc root and CNI config, all under
//! `target/swiftlet-state/containerd/`, so it never meets a system containerd. This module owns
//! that instance's life: clearing what a crashed run left (containers, shims, mounts — only ever
//! under the state folder), writing the config, starting it, waiting until it answers, importing
//! the local images (`images.rs` builds them), noticing when it dies, and stopping it so that no
//! process or mount outlives the task. One xtask at a time owns the instance (a lock file), and
//! `cargo xtask containerd start|stop|status` offers the same to people.
//!
//! Submodules: `config` (what containerd and CNI are told), `leftovers` (clearing a crashed
//! run), `cli` (the commands for people).
//!
//! Not here: talking CRI (swiftlet's `cri/` does; this module only uses `ctr`), and supervising
//! the program that uses the runtime (`supervise.rs`).

use std::{
    fs::{self, File},
    io::{Read as _, Seek as _, Write as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Subcommand;
use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::{
    images::{self, Image},
    sh,
    supervise::Interrupts,
};

mod cli;
mod config;
mod crun;
mod fetch;
mod leftovers;
mod version;

pub use fetch::{deb as fetch_deb, system_mirror};
pub use version::Version;

/// The CRI plugin's namespace: images imported elsewhere are invisible to CRI.
const NAMESPACE: &str = "k8s.io";

/// How long containerd may take to answer on its socket after starting.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long containerd may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Lines of containerd's log shown when it fails.
const LOG_TAIL_LINES: usize = 30;

#[derive(Subcommand)]
pub enum Action {
    /// Start it in the foreground (images built and imported) and keep it running until Ctrl-C
    /// or `cargo xtask containerd stop`; it prints the endpoint to give swiftlet
    /// (`--runtime-endpoint`) or the tests (`SWIFTLET_TEST_RUNTIME_ENDPOINT`).
    Start {
        /// The cgroup driver runc is told to use (`SystemdCgroup`): the one swiftlet's
        /// `cgroupDriver` names; `systemd` needs systemd as the init system.
        #[arg(long, value_enum, default_value_t = CgroupDriver::Cgroupfs)]
        cgroup_driver: CgroupDriver,
        /// The containerd release: 2.1 (Debian sid), 1.7 (Debian trixie), both fetched into
        /// target/containerd-versions/ on first use, or the system's 1.6. Each has its own state folder,
        /// target/swiftlet-state/containerd (1.6) or containerd-<version>.
        #[arg(long, value_enum, default_value_t = Version::default())]
        version: Version,
    },
    /// Stop the instance another xtask runs, and clear what a crashed run left behind
    /// (containers, shims, mounts under the state folder).
    Stop {
        /// Whose instance (each version has its own).
        #[arg(long, value_enum, default_value_t = Version::default())]
        version: Version,
    },
    /// Whether it runs, who owns it, its images and containers, and any leftovers.
    Status {
        /// Whose instance (each version has its own).
        #[arg(long, value_enum, default_value_t = Version::default())]
        version: Version,
    },
}

/// How runc makes the containers' cgroups: it must be the driver swiftlet makes the pods'
/// cgroups with (the kubelet and the runtime agree on one, or runc puts containers where the
/// pod's limits do not hold).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}

/// Where everything of the private instance lives.
#[derive(Debug, Clone)]
pub struct Paths {
    pub state: PathBuf,
    /// The release whose instance this is: its binaries and config format.
    pub version: Version,
}

impl Paths {
    /// `<workspace>/target/swiftlet-state/<the version's folder>`, created and canonical (mount
    /// points and command lines are compared against it as text).
    pub fn of(version: Version) -> anyhow::Result<Paths> {
        let state = sh::root()
            .join("target")
            .join("swiftlet-state")
            .join(version.state_dir_name());
        fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
        let state = fs::canonicalize(&state)?;
        let paths = Paths { state, version };
        // sun_path holds 107 bytes; the ttrpc socket's path is the longest.
        let longest = paths.ttrpc_socket().as_os_str().len();
        if longest > 107 {
            bail!(
                "{} is {longest} bytes, too long for a unix socket (107); use a checkout with a \
                 shorter path",
                paths.ttrpc_socket().display()
            );
        }
        Ok(paths)
    }

    pub fn socket(&self) -> PathBuf {
        self.state.join("containerd.sock")
    }

    fn ttrpc_socket(&self) -> PathBuf {
        self.state.join("containerd.sock.ttrpc")
    }

    /// What swiftlet's `--runtime-endpoint` takes.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    fn config(&self) -> PathBuf {
        self.state.join("config.toml")
    }

    pub fn log(&self) -> PathBuf {
        self.state.join("containerd.log")
    }

    fn lock(&self) -> PathBuf {
        self.state.join("xtask.lock")
    }

    /// containerd's `root`: content, snapshots, metadata; kept between runs (the imported
    /// images stay imported).
    fn root(&self) -> PathBuf {
        self.state.join("root")
    }

    /// containerd's `state`: what a reboot would clear (task bundles, sockets, netns mounts).
    fn run(&self) -> PathBuf {
        self.state.join("run")
    }

    /// runc's state for this instance's containers (one folder per namespace).
    fn runc_root(&self) -> PathBuf {
        self.state.join("runc")
    }

    /// The registries' hosts folder (`<registry host:port>/hosts.toml`, containerd's
    /// `config_path`), where tests put the CA of a local registry.
    pub fn certs_d(&self) -> PathBuf {
        self.state.join("certs.d")
    }

    /// crun's state for the containers of the `crun` handler, laid out as runc's.
    fn crun_root(&self) -> PathBuf {
        self.state.join("crun")
    }

    fn cni_conf_dir(&self) -> PathBuf {
        self.state.join("cni").join("net.d")
    }
}

pub fn command(action: Action) -> anyhow::Result<()> {
    match action {
        Action::Start {
            cgroup_driver,
            version,
        } => cli::start_foreground(cgroup_driver, version),
        Action::Stop { version } => cli::stop_other(version),
        Action::Status { version } => cli::status(version),
    }
}

/// Fetches and unpacks `versions` and builds crun (whatever is not there yet), on a thread at
/// nice 10 whose result the caller joins. `cargo xtask test` starts it before compiling the
/// suite: the downloads wait on the network and the crun build takes what the compiler leaves of
/// the CPUs, instead of both running after it while nothing else happens. [`Containerd::start_with`]
/// finds them done (both are idempotent, and lock against a second xtask doing the same).
pub fn prepare_in_background(versions: Vec<Version>) -> thread::JoinHandle<anyhow::Result<()>> {
    thread::spawn(move || {
        lower_this_threads_priority();
        for version in versions {
            fetch::ensure(version)
                .with_context(|| format!("fetching containerd {}", version.label()))?;
        }
        crun::ensure().context("building crun")?;
        Ok(())
    })
}

/// Nice 10 (or the nicer value it already has) for the calling thread and what it starts: on
/// Linux the nice value is a thread's (`setpriority(2)`, BUGS: "the nice value is a per-thread
/// attribute"), and a child inherits the value of the thread that forked it. Best effort: at
/// worst the work competes evenly.
pub(crate) fn lower_this_threads_priority() {
    Errno::clear();
    // SAFETY: getpriority and setpriority only read their integer arguments; `who` 0 is the
    // calling thread.
    let current = unsafe { nix::libc::getpriority(nix::libc::PRIO_PROCESS, 0) };
    if current == -1 && Errno::last() != Errno::UnknownErrno {
        return;
    }
    // SAFETY: as above.
    let _ = unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, 0, current.max(10)) };
}

/// A running private containerd, owned by this xtask; stopped when dropped.
pub struct Containerd {
    paths: Paths,
    child: Child,
    /// Held while the instance runs: a second xtask would otherwise clear our containers as
    /// leftovers.
    _lock: Flock<File>,
    stopped: bool,
    version: Version,
}

impl Containerd {
    /// Clears leftovers, starts containerd `version` (fetched first if need be, with crun built)
    /// with runc and crun on `cgroup_driver`, waits until it answers and imports the images.
    /// Gives up early when `interrupts` sees Ctrl-C.
    pub fn start_with(
        interrupts: &mut Interrupts,
        cgroup_driver: CgroupDriver,
        version: Version,
    ) -> anyhow::Result<Containerd> {
        if !sh::is_root() {
            bail!(
                "the private containerd must run as root; run `sudo -E cargo xtask ...`, or give \
                 swiftlet a runtime yourself with --runtime-endpoint"
            );
        }
        let images = images::ensure()?;
        fetch::ensure(version)?;
        let started = Instant::now();
        let paths = Paths::of(version)?;
        let lock = lock(&paths)?;
        leftovers::clear(&paths)?;
        let crun = crun::ensure()?;
        config::write(&paths, cgroup_driver, version, &crun)?;
        let log_path = paths.log();
        if log_path.exists() {
            // The previous run's log stays readable (a crash is often explained there).
            let _ = fs::rename(&log_path, paths.state.join("containerd.previous.log"));
        }
        let log = File::create(&log_path)?;
        let mut command = Command::new(version.program("containerd"));
        if let Some(bin) = version.bin_dir() {
            // Its own shim (containerd-shim-runc-v2) first; runc is the system's.
            let mut dirs = vec![bin];
            if let Some(path) = std::env::var_os("PATH") {
                dirs.extend(std::env::split_paths(&path));
            }
            command.env("PATH", std::env::join_paths(dirs)?);
        }
        command
            .arg("--config")
            .arg(paths.config())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: the terminal's Ctrl-C must not stop it before swiftlet.
            .process_group(0);
        println!(
            "xtask: containerd: $ {} (log: {})",
            sh::display(&command),
            log_path.display()
        );
        let child = command.spawn().context(
            "cannot start containerd (Debian package containerd; `cargo xtask setup` installs it)",
        )?;
        let mut containerd = Containerd {
            paths,
            child,
            _lock: lock,
            stopped: false,
            version,
        };
        containerd.wait_ready(interrupts)?;
        for image in &images {
            containerd.import(image)?;
        }
        println!(
            "xtask: containerd: {} ready at {} (pid {}) in {:.1} s",
            version.label(),
            containerd.paths.endpoint(),
            containerd.child.id(),
            started.elapsed().as_secs_f64()
        );
        Ok(containerd)
    }

    pub fn paths(&self) -> &Paths {
        &self.paths
    }

    /// The release `containerd --version` names (e.g. `2.1.9+unknown`), or what it printed.
    pub fn release(&self) -> String {
        let out = sh::output(Command::new(self.version.program("containerd")).arg("--version"))
            .unwrap_or_default();
        version::release_of(&out).map_or_else(|| out.trim().to_owned(), str::to_owned)
    }

    /// `Some(report)` once containerd has exited while it should run: its status and the tail of
    /// its log.
    pub fn crashed(&mut self) -> Option<String> {
        if self.stopped {
            return None;
        }
        let status = self.child.try_wait().ok()??;
        Some(format!(
            "containerd (pid {}) exited unexpectedly ({status}); the end of {}:\n{}",
            self.child.id(),
            self.paths.log().display(),
            log_tail(&self.paths.log())
        ))
    }

    /// Stops containerd (SIGTERM, then SIGKILL after a while) and clears every container, shim
    /// and mount it leaves: containerd does not stop its shims when it exits.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> anyhow::Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let pid = self.child.id();
        if let Some(status) = self.child.try_wait()? {
            println!("xtask: containerd: had already exited ({status})");
        } else {
            println!("xtask: containerd: stopping (pid {pid})");
            let _ = kill(Pid::from_raw(i32::try_from(pid)?), Signal::SIGTERM);
            let deadline = Instant::now() + STOP_TIMEOUT;
            while self.child.try_wait()?.is_none() {
                if Instant::now() >= deadline {
                    println!(
                        "xtask: containerd: still running {STOP_TIMEOUT:?} after SIGTERM; killing it"
                    );
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                thread::sleep(Duration::from_millis(50));
            }
        }
        leftovers::clear(&self.paths)?;
        println!("xtask: containerd: stopped");
        Ok(())
    }

    /// Polls until the gRPC socket answers. `ctr` waits 10 s for a socket that does not exist,
    /// so it is asked only once the file is there.
    fn wait_ready(&mut self, interrupts: &mut Interrupts) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(report) = self.crashed() {
                bail!("{report}");
            }
            if interrupts.requested() {
                bail!("interrupted while containerd was starting");
            }
            if self.paths.socket().exists()
                && sh::output(self.ctr().args(["--connect-timeout", "2s", "version"])).is_some()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "containerd did not answer on {} within {READY_TIMEOUT:?}; the end of {}:\n{}",
                    self.paths.socket().display(),
                    self.paths.log().display(),
                    log_tail(&self.paths.log())
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Imports `image` into the CRI namespace unless this very manifest is already there (the
    /// root folder keeps images between runs).
    fn import(&self, image: &Image) -> anyhow::Result<()> {
        if self.has_image(image)? {
            println!("xtask: containerd: {} already imported", image.name);
            return Ok(());
        }
        sh::run(
            self.ctr()
                .args(["-n", NAMESPACE, "images", "import"])
                .arg(&image.tar),
        )?;
        if !self.has_image(image)? {
            bail!(
                "`ctr images import {}` did not create {} with manifest {}",
                image.tar.display(),
                image.name,
                image.manifest_digest
            );
        }
        Ok(())
    }

    fn has_image(&self, image: &Image) -> anyhow::Result<bool> {
        let listed = sh::output(self.ctr().args(["-n", NAMESPACE, "images", "ls"]))
            .context("`ctr images ls` failed")?;
        // Columns: REF TYPE DIGEST SIZE PLATFORMS LABELS.
        Ok(listed.lines().any(|line| {
            let mut columns = line.split_whitespace();
            columns.next() == Some(image.name) && columns.nth(1) == Some(&image.manifest_digest)
        }))
    }

    fn ctr(&self) -> Command {
        ctr(&self.paths)
    }
}

impl Drop for Containerd {
    /// An early return or a panic between start and stop must not leave containerd running.
    fn drop(&mut self) {
        if let Err(error) = self.stop_inner() {
            eprintln!("xtask: error: stopping containerd: {error:#}");
        }
    }
}

fn ctr(paths: &Paths) -> Command {
    let mut command = Command::new(paths.version.program("ctr"));
    command.arg("--address").arg(paths.socket());
    command
}

/// Takes the instance's lock, or says which xtask holds it.
fn lock(paths: &Paths) -> anyhow::Result<Flock<File>> {
    match try_lock(paths)? {
        Ok(lock) => Ok(lock),
        Err(holder) => bail!(
            "the private containerd in {} is in use by another xtask (pid {holder}); wait for it, \
             or stop it with `cargo xtask containerd stop`",
            paths.state.display()
        ),
    }
}

/// The instance `cargo xtask containerd start` keeps running for people, if one does: its paths
/// and that xtask's pid. Another task may use it as it is (a benchmark, say) instead of failing
/// on the lock; an instance owned by any other xtask (a test run, another benchmark) is not
/// offered, as that xtask clears and stops it when it is done.
pub fn started_for_people(version: Version) -> anyhow::Result<Option<(Paths, String)>> {
    let paths = Paths::of(version)?;
    let holder = match try_lock(&paths)? {
        Ok(_released_on_drop) => return Ok(None),
        Err(holder) => holder,
    };
    let args: Vec<String> = fs::read(format!("/proc/{holder}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let containerd_start = args
        .windows(2)
        .any(|w| w[0] == "containerd" && w[1] == "start");
    Ok((containerd_start && paths.socket().exists()).then_some((paths, holder)))
}

/// The lock with our pid written in it, or the pid of the xtask holding it.
fn try_lock(paths: &Paths) -> anyhow::Result<Result<Flock<File>, String>> {
    let file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(paths.lock())
        .with_context(|| format!("opening {}", paths.lock().display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut lock) => {
            lock.set_len(0)?;
            lock.rewind()?;
            writeln!(lock, "{}", std::process::id())?;
            Ok(Ok(lock))
        }
        Err((mut file, Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            Ok(Err(holder.trim().to_owned()))
        }
        Err((_, errno)) => Err(errno).context(format!("locking {}", paths.lock().display())),
    }
}

/// The last lines of containerd's log, indented.
fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_else(|e| format!("(cannot read it: {e})"));
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(LOG_TAIL_LINES);
    lines[start..]
        .iter()
        .map(|l| format!("  | {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The background preparation runs niced, and so does what it starts; this process does not.
    #[test]
    fn only_the_preparing_thread_and_its_children_are_niced() {
        let nice_of_child = || {
            let out = Command::new("nice").output().expect("nice runs");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<i32>()
                .unwrap()
        };
        let before = nice_of_child();
        let in_thread = thread::spawn(move || {
            lower_this_threads_priority();
            nice_of_child()
        })
        .join()
        .unwrap();
        assert_eq!(in_thread, before.max(10));
        assert_eq!(
            nice_of_child(),
            before,
            "the rest of xtask keeps its priority"
        );
    }
}
