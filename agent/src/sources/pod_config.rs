//! The pod config task (upstream `PodConfig` and its `Mux`): sources send their updates through a
//! [`SourceSender`]; one task merges them in arrival order ([`PodStorage`]) and sends the result,
//! in order, on a bounded channel the sync loop reads. [`SourcesReady`] says when every registered
//! source has sent its first complete set (upstream `SeenAllSources`), which gates work that must
//! not act on a partial view, such as removing pods no source knows.
//!
//! Not here: the diff rules (`merge.rs`) and the sources themselves.

use std::{collections::BTreeSet, time::SystemTime};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{Op, PodStorage, PodUpdate, Source};

/// Upstream's buffer of merged updates.
const UPDATES_CAPACITY: usize = 50;
/// Room for a few updates per source before a source waits for the merge.
const INPUT_CAPACITY: usize = 16;

/// The merge task stopped (shutdown), so the update was not delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the pod config merge has stopped")]
pub struct MergeStopped;

/// Which sources exist and which have sent a SET.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ReadyState {
    registered: BTreeSet<Source>,
    seen: BTreeSet<Source>,
    /// How many merged updates, counted from the first, hold every source's first complete set.
    /// Known before those updates are queued (unlike `seen`), so the reader of the updates can
    /// tell, at the update it handles, whether the set of wanted pods is complete (upstream
    /// marks a source seen before it delivers its updates: `SeenAllSources` holds when the
    /// kubelet admits the first pods of the last source).
    complete_through: Option<u64>,
}

impl ReadyState {
    fn all_ready(&self) -> bool {
        self.registered.is_subset(&self.seen)
    }
}

/// Builds the merge: register sources with [`PodConfig::channel`], then [`PodConfig::run`] it.
pub struct PodConfig {
    storage: PodStorage,
    input_tx: mpsc::Sender<PodUpdate>,
    input_rx: mpsc::Receiver<PodUpdate>,
    updates_tx: mpsc::Sender<PodUpdate>,
    ready: watch::Sender<ReadyState>,
}

impl std::fmt::Debug for PodConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodConfig")
            .field("storage", &self.storage)
            .field("ready", &*self.ready.borrow())
            .finish()
    }
}

impl PodConfig {
    /// The merge and the receiving end of its updates (for the sync loop).
    pub fn new(
        clock: impl Fn() -> SystemTime + Send + Sync + 'static,
    ) -> (PodConfig, mpsc::Receiver<PodUpdate>) {
        let (input_tx, input_rx) = mpsc::channel(INPUT_CAPACITY);
        let (updates_tx, updates_rx) = mpsc::channel(UPDATES_CAPACITY);
        let config = PodConfig {
            storage: PodStorage::new(clock),
            input_tx,
            input_rx,
            updates_tx,
            ready: watch::Sender::new(ReadyState::default()),
        };
        (config, updates_rx)
    }

    /// Registers `source` and returns its sender. Readiness waits for every registered source.
    pub fn channel(&mut self, source: Source) -> SourceSender {
        self.ready.send_modify(|s| {
            s.registered.insert(source);
        });
        SourceSender {
            source,
            tx: self.input_tx.clone(),
        }
    }

    pub fn sources_ready(&self) -> SourcesReady {
        SourcesReady {
            rx: self.ready.subscribe(),
        }
    }

    /// Merges until cancelled, until every [`SourceSender`] is dropped, or until the updates'
    /// receiver is dropped.
    pub async fn run(self, cancel: CancellationToken) {
        let PodConfig {
            mut storage,
            input_tx,
            mut input_rx,
            updates_tx,
            ready,
        } = self;
        // Only the sources' senders keep the input open from here on.
        drop(input_tx);
        let mut queued: u64 = 0;
        loop {
            let update = tokio::select! {
                () = cancel.cancelled() => return,
                update = input_rx.recv() => match update {
                    Some(update) => update,
                    None => return,
                },
            };
            tracing::debug!(source = %update.source, op = ?update.op, pods = update.pods.len(), "pod source update");
            let merged_updates = storage.merge(update);
            let count = u64::try_from(merged_updates.len()).unwrap_or(u64::MAX);
            let seen = storage.seen_sources();
            ready.send_if_modified(|s| {
                let complete = s.complete_through.is_none() && s.registered.is_subset(seen);
                if complete {
                    s.complete_through = Some(queued.saturating_add(count));
                }
                complete
            });
            for merged in merged_updates {
                queued = queued.saturating_add(1);
                tracing::debug!(source = %merged.source, op = ?merged.op, pods = merged.pods.len(), "merged pod update");
                let sent = tokio::select! {
                    () = cancel.cancelled() => return,
                    sent = updates_tx.send(merged) => sent,
                };
                if sent.is_err() {
                    return;
                }
            }
            // After the updates are queued, so a reader that sees "ready" also has the pods.
            let seen = storage.seen_sources();
            ready.send_if_modified(|s| {
                let changed = s.seen != *seen;
                s.seen.clone_from(seen);
                changed
            });
        }
    }
}

/// One source's way into the merge.
#[derive(Clone, Debug)]
pub struct SourceSender {
    source: Source,
    tx: mpsc::Sender<PodUpdate>,
}

impl SourceSender {
    pub fn source(&self) -> Source {
        self.source
    }

    /// The complete current set of this source's pods.
    pub async fn set(&self, pods: Vec<Pod>) -> Result<(), MergeStopped> {
        self.send(Op::Set, pods).await
    }

    pub async fn send(&self, op: Op, pods: Vec<Pod>) -> Result<(), MergeStopped> {
        let update = PodUpdate {
            pods,
            op,
            source: self.source,
        };
        self.tx.send(update).await.map_err(|_| MergeStopped)
    }
}

/// Whether every registered source has sent its first complete set.
#[derive(Clone, Debug)]
pub struct SourcesReady {
    rx: watch::Receiver<ReadyState>,
}

impl SourcesReady {
    pub fn all_ready(&self) -> bool {
        self.rx.borrow().all_ready()
    }

    /// Whether the first `received` merged updates hold every source's first complete set: for
    /// the reader of the updates, which asks it about the update in its hands (admission
    /// releases the CPUs of pods no source wants only then, as upstream's `removeStaleState`).
    pub fn complete_within(&self, received: u64) -> bool {
        let state = self.rx.borrow();
        state.registered.is_empty() || state.complete_through.is_some_and(|t| received >= t)
    }

    /// Waits until [`Self::all_ready`]; returns at once if it already is. Errs if the merge
    /// stopped first.
    pub async fn wait(&mut self) -> Result<(), MergeStopped> {
        self.rx
            .wait_for(ReadyState::all_ready)
            .await
            .map(|_| ())
            .map_err(|_| MergeStopped)
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    #[tokio::test]
    async fn merges_in_order_and_reports_readiness() {
        let (mut config, mut updates) = PodConfig::new(Box::new(SystemTime::now));
        let file = config.channel(Source::File);
        let api = config.channel(Source::Api);
        let mut ready = config.sources_ready();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(config.run(cancel.clone()));

        assert!(!ready.all_ready());
        file.set(vec![]).await.expect("send");
        let first = updates.recv().await.expect("update");
        assert_eq!((first.op, first.source), (Op::Add, Source::File));
        assert!(!ready.all_ready(), "the API source has not sent a set yet");

        api.set(vec![]).await.expect("send");
        let second = updates.recv().await.expect("update");
        assert_eq!((second.op, second.source), (Op::Add, Source::Api));
        ready.wait().await.expect("ready");
        assert!(ready.all_ready());

        cancel.cancel();
        task.await.expect("task");
        assert_eq!(file.set(vec![]).await, Err(MergeStopped));
    }

    #[tokio::test]
    async fn the_reader_knows_at_which_update_every_source_has_sent_its_set() {
        let (mut config, mut updates) = PodConfig::new(Box::new(SystemTime::now));
        let file = config.channel(Source::File);
        let api = config.channel(Source::Api);
        let ready = config.sources_ready();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(config.run(cancel.clone()));

        file.set(vec![]).await.expect("send");
        updates.recv().await.expect("the file source's set");
        assert!(
            !ready.complete_within(1),
            "the API source has not sent a set yet"
        );
        api.set(vec![]).await.expect("send");
        updates.recv().await.expect("the API source's set");
        // Known as soon as the update is in the reader's hands, without waiting for the merge.
        assert!(ready.complete_within(2));
        assert!(!ready.complete_within(1));

        cancel.cancel();
        task.await.expect("task");
    }

    #[tokio::test]
    async fn stops_when_all_sources_are_gone() {
        let (mut config, _updates) = PodConfig::new(Box::new(SystemTime::now));
        let file = config.channel(Source::File);
        let task = tokio::spawn(config.run(CancellationToken::new()));
        drop(file);
        task.await.expect("task ends");
    }
}
