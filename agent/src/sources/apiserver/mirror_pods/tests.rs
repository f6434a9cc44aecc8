//! Mirror pods: upstream's rules as a table over `plan`, the mirror pod's body, and the
//! controller's calls against the scripted API server.

use std::collections::{BTreeMap, HashSet};

use http::Method;
use serde_json::json;

use super::*;
use crate::{
    sources::CONFIG_SOURCE_ANNOTATION,
    testing::{
        self,
        fake_api::{fake_api, status_error},
    },
};

/// Static pod `name` of node n1 made from manifest hash `hash` (its UID, as the file source).
fn static_pod(name: &str, hash: &str) -> Arc<Pod> {
    Arc::new(
        testing::pod()
            .named("kube-system", &format!("{name}-n1"), hash)
            .annotation(CONFIG_SOURCE_ANNOTATION, "file")
            .annotation(CONFIG_HASH_ANNOTATION, hash)
            .label("tier", "control-plane")
            .container(testing::container("etcd"))
            .build(),
    )
}

fn mirror(name: &str, uid: &str, hash: &str, deleting: bool) -> MirrorPod {
    MirrorPod {
        uid: uid.into(),
        namespace: "kube-system".into(),
        name: format!("{name}-n1"),
        hash: hash.into(),
        deleting,
        status: None,
    }
}

fn by_name(mirrors: &[MirrorPod]) -> BTreeMap<String, MirrorPod> {
    mirrors
        .iter()
        .map(|m| (format!("{}_{}", m.name, m.namespace), m.clone()))
        .collect()
}

fn names(of: &[&str]) -> HashSet<String> {
    of.iter().map(|n| format!("{n}-n1_kube-system")).collect()
}

/// The actions as short strings: `create <name>`, `delete <uid>`, `replace <uid>`.
fn summary(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::Create(pod) => format!("create {}", full_name(pod)),
            Action::Delete {
                mirror,
                replace: None,
            } => format!("delete {}", mirror.uid),
            Action::Delete {
                mirror,
                replace: Some(_),
            } => format!("replace {}", mirror.uid),
        })
        .collect()
}

#[test]
fn upstreams_rules() {
    let etcd = static_pod("etcd", "h1");
    let running = |pods: &[&Arc<Pod>]| StaticPods {
        running: pods.iter().map(|p| (*p).clone()).collect(),
        wanted: pods.iter().map(|p| full_name(p)).collect(),
        terminating: HashSet::new(),
    };
    let cases: Vec<(&str, StaticPods, Vec<MirrorPod>, Vec<&str>)> = vec![
        (
            "a running static pod without a mirror gets one",
            running(&[&etcd]),
            vec![],
            vec!["create etcd-n1_kube-system"],
        ),
        (
            "one with its mirror: nothing",
            running(&[&etcd]),
            vec![mirror("etcd", "m1", "h1", false)],
            vec![],
        ),
        (
            "a mirror of another hash (the manifest changed) is replaced",
            running(&[&etcd]),
            vec![mirror("etcd", "m0", "h0", false)],
            vec!["replace m0"],
        ),
        (
            "a mirror being deleted is replaced",
            running(&[&etcd]),
            vec![mirror("etcd", "m1", "h1", true)],
            vec!["replace m1"],
        ),
        (
            "a mirror no static pod has is an orphan",
            running(&[]),
            vec![mirror("etcd", "m1", "h1", false)],
            vec!["delete m1"],
        ),
        (
            "one whose static pod is terminating stays",
            StaticPods {
                terminating: names(&["etcd"]),
                ..StaticPods::default()
            },
            vec![mirror("etcd", "m1", "h1", false)],
            vec![],
        ),
        (
            "one whose static pod is wanted but not started (it waits for its predecessor) stays",
            StaticPods {
                wanted: names(&["etcd"]),
                ..StaticPods::default()
            },
            vec![mirror("etcd", "m0", "h0", false)],
            vec![],
        ),
    ];
    for (what, statics, mirrors, want) in cases {
        assert_eq!(summary(&plan(&statics, &by_name(&mirrors))), want, "{what}");
    }
}

#[test]
fn the_mirror_is_the_static_pod_with_the_hash_and_the_node_as_owner() {
    let etcd = static_pod("etcd", "h1");
    let body = serde_json::to_value(mirror_of(&etcd, "n1", "node-uid")).expect("json");
    assert_eq!(body["metadata"]["name"], "etcd-n1");
    assert_eq!(body["metadata"]["namespace"], "kube-system");
    assert_eq!(body["metadata"]["labels"]["tier"], "control-plane");
    let annotations = &body["metadata"]["annotations"];
    assert_eq!(annotations["kubernetes.io/config.mirror"], "h1");
    assert_eq!(annotations["kubernetes.io/config.hash"], "h1");
    assert_eq!(annotations["kubernetes.io/config.source"], "file");
    assert_eq!(
        body["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "node-uid", "controller": true}])
    );
    // The API server gives it its own UID, and its status.
    assert_eq!(body["metadata"].get("uid"), None);
    assert_eq!(body.get("status"), None);
    assert!(body["spec"]["containers"].is_array());
}

const PODS: &str = "/api/v1/namespaces/kube-system/pods";

#[tokio::test(start_paused = true)]
async fn created_replaced_and_orphans_deleted_with_the_uid_precondition() {
    let (client, mut api) = fake_api();
    let statics = Arc::new(std::sync::Mutex::new(None::<StaticPods>));
    let check = {
        let statics = statics.clone();
        Arc::new(move || statics.lock().expect("lock").clone()) as StaticPodsCheck
    };
    let (_uid_tx, node_uid) = watch::channel(Some("node-uid".to_owned()));
    let (mirrors_tx, mirrors) = watch::channel(None);
    let mut controller = MirrorPodController::new(client, "n1".into(), node_uid, check, mirrors);
    let set_statics = |pods: &[&Arc<Pod>]| {
        *statics.lock().expect("lock") = Some(StaticPods {
            running: pods.iter().map(|p| (*p).clone()).collect(),
            wanted: pods.iter().map(|p| full_name(p)).collect(),
            terminating: HashSet::new(),
        });
    };

    // Nothing before both the static pods and the mirror pods are known.
    mirrors_tx.send_replace(Some(by_name(&[mirror("old", "m-old", "h9", false)])));
    controller.sync().await;
    api.assert_no_request(Duration::from_secs(1)).await;

    // The orphan goes, the running static pod gets its mirror.
    let etcd = static_pod("etcd", "h1");
    set_statics(&[&etcd]);
    let server = async {
        let create = api.expect(Method::POST, PODS).await;
        assert_eq!(
            create.body["metadata"]["annotations"]["kubernetes.io/config.mirror"],
            "h1"
        );
        create.reply(
            201,
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "etcd-n1", "namespace": "kube-system", "uid": "m-1"}}),
        );
        let delete = api.expect(Method::DELETE, &format!("{PODS}/old-n1")).await;
        assert_eq!(
            delete.body,
            json!({"gracePeriodSeconds": 0, "preconditions": {"uid": "m-old"}})
        );
        delete.reply(
            200,
            &json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}),
        );
    };
    tokio::join!(server, controller.sync());
    // The watch has not shown them yet: nothing is sent twice meanwhile.
    controller.sync().await;
    api.assert_no_request(Duration::from_secs(1)).await;

    // The manifest changed: the mirror of the old hash is deleted, then made again.
    mirrors_tx.send_replace(Some(by_name(&[mirror("etcd", "m-1", "h1", false)])));
    let changed = static_pod("etcd", "h2");
    set_statics(&[&changed]);
    let server = async {
        let delete = api.expect(Method::DELETE, &format!("{PODS}/etcd-n1")).await;
        assert_eq!(delete.body["preconditions"]["uid"], "m-1");
        delete.reply(
            200,
            &json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}),
        );
        let create = api.expect(Method::POST, PODS).await;
        assert_eq!(
            create.body["metadata"]["annotations"]["kubernetes.io/config.mirror"],
            "h2"
        );
        create.reply(
            201,
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "etcd-n1", "namespace": "kube-system", "uid": "m-2"}}),
        );
    };
    tokio::join!(server, controller.sync());

    // Deleted through the API by someone else: made again. A refusal waits for the retry.
    mirrors_tx.send_replace(Some(BTreeMap::new()));
    tokio::time::sleep(RETRY_PERIOD).await;
    let server = async {
        api.expect(Method::POST, PODS)
            .await
            .reply(500, &status_error(500, "InternalError"));
    };
    tokio::join!(server, controller.sync());
    controller.sync().await;
    api.assert_no_request(Duration::from_secs(1)).await;
    tokio::time::sleep(RETRY_PERIOD).await;
    let server = async {
        api.expect(Method::POST, PODS).await.reply(
            201,
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "etcd-n1", "namespace": "kube-system", "uid": "m-3"}}),
        );
    };
    tokio::join!(server, controller.sync());
}
