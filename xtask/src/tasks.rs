//! build, run and test. `run` and `test` bring up the private containerd (`containerd.rs`)
//! when swiftlet needs a runtime and the user named none, and always stop it afterwards.

use std::{os::unix::process::CommandExt as _, path::PathBuf, process::Command};

use anyhow::{Context as _, anyhow, bail};

use crate::{
    containerd::{CgroupDriver, Containerd, Version},
    setup, sh,
    supervise::{self, Interrupts, OnContainerdDeath},
};

pub fn profile_dir(release: bool) -> PathBuf {
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

/// `--eviction-hard` of the quick start (`cargo xtask run` with no arguments).
const DEV_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<5%,nodefs.inodesFree<5%,imagefs.available<5%";

/// Runs `swiftlet` as root (it loads eBPF programs). `swiftlet run` without a runtime endpoint
/// gets the private containerd and runs as xtask's child, so that containerd stops after it;
/// anything else replaces this process, so that signals from the terminal reach swiftlet directly.
pub fn run(release: bool, version: Version, args: &[String]) -> anyhow::Result<()> {
    build(release)?;
    let binary = profile_dir(release).join("swiftlet");
    let mut args: Vec<String> = if args.is_empty() {
        // A development machine's disk is often fuller than the kubelet's default disk
        // thresholds (nodefs 10 %, imagefs 15 % free) allow: the examples would be turned away
        // under DiskPressure. The quick start keeps the memory threshold and lowers the disk ones.
        // Image GC too: over its 85 % it would remove the local busybox before the examples
        // start, and the private containerd has no registry to bring it back.
        println!(
            "xtask: run: eviction thresholds for a development machine: {DEV_EVICTION_HARD}, \
             image GC off (pass your own arguments to run with the kubelet's defaults)"
        );
        vec![
            "run".to_owned(),
            "--manifests".to_owned(),
            sh::root().join("examples").display().to_string(),
            "--eviction-hard".to_owned(),
            DEV_EVICTION_HARD.to_owned(),
            "--image-gc-high-threshold".to_owned(),
            "100".to_owned(),
        ]
    } else {
        args.to_vec()
    };
    let needs_runtime = args.first().is_some_and(|a| a == "run")
        && !args.iter().any(|a| {
            a == "--runtime-endpoint"
                || a.starts_with("--runtime-endpoint=")
                || a == "--help"
                || a == "-h"
        });
    if !needs_runtime {
        return exec_as_root(&binary, &args);
    }
    let cgroup_driver = cgroup_driver_of(&args)?;
    if cgroup_driver == CgroupDriver::Systemd {
        println!(
            "xtask: run: cgroupDriver: systemd, so runc in the private containerd uses systemd too"
        );
    }
    let mut interrupts = Interrupts::catch()?;
    let mut containerd = Containerd::start_with(&mut interrupts, cgroup_driver, version)?;
    args.push("--runtime-endpoint".to_owned());
    args.push(containerd.paths().endpoint());
    if !args
        .iter()
        .any(|a| a.starts_with("--pod-infra-container-image"))
    {
        // containerd 1.6 does not pin its sandbox image (1.7 and 2.1 do): named here, image GC
        // never takes it on any version, and no registry could bring it back.
        args.push("--pod-infra-container-image".to_owned());
        args.push(crate::images::PAUSE.to_owned());
    }
    // Containerd::start made sure this is root.
    let mut child = supervise::spawn(Command::new(&binary).args(&args))?;
    let outcome = supervise::supervise(
        &mut child,
        "swiftlet",
        &mut interrupts,
        &mut containerd,
        OnContainerdDeath::StopChild,
    )?;
    let stopped = containerd.stop();
    let ended = if outcome.containerd_died {
        Err(anyhow!(
            "swiftlet was stopped because containerd died (its log's end is above)"
        ))
    } else if !outcome.status.success() && !outcome.interrupted {
        Err(anyhow!("swiftlet failed ({})", outcome.status))
    } else {
        println!("xtask: swiftlet ended ({})", outcome.status);
        Ok(())
    };
    both(ended, stopped)
}

/// The `cgroupDriver` of the file `--config` names in swiftlet's `args` (cgroupfs, swiftlet's
/// default, without one): the private containerd's runc must use the same.
fn cgroup_driver_of(args: &[String]) -> anyhow::Result<CgroupDriver> {
    let mut path = None;
    for (i, arg) in args.iter().enumerate() {
        if let Some(value) = arg.strip_prefix("--config=") {
            path = Some(value.to_owned());
        } else if arg == "--config" {
            path = args.get(i + 1).cloned();
        }
    }
    let Some(path) = path else {
        return Ok(CgroupDriver::Cgroupfs);
    };
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading --config {path}"))?;
    // Only this one key: swiftlet itself reports anything else wrong with the file.
    let file: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap_or_default();
    Ok(match file.get("cgroupDriver").and_then(|d| d.as_str()) {
        Some("systemd") => CgroupDriver::Systemd,
        _ => CgroupDriver::Cgroupfs,
    })
}

/// The first error of the task and of stopping containerd, saying the other if both failed.
pub fn both(task: anyhow::Result<()>, stopped: anyhow::Result<()>) -> anyhow::Result<()> {
    match (task, stopped) {
        (Err(task), Err(stopping)) => {
            eprintln!("xtask: error: stopping containerd: {stopping:#}");
            Err(task)
        }
        (Err(error), Ok(())) | (Ok(()), Err(error)) => Err(error),
        (Ok(()), Ok(())) => Ok(()),
    }
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

/// The binaries the system tests start and the tests themselves, in one build.
pub fn build_suite() -> anyhow::Result<()> {
    sh::run(sh::cmd("cargo").args([
        "build",
        "--workspace",
        "--exclude",
        "swiftlet-ebpf",
        "--bins",
        "--tests",
    ]))
}

/// [`build_suite`], and the executables of the integration test files `files`
/// (`tests/tests/<file>.rs`), in that order. The runtime and kernel matrices run these
/// executables themselves: a `cargo test` of fewer targets would unify the dependencies'
/// features over fewer packages and targets (the agent's dev-dependencies, xtask's), and so
/// compile the agent, the tests and much below them a second time.
pub fn suite_test_binaries(files: &[&str]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut cargo = sh::cmd("cargo");
    cargo.args([
        "build",
        "--workspace",
        "--exclude",
        "swiftlet-ebpf",
        "--bins",
        "--tests",
        "--message-format=json-render-diagnostics",
    ]);
    println!("xtask: $ {}", sh::display(&cargo));
    let out = cargo.stderr(std::process::Stdio::inherit()).output()?;
    if !out.status.success() {
        bail!("building the tests failed ({})", out.status);
    }
    let mut built = std::collections::HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_test = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "test"));
        if let (Some(name), Some(exe), true) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
            is_test,
        ) {
            built.insert(name.to_owned(), PathBuf::from(exe));
        }
    }
    files
        .iter()
        .map(|&file| {
            built
                .remove(file)
                .map(|exe| (file.to_owned(), exe))
                .ok_or_else(|| anyhow!("cargo built no test binary tests/tests/{file}.rs"))
        })
        .collect()
}

/// The whole suite, as CI runs it.
pub fn test(version: Version) -> anyhow::Result<()> {
    setup::ensure()?;
    sh::run(sh::cmd("cargo").args(["fmt", "--all", "--", "--check"]))?;
    // The fuzz targets are a workspace of their own.
    sh::run(sh::cmd("cargo").args([
        "fmt",
        "--manifest-path",
        "tests/fuzz/Cargo.toml",
        "--all",
        "--",
        "--check",
    ]))?;
    // The binaries the tests start and the tests themselves in one build: built apart, tokio
    // and everything above it would be compiled twice (the tests' dev-dependencies turn on more
    // of tokio's features, and cargo unifies features per build). The tests are compiled first;
    // the lints and the fuzz build then take only what running them leaves of the CPUs.
    // Meanwhile, the containerd releases of this run and the runtime matrix are fetched and crun
    // is built (a minute that would otherwise come after the build).
    // So is the node VM's image (downloads and the disk, mostly): not while the tests run, where
    // debootstrap's unpacking once stalled a CPU-manager benchmark's pod start by seconds.
    let prepared =
        sh::is_root().then(|| crate::containerd::prepare_in_background(Version::ALL.to_vec()));
    let node_image = sh::is_root()
        .then(|| crate::node_vm::prepare_in_background(crate::node_vm::DEFAULT_CONTAINERD));
    let built = build_suite();
    // Joined even when the build failed: no download, crun or image build outlives the task.
    let ready = prepared.map(|prepared| {
        prepared
            .join()
            .map_err(|_| anyhow!("fetching containerd and building crun panicked"))
            .and_then(|ready| ready)
    });
    let node_image = node_image.map(|image| {
        image
            .join()
            .map_err(|_| anyhow!("building the node VM's image panicked"))
            .and_then(|ready| ready)
    });
    built?;
    if let Some(image) = node_image {
        image?;
        println!("xtask: {} the node VM's image is ready", sh::elapsed());
    }
    if let Some(ready) = ready {
        ready?;
        println!(
            "xtask: {} containerd releases and crun ready",
            sh::elapsed()
        );
    }
    let fuzz_build = crate::fuzz::Prebuild::start(vec![
        ("clippy of the workspace".to_owned(), clippy_workspace()),
        ("clippy of the eBPF programs".to_owned(), clippy_ebpf()),
    ])?;
    let mut cargo_test = sh::cmd("cargo");
    cargo_test
        .args(["test", "--workspace", "--exclude", "swiftlet-ebpf"])
        .env("SWIFTLET_BIN", profile_dir(false).join("swiftlet"));
    if !sh::is_root() {
        if std::env::var_os("CI").is_some() {
            bail!("CI is set but this is not root: the privileged tests cannot run");
        }
        println!(
            "xtask: NOTE: not root, so the privileged system tests will skip (each says so), and \
             so will those needing the private containerd; run `sudo -E cargo xtask test` to \
             include them (and the kernel matrix, `cargo xtask vm-test`)"
        );
        sh::run(&mut cargo_test)?;
        crate::fuzz::in_suite(fuzz_build)?;
        println!("xtask: {} all tests passed", sh::elapsed());
        return Ok(());
    }
    let mut interrupts = Interrupts::catch()?;
    let mut containerd = Containerd::start_with(&mut interrupts, CgroupDriver::Cgroupfs, version)?;
    cargo_test
        .env(
            "SWIFTLET_TEST_RUNTIME_ENDPOINT",
            containerd.paths().endpoint(),
        )
        .env("SWIFTLET_TEST_CONTAINERD_STATE", &containerd.paths().state);
    let mut child = supervise::spawn(&mut cargo_test)?;
    let outcome = supervise::supervise(
        &mut child,
        "the tests",
        &mut interrupts,
        &mut containerd,
        OnContainerdDeath::LetFinish,
    )?;
    // Stopped whatever the tests did; a failure to stop cleanly fails the task too.
    let stopped = containerd.stop();
    let tested = if outcome.containerd_died {
        Err(anyhow!(
            "containerd crashed during the tests (its log's end is above)"
        ))
    } else if !outcome.status.success() {
        Err(anyhow!("cargo test failed ({})", outcome.status))
    } else {
        Ok(())
    };
    both(tested, stopped)?;
    drop(interrupts);
    // Every area on the other releases too (a selection: the whole suite on each would double
    // CI's time).
    let others: Vec<Version> = Version::ALL.into_iter().filter(|&v| v != version).collect();
    println!(
        "xtask: the whole suite passed on containerd {}; now the runtime matrix's selection on {}",
        version.label(),
        others
            .iter()
            .map(|v| v.label())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let outcomes = crate::runtimes::matrix(&others, crate::runtimes::Scope::Selection)?;
    crate::runtimes::conclude(&outcomes)?;
    // The host's own kernel-event tests ran above; the matrix adds the LTS kernels (and reports
    // the host beside them).
    crate::vm::run(&crate::vm::parse_kernels(&[])?)?;
    // Then swiftlet installed on a systemd node (its root filesystem cached under target/).
    crate::node_vm::run(
        crate::node_vm::DEFAULT_KERNEL,
        crate::node_vm::DEFAULT_CONTAINERD,
        &crate::node_vm::SUITE_SCENARIOS,
        crate::node_suite::Size::Ci,
        None,
    )?;
    // Last, so that its build had the tests and the matrix to hide behind.
    crate::fuzz::in_suite(fuzz_build)?;
    println!("xtask: {} all tests passed", sh::elapsed());
    Ok(())
}

/// Lints the workspace but the eBPF programs, in a target directory of its own: it runs while
/// the tests run, which must not wait on its lock (and it shares no artefact with the build).
fn clippy_workspace() -> std::process::Command {
    let mut cargo = sh::cmd("cargo");
    cargo
        .args([
            "clippy",
            "--workspace",
            "--exclude",
            "swiftlet-ebpf",
            "--all-targets",
            "--target-dir",
        ])
        .arg(sh::root().join("target").join("clippy"))
        .args(["--", "-D", "warnings"]);
    cargo
}

/// Lints the eBPF programs for the target they run on.
fn clippy_ebpf() -> std::process::Command {
    let target_dir = sh::root().join("target").join("ebpf-clippy");
    let mut cargo = sh::cmd("cargo");
    cargo
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
        );
    cargo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_private_containerd_follows_the_config_files_cgroup_driver() {
        let dir = std::env::temp_dir().join(format!("xtask-driver-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("kubelet.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n",
        )
        .unwrap();
        let run = |extra: &[String]| {
            let mut args = vec!["run".to_owned()];
            args.extend_from_slice(extra);
            cgroup_driver_of(&args).unwrap()
        };
        let path = file.display().to_string();
        assert_eq!(run(&[]), CgroupDriver::Cgroupfs);
        assert_eq!(
            run(&["--config".into(), path.clone()]),
            CgroupDriver::Systemd
        );
        assert_eq!(run(&[format!("--config={path}")]), CgroupDriver::Systemd);
        std::fs::write(&file, "cgroupDriver: cgroupfs\n").unwrap();
        assert_eq!(
            run(&["--config".into(), path.clone()]),
            CgroupDriver::Cgroupfs
        );
        assert!(
            cgroup_driver_of(&[
                "run".into(),
                "--config".into(),
                dir.join("missing").display().to_string()
            ])
            .is_err()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
