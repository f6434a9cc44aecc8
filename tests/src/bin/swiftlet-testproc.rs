//! A process with scripted behaviour for the system tests and benchmarks, so that what the kernel
//! sees (exit codes, threads, allocations, fork storms) is exactly what a test asserts on.
//!
//! ```text
//! swiftlet-testproc exit CODE              exit with CODE
//! swiftlet-testproc sleep                  sleep until killed
//! swiftlet-testproc threads N              start N threads that exit, join them, exit 0
//! swiftlet-testproc leader-first CODE      the main thread exits first; another thread later
//!                                          ends the process with CODE
//! swiftlet-testproc alloc MIB              allocate and touch MIB MiB, then sleep
//! swiftlet-testproc read FILE PASSES       drop FILE's cached pages, then read it PASSES times
//!                                          through the page cache (clean, reclaimable memory
//!                                          charged to this process's cgroup); prints the bytes
//! swiftlet-testproc storm N [PARALLEL]     N children forked as fast as possible, each exiting at
//!                                          once; with PARALLEL > 1 by that many worker processes
//!                                          (forking from a multi-threaded process is slower);
//!                                          prints "forked N workers W" when all are reaped
//! swiftlet-testproc paced N                fork N children one after another (fork, exit, reap)
//! swiftlet-testproc spin [PERIOD_MS]       burn CPU until killed; with PERIOD_MS, sleep 1 ms
//!                                          every PERIOD_MS (wall clock), so that the CPU
//!                                          switches tasks at a known rate even when nothing
//!                                          else wants it
//! ```
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test helper's CLI"
)]

use std::{process::ExitCode, thread, time::Duration};

use nix::{
    sys::wait::waitpid,
    unistd::{ForkResult, fork},
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| -> u64 {
        args.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            eprintln!("swiftlet-testproc: argument {i} must be a number: {args:?}");
            std::process::exit(100)
        })
    };
    match args.first().map(String::as_str) {
        Some("exit") => std::process::exit(number(1) as i32),
        Some("sleep") => loop {
            thread::sleep(Duration::from_secs(3600));
        },
        Some("threads") => {
            let handles: Vec<_> = (0..number(1))
                .map(|_| thread::spawn(|| thread::sleep(Duration::from_millis(10))))
                .collect();
            for handle in handles {
                let _ = handle.join();
            }
            ExitCode::SUCCESS
        }
        Some("leader-first") => {
            let code = number(1) as i32;
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                std::process::exit(code);
            });
            // The raw exit(2) syscall ends only the calling (main) thread, without unwinding
            // (pthread_exit would force-unwind through Rust frames and abort).
            // SAFETY: nothing of this thread is used again; the process lives on in the other.
            unsafe { libc::syscall(libc::SYS_exit, 0) };
            unreachable!("exit(2) returned")
        }
        Some("alloc") => {
            let mib = number(1) as usize;
            let mut blocks = Vec::with_capacity(mib);
            for _ in 0..mib {
                // Touch every page so the memory is really charged to the cgroup.
                blocks.push(vec![1u8; 1 << 20]);
            }
            println!("allocated {} MiB", blocks.len());
            loop {
                thread::sleep(Duration::from_secs(3600));
            }
        }
        Some("read") => {
            let Some(path) = args.get(1) else {
                eprintln!("swiftlet-testproc: read needs a file: {args:?}");
                return ExitCode::from(100);
            };
            match read_through_cache(path, number(2)) {
                Ok(bytes) => {
                    println!("read {bytes} bytes");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("swiftlet-testproc: read {path}: {e}");
                    ExitCode::from(101)
                }
            }
        }
        Some("storm") => {
            let total = number(1);
            let parallel = if args.len() > 2 { number(2).max(1) } else { 1 };
            if parallel == 1 {
                println!("forked {} workers 0", fork_sequentially(total));
                return ExitCode::SUCCESS;
            }
            let mut workers = Vec::new();
            for w in 0..parallel {
                let share = total / parallel + u64::from(w < total % parallel);
                // SAFETY: single-threaded here; the child runs plain code and exits.
                match unsafe { fork() } {
                    Ok(ForkResult::Child) => {
                        let forked = fork_sequentially(share);
                        // SAFETY: ends the worker without running the parent's exit handlers.
                        unsafe { libc::_exit(i32::from(forked != share)) }
                    }
                    Ok(ForkResult::Parent { child }) => workers.push(child),
                    Err(e) => {
                        eprintln!("swiftlet-testproc: fork: {e}");
                        return ExitCode::from(101);
                    }
                }
            }
            let all_forked = workers.into_iter().all(|w| {
                matches!(
                    waitpid(w, None),
                    Ok(nix::sys::wait::WaitStatus::Exited(_, 0))
                )
            });
            if !all_forked {
                eprintln!("swiftlet-testproc: a worker could not fork all its children");
                return ExitCode::from(101);
            }
            println!("forked {total} workers {parallel}");
            ExitCode::SUCCESS
        }
        Some("spin") => {
            let period = (args.len() > 1).then(|| Duration::from_millis(number(1)));
            spin(period)
        }
        Some("paced") => {
            println!("forked {} workers 0", fork_sequentially(number(1)));
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("swiftlet-testproc: unknown command {args:?}");
            ExitCode::from(100)
        }
    }
}

/// Spins forever; with a period, sleeps 1 ms after each period of spinning.
fn spin(period: Option<Duration>) -> ! {
    let mut since = std::time::Instant::now();
    let mut x = 0u64;
    loop {
        for _ in 0..10_000 {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
        }
        if let Some(period) = period
            && since.elapsed() >= period
        {
            thread::sleep(Duration::from_millis(1));
            since = std::time::Instant::now();
        }
    }
}

/// Reads `path` `passes` times; its pages cached by whoever wrote it are dropped first, so every
/// page read is charged to this process's memory cgroup.
fn read_through_cache(path: &str, passes: u64) -> std::io::Result<u64> {
    use std::{
        io::{Read as _, Seek as _},
        os::fd::AsRawFd as _,
    };
    let mut file = std::fs::File::open(path)?;
    // SAFETY: a plain syscall on a file descriptor this function owns.
    let advised = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if advised != 0 {
        return Err(std::io::Error::from_raw_os_error(advised));
    }
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0;
    for _ in 0..passes {
        file.rewind()?;
        loop {
            let n = file.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
    }
    Ok(total)
}

/// Forks `n` children one at a time, each exiting at once, reaping each before the next; a fork
/// that fails for lack of resources is retried.
fn fork_sequentially(n: u64) -> u64 {
    let mut forked = 0;
    let mut failures = 0;
    while forked < n && failures < 1000 {
        // SAFETY: the child only calls `_exit`, which is async-signal-safe, so forking from a
        // multi-threaded process is sound here.
        match unsafe { fork() } {
            // SAFETY: `_exit` is async-signal-safe and ends the child at once.
            Ok(ForkResult::Child) => unsafe { libc::_exit(0) },
            Ok(ForkResult::Parent { child }) => {
                let _ = waitpid(child, None);
                forked += 1;
            }
            Err(_) => {
                failures += 1;
                thread::sleep(Duration::from_millis(1));
            }
        }
    }
    forked
}
