//! The local container images that the private containerd runs, built here because no image
//! registry is reachable: `localhost/swiftlet/busybox:latest` (Debian's static busybox and a
//! symlink per applet) and `localhost/swiftlet/pause:latest` (the sandbox process compiled from
//! `xtask/pause/pause.c`). Each is an OCI image layout tarball (`oci-layout`, `index.json`,
//! `blobs/sha256/…`) in `target/images/`, ready for `ctr images import`; importing them is
//! `containerd.rs`'s job. The bytes are deterministic (fixed owners, modes and times, sorted
//! entries, gzip without a timestamp), and an image is rebuilt only when a stamp of its inputs,
//! this file included, changes. No Docker or buildkit involved: Kubernetes' own counterpart is
//! `build/pause/Makefile`, which needs both.

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::sh;

pub const BUSYBOX: &str = "localhost/swiftlet/busybox:latest";
pub const PAUSE: &str = "localhost/swiftlet/pause:latest";

/// The busybox binary from Debian's `busybox-static` (statically linked, so the image needs no
/// libc).
const BUSYBOX_BINARY: &str = "/bin/busybox";

/// Applets the tests and examples rely on; the image gets every applet the binary has, but one of
/// these missing means a different busybox build and fails the build instead of a test later.
const REQUIRED_APPLETS: &[&str] = &[
    "sh", "sleep", "echo", "cat", "true", "false", "ls", "env", "wget", "nc", "ps", "kill",
    "mkdir", "rm", "touch", "date", "hostname", "id", "head", "tail", "grep", "yes", "dd",
];

const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// An image ready to import.
#[derive(Debug, Clone)]
pub struct Image {
    /// The full reference containerd tags it with, e.g. `localhost/swiftlet/busybox:latest`.
    pub name: &'static str,
    /// The OCI image layout tarball.
    pub tar: PathBuf,
    /// The manifest's digest (`sha256:…`): what `ctr images ls` shows once it is imported.
    pub manifest_digest: String,
}

/// Builds both images unless their tarballs are up to date.
pub fn ensure() -> anyhow::Result<Vec<Image>> {
    let dir = sh::root().join("target").join("images");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(vec![busybox(&dir)?, pause(&dir)?])
}

fn busybox(dir: &Path) -> anyhow::Result<Image> {
    let binary = fs::read(BUSYBOX_BINARY).with_context(|| {
        format!("reading {BUSYBOX_BINARY} (Debian package busybox-static; `cargo xtask setup`)")
    })?;
    ensure_static(BUSYBOX_BINARY, &binary)?;
    cached(dir, "busybox", BUSYBOX, &[&binary], || {
        let list = sh::output(Command::new(BUSYBOX_BINARY).arg("--list"))
            .with_context(|| format!("{BUSYBOX_BINARY} --list failed"))?;
        let mut applets: Vec<&str> = list
            .lines()
            .map(str::trim)
            .filter(|a| !a.is_empty() && *a != "busybox" && !a.contains('/'))
            .collect();
        applets.sort_unstable();
        applets.dedup();
        for required in REQUIRED_APPLETS {
            if !applets.contains(required) {
                bail!("{BUSYBOX_BINARY} has no `{required}` applet; the image needs it");
            }
        }
        let mut entries = base_filesystem();
        entries.push(Entry::file("bin/busybox", 0o755, binary.clone()));
        for applet in applets {
            entries.push(Entry::Symlink {
                path: format!("bin/{applet}"),
                target: "busybox".to_owned(),
            });
        }
        let config = json!({
            "Env": [PATH_ENV],
            "Cmd": ["sh"],
            "WorkingDir": "/",
        });
        Ok((entries, config))
    })
}

fn pause(dir: &Path) -> anyhow::Result<Image> {
    let source_path = sh::root().join("xtask").join("pause").join("pause.c");
    let source =
        fs::read(&source_path).with_context(|| format!("reading {}", source_path.display()))?;
    // The compiler is an input too: another gcc makes another binary.
    let gcc = sh::output(Command::new("gcc").arg("--version"))
        .context("gcc is needed to build the pause image (Debian package gcc)")?;
    let flags = ["-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror"];
    cached(
        dir,
        "pause",
        PAUSE,
        &[&source, gcc.as_bytes(), flags.join(" ").as_bytes()],
        || {
            let output = dir.join("pause.bin");
            sh::run(
                Command::new("gcc")
                    .args(flags)
                    .arg("-o")
                    .arg(&output)
                    .arg(&source_path),
            )
            .context(
                "compiling the pause program failed; static linking needs libc6-dev \
                 (`cargo xtask setup` installs it)",
            )?;
            let binary = fs::read(&output)?;
            ensure_static("the compiled pause program", &binary)?;
            let _ = fs::remove_file(&output);
            let mut entries = base_filesystem();
            entries.push(Entry::file("pause", 0o755, binary));
            let config = json!({
                "Env": [PATH_ENV],
                "Entrypoint": ["/pause"],
                "WorkingDir": "/",
            });
            Ok((entries, config))
        },
    )
}

/// Reuses `<dir>/<stem>.tar` when its stamp matches `inputs`, else builds it with `build`
/// (which returns the layer's entries and the image config's `config` object).
fn cached(
    dir: &Path,
    stem: &str,
    name: &'static str,
    inputs: &[&[u8]],
    build: impl FnOnce() -> anyhow::Result<(Vec<Entry>, serde_json::Value)>,
) -> anyhow::Result<Image> {
    let tar = dir.join(format!("{stem}.tar"));
    let stamp_path = dir.join(format!("{stem}.stamp"));
    let mut hasher = Sha256::new();
    // This file is an input: a change to how images are built rebuilds them.
    for part in [include_str!("images.rs").as_bytes(), name.as_bytes()]
        .into_iter()
        .chain(inputs.iter().copied())
    {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    let fingerprint = hex::encode(hasher.finalize());
    if let Ok(stamp) = fs::read_to_string(&stamp_path)
        && let Some((stamped, digest)) = stamp.trim().split_once(' ')
        && stamped == fingerprint
        && tar.exists()
    {
        println!("xtask: images: {name} up to date ({})", tar.display());
        return Ok(Image {
            name,
            tar,
            manifest_digest: digest.to_owned(),
        });
    }
    println!("xtask: images: building {name}");
    let (entries, config) = build()?;
    let (archive, manifest_digest) = oci_archive(name, &entries, config)?;
    write_atomically(&tar, &archive)?;
    write_atomically(
        &stamp_path,
        format!("{fingerprint} {manifest_digest}\n").as_bytes(),
    )?;
    println!(
        "xtask: images: wrote {} ({} bytes, manifest {manifest_digest})",
        tar.display(),
        archive.len()
    );
    Ok(Image {
        name,
        tar,
        manifest_digest,
    })
}

/// One entry of a layer: owned by root, dated the epoch.
enum Entry {
    Dir {
        path: String,
        mode: u32,
    },
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl Entry {
    fn dir(path: &str, mode: u32) -> Entry {
        Entry::Dir {
            path: path.to_owned(),
            mode,
        }
    }

    fn file(path: &str, mode: u32, data: Vec<u8>) -> Entry {
        Entry::File {
            path: path.to_owned(),
            mode,
            data,
        }
    }
}

/// The directories and files a container expects besides its program: mount points runc would
/// otherwise create, a world-writable /tmp, and users for `id` and `ps`.
fn base_filesystem() -> Vec<Entry> {
    let mut entries: Vec<Entry> = ["bin", "dev", "etc", "proc", "root", "sys", "var"]
        .into_iter()
        .map(|d| Entry::dir(d, 0o755))
        .collect();
    entries.push(Entry::dir("tmp", 0o1777));
    entries.push(Entry::file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
            .to_vec(),
    ));
    entries.push(Entry::file(
        "etc/group",
        0o644,
        b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
    ));
    entries
}

/// The OCI image layout tarball of a one-layer image, and its manifest's digest.
fn oci_archive(
    name: &str,
    entries: &[Entry],
    config: serde_json::Value,
) -> anyhow::Result<(Vec<u8>, String)> {
    let layer = layer_tar(entries)?;
    let diff_id = digest(&layer);
    let layer_gz = gzip(&layer)?;
    let image_config = serde_json::to_vec(&json!({
        "architecture": go_arch(),
        "os": "linux",
        "config": config,
        "rootfs": { "type": "layers", "diff_ids": [diff_id] },
        "history": [{ "created_by": "cargo xtask (xtask/src/images.rs)" }],
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", &image_config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", &layer_gz)],
    }))?;
    let manifest_digest = digest(&manifest);
    let (_, tag) = name
        .rsplit_once(':')
        .with_context(|| format!("image name {name} has no tag"))?;
    let mut manifest_descriptor =
        descriptor("application/vnd.oci.image.manifest.v1+json", &manifest);
    manifest_descriptor["platform"] = json!({ "architecture": go_arch(), "os": "linux" });
    // containerd 1.6's importer names the image after `io.containerd.image.name` when present;
    // `org.opencontainers.image.ref.name` (the tag alone, as the OCI spec has it) is what other
    // tools read, and what ctr would combine with `--base-name`.
    manifest_descriptor["annotations"] = json!({
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": tag,
    });
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_descriptor],
    }))?;

    let mut blobs = vec![
        (digest(&image_config), image_config),
        (digest(&layer_gz), layer_gz),
        (manifest_digest.clone(), manifest),
    ];
    blobs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut outer = vec![
        Entry::file(
            "oci-layout",
            0o644,
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
        ),
        Entry::file("index.json", 0o644, index),
        Entry::dir("blobs", 0o755),
        Entry::dir("blobs/sha256", 0o755),
    ];
    for (blob_digest, data) in blobs {
        let hex = blob_digest.trim_start_matches("sha256:");
        outer.push(Entry::file(&format!("blobs/sha256/{hex}"), 0o644, data));
    }
    Ok((layer_tar(&outer)?, manifest_digest))
}

fn descriptor(media_type: &str, blob: &[u8]) -> serde_json::Value {
    json!({ "mediaType": media_type, "digest": digest(blob), "size": blob.len() })
}

fn digest(blob: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(blob)))
}

/// A tar of `entries` in the given order, every header fixed (root-owned, mtime 0) so the same
/// entries always give the same bytes.
fn layer_tar(entries: &[Entry]) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_ustar();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        match entry {
            Entry::Dir { path, mode } => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(*mode);
                header.set_size(0);
                builder.append_data(&mut header, format!("{path}/"), std::io::empty())?;
            }
            Entry::File { path, mode, data } => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, path, data.as_slice())?;
            }
            Entry::Symlink { path, target } => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                builder.append_link(&mut header, path, target)?;
            }
        }
    }
    Ok(builder.into_inner()?)
}

fn gzip(data: &[u8]) -> anyhow::Result<Vec<u8>> {
    // mtime 0 and no file name: the gzip header carries nothing that changes between builds.
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    encoder.write_all(data)?;
    Ok(encoder.finish()?)
}

/// The architecture as OCI (Go) names it.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// Fails unless `elf` is a statically linked (no `PT_INTERP`) 64-bit little-endian ELF: a
/// dynamically linked program would fail in the image with a confusing "no such file".
fn ensure_static(what: &str, elf: &[u8]) -> anyhow::Result<()> {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
            .map(u64::from_le_bytes)
    };
    // ELFCLASS64, ELFDATA2LSB.
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        bail!("{what} is not a 64-bit little-endian ELF program");
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38))
    else {
        bail!("{what}: truncated ELF header");
    };
    let phoff = usize::try_from(phoff)?;
    for i in 0..usize::from(phnum) {
        let at = phoff + i * usize::from(phentsize);
        if u32_at(at) == Some(PT_INTERP) {
            bail!(
                "{what} is dynamically linked; the image needs a static one (Debian: \
                 busybox-static rather than busybox)"
            );
        }
    }
    Ok(())
}

fn write_atomically(path: &Path, data: &[u8]) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, data).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, io::Read as _};

    use super::*;

    fn entries() -> Vec<Entry> {
        let mut entries = base_filesystem();
        entries.push(Entry::file("bin/busybox", 0o755, b"not really".to_vec()));
        entries.push(Entry::Symlink {
            path: "bin/sh".to_owned(),
            target: "busybox".to_owned(),
        });
        entries
    }

    /// The archive's files by path.
    fn files(archive: &[u8]) -> HashMap<String, Vec<u8>> {
        let mut files = HashMap::new();
        for entry in tar::Archive::new(archive).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            files.insert(path, data);
        }
        files
    }

    #[test]
    fn the_same_entries_give_the_same_bytes() {
        let config = json!({ "Cmd": ["sh"] });
        let (first, first_digest) = oci_archive(BUSYBOX, &entries(), config.clone()).unwrap();
        let (second, second_digest) = oci_archive(BUSYBOX, &entries(), config).unwrap();
        assert_eq!(first_digest, second_digest);
        assert!(first == second, "archives differ");
    }

    #[test]
    fn the_archive_is_an_oci_layout_that_containerd_names() {
        let (archive, manifest_digest) =
            oci_archive(PAUSE, &entries(), json!({ "Entrypoint": ["/pause"] })).unwrap();
        let files = files(&archive);
        assert_eq!(
            files["oci-layout"],
            br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec()
        );
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let manifest_descriptor = &index["manifests"][0];
        assert_eq!(manifest_descriptor["digest"], manifest_digest.as_str());
        assert_eq!(
            manifest_descriptor["annotations"]["io.containerd.image.name"],
            PAUSE
        );
        assert_eq!(
            manifest_descriptor["annotations"]["org.opencontainers.image.ref.name"],
            "latest"
        );
        // Every blob is stored under its digest.
        for (path, data) in &files {
            if let Some(hex) = path.strip_prefix("blobs/sha256/")
                && !hex.is_empty()
            {
                assert_eq!(digest(data), format!("sha256:{hex}"), "{path}");
            }
        }
        let blob = |digest: &serde_json::Value| {
            let hex = digest.as_str().unwrap().trim_start_matches("sha256:");
            files[&format!("blobs/sha256/{hex}")].clone()
        };
        let manifest: serde_json::Value =
            serde_json::from_slice(&blob(&manifest_descriptor["digest"])).unwrap();
        let config: serde_json::Value =
            serde_json::from_slice(&blob(&manifest["config"]["digest"])).unwrap();
        assert_eq!(config["config"]["Entrypoint"][0], "/pause");
        // The config names the uncompressed layer (diff id), the manifest the gzip'd one.
        let layer_gz = blob(&manifest["layers"][0]["digest"]);
        let mut layer = Vec::new();
        flate2::read::GzDecoder::new(layer_gz.as_slice())
            .read_to_end(&mut layer)
            .unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], digest(&layer).as_str());
        let layer_files = files_of_layer(&layer);
        assert!(
            layer_files.contains(&"bin/busybox".to_owned()),
            "{layer_files:?}"
        );
        assert!(layer_files.contains(&"tmp/".to_owned()), "{layer_files:?}");
    }

    fn files_of_layer(layer: &[u8]) -> Vec<String> {
        tar::Archive::new(layer)
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect()
    }

    /// A 64-bit little-endian ELF header with one program header of type `p_type`.
    fn elf(p_type: u32) -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf[64..68].copy_from_slice(&p_type.to_le_bytes());
        elf
    }

    #[test]
    fn only_static_programs_go_into_images() {
        const PT_LOAD: u32 = 1;
        const PT_INTERP: u32 = 3;
        assert!(ensure_static("static", &elf(PT_LOAD)).is_ok());
        let error = ensure_static("dynamic", &elf(PT_INTERP)).unwrap_err();
        assert!(error.to_string().contains("dynamically linked"), "{error}");
        assert!(ensure_static("script", b"#!/bin/sh\n").is_err());
        assert!(ensure_static("truncated", &elf(PT_LOAD)[..40]).is_err());
    }
}
