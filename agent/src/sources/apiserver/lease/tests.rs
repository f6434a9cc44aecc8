//! The lease controller against the scripted API server: create, renew from the last lease, and
//! the conflict path, with exact paths, bodies and renew times.

use std::time::Duration;

use http::Method;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::testing::fake_api::{FakeApi, T0_SECONDS, fake_api, paused_clock, status_error};

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1";

/// `MicroTime` of `T0 + seconds`.
fn renew_time(seconds: u64) -> String {
    let at = k8s_openapi::jiff::Timestamp::from_second(
        i64::try_from(T0_SECONDS + seconds).expect("fits"),
    )
    .expect("valid");
    at.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

fn start(uid: Option<&str>) -> (FakeApi, watch::Sender<Option<String>>, CancellationToken) {
    let (client, api) = fake_api();
    let (uid_tx, uid_rx) = watch::channel(uid.map(str::to_owned));
    let options = ApiServerOptions::new("n1".into(), Duration::from_secs(10), 40);
    let cancel = CancellationToken::new();
    let controller = LeaseController::new(client, &options, paused_clock(), uid_rx);
    tokio::spawn(controller.run(cancel.clone()));
    (api, uid_tx, cancel)
}

fn with_version(lease: &Value, version: &str) -> Value {
    let mut lease = lease.clone();
    lease["apiVersion"] = json!("coordination.k8s.io/v1");
    lease["kind"] = json!("Lease");
    lease["metadata"]["resourceVersion"] = json!(version);
    lease
}

#[tokio::test(start_paused = true)]
async fn creates_the_lease_then_renews_it_every_quarter_duration() {
    let (mut api, _uid, cancel) = start(Some("uid-1"));

    let get = api.expect(Method::GET, LEASE).await;
    get.reply(404, &status_error(404, "NotFound"));

    let create = api.expect(Method::POST, LEASES).await;
    assert_eq!(create.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        create.body,
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": "n1",
                "namespace": "kube-node-lease",
                "ownerReferences": [{ "apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1" }],
            },
            "spec": {
                "holderIdentity": "n1",
                "leaseDurationSeconds": 40,
                "renewTime": renew_time(0),
            },
        })
    );
    let stored = with_version(&create.body, "100");
    create.reply(201, &stored);

    // 10 s later (40 s × 0.25): a PUT of the lease last written, no GET.
    let renew = api.expect(Method::PUT, LEASE).await;
    assert_eq!(renew.body["metadata"]["resourceVersion"], "100");
    assert_eq!(renew.body["spec"]["renewTime"], renew_time(10));
    assert_eq!(renew.body["spec"]["holderIdentity"], "n1");
    assert_eq!(renew.body["spec"]["leaseDurationSeconds"], 40);
    assert_eq!(renew.body["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    let stored = with_version(&renew.body, "101");
    renew.reply(200, &stored);

    let second = api.expect(Method::PUT, LEASE).await;
    assert_eq!(second.body["metadata"]["resourceVersion"], "101");
    assert_eq!(second.body["spec"]["renewTime"], renew_time(20));
    let stored = with_version(&second.body, "102");
    second.reply(200, &stored);
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_conflict_reads_the_lease_again_and_retries() {
    let (mut api, _uid, cancel) = start(Some("uid-1"));
    // The lease exists already: read, then renewed (not created).
    let get = api.expect(Method::GET, LEASE).await;
    let existing = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": { "name": "n1", "namespace": "kube-node-lease", "resourceVersion": "7",
            "ownerReferences": [{ "apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-0" }] },
        "spec": { "holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": "2023-01-01T00:00:00.000000Z" },
    });
    get.reply(200, &existing);
    let update = api.expect(Method::PUT, LEASE).await;
    assert_eq!(update.body["metadata"]["resourceVersion"], "7");
    assert_eq!(update.body["spec"]["renewTime"], renew_time(0));
    assert_eq!(
        update.body["metadata"]["ownerReferences"][0]["uid"], "uid-0",
        "an existing owner is kept"
    );
    let stored = with_version(&update.body, "8");
    update.reply(200, &stored);

    // Someone else wrote it meanwhile: 409, GET, PUT from the fresh version.
    let stale = api.expect(Method::PUT, LEASE).await;
    assert_eq!(stale.body["metadata"]["resourceVersion"], "8");
    stale.reply(409, &status_error(409, "Conflict"));
    let reread = api.expect(Method::GET, LEASE).await;
    reread.reply(200, &with_version(&existing, "15"));
    let retry = api.expect(Method::PUT, LEASE).await;
    assert_eq!(retry.body["metadata"]["resourceVersion"], "15");
    assert_eq!(retry.body["spec"]["renewTime"], renew_time(10));
    let stored = with_version(&retry.body, "16");
    retry.reply(200, &stored);

    let next = api.expect(Method::PUT, LEASE).await;
    assert_eq!(next.body["metadata"]["resourceVersion"], "16");
    cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn the_lease_waits_for_the_node_uid_before_creating() {
    let (mut api, uid, cancel) = start(None);
    let get = api.expect(Method::GET, LEASE).await;
    get.reply(404, &status_error(404, "NotFound"));
    // No owner yet: nothing is created this round; the next renewal reads again.
    api.assert_no_request(Duration::from_secs(1)).await;
    uid.send_replace(Some("uid-9".into()));
    let get = api.expect(Method::GET, LEASE).await;
    get.reply(404, &status_error(404, "NotFound"));
    let create = api.expect(Method::POST, LEASES).await;
    assert_eq!(
        create.body["metadata"]["ownerReferences"][0]["uid"],
        "uid-9"
    );
    assert_eq!(create.body["spec"]["renewTime"], renew_time(10));
    cancel.cancel();
}
