//! The API server's reviews for the full server: a `TokenReview` per bearer token and a
//! `SubjectAccessReview` per request attribute, each answer kept for its TTL
//! (`authentication.webhook.cacheTTL`, `authorization.webhook.cacheAuthorizedTTL` /
//! `cacheUnauthorizedTTL`) so a busy client does not turn into API traffic. Both caches are
//! bounded at upstream's sizes ([`TOKEN_CACHE_SIZE`], [`ACCESS_CACHE_SIZE`]), least recently used
//! first out, so a client sending a new token with every request cannot grow them.
//!
//! Not here: what the answers mean for a request (`auth.rs`). Upstream: the apiserver's
//! `plugin/pkg/authenticator/token/webhook`, `plugin/pkg/authorizer/webhook` and the token cache,
//! as `cmd/kubelet/app/auth.go` builds them.

use std::time::Duration;

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};

use super::{
    auth::{Attributes, ReviewError, Reviewer, TokenReviewed, UserInfo},
    review_cache::ReviewCache,
};

/// Token answers kept at most: the size upstream's token cache was designed for (32 stripes,
/// "a 32k entry cache", `k8s.io/apiserver` `cached_token_authenticator.go`; upstream now bounds
/// it by the TTL alone).
pub const TOKEN_CACHE_SIZE: usize = 32 * 1024;
/// SubjectAccessReview answers kept at most (upstream's webhook authorizer:
/// `cache.NewLRUExpireCache(8192)`).
pub const ACCESS_CACHE_SIZE: usize = 8192;
/// An access review whose attributes are larger than this is not cached (upstream's
/// `maxControlledAttrCacheSize`).
pub const MAX_CACHED_ACCESS_KEY: usize = 10_000;

/// [`Reviewer`] over the API server.
pub struct KubeReviewer {
    client: Client,
    token_ttl: Duration,
    authorized_ttl: Duration,
    unauthorized_ttl: Duration,
    tokens: ReviewCache<TokenReviewed>,
    access: ReviewCache<bool>,
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
            tokens: ReviewCache::new(TOKEN_CACHE_SIZE),
            access: ReviewCache::new(ACCESS_CACHE_SIZE),
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
    async fn review_token(&self, token: &str) -> Result<TokenReviewed, ReviewError> {
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
            .map_err(|source| ReviewError::Api {
                review: "TokenReview",
                source,
            })?;
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

    async fn review_access(&self, attributes: &Attributes) -> Result<bool, ReviewError> {
        let review = access_review(attributes);
        let key = serde_json::to_string(&review.spec).map_err(|source| ReviewError::Encode {
            review: "SubjectAccessReview",
            source,
        })?;
        if let Some(allowed) = self.access.get(&key) {
            return Ok(allowed);
        }
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| ReviewError::Api {
                review: "SubjectAccessReview",
                source,
            })?;
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
        if key.len() <= MAX_CACHED_ACCESS_KEY {
            self.access.put(key, allowed, ttl);
        }
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests;
