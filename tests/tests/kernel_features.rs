//! What this kernel offers swiftlet's programs, checked on every kernel of the matrix (`cargo
//! xtask vm-test`) as on the host: every program loads and attaches, the fallbacks taken are the
//! ones this release calls for, and a program needing a newer kernel is refused with the feature
//! and the release named, never loaded halfway or hung. Each test prints one `swiftlet-vm-report`
//! line that the matrix's report shows per kernel.
#![expect(
    clippy::print_stdout,
    reason = "the report line is the matrix's output, read from the test's stdout"
)]

use std::path::Path;

use swiftlet::{
    cm::CgroupLayout,
    kernel::{KernelBtf, KernelEvents, LoadOptions, SchedAudit, canary},
};
use swiftlet_common::names;
use swiftlet_tests::privileged;

/// The running kernel's release, and its major and minor numbers.
fn kernel() -> (String, (u32, u32)) {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_else(|e| panic!("uname: {e}"));
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let major = numbers.next().unwrap_or(0);
    let minor = numbers.next().unwrap_or(0);
    (release, (major, minor))
}

/// An error and every cause below it, on one line.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        // aya's errors often repeat their source's text; say each thing once.
        let said = e.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = e.source();
    }
    text
}

/// Whether tracepoint `event` (`category/name`) has `field`, by its format file.
fn has_field(event: &str, field: &str) -> bool {
    let path = format!("/sys/kernel/tracing/events/{event}/format");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .contains(&format!(" {field};"))
}

/// One line for the matrix's report (the test's stdout reaches the console with `--nocapture`).
fn report(test: &str, fields: &str) {
    println!("swiftlet-vm-report {test}: {fields}");
}

/// The event programs and the scheduler audit load and attach; the tracepoint fields that came
/// in later releases are used exactly where this release has them, with the fallback elsewhere.
#[tokio::test]
async fn every_program_loads_and_attaches_with_this_kernels_fields() {
    let test = "every_program_loads_and_attaches_with_this_kernels_fields";
    if !privileged(test) {
        return;
    }
    let (release, _) = kernel();
    let events = KernelEvents::load(&LoadOptions::default())
        .unwrap_or_else(|e| panic!("load on {release}: {e} (hint: {:?})", e.hint()));
    let info = events.info();
    for (program, _, _) in names::PROGRAMS {
        assert!(
            info.programs.contains(&program),
            "{program} not attached on {release}: {:?}",
            info.programs
        );
    }
    assert_eq!(
        info.pressure_sources.len(),
        3,
        "every memory-pressure tracepoint exists since 6.1: {:?}",
        info.pressure_sources
    );
    // By the format, not the release: distributions backport tracepoint fields (Debian's 6.1
    // has the OOM memory figures of 6.8).
    assert_eq!(
        info.exit_group_dead_field,
        has_field("sched/sched_process_exit", "group_dead"),
        "the exit program reads `group_dead` exactly where the tracepoint has it ({release})"
    );
    assert_eq!(
        info.oom_memory_fields,
        has_field("oom/mark_victim", "total_vm"),
        "the OOM program reads the memory figures exactly where the tracepoint has them \
         ({release})"
    );
    // The memory level trigger's layout and functions are in every supported kernel's BTF; its
    // programs attach wherever the memory controller is on cgroup v2.
    let btf = KernelBtf::open(Path::new("/sys/kernel/btf/vmlinux")).expect("kernel BTF");
    let memcg = btf
        .memcg_layout()
        .unwrap_or_else(|e| panic!("memcg layout on {release}: {e}"));
    for (_, function) in names::MEMCG_PROGRAMS {
        assert!(
            btf.has_function(function),
            "{function} in the BTF of {release}"
        );
    }
    let v2 = matches!(CgroupLayout::detect(), Ok(CgroupLayout::Unified { .. }));
    if v2 {
        assert_eq!(
            info.memcg_level,
            Ok(()),
            "the memory level programs attach on cgroup v2 ({release})"
        );
        for (program, _) in names::MEMCG_PROGRAMS {
            assert!(info.programs.contains(&program), "{program} on {release}");
        }
    } else {
        assert!(
            info.memcg_level
                .as_ref()
                .is_err_and(|why| why.contains("not on cgroup v2")),
            "{:?}",
            info.memcg_level
        );
    }
    let audit = SchedAudit::load(Path::new("/sys/kernel/btf/vmlinux"))
        .unwrap_or_else(|e| panic!("scheduler audit on {release}: {e} (hint: {:?})", e.hint()));
    drop(audit);
    report(
        test,
        &format!(
            "loaded {} programs + sched_switch; process ends told by {}; OOM memory figures {}; \
             memory level trigger {} (page_counter.parent at {})",
            info.programs.len(),
            if info.exit_group_dead_field {
                "the tracepoint's group_dead"
            } else {
                "signal->live (fallback: no group_dead before 6.16)"
            },
            if info.oom_memory_fields {
                "from the tracepoint"
            } else {
                "absent (tracepoint without them, before 6.8)"
            },
            match &info.memcg_level {
                Ok(()) => "attached (fentry)".to_owned(),
                Err(why) => format!("left out: {why}"),
            },
            memcg.pc_parent,
        ),
    );
}

/// The canary needs cgroup local storage (6.2): on older kernels the agent's way of loading
/// refuses naming the feature and the release, and the kernel itself rejects it too (so the
/// probe is not merely cautious); on newer ones it loads and attaches.
#[test]
fn a_program_too_new_for_the_kernel_is_refused_with_the_reason() {
    let test = "a_program_too_new_for_the_kernel_is_refused_with_the_reason";
    if !privileged(test) {
        return;
    }
    let (release, version) = kernel();
    let needs = (6, 2);
    match canary::load() {
        Ok(loaded) => {
            assert!(
                version >= needs,
                "the canary loaded on {release}, older than 6.2"
            );
            drop(loaded);
            report(test, "canary (needs 6.2) loaded and attached");
        }
        Err(refusal) => {
            assert!(
                version < needs,
                "the canary was refused on {release}: {refusal}"
            );
            let text = refusal.to_string();
            assert!(
                text.contains("cgroup local storage") && text.contains("Linux 6.2"),
                "the refusal names the feature and the release: {text}"
            );
            let kernel_says = match canary::load_unchecked() {
                Ok(_) => panic!("{release} loaded the canary when asked blindly"),
                Err(e) => with_causes(&e),
            };
            report(
                test,
                &format!("canary (needs 6.2) refused: {text}; loaded blindly: {kernel_says}"),
            );
        }
    }
}
