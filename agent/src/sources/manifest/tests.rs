//! Tests of decoding one manifest: the static-pod defaults, the UID rules and the rejections.

use std::path::Path;

use super::*;

const NGINX: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: nginx
    image: nginx:1.27
    resources:
      requests: {cpu: 100m, memory: 64Mi}
      limits: {memory: 128Mi}
"#;

fn decode(text: &str) -> Result<Pod, ManifestError> {
    decode_static_pod(
        Path::new("/etc/manifests/web.yaml"),
        text.as_bytes(),
        "Node-1",
    )
}

fn reason(text: &str) -> String {
    match decode(text) {
        Ok(pod) => panic!("accepted: {pod:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn fnv128a_matches_the_reference_vectors() {
    let hash = |s: &[u8]| {
        let mut h = Fnv128a::new();
        h.write(s);
        format!("{:032x}", h.finish())
    };
    assert_eq!(hash(b""), "6c62272e07bb014262b821756295c58d");
    assert_eq!(hash(b"a"), "d228cb696f1a8caf78912b704e4a8964");
}

#[test]
fn applies_the_static_pod_defaults() {
    let pod = decode(NGINX).expect("valid");
    let meta = &pod.metadata;
    assert_eq!(meta.name.as_deref(), Some("web-node-1"));
    assert_eq!(meta.namespace.as_deref(), Some("default"));
    let uid = meta.uid.clone().expect("uid");
    assert_eq!(uid.len(), 32);
    assert!(uid.bytes().all(|b| b.is_ascii_hexdigit()));
    let annotations = meta.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(CONFIG_HASH_ANNOTATION), Some(&uid));
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
    let tolerations = spec.tolerations.clone().unwrap_or_default();
    assert_eq!(tolerations.len(), 1);
    assert_eq!(tolerations[0].operator.as_deref(), Some("Exists"));
    assert_eq!(tolerations[0].effect.as_deref(), Some("NoExecute"));
    assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    assert_eq!(phase, Some("Pending"));
}

#[test]
fn json_is_read_too_and_an_explicit_uid_is_kept() {
    let json = r#"{"apiVersion":"v1","kind":"Pod",
        "metadata":{"name":"db","namespace":"kube-system","uid":"fixed-uid"},
        "spec":{"containers":[{"name":"pg","image":"postgres:16"}],
                "tolerations":[{"operator":"Exists","effect":"NoExecute"}]}}"#;
    let pod = decode(json).expect("valid");
    assert_eq!(pod.metadata.uid.as_deref(), Some("fixed-uid"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("kube-system"));
    let hash = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION));
    assert_eq!(hash.map(String::as_str), Some("fixed-uid"));
    // The toleration it already had is not added twice.
    let tolerations = pod.spec.and_then(|s| s.tolerations).unwrap_or_default();
    assert_eq!(tolerations.len(), 1);
}

#[test]
fn uid_is_stable_and_follows_content_node_and_path() {
    let uid = |text: &str, path: &str, node: &str| {
        decode_static_pod(Path::new(path), text.as_bytes(), node)
            .expect("valid")
            .metadata
            .uid
            .expect("uid")
    };
    let base = uid(NGINX, "/m/web.yaml", "n1");
    assert_eq!(base, uid(NGINX, "/m/web.yaml", "n1"), "stable");
    // Formatting and comments are not content.
    let reformatted = format!(
        "# web server\n{}",
        NGINX.replace("{app: web}", "\n    app: web")
    );
    assert_eq!(base, uid(&reformatted, "/m/web.yaml", "n1"));
    assert_ne!(
        base,
        uid(&NGINX.replace("1.27", "1.28"), "/m/web.yaml", "n1")
    );
    assert_ne!(base, uid(NGINX, "/m/web2.yaml", "n1"));
    assert_ne!(base, uid(NGINX, "/m/web.yaml", "n2"));
}

#[test]
fn rejects_with_a_reason() {
    let cases: &[(&str, &str)] = &[
        ("  \n", "the file is empty"),
        ("kind: Pod\n  bad: [", "not valid YAML or JSON"),
        ("- a\n- b\n", "not a single object"),
        (
            "apiVersion: v1\nkind: Service\n",
            "kind is \"Service\", expected \"Pod\"",
        ),
        (
            "kind: Pod\nmetadata: {name: x}\n",
            "apiVersion is \"\", expected \"v1\"",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: 5}\n",
            "not a valid Pod: invalid type",
        ),
        (
            "apiVersion: v1\nkind: Pod\nspec: {containers: []}\n",
            "name is needed for the pod",
        ),
    ];
    for (text, want) in cases {
        let got = reason(text);
        assert!(got.contains(want), "{text:?}: {got}");
    }
}

#[test]
fn rejects_invalid_pods_naming_the_field() {
    let pod =
        |spec: &str| format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n{spec}");
    let cases: &[(&str, &str)] = &[
        (
            "  containers: []\n",
            "invalid pod: spec.containers: Required value",
        ),
        (
            "  containers: [{name: a}]\n",
            "spec.containers[0].image: Required value",
        ),
        (
            "  containers: [{name: a, image: x}, {name: a, image: y}]\n",
            "spec.containers[1].name: Duplicate value: \"a\"",
        ),
        (
            "  initContainers: [{name: a, image: x}]\n  containers: [{name: a, image: y}]\n",
            "spec.containers[0].name: Duplicate value: \"a\"",
        ),
        (
            "  containers: [{name: a, image: x, resources: {limits: {cpu: 1x}}}]\n",
            "spec.containers[0].resources.limits[cpu]: Invalid value: \"1x\"",
        ),
        (
            "  containers: [{name: a, image: x, resources: {requests: {cpu: 2}, limits: {cpu: 1}}}]\n",
            "spec.containers[0].resources.requests[cpu]: Invalid value: \"2\": must be less than or equal to cpu limit",
        ),
        (
            "  containers: [{name: Web_1, image: x}]\n",
            "spec.containers[0].name: Invalid value: \"Web_1\"",
        ),
        (
            "  restartPolicy: Sometimes\n  containers: [{name: a, image: x}]\n",
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
        ),
        (
            "  containers: [{name: a, image: x}]\n  volumes: [{name: s, secret: {secretName: t}}]\n",
            "spec.volumes[0]: Forbidden: static pods may not reference secrets",
        ),
    ];
    for (spec, want) in cases {
        let got = reason(&pod(spec));
        assert!(got.contains(want), "{spec}: {got}");
    }
}
