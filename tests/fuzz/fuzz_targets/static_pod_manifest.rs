//! A static pod manifest file's bytes, as the static pod source reads them: decoded (YAML or
//! JSON), defaulted, given its static-pod name, UID and annotations, and validated
//! (`swiftlet::sources::decode_static_pod`). A rejection is fine and its message is rendered (it
//! goes to the log and the source's problems); a panic or an accepted pod that breaks the
//! source's invariants is a finding.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use swiftlet::sources::{CONFIG_HASH_ANNOTATION, decode_static_pod, validate_static_pod};

const NODE: &str = "node-1";

fuzz_target!(|data: &[u8]| {
    let path = Path::new("/etc/kubernetes/manifests/pod.yaml");
    let pod = match decode_static_pod(path, data, NODE) {
        Ok(pod) => pod,
        Err(error) => {
            let _ = error.to_string();
            return;
        }
    };
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    assert!(name.ends_with("-node-1"), "static pod name {name:?}");
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    assert!(!uid.is_empty(), "an accepted static pod has a UID");
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get(CONFIG_HASH_ANNOTATION).map(String::as_str),
        Some(uid)
    );
    assert!(
        pod.spec
            .as_ref()
            .is_some_and(|s| s.node_name.as_deref() == Some(NODE))
    );
    // What the sync loop does with it first.
    let _ = swiftlet::pod::full_name(&pod);
    let _ = swiftlet::pod::spec::is_static_pod(&pod);
    // Defaulting and naming already happened; the result is still a valid pod.
    assert_eq!(validate_static_pod(&pod), Ok(()));
});
