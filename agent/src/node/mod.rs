//! What this node is to the cluster, decided once at start: the labels and taints it registers
//! with (the well-known labels plus `--node-labels`, `--register-with-taints`), and its IPs
//! (`--node-ip`, or chosen as upstream's `NodeAddress` setter chooses them). Pure rules with
//! upstream's wording, used by the configuration (to refuse bad flags), by registration (the
//! Node object) and by admission (node affinity and taints are checked against these).
//!
//! - `labels.rs` — label syntax, the labels a kubelet may set on itself, the well-known labels.
//! - `taints.rs` — `ParseTaints`, tolerations.
//! - `addresses.rs` — `--node-ip` and the `InternalIP` choice.
//!
//! Not here: talking to the API server (`sources::apiserver`), the admission decisions
//! (`kubelet::admission`). Upstream: `pkg/kubelet/kubelet_node_status.go` (`initialNode`),
//! `pkg/kubelet/nodestatus`, `pkg/kubelet/apis/well_known_labels.go`, `pkg/util/taints`.

pub mod addresses;
pub mod labels;
pub mod taints;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;

pub use addresses::NodeIpError;
pub use labels::NodeLabelError;
pub use taints::TaintError;

/// The labels and taints the node registers with, as the Node object carries them; admission
/// matches pods against the same (upstream's admission reads the Node, which starts as these).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registration {
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
}
