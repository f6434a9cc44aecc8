//! Builds the eBPF programs (the `swiftlet-ebpf` crate) for `bpfel-unknown-none` and leaves the
//! object in OUT_DIR, where `kernel::loader` embeds it.
//!
//! The programs are built with the same toolchain as the agent: `-Z build-std=core` is enabled
//! for that one nested build with RUSTC_BOOTSTRAP, so no nightly toolchain is needed. The linker is
//! `bpf-linker`, which `cargo xtask build` installs into `<workspace>/.tools/bin`.
//!
//! The fuzz targets (`tests/fuzz`, built by cargo-fuzz with `--cfg fuzzing`) never load the
//! programs: their build leaves empty objects instead (as does `AYA_BUILD_SKIP=1`), so it needs
//! neither `bpf-linker` nor the nightly's `rust-src`, and costs no eBPF build. Loading an empty
//! object fails with aya's parse error; such a library is never shipped.

use std::{env, path::PathBuf};

/// `SWIFTLET_GIT_COMMIT` and `SWIFTLET_RUSTC_VERSION` for `swiftlet_build_info`: the commit
/// from `SWIFTLET_GIT_COMMIT` in the build's environment (a packager building from a tarball
/// knows it), else from git, else `unknown` (a tarball without `.git`); the compiler's version
/// from `$RUSTC --version`.
fn build_info() {
    println!("cargo:rerun-if-env-changed=SWIFTLET_GIT_COMMIT");
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(env::var_os("CARGO_MANIFEST_DIR")?)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
    };
    let commit = env::var("SWIFTLET_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    // A new commit moves HEAD's reflog (per worktree), so the commit is read again.
    for path in ["HEAD", "logs/HEAD"] {
        if let Some(file) = git(&["rev-parse", "--path-format=absolute", "--git-path", path]) {
            println!("cargo:rerun-if-changed={file}");
        }
    }
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let rustc_version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SWIFTLET_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=SWIFTLET_RUSTC_VERSION={rustc_version}");
}

/// The objects `kernel::loader` and `kernel::canary` embed.
const OBJECTS: [&str; 2] = ["swiftlet-ebpf", "swiftlet-ebpf-canary"];

fn main() -> anyhow::Result<()> {
    build_info();
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip || env::var_os("CARGO_CFG_FUZZING").is_some() {
        let out_dir = PathBuf::from(env::var("OUT_DIR")?);
        for object in OBJECTS {
            std::fs::write(out_dir.join(object), [])?;
        }
        return Ok(());
    }
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir
        .parent()
        .ok_or_else(|| anyhow::anyhow!("the agent crate has no parent directory"))?
        .to_path_buf();
    let tools = workspace.join(".tools").join("bin");
    let common = workspace.join("common");
    println!("cargo:rerun-if-changed={}", common.display());

    let path = env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = vec![tools.clone()];
    dirs.extend(env::split_paths(&path));
    let Some(linker) = dirs
        .iter()
        .map(|d| d.join("bpf-linker"))
        .find(|linker| linker.is_file())
    else {
        anyhow::bail!(
            "bpf-linker not found in {} or PATH: run `cargo xtask build` once, which installs it \
             (and the rest of what building swiftlet needs)",
            tools.display()
        );
    };
    // The linker itself, not its folder: cargo-fuzz is installed into the same folder while the
    // tests run, and must not make the next build redo the programs and the agent.
    println!("cargo:rerun-if-changed={}", linker.display());
    let toolchain = env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| "stable".to_owned());
    // SAFETY: build scripts are single-threaded; these only shape the nested cargo's environment.
    unsafe {
        env::set_var("PATH", env::join_paths(dirs)?);
        env::set_var("RUSTC_BOOTSTRAP", "1");
        // aya-build relays every line the nested cargo prints as a warning; keep it to errors.
        env::set_var("CARGO_TERM_QUIET", "true");
    }
    let ebpf = workspace.join("ebpf");
    let ebpf_dir = ebpf
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("non-UTF-8 path {}", ebpf.display()))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "swiftlet-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
}
