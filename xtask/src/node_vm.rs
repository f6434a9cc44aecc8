//! `cargo xtask node-vm`: swiftlet on a real node. A Debian root filesystem (debootstrap of
//! trixie: systemd as PID 1, D-Bus, containerd as a service, runc and crun, the CNI plugins) is
//! built once into a raw ext4 image under `target/node-vm/` (`base-<containerd>-<key>.img`, the
//! key a hash of everything it is built from, so a changed package list or guest file builds a
//! new one); each run boots the kernel matrix's cloud kernel (`vm.rs` fetches it) on a
//! copy-on-write overlay of that image (qcow2 backed by the raw image: runs never dirty the
//! cache) with a second disk, labelled `payload`, holding what the run brings: the `.deb`
//! (`deb.rs`), the local images, the example pods and the scenario. A unit baked into the image
//! (`xtask/node-vm/swiftlet-node-vm.service`) runs the scenario once the system is up, its lines
//! on the serial console, and powers the VM off; the host keeps the console in
//! `target/node-vm/<kernel>-<containerd>/console.log` and writes `report.json` and `report.txt`
//! there, as the kernel matrix does, with the same deadline and kill discipline.
//!
//! Facts this relies on (Debian's cloud kernels 6.1 and 6.12): NVMe and ext4 are built in, so
//! the root disk is an NVMe device and no initramfs is needed; virtio, overlayfs, bridge and
//! netfilter are modules, so the kernels' `/lib/modules` are copied into the image. The boot is
//! systemd's default: pure cgroup v2. The VM's one network interface is on qemu's user-mode
//! network with `restrict=on` (DHCP, and nothing outside the VM reachable): the node has an
//! address and a default route as a real one, and needs nothing from outside.
//!
//! The scenarios (`SCENARIOS`, `xtask/node-vm/scenario<N>.sh`) run in one boot, in number order,
//! each from the node the earlier ones left; `--scenario` picks some. The report has a section
//! per scenario. Scenario 1 of issue 19 (`xtask/node-vm/scenario1.sh`): `dpkg -i`, the examples as static pods,
//! `systemctl enable --now swiftlet`; the unit ready (sd_notify), the pods running, the watchdog
//! kept, oom_score_adj and cgroup as upstream's kubelet.service, and stopping swiftlet leaves the
//! pods running. Scenario 3 (`scenario3.sh`): the eviction benchmark's `kernel` mode on pure v2,
//! its JSON and plot read back from the payload disk (`copy_results`). Scenario 4 (`scenario4.sh`): containerd restarted, then stopped for 40 s with
//! a container killed meanwhile; scenario 5 (`scenario5.sh`): the agent restarted and killed
//! under pods with an exclusive CPU and volumes. Upstream counterpart: none in the kubelet; kind's node image
//! (`images/base/Dockerfile`) and kubeadm's kubelet.service are what this mirrors.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::{containerd::Version, images, node_suite, setup, sh, vm};

/// Debian's release the node runs: systemd 257, containerd 1.7.24, crun 1.21.
const SUITE: &str = "trixie";

/// What the node has beyond debootstrap's minimal base.
const PACKAGES: [&str; 16] = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "udev",
    "kmod",
    "procps",
    "iproute2",
    "iptables",
    "containerd",
    "runc",
    "crun",
    "containernetworking-plugins",
    "ca-certificates",
    "curl",
    "jq",
    "util-linux",
];

/// Files the image gets (guest path, contents, mode).
const GUEST_FILES: [(&str, &str, u32); 5] = [
    (
        "etc/containerd/config.toml",
        include_str!("../node-vm/containerd.toml"),
        0o644,
    ),
    (
        "etc/cni/net.d/10-pods.conflist",
        include_str!("../node-vm/10-pods.conflist"),
        0o644,
    ),
    (
        "etc/systemd/network/20-wired.network",
        include_str!("../node-vm/20-wired.network"),
        0o644,
    ),
    (
        "etc/systemd/system/swiftlet-node-vm.service",
        include_str!("../node-vm/swiftlet-node-vm.service"),
        0o644,
    ),
    (
        "usr/local/sbin/swiftlet-node-vm",
        include_str!("../node-vm/swiftlet-node-vm"),
        0o755,
    ),
];

/// The scenarios of issue 19, in the order one boot runs them: (number, what it shows, script).
/// Each script speaks the console protocol `parse` reads and ends with `done <failed>`; a later
/// one starts from the node the earlier ones left (scenario 1 installs and enables the agent).
const SCENARIOS: [(u32, &str, &str); 6] = [
    (
        1,
        "dpkg -i, enable --now: ready, watchdog, pods, placement",
        include_str!("../node-vm/scenario1.sh"),
    ),
    (
        2,
        "the host suite's tests on pure v2: both drivers, runc and crun",
        include_str!("../node-vm/scenario2.sh"),
    ),
    (
        3,
        "eviction woken by the kernel on pure v2: the eviction benchmark's kernel mode",
        include_str!("../node-vm/scenario3.sh"),
    ),
    (
        4,
        "containerd restarted and away 40 s: pods kept, agent up, exit caught up",
        include_str!("../node-vm/scenario4.sh"),
    ),
    (
        5,
        "agent restarted and killed: pods adopted, exclusive CPU and volumes intact",
        include_str!("../node-vm/scenario5.sh"),
    ),
    // Last: it powers the node off (gracefully, through logind) and reports during the shutdown.
    (
        6,
        "graceful node shutdown: inhibitor lock, pods by priority, statuses",
        include_str!("../node-vm/scenario6.sh"),
    ),
];

/// Sourced by every scenario (`. "$(dirname "$0")/lib.sh"`).
const SCENARIO_LIB: &str = include_str!("../node-vm/lib.sh");

/// The scenario that runs the host suite's test executables (`node_suite`).
const SUITE_SCENARIO: u32 = 2;

/// The scenario that runs the eviction benchmark's `kernel` mode (`swiftlet-bench eviction`).
const BENCH_SCENARIO: u32 = 3;

/// What `cargo xtask test` runs: every scenario, scenario 2 with CI's selection of the host
/// suite's tests and scenario 3 with CI's runs (`node_suite::Size::Ci`).
pub const SUITE_SCENARIOS: [u32; 6] = [1, 2, 3, 4, 5, 6];

/// Changes when the build steps below change in a way the inputs do not show.
const IMAGE_FORMAT: u32 = 2;

/// The root disk's size (sparse): the base system takes about 1 GiB, the pods' images and
/// containerd's snapshots little; the default eviction thresholds (nodefs 10 % free) must hold.
const DISK_SIZE: &str = "6G";

/// Boot, scenarios and power-off under software emulation (boot alone takes about 45-70 s,
/// scenario 1 about 4 min, 4 about 4.5 min with its 40 s outage, 5 about 3 min, 6 about 2 min).
const RUN_DEADLINE: Duration = Duration::from_secs(25 * 60);
/// What scenario 2 adds to it: its full selection's ten test runs took 12 minutes under TCG with
/// two other VMs on the same two CPUs (one test 40 s to 3 minutes), and each is bounded by the
/// script's own per-test timeout; CI's five runs take about half.
const SUITE_DEADLINE: Duration = Duration::from_secs(30 * 60);
const CI_SUITE_DEADLINE: Duration = Duration::from_secs(15 * 60);
/// What one run of scenario 3's benchmark may add (its own bounds: up to 90 s to settle, as long
/// as the hog's memory grows and at most 600 s to cross, 30 s to decide, 60 s to remove; three
/// runs of the debug build took 255 s under emulation on 6.12), and the rest of it.
const BENCH_RUN_DEADLINE: Duration = Duration::from_secs(720);
const BENCH_DEADLINE: Duration = Duration::from_secs(5 * 60);

fn run_deadline(suite: Option<node_suite::Size>, bench: Option<&BenchPayload>) -> Duration {
    let suite = match suite {
        Some(node_suite::Size::Full) => SUITE_DEADLINE,
        Some(node_suite::Size::Ci) => CI_SUITE_DEADLINE,
        None => Duration::ZERO,
    };
    let bench = bench.map_or(Duration::ZERO, |b| {
        BENCH_DEADLINE + BENCH_RUN_DEADLINE * u32::try_from(b.runs).unwrap_or(u32::MAX)
    });
    RUN_DEADLINE + suite + bench
}

/// What a run brings on its payload disk besides the scenarios.
#[derive(Clone, Copy)]
struct Payload<'a> {
    deb: &'a Path,
    images: &'a [images::Image],
    /// Scenario 2's test executables.
    suite: Option<&'a node_suite::Binaries>,
    bench: Option<&'a BenchPayload>,
}

/// Scenario 3's eviction benchmark: which build's agent and driver, and how many runs.
#[derive(Clone, Debug)]
struct BenchPayload {
    /// `target/release` for the full run (the figures the README quotes), `target/debug` for
    /// CI's, whose checks are counts.
    profile: PathBuf,
    runs: usize,
}

/// The full run's count is the host benchmark's; CI's is enough to see each run decided by the
/// kernel's trigger.
const BENCH_RUNS_FULL: usize = 20;
const BENCH_RUNS_CI: usize = 3;

/// What the guest writes on the payload disk (`results/`) and the host copies into the run's
/// folder after the power-off.
const BENCH_RESULTS: [&str; 2] = ["eviction.json", "eviction-latency.svg"];

/// Marks the scenario's console lines.
const MARK: &str = "swiftlet-node-vm:";

/// The kernel `cargo xtask test` boots the node with: trixie's own series.
pub const DEFAULT_KERNEL: &str = "6.12";
/// The containerd release `cargo xtask test` installs on the node (trixie's own).
pub const DEFAULT_CONTAINERD: Version = Version::V1_7;

/// `--kernel`: the kernel matrix's series.
pub fn parse_kernel(given: &str) -> anyhow::Result<&'static str> {
    match vm::parse_kernels(&[given.to_owned()])?.as_slice() {
        [vm::Kernel::Series(series)] => Ok(series),
        _ => bail!("--kernel {given}: the node VM boots 6.1 or 6.12"),
    }
}

/// `--containerd`: trixie's own 1.7 or sid's 2.1.
pub fn check_containerd(version: Version) -> anyhow::Result<Version> {
    match version {
        Version::V1_7 | Version::V2_1 => Ok(version),
        Version::V1_6 => bail!("--containerd 1.6: the node VM runs 1.7 (trixie's) or 2.1 (sid's)"),
    }
}

/// `--scenario`: the numbers given, in the order one boot runs them; all when none is.
pub fn select_scenarios(given: &[u32]) -> anyhow::Result<Vec<u32>> {
    if let Some(unknown) = given
        .iter()
        .find(|n| !SCENARIOS.iter().any(|(m, _, _)| m == *n))
    {
        bail!(
            "--scenario {unknown}: the node VM has scenarios {}",
            SCENARIOS
                .iter()
                .map(|(n, _, _)| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(SCENARIOS
        .iter()
        .map(|(n, _, _)| *n)
        .filter(|n| given.is_empty() || given.contains(n))
        .collect())
}

/// Boots the node with `scenarios`; scenario 2 runs `suite`'s selection of the host suite,
/// scenario 3 its benchmark runs (or `bench_runs`).
pub fn run(
    series: &'static str,
    containerd: Version,
    scenarios: &[u32],
    suite: node_suite::Size,
    bench_runs: Option<usize>,
) -> anyhow::Result<()> {
    setup::ensure()?;
    if !sh::is_root() {
        bail!("the node VM is built with debootstrap and chroot: run it as root");
    }
    let started = Instant::now();
    let dir = sh::root().join("target").join("node-vm");
    fs::create_dir_all(&dir)?;
    // The suite's build (`cargo xtask test` has made it already): a build of the agent alone
    // would unify features differently and compile it a second time. Scenario 2 takes test
    // executables out of it.
    let size = suite;
    let suite = if scenarios.contains(&SUITE_SCENARIO) {
        Some(node_suite::build(suite)?)
    } else {
        crate::tasks::build_suite()?;
        None
    };
    let bench = if scenarios.contains(&BENCH_SCENARIO) {
        let release = size == node_suite::Size::Full;
        if release {
            crate::tasks::build(true)?;
        }
        Some(BenchPayload {
            profile: crate::tasks::profile_dir(release),
            runs: bench_runs.unwrap_or(if release {
                BENCH_RUNS_FULL
            } else {
                BENCH_RUNS_CI
            }),
        })
    } else {
        None
    };
    let deb = crate::deb::package()?;
    let images = images::ensure()?;
    let kernels = kernels()?;
    let vmlinuz = kernels
        .iter()
        .find(|(s, _)| *s == series)
        .map(|(_, v)| v.clone())
        .ok_or_else(|| anyhow!("no kernel {series}"))?;
    let prepared = started.elapsed().as_secs();
    let image_started = Instant::now();
    let (base, built) = base_image(&dir, containerd, &kernels)?;
    let image_seconds = image_started.elapsed().as_secs();
    let run_dir = dir.join(format!("{series}-{}", containerd.label()));
    let payload = Payload {
        deb: &deb,
        images: &images,
        suite: suite.as_ref(),
        bench: bench.as_ref(),
    };
    let mut outcome =
        boot(&vmlinuz, &base, &payload, &run_dir, scenarios).unwrap_or_else(|e| Outcome {
            problem: Some(format!("{e:#}")),
            ..Outcome::default()
        });
    outcome.kernel = series.to_owned();
    outcome.containerd = containerd.label().to_owned();
    outcome.timings = vec![
        ("build, package, images, kernels".to_owned(), prepared),
        (
            if built {
                "root filesystem image built".to_owned()
            } else {
                "root filesystem image (cached)".to_owned()
            },
            image_seconds,
        ),
        ("VM: boot, scenarios, power-off".to_owned(), outcome.seconds),
    ];
    let text = report_text(&outcome);
    print!("{text}");
    fs::create_dir_all(&run_dir)?;
    fs::write(run_dir.join("report.txt"), &text)?;
    fs::write(
        run_dir.join("report.json"),
        serde_json::to_string_pretty(&report_json(&outcome))?,
    )?;
    if !outcome.ok() {
        bail!(
            "the node VM failed on {series} with containerd {}: {} (console and report under {})",
            containerd.label(),
            outcome.failure_summary(),
            run_dir.display()
        );
    }
    println!(
        "xtask: {} node VM passed ({series}, containerd {}) in {} s",
        sh::elapsed(),
        containerd.label(),
        started.elapsed().as_secs()
    );
    Ok(())
}

/// The key of the image: everything it is built from.
/// Every kernel of the kernel matrix, fetched (the image holds the modules of each).
fn kernels() -> anyhow::Result<Vec<(&'static str, PathBuf)>> {
    let kernels_dir = sh::root().join("target").join("vm-test");
    vm::KERNELS
        .iter()
        .map(|&(series, _)| Ok((series, vm::fetch_kernel(&kernels_dir, series)?)))
        .collect()
}

/// The kernels and the root filesystem image for `containerd`, made on a thread of their own at
/// a lower priority: `cargo xtask test` has them made while the suite compiles (debootstrap
/// mostly waits on downloads and the disk), so that a fresh clone's few minutes of image build
/// do not come after everything else. Join it before anything else fetches kernels or builds an image:
/// both write to fixed paths under `target/`.
pub fn prepare_in_background(containerd: Version) -> thread::JoinHandle<anyhow::Result<()>> {
    thread::spawn(move || {
        crate::containerd::lower_this_threads_priority();
        if !sh::is_root() {
            return Ok(());
        }
        let dir = sh::root().join("target").join("node-vm");
        fs::create_dir_all(&dir)?;
        let kernels = kernels()?;
        base_image(&dir, containerd, &kernels).map(|_| ())
    })
}

fn image_key(
    containerd: Version,
    containerd_deb: Option<&Path>,
    mirror: &str,
    kernels: &[String],
) -> String {
    let mut hash = Sha256::new();
    hash.update(format!(
        "{IMAGE_FORMAT}\n{SUITE}\n{mirror}\n{}\n{}\n",
        PACKAGES.join(","),
        containerd.label()
    ));
    if let Some(deb) = containerd_deb.and_then(|d| d.file_name()) {
        hash.update(deb.as_encoded_bytes());
    }
    for kernel in kernels {
        hash.update(format!("kernel {kernel}\n"));
    }
    for (path, contents, mode) in GUEST_FILES {
        hash.update(format!("{path} {mode:o}\n{contents}\n"));
    }
    let digest = hash.finalize();
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The base image for `containerd`, built unless the one for the same inputs is there; returns
/// it and whether it was built now.
fn base_image(
    dir: &Path,
    containerd: Version,
    kernels: &[(&str, PathBuf)],
) -> anyhow::Result<(PathBuf, bool)> {
    // 1.7 is trixie's own; another release is installed from its suite's package.
    let containerd_deb = match containerd {
        Version::V1_7 => None,
        other => crate::containerd::fetch_deb(other, &dir.join("debs-extra"))?,
    };
    let mirror = crate::containerd::system_mirror()?.uri;
    // `<package>/lib/modules/<release>` of each kernel, unpacked by the kernel matrix.
    let mut modules = Vec::new();
    for (_, vmlinuz) in kernels {
        let unpacked = vmlinuz
            .parent()
            .and_then(Path::parent)
            .ok_or_else(|| anyhow!("{} is not in <package>/boot", vmlinuz.display()))?;
        for entry in fs::read_dir(unpacked.join("lib/modules"))?.flatten() {
            modules.push(entry.path());
        }
    }
    let releases: Vec<String> = modules
        .iter()
        .filter_map(|m| m.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let key = image_key(containerd, containerd_deb.as_deref(), &mirror, &releases);
    let prefix = format!("base-{}-", containerd.label());
    let image = dir.join(format!("{prefix}{key}.img"));
    if image.exists() {
        println!("xtask: node-vm: {} (cached)", image.display());
        return Ok((image, false));
    }
    println!(
        "xtask: node-vm: building {} (debootstrap of Debian {SUITE}; a few minutes)",
        image.display()
    );
    let tree = dir.join("rootfs.partial");
    remove_tree(&tree)?;
    let cache = dir.join("debs");
    fs::create_dir_all(&cache)?;
    sh::run(
        Command::new("debootstrap")
            .arg("--variant=minbase")
            .arg(format!("--cache-dir={}", cache.display()))
            .arg(format!("--include={}", PACKAGES.join(",")))
            .arg(SUITE)
            .arg(&tree)
            .arg(&mirror),
    )?;
    if let Some(deb) = &containerd_deb {
        fs::copy(deb, tree.join("tmp/containerd.deb"))?;
        sh::run(
            Command::new("chroot")
                .arg(&tree)
                .args(["dpkg", "-i", "/tmp/containerd.deb"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
        fs::remove_file(tree.join("tmp/containerd.deb"))?;
    }
    for (path, contents, mode) in GUEST_FILES {
        let dest = tree.join(path);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&dest, contents)?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode))?;
    }
    fs::write(tree.join("etc/hostname"), "swiftlet-node\n")?;
    fs::write(
        tree.join("etc/hosts"),
        "127.0.0.1 localhost\n127.0.1.1 swiftlet-node\n::1 localhost ip6-localhost\n",
    )?;
    fs::write(
        tree.join("etc/fstab"),
        "/dev/nvme0n1 / ext4 rw,errors=remount-ro 0 1\n",
    )?;
    sh::run(Command::new("chroot").arg(&tree).args([
        "systemctl",
        "enable",
        "swiftlet-node-vm.service",
        "systemd-networkd.service",
    ]))?;
    // Nobody logs in: the console is the scenario's.
    sh::run(Command::new("chroot").arg(&tree).args([
        "systemctl",
        "mask",
        "serial-getty@ttyS0.service",
        "getty@tty1.service",
    ]))?;
    for source in &modules {
        let release = source
            .file_name()
            .ok_or_else(|| anyhow!("{}", source.display()))?;
        let dest = tree.join("usr/lib/modules").join(release);
        fs::create_dir_all(tree.join("usr/lib/modules"))?;
        sh::run(Command::new("cp").arg("-a").arg(source).arg(&dest))?;
        sh::run(Command::new("chroot").arg(&tree).arg("depmod").arg(release))?;
    }
    // What apt downloaded is in `debs/` already.
    for cached in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        for entry in fs::read_dir(tree.join(cached))?.flatten() {
            if entry.file_type()?.is_file() {
                fs::remove_file(entry.path())?;
            }
        }
    }
    let partial = dir.join(format!("{prefix}{key}.img.partial"));
    let _ = fs::remove_file(&partial);
    sh::run(
        Command::new("truncate")
            .args(["-s", DISK_SIZE])
            .arg(&partial),
    )?;
    sh::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "root", "-d"])
            .arg(&tree)
            .arg(&partial),
    )?;
    fs::rename(&partial, &image)?;
    remove_tree(&tree)?;
    // Images of older inputs are never booted again.
    for entry in fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && entry.path() != image {
            println!("xtask: node-vm: removing the outdated {name}");
            let _ = fs::remove_file(entry.path());
        }
    }
    Ok((image, true))
}

/// Removes a root filesystem tree made here (it holds no mounts: nothing is mounted into it).
fn remove_tree(tree: &Path) -> anyhow::Result<()> {
    if tree.exists() {
        fs::remove_dir_all(tree).with_context(|| format!("removing {}", tree.display()))?;
    }
    Ok(())
}

/// One scenario check as the guest reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Check {
    name: String,
    ok: bool,
    detail: String,
}

/// What one scenario reported.
#[derive(Debug, Default)]
struct Scenario {
    number: u32,
    checks: Vec<Check>,
    facts: BTreeMap<String, String>,
    /// The agent's journal, when a check failed.
    logs: Vec<String>,
    /// The scenario printed its last line.
    done: bool,
}

impl Scenario {
    fn failed(&self) -> usize {
        self.checks.iter().filter(|c| !c.ok).count()
    }

    fn ok(&self) -> bool {
        self.done && self.failed() == 0 && !self.checks.is_empty()
    }

    fn title(&self) -> &'static str {
        SCENARIOS
            .iter()
            .find(|(n, _, _)| *n == self.number)
            .map_or("", |(_, title, _)| title)
    }
}

#[derive(Debug, Default)]
struct Outcome {
    kernel: String,
    containerd: String,
    /// The scenarios the run was asked for.
    expected: Vec<u32>,
    scenarios: Vec<Scenario>,
    problem: Option<String>,
    console_tail: Vec<String>,
    log: Option<PathBuf>,
    seconds: u64,
    timings: Vec<(String, u64)>,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.problem.is_none()
            && self.scenarios.iter().all(Scenario::ok)
            && self.expected == self.scenarios.iter().map(|s| s.number).collect::<Vec<_>>()
    }

    /// A fact of whichever scenario reported it first (the kernel, containerd's version).
    fn fact(&self, name: &str) -> Option<&str> {
        self.scenarios
            .iter()
            .find_map(|s| s.facts.get(name))
            .map(String::as_str)
    }

    fn failure_summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(problem) = &self.problem {
            parts.push(problem.clone());
        }
        for s in &self.scenarios {
            let failed: Vec<&str> = s
                .checks
                .iter()
                .filter(|c| !c.ok)
                .map(|c| c.name.as_str())
                .collect();
            if !failed.is_empty() {
                parts.push(format!("scenario {}: {}", s.number, failed.join(", ")));
            } else if !s.done {
                parts.push(format!("scenario {} did not finish", s.number));
            }
        }
        for n in &self.expected {
            if !self.scenarios.iter().any(|s| s.number == *n) {
                parts.push(format!("scenario {n} did not run"));
            }
        }
        parts.join("; ")
    }
}

/// Reads the scenarios' lines out of the console: `scenario N` opens one, the lines until the
/// next are its own.
fn parse(console: &str) -> Outcome {
    let mut outcome = Outcome::default();
    for line in console.lines() {
        let Some(rest) = line.split_once(MARK).map(|(_, r)| r.trim()) else {
            continue;
        };
        let (kind, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        if kind == "problem:" {
            outcome.problem.get_or_insert_with(|| rest.to_owned());
            continue;
        }
        if kind == "scenario" {
            outcome.scenarios.push(Scenario {
                number: rest.trim().parse().unwrap_or(0),
                ..Scenario::default()
            });
            continue;
        }
        // Lines before any `scenario` line (an older payload) count as scenario 1's.
        if outcome.scenarios.is_empty() {
            outcome.scenarios.push(Scenario {
                number: 1,
                ..Scenario::default()
            });
        }
        let Some(current) = outcome.scenarios.last_mut() else {
            continue;
        };
        match kind {
            "check" => {
                let mut words = rest.splitn(3, ' ');
                let name = words.next().unwrap_or_default().to_owned();
                let ok = words.next() == Some("ok");
                let detail = words.next().unwrap_or_default().trim().to_owned();
                current.checks.push(Check { name, ok, detail });
            }
            "fact" => {
                let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
                current
                    .facts
                    .insert(name.to_owned(), value.trim().to_owned());
            }
            "log" => current.logs.push(rest.to_owned()),
            "done" => current.done = true,
            _ => {}
        }
    }
    outcome
}

/// Boots the node with a fresh overlay and the payload disk; runs the scenarios.
fn boot(
    vmlinuz: &Path,
    base: &Path,
    what: &Payload<'_>,
    run_dir: &Path,
    scenarios: &[u32],
) -> anyhow::Result<Outcome> {
    if run_dir.exists() {
        fs::remove_dir_all(run_dir)?;
    }
    fs::create_dir_all(run_dir)?;
    let overlay = run_dir.join("overlay.qcow2");
    sh::run(
        Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(base)
            .arg(&overlay),
    )?;
    let payload = payload_disk(run_dir, what, scenarios)?;
    let log_path = run_dir.join("console.log");
    let started = Instant::now();
    println!(
        "xtask: {} node-vm: booting {} (console: {})",
        sh::elapsed(),
        vmlinuz.display(),
        log_path.display()
    );
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "2048"])
        // A network interface as a node has, on qemu's user-mode network restricted to the
        // VM: DHCP from qemu, nothing reachable beyond it.
        .args(["-nographic", "-no-reboot"])
        .args(["-nic", "user,restrict=on,model=virtio-net-pci"])
        // The root disk is the only NVMe namespace, so the kernel (no initramfs) finds it as
        // `/dev/nvme0n1`: with a second namespace, the kernel's asynchronous namespace scan
        // names them in either order. The payload is a virtio disk: its driver is a module,
        // loaded by udev once the root is mounted, and the runner mounts it by its label.
        .arg("-drive")
        .arg(format!(
            "if=none,id=root,format=qcow2,file={}",
            overlay.display()
        ))
        .args(["-device", "nvme,id=nvme0,serial=swiftlet-node"])
        .args(["-device", "nvme-ns,drive=root,bus=nvme0,nsid=1"])
        .arg("-drive")
        .arg(format!(
            "if=none,id=payload,format=raw,file={}",
            payload.display()
        ))
        .args(["-device", "virtio-blk-pci,drive=payload"])
        .arg("-kernel")
        .arg(vmlinuz)
        // `quiet` keeps kernel messages from splitting the scenario's lines. The CPU is
        // emulated, so there is no real CPU's speculation flaw to mitigate; 6.1's default
        // mitigations for qemu's model made faults and system calls so slow under TCG that
        // scenario 3's hog never reached the bar in time (a shell filled 32 MiB in 8.2 s, 2.2 s
        // with them off; 6.12, which mitigates only Spectre v1 here, took 1.6 s).
        .args([
            "-append",
            "root=/dev/nvme0n1 rw console=ttyS0 panic=-1 quiet loglevel=3 mitigations=off",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting qemu-system-x86_64 (Debian package qemu-system-x86)")?;
    let deadline = run_deadline(what.suite.map(node_suite::Binaries::size), what.bench);
    let console = vm::watch_console(&mut qemu, &log_path, started + deadline)?;
    let mut outcome = parse(&console.text);
    outcome.expected = scenarios.to_vec();
    outcome.seconds = started.elapsed().as_secs();
    outcome.log = Some(log_path);
    outcome.console_tail = vm::console_tail(&console.text, 20);
    if console.timed_out {
        outcome.problem = Some(format!(
            "no power-off within {} s; killed{}",
            deadline.as_secs(),
            match outcome
                .scenarios
                .last()
                .and_then(|s| s.checks.last().map(|c| (s.number, c)))
            {
                Some((n, check)) => format!(" after scenario {n}'s check {}", check.name),
                None => String::new(),
            }
        ));
    } else if !outcome.scenarios.last().is_some_and(|s| s.done) {
        outcome.problem.get_or_insert_with(|| {
            match vm::KERNEL_CRASH.iter().find(|c| console.text.contains(*c)) {
                Some(crash) => format!("the guest kernel crashed (\"{crash}\" on the console)"),
                None => format!(
                    "the VM stopped before the scenario finished (qemu {})",
                    console.status
                ),
            }
        });
    }
    if what.bench.is_some() {
        copy_results(&payload, run_dir);
    }
    // The overlay and the payload are this run's only; the console and the report stay.
    let _ = fs::remove_file(&overlay);
    let _ = fs::remove_file(&payload);
    Ok(outcome)
}

/// The `payload` disk: the scenarios, the package, the images and the example pods; with
/// scenario 2, the suite's test executables.
fn payload_disk(run_dir: &Path, what: &Payload<'_>, scenarios: &[u32]) -> anyhow::Result<PathBuf> {
    let Payload {
        deb,
        images,
        suite,
        bench,
    } = *what;
    let stage = run_dir.join("payload");
    for sub in ["images", "examples", "scenarios"] {
        fs::create_dir_all(stage.join(sub))?;
    }
    // The image's unit runs `scenario.sh`: here, the selected scenarios one after another.
    fs::write(stage.join("scenario.sh"), driver_script(scenarios))?;
    // What every scenario sources: the console protocol and shared looks at the node.
    fs::write(stage.join("scenarios").join("lib.sh"), SCENARIO_LIB)?;
    for (n, _, script) in SCENARIOS.iter().filter(|(n, _, _)| scenarios.contains(n)) {
        fs::write(stage.join("scenarios").join(format!("{n}.sh")), script)?;
    }
    fs::copy(deb, stage.join("swiftlet.deb"))?;
    if let Some(suite) = suite {
        node_suite::stage(&stage, suite)?;
    }
    if let Some(bench) = bench {
        let dir = stage.join("bench");
        fs::create_dir_all(&dir)?;
        for name in ["swiftlet", "swiftlet-bench"] {
            node_suite::stripped(&bench.profile.join(name), &dir.join(name))?;
        }
        fs::write(dir.join("runs"), format!("{}\n", bench.runs))?;
    }
    for image in images {
        let name = image
            .tar
            .file_name()
            .ok_or_else(|| anyhow!("{}", image.tar.display()))?;
        fs::copy(&image.tar, stage.join("images").join(name))?;
    }
    for entry in fs::read_dir(sh::root().join("examples"))?.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            fs::copy(&path, stage.join("examples").join(entry.file_name()))?;
        }
    }
    let mut bytes = 0;
    for entry in walk(&stage)? {
        bytes += fs::metadata(&entry)?.len();
    }
    let disk = run_dir.join("payload.img");
    // ext4's own metadata and journal on top of the files.
    let size = bytes + bytes / 4 + (64 << 20);
    fs::File::create(&disk)?.set_len(size)?;
    sh::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "payload", "-d"])
            .arg(&stage)
            .arg(&disk),
    )?;
    fs::remove_dir_all(&stage)?;
    Ok(disk)
}

/// Copies scenario 3's results out of the payload disk's ext4 (debugfs reads the image without
/// mounting it) into `run_dir`; what is missing is the scenario's checks' business.
fn copy_results(payload: &Path, run_dir: &Path) {
    for name in BENCH_RESULTS {
        let to = run_dir.join(name);
        let dumped = Command::new("debugfs")
            .arg("-R")
            .arg(format!("dump /results/{name} {}", to.display()))
            .arg(payload)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // debugfs exits 0 even when the file is not there, leaving an empty one or none.
        let kept =
            dumped.is_ok_and(|s| s.success()) && fs::metadata(&to).is_ok_and(|m| m.len() > 0);
        if kept {
            println!("xtask: {} node-vm: {}", sh::elapsed(), to.display());
        } else {
            let _ = fs::remove_file(&to);
        }
    }
}

fn driver_script(scenarios: &[u32]) -> String {
    let mut script = String::from("#!/bin/sh\n");
    for n in scenarios {
        script.push_str(&format!(
            "echo '{MARK} scenario {n}'\nsh /payload/scenarios/{n}.sh\n"
        ));
    }
    script
}

fn walk(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)?.flatten() {
        if entry.file_type()?.is_dir() {
            files.extend(walk(&entry.path())?);
        } else {
            files.push(entry.path());
        }
    }
    Ok(files)
}

fn report_text(o: &Outcome) -> String {
    let mut text = format!(
        "\nxtask: node VM: kernel {} ({}), containerd {} ({}): {}\n",
        o.kernel,
        o.fact("kernel").unwrap_or("?"),
        o.containerd,
        o.fact("containerd").unwrap_or("?"),
        if o.ok() { "ok" } else { "FAILED" }
    );
    for s in &o.scenarios {
        text.push_str(&format!(
            "  scenario {} ({}): {}\n",
            s.number,
            s.title(),
            if s.ok() {
                "ok"
            } else if s.done {
                "FAILED"
            } else {
                "FAILED (did not finish)"
            }
        ));
        for check in &s.checks {
            text.push_str(&format!(
                "    {:<6} {:<30} {}\n",
                if check.ok { "ok" } else { "FAILED" },
                check.name,
                check.detail
            ));
        }
        for (name, value) in &s.facts {
            text.push_str(&format!("    fact   {name:<30} {value}\n"));
        }
        if !s.logs.is_empty() {
            text.push_str("    swiftlet's journal (end):\n");
            for line in &s.logs {
                text.push_str(&format!("      {line}\n"));
            }
        }
    }
    for n in &o.expected {
        if !o.scenarios.iter().any(|s| s.number == *n) {
            text.push_str(&format!("  scenario {n}: FAILED (did not run)\n"));
        }
    }
    for (what, secs) in &o.timings {
        text.push_str(&format!("  time   {what:<32} {secs} s\n"));
    }
    if let Some(problem) = &o.problem {
        text.push_str(&format!("  problem: {problem}\n  last console lines:\n"));
        for line in &o.console_tail {
            text.push_str(&format!("    {line}\n"));
        }
    }
    if let Some(log) = &o.log {
        text.push_str(&format!("  console log: {}\n", log.display()));
    }
    text.push('\n');
    text
}

fn report_json(o: &Outcome) -> serde_json::Value {
    json!({
        "kernel": o.kernel,
        "containerd": o.containerd,
        "ok": o.ok(),
        "seconds": o.seconds,
        "scenarios": o.scenarios.iter().map(|s| json!({
            "scenario": s.number,
            "title": s.title(),
            "ok": s.ok(),
            "done": s.done,
            "checks": s.checks.iter().map(|c| json!({"name": c.name, "ok": c.ok, "detail": c.detail})).collect::<Vec<_>>(),
            "facts": s.facts,
            "journal": s.logs,
        })).collect::<Vec<_>>(),
        "expected": o.expected,
        "timings": o.timings.iter().map(|(what, secs)| json!({"what": what, "seconds": secs})).collect::<Vec<_>>(),
        "problem": o.problem,
        "console_tail": o.console_tail,
        "console_log": o.log,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_gives_each_scenario_its_checks_facts_and_end() {
        let console = "[  OK  ] Started containerd.service\n\
            swiftlet-node-vm: scenario 1\n\
            swiftlet-node-vm: fact kernel 6.12.117+deb12-cloud-amd64\n\
            [   40.1] a kernel line swiftlet-node-vm: check unit_ready ok ActiveState=active\n\
            swiftlet-node-vm: done 0\n\
            swiftlet-node-vm: scenario 5\n\
            swiftlet-node-vm: check adopted FAILED 2 of 3\n\
            swiftlet-node-vm: log Nov 27 swiftlet[301]: an error\n";
        let mut outcome = parse(console);
        outcome.expected = vec![1, 5];
        assert_eq!(outcome.fact("kernel"), Some("6.12.117+deb12-cloud-amd64"));
        assert_eq!(outcome.scenarios.len(), 2);
        let (first, second) = (&outcome.scenarios[0], &outcome.scenarios[1]);
        assert_eq!(first.number, 1);
        assert_eq!(
            first.checks,
            vec![Check {
                name: "unit_ready".into(),
                ok: true,
                detail: "ActiveState=active".into()
            }]
        );
        assert!(first.ok());
        assert_eq!(second.number, 5);
        assert!(!second.done);
        assert_eq!(
            second.logs,
            vec!["Nov 27 swiftlet[301]: an error".to_owned()]
        );
        assert!(!outcome.ok());
        assert_eq!(outcome.failure_summary(), "scenario 5: adopted");

        // A scenario that never started fails the run, even when the others passed.
        let mut missing = parse(
            "swiftlet-node-vm: scenario 1\nswiftlet-node-vm: check a ok\nswiftlet-node-vm: done 0\n",
        );
        missing.expected = vec![1];
        assert!(missing.ok());
        missing.expected = vec![1, 4];
        assert!(!missing.ok());
        assert_eq!(missing.failure_summary(), "scenario 4 did not run");

        let unmounted = parse("swiftlet-node-vm: problem: cannot mount the payload disk\n");
        assert_eq!(
            unmounted.problem.as_deref(),
            Some("cannot mount the payload disk")
        );
    }

    #[test]
    fn scenarios_are_selected_in_boot_order() {
        assert_eq!(
            select_scenarios(&[]).ok(),
            Some(SCENARIOS.iter().map(|s| s.0).collect())
        );
        assert_eq!(select_scenarios(&[1]).ok(), Some(vec![1]));
        assert!(select_scenarios(&[99]).is_err());
        // The console protocol lives in lib.sh: a scenario without it would print nothing parsed.
        for (n, _, script) in SCENARIOS {
            assert!(
                script.contains(". \"$(dirname \"$0\")/lib.sh\""),
                "scenario {n} does not source lib.sh"
            );
        }
        assert!(
            SCENARIO_LIB.contains("check() {") && SCENARIO_LIB.contains("M=\"swiftlet-node-vm:\"")
        );
        let driver = driver_script(&[1]);
        assert!(
            driver.contains("echo 'swiftlet-node-vm: scenario 1'\nsh /payload/scenarios/1.sh\n")
        );
    }

    #[test]
    fn the_image_key_follows_its_inputs() {
        let kernels = vec!["6.1.0-56-cloud-amd64".to_owned()];
        let key = image_key(
            Version::V1_7,
            None,
            "http://deb.debian.org/debian",
            &kernels,
        );
        assert_eq!(key.len(), 16);
        assert_eq!(
            key,
            image_key(
                Version::V1_7,
                None,
                "http://deb.debian.org/debian",
                &kernels
            )
        );
        assert_ne!(
            key,
            image_key(
                Version::V2_1,
                None,
                "http://deb.debian.org/debian",
                &kernels
            )
        );
        assert_ne!(
            key,
            image_key(Version::V1_7, None, "http://mirror/debian", &kernels)
        );
        assert_ne!(
            key,
            image_key(Version::V1_7, None, "http://deb.debian.org/debian", &[])
        );
    }

    #[test]
    fn only_the_matrix_kernels_and_the_vm_containerds_are_taken() {
        assert_eq!(parse_kernel("6.12").ok(), Some("6.12"));
        assert!(parse_kernel("host").is_err());
        assert!(parse_kernel("5.10").is_err());
        assert!(check_containerd(Version::V1_6).is_err());
        assert!(check_containerd(Version::V2_1).is_ok());
    }
}
