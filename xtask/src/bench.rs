//! Benchmarks. Each builds in release mode and runs its driver as root; results (table on stdout,
//! JSON and a plot) go to `target/bench/`. Those that need a container runtime get the private
//! containerd (`containerd.rs`), started before the driver and stopped after it, also when the
//! driver fails or is interrupted; or, when `cargo xtask containerd start` keeps it running
//! already, that instance as it is.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::anyhow;
use clap::Subcommand;

use crate::{
    containerd::{self, CgroupDriver, Containerd, Paths, Version},
    sh,
    supervise::{self, Interrupts, OnContainerdDeath},
    tasks,
};

#[derive(Subcommand)]
pub enum Which {
    /// Kernel-to-userspace latency of exit events, and the spawn-storm rate and losses.
    Events {
        /// Where to write the JSON results (default target/bench/events.json).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Exits to measure in the paced scenario (at least 10,000 for the README's numbers).
        #[arg(long, default_value_t = 20_000)]
        exits: u64,
    },
    /// Static pod startup latency: batches of 10 and 30 pods written at once, manifest to
    /// Running as `/pods` shows it, on the private containerd.
    Startup {
        /// Where to write the JSON results (default target/bench/startup.json).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Rounds per batch size, each with a fresh swiftlet.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// Exit detection latency (kill of a container's init → ContainerDied on the gRPC stream),
    /// where it comes from, and idle cost with 10, 50 and 100 containers, `--pleg relist` (1 s),
    /// `--pleg evented` (CRI container events) and `--pleg ebpf` side by side, on the private
    /// containerd (2.1 unless --containerd says otherwise; 1.6 has no container events, so
    /// relist and ebpf only).
    Pleg {
        /// Where to write the JSON results (default target/bench/pleg.json).
        #[arg(long)]
        json: Option<PathBuf>,
        /// A smoke run in under two minutes: 10 containers, 20 exits, a 10 s idle window.
        #[arg(long)]
        quick: bool,
        /// Running containers (repeatable; default 10, 50 and 100).
        #[arg(long = "size", value_name = "N")]
        sizes: Vec<usize>,
        /// Exits measured per PLEG and size (default 200; 20 with --quick).
        #[arg(long)]
        exits: Option<usize>,
        /// The PLEGs to compare, in order (repeatable: relist, evented, ebpf; default all
        /// three, or relist and ebpf on containerd 1.6).
        #[arg(long = "pleg", value_name = "PLEG")]
        plegs: Vec<String>,
        /// The private containerd's release (2.1, 1.7 or 1.6).
        #[arg(long, value_enum, value_name = "VERSION", default_value_t = Version::default())]
        containerd: Version,
    },
    /// Memory pressure → eviction latency (the pods' working set past
    /// `allocatableMemory.available<400Mi` → the eviction decided, and the pod's container
    /// stopped), with the eviction manager woken by the kernel, by its 10 s check alone (the
    /// kubelet's model) and by PSI alone, on the private containerd.
    Eviction {
        /// Where to write the JSON results (default target/bench/eviction.json).
        #[arg(long)]
        json: Option<PathBuf>,
        /// A smoke run: 3 runs per mode.
        #[arg(long)]
        quick: bool,
        /// Runs per mode (default 20; 3 with --quick).
        #[arg(long)]
        runs: Option<usize>,
        /// Modes to run (repeatable: kernel, periodic, psi; default all three).
        #[arg(long = "mode", value_name = "M")]
        modes: Vec<String>,
    },
    /// The CPU manager's static policy: a Guaranteed pod's container started → its CPU its own
    /// (the shared pool's spinner off it), with cpusets applied on events against the kubelet's
    /// 10 s reconcile; other pods' and the system's time on that CPU in the first 10 s; and what
    /// the scheduler audit's programs cost in context switches. On the private containerd.
    Cpumanager {
        /// Where to write the JSON results (default target/bench/cpumanager.json).
        #[arg(long)]
        json: Option<PathBuf>,
        /// A smoke run: 2 runs per mode, no random wait before each, short overhead windows.
        #[arg(long)]
        quick: bool,
        /// Runs per mode (default 10; 2 with --quick).
        #[arg(long)]
        runs: Option<usize>,
    },
    /// The control plane's view of the node, through the project's API server process:
    /// a container's init killed → the API server holds its terminated status, pods created in
    /// batches of 10 and 30 → Running there, and the agent's idle API requests per pod-minute;
    /// `--pleg relist` against `--pleg ebpf`, on the private containerd.
    Cluster {
        /// Where to write the JSON results (default target/bench/cluster.json).
        #[arg(long)]
        json: Option<PathBuf>,
        /// A smoke run: 20 kills, one batch of each size, a 10 s idle window.
        #[arg(long)]
        quick: bool,
        /// Kills measured per PLEG (default 100; 20 with --quick).
        #[arg(long)]
        kills: Option<usize>,
        /// Batches of each size per PLEG (default 3; 1 with --quick).
        #[arg(long)]
        rounds: Option<usize>,
    },
}

/// The containerd the benchmarks other than `pleg` run on: 1.6, the release their README tables
/// were measured on; each moves to the default release when its table is rerun on it.
const BENCH_RUNTIME: Version = Version::V1_6;

pub fn run(which: Which) -> anyhow::Result<()> {
    tasks::build(true)?;
    let out_dir = sh::root().join("target").join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let release = sh::root().join("target").join("release");
    let driver = release.join("swiftlet-bench");
    match which {
        Which::Events { json, exits } => {
            let json = json.unwrap_or_else(|| out_dir.join("events.json"));
            let args = vec![
                "events".to_owned(),
                "--exits".to_owned(),
                exits.to_string(),
                "--json".to_owned(),
                json.display().to_string(),
                "--out-dir".to_owned(),
                out_dir.display().to_string(),
            ];
            tasks::exec_as_root(&driver, &args)
        }
        Which::Startup { json, rounds } => {
            let json = json.unwrap_or_else(|| out_dir.join("startup.json"));
            let swiftlet = release.join("swiftlet");
            with_containerd(&driver, BENCH_RUNTIME, |containerd| {
                let mut args = agent_bench_args("startup", containerd, &swiftlet, &json, &out_dir);
                args.extend(["--rounds".to_owned(), rounds.to_string()]);
                args
            })
        }
        Which::Pleg {
            json,
            quick,
            sizes,
            exits,
            plegs,
            containerd: version,
        } => {
            let json = json.unwrap_or_else(|| out_dir.join("pleg.json"));
            let swiftlet = release.join("swiftlet");
            let plegs = if plegs.is_empty() && version == Version::V1_6 {
                vec!["relist".to_owned(), "ebpf".to_owned()]
            } else {
                plegs
            };
            with_containerd(&driver, version, |containerd| {
                let mut args = agent_bench_args("pleg", containerd, &swiftlet, &json, &out_dir);
                if quick {
                    args.push("--quick".to_owned());
                }
                for n in sizes {
                    args.extend(["--size".to_owned(), n.to_string()]);
                }
                if let Some(exits) = exits {
                    args.extend(["--exits".to_owned(), exits.to_string()]);
                }
                for pleg in plegs {
                    args.extend(["--pleg".to_owned(), pleg]);
                }
                args
            })
        }
        Which::Eviction {
            json,
            quick,
            runs,
            modes,
        } => {
            let json = json.unwrap_or_else(|| out_dir.join("eviction.json"));
            let swiftlet = release.join("swiftlet");
            with_containerd(&driver, BENCH_RUNTIME, |containerd| {
                let mut args = agent_bench_args("eviction", containerd, &swiftlet, &json, &out_dir);
                if quick {
                    args.push("--quick".to_owned());
                }
                if let Some(runs) = runs {
                    args.extend(["--runs".to_owned(), runs.to_string()]);
                }
                for mode in modes {
                    args.extend(["--mode".to_owned(), mode]);
                }
                args
            })
        }
        Which::Cluster {
            json,
            quick,
            kills,
            rounds,
        } => {
            let json = json.unwrap_or_else(|| out_dir.join("cluster.json"));
            let swiftlet = release.join("swiftlet");
            with_containerd(&driver, BENCH_RUNTIME, |containerd| {
                let mut args = agent_bench_args("cluster", containerd, &swiftlet, &json, &out_dir);
                if quick {
                    args.push("--quick".to_owned());
                }
                if let Some(kills) = kills {
                    args.extend(["--kills".to_owned(), kills.to_string()]);
                }
                if let Some(rounds) = rounds {
                    args.extend(["--rounds".to_owned(), rounds.to_string()]);
                }
                args
            })
        }
        Which::Cpumanager { json, quick, runs } => {
            let json = json.unwrap_or_else(|| out_dir.join("cpumanager.json"));
            let swiftlet = release.join("swiftlet");
            with_containerd(&driver, BENCH_RUNTIME, |containerd| {
                let mut args =
                    agent_bench_args("cpumanager", containerd, &swiftlet, &json, &out_dir);
                if quick {
                    args.push("--quick".to_owned());
                }
                if let Some(runs) = runs {
                    args.extend(["--runs".to_owned(), runs.to_string()]);
                }
                args
            })
        }
    }
}

/// The driver's arguments every benchmark that runs swiftlet on the private containerd takes:
/// `NAME --runtime-endpoint E --swiftlet PATH --json FILE --out-dir DIR`.
fn agent_bench_args(
    name: &str,
    containerd: &Paths,
    swiftlet: &Path,
    json: &Path,
    out_dir: &Path,
) -> Vec<String> {
    vec![
        name.to_owned(),
        "--runtime-endpoint".to_owned(),
        containerd.endpoint(),
        "--swiftlet".to_owned(),
        swiftlet.display().to_string(),
        "--json".to_owned(),
        json.display().to_string(),
        "--out-dir".to_owned(),
        out_dir.display().to_string(),
    ]
}

/// Runs `driver` with the arguments `args` makes from the private containerd's paths, supervised
/// as `cargo xtask test` runs the tests: Ctrl-C reaches the driver, a dying containerd stops it,
/// and containerd is stopped afterwards whatever happened.
///
/// When `cargo xtask containerd start` already keeps it running, the driver uses that instance
/// as it is (exec'd in xtask's place: Ctrl-C reaches it directly), and leaves it running.
fn with_containerd(
    driver: &Path,
    version: Version,
    args: impl FnOnce(&Paths) -> Vec<String>,
) -> anyhow::Result<()> {
    if let Some((paths, holder)) = containerd::started_for_people(version)? {
        println!(
            "xtask: containerd: using the private containerd that `cargo xtask containerd start` \
             (pid {holder}) keeps running at {}",
            paths.endpoint()
        );
        return tasks::exec_as_root(driver, &args(&paths));
    }
    let mut interrupts = Interrupts::catch()?;
    let mut containerd = Containerd::start_with(&mut interrupts, CgroupDriver::Cgroupfs, version)?;
    let args = args(containerd.paths());
    // Containerd::start made sure this is root.
    let mut child = supervise::spawn(Command::new(driver).args(&args))?;
    let outcome = supervise::supervise(
        &mut child,
        "the benchmark",
        &mut interrupts,
        &mut containerd,
        OnContainerdDeath::StopChild,
    )?;
    let stopped = containerd.stop();
    let ran = if outcome.containerd_died {
        Err(anyhow!(
            "the benchmark was stopped because containerd died (its log's end is above)"
        ))
    } else if !outcome.status.success() {
        Err(anyhow!("the benchmark failed ({})", outcome.status))
    } else {
        Ok(())
    };
    tasks::both(ran, stopped)
}
