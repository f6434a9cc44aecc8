//! Authentication and authorization decisions: the path → subresource table, verbs, bearer
//! headers, certificate subjects, and every refusal with its status and message.

use std::sync::Mutex;

use super::*;

#[test]
fn paths_map_to_upstreams_subresources() {
    for (path, want) in [
        ("/pods", vec!["pods", "proxy"]),
        ("/pods/", vec!["pods", "proxy"]),
        ("/runningpods/", vec!["pods", "proxy"]),
        ("/healthz", vec!["healthz", "proxy"]),
        ("/healthz/ping", vec!["healthz", "proxy"]),
        ("/configz", vec!["configz", "proxy"]),
        ("/stats/summary", vec!["stats"]),
        ("/stats", vec!["stats"]),
        ("/metrics", vec!["metrics"]),
        ("/metrics/cadvisor", vec!["metrics"]),
        ("/logs/syslog", vec!["log"]),
        ("/checkpoint/ns/pod/c", vec!["checkpoint"]),
        ("/exec/ns/pod/c", vec!["proxy"]),
        ("/attach/ns/pod/c", vec!["proxy"]),
        ("/portForward/ns/pod", vec!["proxy"]),
        ("/run/ns/pod/c", vec!["proxy"]),
        ("/containerLogs/ns/pod/c", vec!["proxy"]),
        ("/spec", vec!["proxy"]),
        // Prefixes only count at a path boundary.
        ("/podsx", vec!["proxy"]),
        ("/statsx", vec!["proxy"]),
        ("/metricsx", vec!["proxy"]),
    ] {
        assert_eq!(subresources(path), want, "{path}");
    }
}

#[test]
fn verbs_follow_the_http_method() {
    for (method, verb) in [
        (Method::GET, "get"),
        (Method::POST, "create"),
        (Method::PUT, "update"),
        (Method::PATCH, "patch"),
        (Method::DELETE, "delete"),
        (Method::HEAD, ""),
    ] {
        assert_eq!(api_verb(&method), verb);
    }
    let user = UserInfo {
        name: "alice".into(),
        ..UserInfo::default()
    };
    let attrs = request_attributes(&user, &Method::POST, "/exec/ns/p/c", "node-1");
    assert_eq!(
        attrs,
        vec![Attributes {
            user,
            verb: "create",
            subresource: "proxy",
            node: "node-1".into(),
            path: "/exec/ns/p/c".into(),
        }]
    );
}

#[test]
fn bearer_headers() {
    assert_eq!(bearer_token("Bearer abc"), Some("abc"));
    assert_eq!(bearer_token("bearer abc"), Some("abc"));
    assert_eq!(bearer_token("Bearer "), None);
    assert_eq!(bearer_token("Basic abc"), None);
    assert_eq!(bearer_token("Bearer"), None);
}

#[test]
fn a_certificate_names_its_user_by_cn_and_groups_by_o() {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "alice");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:masters");
    let cert = params.self_signed(&key).expect("cert");
    assert_eq!(
        UserInfo::from_certificate(cert.der()),
        Some(UserInfo {
            name: "alice".into(),
            groups: vec!["system:masters".into()],
            ..UserInfo::default()
        })
    );
    let mut no_cn = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    no_cn.distinguished_name = rcgen::DistinguishedName::new();
    let cert = no_cn.self_signed(&key).expect("cert");
    assert_eq!(UserInfo::from_certificate(cert.der()), None);
}

/// Answers from a script and records what it was asked.
#[derive(Default)]
struct ScriptedReviewer {
    token_user: Option<UserInfo>,
    allowed_subresources: Vec<&'static str>,
    fail_access: bool,
    asked: Mutex<Vec<String>>,
}

#[tonic::async_trait]
impl Reviewer for ScriptedReviewer {
    async fn review_token(&self, token: &str) -> Result<TokenReviewed, ReviewError> {
        self.asked
            .lock()
            .expect("lock")
            .push(format!("token {token}"));
        Ok(match &self.token_user {
            Some(user) if token == "good" => TokenReviewed::User(user.clone()),
            _ => TokenReviewed::Rejected("invalid bearer token".into()),
        })
    }

    async fn review_access(&self, attributes: &Attributes) -> Result<bool, ReviewError> {
        self.asked.lock().expect("lock").push(format!(
            "access {} {} {}",
            attributes.user.name, attributes.verb, attributes.subresource
        ));
        if self.fail_access {
            return Err(ReviewError::unreachable("SubjectAccessReview"));
        }
        Ok(self.allowed_subresources.contains(&attributes.subresource))
    }
}

fn auth(anonymous: bool, mode: AuthorizationMode, reviewer: Option<Arc<ScriptedReviewer>>) -> Auth {
    Auth {
        node_name: "node-1".into(),
        anonymous,
        token_webhook: reviewer.is_some(),
        mode,
        reviewer: reviewer.map(|r| r as Arc<dyn Reviewer>),
    }
}

fn alice() -> UserInfo {
    UserInfo {
        name: "alice".into(),
        groups: vec!["dev".into()],
        ..UserInfo::default()
    }
}

#[tokio::test]
async fn authentication_certificate_then_token_then_anonymous() {
    let closed = auth(false, AuthorizationMode::AlwaysAllow, None);
    assert_eq!(
        closed.authenticate(Some(&alice()), None).await,
        Ok(UserInfo {
            groups: vec!["dev".into(), AUTHENTICATED_GROUP.into()],
            ..alice()
        })
    );
    assert_eq!(
        closed.authenticate(None, None).await,
        Err(Refusal::Unauthorized)
    );
    // Without the token webhook a token proves nothing.
    assert_eq!(
        closed.authenticate(None, Some("Bearer good")).await,
        Err(Refusal::Unauthorized)
    );

    let open = auth(true, AuthorizationMode::AlwaysAllow, None);
    assert_eq!(
        open.authenticate(None, None).await,
        Ok(UserInfo {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..UserInfo::default()
        })
    );

    let reviewer = Arc::new(ScriptedReviewer {
        token_user: Some(UserInfo {
            name: "system:serviceaccount:kube-system:metrics".into(),
            ..UserInfo::default()
        }),
        ..ScriptedReviewer::default()
    });
    let tokens = auth(true, AuthorizationMode::AlwaysAllow, Some(reviewer.clone()));
    let user = tokens
        .authenticate(None, Some("Bearer good"))
        .await
        .expect("authenticated");
    assert_eq!(user.name, "system:serviceaccount:kube-system:metrics");
    assert_eq!(user.groups, vec![AUTHENTICATED_GROUP.to_owned()]);
    // A rejected token is refused even with anonymous on (upstream's FailOnError).
    assert_eq!(
        tokens.authenticate(None, Some("Bearer bad")).await,
        Err(Refusal::Unauthorized)
    );
    // A certificate wins without a review.
    tokens
        .authenticate(Some(&alice()), Some("Bearer good"))
        .await
        .expect("authenticated");
    assert_eq!(
        *reviewer.asked.lock().expect("lock"),
        vec!["token good".to_owned(), "token bad".to_owned()]
    );
}

#[tokio::test]
async fn authorization_tries_each_subresource_and_says_which_were_refused() {
    let attrs = request_attributes(&alice(), &Method::GET, "/pods", "node-1");
    assert_eq!(
        auth(false, AuthorizationMode::AlwaysAllow, None)
            .authorize(&attrs)
            .await,
        Ok(())
    );

    let deny_all = Arc::new(ScriptedReviewer::default());
    assert_eq!(
        auth(false, AuthorizationMode::Webhook, Some(deny_all.clone()))
            .authorize(&attrs)
            .await,
        Err(Refusal::Forbidden(
            "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[pods proxy])".into()
        ))
    );
    assert_eq!(
        *deny_all.asked.lock().expect("lock"),
        vec![
            "access alice get pods".to_owned(),
            "access alice get proxy".to_owned()
        ]
    );

    // The coarse `proxy` permission still lets /pods in (backwards compatible).
    let proxy_only = Arc::new(ScriptedReviewer {
        allowed_subresources: vec!["proxy"],
        ..ScriptedReviewer::default()
    });
    assert_eq!(
        auth(false, AuthorizationMode::Webhook, Some(proxy_only))
            .authorize(&attrs)
            .await,
        Ok(())
    );

    let failing = Arc::new(ScriptedReviewer {
        fail_access: true,
        ..ScriptedReviewer::default()
    });
    let exec = request_attributes(&alice(), &Method::POST, "/exec/ns/p/c", "node-1");
    assert_eq!(
        auth(false, AuthorizationMode::Webhook, Some(failing))
            .authorize(&exec)
            .await,
        Err(Refusal::AuthorizerError(
            "Authorization error (user=alice, verb=create, resource=nodes, subresource=proxy)"
                .into()
        ))
    );
}
