//! Running one probe or hook action (upstream `prober.runProbe` and `pkg/probe/{exec,http,tcp,
//! grpc}`): the verdict, with the output that explains it. An error is a probe that could not be
//! run at all (no handler, a port name the container does not declare, the runtime failing):
//! upstream throws such a result away instead of counting it as a failure.

use std::time::Duration;

use k8s_openapi::{
    api::core::v1::{Container, GRPCAction, HTTPGetAction, Probe, TCPSocketAction},
    apimachinery::pkg::util::intstr::IntOrString,
};

use super::http::{self, HttpGet, Scheme};
use crate::cri::RuntimeService;

/// A probe's verdict (upstream `probe.Result`); a warning counts as a success.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Success,
    Warning(String),
    Failure(String),
}

impl Verdict {
    pub fn passed(&self) -> bool {
        !matches!(self, Verdict::Failure(_))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProbeError {
    #[error("missing probe handler for {0}")]
    NoHandler(String),
    #[error("couldn't find port: {0}")]
    Port(String),
    #[error("no pod IP to probe yet")]
    NoPodIp,
    #[error("{0}")]
    Runtime(String),
}

/// What a probe needs besides its spec.
pub struct Target<'a> {
    pub runtime: &'a dyn RuntimeService,
    pub container: &'a Container,
    /// The runtime's id of the instance (without the `containerd://`).
    pub container_id: &'a str,
    pub pod_ip: Option<&'a str>,
    /// `container` of `pod/container` in messages.
    pub name: &'a str,
}

/// Runs `probe` once (upstream `runProbe`); its timeout is `timeoutSeconds`.
pub async fn run(probe: &Probe, target: &Target<'_>) -> Result<Verdict, ProbeError> {
    let timeout =
        Duration::from_secs(u64::try_from(probe.timeout_seconds.unwrap_or(1).max(1)).unwrap_or(1));
    if let Some(exec) = &probe.exec {
        return run_exec(exec.command.clone().unwrap_or_default(), timeout, target).await;
    }
    if let Some(get) = &probe.http_get {
        let request = http_request(get, target)?;
        return Ok(http_verdict(http::get(&request, timeout).await));
    }
    if let Some(tcp) = &probe.tcp_socket {
        return run_tcp(tcp, timeout, target).await;
    }
    if let Some(grpc) = &probe.grpc {
        return run_grpc(grpc, timeout, target).await;
    }
    Err(ProbeError::NoHandler(target.name.to_owned()))
}

/// An exec probe: exit code 0 passes; running past the timeout fails.
pub async fn run_exec(
    command: Vec<String>,
    timeout: Duration,
    target: &Target<'_>,
) -> Result<Verdict, ProbeError> {
    match target
        .runtime
        .exec_sync(target.container_id, command.clone(), timeout)
        .await
    {
        Ok(response) => {
            let mut output = String::from_utf8_lossy(&response.stdout).into_owned();
            output.push_str(&String::from_utf8_lossy(&response.stderr));
            if response.exit_code == 0 {
                Ok(Verdict::Success)
            } else {
                Ok(Verdict::Failure(if output.is_empty() {
                    format!("command {command:?} exited with {}", response.exit_code)
                } else {
                    output
                }))
            }
        }
        Err(e) if e.code() == tonic::Code::DeadlineExceeded => {
            Ok(Verdict::Failure(format!("command {command:?} timed out")))
        }
        Err(e) => Err(ProbeError::Runtime(e.to_string())),
    }
}

/// The GET an `httpGet` action describes, its port resolved and its host defaulted to the pod
/// IP.
pub fn http_request(get: &HTTPGetAction, target: &Target<'_>) -> Result<HttpGet, ProbeError> {
    let port = resolve_port(&get.port, target.container)?;
    let host = match get.host.as_deref().filter(|h| !h.is_empty()) {
        Some(host) => host.to_owned(),
        None => target.pod_ip.ok_or(ProbeError::NoPodIp)?.to_owned(),
    };
    let scheme = if get.scheme.as_deref() == Some("HTTPS") {
        Scheme::Https
    } else {
        Scheme::Http
    };
    let path = get.path.clone().unwrap_or_default();
    let path = if path.starts_with('/') {
        path
    } else {
        format!("/{path}")
    };
    let headers = get
        .http_headers
        .iter()
        .flatten()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    Ok(HttpGet {
        scheme,
        host,
        port,
        path,
        headers,
    })
}

/// 200-399 passes (a redirect with a warning); anything else, or no answer, fails.
pub fn http_verdict(result: Result<http::HttpResponse, http::HttpError>) -> Verdict {
    match result {
        Err(e) => Verdict::Failure(e.to_string()),
        Ok(response) => {
            let code = response.status.as_u16();
            let body = String::from_utf8_lossy(&response.body).into_owned();
            if (200..300).contains(&code) {
                Verdict::Success
            } else if (300..400).contains(&code) {
                Verdict::Warning(format!("Probe terminated redirects, Response body: {body}"))
            } else {
                Verdict::Failure(format!("HTTP probe failed with statuscode: {code}"))
            }
        }
    }
}

async fn run_tcp(
    tcp: &TCPSocketAction,
    timeout: Duration,
    target: &Target<'_>,
) -> Result<Verdict, ProbeError> {
    let port = resolve_port(&tcp.port, target.container)?;
    let host = match tcp.host.as_deref().filter(|h| !h.is_empty()) {
        Some(host) => host.to_owned(),
        None => target.pod_ip.ok_or(ProbeError::NoPodIp)?.to_owned(),
    };
    let connect = tokio::net::TcpStream::connect((host.as_str(), port));
    Ok(match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(_)) => Verdict::Success,
        Ok(Err(e)) => Verdict::Failure(format!("dial tcp {host}:{port}: connect: {e}")),
        Err(_) => Verdict::Failure(format!("dial tcp {host}:{port}: i/o timeout")),
    })
}

async fn run_grpc(
    grpc: &GRPCAction,
    timeout: Duration,
    target: &Target<'_>,
) -> Result<Verdict, ProbeError> {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };

    let host = target.pod_ip.ok_or(ProbeError::NoPodIp)?;
    let port = u16::try_from(grpc.port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ProbeError::Port(format!("invalid port number: {}", grpc.port)))?;
    let service = grpc.service.clone().unwrap_or_default();
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{host}:{port}"))
        .map_err(|e| ProbeError::Runtime(e.to_string()))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => {
            return Ok(Verdict::Failure(format!(
                "timeout: failed to connect service \"{host}:{port}\" within {}s: {e}",
                timeout.as_secs()
            )));
        }
        Err(_) => {
            return Ok(Verdict::Failure(format!(
                "timeout: failed to connect service \"{host}:{port}\" within {}s",
                timeout.as_secs()
            )));
        }
    };
    let mut client = HealthClient::new(channel);
    let check = client.check(HealthCheckRequest { service });
    let response = match tokio::time::timeout(timeout, check).await {
        Err(_) => {
            return Ok(Verdict::Failure(format!(
                "timeout: health rpc did not complete within {}s",
                timeout.as_secs()
            )));
        }
        Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
            return Ok(Verdict::Failure(format!(
                "this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                status.message()
            )));
        }
        Ok(Err(status)) if status.code() == tonic::Code::DeadlineExceeded => {
            return Ok(Verdict::Failure(format!(
                "timeout: health rpc did not complete within {}s",
                timeout.as_secs()
            )));
        }
        Ok(Err(status)) => {
            return Ok(Verdict::Failure(format!(
                "error: health rpc probe failed: {status}"
            )));
        }
        Ok(Ok(response)) => response.into_inner(),
    };
    let status = ServingStatus::try_from(response.status).unwrap_or(ServingStatus::Unknown);
    Ok(if status == ServingStatus::Serving {
        Verdict::Success
    } else {
        Verdict::Failure(format!(
            "service unhealthy (responded with \"{}\")",
            status.as_str_name()
        ))
    })
}

/// A port by number, or by the name of one of the container's ports (upstream
/// `probe.ResolveContainerPort`).
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, ProbeError> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| p.container_port)
            .ok_or_else(|| {
                ProbeError::Port(format!(
                    "port {name:?} is not declared by container {}",
                    container.name
                ))
            })?,
    };
    u16::try_from(number)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ProbeError::Port(format!("invalid port number: {number}")))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ContainerPort;

    use super::*;

    fn container() -> Container {
        Container {
            name: "web".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn ports_resolve_by_number_or_declared_name() {
        let c = container();
        assert_eq!(resolve_port(&IntOrString::Int(81), &c), Ok(81));
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert!(matches!(
            resolve_port(&IntOrString::String("metrics".into()), &c),
            Err(ProbeError::Port(m)) if m.contains("\"metrics\"")
        ));
        assert!(matches!(
            resolve_port(&IntOrString::Int(70000), &c),
            Err(ProbeError::Port(m)) if m == "invalid port number: 70000"
        ));
    }

    fn response(code: u16) -> Result<http::HttpResponse, http::HttpError> {
        Ok(http::HttpResponse {
            status: hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::IM_A_TEAPOT),
            body: bytes::Bytes::from_static(b"moved"),
        })
    }

    #[test]
    fn http_codes_200_to_399_pass() {
        assert_eq!(http_verdict(response(200)), Verdict::Success);
        assert_eq!(http_verdict(response(204)), Verdict::Success);
        assert!(matches!(http_verdict(response(302)), Verdict::Warning(m) if m.ends_with("moved")));
        assert!(http_verdict(response(302)).passed());
        assert_eq!(
            http_verdict(response(404)),
            Verdict::Failure("HTTP probe failed with statuscode: 404".into())
        );
        assert_eq!(
            http_verdict(response(503)),
            Verdict::Failure("HTTP probe failed with statuscode: 503".into())
        );
    }

    fn target<'a>(runtime: &'a crate::cri::fake::FakeRuntime, c: &'a Container) -> Target<'a> {
        Target {
            runtime,
            container: c,
            container_id: "none",
            pod_ip: Some("127.0.0.1"),
            name: "web",
        }
    }

    #[tokio::test]
    async fn grpc_probes_ask_the_standard_health_service() {
        use tonic_health::ServingStatus;

        let (reporter, service) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("up", ServingStatus::Serving)
            .await;
        reporter
            .set_service_status("down", ServingStatus::NotServing)
            .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let runtime = crate::cri::fake::FakeRuntime::new();
        let c = container();
        let probe = |service: &str| Probe {
            grpc: Some(GRPCAction {
                port: i32::from(port),
                service: Some(service.into()),
            }),
            timeout_seconds: Some(5),
            ..Default::default()
        };
        assert_eq!(
            run(&probe("up"), &target(&runtime, &c)).await,
            Ok(Verdict::Success)
        );
        assert_eq!(
            run(&probe("down"), &target(&runtime, &c)).await,
            Ok(Verdict::Failure(
                "service unhealthy (responded with \"NOT_SERVING\")".into()
            ))
        );
        assert!(matches!(
            run(&probe("unknown"), &target(&runtime, &c)).await,
            Ok(Verdict::Failure(m)) if m.starts_with("error: health rpc probe failed")
        ));
        let closed = Probe {
            grpc: Some(GRPCAction {
                port: 1,
                service: None,
            }),
            ..probe("up")
        };
        assert!(matches!(
            run(&closed, &target(&runtime, &c)).await,
            Ok(Verdict::Failure(m)) if m.starts_with("timeout: failed to connect service")
        ));
    }

    #[tokio::test]
    async fn http_probes_send_the_kubelets_headers_and_stop_at_other_hosts() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut request = vec![0u8; 4096];
            let n = conn.read(&mut request).await.expect("read");
            conn.write_all(
                b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere.example/\r\nContent-Length: 5\r\n\r\nmoved",
            )
            .await
            .expect("write");
            String::from_utf8_lossy(&request[..n]).to_lowercase()
        });
        let runtime = crate::cri::fake::FakeRuntime::new();
        let c = container();
        let probe = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::Int(i32::from(port)),
                path: Some("/healthz".into()),
                http_headers: Some(vec![k8s_openapi::api::core::v1::HTTPHeader {
                    name: "X-Probe".into(),
                    value: "yes".into(),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let verdict = run(&probe, &target(&runtime, &c)).await;
        assert!(
            matches!(&verdict, Ok(Verdict::Warning(m)) if m.ends_with("moved")),
            "{verdict:?}"
        );
        let request = server.await.expect("server");
        assert!(request.starts_with("get /healthz http/1.1"), "{request}");
        assert!(request.contains("user-agent: kube-probe/"), "{request}");
        assert!(request.contains("x-probe: yes"), "{request}");
        assert!(request.contains("accept: */*"), "{request}");
    }
}
