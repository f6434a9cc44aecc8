//! Image garbage collection (upstream `pkg/kubelet/images/image_gc_manager.go`): when the image
//! filesystem is at least `imageGCHighThresholdPercent` full, remove images no container uses —
//! least recently used first, never one first seen less than `imageMinimumGCAge` ago, never a
//! pinned one (the runtime's sandbox image) — until it is back to `imageGCLowThresholdPercent`.
//! Under disk pressure, every unused image old enough goes ([`ImageGcManager::delete_unused_images`]).
//!
//! "Used" means by any container the runtime has, running or not: an exited container can be
//! restarted, and its `previous` logs and status name its image. The records of when an image
//! was first seen and last used live in memory, as upstream's: the images present when the
//! agent starts count as first seen long ago.
//!
//! How full the image filesystem is comes from the runtime's `ImageFsInfo` (which filesystem)
//! and `statvfs` of its mountpoint (capacity and space available), injected for tests.

use crate::lock::MutexExt as _;
use std::{
    collections::{HashMap, HashSet},
    io,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use k8s_cri::v1 as cri;

use crate::cri::{ImageService, RuntimeService};

/// Upstream's default `--pod-infra-container-image`.
pub const DEFAULT_SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// Upstream `ImageGCPeriod`.
pub const IMAGE_GC_PERIOD: Duration = Duration::from_secs(300);

/// The image GC policy (`imageGCHighThresholdPercent`, `imageGCLowThresholdPercent`,
/// `imageMinimumGCAge`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageGcPolicy {
    /// At or above this usage (percent of the image filesystem) images are collected; 100
    /// disables image GC.
    pub high_threshold_percent: u8,
    /// Collection frees down to this usage; below `high_threshold_percent`.
    pub low_threshold_percent: u8,
    /// An image is kept at least this long after it was first seen.
    pub min_age: Duration,
    /// The runtime's sandbox image (`--pod-infra-container-image`): always in use. Runtimes that
    /// pin it (containerd ≥ 1.7) protect it themselves; older ones do not.
    pub sandbox_image: Option<String>,
}

impl Default for ImageGcPolicy {
    fn default() -> Self {
        ImageGcPolicy {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            min_age: Duration::from_secs(120),
            sandbox_image: Some(DEFAULT_SANDBOX_IMAGE.to_owned()),
        }
    }
}

impl ImageGcPolicy {
    pub fn enabled(&self) -> bool {
        self.high_threshold_percent < 100
    }
}

/// Capacity and free bytes of a filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity: u64,
    pub available: u64,
}

/// Reads the usage of the filesystem at a path.
pub type FsStats = Arc<dyn Fn(&Path) -> io::Result<FsUsage> + Send + Sync>;

/// `statvfs` of the path.
pub fn statvfs(path: &Path) -> io::Result<FsUsage> {
    let s = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    let frsize = s.fragment_size() as u64;
    Ok(FsUsage {
        capacity: s.blocks() as u64 * frsize,
        available: s.blocks_available() as u64 * frsize,
    })
}

#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    #[error(transparent)]
    Runtime(#[from] crate::cri::Error),
    #[error("the runtime reports no image filesystem")]
    NoImageFs,
    #[error("cannot read the usage of the image filesystem {}: {source}", path.display())]
    Stats {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid capacity 0 on image filesystem {}", path.display())]
    ZeroCapacity { path: PathBuf },
    #[error(
        "failed to garbage collect required amount of images: attempted to free {wanted} bytes, \
         but only found {freed} bytes eligible to free"
    )]
    NotEnough { wanted: u64, freed: u64 },
}

/// What the manager remembers of an image.
#[derive(Clone, Debug)]
struct ImageRecord {
    first_detected: SystemTime,
    /// `None` until a container is seen using it.
    last_used: Option<SystemTime>,
    size: u64,
    pinned: bool,
}

pub struct ImageGcManager {
    images: Arc<dyn ImageService>,
    runtime: Arc<dyn RuntimeService>,
    policy: ImageGcPolicy,
    fs_stats: FsStats,
    clock: Arc<dyn Fn() -> SystemTime + Send + Sync>,
    records: Mutex<HashMap<String, ImageRecord>>,
    /// Whether images were detected once: the images found the first time are stamped as first
    /// seen at an unknown time in the past (the epoch), as upstream, so a restart of the agent
    /// does not make every image young again.
    initialized: AtomicBool,
}

impl ImageGcManager {
    pub fn new(
        images: Arc<dyn ImageService>,
        runtime: Arc<dyn RuntimeService>,
        policy: ImageGcPolicy,
    ) -> Self {
        ImageGcManager {
            images,
            runtime,
            policy,
            fs_stats: Arc::new(statvfs),
            clock: Arc::new(SystemTime::now),
            records: Mutex::new(HashMap::new()),
            initialized: AtomicBool::new(false),
        }
    }

    /// Reads filesystem usage with `stats` (tests).
    pub fn with_fs_stats(mut self, stats: FsStats) -> Self {
        self.fs_stats = stats;
        self
    }

    /// Uses `clock` for first-seen and last-used times (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Fn() -> SystemTime + Send + Sync>) -> Self {
        self.clock = clock;
        self
    }

    pub fn policy(&self) -> &ImageGcPolicy {
        &self.policy
    }

    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<String, ImageRecord>> {
        self.records.lock_unpoisoned()
    }

    /// Records the images present and which are in use now (upstream `detectImages`); returns
    /// the ids in use.
    pub async fn detect_images(&self, now: SystemTime) -> Result<HashSet<String>, ImageGcError> {
        let images = self.images.list_images(None).await?;
        let containers = self.runtime.list_containers(None).await?;
        let in_use = images_in_use(&images, &containers, self.policy.sandbox_image.as_deref());
        let detected = if self.initialized.swap(true, Ordering::SeqCst) {
            now
        } else {
            SystemTime::UNIX_EPOCH
        };
        let mut records = self.records();
        let present: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        records.retain(|id, _| present.contains(id.as_str()));
        for image in &images {
            let record = records.entry(image.id.clone()).or_insert(ImageRecord {
                first_detected: detected,
                last_used: None,
                size: image.size,
                pinned: image.pinned,
            });
            if in_use.contains(&image.id) {
                record.last_used = Some(now);
            }
            record.size = image.size;
            record.pinned = image.pinned;
        }
        Ok(in_use)
    }

    /// One collection (upstream `GarbageCollect`): frees space if usage is at or above the high
    /// threshold. Returns the bytes freed.
    pub async fn garbage_collect(&self) -> Result<u64, ImageGcError> {
        let info = self.images.image_fs_info().await?;
        let path = info
            .image_filesystems
            .iter()
            .find_map(|fs| fs.fs_id.as_ref().map(|id| PathBuf::from(&id.mountpoint)))
            .ok_or(ImageGcError::NoImageFs)?;
        let usage = (self.fs_stats)(&path).map_err(|source| ImageGcError::Stats {
            path: path.clone(),
            source,
        })?;
        let Some(wanted) = bytes_to_free(&self.policy, usage) else {
            if usage.capacity == 0 {
                return Err(ImageGcError::ZeroCapacity { path });
            }
            // Below the threshold: only keep the records fresh.
            self.detect_images((self.clock)()).await?;
            return Ok(0);
        };
        tracing::info!(
            path = %path.display(),
            capacity = usage.capacity,
            available = usage.available,
            wanted,
            "image filesystem usage is over the high threshold: removing unused images"
        );
        let freed = self.free_space(wanted, (self.clock)()).await?;
        if freed < wanted {
            return Err(ImageGcError::NotEnough { wanted, freed });
        }
        Ok(freed)
    }

    /// Removes every unused image old enough (upstream `DeleteUnusedImages`, the eviction
    /// manager's reclaim under disk pressure). Returns the bytes freed.
    pub async fn delete_unused_images(&self) -> Result<u64, ImageGcError> {
        self.free_space(u64::MAX, (self.clock)()).await
    }

    /// Removes unused images, least recently used first, until `wanted` bytes are freed.
    async fn free_space(&self, wanted: u64, now: SystemTime) -> Result<u64, ImageGcError> {
        let in_use = self.detect_images(now).await?;
        let mut candidates: Vec<(String, ImageRecord)> = self
            .records()
            .iter()
            .filter(|(id, r)| !in_use.contains(*id) && !r.pinned)
            .map(|(id, r)| (id.clone(), r.clone()))
            .collect();
        candidates.sort_by(|(a_id, a), (b_id, b)| {
            (a.last_used, a.first_detected, a_id).cmp(&(b.last_used, b.first_detected, b_id))
        });
        let mut freed = 0u64;
        for (id, record) in candidates {
            if freed >= wanted {
                break;
            }
            let age = now
                .duration_since(record.first_detected)
                .unwrap_or_default();
            if age < self.policy.min_age {
                tracing::debug!(
                    image = id,
                    ?age,
                    "image GC: image is younger than imageMinimumGCAge; kept"
                );
                continue;
            }
            let spec = cri::ImageSpec {
                image: id.clone(),
                ..Default::default()
            };
            match self.images.remove_image(spec).await {
                Ok(()) => {
                    tracing::info!(
                        image = id,
                        size = record.size,
                        "image GC: removed an unused image"
                    );
                    freed = freed.saturating_add(record.size);
                    self.records().remove(&id);
                }
                Err(e) => {
                    tracing::warn!(image = id, error = %e, "image GC: cannot remove an image");
                }
            }
        }
        Ok(freed)
    }
}

/// The bytes to free to get from `usage` down to the low threshold, if usage is at or above the
/// high one (upstream: `usagePercent >= HighThresholdPercent`, then
/// `capacity * (100 - LowThresholdPercent) / 100 - available`).
pub fn bytes_to_free(policy: &ImageGcPolicy, usage: FsUsage) -> Option<u64> {
    if usage.capacity == 0 {
        return None;
    }
    let available = usage.available.min(usage.capacity);
    let used_percent = 100 - (u128::from(available) * 100 / u128::from(usage.capacity)) as u64;
    if used_percent < u64::from(policy.high_threshold_percent) {
        return None;
    }
    let target_available =
        u128::from(usage.capacity) * u128::from(100 - policy.low_threshold_percent.min(100)) / 100;
    let wanted = target_available.saturating_sub(u128::from(available));
    Some(u64::try_from(wanted).unwrap_or(u64::MAX))
}

/// Ids of the images any container uses (its resolved image, or an image it names by tag,
/// digest or id), and of the sandbox image.
pub fn images_in_use(
    images: &[cri::Image],
    containers: &[cri::Container],
    sandbox_image: Option<&str>,
) -> HashSet<String> {
    let mut named: HashSet<&str> = sandbox_image.into_iter().collect();
    for c in containers {
        named.insert(c.image_ref.as_str());
        named.insert(c.image_id.as_str());
        if let Some(spec) = &c.image {
            named.insert(spec.image.as_str());
        }
    }
    named.remove("");
    images
        .iter()
        .filter(|i| {
            named.contains(i.id.as_str())
                || i.repo_tags.iter().any(|t| named.contains(t.as_str()))
                || i.repo_digests.iter().any(|d| named.contains(d.as_str()))
        })
        .map(|i| i.id.clone())
        .collect()
}

#[cfg(test)]
mod tests;
