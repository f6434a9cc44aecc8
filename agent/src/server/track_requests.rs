//! The tower layer that counts every request on its connection for as long as its response
//! body lives (a streamed log, a watch), so the connection policy (`connections.rs`) knows which
//! connections are busy, and pins a connection a request upgraded (exec, attach, port-forward).
//! The same layer serves axum's routers and tonic's server.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use hyper::body::{Body as HttpBody, Frame, SizeHint};

use super::connections::{ConnHandle, RequestGuard};

/// The tower layer that counts every request on its connection (found in the request's
/// extensions as a [`ConnHandle`]) until its response body ends, and pins an upgraded one.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrackRequests;

impl<S> tower::Layer<S> for TrackRequests {
    type Service = Tracked<S>;

    fn layer(&self, inner: S) -> Tracked<S> {
        Tracked(inner)
    }
}

#[derive(Clone, Debug)]
pub struct Tracked<S>(S);

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for Tracked<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<GuardedBody<R>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let guard = request
            .extensions()
            .get::<ConnHandle>()
            .map(|c| c.0.request_started());
        let response = self.0.call(request);
        Box::pin(async move {
            let response = response.await?;
            if response.status() == http::StatusCode::SWITCHING_PROTOCOLS
                && let Some(guard) = &guard
            {
                guard.pin();
            }
            Ok(response.map(|inner| GuardedBody { inner, guard }))
        })
    }
}

/// A response body that keeps its request counted as in flight until it ends or is dropped.
#[derive(Debug)]
pub struct GuardedBody<B> {
    inner: B,
    guard: Option<RequestGuard>,
}

impl<B: HttpBody + Unpin> HttpBody for GuardedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
