//! The PLEG benchmark's smoke run (what `cargo xtask bench pleg --quick` does, smaller still) on
//! the real kernel and containerd: both PLEGs run the same workload, every kill is measured, every
//! death carries the SIGKILL status, the kernel-event PLEG learnt every death from the kernel, and
//! the report's table, JSON and plot are written. Latencies are not asserted: the benchmark
//! reports them.
use std::time::Duration;

use swiftlet_tests::{
    bench::{
        machine::Machine,
        pleg::{self, Settings, report},
    },
    privileged, runtime_endpoint, swiftlet_bin,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pleg_benchmark_measures_every_exit_with_both_plegs() {
    let test = "the_pleg_benchmark_measures_every_exit_with_both_plegs";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
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
