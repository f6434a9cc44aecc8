//! How many connections a listener holds, and for how long: every accepted connection takes a
//! [`Slot`] under its listener's limit, its I/O goes through [`TrackedIo`] (which closes it when
//! evicted, idle too long or stalled on a client that stopped reading), and every request on it
//! is counted by `track_requests::TrackRequests` for as long as its response body lives.
//!
//! The policy at the limit: a new connection evicts the oldest one that has not sent a request
//! yet, else the oldest with no request in flight; only when every connection is busy is the new
//! one refused. A flood of idle connections therefore costs its sender its own oldest
//! connections, never a client that asks something: a real client sends its request within a
//! round trip of connecting, so it is never the oldest idle one for long, while the cap bounds
//! the descriptors and buffers a flood can pin. Deadlines (the TLS handshake, the request
//! headers, idleness) close what a flood leaves below the limit.
//!
//! Upgraded connections (exec, attach, port-forward: `101 Switching Protocols`) are pinned:
//! never evicted, never timed out here (the session is the user's).
//!
//! Not here: the accept loops (`listener.rs`, and tonic's for the gRPC socket). Upstream: Go's
//! `http.Server` has timeouts but no connection limit (the kubelet relies on `maxOpenFiles`);
//! the policy is swiftlet's.

use crate::lock::MutexExt as _;
use std::{
    collections::BTreeMap,
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::metrics::ServerMetrics;

/// The deadlines [`TrackedIo`] enforces itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoTimeouts {
    /// A connection with no request in flight for this long (counted from its accept and from
    /// the end of its last request) is closed. `None` where the protocol does it (HTTP/1's
    /// header read timeout, which also runs between requests).
    pub idle: Option<Duration>,
    /// A connection whose writes made no progress for this long (its client stopped reading) is
    /// closed.
    pub write_stall: Duration,
}

/// One connection's state, shared by its I/O, its requests and its listener's [`Tracker`].
#[derive(Debug)]
pub struct Conn {
    id: u64,
    /// Requests seen (0: it has not asked anything yet).
    requests: AtomicU64,
    /// Requests in flight (until their response body ends).
    active: AtomicUsize,
    /// Upgraded to another protocol: never evicted, never timed out.
    pinned: AtomicBool,
    /// When it last had no request in flight, in ms since `epoch`.
    idle_since_ms: AtomicU64,
    epoch: Instant,
    kill: CancellationToken,
}

impl Conn {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A request began on this connection; it counts as in flight until the guard drops.
    pub fn request_started(self: &Arc<Self>) -> RequestGuard {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::AcqRel);
        RequestGuard(self.clone())
    }

    /// The connection now carries an upgraded protocol.
    pub fn pin(&self) {
        self.pinned.store(true, Ordering::Release);
    }

    fn is_pinned(&self) -> bool {
        self.pinned.load(Ordering::Acquire)
    }

    fn is_idle(&self) -> bool {
        self.active.load(Ordering::Acquire) == 0 && !self.is_pinned()
    }

    fn never_asked(&self) -> bool {
        self.requests.load(Ordering::Relaxed) == 0
    }

    /// Fires when the connection was evicted (or its listener closes it).
    pub fn killed(&self) -> WaitForCancellationFutureOwned {
        self.kill.clone().cancelled_owned()
    }

    /// When it stops being idle-timed: `None` while a request is in flight.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        if !self.is_idle() {
            return None;
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Some(self.epoch + since + idle)
    }
}

/// A request in flight; its end makes the connection idle again (if no other is in flight).
#[derive(Debug)]
pub struct RequestGuard(Arc<Conn>);

impl RequestGuard {
    /// The request upgraded the connection.
    pub fn pin(&self) {
        self.0.pin();
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0
            .idle_since_ms
            .store(self.0.now_ms(), Ordering::Release);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A listener's connections under its limit.
pub struct Tracker {
    listener: &'static str,
    max: usize,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    epoch: Instant,
    metrics: ServerMetrics,
}

impl Tracker {
    /// A tracker for `listener` (the metrics label) allowing `max` connections at once.
    pub fn new(listener: &'static str, max: usize, metrics: ServerMetrics) -> Arc<Tracker> {
        metrics.open.with_label_values(&[listener]).set(0);
        metrics
            .limit
            .with_label_values(&[listener])
            .set(gauge(max.max(1)));
        for counter in [
            &metrics.accepted,
            &metrics.evicted,
            &metrics.refused,
            &metrics.timed_out,
        ] {
            counter.with_label_values(&[listener]).inc_by(0);
        }
        Arc::new(Tracker {
            listener,
            max: max.max(1),
            conns: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
            metrics,
        })
    }

    pub fn listener(&self) -> &'static str {
        self.listener
    }

    pub fn max_connections(&self) -> usize {
        self.max
    }

    /// Connections holding a slot now.
    pub fn open(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.conns.lock_unpoisoned()
    }

    /// A slot for a new connection: at the limit, the oldest connection that never asked
    /// anything is evicted, else the oldest idle one; `None` when every connection is busy.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let label = [self.listener];
        let mut conns = self.lock();
        if conns.len() >= self.max {
            let victim = conns
                .values()
                .find(|c| c.never_asked() && c.is_idle())
                .or_else(|| conns.values().find(|c| c.is_idle()))
                .map(|c| c.id);
            match victim.and_then(|id| conns.remove(&id)) {
                Some(victim) => {
                    victim.kill.cancel();
                    self.metrics.evicted.with_label_values(&label).inc();
                }
                None => {
                    self.metrics.refused.with_label_values(&label).inc();
                    return None;
                }
            }
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            requests: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            pinned: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(
                u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX),
            ),
            epoch: self.epoch,
            kill: CancellationToken::new(),
        });
        conns.insert(id, conn.clone());
        self.metrics.accepted.with_label_values(&label).inc();
        self.metrics
            .open
            .with_label_values(&label)
            .set(gauge(conns.len()));
        Some(Slot {
            conn,
            tracker: self.clone(),
        })
    }

    /// Counts a connection closed for a missed deadline.
    pub fn timed_out(&self) {
        self.metrics
            .timed_out
            .with_label_values(&[self.listener])
            .inc();
    }

    fn release(&self, id: u64) {
        let mut conns = self.lock();
        if conns.remove(&id).is_some() {
            self.metrics
                .open
                .with_label_values(&[self.listener])
                .set(gauge(conns.len()));
        }
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A connection's place under its listener's limit, freed when dropped.
pub struct Slot {
    conn: Arc<Conn>,
    tracker: Arc<Tracker>,
}

impl Slot {
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.tracker.release(self.conn.id);
    }
}

/// A connection's handle in its requests' extensions (tonic: its `ConnectInfo`).
#[derive(Clone, Debug)]
pub struct ConnHandle(pub Arc<Conn>);

/// A connection's I/O under its slot: reads and writes fail once it is evicted, once it was idle
/// for [`IoTimeouts::idle`], or once a write made no progress for [`IoTimeouts::write_stall`].
/// Dropping it closes the connection and frees the slot.
pub struct TrackedIo<T> {
    inner: T,
    slot: Slot,
    timeouts: IoTimeouts,
    killed: Pin<Box<WaitForCancellationFutureOwned>>,
    idle: Option<Pin<Box<Sleep>>>,
    stall: Option<Pin<Box<Sleep>>>,
}

impl<T> TrackedIo<T> {
    pub fn new(inner: T, slot: Slot, timeouts: IoTimeouts) -> TrackedIo<T> {
        let killed = Box::pin(slot.conn.killed());
        let idle = timeouts.idle.map(|idle| Box::pin(tokio::time::sleep(idle)));
        TrackedIo {
            inner,
            slot,
            timeouts,
            killed,
            idle,
            stall: None,
        }
    }

    pub fn handle(&self) -> ConnHandle {
        ConnHandle(self.slot.conn.clone())
    }

    /// Why the connection must end now, if it must; otherwise the timers are armed with `cx`.
    fn closed(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.killed.as_mut().poll(cx).is_ready() {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection evicted at the listener's limit",
            ));
        }
        let (Some(idle), Some(sleep)) = (self.timeouts.idle, self.idle.as_mut()) else {
            return None;
        };
        loop {
            if sleep.as_mut().poll(cx).is_pending() {
                return None;
            }
            let conn = &self.slot.conn;
            match conn.idle_deadline(idle) {
                Some(deadline) if deadline <= Instant::now() => {
                    self.slot.tracker.timed_out();
                    return Some(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "connection idle for too long",
                    ));
                }
                Some(deadline) => sleep.as_mut().reset(deadline),
                None => sleep.as_mut().reset(Instant::now() + idle),
            }
        }
    }

    /// After a write attempt: a pending one arms the stall timer, progress disarms it.
    fn stalled<R>(&mut self, cx: &mut Context<'_>, poll: Poll<R>) -> Poll<io::Result<R>> {
        match poll {
            Poll::Ready(r) => {
                self.stall = None;
                Poll::Ready(Ok(r))
            }
            Poll::Pending if self.slot.conn.is_pinned() => Poll::Pending,
            Poll::Pending => {
                let limit = self.timeouts.write_stall;
                let timer = self
                    .stall
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if timer.as_mut().poll(cx).is_ready() {
                    self.slot.tracker.timed_out();
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading",
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TrackedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(e) = this.closed(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TrackedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(e) = this.closed(cx) {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(n)) => this.stalled(cx, Poll::Ready(n)),
            Poll::Pending => this.stalled(cx, Poll::<usize>::Pending),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if let Some(e) = this.closed(cx) {
            return Poll::Ready(Err(e));
        }
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(n)) => this.stalled(cx, Poll::Ready(n)),
            Poll::Pending => this.stalled(cx, Poll::<usize>::Pending),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => this.stalled(cx, Poll::Ready(())),
            Poll::Pending => this.stalled(cx, Poll::<()>::Pending),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T> tonic::transport::server::Connected for TrackedIo<T> {
    type ConnectInfo = ConnHandle;

    fn connect_info(&self) -> ConnHandle {
        self.handle()
    }
}

#[cfg(test)]
mod tests;
