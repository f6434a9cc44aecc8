//! The CPU manager's checkpoint, `cpu_manager_state` in the root dir, in upstream's shape
//! (`CPUManagerCheckpointV2`): the policy's name, the shared pool (`defaultCpuSet`), the
//! exclusive assignments by pod UID and container name, and a checksum. It is written atomically
//! (a temporary file renamed over it) after every change, and read back at start: a corrupt file
//! or one written under another policy is an error that names the file and says how to recover,
//! never silently replaced (upstream: "please drain this node and delete the CPU manager
//! checkpoint file").
//!
//! The checksum is FNV-1a (32 bits) over the checkpoint's JSON without the checksum, keys in
//! order. Upstream hashes Go's `spew` rendering of the struct instead, which nothing outside Go
//! reproduces; a kubelet's checkpoint is therefore reported as corrupt here, by design, rather
//! than trusted unchecked.
//!
//! Not here: what the assignments are (the policy). Upstream:
//! `pkg/kubelet/cm/cpumanager/state/checkpoint.go`, `state_checkpoint.go`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::cpuset::CpuSet;

/// The file's name in the root dir (upstream `cpuManagerStateFileName`).
pub const FILE_NAME: &str = "cpu_manager_state";

/// What the CPU manager remembers across restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignments {
    pub policy: String,
    /// The shared pool: every CPU not assigned exclusively (nor reserved away from pods).
    pub default_set: CpuSet,
    /// Exclusive CPUs by pod UID, then container name.
    pub entries: BTreeMap<String, BTreeMap<String, CpuSet>>,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("reading the CPU manager checkpoint {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the CPU manager checkpoint {} is corrupt ({reason}); drain this node, delete the file and \
         start swiftlet again",
        path.display()
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "the CPU manager checkpoint {} was written under policy {checkpoint:?} but swiftlet is \
         configured with {configured:?}; drain this node, delete the file and start swiftlet again",
        path.display()
    )]
    PolicyMismatch {
        path: PathBuf,
        configured: String,
        checkpoint: String,
    },
    #[error("writing the CPU manager checkpoint {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The file as written (upstream's field names).
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Checkpoint {
    policy_name: String,
    default_cpu_set: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: BTreeMap<String, BTreeMap<String, String>>,
    #[serde(default)]
    checksum: u32,
}

impl Checkpoint {
    fn of(a: &Assignments) -> Checkpoint {
        let mut cp = Checkpoint {
            policy_name: a.policy.clone(),
            default_cpu_set: a.default_set.to_string(),
            entries: a
                .entries
                .iter()
                .map(|(pod, containers)| {
                    let containers = containers
                        .iter()
                        .map(|(name, set)| (name.clone(), set.to_string()))
                        .collect();
                    (pod.clone(), containers)
                })
                .collect(),
            checksum: 0,
        };
        cp.checksum = cp.compute_checksum();
        cp
    }

    /// FNV-1a over the JSON of everything but the checksum.
    fn compute_checksum(&self) -> u32 {
        let body = serde_json::json!({
            "policyName": self.policy_name,
            "defaultCpuSet": self.default_cpu_set,
            "entries": self.entries,
        });
        fnv1a32(body.to_string().as_bytes())
    }
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, b| {
        (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// Reads the checkpoint at `path`: `None` when there is none yet.
pub fn load(path: &Path, configured_policy: &str) -> Result<Option<Assignments>, StateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StateError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let corrupt = |reason: String| StateError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let cp: Checkpoint = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
    let expected = cp.compute_checksum();
    if cp.checksum != expected {
        return Err(corrupt(format!(
            "checksum {} does not match its content ({expected})",
            cp.checksum
        )));
    }
    if cp.policy_name != configured_policy {
        return Err(StateError::PolicyMismatch {
            path: path.to_owned(),
            configured: configured_policy.to_owned(),
            checkpoint: cp.policy_name,
        });
    }
    let set = |text: &str| CpuSet::parse(text).map_err(|e| corrupt(e.to_string()));
    let mut entries = BTreeMap::new();
    for (pod, containers) in &cp.entries {
        let mut parsed = BTreeMap::new();
        for (name, cpus) in containers {
            parsed.insert(name.clone(), set(cpus)?);
        }
        entries.insert(pod.clone(), parsed);
    }
    Ok(Some(Assignments {
        policy: cp.policy_name.clone(),
        default_set: set(&cp.default_cpu_set)?,
        entries,
    }))
}

/// Writes `assignments` to `path` atomically.
pub fn store(path: &Path, assignments: &Assignments) -> Result<(), StateError> {
    let write = |source| StateError::Write {
        path: path.to_owned(),
        source,
    };
    let text = serde_json::to_string(&Checkpoint::of(assignments))
        .map_err(|e| write(std::io::Error::other(e)))?;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(write(std::io::Error::other("not a file path")));
    };
    // Upstream's checkpoint store writes 0600 through a temporary file and a rename.
    crate::hostfs::ensure_dir(dir, 0o750)
        .and_then(|dir| dir.replace_file(name, text.as_bytes(), 0o600))
        .map_err(|e| write(std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Assignments {
        Assignments {
            policy: "static".into(),
            default_set: CpuSet::parse("0,2-3").expect("cpuset"),
            entries: BTreeMap::from([(
                "pod-uid".to_owned(),
                BTreeMap::from([("app".to_owned(), CpuSet::parse("1").expect("cpuset"))]),
            )]),
        }
    }

    #[test]
    fn round_trips_in_upstreams_shape() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE_NAME);
        assert_eq!(load(&path, "static").expect("no file is fine"), None);
        store(&path, &sample()).expect("stored");
        let text = std::fs::read_to_string(&path).expect("read");
        let json: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(json["policyName"], "static");
        assert_eq!(json["defaultCpuSet"], "0,2-3");
        assert_eq!(json["entries"]["pod-uid"]["app"], "1");
        assert!(json["checksum"].as_u64().is_some());
        assert_eq!(load(&path, "static").expect("loads"), Some(sample()));
    }

    #[test]
    fn a_tampered_or_foreign_checkpoint_is_refused_with_the_way_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FILE_NAME);
        store(&path, &sample()).expect("stored");
        let text = std::fs::read_to_string(&path).expect("read");
        std::fs::write(&path, text.replace("\"1\"", "\"2\"")).expect("tamper");
        let err = load(&path, "static").expect_err("checksum");
        assert!(matches!(err, StateError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("delete the file"), "{err}");

        std::fs::write(&path, "{not json").expect("garbage");
        assert!(matches!(
            load(&path, "static"),
            Err(StateError::Corrupt { .. })
        ));

        store(&path, &sample()).expect("stored");
        let err = load(&path, "none").expect_err("policy");
        assert!(
            err.to_string().contains(
                "written under policy \"static\" but swiftlet is configured with \"none\""
            ),
            "{err}"
        );
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        // From the FNV specification's test vectors.
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }
}
