//! The programs' per-CPU, per-kind counters, summed over CPUs. `submitted + lost` is everything the
//! kernel produced for the watched cgroups; `submitted` should equal what the stream delivered.

use std::sync::Arc;

use aya::maps::{MapData, PerCpuArray};
use swiftlet_common::{EventKind, KindCounters};

use super::Error;

#[derive(Clone)]
pub struct CounterReader {
    map: Arc<PerCpuArray<MapData, KindCounters>>,
}

/// Totals by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters {
    pub by_kind: Vec<(EventKind, KindCounters)>,
}

impl KernelCounters {
    pub fn get(&self, kind: EventKind) -> KindCounters {
        self.by_kind
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, c)| *c)
            .unwrap_or_default()
    }

    pub fn total_lost(&self) -> u64 {
        self.by_kind.iter().map(|(_, c)| c.lost).sum()
    }
}

impl CounterReader {
    pub(super) fn new(map: Arc<PerCpuArray<MapData, KindCounters>>) -> Self {
        CounterReader { map }
    }

    /// Reads and sums every CPU's counters (one syscall per kind).
    pub fn read(&self) -> Result<KernelCounters, Error> {
        let mut by_kind = Vec::with_capacity(EventKind::ALL.len());
        for kind in EventKind::ALL {
            let per_cpu = self
                .map
                .get(&(kind as u32), 0)
                .map_err(|source| Error::Map {
                    map: swiftlet_common::names::COUNTERS,
                    source,
                })?;
            let sum = per_cpu
                .iter()
                .fold(KindCounters::default(), |acc, c| KindCounters {
                    submitted: acc.submitted + c.submitted,
                    lost: acc.lost + c.lost,
                    errors: acc.errors + c.errors,
                });
            by_kind.push((kind, sum));
        }
        Ok(KernelCounters { by_kind })
    }
}
