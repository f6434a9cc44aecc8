use super::*;

const WITH_FULL: &str = "\
some avg10=1.50 avg60=0.25 avg300=0.05 total=123456
full avg10=0.75 avg60=0.00 avg300=0.00 total=4567
";

#[test]
fn parses_some_and_full() {
    assert_eq!(
        Psi::parse(WITH_FULL).ok(),
        Some(Psi {
            some: PsiLine {
                avg10: 1.5,
                avg60: 0.25,
                avg300: 0.05,
                total_us: 123_456,
            },
            full: Some(PsiLine {
                avg10: 0.75,
                avg60: 0.0,
                avg300: 0.0,
                total_us: 4567,
            }),
        })
    );
}

#[test]
fn full_is_optional_as_for_cpu_on_older_kernels() {
    let psi = Psi::parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n").ok();
    assert_eq!(
        psi,
        Some(Psi {
            some: PsiLine::default(),
            full: None
        })
    );
}

#[test]
fn fields_a_later_kernel_adds_are_ignored() {
    let psi = Psi::parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=7 avg1=0.00\n").ok();
    assert_eq!(psi.map(|p| p.some.total_us), Some(7));
}

#[test]
fn malformed_text_is_an_error_naming_the_line() {
    let cases = [
        ("", 0, "no `some` line"),
        (
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0",
            0,
            "no `some` line",
        ),
        ("some avg10=0.00 avg60=0.00 total=0", 1, "missing one of"),
        (
            "some avg10=x avg60=0.00 avg300=0.00 total=0",
            1,
            "an average",
        ),
        (
            "some avg10=-1 avg60=0.00 avg300=0.00 total=0",
            1,
            "an average",
        ),
        ("some avg10=0 avg60=0 avg300=0 total=1.5", 1, "total is not"),
        ("some avg10 avg60=0 avg300=0 total=1", 1, "key=value"),
        (
            "some avg10=0 avg60=0 avg300=0 total=1\nhalf avg10=0",
            2,
            "`some` or `full`",
        ),
        (
            "some avg10=0 avg60=0 avg300=0 total=1\nsome avg10=0 avg60=0 avg300=0 total=1",
            2,
            "repeated",
        ),
    ];
    for (text, want_line, want_reason) in cases {
        match Psi::parse(text) {
            Err(PsiError::Parse { line, reason, .. }) => {
                assert_eq!(line, want_line, "{text:?}");
                assert!(reason.contains(want_reason), "{text:?}: {reason}");
            }
            other => panic!("{text:?}: expected a parse error, got {other:?}"),
        }
    }
}

#[test]
fn errors_name_the_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("memory.pressure");
    fs::write(
        &path,
        "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=oops\n",
    )
    .expect("write");
    let message = Psi::read_cgroup(dir.path(), PsiResource::Memory)
        .expect_err("malformed")
        .to_string();
    assert!(
        message.starts_with(&format!("{}: line 2 \"full avg10=oops\"", path.display())),
        "{message}"
    );
    let missing = Psi::read_cgroup(dir.path(), PsiResource::Io).expect_err("missing");
    assert!(missing.is_not_found());
    assert!(missing.to_string().contains("io.pressure"), "{missing}");
}

#[test]
fn resource_names() {
    let names: Vec<_> = PsiResource::ALL
        .iter()
        .map(|r| (r.as_str(), r.file_name(), r.proc_path()))
        .collect();
    assert_eq!(
        names,
        [
            ("cpu", "cpu.pressure", Path::new("/proc/pressure/cpu")),
            (
                "memory",
                "memory.pressure",
                Path::new("/proc/pressure/memory")
            ),
            ("io", "io.pressure", Path::new("/proc/pressure/io")),
        ]
    );
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn windows_are_rounded_to_what_the_kernel_accepts() {
    // (stall, window, privileged) -> (stall, window)
    let cases = [
        // Unprivileged: multiples of 2 s, rounded up.
        ((ms(100), ms(1000), false), (ms(100), ms(2000))),
        ((ms(100), ms(2000), false), (ms(100), ms(2000))),
        ((ms(100), ms(2001), false), (ms(100), ms(4000))),
        ((ms(100), ms(9000), false), (ms(100), ms(10_000))),
        ((ms(100), ms(60_000), false), (ms(100), ms(10_000))),
        ((ms(100), ms(1), false), (ms(100), ms(2000))),
        // Privileged: only the kernel's 500 ms..10 s.
        ((ms(100), ms(1000), true), (ms(100), ms(1000))),
        ((ms(100), ms(100), true), (ms(100), ms(500))),
        ((ms(100), ms(20_000), true), (ms(100), ms(10_000))),
        // The stall stays below the window, and above zero.
        (
            (ms(5000), ms(1000), true),
            (ms(1000) - Duration::from_micros(1), ms(1000)),
        ),
        (
            (ms(5000), ms(1000), false),
            (ms(2000) - Duration::from_micros(1), ms(2000)),
        ),
        (
            (Duration::ZERO, ms(2000), false),
            (Duration::from_micros(1), ms(2000)),
        ),
        // Whole microseconds, rounded up.
        (
            (Duration::from_nanos(1500), ms(2000), false),
            (Duration::from_micros(2), ms(2000)),
        ),
    ];
    for ((stall, window, privileged), want) in cases {
        assert_eq!(
            effective(stall, window, privileged),
            want,
            "stall {stall:?}, window {window:?}, privileged {privileged}"
        );
    }
}

#[test]
fn reads_this_node() {
    for r in PsiResource::ALL {
        let path = r.proc_path();
        if !path.exists() {
            eprintln!(
                "skipped: {} does not exist (PSI is disabled)",
                path.display()
            );
            return;
        }
        let psi = Psi::read_node(r).unwrap_or_else(|e| panic!("{e}"));
        assert!(psi.some.avg10 <= 100.0, "{r:?}: {psi:?}");
        if r != PsiResource::Cpu {
            assert!(psi.full.is_some(), "{r:?} has a full line");
        }
    }
}

/// The kernel accepts the trigger as rounded, on the node's file: for an unprivileged process
/// that means a 1 s window becomes 2 s — and the kernel really refuses 1 s.
#[tokio::test]
async fn the_kernel_accepts_rounded_triggers() {
    let test = "the_kernel_accepts_rounded_triggers";
    let path = PsiResource::Memory.proc_path();
    if !path.exists() || !crate::testing::privileged(test, "register PSI triggers") {
        if !path.exists() {
            eprintln!("skipped {test}: PSI is disabled");
        }
        return;
    }
    let unprivileged = !crate::sys::has_capability(CAP_SYS_RESOURCE);
    let trigger = PsiTrigger::new(path, false, ms(100), ms(1000)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(trigger.path(), path);
    assert_eq!(trigger.stall(), ms(100));
    assert_eq!(
        trigger.window(),
        if unprivileged { ms(2000) } else { ms(1000) }
    );
    let full = PsiTrigger::new(path, true, ms(50), ms(4000)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(full.window(), ms(4000));
    if unprivileged {
        // What the rounding is for: written as asked, the kernel says EINVAL.
        let mut raw = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("open");
        let refused = raw
            .write_all(b"some 100000 1000000\0")
            .expect_err("refused");
        assert_eq!(refused.raw_os_error(), Some(libc::EINVAL), "{refused}");
    }
    // Waiting on a trigger that has not fired does not end it.
    let mut trigger = trigger;
    let waited = tokio::time::timeout(ms(50), trigger.fired()).await;
    assert!(matches!(waited, Err(_) | Ok(Ok(()))), "{waited:?}");
}

#[test]
fn a_missing_file_is_named_when_registering() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("memory.pressure");
    let error = PsiTrigger::new(&path, false, ms(100), ms(2000))
        .err()
        .expect("no such file");
    let message = error.to_string();
    assert!(message.contains("memory.pressure"), "{message}");
    assert!(message.contains("some 100000 2000000"), "{message}");
}
