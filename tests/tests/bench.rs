//! The benchmarks' smoke runs on the real kernel and containerd.
//!
//! PLEG (what `cargo xtask bench pleg --quick` does, smaller still): both PLEGs run the same
//! workload, every kill is measured, every death carries the SIGKILL status, the kernel-event PLEG
//! learnt every death from the kernel, and the report's table, JSON and plot are written.
//! Eviction: see its test. Latencies are not asserted: the benchmarks report them.
use std::{collections::BTreeMap, time::Duration};

use swiftlet_tests::{
    bench::{
        eviction,
        machine::Machine,
        pleg::{self, Settings, report},
    },
    privileged, runtime_endpoint, swiftlet_bin,
};

/// The benchmarks' smoke runs share the runtime's `swiftlet-bench` namespace, which each clears
/// when it starts: they take turns.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pleg_benchmark_measures_every_exit_with_both_plegs() {
    let test = "the_pleg_benchmark_measures_every_exit_with_both_plegs";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let out = std::env::temp_dir().join(format!("swiftlet-bench-smoke-{}", std::process::id()));
    let settings = Settings {
        swiftlet: swiftlet_bin(),
        runtime_endpoint: endpoint,
        sizes: vec![5],
        exits: 10,
        idle: Duration::from_secs(3),
        log_dir: out.join("logs"),
    };
    let outcomes = pleg::run(&settings).await.expect("the benchmark runs");

    let plegs: Vec<(&str, usize)> = outcomes
        .iter()
        .map(|o| (o.pleg.as_str(), o.containers))
        .collect();
    assert_eq!(plegs, [("relist", 5), ("ebpf", 5)]);
    for o in &outcomes {
        assert_eq!(o.missed, 0, "--pleg {}: no kill without its event", o.pleg);
        assert_eq!(o.latencies_ns.len(), 10, "--pleg {}", o.pleg);
        assert_eq!(
            o.wrong_status, 0,
            "--pleg {}: every death is exit 137",
            o.pleg
        );
        assert_eq!(
            o.generations, 2,
            "--pleg {}: 10 exits of 5 containers",
            o.pleg
        );
        assert!(o.idle.seconds >= 3.0, "--pleg {}", o.pleg);
        assert!(o.idle.agent_cpu_seconds > 0.0, "--pleg {}", o.pleg);
        assert!(o.idle.rss_bytes > 0, "--pleg {}", o.pleg);
    }
    let (relist, ebpf) = (&outcomes[0], &outcomes[1]);
    assert_eq!(
        relist.kernel_caused, 0,
        "the relist PLEG has no kernel events"
    );
    assert_eq!(
        ebpf.kernel_caused, 10,
        "every death came from a kernel event"
    );
    // The relist PLEG listed the runtime about once a second while idle; the kernel-event PLEG
    // never did (its safety-net relist is 300 s away).
    assert!(relist.idle.relists >= 2.0, "{:?}", relist.idle);
    assert_eq!(ebpf.idle.relists, 0.0, "{:?}", ebpf.idle);

    let machine = Machine::detect();
    let entries: Vec<report::Entry> = outcomes
        .iter()
        .map(|o| report::Entry::new(o, &machine, "now"))
        .collect();
    let table = report::markdown(&entries);
    assert_eq!(
        table
            .lines()
            .filter(|l| l.starts_with("| relist | 5 |"))
            .count(),
        1,
        "{table}"
    );
    assert_eq!(
        table
            .lines()
            .filter(|l| l.starts_with("| ebpf | 5 |"))
            .count(),
        1,
        "{table}"
    );
    assert!(
        report::warnings(&entries).is_empty(),
        "{:?}",
        report::warnings(&entries)
    );
    let svg = out.join("pleg-latency.svg");
    report::plot(&svg, "smoke", &outcomes).expect("the plot");
    let drawn = std::fs::read_to_string(&svg).expect("the SVG");
    assert!(
        drawn.contains("--pleg ebpf, 5 containers"),
        "the legend names each curve"
    );
    assert!(settings.log_dir.join("swiftlet-ebpf-5.log").is_file());
    assert!(settings.log_dir.join("metrics-relist-5.txt").is_file());
    std::fs::remove_dir_all(&out).expect("removing the smoke run's folder");
}

/// The eviction benchmark's smoke run (`cargo xtask bench eviction --quick`, with one run per
/// mode and no random wait before it): in every mode the hog is evicted, its containers stop,
/// nothing else is evicted and the bystander keeps running; with `--eviction-wakeups none` only
/// the periodic check decides, with the kernel's wake-ups one of them does; the report's table
/// and plot are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_eviction_benchmark_evicts_the_hog_in_every_mode() {
    let test = "the_eviction_benchmark_evicts_the_hog_in_every_mode";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let out = std::env::temp_dir().join(format!(
        "swiftlet-bench-eviction-smoke-{}",
        std::process::id()
    ));
    let settings = eviction::Settings {
        swiftlet: swiftlet_bin(),
        runtime_endpoint: endpoint,
        modes: eviction::Mode::ALL.to_vec(),
        runs: 1,
        max_delay: Duration::ZERO,
        log_dir: out.join("logs"),
    };
    let outcomes = eviction::run(&settings).await.expect("the benchmark runs");

    let modes: Vec<&str> = outcomes.iter().map(|o| o.mode.name()).collect();
    assert_eq!(modes, ["kernel", "periodic", "psi"]);
    for o in &outcomes {
        let what = format!("--eviction-wakeups {}", o.wakeups);
        assert_eq!(o.failures(), 0, "{what}: {:#?}", o.runs);
        assert_eq!(o.evictions(), 1, "{what}");
        assert_eq!(o.decision_latencies_ns().len(), 1, "{what}");
        assert_eq!(o.stopped_latencies_ns().len(), 1, "{what}");
        assert!(
            o.bystander_ok() && o.bystander_restarts == 0,
            "{what}: the bystander ended {} with {} restarts, evicted {} times",
            o.bystander_phase,
            o.bystander_restarts,
            o.bystander_evictions
        );
        assert!(
            o.stray_evictions.is_empty(),
            "{what}: {:?}",
            o.stray_evictions
        );
    }
    let (kernel, periodic) = (&outcomes[0], &outcomes[1]);
    assert_eq!(
        periodic.decided_by(),
        BTreeMap::from([("periodic".to_owned(), 1)]),
        "only the periodic check decides with --eviction-wakeups none"
    );
    assert!(
        kernel
            .decided_by()
            .keys()
            .all(|source| ["memcg", "psi", "oom", "reclaim"].contains(&source.as_str())),
        "with the kernel's wake-ups, one of them decides, not the periodic check: {:?}",
        kernel.decided_by()
    );

    let machine = Machine::detect();
    let entries: Vec<eviction::report::Entry> = outcomes
        .iter()
        .map(|o| eviction::report::Entry::new(o, &machine, "now"))
        .collect();
    let table = eviction::report::markdown(&entries);
    for mode in modes {
        let rows = table
            .lines()
            .filter(|l| l.starts_with(&format!("| {mode} |")));
        assert_eq!(rows.count(), 1, "{table}");
        assert!(
            settings
                .log_dir
                .join(format!("swiftlet-{mode}.log"))
                .is_file(),
            "{mode}"
        );
        assert!(
            settings
                .log_dir
                .join(format!("metrics-{mode}.txt"))
                .is_file(),
            "{mode}"
        );
    }
    let warnings = eviction::report::warnings(&entries);
    assert!(warnings.is_empty(), "{warnings:?}");
    let svg = out.join("eviction-latency.svg");
    eviction::report::plot(&svg, "smoke", &outcomes).expect("the plot");
    let drawn = std::fs::read_to_string(&svg).expect("the SVG");
    assert!(
        drawn.contains("periodic: decision"),
        "the legend names each curve"
    );
    std::fs::remove_dir_all(&out).expect("removing the smoke run's folder");
}
