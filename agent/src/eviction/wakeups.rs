//! The tasks that wake the eviction manager: PSI triggers on the pods' cgroup and the node, memory
//! cgroup notifications (re-armed after every decision), the kernel programs' OOM kills and
//! reclaim records from the event bus, and on cgroup v2 the pods' cgroup reaching the memory level
//! the last decision's figures put a threshold at (the kernel's charge trigger, or a 10 ms poll).
//! Each only says "look now"; the manager reads fresh figures itself.
//!
//! Not here: the decision (`manager.rs`).

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::{sync::broadcast, task::JoinSet};
use tokio_util::sync::CancellationToken;

use super::{
    logic::{Observations, is_met, quantity},
    manager::{WakeSource, Waker},
    memcg::{CurrentReader, MemoryEvents, UsageThreshold, supports_usage_thresholds},
    observe::{NodeObserver, stat_value},
    thresholds::{Operator, Signal, Threshold},
};
use crate::{
    cm::{
        CgroupLayout,
        psi::{PsiResource, PsiTrigger},
    },
    kernel::{EventBody, MemcgTrigger, StreamItem},
};

/// PSI triggers: a wake-up when tasks stalled this long within one window. The window is the
/// smallest the kernel grants this process (2 s without CAP_SYS_RESOURCE).
pub const PSI_STALL: Duration = Duration::from_millis(100);
pub const PSI_WINDOW: Duration = Duration::from_secs(1);

/// Starts one task per PSI trigger: `some` memory and io stalls of the pods' cgroup and of the
/// node. A trigger that cannot be registered is logged and left out.
pub fn spawn_psi(
    observer: &NodeObserver,
    waker: &Waker,
    tasks: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) -> Vec<String> {
    let mut armed = Vec::new();
    let kubepods = observer
        .layout
        .cgroup2_root()
        .ok()
        .map(|r| r.join(&observer.pods_cgroup));
    let mut files: Vec<PathBuf> = Vec::new();
    for resource in [PsiResource::Memory, PsiResource::Io] {
        if let Some(dir) = &kubepods {
            files.push(dir.join(resource.file_name()));
        }
        files.push(PathBuf::from(resource.proc_path()));
    }
    for path in files {
        match PsiTrigger::new(&path, false, PSI_STALL, PSI_WINDOW) {
            Ok(mut trigger) => {
                armed.push(format!(
                    "{} (some {:?} in {:?})",
                    path.display(),
                    trigger.stall(),
                    trigger.window()
                ));
                let waker = waker.clone();
                let shutdown = shutdown.clone();
                tasks.spawn(async move {
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            fired = trigger.fired() => match fired {
                                Ok(()) => waker.wake(WakeSource::Psi),
                                Err(e) => {
                                    tracing::warn!(error = %e, "a PSI trigger ended");
                                    return;
                                }
                            },
                        }
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "PSI trigger not registered"),
        }
    }
    armed
}

/// Wakes the manager on OOM kills and reclaim records from the kernel programs. A lagging
/// receiver lost records: it wakes the manager once for all of them.
pub fn spawn_kernel(
    mut events: broadcast::Receiver<Arc<StreamItem>>,
    waker: Waker,
    tasks: &mut JoinSet<()>,
    shutdown: CancellationToken,
) {
    tasks.spawn(async move {
        loop {
            let item = tokio::select! {
                () = shutdown.cancelled() => return,
                item = events.recv() => item,
            };
            match item {
                Ok(item) => {
                    if let StreamItem::Event(event) = item.as_ref() {
                        match &event.body {
                            EventBody::Oom(_) => waker.wake(WakeSource::Oom),
                            EventBody::Pressure(_) => waker.wake(WakeSource::Reclaim),
                            _ => {}
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => waker.wake(WakeSource::Reclaim),
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

/// Memory cgroup notifications. On a v1 memory controller: one usage threshold per memory
/// threshold, re-armed whenever the manager's observations move the level it means. On cgroup
/// v2: `memory.events` of the pods' cgroup.
pub fn spawn_memcg(
    observer: NodeObserver,
    thresholds: Vec<Threshold>,
    mut observed: tokio::sync::watch::Receiver<Observations>,
    waker: Waker,
    tasks: &mut JoinSet<()>,
    shutdown: CancellationToken,
) -> Option<String> {
    if let CgroupLayout::Unified { .. } = observer.layout {
        let dir = observer.memory_dir(&observer.pods_cgroup)?;
        return match MemoryEvents::watch(&dir) {
            Ok(mut events) => {
                let what = format!("{} (inotify)", events.path.display());
                tasks.spawn(async move {
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => return,
                            changed = events.changed() => match changed {
                                Some(()) => waker.wake(WakeSource::Memcg),
                                None => return,
                            },
                        }
                    }
                });
                Some(what)
            }
            Err(e) => {
                tracing::warn!(error = %e, "memory.events not watched");
                None
            }
        };
    }
    let memory: Vec<Threshold> = thresholds
        .into_iter()
        .filter(|t| {
            t.operator == Operator::LessThan
                && matches!(
                    t.signal,
                    Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
                )
        })
        .collect();
    if memory.is_empty() {
        return None;
    }
    let root = observer.memory_dir("")?;
    if !supports_usage_thresholds(&root) {
        return None;
    }
    let what = format!(
        "usage thresholds on {} (cgroup.event_control)",
        root.display()
    );
    tasks.spawn(async move {
        let mut armed: Vec<UsageThreshold> = Vec::new();
        loop {
            let levels = usage_levels(&observer, &memory, &observed.borrow_and_update());
            let moved = levels.len() != armed.len()
                || levels.iter().zip(&armed).any(|((dir, bytes), a)| {
                    *dir != a.dir || bytes.abs_diff(a.bytes) >= REARM_STEP
                });
            if moved {
                armed.clear();
                for (dir, bytes) in levels {
                    match UsageThreshold::arm(&dir, bytes) {
                        Ok(t) => armed.push(t),
                        Err(e) => tracing::warn!(error = %e, "memory usage threshold not armed"),
                    }
                }
            }
            enum Next {
                Stop,
                Look,
                Crossed,
                Failed(super::memcg::MemcgError),
            }
            let next = {
                let crossed = async {
                    if armed.is_empty() {
                        std::future::pending().await
                    } else {
                        futures::future::select_all(armed.iter().map(|t| Box::pin(t.crossed())))
                            .await
                            .0
                    }
                };
                tokio::select! {
                    () = shutdown.cancelled() => Next::Stop,
                    changed = observed.changed() => if changed.is_err() { Next::Stop } else { Next::Look },
                    result = crossed => match result {
                        Ok(()) => Next::Crossed,
                        Err(e) => Next::Failed(e),
                    },
                }
            };
            match next {
                Next::Stop => return,
                Next::Look => {}
                Next::Crossed => waker.wake(WakeSource::Memcg),
                Next::Failed(e) => {
                    tracing::warn!(error = %e, "memory usage threshold failed; re-arming");
                    armed.clear();
                }
            }
        }
    });
    Some(what)
}

/// Re-registering costs a write and a new eventfd; the kernel's own usage figure is batched
/// per CPU anyway, so levels closer than this are the same level.
const REARM_STEP: u64 = 1 << 20;

/// The `memory.usage_in_bytes` level at which each memory threshold is crossed: the working set
/// it allows plus the cgroup's inactive file pages now (upstream `UpdateThreshold`).
fn usage_levels(
    observer: &NodeObserver,
    thresholds: &[Threshold],
    observed: &Observations,
) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    for t in thresholds {
        let (path, capacity) = match t.signal {
            Signal::MemoryAvailable => ("", observer.memory_capacity),
            Signal::AllocatableMemoryAvailable => {
                (observer.pods_cgroup.as_str(), observer.allocatable_memory)
            }
            _ => continue,
        };
        if !observed.contains_key(&t.signal) {
            continue;
        }
        let Some(dir) = observer.memory_dir(path) else {
            continue;
        };
        let inactive = std::fs::read_to_string(dir.join("memory.stat"))
            .ok()
            .and_then(|s| stat_value(&s, "total_inactive_file"))
            .unwrap_or(0);
        let level = capacity - quantity(t.value, capacity) + inactive;
        if let Ok(level) = u64::try_from(level)
            && level > 0
        {
            out.push((dir, level));
        }
    }
    out
}

/// How often the fallback polls the pods' `memory.current` while a level is armed.
pub const LEVEL_POLL: Duration = Duration::from_millis(10);

/// The memory thresholds a usage level can stand for: `memory.available` and
/// `allocatableMemory.available` below a value.
fn memory_thresholds(thresholds: Vec<Threshold>) -> Vec<Threshold> {
    thresholds
        .into_iter()
        .filter(|t| {
            t.operator == Operator::LessThan
                && matches!(
                    t.signal,
                    Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
                )
        })
        .collect()
}

/// The pods' cgroup usage (`memory.current`, bytes) at which the nearest memory threshold not met
/// by the last decision's `observed` figures is crossed; `None` when every one is met (the manager
/// is already acting on it) or none was observed.
/// - `allocatableMemory.available`: the working set it allows plus the cgroup's inactive file
///   pages now, `allocatable − threshold + inactive_file`, as the v1 usage threshold (upstream
///   `UpdateThreshold`);
/// - `memory.available`, the node's: the pods' usage now plus what is left above the threshold,
///   the rest of the node taken as it was (a change there moves the level at the next decision).
pub fn pods_usage_level(
    thresholds: &[Threshold],
    observed: &Observations,
    current: u64,
    inactive_file: u64,
) -> Option<u64> {
    let mut level: Option<u64> = None;
    for t in thresholds {
        let Some(o) = observed.get(&t.signal) else {
            continue;
        };
        if is_met(t, o, false) {
            continue;
        }
        let bar = quantity(t.value, o.capacity);
        let at = match t.signal {
            Signal::AllocatableMemoryAvailable => {
                (o.capacity - bar).saturating_add(i64::try_from(inactive_file).unwrap_or(i64::MAX))
            }
            Signal::MemoryAvailable => {
                (o.available - bar).saturating_add(i64::try_from(current).unwrap_or(i64::MAX))
            }
            _ => continue,
        };
        if let Ok(at) = u64::try_from(at)
            && at > 0
        {
            level = Some(level.map_or(at, |l| l.min(at)));
        }
    }
    level
}

/// The level in whole pages, as the kernel counts usage: a usage of `pages` reaches `bytes`
/// when `pages * page >= bytes`.
pub fn level_pages(bytes: u64, page: u64) -> u64 {
    bytes.div_ceil(page.max(1))
}

/// How the pods' level is watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watcher {
    /// The kernel's charge trigger.
    Kernel,
    /// [`LEVEL_POLL`] reads of `memory.current`.
    Poll,
}

impl Watcher {
    fn source(self) -> WakeSource {
        match self {
            Watcher::Kernel => WakeSource::MemcgLevel,
            Watcher::Poll => WakeSource::MemcgPoll,
        }
    }
}

/// What the level task needs besides the manager's figures.
pub struct LevelInputs {
    /// `level`: the kernel's trigger when it is attached, else the poll.
    pub level: bool,
    /// `poll`: the poll, whatever else runs.
    pub poll: bool,
    pub trigger: Option<MemcgTrigger>,
    /// The kernel events, where the trigger's records arrive.
    pub events: Option<broadcast::Receiver<Arc<StreamItem>>>,
}

/// The pods' cgroup reaching the memory level of the nearest threshold (cgroup v2 only; v1 has
/// its usage thresholds in [`spawn_memcg`]). Re-armed after every decision from its figures; a
/// crossing wakes the manager once per arming. Returns what watches, for the log.
pub fn spawn_level(
    observer: NodeObserver,
    thresholds: Vec<Threshold>,
    observed: tokio::sync::watch::Receiver<Observations>,
    inputs: LevelInputs,
    waker: Waker,
    tasks: &mut JoinSet<()>,
    shutdown: CancellationToken,
) -> Vec<String> {
    let CgroupLayout::Unified { root } = &observer.layout else {
        return Vec::new();
    };
    let dir = root.join(&observer.pods_cgroup);
    let memory = memory_thresholds(thresholds);
    if memory.is_empty() || !(inputs.level || inputs.poll) {
        return Vec::new();
    }
    let mut watchers = Vec::new();
    if inputs.level
        && let (Some(trigger), Some(events)) = (&inputs.trigger, &inputs.events)
    {
        match trigger.watch(&dir) {
            Ok(id) => watchers.push((
                Watcher::Kernel,
                Some((trigger.clone(), id, events.resubscribe())),
            )),
            Err(e) => tracing::warn!(
                error = %e,
                "the kernel's memory level trigger cannot watch the pods' cgroup: polling instead"
            ),
        }
    }
    let fallback = inputs.level && watchers.is_empty();
    if inputs.poll || fallback {
        watchers.push((Watcher::Poll, None));
    }
    let mut what = Vec::new();
    for (watcher, kernel) in watchers {
        let reader = match CurrentReader::open(&dir) {
            Ok(reader) => reader,
            Err(e) => {
                tracing::warn!(error = %e, "the pods' memory level is not watched");
                continue;
            }
        };
        what.push(match watcher {
            Watcher::Kernel => format!("{} level (kernel charge trigger)", reader.path.display()),
            Watcher::Poll => format!(
                "{} level (polled every {LEVEL_POLL:?})",
                reader.path.display()
            ),
        });
        let task = LevelTask {
            watcher,
            dir: dir.clone(),
            thresholds: memory.clone(),
            reader,
            kernel,
            waker: waker.clone(),
            armed: None,
            rechecked: false,
        };
        tasks.spawn(task.run(observed.clone(), shutdown.clone()));
    }
    what
}

struct LevelTask {
    watcher: Watcher,
    dir: PathBuf,
    thresholds: Vec<Threshold>,
    reader: CurrentReader,
    /// The trigger, the cgroup id it watches, and the events its records come in.
    kernel: Option<(MemcgTrigger, u64, broadcast::Receiver<Arc<StreamItem>>)>,
    waker: Waker,
    /// The level armed (bytes), until it is reached.
    armed: Option<u64>,
    /// The last arming found the level already reached and woke the manager: the next one that
    /// does leaves it to the next charge, so a level that figures put right at the usage cannot
    /// spin the manager.
    rechecked: bool,
}

impl LevelTask {
    async fn run(
        mut self,
        mut observed: tokio::sync::watch::Receiver<Observations>,
        shutdown: CancellationToken,
    ) {
        let mut poll = tokio::time::interval(LEVEL_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let polling = self.watcher == Watcher::Poll && self.armed.is_some();
            let record = async {
                match &mut self.kernel {
                    Some((_, id, events)) => loop {
                        match events.recv().await {
                            Ok(item) => {
                                if let StreamItem::Event(event) = item.as_ref()
                                    && let EventBody::MemcgLevel(m) = &event.body
                                    && m.cgroup_id == *id
                                {
                                    return Some(true);
                                }
                            }
                            // A record may be among those lost: the usage says.
                            Err(broadcast::error::RecvError::Lagged(_)) => return Some(false),
                            Err(broadcast::error::RecvError::Closed) => return None,
                        }
                    },
                    None => std::future::pending().await,
                }
            };
            enum Next {
                Stop,
                Rearm,
                Fired,
                Check,
            }
            let next = tokio::select! {
                () = shutdown.cancelled() => Next::Stop,
                changed = observed.changed() => {
                    if changed.is_err() { Next::Stop } else { Next::Rearm }
                }
                record = record => match record {
                    Some(true) => Next::Fired,
                    Some(false) => Next::Check,
                    None => {
                        tracing::warn!(
                            "kernel events ended: the pods' memory level is no longer watched"
                        );
                        Next::Stop
                    }
                },
                _ = poll.tick(), if polling => Next::Check,
            };
            match next {
                Next::Stop => return,
                Next::Rearm => {
                    let figures = observed.borrow_and_update().clone();
                    self.rearm(&figures);
                }
                Next::Fired => self.fired(),
                Next::Check => self.check(),
            }
        }
    }

    fn fired(&mut self) {
        self.armed = None;
        self.rechecked = false;
        self.waker.wake(self.watcher.source());
    }

    /// Compares the usage with the armed level (a poll, or after missed records).
    fn check(&mut self) {
        let Some(level) = self.armed else {
            return;
        };
        match self.reader.read() {
            Ok(current) if current >= level => {
                if let Some((trigger, _, _)) = &self.kernel
                    && let Err(e) = trigger.disarm()
                {
                    tracing::warn!(error = %e, "memory level trigger not disarmed");
                }
                self.fired();
            }
            Ok(_) => {}
            Err(e) => self.reopen(e),
        }
    }

    /// The cgroup was re-created (or its file went away): read the new one from the next poll.
    fn reopen(&mut self, error: super::memcg::MemcgError) {
        tracing::debug!(%error, "re-opening the pods' memory.current");
        if let Ok(reader) = CurrentReader::open(&self.dir) {
            self.reader = reader;
        }
    }

    /// Arms the level the decision's figures mean, then reads the usage once more: a crossing
    /// between the figures and the arming would otherwise wait for the next charge.
    fn rearm(&mut self, figures: &Observations) {
        let current = match self.reader.read() {
            Ok(current) => current,
            Err(e) => {
                self.reopen(e);
                self.armed = None;
                return;
            }
        };
        let needs_inactive = self
            .thresholds
            .iter()
            .any(|t| t.signal == Signal::AllocatableMemoryAvailable);
        let inactive = if needs_inactive {
            std::fs::read_to_string(self.dir.join("memory.stat"))
                .ok()
                .and_then(|s| stat_value(&s, "inactive_file"))
                .and_then(|v| u64::try_from(v).ok())
                .unwrap_or(0)
        } else {
            0
        };
        let level = pods_usage_level(&self.thresholds, figures, current, inactive);
        self.armed = level;
        if let Some((trigger, id, _)) = &mut self.kernel {
            // The cgroup re-created (a new id): learn its counter again.
            if crate::kernel::cgroup_id_of(&self.dir).is_ok_and(|now| now != *id) {
                match trigger.watch(&self.dir) {
                    Ok(now) => *id = now,
                    Err(e) => {
                        tracing::warn!(error = %e, "memory level trigger lost the pods' cgroup")
                    }
                }
            }
            let armed = match level {
                Some(bytes) => trigger.arm(level_pages(bytes, page_size())),
                None => trigger.disarm(),
            };
            if let Err(e) = armed {
                tracing::warn!(error = %e, "memory level trigger not armed");
            }
        }
        let Some(level) = level else {
            return;
        };
        match self.reader.read() {
            Ok(now) if now >= level => {
                if self.rechecked {
                    // Left armed: the next charge fires it.
                    self.rechecked = false;
                    return;
                }
                if let Some((trigger, _, _)) = &self.kernel {
                    let _ = trigger.disarm();
                }
                self.armed = None;
                self.rechecked = true;
                self.waker.wake(self.watcher.source());
            }
            Ok(_) => self.rechecked = false,
            Err(e) => self.reopen(e),
        }
    }
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::{logic::Observation, thresholds::parse_threshold_statement};

    const MI: i64 = 1 << 20;

    fn threshold(text: &str) -> Threshold {
        parse_threshold_statement(text)
            .expect("parses")
            .expect("a threshold")
    }

    fn observed(pairs: &[(Signal, i64, i64)]) -> Observations {
        pairs
            .iter()
            .map(|&(signal, available, capacity)| {
                (
                    signal,
                    Observation {
                        available,
                        capacity,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_level_is_the_nearest_threshold_not_met() {
        let allocatable = threshold("allocatableMemory.available<200Mi");
        let node = threshold("memory.available<100Mi");
        type Case = (
            &'static str,
            Vec<Threshold>,
            Observations,
            u64,
            u64,
            Option<u64>,
        );
        let cases: [Case; 6] = [
            (
                // allocatable 1000 Mi, 300 Mi left: crossed at 800 Mi of working set plus the
                // inactive file pages now (50 Mi).
                "allocatable, as the v1 usage threshold",
                vec![allocatable.clone()],
                observed(&[(Signal::AllocatableMemoryAvailable, 300 * MI, 1000 * MI)]),
                760 << 20,
                50 << 20,
                Some(850 << 20),
            ),
            (
                // The node has 400 Mi left, 300 Mi above its threshold: the pods may grow by it.
                "node, by the headroom",
                vec![node.clone()],
                observed(&[(Signal::MemoryAvailable, 400 * MI, 4000 * MI)]),
                500 << 20,
                0,
                Some(800 << 20),
            ),
            (
                "the nearer of the two",
                vec![allocatable.clone(), node.clone()],
                observed(&[
                    (Signal::AllocatableMemoryAvailable, 300 * MI, 1000 * MI),
                    (Signal::MemoryAvailable, 150 * MI, 4000 * MI),
                ]),
                760 << 20,
                50 << 20,
                Some(810 << 20),
            ),
            (
                "a threshold met already is the manager's business, not a level",
                vec![allocatable.clone(), node.clone()],
                observed(&[
                    (Signal::AllocatableMemoryAvailable, 100 * MI, 1000 * MI),
                    (Signal::MemoryAvailable, 400 * MI, 4000 * MI),
                ]),
                500 << 20,
                0,
                Some(800 << 20),
            ),
            (
                "every one met: nothing to arm",
                vec![allocatable.clone()],
                observed(&[(Signal::AllocatableMemoryAvailable, 100 * MI, 1000 * MI)]),
                900 << 20,
                0,
                None,
            ),
            (
                "not observed yet",
                vec![allocatable.clone(), node.clone()],
                Observations::new(),
                100,
                0,
                None,
            ),
        ];
        for (what, thresholds, observed, current, inactive, want) in cases {
            assert_eq!(
                pods_usage_level(&thresholds, &observed, current, inactive),
                want,
                "{what}"
            );
        }
    }

    #[test]
    fn a_percentage_threshold_is_of_the_capacity() {
        let t = threshold("allocatableMemory.available<50%");
        let o = observed(&[(Signal::AllocatableMemoryAvailable, 600 * MI, 1000 * MI)]);
        assert_eq!(pods_usage_level(&[t], &o, 0, 0), Some(500 << 20));
    }

    #[test]
    fn only_memory_thresholds_below_a_value_make_levels() {
        let kept = memory_thresholds(vec![
            threshold("memory.available<100Mi"),
            threshold("allocatableMemory.available<1Gi"),
            threshold("nodefs.available<10%"),
            threshold("pid.available<100"),
        ]);
        let signals: Vec<Signal> = kept.iter().map(|t| t.signal).collect();
        assert_eq!(
            signals,
            [Signal::MemoryAvailable, Signal::AllocatableMemoryAvailable]
        );
    }

    #[test]
    fn levels_round_up_to_whole_pages() {
        assert_eq!(level_pages(0, 4096), 0);
        assert_eq!(level_pages(1, 4096), 1);
        assert_eq!(level_pages(4096, 4096), 1);
        assert_eq!(level_pages(4097, 4096), 2);
        assert_eq!(level_pages(8 << 20, 4096), 2048);
        assert_eq!(level_pages(100, 0), 100, "a page size of 0 is taken as 1");
    }

    /// The poll against a `memory.current` the test writes: one wake-up per arming, the arming
    /// itself wakes when the usage is already there, but not twice in a row.
    #[test]
    fn the_poll_wakes_once_per_arming() {
        let dir = tempfile::tempdir().expect("tempdir");
        let set = |bytes: u64| {
            std::fs::write(dir.path().join("memory.current"), format!("{bytes}\n")).expect("write")
        };
        set(100 << 20);
        std::fs::write(dir.path().join("memory.stat"), "inactive_file 0\n").expect("write");
        let (waker, mut wakes) = Waker::for_test();
        let mut task = LevelTask {
            watcher: Watcher::Poll,
            dir: dir.path().to_owned(),
            thresholds: vec![threshold("allocatableMemory.available<200Mi")],
            reader: CurrentReader::open(dir.path()).expect("open"),
            kernel: None,
            waker,
            armed: None,
            rechecked: false,
        };
        let figures = observed(&[(Signal::AllocatableMemoryAvailable, 300 * MI, 1000 * MI)]);
        let mut woken = || {
            let mut sources = Vec::new();
            while let Ok(wake) = wakes.try_recv() {
                sources.push(wake.source);
            }
            sources
        };

        task.rearm(&figures);
        assert_eq!(task.armed, Some(800 << 20));
        task.check();
        assert_eq!(woken(), [], "below the level");
        set(800 << 20);
        task.check();
        assert_eq!(woken(), [WakeSource::MemcgPoll], "reached");
        task.check();
        assert_eq!(woken(), [], "once per arming");

        // Armed where the usage already is: the arming wakes at once, then the next one leaves
        // it to the poll (no spinning on a level the figures put at the usage).
        task.rearm(&figures);
        assert_eq!(
            woken(),
            [WakeSource::MemcgPoll],
            "the crossing before the arming"
        );
        assert_eq!(task.armed, None);
        task.rearm(&figures);
        assert_eq!(woken(), [], "not twice in a row");
        assert_eq!(task.armed, Some(800 << 20), "left armed for the poll");
        task.check();
        assert_eq!(woken(), [WakeSource::MemcgPoll]);

        // A threshold met already arms nothing.
        let met = observed(&[(Signal::AllocatableMemoryAvailable, 100 * MI, 1000 * MI)]);
        task.rearm(&met);
        assert_eq!(task.armed, None);
        assert_eq!(woken(), []);
    }

    #[test]
    fn each_watcher_wakes_the_manager_as_itself() {
        assert_eq!(Watcher::Kernel.source().as_str(), "memcg_level");
        assert_eq!(Watcher::Poll.source().as_str(), "memcg_poll");
    }
}
