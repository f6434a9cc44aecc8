//! The authentication and authorization answers: TokenReview and SubjectAccessReview
//! (<https://kubernetes.io/docs/reference/access-authn-authz/webhook/>) from a table the tests
//! set, and TokenRequest (`serviceaccounts/<name>/token`,
//! <https://kubernetes.io/docs/reference/kubernetes-api/authentication-resources/token-request-v1/>)
//! issuing tokens that TokenReview then authenticates as the service account.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{
    meta::{meta_str, rfc3339},
    resources::Resource,
    status::{ApiError, ApiResult},
};

/// One authorization rule: every field given must equal the review's (`*` matches anything);
/// the first rule that matches decides.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccessRule {
    pub user: Option<String>,
    pub group: Option<String>,
    pub verb: Option<String>,
    pub resource: Option<String>,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// For non-resource requests (`/healthz`).
    pub path: Option<String>,
    pub allowed: bool,
}

/// The table the tests set with `PUT /_test/reviews`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReviewTable {
    /// Bearer token → `UserInfo` (`{"username", "uid", "groups"}`).
    #[serde(default)]
    pub tokens: HashMap<String, Value>,
    #[serde(default)]
    pub access: Vec<AccessRule>,
}

#[derive(Debug, Default)]
pub struct Reviews {
    table: ReviewTable,
    /// Tokens TokenRequest issued → the service account's `UserInfo`.
    issued: HashMap<String, Value>,
    serial: u64,
}

fn field_matches(rule: Option<&String>, have: Option<&str>) -> bool {
    rule.is_none_or(|want| want == "*" || Some(want.as_str()) == have)
}

impl Reviews {
    pub fn set_table(&mut self, table: ReviewTable) {
        self.table = table;
    }

    /// A TokenReview answered: the request with `status` (`authenticated`, `user`,
    /// `audiences`), or `authenticated: false` for a token nobody knows.
    pub fn token_review(&self, mut review: Value) -> Value {
        let token = review
            .get("spec")
            .and_then(|s| s.get("token"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let audiences = review
            .get("spec")
            .and_then(|s| s.get("audiences"))
            .cloned()
            .unwrap_or(json!([]));
        let user = self
            .table
            .tokens
            .get(token)
            .or_else(|| self.issued.get(token));
        review["status"] = match user {
            Some(user) => json!({"authenticated": true, "user": user, "audiences": audiences}),
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        };
        review
    }

    /// A SubjectAccessReview answered from the rules (denied when none matches).
    pub fn access_review(&self, mut review: Value) -> Value {
        let spec = review.get("spec").cloned().unwrap_or_default();
        let user = spec.get("user").and_then(Value::as_str);
        let groups: Vec<&str> = spec
            .get("groups")
            .and_then(Value::as_array)
            .map(|g| g.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let attrs = spec
            .get("resourceAttributes")
            .or_else(|| spec.get("nonResourceAttributes"));
        let attr = |k: &str| attrs.and_then(|a| a.get(k)).and_then(Value::as_str);
        let found = self.table.access.iter().find(|rule| {
            field_matches(rule.user.as_ref(), user)
                && rule
                    .group
                    .as_ref()
                    .is_none_or(|g| g == "*" || groups.contains(&g.as_str()))
                && field_matches(rule.verb.as_ref(), attr("verb"))
                && field_matches(rule.resource.as_ref(), attr("resource"))
                && field_matches(rule.subresource.as_ref(), attr("subresource"))
                && field_matches(rule.namespace.as_ref(), attr("namespace"))
                && field_matches(rule.name.as_ref(), attr("name"))
                && field_matches(rule.path.as_ref(), attr("path"))
        });
        review["status"] = match found {
            Some(rule) if rule.allowed => {
                json!({"allowed": true, "reason": "allowed by the test table"})
            }
            Some(_) => {
                json!({"allowed": false, "denied": true, "reason": "denied by the test table"})
            }
            None => json!({"allowed": false, "reason": "no rule of the test table matched"}),
        };
        review
    }

    /// A TokenRequest for `account`: a new token valid `spec.expirationSeconds` (default one
    /// hour; fewer than `min_seconds` is invalid, as upstream's 10-minute minimum). A request
    /// for more than `max_seconds` (when positive) is shortened to it, in the answer's
    /// `spec.expirationSeconds` and its `expirationTimestamp`, as kube-apiserver does with
    /// `--service-account-max-token-expiration` (`TokenREST.Create`: "requested expiration of
    /// N seconds shortened to M seconds"). kube-apiserver accepts no maximum below an hour; this
    /// server takes any, so a test sees a token renewed within seconds.
    pub fn token_request(
        &mut self,
        resource: &Resource,
        account: &Value,
        mut request: Value,
        now: i64,
        (min_seconds, max_seconds): (i64, i64),
    ) -> ApiResult<Value> {
        let name = meta_str(account, "name").unwrap_or_default();
        let namespace = meta_str(account, "namespace").unwrap_or_default();
        let seconds = request
            .get("spec")
            .and_then(|s| s.get("expirationSeconds"))
            .and_then(Value::as_i64)
            .unwrap_or(3600);
        if seconds < min_seconds {
            return Err(ApiError::invalid(
                resource,
                name,
                &format!(
                    "spec.expirationSeconds: Invalid value: {seconds}: may not specify a duration less than {min_seconds} seconds"
                ),
            ));
        }
        let seconds = if max_seconds > 0 {
            seconds.min(max_seconds)
        } else {
            seconds
        };
        self.serial += 1;
        let token = format!(
            "swiftlet-test.{namespace}.{name}.{}.{:016x}",
            self.serial,
            fastrand::u64(..)
        );
        self.issued.insert(
            token.clone(),
            json!({
                "username": format!("system:serviceaccount:{namespace}:{name}"),
                "uid": meta_str(account, "uid").unwrap_or_default(),
                "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
            }),
        );
        if let Some(map) = request.as_object_mut() {
            map.insert("kind".to_owned(), json!("TokenRequest"));
            map.insert("apiVersion".to_owned(), json!("authentication.k8s.io/v1"));
            let spec = map.entry("spec").or_insert_with(|| json!({}));
            spec["expirationSeconds"] = json!(seconds);
            map.insert(
                "status".to_owned(),
                json!({"token": token, "expirationTimestamp": rfc3339(now + seconds)}),
            );
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::find;

    #[test]
    fn issued_tokens_authenticate_as_their_service_account() {
        let mut reviews = Reviews::default();
        let accounts = find("", "v1", "serviceaccounts").expect("serviceaccounts");
        let account = json!({"metadata": {"name": "sa", "namespace": "ns", "uid": "u1"}});
        let issued = reviews
            .token_request(
                accounts,
                &account,
                json!({"spec": {"expirationSeconds": 600}}),
                1000,
                (600, 0),
            )
            .expect("issued");
        assert_eq!(issued["status"]["expirationTimestamp"], rfc3339(1600));
        let token = issued["status"]["token"]
            .as_str()
            .expect("a token")
            .to_owned();
        let review = reviews.token_review(json!({"spec": {"token": token}}));
        assert_eq!(review["status"]["authenticated"], true);
        assert_eq!(
            review["status"]["user"]["username"],
            "system:serviceaccount:ns:sa"
        );
        let unknown = reviews.token_review(json!({"spec": {"token": "nope"}}));
        assert_eq!(unknown["status"]["authenticated"], false);
        let short = reviews.token_request(
            accounts,
            &account,
            json!({"spec": {"expirationSeconds": 60}}),
            0,
            (600, 0),
        );
        assert_eq!(short.map_err(|e| e.code), Err(422));
        // A maximum shortens a longer request: the answer says how long the token lives.
        let capped = reviews
            .token_request(
                accounts,
                &account,
                json!({"spec": {"expirationSeconds": 3600}}),
                1000,
                (600, 20),
            )
            .expect("issued");
        assert_eq!(capped["spec"]["expirationSeconds"], 20);
        assert_eq!(capped["status"]["expirationTimestamp"], rfc3339(1020));
    }

    #[test]
    fn the_first_matching_rule_decides_access() {
        let mut reviews = Reviews::default();
        reviews.set_table(ReviewTable {
            tokens: HashMap::new(),
            access: vec![
                AccessRule {
                    user: Some("alice".into()),
                    verb: Some("get".into()),
                    allowed: true,
                    ..AccessRule::default()
                },
                AccessRule {
                    group: Some("ops".into()),
                    allowed: false,
                    ..AccessRule::default()
                },
            ],
        });
        let review = |user: &str, group: &str, verb: &str| {
            reviews.access_review(json!({"spec": {
                "user": user, "groups": [group],
                "resourceAttributes": {"verb": verb, "resource": "nodes", "subresource": "proxy"},
            }}))["status"]["allowed"]
                .clone()
        };
        assert_eq!(review("alice", "x", "get"), true);
        assert_eq!(review("alice", "x", "create"), false);
        assert_eq!(review("bob", "ops", "get"), false);
        assert_eq!(review("bob", "dev", "get"), false);
    }
}
