//! The kubelet TLS bootstrap and certificate rotation against the project's API server process
//! acting as the CSR approver and signer (a real CA, certificates of 90 s): an agent started with
//! only a bootstrap kubeconfig requests its client certificate as `system:bootstrap:<id>`, gets
//! it auto-approved and signed, writes its kubeconfig and key (0600, in a 0700 cert dir) and
//! registers its Node with it; with `rotateCertificates` the client certificate is renewed by
//! the node itself before it expires and the Lease keeps being renewed past the first
//! certificate's expiry, with no restart; with `serverTLSBootstrap` the kubelet server serves
//! nothing until the test approves its serving CSR, then the cluster-issued certificate with the
//! node's IP, renewed likewise. A serving certificate kept from an earlier run that lacks the
//! node's address is replaced at once (upstream `certSatisfiesTemplate`), against the same
//! server without an agent.
//! Upstream: <https://kubernetes.io/docs/reference/access-authn-authz/kubelet-tls-bootstrapping/>.
#![expect(
    clippy::expect_used,
    reason = "helpers of tests: a failed step fails the test"
)]

use std::{
    collections::BTreeSet,
    os::unix::fs::MetadataExt as _,
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use k8s_openapi::api::core::v1::Node as ApiNode;
use kube::Api;
use serde_json::Value;
use swiftlet_tests::{
    EVENT_WAIT,
    cluster::{runtime, wait_for},
    node::Node,
    privileged, runtime_endpoint,
    test_apiserver::{ApiServerOptions, TestApiServer, new_bootstrap_token},
    tls,
};
use x509_parser::prelude::{FromDer as _, GeneralName, ParsedExtension, X509Certificate};

const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The certificates' lifetime: the renewal comes at 70–90 % of it (42–54 s), at least 6 s before
/// the expiry the test then waits out; longer would only lengthen the wait.
const LIFETIME: Duration = Duration::from_secs(60);

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .mode()
        & 0o7777
}

/// (serial, CN, not after, IP SANs) of the first certificate in PEM `pem`.
fn leaf(pem: &[u8]) -> (String, String, SystemTime, Vec<Vec<u8>>) {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).expect("PEM");
    let (_, cert) = X509Certificate::from_der(&block.contents).expect("a certificate");
    leaf_of(&cert)
}

fn leaf_of(cert: &X509Certificate<'_>) -> (String, String, SystemTime, Vec<Vec<u8>>) {
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or_default()
        .to_owned();
    let not_after = SystemTime::UNIX_EPOCH
        + Duration::from_secs(
            u64::try_from(cert.validity().not_after.timestamp()).expect("after 1970"),
        );
    let mut ips = Vec::new();
    for extension in cert.extensions() {
        if let ParsedExtension::SubjectAlternativeName(san) = extension.parsed_extension() {
            for name in &san.general_names {
                if let GeneralName::IPAddress(ip) = name {
                    ips.push(ip.to_vec());
                }
            }
        }
    }
    (cert.raw_serial_as_string(), cn, not_after, ips)
}

fn signer(csr: &Value) -> &str {
    csr["spec"]["signerName"].as_str().unwrap_or_default()
}

fn username(csr: &Value) -> &str {
    csr["spec"]["username"].as_str().unwrap_or_default()
}

fn name(csr: &Value) -> String {
    csr["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn has_condition(csr: &Value, kind: &str) -> bool {
    csr["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == kind))
}

/// Approves every serving CSR not yet approved (as an administrator would); returns their names.
fn approve_serving(server: &TestApiServer, approved: &mut BTreeSet<String>) {
    for csr in server.list_csrs() {
        if signer(&csr) == SERVING_SIGNER && !has_condition(&csr, "Approved") {
            let csr_name = name(&csr);
            server.approve_csr(&csr_name);
            approved.insert(csr_name);
        }
    }
}

/// The serving certificate the kubelet server presents to a client trusting only the cluster
/// CA and expecting `ip`; `None` while the handshake fails.
fn presented(server: &TestApiServer, port: u16, ip: &str) -> Option<(String, Vec<Vec<u8>>)> {
    let config = tls::client_config(&server.ca_pem_path(), None);
    let stream = tls::connect(port, ip, config).ok()?;
    let chain = stream.conn.peer_certificates()?;
    let (_, cert) = X509Certificate::from_der(chain.first()?.as_ref()).ok()?;
    let (serial, _, _, ips) = leaf_of(&cert);
    Some((serial, ips))
}

#[test]
fn a_node_joins_with_a_bootstrap_token_and_rotates_its_certificates() {
    let test = "a_node_joins_with_a_bootstrap_token_and_rotates_its_certificates";
    if !privileged(test) {
        return;
    }
    let Some(endpoint) = runtime_endpoint(test) else {
        return;
    };
    let began = Instant::now();
    let step = |what: &str| eprintln!("{test}: {:>6.1?} {what}", began.elapsed());
    let token = new_bootstrap_token();
    let id = token.split('.').next().expect("a token id").to_owned();
    let server = TestApiServer::start_with_options(
        "bootstrap",
        &ApiServerOptions {
            bootstrap_tokens: vec![token.clone()],
            cluster_signing_duration: Some(LIFETIME),
            ..ApiServerOptions::default()
        },
    );
    let bootstrap = server.bootstrap_kubeconfig(&token);
    let short = "boot";
    let node_dir =
        std::env::temp_dir().join(format!("swiftlet-node-{}-{short}", std::process::id()));
    let kubeconfig = node_dir.join("kubelet.conf");
    let config_dir =
        std::env::temp_dir().join(format!("swiftlet-bootstrap-config-{}", std::process::id()));
    std::fs::create_dir_all(&config_dir).expect("config dir");
    let config_file = config_dir.join("kubelet-config.yaml");
    std::fs::write(
        &config_file,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nrotateCertificates: true\nserverTLSBootstrap: true\n",
    )
    .expect("config file");
    let node = Node::start_with(
        short,
        &endpoint,
        &[
            "--bootstrap-kubeconfig",
            bootstrap.to_str().expect("utf-8"),
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8"),
            "--config",
            config_file.to_str().expect("utf-8"),
        ],
    );
    step("agent running");
    let node_user = format!("system:node:{}", node.name);

    // The client CSR: by the bootstrap token's user, under upstream's digested name.
    let csrs = server.list_csrs();
    let client_csrs: Vec<_> = csrs.iter().filter(|c| signer(c) == CLIENT_SIGNER).collect();
    assert_eq!(client_csrs.len(), 1, "{csrs:#?}");
    assert_eq!(username(client_csrs[0]), format!("system:bootstrap:{id}"));
    assert!(
        name(client_csrs[0]).starts_with("node-csr-"),
        "{:#}",
        client_csrs[0]
    );
    assert_eq!(
        client_csrs[0]["spec"]["usages"],
        serde_json::json!(["digital signature", "client auth"])
    );

    // The files: the pair and the kubeconfig 0600, the cert dir 0700, no pending key.
    let cert_dir = node.cert_dir();
    let pem_path = cert_dir.join("kubelet-client-current.pem");
    assert_eq!(mode(&cert_dir), 0o700);
    assert_eq!(mode(&pem_path), 0o600);
    assert_eq!(mode(&kubeconfig), 0o600);
    assert!(!cert_dir.join("kubelet-client.key.tmp").exists());
    let written = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
    assert!(
        written.contains(&format!("client-certificate: \"{}\"", pem_path.display())),
        "{written}"
    );
    assert!(written.contains(&server.url), "{written}");
    let (first_serial, cn, first_expiry, _) = leaf(&std::fs::read(&pem_path).expect("pem"));
    assert_eq!(cn, node_user);

    // The Node registers: a bootstrap token may only request certificates, so the node's
    // certificate made it.
    let rt = runtime();
    let client = rt.block_on(server.client());
    let nodes: Api<ApiNode> = Api::all(client.clone());
    let registered = wait_for(
        "the Node is registered",
        EVENT_WAIT,
        || rt.block_on(nodes.get_opt(&node.name)).ok().flatten(),
        Option::is_some,
    )
    .expect("registered");
    let ip = registered
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .expect("an InternalIP");
    let ip_octets = match ip.parse::<std::net::IpAddr>().expect("an IP") {
        std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
        std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    step("node registered");

    // The serving CSR waits for an approval; until then the kubelet server has no certificate.
    let serving = wait_for(
        "a serving CSR",
        EVENT_WAIT,
        || {
            server
                .list_csrs()
                .into_iter()
                .find(|c| signer(c) == SERVING_SIGNER)
        },
        Option::is_some,
    )
    .expect("a serving CSR");
    assert_eq!(username(&serving), node_user);
    assert!(
        presented(&server, node.kubelet_port, &ip).is_none(),
        "no certificate before approval"
    );
    let mut approved = BTreeSet::new();
    approve_serving(&server, &mut approved);
    let (first_serving, ips) = wait_for(
        "the kubelet server presents the cluster-issued certificate",
        EVENT_WAIT,
        || presented(&server, node.kubelet_port, &ip),
        Option::is_some,
    )
    .expect("presented");
    assert!(ips.contains(&ip_octets), "the node's IP is a SAN: {ips:?}");
    let stored =
        leaf(&std::fs::read(cert_dir.join("kubelet-server-current.pem")).expect("serving pem"));
    assert_eq!(stored.0, first_serving);
    assert_eq!(mode(&cert_dir.join("kubelet-server-current.pem")), 0o600);
    step("serving certificate presented");

    // Rotation: a renewal by the node itself before the first certificate expires, and serving
    // renewals approved as they come.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client, "kube-node-lease");
    let renewed = || {
        rt.block_on(leases.get(&node.name))
            .ok()
            .and_then(|l| l.spec)
            .and_then(|s| s.renew_time)
            .map(|t| t.0)
    };
    let wait = LIFETIME + EVENT_WAIT;
    let rotated_client = wait_for(
        "the client certificate rotates",
        wait,
        || {
            approve_serving(&server, &mut approved);
            leaf(&std::fs::read(&pem_path).expect("pem")).0
        },
        |serial| *serial != first_serial,
    );
    let renewals: Vec<_> = server
        .list_csrs()
        .into_iter()
        .filter(|c| signer(c) == CLIENT_SIGNER && username(c) == node_user)
        .collect();
    assert_eq!(
        renewals.len(),
        1,
        "one renewal by the node itself: {renewals:#?}"
    );
    assert!(
        SystemTime::now() < first_expiry,
        "renewed before the old certificate expired"
    );
    step("client certificate rotated");

    // Past the first certificate's expiry the heartbeat goes on (the old connections closed).
    wait_for(
        "the first client certificate expires",
        wait,
        || {
            approve_serving(&server, &mut approved);
            SystemTime::now()
        },
        |now| *now > first_expiry + Duration::from_secs(1),
    );
    let after_expiry = wait_for("a Lease", EVENT_WAIT, renewed, Option::is_some);
    let later = wait_for(
        "the Lease is renewed after the expiry",
        EVENT_WAIT,
        || {
            approve_serving(&server, &mut approved);
            renewed()
        },
        |t| *t != after_expiry,
    );
    assert!(later > after_expiry);
    step("heartbeat after the first certificate expired");

    let (rotated_serving, ips) = wait_for(
        "the serving certificate rotates",
        wait,
        || {
            approve_serving(&server, &mut approved);
            presented(&server, node.kubelet_port, &ip)
        },
        |p| {
            p.as_ref()
                .is_some_and(|(serial, _)| *serial != first_serving)
        },
    )
    .expect("presented");
    assert!(ips.contains(&ip_octets));
    assert_ne!(rotated_serving, first_serving);
    assert!(approved.len() >= 2, "{approved:?}");
    step("serving certificate rotated");

    let log = node.log_lines();
    assert!(
        !log.iter().any(|l| l.contains("swiftlet is running")),
        "the agent never restarted"
    );
    // The issued certificates cover what was requested: no replacement before a deadline.
    assert!(
        !log.iter().any(|l| l.contains("does not cover")),
        "{log:#?}"
    );
    assert_ne!(rotated_client, first_serial);
    let _ = std::fs::remove_dir_all(&config_dir);
}

/// The serving certificate manager against the API server process, without an agent: a
/// certificate kept in the cert dir that does not name the node's current address (an address
/// changed since the last run) is replaced at the manager's first look, long before its rotation
/// deadline, by one CSR whose issued certificate names the address; the next look waits.
#[test]
fn a_kept_serving_certificate_without_the_nodes_address_is_replaced_at_once() {
    use swiftlet::certificate::{
        csr::{Kind, Subject},
        manager::{ApiRequester, Manager, Step},
        metrics::CertificateMetrics,
        store::{Pair, SERVER_PEM, Store},
    };

    let server = TestApiServer::start("certtemplate");
    let node = "swiftlet-template-node";
    let old_ip: std::net::IpAddr = "192.0.2.9".parse().expect("ip");
    let new_ip: std::net::IpAddr = "192.0.2.5".parse().expect("ip");
    let dir = std::env::temp_dir().join(format!("swiftlet-template-{}", std::process::id()));
    let store = std::sync::Arc::new(Store::open(&dir.join("pki")).expect("cert dir"));

    // Last run's certificate: this node, the old address, an hour to live.
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec![node.to_owned()]).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress(old_ip));
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - Duration::from_secs(60);
    params.not_after = now + Duration::from_secs(3600);
    let kept = params.self_signed(&key).expect("self-signed");
    let pem = format!("{}{}", kept.pem(), key.serialize_pem()).into_bytes();
    let kept = Pair::from_pem(pem, &dir.join("kept.pem")).expect("pair");

    let rt = runtime();
    let client = rt.block_on(server.client());
    let clock = swiftlet::clock::system();
    let metrics = CertificateMetrics::new(Kind::Serving, clock.clone()).expect("metrics");
    let manager = Manager::new(
        Kind::Serving,
        Subject {
            dns_names: vec![node.to_owned()],
            ips: vec![new_ip],
            ..Subject::node(node)
        },
        store,
        SERVER_PEM,
        ApiRequester { client },
        clock,
        metrics,
        Some(kept.clone()),
    );
    assert!(
        manager.replace_early().is_some(),
        "the old address only: {kept:?}"
    );

    // The manager asks on the runtime's worker while this thread approves, as an operator would.
    let asking = rt.spawn(async move {
        let mut manager = manager;
        let step = manager.step().await;
        (manager, step)
    });
    let csr = wait_for(
        "a serving CSR",
        EVENT_WAIT,
        || {
            server
                .list_csrs()
                .into_iter()
                .find(|c| signer(c) == SERVING_SIGNER)
        },
        Option::is_some,
    )
    .expect("a serving CSR");
    server.approve_csr(&name(&csr));
    let (mut manager, step) = rt.block_on(asking).expect("the manager's task");
    assert!(matches!(step, Step::Rotated), "{step:?}");
    let issued = manager.current().expect("issued");
    assert_ne!(issued.serial, kept.serial);
    assert!(issued.names.ips.contains(&new_ip), "{:?}", issued.names);
    assert!(manager.replace_early().is_none());
    assert!(matches!(rt.block_on(manager.step()), Step::Wait(_)));
    let serving: Vec<_> = server
        .list_csrs()
        .into_iter()
        .filter(|c| signer(c) == SERVING_SIGNER)
        .collect();
    assert_eq!(serving.len(), 1, "{serving:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}
