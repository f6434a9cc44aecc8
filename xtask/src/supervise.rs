//! Running a child (swiftlet, or `cargo test`) to its end while xtask also owns a private
//! containerd: Ctrl-C and SIGTERM are caught and forwarded to the child instead of killing xtask,
//! so that containerd is always stopped after the child; a containerd that dies meanwhile is
//! reported at once. The child runs in its own process group, so the terminal's Ctrl-C reaches it
//! once, through xtask; containerd itself is in another group and hears none of it.

use std::{
    os::unix::process::CommandExt as _,
    process::{Child, Command, ExitStatus},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use nix::{sys::signal::Signal, unistd::Pid};
use signal_hook::{
    consts::{SIGINT, SIGTERM},
    iterator::Signals,
};

use crate::{containerd::Containerd, sh};

const POLL: Duration = Duration::from_millis(50);

/// How long a child may take to exit after a forwarded signal before it is killed.
const GRACE: Duration = Duration::from_secs(15);

/// SIGINT and SIGTERM, caught from creation on: while one exists, these signals no longer end
/// xtask but are collected here for it to act on.
pub struct Interrupts {
    signals: Signals,
    seen: bool,
}

impl Interrupts {
    pub fn catch() -> anyhow::Result<Interrupts> {
        let signals = Signals::new([SIGINT, SIGTERM]).context("catching SIGINT and SIGTERM")?;
        Ok(Interrupts {
            signals,
            seen: false,
        })
    }

    /// Signals received since the last call.
    pub fn take(&mut self) -> Vec<Signal> {
        let taken: Vec<Signal> = self
            .signals
            .pending()
            .filter_map(|s| Signal::try_from(s).ok())
            .collect();
        self.seen |= !taken.is_empty();
        taken
    }

    /// Whether a signal arrived, now or before.
    pub fn requested(&mut self) -> bool {
        let _ = self.take();
        self.seen
    }
}

/// What to do when containerd dies while the child runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OnContainerdDeath {
    /// Stop the child: it cannot work without its runtime (swiftlet).
    StopChild,
    /// Let it finish and report afterwards (the test suite, whose failures then say more).
    LetFinish,
}

/// How a supervised child ended.
pub struct Outcome {
    pub status: ExitStatus,
    /// Whether containerd died while the child ran (reported when it happened).
    pub containerd_died: bool,
    /// Whether xtask was asked to stop (Ctrl-C or SIGTERM) and passed that on.
    pub interrupted: bool,
}

/// Starts `command` in a process group of its own, echoing it.
pub fn spawn(command: &mut Command) -> anyhow::Result<Child> {
    println!("xtask: $ {}", sh::display(command));
    command
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {}", sh::display(command)))
}

/// Waits for `child` (started by [`spawn`]) to end, forwarding caught signals to its process
/// group and watching `containerd`.
pub fn supervise(
    child: &mut Child,
    what: &str,
    interrupts: &mut Interrupts,
    containerd: &mut Containerd,
    on_death: OnContainerdDeath,
) -> anyhow::Result<Outcome> {
    let group = Pid::from_raw(i32::try_from(child.id())?);
    let mut containerd_died = false;
    let mut interrupted = false;
    let mut kill_at: Option<Instant> = None;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Outcome {
                status,
                containerd_died,
                interrupted,
            });
        }
        for signal in interrupts.take() {
            println!("xtask: {signal}: passing it on to {what}");
            interrupted = true;
            let _ = nix::sys::signal::killpg(group, signal);
            kill_at.get_or_insert_with(|| Instant::now() + GRACE);
        }
        if !containerd_died && let Some(report) = containerd.crashed() {
            eprintln!("xtask: error: {report}");
            containerd_died = true;
            if on_death == OnContainerdDeath::StopChild {
                println!("xtask: stopping {what}: it cannot work without its runtime");
                let _ = nix::sys::signal::killpg(group, Signal::SIGTERM);
                kill_at.get_or_insert_with(|| Instant::now() + GRACE);
            }
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            println!("xtask: {what} did not exit within {GRACE:?}; killing it");
            let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
            kill_at = None;
        }
        thread::sleep(POLL);
    }
}
