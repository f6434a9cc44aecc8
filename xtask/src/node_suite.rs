//! The host suite's system tests inside the node VM (scenario 2 of issue 19, and issue 18's
//! runtime handlers on a pure cgroup v2 node): a selection of `tests/tests/*.rs` run against the
//! VM's own containerd (a systemd service), under both cgroup drivers, with the real systemd as
//! PID 1. The test executables are the suite's own build (`tasks::suite_test_binaries`, so
//! nothing is compiled twice), copied to the payload disk without their debug sections (a
//! fifth of the size, and the payload is written on every run), with the binaries they start
//! next to them as `cargo test` leaves them (`suite/deps/<test>`, `suite/<binary>`).
//! `xtask/node-vm/scenario2.sh` reads [`SELECTION`] from `suite/selection` and reports a check
//! per test and driver.
//!
//! Why a selection: every test under TCG takes 5-10 times its host time, and the node VM runs
//! in CI. One test per area goes through what pure cgroup v2 and the systemd driver change:
//! where pod and container cgroups are, their limits, the kernel events of their deaths, the
//! memory signals of eviction, the cpuset of an exclusive CPU; and crun, which refuses the hybrid
//! layout of the CI hosts, runs its pod only here.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, anyhow};

use crate::{sh, tasks};

/// The cgroup drivers a test runs under (`SWIFTLET_TEST_CGROUP_DRIVER`; containerd's runc
/// `SystemdCgroup` follows it).
#[derive(Clone, Copy)]
enum Drivers {
    Both,
    /// The node's own containerd configuration (`SystemdCgroup = true`) only.
    Systemd,
}

/// (test file, test, drivers): what scenario 2 runs, in this order (all of one driver first).
const SELECTION: &[(&str, &str, Drivers)] = &[
    // Statuses through restart policies (no cgroup path in it: once); QoS cgroups with their
    // limits and OOM scores under each driver.
    ("pods", "exit_codes_and_restart_policies", Drivers::Systemd),
    (
        "pods",
        "pods_run_in_their_qos_cgroups_with_their_limits",
        Drivers::Both,
    ),
    // Exit codes, a signal and an OOM kill, all from kernel events with no relist.
    (
        "pleg",
        "deaths_reach_the_status_with_no_relist",
        Drivers::Both,
    ),
    // allocatableMemory pressure on the node allocatable cgroup of its own root.
    (
        "eviction",
        "memory_pressure_evicts_the_best_effort_pod_and_no_other",
        Drivers::Both,
    ),
    // An exclusive CPU through the container's cpuset.
    (
        "cpumanager",
        "a_guaranteed_pod_gets_cpu_1_alone_until_it_is_deleted",
        Drivers::Both,
    ),
    // crun next to runc, through RuntimeClasses: the node's containerd as configured.
    (
        "runtime_handlers",
        "the_same_pod_runs_under_runc_and_under_crun",
        Drivers::Systemd,
    ),
];

/// The binaries the selected tests start, found next to the test executables.
const SIBLINGS: [&str; 2] = ["swiftlet", "swiftlet-test-apiserver"];

/// The selected tests' executables, by file.
pub struct Binaries(Vec<(String, PathBuf)>);

/// The test files of [`SELECTION`], each once.
fn files() -> Vec<&'static str> {
    let mut files: Vec<&str> = SELECTION.iter().map(|(file, _, _)| *file).collect();
    files.dedup();
    files
}

/// The suite's build, and the selected files' test executables out of it.
pub fn build() -> anyhow::Result<Binaries> {
    tasks::suite_test_binaries(&files()).map(Binaries)
}

/// `suite/selection`: one `<driver> <file> <test>` line per run, systemd's first.
fn selection() -> String {
    let mut lines = String::new();
    for driver in ["systemd", "cgroupfs"] {
        for (file, test, drivers) in SELECTION {
            if driver == "systemd" || matches!(drivers, Drivers::Both) {
                lines.push_str(&format!("{driver} {file} {test}\n"));
            }
        }
    }
    lines
}

/// Puts the executables and the selection under `stage/suite`.
pub fn stage(stage: &Path, binaries: &Binaries) -> anyhow::Result<()> {
    let suite = stage.join("suite");
    fs::create_dir_all(suite.join("deps"))?;
    fs::write(suite.join("selection"), selection())?;
    for (file, exe) in &binaries.0 {
        stripped(exe, &suite.join("deps").join(file))?;
    }
    let built = tasks::profile_dir(false);
    for name in SIBLINGS {
        stripped(&built.join(name), &suite.join(name))?;
    }
    Ok(())
}

/// A copy of `from` without its debug sections (the symbols stay: backtraces keep names).
fn stripped(from: &Path, to: &Path) -> anyhow::Result<()> {
    if !from.exists() {
        return Err(anyhow!("{} is not built", from.display()));
    }
    sh::run(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(from)
            .arg(to),
    )
    .with_context(|| format!("objcopy (Debian package binutils) of {}", from.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_area_runs_under_both_drivers_and_crun_once() {
        let lines = selection();
        let runs: Vec<(&str, &str)> = lines
            .lines()
            .filter_map(|l| {
                let mut words = l.split(' ');
                Some((words.next()?, words.nth(1)?))
            })
            .collect();
        for file in ["pods", "pleg", "eviction", "cpumanager"] {
            let test_of = |driver| {
                SELECTION
                    .iter()
                    .any(|(f, t, _)| *f == file && runs.contains(&(driver, *t)))
            };
            assert!(test_of("systemd") && test_of("cgroupfs"), "{file}");
        }
        assert_eq!(
            lines
                .matches("the_same_pod_runs_under_runc_and_under_crun")
                .count(),
            1
        );
        // All of one driver before the other: containerd restarts once in between.
        let first_cgroupfs = lines.find("cgroupfs").unwrap_or(lines.len());
        assert!(!lines[first_cgroupfs..].contains("systemd "));
        assert_eq!(
            files(),
            ["pods", "pleg", "eviction", "cpumanager", "runtime_handlers"]
        );
    }
}
