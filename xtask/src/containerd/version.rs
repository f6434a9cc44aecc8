//! Which containerd the private instance runs: the system's 1.6 (Debian bookworm's package), or
//! 1.7 or 2.1 from Debian's trixie and sid suites, unpacked under `target/containerd-versions/`
//! by `fetch.rs`. This module owns the per-version facts (where the binaries are, which config
//! format the version reads, which state folder it gets) and the decision whether an unpacked
//! copy can be reused, read from the binary's `--version`. Not here: fetching (`fetch.rs`) and
//! the config's text (`config.rs`). Upstream: containerd's release matrix
//! (containerd/containerd `RELEASES.md`: config version 2 for 1.x, version 3 for 2.x).

use std::path::{Path, PathBuf};

use crate::sh;

/// A containerd release line the private instance can run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Version {
    /// The system's package (bookworm's 1.6.20), found on PATH.
    #[value(name = "1.6")]
    V1_6,
    /// Debian trixie's package (1.7.24).
    #[value(name = "1.7")]
    V1_7,
    /// Debian sid's package (2.1.9): the default, what nodes run now (Kubernetes 1.35 is the
    /// last release to support containerd 1.x).
    #[default]
    #[value(name = "2.1")]
    V2_1,
}

/// The schema of `config.toml`: 1.x reads `version = 2` (the CRI plugin is one
/// `io.containerd.grpc.v1.cri`), 2.x reads `version = 3` (the CRI plugin split into
/// `io.containerd.cri.v1.images` and `io.containerd.cri.v1.runtime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigFormat {
    V2,
    V3,
}

impl Version {
    /// Every release the private containerd runs, oldest first.
    pub const ALL: [Version; 3] = [Version::V1_6, Version::V1_7, Version::V2_1];

    /// `1.6`, `1.7`, `2.1`: what `--version`/`--containerd` take.
    pub fn label(self) -> &'static str {
        match self {
            Version::V1_6 => "1.6",
            Version::V1_7 => "1.7",
            Version::V2_1 => "2.1",
        }
    }

    /// The Debian suite its package comes from; `None` for the system's own package.
    pub fn suite(self) -> Option<&'static str> {
        match self {
            Version::V1_6 => None,
            Version::V1_7 => Some("trixie"),
            Version::V2_1 => Some("sid"),
        }
    }

    pub fn config_format(self) -> ConfigFormat {
        match self {
            Version::V1_6 | Version::V1_7 => ConfigFormat::V2,
            Version::V2_1 => ConfigFormat::V3,
        }
    }

    /// The state folder's name under `target/swiftlet-state/`: 1.6 keeps the folder it always
    /// had; the others get their own, since a newer containerd migrates the metadata database an
    /// older one then cannot read, and so that versions can run side by side.
    pub fn state_dir_name(self) -> &'static str {
        match self {
            Version::V1_6 => "containerd",
            Version::V1_7 => "containerd-1.7",
            Version::V2_1 => "containerd-2.1",
        }
    }

    /// Where `fetch.rs` unpacks this version's package (`dpkg -x`); `None` for the system's.
    pub fn unpack_dir(self) -> Option<PathBuf> {
        self.suite().map(|_| versions_dir().join(self.label()))
    }

    /// The folder holding `containerd`, `containerd-shim-runc-v2` and `ctr`; `None` means PATH.
    pub fn bin_dir(self) -> Option<PathBuf> {
        self.unpack_dir().map(|d| d.join("usr").join("bin"))
    }

    /// A program of this version: the unpacked one, or the name PATH resolves.
    pub fn program(self, name: &str) -> PathBuf {
        self.bin_dir()
            .map_or_else(|| PathBuf::from(name), |dir| dir.join(name))
    }

    /// Whether `containerd --version`'s output is a release of this line (`1.7.x`, `2.1.x`).
    pub fn matches(self, version_output: &str) -> bool {
        release_of(version_output).is_some_and(|release| {
            release
                .strip_prefix(self.label())
                .is_some_and(|rest| rest.starts_with('.'))
        })
    }
}

/// `target/containerd-versions/`: the unpacked packages, and apt's private files.
pub fn versions_dir() -> PathBuf {
    sh::root().join("target").join("containerd-versions")
}

/// The release in `containerd --version`'s output, e.g. `1.7.24~ds1` from
/// `containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1` or `2.1.9+unknown`
/// from `containerd github.com/containerd/containerd/v2 2.1.9+unknown` (upstream prints
/// `v1.7.24`; Debian drops the `v`).
pub fn release_of(version_output: &str) -> Option<&str> {
    let mut words = version_output.split_whitespace();
    if words.next()? != "containerd" {
        return None;
    }
    let release = words.nth(1)?;
    let release = release.strip_prefix('v').unwrap_or(release);
    release
        .starts_with(|c: char| c.is_ascii_digit())
        .then_some(release)
}

/// Whether the unpacked copy at `containerd` can be reused: it exists and says it is `version`.
pub fn reusable(version: Version, containerd: &Path) -> bool {
    containerd.is_file()
        && sh::output(std::process::Command::new(containerd).arg("--version"))
            .is_some_and(|out| version.matches(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Version; 3] = Version::ALL;

    #[test]
    fn the_release_is_read_from_each_packages_version_line() {
        for (output, release) in [
            (
                "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n",
                Some("1.6.20~ds1"),
            ),
            (
                "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1\n",
                Some("1.7.24~ds1"),
            ),
            (
                "containerd github.com/containerd/containerd/v2 2.1.9+unknown \n",
                Some("2.1.9+unknown"),
            ),
            (
                "containerd containerd.io v1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da\n",
                Some("1.7.27"),
            ),
            ("runc version 1.1.5\n", None),
            ("containerd github.com/containerd/containerd\n", None),
            ("", None),
        ] {
            assert_eq!(release_of(output), release, "{output:?}");
        }
    }

    #[test]
    fn a_copy_is_reused_only_for_its_own_release_line() {
        let v17 = "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1";
        let v21 = "containerd github.com/containerd/containerd/v2 2.1.9+unknown";
        let v2_10 = "containerd github.com/containerd/containerd/v2 2.10.0";
        assert!(Version::V1_7.matches(v17));
        assert!(!Version::V1_6.matches(v17));
        assert!(!Version::V2_1.matches(v17));
        assert!(Version::V2_1.matches(v21));
        assert!(!Version::V1_7.matches(v21));
        assert!(!Version::V2_1.matches(v2_10), "2.10 is not 2.1");
        assert!(!Version::V2_1.matches("garbage"));
        assert!(!reusable(
            Version::V2_1,
            Path::new("/nonexistent/containerd")
        ));
    }

    #[test]
    fn each_version_has_its_own_format_state_and_binaries() {
        assert_eq!(Version::V1_6.config_format(), ConfigFormat::V2);
        assert_eq!(Version::V1_7.config_format(), ConfigFormat::V2);
        assert_eq!(Version::V2_1.config_format(), ConfigFormat::V3);
        assert_eq!(Version::V1_6.program("ctr"), PathBuf::from("ctr"));
        assert!(Version::V2_1.program("ctr").ends_with("2.1/usr/bin/ctr"));
        let states: std::collections::HashSet<_> = ALL.iter().map(|v| v.state_dir_name()).collect();
        assert_eq!(states.len(), ALL.len());
        // 1.6 keeps the folder the tests' SWIFTLET_TEST_CONTAINERD_STATE always named.
        assert_eq!(Version::V1_6.state_dir_name(), "containerd");
        assert_eq!(Version::default(), Version::V2_1);
    }
}
