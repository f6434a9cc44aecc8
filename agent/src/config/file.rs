//! The parts of the configuration file that are not one setting each: the header it may declare
//! (`kind`, `apiVersion`) and the nested `authentication` and `authorization` mappings, as
//! written (durations as strings, so the loader can name the field and the bad value in one
//! message; unknown fields rejected by serde). The file's top-level fields are generated from the
//! settings table (`settings.rs`, [`FileConfig`](super::FileConfig)).
//!
//! Not here: defaults, validation, reading the file (`load.rs`). Upstream: `KubeletConfiguration`
//! in `staging/src/k8s.io/kubelet/config/v1beta1/types.go`.

use std::path::PathBuf;

use serde::Deserialize;

/// The `kind` a file may declare (optional; checked when present).
pub const KIND: &str = "KubeletConfiguration";
/// The `apiVersion` a file may declare (optional; checked when present).
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";

/// `authentication` as written in the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileAuthentication {
    pub x509: Option<FileX509>,
    pub webhook: Option<FileAuthnWebhook>,
    pub anonymous: Option<FileEnabled>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileX509 {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthnWebhook {
    pub enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEnabled {
    pub enabled: Option<bool>,
}

/// `authorization` as written in the file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthorization {
    pub mode: Option<String>,
    pub webhook: Option<FileAuthzWebhook>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthzWebhook {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<String>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<String>,
}
