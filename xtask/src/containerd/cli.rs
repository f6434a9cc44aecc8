//! `cargo xtask containerd start|stop|status`: the private containerd for people, e.g. to run
//! `swiftlet run --runtime-endpoint …` or single tests against it, or to clear a crashed run.

use std::{
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use super::{
    CgroupDriver, Containerd, NAMESPACE, Paths, STOP_TIMEOUT, Version, ctr, leftovers, try_lock,
};
use crate::{sh, supervise::Interrupts};

/// `containerd start`: runs until Ctrl-C, SIGTERM (what `containerd stop` sends) or its death.
pub(super) fn start_foreground(
    cgroup_driver: CgroupDriver,
    version: Version,
) -> anyhow::Result<()> {
    let mut interrupts = Interrupts::catch()?;
    let mut containerd = Containerd::start_with(&mut interrupts, cgroup_driver, version)?;
    let paths = containerd.paths().clone();
    println!(
        "xtask: containerd: running until Ctrl-C (or `cargo xtask containerd stop`). Use it with:\n  \
         swiftlet run --runtime-endpoint {endpoint}\n  \
         SWIFTLET_TEST_RUNTIME_ENDPOINT={endpoint} SWIFTLET_TEST_CONTAINERD_STATE={state} cargo test\n  \
         ctr --address {socket} -n {NAMESPACE} images ls",
        endpoint = paths.endpoint(),
        state = paths.state.display(),
        socket = paths.socket().display(),
    );
    loop {
        if let Some(signal) = interrupts.take().first() {
            println!("xtask: containerd: {signal}");
            return containerd.stop();
        }
        if let Some(report) = containerd.crashed() {
            // Said before the clean-up's messages, which would bury it.
            eprintln!("xtask: error: {report}");
            containerd.stop()?;
            bail!("containerd crashed (above)");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// `containerd stop`: asks the owning xtask to stop (it stops containerd in order), then clears
/// leftovers.
pub(super) fn stop_other(version: Version) -> anyhow::Result<()> {
    let paths = Paths::of(version)?;
    if !sh::is_root() {
        bail!("stopping the private containerd needs root: `sudo -E cargo xtask containerd stop`");
    }
    let lock = match try_lock(&paths)? {
        Ok(lock) => lock,
        Err(holder) => {
            let pid: i32 = holder
                .parse()
                .with_context(|| format!("{} names no pid: {holder:?}", paths.lock().display()))?;
            println!("xtask: containerd: asking xtask (pid {pid}), which runs it, to stop");
            kill(Pid::from_raw(pid), Signal::SIGTERM)
                .with_context(|| format!("signalling pid {pid}"))?;
            let deadline = Instant::now() + STOP_TIMEOUT * 3;
            loop {
                if let Ok(lock) = try_lock(&paths)? {
                    break lock;
                }
                if Instant::now() >= deadline {
                    bail!("xtask (pid {pid}) still holds {}", paths.lock().display());
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
    };
    leftovers::clear(&paths)?;
    drop(lock);
    println!(
        "xtask: containerd: not running; nothing left under {}",
        paths.state.display()
    );
    Ok(())
}

/// `containerd status`.
pub(super) fn status(version: Version) -> anyhow::Result<()> {
    let paths = Paths::of(version)?;
    println!("state:    {}", paths.state.display());
    println!("endpoint: {}", paths.endpoint());
    println!("log:      {}", paths.log().display());
    let holder = match try_lock(&paths) {
        Ok(Ok(_released_on_drop)) => None,
        Ok(Err(holder)) => Some(holder),
        Err(error) => {
            println!("owner:    unknown ({error:#})");
            None
        }
    };
    let processes = leftovers::processes_referencing(&paths.state);
    let mounts = leftovers::mounts_under(&paths.state)?;
    match &holder {
        Some(pid) => println!("owner:    xtask pid {pid}"),
        None if processes.is_empty() => println!("owner:    none (not running)"),
        None => println!("owner:    none (its processes below are a crashed run's)"),
    }
    for (pid, argv0) in &processes {
        println!("process:  {pid} {argv0}");
    }
    if holder.is_some() && paths.socket().exists() {
        let mut ctr = ctr(&paths);
        if let Some(version) = sh::output(ctr.args(["--connect-timeout", "2s", "version"])) {
            let server = version
                .lines()
                .skip_while(|l| !l.starts_with("Server"))
                .find_map(|l| l.trim().strip_prefix("Version:"))
                .unwrap_or("?");
            println!("answers:  yes (containerd {})", server.trim());
            for what in ["images", "containers", "tasks"] {
                let listed = sh::output(&mut ctr_in(&paths, what)).unwrap_or_default();
                println!("{what} ({NAMESPACE}):");
                for line in listed.lines() {
                    println!("  {line}");
                }
            }
        } else {
            println!("answers:  no");
        }
    }
    println!("mounts:   {} under the state folder", mounts.len());
    if holder.is_none() && (!processes.is_empty() || !mounts.is_empty()) {
        println!("leftovers of a crashed run: clear them with `cargo xtask containerd stop`");
    }
    Ok(())
}

fn ctr_in(paths: &Paths, what: &str) -> Command {
    let mut command = ctr(paths);
    command.args(["-n", NAMESPACE, what, "ls"]);
    command
}
