//! Streaming: the options of a request, the CRI request an exec makes, and the proxy carrying an
//! upgraded connection to a stand-in streaming server byte for byte (over real sockets).

use std::sync::Mutex;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, PodStatus,
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};

use super::*;
use crate::cri::fake::FakeRuntime;

#[test]
fn stream_options_as_upstream() {
    let o = StreamOptions::from_query("command=sh&command=-c&command=echo%20hi&stdout=1&stderr=1")
        .expect("valid");
    assert_eq!(
        o,
        StreamOptions {
            stdin: false,
            stdout: true,
            stderr: true,
            tty: false,
            command: vec!["sh".into(), "-c".into(), "echo hi".into()],
        }
    );
    // A terminal has no separate stderr.
    let o = StreamOptions::from_query("stdin=1&stderr=1&tty=1").expect("valid");
    assert!(o.stdin && o.tty && !o.stderr);
    assert_eq!(
        StreamOptions::from_query("command=ls&tty=1").map_err(|e| e.to_string()),
        Err("you must specify at least 1 of stdin, stdout, stderr".into())
    );
    // Only "1" means yes.
    assert!(StreamOptions::from_query("stdout=true").is_err());
}

/// Records the CRI requests and hands out one URL.
struct RecordingStreams {
    url: String,
    execs: Mutex<Vec<cri::ExecRequest>>,
}

#[tonic::async_trait]
impl StreamingService for RecordingStreams {
    async fn exec(&self, request: cri::ExecRequest) -> crate::cri::Result<String> {
        self.execs.lock().expect("lock").push(request);
        Ok(self.url.clone())
    }
    async fn attach(&self, _: cri::AttachRequest) -> crate::cri::Result<String> {
        Ok(self.url.clone())
    }
    async fn port_forward(&self, _: cri::PortForwardRequest) -> crate::cri::Result<String> {
        Ok(self.url.clone())
    }
}

fn running_pod() -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some("web".into());
    pod.metadata.namespace = Some("default".into());
    pod.metadata.uid = Some("u1".into());
    pod.status = Some(PodStatus {
        container_statuses: Some(vec![ContainerStatus {
            name: "app".into(),
            container_id: Some("containerd://c0ffee".into()),
            image: "busybox".into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    });
    pod
}

/// A stand-in for the runtime's streaming server: answers the first request with 101, reports
/// its request head, then echoes.
async fn echo_backend() -> (String, tokio::sync::oneshot::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!(
        "http://{}/exec/tok123",
        listener.local_addr().expect("addr")
    );
    let (head_tx, head_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.expect("accept");
        let head = read_head(&mut conn).await;
        let _ = head_tx.send(head);
        conn.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
              X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n",
        )
        .await
        .expect("write");
        let mut buf = [0u8; 64];
        while let Ok(n) = conn.read(&mut buf).await {
            if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    (url, head_rx)
}

async fn read_head(conn: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await.expect("read") == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8(head).expect("utf-8")
}

async fn serve(streaming: Arc<Streaming>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router(streaming)).await;
    });
    addr
}

#[tokio::test]
async fn exec_asks_the_runtime_and_proxies_the_upgraded_stream() {
    let (url, backend_head) = echo_backend().await;
    let streams = Arc::new(RecordingStreams {
        url,
        execs: Mutex::new(Vec::new()),
    });
    let addr = serve(Arc::new(Streaming {
        runtime: Arc::new(FakeRuntime::new()),
        streams: streams.clone(),
        pods: Arc::new(|| vec![running_pod()]),
        run_timeout: std::time::Duration::from_secs(120),
    }))
    .await;

    let mut client = TcpStream::connect(addr).await.expect("connect");
    client
        .write_all(
            b"POST /exec/default/web/app?command=echo&command=hi&stdout=1 HTTP/1.1\r\n\
              Host: node\r\nAuthorization: Bearer secret\r\nConnection: Upgrade\r\n\
              Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n",
        )
        .await
        .expect("write");
    let head = read_head(&mut client).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_lowercase()
            .contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{head}"
    );
    client.write_all(b"ping").await.expect("write");
    let mut echoed = [0u8; 4];
    client.read_exact(&mut echoed).await.expect("echo");
    assert_eq!(&echoed, b"ping");

    assert_eq!(
        *streams.execs.lock().expect("lock"),
        vec![cri::ExecRequest {
            container_id: "c0ffee".into(),
            cmd: vec!["echo".into(), "hi".into()],
            tty: false,
            stdin: false,
            stdout: true,
            stderr: false,
        }]
    );
    let head = backend_head.await.expect("backend saw a request");
    assert!(
        head.starts_with("POST /exec/tok123?command=echo&command=hi&stdout=1 HTTP/1.1\r\n"),
        "{head}"
    );
    let lower = head.to_lowercase();
    assert!(lower.contains("upgrade: spdy/3.1"), "{head}");
    assert!(
        !lower.contains("authorization"),
        "credentials leaked: {head}"
    );
}

#[tokio::test]
async fn refusals_before_any_stream() {
    let streams = Arc::new(RecordingStreams {
        url: "http://127.0.0.1:1/x".into(),
        execs: Mutex::new(Vec::new()),
    });
    let addr = serve(Arc::new(Streaming {
        runtime: Arc::new(FakeRuntime::new()),
        streams: streams.clone(),
        pods: Arc::new(|| vec![running_pod()]),
        run_timeout: std::time::Duration::from_secs(120),
    }))
    .await;
    let upgrade = "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n";
    for (path, headers, status) in [
        ("/exec/default/nope/app?stdout=1", upgrade, "404"),
        ("/exec/default/web/other?stdout=1", upgrade, "404"),
        ("/exec/default/web/u2/app?stdout=1", upgrade, "404"),
        ("/exec/default/web/app?command=ls", upgrade, "400"),
        // Not an upgrade: refused after the CRI call, as upstream's upgrade-required proxy.
        ("/exec/default/web/app?stdout=1", "\r\n", "400"),
    ] {
        let mut client = TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nHost: n\r\n{headers}");
        client.write_all(request.as_bytes()).await.expect("write");
        let head = read_head(&mut client).await;
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status}")),
            "{path}: {head}"
        );
    }
    assert_eq!(streams.execs.lock().expect("lock").len(), 1);
}

/// `running_pod` whose container `app` is the fake's container `id`.
fn pod_running(id: &str) -> Pod {
    let mut pod = running_pod();
    if let Some(statuses) = pod
        .status
        .as_mut()
        .and_then(|s| s.container_statuses.as_mut())
    {
        statuses[0].container_id = Some(format!("containerd://{id}"));
    }
    pod
}

#[tokio::test(start_paused = true)]
async fn run_gives_its_command_the_runtime_request_timeout() {
    use tower::ServiceExt as _;

    let fake = Arc::new(FakeRuntime::new());
    let (_, ids) = fake
        .start_pod("u1", "web", "default", &["app"])
        .await
        .expect("pod");
    let id = ids.first().cloned().expect("container");
    let pod = pod_running(&id);
    let app = router(Arc::new(Streaming {
        runtime: fake.clone(),
        streams: Arc::new(RecordingStreams {
            url: String::new(),
            execs: Mutex::new(Vec::new()),
        }),
        pods: Arc::new(move || vec![pod.clone()]),
        run_timeout: std::time::Duration::from_secs(120),
    }));
    let run = |app: axum::Router| async move {
        let request = axum::http::Request::post("/run/default/web/app?cmd=sleep%201000000")
            .body(axum::body::Body::empty())
            .expect("request");
        let response = app.oneshot(request).await.expect("infallible");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    assert_eq!(run(app.clone()).await.0, StatusCode::OK);
    // A command that never ends is killed by the runtime at the timeout, and the answer says so
    // (paused time: the two minutes pass at once).
    fake.hang_execs();
    let (status, body) = run(app).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("timeout 120s exceeded"), "{body}");
    let timeouts: Vec<_> = fake
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            crate::cri::fake::Call::ExecSync { cmd, timeout, .. } => Some((cmd, timeout)),
            _ => None,
        })
        .collect();
    let want = (
        vec!["sleep".to_owned(), "1000000".to_owned()],
        std::time::Duration::from_secs(120),
    );
    assert_eq!(timeouts, vec![want.clone(), want]);
}
