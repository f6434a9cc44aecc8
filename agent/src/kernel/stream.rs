//! Reading the events ring buffer: wait for readiness on its fd (epoll through tokio), then drain
//! it until empty, decoding each record as it comes. The kernel wakes the reader only when the
//! reader has caught up (adaptive notification), so draining to empty before waiting again is what
//! keeps no record waiting.

use std::collections::VecDeque;

use aya::maps::{MapData, PerCpuArray, RingBuf};
use tokio::io::unix::AsyncFd;

use super::{Error, KernelEvent, KernelEvents, event, monotonic_ns};

/// What the stream yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StreamItem {
    Event(KernelEvent),
    /// The kernel could not fit `count` events into the ring buffer (reported with the next
    /// record of the same CPU; the exact per-kind totals are in the counters).
    Lost {
        count: u64,
    },
}

/// Records decoded per wake-up before yielding to the runtime, so one busy stream cannot starve
/// other tasks.
const BATCH: usize = 1024;

pub(super) struct RingReader {
    fd: AsyncFd<RingBuf<MapData>>,
    /// Every reserve failure, per CPU.
    lost_total: PerCpuArray<MapData, u64>,
    /// The sum of `lost_total` already reported as [`StreamItem::Lost`].
    lost_reported: u64,
    /// A record said its CPU lost events just before it: check the counter now.
    loss_hinted: bool,
    pending: VecDeque<StreamItem>,
    /// Records that did not decode (agent and programs out of step: a bug, counted, not fatal).
    pub(super) malformed: u64,
    pub(super) delivered: [u64; swiftlet_common::MAX_KIND as usize],
}

impl RingReader {
    pub(super) fn new(
        fd: AsyncFd<RingBuf<MapData>>,
        lost_total: PerCpuArray<MapData, u64>,
    ) -> Self {
        RingReader {
            fd,
            lost_total,
            lost_reported: 0,
            loss_hinted: false,
            pending: VecDeque::with_capacity(BATCH),
            malformed: 0,
            delivered: [0; swiftlet_common::MAX_KIND as usize],
        }
    }

    /// Losses are learnt from the kernel's total: whenever a record hints at one, and before
    /// every wait (so a loss is reported even when no record follows it, e.g. when the ring stayed
    /// full until the burst ended).
    async fn next(&mut self) -> Result<StreamItem, Error> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Ok(item);
            }
            if let Some(count) = self.new_losses()? {
                return Ok(StreamItem::Lost { count });
            }
            let mut guard = self.fd.readable_mut().await.map_err(Error::Io)?;
            let ring = guard.get_inner_mut();
            let mut drained = 0;
            let mut empty = false;
            while drained < BATCH {
                let Some(record) = ring.next() else {
                    empty = true;
                    break;
                };
                drained += 1;
                match event::decode(&record, monotonic_ns()) {
                    Ok((event, meta)) => {
                        self.loss_hinted |= meta.lost_before > 0;
                        let kind = event.body.kind() as usize;
                        if let Some(n) = self.delivered.get_mut(kind) {
                            *n += 1;
                        }
                        self.pending.push_back(StreamItem::Event(event));
                    }
                    Err(error) => {
                        self.malformed += 1;
                        tracing::warn!(%error, "skipping a malformed kernel record");
                    }
                }
            }
            if empty {
                guard.clear_ready();
            }
            if self.loss_hinted {
                self.loss_hinted = false;
                if let Some(count) = self.new_losses()? {
                    // Before the records that came after the loss.
                    self.pending.push_front(StreamItem::Lost { count });
                }
            }
        }
    }

    fn new_losses(&mut self) -> Result<Option<u64>, Error> {
        let per_cpu = self.lost_total.get(&0, 0).map_err(|source| Error::Map {
            map: swiftlet_common::names::LOST_TOTAL,
            source,
        })?;
        let total: u64 = per_cpu.iter().sum();
        let new = total.saturating_sub(self.lost_reported);
        self.lost_reported = total;
        Ok((new > 0).then_some(new))
    }
}

impl KernelEvents {
    /// The next event (or loss report). Cancel-safe: an item is only removed when returned.
    pub async fn next(&mut self) -> Result<StreamItem, Error> {
        self.ring.next().await
    }

    /// Events handed out so far, by kind (indexed like the kernel counters).
    pub fn delivered(&self) -> &[u64] {
        &self.ring.delivered
    }

    /// Records that could not be decoded.
    pub fn malformed(&self) -> u64 {
        self.ring.malformed
    }
}
