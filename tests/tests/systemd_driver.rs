//! The systemd cgroup driver against a real systemd: `swiftlet::cm::systemd::SystemdSlices` on
//! the system bus of systemd running as PID 1 of namespaces of its own
//! (`swiftlet_tests::systemd::SystemdNamespace`). It checks what the kubelet relies on from
//! systemd (upstream `cgroupManagerImpl` with the systemd driver, over runc's
//! `libcontainer/cgroups/systemd`): the QoS and pod slices become nested cgroup directories
//! (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`), their CPU,
//! memory and pids limits land in the cgroup files, `SetUnitProperties` on an existing slice
//! changes them, and `StopUnit` removes the directories.
#![expect(clippy::expect_used, reason = "a failed step fails the test")]
#![expect(
    clippy::print_stderr,
    reason = "the test reports systemd's start-up time"
)]

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use swiftlet::cm::systemd::{SliceResources, SystemdSlices};
use swiftlet_tests::{EVENT_WAIT, privileged, systemd::SystemdNamespace};

const MIB: i64 = 1024 * 1024;

/// Runs `body` on a runtime of the test's own thread (systemd's parent-death signal is tied to
/// the thread that starts it), unless the test may skip.
fn privileged_async<F: std::future::Future<Output = ()>>(
    test: &'static str,
    body: impl FnOnce(&'static str) -> F,
) {
    if !privileged(test) {
        return;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(body(test));
}

#[test]
fn pod_slices_are_made_limited_and_stopped_by_a_real_systemd() {
    privileged_async(
        "pod_slices_are_made_limited_and_stopped_by_a_real_systemd",
        slices,
    );
}

async fn slices(test: &str) {
    let systemd = SystemdNamespace::start("driver")
        .await
        .unwrap_or_else(|e| panic!("{test}: start systemd: {e}"));
    eprintln!(
        "{test}: systemd {} answered {:?} after the start",
        systemd.pid(),
        systemd.startup()
    );
    let connection = systemd.connect().await.expect("connect to systemd");
    let slices = SystemdSlices::on(&connection, systemd.unified())
        .await
        .expect("the manager's proxy");
    let limits = Limits::of(&systemd);

    let uid = format!("{:08x}_{:04x}", fastrand::u32(..), fastrand::u16(..));
    let kubepods = "kubepods.slice";
    let burstable = "kubepods.slice/kubepods-burstable.slice";
    let pod = format!("{burstable}/kubepods-burstable-pod{uid}.slice");

    slices
        .ensure_slice(
            kubepods,
            &SliceResources {
                cpu_shares: Some(2048),
                memory_bytes: Some(512 * MIB),
                pids_max: Some(1000),
                ..SliceResources::default()
            },
        )
        .await
        .expect("make kubepods.slice");
    slices
        .ensure_slice(
            burstable,
            &SliceResources {
                cpu_shares: Some(1024),
                ..SliceResources::default()
            },
        )
        .await
        .expect("make kubepods-burstable.slice");
    let first = SliceResources {
        cpu_shares: Some(512),
        cpu_quota_us: Some(50_000),
        memory_bytes: Some(256 * MIB),
        pids_max: Some(100),
        ..SliceResources::default()
    };
    slices
        .ensure_slice(&pod, &first)
        .await
        .expect("make the pod's slice");

    // The slices nest as their names say, in the hierarchy systemd tracks units in.
    let tracking = systemd.cgroup_root("systemd").expect("systemd's hierarchy");
    for dir in [kubepods, burstable, pod.as_str()] {
        until(&format!("{dir} in {}", tracking.display()), || {
            tracking.join(dir).is_dir()
        })
        .await;
    }
    let unit = format!("kubepods-burstable-pod{uid}.slice");
    let state = systemd
        .command("systemctl")
        .args(["is-active", &unit])
        .output()
        .expect("run systemctl in the namespace");
    assert_eq!(
        String::from_utf8_lossy(&state.stdout).trim(),
        "active",
        "{unit} as systemd has it; its log: {}",
        systemd.log()
    );
    limits.expect(kubepods, 2048, None, 512 * MIB, 1000).await;
    limits.expect(&pod, 512, Some(50_000), 256 * MIB, 100).await;

    // The same slice again: UnitExists, so its properties are set instead.
    let second = SliceResources {
        cpu_shares: Some(256),
        cpu_quota_us: Some(20_000),
        memory_bytes: Some(128 * MIB),
        pids_max: Some(50),
        ..SliceResources::default()
    };
    slices
        .ensure_slice(&pod, &second)
        .await
        .expect("set the pod slice's properties");
    limits.expect(&pod, 256, Some(20_000), 128 * MIB, 50).await;
    let shown = systemd
        .command("systemctl")
        .args(["show", "--property=LoadState,UnitFileState", &unit])
        .output()
        .expect("run systemctl in the namespace");
    // As on a node: a transient unit whose file systemd's lookup finds. (systemd 252 also
    // reports NeedDaemonReload=yes once SetUnitProperties has added its runtime drop-ins; the
    // limits are in force all the same, as checked above.)
    assert_eq!(
        String::from_utf8_lossy(&shown.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["LoadState=loaded", "UnitFileState=transient"],
        "{unit} as systemd has it after SetUnitProperties"
    );

    // Stopping removes the directories in every hierarchy, and a stopped or unknown slice
    // stops without an error.
    slices.stop_slice(&pod).await.expect("stop the pod's slice");
    for root in limits.roots().chain([tracking]) {
        until(&format!("{pod} gone from {}", root.display()), || {
            !root.join(&pod).exists()
        })
        .await;
    }
    assert!(
        tracking.join(burstable).is_dir(),
        "stopping the pod's slice left its parent"
    );
    slices
        .stop_slice(&pod)
        .await
        .expect("stop the stopped pod slice again");
    slices
        .stop_slice("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podnone.slice")
        .await
        .expect("stop a slice systemd never had");
    slices
        .stop_slice(kubepods)
        .await
        .expect("stop kubepods.slice");
    until("kubepods.slice and its children gone", || {
        !tracking.join(kubepods).exists()
    })
    .await;

    // Halting it leaves nothing on the host: no process of the namespace, no cgroup.
    let pid = systemd.pid();
    let roots: Vec<PathBuf> = limits
        .roots()
        .chain([tracking])
        .map(Path::to_path_buf)
        .collect();
    drop(slices);
    drop(connection);
    drop(systemd);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "systemd {pid} outlived its namespace"
    );
    for root in roots {
        assert!(!root.exists(), "{} outlived the namespace", root.display());
    }
}

/// Where a slice's limits are on the host, in the layout systemd sees.
struct Limits {
    cpu: PathBuf,
    memory: PathBuf,
    pids: PathBuf,
    unified: bool,
}

impl Limits {
    fn of(systemd: &SystemdNamespace) -> Limits {
        let root = |controller| {
            systemd
                .cgroup_root(controller)
                .unwrap_or_else(|| panic!("no {controller} hierarchy"))
                .to_owned()
        };
        Limits {
            cpu: root("cpu"),
            memory: root("memory"),
            pids: root("pids"),
            unified: systemd.unified(),
        }
    }

    fn roots(&self) -> impl Iterator<Item = &Path> {
        [&self.cpu, &self.memory, &self.pids]
            .into_iter()
            .map(PathBuf::as_path)
    }

    /// Waits until the slice's cgroup files hold these limits: runc's property mapping
    /// (`CPUShares` or `CPUWeight`, `CPUQuotaPerSecUSec` over systemd's 100ms period,
    /// `MemoryLimit` or `MemoryMax`, `TasksMax`) as systemd writes it.
    async fn expect(&self, dir: &str, shares: u64, quota_us: Option<u64>, memory: i64, pids: u64) {
        let mut want = Vec::new();
        if self.unified {
            // runc's ConvertCPUSharesToCgroupV2Value.
            let weight = 1 + (shares - 2) * 9999 / 262_142;
            want.push((self.cpu.join(dir).join("cpu.weight"), weight.to_string()));
            let max = quota_us.map_or("max".to_owned(), |q| q.to_string());
            want.push((self.cpu.join(dir).join("cpu.max"), format!("{max} 100000")));
            want.push((self.memory.join(dir).join("memory.max"), memory.to_string()));
        } else {
            want.push((self.cpu.join(dir).join("cpu.shares"), shares.to_string()));
            if let Some(quota) = quota_us {
                want.push((
                    self.cpu.join(dir).join("cpu.cfs_period_us"),
                    "100000".into(),
                ));
                want.push((
                    self.cpu.join(dir).join("cpu.cfs_quota_us"),
                    quota.to_string(),
                ));
            }
            want.push((
                self.memory.join(dir).join("memory.limit_in_bytes"),
                memory.to_string(),
            ));
        }
        want.push((self.pids.join(dir).join("pids.max"), pids.to_string()));
        for (file, value) in want {
            until(&format!("{} = {value}", file.display()), || {
                fs::read_to_string(&file).is_ok_and(|v| v.trim() == value)
            })
            .await;
        }
    }
}

/// Waits (bounded by [`EVENT_WAIT`]) until `want` holds, letting the connection's task run.
async fn until(what: &str, want: impl Fn() -> bool) {
    let deadline = Instant::now() + EVENT_WAIT;
    while !want() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The pods' cgroups with `cgroupDriver: systemd`, as the agent makes them
/// (`swiftlet::cm::pod_cgroups::PodCgroups` with systemd's slices): the QoS slices at start,
/// then a pod's slice with the limits of its spec, present with them as soon as `ensure_pod`
/// returns (it waits for systemd's job, as runc does, so the runtime's scopes can go below at
/// once), and gone from every hierarchy as soon as `remove_pod` returns.
#[test]
fn the_agents_pod_cgroups_are_slices_of_a_real_systemd() {
    privileged_async(
        "the_agents_pod_cgroups_are_slices_of_a_real_systemd",
        pod_cgroups,
    );
}

async fn pod_cgroups(test: &str) {
    use k8s_openapi::{
        api::core::v1::{Container, Pod, PodSpec, ResourceRequirements},
        apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::ObjectMeta},
    };
    use swiftlet::{
        cgroup::{PodCgroupLayout, pods::CgroupDriver},
        cm::{
            CgroupLayout,
            pod_cgroups::{PodCgroupConfig, PodCgroups},
        },
        container::PodUid,
    };

    let systemd = SystemdNamespace::start("pods")
        .await
        .unwrap_or_else(|e| panic!("{test}: start systemd: {e}"));
    let connection = systemd.connect().await.expect("connect to systemd");
    let slices = SystemdSlices::on(&connection, systemd.unified())
        .await
        .expect("the manager's proxy");
    let limits = Limits::of(&systemd);
    let tracking = systemd
        .cgroup_root("systemd")
        .expect("systemd's hierarchy")
        .to_owned();
    // Only the directories systemd does not manage are removed by hand; none are here, so the
    // layout's mounts may be anywhere.
    let elsewhere = std::env::temp_dir().join(format!("{test}-{}", std::process::id()));
    let cgroups = PodCgroups::with_systemd(
        PodCgroupConfig {
            pods: PodCgroupLayout::for_driver(CgroupDriver::Systemd, Path::new("/"), true),
            pod_pids_limit: 64,
            allocatable_memory: Some(1024 * MIB),
            ..PodCgroupConfig::default()
        },
        CgroupLayout::Unified {
            root: elsewhere.clone(),
        },
        slices,
    );
    cgroups
        .ensure_qos_hierarchy()
        .await
        .expect("the QoS slices");
    for dir in [
        "kubepods.slice",
        "kubepods.slice/kubepods-burstable.slice",
        "kubepods.slice/kubepods-besteffort.slice",
    ] {
        assert!(tracking.join(dir).is_dir(), "{dir} once the start returned");
    }

    let uid = format!("{:08x}-{:04x}", fastrand::u32(..), fastrand::u16(..));
    let quantities = |cpu: &str, memory: &str| {
        Some(
            [("cpu", cpu), ("memory", memory)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
                .collect(),
        )
    };
    let pod = Pod {
        metadata: ObjectMeta {
            uid: Some(uid.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    requests: quantities("250m", "64Mi"),
                    limits: quantities("500m", "96Mi"),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    };
    cgroups.ensure_pod(&pod).await.expect("the pod's slice");
    let parent = cgroups.cgroup_parent(&pod).expect("cgroup_parent");
    let dir = format!("kubepods.slice/kubepods-burstable.slice/{parent}");
    assert_eq!(
        parent,
        format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_"))
    );
    assert!(
        tracking.join(&dir).is_dir(),
        "{dir} once ensure_pod returned"
    );
    // 250m requested: 256 shares; a 500m limit: 50ms of every 100ms.
    limits.expect(&dir, 256, Some(50_000), 96 * MIB, 64).await;
    assert_eq!(
        cgroups.existing_pods(),
        Vec::<PodUid>::new(),
        "none in the layout's own mounts"
    );

    cgroups
        .remove_pod(&PodUid::from(uid.as_str()))
        .await
        .expect("remove the pod");
    for root in limits.roots().chain([tracking.as_path()]) {
        assert!(
            !root.join(&dir).exists(),
            "{dir} still in {} once remove_pod returned",
            root.display()
        );
    }
    assert!(
        tracking
            .join("kubepods.slice/kubepods-burstable.slice")
            .is_dir()
    );
}
