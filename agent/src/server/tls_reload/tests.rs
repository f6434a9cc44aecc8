use std::{fs, path::Path, time::Duration};

use super::*;
use crate::{
    config::{
        Authentication, Authorization, AuthorizationMode, ServerConfig as Settings, TlsVersion,
    },
    server::{
        test_pki::{Ca, Leaf, handshake},
        tls::MAX_FILE_BYTES,
    },
};

fn settings(dir: &Path, pair: bool, client_ca: bool) -> Settings {
    Settings {
        address: None,
        tls_cert_file: pair.then(|| dir.join("tls.crt")),
        tls_private_key_file: pair.then(|| dir.join("tls.key")),
        cert_directory: dir.join("pki"),
        tls_min_version: TlsVersion::Tls12,
        tls_cipher_suites: Vec::new(),
        enable_debugging_handlers: true,
        authentication: Authentication {
            anonymous: false,
            anonymous_turned_off: false,
            webhook: false,
            webhook_cache_ttl: Duration::from_secs(120),
            client_ca_file: client_ca.then(|| dir.join("ca.crt")),
        },
        authorization: Authorization {
            mode: AuthorizationMode::AlwaysAllow,
            cache_authorized_ttl: Duration::from_secs(300),
            cache_unauthorized_ttl: Duration::from_secs(30),
        },
    }
}

/// Replaces `name` in `dir` as editors and cert-manager do: written aside, renamed in.
fn replace(dir: &Path, name: &str, text: &str) {
    let aside = dir.join(format!(".{name}.tmp"));
    fs::write(&aside, text).expect("write aside");
    fs::rename(&aside, dir.join(name)).expect("rename in");
}

fn write_pair(dir: &Path, leaf: &Leaf) {
    replace(dir, "tls.crt", &leaf.cert_pem);
    replace(dir, "tls.key", &leaf.key_pem);
}

#[tokio::test]
async fn a_replaced_pair_is_served_from_the_next_handshake_after_a_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::new("ca");
    let (old, new) = (ca.serving("old"), ca.serving("new"));
    write_pair(dir.path(), &old);
    let (tls, mut reloader) =
        ServerTls::load(&settings(dir.path(), true, false), "node-1").expect("loads");
    assert_eq!(reloader.check(), Checked::default(), "nothing changed yet");
    assert_eq!(
        handshake(tls.config(), &ca, None).await,
        Ok(old.der.clone())
    );

    write_pair(dir.path(), &new);
    assert_eq!(
        reloader.check(),
        Checked {
            reloaded: 1,
            refused: 0
        }
    );
    assert_eq!(handshake(tls.config(), &ca, None).await, Ok(new.der));
    assert_eq!(reloader.check(), Checked::default());
}

#[tokio::test]
async fn a_bad_or_mismatched_pair_is_refused_once_and_the_old_one_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::new("ca");
    let (old, new) = (ca.serving("old"), ca.serving("new"));
    write_pair(dir.path(), &old);
    let registry = Registry::new();
    let metrics = ReloadMetrics::register(&registry).expect("metrics");
    let (tls, reloader) =
        ServerTls::load(&settings(dir.path(), true, false), "node-1").expect("loads");
    let mut reloader = reloader.with_metrics(metrics.clone());
    assert!(metrics.not_after.get() > 0);
    let refused = Checked {
        reloaded: 0,
        refused: 1,
    };

    replace(dir.path(), "tls.crt", "garbage");
    assert_eq!(reloader.check(), refused);
    // The same problem is not reported again at every re-check.
    assert_eq!(reloader.check(), Checked::default());
    // The new certificate beside the old key: they do not match.
    replace(dir.path(), "tls.crt", &new.cert_pem);
    assert_eq!(reloader.check(), refused);
    let err = certified_key(
        PairFields::CONFIGURED,
        &dir.path().join("tls.crt"),
        &dir.path().join("tls.key"),
        &read_pair(
            PairFields::CONFIGURED,
            &dir.path().join("tls.crt"),
            &dir.path().join("tls.key"),
        )
        .expect("reads"),
        tls.provider(),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        err.contains("tlsCertFile") && err.contains("tlsPrivateKeyFile") && err.contains("match"),
        "{err}"
    );
    // Too large to be a certificate.
    replace(
        dir.path(),
        "tls.crt",
        &"x".repeat(MAX_FILE_BYTES as usize + 1),
    );
    assert_eq!(reloader.check(), refused);
    assert_eq!(handshake(tls.config(), &ca, None).await, Ok(old.der));
    assert_eq!(
        metrics
            .errors
            .with_label_values(&["serving_certificate"])
            .get(),
        3
    );

    replace(dir.path(), "tls.key", &new.key_pem);
    replace(dir.path(), "tls.crt", &new.cert_pem);
    assert_eq!(reloader.check().reloaded, 1);
    assert_eq!(handshake(tls.config(), &ca, None).await, Ok(new.der));
    assert_eq!(
        metrics
            .reloads
            .with_label_values(&["serving_certificate"])
            .get(),
        1
    );
}

#[tokio::test]
async fn a_changed_client_ca_file_decides_the_next_handshake() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_ca, ca1, ca2) = (Ca::new("server-ca"), Ca::new("ca1"), Ca::new("ca2"));
    write_pair(dir.path(), &server_ca.serving("kubelet"));
    replace(dir.path(), "ca.crt", &ca1.pem);
    let (alice, bob) = (ca1.client("alice"), ca2.client("bob"));
    let (tls, mut reloader) =
        ServerTls::load(&settings(dir.path(), true, true), "node-1").expect("loads");
    assert!(
        handshake(tls.config(), &server_ca, Some(&alice))
            .await
            .is_ok()
    );
    assert!(
        handshake(tls.config(), &server_ca, Some(&bob))
            .await
            .is_err()
    );

    replace(dir.path(), "ca.crt", &ca2.pem);
    assert_eq!(reloader.check().reloaded, 1);
    assert!(
        handshake(tls.config(), &server_ca, Some(&bob))
            .await
            .is_ok()
    );
    assert!(
        handshake(tls.config(), &server_ca, Some(&alice))
            .await
            .is_err()
    );
    // No client certificate is still a handshake (authentication decides later).
    assert!(handshake(tls.config(), &server_ca, None).await.is_ok());

    replace(dir.path(), "ca.crt", "not a CA");
    assert_eq!(reloader.check().refused, 1);
    assert!(
        handshake(tls.config(), &server_ca, Some(&bob))
            .await
            .is_ok()
    );
}

/// Kubernetes' atomic writer: files are symlinks through `..data`, itself a symlink to a
/// timestamped directory, swapped by renaming a new `..data` over it.
fn atomic_write(dir: &Path, version: &str, files: &[(&str, &str)]) {
    let data = dir.join(format!("..{version}"));
    fs::create_dir(&data).expect("version dir");
    for (name, text) in files {
        fs::write(data.join(name), text).expect("write");
        let link = dir.join(name);
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link).expect("link");
        }
    }
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{version}"), &tmp).expect("data link");
    fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
}

#[tokio::test]
async fn the_watch_reloads_a_secret_volume_swap_without_a_check_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_ca, ca1, ca2) = (Ca::new("server-ca"), Ca::new("ca1"), Ca::new("ca2"));
    let (old, new) = (server_ca.serving("old"), server_ca.serving("new"));
    let bob = ca2.client("bob");
    atomic_write(
        dir.path(),
        "v1",
        &[
            ("tls.crt", &old.cert_pem),
            ("tls.key", &old.key_pem),
            ("ca.crt", &ca1.pem),
        ],
    );
    let (tls, reloader) =
        ServerTls::load(&settings(dir.path(), true, true), "node-1").expect("loads");
    let shutdown = CancellationToken::new();
    let watching = tokio::spawn(reloader.run(shutdown.clone()));
    assert_eq!(handshake(tls.config(), &server_ca, None).await, Ok(old.der));

    atomic_write(
        dir.path(),
        "v2",
        &[
            ("tls.crt", &new.cert_pem),
            ("tls.key", &new.key_pem),
            ("ca.crt", &ca2.pem),
        ],
    );
    // Far below the minute's re-check: only the directory watch can have done it.
    let seen = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if handshake(tls.config(), &server_ca, Some(&bob)).await == Ok(new.der.clone()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    shutdown.cancel();
    watching.await.expect("reloader ends");
    assert!(seen.is_ok(), "the swap was not picked up");
}
