//! The container runtime the system tests and `cargo xtask run` use, proven against the real
//! thing (the private containerd `cargo xtask test` starts, at SWIFTLET_TEST_RUNTIME_ENDPOINT):
//! it answers CRI v1, holds the local images, runs a busybox container to its exit code with its
//! output logged, removes a pod without leaving mounts, and gives a pod on the CNI bridge an
//! address. When one of these fails, the environment is broken, not swiftlet.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use k8s_cri::v1::{
    ContainerConfig, ContainerFilter, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, ImageStatusRequest, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, ListContainersRequest, ListPodSandboxRequest, NamespaceMode,
    NamespaceOption, PodSandboxConfig, PodSandboxFilter, PodSandboxMetadata,
    PodSandboxStatusRequest, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopPodSandboxRequest, VersionRequest, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use swiftlet_tests::{EVENT_WAIT, node::BUSYBOX, runtime_endpoint};
use tonic::transport::Channel;

const PAUSE: &str = "localhost/swiftlet/pause:latest";

/// The label that marks this test run's pods and containers, so that the checks for leftovers
/// look at nothing else.
const RUN_LABEL: &str = "swiftlet-tests/runtime";

struct Cri {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

/// Connects to `endpoint` (`unix://PATH`) and waits until the CRI plugin answers `Version`: a
/// containerd that has just started serves gRPC a moment before its CRI plugin is initialised.
async fn connect(endpoint: &str) -> Cri {
    let socket = PathBuf::from(
        endpoint
            .strip_prefix("unix://")
            .unwrap_or_else(|| panic!("{endpoint} is not a unix:// endpoint")),
    );
    let channel = swiftlet_tests::unix_channel(socket)
        .await
        .unwrap_or_else(|e| panic!("connect to {endpoint}: {e}"));
    let mut runtime = RuntimeServiceClient::new(channel.clone());
    let deadline = Instant::now() + EVENT_WAIT;
    loop {
        match runtime.version(VersionRequest::default()).await {
            Ok(_) => break,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(status) => panic!("CRI at {endpoint} did not answer Version: {status}"),
        }
    }
    Cri {
        runtime,
        images: ImageServiceClient::new(channel),
    }
}

/// A name no other test, run or leftover uses.
fn unique(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{what}-{}-{nanos}", std::process::id())
}

/// A pod sandbox that is stopped and removed when dropped, also when the test fails midway.
struct Sandbox {
    endpoint: String,
    id: String,
    config: PodSandboxConfig,
    removed: bool,
}

impl Sandbox {
    async fn run(cri: &mut Cri, endpoint: &str, name: &str, network: NamespaceMode) -> Sandbox {
        let uid = unique(name);
        let config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.clone(),
                namespace: "swiftlet-tests".to_owned(),
                attempt: 0,
            }),
            // With the host's network the sandbox keeps the host's name: it must stay empty.
            hostname: if network == NamespaceMode::Node {
                String::new()
            } else {
                name.to_owned()
            },
            log_directory: log_directory(&uid).display().to_string(),
            labels: HashMap::from([(RUN_LABEL.to_owned(), uid)]),
            linux: Some(LinuxPodSandboxConfig {
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(NamespaceOption {
                        network: network as i32,
                        pid: NamespaceMode::Container as i32,
                        ipc: NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        // The kubelet creates the pod's log folder; the runtime only writes files into it.
        std::fs::create_dir_all(&config.log_directory).expect("create the pod log folder");
        let id = cri
            .runtime
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}"))
            .into_inner()
            .pod_sandbox_id;
        Sandbox {
            endpoint: endpoint.to_owned(),
            id,
            config,
            removed: false,
        }
    }

    fn label(&self) -> HashMap<String, String> {
        self.config.labels.clone()
    }

    async fn remove(mut self, cri: &mut Cri) {
        remove_sandbox(cri, &self.id).await;
        self.removed = true;
        let _ = std::fs::remove_dir_all(&self.config.log_directory);
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.config.log_directory);
        // Dropped while the test's runtime unwinds: another thread with its own runtime and
        // connection does the cleanup, since the test's runtime cannot run anything now.
        let (endpoint, id) = (self.endpoint.clone(), self.id.clone());
        let cleanup = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the cleanup")
                .block_on(async {
                    let mut cri = connect(&endpoint).await;
                    remove_sandbox(&mut cri, &id).await;
                });
        });
        let _ = cleanup.join();
    }
}

async fn remove_sandbox(cri: &mut Cri, id: &str) {
    cri.runtime
        .stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        })
        .await
        .unwrap_or_else(|e| panic!("StopPodSandbox {id}: {e}"));
    cri.runtime
        .remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        })
        .await
        .unwrap_or_else(|e| panic!("RemovePodSandbox {id}: {e}"));
}

fn log_directory(uid: &str) -> PathBuf {
    std::env::temp_dir().join(format!("swiftlet-test-pods/{uid}"))
}

/// Mount points that name `id` under the runtime's state folder (rootfs, shm, netns), when
/// `cargo xtask test` said where that is.
fn mounts_of(id: &str) -> Vec<String> {
    let Some(state) = std::env::var_os("SWIFTLET_TEST_CONTAINERD_STATE") else {
        return Vec::new();
    };
    let state = Path::new(&state).display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("read mountinfo")
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&state) && point.contains(id))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn runtime_answers_cri_v1_with_the_local_images() {
    let Some(endpoint) = runtime_endpoint("runtime_answers_cri_v1_with_the_local_images") else {
        return;
    };
    let mut cri = connect(&endpoint).await;
    let version = cri
        .runtime
        .version(VersionRequest::default())
        .await
        .expect("Version")
        .into_inner();
    assert_eq!(version.runtime_api_version, "v1", "{version:?}");
    assert_eq!(version.runtime_name, "containerd", "{version:?}");
    for name in [BUSYBOX, PAUSE] {
        let status = cri
            .images
            .image_status(ImageStatusRequest {
                image: Some(ImageSpec {
                    image: name.to_owned(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .unwrap_or_else(|e| panic!("ImageStatus {name}: {e}"))
            .into_inner();
        let image = status
            .image
            .unwrap_or_else(|| panic!("{name} is not in the runtime: `cargo xtask` imports it"));
        assert!(
            image.repo_tags.iter().any(|t| t == name),
            "{name}: {image:?}"
        );
    }
}

#[tokio::test]
async fn a_container_runs_to_its_exit_code_and_its_pod_goes_away() {
    let Some(endpoint) =
        runtime_endpoint("a_container_runs_to_its_exit_code_and_its_pod_goes_away")
    else {
        return;
    };
    let mut cri = connect(&endpoint).await;
    let sandbox = Sandbox::run(&mut cri, &endpoint, "exit-code", NamespaceMode::Node).await;
    let container = ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "exit3".to_owned(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: BUSYBOX.to_owned(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), "echo hi; exit 3".into()],
        labels: sandbox.label(),
        log_path: "exit3.log".to_owned(),
        ..Default::default()
    };
    let id = cri
        .runtime
        .create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox.id.clone(),
            config: Some(container),
            sandbox_config: Some(sandbox.config.clone()),
        })
        .await
        .expect("CreateContainer")
        .into_inner()
        .container_id;
    cri.runtime
        .start_container(StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect("StartContainer");

    // Bounded so that a container that never exits fails the test; not a timing assertion.
    let deadline = Instant::now() + EVENT_WAIT;
    let status = loop {
        let status = cri
            .runtime
            .container_status(ContainerStatusRequest {
                container_id: id.clone(),
                verbose: false,
            })
            .await
            .expect("ContainerStatus")
            .into_inner()
            .status
            .expect("a status");
        if status.state == ContainerState::ContainerExited as i32 {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "not exited within {EVENT_WAIT:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.exit_code, 3, "{status:?}");
    // CRI's log format: `<time> stdout F hi`.
    let log = std::fs::read_to_string(&status.log_path)
        .unwrap_or_else(|e| panic!("read {}: {e}", status.log_path));
    assert!(log.lines().any(|l| l.ends_with(" stdout F hi")), "{log:?}");

    let sandbox_id = sandbox.id.clone();
    let labels = sandbox.label();
    if std::env::var_os("SWIFTLET_TEST_CONTAINERD_STATE").is_some() {
        // The check for mounts left behind means something only if there were some.
        assert!(
            !mounts_of(&sandbox_id).is_empty(),
            "no mounts of the running pod under SWIFTLET_TEST_CONTAINERD_STATE"
        );
    }
    sandbox.remove(&mut cri).await;

    let pods = cri
        .runtime
        .list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                label_selector: labels.clone(),
                ..Default::default()
            }),
        })
        .await
        .expect("ListPodSandbox")
        .into_inner()
        .items;
    assert!(pods.is_empty(), "left behind: {pods:?}");
    let containers = cri
        .runtime
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                label_selector: labels,
                ..Default::default()
            }),
        })
        .await
        .expect("ListContainers")
        .into_inner()
        .containers;
    assert!(containers.is_empty(), "left behind: {containers:?}");
    let mounts = mounts_of(&sandbox_id);
    assert!(mounts.is_empty(), "mounts left behind: {mounts:#?}");
}

#[tokio::test]
async fn a_pod_on_the_bridge_network_gets_an_address() {
    let Some(endpoint) = runtime_endpoint("a_pod_on_the_bridge_network_gets_an_address") else {
        return;
    };
    let mut cri = connect(&endpoint).await;
    let sandbox = Sandbox::run(&mut cri, &endpoint, "bridge", NamespaceMode::Pod).await;
    let status = cri
        .runtime
        .pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: sandbox.id.clone(),
            verbose: false,
        })
        .await
        .expect("PodSandboxStatus")
        .into_inner()
        .status
        .expect("a status");
    let ip = status
        .network
        .as_ref()
        .map(|n| n.ip.clone())
        .unwrap_or_default();
    let ip: Ipv4Addr = ip
        .parse()
        .unwrap_or_else(|e| panic!("sandbox address {ip:?}: {e}; {status:?}"));
    // 10.88.0.0/16, the private containerd's CNI bridge network.
    assert_eq!(ip.octets()[..2], [10, 88], "{ip} is outside 10.88.0.0/16");
    sandbox.remove(&mut cri).await;
}
