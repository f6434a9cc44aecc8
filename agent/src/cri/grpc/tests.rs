mod server;

use std::{
    path::Path,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use k8s_cri::v1 as cri;
use tonic::Code;

use super::*;
use crate::container::PodUid;
use crate::cri::{
    ImageService as _, RuntimeService,
    fake::{
        Call, FakeRuntime,
        fixtures::{IMAGE, container_config, image_spec, pod_sandbox_config},
    },
};

fn config(endpoint: &str, request_timeout: Duration) -> GrpcRuntimeConfig {
    GrpcRuntimeConfig {
        request_timeout,
        ..GrpcRuntimeConfig::new(endpoint)
    }
}

async fn connect(
    endpoint: &str,
    request_timeout: Duration,
) -> (Result<GrpcRuntime>, RuntimeMetrics) {
    let metrics = RuntimeMetrics::unregistered().unwrap();
    let client = GrpcRuntime::connect(config(endpoint, request_timeout), metrics.clone()).await;
    (client, metrics)
}

/// A grpc-timeout header value ("7000000u") as a duration.
fn header_duration(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().unwrap();
    match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        other => panic!("unit {other}"),
    }
}

#[test]
fn endpoints_are_unix_sockets_with_or_without_the_scheme() {
    let path = |e: &str| socket_path(e).map_err(|e| e.to_string());
    assert_eq!(
        path("unix:///run/containerd/containerd.sock"),
        Ok("/run/containerd/containerd.sock".into())
    );
    assert_eq!(
        path("/tmp/cri-dev/containerd.sock"),
        Ok("/tmp/cri-dev/containerd.sock".into())
    );
    for bad in [
        "",
        "  ",
        "unix://",
        "tcp://127.0.0.1:1234",
        "npipe:////./pipe/containerd",
    ] {
        let err = path(bad).unwrap_err();
        assert!(err.contains("--runtime-endpoint"), "{bad:?}: {err}");
    }
    assert!(
        path("http://localhost:80")
            .unwrap_err()
            .contains("only unix sockets")
    );
}

#[tokio::test]
async fn connecting_to_nothing_fails_clearly_and_counts_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}", dir.path().join("absent.sock").display());
    let (client, metrics) = connect(&endpoint, Duration::from_secs(5)).await;
    let Err(err) = client else {
        panic!("connected to nothing")
    };
    let text = err.to_string();
    assert!(
        matches!(
            err,
            Error::Unreachable {
                operation: Operation::Version,
                ..
            }
        ),
        "{text}"
    );
    assert!(text.contains(&endpoint), "{text}");
    assert!(text.contains("--runtime-endpoint"), "{text}");
    assert!(
        text.contains("No such file or directory"),
        "the OS's reason: {text}"
    );
    assert_eq!(metrics.errors(Operation::Version), 1);

    let (client, metrics) = connect("tcp://127.0.0.1:1", Duration::from_secs(5)).await;
    assert!(matches!(client, Err(Error::InvalidEndpoint { .. })));
    assert_eq!(
        metrics.operations(Operation::Version),
        0,
        "refused before any call"
    );
}

#[tokio::test]
async fn a_socket_that_is_not_a_cri_runtime_is_named_as_such() {
    let served = server::serve(Arc::new(FakeRuntime::new()), false);
    let Err(err) = connect(&served.endpoint, Duration::from_secs(5)).await.0 else {
        panic!("connected without a runtime service");
    };
    assert!(err.to_string().contains("CRI plugin"), "{err}");
}

#[tokio::test]
async fn a_runtime_that_does_not_answer_fails_the_connection_in_time() {
    let served = server::serve(Arc::new(FakeRuntime::new()), true);
    served.knobs.hang.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let Err(err) = connect(&served.endpoint, Duration::from_millis(300))
        .await
        .0
    else {
        panic!("connected to a hung runtime");
    };
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
    assert!(err.to_string().contains("no answer"), "{err}");
}

#[tokio::test]
async fn a_pod_runs_and_is_read_back_over_grpc() {
    let fake = Arc::new(FakeRuntime::new());
    let served = server::serve(fake.clone(), true);
    let (client, metrics) = connect(&served.endpoint, Duration::from_secs(5)).await;
    let client = client.unwrap();
    assert_eq!(client.runtime_name(), "containerd");
    assert_eq!(client.version_info().runtime_version, "1.6.20-fake");
    assert_eq!(client.endpoint(), served.endpoint);
    assert_eq!(
        client
            .status()
            .await
            .unwrap()
            .status
            .unwrap()
            .conditions
            .len(),
        2
    );

    let sandbox_config = pod_sandbox_config("u1", "web", "prod", 0);
    let sandbox = client
        .run_pod_sandbox(sandbox_config.clone(), "")
        .await
        .unwrap();
    assert_eq!(client.image_status(image_spec(IMAGE)).await.unwrap(), None);
    let image_ref = client
        .pull_image(image_spec(IMAGE), None, None)
        .await
        .unwrap();
    assert!(image_ref.starts_with("sha256:"));
    let config = container_config(&sandbox_config, "app", IMAGE, 0, 0x1f);
    let id = client
        .create_container(&sandbox, config, sandbox_config)
        .await
        .unwrap();
    client.start_container(&id).await.unwrap();
    let exec = client
        .exec_sync(&id, vec!["true".into()], Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(exec.exit_code, 0);
    let resources = cri::LinuxContainerResources {
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    client
        .update_container_resources(&id, resources)
        .await
        .unwrap();

    let status = crate::cri::convert::get_pod_status(&client, &PodUid::from("u1"), "web", "prod")
        .await
        .unwrap();
    assert_eq!(status.ips(), ["10.88.0.2".to_owned()]);
    let app = status.latest("app").unwrap();
    assert_eq!(app.id.to_string(), format!("containerd://{id}"));
    assert_eq!(
        (app.hash, app.sandbox_id.as_str()),
        (0x1f, sandbox.as_str())
    );
    let pods = crate::cri::convert::get_pods(&client, false).await.unwrap();
    assert_eq!(pods.len(), 1);

    client
        .stop_container(&id, Duration::from_secs(1))
        .await
        .unwrap();
    client.remove_container(&id).await.unwrap();
    client.stop_pod_sandbox(&sandbox).await.unwrap();
    client.remove_pod_sandbox(&sandbox).await.unwrap();
    assert_eq!(client.list_images(None).await.unwrap().len(), 1);
    assert_eq!(
        client
            .image_fs_info()
            .await
            .unwrap()
            .image_filesystems
            .len(),
        1
    );
    client.remove_image(image_spec(IMAGE)).await.unwrap();

    assert!(fake.calls().contains(&Call::StopContainer {
        id: id.clone(),
        grace: Duration::from_secs(1)
    }));
    assert_eq!(metrics.operations(Operation::Version), 1);
    assert_eq!(metrics.operations(Operation::ContainerStatus), 1);
    assert_eq!(metrics.operations(Operation::RunPodSandbox), 1);
    assert_eq!(metrics.errors(Operation::RunPodSandbox), 0);
}

#[tokio::test]
async fn runtime_errors_keep_their_meaning_over_the_wire() {
    let fake = Arc::new(FakeRuntime::new());
    let served = server::serve(fake.clone(), true);
    let (client, metrics) = connect(&served.endpoint, Duration::from_secs(5)).await;
    let client = client.unwrap();

    let err = client.container_status("gone").await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_eq!(metrics.errors(Operation::ContainerStatus), 1);
    // Removing what is gone is not an error (CRI: idempotent).
    client.remove_container("gone").await.unwrap();

    fake.fail_next(Operation::PullImage, Code::Unknown);
    let err = client
        .pull_image(image_spec("x"), None, None)
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.operation()),
        (Code::Unknown, Some(Operation::PullImage))
    );
    fake.fail_next(Operation::ListContainers, Code::Unavailable);
    let err = client.list_containers(None).await.unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
}

#[tokio::test]
async fn runtime_config_is_unimplemented_or_the_runtimes_driver() {
    let fake = Arc::new(FakeRuntime::new());
    let served = server::serve(fake.clone(), true);
    let (client, metrics) = connect(&served.endpoint, Duration::from_secs(5)).await;
    let client = client.unwrap();
    // As containerd 1.6: a runtime without the RPC stays reachable, and says so by its code.
    let err = client.runtime_config().await.unwrap_err();
    assert_eq!(
        (err.code(), err.operation()),
        (Code::Unimplemented, Some(Operation::RuntimeConfig))
    );
    assert_eq!(metrics.errors(Operation::RuntimeConfig), 1);
    let answer = cri::RuntimeConfigResponse {
        linux: Some(cri::LinuxRuntimeConfiguration {
            cgroup_driver: cri::CgroupDriver::Cgroupfs as i32,
        }),
    };
    fake.set_runtime_config(Some(answer));
    assert_eq!(client.runtime_config().await.unwrap(), answer);
    assert_eq!(metrics.operations(Operation::RuntimeConfig), 2);
}

#[tokio::test]
async fn container_events_stream_or_are_unimplemented() {
    use futures::StreamExt as _;
    let fake = Arc::new(FakeRuntime::new());
    let served = server::serve(fake.clone(), true);
    let (client, metrics) = connect(&served.endpoint, Duration::from_secs(5)).await;
    let client = client.unwrap();
    // As containerd 1.6.
    let err = client.get_container_events().await.err().unwrap();
    assert_eq!(
        (err.code(), err.operation()),
        (Code::Unimplemented, Some(Operation::GetContainerEvents))
    );
    assert_eq!(metrics.errors(Operation::GetContainerEvents), 1);

    fake.enable_container_events();
    let mut events = client.get_container_events().await.unwrap();
    let (sandbox, ids) = fake
        .start_pod("u1", "web", "default", &["main"])
        .await
        .unwrap();
    while fake.container_event_subscribers() == 0 {
        tokio::task::yield_now().await;
    }
    fake.send_container_event(
        &ids[0],
        &sandbox,
        cri::ContainerEventType::ContainerStartedEvent,
    );
    let event = events.next().await.unwrap().unwrap();
    assert_eq!(event.container_id, ids[0]);
    assert_eq!(
        event
            .pod_sandbox_status
            .and_then(|s| s.metadata)
            .map(|m| m.uid),
        Some("u1".to_owned())
    );
    assert_eq!(event.containers_statuses.len(), 1);
    // A broken stream is an error item with the runtime's code.
    fake.break_container_events(Code::Unavailable);
    let broken = events.next().await.unwrap().unwrap_err();
    assert_eq!(broken.code(), Code::Unavailable);
    assert_eq!(metrics.operations(Operation::GetContainerEvents), 2);
}

#[tokio::test]
async fn every_call_carries_the_upstream_deadline() {
    let fake = Arc::new(FakeRuntime::new());
    let served = server::serve(fake.clone(), true);
    let base = Duration::from_secs(2);
    let client = connect(&served.endpoint, base).await.0.unwrap();
    let (sandbox, ids) = fake.start_pod("u1", "p", "ns", &["a"]).await.unwrap();
    client
        .run_pod_sandbox(pod_sandbox_config("u2", "q", "ns", 0), "")
        .await
        .unwrap();
    client
        .exec_sync(&ids[0], vec![], Duration::ZERO)
        .await
        .unwrap();
    client
        .exec_sync(&ids[0], vec![], Duration::from_secs(3))
        .await
        .unwrap();
    client
        .stop_container(&ids[0], Duration::from_secs(5))
        .await
        .unwrap();
    client
        .pull_image(image_spec("img"), None, None)
        .await
        .unwrap();
    client.stop_pod_sandbox(&sandbox).await.unwrap();

    let seen: Vec<(String, Option<Duration>)> = served
        .knobs
        .deadlines
        .lock()
        .unwrap()
        .iter()
        .map(|(method, header)| (method.clone(), header.as_deref().map(header_duration)))
        .collect();
    let s = |n| Some(Duration::from_secs(n));
    assert_eq!(
        seen,
        vec![
            ("Version".into(), s(2)),
            ("RunPodSandbox".into(), s(4)),
            ("ExecSync".into(), None),
            ("ExecSync".into(), s(5)),
            ("StopContainer".into(), s(7)),
            ("PullImage".into(), None),
            ("StopPodSandbox".into(), s(2)),
        ]
    );
}

#[tokio::test]
async fn a_hung_call_ends_at_its_deadline() {
    let served = server::serve(Arc::new(FakeRuntime::new()), true);
    let (client, metrics) = connect(&served.endpoint, Duration::from_millis(300)).await;
    let client = client.unwrap();
    served.knobs.hang.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let err = client.list_pod_sandbox(None).await.unwrap_err();
    let elapsed = start.elapsed();
    assert!(
        matches!(
            err,
            Error::DeadlineExceeded { operation: Operation::ListPodSandbox, timeout: Some(t), .. }
                if t == Duration::from_millis(300)
        ),
        "{err}"
    );
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
    assert_eq!(metrics.errors(Operation::ListPodSandbox), 1);
}

#[tokio::test]
async fn answers_missing_required_fields_are_refused() {
    let fake = Arc::new(FakeRuntime::new());
    let served = server::serve(fake.clone(), true);
    let client = connect(&served.endpoint, Duration::from_secs(5))
        .await
        .0
        .unwrap();
    let (sandbox, ids) = fake.start_pod("u1", "p", "ns", &["a"]).await.unwrap();
    served.knobs.blank.store(true, Ordering::SeqCst);

    let invalid = |r: Result<()>| match r {
        Err(Error::InvalidResponse { problem, .. }) => problem,
        other => panic!("{other:?}"),
    };
    let run = client
        .run_pod_sandbox(pod_sandbox_config("u2", "q", "ns", 0), "")
        .await;
    assert_eq!(invalid(run.map(drop)), "PodSandboxId is not set");
    let status = client.container_status(&ids[0]).await;
    assert_eq!(invalid(status.map(drop)), "status.ImageRef is not set");
    let status = client.pod_sandbox_status(&sandbox).await;
    assert_eq!(invalid(status.map(drop)), "status.CreatedAt is not set");
    assert!(matches!(
        client.version().await,
        Err(Error::InvalidResponse {
            operation: Operation::Version,
            ..
        })
    ));
}

#[test]
fn the_default_endpoint_is_containerds() {
    let config = GrpcRuntimeConfig::new(GrpcRuntimeConfig::DEFAULT_ENDPOINT);
    assert_eq!(config.request_timeout, Duration::from_secs(120));
    assert_eq!(config.pull_image_timeout, None);
    assert_eq!(
        socket_path(&config.endpoint).unwrap(),
        Path::new("/run/containerd/containerd.sock")
    );
}
