//! build, run and test.

use std::{os::unix::process::CommandExt as _, path::PathBuf};

use anyhow::bail;

use crate::{setup, sh};

fn profile_dir(release: bool) -> PathBuf {
    sh::root()
        .join("target")
        .join(if release { "release" } else { "debug" })
}

pub fn build(release: bool) -> anyhow::Result<()> {
    setup::ensure()?;
    let mut cargo = sh::cmd("cargo");
    cargo.args(["build", "--bins"]);
    if release {
        cargo.arg("--release");
    }
    sh::run(&mut cargo)
}

/// Replaces this process with `swiftlet` (as root: it loads eBPF programs), so that signals
/// from the terminal reach the agent directly.
pub fn run(release: bool, args: &[String]) -> anyhow::Result<()> {
    build(release)?;
    let binary = profile_dir(release).join("swiftlet");
    let args: Vec<String> = if args.is_empty() {
        vec!["run".to_owned()]
    } else {
        args.to_vec()
    };
    exec_as_root(&binary, &args)
}

/// Execs `binary` with `args`, through `sudo` when not root.
pub fn exec_as_root(binary: &std::path::Path, args: &[String]) -> anyhow::Result<()> {
    let mut command = if sh::is_root() {
        let mut c = std::process::Command::new(binary);
        c.args(args);
        c
    } else if sh::output(std::process::Command::new("sudo").arg("-V")).is_some() {
        println!("xtask: not root; running through sudo (swiftlet loads eBPF programs)");
        let mut c = std::process::Command::new("sudo");
        c.arg("-E").arg(binary).args(args);
        c
    } else {
        bail!("swiftlet must run as root to load its eBPF programs, and sudo is not available");
    };
    println!("xtask: $ {}", sh::display(&command));
    let error = command.exec();
    bail!("cannot exec {}: {error}", binary.display())
}

/// The whole suite, as CI runs it.
pub fn test() -> anyhow::Result<()> {
    setup::ensure()?;
    sh::run(sh::cmd("cargo").args(["fmt", "--all", "--", "--check"]))?;
    sh::run(sh::cmd("cargo").args([
        "clippy",
        "--workspace",
        "--exclude",
        "swiftlet-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    clippy_ebpf()?;
    sh::run(sh::cmd("cargo").args(["build", "--bins"]))?;
    if !sh::is_root() {
        if std::env::var_os("CI").is_some() {
            bail!("CI is set but this is not root: the privileged tests cannot run");
        }
        println!(
            "xtask: NOTE: not root, so the privileged system tests will skip (each says so); \
             run `sudo -E cargo xtask test` to include them"
        );
    }
    sh::run(
        sh::cmd("cargo")
            .args(["test", "--workspace", "--exclude", "swiftlet-ebpf"])
            .env("SWIFTLET_BIN", profile_dir(false).join("swiftlet")),
    )?;
    println!("xtask: all tests passed");
    Ok(())
}

/// Lints the eBPF programs for the target they run on.
fn clippy_ebpf() -> anyhow::Result<()> {
    let target_dir = sh::root().join("target").join("ebpf-clippy");
    sh::run(
        sh::cmd("cargo")
            .args([
                "clippy",
                "--package",
                "swiftlet-ebpf",
                "--release",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--target-dir",
            ])
            .arg(&target_dir)
            .args(["--", "-D", "warnings"])
            .env("RUSTC_BOOTSTRAP", "1")
            .env(
                "CARGO_ENCODED_RUSTFLAGS",
                "--cfg=bpf_target_arch=\"x86_64\"",
            ),
    )
}
