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

    fn providers(&self, match_images: &str, delay: &str) -> CredentialProviders {
        CredentialProviders::from_flags(
            Some(&self.config(match_images, delay)),
            Some(&self.dir.path().join("bin")),
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
        CredentialProviders::from_flags(Some(&config), Some(&fixture.dir.path().join("nope"))),
        Err(ConfigError::NoBinDir { .. })
    ));
    std::fs::set_permissions(bin.join("counting"), std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    assert!(matches!(
        CredentialProviders::from_flags(Some(&config), Some(&bin)),
        Err(ConfigError::NotExecutable { .. })
    ));
    std::fs::remove_file(bin.join("counting")).expect("remove");
    let error = CredentialProviders::from_flags(Some(&config), Some(&bin))
        .err()
        .expect("missing binary");
    assert!(matches!(error, ConfigError::NoBinary { .. }), "{error}");
    assert!(error.to_string().contains("counting"), "{error}");
}
