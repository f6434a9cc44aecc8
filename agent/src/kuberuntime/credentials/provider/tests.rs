use std::os::unix::fs::PermissionsExt as _;

use super::*;

/// A bin dir with one plugin, `counting`, that appends a line to `calls` per exec, sleeps
/// `$DELAY` seconds and answers with the credentials of its environment for `r.io:5000`.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new(cache_key_type: &str, cache_duration: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("bin dir");
        let calls = dir.path().join("calls");
        let duration = if cache_duration.is_empty() {
            String::new()
        } else {
            format!(r#""cacheDuration":"{cache_duration}","#)
        };
        let script = format!(
            r#"#!/bin/sh
cat >/dev/null
echo x >> {calls}
sleep "${{DELAY:-0}}"
printf '{{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"{cache_key_type}",{duration}"auth":{{"r.io:5000":{{"username":"%s","password":"p"}},"r.io:5000/team":{{"username":"team-%s","password":"p"}}}}}}' "$USER_NAME" "$USER_NAME"
"#,
            calls = calls.display()
        );
        let plugin = bin.join("counting");
        std::fs::write(&plugin, script).expect("write plugin");
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Fixture { dir }
    }

    fn config(&self, match_images: &str, delay: &str) -> std::path::PathBuf {
        let path = self.dir.path().join("config.yaml");
        std::fs::write(
            &path,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
                 - name: counting\n  matchImages: {match_images}\n  defaultCacheDuration: 10m\n  \
                 apiVersion: credentialprovider.kubelet.k8s.io/v1\n  env:\n  \
                 - {{name: USER_NAME, value: node}}\n  - {{name: DELAY, value: \"{delay}\"}}\n"
            ),
        )
        .expect("write config");
        path
    }

    fn trust(&self) -> Trust {
        Trust::beneath(self.dir.path())
    }

    fn providers(&self, match_images: &str, delay: &str) -> CredentialProviders {
        CredentialProviders::load(
            &self.config(match_images, delay),
            &self.dir.path().join("bin"),
            &self.trust(),
        )
        .expect("valid providers")
    }

    fn calls(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

fn users(provided: &Provided) -> Vec<&str> {
    provided
        .credentials
        .iter()
        .map(|c| c.username.as_str())
        .collect()
}

#[tokio::test]
async fn only_matching_images_ask_the_plugin_and_its_entries_match_as_a_docker_config() {
    let fixture = Fixture::new("Image", "");
    let providers = fixture.providers(r#"["*.io:5000"]"#, "0");
    // Another port, another number of labels: the plugin is not asked.
    for image in ["r.io/team/app", "r.io:6000/app", "a.r.io:5000/app"] {
        let provided = providers.lookup(image).await;
        assert!(provided.credentials.is_empty(), "{image}");
        assert!(provided.failures.is_empty(), "{image}");
    }
    assert_eq!(fixture.calls(), 0);
    // The more specific entry first, as a keyring orders them.
    let provided = providers.lookup("r.io:5000/team/app").await;
    assert_eq!(users(&provided), ["team-node", "node"]);
    assert_eq!(
        provided.credentials[0].source,
        "credential provider counting"
    );
    let provided = providers.lookup("r.io:5000/other").await;
    assert_eq!(users(&provided), ["node"]);
    assert_eq!(fixture.calls(), 2);
}

#[tokio::test]
async fn a_response_is_cached_under_its_key_type_for_its_duration() {
    // Registry: one exec serves every image of the registry.
    let fixture = Fixture::new("Registry", "");
    let providers = fixture.providers(r#"["r.io:5000"]"#, "0");
    providers.lookup("r.io:5000/a").await;
    providers.lookup("r.io:5000/b").await;
    providers.lookup("r.io:5000/a").await;
    assert_eq!(fixture.calls(), 1);
    // Image: one exec per image.
    let fixture = Fixture::new("Image", "");
    let providers = fixture.providers(r#"["r.io:5000"]"#, "0");
    providers.lookup("r.io:5000/a").await;
    providers.lookup("r.io:5000/b").await;
    providers.lookup("r.io:5000/a").await;
    assert_eq!(fixture.calls(), 2);
    // A cache duration of zero: never cached.
    let fixture = Fixture::new("Global", "0s");
    let providers = fixture.providers(r#"["r.io:5000"]"#, "0");
    providers.lookup("r.io:5000/a").await;
    let provided = providers.lookup("r.io:5000/a").await;
    assert_eq!(users(&provided), ["node"]);
    assert_eq!(fixture.calls(), 2);
}

/// Pulls of one image at the same time share one exec (upstream's singleflight).
#[tokio::test]
async fn concurrent_lookups_of_an_image_share_one_exec() {
    let fixture = Fixture::new("Image", "0s");
    let providers = fixture.providers(r#"["r.io:5000"]"#, "1");
    let lookups: Vec<_> = (0..8).map(|_| providers.lookup("r.io:5000/a")).collect();
    let results = futures::future::join_all(lookups).await;
    for provided in &results {
        assert_eq!(users(provided), ["node"]);
    }
    assert_eq!(fixture.calls(), 1);
    assert!(
        providers.providers[0]
            .in_flight
            .lock_unpoisoned()
            .is_empty()
    );
}

#[tokio::test]
async fn a_failing_plugin_gives_no_credentials_and_says_why() {
    let fixture = Fixture::new("Image", "");
    let bin = fixture.dir.path().join("bin").join("counting");
    std::fs::write(
        &bin,
        "#!/bin/sh\necho 'registry token service down' >&2\nexit 1\n",
    )
    .expect("rewrite plugin");
    let providers = fixture.providers(r#"["r.io:5000"]"#, "0");
    let provided = providers.lookup("r.io:5000/a").await;
    assert!(provided.credentials.is_empty());
    assert_eq!(provided.failures.len(), 1);
    let explained = provided.explain("401 Unauthorized".into());
    assert!(explained.starts_with("401 Unauthorized; "), "{explained}");
    assert!(explained.contains("counting"), "{explained}");
    assert!(
        explained.contains("registry token service down"),
        "{explained}"
    );
    assert_eq!(Provided::default().explain("x".into()), "x");
}

#[test]
fn start_up_refuses_a_missing_bin_dir_binary_or_flag() {
    let fixture = Fixture::new("Image", "");
    let config = fixture.config(r#"["r.io"]"#, "0");
    let bin = fixture.dir.path().join("bin");
    let trust = fixture.trust();
    assert!(matches!(
        CredentialProviders::from_flags(Some(&config), None),
        Err(ConfigError::OnlyOne)
    ));
    assert!(matches!(
        CredentialProviders::from_flags(None, Some(&bin)),
        Err(ConfigError::OnlyOne)
    ));
    assert!(
        CredentialProviders::from_flags(None, None)
            .expect("none")
            .is_empty()
    );
    assert!(matches!(
        CredentialProviders::load(&config, &fixture.dir.path().join("nope"), &trust),
        Err(ConfigError::NoBinDir { .. })
    ));
    std::fs::set_permissions(bin.join("counting"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let error = CredentialProviders::load(&config, &bin, &trust)
        .err()
        .expect("not executable");
    assert!(
        matches!(error, ConfigError::Untrusted(TrustError::Kind { .. })),
        "{error}"
    );
    std::fs::remove_file(bin.join("counting")).expect("remove");
    let error = CredentialProviders::load(&config, &bin, &trust)
        .err()
        .expect("missing binary");
    assert!(matches!(error, ConfigError::NoBinary { .. }), "{error}");
    assert!(error.to_string().contains("counting"), "{error}");
}

fn errors(providers: &CredentialProviders) -> u64 {
    providers
        .metrics
        .as_ref()
        .map_or(0, |m| m.errors.with_label_values(&["counting"]).get())
}

fn runs(providers: &CredentialProviders) -> u64 {
    providers.metrics.as_ref().map_or(0, |m| {
        m.duration
            .with_label_values(&["counting"])
            .get_sample_count()
    })
}

/// Each exec is timed and each failed one counted, by plugin name, as upstream's plugin
/// metrics; and they are what the registry renders.
#[tokio::test]
async fn each_exec_is_timed_and_each_failure_counted_by_plugin_name() {
    let fixture = Fixture::new("Image", "0s");
    let providers = fixture.providers(r#"["r.io:5000"]"#, "0");
    providers.lookup("r.io:5000/a").await;
    assert_eq!((runs(&providers), errors(&providers)), (1, 0));
    std::fs::write(
        fixture.dir.path().join("bin").join("counting"),
        "#!/bin/sh\nexit 1\n",
    )
    .expect("rewrite plugin");
    let provided = providers.lookup("r.io:5000/a").await;
    assert_eq!(provided.failures.len(), 1);
    assert_eq!((runs(&providers), errors(&providers)), (2, 1));
    let registry = prometheus::Registry::new();
    providers.register_metrics(&registry).expect("register");
    let mut text = Vec::new();
    prometheus::Encoder::encode(
        &prometheus::TextEncoder::new(),
        &registry.gather(),
        &mut text,
    )
    .expect("encode");
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains(
            r#"kubelet_credential_provider_plugin_errors_total{plugin_name="counting"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"kubelet_credential_provider_plugin_duration_count{plugin_name="counting"} 2"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"kubelet_credential_provider_plugin_duration_bucket{plugin_name="counting",le="10"} 2"#),
        "{text}"
    );
    // No providers: nothing registered, nothing to fail.
    CredentialProviders::none()
        .register_metrics(&prometheus::Registry::new())
        .expect("nothing to register");
}

/// What is done to the plugin, how it is undone, and what the refusal says.
type Case<'a> = (&'a str, &'a dyn Fn(), &'a dyn Fn(), &'a str);

/// A plugin that became unsafe after start — swapped for a link, made writable by its group,
/// or its bin dir made so — is not executed: the lookup fails naming the path, and is counted.
#[tokio::test]
async fn a_plugin_made_unsafe_after_start_is_not_executed_and_is_counted() {
    let fixture = Fixture::new("Image", "0s");
    let providers = fixture.providers(r#"["r.io:5000"]"#, "0");
    let bin = fixture.dir.path().join("bin");
    let plugin = bin.join("counting");
    let moved = fixture.dir.path().join("moved");
    let mode = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    };
    let cases: [Case<'_>; 3] = [
        (
            "a link",
            &|| {
                std::fs::rename(&plugin, &moved).expect("move");
                std::os::unix::fs::symlink(&moved, &plugin).expect("link");
            },
            &|| {
                std::fs::remove_file(&plugin).expect("unlink");
                std::fs::rename(&moved, &plugin).expect("move back");
            },
            "a symbolic link",
        ),
        (
            "group-writable",
            &|| mode(&plugin, 0o775),
            &|| mode(&plugin, 0o755),
            "mode 0775",
        ),
        (
            "in a world-writable bin dir",
            &|| mode(&bin, 0o777),
            &|| mode(&bin, 0o755),
            "is writable by its group and others",
        ),
    ];
    for (i, (case, break_it, mend_it, said)) in cases.iter().enumerate() {
        break_it();
        let provided = providers.lookup("r.io:5000/a").await;
        mend_it();
        assert!(provided.credentials.is_empty(), "{case}");
        let [ExecError::Untrusted { ref source, .. }] = provided.failures[..] else {
            panic!("{case}: {:?}", provided.failures);
        };
        let text = source.to_string();
        assert!(text.contains(said), "{case}: {text}");
        assert_eq!(fixture.calls(), 0, "{case}: the plugin ran");
        assert_eq!(errors(&providers), i as u64 + 1, "{case}");
        assert_eq!(runs(&providers), 0, "{case}");
    }
    // Mended, it runs again.
    let provided = providers.lookup("r.io:5000/a").await;
    assert_eq!(users(&provided), ["node"]);
    assert_eq!(fixture.calls(), 1);
}
