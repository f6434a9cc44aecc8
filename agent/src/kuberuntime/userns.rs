//! User namespaces of pods (upstream `pkg/kubelet/userns/userns_manager.go`): a pod with
//! `hostUsers: false` gets its own range of 65536 host ids, mapped to 0–65535 inside, for as long
//! as it exists on the node; every other pod is told to use the node's user namespace. Ranges are
//! handed out from upstream's default (host ids 65536 up to 2³²) and never overlap, so no two
//! pods share a host id.
//!
//! A pod's range must survive an agent restart (its volumes' files are owned by those ids, and a
//! second pod must never get them while it runs), so every change is written to a checkpoint,
//! `<rootDir>/userns_state` (mode 0600, replaced atomically), read back at start. Upstream keeps one
//! file per pod directory instead; one checkpoint keeps the pod directories to the volume manager.
//!
//! Whether the runtime can do it at all comes from CRI `Status` (its runtime handler's
//! `user_namespaces` feature); admission refuses a pod that needs it on a runtime without it
//! (`kubelet::security_admission`), and this manager refuses again at sandbox creation with
//! upstream's message, should the runtime have changed in between.

use crate::lock::MutexExt as _;
use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read as _, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use crate::container::{PodUid, RuntimeFeatures};

/// Ids per pod (upstream `userNsLength`).
pub const USERNS_LENGTH: u32 = 1 << 16;
/// The first host id handed out (upstream's default when the node has no `kubelet` subids).
pub const FIRST_HOST_ID: u32 = 1 << 16;
/// Ranges available: host ids `FIRST_HOST_ID` up to 2³².
const RANGES: u32 = u32::MAX / USERNS_LENGTH;
/// The checkpoint's file name below the root dir.
pub const CHECKPOINT_FILE: &str = "userns_state";
/// A checkpoint larger than this is not ours (65535 ranges take under 5 MiB).
const CHECKPOINT_MAX_BYTES: u64 = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    #[error("RuntimeClass handler {handler:?} does not support user namespaces")]
    Unsupported { handler: String },
    #[error("no free user namespace range is left for pod {pod} (all {RANGES} are in use)")]
    Exhausted { pod: PodUid },
    #[error("the user namespace checkpoint {}: {reason}", path.display())]
    Checkpoint { path: PathBuf, reason: String },
}

/// Pod → first host id of its range, as written to the checkpoint.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Checkpoint {
    /// Always [`USERNS_LENGTH`]; recorded so that a change of it is noticed.
    length: u32,
    pods: BTreeMap<String, u32>,
}

#[derive(Default)]
struct Ranges {
    by_pod: BTreeMap<PodUid, u32>,
    used: BTreeSet<u32>,
}

impl Ranges {
    fn first_free(&self) -> Option<u32> {
        (0..RANGES).find(|i| !self.used.contains(i))
    }
}

pub struct UsernsManager {
    /// `None`: no runtime feature source; every `hostUsers: false` pod is refused.
    features: Option<watch::Receiver<Option<RuntimeFeatures>>>,
    /// `None`: nothing is persisted (tests, and the refusing manager).
    checkpoint: Option<PathBuf>,
    ranges: Mutex<Ranges>,
}

impl UsernsManager {
    /// A manager for a runtime without user namespaces: every pod uses the node's.
    pub fn host_only() -> UsernsManager {
        UsernsManager {
            features: None,
            checkpoint: None,
            ranges: Mutex::new(Ranges::default()),
        }
    }

    /// A manager that asks `features` whether the runtime supports user namespaces, keeping its
    /// ranges in `<root_dir>/userns_state` (read now, if present).
    pub fn load(
        root_dir: &Path,
        features: watch::Receiver<Option<RuntimeFeatures>>,
    ) -> Result<UsernsManager, UsernsError> {
        let path = root_dir.join(CHECKPOINT_FILE);
        let ranges = read_checkpoint(&path)?;
        Ok(UsernsManager {
            features: Some(features),
            checkpoint: Some(path),
            ranges: Mutex::new(ranges),
        })
    }

    fn ranges(&self) -> MutexGuard<'_, Ranges> {
        self.ranges.lock_unpoisoned()
    }

    /// Whether the runtime's `handler` supports user namespaces, by its last `Status` answer.
    pub fn supported(&self, handler: &str) -> bool {
        self.features.as_ref().is_some_and(|f| {
            f.borrow()
                .as_ref()
                .is_some_and(|f| f.handler_supports_user_namespaces(handler))
        })
    }

    /// The user namespace of `pod`'s sandbox and containers (upstream
    /// `GetOrCreateUserNamespaceMappings`): the node's unless `hostUsers: false`, then the pod's
    /// own range, allocated and checkpointed on first use.
    pub fn mappings(
        &self,
        pod: &Pod,
        handler: &str,
    ) -> Result<Option<cri::UserNamespace>, UsernsError> {
        let host_users = pod.spec.as_ref().and_then(|s| s.host_users);
        if host_users != Some(false) {
            return Ok(Some(cri::UserNamespace {
                mode: cri::NamespaceMode::Node as i32,
                ..Default::default()
            }));
        }
        if !self.supported(handler) {
            return Err(UsernsError::Unsupported {
                handler: handler.to_owned(),
            });
        }
        let uid = PodUid(pod.metadata.uid.clone().unwrap_or_default());
        let mut ranges = self.ranges();
        let index = match ranges.by_pod.get(&uid) {
            Some(i) => *i,
            None => {
                let i = ranges
                    .first_free()
                    .ok_or_else(|| UsernsError::Exhausted { pod: uid.clone() })?;
                ranges.by_pod.insert(uid.clone(), i);
                ranges.used.insert(i);
                if let Err(e) = self.store(&ranges) {
                    ranges.by_pod.remove(&uid);
                    ranges.used.remove(&i);
                    return Err(e);
                }
                i
            }
        };
        let mapping = cri::IdMapping {
            host_id: FIRST_HOST_ID + index * USERNS_LENGTH,
            container_id: 0,
            length: USERNS_LENGTH,
        };
        Ok(Some(cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: vec![mapping],
            gids: vec![mapping],
        }))
    }

    /// Frees the ranges of pods `keep` rejects (upstream
    /// `CleanupOrphanedPodUsernsAllocations`): those no source wants and the runtime no longer
    /// runs.
    pub fn retain(&self, keep: impl Fn(&PodUid) -> bool) {
        let mut ranges = self.ranges();
        let gone: Vec<PodUid> = ranges
            .by_pod
            .keys()
            .filter(|uid| !keep(uid))
            .cloned()
            .collect();
        if gone.is_empty() {
            return;
        }
        for uid in &gone {
            if let Some(i) = ranges.by_pod.remove(uid) {
                ranges.used.remove(&i);
            }
        }
        if let Err(e) = self.store(&ranges) {
            tracing::warn!(error = %e, "cannot record freed user namespace ranges");
        }
    }

    /// How many pods hold a range.
    pub fn allocated(&self) -> usize {
        self.ranges().by_pod.len()
    }

    fn store(&self, ranges: &Ranges) -> Result<(), UsernsError> {
        let Some(path) = &self.checkpoint else {
            return Ok(());
        };
        let bad = |reason: String| UsernsError::Checkpoint {
            path: path.clone(),
            reason,
        };
        let checkpoint = Checkpoint {
            length: USERNS_LENGTH,
            pods: ranges
                .by_pod
                .iter()
                .map(|(uid, i)| (uid.0.clone(), FIRST_HOST_ID + i * USERNS_LENGTH))
                .collect(),
        };
        let text = serde_json::to_vec(&checkpoint).map_err(|e| bad(e.to_string()))?;
        let tmp = path.with_extension("tmp");
        // A stale temporary file (an earlier crash) goes first; O_EXCL and O_NOFOLLOW then
        // make sure the data lands in a fresh file of ours.
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(bad(format!("removing {}: {e}", tmp.display())));
            }
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|e| bad(format!("creating {}: {e}", tmp.display())))?;
        file.write_all(&text)
            .and_then(|()| file.sync_all())
            .map_err(|e| bad(format!("writing {}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, path).map_err(|e| bad(format!("renaming it into place: {e}")))
    }
}

fn read_checkpoint(path: &Path) -> Result<Ranges, UsernsError> {
    let bad = |reason: String| UsernsError::Checkpoint {
        path: path.to_owned(),
        reason,
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Ranges::default()),
        Err(e) => return Err(bad(format!("cannot open it: {e}"))),
    };
    let mut text = Vec::new();
    file.take(CHECKPOINT_MAX_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| bad(format!("cannot read it: {e}")))?;
    if text.len() as u64 > CHECKPOINT_MAX_BYTES {
        return Err(bad(format!("larger than {CHECKPOINT_MAX_BYTES} bytes")));
    }
    let checkpoint: Checkpoint =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not a checkpoint: {e}")))?;
    if checkpoint.length != USERNS_LENGTH {
        return Err(bad(format!(
            "written for ranges of {} ids, not {USERNS_LENGTH}",
            checkpoint.length
        )));
    }
    let mut ranges = Ranges::default();
    for (uid, host_id) in checkpoint.pods {
        let index = host_id
            .checked_sub(FIRST_HOST_ID)
            .filter(|offset| offset % USERNS_LENGTH == 0)
            .map(|offset| offset / USERNS_LENGTH)
            .filter(|i| *i < RANGES)
            .ok_or_else(|| bad(format!("pod {uid}: host id {host_id} is not a range start")))?;
        if !ranges.used.insert(index) {
            return Err(bad(format!("pod {uid}: host id {host_id} is given twice")));
        }
        ranges.by_pod.insert(PodUid(uid), index);
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests;
