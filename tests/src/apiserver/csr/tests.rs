//! The CSR strategy, validation, kubelet checks and the approver's decisions.

use rcgen::{CertificateParams, DnType, KeyPair, SanType};
use serde_json::json;

use super::*;
use crate::apiserver::{authn::AUTHENTICATED_GROUP, resources::by_kind};

pub(crate) fn request_pem(cn: &str, orgs: &[&str], sans: &[&str]) -> String {
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, cn);
    for o in orgs {
        params.distinguished_name.push(DnType::OrganizationName, *o);
    }
    for san in sans {
        params.subject_alt_names.push(match san.parse() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName((*san).try_into().expect("dns")),
        });
    }
    params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem")
}

pub(crate) fn csr_object(name: &str, pem: &str, signer: &str, usages: &[&str]) -> Value {
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": serde_json::to_value(ByteString(pem.as_bytes().to_vec())).expect("b64"),
            "signerName": signer,
            "usages": usages,
            "username": "forged",
            "groups": ["system:masters"],
        },
        "status": {"conditions": [{"type": "Approved", "status": "True"}]},
    })
}

fn resource() -> &'static Resource {
    by_kind("certificates.k8s.io/v1", KIND).expect("csr resource")
}

fn user(name: &str, groups: &[&str]) -> User {
    User {
        name: name.to_owned(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        ..User::default()
    }
}

const CLIENT_USAGES: [&str; 3] = ["digital signature", "key encipherment", "client auth"];

#[test]
fn create_records_the_requester_and_clears_the_status() {
    let pem = request_pem("system:node:n1", &[NODES_GROUP], &[]);
    let boot = user(
        "system:bootstrap:abcdef",
        &[BOOTSTRAPPERS_GROUP, AUTHENTICATED_GROUP],
    );
    let created = prepare_create(
        resource(),
        csr_object("c", &pem, CLIENT_KUBELET_SIGNER, &CLIENT_USAGES),
        &boot,
    )
    .expect("valid");
    assert_eq!(created["spec"]["username"], "system:bootstrap:abcdef");
    assert_eq!(
        created["spec"]["groups"],
        json!([BOOTSTRAPPERS_GROUP, AUTHENTICATED_GROUP])
    );
    assert_eq!(created["status"], json!({}), "no pre-approved requests");
}

#[test]
fn create_validates_the_request_signer_usages_and_expiration() {
    let pem = request_pem("system:node:n1", &[NODES_GROUP], &[]);
    let boot = user("b", &[BOOTSTRAPPERS_GROUP]);
    let mut not_pem = csr_object("c", "hello", CLIENT_KUBELET_SIGNER, &CLIENT_USAGES);
    let error = prepare_create(resource(), not_pem.clone(), &boot).expect_err("not PEM");
    assert_eq!(error.code, 422);
    assert!(error.message.contains("spec.request"), "{}", error.message);
    not_pem["spec"]["request"] = serde_json::to_value(ByteString(
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec(),
    ))
    .expect("b64");
    let error = prepare_create(resource(), not_pem, &boot).expect_err("not a CSR");
    assert!(
        error.message.contains("CERTIFICATE REQUEST"),
        "{}",
        error.message
    );
    let no_signer = csr_object("c", &pem, "", &CLIENT_USAGES);
    let error = prepare_create(resource(), no_signer, &boot).expect_err("no signer");
    assert!(
        error.message.contains("spec.signerName: Required value"),
        "{}",
        error.message
    );
    let no_usages = csr_object("c", &pem, CLIENT_KUBELET_SIGNER, &[]);
    let error = prepare_create(resource(), no_usages, &boot).expect_err("no usages");
    assert!(
        error.message.contains("spec.usages: Required value"),
        "{}",
        error.message
    );
    let mut short = csr_object("c", &pem, CLIENT_KUBELET_SIGNER, &CLIENT_USAGES);
    short["spec"]["expirationSeconds"] = json!(599);
    let error = prepare_create(resource(), short, &boot).expect_err("too short");
    assert!(
        error.message.contains("spec.expirationSeconds"),
        "{}",
        error.message
    );
}

fn stored(approved: bool) -> Value {
    let pem = request_pem("system:node:n1", &[NODES_GROUP], &[]);
    let boot = user(
        "system:bootstrap:abcdef",
        &[BOOTSTRAPPERS_GROUP, AUTHENTICATED_GROUP],
    );
    let mut object = prepare_create(
        resource(),
        csr_object("c", &pem, CLIENT_KUBELET_SIGNER, &CLIENT_USAGES),
        &boot,
    )
    .expect("valid");
    if approved {
        object = with_condition(
            &object,
            json!({"type": "Approved", "status": "True", "reason": "R"}),
            100,
        );
    }
    object
}

#[test]
fn updates_keep_the_spec_and_each_path_its_own_part_of_the_status() {
    let old = stored(false);
    let mut new = old.clone();
    new["spec"]["signerName"] = json!("example.com/other");
    new["status"] =
        json!({"conditions": [{"type": "Approved", "status": "True"}], "certificate": "eA=="});
    let main = prepare_update(resource(), Part::Main, &old, new.clone(), 5).expect("main");
    assert_eq!(main["spec"], old["spec"], "spec is immutable");
    assert_eq!(
        main["status"], old["status"],
        "the object's update keeps the status"
    );
    let status = prepare_update(resource(), Part::Status, &old, json!({"status": {"conditions": [{"type": "Approved", "status": "True"}, {"type": "Failed", "status": "True"}]}}), 5)
        .expect("status");
    let all = conditions(&status);
    let kinds: Vec<&str> = all.iter().map(condition_type).collect();
    assert_eq!(kinds, ["Failed"], "/status cannot approve");
    let approval = prepare_update(resource(), Part::Approval, &old, new, 5).expect("approval");
    assert!(has_condition(&approval, "Approved"));
    assert_eq!(approval["spec"], old["spec"]);
    assert!(
        approval["status"].get("certificate").is_none(),
        "/approval cannot set the certificate"
    );
    assert_eq!(
        approval["status"]["conditions"][0]["lastUpdateTime"],
        json!(rfc3339(5))
    );
}

#[test]
fn approval_conditions_are_exclusive_and_permanent_and_a_certificate_is_not_replaced() {
    let approved = stored(true);
    let both = json!({"status": {"conditions": [{"type": "Approved", "status": "True"}, {"type": "Denied", "status": "True"}]}});
    let error = prepare_update(resource(), Part::Approval, &approved, both, 5).expect_err("both");
    assert!(
        error.message.contains("mutually exclusive"),
        "{}",
        error.message
    );
    let removed = json!({"status": {"conditions": []}});
    let error =
        prepare_update(resource(), Part::Approval, &approved, removed, 5).expect_err("removed");
    assert!(
        error.message.contains("may not remove"),
        "{}",
        error.message
    );
    let pem = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";
    let mut signed = approved.clone();
    signed["status"]["certificate"] =
        serde_json::to_value(ByteString(pem.as_bytes().to_vec())).expect("b64");
    let mut replaced = signed.clone();
    replaced["status"]["certificate"] = json!("eA==");
    let error =
        prepare_update(resource(), Part::Status, &signed, replaced, 5).expect_err("replaced");
    assert!(
        error
            .message
            .contains("may not modify existing certificate"),
        "{}",
        error.message
    );
}

#[test]
fn the_approver_approves_node_client_requests_of_bootstrappers_and_of_the_node_itself() {
    let make =
        |cn: &str, orgs: &[&str], sans: &[&str], signer: &str, usages: &[&str], requester: User| {
            let pem = request_pem(cn, orgs, sans);
            prepare_create(
                resource(),
                csr_object("c", &pem, signer, usages),
                &requester,
            )
            .expect("valid")
        };
    let boot = || {
        user(
            "system:bootstrap:abcdef",
            &[BOOTSTRAPPERS_GROUP, AUTHENTICATED_GROUP],
        )
    };
    let node = || user("system:node:n1", &[NODES_GROUP, AUTHENTICATED_GROUP]);
    let other = || user("system:node:n2", &[NODES_GROUP, AUTHENTICATED_GROUP]);
    let nobody = || user("alice", &[AUTHENTICATED_GROUP]);
    let n1 = "system:node:n1";
    let nodes: &[&str] = &[NODES_GROUP];
    let ec_usages: &[&str] = &["digital signature", "client auth"];
    let table: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "bootstrapper",
            make(
                n1,
                nodes,
                &[],
                CLIENT_KUBELET_SIGNER,
                &CLIENT_USAGES,
                boot(),
            ),
            Some("Auto approving kubelet client certificate after SubjectAccessReview."),
        ),
        (
            "bootstrapper, EC usages",
            make(n1, nodes, &[], CLIENT_KUBELET_SIGNER, ec_usages, boot()),
            Some("Auto approving kubelet client certificate after SubjectAccessReview."),
        ),
        (
            "the node itself",
            make(
                n1,
                nodes,
                &[],
                CLIENT_KUBELET_SIGNER,
                &CLIENT_USAGES,
                node(),
            ),
            Some("Auto approving self kubelet client certificate after SubjectAccessReview."),
        ),
        (
            "another node",
            make(
                n1,
                nodes,
                &[],
                CLIENT_KUBELET_SIGNER,
                &CLIENT_USAGES,
                other(),
            ),
            None,
        ),
        (
            "not a node or bootstrapper",
            make(
                n1,
                nodes,
                &[],
                CLIENT_KUBELET_SIGNER,
                &CLIENT_USAGES,
                nobody(),
            ),
            None,
        ),
        (
            "a SAN",
            make(
                n1,
                nodes,
                &["n1"],
                CLIENT_KUBELET_SIGNER,
                &CLIENT_USAGES,
                boot(),
            ),
            None,
        ),
        (
            "a second organization",
            make(
                n1,
                &[NODES_GROUP, "x"],
                &[],
                CLIENT_KUBELET_SIGNER,
                &CLIENT_USAGES,
                boot(),
            ),
            None,
        ),
        (
            "not a node name",
            make(
                "n1",
                nodes,
                &[],
                CLIENT_KUBELET_SIGNER,
                &CLIENT_USAGES,
                boot(),
            ),
            None,
        ),
        (
            "server auth",
            make(
                n1,
                nodes,
                &[],
                CLIENT_KUBELET_SIGNER,
                &["digital signature", "key encipherment", "server auth"],
                boot(),
            ),
            None,
        ),
        (
            "a serving request",
            make(
                n1,
                nodes,
                &["n1"],
                KUBELET_SERVING_SIGNER,
                &["digital signature", "key encipherment", "server auth"],
                node(),
            ),
            None,
        ),
    ];
    for (case, object, want) in table {
        let got = approval(&object);
        assert_eq!(
            got.as_ref()
                .map(|c| c["message"].as_str().unwrap_or_default()),
            want,
            "{case}"
        );
        if let Some(condition) = got {
            assert_eq!(condition["type"], "Approved", "{case}");
            assert_eq!(condition["reason"], "AutoApproved", "{case}");
            let approved = with_condition(&object, condition, 1);
            assert_eq!(approval(&approved), None, "{case}: decided once");
        }
    }
}

#[test]
fn the_serving_checks_follow_upstream() {
    let parse = |cn: &str, orgs: &[&str], sans: &[&str]| {
        parse_request(request_pem(cn, orgs, sans).as_bytes())
            .expect("parses")
            .1
    };
    let usages: Vec<String> = ["digital signature", "key encipherment", "server auth"]
        .map(str::to_owned)
        .into();
    let good = parse("system:node:n1", &[NODES_GROUP], &["n1", "10.0.0.1"]);
    assert_eq!(good.dns_names, 1);
    assert_eq!(good.ip_addresses, 1);
    assert_eq!(validate_kubelet_serving(&good, &usages), Ok(()));
    let no_san = parse("system:node:n1", &[NODES_GROUP], &[]);
    assert_eq!(
        validate_kubelet_serving(&no_san, &usages),
        Err("DNS or IP subjectAltName is required".to_owned())
    );
    let client: Vec<String> = ["digital signature", "client auth"]
        .map(str::to_owned)
        .into();
    assert!(validate_kubelet_serving(&good, &client).is_err());
    assert!(
        validate_kubelet_client(&good, &client).is_err(),
        "SANs are not allowed in client certs"
    );
}
