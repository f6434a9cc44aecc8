//! An image credential provider plugin for the system tests (the kubelet's exec plugin API,
//! `credentialprovider.kubelet.k8s.io/v1`): it reads the `CredentialProviderRequest` on stdin,
//! checks it, and answers as its first argument says. What it was asked is appended to the file
//! `SWIFTLET_TEST_PROVIDER_LOG` names, one image a line, so that a test can count the execs.
//!
//! ```text
//! swiftlet-test-credential-provider answer         credentials for the image's registry:
//!                                                  SWIFTLET_TEST_PROVIDER_USERNAME and
//!                                                  SWIFTLET_TEST_PROVIDER_PASSWORD, cached per
//!                                                  SWIFTLET_TEST_PROVIDER_CACHE_KEY_TYPE
//!                                                  (default Registry) for
//!                                                  SWIFTLET_TEST_PROVIDER_CACHE_DURATION (if set)
//! swiftlet-test-credential-provider garbage        not JSON
//! swiftlet-test-credential-provider huge           credentials without end
//! swiftlet-test-credential-provider hang           nothing, never exiting
//! swiftlet-test-credential-provider wrong-version  an answer of apiVersion v1alpha1
//! swiftlet-test-credential-provider fail           exit 1 with a message on stderr
//! ```
#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test plugin's protocol is its stdout"
)]

use std::{
    io::{Read as _, Write as _},
    process::ExitCode,
};

use serde_json::{Value, json};

const API_VERSION: &str = "credentialprovider.kubelet.k8s.io/v1";

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("reading the request: {e}");
        return ExitCode::from(2);
    }
    let request: Value = match serde_json::from_str(&input) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("the request is not JSON: {e}");
            return ExitCode::from(2);
        }
    };
    if request["kind"] != "CredentialProviderRequest" || request["apiVersion"] != API_VERSION {
        eprintln!("not a {API_VERSION} CredentialProviderRequest: {input}");
        return ExitCode::from(2);
    }
    let Some(image) = request["image"].as_str().filter(|i| !i.is_empty()) else {
        eprintln!("the request names no image: {input}");
        return ExitCode::from(2);
    };
    if let Some(log) = env("SWIFTLET_TEST_PROVIDER_LOG") {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut f| writeln!(f, "{mode} {image}"));
        if let Err(e) = appended {
            eprintln!("{log}: {e}");
            return ExitCode::from(2);
        }
    }
    let registry = image.split('/').next().unwrap_or(image);
    let mut answer = json!({
        "kind": "CredentialProviderResponse",
        "apiVersion": API_VERSION,
        "cacheKeyType": env("SWIFTLET_TEST_PROVIDER_CACHE_KEY_TYPE").unwrap_or_else(|| "Registry".into()),
        "auth": {
            registry: {
                "username": env("SWIFTLET_TEST_PROVIDER_USERNAME").unwrap_or_default(),
                "password": env("SWIFTLET_TEST_PROVIDER_PASSWORD").unwrap_or_default(),
            },
        },
    });
    if let Some(duration) = env("SWIFTLET_TEST_PROVIDER_CACHE_DURATION") {
        answer["cacheDuration"] = Value::String(duration);
    }
    match mode.as_str() {
        "answer" => {
            println!("{answer}");
        }
        "wrong-version" => {
            answer["apiVersion"] =
                Value::String("credentialprovider.kubelet.k8s.io/v1alpha1".into());
            println!("{answer}");
        }
        "garbage" => {
            println!("this is not a CredentialProviderResponse");
        }
        "huge" => {
            // Until the agent stops reading (a broken pipe) or kills it.
            let chunk = "credential".repeat(1000);
            let mut stdout = std::io::stdout().lock();
            while stdout.write_all(chunk.as_bytes()).is_ok() {}
        }
        "hang" => loop {
            std::thread::park();
        },
        "fail" => {
            eprintln!("the test provider was told to fail");
            return ExitCode::from(1);
        }
        other => {
            eprintln!("unknown mode {other:?}");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
