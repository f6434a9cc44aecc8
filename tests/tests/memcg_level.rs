//! The eviction manager's memory level wake-up against the real kernel, chosen by where the
//! memory controller is (never skipped for it): on cgroup v2 (the kernel matrix's VMs), the
//! charge programs fire once per arming when a process in a child of the watched cgroup takes its
//! usage to the level, and never for a sibling's charges; on a v1 memory controller (a hybrid
//! host) they are left out, saying why, and the v1 usage threshold does the same job. Run as root.
#![expect(
    clippy::print_stdout,
    reason = "the report line is the matrix's output, read from the test's stdout"
)]
#![expect(
    clippy::expect_used,
    reason = "tests: the helpers below each test's two halves fail it with the reason"
)]

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use swiftlet::{
    cm::CgroupLayout,
    eviction::memcg::UsageThreshold,
    kernel::{EventBody, KernelEvents, LoadOptions, MemcgLevel, StreamItem},
};
use swiftlet_tests::{TestCgroup, privileged, read_until, testproc};

const MIB: u64 = 1 << 20;

fn page() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as u64)
}

fn current(dir: &Path) -> u64 {
    let path = dir.join("memory.current");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .expect("a byte count")
}

fn enable_memory(dir: &Path) {
    let control = dir.join("cgroup.subtree_control");
    std::fs::write(&control, "+memory")
        .unwrap_or_else(|e| panic!("+memory in {}: {e}", control.display()));
}

/// A process that allocates (and touches) `mib` MiB, returned once it says it has.
fn hog(spawn: impl FnOnce(&mut Command) -> Child, mib: u64) -> Child {
    let mut command = Command::new(testproc());
    command
        .args(["alloc", &mib.to_string()])
        .stdout(Stdio::piped());
    let mut child = spawn(&mut command);
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the hog's report");
    assert!(line.starts_with("allocated"), "the hog says: {line:?}");
    child
}

fn kill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn level_records(items: &[StreamItem]) -> Vec<MemcgLevel> {
    items
        .iter()
        .filter_map(|item| match item {
            StreamItem::Event(e) => match &e.body {
                EventBody::MemcgLevel(m) => Some(m.clone()),
                _ => None,
            },
            StreamItem::Lost { .. } => None,
        })
        .collect()
}

/// Everything the programs emitted up to a sentinel process's exit in `leaf`: the ring keeps the
/// kernel's order, so a record of anything done before it precedes that exit.
async fn until_sentinel(events: &mut KernelEvents, leaf: &TestCgroup) -> Vec<StreamItem> {
    let mut sentinel = leaf.spawn(Command::new(testproc()).args(["exit", "0"]));
    let _ = sentinel.wait();
    let pid = sentinel.id();
    let (_, before) = read_until(
        events,
        |e| matches!(&e.body, EventBody::Exit(x) if x.pid == pid),
    )
    .await;
    before
}

#[tokio::test]
async fn the_memory_level_fires_once_per_arming_for_the_watched_subtree_only() {
    let test = "the_memory_level_fires_once_per_arming_for_the_watched_subtree_only";
    if !privileged(test) {
        return;
    }
    let layout = CgroupLayout::detect().expect("cgroup layout");
    match layout {
        CgroupLayout::Unified { .. } => on_cgroup_v2(test).await,
        other => on_a_v1_memory_controller(test, &other).await,
    }
}

async fn on_cgroup_v2(test: &str) {
    // The pods' cgroup stand-in, with the memory controller for its children, a container two
    // levels below it (the charges walk up to it), and a sibling outside.
    let watched = TestCgroup::new("level");
    let sibling = watched.prefix_sibling("x");
    if let Some(root) = watched.dir.parent() {
        enable_memory(root);
    }
    enable_memory(&watched.dir);
    let pod = watched.child("pod");
    enable_memory(&pod.dir);
    let container = pod.child("container");

    let mut events = KernelEvents::load(&LoadOptions {
        watch: vec![watched.dir.clone()],
        ..LoadOptions::default()
    })
    .unwrap_or_else(|e| panic!("load: {e} (hint: {:?})", e.hint()));
    assert_eq!(
        events.info().memcg_level,
        Ok(()),
        "the level programs attach on cgroup v2"
    );
    let trigger = events.memcg_trigger().expect("the level trigger");
    let id = trigger.watch(&watched.dir).expect("the counter is learnt");
    assert_eq!(id, watched.id());
    let watch = trigger.get().expect("the trigger");
    assert_ne!(watch.counter, 0, "discovery stored the counter's address");
    assert_eq!(watch.armed, 0, "watching does not arm");

    // Armed 8 MiB above the watched usage: a sibling's 32 MiB is not its business.
    let pages = |bytes: u64| bytes.div_ceil(page());
    let level = pages(current(&watched.dir) + 8 * MIB);
    trigger.arm(level).expect("arm");
    let outside = hog(|c| sibling.spawn(c), 32);
    kill(outside);
    let before = until_sentinel(&mut events, &container).await;
    assert_eq!(level_records(&before), [], "a sibling's charges never fire");
    assert_eq!(
        trigger.get().expect("the trigger").armed,
        1,
        "still armed after the sibling's charges"
    );

    // The container's 32 MiB crosses it: one record, and the trigger disarmed.
    let first = hog(|c| container.spawn(c), 32);
    let (record, _) = read_until(&mut events, |e| matches!(e.body, EventBody::MemcgLevel(_))).await;
    let EventBody::MemcgLevel(crossed) = &record.body else {
        unreachable!()
    };
    assert_eq!(crossed.cgroup_id, watched.id());
    assert_eq!(crossed.level_pages, level);
    assert!(
        crossed.usage_pages < level && crossed.usage_pages + crossed.nr_pages >= level,
        "the record is the charge that crossed: {crossed:?}"
    );
    assert_eq!(
        trigger.get().expect("the trigger").armed,
        0,
        "fired once, disarmed"
    );
    // More charges without a new arming: nothing more.
    let second = hog(|c| container.spawn(c), 16);
    let after = until_sentinel(&mut events, &container).await;
    assert_eq!(level_records(&after), [], "one record per arming");

    // Armed again above what the two hogs hold: the next crossing makes exactly one more.
    let level = pages(current(&watched.dir) + 8 * MIB);
    trigger.arm(level).expect("re-arm");
    let third = hog(|c| container.spawn(c), 32);
    let after = until_sentinel(&mut events, &container).await;
    let records = level_records(&after);
    assert_eq!(
        records.len(),
        1,
        "one record for the second arming: {records:?}"
    );
    assert_eq!(records[0].level_pages, level);
    for child in [first, second, third] {
        kill(child);
    }
    let counters = events.counters().read().expect("counters");
    let kind = counters.get(swiftlet_common::EventKind::MemcgLevel);
    assert_eq!(kind.errors, 0, "no failed kernel read: {kind:?}");
    assert_eq!(kind.submitted, 2, "two armings, two records: {kind:?}");
    println!(
        "swiftlet-vm-report {test}: cgroup v2: fentry level trigger, one record per arming \
         (2 of 2), none for the sibling"
    );
}

/// A v1 memory cgroup for the test, removed (after killing what runs in it) on drop.
struct V1Memcg(PathBuf);

impl V1Memcg {
    fn new(dir: PathBuf) -> V1Memcg {
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        V1Memcg(dir)
    }

    fn spawn(&self, command: &mut Command) -> Child {
        let procs = self.0.join("cgroup.procs");
        // SAFETY: only an open(2) and a write(2) between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || {
                std::fs::write(&procs, "0")
            });
        }
        command.spawn().expect("spawn in the v1 memory cgroup")
    }
}

impl Drop for V1Memcg {
    fn drop(&mut self) {
        for _ in 0..100 {
            let pids = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
            for pid in pids.lines().filter_map(|l| l.trim().parse().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

async fn on_a_v1_memory_controller(test: &str, layout: &CgroupLayout) {
    // The level programs stay out, saying why.
    let events = KernelEvents::load(&LoadOptions::default())
        .unwrap_or_else(|e| panic!("load: {e} (hint: {:?})", e.hint()));
    let why = events.info().memcg_level.clone().expect_err("not attached");
    assert!(why.contains("not on cgroup v2"), "{why}");
    assert!(events.memcg_trigger().is_none());
    drop(events);

    // The v1 usage threshold does the job: a child's charges cross it; a sibling's do not count.
    let memory_root = layout
        .v1_controller("memory")
        .filter(|p| p.exists())
        .expect("a v1 memory controller");
    let unique = format!("swiftlet-test-{}-level", std::process::id());
    let watched = V1Memcg::new(memory_root.join(&unique));
    let sibling = V1Memcg::new(memory_root.join(format!("{unique}x")));
    if watched.0.join("memory.use_hierarchy").exists() {
        // Hierarchical accounting (always on since 5.x; writable only while empty).
        let _ = std::fs::write(watched.0.join("memory.use_hierarchy"), "1");
    }
    let child = V1Memcg::new(watched.0.join("container"));
    let usage = |dir: &Path| -> u64 {
        std::fs::read_to_string(dir.join("memory.usage_in_bytes"))
            .expect("usage")
            .trim()
            .parse()
            .expect("a byte count")
    };
    let level = usage(&watched.0) + 8 * MIB;
    let threshold = UsageThreshold::arm(&watched.0, level).expect("armed");
    let outside = hog(|c| sibling.spawn(c), 32);
    assert!(
        usage(&watched.0) < level,
        "a sibling's 32 MiB are not the watched cgroup's"
    );
    kill(outside);
    let inside = hog(|c| child.spawn(c), 32);
    let crossed = tokio::time::timeout(swiftlet_tests::event_wait(), threshold.crossed()).await;
    kill(inside);
    assert!(
        matches!(crossed, Ok(Ok(()))),
        "the child's charges cross it: {crossed:?}"
    );
    println!(
        "swiftlet-vm-report {test}: {} layout: level programs left out ({why}); v1 usage \
         threshold crossed by the child's charges",
        layout.name()
    );
}
