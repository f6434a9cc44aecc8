//! Helpers for swiftlet's system tests and benchmarks: the privilege gate, the container runtime
//! gate, cgroups that clean up after themselves, processes placed into them, and the paths of the
//! binaries under test.
#![expect(clippy::print_stderr, reason = "tests say why they skip")]
#![expect(
    clippy::expect_used,
    reason = "test support: a setup step that fails must fail the test, loudly"
)]

pub mod apiserver;
pub mod bench;
pub mod cgroup;
pub mod cluster;
pub mod driver;
pub mod exposition;
pub mod manifest;
pub mod node;
pub mod process;
pub mod registry;
pub mod systemd;
pub mod test_apiserver;
pub mod tls;
pub mod trusted;

use std::{path::PathBuf, time::Duration};

pub use cgroup::TestCgroup;
use swiftlet::kernel::{KernelEvent, KernelEvents, StreamItem};

/// Whether this test may touch the kernel. Outside CI, a test that is not root skips, saying why;
/// in CI (`CI` set) a privileged test that cannot run fails instead.
pub fn privileged(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{test}: privileged test cannot run: not root (CI is set, so this is a failure)");
    }
    eprintln!("skipped {test}: needs root to load eBPF programs and manage cgroups");
    false
}

/// The CRI endpoint (`unix:///…/containerd.sock`) of the runtime the system tests use:
/// `SWIFTLET_TEST_RUNTIME_ENDPOINT`, which `cargo xtask test` sets to its private containerd.
/// Unset, a test skips saying why, or fails when `CI` is set.
/// Runs `f` with a CRI client of the test's container runtime, on a runtime of its own (the
/// system tests are synchronous). For tests that look at or change the runtime behind the
/// agent's back.
pub fn with_cri<T, Fut>(test: &str, f: impl FnOnce(swiftlet::cri::GrpcRuntime) -> Fut) -> T
where
    Fut: std::future::Future<Output = T>,
{
    let endpoint = runtime_endpoint(test).expect("a runtime endpoint");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(async {
            let runtime = swiftlet::cri::GrpcRuntime::connect(
                swiftlet::cri::GrpcRuntimeConfig {
                    endpoint,
                    request_timeout: std::time::Duration::from_secs(10),
                    pull_image_timeout: None,
                },
                swiftlet::cri::RuntimeMetrics::unregistered().expect("metrics"),
            )
            .await
            .expect("connect to the runtime");
            f(runtime).await
        })
}

pub fn runtime_endpoint(test: &str) -> Option<String> {
    if let Some(endpoint) = std::env::var_os("SWIFTLET_TEST_RUNTIME_ENDPOINT") {
        return Some(endpoint.to_string_lossy().into_owned());
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{test}: SWIFTLET_TEST_RUNTIME_ENDPOINT is not set (CI is set, so this is a failure); \
             `cargo xtask test` sets it"
        );
    }
    eprintln!(
        "skipped {test}: needs a container runtime; SWIFTLET_TEST_RUNTIME_ENDPOINT is not set \
         (`sudo -E cargo xtask test` starts one, or see `cargo xtask containerd start`)"
    );
    None
}

/// Eviction thresholds for agents under test, unless the test sets its own: memory only. The
/// kubelet's default disk thresholds (`nodefs.available<10%`, `imagefs.available<15%`) would put
/// a shared test machine with a fuller disk under DiskPressure, and then every test pod is
/// rejected or evicted for reasons that have nothing to do with the test.
pub fn default_eviction_args(extra: &[impl AsRef<str>]) -> Vec<&'static str> {
    if extra
        .iter()
        .any(|a| a.as_ref().starts_with("--eviction-hard"))
    {
        return Vec::new();
    }
    vec!["--eviction-hard", "memory.available<100Mi"]
}

/// Image GC for agents under test, unless the test sets its thresholds: off. Images count as
/// old when an agent starts, and `statvfs` counts the root's reserved blocks as used, so on a
/// fuller test machine the default 85% would remove the imported busybox whenever no pod uses it
/// — and no registry can bring it back.
pub fn default_image_gc_args(extra: &[impl AsRef<str>]) -> Vec<&'static str> {
    if extra
        .iter()
        .any(|a| a.as_ref().starts_with("--image-gc-high-threshold"))
    {
        return Vec::new();
    }
    vec!["--image-gc-high-threshold", "100"]
}

/// Container GC for agents under test, unless the test sets its own minimum age: only dead
/// containers older than a day, i.e. none. Test agents share one containerd, and to an agent
/// every pod it does not know is gone: its collector would remove the dead containers (and with
/// them the statuses) of pods other tests' agents run at the same time.
pub fn default_container_gc_args(extra: &[impl AsRef<str>]) -> Vec<&'static str> {
    if extra
        .iter()
        .any(|a| a.as_ref().starts_with("--minimum-container-ttl-duration"))
    {
        return Vec::new();
    }
    vec!["--minimum-container-ttl-duration", "24h"]
}

/// The scripted helper process (see `src/bin/swiftlet-testproc.rs`).
pub fn testproc() -> PathBuf {
    sibling_binary("swiftlet-testproc")
}

/// The image credential provider plugin for tests (see
/// `src/bin/swiftlet-test-credential-provider.rs`).
pub fn test_credential_provider() -> PathBuf {
    sibling_binary("swiftlet-test-credential-provider")
}

/// The `swiftlet` binary: `SWIFTLET_BIN`, or the one built next to the running test.
pub fn swiftlet_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("SWIFTLET_BIN") {
        return PathBuf::from(path);
    }
    sibling_binary("swiftlet")
}

pub(crate) fn sibling_binary(name: &str) -> PathBuf {
    // Tests run from target/<profile>/deps/; binaries live in target/<profile>/.
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo xtask test` (or `cargo build --workspace --bins`) first",
        path.display()
    );
    path
}

/// How long a test waits for an event before failing. Not a performance assertion: only a bound
/// so that a missing event fails the test instead of hanging it.
pub const EVENT_WAIT: Duration = Duration::from_secs(30);

/// Multiplies [`EVENT_WAIT`] in [`event_wait`]: a whole number, 1 unless given.
pub const WAIT_SCALE_ENV: &str = "SWIFTLET_TEST_WAIT_SCALE";

/// [`EVENT_WAIT`] times `SWIFTLET_TEST_WAIT_SCALE`. Still only a bound: the node VM runs the
/// tests under software emulation (qemu's TCG), where a pod's sandbox alone takes tens of
/// seconds, so it stretches every bound alike instead of each test guessing its own. A value
/// that is not a whole number from 1 to 20 fails the test naming the variable.
pub fn event_wait() -> Duration {
    let value = std::env::var_os(WAIT_SCALE_ENV);
    let scale = wait_scale(value.as_deref().map(|v| v.to_string_lossy()).as_deref())
        .unwrap_or_else(|e| panic!("{e}"));
    EVENT_WAIT * scale
}

fn wait_scale(value: Option<&str>) -> Result<u32, String> {
    match value {
        None | Some("") => Ok(1),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=20).contains(n))
            .ok_or_else(|| format!("{WAIT_SCALE_ENV}={v:?}: expected a whole number from 1 to 20")),
    }
}

/// Reads events until `want` matches one, returning it with everything read before it.
pub async fn read_until(
    events: &mut KernelEvents,
    mut want: impl FnMut(&KernelEvent) -> bool,
) -> (KernelEvent, Vec<StreamItem>) {
    let mut before = Vec::new();
    let wait = event_wait();
    let found = tokio::time::timeout(wait, async {
        loop {
            match events.next().await.expect("the event stream keeps working") {
                StreamItem::Event(event) if want(&event) => return event,
                item => before.push(item),
            }
        }
    })
    .await;
    match found {
        Ok(event) => (event, before),
        Err(_) => panic!(
            "no matching event within {wait:?}; saw {} other items: {before:#?}",
            before.len()
        ),
    }
}

/// A gRPC channel over the unix socket `socket` (containerd's CRI, swiftlet's API): tonic has no
/// unix endpoint of its own, so the connector dials the socket and the URI is only a placeholder.
pub async fn unix_channel(
    socket: impl Into<PathBuf>,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let socket = socket.into();
    tonic::transport::Endpoint::from_static("http://unix.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

/// Waits (bounded by [`event_wait`]) until `want` holds; panics naming `what` if it never does.
pub fn eventually(what: &str, want: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + event_wait();
    while std::time::Instant::now() < deadline {
        if want() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("never: {what}");
}

/// A plain HTTP/1.0 GET on loopback; the body, or an empty string if nothing answers.
pub fn http_get(port: u16, path: &str) -> String {
    http_get_status(port, path).1
}

/// A plain HTTP/1.0 GET on loopback: the status and the body (0 and nothing if nothing answers).
pub fn http_get_status(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    if write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").is_err() {
        return (0, String::new());
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    http_response(&response)
}

/// The status and body of a raw HTTP/1 response (status 0 when it has none).
pub fn http_response(response: &str) -> (u16, String) {
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_scale_is_a_small_whole_number() {
        assert_eq!(wait_scale(None), Ok(1));
        assert_eq!(wait_scale(Some("4")), Ok(4));
        for bad in ["0", "21", "1.5", "x"] {
            let error = wait_scale(Some(bad)).expect_err(bad);
            assert!(
                error.contains(WAIT_SCALE_ENV) && error.contains(bad),
                "{error}"
            );
        }
    }
}
