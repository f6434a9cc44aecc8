//! Reloading the kubelet server's `tlsCertFile`/`tlsPrivateKeyFile` pair and its
//! `authentication.x509.clientCAFile` when they change on disk, without a restart: inotify on
//! the directories that hold them (not the files: editors, cert-manager and `kubectl cp`
//! replace a file by rename, and Kubernetes' atomic writer swaps a `..data` symlink in the
//! directory), plus a re-check every minute as the safety net for lost events and replaced
//! directories. Each check reads the files again by the paths the operator gave (following
//! their symlinks, as upstream does) and acts only when their bytes changed.
//!
//! A new pair that does not parse, or whose key does not match its certificate, and a client CA
//! file that does not parse, leave the server as it was: a warning names the file and why, once
//! per distinct problem, and an error counter goes up; the next change is tried again. The
//! self-signed pair is not watched (nothing else writes it). Upstream:
//! `dynamiccertificates.DynamicCertKeyPairContent` and `DynamicFileCAContent`
//! (`staging/src/k8s.io/apiserver/pkg/server/dynamiccertificates/`: fsnotify on the file plus
//! `wait.Until(..., 1*time.Minute)`, keep the last good content on a load error), used by the
//! kubelet through `DynamicServingCertificateController` for its serving pair and client CA.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use inotify::{EventMask, EventStream, Inotify, WatchMask};
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::hostfs::{self, BurstEnd};

use super::tls::{
    CLIENT_CA, PairBytes, PairFields, ServerTls, TlsError, certified_key, read_bounded, read_pair,
};

/// Upstream's periodic re-check of certificate and CA files.
pub const RECHECK_PERIOD: Duration = Duration::from_secs(60);
/// Quiet time that ends a burst of directory events (a rename of the certificate followed by
/// the key's is one change).
const DEBOUNCE: Duration = Duration::from_millis(100);
/// A burst is cut off after this long, so a busy directory still gets checked.
const MAX_BURST: Duration = Duration::from_secs(1);

/// The reload counters and the served certificate's expiry.
#[derive(Clone)]
pub struct ReloadMetrics {
    pub reloads: IntCounterVec,
    pub errors: IntCounterVec,
    pub not_after: IntGauge,
}

impl ReloadMetrics {
    pub fn register(registry: &Registry) -> Result<ReloadMetrics, prometheus::Error> {
        let reloads = IntCounterVec::new(
            Opts::new(
                "swiftlet_server_certificate_reloads_total",
                "Changed files the kubelet server took up without a restart, by content \
                 (serving_certificate, client_ca).",
            ),
            &["content"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "swiftlet_server_certificate_reload_errors_total",
                "Changed files the kubelet server refused (unreadable, unparsable, a key that \
                 does not match its certificate) and kept serving the previous content, by \
                 content (serving_certificate, client_ca).",
            ),
            &["content"],
        )?;
        let not_after = IntGauge::new(
            "swiftlet_server_certificate_not_after_seconds",
            "The notAfter time (Unix seconds) of the certificate the kubelet server loaded \
             from tlsCertFile last.",
        )?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(not_after.clone()))?;
        Ok(ReloadMetrics {
            reloads,
            errors,
            not_after,
        })
    }
}

/// One watched content: its files, the bytes now served, the last problem reported.
struct Watched<T> {
    files: T,
    served: Vec<Vec<u8>>,
    problem: Option<String>,
}

/// Watches the configured pair and client CA file of one [`ServerTls`] and swaps in what
/// changed; built by [`ServerTls::load`] and [`ServerTls::with_certificate`].
pub struct Reloader {
    tls: ServerTls,
    pair: Option<Watched<(PathBuf, PathBuf)>>,
    client_ca: Option<Watched<PathBuf>>,
    metrics: Option<ReloadMetrics>,
    period: Duration,
}

/// What one check did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    pub reloaded: usize,
    pub refused: usize,
}

impl Reloader {
    pub(super) fn new(
        tls: ServerTls,
        pair: Option<(PathBuf, PathBuf, PairBytes)>,
        client_ca: Option<(PathBuf, Vec<u8>)>,
    ) -> Reloader {
        Reloader {
            tls,
            pair: pair.map(|(cert, key, (c, k))| Watched {
                files: (cert, key),
                served: vec![c, k],
                problem: None,
            }),
            client_ca: client_ca.map(|(path, pem)| Watched {
                files: path,
                served: vec![pem],
                problem: None,
            }),
            metrics: None,
            period: RECHECK_PERIOD,
        }
    }

    /// Counts reloads and refusals in `metrics`, and sets the served certificate's expiry now.
    pub fn with_metrics(mut self, metrics: ReloadMetrics) -> Reloader {
        if self.pair.is_some()
            && let Some(leaf) = self.tls.serving().current()
            && let Some(not_after) = leaf.cert.first().and_then(|c| not_after(c))
        {
            metrics.not_after.set(not_after);
        }
        self.metrics = Some(metrics);
        self
    }

    /// The directories to watch, each once.
    fn dirs(&self) -> Vec<PathBuf> {
        let mut files: Vec<&Path> = Vec::new();
        if let Some(pair) = &self.pair {
            files.extend([pair.files.0.as_path(), pair.files.1.as_path()]);
        }
        if let Some(ca) = &self.client_ca {
            files.push(&ca.files);
        }
        let mut dirs: Vec<PathBuf> = files
            .into_iter()
            .map(|f| match f.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
                _ => PathBuf::from("."),
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// Reads the watched files and serves what changed and is sound.
    pub fn check(&mut self) -> Checked {
        let mut checked = Checked::default();
        let (tls, metrics) = (&self.tls, self.metrics.as_ref());
        if let Some(pair) = &mut self.pair {
            let (cert, key) = (&pair.files.0, &pair.files.1);
            let outcome = read_pair(PairFields::CONFIGURED, cert, key).and_then(|bytes| {
                if pair.served == [bytes.0.as_slice(), bytes.1.as_slice()] {
                    return Ok(None);
                }
                let leaf =
                    certified_key(PairFields::CONFIGURED, cert, key, &bytes, tls.provider())?;
                let serving = tls.serving();
                serving.set(leaf.clone()).map_err(|source| TlsError::Pair {
                    cert: cert.clone(),
                    key: key.clone(),
                    source,
                })?;
                if let Some(m) = metrics
                    && let Some(not_after) = leaf.cert.first().and_then(|c| not_after(c))
                {
                    m.not_after.set(not_after);
                }
                tracing::info!(cert = %cert.display(), key = %key.display(), "kubelet server: serving the changed certificate");
                Ok(Some(vec![bytes.0, bytes.1]))
            });
            record(pair, outcome, "serving_certificate", metrics, &mut checked);
        }
        if let Some(ca) = &mut self.client_ca {
            let path = &ca.files;
            let outcome = read_bounded(CLIENT_CA, path).and_then(|pem| {
                if ca.served == [pem.as_slice()] {
                    return Ok(None);
                }
                tls.set_client_ca(path, &pem)?;
                tracing::info!(file = %path.display(), "kubelet server: trusting the changed client CA file");
                Ok(Some(vec![pem]))
            });
            record(ca, outcome, "client_ca", metrics, &mut checked);
        }
        checked
    }

    /// Watches and re-checks until `shutdown` (only waits for it when nothing is watched).
    pub async fn run(mut self, shutdown: CancellationToken) {
        if self.pair.is_none() && self.client_ca.is_none() {
            return shutdown.cancelled().await;
        }
        let dirs = self.dirs();
        // Watching first, then checking: a change in between is seen by one or the other.
        let mut events = watch(&dirs);
        self.check();
        let mut tick = tokio::time::interval_at(Instant::now() + self.period, self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {
                    if events.is_none() {
                        events = watch(&dirs);
                    }
                }
                burst = next_burst(events.as_mut()) => {
                    if burst.lost {
                        // A moved or deleted directory: watch the path again (or at the tick).
                        events = watch(&dirs);
                    }
                }
            }
            self.check();
        }
    }
}

/// Keeps the outcome of one content's check: the new bytes as served, or the problem (warned
/// and counted once per distinct problem; the previous content is still served).
fn record<T>(
    watched: &mut Watched<T>,
    outcome: Result<Option<Vec<Vec<u8>>>, TlsError>,
    content: &'static str,
    metrics: Option<&ReloadMetrics>,
    checked: &mut Checked,
) {
    match outcome {
        Ok(None) => watched.problem = None,
        Ok(Some(served)) => {
            watched.served = served;
            watched.problem = None;
            checked.reloaded += 1;
            if let Some(m) = metrics {
                m.reloads.with_label_values(&[content]).inc();
            }
        }
        Err(e) => {
            let problem = e.to_string();
            if watched.problem.as_ref() != Some(&problem) {
                tracing::warn!(error = %problem, "kubelet server: keeping the previous {content}");
                checked.refused += 1;
                if let Some(m) = metrics {
                    m.errors.with_label_values(&[content]).inc();
                }
                watched.problem = Some(problem);
            }
        }
    }
}

fn not_after(der: &rustls_pki_types::CertificateDer<'_>) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

fn watch(dirs: &[PathBuf]) -> Option<EventStream<Vec<u8>>> {
    let result = (|| {
        let inotify = Inotify::init()?;
        let mask = WatchMask::CLOSE_WRITE
            | WatchMask::CREATE
            | WatchMask::DELETE
            | WatchMask::MOVED_FROM
            | WatchMask::MOVED_TO
            | WatchMask::ATTRIB
            | WatchMask::DELETE_SELF
            | WatchMask::MOVE_SELF
            | WatchMask::ONLYDIR;
        for dir in dirs {
            inotify.watches().add(dir, mask)?;
        }
        inotify.into_event_stream(vec![0; 4096])
    })();
    match result {
        Ok(stream) => Some(stream),
        Err(error) => {
            tracing::warn!(%error, ?dirs, "kubelet server: cannot watch the certificate directories; re-checking every minute");
            None
        }
    }
}

#[derive(Default)]
struct Burst {
    lost: bool,
}

/// Waits for an event (forever without a watch), then for the rest of its burst.
async fn next_burst(stream: Option<&mut EventStream<Vec<u8>>>) -> Burst {
    let Some(stream) = stream else {
        return std::future::pending().await;
    };
    let mut burst = Burst::default();
    let ended = hostfs::next_burst(stream, DEBOUNCE, MAX_BURST, |event| {
        if event
            .mask
            .intersects(EventMask::DELETE_SELF | EventMask::MOVE_SELF | EventMask::IGNORED)
        {
            burst.lost = true;
        }
    })
    .await;
    if matches!(ended, BurstEnd::Broken(_)) {
        burst.lost = true;
    }
    burst
}

#[cfg(test)]
mod tests;
