//! `cargo xtask <task>`: everything a new machine needs to build, run, test and benchmark swiftlet,
//! each task first making sure the machine has what it needs (`setup`).
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "xtask talks to the person at the terminal"
)]

mod bench;
mod containerd;
mod deb;
mod fuzz;
mod images;
mod node_suite;
mod node_vm;
mod runtimes;
mod setup;
mod sh;
mod supervise;
mod tasks;
mod vm;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Build, run, test and benchmark swiftlet"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building swiftlet needs (Debian packages, rust-src, bpf-linker, and for the
    /// fuzz targets the nightly toolchain and cargo-fuzz); idempotent.
    Setup,
    /// Set up, then build every crate and the eBPF programs.
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Build, then run `swiftlet` as root (the privileged loader). Arguments after `--` go to
    /// swiftlet, e.g. `cargo xtask run -- events --json`; none means `run --manifests examples`.
    /// `swiftlet run` without `--runtime-endpoint` gets the private containerd (see
    /// `cargo xtask containerd --help`), started before it and stopped after it.
    Run {
        #[arg(long)]
        release: bool,
        /// The private containerd's release (2.1, 1.7 or 1.6; see `cargo xtask containerd
        /// start --help`).
        #[arg(long, value_enum, value_name = "VERSION", default_value_t = containerd::Version::default())]
        containerd: containerd::Version,
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// The whole suite: formatting, clippy, unit tests and the privileged system tests, the
    /// latter against the private containerd (SWIFTLET_TEST_RUNTIME_ENDPOINT), the runtime matrix's
    /// selection on the other containerd releases (`runtime-test`), the kernel matrix
    /// (`vm-test`), the node VM's scenario (`node-vm`), then a short run of every fuzz target
    /// (`fuzz --seconds 20`, built in the background while the tests run).
    Test {
        /// The private containerd's release the whole suite runs against (2.1, 1.7 or 1.6); the
        /// runtime matrix's selection runs on the two others.
        #[arg(long, value_enum, value_name = "VERSION", default_value_t = containerd::Version::default())]
        containerd: containerd::Version,
    },
    /// The runtime matrix: the system tests of every area the runtime shapes (pods, PLEG,
    /// eviction, CPU manager, probes, volumes, logs, CRI, runtime handlers) on each private
    /// containerd release, one after another, with a report per release. `cargo xtask test` runs
    /// a selection of them on the releases other than its own.
    RuntimeTest {
        /// 1.6, 1.7 or 2.1; repeatable; all three when none is given.
        #[arg(long = "containerd", value_enum, value_name = "VERSION")]
        versions: Vec<containerd::Version>,
        /// Every test of those areas' files, not only the selection `cargo xtask test` runs.
        #[arg(long)]
        all: bool,
    },
    /// The fuzz targets of tests/fuzz (cargo-fuzz, libFuzzer, AddressSanitizer, the nightly
    /// toolchain): one build, then each target for N seconds from its seeds and the corpus grown
    /// so far; prints executions and findings per target and fails on any crash, hang or OOM.
    /// Corpus, findings and logs are kept under target/fuzz/.
    Fuzz {
        /// Seconds per target.
        #[arg(long, value_name = "N", default_value_t = fuzz::DEFAULT_SECONDS)]
        seconds: u64,
        /// Targets to run (all when none): static_pod_manifest, cri_log_line,
        /// container_log_read, config_file, kernel_event, http_query.
        targets: Vec<String>,
    },
    /// The kernel matrix: the eBPF programs' tests on Debian's 6.1 and 6.12 cloud kernels in
    /// qemu VMs (pure cgroup v2) and on this machine's kernel, with a report per kernel.
    /// Kernels and consoles are kept under target/vm-test/.
    VmTest {
        /// 6.1, 6.12, host or all (the default); repeatable.
        #[arg(long = "kernel", value_name = "KERNEL")]
        kernels: Vec<String>,
    },
    /// swiftlet on a real node: a Debian trixie VM (systemd, pure cgroup v2, containerd as a
    /// service; root filesystem built once and cached under target/node-vm/) boots the kernel
    /// matrix's kernel; scenario 1 installs the .deb, enables the service with the example pods
    /// as static pods and checks readiness, watchdog, pods, oom_score_adj and cgroup. Console and
    /// report under target/node-vm/<kernel>-<containerd>/.
    NodeVm {
        /// 6.1 or 6.12.
        #[arg(long, value_name = "KERNEL", default_value = "6.12")]
        kernel: String,
        /// 1.7 (trixie's own) or 2.1 (sid's package).
        #[arg(long, value_enum, value_name = "VERSION", default_value = "1.7")]
        containerd: containerd::Version,
        /// A scenario to run (repeatable); every one, in order, when none is given. They run in
        /// one boot, each from the node the earlier ones left.
        #[arg(long = "scenario", value_name = "N")]
        scenarios: Vec<u32>,
        /// How much of scenarios 2 and 3: full (every test of the host suite's selection
        /// under each driver it lists; the eviction benchmark's 20 runs on the release build),
        /// or ci (what `cargo xtask test` runs: every area once, and crun; 3 runs on the debug
        /// build, checked by counts).
        #[arg(long, value_enum, value_name = "SELECTION", default_value = "full")]
        suite: node_suite::Size,
        /// Scenario 3's runs instead of its selection's (20 full, 3 ci).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
        bench_runs: Option<u16>,
    },
    /// swiftlet as a Debian package: target/deb/swiftlet_<version>_amd64.deb (the binary, the
    /// systemd unit, the default config; see packaging/).
    Deb,
    /// The private containerd that `run` and `test` use: its own config, root, sockets and CNI
    /// network under target/swiftlet-state/containerd, with the local images
    /// localhost/swiftlet/{busybox,pause}:latest imported (built into target/images/).
    Containerd {
        #[command(subcommand)]
        action: containerd::Action,
    },
    /// Benchmarks, run as root; results go to target/bench/.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
    },
}

fn main() {
    sh::start_clock();
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup => setup::ensure().and_then(|()| setup::fuzz_tools()),
        Task::Build { release } => tasks::build(release),
        Task::Run {
            release,
            containerd,
            args,
        } => tasks::run(release, containerd, &args),
        Task::Test { containerd } => tasks::test(containerd),
        Task::RuntimeTest { versions, all } => runtimes::run(
            &versions,
            if all {
                runtimes::Scope::All
            } else {
                runtimes::Scope::Selection
            },
        ),
        Task::Fuzz { seconds, targets } => fuzz::run(seconds, &targets),
        Task::VmTest { kernels } => vm::parse_kernels(&kernels).and_then(|k| vm::run(&k)),
        Task::NodeVm {
            kernel,
            containerd,
            scenarios,
            suite,
            bench_runs,
        } => node_vm::parse_kernel(&kernel).and_then(|k| {
            let c = node_vm::check_containerd(containerd)?;
            let scenarios = node_vm::select_scenarios(&scenarios)?;
            node_vm::run(k, c, &scenarios, suite, bench_runs.map(usize::from))
        }),
        Task::Deb => deb::run().map(|_| ()),
        Task::Containerd { action } => containerd::command(action),
        Task::Bench { which } => bench::run(which),
    };
    if let Err(error) = result {
        eprintln!("xtask: error: {error:#}");
        std::process::exit(1);
    }
}
