//! The benchmark's own view of one Guaranteed pod's start, from a dedicated thread that looks
//! about every millisecond, stamped with CLOCK_MONOTONIC:
//! - its container's start: the first sample in which its cgroup2 folder
//!   (`<cgroupRoot>/kubepods/pod<uid>/<id>`) has a process in `cgroup.procs` (runc's, as it
//!   creates the container: its last stage becomes the container's shell);
//! - exclusivity in place: the first sample in which that process may run on the exclusive CPU
//!   alone (`Cpus_allowed_list`, where the kernel enforces the cpuset) and the spinner of the
//!   shared pool no longer may. It is dated from the later of the two conditions' onsets, so that
//!   a spinner moved off the CPU before the container existed dates it before the start.
//!
//! The pod's folder is the one that appears below `kubepods` (where Guaranteed pods' folders are;
//! the others are in `burstable/` and `besteffort/`) after the manifest; of its container folders,
//! the sandbox's (whose process becomes `pause`) is told from the container's by the process's
//! name once runc's last stage has exec'd (the time of the start is the folder's first process
//! all the same). A sample is stamped when it is taken: what it sees happened
//! since the previous one, so each time is late by at most one interval (the longest is kept).
//!
//! The thread keeps to the reserved CPU: its own time on the exclusive CPU would count as
//! foreign time.

use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::OsString,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use serde::Serialize;
use swiftlet::{cm::cpumanager::CpuSet, kernel::monotonic_ns};
use tokio::sync::mpsc;

/// The sampling interval.
pub const INTERVAL: Duration = Duration::from_millis(1);

/// What to watch.
#[derive(Clone, Debug)]
pub struct Target {
    /// `<cgroup2 mount>/<cgroupRoot>/kubepods`.
    pub kubepods: PathBuf,
    /// The pod folders below it before the manifest was written (not the new pod's).
    pub known_pods: BTreeSet<OsString>,
    /// The spinner's process (in the shared pool).
    pub spinner_pid: u32,
    /// The CPU the pod is to get alone.
    pub exclusive_cpu: u32,
    /// The CPU the thread keeps to.
    pub reserved_cpu: usize,
    /// From the thread's start to the container's: beyond that, a failure.
    pub start_timeout: Duration,
    /// From the container's start to exclusivity in place: beyond that, a failure.
    pub in_place_timeout: Duration,
}

/// What the thread reports: the start as soon as it is known (so that what is timed from it can
/// begin), then everything.
#[derive(Clone, Debug)]
pub enum Seen {
    Started { at_ns: u64, container_id: String },
    Finished(Watched),
}

/// Everything one watch saw; times in CLOCK_MONOTONIC ns.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Watched {
    /// The container's folder name: its runtime id.
    pub container_id: Option<String>,
    /// The first sample with a process in the container's `cgroup.procs`.
    pub start_ns: Option<u64>,
    /// Since when the container's process may run on the exclusive CPU alone ...
    pub pinned_ns: Option<u64>,
    /// ... and the spinner no longer on it, as of the sample that saw both.
    pub spinner_off_ns: Option<u64>,
    /// The later of the two: exclusivity in place.
    pub in_place_ns: Option<u64>,
    pub samples: u64,
    /// The longest time between two samples.
    pub max_interval_ns: u64,
    pub failure: Option<String>,
}

/// The watching thread; stopped when dropped.
pub struct Watch {
    stop: Arc<AtomicBool>,
}

impl Watch {
    /// Starts the thread; what it sees comes on the receiver.
    pub fn start(target: Target) -> std::io::Result<(Watch, mpsc::UnboundedReceiver<Seen>)> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::unbounded_channel();
        let thread_stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("cpumanager-watch".into())
            .spawn(move || {
                let watched = watch(&target, &thread_stop, &tx);
                let _ = tx.send(Seen::Finished(watched));
            })?;
        Ok((Watch { stop }, rx))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One container folder of the pod.
#[derive(Default)]
struct Folder {
    /// Its first process now (runc's first stages exit: it is read again at every sample).
    pid: Option<u32>,
    /// When it first had one.
    first_ns: Option<u64>,
    /// The sandbox's (its process became `pause`).
    sandbox: bool,
    /// Since when its process may run on the exclusive CPU alone.
    pinned_since: Option<u64>,
}

fn watch(target: &Target, stop: &AtomicBool, tx: &mpsc::UnboundedSender<Seen>) -> Watched {
    let mut reserved = nix::sched::CpuSet::new();
    if reserved.set(target.reserved_cpu).is_ok() {
        // Best effort: the measurement stands without it, a little noisier.
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &reserved);
    }
    let alone: CpuSet = [target.exclusive_cpu].into_iter().collect();
    let begun = monotonic_ns();
    let mut w = Watched::default();
    let mut pod: Option<PathBuf> = None;
    let mut folders: BTreeMap<String, Folder> = BTreeMap::new();
    let mut spinner_off_since: Option<u64> = None;
    let mut last_ns = begun;
    loop {
        if stop.load(Ordering::Relaxed) {
            w.failure = Some("the watch was stopped".into());
            return w;
        }
        let now = monotonic_ns();
        w.samples += 1;
        w.max_interval_ns = w.max_interval_ns.max(now - last_ns);
        last_ns = now;

        let Some(spinner) = cpus_allowed(target.spinner_pid) else {
            w.failure = Some(format!(
                "the spinner's process {} is gone",
                target.spinner_pid
            ));
            return w;
        };
        if spinner.contains(target.exclusive_cpu) {
            spinner_off_since = None;
        } else {
            spinner_off_since.get_or_insert(now);
        }

        if pod.is_none() {
            pod = new_pod_folder(&target.kubepods, &target.known_pods);
        }
        if let Some(pod) = &pod {
            look_at_containers(pod, &mut folders, &alone, now);
        }
        if w.container_id.is_none()
            && let Some((id, f)) = folders.iter().find(|(_, f)| !f.sandbox && is_started(f))
            && let Some(first_ns) = f.first_ns
        {
            w.container_id = Some(id.clone());
            w.start_ns = Some(first_ns);
            let _ = tx.send(Seen::Started {
                at_ns: first_ns,
                container_id: id.clone(),
            });
        }
        if let Some(id) = &w.container_id {
            let pinned = folders.get(id).and_then(|f| f.pinned_since);
            if let (Some(pinned), Some(off)) = (pinned, spinner_off_since) {
                w.pinned_ns = Some(pinned);
                w.spinner_off_ns = Some(off);
                w.in_place_ns = Some(pinned.max(off));
                return w;
            }
        }

        match w.start_ns {
            None if now - begun > nanos(target.start_timeout) => {
                w.failure = Some(format!(
                    "no container of the pod had a process within {:?} ({})",
                    target.start_timeout,
                    pod.as_ref().map_or_else(
                        || "its cgroup folder never appeared".to_owned(),
                        |p| format!("{} containers seen in {}", folders.len(), p.display())
                    )
                ));
                return w;
            }
            Some(start) if now - start > nanos(target.in_place_timeout) => {
                let pinned = w
                    .container_id
                    .as_ref()
                    .and_then(|id| folders.get(id))
                    .and_then(|f| f.pid)
                    .and_then(cpus_allowed);
                w.failure = Some(format!(
                    "exclusivity not in place {:?} after the start: the container may run on \
                     CPUs {}, the spinner on {spinner}",
                    target.in_place_timeout,
                    pinned.map_or_else(|| "?".to_owned(), |s| s.to_string())
                ));
                return w;
            }
            _ => {}
        }
        std::thread::sleep(INTERVAL);
    }
}

/// Whether the folder's process has left runc's init (a started container, or one that runc
/// created and has not started yet, is told apart from the sandbox only then).
fn is_started(f: &Folder) -> bool {
    f.pid
        .and_then(comm)
        .is_some_and(|c| c != "pause" && !c.starts_with("runc"))
}

/// The first `pod*` folder below `kubepods` that is not one of `known`.
fn new_pod_folder(kubepods: &Path, known: &BTreeSet<OsString>) -> Option<PathBuf> {
    std::fs::read_dir(kubepods)
        .ok()?
        .flatten()
        .find(|e| {
            let name = e.file_name();
            name.to_string_lossy().starts_with("pod")
                && !known.contains(&name)
                && e.file_type().is_ok_and(|t| t.is_dir())
        })
        .map(|e| e.path())
}

/// Notes the processes of the pod's container folders and what CPUs they may use.
fn look_at_containers(
    pod: &Path,
    folders: &mut BTreeMap<String, Folder>,
    alone: &CpuSet,
    now: u64,
) {
    let Ok(entries) = std::fs::read_dir(pod) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let id = entry.file_name().to_string_lossy().into_owned();
        let folder = folders.entry(id).or_default();
        if folder.sandbox {
            continue;
        }
        folder.pid = first_process(&entry.path());
        let Some(pid) = folder.pid else { continue };
        folder.first_ns.get_or_insert(now);
        if comm(pid).as_deref() == Some("pause") {
            folder.sandbox = true;
            continue;
        }
        if cpus_allowed(pid).as_ref() == Some(alone) {
            folder.pinned_since.get_or_insert(now);
        } else {
            folder.pinned_since = None;
        }
    }
}

/// The first process in a cgroup folder's `cgroup.procs`.
pub fn first_process(cgroup: &Path) -> Option<u32> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// The CPUs process `pid` may run on (`Cpus_allowed_list` of `/proc/<pid>/status`); `None` once
/// it is gone.
pub fn cpus_allowed(pid: u32) -> Option<CpuSet> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    CpuSet::parse(list.trim()).ok()
}

/// The process's name (`/proc/<pid>/comm`).
fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_owned())
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
