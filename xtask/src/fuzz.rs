//! `cargo xtask fuzz`: builds the cargo-fuzz targets of `tests/fuzz` once (one cargo build, every
//! target a binary of it) and runs each for a while with libFuzzer, from the committed seeds and
//! the corpus grown by earlier runs; prints the executions and findings per target and fails if any
//! target crashed, hung or ran out of memory, naming the reproducer.
//!
//! The build is cargo-fuzz's `--dev` profile as `tests/fuzz/Cargo.toml` sets it (opt-level 0,
//! debug assertions and overflow checks, line tables) with AddressSanitizer, not its release
//! profile. The agent pulls in k8s-openapi, kube, tonic and rustls, and the serde code of the
//! Kubernetes types is instantiated in the agent itself: a cold build at opt-level 1 took 32 CPU
//! minutes here, and release (opt-level 3, one codegen unit per crate) far more. Measured on
//! k8s-openapi and a Pod decoder alone, coverage-instrumented: opt-level 1 with ASan 174 CPU s,
//! opt-level 0 with ASan 65 s, opt-level 0 without 47 s; the whole build at opt-level 0 with ASan
//! took 11 CPU minutes. So the targets run unoptimised (slower per input, which a longer run
//! makes up for), libFuzzer itself optimised (unoptimised, its own bookkeeping took most of each
//! run), and AddressSanitizer stays for its small price: the YAML parser under the manifest and
//! config targets (unsafe-libyaml) and the record decoder (`sys::read_pod`) read through raw
//! pointers.
//!
//! In `cargo xtask test` the build (and the install of the fuzz tools a fresh clone lacks) runs in
//! the background at nice 19 from the moment the tests are compiled, after the suite's lints
//! ([`Prebuild`]), and the short runs come last ([`in_suite`]). Targets run as many at a time as there are CPUs.
//!
//! Everything it makes is under `target/fuzz/`: the build, `corpus/<target>/` (grown, kept across
//! runs), `artifacts/<target>/` (crashing inputs) and `logs/<target>.log` (libFuzzer's output).

use std::{
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::Instant,
};

use anyhow::{Context as _, bail};
use nix::sys::signal::Signal;

use crate::{setup, sh};

/// The targets (binaries of `tests/fuzz`), each with what it feeds hostile bytes to.
pub const TARGETS: &[(&str, &str)] = &[
    (
        "static_pod_manifest",
        "a static pod manifest: decode, defaults, validation",
    ),
    (
        "cri_log_line",
        "CRI log records, one line at a time and streamed in any chunks",
    ),
    (
        "container_log_read",
        "a whole container log read as /containerLogs reads it",
    ),
    ("config_file", "the --config file into a validated Config"),
    (
        "kernel_event",
        "ring-buffer records into events, and their cgroup paths",
    ),
    (
        "http_query",
        "kubelet server request targets: /containerLogs, exec/attach/portForward/run queries",
    ),
];

/// Seconds per target of `cargo xtask fuzz` without `--seconds`.
pub const DEFAULT_SECONDS: u64 = 60;
/// Seconds per target in `cargo xtask test` (CI).
pub const CI_SECONDS: u64 = 20;
/// One input taking longer than this is a finding (a hang). Generous: the machine is shared and
/// an input runs under AddressSanitizer.
const TIMEOUT_SECONDS: u64 = 10;
/// libFuzzer's memory limit per target process.
const RSS_LIMIT_MB: u64 = 2048;
/// The longest input libFuzzer makes up: room for a manifest or a config with every field, a
/// few kernel records, a log file of some lines.
const MAX_LEN: usize = 16 * 1024;

const TRIPLE: &str = "x86_64-unknown-linux-gnu";

fn fuzz_dir() -> PathBuf {
    sh::root().join("tests").join("fuzz")
}

fn out_dir() -> PathBuf {
    sh::root().join("target").join("fuzz")
}

/// What one target's run found.
struct Outcome {
    target: &'static str,
    runs: u64,
    per_second: u64,
    peak_rss_mb: u64,
    corpus: usize,
    coverage: String,
    findings: Vec<PathBuf>,
    failed: bool,
    /// libFuzzer's output.
    log: PathBuf,
}

/// `cargo xtask fuzz [--seconds N] [TARGET...]`.
pub fn run(seconds: u64, names: &[String]) -> anyhow::Result<()> {
    let targets = select(names)?;
    setup::ensure()?;
    setup::fuzz_tools()?;
    let started = Instant::now();
    sh::run(&mut build_command())?;
    println!(
        "xtask: fuzz: built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    run_targets(&targets, seconds)
}

/// The targets named (all when none), refusing unknown names.
fn select(names: &[String]) -> anyhow::Result<Vec<(&'static str, &'static str)>> {
    if names.is_empty() {
        return Ok(TARGETS.to_vec());
    }
    names
        .iter()
        .map(|name| {
            TARGETS
                .iter()
                .find(|(t, _)| t == name)
                .copied()
                .with_context(|| {
                    let known: Vec<&str> = TARGETS.iter().map(|(t, _)| *t).collect();
                    format!("no fuzz target {name:?}; the targets: {}", known.join(", "))
                })
        })
        .collect()
}

/// One build of every target.
fn build_command() -> Command {
    let mut cargo = sh::cmd("cargo");
    cargo
        .args(["+nightly", "fuzz", "build", "--dev", "--fuzz-dir"])
        .arg(fuzz_dir())
        .arg("--target-dir")
        .arg(out_dir());
    cargo
}

/// The suite's fuzz build (and the install of the fuzz tools a fresh clone lacks), after the
/// steps the suite gives it first (its lints), started in the background at the lowest CPU
/// priority while the tests run: they leave the CPUs idle much of the time (containers
/// starting, probes and timeouts waited for, one agent at a time), and the builds take only
/// what they leave. Dropped before [`in_suite`] waited for it (a failed test ends the suite
/// first), it kills the command under way with its compilers and stops.
pub struct Prebuild {
    worker: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    /// The process group of the command under way; `None` once cancelled.
    current: Arc<Mutex<Option<Option<u32>>>>,
    log: PathBuf,
    started: Instant,
}

impl Prebuild {
    pub fn start(first: Vec<(String, Command)>) -> anyhow::Result<Prebuild> {
        let logs = out_dir().join("logs");
        fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let log_path = logs.join("build.log");
        let log = fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut steps = first;
        steps.extend(setup::fuzz_tool_installs());
        steps.push(("building the fuzz targets".to_owned(), build_command()));
        println!(
            "xtask: in the background at nice 19 while the tests run: {} (output: {})",
            steps
                .iter()
                .map(|(what, _)| what.as_str())
                .collect::<Vec<_>>()
                .join(", then "),
            log_path.display()
        );
        let current = Arc::new(Mutex::new(Some(None)));
        let worker = {
            let current = current.clone();
            std::thread::spawn(move || run_niced(steps, &log, &current))
        };
        Ok(Prebuild {
            worker: Some(worker),
            current,
            log: log_path,
            started: Instant::now(),
        })
    }

    /// Waits for the build; says how long it took and how long the suite waited for it.
    fn finish(mut self) -> anyhow::Result<()> {
        let waiting = Instant::now();
        let result = match self.worker.take() {
            Some(worker) => worker
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the fuzz build's thread panicked"))),
            None => Err(anyhow::anyhow!("the fuzz build was already waited for")),
        };
        if let Err(error) = result {
            let text = fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            for line in tail.iter().rev() {
                eprintln!("  {line}");
            }
            return Err(error.context(format!(
                "a background step (lints or the fuzz build) failed; its output is in {}",
                self.log.display()
            )));
        }
        println!(
            "xtask: the background lints and fuzz build took {:.0} s; the suite waited {:.0} s \
             for them",
            self.started.elapsed().as_secs_f64(),
            waiting.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

impl Drop for Prebuild {
    fn drop(&mut self) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        let running = match self.current.lock() {
            Ok(mut current) => current.take().flatten(),
            Err(_) => None,
        };
        if let Some(pgid) = running.and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), Signal::SIGKILL);
        }
        let _ = worker.join();
    }
}

/// Runs `steps` one after the other at nice 19, each in its own process group (recorded in
/// `current` so that it can be killed), output to `log`; stops at the first failure or when
/// cancelled (`current` emptied).
fn run_niced(
    steps: Vec<(String, Command)>,
    log: &fs::File,
    current: &Mutex<Option<Option<u32>>>,
) -> anyhow::Result<()> {
    for (what, command) in steps {
        let mut nice = Command::new("nice");
        nice.args(["-n", "19"])
            .arg(command.get_program())
            .args(command.get_args())
            .envs(
                command
                    .get_envs()
                    .filter_map(|(key, value)| value.map(|value| (key, value))),
            )
            .current_dir(sh::root())
            .env("PATH", sh::path_with_tools())
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?);
        let mut child = {
            let mut current = current
                .lock()
                .map_err(|_| anyhow::anyhow!("the background steps' state is poisoned"))?;
            let Some(slot) = current.as_mut() else {
                bail!("cancelled");
            };
            let child = nice
                .spawn()
                .with_context(|| format!("cannot start {}", sh::display(&command)))?;
            *slot = Some(child.id());
            child
        };
        let status = child
            .wait()
            .with_context(|| format!("waiting for {what}"))?;
        if !status.success() {
            bail!("{} failed ({status})", sh::display(&command));
        }
    }
    Ok(())
}

/// The suite's short run of every target, once its background build is done.
pub fn in_suite(build: Prebuild) -> anyhow::Result<()> {
    build.finish()?;
    run_targets(TARGETS, CI_SECONDS)
}

/// Runs the targets, as many at a time as there are CPUs (each fuzzer is one thread).
fn run_targets(targets: &[(&'static str, &'static str)], seconds: u64) -> anyhow::Result<()> {
    let parallel = std::thread::available_parallelism().map_or(1, usize::from);
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for batch in targets.chunks(parallel) {
        let results: Vec<anyhow::Result<Outcome>> = std::thread::scope(|scope| {
            let running: Vec<_> = batch
                .iter()
                .map(|(target, what)| scope.spawn(move || fuzz(target, what, seconds)))
                .collect();
            running
                .into_iter()
                .map(|r| {
                    r.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a fuzz runner panicked")))
                })
                .collect()
        });
        for result in results {
            outcomes.push(result?);
        }
    }
    println!(
        "xtask: fuzz: {} targets, {seconds} s each, {parallel} at a time: {:.0} s",
        targets.len(),
        started.elapsed().as_secs_f64()
    );
    report(&outcomes)
}

fn binary(target: &str) -> PathBuf {
    out_dir().join(TRIPLE).join("debug").join(target)
}

/// Runs one target for `seconds`, its output kept in a log file.
fn fuzz(target: &'static str, what: &str, seconds: u64) -> anyhow::Result<Outcome> {
    let out = out_dir();
    let corpus = out.join("corpus").join(target);
    let artifacts = out.join("artifacts").join(target);
    let logs = out.join("logs");
    for dir in [&corpus, &artifacts, &logs] {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let before = files(&artifacts)?;
    let seeds = fuzz_dir().join("seeds").join(target);
    let log_path = logs.join(format!("{target}.log"));
    let log =
        fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let mut command = Command::new(binary(target));
    command
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-timeout={TIMEOUT_SECONDS}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-max_len={MAX_LEN}"))
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        // New inputs go to the first directory; the seeds are only read.
        .arg(&corpus)
        .arg(&seeds)
        // As cargo-fuzz runs its targets (the check is noisy for Rust binaries).
        .env("ASAN_OPTIONS", "detect_odr_violation=0")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    println!(
        "xtask: fuzz: {target} ({what}) for {seconds} s; libFuzzer's output: {}",
        log_path.display()
    );
    let status = command
        .status()
        .with_context(|| format!("cannot run {}: build it first", binary(target).display()))?;
    let text = fs::read_to_string(&log_path).unwrap_or_default();
    let findings: Vec<PathBuf> = files(&artifacts)?
        .into_iter()
        .filter(|f| !before.contains(f))
        .filter(|f| is_finding(f))
        .collect();
    Ok(Outcome {
        target,
        runs: final_stat(&text, "stat::number_of_executed_units").unwrap_or(0),
        per_second: final_stat(&text, "stat::average_exec_per_sec").unwrap_or(0),
        peak_rss_mb: final_stat(&text, "stat::peak_rss_mb").unwrap_or(0),
        corpus: files(&corpus)?.len(),
        coverage: last_coverage(&text),
        findings,
        failed: !status.success(),
        log: log_path,
    })
}

/// Regular files directly in `dir`.
fn files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// libFuzzer names a crashing input `crash-…`, a hang `timeout-…`, too much memory `oom-…`,
/// a leak `leak-…`.
fn is_finding(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        ["crash-", "timeout-", "oom-", "leak-"]
            .iter()
            .any(|p| n.starts_with(p))
    })
}

/// A `stat::<name>: <value>` line of `-print_final_stats`.
fn final_stat(text: &str, name: &str) -> Option<u64> {
    text.lines().rev().find_map(|l| {
        l.strip_prefix(name)?
            .trim_start_matches(':')
            .trim()
            .parse()
            .ok()
    })
}

/// `cov: N ft: M` of libFuzzer's last status line: edges and features covered.
fn last_coverage(text: &str) -> String {
    text.lines()
        .rev()
        .find_map(|l| {
            let cov = l.split_once(" cov: ")?.1.split_whitespace().next()?;
            let ft = l.split_once(" ft: ")?.1.split_whitespace().next()?;
            Some(format!("{cov} edges, {ft} features"))
        })
        .unwrap_or_else(|| "-".to_owned())
}

fn report(outcomes: &[Outcome]) -> anyhow::Result<()> {
    println!("xtask: fuzz: results");
    println!(
        "  {:<22} {:>12} {:>8} {:>8} {:>7}  {:<28} findings",
        "target", "executions", "exec/s", "rss MB", "corpus", "coverage"
    );
    for o in outcomes {
        println!(
            "  {:<22} {:>12} {:>8} {:>8} {:>7}  {:<28} {}",
            o.target,
            o.runs,
            o.per_second,
            o.peak_rss_mb,
            o.corpus,
            o.coverage,
            o.findings.len() + usize::from(o.failed && o.findings.is_empty())
        );
    }
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.failed).collect();
    if failed.is_empty() {
        println!("xtask: fuzz: no findings");
        return Ok(());
    }
    for o in &failed {
        let text = fs::read_to_string(&o.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        eprintln!(
            "xtask: fuzz: {} failed; the end of its output ({}):",
            o.target,
            o.log.display()
        );
        for line in tail.iter().rev() {
            eprintln!("  {line}");
        }
        for finding in &o.findings {
            println!(
                "xtask: fuzz: {} found {}; reproduce with {} {}",
                o.target,
                finding.display(),
                binary(o.target).display(),
                finding.display()
            );
        }
    }
    let names: Vec<&str> = failed.iter().map(|o| o.target).collect();
    bail!(
        "fuzzing found problems in {} (each becomes a regression unit test next to the code it \
         broke, and a fix)",
        names.join(", ")
    )
}
