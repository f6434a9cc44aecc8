use super::*;
use crate::container::RuntimeHandler;
use crate::testing;
use std::os::unix::fs::PermissionsExt as _;

fn pod(uid: &str, host_users: Option<bool>) -> Pod {
    testing::pod()
        .uid(uid)
        .spec(|s| s.host_users = host_users)
        .build()
}

fn features(user_namespaces: bool) -> watch::Receiver<Option<RuntimeFeatures>> {
    let (tx, rx) = watch::channel(Some(RuntimeFeatures {
        supplemental_groups_policy: false,
        handlers: vec![RuntimeHandler {
            name: String::new(),
            user_namespaces,
            recursive_read_only_mounts: false,
        }],
    }));
    // The receiver keeps the last value after the sender is gone.
    drop(tx);
    rx
}

fn range(ns: &Option<cri::UserNamespace>) -> Option<(u32, u32)> {
    let ns = ns.as_ref()?;
    let uid = ns.uids.first()?;
    assert_eq!(ns.uids, ns.gids, "uid and gid mappings are the same");
    assert_eq!(uid.container_id, 0);
    Some((uid.host_id, uid.length))
}

#[test]
fn pods_without_host_users_false_use_the_nodes_namespace() {
    let m = UsernsManager::host_only();
    for host_users in [None, Some(true)] {
        let ns = m.mappings(&pod("a", host_users), "").expect("node");
        assert_eq!(
            ns.map(|n| (n.mode, n.uids.len())),
            Some((cri::NamespaceMode::Node as i32, 0))
        );
    }
    let refused = m
        .mappings(&pod("a", Some(false)), "")
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        refused.as_deref(),
        Some("RuntimeClass handler \"\" does not support user namespaces")
    );
}

#[test]
fn a_runtime_without_the_feature_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = UsernsManager::load(dir.path(), features(false)).expect("load");
    assert!(matches!(
        m.mappings(&pod("a", Some(false)), ""),
        Err(UsernsError::Unsupported { .. })
    ));
    assert_eq!(m.allocated(), 0);
}

#[test]
fn ranges_never_overlap_are_stable_and_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = UsernsManager::load(dir.path(), features(true)).expect("load");
    let a = range(&m.mappings(&pod("a", Some(false)), "").expect("a"));
    let b = range(&m.mappings(&pod("b", Some(false)), "").expect("b"));
    assert_eq!(a, Some((FIRST_HOST_ID, USERNS_LENGTH)));
    assert_eq!(b, Some((FIRST_HOST_ID + USERNS_LENGTH, USERNS_LENGTH)));
    // Asking again gives the same range.
    assert_eq!(
        range(&m.mappings(&pod("a", Some(false)), "").expect("a")),
        a
    );
    let path = dir.path().join(CHECKPOINT_FILE);
    let mode = std::fs::metadata(&path)
        .expect("checkpoint")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // A restarted agent keeps them, and gives a new pod a range of its own.
    let again = UsernsManager::load(dir.path(), features(true)).expect("reload");
    assert_eq!(again.allocated(), 2);
    assert_eq!(
        range(&again.mappings(&pod("b", Some(false)), "").expect("b")),
        b
    );
    let c = range(&again.mappings(&pod("c", Some(false)), "").expect("c"));
    assert_eq!(c, Some((FIRST_HOST_ID + 2 * USERNS_LENGTH, USERNS_LENGTH)));
    // A freed range is handed out again.
    again.retain(|uid| uid.0 != "a");
    assert_eq!(again.allocated(), 2);
    let d = range(&again.mappings(&pod("d", Some(false)), "").expect("d"));
    assert_eq!(d, a);
}

#[test]
fn a_bad_checkpoint_stops_the_start_naming_the_file() {
    let cases = [
        "not json",
        r#"{"length":4096,"pods":{}}"#,
        r#"{"length":65536,"pods":{"a":100}}"#,
        r#"{"length":65536,"pods":{"a":65536,"b":65536}}"#,
        r#"{"length":65536,"pods":{},"extra":1}"#,
    ];
    for text in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(CHECKPOINT_FILE), text).expect("write");
        let err = UsernsManager::load(dir.path(), features(true))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(CHECKPOINT_FILE), "{text}: {err}");
    }
}

#[test]
fn a_symlinked_checkpoint_is_not_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep").expect("write");
    std::os::unix::fs::symlink(&victim, dir.path().join(CHECKPOINT_FILE)).expect("symlink");
    assert!(UsernsManager::load(dir.path(), features(true)).is_err());
    // A planted temporary file is replaced, not written through.
    let tmp = dir.path().join(CHECKPOINT_FILE).with_extension("tmp");
    std::fs::remove_file(dir.path().join(CHECKPOINT_FILE)).expect("rm");
    std::os::unix::fs::symlink(&victim, &tmp).expect("symlink");
    let m = UsernsManager::load(dir.path(), features(true)).expect("load");
    m.mappings(&pod("a", Some(false)), "").expect("a");
    assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "keep");
}
