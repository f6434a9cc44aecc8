//! When the last graceful shutdown began and ended: upstream's two gauges
//! (`kubelet_graceful_shutdown_start_time_seconds`, `kubelet_graceful_shutdown_end_time_seconds`),
//! and the state file that carries them across the reboot (upstream `storage.go`:
//! `<rootDir>/graceful_node_shutdown_state`, JSON `{"startTime": …, "endTime": …}`).

use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;
use prometheus::{Gauge, Registry};
use serde::{Deserialize, Serialize};

/// Upstream `localStorageStateFile`.
pub const STATE_FILE: &str = "graceful_node_shutdown_state";
/// The state file is a few dozen bytes; anything much larger is not ours.
const STATE_MAX_BYTES: u64 = 4096;
/// Go's zero `time.Time`, which upstream writes for an end not reached yet.
const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

#[derive(Clone)]
pub struct ShutdownMetrics {
    pub start_time: Gauge,
    pub end_time: Gauge,
    /// Where the state file is kept (the root dir); `None` keeps none (tests).
    root_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    #[serde(default)]
    start_time: String,
    #[serde(default)]
    end_time: String,
}

impl ShutdownMetrics {
    pub fn register(
        registry: &Registry,
        root_dir: Option<&Path>,
    ) -> Result<ShutdownMetrics, prometheus::Error> {
        let start_time = Gauge::new(
            "kubelet_graceful_shutdown_start_time_seconds",
            "Last graceful shutdown start time since unix epoch in seconds",
        )?;
        let end_time = Gauge::new(
            "kubelet_graceful_shutdown_end_time_seconds",
            "Last graceful shutdown end time since unix epoch in seconds",
        )?;
        registry.register(Box::new(start_time.clone()))?;
        registry.register(Box::new(end_time.clone()))?;
        Ok(ShutdownMetrics {
            start_time,
            end_time,
            root_dir: root_dir.map(Path::to_owned),
        })
    }

    /// The gauges from the state file an earlier run left (upstream `setMetrics`).
    pub fn restore(&self) {
        let Some(dir) = &self.root_dir else { return };
        let path = dir.join(STATE_FILE);
        let text = match read_bounded(dir, &path) {
            Ok(Some(text)) => text,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the graceful shutdown state");
                return;
            }
        };
        match serde_json::from_str::<State>(&text) {
            Ok(state) => {
                if let Some(t) = unix_seconds(&state.start_time) {
                    self.start_time.set(t);
                }
                if let Some(t) = unix_seconds(&state.end_time) {
                    self.end_time.set(t);
                }
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "the graceful shutdown state is not the JSON swiftlet writes")
            }
        }
    }

    /// The shutdown began at `now`: the end gauge goes back to 0 until it ends.
    pub fn began(&self, now: Timestamp) {
        self.start_time.set(seconds(now));
        self.end_time.set(0.0);
        self.store(&State {
            start_time: now.to_string(),
            end_time: GO_ZERO_TIME.to_owned(),
        });
    }

    /// The shutdown that began at `began` ended at `now`.
    pub fn ended(&self, began: Timestamp, now: Timestamp) {
        self.end_time.set(seconds(now));
        self.store(&State {
            start_time: began.to_string(),
            end_time: now.to_string(),
        });
    }

    fn store(&self, state: &State) {
        let Some(dir) = &self.root_dir else { return };
        let written = serde_json::to_vec(state)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                crate::hostfs::Dir::open(dir)
                    .and_then(|d| d.replace_file(STATE_FILE.as_ref(), &bytes, 0o600))
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = written {
            tracing::warn!(dir = %dir.display(), error = e, "cannot store the graceful shutdown state");
        }
    }
}

/// The state file's text, read through the root dir's descriptor (no link followed); `None`
/// when there is none.
fn read_bounded(dir: &Path, path: &Path) -> Result<Option<String>, String> {
    use std::io::Read as _;
    let dir = crate::hostfs::Dir::open(dir).map_err(|e| e.to_string())?;
    let file = match dir.open_file(Path::new(STATE_FILE)) {
        Ok(file) => file,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut text = String::new();
    file.take(STATE_MAX_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(text))
}

fn seconds(t: Timestamp) -> f64 {
    t.as_second() as f64
}

/// An RFC 3339 time as Unix seconds; `None` for Go's zero time or anything unreadable.
fn unix_seconds(text: &str) -> Option<f64> {
    let t: Timestamp = text.parse().ok()?;
    (t.as_second() > 0).then(|| seconds(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_survives_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let began: Timestamp = "2026-11-27T21:00:00Z".parse().expect("time");
        let ended: Timestamp = "2026-11-27T21:00:30Z".parse().expect("time");
        let first = ShutdownMetrics::register(&Registry::new(), Some(dir.path())).expect("metrics");
        first.began(began);
        assert_eq!(first.end_time.get(), 0.0);
        first.ended(began, ended);
        let text = std::fs::read_to_string(dir.path().join(STATE_FILE)).expect("state file");
        assert!(
            text.contains("\"startTime\":\"2026-11-27T21:00:00Z\""),
            "{text}"
        );

        let second =
            ShutdownMetrics::register(&Registry::new(), Some(dir.path())).expect("metrics");
        second.restore();
        assert_eq!(second.start_time.get(), began.as_second() as f64);
        assert_eq!(second.end_time.get(), ended.as_second() as f64);
    }

    #[test]
    fn an_unfinished_shutdown_leaves_the_end_at_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join(STATE_FILE),
            format!(r#"{{"startTime":"2026-11-27T21:00:00Z","endTime":"{GO_ZERO_TIME}"}}"#),
        )
        .expect("write");
        let m = ShutdownMetrics::register(&Registry::new(), Some(dir.path())).expect("metrics");
        m.restore();
        assert!(m.start_time.get() > 0.0);
        assert_eq!(m.end_time.get(), 0.0);
    }
}
