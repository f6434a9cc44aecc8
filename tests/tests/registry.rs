//! Images pulled from a real registry, as nodes get them: the test registry
//! (`swiftlet_tests::registry`, Debian's distribution registry on loopback with TLS and htpasswd)
//! holding the local images, and the private containerd pulling them over CRI with the
//! credentials it is given and the CA its `certs.d` names.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use k8s_cri::v1::{AuthConfig, ImageSpec};
use swiftlet::cri::ImageService as _;
use swiftlet_tests::{
    node::BUSYBOX,
    registry::{TestRegistry, USER, header},
    runtime_endpoint, with_cri,
};

fn spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}

fn auth(password: &str) -> AuthConfig {
    AuthConfig {
        username: USER.to_owned(),
        password: password.to_owned(),
        ..Default::default()
    }
}

/// The test support itself: the registry lets only its user in, holds what was pushed under
/// the pushed digest, and containerd pulls it over TLS with the right password only; removing
/// the pulled image leaves the imported busybox alone; dropping the registry stops it and
/// removes containerd's `hosts.toml`.
#[test]
fn the_test_registry_serves_pushed_images_to_its_user_over_tls() {
    let test = "the_test_registry_serves_pushed_images_to_its_user_over_tls";
    let Some(registry) = TestRegistry::for_test(test) else {
        return;
    };
    if runtime_endpoint(test).is_none() {
        return;
    }
    let right = (USER, registry.password.as_str());

    let anonymous = registry
        .request("GET", "/v2/", None, &[], None)
        .expect("an answer");
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    let challenge = header(&anonymous.head, "www-authenticate").expect("a challenge");
    assert!(challenge.starts_with("Basic "), "{challenge}");
    let wrong = registry
        .request("GET", "/v2/", Some((USER, "not-the-password")), &[], None)
        .expect("an answer");
    assert_eq!(wrong.status, 401, "{wrong:?}");
    let known = registry
        .request("GET", "/v2/", Some(right), &[], None)
        .expect("an answer");
    assert_eq!(known.status, 200, "{known:?}");

    let pushed = registry.push_local("busybox", "swiftlet/busybox", "latest");
    assert_eq!(
        pushed.reference,
        registry.image("swiftlet/busybox", "latest")
    );
    let manifest = registry
        .request(
            "GET",
            "/v2/swiftlet/busybox/manifests/latest",
            Some(right),
            &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
            None,
        )
        .expect("an answer");
    assert_eq!(manifest.status, 200, "{manifest:?}");
    assert_eq!(
        header(&manifest.head, "docker-content-digest").as_deref(),
        Some(pushed.manifest_digest.as_str())
    );
    // A second push finds the blobs there and gives the same manifest.
    let again = registry.push_local("busybox", "swiftlet/busybox", "latest");
    assert_eq!(again.manifest_digest, pushed.manifest_digest);

    let hosts_dir = registry.hosts_dir().expect("a hosts folder").to_owned();
    let hosts = std::fs::read_to_string(hosts_dir.join("hosts.toml")).expect("hosts.toml");
    assert!(
        hosts.contains(&format!("[host.\"https://{}\"]", registry.host))
            && hosts.contains(&registry.ca_file().display().to_string()),
        "{hosts}"
    );

    let password = registry.password.clone();
    with_cri(test, |runtime| async move {
        let image = spec(&pushed.reference);
        let refused = [None, Some(auth("not-the-password"))];
        for credentials in refused {
            let error = runtime
                .pull_image(image.clone(), credentials.clone(), None)
                .await
                .expect_err("a pull without the right password fails");
            // containerd words it "401 Unauthorized", or, asked for basic auth with none to
            // give, "no basic auth credentials".
            let text = error.to_string().to_lowercase();
            assert!(
                text.contains("unauthorized") || text.contains("no basic auth credentials"),
                "{credentials:?}: {error}"
            );
        }
        assert!(
            runtime
                .image_status(image.clone())
                .await
                .expect("status")
                .is_none(),
            "a refused pull left the image"
        );
        runtime
            .pull_image(image.clone(), Some(auth(&password)), None)
            .await
            .expect("the pull with the password works");
        let pulled = runtime
            .image_status(image.clone())
            .await
            .expect("status")
            .expect("the pulled image");
        assert_eq!(pulled.id, pushed.config_digest);
        assert!(
            pulled
                .repo_digests
                .iter()
                .any(|d| d.ends_with(&pushed.manifest_digest)),
            "{:?}",
            pulled.repo_digests
        );
        let imported = runtime
            .image_status(spec(BUSYBOX))
            .await
            .expect("status")
            .expect("the imported busybox");
        assert_ne!(
            imported.id, pulled.id,
            "the pushed image has an ID of its own"
        );
        runtime
            .remove_image(image.clone())
            .await
            .expect("the pulled image removed");
        assert!(runtime.image_status(image).await.expect("status").is_none());
        assert!(
            runtime
                .image_status(spec(BUSYBOX))
                .await
                .expect("status")
                .is_some(),
            "removing the pulled image removed the imported one"
        );
    });

    let port = registry.port;
    drop(registry);
    assert!(!hosts_dir.exists(), "{} is left", hosts_dir.display());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the registry still listens"
    );
}
