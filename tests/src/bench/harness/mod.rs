//! What the benchmarks that run pods share: one `swiftlet run` per measurement (`agent`), the
//! node as a user sees it through the read-only port (`http`), the runtime's clean-up over CRI
//! (`cri`) and the pod cgroups left behind (`cgroups`).

pub mod agent;
pub mod cgroups;
pub mod cri;
pub mod http;
pub mod manifests;

use std::time::{Duration, Instant};

use anyhow::Result;

use self::cri::Cri;

/// The namespace of every benchmark pod: what the CRI clean-up selects on
/// (`io.kubernetes.pod.namespace`), so it never touches another pod.
pub const NAMESPACE: &str = "swiftlet-bench";

/// `--node-name` of the benchmarks' swiftlet; static pod names get it as a suffix.
pub const NODE_NAME: &str = "bench";

/// The local image xtask imports into its containerd (never pulled).
pub const IMAGE: &str = "localhost/swiftlet/busybox:latest";

/// A static pod of one busybox `sleep 3600` container in [`NAMESPACE`], labelled `app: {app}`.
/// `sleep` is the container's PID 1 and ignores SIGTERM, so the grace period is 0 (swiftlet then
/// waits its minimum of 2 s): teardowns between measurements stay short.
pub fn sleep_pod(name: &str, app: &str, restart_policy: &str) -> String {
    format!(
        "apiVersion: v1\n\
         kind: Pod\n\
         metadata:\n  \
           name: {name}\n  \
           namespace: {NAMESPACE}\n  \
           labels:\n    \
             app: {app}\n\
         spec:\n  \
           restartPolicy: {restart_policy}\n  \
           terminationGracePeriodSeconds: 0\n  \
           containers:\n    \
             - name: sleep\n      \
               image: {IMAGE}\n      \
               imagePullPolicy: Never\n      \
               command: [\"sleep\", \"3600\"]\n"
    )
}

/// How often [`wait_removed`] looks again: teardowns are not measured, so it need not be fast.
const TEARDOWN_POLL: Duration = Duration::from_millis(100);

/// Waits until the swiftlet on `port` no longer lists the pods `names` in `/pods` and the
/// runtime has no sandbox of the benchmark left. Whether that happened within `timeout`.
pub async fn wait_removed(
    port: u16,
    cri: &mut Cri,
    names: &[String],
    timeout: Duration,
) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let listed = http::list(&http::get(port, "/pods").await?)?;
        if !names.iter().any(|n| listed.contains_key(n)) {
            break;
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(TEARDOWN_POLL).await;
    }
    loop {
        if cri.sandboxes().await?.is_empty() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(TEARDOWN_POLL).await;
    }
}

/// A fresh private folder for one configuration of benchmark `bench`, removed when dropped
/// (also when an interrupt drops the run midway).
pub struct WorkDir(pub std::path::PathBuf);

impl WorkDir {
    pub fn new(bench: &str, label: &str) -> Result<WorkDir> {
        use anyhow::Context as _;
        let dir = std::env::temp_dir().join(format!(
            "swiftlet-bench-{bench}-{}-{label}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(WorkDir(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
