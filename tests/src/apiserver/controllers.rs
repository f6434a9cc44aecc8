//! The kube-controller-manager loops a kubeadm cluster runs for the kubelet's certificates:
//! csrapproving (auto-approves node client CSRs, [`super::csr::approval`]) and csrsigning
//! (signs approved kubelet CSRs with the cluster CA, [`super::signer`]). Like the real ones
//! they act on the store's change events, after the request that caused them has been
//! answered, and write through the same store, so watchers see an ADDED then MODIFIED events.
//!
//! Upstream: `pkg/controller/certificates/certificate_controller.go` (an informer-driven
//! queue), `approver/sarapprove.go`, `signer/signer.go`.

use std::sync::Arc;

use k8s_openapi::ByteString;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::{
    ApiServer,
    csr::{self, KIND},
    meta::{meta_str, now_seconds},
    resources::{Resource, by_kind},
    signer::{self, SignError},
};

/// Runs the controllers until the store's change channel closes.
pub async fn run(server: Arc<ApiServer>) {
    let Some(resource) = by_kind("certificates.k8s.io/v1", KIND) else {
        return;
    };
    let mut changes = server.store().subscribe();
    resync(&server, resource).await;
    loop {
        match changes.recv().await {
            Ok(change) if change.resource == resource => {
                if let Some(name) = meta_str(&change.object, "name") {
                    reconcile(&server, resource, name).await;
                }
            }
            Ok(_) => {}
            // Missed events: look at every CSR again, as an informer's relist does.
            Err(RecvError::Lagged(_)) => resync(&server, resource).await,
            Err(RecvError::Closed) => return,
        }
    }
}

async fn resync(server: &ApiServer, resource: &'static Resource) {
    let names: Vec<String> = server
        .store()
        .list(resource, None, None)
        .map(|(key, _)| key.name.clone())
        .collect();
    for name in names {
        reconcile(server, resource, &name).await;
    }
}

/// One CSR: approve it if the approver would, else sign it if approved.
async fn reconcile(server: &ApiServer, resource: &'static Resource, name: &str) {
    let Ok(object) = server.store().get(resource, None, name) else {
        return;
    };
    if server.config.auto_approve
        && let Some(condition) = csr::approval(&object)
    {
        let _ = server.store().update(resource, None, name, |current| {
            // Decided again on the current state: a person may have approved or denied it.
            Ok(match csr::approval(current) {
                Some(_) => csr::with_condition(current, condition, now_seconds()),
                None => current.clone(),
            })
        });
        // The approval's own change event brings the CSR back for signing.
        return;
    }
    let Some(ca) = server.ca() else {
        return;
    };
    tokio::time::sleep(signer::SIGNING_DELAY).await;
    let cap = server.config.cluster_signing_seconds;
    let _ = server.store().update(resource, None, name, |current| {
        Ok(match signer::sign(ca, current, now_seconds(), cap) {
            Ok(pem) => with_certificate(current, &pem),
            Err(SignError::Validation(message)) => csr::with_condition(
                current,
                json!({
                    "type": "Failed",
                    "status": "True",
                    "reason": "SignerValidationFailure",
                    "message": message,
                }),
                now_seconds(),
            ),
            Err(SignError::NotOurs) => current.clone(),
            // Retried on the CSR's next change, as the queue's backoff would; said on stderr
            // (the controller's log) so a test that waits in vain can show why.
            Err(SignError::Signing(why)) => {
                log_signing_error(name, &why);
                current.clone()
            }
        })
    });
}

#[expect(
    clippy::print_stderr,
    reason = "the test API server's log is its stderr"
)]
fn log_signing_error(name: &str, why: &str) {
    eprintln!("swiftlet-test-apiserver: csrsigning: CSR {name}: {why}");
}

fn with_certificate(object: &Value, pem: &str) -> Value {
    let mut new = object.clone();
    let encoded = serde_json::to_value(ByteString(pem.as_bytes().to_vec())).unwrap_or_default();
    if let Some(map) = new.as_object_mut() {
        let status = map.entry("status").or_insert_with(|| json!({}));
        if let Some(status) = status.as_object_mut() {
            status.insert("certificate".to_owned(), encoded);
        }
    }
    new
}

#[cfg(test)]
mod tests;
