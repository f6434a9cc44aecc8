//! The runtime matrix, as the kernel matrix (`vm.rs`) is for kernels: the system tests of every
//! area the container runtime shapes (pods, PLEG, Evented PLEG, eviction, CPU manager, probes,
//! volumes, logs, CRI, registry, runtime handlers) against each private containerd release, one
//! release after another (the tests share the machine's CPUs, memory and cgroups; two suites at
//! once would disturb the evictions and the exclusive CPUs they check), with a report per
//! release. The test binaries are the suite's own build, run directly (no `cargo test`, which
//! would build them again: see `tasks::suite_test_binaries`).
//!
//! `cargo xtask test` runs the whole suite on its release and then [`SELECTION`] on each other
//! one: every area on every release, within CI's time. `cargo xtask runtime-test --all` runs
//! every test of those areas' files instead, on the releases it is given.

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{ChildStdout, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::Instant,
};

use anyhow::{anyhow, bail};

use crate::{
    containerd::{CgroupDriver, Containerd, Version},
    sh,
    supervise::{self, Interrupts, OnContainerdDeath},
    tasks,
};

/// One area of the matrix: its test file (`tests/tests/<file>.rs`) and the tests of it that
/// every release runs in `cargo xtask test`.
struct Area {
    name: &'static str,
    file: &'static str,
    tests: &'static [&'static str],
}

/// What every release runs: per area the tests that go through what differs between releases
/// (the runtime's event order and status timing, its exit and OOM reporting, the sandbox image,
/// CRI fields and handlers).
const SELECTION: &[Area] = &[
    Area {
        name: "pods",
        file: "pods",
        tests: &[
            "exit_codes_and_restart_policies",
            "a_container_over_its_memory_limit_is_oom_killed",
        ],
    },
    Area {
        name: "PLEG",
        file: "pleg",
        tests: &[
            "deaths_reach_the_status_with_no_relist",
            "lost_events_force_a_relist_and_no_death_is_missed",
        ],
    },
    Area {
        name: "Evented PLEG",
        file: "pleg_evented",
        // On 1.6 both check the refusal; on 1.7 each event goes to one subscriber (stale ones
        // included), on 2.x to all.
        tests: &[
            "container_deaths_reach_the_status_from_the_runtimes_events",
            "a_lost_stream_is_subscribed_again_then_the_relist_takes_over",
        ],
    },
    Area {
        name: "eviction",
        file: "eviction",
        tests: &["memory_pressure_evicts_the_best_effort_pod_and_no_other"],
    },
    Area {
        name: "CPU manager",
        file: "cpumanager",
        tests: &["a_guaranteed_pod_gets_cpu_1_alone_until_it_is_deleted"],
    },
    Area {
        name: "probes",
        file: "probes",
        tests: &["each_probe_kind_passes_and_fails"],
    },
    Area {
        name: "volumes",
        file: "volumes",
        tests: &["an_empty_dir_is_shared_between_containers_and_removed_with_the_pod"],
    },
    Area {
        name: "logs",
        file: "logs",
        tests: &["container_logs_with_tail_timestamps_since_and_limits"],
    },
    Area {
        name: "CRI",
        file: "runtime",
        tests: &[
            "runtime_answers_cri_v1_with_the_local_images",
            "a_container_runs_to_its_exit_code_and_its_pod_goes_away",
            "a_pod_on_the_bridge_network_gets_an_address",
        ],
    },
    Area {
        name: "registry",
        file: "registry",
        // The registry's CA through each release's `certs.d` config, credentials over CRI,
        // and pulls under each pull policy.
        tests: &[
            "the_test_registry_serves_pushed_images_to_its_user_over_tls",
            "pods_pull_from_the_registry_with_their_pull_secrets_under_each_policy",
        ],
    },
    Area {
        name: "runtime handlers",
        file: "runtime_handlers",
        tests: &["the_same_pod_runs_under_runc_and_under_crun"],
    },
];

fn selected() -> usize {
    SELECTION.iter().map(|area| area.tests.len()).sum()
}

/// How much of each area a release runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// [`SELECTION`].
    Selection,
    /// Every test of the areas' files.
    All,
}

/// One release's run.
pub struct Outcome {
    version: Version,
    /// `containerd --version`'s release, e.g. `2.1.9+unknown`.
    release: String,
    passed: Vec<String>,
    failed: Vec<String>,
    seconds: u64,
    /// Why the run itself failed (containerd died, the tests could not start), beyond the
    /// failed tests.
    problem: Option<String>,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.problem.is_none() && self.failed.is_empty() && !self.passed.is_empty()
    }
}

/// `cargo xtask runtime-test`: the matrix on `versions` (every release when empty), then the
/// report; fails if any release failed.
pub fn run(versions: &[Version], scope: Scope) -> anyhow::Result<()> {
    let versions = if versions.is_empty() {
        Version::ALL.to_vec()
    } else {
        versions.to_vec()
    };
    crate::setup::ensure()?;
    let outcomes = matrix(&versions, scope)?;
    conclude(&outcomes)
}

/// The matrix on `versions`, one release at a time.
pub fn matrix(versions: &[Version], scope: Scope) -> anyhow::Result<Vec<Outcome>> {
    if !sh::is_root() {
        bail!("the runtime matrix starts containerd and swiftlet: run it as root");
    }
    let files: Vec<&str> = SELECTION.iter().map(|area| area.file).collect();
    let binaries = tasks::suite_test_binaries(&files)?;
    let mut interrupts = Interrupts::catch()?;
    let mut outcomes = Vec::new();
    for &version in versions {
        outcomes.push(one(version, scope, &binaries, &mut interrupts)?);
        if interrupts.requested() {
            bail!("interrupted");
        }
    }
    Ok(outcomes)
}

/// Prints the report and fails unless every release passed.
pub fn conclude(outcomes: &[Outcome]) -> anyhow::Result<()> {
    print_report(outcomes);
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.version.label())
        .collect();
    if !failed.is_empty() {
        bail!(
            "the runtime matrix failed on containerd {}",
            failed.join(", ")
        );
    }
    let passed: Vec<&str> = outcomes.iter().map(|o| o.version.label()).collect();
    println!(
        "xtask: {} runtime matrix passed on containerd {}",
        sh::elapsed(),
        passed.join(", ")
    );
    Ok(())
}

/// The areas' test binaries, in [`SELECTION`]'s order.
type Binaries = Vec<(String, PathBuf)>;

fn one(
    version: Version,
    scope: Scope,
    binaries: &Binaries,
    interrupts: &mut Interrupts,
) -> anyhow::Result<Outcome> {
    println!("xtask: runtime matrix: containerd {}", version.label());
    let started = Instant::now();
    let mut containerd = Containerd::start_with(interrupts, CgroupDriver::Cgroupfs, version)?;
    let release = containerd.release();
    let results = Arc::new(Mutex::new((Vec::new(), Vec::new())));
    let mut containerd_died = false;
    let mut broken = Vec::new();
    for (area, (file, exe)) in SELECTION.iter().zip(binaries) {
        // Run as `cargo test` runs them, without cargo: see `tasks::suite_test_binaries`.
        let mut test = Command::new(exe);
        if scope == Scope::Selection {
            test.arg("--exact").args(area.tests);
        }
        test.current_dir(sh::root().join("tests"))
            .env("SWIFTLET_BIN", tasks::profile_dir(false).join("swiftlet"))
            .env(
                "SWIFTLET_TEST_RUNTIME_ENDPOINT",
                containerd.paths().endpoint(),
            )
            .env("SWIFTLET_TEST_CONTAINERD_STATE", &containerd.paths().state)
            .stdout(Stdio::piped());
        let mut child = supervise::spawn(&mut test)?;
        let failed_before = results.lock().map_or(0, |r| r.1.len());
        let reader = child
            .stdout
            .take()
            .map(|stdout| pass_through(stdout, Arc::clone(&results)));
        let what = format!("tests/{file}.rs");
        let outcome = supervise::supervise(
            &mut child,
            &what,
            interrupts,
            &mut containerd,
            OnContainerdDeath::LetFinish,
        )?;
        if let Some(reader) = reader {
            let _ = reader.join();
        }
        let failed_now = results.lock().map_or(0, |r| r.1.len());
        if !outcome.status.success() && failed_now == failed_before {
            broken.push(format!("{what} failed ({})", outcome.status));
        }
        if outcome.containerd_died {
            containerd_died = true;
            break;
        }
        if outcome.interrupted {
            break;
        }
    }
    let stopped = containerd.stop();
    let (passed, failed) = results
        .lock()
        .map(|r| r.clone())
        .map_err(|_| anyhow!("the test output reader panicked"))?;
    let problem = if containerd_died {
        Some("containerd died during the tests (its log's end is above)".to_owned())
    } else if let Err(error) = stopped {
        Some(format!("containerd did not stop cleanly: {error:#}"))
    } else if !broken.is_empty() {
        Some(broken.join("; "))
    } else if scope == Scope::Selection && passed.len() + failed.len() != selected() {
        // A name that matches no test would otherwise shrink the matrix unnoticed.
        Some(format!(
            "{} of the {} selected tests ran",
            passed.len() + failed.len(),
            selected()
        ))
    } else {
        None
    };
    Ok(Outcome {
        version,
        release,
        passed,
        failed,
        seconds: started.elapsed().as_secs(),
        problem,
    })
}

/// Passes the harness's lines through as they come, keeping the verdicts for the report.
fn pass_through(
    stdout: ChildStdout,
    results: Arc<Mutex<(Vec<String>, Vec<String>)>>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("{line}");
            if let Some((name, verdict)) = verdict(&line)
                && let Ok(mut results) = results.lock()
            {
                let (passed, failed) = &mut *results;
                match verdict {
                    Verdict::Passed => passed.push(name),
                    Verdict::Failed => failed.push(name),
                }
            }
        }
    })
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Passed,
    Failed,
}

/// The libtest line `test <name> ... ok` or `... FAILED`.
fn verdict(line: &str) -> Option<(String, Verdict)> {
    let rest = line.strip_prefix("test ")?;
    let (name, result) = rest.rsplit_once(" ... ")?;
    let verdict = match result.trim() {
        "ok" => Verdict::Passed,
        "FAILED" => Verdict::Failed,
        _ => return None,
    };
    Some((name.to_owned(), verdict))
}

fn print_report(outcomes: &[Outcome]) {
    println!("\nxtask: runtime matrix");
    println!(
        "{:<11} {:<18} {:>6} {:>6} {:>6}  result",
        "containerd", "release", "passed", "failed", "secs"
    );
    for o in outcomes {
        println!(
            "{:<11} {:<18} {:>6} {:>6} {:>6}  {}",
            o.version.label(),
            o.release,
            o.passed.len(),
            o.failed.len(),
            o.seconds,
            if o.ok() { "ok" } else { "FAILED" }
        );
    }
    for o in outcomes {
        println!("\n[{}] {}", o.version.label(), o.release);
        if let Some(problem) = &o.problem {
            println!("  problem: {problem}");
        }
        for test in &o.failed {
            println!("  FAILED {test} (its output is above)");
        }
    }
    println!("\nareas, and the tests each release runs in `cargo xtask test`:");
    for area in SELECTION {
        println!(
            "  {} ({}.rs): {}",
            area.name,
            area.file,
            area.tests.join(", ")
        );
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_verdict_lines_are_read_and_others_ignored() {
        assert_eq!(
            verdict("test exit_codes_and_restart_policies ... ok"),
            Some((
                "exit_codes_and_restart_policies".to_owned(),
                Verdict::Passed
            ))
        );
        assert_eq!(
            verdict("test a_b ... FAILED"),
            Some(("a_b".to_owned(), Verdict::Failed))
        );
        assert_eq!(
            verdict("test a_b has been running for over 60 seconds"),
            None
        );
        assert_eq!(verdict("test result: ok. 3 passed; 0 failed"), None);
        assert_eq!(verdict("running 3 tests"), None);
    }

    #[test]
    fn every_selected_test_is_in_its_file() {
        let root = sh::root();
        for area in SELECTION {
            let path = root.join("tests/tests").join(format!("{}.rs", area.file));
            let source = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for test in area.tests {
                assert!(
                    source.contains(&format!("fn {test}()")),
                    "{} has no test {test}",
                    path.display()
                );
            }
        }
    }
}
