//! A pod's runtime handler (upstream `pkg/kubelet/runtimeclass/runtimeclass_manager.go`
//! `LookupRuntimeHandler`): no `runtimeClassName` (or an empty one) is the runtime's default
//! handler `""`; a name is resolved through the `node.k8s.io/v1` RuntimeClass of that name to its
//! `handler`, which the sandbox is run with (CRI `RunPodSandbox`'s `runtime_handler`). A
//! RuntimeClass that does not exist fails the sandbox's creation, as upstream's
//! `createPodSandbox` fails (the pod stays Pending and the next sync tries again); the runtime
//! refusing an unknown handler does the same with the runtime's error.
//!
//! Without an API server (no `--kubeconfig`) upstream has no RuntimeClass manager and every pod
//! gets the default handler; [`DefaultHandler`] does the same. With one, [`ApiRuntimeClasses`]
//! reads the RuntimeClass when a sandbox is made (upstream watches all RuntimeClasses with an
//! informer; a read per sandbox sees the same objects, with nothing cached to bound).
//!
//! Not here: the overhead a RuntimeClass declares (the API server's admission copies it into the
//! pod's `spec.overhead`, which admission counts), its scheduling constraints (the API server's
//! and the scheduler's).

use k8s_openapi::api::{core::v1::Pod, node::v1::RuntimeClass};
use kube::{Api, Client};

/// Why a pod's RuntimeClass gave no handler; the message is upstream's.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeClassError {
    /// The API server's `NotFound` message for the object.
    #[error("runtimeclasses.node.k8s.io {name:?} not found")]
    NotFound { name: String },
    #[error("failed to lookup RuntimeClass {name}: {source}")]
    Lookup {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Where RuntimeClasses are read from.
#[tonic::async_trait]
pub trait RuntimeClasses: Send + Sync {
    /// The handler of the RuntimeClass `name` (never empty: `name` is not).
    async fn handler(&self, name: &str) -> Result<String, RuntimeClassError>;
}

/// No API server: every RuntimeClass name means the runtime's default handler, as upstream
/// without a RuntimeClass manager.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultHandler;

#[tonic::async_trait]
impl RuntimeClasses for DefaultHandler {
    async fn handler(&self, _name: &str) -> Result<String, RuntimeClassError> {
        Ok(String::new())
    }
}

/// The API server's RuntimeClasses, read through kube's client.
pub struct ApiRuntimeClasses(pub Client);

#[tonic::async_trait]
impl RuntimeClasses for ApiRuntimeClasses {
    async fn handler(&self, name: &str) -> Result<String, RuntimeClassError> {
        let api: Api<RuntimeClass> = Api::all(self.0.clone());
        match api.get(name).await {
            Ok(class) => Ok(class.handler),
            Err(kube::Error::Api(status)) if status.code == 404 || status.reason == "NotFound" => {
                Err(RuntimeClassError::NotFound {
                    name: name.to_owned(),
                })
            }
            Err(source) => Err(RuntimeClassError::Lookup {
                name: name.to_owned(),
                source,
            }),
        }
    }
}

/// The RuntimeClass name a pod asks for, if any (an empty name is the default, as upstream).
pub fn runtime_class_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.runtime_class_name.as_deref())
        .filter(|name| !name.is_empty())
}

/// Upstream `LookupRuntimeHandler`: `default` without a RuntimeClass name, else the class's
/// handler.
pub async fn lookup_runtime_handler(
    classes: &dyn RuntimeClasses,
    pod: &Pod,
    default: &str,
) -> Result<String, RuntimeClassError> {
    match runtime_class_name(pod) {
        None => Ok(default.to_owned()),
        Some(name) => classes.handler(name).await,
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::json;

    use super::*;
    use crate::testing::fake_api::{fake_api, status_error};

    fn pod(class: Option<&str>) -> Pod {
        crate::testing::pod()
            .spec(|s| s.runtime_class_name = class.map(Into::into))
            .build()
    }

    #[tokio::test]
    async fn a_pod_without_a_class_gets_the_default_handler_without_asking() {
        let (client, _api) = fake_api();
        let classes = ApiRuntimeClasses(client);
        let handler = lookup_runtime_handler(&classes, &pod(None), "").await;
        assert_eq!(handler.ok().as_deref(), Some(""));
        let handler = lookup_runtime_handler(&classes, &pod(Some("")), "").await;
        assert_eq!(handler.ok().as_deref(), Some(""));
        let standalone = lookup_runtime_handler(&DefaultHandler, &pod(Some("kata")), "").await;
        assert_eq!(standalone.ok().as_deref(), Some(""));
    }

    #[tokio::test]
    async fn a_class_resolves_to_its_handler_and_a_missing_one_is_named() {
        let (client, mut api) = fake_api();
        let classes = ApiRuntimeClasses(client);
        let answered = tokio::spawn(async move {
            let get = api
                .expect(Method::GET, "/apis/node.k8s.io/v1/runtimeclasses/kata")
                .await;
            get.reply(
                200,
                &json!({
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": { "name": "kata" },
                    "handler": "kata-qemu",
                }),
            );
            let get = api
                .expect(Method::GET, "/apis/node.k8s.io/v1/runtimeclasses/absent")
                .await;
            get.reply(404, &status_error(404, "NotFound"));
        });
        let handler = lookup_runtime_handler(&classes, &pod(Some("kata")), "").await;
        assert_eq!(handler.ok().as_deref(), Some("kata-qemu"));
        let missing = lookup_runtime_handler(&classes, &pod(Some("absent")), "")
            .await
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            missing.as_deref(),
            Some("runtimeclasses.node.k8s.io \"absent\" not found")
        );
        answered.await.expect("the fake API answered");
    }
}
