//! The client-side rate limit of the agent's API requests (`kubeAPIQPS`, `kubeAPIBurst`): a token
//! bucket shared by every request of one client, as client-go's `rest.Config` builds one
//! (`flowcontrol.NewTokenBucketRateLimiter(qps, burst)`, on `golang.org/x/time/rate`): the bucket
//! starts full with `burst` tokens, refills at `qps` a second, and a request waits for its token in
//! the order it asked. A watch costs one token when it starts, as in client-go.
//!
//! The wait happens in `poll_ready`, behind kube's request buffer (a `tower::Buffer` of 1,024):
//! callers queue there, bounded, instead of each holding a timer. A token is reserved before the
//! wait (the bucket may go below zero), so requests are served first come, first served and the
//! bucket never grants more than `burst + qps × t` in any `t`.
//!
//! Not here: which clients are limited (the heartbeat client is not, as upstream's: `client.rs`).

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// A token bucket: `burst` tokens at most, `qps` added a second.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<Tokens>,
}

#[derive(Debug)]
struct Tokens {
    /// May go below zero: tokens reserved by requests still waiting.
    available: f64,
    at: Instant,
}

/// How long a wait may be before it is logged (client-go logs waits over 1 s at its default
/// verbosity: `extraLongThrottleLatency`).
const LONG_WAIT: Duration = Duration::from_secs(1);

impl TokenBucket {
    /// client-go's meaning of the numbers: `qps` 0 stands for its default of 5 and `burst` 0 for
    /// 10 (`rest.DefaultQPS`, `rest.DefaultBurst`); a burst below one allows one request.
    pub fn new(qps: u32, burst: u32) -> TokenBucket {
        let qps = if qps == 0 { 5.0 } else { f64::from(qps) };
        let burst = if burst == 0 { 10.0 } else { f64::from(burst) };
        TokenBucket {
            qps,
            burst: burst.max(1.0),
            state: Mutex::new(Tokens {
                available: burst.max(1.0),
                at: Instant::now(),
            }),
        }
    }

    /// Takes one token now, returning how long its holder must wait before using it.
    pub fn reserve(&self) -> Duration {
        let now = Instant::now();
        // A poisoned lock only means another request panicked while holding plain numbers.
        let mut tokens = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(tokens.at).as_secs_f64();
        tokens.available = (tokens.available + elapsed * self.qps).min(self.burst);
        tokens.at = now;
        tokens.available -= 1.0;
        if tokens.available >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-tokens.available / self.qps)
        }
    }
}

/// Limits a service's requests by a shared [`TokenBucket`].
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    bucket: Arc<TokenBucket>,
}

impl RateLimitLayer {
    pub fn new(bucket: Arc<TokenBucket>) -> Self {
        RateLimitLayer { bucket }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            state: State::Idle,
        }
    }
}

pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
    state: State,
}

enum State {
    /// No token held.
    Idle,
    /// A token reserved, usable once the timer fires.
    Waiting(Pin<Box<Sleep>>),
    /// A token held for the next call.
    Ready,
}

impl<S, Request> Service<Request> for RateLimit<S>
where
    S: Service<Request>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match &mut self.state {
                State::Idle => {
                    let wait = self.bucket.reserve();
                    if wait.is_zero() {
                        self.state = State::Ready;
                    } else {
                        if wait >= LONG_WAIT {
                            tracing::info!(
                                wait = ?wait,
                                "API request waiting for client-side throttling (kubeAPIQPS, kubeAPIBurst)"
                            );
                        }
                        self.state = State::Waiting(Box::pin(tokio::time::sleep(wait)));
                    }
                }
                State::Waiting(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.state = State::Ready;
                }
                State::Ready => return self.inner.poll_ready(cx),
            }
        }
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The token is spent by this call; tower's contract has `poll_ready` before each call.
        self.state = State::Idle;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tower::{ServiceExt as _, service_fn};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_grants_its_burst_then_qps() {
        let bucket = TokenBucket::new(2, 3);
        for _ in 0..3 {
            assert_eq!(bucket.reserve(), Duration::ZERO);
        }
        // The fourth and fifth wait half a second each, in order.
        assert_eq!(bucket.reserve(), Duration::from_millis(500));
        assert_eq!(bucket.reserve(), Duration::from_millis(1000));
        tokio::time::advance(Duration::from_secs(10)).await;
        // Refilled to the burst, not beyond.
        for _ in 0..3 {
            assert_eq!(bucket.reserve(), Duration::ZERO);
        }
        assert!(bucket.reserve() > Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_means_client_go_defaults() {
        let bucket = TokenBucket::new(0, 0);
        for _ in 0..10 {
            assert_eq!(bucket.reserve(), Duration::ZERO);
        }
        assert_eq!(bucket.reserve(), Duration::from_millis(200));
    }

    #[tokio::test(start_paused = true)]
    async fn requests_beyond_the_burst_wait_for_their_tokens() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let inner = service_fn(move |()| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::convert::Infallible>(()) }
        });
        let layer = RateLimitLayer::new(Arc::new(TokenBucket::new(1, 2)));
        let mut service = layer.layer(inner);
        let started = Instant::now();
        for _ in 0..5 {
            service
                .ready()
                .await
                .expect("ready")
                .call(())
                .await
                .expect("called");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 5);
        // Two at once, then one a second: the fifth after three seconds of (paused) time.
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }
}
