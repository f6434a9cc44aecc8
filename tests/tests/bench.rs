//! The benchmarks' smoke runs on the real kernel and containerd.
//!
//! PLEG (what `cargo xtask bench pleg --quick` does, smaller still): the three PLEGs (two on a
//! runtime without CRI container events) run the same workload, every kill is measured, every
//! death carries the SIGKILL status, the kernel-event PLEG learnt every death from the kernel, the
//! Evented PLEG from the runtime's stream, and the report's table, JSON and plot are written.
//! Eviction and CPU manager: see their tests. Latencies are not asserted: the benchmarks report
//! them.
use std::{collections::BTreeMap, time::Duration};

use swiftlet_tests::{
    bench::{
        cluster, cpumanager, eviction,
        machine::Machine,
        pleg::{self, Settings, report},
    },
    privileged, runtime_endpoint, swiftlet_bin,
};

/// The benchmarks' smoke runs share the runtime's `swiftlet-bench` namespace, which each clears
/// when it starts: they take turns.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pleg_benchmark_measures_every_exit_with_every_pleg() {
    let test = "the_pleg_benchmark_measures_every_exit_with_every_pleg";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let runtime = swiftlet_tests::bench::harness::cri::Cri::connect(&endpoint)
        .await
        .expect("CRI")
        .runtime_version()
        .await
        .expect("CRI Version");
    // containerd 1.6 has no CRI container events: the Evented PLEG is refused there.
    let plegs: Vec<&str> = if runtime.starts_with("containerd 1.6") {
        println!("{test}: {runtime} has no GetContainerEvents; --pleg evented not run");
        vec!["relist", "ebpf"]
    } else {
        vec!["relist", "evented", "ebpf"]
    };
    let out = std::env::temp_dir().join(format!("swiftlet-bench-smoke-{}", std::process::id()));
    let settings = Settings {
        swiftlet: swiftlet_bin(),
        runtime_endpoint: endpoint,
        sizes: vec![3],
        plegs: plegs.iter().map(|&p| p.to_owned()).collect(),
        exits: 6,
        idle: Duration::from_secs(3),
        log_dir: out.join("logs"),
    };
    let outcomes = pleg::run(&settings).await.expect("the benchmark runs");

    let ran: Vec<(&str, usize)> = outcomes
        .iter()
        .map(|o| (o.pleg.as_str(), o.containers))
        .collect();
    let expected: Vec<(&str, usize)> = plegs.iter().map(|&p| (p, 3)).collect();
    assert_eq!(ran, expected);
    for o in &outcomes {
        assert_eq!(o.missed, 0, "--pleg {}: no kill without its event", o.pleg);
        assert_eq!(o.latencies_ns.len(), 6, "--pleg {}", o.pleg);
        assert_eq!(
            o.wrong_status, 0,
            "--pleg {}: every death is exit 137",
            o.pleg
        );
        assert_eq!(
            o.generations, 2,
            "--pleg {}: 6 exits of 3 containers",
            o.pleg
        );
        assert!(o.idle.seconds >= 3.0, "--pleg {}", o.pleg);
        assert!(o.idle.agent_cpu_seconds > 0.0, "--pleg {}", o.pleg);
        assert!(o.idle.rss_bytes > 0, "--pleg {}", o.pleg);
        assert_eq!(o.runtime, runtime);
        // containerd reaps (finished_at) every killed init; an event's status is observed
        // after the kill, except the kernel-event PLEG's, which amends an earlier one.
        assert_eq!(o.phases.reaped_ns.len(), 6, "--pleg {}", o.pleg);
        if o.pleg != "ebpf" {
            assert_eq!(o.phases.observed_ns.len(), 6, "--pleg {}", o.pleg);
        }
    }
    let (relist, ebpf) = (&outcomes[0], &outcomes[outcomes.len() - 1]);
    assert!(relist.phases.kernel_ns.is_empty());
    assert_eq!(ebpf.phases.kernel_ns.len(), 6, "the kernel saw every exit");
    if let Some(evented) = outcomes.iter().find(|o| o.pleg == "evented") {
        assert_eq!(
            evented.kernel_caused, 0,
            "the Evented PLEG has no kernel events"
        );
        // Its safety-net relist is 300 s away; the runtime's stream told it every change: at
        // least a start and a stop of each container of two generations.
        assert_eq!(evented.idle.relists, 0.0, "{:?}", evented.idle);
        assert!(evented.stream_events >= 12.0, "{}", evented.stream_events);
        // containerd sends the stop event after it reaped the init.
        assert!(
            evented.phases.observed_ns[3] >= evented.phases.reaped_ns[3],
            "{:?}",
            evented.phases
        );
    }
    assert_eq!(
        relist.kernel_caused, 0,
        "the relist PLEG has no kernel events"
    );
    assert_eq!(
        ebpf.kernel_caused, 6,
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
            .filter(|l| l.starts_with("| relist | 3 |"))
            .count(),
        2,
        "{table}"
    );
    assert_eq!(
        table
            .lines()
            .filter(|l| l.starts_with("| ebpf | 3 |"))
            .count(),
        2,
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
        drawn.contains("--pleg ebpf, 3 containers"),
        "the legend names each curve"
    );
    assert!(settings.log_dir.join("swiftlet-ebpf-3.log").is_file());
    assert!(settings.log_dir.join("metrics-relist-3.txt").is_file());
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

/// The CPU manager benchmark's smoke run (`cargo xtask bench cpumanager --quick`: two runs per
/// mode, no random wait, short overhead windows; smaller still: a 3 s reconcile period): in
/// both modes every Guaranteed pod got its CPU
/// alone and its foreign time was read, the spinner ran throughout, applying on events was in
/// place sooner than the reconcile alone (when the reconcile took any time at all), the overhead
/// was measured in both modes, and the report's table, JSON and plot are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpumanager_benchmark_gives_every_guaranteed_pod_its_cpu() {
    let test = "the_cpumanager_benchmark_gives_every_guaranteed_pod_its_cpu";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let out = std::env::temp_dir().join(format!(
        "swiftlet-bench-cpumanager-smoke-{}",
        std::process::id()
    ));
    let settings = cpumanager::Settings {
        swiftlet: swiftlet_bin(),
        runtime_endpoint: endpoint,
        modes: cpumanager::Mode::ALL.to_vec(),
        runs: 2,
        max_delay: Duration::ZERO,
        overhead_rounds: 2,
        overhead_window: Duration::from_millis(200),
        // The reconcile applies a few seconds after the start instead of the kubelet's 10 s:
        // every run waits it out. The foreign time is read after the real run's 10 s: 3 s once
        // left a slow start in CI with no series of the container in the scheduler audit yet.
        reconcile_period: Duration::from_secs(3),
        foreign_window: Duration::from_secs(10),
        log_dir: out.join("logs"),
    };
    let outcome = cpumanager::run(&settings)
        .await
        .expect("the benchmark runs");

    let modes: Vec<&str> = outcome.modes.iter().map(|o| o.mode.name()).collect();
    assert_eq!(modes, ["events", "reconcile"]);
    for o in &outcome.modes {
        let what = format!("--cpu-manager-apply {}", o.mode.name());
        assert_eq!(o.failures(), 0, "{what}: {:#?}", o.runs);
        assert_eq!(o.runs.len(), 2, "{what}");
        assert_eq!(o.latencies_ns().len(), 2, "{what}");
        assert_eq!(
            o.foreign_pod_ns().len(),
            2,
            "{what}: the foreign time was read"
        );
        assert_eq!(o.foreign_other_ns().len(), 2, "{what}");
        assert!(o.spinner_ran_throughout, "{what}");
        assert!(
            o.runs.iter().all(|r| r.samples > 0),
            "{what}: {:#?}",
            o.runs
        );
    }
    let (events, reconcile) = (&outcome.modes[0], &outcome.modes[1]);
    let p50 = |o: &cpumanager::ModeOutcome| {
        swiftlet_tests::bench::stats::nearest_rank(&o.latencies_ns(), 1, 2)
    };
    if p50(reconcile) > 0 {
        assert!(
            p50(events) < p50(reconcile),
            "events {:?} vs reconcile {:?}",
            events.latencies_ns(),
            reconcile.latencies_ns()
        );
    }
    assert!(
        events.cpuset_updates.get("event").is_some_and(|n| *n > 0.0),
        "cpusets were updated on events: {:?}",
        events.cpuset_updates
    );
    assert!(
        reconcile
            .cpuset_updates
            .get("event")
            .is_none_or(|n| *n == 0.0),
        "the reconcile alone updated them: {:?}",
        reconcile.cpuset_updates
    );
    let o = &outcome.overhead;
    assert_eq!((o.without.len(), o.with.len()), (2, 2), "{o:?}");
    assert!(o.median_without > 0 && o.median_with > 0, "{o:?}");

    let report = cpumanager::report::Report::new(&outcome, Machine::detect(), "now");
    let table = report.markdown();
    for mode in modes {
        let rows = table
            .lines()
            .filter(|l| l.starts_with(&format!("| {mode} |")));
        assert_eq!(rows.count(), 1, "{table}");
        for file in [
            format!("swiftlet-{mode}.log"),
            format!("metrics-{mode}.txt"),
        ] {
            assert!(settings.log_dir.join(&file).is_file(), "{file}");
        }
    }
    assert!(table.contains("| `sched_switch` (tp_btf) |"), "{table}");
    assert_eq!(report.verdicts().len(), 4);
    let warnings = report.warnings();
    assert!(warnings.is_empty(), "{warnings:?}");
    let json = out.join("cpumanager.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report).expect("JSON")).expect("written");
    let read: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("read")).expect("parsed");
    assert_eq!(read["modes"][1]["mode"], "reconcile");
    assert_eq!(
        read["modes"][0]["run_details"].as_array().map(Vec::len),
        Some(2)
    );
    let svg = out.join("cpumanager-latency.svg");
    cpumanager::report::plot(&svg, "smoke", &outcome.modes).expect("the plot");
    let drawn = std::fs::read_to_string(&svg).expect("the SVG");
    assert!(
        drawn.contains("--cpu-manager-apply reconcile"),
        "the legend names each curve"
    );
    std::fs::remove_dir_all(&out).expect("removing the smoke run's folder");
}

/// The cluster benchmark's smoke run (`cargo xtask bench cluster --quick`, smaller still): both
/// PLEGs through the API server process, every kill's terminated status reaches it, every pod of
/// the batch is Running there, the agent's idle requests are counted, and the JSON is the array
/// the issue names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_benchmark_sees_every_kill_and_start_on_the_api_server() {
    let test = "the_cluster_benchmark_sees_every_kill_and_start_on_the_api_server";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let out = std::env::temp_dir().join(format!(
        "swiftlet-bench-cluster-smoke-{}",
        std::process::id()
    ));
    let settings = cluster::Settings {
        swiftlet: swiftlet_bin(),
        runtime_endpoint: endpoint,
        kills: 10,
        batches: vec![10],
        rounds: 1,
        idle: Duration::from_secs(5),
        log_dir: out.join("logs"),
    };
    let outcomes = cluster::run(&settings).await.expect("the benchmark runs");
    let plegs: Vec<&str> = outcomes.iter().map(|o| o.pleg.as_str()).collect();
    assert_eq!(plegs, ["relist", "ebpf"]);
    for o in &outcomes {
        assert_eq!(o.missed_kills, 0, "--pleg {}", o.pleg);
        assert_eq!(o.kill_ns.len(), 10, "--pleg {}", o.pleg);
        assert_eq!(o.missed_starts, 0, "--pleg {}", o.pleg);
        assert_eq!(
            o.create_ns.get(&10).map(Vec::len),
            Some(10),
            "--pleg {}",
            o.pleg
        );
        // The Lease alone is renewed every 10 s.
        assert!(o.idle_requests > 0, "--pleg {}", o.pleg);
    }
    let report = cluster::report::Report::new(&outcomes, &Machine::detect(), "smoke");
    let json = serde_json::to_value(&report).expect("json");
    let measures: Vec<(&str, &str)> = json
        .as_array()
        .expect("an array")
        .iter()
        .map(|e| {
            (
                e["pleg"].as_str().unwrap_or_default(),
                e["measure"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        measures,
        [
            ("relist", "kill_to_api_terminated"),
            ("relist", "create_to_api_running_10"),
            ("relist", "idle_api_requests_per_pod_minute"),
            ("ebpf", "kill_to_api_terminated"),
            ("ebpf", "create_to_api_running_10"),
            ("ebpf", "idle_api_requests_per_pod_minute"),
        ]
    );
    let svg = out.join("cluster-latency.svg");
    cluster::report::plot(&svg, "smoke", &outcomes).expect("the plot is written");
    assert!(std::fs::metadata(&svg).is_ok_and(|m| m.len() > 0));
    let _ = std::fs::remove_dir_all(&out);
}
