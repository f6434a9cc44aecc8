//! Running commands: each is echoed before it runs, and a failure names the command.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::Instant,
};

use anyhow::{Context as _, bail};

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or(manifest.clone(), Path::to_path_buf)
}

/// Where `setup` puts the tools it builds (bpf-linker).
pub fn tools_dir() -> PathBuf {
    root().join(".tools")
}

/// PATH with the project's tools first.
pub fn path_with_tools() -> std::ffi::OsString {
    let mut dirs = vec![tools_dir().join("bin")];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).unwrap_or_default()
}

/// A command in the workspace root with the tools on PATH.
pub fn cmd(program: &str) -> Command {
    let mut command = Command::new(program);
    command.current_dir(root()).env("PATH", path_with_tools());
    // CI builds once from a fresh clone: incremental compilation's caches would only be written,
    // never read. Every cargo of a CI run goes through here, so they all agree on it.
    if program == "cargo"
        && std::env::var_os("CI").is_some()
        && std::env::var_os("CARGO_INCREMENTAL").is_none()
    {
        command.env("CARGO_INCREMENTAL", "0");
    }
    command
}

static STARTED: OnceLock<Instant> = OnceLock::new();

/// Marks the start of the task, from which [`run`] tells the time of each command.
pub fn start_clock() {
    STARTED.get_or_init(Instant::now);
}

/// `[mm:ss]` since [`start_clock`]: a slow CI run's log shows where its time went.
pub fn elapsed() -> String {
    let secs = STARTED.get_or_init(Instant::now).elapsed().as_secs();
    format!("[{:02}:{:02}]", secs / 60, secs % 60)
}

/// Runs `command`, echoing it; fails naming it if it fails.
pub fn run(command: &mut Command) -> anyhow::Result<()> {
    println!("xtask: {} $ {}", elapsed(), display(command));
    let status = command
        .status()
        .with_context(|| format!("cannot start {}", display(command)))?;
    if !status.success() {
        bail!("{} failed ({status})", display(command));
    }
    println!("xtask: {} done: {}", elapsed(), short(command));
    Ok(())
}

/// The program and its first argument (`cargo test`), for the line that times a command.
fn short(command: &Command) -> String {
    let mut words = vec![command.get_program().to_string_lossy().into_owned()];
    words.extend(
        command
            .get_args()
            .take(1)
            .map(|a| a.to_string_lossy().into_owned()),
    );
    words.join(" ")
}

/// Runs `command` quietly and returns its stdout, or `None` if it fails or cannot start.
pub fn output(command: &mut Command) -> Option<String> {
    let out = command.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn display(command: &Command) -> String {
    let mut text = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
