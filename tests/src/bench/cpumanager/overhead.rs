//! What the scheduler audit costs a context-switch-heavy workload: two threads pinned to one CPU
//! ping-pong a byte through two pipes (each round trip is two wakeups and two context switches
//! on that CPU), and the round trips per second are counted over windows that alternate between
//! no audit and the audit loaded, in one process. With the audit, the CPU is owned by a cgroup
//! that does not exist, so every switch there also takes the foreign-time path: the most the
//! audit can cost a switch.
//!
//! The audit is loaded for each audited window and dropped after it (loading, i.e. the verifier,
//! is outside the windows), and the order alternates (ABBA), so a drift in the machine's speed
//! weighs on both modes alike. Needs root.

use std::{
    io::{self, Read as _, Write as _},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use nix::{
    sched::{CpuSet, sched_getaffinity, sched_setaffinity},
    unistd::Pid,
};
use serde::Serialize;
use swiftlet::kernel::SchedAudit;

use crate::bench::stats::nearest_rank;

/// The owner set on the measured CPU: no cgroup has this id, so every task there is foreign.
const NO_SUCH_CGROUP: u64 = u64::MAX;

/// After the audit is loaded or dropped, before a window starts.
const SETTLE: Duration = Duration::from_millis(20);

/// Context switches on the measured CPU per round trip.
const SWITCHES_PER_ROUND_TRIP: f64 = 2.0;

/// Round trips per second in each window, by mode, and what the audit costs.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadResult {
    /// The CPU both threads ran on (and the audit's owned CPU).
    pub cpu: u32,
    pub window_ms: f64,
    /// Round trips per second of each window without the audit, in run order.
    pub without: Vec<u64>,
    /// Round trips per second of each window with the audit loaded, in run order.
    pub with: Vec<u64>,
    pub median_without: u64,
    pub median_with: u64,
    /// `1 - median_with / median_without`: the share of the round trips the audit costs
    /// (negative when the noise favours the audited windows).
    pub overhead: f64,
    /// What the difference of the medians comes to per context switch, in ns.
    pub added_ns_per_switch: f64,
}

impl OverheadResult {
    /// Summarises the windows' rates.
    pub fn of(cpu: u32, window: Duration, without: Vec<u64>, with: Vec<u64>) -> OverheadResult {
        let median = |rates: &[u64]| {
            let mut sorted = rates.to_vec();
            sorted.sort_unstable();
            nearest_rank(&sorted, 1, 2)
        };
        let median_without = median(&without);
        let median_with = median(&with);
        let overhead = if median_without == 0 {
            0.0
        } else {
            1.0 - median_with as f64 / median_without as f64
        };
        let per_switch_ns = |rate: u64| 1e9 / (rate as f64 * SWITCHES_PER_ROUND_TRIP);
        let added_ns_per_switch = if median_with == 0 || median_without == 0 {
            0.0
        } else {
            per_switch_ns(median_with) - per_switch_ns(median_without)
        };
        OverheadResult {
            cpu,
            window_ms: window.as_secs_f64() * 1e3,
            without,
            with,
            median_without,
            median_with,
            overhead,
            added_ns_per_switch,
        }
    }
}

/// Measures `rounds` windows of `window` in each mode (see the module's doc).
pub fn switch_overhead(rounds: usize, window: Duration) -> Result<OverheadResult> {
    if rounds == 0 || window.is_zero() {
        bail!("the overhead needs at least one round and a non-empty window");
    }
    let cpu = last_allowed_cpu()?;
    let ping_pong = PingPong::start(cpu)?;
    let mut without = Vec::with_capacity(rounds);
    let mut with = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let audited_first = round % 2 == 1;
        for audited in [audited_first, !audited_first] {
            let audit = if audited {
                let audit = SchedAudit::load(Path::new("/sys/kernel/btf/vmlinux"))
                    .map_err(|e| anyhow!("{e} (hint: {:?})", e.hint()))
                    .context("loading the scheduler audit (root needed)")?;
                audit.set_owner(cpu as u32, NO_SUCH_CGROUP)?;
                Some(audit)
            } else {
                None
            };
            thread::sleep(SETTLE);
            let rate = ping_pong.rate_over(window)?;
            match audit {
                Some(audit) => {
                    // The audited path was taken: the switches on the CPU were counted as foreign.
                    let counted = audit
                        .foreign()?
                        .iter()
                        .any(|r| r.cpu == cpu as u32 && r.owner == NO_SUCH_CGROUP);
                    if !counted {
                        bail!("the audit counted no foreign time on CPU {cpu}: is it attached?");
                    }
                    with.push(rate);
                }
                None => without.push(rate),
            }
        }
    }
    ping_pong.stop()?;
    Ok(OverheadResult::of(cpu as u32, window, without, with))
}

/// The highest CPU this process may run on.
fn last_allowed_cpu() -> Result<usize> {
    let allowed = sched_getaffinity(Pid::from_raw(0)).context("sched_getaffinity")?;
    (0..CpuSet::count())
        .rev()
        .find(|&cpu| allowed.is_set(cpu).unwrap_or(false))
        .ok_or_else(|| anyhow!("this process may run on no CPU"))
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> io::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu).map_err(io::Error::from)?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(io::Error::from)
}

/// The two ping-pong threads and their round-trip count.
struct PingPong {
    round_trips: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<io::Result<()>>>,
}

impl PingPong {
    fn start(cpu: usize) -> Result<PingPong> {
        let (mut pong_in, mut ping_out) = io::pipe().context("pipe")?;
        let (mut ping_in, mut pong_out) = io::pipe().context("pipe")?;
        let round_trips = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let pong = thread::spawn(move || {
            pin(cpu)?;
            let mut byte = [0u8; 1];
            // Ends when the ping side closes its end.
            while pong_in.read(&mut byte)? == 1 {
                pong_out.write_all(&byte)?;
            }
            Ok(())
        });
        let ping = {
            let round_trips = Arc::clone(&round_trips);
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                pin(cpu)?;
                let mut byte = [1u8; 1];
                while !stop.load(Ordering::Relaxed) {
                    ping_out.write_all(&byte)?;
                    if ping_in.read(&mut byte)? == 0 {
                        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                    }
                    round_trips.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        };
        Ok(PingPong {
            round_trips,
            stop,
            threads: vec![ping, pong],
        })
    }

    /// Round trips per second over the next `window`.
    fn rate_over(&self, window: Duration) -> Result<u64> {
        if self.threads.iter().any(JoinHandle::is_finished) {
            bail!("a ping-pong thread ended early");
        }
        let (start_count, start) = (self.round_trips.load(Ordering::Relaxed), Instant::now());
        thread::sleep(window);
        let (end_count, end) = (self.round_trips.load(Ordering::Relaxed), Instant::now());
        let seconds = (end - start).as_secs_f64();
        Ok(((end_count - start_count) as f64 / seconds).round() as u64)
    }

    fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            thread
                .join()
                .map_err(|_| anyhow!("a ping-pong thread panicked"))?
                .context("ping-pong")?;
        }
        Ok(())
    }
}

impl Drop for PingPong {
    fn drop(&mut self) {
        // An early return leaves the threads to end on their own: the ping side stops, closing
        // its pipe ends, and the pong side sees the end of its input.
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_compares_the_medians() {
        let result = OverheadResult::of(
            1,
            Duration::from_millis(200),
            vec![100_000, 90_000, 110_000],
            vec![95_000, 80_000, 99_000, 1],
        );
        assert_eq!(
            (result.median_without, result.median_with),
            (100_000, 80_000)
        );
        assert!((result.overhead - 0.2).abs() < 1e-9, "{}", result.overhead);
        // 80k round trips/s = 6250 ns per switch; 100k = 5000 ns.
        assert!((result.added_ns_per_switch - 1250.0).abs() < 1e-6);
        assert!((result.window_ms - 200.0).abs() < 1e-9);
    }

    #[test]
    fn empty_modes_give_no_overhead() {
        let result = OverheadResult::of(0, Duration::from_millis(1), vec![], vec![]);
        assert_eq!(result.overhead, 0.0);
        assert_eq!(result.added_ns_per_switch, 0.0);
    }
}
