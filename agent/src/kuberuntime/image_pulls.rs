//! The node-wide limits on image pulls and their metrics: how many pulls run at once
//! (`serializeImagePulls`, `maxParallelImagePulls`), how often a pull may start
//! (`registryPullQPS`, `registryBurst`), and how long pulls take
//! (`kubelet_image_pull_duration_seconds`).
//!
//! Upstream (`pkg/kubelet/images/puller.go`): the serial puller is one worker node-wide fed by a
//! channel of 10 requests whose senders block when it is full; the parallel puller runs every
//! pull at once, or at most `maxParallelImagePulls` with a channel of tokens. Here both are one
//! FIFO semaphore (1 slot, `maxParallelImagePulls` slots, or none): the waiters are the pod
//! workers' own syncs, each pod's at most one pull at a time, so the queue is bounded by the pods
//! the node admitted (`maxPods`) as upstream's blocked senders are, with no buffer of its own; a
//! sync that is dropped while waiting leaves the queue at once (upstream's queued request is
//! still pulled). The rate limit is upstream's `throttleImagePulling` (`images/helpers.go`): a
//! token bucket of `registryBurst` tokens refilled at `registryPullQPS` a second, asked with
//! `TryAccept` once the pull has its slot; without a token the pull fails at once with
//! "pull QPS exceeded." and the pod backs off as after any failed pull. The histogram's buckets
//! and its `image_size_in_bytes` label are upstream's (`pkg/kubelet/metrics/metrics.go`,
//! `GetImageSizeBucket`).
//!
//! Not here: whether to pull, credentials, events and back-off (`images.rs`).

use std::{num::NonZeroU32, sync::Arc};

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntGauge, Registry};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use crate::lock::MutexExt as _;

/// How pulls are limited node-wide, as configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PullLimits {
    /// One pull at a time (`serializeImagePulls`).
    pub serialize: bool,
    /// With `serialize` false, the most pulls at once (`maxParallelImagePulls`); `None` for no
    /// limit.
    pub max_parallel: Option<NonZeroU32>,
    /// Pulls a second (`registryPullQPS`); 0 for no rate limit.
    pub qps: u32,
    /// Pulls that may start at once above `qps` (`registryBurst`).
    pub burst: u32,
}

impl Default for PullLimits {
    /// Upstream's defaults (`SetDefaults_KubeletConfiguration`).
    fn default() -> Self {
        PullLimits {
            serialize: true,
            max_parallel: None,
            qps: 5,
            burst: 10,
        }
    }
}

impl PullLimits {
    /// How many pulls may run at once; `None` for no limit.
    pub fn slots(&self) -> Option<u32> {
        if self.serialize {
            Some(1)
        } else {
            self.max_parallel.map(NonZeroU32::get)
        }
    }
}

/// Upstream's error when the token bucket is empty (`throttledImageService.PullImage`).
pub const PULL_QPS_EXCEEDED: &str = "pull QPS exceeded.";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PullGateError {
    #[error("pull QPS exceeded.")]
    QpsExceeded,
}

/// A token bucket (`golang.org/x/time/rate`'s `Allow`, behind client-go's
/// `NewTokenBucketRateLimiter`): full at start, refilled continuously at `rate` a second up to
/// `burst`.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(qps: u32, burst: u32, now: Instant) -> Self {
        TokenBucket {
            rate: f64::from(qps),
            burst: f64::from(burst),
            tokens: f64::from(burst),
            last: now,
        }
    }

    /// Takes a token if there is one.
    pub fn try_accept(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        if now > self.last {
            self.last = now;
        }
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The pull metrics, registered once.
#[derive(Clone)]
pub struct ImagePullMetrics {
    /// `kubelet_image_pull_duration_seconds{image_size_in_bytes}`: from the decision to pull to
    /// the image being there, waiting included (as upstream observes it).
    pub duration: HistogramVec,
    /// `swiftlet_image_pulls_in_flight`: pulls running now.
    pub in_flight: IntGauge,
    /// `swiftlet_image_pulls_waiting`: pulls waiting for a slot now (the serial queue's length).
    pub waiting: IntGauge,
    /// `swiftlet_image_pull_concurrency`: the pulls running (this one included) each time a pull
    /// starts; its maximum is the node's largest overlap of pulls.
    pub concurrency: Histogram,
}

/// Upstream's `imagePullDurationBuckets`.
const DURATION_BUCKETS: [f64; 18] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
];

impl ImagePullMetrics {
    pub fn register(registry: &Registry) -> Result<ImagePullMetrics, prometheus::Error> {
        let metrics = Self::unregistered()?;
        registry.register(Box::new(metrics.duration.clone()))?;
        registry.register(Box::new(metrics.in_flight.clone()))?;
        registry.register(Box::new(metrics.waiting.clone()))?;
        registry.register(Box::new(metrics.concurrency.clone()))?;
        Ok(metrics)
    }

    /// Metrics nobody reads (unit tests, and a manager built without a registry).
    pub fn unregistered() -> Result<ImagePullMetrics, prometheus::Error> {
        Ok(ImagePullMetrics {
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "kubelet_image_pull_duration_seconds",
                    "Duration in seconds to pull an image.",
                )
                .buckets(DURATION_BUCKETS.to_vec()),
                &["image_size_in_bytes"],
            )?,
            in_flight: IntGauge::new(
                "swiftlet_image_pulls_in_flight",
                "Image pulls running now (node-wide, after serializeImagePulls and \
                 maxParallelImagePulls).",
            )?,
            waiting: IntGauge::new(
                "swiftlet_image_pulls_waiting",
                "Image pulls waiting for serializeImagePulls or maxParallelImagePulls to let \
                 them start.",
            )?,
            concurrency: Histogram::with_opts(
                HistogramOpts::new(
                    "swiftlet_image_pull_concurrency",
                    "Image pulls running, the starting one included, each time a pull starts.",
                )
                .buckets(vec![1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0]),
            )?,
        })
    }
}

/// Upstream's `GetImageSizeBucket`: the size class of a pulled image, `N/A` when its size is
/// unknown (0).
pub fn image_size_bucket(size: u64) -> &'static str {
    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;
    const BUCKETS: [(u64, &str); 12] = [
        (0, "0-10MB"),
        (10 * MIB, "10MB-100MB"),
        (100 * MIB, "100MB-500MB"),
        (500 * MIB, "500MB-1GB"),
        (GIB, "1GB-5GB"),
        (5 * GIB, "5GB-10GB"),
        (10 * GIB, "10GB-20GB"),
        (20 * GIB, "20GB-30GB"),
        (30 * GIB, "30GB-40GB"),
        (40 * GIB, "40GB-60GB"),
        (60 * GIB, "60GB-100GB"),
        (100 * GIB, "GT100GB"),
    ];
    if size == 0 {
        return "N/A";
    }
    BUCKETS
        .iter()
        .rev()
        .find(|(lower, _)| size > *lower)
        .map_or("", |(_, label)| label)
}

/// Lets pulls start as the limits allow; shared by every pod's syncs.
pub struct PullGate {
    slots: Option<Arc<Semaphore>>,
    bucket: Option<std::sync::Mutex<TokenBucket>>,
    metrics: Option<ImagePullMetrics>,
}

/// A running pull's slot; dropping it lets the next waiting pull start.
pub struct PullSlot {
    _permit: Option<OwnedSemaphorePermit>,
    in_flight: Option<IntGauge>,
}

impl Drop for PullSlot {
    fn drop(&mut self) {
        if let Some(gauge) = &self.in_flight {
            gauge.dec();
        }
    }
}

/// Counts a waiting pull for as long as it waits, even when its sync is dropped meanwhile.
struct Waiting<'a>(Option<&'a IntGauge>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(gauge) = self.0 {
            gauge.dec();
        }
    }
}

impl PullGate {
    pub fn new(limits: PullLimits) -> Self {
        let slots = limits.slots().map(|n| {
            let n = usize::try_from(n)
                .unwrap_or(Semaphore::MAX_PERMITS)
                .min(Semaphore::MAX_PERMITS);
            Arc::new(Semaphore::new(n))
        });
        let bucket = (limits.qps > 0).then(|| {
            std::sync::Mutex::new(TokenBucket::new(limits.qps, limits.burst, Instant::now()))
        });
        PullGate {
            slots,
            bucket,
            metrics: None,
        }
    }

    /// No limits (upstream's parallel puller without `maxParallelImagePulls`, QPS 0).
    pub fn unlimited() -> Self {
        PullGate {
            slots: None,
            bucket: None,
            metrics: None,
        }
    }

    /// Reports the gate's state and the pulls' durations to `metrics`.
    pub fn with_metrics(mut self, metrics: ImagePullMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Waits for a slot (first come, first served), then takes a token; without a token the
    /// slot is given back and the pull fails, as upstream's throttled image service fails it.
    pub async fn admit(&self) -> Result<PullSlot, PullGateError> {
        let permit = match &self.slots {
            Some(slots) => {
                let waiting = Waiting(self.metrics.as_ref().map(|m| {
                    m.waiting.inc();
                    &m.waiting
                }));
                // The semaphore is never closed, so acquiring fails never; a closed one would
                // mean no limit.
                let permit = slots.clone().acquire_owned().await.ok();
                drop(waiting);
                permit
            }
            None => None,
        };
        if let Some(bucket) = &self.bucket
            && !bucket.lock_unpoisoned().try_accept(Instant::now())
        {
            return Err(PullGateError::QpsExceeded);
        }
        let in_flight = self.metrics.as_ref().map(|m| {
            m.in_flight.inc();
            m.concurrency.observe(m.in_flight.get() as f64);
            m.in_flight.clone()
        });
        Ok(PullSlot {
            _permit: permit,
            in_flight,
        })
    }

    /// Records a finished pull: `took` from the decision to pull, waiting included, and the
    /// image's size (0 when unknown).
    pub fn observe(&self, took: std::time::Duration, size: u64) {
        if let Some(metrics) = &self.metrics {
            metrics
                .duration
                .with_label_values(&[image_size_bucket(size)])
                .observe(took.as_secs_f64());
        }
    }
}

#[cfg(test)]
mod tests;
