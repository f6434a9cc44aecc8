//! The API server's reviews for the full server: a `TokenReview` per bearer token and a
//! `SubjectAccessReview` per request attribute, each answer kept for its TTL
//! (`authentication.webhook.cacheTTL`, `authorization.webhook.cacheAuthorizedTTL` /
//! `cacheUnauthorizedTTL`) so a busy client does not turn into API traffic.
//!
//! Not here: what the answers mean for a request (`auth.rs`). Upstream: the apiserver's
//! `plugin/pkg/authenticator/token/webhook`, `plugin/pkg/authorizer/webhook` and the token cache,
//! as `cmd/kubelet/app/auth.go` builds them.

use std::{collections::HashMap, sync::Mutex, time::Duration};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};
use tokio::time::Instant;

use super::auth::{Attributes, Reviewer, TokenReviewed, UserInfo};

/// Answers kept until they expire.
struct TtlCache<V> {
    entries: Mutex<HashMap<String, (Instant, V)>>,
}

impl<V: Clone> TtlCache<V> {
    fn new() -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &str) -> Option<V> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        entries.retain(|_, (until, _)| *until > now);
        entries.get(key).map(|(_, v)| v.clone())
    }

    fn put(&self, key: String, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (Instant::now() + ttl, value));
    }
}

/// [`Reviewer`] over the API server.
pub struct KubeReviewer {
    client: Client,
    token_ttl: Duration,
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
    tokens: TtlCache<TokenReviewed>,
    access: TtlCache<bool>,
}

impl KubeReviewer {
    pub fn new(
        client: Client,
        token_ttl: Duration,
        authorized_ttl: Duration,
        unauthorized_ttl: Duration,
    ) -> Self {
        KubeReviewer {
            client,
            token_ttl,
            authorized_ttl,
            unauthorized_ttl,
            tokens: TtlCache::new(),
            access: TtlCache::new(),
        }
    }
}

/// The SubjectAccessReview of one attribute, as upstream's webhook authorizer builds it.
pub fn access_review(attributes: &Attributes) -> SubjectAccessReview {
    let user = &attributes.user;
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(attributes.verb.to_owned()),
                version: Some("v1".into()),
                resource: Some("nodes".into()),
                subresource: Some(attributes.subresource.to_owned()),
                name: Some(attributes.node.clone()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

#[tonic::async_trait]
impl Reviewer for KubeReviewer {
    async fn review_token(&self, token: &str) -> Result<TokenReviewed, String> {
        // Kept by digest: the cache must not hold the credentials themselves.
        let key = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()));
        if let Some(cached) = self.tokens.get(&key) {
            return Ok(cached);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("TokenReview: {e}"))?;
        let status = answer.status.unwrap_or_default();
        let reviewed = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => TokenReviewed::User(UserInfo {
                name: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }),
            _ => TokenReviewed::Rejected(status.error.unwrap_or_default()),
        };
        self.tokens.put(key, reviewed.clone(), self.token_ttl);
        Ok(reviewed)
    }

    async fn review_access(&self, attributes: &Attributes) -> Result<bool, String> {
        let review = access_review(attributes);
        let key = serde_json::to_string(&review.spec).map_err(|e| e.to_string())?;
        if let Some(allowed) = self.access.get(&key) {
            return Ok(allowed);
        }
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        let status = answer.status.unwrap_or_default();
        if let Some(error) = status.evaluation_error.as_deref().filter(|e| !e.is_empty()) {
            tracing::debug!(error, "SubjectAccessReview evaluation error");
        }
        let allowed = status.allowed && !status.denied.unwrap_or(false);
        let ttl = if allowed {
            self.authorized_ttl
        } else {
            self.unauthorized_ttl
        };
        self.access.put(key, allowed, ttl);
        Ok(allowed)
    }
}

#[cfg(test)]
#[path = "webhook_tests.rs"]
mod tests;
