//! swiftlet's benchmark driver, run as root by `cargo xtask bench <which>`.
//!
//! ```text
//! swiftlet-bench events [--exits N] [--json FILE] [--out-dir DIR] [--ring-buffer-bytes B]
//! swiftlet-bench startup --runtime-endpoint unix://SOCKET [--swiftlet PATH] [--rounds N]
//!                        [--batch N]... [--json FILE] [--out-dir DIR] [--poll-ms MS]
//!                        [--timeout-s S]
//! swiftlet-bench pleg --runtime-endpoint unix://SOCKET [--swiftlet PATH] [--size N]...
//!                     [--pleg P]... [--exits N] [--idle-s S] [--quick] [--json FILE] [--out-dir DIR]
//! swiftlet-bench eviction --runtime-endpoint unix://SOCKET [--swiftlet PATH] [--mode M]...
//!                         [--runs N] [--quick] [--json FILE] [--out-dir DIR]
//! swiftlet-bench cpumanager --runtime-endpoint unix://SOCKET [--swiftlet PATH] [--mode M]...
//!                           [--runs N] [--quick] [--json FILE] [--out-dir DIR]
//! swiftlet-bench cluster --runtime-endpoint unix://SOCKET [--swiftlet PATH] [--kills N]
//!                        [--batch N]... [--rounds N] [--idle-s S] [--quick] [--json FILE]
//!                        [--out-dir DIR]
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
//! `pleg` measures, with `--pleg relist` (1 s), `--pleg evented` and `--pleg ebpf` side by side
//! for each number of running containers, how long after a container's init is killed its
//! `ContainerDied` reaches swiftlet's gRPC stream, where that time goes (kernel, runtime reaping,
//! status observed), and what each costs idle (CPU, CRI calls, RSS). Same outputs, logs under
//! `<out-dir>/pleg/`.
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
//!
//! `cluster` measures, through the project's API server process and with `--pleg relist` and
//! `--pleg ebpf` side by side, how long after a container's init is killed the API server holds
//! a status showing it terminated, how long pods created through the API in batches of 10 and
//! 30 take to show Running there, and how many API requests the agent makes per pod and minute
//! when idle. Same outputs, logs under `<out-dir>/cluster/`.
//!
//! This file is the command line only: each benchmark's scenario, report and plot are its module
//! in `swiftlet_tests::bench`, and what they all do around them (root check, interrupts, table,
//! JSON, plot) is `bench::driver`.
#![expect(
    clippy::print_stderr,
    reason = "a benchmark driver reports on the terminal"
)]

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use swiftlet_tests::bench::{
    cluster, cpumanager,
    driver::{self, Benchmark, Output},
    events, eviction, pleg, startup,
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
    /// The control plane's view: kill → terminated status on the API server, create → Running
    /// there, idle API requests; relist PLEG against kernel-event PLEG.
    Cluster(ClusterArgs),
}

/// Where the results go, for every benchmark.
#[derive(Args)]
struct OutputArgs {
    /// Where to write the JSON results (default <out-dir>/<benchmark>.json).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Where the JSON (by default), the plot, and the logs go.
    #[arg(long, default_value = "target/bench")]
    out_dir: PathBuf,
}

impl OutputArgs {
    fn output(self) -> Output {
        Output {
            json: self.json,
            out_dir: self.out_dir,
        }
    }

    /// `<out-dir>/<benchmark>`: where a benchmark that runs swiftlet keeps its logs.
    fn log_dir<B: Benchmark>(&self) -> PathBuf {
        self.out_dir.join(B::NAME)
    }
}

/// The agent and runtime of every benchmark that runs pods.
#[derive(Args)]
struct AgentArgs {
    /// The CRI runtime swiftlet runs the pods on (`unix://…`; the busybox and pause images
    /// imported, as `cargo xtask bench <benchmark>` does).
    #[arg(long)]
    runtime_endpoint: String,
    /// The swiftlet binary (default: the one next to this driver).
    #[arg(long)]
    swiftlet: Option<PathBuf>,
}

impl AgentArgs {
    fn swiftlet(&mut self) -> PathBuf {
        self.swiftlet
            .take()
            .unwrap_or_else(swiftlet_tests::swiftlet_bin)
    }
}

#[derive(Args)]
struct EventsArgs {
    /// Exits per scenario (10,000 or more, for a meaningful p99.9).
    #[arg(long, default_value_t = 20_000)]
    exits: u64,
    /// Size of the events ring buffer: a power-of-two multiple of the page size.
    #[arg(long, default_value_t = swiftlet_common::DEFAULT_RING_BYTES)]
    ring_buffer_bytes: u32,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Args)]
struct StartupArgs {
    #[command(flatten)]
    agent: AgentArgs,
    /// Rounds per batch size, each with a fresh swiftlet.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Pods per batch (repeatable; default 10 and 30).
    #[arg(long = "batch", value_name = "N")]
    batches: Vec<usize>,
    /// Interval of the /pods poll, in ms: the resolution of the measurement.
    #[arg(long, default_value_t = 5)]
    poll_ms: u64,
    /// How long a round waits for its pods to run, in seconds.
    #[arg(long, default_value_t = 120)]
    timeout_s: u64,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Args)]
struct PlegArgs {
    #[command(flatten)]
    agent: AgentArgs,
    /// Running containers (repeatable; default 10, 50 and 100). Each is run with every PLEG.
    #[arg(long = "size", value_name = "N")]
    sizes: Vec<usize>,
    /// The PLEGs to compare, in order (repeatable: relist, evented, ebpf; default all three —
    /// evented needs a runtime with CRI GetContainerEvents, containerd 1.7 or later).
    #[arg(long = "pleg", value_name = "PLEG")]
    plegs: Vec<String>,
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
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Args)]
struct EvictionArgs {
    #[command(flatten)]
    agent: AgentArgs,
    /// Modes to run, in order (repeatable: kernel, periodic, psi; default all three).
    #[arg(long = "mode", value_name = "M")]
    modes: Vec<eviction::Mode>,
    /// Runs per mode (default 20; 3 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// A smoke run: 3 runs per mode.
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Args)]
struct CpumanagerArgs {
    #[command(flatten)]
    agent: AgentArgs,
    /// Modes to run, in order (repeatable: events, reconcile; default both).
    #[arg(long = "mode", value_name = "M")]
    modes: Vec<cpumanager::Mode>,
    /// Runs per mode (default 10; 2 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// A smoke run: 2 runs per mode, no random wait before each, short overhead windows.
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Args)]
struct ClusterArgs {
    #[command(flatten)]
    agent: AgentArgs,
    /// Kills measured per PLEG, at least (default 100; 20 with --quick).
    #[arg(long)]
    kills: Option<usize>,
    /// Pods created at once (repeatable; default 10 and 30).
    #[arg(long = "batch", value_name = "N")]
    batches: Vec<usize>,
    /// Batches of each size per PLEG (default 3; 1 with --quick).
    #[arg(long)]
    rounds: Option<usize>,
    /// The idle window over which the agent's API requests are counted, in seconds (default 60;
    /// 10 with --quick).
    #[arg(long)]
    idle_s: Option<u64>,
    /// A smoke run: 20 kills, one batch of each size, a 10 s idle window.
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    output: OutputArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Cli::parse().bench {
        Bench::Events(args) => events_bench(args).await,
        Bench::Startup(args) => startup_bench(args).await,
        Bench::Pleg(args) => pleg_bench(args).await,
        Bench::Eviction(args) => eviction_bench(args).await,
        Bench::Cpumanager(args) => cpumanager_bench(args).await,
        Bench::Cluster(args) => cluster_bench(args).await,
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
    let settings = events::Settings {
        exits: args.exits,
        ring_buffer_bytes: args.ring_buffer_bytes,
        testproc: swiftlet_tests::testproc(),
    };
    driver::run(&settings, &args.output.output()).await
}

async fn startup_bench(mut args: StartupArgs) -> Result<()> {
    let settings = startup::Settings {
        swiftlet: args.agent.swiftlet(),
        runtime_endpoint: args.agent.runtime_endpoint,
        batches: if args.batches.is_empty() {
            vec![10, 30]
        } else {
            args.batches
        },
        rounds: args.rounds,
        poll: Duration::from_millis(args.poll_ms),
        timeout: Duration::from_secs(args.timeout_s),
        log_dir: args.output.log_dir::<startup::Bench>(),
    };
    driver::run(&startup::Bench::new(settings), &args.output.output()).await
}

async fn pleg_bench(mut args: PlegArgs) -> Result<()> {
    let sizes = match (args.sizes.is_empty(), args.quick) {
        (false, _) => args.sizes,
        (true, true) => vec![10],
        (true, false) => vec![10, 50, 100],
    };
    let settings = pleg::Settings {
        swiftlet: args.agent.swiftlet(),
        runtime_endpoint: args.agent.runtime_endpoint,
        sizes,
        plegs: if args.plegs.is_empty() {
            pleg::PLEGS.iter().map(|&p| p.to_owned()).collect()
        } else {
            args.plegs
        },
        exits: args.exits.unwrap_or(if args.quick { 20 } else { 200 }),
        idle: Duration::from_secs(args.idle_s.unwrap_or(if args.quick { 10 } else { 60 })),
        log_dir: args.output.log_dir::<pleg::Settings>(),
    };
    driver::run(&settings, &args.output.output()).await
}

async fn eviction_bench(mut args: EvictionArgs) -> Result<()> {
    let settings = eviction::Settings {
        swiftlet: args.agent.swiftlet(),
        runtime_endpoint: args.agent.runtime_endpoint,
        modes: if args.modes.is_empty() {
            eviction::Mode::ALL.to_vec()
        } else {
            args.modes
        },
        runs: args.runs.unwrap_or(if args.quick { 3 } else { 20 }),
        max_delay: eviction::MONITORING_PERIOD,
        log_dir: args.output.log_dir::<eviction::Settings>(),
    };
    driver::run(&settings, &args.output.output()).await
}

async fn cpumanager_bench(mut args: CpumanagerArgs) -> Result<()> {
    let settings = cpumanager::Settings {
        swiftlet: args.agent.swiftlet(),
        runtime_endpoint: args.agent.runtime_endpoint,
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
        reconcile_period: cpumanager::RECONCILE_PERIOD,
        foreign_window: cpumanager::FOREIGN_WINDOW,
        log_dir: args.output.log_dir::<cpumanager::Settings>(),
    };
    driver::run(&settings, &args.output.output()).await
}

async fn cluster_bench(mut args: ClusterArgs) -> Result<()> {
    let settings = cluster::Settings {
        swiftlet: args.agent.swiftlet(),
        runtime_endpoint: args.agent.runtime_endpoint,
        kills: args.kills.unwrap_or(if args.quick { 20 } else { 100 }),
        batches: if args.batches.is_empty() {
            vec![10, 30]
        } else {
            args.batches
        },
        rounds: args.rounds.unwrap_or(if args.quick { 1 } else { 3 }),
        idle: Duration::from_secs(args.idle_s.unwrap_or(if args.quick { 10 } else { 60 })),
        log_dir: args.output.log_dir::<cluster::Settings>(),
    };
    driver::run(&settings, &args.output.output()).await
}
