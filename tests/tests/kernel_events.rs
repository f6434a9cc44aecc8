//! The kernel event pipeline against the real kernel: real processes in real cgroups, the
//! programs loaded and attached as the agent does it. Run as root (`cargo xtask test`).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use swiftlet::kernel::{EventBody, KernelEvents, LoadOptions, MemoryPressure, StreamItem};
use swiftlet_common::{EventKind, PressureSource};
use swiftlet_tests::{TestCgroup, privileged, read_until, testproc};

fn load(watch: &[&TestCgroup], ring_bytes: Option<u32>) -> KernelEvents {
    let mut options = LoadOptions {
        watch: watch.iter().map(|c| c.dir.clone()).collect(),
        ..LoadOptions::default()
    };
    if let Some(bytes) = ring_bytes {
        options.ring_bytes = bytes;
    }
    KernelEvents::load(&options).unwrap_or_else(|e| panic!("load: {e} (hint: {:?})", e.hint()))
}

fn exit_of(body: &EventBody, pid: u32) -> Option<&swiftlet::kernel::ProcessExit> {
    match body {
        EventBody::Exit(e) if e.pid == pid => Some(e),
        _ => None,
    }
}

/// Exits with 0, with 3 and by SIGKILL: one event each, with the right pid, cgroup and status,
/// and nothing twice (a sentinel process's exit comes after anything the three could produce).
#[tokio::test]
async fn exit_events_carry_pid_cgroup_and_status() {
    if !privileged("exit_events_carry_pid_cgroup_and_status") {
        return;
    }
    let cgroup = TestCgroup::new("exits");
    let mut events = load(&[&cgroup], None);

    let mut zero = cgroup.spawn(Command::new(testproc()).args(["exit", "0"]));
    let mut three = cgroup.spawn(Command::new(testproc()).args(["exit", "3"]));
    let mut killed = cgroup.spawn(Command::new(testproc()).arg("sleep"));
    assert_eq!(zero.wait().expect("wait").code(), Some(0));
    assert_eq!(three.wait().expect("wait").code(), Some(3));
    killed.kill().expect("SIGKILL");
    let _ = killed.wait();
    let mut sentinel = cgroup.spawn(Command::new(testproc()).args(["exit", "42"]));
    let _ = sentinel.wait();
    let sentinel_pid = sentinel.id();

    let (last, before) =
        read_until(&mut events, |e| exit_of(&e.body, sentinel_pid).is_some()).await;
    let mut exits: HashMap<u32, Vec<swiftlet::kernel::ProcessExit>> = HashMap::new();
    for item in &before {
        if let StreamItem::Event(event) = item
            && let EventBody::Exit(exit) = &event.body
        {
            exits.entry(exit.pid).or_default().push(exit.clone());
        }
    }
    let one = |pid: u32| {
        let list = exits.get(&pid).cloned().unwrap_or_default();
        assert_eq!(
            list.len(),
            1,
            "exactly one exit event for pid {pid}: {list:#?}"
        );
        list[0].clone()
    };
    let e0 = one(zero.id());
    let e3 = one(three.id());
    let e9 = one(killed.id());
    for e in [&e0, &e3, &e9] {
        assert_eq!(
            e.cgroup_id,
            cgroup.id(),
            "cgroup id is the inode of the cgroup directory"
        );
        assert_eq!(
            e.tid, e.pid,
            "a single-threaded process exits through its only thread"
        );
    }
    assert_eq!((e0.exit_code, e0.signal), (Some(0), None));
    assert_eq!((e3.exit_code, e3.signal), (Some(3), None));
    assert_eq!((e9.exit_code, e9.signal), (None, Some(9)));
    assert_eq!(e9.container_exit_code(), 137);
    assert_eq!(
        exit_of(&last.body, sentinel_pid).and_then(|e| e.exit_code),
        Some(42)
    );
    // Everything before the sentinel was about our processes only.
    assert!(
        exits
            .keys()
            .all(|pid| [zero.id(), three.id(), killed.id()].contains(pid))
    );
}

/// Threads that exit do not make process-exit events; a process whose main thread leaves first
/// is reported once, when its last thread ends it, with that thread's exit code.
#[tokio::test]
async fn thread_exits_are_not_process_exits() {
    if !privileged("thread_exits_are_not_process_exits") {
        return;
    }
    let cgroup = TestCgroup::new("threads");
    let mut events = load(&[&cgroup], None);

    let mut threads = cgroup.spawn(Command::new(testproc()).args(["threads", "8"]));
    assert_eq!(threads.wait().expect("wait").code(), Some(0));
    let mut leader_first = cgroup.spawn(Command::new(testproc()).args(["leader-first", "5"]));
    assert_eq!(leader_first.wait().expect("wait").code(), Some(5));
    let mut sentinel = cgroup.spawn(Command::new(testproc()).args(["exit", "0"]));
    let _ = sentinel.wait();
    let sentinel_pid = sentinel.id();

    let (_, before) = read_until(&mut events, |e| exit_of(&e.body, sentinel_pid).is_some()).await;
    let exits: Vec<_> = before
        .iter()
        .filter_map(|item| match item {
            StreamItem::Event(event) => match &event.body {
                EventBody::Exit(exit) => Some(exit.clone()),
                _ => None,
            },
            StreamItem::Lost { .. } => None,
        })
        .collect();
    assert_eq!(
        exits.len(),
        2,
        "one event per process, none per thread: {exits:#?}"
    );
    assert_eq!(exits[0].pid, threads.id());
    assert_eq!(exits[0].exit_code, Some(0));
    assert_eq!(exits[1].pid, leader_first.id());
    assert_eq!(exits[1].exit_code, Some(5));
    assert_ne!(
        exits[1].tid, exits[1].pid,
        "the last thread, not the leader, ended it"
    );
}

/// Processes outside the watched subtree make no events; processes in a child cgroup created after
/// the filter was set do.
#[tokio::test]
async fn the_filter_keeps_only_watched_subtrees() {
    if !privileged("the_filter_keeps_only_watched_subtrees") {
        return;
    }
    let watched = TestCgroup::new("watched");
    let outside = watched.prefix_sibling("x");
    let mut events = load(&[&watched], None);

    let mut out = outside.spawn(Command::new(testproc()).args(["exit", "0"]));
    let _ = out.wait();
    let nested = watched.child("nested");
    let mut inside = nested.spawn(Command::new(testproc()).args(["exit", "0"]));
    let _ = inside.wait();
    let inside_pid = inside.id();

    let (event, before) = read_until(&mut events, |e| exit_of(&e.body, inside_pid).is_some()).await;
    assert_eq!(event.body.cgroup_id(), nested.id());
    let foreign: Vec<_> = before
        .iter()
        .filter(|item| match item {
            StreamItem::Event(e) => {
                e.body.cgroup_id() == outside.id()
                    || matches!(&e.body, EventBody::Exit(x) if x.pid == out.id())
            }
            StreamItem::Lost { .. } => false,
        })
        .collect();
    assert!(
        foreign.is_empty(),
        "events from outside the filter: {foreign:#?}"
    );
    // The only cgroup event is the nested mkdir (the sibling's mkdir came before the load).
    let mkdirs: Vec<_> = before
        .iter()
        .filter_map(|item| match item {
            StreamItem::Event(e) => match &e.body {
                EventBody::CgroupMkdir(c) => Some(c.clone()),
                _ => None,
            },
            StreamItem::Lost { .. } => None,
        })
        .collect();
    assert_eq!(mkdirs.len(), 1, "{mkdirs:#?}");
    assert_eq!(mkdirs[0].cgroup_id, nested.id());
}

/// A process allocating past its cgroup's memory limit is OOM-killed: the oom event names its pid
/// and cgroup, and comes before its exit event (killed by SIGKILL).
#[tokio::test]
async fn oom_kills_name_the_victim_and_its_cgroup() {
    if !privileged("oom_kills_name_the_victim_and_its_cgroup") {
        return;
    }
    let cgroup = TestCgroup::with_memory_limit("oom", 32 << 20);
    let mut events = load(&[&cgroup], None);

    let mut hog = cgroup.spawn(
        Command::new(testproc())
            .args(["alloc", "512"])
            .stdout(std::process::Stdio::null()),
    );
    let status = hog.wait().expect("wait");
    let pid = hog.id();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        status.signal(),
        Some(9),
        "the OOM killer kills with SIGKILL"
    );

    let (oom, _) = read_until(
        &mut events,
        |e| matches!(&e.body, EventBody::Oom(o) if o.pid == pid),
    )
    .await;
    let EventBody::Oom(kill) = &oom.body else {
        unreachable!()
    };
    assert_eq!(kill.cgroup_id, cgroup.id());
    assert_eq!(
        kill.comm, "swiftlet-testpr",
        "comm is the kernel's 15-byte task name"
    );
    assert!(
        kill.exit_ts_ns >= oom.ts_ns,
        "the victim exits after it is chosen"
    );
    if let Some(rss) = kill.anon_rss_kb {
        assert!(rss > 0, "the victim had anonymous memory");
    }
    let (exit, _) = read_until(&mut events, |e| exit_of(&e.body, pid).is_some()).await;
    let EventBody::Exit(exit) = &exit.body else {
        unreachable!()
    };
    assert_eq!(exit.signal, Some(9));
    assert_eq!(exit.cgroup_id, cgroup.id());
}

/// mkdir and rmdir of a cgroup in a watched subtree: events with its id, level and path.
#[tokio::test]
async fn cgroup_mkdir_and_rmdir_events() {
    if !privileged("cgroup_mkdir_and_rmdir_events") {
        return;
    }
    let parent = TestCgroup::new("cgroups");
    let mut events = load(&[&parent], None);

    let child_dir = parent.dir.join("child");
    std::fs::create_dir(&child_dir).expect("mkdir");
    let id = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&child_dir).expect("stat"));
    std::fs::remove_dir(&child_dir).expect("rmdir");

    let expected_path = format!("{}/child", parent.path);
    let (mkdir, _) = read_until(&mut events, |e| matches!(e.body, EventBody::CgroupMkdir(_))).await;
    let (rmdir, _) = read_until(&mut events, |e| matches!(e.body, EventBody::CgroupRmdir(_))).await;
    for (event, kind) in [
        (&mkdir, EventKind::CgroupMkdir),
        (&rmdir, EventKind::CgroupRmdir),
    ] {
        assert_eq!(event.body.kind(), kind);
        let (EventBody::CgroupMkdir(c) | EventBody::CgroupRmdir(c)) = &event.body else {
            unreachable!()
        };
        assert_eq!(c.cgroup_id, id);
        assert_eq!(c.path.to_str(), Some(expected_path.as_str()));
        assert_eq!(c.level as usize, expected_path.matches('/').count());
    }
    assert!(mkdir.ts_ns < rmdir.ts_ns);
}

/// A burst larger than a one-page ring buffer: some events are lost, the kernel counts them, and
/// delivered + lost equals what was produced.
#[tokio::test]
async fn losses_are_counted_and_add_up() {
    if !privileged("losses_are_counted_and_add_up") {
        return;
    }
    const CHILDREN: u64 = 2000;
    let cgroup = TestCgroup::new("losses");
    let mut events = load(&[&cgroup], Some(4096));

    // Nothing reads the ring while the storm runs, so it overflows.
    let mut storm = cgroup.spawn(
        Command::new(testproc())
            .args(["storm", &CHILDREN.to_string()])
            .stdout(std::process::Stdio::null()),
    );
    assert!(storm.wait().expect("wait").success());
    let produced = CHILDREN + 1; // the children and the storm process itself

    let counters = events.counters().read().expect("counters");
    let exits = counters.get(EventKind::Exit);
    assert!(
        exits.lost > 0,
        "a one-page ring cannot hold {produced} exits: {exits:?}"
    );
    assert_eq!(exits.submitted + exits.lost, produced, "{exits:?}");
    assert_eq!(exits.errors, 0);

    let mut delivered = 0u64;
    let mut lost_reported = 0u64;
    let drained = tokio::time::timeout(swiftlet_tests::EVENT_WAIT, async {
        while delivered < exits.submitted {
            match events.next().await.expect("stream") {
                StreamItem::Event(e) if e.body.kind() == EventKind::Exit => delivered += 1,
                StreamItem::Lost { count } => lost_reported += count,
                StreamItem::Event(_) => {}
            }
        }
    })
    .await;
    assert!(
        drained.is_ok(),
        "delivered {delivered} of {} submitted",
        exits.submitted
    );
    assert_eq!(delivered + exits.lost, produced);
    assert_eq!(events.delivered()[EventKind::Exit as usize], delivered);
    assert!(lost_reported > 0, "the records after a loss say so");
    assert_eq!(events.malformed(), 0);
}

/// A file on disk (not tmpfs, whose pages are never reclaimed), removed on drop.
struct ScratchFile(PathBuf);

impl ScratchFile {
    /// `mib` MiB written and synced, so its cached pages are clean and can be dropped.
    fn new(name: &str, mib: usize) -> ScratchFile {
        use std::io::Write as _;
        let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("swiftlet-test-{}-{name}", std::process::id()));
        let guard = ScratchFile(path);
        let write = |path: &Path| {
            let mut file = std::fs::File::create(path)?;
            let block = vec![0x5au8; 1 << 20];
            for _ in 0..mib {
                file.write_all(&block)?;
            }
            file.sync_all()
        };
        write(&guard.0).unwrap_or_else(|e| panic!("scratch file {}: {e}", guard.0.display()));
        guard
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Reads `file` twice from a process in `cgroup`, through the page cache (the reader first drops
/// the file's cached pages, so every page it reads is charged to `cgroup`); returns how long it
/// took.
fn read_through(cgroup: &TestCgroup, file: &ScratchFile) -> Duration {
    let started = Instant::now();
    let mut reader = cgroup.spawn(
        Command::new(testproc())
            .arg("read")
            .arg(&file.0)
            .arg("2")
            .stdout(Stdio::null()),
    );
    let status = reader
        .wait()
        .unwrap_or_else(|e| panic!("wait for the reader: {e}"));
    assert!(status.success(), "the reader failed: {status}");
    started.elapsed()
}

/// Everything the stream delivered until a sentinel process in `cgroup` exited (the ring is in
/// kernel order, so whatever `cgroup` caused before is in it), and the pressure records among it.
async fn until_sentinel(
    events: &mut KernelEvents,
    cgroup: &TestCgroup,
) -> (Vec<StreamItem>, Vec<MemoryPressure>) {
    let mut sentinel = cgroup.spawn(Command::new(testproc()).args(["exit", "0"]));
    let _ = sentinel.wait();
    let sentinel_pid = sentinel.id();
    let (_, before) = read_until(events, |e| exit_of(&e.body, sentinel_pid).is_some()).await;
    let pressure = before
        .iter()
        .filter_map(|item| match item {
            StreamItem::Event(e) => match &e.body {
                EventBody::Pressure(p) => Some(p.clone()),
                _ => None,
            },
            StreamItem::Lost { .. } => None,
        })
        .collect();
    (before, pressure)
}

fn memcg_records(pressure: &[MemoryPressure]) -> Vec<&MemoryPressure> {
    pressure
        .iter()
        .filter(|p| p.source == PressureSource::MemcgReclaim)
        .collect()
}

const PRESSURE_LIMIT: u64 = 32 << 20;
const PRESSURE_FILE_MIB: usize = 128;

/// Reading 4x a cgroup's 32 MiB memory limit through the page cache makes the kernel reclaim in
/// that cgroup about a hundred times. In a watched cgroup that is reported as `memcg_reclaim`
/// records with the cgroup's id, at most one per CPU per interval, the calls in between counted
/// as suppressed (not lost); the same reading in an unwatched cgroup is not reported at all.
#[tokio::test]
async fn memcg_reclaim_is_reported_rate_limited_for_watched_cgroups_only() {
    if !privileged("memcg_reclaim_is_reported_rate_limited_for_watched_cgroups_only") {
        return;
    }
    let watched = TestCgroup::with_memory_limit("pressure", PRESSURE_LIMIT);
    let outside = TestCgroup::with_memory_limit("pressure-outside", PRESSURE_LIMIT);
    let file = ScratchFile::new("pressure", PRESSURE_FILE_MIB);
    let mut events = load(&[&watched], None);
    assert_eq!(
        events.info().pressure_sources,
        PressureSource::ALL.to_vec(),
        "every vmscan tracepoint is attached on this kernel"
    );
    let interval = LoadOptions::default().pressure_min_interval;

    read_through(&outside, &file);
    let elapsed = read_through(&watched, &file);
    let (_, pressure) = until_sentinel(&mut events, &watched).await;
    let memcg = memcg_records(&pressure);
    assert!(!memcg.is_empty(), "no memcg_reclaim record: {pressure:#?}");
    for p in &memcg {
        assert_eq!(
            p.cgroup_id,
            watched.id(),
            "memcg reclaim is reported for the watched cgroup only: {p:?}"
        );
        assert_eq!(
            p.order,
            Some(0),
            "memcg reclaim is for order-0 charges: {p:?}"
        );
    }

    // The rate limit: at most one record per CPU per interval, the rest folded into `suppressed`.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u128;
    let bound = cpus * (elapsed.as_nanos() / interval.as_nanos() + 1);
    let suppressed: u64 = memcg.iter().map(|p| p.suppressed).sum();
    eprintln!(
        "memcg_reclaim: {} records, {suppressed} suppressed in {elapsed:?} (bound {bound})",
        memcg.len()
    );
    assert!(
        memcg.len() as u128 <= bound,
        "{} records in {elapsed:?} on {cpus} CPUs at one per {interval:?}",
        memcg.len()
    );
    assert!(
        suppressed >= memcg.len() as u64,
        "the storm was folded into few records: {memcg:#?}"
    );

    // Suppressed is not lost: every pressure record was submitted and delivered.
    let counters = events
        .counters()
        .read()
        .expect("counters")
        .get(EventKind::Pressure);
    let delivered = events.delivered()[EventKind::Pressure as usize];
    assert_eq!(delivered, pressure.len() as u64);
    assert_eq!((counters.lost, counters.errors), (0, 0), "{counters:?}");
    assert!(counters.submitted >= delivered, "{counters:?}");
    assert_eq!(events.malformed(), 0);
}

/// The interval is the agent's to choose: with none, every reclaim call is a record (none
/// suppressed), which counts the calls; with the default, the same reading makes far fewer.
#[tokio::test]
async fn the_pressure_rate_limit_follows_the_configured_interval() {
    if !privileged("the_pressure_rate_limit_follows_the_configured_interval") {
        return;
    }
    let cgroup = TestCgroup::with_memory_limit("pressure-rate", PRESSURE_LIMIT);
    let file = ScratchFile::new("pressure-rate", PRESSURE_FILE_MIB);
    let count_records = async |interval: Duration| {
        let mut events = KernelEvents::load(&LoadOptions {
            watch: vec![cgroup.dir.clone()],
            pressure_min_interval: interval,
            ..LoadOptions::default()
        })
        .unwrap_or_else(|e| panic!("load: {e} (hint: {:?})", e.hint()));
        read_through(&cgroup, &file);
        let (_, pressure) = until_sentinel(&mut events, &cgroup).await;
        let lost = events
            .counters()
            .read()
            .expect("counters")
            .get(EventKind::Pressure)
            .lost;
        assert_eq!(lost, 0, "a 1 MiB ring holds every record of this run");
        memcg_records(&pressure)
            .into_iter()
            .cloned()
            .collect::<Vec<_>>()
    };

    let every_call = count_records(Duration::ZERO).await;
    assert!(
        every_call.iter().all(|p| p.suppressed == 0),
        "nothing is suppressed without an interval"
    );
    let limited = count_records(LoadOptions::default().pressure_min_interval).await;
    eprintln!(
        "memcg_reclaim: {} reclaim calls, {} records at the default interval",
        every_call.len(),
        limited.len()
    );
    assert!(
        !limited.is_empty() && limited.len() * 4 <= every_call.len(),
        "far fewer records ({}) than reclaim calls ({})",
        limited.len(),
        every_call.len()
    );
}
