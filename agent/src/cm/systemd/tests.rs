//! The D-Bus calls against an in-process fake of systemd's manager object on a peer-to-peer
//! connection: what a unit test can check of the driver (the real systemd is the node VM's).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use zbus::{
    Guid,
    connection::Builder,
    zvariant::{OwnedObjectPath, OwnedValue},
};

use std::path::Path;

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

#[derive(Default)]
struct FakeManager {
    calls: Arc<Mutex<Vec<Call>>>,
    units: Arc<Mutex<Vec<String>>>,
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl FakeManager {
    async fn start_transient_unit(
        &self,
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
        let mut units = self.units.lock().expect("units");
        if units.contains(&name) {
            return Err(FakeError::UnitExists(format!(
                "Unit {name} already exists."
            )));
        }
        units.push(name);
        OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/1")
            .map_err(|e| FakeError::ZBus(e.into()))
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

    async fn stop_unit(&self, name: String, _mode: String) -> Result<OwnedObjectPath, FakeError> {
        self.calls
            .lock()
            .expect("calls")
            .push(Call::Stop { unit: name.clone() });
        let mut units = self.units.lock().expect("units");
        if !units.contains(&name) {
            return Err(FakeError::NoSuchUnit(format!("Unit {name} not loaded.")));
        }
        units.retain(|u| *u != name);
        OwnedObjectPath::try_from("/org/freedesktop/systemd1/job/2")
            .map_err(|e| FakeError::ZBus(e.into()))
    }
}

/// A client connection to a fake manager served on the other end of a socketpair.
async fn fake() -> (zbus::Connection, zbus::Connection, Arc<Mutex<Vec<Call>>>) {
    let (client, server) = tokio::net::UnixStream::pair().expect("socketpair");
    let fake = FakeManager::default();
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
    let started: Vec<(&str, String)> = calls
        .iter()
        .filter_map(|c| match c {
            Call::Start { unit, props, .. } => {
                let wants = props
                    .get("Wants")
                    .map(|w| format!("{w:?}"))
                    .unwrap_or_default();
                Some((unit.as_str(), wants))
            }
            _ => None,
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
    assert_eq!(quota_per_sec(1_500), 20_000);
    assert_eq!(quota_per_sec(100_000), 1_000_000);
    assert_eq!(cpu_weight(2), 1);
    assert_eq!(cpu_weight(1024), 39);
    assert_eq!(cpu_weight(262_144), 10_000);
    assert!(matches!(
        unit_and_parent("kubepods.slice/x"),
        Err(SystemdError::NotASlice { .. })
    ));
    assert_eq!(
        unit_and_parent("/kubepods.slice").expect("slice"),
        ("kubepods.slice", "-.slice")
    );
}
