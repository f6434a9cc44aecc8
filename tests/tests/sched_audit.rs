//! The scheduler audit against the real kernel: busy processes in real cgroups, pinned to one CPU
//! that one of the cgroups owns. Run as root (`cargo xtask test`). Asserts orderings and counts,
//! never durations: the sleeps only give the scheduler time to switch.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Child, Command},
    thread,
    time::Duration,
};

use nix::{
    sched::{CpuSet, sched_getaffinity, sched_setaffinity},
    unistd::Pid,
};
use swiftlet::kernel::{SchedAudit, cgroup_id_of};
use swiftlet_common::MAX_CPUS;
use swiftlet_tests::{TestCgroup, privileged, testproc};

/// Time for the spinners to be switched out and in many times over.
const SETTLE: Duration = Duration::from_millis(300);

/// A busy process pinned to one CPU, killed and reaped on drop.
struct Spinner(Child);

impl Spinner {
    /// A spinner that sleeps 1 ms every 10 ms, so its CPU switches tasks even when nothing else
    /// wants it.
    fn start(cgroup: &TestCgroup, cpu: usize) -> Spinner {
        Spinner::spawn(cgroup, cpu, &["spin", "10"])
    }

    /// A spinner that never sleeps: it leaves the CPU only when preempted.
    fn never_sleeping(cgroup: &TestCgroup, cpu: usize) -> Spinner {
        Spinner::spawn(cgroup, cpu, &["spin"])
    }

    fn spawn(cgroup: &TestCgroup, cpu: usize, args: &[&str]) -> Spinner {
        let mut set = CpuSet::new();
        set.set(cpu).expect("a CPU number within CpuSet");
        let mut command = Command::new(testproc());
        command.args(args);
        // SAFETY: runs between fork and exec and only makes the sched_setaffinity syscall, which
        // is async-signal-safe, on a set built before the fork.
        unsafe {
            command.pre_exec(move || {
                sched_setaffinity(Pid::from_raw(0), &set).map_err(std::io::Error::from)
            });
        }
        Spinner(cgroup.spawn(&mut command))
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The highest CPU this process may run on: on a machine with two or more, not the one the test
/// harness is most likely on.
fn audited_cpu() -> usize {
    let allowed = sched_getaffinity(Pid::from_raw(0)).expect("sched_getaffinity");
    (0..CpuSet::count())
        .rev()
        .find(|&cpu| allowed.is_set(cpu).unwrap_or(false))
        .expect("at least one CPU")
}

fn load() -> SchedAudit {
    SchedAudit::load(Path::new("/sys/kernel/btf/vmlinux"))
        .unwrap_or_else(|e| panic!("load: {e} (hint: {:?})", e.hint()))
}

/// The foreign time of `intruder` on `owner`'s `cpu` so far.
fn foreign_ns(audit: &SchedAudit, cpu: u32, owner: u64, intruder: u64) -> u64 {
    audit
        .foreign()
        .expect("read foreign time")
        .iter()
        .filter(|r| r.cpu == cpu && r.owner == owner && r.intruder == intruder)
        .map(|r| r.ns)
        .sum()
}

/// B's process on A's CPU is foreign time that grows; A's own process there is not; once A no
/// longer owns the CPU, B's time there stops counting; two of B's processes sharing the CPU, never
/// sleeping, wait for each other in the run queue (preemption, not wakeups, puts them there).
#[test]
fn foreign_time_on_an_owned_cpu_and_run_queue_waits() {
    if !privileged("foreign_time_on_an_owned_cpu_and_run_queue_waits") {
        return;
    }
    let a = TestCgroup::new("sched-owner");
    let b = TestCgroup::new("sched-intruder");
    let id_a = cgroup_id_of(&a.dir).expect("cgroup id of A");
    let id_b = cgroup_id_of(&b.dir).expect("cgroup id of B");
    assert_eq!((id_a, id_b), (a.id(), b.id()));
    let audit = load();
    let pinned = audited_cpu();
    let cpu = pinned as u32;

    audit.set_owner(cpu, id_a).expect("set owner");
    assert_eq!(audit.owners().expect("owners"), [(cpu, id_a)]);
    assert!(
        audit.set_owner(MAX_CPUS, id_a).is_err(),
        "CPUs beyond the owner array are refused"
    );

    // B alone on A's CPU: all of its time there is foreign, and it keeps adding up.
    let intruder = Spinner::start(&b, pinned);
    thread::sleep(SETTLE);
    let first = foreign_ns(&audit, cpu, id_a, id_b);
    thread::sleep(SETTLE);
    let second = foreign_ns(&audit, cpu, id_a, id_b);
    assert!(first > 0, "B ran on A's CPU {cpu}: {:#?}", audit.foreign());
    assert!(
        second > first,
        "B's foreign time grows: {first} then {second}"
    );
    drop(intruder);

    // A alone on its own CPU: never foreign.
    let owner = Spinner::start(&a, pinned);
    thread::sleep(SETTLE);
    let runs = audit.foreign().expect("read foreign time");
    assert!(
        runs.iter().all(|r| r.intruder != id_a),
        "the owner's own time counted as foreign: {runs:#?}"
    );
    drop(owner);

    // Two of B's processes share the CPU, first while A owns it, then after ownership is
    // cleared: from then on nothing is added. They never sleep, so after their start (a
    // wakeup each) only preemption makes them wait.
    let spinners = [
        Spinner::never_sleeping(&b, pinned),
        Spinner::never_sleeping(&b, pinned),
    ];
    thread::sleep(SETTLE);
    let while_owned = foreign_ns(&audit, cpu, id_a, id_b);
    assert!(while_owned > second, "{second} then {while_owned}");
    let runq_count = |audit: &SchedAudit| {
        audit
            .runqueue()
            .expect("read run-queue histograms")
            .get(&id_b)
            .map_or(0, |h| h.count())
    };
    let waits = runq_count(&audit);
    audit.set_owner(cpu, 0).expect("clear owner");
    assert!(audit.owners().expect("owners").is_empty());
    // A switch that read the owner just before it was cleared may still be adding.
    thread::sleep(Duration::from_millis(50));
    let cleared = foreign_ns(&audit, cpu, id_a, id_b);
    thread::sleep(SETTLE);
    assert_eq!(
        foreign_ns(&audit, cpu, id_a, id_b),
        cleared,
        "B's time stops counting once the CPU has no owner"
    );

    let runq = audit.runqueue().expect("read run-queue histograms");
    let hist = runq
        .get(&id_b)
        .unwrap_or_else(|| panic!("no run-queue histogram for B ({id_b})"));
    assert!(
        hist.count() > waits && waits > 0,
        "preempted spinners keep waiting: {waits} then {hist:?}"
    );
    assert!(hist.sum_ns > 0, "{hist:?}");
    drop(spinners);
    // A reaped spinner still has its last switch-out to make: its parent's wait returns once the
    // exit is notified, before the dying task leaves the CPU, and that switch-out charges B's
    // run-queue wait (CI on 6.1 under emulation saw it land after the removal below).
    thread::sleep(SETTLE);

    let counters = audit.counters().expect("counters");
    assert_eq!(counters.errors, 0, "{counters:?}");
    assert_eq!(counters.foreign_full, 0, "{counters:?}");

    // A cgroup that is gone is forgotten on request.
    audit.remove_cgroup(id_b).expect("remove B");
    let runs = audit.foreign().expect("read foreign time");
    assert!(runs.iter().all(|r| r.intruder != id_b), "{runs:#?}");
    assert!(!audit.runqueue().expect("runqueue").contains_key(&id_b));
}

/// Two audits are independent: each has its own owners and counts, and dropping one leaves the
/// other working.
#[test]
fn audits_are_independent() {
    if !privileged("audits_are_independent") {
        return;
    }
    let a = TestCgroup::new("sched-independent");
    let id_a = a.id();
    let cpu = audited_cpu();
    let first = load();
    let second = load();
    first.set_owner(cpu as u32, id_a).expect("set owner");
    assert!(second.owners().expect("owners").is_empty());
    drop(first);

    second.set_owner(cpu as u32, id_a).expect("set owner");
    let other = TestCgroup::new("sched-independent-other");
    let spinner = Spinner::start(&other, cpu);
    thread::sleep(SETTLE);
    drop(spinner);
    assert!(
        second
            .foreign()
            .expect("foreign")
            .iter()
            .any(|r| r.owner == id_a && r.intruder == other.id()),
        "{:#?}",
        second.foreign()
    );
}
