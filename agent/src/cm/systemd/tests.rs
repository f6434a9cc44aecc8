//! The D-Bus calls against an in-process fake of systemd's manager object on a peer-to-peer
//! connection: what a unit test can check of the driver (the real systemd is the node VM's).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use zbus::{
    Guid,
    connection::Builder,
    object_server::SignalEmitter,
    zvariant::{ObjectPath, OwnedObjectPath, OwnedValue},
};

use std::path::Path;

use std::time::Duration;

use super::*;
use crate::cgroup::{
    PodCgroupLayout,
    pods::{CgroupDriver, validate_slice_root},
};
use crate::pod::qos::QosClass;

type Props = BTreeMap<String, OwnedValue>;

#[derive(Debug, PartialEq)]
enum Call {
    Start {
        unit: String,
        mode: String,
        props: Props,
    },
    Set {
        unit: String,
        props: Props,
    },
    Stop {
        unit: String,
    },
}

#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.freedesktop.systemd1")]
enum FakeError {
    #[zbus(error)]
    ZBus(zbus::Error),
    UnitExists(String),
    NoSuchUnit(String),
}

/// How the fake ends the jobs it queues.
#[derive(Clone, Debug, Default)]
enum Jobs {
    /// `JobRemoved` with `done` for every job.
    #[default]
    Done,
    /// `JobRemoved` with this result for every job.
    Ending(&'static str),
    /// No `JobRemoved` at all (a job systemd never finishes).
    Never,
}

#[derive(Default)]
struct FakeManager {
    calls: Arc<Mutex<Vec<Call>>>,
    units: Arc<Mutex<Vec<String>>>,
    jobs: Jobs,
    next_job: std::sync::atomic::AtomicU32,
}

impl FakeManager {
    /// A new job's path, its `JobRemoved` sent (before the reply, which a client must handle
    /// as well as after it) as the fake is told to.
    async fn queue_job(
        &self,
        emitter: &SignalEmitter<'_>,
        unit: &str,
    ) -> Result<OwnedObjectPath, FakeError> {
        let id = self
            .next_job
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let job = OwnedObjectPath::try_from(format!("/org/freedesktop/systemd1/job/{id}"))
            .map_err(|e| FakeError::ZBus(e.into()))?;
        let result = match &self.jobs {
            Jobs::Done => "done",
            Jobs::Ending(result) => result,
            Jobs::Never => return Ok(job),
        };
        // Another client's job ends first: the waiter must look at the path.
        FakeManager::job_removed(
            emitter,
            id + 1000,
            "/org/freedesktop/systemd1/job/9999"
                .try_into()
                .map_err(|e: zbus::zvariant::Error| FakeError::ZBus(e.into()))?,
            "other.service",
            "failed",
        )
        .await?;
        FakeManager::job_removed(emitter, id, job.as_ref(), unit, result).await?;
        Ok(job)
    }
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl FakeManager {
    #[zbus(signal)]
    async fn job_removed(
        emitter: &SignalEmitter<'_>,
        id: u32,
        job: ObjectPath<'_>,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;

    async fn start_transient_unit(
        &self,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        name: String,
        mode: String,
        properties: Vec<(String, OwnedValue)>,
        _aux: Vec<(String, Vec<(String, OwnedValue)>)>,
    ) -> Result<OwnedObjectPath, FakeError> {
        let props = properties.into_iter().collect();
        self.calls.lock().expect("calls").push(Call::Start {
            unit: name.clone(),
            mode,
            props,
        });
        let exists = {
            let mut units = self.units.lock().expect("units");
            let exists = units.contains(&name);
            if !exists {
                units.push(name.clone());
            }
            exists
        };
        if exists {
            return Err(FakeError::UnitExists(format!(
                "Unit {name} already exists."
            )));
        }
        self.queue_job(&emitter, &name).await
    }

    async fn set_unit_properties(
        &self,
        name: String,
        _runtime: bool,
        properties: Vec<(String, OwnedValue)>,
    ) -> Result<(), FakeError> {
        self.calls.lock().expect("calls").push(Call::Set {
            unit: name,
            props: properties.into_iter().collect(),
        });
        Ok(())
    }

    async fn stop_unit(
        &self,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        name: String,
        _mode: String,
    ) -> Result<OwnedObjectPath, FakeError> {
        self.calls
            .lock()
            .expect("calls")
            .push(Call::Stop { unit: name.clone() });
        let loaded = {
            let mut units = self.units.lock().expect("units");
            let loaded = units.contains(&name);
            units.retain(|u| *u != name);
            loaded
        };
        if !loaded {
            return Err(FakeError::NoSuchUnit(format!("Unit {name} not loaded.")));
        }
        self.queue_job(&emitter, &name).await
    }
}

/// A client connection to a fake manager served on the other end of a socketpair.
async fn fake() -> (zbus::Connection, zbus::Connection, Arc<Mutex<Vec<Call>>>) {
    fake_with(Jobs::Done).await
}

async fn fake_with(jobs: Jobs) -> (zbus::Connection, zbus::Connection, Arc<Mutex<Vec<Call>>>) {
    let (client, server) = tokio::net::UnixStream::pair().expect("socketpair");
    let fake = FakeManager {
        jobs,
        ..FakeManager::default()
    };
    let calls = fake.calls.clone();
    let guid = Guid::generate();
    let server = Builder::unix_stream(server)
        .server(guid)
        .expect("guid")
        .p2p()
        .serve_at("/org/freedesktop/systemd1", fake)
        .expect("serve")
        .build();
    let client = Builder::unix_stream(client).p2p().build();
    let (server, client) = tokio::join!(server, client);
    (client.expect("client"), server.expect("server"), calls)
}

/// The units started, in order, with their properties.
fn started(calls: &[Call]) -> Vec<(&str, &Props)> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Start { unit, props, .. } => Some((unit.as_str(), props)),
            _ => None,
        })
        .collect()
}

fn value<T: Into<zbus::zvariant::Value<'static>>>(v: T) -> OwnedValue {
    OwnedValue::try_from(v.into()).expect("owned value")
}

#[tokio::test]
async fn pod_slices_start_as_transient_units_nested_by_wants() {
    let (client, _server, calls) = fake().await;
    let slices = SystemdSlices::on(&client, false).await.expect("proxy");
    let layout = PodCgroupLayout::for_driver(CgroupDriver::Systemd, Path::new("/"), true);
    for dir in layout.qos_dirs() {
        slices
            .ensure_slice(&dir, &SliceResources::default())
            .await
            .expect("qos slice");
    }
    let uid = "0a1b-2c";
    let pod = layout.pod_dir(QosClass::Burstable, uid);
    let limits = SliceResources {
        cpu_shares: Some(512),
        cpu_quota_us: Some(25_000),
        memory_bytes: Some(128 << 20),
        pids_max: Some(100),
        ..SliceResources::default()
    };
    slices.ensure_slice(&pod, &limits).await.expect("pod slice");
    // Again: the unit exists, so its limits are set on it instead.
    slices
        .ensure_slice(&pod, &limits)
        .await
        .expect("pod slice again");
    slices.stop_slice(&pod).await.expect("stop");
    slices
        .stop_slice(&pod)
        .await
        .expect("stopping a gone unit is no error");

    let calls = calls.lock().expect("calls");
    let started: Vec<(&str, String)> = started(&calls)
        .into_iter()
        .map(|(unit, props)| {
            let wants = props
                .get("Wants")
                .map(|w| format!("{w:?}"))
                .unwrap_or_default();
            (unit, wants)
        })
        .collect();
    let units: Vec<&str> = started.iter().map(|(u, _)| *u).collect();
    assert_eq!(
        units,
        [
            "kubepods.slice",
            "kubepods-burstable.slice",
            "kubepods-besteffort.slice",
            "kubepods-burstable-pod0a1b_2c.slice",
            "kubepods-burstable-pod0a1b_2c.slice",
        ]
    );
    // Each slice wants its parent: the root slice for kubepods, then the level above.
    for ((_, wants), parent) in started.iter().zip([
        "-.slice",
        "kubepods.slice",
        "kubepods.slice",
        "kubepods-burstable.slice",
    ]) {
        assert!(
            wants.contains(&format!("\"{parent}\"")),
            "{wants} wants {parent}"
        );
    }
    let Call::Start { mode, props, .. } = &calls[3] else {
        panic!("fourth call is {:?}", calls[3]);
    };
    assert_eq!(mode, "replace");
    let want: Props = [
        (
            "Description",
            value("libcontainer container kubepods-burstable-pod0a1b_2c.slice"),
        ),
        ("Wants", value(vec!["kubepods-burstable.slice".to_owned()])),
        ("MemoryAccounting", value(true)),
        ("CPUAccounting", value(true)),
        ("BlockIOAccounting", value(true)),
        ("TasksAccounting", value(true)),
        ("DefaultDependencies", value(false)),
        ("CPUShares", value(512u64)),
        ("CPUQuotaPerSecUSec", value(250_000u64)),
        ("MemoryLimit", value(128u64 << 20)),
        ("TasksMax", value(100u64)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(props, &want);
    assert!(!props.contains_key("Slice") && !props.contains_key("Delegate"));
    let Call::Set { unit, props } = &calls[5] else {
        panic!("sixth call is {:?}", calls[5]);
    };
    assert_eq!(unit, "kubepods-burstable-pod0a1b_2c.slice");
    assert_eq!(props.len(), 4, "{props:?}");
    assert_eq!(props.get("CPUShares"), Some(&value(512u64)));
    assert_eq!(
        calls[6..],
        [
            Call::Stop {
                unit: "kubepods-burstable-pod0a1b_2c.slice".into()
            },
            Call::Stop {
                unit: "kubepods-burstable-pod0a1b_2c.slice".into()
            },
        ]
    );
}

#[tokio::test]
async fn unified_hierarchy_slices_get_cgroup_v2_properties() {
    let (client, _server, calls) = fake().await;
    let slices = SystemdSlices::on(&client, true).await.expect("proxy");
    assert_eq!(validate_slice_root(Path::new("/kube.slice")), Ok(()));
    let layout = PodCgroupLayout::for_driver(CgroupDriver::Systemd, Path::new("/kube.slice"), true);
    let dir = layout.qos_dir(QosClass::BestEffort);
    assert_eq!(
        dir,
        "kube.slice/kube-kubepods.slice/kube-kubepods-besteffort.slice"
    );
    let resources = SliceResources {
        cpu_shares: Some(2),
        memory_bytes: Some(1 << 30),
        cpu_quota_us: Some(-1),
        ..SliceResources::default()
    };
    slices.ensure_slice(&dir, &resources).await.expect("slice");
    let calls = calls.lock().expect("calls");
    let [Call::Start { unit, props, .. }] = &calls[..] else {
        panic!("calls: {calls:?}");
    };
    assert_eq!(unit, "kube-kubepods-besteffort.slice");
    assert_eq!(
        props.get("Wants"),
        Some(&value(vec!["kube-kubepods.slice".to_owned()]))
    );
    assert_eq!(props.get("CPUWeight"), Some(&value(1u64)));
    assert_eq!(props.get("MemoryMax"), Some(&value(1u64 << 30)));
    assert_eq!(props.get("CPUQuotaPerSecUSec"), Some(&value(u64::MAX)));
    assert_eq!(props.get("IOAccounting"), Some(&value(true)));
    assert!(!props.contains_key("CPUShares") && !props.contains_key("MemoryLimit"));
}

#[tokio::test]
async fn the_manager_answering_a_ping_passes_the_bus_check() {
    let (client, _server, _) = fake().await;
    assert!(super::preflight::ping(&client).await.is_ok());
}

#[test]
fn quota_and_weight_follow_runc() {
    // addCpuQuota: 1.5ms per 100ms is 15ms per second, rounded up to 20ms.
    assert_eq!(quota_per_sec(1_500, 100_000), 20_000);
    assert_eq!(quota_per_sec(100_000, 100_000), 1_000_000);
    // cpuCFSQuotaPeriod 50ms: 25ms of every 50ms is half a CPU.
    assert_eq!(quota_per_sec(25_000, 50_000), 500_000);
    assert_eq!(quota_per_sec(-1, 50_000), u64::MAX);
    assert!(matches!(
        unit_and_parent("kubepods.slice/x"),
        Err(SystemdError::NotASlice { .. })
    ));
    assert_eq!(
        unit_and_parent("/kubepods.slice").expect("slice"),
        ("kubepods.slice", "-.slice")
    );
}

#[tokio::test]
async fn a_start_job_that_fails_or_never_ends_is_an_error_a_stop_job_is_not() {
    let (client, _server, _) = fake_with(Jobs::Ending("dependency")).await;
    let slices = SystemdSlices::on(&client, true).await.expect("proxy");
    let err = slices
        .ensure_slice("kubepods.slice", &SliceResources::default())
        .await
        .expect_err("the job failed");
    assert!(
        matches!(&err, SystemdError::JobFailed { result, .. } if result == "dependency"),
        "{err}"
    );
    assert!(
        slices.stop_slice("kubepods.slice").await.is_ok(),
        "a failed stop job is logged: the caller clears what is left"
    );

    let (client, _server, calls) = fake_with(Jobs::Never).await;
    let slices = SystemdSlices::on(&client, true)
        .await
        .expect("proxy")
        .with_job_timeout(Duration::from_millis(50));
    let err = slices
        .ensure_slice("kubepods.slice", &SliceResources::default())
        .await
        .expect_err("the job never ended");
    assert!(matches!(err, SystemdError::JobTimeout { .. }), "{err}");
    assert!(slices.stop_slice("kubepods.slice").await.is_ok());
    assert_eq!(calls.lock().expect("calls").len(), 2);
}

/// A pod whose one container requests and limits `cpu` and `memory` differently (burstable).
fn burstable_pod(uid: &str) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::{
        api::core::v1::{Container, Pod, PodSpec, ResourceRequirements},
        apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
    };
    let quantities = |cpu: &str, memory: &str| {
        Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
        ]))
    };
    Pod {
        metadata: ObjectMeta {
            uid: Some(uid.to_owned()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    requests: quantities("250m", "64Mi"),
                    limits: quantities("500m", "128Mi"),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

#[tokio::test]
async fn with_the_systemd_driver_pod_cgroups_are_slices_and_only_leftovers_are_removed_by_hand() {
    use crate::{
        cm::{
            CgroupLayout,
            pod_cgroups::{PodCgroupConfig, PodCgroups},
        },
        container::PodUid,
    };
    let (client, _server, calls) = fake().await;
    let slices = SystemdSlices::on(&client, true).await.expect("proxy");
    let root = tempfile::tempdir().expect("tempdir");
    let cgroups = PodCgroups::with_systemd(
        PodCgroupConfig {
            pods: PodCgroupLayout::for_driver(CgroupDriver::Systemd, Path::new("/"), true),
            pod_pids_limit: 1024,
            allocatable_memory: Some(8 << 30),
            ..PodCgroupConfig::default()
        },
        CgroupLayout::Unified {
            root: root.path().to_owned(),
        },
        slices,
    );
    cgroups.ensure_qos_hierarchy().await.expect("qos slices");
    let pod = burstable_pod("9f-1");
    cgroups.ensure_pod(&pod).await.expect("pod slice");
    assert_eq!(
        cgroups.cgroup_parent(&pod).expect("parent"),
        "kubepods-burstable-pod9f_1.slice"
    );
    // systemd made the directories; runc's scope below the pod is one it would leave behind
    // in a hierarchy it does not manage.
    let pod_dir = root
        .path()
        .join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9f_1.slice");
    std::fs::create_dir_all(pod_dir.join("cri-containerd-abc.scope")).expect("mkdir");
    assert_eq!(cgroups.existing_pods(), [PodUid::from("9f-1")]);
    cgroups
        .remove_pod(&PodUid::from("9f-1"))
        .await
        .expect("remove");
    assert!(!pod_dir.exists(), "leftovers removed after the stop");
    assert!(root.path().join("kubepods.slice").exists());

    let calls = calls.lock().expect("calls");
    let started = started(&calls);
    let units: Vec<&str> = started.iter().map(|(u, _)| *u).collect();
    // The burstable level weighs the pod's request before its slice is made, and drops it
    // with the pod (upstream `UpdateQOSCgroups` before `EnsureExists`).
    assert_eq!(
        units,
        [
            "kubepods.slice",
            "kubepods-burstable.slice",
            "kubepods-besteffort.slice",
            "kubepods-burstable.slice",
            "kubepods-burstable-pod9f_1.slice",
            "kubepods-burstable.slice"
        ]
    );
    assert_eq!(started[0].1.get("MemoryMax"), Some(&value(8u64 << 30)));
    assert_eq!(started[2].1.get("CPUWeight"), Some(&value(1u64)));
    assert!(!started[1].1.contains_key("CPUWeight") && !started[1].1.contains_key("MemoryMax"));
    assert_eq!(started[3].1.get("CPUWeight"), Some(&value(10u64)));
    assert_eq!(started[5].1.get("CPUWeight"), Some(&value(1u64)));
    let pod_props = started[4].1;
    // 250m requested: shares 256, weight 10; 500m limit: 50ms per 100ms.
    assert_eq!(pod_props.get("CPUWeight"), Some(&value(10u64)));
    assert_eq!(
        pod_props.get("CPUQuotaPerSecUSec"),
        Some(&value(500_000u64))
    );
    assert_eq!(
        pod_props.get("CPUQuotaPeriodUSec"),
        Some(&value(100_000u64))
    );
    assert_eq!(pod_props.get("MemoryMax"), Some(&value(128u64 << 20)));
    assert_eq!(pod_props.get("TasksMax"), Some(&value(1024u64)));
    // The pod's slice is stopped under every QoS level it may have been made in.
    let stopped: Vec<&str> = calls
        .iter()
        .filter_map(|c| match c {
            Call::Stop { unit } => Some(unit.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        stopped,
        [
            "kubepods-pod9f_1.slice",
            "kubepods-burstable-pod9f_1.slice",
            "kubepods-besteffort-pod9f_1.slice"
        ]
    );
}
