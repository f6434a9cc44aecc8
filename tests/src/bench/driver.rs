//! What every benchmark of `swiftlet-bench` does around its own scenario, written once: the root
//! check, the line saying what will run, the run itself (and, for those that run pods, the
//! runtime cleared when Ctrl-C or SIGTERM interrupts it), the report on stdout (the Markdown table,
//! the verdicts on the targets, the warnings), the JSON (`<out-dir>/<name>.json` unless `--json`)
//! and the latency plot beside the JSON (`<json stem>-latency.svg`).
//!
//! A benchmark says only what is its own by implementing [`Benchmark`]: its scenario, its report
//! and its plot. Percentiles come from `stats`, the machine line from `machine`, the plots from
//! `plot`; swiftlet, `/pods` and the runtime's clean-up from `harness`.
#![expect(clippy::print_stdout, reason = "the report goes to the terminal")]

use std::{
    future::Future,
    path::{Path, PathBuf},
    time::SystemTime,
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use super::machine::Machine;

/// One benchmark's own part; [`run`] does the rest.
pub trait Benchmark {
    /// The subcommand (`swiftlet-bench NAME`, `cargo xtask bench NAME`), and the stem of the JSON
    /// and plot files.
    const NAME: &'static str;
    /// Why the benchmark needs root, as the error of a run without it starts.
    const NEEDS_ROOT: &'static str;
    /// Whether the run leaves pods in the runtime when it is interrupted, which
    /// [`Benchmark::clean_up`] then clears. A benchmark without pods keeps the default
    /// disposition of the signals.
    const RUNS_PODS: bool;

    /// Everything the run measured.
    type Outcome;
    /// What the JSON carries.
    type Report: Serialize;

    /// What is about to run, for the terminal (stderr); nothing to say, `None`.
    fn announce(&self) -> Option<String>;

    /// The scenario, start to end.
    fn run(&self) -> impl Future<Output = Result<Self::Outcome>>;

    /// After an interrupted run (the [`Benchmark::run`] future dropped midway): clears what it
    /// left in the runtime.
    fn clean_up(&self) -> impl Future<Output = Result<()>>;

    fn report(&self, outcome: &Self::Outcome, machine: &Machine, now: SystemTime) -> Self::Report;

    /// The machine line and the table.
    fn markdown(report: &Self::Report) -> String;

    /// One line per target: met or missed.
    fn verdicts(report: &Self::Report) -> Vec<String>;

    /// What makes the numbers doubtful (printed after `WARNING: `).
    fn warnings(report: &Self::Report) -> Vec<String>;

    /// Writes the latency plot, an SVG, to `path`.
    fn plot(&self, path: &Path, machine: &Machine, outcome: &Self::Outcome) -> Result<()>;
}

/// Where the results go: `--json` and `--out-dir`.
#[derive(Clone, Debug)]
pub struct Output {
    /// The JSON's path; `<out_dir>/<name>.json` when `None`.
    pub json: Option<PathBuf>,
    /// Where the JSON (by default) and the plot go; benchmarks put their logs under
    /// `<out_dir>/<name>/`.
    pub out_dir: PathBuf,
}

/// Runs `bench` and reports it: the table, verdicts and warnings on stdout, the JSON and the plot
/// as `output` says.
pub async fn run<B: Benchmark>(bench: &B, output: &Output) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("{}: run `cargo xtask bench {}`", B::NEEDS_ROOT, B::NAME);
    }
    if let Some(line) = bench.announce() {
        eprintln!("{line}");
    }
    let outcome = if B::RUNS_PODS {
        // xtask passes Ctrl-C and SIGTERM on to this process group, swiftlet included: the run
        // in flight is dropped (its swiftlet killed, its folders removed) and the runtime
        // cleared, so that an interrupted run leaves no pod, log or cgroup behind either.
        tokio::select! {
            outcome = bench.run() => outcome?,
            signal = interrupted() => {
                eprintln!("{}: {signal}: clearing the benchmark's pods", B::NAME);
                bench.clean_up().await?;
                bail!("interrupted by {signal}");
            }
        }
    } else {
        bench.run().await?
    };

    let machine = Machine::detect();
    let report = bench.report(&outcome, &machine, SystemTime::now());
    println!("{}", B::markdown(&report));
    for verdict in B::verdicts(&report) {
        println!("{verdict}");
    }
    for problem in B::warnings(&report) {
        println!("WARNING: {problem}");
    }
    std::fs::create_dir_all(&output.out_dir)
        .with_context(|| format!("creating {}", output.out_dir.display()))?;
    let json = output
        .json
        .clone()
        .unwrap_or_else(|| output.out_dir.join(format!("{}.json", B::NAME)));
    write_json(&json, &report)?;
    let svg = plot_path(&json);
    bench
        .plot(&svg, &machine, &outcome)
        .with_context(|| format!("plotting {}", svg.display()))?;
    eprintln!("wrote {} and {}", json.display(), svg.display());
    Ok(())
}

/// The plot beside its JSON and named after it (`pleg.json` → `pleg-latency.svg`), so a run with
/// its own `--json` (another containerd, say) never overwrites another run's plot.
fn plot_path(json: &Path) -> PathBuf {
    let stem = json
        .file_stem()
        .map_or_else(|| "bench".into(), |s| s.to_string_lossy().into_owned());
    json.with_file_name(format!("{stem}-latency.svg"))
}

/// The first SIGINT or SIGTERM ("SIGINT"/"SIGTERM"); never, if the handlers cannot be set.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        _ => std::future::pending().await,
    }
}

fn write_json(path: &Path, report: &impl Serialize) -> Result<()> {
    let mut text = serde_json::to_string_pretty(report).context("serialising the results")?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::plot_path;

    #[test]
    fn the_plot_follows_the_json() {
        assert_eq!(
            plot_path(Path::new("target/bench/pleg.json")),
            Path::new("target/bench/pleg-latency.svg")
        );
        assert_eq!(
            plot_path(Path::new("/tmp/pleg-1.7.json")),
            Path::new("/tmp/pleg-1.7-latency.svg")
        );
    }
}
