//! The API server process under test (`swiftlet-test-apiserver`), as [`crate::node`] runs the
//! agent: started on a free port with its own directory, its kubeconfig path for `swiftlet run
//! --kubeconfig` and a kube-rs client for the test, the `/_test/…` fault switches, and the
//! process killed (and its directory removed) when the guard goes out of scope.

use std::{
    io::{Read as _, Write as _},
    path::PathBuf,
    process::Command,
    time::Duration,
};

use serde_json::Value;

use crate::{process::Running, sibling_binary};

/// The `User-Agent` of the tests' own clients.
pub const TEST_USER_AGENT: &str = "swiftlet-tests";

pub struct TestApiServer {
    pub url: String,
    pub port: u16,
    /// The kubeconfig (server, CA file, bearer token).
    pub kubeconfig: PathBuf,
    pub token: String,
    dir: PathBuf,
    pub process: Running,
}

/// The binary (`SWIFTLET_TEST_APISERVER_BIN`, or the one built next to the running test).
pub fn apiserver_bin() -> PathBuf {
    std::env::var_os("SWIFTLET_TEST_APISERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| sibling_binary("swiftlet-test-apiserver"))
}

impl TestApiServer {
    /// Starts a server named `name` (for its directory) with the default flags.
    pub fn start(name: &str) -> TestApiServer {
        Self::start_with(name, &[])
    }

    /// Starts one with more flags (`--history N`, `--bookmark-interval-ms N`, …).
    pub fn start_with(name: &str, extra_args: &[&str]) -> TestApiServer {
        let dir =
            std::env::temp_dir().join(format!("swiftlet-apiserver-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let process = Running::start(
            Command::new(apiserver_bin())
                .arg("--dir")
                .arg(&dir)
                .args(extra_args),
        );
        let line = process.wait_stdout(|l| l.starts_with("swiftlet-test-apiserver ready "));
        let ready: Value = line
            .strip_prefix("swiftlet-test-apiserver ready ")
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or_else(|| panic!("an unreadable readiness line: {line}"));
        let text = |k: &str| {
            ready[k]
                .as_str()
                .unwrap_or_else(|| panic!("no {k} in {line}"))
                .to_owned()
        };
        TestApiServer {
            url: text("url"),
            port: ready["port"]
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .unwrap_or_else(|| panic!("no port in {line}")),
            kubeconfig: PathBuf::from(text("kubeconfig")),
            token: text("token"),
            dir,
            process,
        }
    }

    /// A kube-rs client from the kubeconfig, built by swiftlet's own `--kubeconfig` code
    /// (needs a tokio runtime). Its `User-Agent` is [`TEST_USER_AGENT`], so the request log
    /// tells the test's requests from the agent's.
    pub async fn client(&self) -> kube::Client {
        swiftlet::sources::client_from_kubeconfig(&self.kubeconfig, TEST_USER_AGENT)
            .await
            .unwrap_or_else(|e| panic!("a client from {}: {e}", self.kubeconfig.display()))
    }

    /// The CA certificate file the kubeconfig trusts.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A blocking HTTPS request with the bearer token: (status, JSON body or Null).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let config = crate::tls::client_config(&self.ca_file(), None);
        let mut stream = crate::tls::connect(self.port, "localhost", config)
            .unwrap_or_else(|e| panic!("connect to the API server: {e}"));
        let body = body.map(Value::to_string).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            self.token,
            body.len()
        );
        stream
            .write_all(head.as_bytes())
            .and_then(|()| stream.write_all(body.as_bytes()))
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let mut raw = Vec::new();
        if let Err(e) = stream.read_to_end(&mut raw)
            && (e.kind() != std::io::ErrorKind::UnexpectedEof || raw.is_empty())
        {
            panic!("{method} {path}: read: {e}");
        }
        let (status, text) = crate::http_response(&String::from_utf8_lossy(&raw));
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// A `/_test/…` control request that must succeed.
    fn control(&self, method: &str, what: &str, body: Option<&Value>) -> Value {
        let (status, answer) = self.request(method, &format!("/_test/{what}"), body);
        assert_eq!(status, 200, "{method} /_test/{what}: {answer}");
        answer
    }

    /// Every API request answers 503 while `on`.
    pub fn set_unavailable(&self, on: bool) {
        self.control(
            "POST",
            "unavailable",
            Some(&serde_json::json!({"enabled": on})),
        );
    }

    /// Takes the server down for `duration` (connections refused, open ones cut; the state
    /// kept) and returns once its port refuses connections.
    pub fn go_down(&self, duration: Duration) {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        // The server may cut this very connection before it answers: only the effect counts.
        let body = serde_json::json!({"millis": millis}).to_string();
        if let Ok(mut stream) = crate::tls::connect(
            self.port,
            "localhost",
            crate::tls::client_config(&self.ca_file(), None),
        ) {
            let head = format!(
                "POST /_test/down HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: Bearer {}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                self.token,
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let mut ignored = Vec::new();
            let _ = stream.read_to_end(&mut ignored);
        }
        crate::eventually("the API server refuses connections", || {
            std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err()
        });
    }

    /// Every API request waits `delay` first.
    pub fn set_delay(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.control(
            "POST",
            "delay",
            Some(&serde_json::json!({"millis": millis})),
        );
    }

    /// Ends every open watch.
    pub fn drop_watches(&self) {
        self.control("POST", "drop-watches", None);
    }

    /// Compacts the history: every resourceVersion before now gets 410 Gone.
    pub fn compact(&self) {
        self.control("POST", "compact", None);
    }

    /// As if restarted with fresh resourceVersions: watches dropped, every version expired.
    pub fn restart_fresh(&self) {
        self.control("POST", "restart", None);
    }

    /// The API requests served so far: (total, the last ones as `{method, path, query}`).
    pub fn requests(&self) -> (u64, Vec<crate::apiserver::LoggedRequest>) {
        let log = self.control("GET", "requests", None);
        let requests = serde_json::from_value(log["requests"].clone()).unwrap_or_default();
        (log["total"].as_u64().unwrap_or(0), requests)
    }

    pub fn clear_requests(&self) {
        self.control("DELETE", "requests", None);
    }

    /// Sets the TokenReview/SubjectAccessReview answers.
    pub fn set_reviews(&self, table: &crate::apiserver::ReviewTable) {
        let body = serde_json::to_value(table).unwrap_or_default();
        self.control("PUT", "reviews", Some(&body));
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
