use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::cri::fake::{
    FakeRuntime,
    fixtures::{container_config, pod_sandbox_config},
};

const MIB: u64 = 1024 * 1024;

/// A 10 MiB image filesystem whose free space the test sets.
fn fs(available: &Arc<AtomicU64>) -> FsStats {
    let available = available.clone();
    Arc::new(move |_| {
        Ok(FsUsage {
            capacity: 10 * MIB,
            available: available.load(Ordering::SeqCst),
        })
    })
}

fn manager(
    fake: &Arc<FakeRuntime>,
    policy: ImageGcPolicy,
    available: &Arc<AtomicU64>,
) -> ImageGcManager {
    let clock = {
        let fake = fake.clone();
        Arc::new(move || fake.now())
    };
    ImageGcManager::new(fake.clone(), fake.clone(), policy)
        .with_fs_stats(fs(available))
        .with_clock(clock)
}

/// Runs a container of `image` in a new pod; exits it unless `keep_running`.
async fn use_image(fake: &FakeRuntime, uid: &str, image: &str, keep_running: bool) {
    let sandbox = pod_sandbox_config(uid, uid, "ns", 0);
    let sandbox_id = fake
        .run_pod_sandbox(sandbox.clone(), "")
        .await
        .expect("sandbox");
    let config = container_config(&sandbox, "app", image, 0, 0);
    let id = fake
        .create_container(&sandbox_id, config, sandbox)
        .await
        .expect("create");
    fake.start_container(&id).await.expect("start");
    if !keep_running {
        fake.exit_container(&id, 0);
    }
}

const NO_MIN_AGE: ImageGcPolicy = ImageGcPolicy {
    high_threshold_percent: 85,
    low_threshold_percent: 80,
    min_age: Duration::ZERO,
    sandbox_image: None,
};

#[test]
fn thresholds_as_upstream() {
    let usage = |available| FsUsage {
        capacity: 100,
        available,
    };
    let p = ImageGcPolicy::default();
    assert_eq!(bytes_to_free(&p, usage(16)), None, "84% used");
    assert_eq!(
        bytes_to_free(&p, usage(15)),
        Some(5),
        "85% used: down to 80%"
    );
    assert_eq!(bytes_to_free(&p, usage(0)), Some(20));
    // Available beyond capacity counts as capacity.
    assert_eq!(bytes_to_free(&p, usage(500)), None);
    let aggressive = ImageGcPolicy {
        high_threshold_percent: 1,
        low_threshold_percent: 0,
        ..p.clone()
    };
    assert_eq!(bytes_to_free(&aggressive, usage(98)), Some(2));
    assert_eq!(bytes_to_free(&aggressive, usage(100)), None, "0% used");
    assert!(
        !ImageGcPolicy {
            high_threshold_percent: 100,
            ..p
        }
        .enabled()
    );
}

#[tokio::test]
async fn below_the_high_threshold_nothing_goes() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image("old:1");
    let available = Arc::new(AtomicU64::new(2 * MIB));
    assert_eq!(
        manager(&fake, NO_MIN_AGE, &available)
            .garbage_collect()
            .await
            .expect("gc"),
        0
    );
    assert_eq!(fake.image_names(), ["old:1"]);
}

#[tokio::test]
async fn unused_images_go_least_recently_used_first_until_the_low_threshold() {
    let fake = Arc::new(FakeRuntime::new());
    for image in [
        "never-used:1",
        "used-long-ago:1",
        "used-lately:1",
        "running:1",
        "exited:1",
        "pause:1",
        "sandbox:1",
    ] {
        fake.add_image(image);
    }
    fake.pin_image("pause:1");
    let available = Arc::new(AtomicU64::new(5 * MIB));
    let policy = ImageGcPolicy {
        sandbox_image: Some("sandbox:1".into()),
        ..NO_MIN_AGE
    };
    let gc = manager(&fake, policy, &available);
    use_image(&fake, "a", "used-long-ago:1", true).await;
    gc.detect_images(fake.now()).await.expect("detect");
    fake.advance_clock(Duration::from_secs(60));
    // The pod of used-long-ago goes; used-lately is used now.
    fake.vanish_container(&fake.container_ids()[0]);
    use_image(&fake, "b", "used-lately:1", true).await;
    gc.detect_images(fake.now()).await.expect("detect");
    fake.vanish_container(&fake.container_ids()[0]);
    use_image(&fake, "c", "running:1", true).await;
    use_image(&fake, "d", "exited:1", false).await;
    // 90% used: 10 MiB * 20% - 1 MiB = 1 MiB to free; the never-used image goes first.
    available.store(MIB, Ordering::SeqCst);
    assert_eq!(gc.garbage_collect().await.expect("gc"), MIB);
    assert_eq!(
        fake.image_names(),
        [
            "exited:1",
            "pause:1",
            "running:1",
            "sandbox:1",
            "used-lately:1",
            "used-long-ago:1"
        ]
    );
    // 2 MiB wanted: the one used longest ago, then the one used lately.
    available.store(0, Ordering::SeqCst);
    assert_eq!(gc.garbage_collect().await.expect("gc"), 2 * MIB);
    assert_eq!(
        fake.image_names(),
        ["exited:1", "pause:1", "running:1", "sandbox:1"]
    );
    // Nothing else may go: in use by a running or an exited container, pinned, or the sandbox
    // image.
    let err = gc.garbage_collect().await.expect_err("not enough");
    assert!(
        matches!(err, ImageGcError::NotEnough { freed: 0, .. }),
        "{err}"
    );
    assert_eq!(gc.delete_unused_images().await.expect("delete"), 0);
    assert_eq!(
        fake.image_names(),
        ["exited:1", "pause:1", "running:1", "sandbox:1"]
    );
}

#[tokio::test]
async fn young_images_are_kept_but_those_found_at_start_are_old() {
    let fake = Arc::new(FakeRuntime::new());
    fake.add_image("there-at-start:1");
    let available = Arc::new(AtomicU64::new(0));
    let policy = ImageGcPolicy {
        sandbox_image: None,
        ..ImageGcPolicy::default()
    };
    let gc = manager(&fake, policy, &available);
    assert_eq!(gc.delete_unused_images().await.expect("delete"), MIB);
    fake.add_image("new:1");
    assert_eq!(gc.delete_unused_images().await.expect("delete"), 0);
    assert_eq!(fake.image_names(), ["new:1"]);
    fake.advance_clock(Duration::from_secs(121));
    assert_eq!(gc.delete_unused_images().await.expect("delete"), MIB);
    assert!(fake.image_names().is_empty());
}

#[tokio::test]
async fn a_zero_capacity_is_an_error() {
    let fake = Arc::new(FakeRuntime::new());
    let gc =
        ImageGcManager::new(fake.clone(), fake.clone(), NO_MIN_AGE).with_fs_stats(Arc::new(|_| {
            Ok(FsUsage {
                capacity: 0,
                available: 0,
            })
        }));
    let err = gc.garbage_collect().await.expect_err("zero");
    assert!(err.to_string().contains("invalid capacity 0"), "{err}");
}
