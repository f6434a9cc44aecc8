//! `cargo xtask vm-test`: the kernel-event tests on the kernels users run. Each kernel is a
//! Debian cloud kernel (fetched with `apt-get download`, kept under `target/vm-test/kernels/`),
//! booted under qemu's software emulation with one initramfs: busybox, the test binaries
//! (stripped) with their shared libraries, and an `/init` that mounts a pure cgroup v2 hierarchy
//! at `/sys/fs/cgroup`, runs the tests and powers off. `host` runs the same binaries here. Every
//! kernel gets a report (programs and fallbacks, passed/failed/not run); the serial console of
//! each VM is kept in `target/vm-test/<kernel>/console.log`. A VM that does not finish in time
//! is killed and reported with the test it was in, so a hang is a failure, never a stuck CI; a VM
//! that stops early with no crash its kernel reported is booted once more (see `boot_retrying`).

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, anyhow, bail};
use serde_json::{Value, json};

use crate::{setup, sh};

/// The test files (`tests/tests/<name>.rs`) that make the matrix: everything the eBPF programs
/// and their loader do against a kernel.
const TEST_FILES: [&str; 4] = [
    "kernel_events",
    "kernel_features",
    "memcg_level",
    "sched_audit",
];

/// Tests that cannot run in the VMs, and why; they run on the host (`cargo xtask test`).
const NOT_IN_VMS: [(&str, &str); 2] = [
    (
        "memcg_reclaim_is_reported_rate_limited_for_watched_cgroups_only",
        "reclaims page cache of a file on disk; the VMs have only an initramfs (tmpfs pages are \
         charged to their writer and never reclaimed from the reader's cgroup)",
    ),
    (
        "the_pressure_rate_limit_follows_the_configured_interval",
        "same: needs a disk-backed page cache",
    ),
];

/// The Debian package whose dependency is the newest cloud kernel of a series.
pub(crate) const KERNELS: [(&str, &str); 2] = [
    ("6.1", "linux-image-cloud-amd64"),
    ("6.12", "linux-image-6.12-cloud-amd64"),
];

/// Longest a VM may take (boot, every test, power-off) under software emulation.
const VM_DEADLINE: Duration = Duration::from_secs(15 * 60);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kernel {
    Host,
    Series(&'static str),
}

impl Kernel {
    fn name(&self) -> &str {
        match self {
            Kernel::Host => "host",
            Kernel::Series(series) => series,
        }
    }
}

/// `--kernel` values: `6.1`, `6.12`, `host` or `all`, repeatable.
pub fn parse_kernels(given: &[String]) -> anyhow::Result<Vec<Kernel>> {
    let mut kernels = Vec::new();
    let given: Vec<&str> = if given.is_empty() {
        vec!["all"]
    } else {
        given.iter().map(String::as_str).collect()
    };
    for name in given {
        let add: Vec<Kernel> = match name {
            "all" => std::iter::once(Kernel::Host)
                .chain(KERNELS.iter().map(|(series, _)| Kernel::Series(series)))
                .collect(),
            "host" => vec![Kernel::Host],
            other => match KERNELS.iter().find(|(series, _)| *series == other) {
                Some((series, _)) => vec![Kernel::Series(series)],
                None => bail!(
                    "--kernel {other}: expected one of host, all, {}",
                    KERNELS.map(|(s, _)| s).join(", ")
                ),
            },
        };
        for kernel in add {
            if !kernels.contains(&kernel) {
                kernels.push(kernel);
            }
        }
    }
    Ok(kernels)
}

/// What one kernel's run produced.
#[derive(Debug, Default)]
struct Outcome {
    kernel: String,
    release: String,
    /// Test name → passed.
    results: BTreeMap<String, bool>,
    /// The output of each failed test.
    failures: BTreeMap<String, String>,
    /// The `swiftlet-vm-report` lines, in order.
    reports: Vec<String>,
    /// Tests that started and never finished (a hang or a crash of the VM).
    unfinished: Vec<String>,
    /// Why the run as a whole failed (boot, timeout), if it did.
    problem: Option<String>,
    /// The VM stopped before its `done` line without a kernel panic (see [`boot_retrying`]).
    stopped_early: bool,
    /// The last console lines that are not test events: the kernel's own account of a crash.
    console_tail: Vec<String>,
    /// The first boot's problem when the VM was booted a second time.
    retried_after: Option<String>,
    log: Option<PathBuf>,
    seconds: u64,
}

impl Outcome {
    fn passed(&self) -> usize {
        self.results.values().filter(|ok| **ok).count()
    }

    fn failed(&self) -> usize {
        self.results.len() - self.passed()
    }

    fn ok(&self) -> bool {
        self.problem.is_none()
            && self.failed() == 0
            && self.unfinished.is_empty()
            && !self.results.is_empty()
    }
}

pub fn run(kernels: &[Kernel]) -> anyhow::Result<()> {
    setup::ensure()?;
    if !sh::is_root() {
        bail!(
            "the kernel matrix loads eBPF programs: run it as root (sudo -E cargo xtask vm-test)"
        );
    }
    let binaries = build_tests()?;
    let dir = sh::root().join("target").join("vm-test");
    fs::create_dir_all(&dir)?;
    let vms: Vec<&'static str> = kernels
        .iter()
        .filter_map(|k| match k {
            Kernel::Series(series) => Some(*series),
            Kernel::Host => None,
        })
        .collect();
    let mut outcomes = Vec::new();
    // The VMs run in the background while the host's tests run here.
    let (tx, rx) = mpsc::channel();
    if !vms.is_empty() {
        let initramfs = build_initramfs(&dir, &binaries)?;
        for series in &vms {
            let vmlinuz = fetch_kernel(&dir, series)?;
            let (tx, initramfs, dir) = (tx.clone(), initramfs.clone(), dir.join(series));
            let series = *series;
            thread::spawn(move || {
                let outcome = boot_retrying(series, &vmlinuz, &initramfs, &dir);
                let _ = tx.send(outcome);
            });
        }
    }
    drop(tx);
    if kernels.contains(&Kernel::Host) {
        outcomes.push(run_on_host(&binaries)?);
    }
    outcomes.extend(rx.iter());
    outcomes.sort_by_key(|o| {
        kernels
            .iter()
            .position(|k| k.name() == o.kernel)
            .unwrap_or(usize::MAX)
    });
    print_report(&outcomes);
    write_json(&dir.join("report.json"), &outcomes)?;
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.kernel.as_str())
        .collect();
    if !failed.is_empty() {
        bail!(
            "the kernel matrix failed on {} (consoles and report under {})",
            failed.join(", "),
            dir.display()
        );
    }
    let names: Vec<&str> = outcomes.iter().map(|o| o.kernel.as_str()).collect();
    println!(
        "xtask: {} kernel matrix passed on {}",
        crate::sh::elapsed(),
        names.join(", ")
    );
    Ok(())
}

/// The matrix's test binaries and the helper binary they start.
struct Binaries {
    tests: Vec<(String, PathBuf)>,
    testproc: PathBuf,
}

fn build_tests() -> anyhow::Result<Binaries> {
    // The same build as `cargo xtask test`'s, so that nothing is compiled twice.
    let tests = crate::tasks::suite_test_binaries(&TEST_FILES)?;
    let testproc = sh::root().join("target/debug/swiftlet-testproc");
    if !testproc.exists() {
        bail!("{} was not built", testproc.display());
    }
    Ok(Binaries { tests, testproc })
}

/// libtest's arguments: one test at a time (a hang names its test), JSON events with each test's
/// output (RUSTC_BOOTSTRAP lets a stable build's libtest take `-Z unstable-options`).
fn libtest_args(in_vm: bool) -> Vec<String> {
    let mut args: Vec<String> = [
        "--test-threads=1",
        "-Z",
        "unstable-options",
        "--format=json",
        "--show-output",
        "--report-time",
    ]
    .map(str::to_owned)
    .to_vec();
    if in_vm {
        args.push("--exact".to_owned());
        for (test, _) in NOT_IN_VMS {
            args.extend(["--skip".to_owned(), test.to_owned()]);
        }
    }
    args
}

fn run_on_host(binaries: &Binaries) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let mut output = String::new();
    for (name, exe) in &binaries.tests {
        println!("xtask: vm-test: host: {name}");
        let out = Command::new(exe)
            .args(libtest_args(false))
            .env("CI", "true")
            .env("RUSTC_BOOTSTRAP", "1")
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("running {}", exe.display()))?;
        output.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    let mut outcome = parse(&output);
    outcome.kernel = "host".into();
    outcome.release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    outcome.seconds = started.elapsed().as_secs();
    Ok(outcome)
}

/// The newest cloud kernel of `series`, downloaded and unpacked once; returns its vmlinuz.
pub(crate) fn fetch_kernel(dir: &Path, series: &str) -> anyhow::Result<PathBuf> {
    let meta = KERNELS
        .iter()
        .find(|(s, _)| *s == series)
        .map(|(_, meta)| *meta)
        .ok_or_else(|| anyhow!("no kernel series {series}"))?;
    let package = match resolve(meta, series) {
        Some(package) => package,
        None => {
            sh::run(Command::new("apt-get").args(["update", "-qq"]))?;
            resolve(meta, series).ok_or_else(|| {
                anyhow!("apt knows no {meta} depending on a linux-image-{series}.* package")
            })?
        }
    };
    let cache = dir.join("kernels");
    let unpacked = cache.join(&package);
    if let Some(vmlinuz) = find_vmlinuz(&unpacked) {
        println!("xtask: vm-test: {series}: {package} (cached)");
        return Ok(vmlinuz);
    }
    fs::create_dir_all(&cache)?;
    sh::run(
        Command::new("apt-get")
            .args(["download", "-qq", "-o", "APT::Sandbox::User=root"])
            .arg(&package)
            .current_dir(&cache),
    )?;
    let deb = fs::read_dir(&cache)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
        })
        .ok_or_else(|| {
            anyhow!(
                "apt-get download left no {package}_*.deb in {}",
                cache.display()
            )
        })?;
    let partial = cache.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    sh::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&partial))?;
    fs::rename(&partial, &unpacked)?;
    let _ = fs::remove_file(&deb);
    find_vmlinuz(&unpacked).ok_or_else(|| anyhow!("{package} has no boot/vmlinuz-*"))
}

/// The package `meta` depends on, if it is of `series` (`linux-image-6.1.0-56-cloud-amd64`).
fn resolve(meta: &str, series: &str) -> Option<String> {
    let out = sh::output(Command::new("apt-cache").args(["depends", "--important", meta]))?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .find(|p| {
            p.strip_prefix("linux-image-")
                .and_then(|rest| rest.strip_prefix(series))
                .is_some_and(|rest| rest.starts_with('.'))
        })
        .map(str::to_owned)
}

fn find_vmlinuz(unpacked: &Path) -> Option<PathBuf> {
    fs::read_dir(unpacked.join("boot"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
}

/// The initramfs every VM boots: busybox, the stripped test binaries at `/t/deps/` with the
/// helper at `/t/` (where the tests look for it), their libraries, and `/init`.
fn build_initramfs(dir: &Path, binaries: &Binaries) -> anyhow::Result<PathBuf> {
    let root = dir.join("initramfs");
    let _ = fs::remove_dir_all(&root);
    for sub in ["bin", "t/deps", "proc", "sys", "dev", "tmp", "etc"] {
        fs::create_dir_all(root.join(sub))?;
    }
    fs::copy("/bin/busybox", root.join("bin/busybox"))
        .context("copying /bin/busybox (Debian package busybox-static)")?;
    let mut executables = Vec::new();
    for (name, exe) in &binaries.tests {
        let dest = root.join("t/deps").join(name);
        strip(exe, &dest)?;
        executables.push(dest);
    }
    let testproc = root.join("t/swiftlet-testproc");
    strip(&binaries.testproc, &testproc)?;
    executables.push(testproc);
    for library in libraries(&executables)? {
        let dest = root.join(library.strip_prefix("/").unwrap_or(&library));
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::copy(&library, &dest).with_context(|| format!("copying {}", library.display()))?;
    }
    let init = root.join("init");
    fs::write(&init, init_script(&binaries.tests))?;
    fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;

    let image = dir.join("initramfs.cpio.gz");
    let mut files = Vec::new();
    collect(&root, &root, &mut files)?;
    let mut cpio = Command::new("cpio")
        .args(["--create", "--format=newc", "--quiet"])
        .current_dir(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting cpio (Debian package cpio)")?;
    let mut stdin = cpio
        .stdin
        .take()
        .ok_or_else(|| anyhow!("cpio has no stdin"))?;
    let list = files.join("\n") + "\n";
    let writer = thread::spawn(move || stdin.write_all(list.as_bytes()));
    let mut archive = Vec::new();
    if let Some(mut stdout) = cpio.stdout.take() {
        std::io::Read::read_to_end(&mut stdout, &mut archive)?;
    }
    writer
        .join()
        .map_err(|_| anyhow!("writing to cpio panicked"))??;
    let status = cpio.wait()?;
    if !status.success() {
        bail!("cpio failed ({status})");
    }
    let mut gz =
        flate2::write::GzEncoder::new(fs::File::create(&image)?, flate2::Compression::fast());
    gz.write_all(&archive)?;
    gz.finish()?;
    println!(
        "xtask: vm-test: initramfs {} ({} MiB)",
        image.display(),
        fs::metadata(&image)?.len() >> 20
    );
    Ok(image)
}

/// Paths relative to `root`, directories before what they hold (cpio's order).
fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) -> anyhow::Result<()> {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)?.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let rel = path.strip_prefix(root)?.to_string_lossy().into_owned();
        out.push(rel);
        if path.is_dir() && !path.is_symlink() {
            collect(root, &path, out)?;
        }
    }
    Ok(())
}

/// Debug builds are mostly DWARF: stripped, the initramfs is a tenth of the size.
fn strip(from: &Path, to: &Path) -> anyhow::Result<()> {
    let status = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(from)
        .arg(to)
        .status()
        .context("running objcopy (Debian package binutils)")?;
    if !status.success() {
        bail!("objcopy --strip-debug {} failed ({status})", from.display());
    }
    Ok(())
}

/// The shared libraries (and the dynamic loader) `ldd` says the executables need.
fn libraries(executables: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut libraries = Vec::new();
    for exe in executables {
        let out = sh::output(Command::new("ldd").arg(exe))
            .ok_or_else(|| anyhow!("ldd {} failed", exe.display()))?;
        for line in out.lines() {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
            let path = line
                .split("=>")
                .last()
                .and_then(|rest| rest.split_whitespace().next())
                .filter(|p| p.starts_with('/'));
            if let Some(path) = path.map(PathBuf::from)
                && !libraries.contains(&path)
            {
                libraries.push(path);
            }
        }
    }
    Ok(libraries)
}

/// Marks the console lines `/init` writes, apart from the tests' JSON events.
const MARK: &str = "swiftlet-vm:";

fn init_script(tests: &[(String, PathBuf)]) -> String {
    let args = libtest_args(true).join(" ");
    let mut script = format!(
        "#!/bin/busybox sh\n\
         # The matrix VM's init: a pure cgroup v2 system with tracefs, the tests, then power-off.\n\
         /bin/busybox --install -s /bin\n\
         export PATH=/bin CI=true RUST_BACKTRACE=1 RUSTC_BOOTSTRAP=1\n\
         mount -t proc proc /proc\n\
         mount -t sysfs sysfs /sys\n\
         mount -t devtmpfs devtmpfs /dev\n\
         mount -t cgroup2 cgroup2 /sys/fs/cgroup || echo \"{MARK} problem: cannot mount cgroup2 at /sys/fs/cgroup\"\n\
         mount -t tracefs tracefs /sys/kernel/tracing || echo \"{MARK} problem: cannot mount tracefs\"\n\
         mount -t tmpfs tmpfs /tmp\n\
         echo \"{MARK} release $(uname -r)\"\n"
    );
    for (name, _) in tests {
        script.push_str(&format!(
            "echo \"{MARK} begin {name}\"\n/t/deps/{name} {args}\necho \"{MARK} end {name} $?\"\n"
        ));
    }
    script.push_str(&format!("echo \"{MARK} done\"\npoweroff -f\n"));
    script
}

/// Console lines by which the guest kernel tells of its own crash.
pub(crate) const KERNEL_CRASH: [&str; 6] = [
    "Kernel panic",
    "BUG:",
    "Oops",
    "general protection fault",
    "watchdog: ",
    "Call Trace:",
];

/// Boots the VM; boots it once more if it stopped before its tests finished with no crash the
/// guest kernel reported and no test failed: under software emulation on a loaded machine a guest
/// can be reset by the emulator (seen once in CI, never reproduced), which says nothing about
/// swiftlet. A kernel panic, an oops, a failed test or a hang is never retried. The first boot's
/// console stays in `console-first.log` and the report says the VM was booted again and why.
fn boot_retrying(series: &str, vmlinuz: &Path, initramfs: &Path, dir: &Path) -> Outcome {
    let attempt = || {
        boot(series, vmlinuz, initramfs, dir).unwrap_or_else(|e| Outcome {
            kernel: series.to_owned(),
            problem: Some(format!("{e:#}")),
            ..Outcome::default()
        })
    };
    let first = attempt();
    if !first.stopped_early || first.failed() > 0 {
        return first;
    }
    let why = format!(
        "{} (in {}); last console lines: {}",
        first.problem.as_deref().unwrap_or("stopped early"),
        first.unfinished.join(", "),
        first.console_tail.join(" | ")
    );
    println!("xtask: vm-test: {series}: booting again: {why}");
    if let Some(log) = &first.log {
        let _ = fs::rename(log, dir.join("console-first.log"));
    }
    let mut second = attempt();
    second.retried_after = Some(why);
    second
}

/// Whether the VM stopped before its `done` line, and how: the problem to report, and whether
/// the guest kernel said nothing of a crash (the one case booted again).
fn early_stop(console: &str, qemu_status: &str) -> Option<(String, bool)> {
    if console.contains(&format!("{MARK} done")) {
        return None;
    }
    Some(match KERNEL_CRASH.iter().find(|c| console.contains(*c)) {
        Some(crash) => (
            format!("the guest kernel crashed (\"{crash}\" on the console; qemu {qemu_status})"),
            false,
        ),
        None => (
            format!(
                "the VM stopped before its tests finished, no kernel crash on the console \
                 (qemu {qemu_status})"
            ),
            true,
        ),
    })
}

/// The last `count` console lines that are not the tests' JSON events.
pub(crate) fn console_tail(console: &str, count: usize) -> Vec<String> {
    let mut tail: Vec<String> = console
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('{'))
        .rev()
        .take(count)
        .map(str::to_owned)
        .collect();
    tail.reverse();
    tail
}

/// Boots `vmlinuz` with the initramfs, keeps the console in `dir/console.log`, and parses it.
fn boot(series: &str, vmlinuz: &Path, initramfs: &Path, dir: &Path) -> anyhow::Result<Outcome> {
    fs::create_dir_all(dir)?;
    let log_path = dir.join("console.log");
    let started = Instant::now();
    println!("xtask: vm-test: {series}: booting {}", vmlinuz.display());
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "1024"])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        // `quiet`: kernel warnings (an OOM kill's report) would break the tests' JSON lines.
        .args(["-append", "console=ttyS0 panic=-1 quiet loglevel=3"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting qemu-system-x86_64 (Debian package qemu-system-x86)")?;
    let console = watch_console(&mut qemu, &log_path, started + VM_DEADLINE)?;
    let (console, timed_out, status) = (console.text, console.timed_out, console.status);
    let mut outcome = parse(&console);
    outcome.kernel = series.to_owned();
    outcome.log = Some(log_path);
    outcome.seconds = started.elapsed().as_secs();
    outcome.console_tail = console_tail(&console, 15);
    if timed_out {
        outcome.problem = Some(format!(
            "no power-off within {} s; killed{}",
            VM_DEADLINE.as_secs(),
            match outcome.unfinished.first() {
                Some(test) => format!(" while in {test}"),
                None => String::new(),
            }
        ));
    } else if let Some((problem, early)) = early_stop(&console, &status.to_string()) {
        outcome.problem = Some(problem);
        outcome.stopped_early = early;
    }
    for line in console.lines() {
        if let Some(problem) = line
            .split_once(&format!("{MARK} problem: "))
            .map(|(_, p)| p)
        {
            outcome.problem.get_or_insert_with(|| problem.to_owned());
        }
    }
    Ok(outcome)
}

/// What a VM wrote on its serial console, and how it ended.
pub(crate) struct Console {
    pub text: String,
    /// The deadline passed and qemu was killed.
    pub timed_out: bool,
    pub status: std::process::ExitStatus,
}

/// Keeps qemu's console (its stdout, and its stderr as `qemu: ` lines) in `log_path` line by
/// line as it comes, so a hung VM's log says where it hung; kills qemu at `deadline`.
pub(crate) fn watch_console(
    qemu: &mut std::process::Child,
    log_path: &Path,
    deadline: Instant,
) -> anyhow::Result<Console> {
    let stdout = qemu
        .stdout
        .take()
        .ok_or_else(|| anyhow!("qemu has no stdout"))?;
    let stderr = qemu
        .stderr
        .take()
        .ok_or_else(|| anyhow!("qemu has no stderr"))?;
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    let err_tx = lines_tx.clone();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = err_tx.send(format!("qemu: {line}"));
        }
    });
    let mut log = fs::File::create(log_path)?;
    let mut text = String::new();
    let mut timed_out = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines_rx.recv_timeout(left) {
            Ok(line) => {
                writeln!(log, "{line}")?;
                text.push_str(&line);
                text.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                let _ = qemu.kill();
                break;
            }
        }
    }
    let status = qemu.wait()?;
    Ok(Console {
        text,
        timed_out,
        status,
    })
}

/// Reads libtest's JSON events and the `swiftlet-vm-report` lines out of a console or stdout.
fn parse(output: &str) -> Outcome {
    let mut outcome = Outcome::default();
    let mut started: Vec<String> = Vec::new();
    for line in output.lines() {
        if let Some(release) = line.split_once(&format!("{MARK} release ")).map(|(_, r)| r) {
            outcome.release = release.trim().to_owned();
        }
        // A kernel message may share the serial line; the event starts at its brace.
        let Some(event) = line
            .find('{')
            .and_then(|at| serde_json::from_str::<Value>(&line[at..]).ok())
        else {
            continue;
        };
        if event["type"] != "test" {
            continue;
        }
        let name = event["name"].as_str().unwrap_or_default().to_owned();
        let stdout = event["stdout"].as_str().unwrap_or_default();
        match event["event"].as_str().unwrap_or_default() {
            "started" => started.push(name),
            "ok" => {
                started.retain(|n| *n != name);
                outcome.results.insert(name, true);
            }
            "failed" | "timeout" => {
                started.retain(|n| *n != name);
                outcome.failures.insert(name.clone(), stdout.to_owned());
                outcome.results.insert(name, false);
            }
            _ => {}
        }
        outcome.reports.extend(
            stdout
                .lines()
                .filter_map(|l| l.strip_prefix("swiftlet-vm-report "))
                .map(str::to_owned),
        );
    }
    outcome.unfinished = started;
    outcome
}

fn print_report(outcomes: &[Outcome]) {
    println!("\nxtask: kernel matrix");
    println!(
        "{:<8} {:<34} {:>6} {:>6} {:>7} {:>6}  result",
        "kernel", "release", "passed", "failed", "not run", "secs"
    );
    for o in outcomes {
        let not_run = if o.kernel == "host" {
            0
        } else {
            NOT_IN_VMS.len()
        };
        println!(
            "{:<8} {:<34} {:>6} {:>6} {:>7} {:>6}  {}",
            o.kernel,
            o.release,
            o.passed(),
            o.failed(),
            not_run,
            o.seconds,
            if o.ok() { "ok" } else { "FAILED" }
        );
    }
    for o in outcomes {
        println!("\n[{}] {}", o.kernel, o.release);
        for report in &o.reports {
            println!("  {report}");
        }
        if let Some(first) = &o.retried_after {
            println!("  booted twice; the first boot: {first}");
        }
        if let Some(problem) = &o.problem {
            println!("  problem: {problem}");
            println!("  last console lines:");
            for line in &o.console_tail {
                println!("    {line}");
            }
        }
        for test in &o.unfinished {
            println!("  unfinished: {test}");
        }
        for (test, output) in &o.failures {
            println!("  FAILED {test}:");
            for line in output.lines().take(40) {
                println!("    {line}");
            }
        }
        if !o.ok()
            && let Some(log) = &o.log
        {
            println!("  console log: {}", log.display());
        }
    }
    if outcomes.iter().any(|o| o.kernel != "host") {
        println!("\nnot run in the VMs (they run on the host):");
        for (test, why) in NOT_IN_VMS {
            println!("  {test}: {why}");
        }
    }
    println!();
}

fn write_json(path: &Path, outcomes: &[Outcome]) -> anyhow::Result<()> {
    let kernels: Vec<Value> = outcomes
        .iter()
        .map(|o| {
            json!({
                "kernel": o.kernel,
                "release": o.release,
                "ok": o.ok(),
                "seconds": o.seconds,
                "passed": o.results.iter().filter(|(_, ok)| **ok).map(|(n, _)| n).collect::<Vec<_>>(),
                "failed": o.failures,
                "unfinished": o.unfinished,
                "not_run": if o.kernel == "host" { Vec::new() } else { NOT_IN_VMS.map(|(t, _)| t).to_vec() },
                "reports": o.reports,
                "problem": o.problem,
                "retried_after": o.retried_after,
                "console_tail": o.console_tail,
                "console_log": o.log,
            })
        })
        .collect();
    fs::write(
        path,
        serde_json::to_string_pretty(&json!({ "kernels": kernels }))?,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_named_or_all() {
        assert_eq!(
            parse_kernels(&[]).ok(),
            Some(vec![
                Kernel::Host,
                Kernel::Series("6.1"),
                Kernel::Series("6.12")
            ])
        );
        assert_eq!(
            parse_kernels(&["6.12".into(), "host".into(), "6.12".into()]).ok(),
            Some(vec![Kernel::Series("6.12"), Kernel::Host])
        );
        let error = parse_kernels(&["5.15".into()]).err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some("--kernel 5.15: expected one of host, all, 6.1, 6.12")
        );
    }

    #[test]
    fn the_console_gives_results_reports_and_the_test_a_hang_was_in() {
        let console = "\u{1b}c swiftlet-vm: release 6.1.0-56-cloud-amd64\n\
            { \"type\": \"test\", \"event\": \"started\", \"name\": \"a\" }\n\
            {\"type\":\"test\",\"name\":\"a\",\"event\":\"ok\",\"stdout\":\"swiftlet-vm-report a: loaded 8\\n\"}\n\
            [   12.3] some kernel line {\"type\":\"test\",\"event\":\"started\",\"name\":\"b\"}\n\
            {\"type\":\"test\",\"name\":\"b\",\"event\":\"failed\",\"stdout\":\"panicked: no\\n\"}\n\
            {\"type\":\"test\",\"event\":\"started\",\"name\":\"c\"}\n";
        let outcome = parse(console);
        assert_eq!(outcome.release, "6.1.0-56-cloud-amd64");
        assert_eq!(outcome.passed(), 1);
        assert_eq!(outcome.failed(), 1);
        assert_eq!(outcome.reports, vec!["a: loaded 8".to_owned()]);
        assert_eq!(outcome.unfinished, vec!["c".to_owned()]);
        assert_eq!(
            outcome.failures.get("b").map(String::as_str),
            Some("panicked: no\n")
        );
        assert!(!outcome.ok());
    }

    #[test]
    fn only_a_stop_the_kernel_does_not_explain_is_booted_again() {
        let finished = "swiftlet-vm: end sched_audit 0\nswiftlet-vm: done\n";
        assert_eq!(early_stop(finished, "exit status: 0"), None);
        let reset = "swiftlet-vm: begin sched_audit\n{\"type\":\"test\",\"event\":\"started\",\"name\":\"x\"}\n";
        assert!(early_stop(reset, "exit status: 0").is_some_and(|(_, again)| again));
        let panic =
            "swiftlet-vm: begin sched_audit\n[ 9.1] Kernel panic - not syncing: Fatal exception\n";
        let (problem, again) = early_stop(panic, "exit status: 0").unwrap_or_default();
        assert!(!again);
        assert!(problem.contains("Kernel panic"), "{problem}");
        assert_eq!(
            console_tail(reset, 5),
            vec!["swiftlet-vm: begin sched_audit".to_owned()]
        );
        assert_eq!(console_tail(panic, 1).len(), 1);
    }

    #[test]
    fn the_init_runs_every_binary_and_skips_what_cannot_run_in_a_vm() {
        let script = init_script(&[("kernel_events".into(), PathBuf::from("/x"))]);
        assert!(script.contains("mount -t cgroup2 cgroup2 /sys/fs/cgroup"));
        assert!(script.contains("/t/deps/kernel_events --test-threads=1"));
        for (test, _) in NOT_IN_VMS {
            assert!(script.contains(&format!("--skip {test}")), "{test}");
        }
        assert!(script.ends_with("poweroff -f\n"));
    }
}
