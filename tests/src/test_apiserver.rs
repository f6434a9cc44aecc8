//! The API server process under test (`swiftlet-test-apiserver`), as [`crate::node`] runs the
//! agent: started on a free port with its own directory, its kubeconfig path for `swiftlet run
//! --kubeconfig` and a kube-rs client for the test, the `/_test/…` fault switches, and the
//! process killed (and its directory removed) when the guard goes out of scope. For the
//! kubelet's TLS bootstrap: [`ApiServerOptions`] (bootstrap tokens, the signing duration,
//! auto-approval off), a bootstrap kubeconfig, requests as a bootstrapper or with a client
//! certificate ([`Credentials`], [`KeptConnection`]), and the CSRs listed and approved as
//! `kubectl certificate approve` does.

use std::{
    io::{Read as _, Write as _},
    path::PathBuf,
    process::Command,
    time::Duration,
};

use serde_json::{Value, json};

use crate::{process::Running, sibling_binary, tls::ClientIdentity};

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

/// How a server is started beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct ApiServerOptions {
    /// Bootstrap tokens (`<id>.<secret>`, see [`new_bootstrap_token`]).
    pub bootstrap_tokens: Vec<String>,
    /// The longest certificate the CSR signer issues (`--cluster-signing-duration`); it caps
    /// even below upstream's 10-minute floor. Default: a year.
    pub cluster_signing_duration: Option<Duration>,
    /// Node client CSRs wait for [`TestApiServer::approve_csr`] instead of being auto-approved.
    pub no_auto_approve: bool,
    /// More flags.
    pub extra_args: Vec<String>,
}

/// A fresh bootstrap token in the documented format (`[a-z0-9]{6}.[a-z0-9]{16}`).
pub fn new_bootstrap_token() -> String {
    let part = |n: usize| -> String {
        (0..n)
            .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[fastrand::usize(..36)]))
            .collect()
    };
    format!("{}.{}", part(6), part(16))
}

/// Who a request is made as.
#[derive(Clone, Copy)]
pub enum Credentials<'a> {
    /// A bearer token (the admin's, a bootstrap token, or any other).
    Token(&'a str),
    /// A client certificate (see [`client_identity`]).
    Certificate(&'a ClientIdentity),
    /// Nothing.
    Anonymous,
}

/// A client identity from a PEM certificate (e.g. a CSR's `status.certificate`) and the
/// PKCS#8 DER of its key (`rcgen::KeyPair::serialize_der`).
pub fn client_identity(certificate_pem: &[u8], key_pkcs8_der: Vec<u8>) -> ClientIdentity {
    use rustls_pki_types::{CertificateDer, pem::PemObject as _};
    let chain = CertificateDer::pem_slice_iter(certificate_pem)
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("a PEM certificate: {e}"));
    assert!(!chain.is_empty(), "no certificate in the PEM");
    ClientIdentity {
        chain,
        key: key_pkcs8_der,
    }
}

/// The CSR path under `certificates.k8s.io/v1`.
const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

impl TestApiServer {
    /// Starts a server named `name` with `options`.
    pub fn start_with_options(name: &str, options: &ApiServerOptions) -> TestApiServer {
        let mut args: Vec<String> = Vec::new();
        for token in &options.bootstrap_tokens {
            args.push("--bootstrap-token".to_owned());
            args.push(token.clone());
        }
        if let Some(duration) = options.cluster_signing_duration {
            args.push("--cluster-signing-duration".to_owned());
            args.push(duration.as_secs().max(1).to_string());
        }
        if options.no_auto_approve {
            args.push("--no-auto-approve".to_owned());
        }
        args.extend(options.extra_args.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::start_with(name, &args)
    }

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

    /// The CA's PEM file (what a bootstrap kubeconfig names; also the client CA and the CSR
    /// signer's CA).
    pub fn ca_pem_path(&self) -> PathBuf {
        self.ca_file()
    }

    /// Writes a kubeconfig with `token` (a bootstrap token) for this server, as `kubeadm join`
    /// writes `bootstrap-kubelet.conf`, and returns its path.
    pub fn bootstrap_kubeconfig(&self, token: &str) -> PathBuf {
        let id = token.split('.').next().unwrap_or("token");
        let path = self.dir.join(format!("bootstrap-kubeconfig-{id}"));
        let text = crate::apiserver::serve::kubeconfig(&self.url, &self.ca_file(), token);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }

    /// A blocking HTTPS request with the bearer token: (status, JSON body or Null).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.request_as(Credentials::Token(&self.token), method, path, body)
    }

    /// A blocking HTTPS request made as `credentials`, on a connection of its own.
    pub fn request_as(
        &self,
        credentials: Credentials<'_>,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let identity = match credentials {
            Credentials::Certificate(identity) => Some(identity),
            _ => None,
        };
        let config = crate::tls::client_config(&self.ca_file(), identity);
        let mut stream = crate::tls::connect(self.port, "localhost", config)
            .unwrap_or_else(|e| panic!("connect to the API server: {e}"));
        let body = body.map(Value::to_string).unwrap_or_default();
        let authorization = match credentials {
            Credentials::Token(token) => format!("Authorization: Bearer {token}\r\n"),
            _ => String::new(),
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{authorization}\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
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

impl TestApiServer {
    /// Every CertificateSigningRequest.
    pub fn list_csrs(&self) -> Vec<Value> {
        let (status, list) = self.request("GET", CSRS, None);
        assert_eq!(status, 200, "list CSRs: {list}");
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// One CSR, if it exists.
    pub fn get_csr(&self, name: &str) -> Option<Value> {
        let (status, csr) = self.request("GET", &format!("{CSRS}/{name}"), None);
        (status == 200).then_some(csr)
    }

    /// Approves a CSR as `kubectl certificate approve` does: the Approved condition added
    /// through the `approval` subresource (the signer then issues the certificate).
    pub fn approve_csr(&self, name: &str) {
        self.decide_csr(
            name,
            "Approved",
            "KubectlApprove",
            "This CSR was approved by kubectl certificate approve.",
        );
    }

    /// Denies a CSR as `kubectl certificate deny` does.
    pub fn deny_csr(&self, name: &str) {
        self.decide_csr(
            name,
            "Denied",
            "KubectlDeny",
            "This CSR was denied by kubectl certificate deny.",
        );
    }

    fn decide_csr(&self, name: &str, kind: &str, reason: &str, message: &str) {
        let mut csr = self
            .get_csr(name)
            .unwrap_or_else(|| panic!("no CSR {name}"));
        let condition =
            json!({"type": kind, "status": "True", "reason": reason, "message": message});
        match csr["status"]["conditions"].as_array_mut() {
            Some(conditions) => conditions.push(condition),
            None => csr["status"]["conditions"] = json!([condition]),
        }
        let (status, answer) = self.request("PUT", &format!("{CSRS}/{name}/approval"), Some(&csr));
        assert_eq!(status, 200, "{kind} CSR {name}: {answer}");
    }

    /// A kept-alive connection made as `credentials` (as the kubelet's client keeps one).
    pub fn connect_as(&self, credentials: Credentials<'_>) -> KeptConnection {
        let identity = match credentials {
            Credentials::Certificate(identity) => Some(identity),
            _ => None,
        };
        let config = crate::tls::client_config(&self.ca_file(), identity);
        let stream = crate::tls::connect(self.port, "localhost", config)
            .unwrap_or_else(|e| panic!("connect to the API server: {e}"));
        let authorization = match credentials {
            Credentials::Token(token) => format!("Authorization: Bearer {token}\r\n"),
            _ => String::new(),
        };
        KeptConnection {
            stream,
            authorization,
        }
    }
}

/// One HTTP/1.1 connection for several requests.
pub struct KeptConnection {
    stream: rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>,
    authorization: String,
}

impl KeptConnection {
    /// A request without a body on this connection: (status, JSON body or Null).
    pub fn request(&mut self, method: &str, path: &str) -> (u16, Value) {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{}Content-Length: 0\r\n\r\n",
            self.authorization
        );
        self.stream
            .write_all(head.as_bytes())
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let mut raw = Vec::new();
        let mut byte = [0u8; 1];
        while !raw.ends_with(b"\r\n\r\n") {
            self.stream
                .read_exact(&mut byte)
                .unwrap_or_else(|e| panic!("{method} {path}: the head: {e}"));
            raw.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {head}"));
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or_else(|| panic!("no content-length in {head}"));
        let mut body = vec![0u8; length];
        self.stream
            .read_exact(&mut body)
            .unwrap_or_else(|e| panic!("{method} {path}: the body: {e}"));
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        let _ = self.process.child.kill();
        let _ = self.process.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
