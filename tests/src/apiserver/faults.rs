//! Fault injection and the request log, driven through `/_test/…` on the same server (never
//! part of the Kubernetes API): answer 503 to everything, delay every request, drop every open
//! watch, compact the history now, restart with fresh resourceVersions; and a bounded log of
//! the API requests served (method, path, query) for tests and benchmarks to count.

use std::{
    collections::VecDeque,
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// One API request as received, with the status it was answered with (for a watch, the
/// status its stream started with).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    pub code: u16,
    /// The client's `User-Agent` header (empty without one).
    #[serde(default)]
    pub user_agent: String,
    /// When it arrived, in milliseconds since the server started (before any injected delay).
    #[serde(default)]
    pub received_ms: u64,
}

/// The last requests (bounded) and how many there were in all.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RequestLog {
    pub total: u64,
    pub requests: VecDeque<LoggedRequest>,
}

/// How many requests the log keeps; `total` counts on past it.
const LOG_LIMIT: usize = 100_000;

pub struct Faults {
    unavailable: AtomicBool,
    delay_ms: AtomicU64,
    /// Bumped to end every open watch.
    watch_epoch: watch::Sender<u64>,
    /// Bumped to take the server down (listener closed, connections cut) for `outage_ms`.
    outage_epoch: watch::Sender<u64>,
    outage_ms: AtomicU64,
    log: Mutex<RequestLog>,
    started: Instant,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            unavailable: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
            watch_epoch: watch::channel(0).0,
            outage_epoch: watch::channel(0).0,
            outage_ms: AtomicU64::new(0),
            log: Mutex::new(RequestLog::default()),
            started: Instant::now(),
        }
    }
}

impl Faults {
    pub fn set_unavailable(&self, on: bool) {
        self.unavailable.store(on, Ordering::SeqCst);
    }

    pub fn unavailable(&self) -> bool {
        self.unavailable.load(Ordering::SeqCst)
    }

    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(Ordering::SeqCst))
    }

    /// Ends every open watch (their clients see the stream end and re-watch).
    pub fn drop_watches(&self) {
        self.watch_epoch.send_modify(|e| *e += 1);
    }

    /// What a watch listens on to learn it was dropped.
    pub fn watch_dropped(&self) -> watch::Receiver<u64> {
        self.watch_epoch.subscribe()
    }

    /// Takes the server down for `duration`: its port refuses connections and every open
    /// connection (watches included) is cut, as when the process is gone; then it listens again
    /// on the same port with the same state.
    pub fn go_down(&self, duration: Duration) {
        self.outage_ms.store(
            u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
        self.outage_epoch.send_modify(|e| *e += 1);
    }

    /// What the listener and the connections watch to learn of an outage.
    pub fn outages(&self) -> watch::Receiver<u64> {
        self.outage_epoch.subscribe()
    }

    /// How long the latest outage lasts.
    pub fn outage(&self) -> Duration {
        Duration::from_millis(self.outage_ms.load(Ordering::SeqCst))
    }

    /// Milliseconds since the server started, for [`LoggedRequest::received_ms`].
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn record(&self, request: LoggedRequest) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.total += 1;
        log.requests.push_back(request);
        while log.requests.len() > LOG_LIMIT {
            log.requests.pop_front();
        }
    }

    /// The log as JSON (`{"total": n, "requests": [...]}`).
    pub fn log_json(&self) -> serde_json::Value {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        serde_json::to_value(&*log).unwrap_or_default()
    }

    pub fn clear_log(&self) {
        *self.log.lock().unwrap_or_else(|p| p.into_inner()) = RequestLog::default();
    }
}
