//! The volume code's API reader, [`KubeObjects`], also serves containers' environments
//! (`kuberuntime::env::EnvObjects`): one client for every ConfigMap and Secret the node reads.
//! The environment takes a ConfigMap's `data` only and a Secret's `data` (upstream
//! `makeEnvironmentVariables` reads `configMap.Data` and `secret.Data`; the API server folds
//! `stringData` into `data`, its keys winning, which is done here too for one that did not, as
//! the volumes do).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;

use super::{KubeObjects, api_objects::secret_data};
use crate::kuberuntime::env::{EnvObjects, ReadError};

#[tonic::async_trait]
impl EnvObjects for KubeObjects {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, ReadError> {
        let api: Api<ConfigMap> = Api::namespaced(self.0.clone(), namespace);
        let found = api.get_opt(name).await.map_err(|e| ReadError(e.into()))?;
        Ok(found.map(|c| c.data.unwrap_or_default()))
    }

    async fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, ReadError> {
        let api: Api<Secret> = Api::namespaced(self.0.clone(), namespace);
        let found = api.get_opt(name).await.map_err(|e| ReadError(e.into()))?;
        Ok(found.map(|s| secret_data(s).0))
    }
}
