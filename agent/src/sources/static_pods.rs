//! The static pod source (upstream `pkg/kubelet/config/file.go`, `file_linux.go`): watches
//! `staticPodPath` with inotify and sends the complete set of its pods (a SET) whenever it
//! changes, so a written, renamed or deleted manifest is acted on at once. A full rescan every
//! `fileCheckFrequency` is only the safety net (for lost events, a replaced directory, writers
//! that never close). A missing directory is watched for again with upstream's backoff (1 s up to
//! 20 s) and counts as empty meanwhile.
//!
//! Events of one burst are taken together (a short quiet window), and each named file is read
//! again as it now is on disk rather than interpreted from the event: an editor's "rename the old
//! file away, write a new one" then looks like what it is, an unchanged or changed file, never a
//! removal followed by an addition that would restart the pod. Content is read on
//! `IN_CLOSE_WRITE` (not on every write), so a half-written file is never parsed.
//!
//! Rejected manifests are logged once and listed in [`StaticPodSource::problems`]; every other pod
//! keeps flowing. Not here: parsing (`manifest.rs`), the directory state (`manifest_dir.rs`).

use std::{collections::BTreeMap, ffi::OsString, path::PathBuf, time::Duration};

use inotify::{EventMask, EventStream, Inotify, WatchMask};
use k8s_openapi::api::core::v1::Pod;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::hostfs::{self, BurstEnd};

use super::{
    MergeStopped, SourceProblem, SourceSender,
    manifest_dir::{Listing, ManifestDir},
};

pub use super::manifest_dir::is_manifest_name;

/// Upstream's retry of a failed watch (`retryPeriod`, `maxRetryPeriod`).
const WATCH_RETRY_MIN: Duration = Duration::from_secs(1);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(20);
/// A burst of events is cut off after this long, so a busy directory still gets read.
const MAX_BURST: Duration = Duration::from_millis(500);

#[derive(Clone, Debug)]
pub struct StaticPodOptions {
    /// `staticPodPath`.
    pub dir: PathBuf,
    /// Appended to pod names; part of every UID.
    pub node_name: String,
    /// `fileCheckFrequency`: the safety-net full rescan.
    pub rescan_period: Duration,
    /// Quiet time that ends a burst of events.
    pub debounce: Duration,
}

impl StaticPodOptions {
    pub fn new(dir: PathBuf, node_name: String, rescan_period: Duration) -> Self {
        StaticPodOptions {
            dir,
            node_name,
            rescan_period,
            debounce: Duration::from_millis(50),
        }
    }
}

pub struct StaticPodSource {
    options: StaticPodOptions,
    sender: SourceSender,
    problems: watch::Sender<Vec<SourceProblem>>,
}

impl std::fmt::Debug for StaticPodSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticPodSource")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Names touched by one burst of events, and whether the whole directory must be read again.
#[derive(Debug, Default)]
struct Burst {
    /// Name → whether its only event so far is its creation.
    names: BTreeMap<OsString, bool>,
    rescan: bool,
    /// The watched directory itself went away (deleted, moved, unmounted).
    watch_lost: bool,
}

impl Burst {
    fn add(&mut self, mask: EventMask, name: Option<OsString>) {
        if mask.contains(EventMask::Q_OVERFLOW) {
            self.rescan = true;
        }
        let lost =
            EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED | EventMask::UNMOUNT;
        if mask.intersects(lost) {
            self.watch_lost = true;
            self.rescan = true;
        }
        if let Some(name) = name {
            let created_only = (mask - EventMask::ISDIR) == EventMask::CREATE;
            let entry = self.names.entry(name).or_insert(true);
            *entry &= created_only;
        }
    }
}

impl StaticPodSource {
    pub fn new(options: StaticPodOptions, sender: SourceSender) -> Self {
        StaticPodSource {
            options,
            sender,
            problems: watch::Sender::new(Vec::new()),
        }
    }

    /// The manifests currently rejected, and why.
    pub fn problems(&self) -> watch::Receiver<Vec<SourceProblem>> {
        self.problems.subscribe()
    }

    /// Watches and sends until cancelled or until the merge stops.
    pub async fn run(self, cancel: CancellationToken) {
        tracing::info!(path = %self.options.dir.display(), "watching static pod manifests");
        let mut task = Task {
            state: Some(ManifestDir::new(
                self.options.dir.clone(),
                self.options.node_name.clone(),
            )),
            last_sent: None,
            source: &self,
        };
        if let Err(MergeStopped) = task.run(cancel).await {
            tracing::debug!("pod config merge stopped; static pod source ends");
        }
    }
}

struct Task<'a> {
    /// `None` only while a blocking read has it.
    state: Option<ManifestDir>,
    last_sent: Option<Vec<Pod>>,
    source: &'a StaticPodSource,
}

impl Task<'_> {
    async fn run(&mut self, cancel: CancellationToken) -> Result<(), MergeStopped> {
        let options = &self.source.options;
        let mut stream: Option<EventStream<Vec<u8>>> = None;
        let mut retry = WATCH_RETRY_MIN;
        let mut next_watch = Instant::now();
        let mut rescan = tokio::time::interval_at(
            Instant::now() + options.rescan_period,
            options.rescan_period,
        );
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut need_rescan = true;

        loop {
            if stream.is_none() && Instant::now() >= next_watch {
                match watch_dir(options) {
                    Ok(s) => {
                        stream = Some(s);
                        retry = WATCH_RETRY_MIN;
                        // Files may have appeared before the watch existed.
                        need_rescan = true;
                    }
                    Err(error) => {
                        if error.kind() != std::io::ErrorKind::NotFound {
                            tracing::warn!(path = %options.dir.display(), %error, "cannot watch the static pod path; retrying");
                        }
                        next_watch = Instant::now() + retry;
                        retry = (retry * 2).min(WATCH_RETRY_MAX);
                    }
                }
            }
            if need_rescan {
                need_rescan = false;
                self.apply(Burst {
                    rescan: true,
                    ..Burst::default()
                })
                .await;
                self.publish().await?;
            }

            let burst = tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                _ = rescan.tick() => {
                    need_rescan = true;
                    continue;
                }
                () = tokio::time::sleep_until(next_watch), if stream.is_none() => continue,
                burst = next_burst(stream.as_mut(), options.debounce), if stream.is_some() => burst,
            };
            if burst.watch_lost {
                tracing::info!(path = %options.dir.display(), "static pod path went away; watching for it again");
                stream = None;
                next_watch = Instant::now();
            }
            self.apply(burst).await;
            self.publish().await?;
        }
    }

    /// Reads what the burst names (or everything) off the async threads: manifests are small, but
    /// a slow disk must not stall the runtime.
    async fn apply(&mut self, burst: Burst) {
        let Some(mut state) = self.state.take() else {
            return;
        };
        let dir = state.dir().to_owned();
        let joined = tokio::task::spawn_blocking(move || {
            if burst.rescan {
                state.rescan();
            } else {
                for (name, created_only) in &burst.names {
                    state.refresh(name, *created_only);
                }
            }
            state
        })
        .await;
        self.state = Some(match joined {
            Ok(state) => state,
            Err(error) => {
                // A bug; start over from disk rather than keep a half-updated view.
                tracing::error!(%error, "static pod read failed; rescanning");
                let mut fresh = ManifestDir::new(dir, self.source.options.node_name.clone());
                fresh.rescan();
                fresh
            }
        });
    }

    /// Sends the pods if they changed (always the first time: the merge learns the source is
    /// ready) and updates the problem list, logging each new problem once. Sends nothing until
    /// the directory could be listed once.
    async fn publish(&mut self) -> Result<(), MergeStopped> {
        let Some(state) = self.state.as_mut() else {
            return Ok(());
        };
        let missing = *state.listing() == Listing::Missing;
        let listed = state.has_listed();
        let (pods, problems) = state.snapshot();
        self.source.problems.send_if_modified(|current| {
            for problem in problems.iter().filter(|p| !current.contains(p)) {
                tracing::warn!(file = %problem.file.display(), reason = %problem.reason, "static pod manifest rejected");
            }
            let changed = *current != problems;
            *current = problems;
            changed
        });
        if !listed || self.last_sent.as_ref() == Some(&pods) {
            return Ok(());
        }
        if missing && self.last_sent.is_none() {
            tracing::info!(path = %state.dir().display(), "static pod path does not exist (yet)");
        }
        tracing::debug!(pods = pods.len(), "static pods changed");
        self.source.sender.set(pods.clone()).await?;
        self.last_sent = Some(pods);
        Ok(())
    }
}

fn watch_dir(options: &StaticPodOptions) -> std::io::Result<EventStream<Vec<u8>>> {
    let inotify = Inotify::init()?;
    let mask = WatchMask::CLOSE_WRITE
        | WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR;
    inotify.watches().add(&options.dir, mask)?;
    inotify.into_event_stream(vec![0; 16 * 1024])
}

/// Waits for an event, then gathers the rest of its burst: until `debounce` passes without one, or
/// [`MAX_BURST`] in all. A broken stream ends as a lost watch.
async fn next_burst(stream: Option<&mut EventStream<Vec<u8>>>, debounce: Duration) -> Burst {
    let mut burst = Burst::default();
    let Some(stream) = stream else {
        return burst;
    };
    let ended = hostfs::next_burst(stream, debounce, MAX_BURST, |event| {
        burst.add(event.mask, event.name);
    })
    .await;
    if let BurstEnd::Broken(error) = ended {
        if let Some(error) = error {
            tracing::warn!(%error, "reading inotify events failed; watching again");
        }
        burst.watch_lost = true;
        burst.rescan = true;
    }
    burst
}

#[cfg(test)]
mod tests;
