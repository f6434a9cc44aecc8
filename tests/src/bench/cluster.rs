//! The cluster benchmark (`swiftlet-bench cluster`): what the control plane sees of the node,
//! through the project's API server process (`swiftlet-test-apiserver`, over HTTPS) and a
//! `swiftlet run --kubeconfig` on the real containerd, with `--pleg relist` (1 s, the kubelet's
//! default) and `--pleg ebpf` one after the other in one run, each with a fresh API server:
//! - (a) `kill_to_api_terminated`: generations of [`KILL_PODS`] pods (one busybox `sleep`,
//!   `restartPolicy: Never`) created bound to the node; once they run, each container's init is
//!   SIGKILLed in a random order, a random 100–500 ms apart; from just before `kill(2)` to the
//!   arrival, on the benchmark's own watch of the API server, of the pod version whose status
//!   shows that container terminated, is one sample. The pods are then deleted and the next
//!   generation made, until enough kills were measured;
//! - (c) `idle_api_requests_per_pod_minute`: once the last generation runs and has settled,
//!   the API requests the agent makes (its `User-Agent`) over an idle window, per pod and minute,
//!   from the API server's request log: the Lease, the Node status, and anything else it does;
//! - (b) `create_to_api_running_<N>`: batches of N pods created through the API at once (the
//!   creates in flight together); from just before each create to the arrival of the version of
//!   that pod that is `Running`, on the same watch.
//!
//! Submodules: `report` (table, JSON, verdicts, plot).

pub mod report;

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams},
};
use nix::{sys::signal::Signal, unistd::Pid};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;

use super::{
    driver::Benchmark,
    harness::{
        self, IMAGE, NAMESPACE, NODE_NAME,
        agent::{Agent, AgentOptions},
        cri::Cri,
    },
    machine::Machine,
    report::rfc3339,
};
use crate::test_apiserver::TestApiServer;

/// The two PLEGs, in the order the run takes them.
pub const PLEGS: [&str; 2] = ["relist", "ebpf"];

/// The relist PLEG's period: the kubelet's default.
const RELIST_PERIOD: &str = "1s";

/// Pods per generation of the kill measurement, and the pods the idle window counts over.
pub const KILL_PODS: usize = 10;

/// Time between two kills, drawn uniformly from this range (ms): kills fall at every phase of
/// the relist period.
const KILL_GAP_MS: (u64, u64) = (100, 500);

/// How long pods may take to run, and a killed container's terminated status to arrive, before
/// it counts as missed: far above what either PLEG takes.
const START_TIMEOUT: Duration = Duration::from_secs(120);
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// After the first generation runs, before the idle window: the starts' statuses are sent.
const SETTLE: Duration = Duration::from_secs(5);

/// Bound on a teardown between measurements.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(120);

/// The seed of the kill order and gaps: runs are repeatable.
const SEED: u64 = 0xC1A5_7E12;

/// The agent's `User-Agent` starts so (the benchmark's own client names itself otherwise).
const AGENT_USER_AGENT: &str = "swiftlet/";

/// What to run, and against what.
#[derive(Clone, Debug)]
pub struct Settings {
    pub swiftlet: PathBuf,
    pub runtime_endpoint: String,
    /// Kills to measure per PLEG, at least.
    pub kills: usize,
    /// Batch sizes of the create measurement.
    pub batches: Vec<usize>,
    /// Batches of each size per PLEG.
    pub rounds: usize,
    /// The idle window over which the agent's API requests are counted.
    pub idle: Duration,
    /// Where each PLEG's swiftlet log and `/metrics` snapshot go.
    pub log_dir: PathBuf,
}

/// One PLEG's measurements.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub pleg: String,
    /// Kill → terminated status on the API server, per kill measured, ascending.
    pub kill_ns: Vec<u64>,
    /// Kills whose terminated status did not arrive within [`EVENT_TIMEOUT`].
    pub missed_kills: usize,
    /// Create → Running on the API server, by batch size, ascending.
    pub create_ns: BTreeMap<usize, Vec<u64>>,
    /// Pods not Running on the API server within [`START_TIMEOUT`].
    pub missed_starts: usize,
    /// The agent's API requests over the idle window, with [`KILL_PODS`] pods running.
    pub idle_requests: u64,
    pub idle_seconds: f64,
    /// The same by request (`METHOD path`, a pod's name as `{pod}`).
    pub idle_by_request: BTreeMap<String, u64>,
}

impl Outcome {
    /// API requests per pod and minute while idle.
    pub fn idle_per_pod_minute(&self) -> f64 {
        if self.idle_seconds > 0.0 {
            self.idle_requests as f64 * 60.0 / self.idle_seconds / KILL_PODS as f64
        } else {
            0.0
        }
    }
}

/// Runs both PLEGs.
pub async fn run(settings: &Settings) -> Result<Vec<Outcome>> {
    if settings.kills == 0 || settings.rounds == 0 || settings.batches.contains(&0) {
        bail!("kills, rounds and batch sizes must not be zero");
    }
    let _ = std::fs::remove_dir_all(&settings.log_dir);
    std::fs::create_dir_all(&settings.log_dir)
        .with_context(|| format!("creating {}", settings.log_dir.display()))?;
    let mut cri = Cri::connect(&settings.runtime_endpoint).await?;
    cri.clear()
        .await
        .context("clearing an earlier run's pods")?;
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut outcomes = Vec::new();
    for pleg in PLEGS {
        let outcome = run_pleg(settings, pleg, &mut cri, &mut rng)
            .await
            .with_context(|| format!("--pleg {pleg}"))?;
        eprintln!("{}", progress_line(&outcome));
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

/// Clears every pod of the benchmark from the runtime at `endpoint`, after an interrupted run.
pub async fn clean_up(endpoint: &str) -> Result<()> {
    Cri::connect(endpoint).await?.clear().await.map(drop)
}

fn progress_line(o: &Outcome) -> String {
    let kill = super::stats::LatencyMs::of(&o.kill_ns);
    format!(
        "--pleg {}: kill → API terminated p50 {:.2} ms, p99 {:.2} ms over {} ({} missed); idle \
         {:.2} API requests per pod-minute ({:?} in {:.0} s)",
        o.pleg,
        kill.p50,
        kill.p99,
        kill.n,
        o.missed_kills,
        o.idle_per_pod_minute(),
        o.idle_by_request,
        o.idle_seconds
    )
}

async fn run_pleg(
    settings: &Settings,
    pleg: &'static str,
    cri: &mut Cri,
    rng: &mut fastrand::Rng,
) -> Result<Outcome> {
    let server = tokio::task::block_in_place(|| TestApiServer::start(&format!("bench-{pleg}")));
    let work = harness::WorkDir::with_manifests("cluster", pleg)?;
    let mut extra_args = vec![
        "--kubeconfig".to_owned(),
        server.kubeconfig.display().to_string(),
    ];
    if pleg == "relist" {
        extra_args.extend(["--pleg-relist-period".to_owned(), RELIST_PERIOD.to_owned()]);
    }
    let options = AgentOptions {
        swiftlet: settings.swiftlet.clone(),
        runtime_endpoint: settings.runtime_endpoint.clone(),
        manifests: work.manifests(),
        work_dir: work.0.clone(),
        log: settings.log_dir.join(format!("swiftlet-{pleg}.log")),
        pleg: pleg.to_owned(),
        extra_args,
    };
    let client = server.client().await;
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .context("creating the benchmark's namespace")?;
    let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let agent = Agent::start(&options).await?;
    let run = PlegRun {
        settings,
        pleg,
        server: &server,
        agent: &agent,
        pods: &pods,
    };
    let measured = run.measure(cri, rng).await;
    let stopped = agent
        .stop_after_snapshot(&settings.log_dir.join(format!("metrics-{pleg}.txt")))
        .await;
    let cleared = cri.clear().await.context("clearing the run's pods");
    let outcome = measured?;
    stopped.context("stopping swiftlet")?;
    cleared?;
    Ok(outcome)
}

/// One PLEG's agent, API server and watch.
struct PlegRun<'a> {
    settings: &'a Settings,
    pleg: &'static str,
    server: &'a TestApiServer,
    agent: &'a Agent,
    pods: &'a Api<Pod>,
}

/// A version of a pod as it arrived on the benchmark's watch.
struct Seen {
    at: Instant,
    pod: Pod,
}

impl PlegRun<'_> {
    async fn measure(&self, cri: &mut Cri, rng: &mut fastrand::Rng) -> Result<Outcome> {
        let mut seen = watch_pods(self.pods.clone()).await?;
        let mut outcome = Outcome {
            pleg: self.pleg.to_owned(),
            ..Outcome::default()
        };
        let mut generation = 0;
        while outcome.kill_ns.len() + outcome.missed_kills < self.settings.kills {
            self.kill_generation(generation, cri, rng, &mut seen, &mut outcome)
                .await
                .with_context(|| format!("kill generation {generation}"))?;
            generation += 1;
        }
        outcome.kill_ns.sort_unstable();
        for &size in &self.settings.batches {
            for round in 0..self.settings.rounds {
                let mut latencies = self
                    .create_batch(size, round, cri, &mut seen, &mut outcome)
                    .await
                    .with_context(|| format!("batch of {size}, round {round}"))?;
                outcome
                    .create_ns
                    .entry(size)
                    .or_default()
                    .append(&mut latencies);
            }
        }
        for latencies in outcome.create_ns.values_mut() {
            latencies.sort_unstable();
        }
        Ok(outcome)
    }

    async fn kill_generation(
        &self,
        generation: usize,
        cri: &mut Cri,
        rng: &mut fastrand::Rng,
        seen: &mut mpsc::UnboundedReceiver<Seen>,
        outcome: &mut Outcome,
    ) -> Result<()> {
        let names: Vec<String> = (0..KILL_PODS)
            .map(|i| format!("kill-{}-g{generation}-{i:02}", self.pleg))
            .collect();
        for name in &names {
            self.pods
                .create(&PostParams::default(), &bench_pod(name))
                .await
                .with_context(|| format!("creating {name}"))?;
        }
        let running = wait_running(seen, &names).await?;
        // The idle window comes in the last generation: the agent's start (registration, the
        // Lease's creation) is long over by then.
        let last = outcome.kill_ns.len() + outcome.missed_kills + KILL_PODS >= self.settings.kills;
        if last {
            tokio::time::sleep(SETTLE).await;
            let (by_request, seconds) = self.idle_requests().await;
            outcome.idle_requests = by_request.values().sum();
            outcome.idle_by_request = by_request;
            outcome.idle_seconds = seconds;
        }
        let mut targets = Vec::with_capacity(running.len());
        for (name, container) in running {
            let pid = cri.container_pid(&container).await?;
            targets.push((name, container, pid));
        }
        rng.shuffle(&mut targets);
        // What came before the kills (the starts) is not measured.
        while seen.try_recv().is_ok() {}
        let mut killed_at: HashMap<String, Instant> = HashMap::new();
        let mut record = |version: Seen, killed_at: &mut HashMap<String, Instant>| {
            let Some(id) = terminated_container(&version.pod) else {
                return;
            };
            if let Some(t0) = killed_at.remove(&id) {
                outcome
                    .kill_ns
                    .push(nanos(version.at.saturating_duration_since(t0)));
            }
        };
        for (name, container, pid) in &targets {
            let gap = Duration::from_millis(rng.u64(KILL_GAP_MS.0..=KILL_GAP_MS.1));
            let next = tokio::time::Instant::now() + gap;
            while let Ok(Some(version)) = tokio::time::timeout_at(next, seen.recv()).await {
                record(version, &mut killed_at);
            }
            let t0 = Instant::now();
            nix::sys::signal::kill(Pid::from_raw(i32::try_from(*pid)?), Signal::SIGKILL)
                .with_context(|| format!("killing the init (pid {pid}) of {name}"))?;
            killed_at.insert(container.clone(), t0);
        }
        let deadline = tokio::time::Instant::now() + EVENT_TIMEOUT;
        while !killed_at.is_empty() {
            match tokio::time::timeout_at(deadline, seen.recv()).await {
                Ok(Some(version)) => record(version, &mut killed_at),
                Ok(None) => bail!("the benchmark's watch of the API server ended"),
                Err(_) => break,
            }
        }
        outcome.missed_kills += killed_at.len();
        self.tear_down(&names, cri).await
    }

    /// Creates `size` pods at once; the latency of each to Running on the API server.
    async fn create_batch(
        &self,
        size: usize,
        round: usize,
        cri: &mut Cri,
        seen: &mut mpsc::UnboundedReceiver<Seen>,
        outcome: &mut Outcome,
    ) -> Result<Vec<u64>> {
        let names: Vec<String> = (0..size)
            .map(|i| format!("start-{}-{size}-r{round}-{i:02}", self.pleg))
            .collect();
        while seen.try_recv().is_ok() {}
        let mut creates = tokio::task::JoinSet::new();
        let mut created_at = HashMap::new();
        for name in &names {
            let pods = self.pods.clone();
            let pod = bench_pod(name);
            created_at.insert(name.clone(), Instant::now());
            creates.spawn(async move { pods.create(&PostParams::default(), &pod).await });
        }
        while let Some(created) = creates.join_next().await {
            created
                .context("a create task")?
                .context("creating a pod of the batch")?;
        }
        let mut latencies = Vec::with_capacity(size);
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        while !created_at.is_empty() {
            let version = match tokio::time::timeout_at(deadline, seen.recv()).await {
                Ok(Some(version)) => version,
                Ok(None) => bail!("the benchmark's watch of the API server ended"),
                Err(_) => break,
            };
            if phase(&version.pod) != "Running" {
                continue;
            }
            let name = version.pod.metadata.name.clone().unwrap_or_default();
            if let Some(t0) = created_at.remove(&name) {
                latencies.push(nanos(version.at.saturating_duration_since(t0)));
            }
        }
        outcome.missed_starts += created_at.len();
        self.tear_down(&names, cri).await?;
        Ok(latencies)
    }

    /// The agent's API requests over the idle window, by request, and the window's seconds.
    async fn idle_requests(&self) -> (BTreeMap<String, u64>, f64) {
        tokio::task::block_in_place(|| self.server.clear_requests());
        let start = Instant::now();
        tokio::time::sleep(self.settings.idle).await;
        let (_, log) = tokio::task::block_in_place(|| self.server.requests());
        let seconds = start.elapsed().as_secs_f64();
        let mut by_request = BTreeMap::new();
        for r in log
            .iter()
            .filter(|r| r.user_agent.starts_with(AGENT_USER_AGENT))
        {
            *by_request
                .entry(format!("{} {}", r.method, request_kind(&r.path)))
                .or_default() += 1;
        }
        (by_request, seconds)
    }

    /// Deletes the pods at once (grace 0) and waits until the node has removed them.
    async fn tear_down(&self, names: &[String], cri: &mut Cri) -> Result<()> {
        let now = DeleteParams::default().grace_period(0);
        for name in names {
            if let Err(error) = self.pods.delete(name, &now).await
                && !matches!(&error, kube::Error::Api(s) if s.code == 404)
            {
                return Err(error).with_context(|| format!("deleting {name}"));
            }
        }
        if !harness::wait_removed(self.agent.port, cri, names, TEARDOWN_TIMEOUT).await? {
            eprintln!(
                "--pleg {}: swiftlet did not remove its pods within {TEARDOWN_TIMEOUT:?}; \
                 clearing them over CRI",
                self.pleg
            );
            cri.clear().await?;
        }
        Ok(())
    }
}

/// One busybox `sleep` container, never restarted, bound to the benchmark's node; no grace
/// period, so that teardowns stay short.
fn bench_pod(name: &str) -> Pod {
    let pod = json!({
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "swiftlet-bench-cluster"}},
        "spec": {
            "nodeName": NODE_NAME,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "sleep",
                "image": IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
            }],
        },
    });
    // A literal of the pod type: cannot fail.
    serde_json::from_value(pod).unwrap_or_default()
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

/// The runtime's ID of the pod's container when its status shows it terminated.
fn terminated_container(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    status.state.as_ref()?.terminated.as_ref()?;
    let id = status.container_id.as_deref()?;
    Some(id.split_once("://").map_or(id, |(_, id)| id).to_owned())
}

/// The runtime's ID of the pod's container when the pod is Running.
fn running_container(pod: &Pod) -> Option<String> {
    if phase(pod) != "Running" {
        return None;
    }
    let status = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    status.state.as_ref()?.running.as_ref()?;
    let id = status.container_id.as_deref()?;
    Some(id.split_once("://").map_or(id, |(_, id)| id).to_owned())
}

/// Waits, on the watch, until every pod of `names` runs: (name, container ID) of each.
async fn wait_running(
    seen: &mut mpsc::UnboundedReceiver<Seen>,
    names: &[String],
) -> Result<Vec<(String, String)>> {
    let mut running: BTreeMap<String, String> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + START_TIMEOUT;
    while running.len() < names.len() {
        match tokio::time::timeout_at(deadline, seen.recv()).await {
            Ok(Some(version)) => {
                let name = version.pod.metadata.name.clone().unwrap_or_default();
                if names.contains(&name)
                    && let Some(id) = running_container(&version.pod)
                {
                    running.insert(name, id);
                }
            }
            Ok(None) => bail!("the benchmark's watch of the API server ended"),
            Err(_) => bail!(
                "{} of {} pods ran within {START_TIMEOUT:?}",
                running.len(),
                names.len()
            ),
        }
    }
    Ok(running.into_iter().collect())
}

/// Every version of the benchmark's pods from now on, with the instant it arrived; the watch
/// is started again from the last version seen when the API server ends it.
async fn watch_pods(pods: Api<Pod>) -> Result<mpsc::UnboundedReceiver<Seen>> {
    let listed = pods
        .list(&ListParams::default())
        .await
        .context("listing the benchmark's pods")?;
    let mut version = listed.metadata.resource_version.unwrap_or_default();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok(stream) = pods.watch(&WatchParams::default(), &version).await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let mut stream = Box::pin(stream);
            while let Some(event) = stream.next().await {
                let at = Instant::now();
                let pod = match event {
                    Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => pod,
                    Ok(WatchEvent::Deleted(pod)) => {
                        version = pod.metadata.resource_version.clone().unwrap_or(version);
                        continue;
                    }
                    Ok(WatchEvent::Bookmark(b)) => {
                        version = b.metadata.resource_version;
                        continue;
                    }
                    // 410 Gone or a broken stream: this benchmark never compacts, so watch on.
                    Ok(WatchEvent::Error(_)) | Err(_) => break,
                };
                version = pod.metadata.resource_version.clone().unwrap_or(version);
                if tx.send(Seen { at, pod }).is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

/// `path` with the name after `pods/` as `{pod}`: one kind for every pod's request.
fn request_kind(path: &str) -> String {
    match path.split_once("/pods/") {
        Some((before, after)) => {
            let rest = after.split_once('/').map_or("", |(_, rest)| rest);
            if rest.is_empty() {
                format!("{before}/pods/{{pod}}")
            } else {
                format!("{before}/pods/{{pod}}/{rest}")
            }
        }
        None => path.to_owned(),
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Benchmark for Settings {
    const NAME: &'static str = "cluster";
    const NEEDS_ROOT: &'static str = "swiftlet loads eBPF programs and manages cgroups, and the \
                                      benchmark kills containers, which needs root";
    const RUNS_PODS: bool = true;
    type Outcome = Vec<Outcome>;
    type Report = report::Report;

    fn announce(&self) -> Option<String> {
        Some(format!(
            "cluster: through the API server, --pleg {}; {} kills of {KILL_PODS} pods at a time, \
             batches of {:?} × {}, a {} s idle window; swiftlet logs in {}",
            PLEGS.join(" and --pleg "),
            self.kills,
            self.batches,
            self.rounds,
            self.idle.as_secs(),
            self.log_dir.display()
        ))
    }

    async fn run(&self) -> Result<Vec<Outcome>> {
        run(self).await
    }

    async fn clean_up(&self) -> Result<()> {
        clean_up(&self.runtime_endpoint).await
    }

    fn report(
        &self,
        outcomes: &Vec<Outcome>,
        machine: &Machine,
        now: std::time::SystemTime,
    ) -> report::Report {
        report::Report::new(outcomes, machine, &rfc3339(now))
    }

    fn markdown(report: &report::Report) -> String {
        report.markdown()
    }

    fn verdicts(report: &report::Report) -> Vec<String> {
        report.verdicts()
    }

    fn warnings(report: &report::Report) -> Vec<String> {
        report.warnings()
    }

    fn plot(
        &self,
        path: &std::path::Path,
        machine: &Machine,
        outcomes: &Vec<Outcome>,
    ) -> Result<()> {
        let title = format!(
            "The control plane's view of the node, relist vs kernel events (Linux {}, {} CPUs)",
            machine.kernel_release, machine.cpus
        );
        report::plot(path, &title, outcomes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_requests_are_one_kind() {
        assert_eq!(
            request_kind("/api/v1/namespaces/ns/pods/p1/status"),
            "/api/v1/namespaces/ns/pods/{pod}/status"
        );
        assert_eq!(
            request_kind("/api/v1/namespaces/ns/pods/p1"),
            "/api/v1/namespaces/ns/pods/{pod}"
        );
        assert_eq!(request_kind("/api/v1/pods"), "/api/v1/pods");
    }
}
