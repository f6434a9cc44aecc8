//! The volume manager (upstream `pkg/kubelet/volumemanager`): a desired state of world (the
//! volumes of the pods the pod workers are running), an actual state of world (what is set up on
//! the node), and a reconciler that sets up what is desired and tears down what is not.
//!
//! Upstream's populator scans the pod manager every 100 ms; here the pod sync adds its pod
//! ([`VolumeManager::wait_for_attach_and_mount`]) and the terminated-pod sync removes it
//! ([`VolumeManager::wait_for_unmount`]), each kicking the reconciler at once. The waits keep
//! upstream's bound (back-off from 1 s, ×1.2, 6 steps) but also look after every reconcile
//! pass, so a pod whose volumes are ready does not sleep through the first step.
//!
//! Volumes that follow the API: every sync of a pod after the first marks its set-up configMap,
//! secret and projected volumes for a remount (upstream `WaitForAttachAndMount` →
//! `ReprocessPod` → `MarkRemountRequired` for plugins whose `RequiresRemount` holds), so they
//! are set up again within `syncFrequency` (the pod workers' resync): the objects are read again
//! from the object source (a watch per object by default, see `object_watch.rs`), tokens come
//! from the token manager (renewed at 80 % of their lifetime, `token_manager.rs`), and the atomic
//! writer swaps `..data` only when the payload changed. A remount that fails leaves the volume
//! set up with its last files (a deleted object, an API server away) and is tried again at the
//! pod's next sync; downwardAPI volumes are written again every pass. The pod's object
//! references are registered with the source when the pod is added and dropped when it is
//! removed (upstream's pod manager registers them with the ConfigMap and Secret managers).
//!
//! A failed set-up is retried every pass; it is reported as a `FailedMount` event about the pod
//! (`MountVolume.SetUp failed for volume "v" : …`) as often as upstream's operation executor
//! retries it: at once, then after 0.5 s doubling to 2 min 2 s (`exponentialbackoff`), so a
//! volume that keeps failing makes one series of events, not one per pass.

use crate::lock::MutexExt as _;
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::{
    Error, Result,
    api_objects::{Fetch, ObjectRef, ObjectSource},
    downward_api, empty_dir, host_path,
    metrics::VolumeMetrics,
    mount::{self, MountInfo},
    ownership::{self, FsGroup},
    paths::{Plugin, PodDirs},
    projected::{self, Want},
    spec::{Medium, Source, VolumeSpec, pod_volumes},
    subpath,
    token_manager::TokenManager,
};
use crate::{
    events::{Action, Event, Events, pod_ref, reasons},
    hostfs::Dir,
};

/// The objects read for this pass, by (pod, volume).
type Fetches = HashMap<(PodUid, String), Vec<Fetch>>;
use crate::{container::PodUid, pod::pod_uid};

/// Upstream's reconciler period; here only the safety net (changes kick it at once).
pub const RECONCILE_PERIOD: Duration = Duration::from_secs(1);

/// Upstream `initialDurationBeforeRetry` and `maxDurationBeforeRetry` of a failed volume
/// operation: how often its `FailedMount` event repeats.
pub const FAILED_MOUNT_FIRST_RETRY: Duration = Duration::from_millis(500);
pub const FAILED_MOUNT_MAX_RETRY: Duration = Duration::from_secs(122);

/// When a volume's failure is next reported.
struct FailureReport {
    next: tokio::time::Instant,
    step: Duration,
}

/// Upstream `WaitForAttachAndMount`'s back-off: 1 s, ×1.2, 6 steps.
pub fn wait_steps() -> Vec<Duration> {
    let mut step = Duration::from_secs(1);
    let mut out = Vec::new();
    // Six checks, five sleeps between them (`wait.ExponentialBackoff`).
    for _ in 0..5 {
        out.push(step);
        step = step.mul_f64(1.2);
    }
    out
}

#[derive(Clone, Debug)]
pub struct VolumeManagerConfig {
    pub dirs: PodDirs,
    /// For memory emptyDirs without a smaller limit.
    pub node_allocatable_memory: i64,
    /// For downward API resource items of containers without a limit.
    pub node: downward_api::NodeResources,
    /// `clusterDomain`, for the pod's FQDN in its `/etc/hosts`.
    pub cluster_domain: Option<String>,
    /// How long the waits last: upstream's back-off ([`wait_steps`]) in total.
    pub wait_budget: Duration,
}

/// The total of upstream's back-off steps (about 7.4 s).
pub fn default_wait_budget() -> Duration {
    wait_steps().iter().sum()
}

/// A volume set up on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountedVolume {
    pub plugin: Plugin,
    /// What containers bind (the volume dir, or the node's path for hostPath).
    pub path: PathBuf,
    /// Disk emptyDirs: `sizeLimit`, for the usage report.
    pub size_limit: Option<i64>,
}

/// A disk emptyDir's usage (upstream measures it for eviction; see [`empty_dir`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmptyDirUsage {
    pub volume: String,
    pub bytes: u64,
    pub size_limit: Option<i64>,
}

struct DesiredPod {
    pod: Arc<Pod>,
    volumes: Vec<VolumeSpec>,
}

#[derive(Default)]
struct State {
    desired: HashMap<PodUid, DesiredPod>,
    actual: HashMap<PodUid, BTreeMap<String, MountedVolume>>,
    /// The last set-up failure per volume, upstream's event text.
    failures: HashMap<PodUid, BTreeMap<String, String>>,
    /// Set-up volumes to set up again (upstream's `remountRequired`), by pod and volume name.
    remount: HashSet<(PodUid, String)>,
    /// When each failing volume's failure is reported again.
    reports: HashMap<PodUid, BTreeMap<String, FailureReport>>,
}

pub struct VolumeManager {
    config: VolumeManagerConfig,
    state: Mutex<State>,
    kick: Notify,
    /// Counts reconcile passes; waiters look again after each.
    passes: watch::Sender<u64>,
    /// Only one reconcile pass at a time (the loop, or a test calling it).
    reconciling: tokio::sync::Mutex<()>,
    metrics: VolumeMetrics,
    /// Where ConfigMaps and Secrets come from, once an API server is connected.
    objects: std::sync::OnceLock<Arc<dyn ObjectSource>>,
    /// Service account tokens of projected volumes, renewed when due.
    tokens: TokenManager,
    events: Events,
}

impl VolumeManager {
    pub fn new(config: VolumeManagerConfig, metrics: VolumeMetrics, events: Events) -> Arc<Self> {
        Arc::new(VolumeManager {
            config,
            metrics,
            events,
            state: Mutex::new(State::default()),
            kick: Notify::new(),
            passes: watch::channel(0).0,
            reconciling: tokio::sync::Mutex::new(()),
            objects: std::sync::OnceLock::new(),
            tokens: TokenManager::new(crate::clock::system(), Arc::new(fastrand::f64)),
        })
    }

    pub fn dirs(&self) -> &PodDirs {
        &self.config.dirs
    }

    /// configMap and secret volumes are read from `objects` from now on.
    pub fn set_object_source(&self, objects: Arc<dyn ObjectSource>) {
        let _ = self.objects.set(objects);
    }

    pub fn cluster_domain(&self) -> Option<&str> {
        self.config.cluster_domain.as_deref()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock_unpoisoned()
    }

    /// The reconciler: a pass whenever kicked, and every [`RECONCILE_PERIOD`].
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            self.reconcile().await;
            tokio::select! {
                () = self.kick.notified() => {}
                () = tokio::time::sleep(RECONCILE_PERIOD) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    /// One reconcile pass (the file system work off the async threads).
    pub async fn reconcile(self: &Arc<Self>) {
        let _one = self.reconciling.lock().await;
        self.tokens.cleanup();
        let fetched = self.fetch_objects().await;
        let this = self.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || this.reconcile_blocking(&fetched)).await
        {
            tracing::error!(error = %e, "volume reconcile pass failed");
        }
        self.passes.send_modify(|n| *n += 1);
    }

    /// Reads what the object and projected volumes about to be set up or remounted need (one
    /// read per source).
    async fn fetch_objects(&self) -> Fetches {
        let wanted: Vec<((PodUid, String), Vec<Want>)> = {
            let state = self.state();
            state
                .desired
                .iter()
                .flat_map(|(uid, d)| {
                    let actual = state.actual.get(uid);
                    let remount = &state.remount;
                    let pod = d.pod.clone();
                    d.volumes.iter().filter_map(move |v| {
                        let key = (uid.clone(), v.name.clone());
                        if actual.is_some_and(|a| a.contains_key(&v.name))
                            && !remount.contains(&key)
                        {
                            return None;
                        }
                        Some((key, volume_wants(&pod, v)?))
                    })
                })
                .collect()
        };
        let mut out = Fetches::new();
        for (key, wants) in wanted {
            let mut fetched = Vec::with_capacity(wants.len());
            for want in wants {
                let objects = self.objects.get();
                let no_api = || "no API server is connected".to_owned();
                fetched.push(match (want, objects) {
                    (Want::Nothing, _) => Fetch::Nothing,
                    (Want::Object(kind, namespace, name), Some(o)) => {
                        Fetch::Object(o.get(kind, &namespace, &name).await)
                    }
                    (Want::Token(spec), Some(o)) => Fetch::Token(
                        self.tokens
                            .get(&spec, o.as_ref())
                            .await
                            .map_err(|e| e.to_string()),
                    ),
                    (Want::Object(..), None) => Fetch::Object(Err(no_api())),
                    (Want::Token(_), None) => Fetch::Token(Err(
                        super::token_manager::TokenError::Fetch(no_api()).to_string(),
                    )),
                });
            }
            out.insert(key, fetched);
        }
        out
    }

    fn reconcile_blocking(&self, fetched: &Fetches) {
        // Without the node's mounts a memory volume could be mounted twice: skip the pass.
        let mounts = match mount::mounts() {
            Ok(mounts) => mounts,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the node's mounts; volumes not reconciled");
                return;
            }
        };
        // Tear down what is set up but no longer wanted (upstream `unmountVolumes`).
        let unwanted: Vec<(PodUid, String, MountedVolume)> = {
            let state = self.state();
            state
                .actual
                .iter()
                .flat_map(|(uid, volumes)| {
                    let wanted = state.desired.get(uid);
                    volumes
                        .iter()
                        .filter(move |(name, _)| {
                            !wanted.is_some_and(|d| d.volumes.iter().any(|v| &v.name == *name))
                        })
                        .map(move |(name, v)| (uid.clone(), name.clone(), v.clone()))
                })
                .collect()
        };
        for (uid, name, volume) in unwanted {
            let started = std::time::Instant::now();
            let done = self.tear_down(&uid, &name, &volume, &mounts);
            self.metrics.operation(
                "volume_unmount",
                volume.plugin,
                done.is_ok(),
                started.elapsed().as_secs_f64(),
            );
            match done {
                Ok(()) => {
                    tracing::debug!(pod = %uid, volume = name, "volume torn down");
                    let mut state = self.state();
                    if let Some(volumes) = state.actual.get_mut(&uid) {
                        volumes.remove(&name);
                        if volumes.is_empty() {
                            state.actual.remove(&uid);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(pod = %uid, volume = name, error = %e, "UnmountVolume.TearDown failed")
                }
            }
        }
        // Set up what is wanted (upstream `mountOrAttachVolumes`), and again what is marked for a
        // remount. Downward API volumes are written again each pass: the atomic writer changes
        // nothing unless the pod did.
        let wanted: Vec<(PodUid, Arc<Pod>, VolumeSpec)> = {
            let state = self.state();
            state
                .desired
                .iter()
                .flat_map(|(uid, d)| {
                    let actual = state.actual.get(uid);
                    let remount = &state.remount;
                    d.volumes
                        .iter()
                        .filter(move |v| {
                            let key = (uid.clone(), v.name.clone());
                            let object = matches!(
                                v.source,
                                Source::Object { .. } | Source::Projected { .. }
                            );
                            // An object volume added after the fetch waits for the next pass.
                            if object && !fetched.contains_key(&key) {
                                return false;
                            }
                            matches!(v.source, Source::DownwardApi { .. })
                                || !actual.is_some_and(|a| a.contains_key(&v.name))
                                || remount.contains(&key)
                        })
                        .map(move |v| (uid.clone(), d.pod.clone(), v.clone()))
                })
                .collect()
        };
        for (uid, pod, volume) in wanted {
            let started = std::time::Instant::now();
            let result = self.set_up(&uid, &pod, &volume, &mounts, fetched);
            self.metrics.operation(
                "volume_mount",
                volume.source.plugin(),
                result.is_ok(),
                started.elapsed().as_secs_f64(),
            );
            let mut state = self.state();
            // Done either way: a failed remount waits for the pod's next sync, with the files it
            // had (upstream's SetUp fails before it writes).
            state.remount.remove(&(uid.clone(), volume.name.clone()));
            // The pod may have gone while this one was being set up: the next pass tears it down.
            match result {
                Ok(mounted) => {
                    if let Some(f) = state.failures.get_mut(&uid) {
                        f.remove(&volume.name);
                    }
                    if let Some(r) = state.reports.get_mut(&uid) {
                        r.remove(&volume.name);
                    }
                    state
                        .actual
                        .entry(uid)
                        .or_default()
                        .insert(volume.name, mounted);
                }
                Err(e) => {
                    let text = format!(
                        "MountVolume.SetUp failed for volume {:?} : {e}",
                        volume.name
                    );
                    let failures = state.failures.entry(uid.clone()).or_default();
                    // Retried every pass: said once per distinct failure.
                    if failures.get(&volume.name) != Some(&text) {
                        tracing::warn!(pod = %uid, volume = volume.name, error = %e, "FailedMount");
                    }
                    failures.insert(volume.name.clone(), text.clone());
                    let now = tokio::time::Instant::now();
                    let reports = state.reports.entry(uid.clone()).or_default();
                    let due = reports.get(&volume.name).is_none_or(|r| now >= r.next);
                    if due {
                        let step = reports
                            .get(&volume.name)
                            .map_or(FAILED_MOUNT_FIRST_RETRY, |r| {
                                (r.step * 2).min(FAILED_MOUNT_MAX_RETRY)
                            });
                        reports.insert(
                            volume.name,
                            FailureReport {
                                next: now + step,
                                step,
                            },
                        );
                        self.events.record(Event::warning(
                            pod_ref(&pod),
                            reasons::FAILED_MOUNT_VOLUME,
                            Action::MountVolume,
                            text,
                        ));
                    }
                }
            }
        }
        self.publish_totals();
    }

    fn publish_totals(&self) {
        let state = self.state();
        let desired: Vec<Plugin> = state
            .desired
            .values()
            .flat_map(|d| d.volumes.iter().map(|v| v.source.plugin()))
            .collect();
        let actual: Vec<Plugin> = state
            .actual
            .values()
            .flat_map(|a| a.values().map(|v| v.plugin))
            .collect();
        drop(state);
        self.metrics.totals(&desired, &actual);
    }

    /// Tears volume `name` of pod `uid` down: its subPath binds first (upstream
    /// `CleanSubPaths`), then its directory (hostPath: nothing of the node's).
    fn tear_down(
        &self,
        uid: &PodUid,
        name: &str,
        volume: &MountedVolume,
        mounts: &[MountInfo],
    ) -> Result<()> {
        subpath::clean(&self.config.dirs, uid, name, mounts)?;
        if volume.plugin == Plugin::HostPath {
            return Ok(());
        }
        match self
            .config
            .dirs
            .open_in_pod(uid, &["volumes", &volume.plugin.dir_name()])
        {
            Ok(parent) => empty_dir::tear_down(&parent, name, mounts),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn set_up(
        &self,
        uid: &PodUid,
        pod: &Pod,
        volume: &VolumeSpec,
        mounts: &[MountInfo],
        fetched: &Fetches,
    ) -> Result<MountedVolume> {
        let plugin = volume.source.plugin();
        let dir = self.config.dirs.volume(uid, plugin, &volume.name);
        let memory =
            |limit| empty_dir::memory_size(self.config.node_allocatable_memory, limit, pod);
        let fs_group = FsGroup::of(pod);
        let mounted = |size_limit| MountedVolume {
            plugin,
            path: dir.clone(),
            size_limit,
        };
        // downwardAPI, configMap, secret and projected: files on a tmpfs, written atomically,
        // fsGroup applied to the new payload (read-only bits) before it becomes visible.
        let write_files = |payload: &super::atomic_writer::Payload| -> Result<()> {
            // The group's read bits the ownership change adds, in the payload already: the
            // writer's unchanged check compares modes, and a remount must find the files as the
            // last write left them.
            let grouped;
            let payload = match fs_group {
                Some(_) => {
                    grouped = payload
                        .iter()
                        .map(|(path, file)| {
                            let mut file = file.clone();
                            file.mode |= ownership::RO_MASK;
                            (path.clone(), file)
                        })
                        .collect();
                    &grouped
                }
                None => payload,
            };
            let parent = self.config.dirs.plugin_dir(uid, plugin)?;
            let root =
                empty_dir::set_up(&parent, &volume.name, Medium::Memory, memory(None), mounts)?;
            let perms = |volume_root: &Dir, payload_dir: &Dir| -> Result<()> {
                if let Some(group) = fs_group {
                    ownership::change_below(payload_dir, group.gid, true)?;
                    ownership::change_dir(payload_dir, group.gid, true)?;
                    ownership::change_dir(volume_root, group.gid, true)?;
                }
                Ok(())
            };
            super::atomic_writer::write(&root, payload, SystemTime::now(), &perms)?;
            Ok(())
        };
        match &volume.source {
            Source::EmptyDir { medium, size_limit } => {
                let parent = self.config.dirs.plugin_dir(uid, plugin)?;
                let root =
                    empty_dir::set_up(&parent, &volume.name, *medium, memory(*size_limit), mounts)?;
                if let Some(group) = fs_group {
                    ownership::set_volume_ownership(&root, group, false)?;
                }
                Ok(mounted(
                    (*medium == Medium::Disk).then_some(*size_limit).flatten(),
                ))
            }
            Source::HostPath { path, kind } => {
                host_path::check_type(path, kind)?;
                Ok(MountedVolume {
                    plugin,
                    path: PathBuf::from(path),
                    size_limit: None,
                })
            }
            Source::DownwardApi {
                items,
                default_mode,
            } => {
                let payload = downward_api::payload(
                    &volume.name,
                    pod,
                    items,
                    *default_mode,
                    self.config.node,
                )?;
                write_files(&payload)?;
                Ok(mounted(None))
            }
            Source::Projected {
                sources,
                default_mode,
            } => {
                let none = Vec::new();
                let found = fetched
                    .get(&(uid.clone(), volume.name.clone()))
                    .unwrap_or(&none);
                let payload = projected::payload(
                    &volume.name,
                    pod,
                    sources,
                    found,
                    *default_mode,
                    self.config.node,
                    fs_group.is_some(),
                )?;
                write_files(&payload)?;
                Ok(mounted(None))
            }
            Source::Object {
                kind,
                name,
                items,
                default_mode,
                optional,
            } => {
                let missing = Err("not read".to_owned());
                let found = match fetched
                    .get(&(uid.clone(), volume.name.clone()))
                    .and_then(|f| f.first())
                {
                    Some(Fetch::Object(found)) => found,
                    _ => &missing,
                };
                let payload = super::api_objects::payload(
                    &volume.name,
                    *kind,
                    name,
                    found,
                    items,
                    *default_mode,
                    *optional,
                )?;
                write_files(&payload)?;
                Ok(mounted(None))
            }
        }
    }

    /// Wants `pod`'s volumes set up (upstream's populator adding a pod); a spec the manager
    /// cannot serve is an error at once.
    pub fn add_pod(&self, pod: Arc<Pod>) -> Result<()> {
        let volumes = pod_volumes(&pod)?;
        let uid = pod_uid(&pod);
        // The sources validated both; the paths built from them do not depend on it.
        crate::hostfs::check_component(std::ffi::OsStr::new(&uid.0))?;
        for v in &volumes {
            crate::hostfs::check_component(std::ffi::OsStr::new(&v.name))?;
        }
        if let Some(objects) = self.objects.get() {
            objects.register_pod(&uid, &referenced_objects(&pod, &volumes));
        }
        let mut state = self.state();
        // Upstream `MarkRemountRequired`: what is set up already is set up again.
        let mounted: Vec<String> = state
            .actual
            .get(&uid)
            .map(|a| {
                volumes
                    .iter()
                    .filter(|v| requires_remount(&v.source) && a.contains_key(&v.name))
                    .map(|v| v.name.clone())
                    .collect()
            })
            .unwrap_or_default();
        // A pod without volumes gives the reconciler nothing to do.
        let kick = !volumes.is_empty();
        for name in mounted {
            state.remount.insert((uid.clone(), name));
        }
        state.desired.insert(uid, DesiredPod { pod, volumes });
        drop(state);
        if kick {
            self.kick.notify_one();
        }
        Ok(())
    }

    /// No longer wants the volumes of `uid` (its pod terminated).
    pub fn remove_pod(&self, uid: &PodUid) {
        if let Some(objects) = self.objects.get() {
            objects.unregister_pod(uid);
        }
        self.tokens.forget_pod(uid);
        let mut state = self.state();
        state.desired.remove(uid);
        state.failures.remove(uid);
        state.remount.retain(|(pod, _)| pod != uid);
        state.reports.remove(uid);
        let kick = state.actual.contains_key(uid);
        drop(state);
        if kick {
            self.kick.notify_one();
        }
    }

    /// Waits until every volume of `pod` is set up (upstream `WaitForAttachAndMount`).
    pub async fn wait_for_attach_and_mount(
        &self,
        pod: Arc<Pod>,
        cancel: &CancellationToken,
    ) -> Result<()> {
        let uid = pod_uid(&pod);
        self.add_pod(pod)?;
        let ready = || self.unmounted(&uid).is_empty();
        if self.wait(ready, cancel).await? {
            return Ok(());
        }
        let unmounted = self.unmounted(&uid);
        let failures = self
            .state()
            .failures
            .get(&uid)
            .map(|f| f.values().cloned().collect())
            .unwrap_or_default();
        Err(Error::Timeout {
            unmounted,
            failures,
        })
    }

    /// Tears down the volumes of `uid` and waits until none is set up (upstream
    /// `WaitForUnmount`).
    pub async fn wait_for_unmount(&self, uid: &PodUid, cancel: &CancellationToken) -> Result<()> {
        self.remove_pod(uid);
        let gone = || !self.state().actual.contains_key(uid);
        if self.wait(gone, cancel).await? {
            return Ok(());
        }
        let unmounted: Vec<String> = self
            .state()
            .actual
            .get(uid)
            .map(|v| v.keys().cloned().collect())
            .unwrap_or_default();
        Err(Error::UnmountTimeout { mounted: unmounted })
    }

    /// Checks `done` after every reconcile pass until the back-off runs out; whether it held.
    async fn wait(&self, done: impl Fn() -> bool, cancel: &CancellationToken) -> Result<bool> {
        let mut passes = self.passes.subscribe();
        let deadline = tokio::time::Instant::now() + self.config.wait_budget;
        loop {
            if done() {
                return Ok(true);
            }
            tokio::select! {
                changed = passes.changed() => {
                    if changed.is_err() {
                        return Ok(done());
                    }
                }
                () = tokio::time::sleep_until(deadline) => return Ok(done()),
                () = cancel.cancelled() => return Err(Error::Cancelled),
            }
        }
    }

    /// Desired volumes of `uid` that are not set up yet.
    fn unmounted(&self, uid: &PodUid) -> Vec<String> {
        let state = self.state();
        let actual = state.actual.get(uid);
        state
            .desired
            .get(uid)
            .map(|d| {
                d.volumes
                    .iter()
                    .filter(|v| !actual.is_some_and(|a| a.contains_key(&v.name)))
                    .map(|v| v.name.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The set-up volumes of `uid` by name (upstream `GetMountedVolumesForPod`).
    pub fn mounted_volumes(&self, uid: &PodUid) -> BTreeMap<String, MountedVolume> {
        self.state().actual.get(uid).cloned().unwrap_or_default()
    }

    /// How much each disk emptyDir of `uid` holds, with its `sizeLimit`.
    pub fn empty_dir_usage(&self, uid: &PodUid) -> Vec<EmptyDirUsage> {
        self.mounted_volumes(uid)
            .into_iter()
            .filter(|(_, v)| v.plugin == Plugin::EmptyDir)
            .map(|(volume, v)| EmptyDirUsage {
                volume,
                bytes: empty_dir::disk_usage(&v.path),
                size_limit: v.size_limit,
            })
            .collect()
    }

    /// Removes the directory of a pod nobody wants any more, after unmounting whatever is left
    /// mounted below it (upstream `cleanupOrphanedPodDirs`, which also reconstructs and tears
    /// down volumes left by an earlier run). A pod the manager still tracks is left alone.
    pub fn remove_pod_dir(&self, uid: &PodUid) -> Result<()> {
        {
            let state = self.state();
            if state.desired.contains_key(uid) || state.actual.contains_key(uid) {
                return Ok(());
            }
        }
        crate::hostfs::check_component(std::ffi::OsStr::new(&uid.0))?;
        let dir = self.config.dirs.pod(uid);
        if std::fs::symlink_metadata(&dir).is_err() {
            return Ok(());
        }
        for point in mount::mounts_below(&mount::mounts()?, &dir) {
            mount::unmount(&point)?;
        }
        // Through descriptors below `<rootDir>/pods`: a link is removed as a link, and a mount
        // still there (it could be the node's data) stops the removal by name.
        let pods = Dir::open(&self.config.dirs.pods())?;
        crate::hostfs::remove_all(&pods, std::ffi::OsStr::new(&uid.0))?;
        Ok(())
    }

    /// The volumes of `uid` marked for a remount that has not happened yet.
    #[cfg(test)]
    pub fn remount_pending(&self, uid: &PodUid) -> Vec<String> {
        let mut names: Vec<String> = self
            .state()
            .remount
            .iter()
            .filter(|(pod, _)| pod == uid)
            .map(|(_, name)| name.clone())
            .collect();
        names.sort();
        names
    }

    /// Housekeeping: removes the directories of pods `keep` does not name.
    pub fn cleanup_orphaned_pod_dirs(&self, keep: impl Fn(&PodUid) -> bool) {
        let tracked: HashSet<PodUid> = {
            let state = self.state();
            state
                .desired
                .keys()
                .chain(state.actual.keys())
                .cloned()
                .collect()
        };
        for uid in self.config.dirs.existing_pods() {
            if keep(&uid) || tracked.contains(&uid) {
                continue;
            }
            match self.remove_pod_dir(&uid) {
                Ok(()) => tracing::info!(pod = %uid, "removed an orphaned pod directory"),
                Err(e) => {
                    tracing::warn!(pod = %uid, error = %e, "orphaned pod directory not removed")
                }
            }
        }
    }
}

/// Plugins whose set-up is repeated at every sync (upstream `RequiresRemount`: configMap,
/// secret, projected and downwardAPI; downwardAPI volumes are written every pass here anyway).
fn requires_remount(source: &Source) -> bool {
    matches!(source, Source::Object { .. } | Source::Projected { .. })
}

/// What volume `v` of `pod` reads from the API server, one entry per source; `None` for
/// volumes that read nothing.
fn volume_wants(pod: &Pod, v: &VolumeSpec) -> Option<Vec<Want>> {
    match &v.source {
        Source::Object { kind, name, .. } => {
            let namespace = pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            Some(vec![Want::Object(*kind, namespace, name.clone())])
        }
        Source::Projected { sources, .. } => Some(projected::wanted(pod, sources)),
        _ => None,
    }
}

/// The ConfigMaps and Secrets the volumes of `pod` read (upstream's `getReferencedObjects`,
/// for volumes).
fn referenced_objects(pod: &Pod, volumes: &[VolumeSpec]) -> std::collections::BTreeSet<ObjectRef> {
    volumes
        .iter()
        .filter_map(|v| volume_wants(pod, v))
        .flatten()
        .filter_map(|want| match want {
            Want::Object(kind, namespace, name) => Some(ObjectRef {
                kind,
                namespace,
                name,
            }),
            _ => None,
        })
        .collect()
}
