//! The project's own Kubernetes API server for system tests and benchmarks (see
//! `swiftlet_tests::apiserver`): serves HTTPS on `127.0.0.1`, writes `ca.crt` and `kubeconfig`
//! into `--dir`, and prints one line when ready:
//!
//! ```text
//! swiftlet-test-apiserver ready {"url":"https://127.0.0.1:PORT","port":PORT,"kubeconfig":"DIR/kubeconfig","token":"…"}
//! ```
//!
//! It runs until killed. Faults and the request log are under `/_test/…` on the same server
//! (listed in `swiftlet_tests::apiserver::control`).
#![expect(
    clippy::print_stdout,
    reason = "the readiness line is this CLI's interface"
)]

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use serde_json::json;
use swiftlet_tests::apiserver::{ApiServer, ServerConfig, authn, controllers, http, serve};

#[derive(Parser)]
#[command(about = "A Kubernetes API server for swiftlet's tests")]
struct Args {
    /// Where to write `ca.crt` and `kubeconfig`.
    #[arg(long)]
    dir: PathBuf,
    /// The port on 127.0.0.1; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// How many changes the watch history keeps (older resourceVersions get 410 Gone).
    #[arg(long, default_value_t = 10_000)]
    history: usize,
    /// How often a watch that allows bookmarks gets one, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    bookmark_interval_ms: u64,
    /// The shortest TokenRequest expiration accepted, in seconds.
    #[arg(long, default_value_t = 600)]
    min_token_expiration_seconds: i64,
    /// The longest TokenRequest expiration granted, in seconds (longer requests are shortened);
    /// 0 for no cap.
    #[arg(long, default_value_t = 0)]
    max_token_expiration_seconds: i64,
    /// The bearer token; a random one by default.
    #[arg(long)]
    token: Option<String>,
    /// A bootstrap token `<id>.<secret>` (id `[a-z0-9]{6}`, secret `[a-z0-9]{16}`) that
    /// authenticates as `system:bootstrap:<id>` in `system:bootstrappers`; repeatable.
    #[arg(long = "bootstrap-token", value_parser = authn::parse_bootstrap_token)]
    bootstrap_tokens: Vec<String>,
    /// The longest certificate the CSR signer issues, in seconds (kube-controller-manager's
    /// `--cluster-signing-duration`). Test-only: it caps even below upstream's 600 s floor.
    #[arg(long, default_value_t = 365 * 24 * 3600)]
    cluster_signing_duration: i64,
    /// Leave node client CSRs for the test to approve (no csrapproving controller).
    #[arg(long)]
    no_auto_approve: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut config = ServerConfig {
        history: args.history,
        bookmark_interval: Duration::from_millis(args.bookmark_interval_ms.max(1)),
        min_token_expiration_seconds: args.min_token_expiration_seconds,
        max_token_expiration_seconds: args.max_token_expiration_seconds,
        bootstrap_tokens: args.bootstrap_tokens,
        cluster_signing_seconds: args.cluster_signing_duration.max(1),
        auto_approve: !args.no_auto_approve,
        ..ServerConfig::default()
    };
    if let Some(token) = args.token {
        config.token = token;
    }
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .with_context(|| format!("bind 127.0.0.1:{}", args.port))?;
    let port = listener.local_addr().context("the bound address")?.port();
    let certificates = serve::certificates()?;
    let tls = serve::tls_config(&certificates)?;
    std::fs::create_dir_all(&args.dir).with_context(|| format!("mkdir {}", args.dir.display()))?;
    let ca_file = args.dir.join("ca.crt");
    std::fs::write(&ca_file, &certificates.ca_pem)
        .with_context(|| format!("write {}", ca_file.display()))?;
    let url = format!("https://127.0.0.1:{port}");
    let kubeconfig = args.dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        serve::kubeconfig(&url, &ca_file, &config.token),
    )
    .with_context(|| format!("write {}", kubeconfig.display()))?;
    let token = config.token.clone();
    let server = Arc::new(ApiServer::new(config, port).with_ca(certificates.ca)?);
    tokio::spawn(controllers::run(server.clone()));
    let serving = tokio::spawn(serve::serve(
        listener,
        tls,
        http::router(server.clone()),
        server,
    ));
    println!(
        "swiftlet-test-apiserver ready {}",
        json!({"url": url, "port": port, "kubeconfig": kubeconfig, "token": token})
    );
    tokio::select! {
        result = serving => result.context("the server task")?,
        result = tokio::signal::ctrl_c() => result.context("waiting for a signal")?,
    }
    Ok(())
}
