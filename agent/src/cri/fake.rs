//! An in-memory CRI runtime for unit tests of the components above `cri` (pod workers, PLEG,
//! `kuberuntime`'s SyncPod): sandboxes and containers with containerd's state transitions, a
//! log of every call, and failures scripted per operation. Upstream counterpart:
//! `k8s.io/cri-client/pkg/fake` (`FakeRuntimeService`, `FakeImageService`).
//!
//! What it models, as containerd 1.6 was seen to behave: ids are unique; a sandbox's name
//! and attempt, and a container's name and attempt within its sandbox, are reserved (`Unknown`
//! on reuse); a container needs a ready sandbox and a present image (`NotFound` otherwise:
//! containerd finds no sandbox task, or cannot resolve the image); `Start` needs a created
//! container (`Unknown` otherwise); `Stop*` of an unknown id is `NotFound`, `Remove*` of one is
//! fine, and both force what they must (a stopped sandbox's running containers exit 137, its
//! IP goes); statuses of an unknown id are `NotFound`; a stop with a grace period ends the
//! process by SIGTERM (143), without one by SIGKILL (137). Time is a logical clock that ticks
//! 1 ms per change, so creation order is strict and tests are deterministic. Images are
//! matched by the exact name used (`ImageStatus` also by id, as containerd resolves it); an image
//! runs as root unless `set_image_user` says otherwise. `Status` reports no runtime handlers or
//! features (as containerd 1.6) unless `set_features` sets them. `GetContainerEvents` answers
//! Unimplemented (as containerd 1.6) until `enable_container_events`; then each stream carries the
//! events a test sends (`send_container_event`, built as containerd builds them: the sandbox's
//! status and all its containers') until `break_container_events`.
//! Not modelled: processes, networking beyond one IP per pod-network sandbox, logs (except that
//! `ReopenContainerLog` creates the log file, as the runtime would).

mod call;
pub mod fixtures;
mod image;
mod objects;
mod runtime;
#[cfg(test)]
mod tests;

use crate::lock::MutexExt as _;
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use k8s_cri::v1 as cri;

pub use call::Call;
use objects::{Container, Sandbox};

use super::{Error, Operation, Result};

/// One open `GetContainerEvents` stream of the fake.
type EventSender = tokio::sync::mpsc::UnboundedSender<Result<cri::ContainerEventResponse>>;

/// Shown as the endpoint of a scripted `Unavailable`.
const FAKE_ENDPOINT: &str = "fake://runtime";
/// 2023-11-14T22:13:20Z: a plausible start for the logical clock.
const CLOCK_START_NS: i64 = 1_700_000_000_000_000_000;
const TICK_NS: i64 = 1_000_000;

/// A failure waiting for its call.
#[derive(Clone, Debug)]
struct ScriptedFailure {
    operation: Operation,
    /// Only calls naming this object fail (any call of the operation when `None`).
    target: Option<String>,
    code: tonic::Code,
    /// Fails every matching call instead of only the next one.
    always: bool,
}

/// The fake runtime; implements [`super::RuntimeService`] and [`super::ImageService`].
pub struct FakeRuntime {
    runtime_name: String,
    state: Mutex<State>,
    /// `ExecSync` calls waiting for an answer now (a dropped call is no longer waiting).
    execs_waiting: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

struct State {
    clock_ns: i64,
    next_id: u64,
    next_ip: u32,
    sandboxes: BTreeMap<String, Sandbox>,
    containers: BTreeMap<String, Container>,
    /// By the name the image was pulled or added under.
    images: BTreeMap<String, cri::Image>,
    exec_results: HashMap<String, cri::ExecSyncResponse>,
    /// `ExecSync` never answers (until its timeout, if it has one).
    exec_hangs: bool,
    /// What `ListContainerStats` reports as each container's writable layer, by id (none for
    /// the others).
    writable_layers: HashMap<String, u64>,
    runtime_ready: bool,
    network_ready: bool,
    /// What `Status` reports beyond the conditions (none, as containerd 1.6, unless set).
    runtime_handlers: Vec<cri::RuntimeHandler>,
    features: Option<cri::RuntimeFeatures>,
    /// What `RuntimeConfig` answers; `None` answers Unimplemented, as containerd 1.6 does.
    runtime_config: Option<cri::RuntimeConfigResponse>,
    /// Whether `GetContainerEvents` is implemented (not in containerd 1.6, the default).
    container_events: bool,
    /// What `Version` answers as the runtime's version.
    runtime_version: String,
    /// The open `GetContainerEvents` streams.
    event_subscribers: Vec<EventSender>,
    failures: Vec<ScriptedFailure>,
    calls: Vec<Call>,
}

impl State {
    fn tick(&mut self) -> i64 {
        self.clock_ns += TICK_NS;
        self.clock_ns
    }

    fn new_id(&mut self, kind: &str) -> String {
        self.next_id += 1;
        format!("{kind}-{}", self.next_id)
    }

    /// Takes the first failure scripted for this call, if any.
    fn take_failure(&mut self, operation: Operation, target: &str) -> Option<tonic::Code> {
        let index = self.failures.iter().position(|f| {
            f.operation == operation && f.target.as_deref().is_none_or(|t| t == target)
        })?;
        let failure = &self.failures[index];
        let code = failure.code;
        if !failure.always {
            self.failures.remove(index);
        }
        Some(code)
    }

    /// Ends a container's run as containerd reports it: "Completed" for 0, "Error" otherwise.
    fn exit(&mut self, id: &str, exit_code: i32, reason: Option<&str>) -> bool {
        let now = self.tick();
        let Some(c) = self.containers.get_mut(id) else {
            return false;
        };
        if c.state != cri::ContainerState::ContainerRunning {
            return false;
        }
        c.state = cri::ContainerState::ContainerExited;
        c.finished_at = now;
        c.exit_code = exit_code;
        c.reason = match reason {
            Some(reason) => reason.to_owned(),
            None if exit_code == 0 => "Completed".to_owned(),
            None => "Error".to_owned(),
        };
        true
    }
}

impl Default for FakeRuntime {
    fn default() -> Self {
        FakeRuntime::new()
    }
}

impl FakeRuntime {
    /// An empty, ready runtime named "containerd".
    pub fn new() -> Self {
        FakeRuntime::with_runtime_name("containerd")
    }

    pub fn with_runtime_name(name: &str) -> Self {
        FakeRuntime {
            runtime_name: name.to_owned(),
            state: Mutex::new(State {
                clock_ns: CLOCK_START_NS,
                next_id: 0,
                next_ip: 1,
                sandboxes: BTreeMap::new(),
                containers: BTreeMap::new(),
                images: BTreeMap::new(),
                exec_results: HashMap::new(),
                exec_hangs: false,
                writable_layers: HashMap::new(),
                runtime_ready: true,
                network_ready: true,
                runtime_handlers: Vec::new(),
                features: None,
                runtime_config: None,
                container_events: false,
                runtime_version: "1.6.20-fake".to_owned(),
                event_subscribers: Vec::new(),
                failures: Vec::new(),
                calls: Vec::new(),
            }),
            execs_waiting: std::sync::Arc::default(),
        }
    }

    // A panicking test thread must not hide the fake from the test's other assertions.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock_unpoisoned()
    }

    /// Logs the call and applies a scripted failure; the state for the call to act on.
    fn begin(&self, call: Call) -> Result<MutexGuard<'_, State>> {
        let mut state = self.lock();
        let operation = call.operation();
        let target = call.target().to_owned();
        state.calls.push(call);
        match state.take_failure(operation, &target) {
            Some(code) => Err(fail(operation, &target, code, "scripted failure")),
            None => Ok(state),
        }
    }

    /// The fake's clock (what it stamps creations, starts and exits with), for callers that
    /// need to agree with it.
    pub fn now(&self) -> std::time::SystemTime {
        let nanos = u64::try_from(self.lock().clock_ns).unwrap_or(0);
        std::time::SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos)
    }

    /// Every call so far, oldest first.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// Every call so far, clearing the log.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.lock().calls)
    }

    /// The writable layer's bytes `ListContainerStats` reports for container `id`.
    pub fn set_writable_layer(&self, id: &str, bytes: u64) {
        self.lock().writable_layers.insert(id.to_owned(), bytes);
    }

    /// The next call of `operation` fails with `code` (once; scripts queue up in order).
    pub fn fail_next(&self, operation: Operation, code: tonic::Code) {
        self.script(operation, None, code, false);
    }

    /// The next call of `operation` naming `target` (a sandbox or container id, an image, or
    /// the sandbox id of a `CreateContainer`) fails with `code`.
    pub fn fail_next_for(&self, operation: Operation, target: &str, code: tonic::Code) {
        self.script(operation, Some(target.to_owned()), code, false);
    }

    /// Every call of `operation` fails with `code` until [`FakeRuntime::clear_failures`].
    pub fn fail_always(&self, operation: Operation, code: tonic::Code) {
        self.script(operation, None, code, true);
    }

    pub fn clear_failures(&self) {
        self.lock().failures.clear();
    }

    fn script(
        &self,
        operation: Operation,
        target: Option<String>,
        code: tonic::Code,
        always: bool,
    ) {
        self.lock().failures.push(ScriptedFailure {
            operation,
            target,
            code,
            always,
        });
    }

    /// Makes an image present, as if pulled; returns its id.
    pub fn add_image(&self, name: &str) -> String {
        let mut state = self.lock();
        image::insert(&mut state, name)
    }

    /// Marks an image pinned, as containerd marks its sandbox image (image GC never removes a
    /// pinned image). False if there is no such image.
    pub fn pin_image(&self, name: &str) -> bool {
        self.lock()
            .images
            .get_mut(name)
            .map(|i| i.pinned = true)
            .is_some()
    }

    /// Names of the images present, in name order.
    pub fn image_names(&self) -> Vec<String> {
        self.lock().images.keys().cloned().collect()
    }

    /// The running container's main process exits with `exit_code`. False if it is not running.
    pub fn exit_container(&self, id: &str, exit_code: i32) -> bool {
        self.lock().exit(id, exit_code, None)
    }

    /// From now on `GetContainerEvents` answers with a stream, as containerd 1.7 and later do
    /// (the fake starts as 1.6, which answers Unimplemented).
    pub fn enable_container_events(&self) {
        self.lock().container_events = true;
    }

    /// From now on `Version` answers `version` as the runtime's version.
    pub fn set_runtime_version(&self, version: &str) {
        self.lock().runtime_version = version.to_owned();
    }

    /// Sends a container event to every open `GetContainerEvents` stream, as containerd's
    /// `generateAndSendContainerEvent` makes it: the status of sandbox `sandbox_id` (none once it
    /// is removed) and of every container in it, stamped now. Returns how many streams took it.
    pub fn send_container_event(
        &self,
        container_id: &str,
        sandbox_id: &str,
        kind: cri::ContainerEventType,
    ) -> usize {
        let mut state = self.lock();
        let created_at = state.tick();
        let sandbox = state.sandboxes.get(sandbox_id);
        let log_dir = sandbox
            .map(|s| s.config.log_directory.clone())
            .unwrap_or_default();
        let event = cri::ContainerEventResponse {
            container_id: container_id.to_owned(),
            container_event_type: kind.into(),
            created_at,
            pod_sandbox_status: sandbox.map(|s| s.to_status(sandbox_id)),
            containers_statuses: state
                .containers
                .iter()
                .filter(|(_, c)| c.sandbox_id == sandbox_id)
                .map(|(id, c)| c.to_status(id, &log_dir))
                .collect(),
        };
        state
            .event_subscribers
            .retain(|tx| tx.send(Ok(event.clone())).is_ok());
        state.event_subscribers.len()
    }

    /// Breaks every open `GetContainerEvents` stream with `code` (the runtime restarted, the
    /// connection dropped).
    pub fn break_container_events(&self, code: tonic::Code) {
        let error = || fail(Operation::GetContainerEvents, "", code, "stream broken");
        for tx in self.lock().event_subscribers.drain(..) {
            let _ = tx.send(Err(error()));
        }
    }

    /// The `GetContainerEvents` streams open now (a dropped one no longer counts).
    pub fn container_event_subscribers(&self) -> usize {
        let mut state = self.lock();
        state.event_subscribers.retain(|tx| !tx.is_closed());
        state.event_subscribers.len()
    }

    /// The running container is killed by the OOM killer (137, reason "OOMKilled").
    pub fn oom_kill_container(&self, id: &str) -> bool {
        self.lock().exit(id, 137, Some("OOMKilled"))
    }

    /// The container disappears without any call (removed behind the agent's back). False if
    /// there was no such container.
    pub fn vanish_container(&self, id: &str) -> bool {
        self.lock().containers.remove(id).is_some()
    }

    /// The sandbox record disappears without any call. Its containers stay, as a list taken
    /// between the sandbox and the container listings sees a pod created in between; vanish
    /// them too to make the whole pod disappear.
    pub fn vanish_sandbox(&self, id: &str) -> bool {
        self.lock().sandboxes.remove(id).is_some()
    }

    /// From now on `ExecSync` never answers: every command hangs (until the call's timeout, if
    /// it has one, as the runtime would kill it then).
    pub fn hang_execs(&self) {
        self.lock().exec_hangs = true;
    }

    /// `ExecSync` calls waiting for their answer now (a cancelled call no longer waits).
    pub fn execs_waiting(&self) -> usize {
        self.execs_waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// What `ExecSync` in this container answers (exit 0 and no output until set).
    pub fn set_exec_result(&self, container_id: &str, result: cri::ExecSyncResponse) {
        self.lock()
            .exec_results
            .insert(container_id.to_owned(), result);
    }

    /// The `RuntimeReady` and `NetworkReady` conditions `Status` reports.
    pub fn set_conditions(&self, runtime_ready: bool, network_ready: bool) {
        let mut state = self.lock();
        state.runtime_ready = runtime_ready;
        state.network_ready = network_ready;
    }

    /// What `Status` reports as the runtime's handlers and features (a CRI v1.30+ runtime).
    pub fn set_features(
        &self,
        handlers: Vec<cri::RuntimeHandler>,
        features: Option<cri::RuntimeFeatures>,
    ) {
        let mut state = self.lock();
        state.runtime_handlers = handlers;
        state.features = features;
    }

    /// What `RuntimeConfig` answers from now on (a CRI v1.28+ runtime); `None` answers
    /// Unimplemented again, as containerd before 2.0.
    pub fn set_runtime_config(&self, config: Option<cri::RuntimeConfigResponse>) {
        self.lock().runtime_config = config;
    }

    /// The user image `name` runs as, as `ImageStatus` reports it (adds the image if absent).
    pub fn set_image_user(&self, name: &str, uid: Option<i64>, username: &str) {
        let mut state = self.lock();
        image::insert(&mut state, name);
        if let Some(image) = state.images.get_mut(name) {
            image.uid = uid.map(|value| cri::Int64Value { value });
            image.username = username.to_owned();
        }
    }

    /// Moves the logical clock forward (e.g. to age an exited container).
    pub fn advance_clock(&self, by: Duration) {
        let nanos = i64::try_from(by.as_nanos()).unwrap_or(i64::MAX);
        let mut state = self.lock();
        state.clock_ns = state.clock_ns.saturating_add(nanos);
    }

    /// Ids of all sandboxes, in id order.
    pub fn sandbox_ids(&self) -> Vec<String> {
        self.lock().sandboxes.keys().cloned().collect()
    }

    /// Ids of all containers, in id order.
    pub fn container_ids(&self) -> Vec<String> {
        self.lock().containers.keys().cloned().collect()
    }

    /// The config a sandbox was created with.
    pub fn sandbox_config(&self, id: &str) -> Option<cri::PodSandboxConfig> {
        self.lock().sandboxes.get(id).map(|s| s.config.clone())
    }

    /// The config a container was created with.
    pub fn container_config(&self, id: &str) -> Option<cri::ContainerConfig> {
        self.lock().containers.get(id).map(|c| c.config.clone())
    }

    /// The resources of the container's last `UpdateContainerResources`.
    pub fn container_resources(&self, id: &str) -> Option<cri::LinuxContainerResources> {
        self.lock()
            .containers
            .get(id)
            .and_then(|c| c.resources.clone())
    }

    /// The container's state, without a logged call.
    pub fn container_state(&self, id: &str) -> Option<cri::ContainerState> {
        self.lock().containers.get(id).map(|c| c.state)
    }

    /// The sandbox's state, without a logged call.
    pub fn sandbox_state(&self, id: &str) -> Option<cri::PodSandboxState> {
        self.lock().sandboxes.get(id).map(|s| s.state)
    }
}

/// An error as the real client would map the runtime's status.
fn fail(operation: Operation, id: &str, code: tonic::Code, message: &str) -> Error {
    Error::from_status(
        operation,
        id,
        FAKE_ENDPOINT,
        None,
        tonic::Status::new(code, message),
    )
}
