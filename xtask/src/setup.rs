//! Making a fresh machine ready to build swiftlet, saying what is done at each step; a second run
//! only checks. Needs: Debian packages (protoc, promtool, and the container runtime with what its
//! local images are built from), the `rust-src` component (the eBPF programs build `core` for the
//! BPF target), and `bpf-linker` built against this rustc's own LLVM into `.tools/` (no system
//! LLVM needed); for the fuzz targets, a nightly toolchain (sanitizers and libFuzzer's coverage
//! instrumentation are unstable) and `cargo-fuzz` into `.tools/`.

use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, bail};

use crate::sh;

/// Debian packages and why each is needed.
pub const DEBIAN_PACKAGES: &[(&str, &str, &str)] = &[
    // (package, a command or absolute file it provides, why)
    ("protobuf-compiler", "protoc", "generating the gRPC code"),
    (
        "prometheus",
        "promtool",
        "checking the /metrics exposition in the tests",
    ),
    (
        "containerd",
        "containerd",
        "the private container runtime that `cargo xtask run` and the tests start",
    ),
    (
        "runc",
        "runc",
        "the OCI runtime that containerd's shim starts containers with",
    ),
    (
        "libyajl-dev",
        "/usr/include/yajl/yajl_tree.h",
        "building crun (the private containerd's `crun` handler) from Debian trixie's source",
    ),
    (
        "libseccomp-dev",
        "/usr/include/seccomp.h",
        "building crun: seccomp filters",
    ),
    (
        "libcap-dev",
        "/usr/include/sys/capability.h",
        "building crun: capabilities",
    ),
    (
        "libsystemd-dev",
        "/usr/include/systemd/sd-bus.h",
        "building crun: its systemd cgroup driver",
    ),
    (
        "pkg-config",
        "pkg-config",
        "building crun: finding its libraries",
    ),
    ("make", "make", "building crun"),
    (
        "containernetworking-plugins",
        "/usr/lib/cni/bridge",
        "the CNI plugins (bridge, host-local, portmap, loopback) of the pods' network",
    ),
    (
        "busybox-static",
        "/bin/busybox",
        "the static busybox of the local busybox image (it replaces the package busybox)",
    ),
    (
        "gcc",
        "gcc",
        "compiling the pause program of the local sandbox image",
    ),
    (
        "qemu-system-x86",
        "qemu-system-x86_64",
        "booting the kernel matrix's kernels (`cargo xtask vm-test`)",
    ),
    ("cpio", "cpio", "packing the kernel matrix's initramfs"),
    (
        "debootstrap",
        "debootstrap",
        "building the node VM's Debian root filesystem (`cargo xtask node-vm`)",
    ),
    (
        "qemu-utils",
        "qemu-img",
        "the node VM's copy-on-write disk over its cached image",
    ),
    (
        "binutils",
        "objcopy",
        "stripping the test binaries that go into the kernel matrix's initramfs",
    ),
    (
        "libc6-dev",
        "/usr/include/signal.h",
        "the C headers and static libc that `gcc -static` links the pause program with",
    ),
    (
        "docker-registry",
        "/usr/bin/docker-registry",
        "the image registry (distribution 2.8) on loopback that the tests pull images from",
    ),
];

pub const BPF_LINKER_VERSION: &str = "0.13.0";
/// Works with the nightly 1.97 (2026-05-19) these machines have; newer cargo-fuzz releases may
/// need a newer nightly.
pub const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// What building and testing swiftlet needs, but the fuzz tools (see [`fuzz_tools`]).
pub fn ensure() -> anyhow::Result<()> {
    debian_packages()?;
    rust_src()?;
    bpf_linker()?;
    Ok(())
}

/// The fuzz targets' tools, installed here and now (`cargo xtask setup`, `cargo xtask fuzz`);
/// `cargo xtask test` installs them with its background fuzz build instead.
pub fn fuzz_tools() -> anyhow::Result<()> {
    for (what, install) in fuzz_tool_installs() {
        println!("xtask: setup: {what}");
        sh::run(&mut { install })?;
    }
    Ok(())
}

fn debian_packages() -> anyhow::Result<()> {
    let installed = |package: &str| {
        sh::output(std::process::Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
            .is_some_and(|status| status.contains("install ok installed"))
    };
    let has_dpkg = sh::output(std::process::Command::new("dpkg-query").arg("--version")).is_some();
    let missing: Vec<&(&str, &str, &str)> = DEBIAN_PACKAGES
        .iter()
        .filter(|(package, command, _)| {
            if has_dpkg {
                !installed(package)
            } else if command.starts_with('/') {
                !Path::new(command).exists()
            } else {
                sh::output(std::process::Command::new("which").arg(command)).is_none()
            }
        })
        .collect();
    if missing.is_empty() {
        println!("xtask: setup: Debian packages present");
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|(p, _, _)| *p).collect();
    for (package, _, why) in &missing {
        println!("xtask: setup: need {package} ({why})");
    }
    if !has_dpkg {
        bail!(
            "this is not a Debian-like system: install the equivalents of {} yourself",
            names.join(" ")
        );
    }
    if !sh::is_root() {
        bail!(
            "missing Debian packages; install them as root:\n  sudo apt-get update && sudo \
             apt-get install -y {}",
            names.join(" ")
        );
    }
    println!("xtask: setup: installing {}", names.join(" "));
    sh::run(std::process::Command::new("apt-get").args(["update", "-qq"]))?;
    sh::run(
        std::process::Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&names)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn rust_src() -> anyhow::Result<()> {
    let installed =
        sh::output(std::process::Command::new("rustup").args(["component", "list", "--installed"]))
            .context("rustup is needed (the eBPF build uses the toolchain's rust-src)")?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        println!("xtask: setup: rust-src present");
        return Ok(());
    }
    println!("xtask: setup: adding the rust-src component (the eBPF programs build core from it)");
    sh::run(std::process::Command::new("rustup").args(["component", "add", "rust-src"]))
}

/// The commands that install what the fuzz build lacks, each with what it does: the nightly
/// toolchain (sanitizers and libFuzzer's instrumentation are unstable; the eBPF programs do not
/// need it, build.rs leaves them out of a fuzz build) and cargo-fuzz, pinned, into `.tools/bin`
/// (on PATH for every command xtask runs). Empty when both are there.
pub fn fuzz_tool_installs() -> Vec<(String, Command)> {
    let mut installs = Vec::new();
    match sh::output(Command::new("rustup").args(["run", "nightly", "rustc", "-V"])) {
        Some(v) => println!("xtask: setup: nightly toolchain present ({})", v.trim()),
        None => {
            let mut rustup = Command::new("rustup");
            rustup.args(["toolchain", "install", "nightly", "--profile", "minimal"]);
            installs.push((
                "installing the nightly toolchain (the fuzz targets build with it)".to_owned(),
                rustup,
            ));
        }
    }
    let tools = sh::tools_dir();
    let binary = tools.join("bin").join("cargo-fuzz");
    if sh::output(Command::new(&binary).arg("--version"))
        .is_some_and(|v| v.split_whitespace().nth(1) == Some(CARGO_FUZZ_VERSION))
    {
        println!(
            "xtask: setup: cargo-fuzz {CARGO_FUZZ_VERSION} present in {}",
            tools.display()
        );
    } else {
        let mut cargo = Command::new("cargo");
        cargo
            .args(["install", "cargo-fuzz", "--locked", "--force", "--version"])
            .arg(CARGO_FUZZ_VERSION)
            .arg("--root")
            .arg(&tools);
        installs.push((
            format!(
                "building cargo-fuzz {CARGO_FUZZ_VERSION} into {} (about a minute)",
                tools.display()
            ),
            cargo,
        ));
    }
    installs
}

/// bpf-linker links against LLVM; it is built against the very libLLVM this rustc ships, so its
/// LLVM always matches the compiler's (a mismatch breaks the link of the eBPF object).
fn bpf_linker() -> anyhow::Result<()> {
    let tools = sh::tools_dir();
    let linker = tools.join("bin").join("bpf-linker");
    let stamp_path = tools.join("bpf-linker.stamp");
    let rustc = sh::output(std::process::Command::new("rustc").arg("-vV"))
        .context("cannot run rustc -vV")?;
    let stamp = format!("bpf-linker {BPF_LINKER_VERSION}\n{rustc}");
    let works = sh::output(std::process::Command::new(&linker).arg("--version"))
        .is_some_and(|v| v.contains(BPF_LINKER_VERSION));
    if works && fs::read_to_string(&stamp_path).ok().as_deref() == Some(stamp.as_str()) {
        println!(
            "xtask: setup: bpf-linker {BPF_LINKER_VERSION} present in {}",
            tools.display()
        );
        return Ok(());
    }
    let llvm_major = rustc
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("rustc -vV does not say its LLVM version")?
        .to_owned();
    let sysroot = sh::output(std::process::Command::new("rustc").args(["--print", "sysroot"]))
        .context("cannot run rustc --print sysroot")?;
    let sysroot_lib = Path::new(sysroot.trim()).join("lib");
    let libllvm = fs::read_dir(&sysroot_lib)
        .with_context(|| format!("reading {}", sysroot_lib.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        })
        .with_context(|| format!("no libLLVM in {}", sysroot_lib.display()))?;
    println!(
        "xtask: setup: building bpf-linker {BPF_LINKER_VERSION} against this rustc's LLVM \
         {llvm_major} ({}); takes about a minute",
        libllvm.display()
    );
    // cargo install's llvm-sys looks for <prefix>/lib/libLLVM.so.
    let prefix = tools.join("llvm");
    let prefix_lib = prefix.join("lib");
    fs::create_dir_all(&prefix_lib)?;
    let link = prefix_lib.join("libLLVM.so");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&libllvm, &link)
        .with_context(|| format!("linking {} to {}", link.display(), libllvm.display()))?;
    sh::run(
        std::process::Command::new("cargo")
            .args(["install", "bpf-linker", "--locked", "--force", "--version"])
            .arg(BPF_LINKER_VERSION)
            .args(["--no-default-features", "--features"])
            .arg(format!("llvm-{llvm_major}"))
            .arg("--root")
            .arg(&tools)
            .env("LLVM_PREFIX", &prefix)
            // Find the toolchain's libLLVM at run time without LD_LIBRARY_PATH.
            .env(
                "RUSTFLAGS",
                format!("-C link-arg=-Wl,-rpath,{}", sysroot_lib.display()),
            ),
    )?;
    fs::write(&stamp_path, stamp)?;
    Ok(())
}
