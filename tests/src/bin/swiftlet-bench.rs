//! swiftlet's benchmark driver, run as root by `cargo xtask bench <which>`.
//!
//! ```text
//! swiftlet-bench events [--exits N] [--json FILE] [--out-dir DIR] [--ring-buffer-bytes B]
//! swiftlet-bench startup --runtime-endpoint unix://SOCKET [--swiftlet PATH] [--rounds N]
//!                        [--batch N]... [--json FILE] [--out-dir DIR] [--poll-ms MS]
//!                        [--timeout-s S]
//! swiftlet-bench pleg --runtime-endpoint unix://SOCKET [--swiftlet PATH] [--size N]...
//!                     [--exits N] [--idle-s S] [--quick] [--json FILE] [--out-dir DIR]
//! swiftlet-bench eviction --runtime-endpoint unix://SOCKET [--swiftlet PATH] [--mode M]...
//!                         [--runs N] [--quick] [--json FILE] [--out-dir DIR]
//! swiftlet-bench cpumanager --runtime-endpoint unix://SOCKET [--swiftlet PATH] [--mode M]...
//!                           [--runs N] [--quick] [--json FILE] [--out-dir DIR]
//! ```
//!
//! `events` measures, on the running kernel, how long a process-exit event takes from the
//! kernel's tracepoint to swiftlet's reader, for exits one at a time (`paced`) and at the highest
//! rate the machine produces (`storm`, one forking worker per CPU), and whether the ring buffer
//! loses any at that rate. It prints a Markdown table and writes JSON and an SVG latency plot.
//!
//! `startup` measures how long static pods take from their manifest's appearance to Running as
//! `GET /pods` shows it, for batches written at once into a fresh `swiftlet run`'s manifest
//! directory, against a real container runtime (`cargo xtask bench startup` starts its private
//! containerd). Same outputs: a table, JSON, an SVG plot; plus each round's swiftlet log and
//! `/metrics` snapshot under `<out-dir>/startup/`.
//!
//! `pleg` measures, with `--pleg relist` (1 s) and `--pleg ebpf` side by side for each number of
//! running containers, how long after a container's init is killed its `ContainerDied` reaches
//! swiftlet's gRPC stream, and what each costs idle (CPU, CRI calls, RSS). Same outputs, logs
//! under `<out-dir>/pleg/`.
//!
//! `eviction` measures, with the eviction manager woken by the kernel (`kernel`: every wake-up),
//! by its periodic 10 s check alone (`periodic`, the kubelet's model) and by PSI triggers alone
//! (`psi`), how long after the pods' working set crosses an `allocatableMemory.available`
//! threshold the manager decides to evict the pod that caused it, and its container has stopped.
//! Same outputs, logs under `<out-dir>/eviction/`.
//!
//! `cpumanager` measures, with the static CPU manager applying cpusets on events (`events`) and
//! on its 10 s reconcile alone (`reconcile`, the kubelet's model), how long after a Guaranteed
//! pod's container has started its CPU is its own (the shared pool's spinner off it), how long
//! other pods and the system ran on that CPU in the container's first 10 s, and what the
//! scheduler audit's programs cost in context switches. Same outputs, logs under
//! `<out-dir>/cpumanager/`.
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark driver reports on the terminal"
)]

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use clap::{Args, Parser, Subcommand};
use swiftlet_tests::bench::{
    cpumanager,
    events::{self, Outcome, Scenario},
    eviction,
    machine::{self, Machine},
    pleg,
    plot::{self, Axes, Curve},
    report::{Report, ScenarioReport},
    startup,
};

#[derive(Parser)]
#[command(name = "swiftlet-bench", about = "swiftlet's benchmarks (run as root)")]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Kernel-to-userspace latency of exit events, and the spawn-storm rate and losses.
    Events(EventsArgs),
    /// Static pod startup latency: manifest written → Running in /pods, batches of 10 and 30.
    Startup(StartupArgs),
    /// Exit detection latency and idle cost, relist PLEG against kernel-event PLEG.
    Pleg(PlegArgs),
    /// Memory pressure → eviction latency: kernel wake-ups, the periodic check, PSI.
    Eviction(EvictionArgs),
    /// CPU manager: start → exclusive CPU, on events vs the 10 s reconcile; foreign time on the
    /// CPU; the scheduler audit's cost.
    Cpumanager(CpumanagerArgs),
}

#[derive(Args)]
struct EventsArgs {
    /// Exits per scenario (10,000 or more, for a meaningful p99.9).
    #[arg(long, default_value_t = 20_000)]
    exits: u64,
    /// Where to write the JSON results (default <out-dir>/events.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where the JSON (by default) and the plot go.
    #[arg(long, default_value = "target/bench")]
    out_dir: PathBuf,
    /// Size of the events ring buffer: a power-of-two multiple of the page size.
    #[arg(long, default_value_t = swiftlet_common::DEFAULT_RING_BYTES)]
    ring_buffer_bytes: u32,
}

#[derive(Args)]
struct StartupArgs {
    /// The CRI runtime swiftlet runs the pods on (`unix://…`; the busybox and pause images
    /// imported, as `cargo xtask bench startup` does).
    #[arg(long)]
    runtime_endpoint: String,
    /// The swiftlet binary (default: the one next to this driver).
    #[arg(long)]
    swiftlet: Option<PathBuf>,
    /// Rounds per batch size, each with a fresh swiftlet.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Pods per batch (repeatable; default 10 and 30).
    #[arg(long = "batch", value_name = "N")]
    batches: Vec<usize>,
    /// Where to write the JSON results (default <out-dir>/startup.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where the JSON (by default), the plot, and the logs go.
    #[arg(long, default_value = "target/bench")]
    out_dir: PathBuf,
    /// Interval of the /pods poll, in ms: the resolution of the measurement.
    #[arg(long, default_value_t = 5)]
    poll_ms: u64,
    /// How long a round waits for its pods to run, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
}

#[derive(Args)]
struct PlegArgs {
    /// The CRI runtime swiftlet runs the pods on (`unix://…`; the busybox and pause images
    /// imported, as `cargo xtask bench pleg` does).
    #[arg(long)]
    runtime_endpoint: String,
    /// The swiftlet binary (default: the one next to this driver).
    #[arg(long)]
    swiftlet: Option<PathBuf>,
    /// Running containers (repeatable; default 10, 50 and 100). Each is run with both PLEGs.
    #[arg(long = "size", value_name = "N")]
    sizes: Vec<usize>,
    /// Exits measured per PLEG and size, at least (default 200).
    #[arg(long)]
    exits: Option<usize>,
    /// The idle window over which CPU, CRI calls and RSS are taken, in seconds (default 60).
    #[arg(long)]
    idle_s: Option<u64>,
    /// A smoke run in under two minutes: 10 containers, 20 exits, a 10 s idle window (sizes,
    /// exits and idle window given explicitly still win).
    #[arg(long)]
    quick: bool,
    /// Where to write the JSON results (default <out-dir>/pleg.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where the JSON (by default), the plot, and the logs go.
    #[arg(long, default_value = "target/bench")]
    out_dir: PathBuf,
}

#[derive(Args)]
struct EvictionArgs {
    /// The CRI runtime swiftlet runs the pods on (`unix://…`; the busybox and pause images
    /// imported, as `cargo xtask bench eviction` does).
    #[arg(long)]
    runtime_endpoint: String,
    /// The swiftlet binary (default: the one next to this driver).
    #[arg(long)]
    swiftlet: Option<PathBuf>,
    /// Modes to run, in order (repeatable: kernel, periodic, psi; default all three).
    #[arg(long = "mode", value_name = "M")]
    modes: Vec<eviction::Mode>,
    /// Runs per mode (default 20; 3 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// A smoke run: 3 runs per mode.
    #[arg(long)]
    quick: bool,
    /// Where to write the JSON results (default <out-dir>/eviction.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where the JSON (by default), the plot, and the logs go.
    #[arg(long, default_value = "target/bench")]
    out_dir: PathBuf,
}

#[derive(Args)]
struct CpumanagerArgs {
    /// The CRI runtime swiftlet runs the pods on (`unix://…`; the busybox and pause images
    /// imported, as `cargo xtask bench cpumanager` does).
    #[arg(long)]
    runtime_endpoint: String,
    /// The swiftlet binary (default: the one next to this driver).
    #[arg(long)]
    swiftlet: Option<PathBuf>,
    /// Modes to run, in order (repeatable: events, reconcile; default both).
    #[arg(long = "mode", value_name = "M")]
    modes: Vec<cpumanager::Mode>,
    /// Runs per mode (default 10; 2 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// A smoke run: 2 runs per mode, no random wait before each, short overhead windows.
    #[arg(long)]
    quick: bool,
    /// Where to write the JSON results (default <out-dir>/cpumanager.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where the JSON (by default), the plot, and the logs go.
    #[arg(long, default_value = "target/bench")]
    out_dir: PathBuf,
}

/// Below this, p99.9 rests on fewer than ten samples.
const MEANINGFUL_EXITS: u64 = 10_000;

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().bench {
        Bench::Events(args) => events_bench(args).await,
        Bench::Startup(args) => startup_bench(args).await,
        Bench::Pleg(args) => pleg_bench(args).await,
        Bench::Eviction(args) => eviction_bench(args).await,
        Bench::Cpumanager(args) => cpumanager_bench(args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("swiftlet-bench: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn events_bench(args: EventsArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "loading eBPF programs and creating cgroups needs root: run `cargo xtask bench events`"
        );
    }
    if args.exits < MEANINGFUL_EXITS {
        eprintln!(
            "note: {} exits per scenario; use at least {MEANINGFUL_EXITS} for a meaningful p99.9",
            args.exits
        );
    }
    let testproc = swiftlet_tests::testproc();
    let scenarios = [
        Scenario::paced(args.exits),
        Scenario::storm(args.exits, machine::cpus()),
    ];
    let mut outcomes = Vec::with_capacity(scenarios.len());
    for scenario in &scenarios {
        eprintln!(
            "running {}: swiftlet-testproc {} (ring buffer {} bytes)",
            scenario.name,
            scenario.args.join(" "),
            args.ring_buffer_bytes
        );
        let outcome = events::run(scenario, &testproc, args.ring_buffer_bytes)
            .await
            .with_context(|| format!("scenario {}", scenario.name))?;
        outcomes.push(outcome);
    }

    let reports = outcomes
        .iter()
        .map(|o| ScenarioReport::new(o, args.ring_buffer_bytes))
        .collect();
    let report = Report::new(Machine::detect(), reports, SystemTime::now());
    println!("{}", report.markdown());
    for scenario in &report.scenarios {
        for problem in &scenario.inconsistencies {
            println!("WARNING: {problem}");
        }
    }

    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let json = args
        .json
        .unwrap_or_else(|| args.out_dir.join("events.json"));
    write_json(&json, &report)?;
    let svg = args.out_dir.join("events-latency.svg");
    write_plot(&svg, &report.machine, &outcomes)?;
    eprintln!("wrote {} and {}", json.display(), svg.display());
    Ok(())
}

async fn startup_bench(args: StartupArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "swiftlet loads eBPF programs and manages cgroups, which needs root: run `cargo xtask \
             bench startup`"
        );
    }
    // Read first: what else the machine was doing when the run began.
    let load_average = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.trim().to_owned())
        .unwrap_or_default();
    let settings = startup::Settings {
        swiftlet: args.swiftlet.unwrap_or_else(swiftlet_tests::swiftlet_bin),
        runtime_endpoint: args.runtime_endpoint,
        batches: if args.batches.is_empty() {
            vec![10, 30]
        } else {
            args.batches
        },
        rounds: args.rounds,
        poll: Duration::from_millis(args.poll_ms),
        timeout: Duration::from_secs(args.timeout_s),
        log_dir: args.out_dir.join("startup"),
    };
    eprintln!(
        "startup: batches of {:?} pods, {} rounds each, /pods polled every {} ms; swiftlet logs \
         in {}",
        settings.batches,
        settings.rounds,
        args.poll_ms,
        settings.log_dir.display()
    );
    // xtask passes Ctrl-C and SIGTERM on to this process group, swiftlet included: the round in
    // flight is dropped (its swiftlet killed, its folders removed) and the runtime cleared, so
    // that an interrupted run leaves no pod, log or cgroup behind either.
    let seen = startup::SeenUids::default();
    let batches = tokio::select! {
        batches = startup::run(&settings, &seen) => batches?,
        signal = interrupted() => {
            eprintln!("startup: {signal}: clearing the benchmark's pods");
            startup::clean_up(&settings.runtime_endpoint, &seen).await?;
            bail!("interrupted by {signal}");
        }
    };

    let report = startup::report::Report::new(
        Machine::detect(),
        load_average,
        &settings,
        &batches,
        SystemTime::now(),
    );
    println!("{}", report.markdown());
    for problem in report.warnings() {
        println!("WARNING: {problem}");
    }
    let json = args
        .json
        .unwrap_or_else(|| args.out_dir.join("startup.json"));
    write_json(&json, &report)?;
    let svg = args.out_dir.join("startup-latency.svg");
    let title = format!(
        "Static pod startup, manifest to Running (Linux {}, {} CPUs)",
        report.machine.kernel_release, report.machine.cpus
    );
    startup::report::plot(&svg, &title, &batches)
        .with_context(|| format!("plotting {}", svg.display()))?;
    eprintln!("wrote {} and {}", json.display(), svg.display());
    Ok(())
}

async fn pleg_bench(args: PlegArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "swiftlet loads eBPF programs and manages cgroups, and the benchmark kills containers, \
             which needs root: run `cargo xtask bench pleg`"
        );
    }
    let sizes = match (args.sizes.is_empty(), args.quick) {
        (false, _) => args.sizes,
        (true, true) => vec![10],
        (true, false) => vec![10, 50, 100],
    };
    let exits = args.exits.unwrap_or(if args.quick { 20 } else { 200 });
    let idle_s = args.idle_s.unwrap_or(if args.quick { 10 } else { 60 });
    let settings = pleg::Settings {
        swiftlet: args.swiftlet.unwrap_or_else(swiftlet_tests::swiftlet_bin),
        runtime_endpoint: args.runtime_endpoint,
        sizes,
        exits,
        idle: Duration::from_secs(idle_s),
        log_dir: args.out_dir.join("pleg"),
    };
    eprintln!(
        "pleg: {:?} containers, each with --pleg {}; {} exits each, {} s idle window; swiftlet \
         logs in {}",
        settings.sizes,
        pleg::PLEGS.join(" and --pleg "),
        settings.exits,
        idle_s,
        settings.log_dir.display()
    );
    let outcomes = tokio::select! {
        outcomes = pleg::run(&settings) => outcomes?,
        signal = interrupted() => {
            eprintln!("pleg: {signal}: clearing the benchmark's pods");
            pleg::clean_up(&settings.runtime_endpoint).await?;
            bail!("interrupted by {signal}");
        }
    };

    let machine = Machine::detect();
    let date = swiftlet_tests::bench::report::now_rfc3339();
    let entries: Vec<pleg::report::Entry> = outcomes
        .iter()
        .map(|o| pleg::report::Entry::new(o, &machine, &date))
        .collect();
    println!("{}", pleg::report::markdown(&entries));
    for verdict in pleg::report::verdicts(&entries) {
        println!("{verdict}");
    }
    for problem in pleg::report::warnings(&entries) {
        println!("WARNING: {problem}");
    }
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let json = args.json.unwrap_or_else(|| args.out_dir.join("pleg.json"));
    write_json(&json, &entries)?;
    let svg = args.out_dir.join("pleg-latency.svg");
    let title = format!(
        "Container exit → pod lifecycle event, relist vs kernel events (Linux {}, {} CPUs)",
        machine.kernel_release, machine.cpus
    );
    pleg::report::plot(&svg, &title, &outcomes)
        .with_context(|| format!("plotting {}", svg.display()))?;
    eprintln!("wrote {} and {}", json.display(), svg.display());
    Ok(())
}

async fn eviction_bench(args: EvictionArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "swiftlet loads eBPF programs and manages cgroups, which needs root: run `cargo xtask \
             bench eviction`"
        );
    }
    let settings = eviction::Settings {
        swiftlet: args.swiftlet.unwrap_or_else(swiftlet_tests::swiftlet_bin),
        runtime_endpoint: args.runtime_endpoint,
        modes: if args.modes.is_empty() {
            eviction::Mode::ALL.to_vec()
        } else {
            args.modes
        },
        runs: args.runs.unwrap_or(if args.quick { 3 } else { 20 }),
        max_delay: eviction::MONITORING_PERIOD,
        log_dir: args.out_dir.join("eviction"),
    };
    eprintln!(
        "eviction: modes {:?}, {} runs each; the pods' cgroup ({}/kubepods) limited to {} MiB, \
         allocatableMemory.available<{}Mi; swiftlet logs in {}",
        settings.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        settings.runs,
        eviction::CGROUP_ROOT,
        eviction::ALLOCATABLE_BYTES >> 20,
        eviction::THRESHOLD_MIB,
        settings.log_dir.display()
    );
    let outcomes = tokio::select! {
        outcomes = eviction::run(&settings) => outcomes?,
        signal = interrupted() => {
            eprintln!("eviction: {signal}: clearing the benchmark's pods");
            eviction::clean_up(&settings.runtime_endpoint).await?;
            bail!("interrupted by {signal}");
        }
    };

    let machine = Machine::detect();
    let date = swiftlet_tests::bench::report::now_rfc3339();
    let entries: Vec<eviction::report::Entry> = outcomes
        .iter()
        .map(|o| eviction::report::Entry::new(o, &machine, &date))
        .collect();
    println!("{}", eviction::report::markdown(&entries));
    for verdict in eviction::report::verdicts(&entries) {
        println!("{verdict}");
    }
    for problem in eviction::report::warnings(&entries) {
        println!("WARNING: {problem}");
    }
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let json = args
        .json
        .unwrap_or_else(|| args.out_dir.join("eviction.json"));
    write_json(&json, &entries)?;
    let svg = args.out_dir.join("eviction-latency.svg");
    let title = format!(
        "Memory pressure → eviction, kernel wake-ups vs the 10 s check (Linux {}, {} CPUs)",
        machine.kernel_release, machine.cpus
    );
    eviction::report::plot(&svg, &title, &outcomes)
        .with_context(|| format!("plotting {}", svg.display()))?;
    eprintln!("wrote {} and {}", json.display(), svg.display());
    Ok(())
}

async fn cpumanager_bench(args: CpumanagerArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "swiftlet loads eBPF programs and manages cgroups, which needs root: run `cargo xtask \
             bench cpumanager`"
        );
    }
    let settings = cpumanager::Settings {
        swiftlet: args.swiftlet.unwrap_or_else(swiftlet_tests::swiftlet_bin),
        runtime_endpoint: args.runtime_endpoint,
        modes: if args.modes.is_empty() {
            cpumanager::Mode::ALL.to_vec()
        } else {
            args.modes
        },
        runs: args.runs.unwrap_or(if args.quick { 2 } else { 10 }),
        max_delay: if args.quick {
            Duration::ZERO
        } else {
            cpumanager::RECONCILE_PERIOD
        },
        overhead_rounds: if args.quick { 2 } else { 10 },
        overhead_window: Duration::from_millis(if args.quick { 200 } else { 1000 }),
        log_dir: args.out_dir.join("cpumanager"),
    };
    eprintln!(
        "cpumanager: modes {:?}, {} runs each; --cpu-manager-policy static --reserved-cpus {}, \
         a Guaranteed pod gets CPU {} beside a spinner in the shared pool; cgroup root {}; \
         swiftlet logs in {}",
        settings.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        settings.runs,
        cpumanager::RESERVED_CPU,
        cpumanager::EXCLUSIVE_CPU,
        cpumanager::CGROUP_ROOT,
        settings.log_dir.display()
    );
    let outcome = tokio::select! {
        outcome = cpumanager::run(&settings) => outcome?,
        signal = interrupted() => {
            eprintln!("cpumanager: {signal}: clearing the benchmark's pods");
            cpumanager::clean_up(&settings.runtime_endpoint).await?;
            bail!("interrupted by {signal}");
        }
    };

    let machine = Machine::detect();
    let date = swiftlet_tests::bench::report::now_rfc3339();
    let report = cpumanager::report::Report::new(&outcome, machine, &date);
    println!("{}", report.markdown());
    for verdict in report.verdicts() {
        println!("{verdict}");
    }
    for problem in report.warnings() {
        println!("WARNING: {problem}");
    }
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let json = args
        .json
        .unwrap_or_else(|| args.out_dir.join("cpumanager.json"));
    write_json(&json, &report)?;
    let svg = args.out_dir.join("cpumanager-latency.svg");
    let title = format!(
        "Guaranteed container started → its CPU its own, events vs the 10 s reconcile (Linux {}, \
         {} CPUs)",
        report.machine.kernel_release, report.machine.cpus
    );
    cpumanager::report::plot(&svg, &title, &outcome.modes)
        .with_context(|| format!("plotting {}", svg.display()))?;
    eprintln!("wrote {} and {}", json.display(), svg.display());
    Ok(())
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

fn write_json(path: &Path, report: &impl serde::Serialize) -> Result<()> {
    let mut text = serde_json::to_string_pretty(report).context("serialising the results")?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn write_plot(path: &Path, machine: &Machine, outcomes: &[Outcome]) -> Result<()> {
    let curves: Vec<Curve<'_>> = outcomes
        .iter()
        .map(|o| Curve {
            name: &o.scenario.name,
            sorted_ns: &o.latencies_ns,
        })
        .collect();
    let title = format!(
        "Exit event latency, kernel to swiftlet (Linux {}, {} CPUs)",
        machine.kernel_release, machine.cpus
    );
    let axes = Axes {
        ns_per_unit: 1e3,
        x_desc: "latency, kernel to userspace (µs, log scale)",
        y_desc: "fraction of exit events",
    };
    plot::latency_cdf(path, &title, &axes, &curves)
        .with_context(|| format!("plotting {}", path.display()))
}
