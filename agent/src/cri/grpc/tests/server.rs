//! Test support: the fake runtime served over real gRPC on a unix socket, so the client is
//! exercised end to end (encoding, deadlines, status codes) without containerd. Knobs make the
//! server hang, answer with required fields left out, or lack the runtime service.

use std::{
    convert::Infallible,
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use k8s_cri::v1 as cri;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{
    Status,
    body::Body,
    server::{Grpc, NamedService, ServerStreamingService, UnaryService},
};

use crate::cri::{Error, ImageService as _, RuntimeService as _, fake::FakeRuntime};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type EventStream =
    Pin<Box<dyn futures::Stream<Item = Result<cri::ContainerEventResponse, Status>> + Send>>;
/// (method, grpc-timeout header) of every request.
type Deadlines = Arc<Mutex<Vec<(String, Option<String>)>>>;

#[derive(Clone)]
pub struct Knobs {
    pub fake: Arc<FakeRuntime>,
    /// Every request hangs.
    pub hang: Arc<AtomicBool>,
    /// Answers leave out fields CRI requires.
    pub blank: Arc<AtomicBool>,
    pub deadlines: Deadlines,
}

pub struct Served {
    pub knobs: Knobs,
    pub endpoint: String,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `fake`; without `runtime_service` only the image service answers (as a socket that
/// is not a CRI runtime's would answer Unimplemented).
pub fn serve(fake: Arc<FakeRuntime>, runtime_service: bool) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("cri.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let knobs = Knobs {
        fake,
        hang: Arc::default(),
        blank: Arc::default(),
        deadlines: Arc::default(),
    };
    let mut router = tonic::transport::Server::builder().add_service(ImageSvc(knobs.clone()));
    if runtime_service {
        router = router.add_service(RuntimeSvc(knobs.clone()));
    }
    let task = tokio::spawn(async move {
        let _ = router
            .serve_with_incoming(UnixListenerStream::new(listener))
            .await;
    });
    Served {
        knobs,
        endpoint: format!("unix://{}", path.display()),
        _dir: dir,
        task,
    }
}

#[derive(Clone)]
struct RuntimeSvc(Knobs);
#[derive(Clone)]
struct ImageSvc(Knobs);

impl NamedService for RuntimeSvc {
    const NAME: &'static str = "runtime.v1.RuntimeService";
}
impl NamedService for ImageSvc {
    const NAME: &'static str = "runtime.v1.ImageService";
}

macro_rules! service {
    ($svc:ident) => {
        impl tower::Service<http::Request<Body>> for $svc {
            type Response = http::Response<Body>;
            type Error = Infallible;
            type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }

            fn call(&mut self, req: http::Request<Body>) -> Self::Future {
                let knobs = self.0.clone();
                Box::pin(async move { Ok(route(knobs, req).await) })
            }
        }
    };
}
service!(RuntimeSvc);
service!(ImageSvc);

/// One unary method: decodes `Req`, runs `handler`, encodes its answer.
struct Unary<F>(Option<F>);

impl<Req, Resp, F, Fut> UnaryService<Req> for Unary<F>
where
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, Error>> + Send + 'static,
    Resp: Send + 'static,
{
    type Response = Resp;
    type Future = BoxFuture<Result<tonic::Response<Resp>, Status>>;

    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        let Some(handler) = self.0.take() else {
            return Box::pin(async { Err(Status::internal("called twice")) });
        };
        let answer = handler(request.into_inner());
        Box::pin(async move {
            answer
                .await
                .map(tonic::Response::new)
                .map_err(|e| Status::new(e.code(), e.to_string()))
        })
    }
}

/// `GetContainerEvents`: the fake's event stream, served as a server stream.
struct Events(Arc<FakeRuntime>);

impl ServerStreamingService<cri::GetEventsRequest> for Events {
    type Response = cri::ContainerEventResponse;
    type ResponseStream = EventStream;
    type Future = BoxFuture<Result<tonic::Response<EventStream>, Status>>;

    fn call(&mut self, _: tonic::Request<cri::GetEventsRequest>) -> Self::Future {
        let fake = self.0.clone();
        Box::pin(async move {
            use futures::StreamExt as _;
            let status = |e: Error| Status::new(e.code(), e.to_string());
            let events = fake.get_container_events().await.map_err(status)?;
            let events: EventStream = Box::pin(events.map(move |item| item.map_err(status)));
            Ok(tonic::Response::new(events))
        })
    }
}

async fn unary<Req, Resp, F, Fut>(req: http::Request<Body>, handler: F) -> http::Response<Body>
where
    Req: tonic_prost::prost::Message + Default + Send + 'static,
    Resp: tonic_prost::prost::Message + Send + 'static,
    F: FnOnce(Req) -> Fut,
    Fut: Future<Output = Result<Resp, Error>> + Send + 'static,
{
    let codec = tonic_prost::ProstCodec::<Resp, Req>::default();
    Grpc::new(codec).unary(Unary(Some(handler)), req).await
}

fn secs(seconds: i64) -> Duration {
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

async fn route(k: Knobs, req: http::Request<Body>) -> http::Response<Body> {
    let path = req.uri().path().to_owned();
    let method = path.rsplit('/').next().unwrap_or_default().to_owned();
    let timeout = req
        .headers()
        .get("grpc-timeout")
        .map(|v| v.to_str().unwrap().to_owned());
    k.deadlines.lock().unwrap().push((method.clone(), timeout));
    if k.hang.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let blank = k.blank.load(Ordering::SeqCst);
    let f = &k.fake;
    if method == "GetContainerEvents" {
        let codec =
            tonic_prost::ProstCodec::<cri::ContainerEventResponse, cri::GetEventsRequest>::default(
            );
        return Grpc::new(codec)
            .server_streaming(Events(f.clone()), req)
            .await;
    }
    let req = match sandbox_rpc(&method, f.clone(), blank, req).await {
        Ok(response) => return response,
        Err(req) => req,
    };
    let req = match container_rpc(&method, f.clone(), blank, req).await {
        Ok(response) => return response,
        Err(req) => req,
    };
    match image_rpc(&method, f.clone(), req).await {
        Ok(response) => response,
        Err(_) => Status::unimplemented(path).into_http(),
    }
}

/// The runtime's version and status, and the sandbox calls; the request back when it is none.
async fn sandbox_rpc(
    method: &str,
    f: Arc<FakeRuntime>,
    blank: bool,
    req: http::Request<Body>,
) -> Result<http::Response<Body>, http::Request<Body>> {
    let response = match method {
        "Version" => {
            unary(req, move |_: cri::VersionRequest| async move {
                let mut v = f.version().await?;
                if blank {
                    v.runtime_version.clear();
                }
                Ok(v)
            })
            .await
        }
        "Status" => {
            unary(
                req,
                move |_: cri::StatusRequest| async move { f.status().await },
            )
            .await
        }
        "RuntimeConfig" => {
            unary(req, move |_: cri::RuntimeConfigRequest| async move {
                f.runtime_config().await
            })
            .await
        }
        "RunPodSandbox" => {
            unary(req, move |r: cri::RunPodSandboxRequest| async move {
                let config = r.config.unwrap_or_default();
                let id = f.run_pod_sandbox(config, &r.runtime_handler).await?;
                let pod_sandbox_id = if blank { String::new() } else { id };
                Ok(cri::RunPodSandboxResponse { pod_sandbox_id })
            })
            .await
        }
        "StopPodSandbox" => {
            unary(req, move |r: cri::StopPodSandboxRequest| async move {
                f.stop_pod_sandbox(&r.pod_sandbox_id).await?;
                Ok(cri::StopPodSandboxResponse {})
            })
            .await
        }
        "RemovePodSandbox" => {
            unary(req, move |r: cri::RemovePodSandboxRequest| async move {
                f.remove_pod_sandbox(&r.pod_sandbox_id).await?;
                Ok(cri::RemovePodSandboxResponse {})
            })
            .await
        }
        "PodSandboxStatus" => {
            unary(req, move |r: cri::PodSandboxStatusRequest| async move {
                let mut status = f.pod_sandbox_status(&r.pod_sandbox_id).await?;
                if blank {
                    status.created_at = 0;
                }
                Ok(cri::PodSandboxStatusResponse {
                    status: Some(status),
                    ..Default::default()
                })
            })
            .await
        }
        "ListPodSandbox" => {
            unary(req, move |r: cri::ListPodSandboxRequest| async move {
                let items = f.list_pod_sandbox(r.filter).await?;
                Ok(cri::ListPodSandboxResponse { items })
            })
            .await
        }
        _ => return Err(req),
    };
    Ok(response)
}

/// The container calls; the request back when it is none of them.
async fn container_rpc(
    method: &str,
    f: Arc<FakeRuntime>,
    blank: bool,
    req: http::Request<Body>,
) -> Result<http::Response<Body>, http::Request<Body>> {
    let response = match method {
        "CreateContainer" => {
            unary(req, move |r: cri::CreateContainerRequest| async move {
                let config = r.config.unwrap_or_default();
                let sandbox = r.sandbox_config.unwrap_or_default();
                let id = f
                    .create_container(&r.pod_sandbox_id, config, sandbox)
                    .await?;
                Ok(cri::CreateContainerResponse { container_id: id })
            })
            .await
        }
        "StartContainer" => {
            unary(req, move |r: cri::StartContainerRequest| async move {
                f.start_container(&r.container_id).await?;
                Ok(cri::StartContainerResponse {})
            })
            .await
        }
        "StopContainer" => {
            unary(req, move |r: cri::StopContainerRequest| async move {
                f.stop_container(&r.container_id, secs(r.timeout)).await?;
                Ok(cri::StopContainerResponse {})
            })
            .await
        }
        "RemoveContainer" => {
            unary(req, move |r: cri::RemoveContainerRequest| async move {
                f.remove_container(&r.container_id).await?;
                Ok(cri::RemoveContainerResponse {})
            })
            .await
        }
        "ListContainers" => {
            unary(req, move |r: cri::ListContainersRequest| async move {
                let containers = f.list_containers(r.filter).await?;
                Ok(cri::ListContainersResponse { containers })
            })
            .await
        }
        "ContainerStatus" => {
            unary(req, move |r: cri::ContainerStatusRequest| async move {
                let mut status = f.container_status(&r.container_id).await?;
                if blank {
                    status.image_ref.clear();
                }
                Ok(cri::ContainerStatusResponse {
                    status: Some(status),
                    ..Default::default()
                })
            })
            .await
        }
        "UpdateContainerResources" => {
            unary(
                req,
                move |r: cri::UpdateContainerResourcesRequest| async move {
                    let linux = r.linux.unwrap_or_default();
                    f.update_container_resources(&r.container_id, linux).await?;
                    Ok(cri::UpdateContainerResourcesResponse {})
                },
            )
            .await
        }
        "ExecSync" => {
            unary(req, move |r: cri::ExecSyncRequest| async move {
                f.exec_sync(&r.container_id, r.cmd, secs(r.timeout)).await
            })
            .await
        }
        _ => return Err(req),
    };
    Ok(response)
}

/// The image calls; the request back when it is none of them.
async fn image_rpc(
    method: &str,
    f: Arc<FakeRuntime>,
    req: http::Request<Body>,
) -> Result<http::Response<Body>, http::Request<Body>> {
    let response = match method {
        "ListImages" => {
            unary(req, move |r: cri::ListImagesRequest| async move {
                let images = f.list_images(r.filter).await?;
                Ok(cri::ListImagesResponse { images })
            })
            .await
        }
        "ImageStatus" => {
            unary(req, move |r: cri::ImageStatusRequest| async move {
                let image = f.image_status(r.image.unwrap_or_default()).await?;
                Ok(cri::ImageStatusResponse {
                    image,
                    ..Default::default()
                })
            })
            .await
        }
        "PullImage" => {
            unary(req, move |r: cri::PullImageRequest| async move {
                let spec = r.image.unwrap_or_default();
                let image_ref = f.pull_image(spec, r.auth, r.sandbox_config).await?;
                Ok(cri::PullImageResponse { image_ref })
            })
            .await
        }
        "RemoveImage" => {
            unary(req, move |r: cri::RemoveImageRequest| async move {
                f.remove_image(r.image.unwrap_or_default()).await?;
                Ok(cri::RemoveImageResponse {})
            })
            .await
        }
        "ImageFsInfo" => {
            unary(req, move |_: cri::ImageFsInfoRequest| async move {
                f.image_fs_info().await
            })
            .await
        }
        _ => return Err(req),
    };
    Ok(response)
}
