//! What the benchmarks that run pods share: one `swiftlet run` per measurement (`agent`), the
//! node as a user sees it through the read-only port (`http`), the runtime's clean-up over CRI
//! (`cri`) and the pod cgroups left behind (`cgroups`).

pub mod agent;
pub mod cgroups;
pub mod cri;
pub mod http;
pub mod manifests;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

use self::{agent::Agent, cri::Cri};

/// The namespace of every benchmark pod: what the CRI clean-up selects on
/// (`io.kubernetes.pod.namespace`), so it never touches another pod.
pub const NAMESPACE: &str = "swiftlet-bench";

/// `--node-name` of the benchmarks' swiftlet; static pod names get it as a suffix.
pub const NODE_NAME: &str = "bench";

/// The local image xtask imports into its containerd (never pulled).
pub const IMAGE: &str = "localhost/swiftlet/busybox:latest";

/// A static pod's manifest up to its `containers:` key: in [`NAMESPACE`], labelled `app: {app}`,
/// with no grace period (swiftlet then waits its minimum of 2 s for a container that ignores
/// SIGTERM), so that teardowns between measurements stay short. The containers' list follows.
pub fn pod_header(name: &str, app: &str, restart_policy: &str) -> String {
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
           containers:\n"
    )
}

/// A static pod of one busybox `sleep 3600` container (see [`pod_header`]). `sleep` is the
/// container's PID 1 and ignores SIGTERM: swiftlet waits its minimum of 2 s.
pub fn sleep_pod(name: &str, app: &str, restart_policy: &str) -> String {
    format!(
        "{}    - name: sleep\n      \
               image: {IMAGE}\n      \
               imagePullPolicy: Never\n      \
               command: [\"sleep\", \"3600\"]\n",
        pod_header(name, app, restart_policy)
    )
}

/// A static pod of one busybox container `main` running `sh -c script` (see [`pod_header`] and
/// [`shell_container`]).
pub fn shell_pod(
    name: &str,
    app: &str,
    restart_policy: &str,
    resources: &str,
    script: &str,
) -> String {
    pod_header(name, app, restart_policy) + &shell_container("main", resources, script)
}

/// One entry of a pod's `containers:` list: busybox running `sh -c script`, with `resources`
/// (YAML lines at the container's keys' indentation, or nothing).
pub fn shell_container(name: &str, resources: &str, script: &str) -> String {
    format!(
        "    - name: {name}\n      \
           image: {IMAGE}\n      \
           imagePullPolicy: Never\n\
         {resources}      \
           command: [\"sh\", \"-c\", {script:?}]\n"
    )
}

/// How often [`wait_running`], [`wait_unlisted`] and [`wait_removed`] look again: starts and
/// teardowns are not measured, so they need not be fast.
const TEARDOWN_POLL: Duration = Duration::from_millis(100);

/// Polls `/pods` of `agent` until every pod of `names` runs; their containers' ids (each pod's
/// first). Fails, with the end of swiftlet's log, when they do not within `timeout`.
pub async fn wait_running(
    agent: &Agent,
    names: &[String],
    timeout: Duration,
) -> Result<Vec<String>> {
    let deadline = Instant::now() + timeout;
    loop {
        let listed = http::list(&http::get(agent.port, "/pods").await?)?;
        let running: Option<Vec<String>> = names
            .iter()
            .map(|n| {
                listed
                    .get(n)
                    .filter(|p| p.running)
                    .and_then(|p| p.container_ids.first().cloned())
            })
            .collect();
        if let Some(ids) = running {
            return Ok(ids);
        }
        if Instant::now() >= deadline {
            let up = names
                .iter()
                .filter(|n| listed.get(*n).is_some_and(|p| p.running))
                .count();
            bail!(
                "{up} of {} pods ran within {timeout:?}; the end of swiftlet's log:\n{}",
                names.len(),
                agent.log_tail()
            );
        }
        tokio::time::sleep(TEARDOWN_POLL).await;
    }
}

/// Waits until the swiftlet on `port` no longer lists the pods `names` in `/pods`. Whether that
/// happened within `timeout`.
pub async fn wait_unlisted(port: u16, names: &[String], timeout: Duration) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let listed = http::list(&http::get(port, "/pods").await?)?;
        if !names.iter().any(|n| listed.contains_key(n)) {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(TEARDOWN_POLL).await;
    }
}

/// Waits until the swiftlet on `port` no longer lists the pods `names` in `/pods` and the
/// runtime has no sandbox of the benchmark left. Whether that happened within `timeout`.
pub async fn wait_removed(
    port: u16,
    cri: &mut Cri,
    names: &[String],
    timeout: Duration,
) -> Result<bool> {
    let deadline = Instant::now() + timeout;
    if !wait_unlisted(port, names, timeout).await? {
        return Ok(false);
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

/// Clears every pod of the benchmark from the runtime, then the cgroup folder `cgroup_root` of a
/// benchmark whose agents have a cgroup root of their own (see [`cgroups::remove_root`]). How
/// many sandboxes and containers there were.
pub async fn clear_with_root(cri: &mut Cri, cgroup_root: &str) -> Result<usize> {
    let cleared = cri.clear().await?;
    cgroups::remove_root(cgroup_root);
    Ok(cleared.found)
}

/// A fresh private folder for one configuration of benchmark `bench`, removed when dropped
/// (also when an interrupt drops the run midway).
pub struct WorkDir(pub PathBuf);

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

    /// [`WorkDir::new`] with the folders of a swiftlet's static pods in it: [`WorkDir::staging`]
    /// and [`WorkDir::manifests`].
    pub fn with_manifests(bench: &str, label: &str) -> Result<WorkDir> {
        use anyhow::Context as _;
        let dir = WorkDir::new(bench, label)?;
        for d in [dir.staging(), dir.manifests()] {
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        Ok(dir)
    }

    /// Where manifests are written before they are renamed into [`WorkDir::manifests`].
    pub fn staging(&self) -> PathBuf {
        self.0.join("staging")
    }

    /// swiftlet's `--manifests`.
    pub fn manifests(&self) -> PathBuf {
        self.0.join("manifests")
    }

    /// Writes a config file that gives swiftlet the cgroup root `root` (`cgroupRoot`), for a
    /// benchmark whose pods keep apart from everything else's; its path, for `--config`.
    pub fn cgroup_root_config(&self, root: &str) -> Result<PathBuf> {
        use anyhow::Context as _;
        let config = self.0.join("config.yaml");
        std::fs::write(&config, format!("cgroupRoot: {root}\n"))
            .with_context(|| format!("writing {}", config.display()))?;
        Ok(config)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
