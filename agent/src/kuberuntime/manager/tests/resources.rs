//! What the runtime is asked for a container's resources through `KubeRuntimeManager` against
//! the CRI fake: huge page limits for every size the node has (upstream
//! `GetHugepageLimitsFromResources`), and the CFS quota in the configured period.

use crate::testing;
use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_openapi::{
    api::core::v1::{Container, ResourceRequirements},
    apimachinery::pkg::api::resource::Quantity,
};
use tokio_util::sync::CancellationToken;

use crate::{
    cm::helpers::CfsQuota,
    container::PodUid,
    cri::{convert::get_pod_status, fake::FakeRuntime},
    kuberuntime::{NoProbes, container_config::ResourceOptions},
};

const IMAGE: &str = "localhost/swiftlet/busybox:latest";

fn container(name: &str, limits: &[(&str, &str)]) -> Container {
    let list: std::collections::BTreeMap<String, Quantity> = limits
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
        .collect();
    Container {
        name: name.into(),
        image: Some(IMAGE.into()),
        image_pull_policy: Some("Never".into()),
        // Requests equal to the limits, as upstream's validation requires of huge pages.
        resources: Some(ResourceRequirements {
            requests: Some(list.clone()),
            limits: Some(list),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The resources the fake was asked to create container `name` with.
fn asked(fake: &FakeRuntime, name: &str) -> Option<cri::LinuxContainerResources> {
    fake.container_ids()
        .iter()
        .filter_map(|id| fake.container_config(id))
        .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
        .and_then(|c| c.linux?.resources)
}

#[tokio::test]
async fn containers_ask_for_every_hugepage_size_and_the_configured_cfs_period() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image(IMAGE);
    let (m, _) = crate::kuberuntime::fixtures::runtime_manager_with(
        &fake,
        "swiftlet-manager-resources-tests",
        false,
        ResourceOptions {
            cfs_quota: CfsQuota {
                enforce: true,
                period_us: 50_000,
            },
            hugepage_sizes: vec![2 << 20, 1 << 30],
        },
    );
    let pod = testing::pod()
        .named("default", "web", "uid-1")
        .host_network(true)
        .containers(vec![
            container(
                "huge",
                &[
                    ("cpu", "500m"),
                    ("memory", "64Mi"),
                    ("hugepages-2Mi", "8Mi"),
                ],
            ),
            container("plain", &[("cpu", "100m"), ("memory", "64Mi")]),
        ])
        .build();
    let status = get_pod_status(fake.as_ref(), &PodUid::from("uid-1"), "web", "default")
        .await
        .expect("status");
    let outcome = m
        .sync_pod(
            &pod,
            &status,
            "/kubepods/podx",
            &NoProbes,
            &CancellationToken::new(),
        )
        .await;
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    let limits = |name| {
        asked(&fake, name).map(|r| {
            (
                r.hugepage_limits
                    .into_iter()
                    .map(|l| (l.page_size, l.limit))
                    .collect::<Vec<_>>(),
                r.cpu_quota,
                r.cpu_period,
            )
        })
    };
    assert_eq!(
        limits("huge"),
        Some((
            vec![("2MB".to_owned(), 8 << 20), ("1GB".to_owned(), 0)],
            25_000,
            50_000
        ))
    );
    // A container asking for none may use none of any size.
    assert_eq!(
        limits("plain"),
        Some((
            vec![("2MB".to_owned(), 0), ("1GB".to_owned(), 0)],
            5_000,
            50_000
        ))
    );
}
