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

/// The objects `kernel::loader` and `kernel::canary` embed.
const OBJECTS: [&str; 2] = ["swiftlet-ebpf", "swiftlet-ebpf-canary"];

fn main() -> anyhow::Result<()> {
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
