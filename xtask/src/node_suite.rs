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
//! layout of the CI hosts, runs its pod only here. [`Size::Full`] runs each under both drivers;
//! CI ([`Size::Ci`]) each once, under one driver or the other.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, anyhow};

use crate::{sh, tasks};

/// A cgroup driver a test runs under (`SWIFTLET_TEST_CGROUP_DRIVER`; containerd's runc
/// `SystemdCgroup` follows it).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Driver {
    Systemd,
    Cgroupfs,
}

impl Driver {
    const ALL: [Driver; 2] = [Driver::Systemd, Driver::Cgroupfs];

    fn name(self) -> &'static str {
        match self {
            Driver::Systemd => "systemd",
            Driver::Cgroupfs => "cgroupfs",
        }
    }
}

/// Which runs of [`SELECTION`] scenario 2 makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Size {
    /// Every test under every driver it lists (about 12 minutes under TCG).
    Full,
    /// What `cargo xtask test` runs: every area once, under one driver or the other, and crun.
    Ci,
}

/// One test of the selection: the drivers of the full selection, and the one of CI's.
struct Run {
    file: &'static str,
    test: &'static str,
    full: &'static [Driver],
    ci: Option<Driver>,
}

const BOTH: &[Driver] = &Driver::ALL;
const SYSTEMD: &[Driver] = &[Driver::Systemd];

/// What scenario 2 runs, in this order (all of one driver first). CI's runs cover every area
/// once and each driver: the node's own (systemd) for the runtime handlers and the deaths, where
/// the kernel events and crun differ most from the host; cgroupfs for the cgroups a test names
/// itself (QoS, the eviction's allocatable cgroup, the exclusive CPU's cpuset). Scenario 5 adds
/// the static CPU manager under the systemd driver.
const SELECTION: &[Run] = &[
    // Statuses through restart policies (no cgroup path in it: once).
    Run {
        file: "pods",
        test: "exit_codes_and_restart_policies",
        full: SYSTEMD,
        ci: None,
    },
    // QoS cgroups with their limits and OOM scores under each driver.
    Run {
        file: "pods",
        test: "pods_run_in_their_qos_cgroups_with_their_limits",
        full: BOTH,
        ci: Some(Driver::Cgroupfs),
    },
    // Exit codes, a signal and an OOM kill, all from kernel events with no relist.
    Run {
        file: "pleg",
        test: "deaths_reach_the_status_with_no_relist",
        full: BOTH,
        ci: Some(Driver::Systemd),
    },
    // allocatableMemory pressure on the node allocatable cgroup of its own root.
    Run {
        file: "eviction",
        test: "memory_pressure_evicts_the_best_effort_pod_and_no_other",
        full: BOTH,
        ci: Some(Driver::Cgroupfs),
    },
    // An exclusive CPU through the container's cpuset.
    Run {
        file: "cpumanager",
        test: "a_guaranteed_pod_gets_cpu_1_alone_until_it_is_deleted",
        full: BOTH,
        ci: Some(Driver::Cgroupfs),
    },
    // crun next to runc, through RuntimeClasses: the node's containerd as configured.
    Run {
        file: "runtime_handlers",
        test: "the_same_pod_runs_under_runc_and_under_crun",
        full: SYSTEMD,
        ci: Some(Driver::Systemd),
    },
];

impl Run {
    fn runs_under(&self, driver: Driver, size: Size) -> bool {
        match size {
            Size::Full => self.full.contains(&driver),
            Size::Ci => self.ci == Some(driver),
        }
    }
}

/// The binaries the selected tests start, found next to the test executables.
const SIBLINGS: [&str; 2] = ["swiftlet", "swiftlet-test-apiserver"];

/// The selected tests' executables, by file, and which runs of them the VM makes.
pub struct Binaries {
    size: Size,
    exes: Vec<(String, PathBuf)>,
}

impl Binaries {
    pub fn size(&self) -> Size {
        self.size
    }
}

/// The test files of `size`'s runs, each once.
fn files(size: Size) -> Vec<&'static str> {
    let mut files: Vec<&str> = SELECTION
        .iter()
        .filter(|run| Driver::ALL.iter().any(|d| run.runs_under(*d, size)))
        .map(|run| run.file)
        .collect();
    files.dedup();
    files
}

/// The suite's build, and the test executables of `size`'s runs out of it.
pub fn build(size: Size) -> anyhow::Result<Binaries> {
    let exes = tasks::suite_test_binaries(&files(size))?;
    Ok(Binaries { size, exes })
}

/// `suite/selection`: one `<driver> <file> <test>` line per run, systemd's first.
fn selection(size: Size) -> String {
    let mut lines = String::new();
    for driver in Driver::ALL {
        for run in SELECTION.iter().filter(|run| run.runs_under(driver, size)) {
            lines.push_str(&format!("{} {} {}\n", driver.name(), run.file, run.test));
        }
    }
    lines
}

/// Puts the executables and the selection under `stage/suite`.
pub fn stage(stage: &Path, binaries: &Binaries) -> anyhow::Result<()> {
    let suite = stage.join("suite");
    fs::create_dir_all(suite.join("deps"))?;
    fs::write(suite.join("selection"), selection(binaries.size))?;
    for (file, exe) in &binaries.exes {
        stripped(exe, &suite.join("deps").join(file))?;
    }
    let built = tasks::profile_dir(false);
    for name in SIBLINGS {
        stripped(&built.join(name), &suite.join(name))?;
    }
    Ok(())
}

/// A copy of `from` without its debug sections (the symbols stay: backtraces keep names).
pub fn stripped(from: &Path, to: &Path) -> anyhow::Result<()> {
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

    /// (driver, file, test) of each line of `size`'s selection.
    fn runs(size: Size) -> Vec<(String, String, String)> {
        selection(size)
            .lines()
            .map(|l| {
                let words: Vec<&str> = l.split(' ').collect();
                assert_eq!(words.len(), 3, "{l}");
                (
                    words[0].to_owned(),
                    words[1].to_owned(),
                    words[2].to_owned(),
                )
            })
            .collect()
    }

    const AREAS: [&str; 4] = ["pods", "pleg", "eviction", "cpumanager"];
    const CRUN: &str = "the_same_pod_runs_under_runc_and_under_crun";

    #[test]
    fn the_full_selection_runs_every_area_under_both_drivers_and_crun_once() {
        let runs = runs(Size::Full);
        for file in AREAS {
            for driver in ["systemd", "cgroupfs"] {
                assert!(
                    runs.iter().any(|(d, f, _)| d == driver && f == file),
                    "{file} under {driver}"
                );
            }
        }
        assert_eq!(runs.iter().filter(|(_, _, t)| t == CRUN).count(), 1);
        assert_eq!(
            files(Size::Full),
            ["pods", "pleg", "eviction", "cpumanager", "runtime_handlers"]
        );
    }

    #[test]
    fn ci_runs_every_area_once_both_drivers_and_crun() {
        let runs = runs(Size::Ci);
        for file in AREAS {
            assert_eq!(
                runs.iter().filter(|(_, f, _)| f == file).count(),
                1,
                "{file}"
            );
        }
        for driver in ["systemd", "cgroupfs"] {
            assert!(runs.iter().any(|(d, _, _)| d == driver), "{driver}");
        }
        assert!(runs.iter().any(|(d, _, t)| d == "systemd" && t == CRUN));
        // A strict subset of the full selection.
        let full = self::runs(Size::Full);
        assert!(runs.iter().all(|run| full.contains(run)));
        assert!(runs.len() < full.len());
    }

    #[test]
    fn all_of_one_driver_runs_before_the_other() {
        // containerd restarts once in between.
        for size in [Size::Full, Size::Ci] {
            let drivers: Vec<String> = runs(size).into_iter().map(|(d, _, _)| d).collect();
            let first_cgroupfs = drivers
                .iter()
                .position(|d| d == "cgroupfs")
                .unwrap_or(drivers.len());
            assert!(drivers[first_cgroupfs..].iter().all(|d| d == "cgroupfs"));
        }
    }
}
