//! Service account tokens for projected volumes (upstream `pkg/kubelet/token/token_manager.go`):
//! one cached token per request (service account, namespace, audience, expiration, bound pod),
//! requested again through TokenRequest only when upstream's `requiresRefresh` says so — older
//! than 80 % of its lifetime or than 24 h, each less a random jitter of up to 10 s, or issued "in
//! the future" (the clock stepped back). A refresh that fails while the cached token is still
//! valid keeps it (logged); once it expired, the volume's set-up fails. Expired tokens leave the
//! cache at every [`TokenManager::cleanup`] and a pod's tokens with the pod
//! ([`TokenManager::forget_pod`], upstream `DeleteServiceAccountToken`).
//!
//! The lifetime is the answer's `spec.expirationSeconds` and its end the answer's
//! `status.expirationTimestamp`: the API server decides both (it may shorten what was asked,
//! kube-apiserver's `--service-account-max-token-expiration`). An answer without a lifetime is
//! never refreshed before it expires, as upstream.
//!
//! Not here: writing the token (`projected.rs`), the TokenRequest call (`api_objects.rs`).

use crate::lock::MutexExt as _;
use std::{collections::HashMap, sync::Mutex, time::Duration, time::SystemTime};

use super::api_objects::{IssuedToken, ObjectSource, TokenSpec};
use crate::{clock::Clock, container::PodUid};

/// Upstream `maxTTL`: a token older than this is renewed whatever its lifetime.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Upstream `maxJitter`.
pub const MAX_JITTER: Duration = Duration::from_secs(10);

/// A random number in `[0, 1)` (the jitter's fraction; injected so tests pin it).
pub type Jitter = std::sync::Arc<dyn Fn() -> f64 + Send + Sync>;

/// Why no token could be had; the texts are upstream's.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("failed to fetch token: {0}")]
    Fetch(String),
    #[error("token {key} expired and refresh failed: {reason}")]
    ExpiredAndRefreshFailed { key: String, reason: String },
}

pub struct TokenManager {
    cache: Mutex<HashMap<TokenSpec, IssuedToken>>,
    clock: Clock,
    jitter: Jitter,
}

impl TokenManager {
    pub fn new(clock: Clock, jitter: Jitter) -> Self {
        TokenManager {
            cache: Mutex::new(HashMap::new()),
            clock,
            jitter,
        }
    }

    /// The token for `spec`: the cached one unless it needs a refresh (upstream
    /// `GetServiceAccountToken`).
    pub async fn get(
        &self,
        spec: &TokenSpec,
        source: &dyn ObjectSource,
    ) -> Result<String, TokenError> {
        let cached = self.cache.lock_unpoisoned().get(spec).cloned();
        if let Some(cached) = &cached {
            let now = (self.clock)();
            if !requires_refresh(cached, now, MAX_JITTER.mul_f64((self.jitter)())) {
                return Ok(cached.token.clone());
            }
        }
        match (source.token(spec).await, cached) {
            (Ok(issued), _) => {
                let token = issued.token.clone();
                self.cache.lock_unpoisoned().insert(spec.clone(), issued);
                Ok(token)
            }
            (Err(reason), None) => Err(TokenError::Fetch(reason)),
            (Err(reason), Some(cached)) if (self.clock)() > cached.expires => {
                Err(TokenError::ExpiredAndRefreshFailed {
                    key: key(spec),
                    reason,
                })
            }
            (Err(reason), Some(cached)) => {
                tracing::warn!(
                    key = key(spec),
                    error = reason,
                    "couldn't update token; the current one is still valid"
                );
                Ok(cached.token)
            }
        }
    }

    /// Drops the tokens bound to `pod` (upstream `DeleteServiceAccountToken`).
    pub fn forget_pod(&self, pod: &PodUid) {
        self.cache
            .lock_unpoisoned()
            .retain(|spec, _| spec.pod_uid != pod.0);
    }

    /// Drops expired tokens (upstream's `cleanup`, every `gcPeriod`).
    pub fn cleanup(&self) {
        let now = (self.clock)();
        self.cache
            .lock_unpoisoned()
            .retain(|_, issued| now <= issued.expires);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.cache.lock_unpoisoned().len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Upstream's cache key, safe to log (no token in it).
fn key(spec: &TokenSpec) -> String {
    format!(
        "{:?}/{:?}/{:?}/{}/{:?}/{:?}",
        spec.service_account,
        spec.namespace,
        spec.audience,
        spec.expiration_seconds,
        spec.pod_name,
        spec.pod_uid
    )
}

/// Upstream `requiresRefresh`, with the jitter drawn by the caller.
pub fn requires_refresh(issued: &IssuedToken, now: SystemTime, jitter: Duration) -> bool {
    let Some(lifetime) = issued
        .lifetime_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs)
    else {
        tracing::error!(
            "the API server's token request answer has no expirationSeconds; the token is kept until it expires"
        );
        return false;
    };
    let exp = issued.expires;
    let Some(iat) = exp.checked_sub(lifetime) else {
        return true;
    };
    if iat
        .checked_add(MAX_TTL.saturating_sub(jitter))
        .is_some_and(|t| now > t)
    {
        return true;
    }
    // Within 20 % of the lifetime (whole seconds, as upstream's integer arithmetic) plus the
    // jitter of its end.
    let last_fifth = Duration::from_secs(lifetime.as_secs() * 20 / 100) + jitter;
    if exp.checked_sub(last_fifth).is_none_or(|t| now > t) {
        return true;
    }
    now < iat
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    };

    const T0: u64 = 1_700_000_000;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(T0 + secs)
    }

    fn issued(at_secs: u64, lifetime: i64) -> IssuedToken {
        IssuedToken {
            token: format!("t{at_secs}"),
            expires: at(at_secs + lifetime.unsigned_abs()),
            lifetime_seconds: Some(lifetime),
        }
    }

    #[test]
    fn refresh_at_eighty_percent_of_the_lifetime_less_the_jitter() {
        let t = issued(0, 600);
        let none = Duration::ZERO;
        // (now, jitter, wanted)
        let cases = [
            (0, none, false),
            (479, none, false),
            (480, none, false),
            (481, none, true),
            (471, Duration::from_secs(10), true),
            (469, Duration::from_secs(10), false),
            (700, none, true),
        ];
        for (now, jitter, want) in cases {
            assert_eq!(
                requires_refresh(&t, at(now), jitter),
                want,
                "now +{now}s, jitter {jitter:?}"
            );
        }
    }

    #[test]
    fn refresh_after_a_day_and_when_the_clock_went_back() {
        let long = issued(1000, 7 * 24 * 3600);
        assert!(!requires_refresh(
            &long,
            at(1000 + 24 * 3600),
            Duration::ZERO
        ));
        assert!(requires_refresh(
            &long,
            at(1001 + 24 * 3600),
            Duration::ZERO
        ));
        // Issued at +1000 s, now +999 s: the clock stepped back.
        assert!(requires_refresh(&long, at(999), Duration::ZERO));
        let no_lifetime = IssuedToken {
            lifetime_seconds: None,
            ..issued(0, 600)
        };
        assert!(!requires_refresh(&no_lifetime, at(590), Duration::ZERO));
    }

    /// A token source that issues `t<n>` valid 600 s from the shared clock, or fails.
    struct Issuer {
        now: Arc<AtomicU64>,
        issued: AtomicU64,
        fail: std::sync::atomic::AtomicBool,
    }

    #[tonic::async_trait]
    impl ObjectSource for Issuer {
        async fn get(
            &self,
            _: crate::volume::ObjectKind,
            _: &str,
            _: &str,
        ) -> Result<Option<crate::volume::ObjectData>, String> {
            Ok(None)
        }

        async fn token(&self, _: &TokenSpec) -> Result<IssuedToken, String> {
            if self.fail.load(Ordering::SeqCst) {
                return Err("connection refused".into());
            }
            let n = self.issued.fetch_add(1, Ordering::SeqCst) + 1;
            let now = self.now.load(Ordering::SeqCst);
            Ok(IssuedToken {
                token: format!("t{n}"),
                expires: at(now + 600),
                lifetime_seconds: Some(600),
            })
        }
    }

    fn spec(pod: &str) -> TokenSpec {
        TokenSpec {
            namespace: "prod".into(),
            service_account: "default".into(),
            audience: None,
            expiration_seconds: 600,
            pod_name: "web".into(),
            pod_uid: pod.into(),
        }
    }

    #[tokio::test]
    async fn cached_until_due_kept_while_valid_then_an_error() {
        let now = Arc::new(AtomicU64::new(0));
        let clock_now = now.clone();
        let clock: Clock = Arc::new(move || at(clock_now.load(Ordering::SeqCst)));
        let manager = TokenManager::new(clock, Arc::new(|| 0.0));
        let issuer = Issuer {
            now: now.clone(),
            issued: AtomicU64::new(0),
            fail: false.into(),
        };
        let u1 = spec("u1");
        let get = || manager.get(&u1, &issuer);
        assert_eq!(get().await, Ok("t1".into()));
        now.store(470, Ordering::SeqCst);
        assert_eq!(get().await, Ok("t1".into()), "not due before 80 %");
        now.store(490, Ordering::SeqCst);
        assert_eq!(get().await, Ok("t2".into()), "renewed after 80 %");
        assert_eq!(issuer.issued.load(Ordering::SeqCst), 2);

        // t2 was issued at +490 s and ends at +1090 s.
        issuer.fail.store(true, Ordering::SeqCst);
        now.store(1000, Ordering::SeqCst);
        assert_eq!(get().await, Ok("t2".into()), "still valid: kept");
        now.store(1100, Ordering::SeqCst);
        let expired = get().await;
        assert!(
            matches!(&expired, Err(TokenError::ExpiredAndRefreshFailed { reason, .. }) if reason == "connection refused"),
            "{expired:?}"
        );
        assert_eq!(
            manager.get(&spec("u2"), &issuer).await,
            Err(TokenError::Fetch("connection refused".into()))
        );
    }

    #[tokio::test]
    async fn expired_and_forgotten_tokens_leave_the_cache() {
        let now = Arc::new(AtomicU64::new(0));
        let clock_now = now.clone();
        let clock: Clock = Arc::new(move || at(clock_now.load(Ordering::SeqCst)));
        let manager = TokenManager::new(clock, Arc::new(|| 0.5));
        let issuer = Issuer {
            now: now.clone(),
            issued: AtomicU64::new(0),
            fail: false.into(),
        };
        manager.get(&spec("u1"), &issuer).await.expect("a token");
        now.store(100, Ordering::SeqCst);
        manager.get(&spec("u2"), &issuer).await.expect("a token");
        assert_eq!(manager.len(), 2);
        manager.forget_pod(&PodUid::from("u2"));
        assert_eq!(manager.len(), 1);
        now.store(601, Ordering::SeqCst);
        manager.cleanup();
        assert!(manager.is_empty());
    }
}
