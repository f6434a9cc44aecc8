//! `cargo xtask <task>`: everything a new machine needs to build, run, test and benchmark swiftlet,
//! each task first making sure the machine has what it needs (`setup`).
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "xtask talks to the person at the terminal"
)]

mod bench;
mod containerd;
mod images;
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
    /// Install what building swiftlet needs (Debian packages, rust-src, bpf-linker); idempotent.
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
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// The whole suite: formatting, clippy, unit tests and the privileged system tests, the
    /// latter against the private containerd (SWIFTLET_TEST_RUNTIME_ENDPOINT), then the kernel
    /// matrix (`vm-test`).
    Test,
    /// The kernel matrix: the eBPF programs' tests on Debian's 6.1 and 6.12 cloud kernels in
    /// qemu VMs (pure cgroup v2) and on this machine's kernel, with a report per kernel.
    /// Kernels and consoles are kept under target/vm-test/.
    VmTest {
        /// 6.1, 6.12, host or all (the default); repeatable.
        #[arg(long = "kernel", value_name = "KERNEL")]
        kernels: Vec<String>,
    },
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
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup => setup::ensure(),
        Task::Build { release } => tasks::build(release),
        Task::Run { release, args } => tasks::run(release, &args),
        Task::Test => tasks::test(),
        Task::VmTest { kernels } => vm::parse_kernels(&kernels).and_then(|k| vm::run(&k)),
        Task::Containerd { action } => containerd::command(action),
        Task::Bench { which } => bench::run(which),
    };
    if let Err(error) = result {
        eprintln!("xtask: error: {error:#}");
        std::process::exit(1);
    }
}
