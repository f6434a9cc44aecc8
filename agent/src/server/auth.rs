//! Who is asking and may they: the full server's authentication (a verified client certificate,
//! else a bearer token checked by a [`Reviewer`], else anonymous when allowed) and authorization
//! (`AlwaysAllow`, or a SubjectAccessReview per request attribute), and the attributes a request
//! maps to: `nodes/<subresource>` of this node, the verb from the HTTP method.
//!
//! Not here: the TLS handshake that verifies certificates (`tls.rs`) and the API calls
//! (`webhook.rs`). Upstream: `pkg/kubelet/server/auth.go` (`GetRequestAttributes`, with the
//! `KubeletFineGrainedAuthz` subresources `pods`, `healthz`, `configz` tried before `proxy`),
//! `server.go` `InstallAuthFilter` (401 "Unauthorized", 403 "Forbidden (user=…, verb=…,
//! resource=…, subresource(s)=[…])", 500 on an authorizer error), and the apiserver's x509,
//! bearer-token, anonymous and webhook authenticators.

use std::{collections::BTreeMap, sync::Arc};

use http::Method;

use crate::config::AuthorizationMode;

/// The group every authenticated user is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
pub const ANONYMOUS_USER: &str = "system:anonymous";
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";

/// An authenticated user, as the API server's `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    pub fn anonymous() -> UserInfo {
        UserInfo {
            name: ANONYMOUS_USER.into(),
            groups: vec![UNAUTHENTICATED_GROUP.into()],
            ..UserInfo::default()
        }
    }

    /// Adds `system:authenticated` unless present (upstream's `AuthenticatedGroupAdder`).
    fn authenticated(mut self) -> UserInfo {
        if !self.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            self.groups.push(AUTHENTICATED_GROUP.into());
        }
        self
    }

    /// The user of a client certificate that passed verification: CN, with the organizations
    /// as groups. A certificate without a CN names no one.
    pub fn from_certificate(der: &[u8]) -> Option<UserInfo> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let subject = cert.subject();
        let name = subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())?
            .to_owned();
        if name.is_empty() {
            return None;
        }
        let groups = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_owned))
            .collect();
        Some(UserInfo {
            name,
            groups,
            ..UserInfo::default()
        })
    }
}

/// The verified client certificate's user of a connection, put in each of its requests.
#[derive(Clone, Debug, Default)]
pub struct PeerUser(pub Option<UserInfo>);

/// One authorization question: may `user` `verb` `nodes/<subresource>` named `node`?
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub user: UserInfo,
    pub verb: &'static str,
    pub subresource: &'static str,
    pub node: String,
    pub path: String,
}

/// The API verb of an HTTP method, as upstream maps it (other methods: none).
pub fn api_verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::GET => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// Upstream `isSubpath`: `path` itself or below it.
fn is_subpath(sub: &str, path: &str) -> bool {
    let path = path.trim_end_matches('/');
    sub == path || (sub.starts_with(path) && sub.as_bytes().get(path.len()) == Some(&b'/'))
}

/// The subresources a request path is checked against, in order; any one allowed lets it in.
pub fn subresources(path: &str) -> Vec<&'static str> {
    let mut out = Vec::with_capacity(2);
    if is_subpath(path, "/pods") || is_subpath(path, "/runningpods/") {
        out.push("pods");
    } else if is_subpath(path, "/healthz") {
        out.push("healthz");
    } else if is_subpath(path, "/configz") {
        out.push("configz");
    } else if is_subpath(path, "/statusz") {
        out.push("statusz");
    }
    out.push(if is_subpath(path, "/stats/") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs/") {
        "log"
    } else if is_subpath(path, "/checkpoint/") {
        "checkpoint"
    } else {
        "proxy"
    });
    out
}

/// The attributes of one request, one per subresource.
pub fn request_attributes(
    user: &UserInfo,
    method: &Method,
    path: &str,
    node: &str,
) -> Vec<Attributes> {
    subresources(path)
        .into_iter()
        .map(|subresource| Attributes {
            user: user.clone(),
            verb: api_verb(method),
            subresource,
            node: node.to_owned(),
            path: path.to_owned(),
        })
        .collect()
}

/// What a token review said about a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenReviewed {
    User(UserInfo),
    /// Not authenticated, with the API server's error text if any.
    Rejected(String),
}

/// Why a review got no answer: the request refused, never fails open.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The API server did not answer the review (`TokenReview`, `SubjectAccessReview`).
    #[error("{review}: {source}")]
    Api {
        review: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("{review}: the request cannot be encoded: {source}")]
    Encode {
        review: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

#[cfg(test)]
impl ReviewError {
    /// An API server that refuses the connection, as tests script it.
    pub(crate) fn unreachable(review: &'static str) -> Self {
        ReviewError::Api {
            review,
            source: kube::Error::Service(Box::new(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused",
            ))),
        }
    }
}

/// The API server's reviews (TokenReview, SubjectAccessReview); `webhook.rs` has the real one.
#[tonic::async_trait]
pub trait Reviewer: Send + Sync {
    async fn review_token(&self, token: &str) -> Result<TokenReviewed, ReviewError>;
    /// `Ok(true)` when allowed.
    async fn review_access(&self, attributes: &Attributes) -> Result<bool, ReviewError>;
}

/// Why a request is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 401 "Unauthorized".
    Unauthorized,
    /// 403 with upstream's message.
    Forbidden(String),
    /// 500: the authorizer could not answer.
    AuthorizerError(String),
}

/// The full server's authentication and authorization.
#[derive(Clone)]
pub struct Auth {
    pub node_name: String,
    pub anonymous: bool,
    /// Bearer tokens are reviewed (authentication.webhook.enabled).
    pub token_webhook: bool,
    pub mode: AuthorizationMode,
    /// The API server's reviews; `None` standalone (then neither webhook is configured).
    pub reviewer: Option<Arc<dyn Reviewer>>,
}

impl Auth {
    /// The user of a request: its verified certificate's, else its bearer token's, else
    /// anonymous when allowed.
    pub async fn authenticate(
        &self,
        peer: Option<&UserInfo>,
        authorization: Option<&str>,
    ) -> Result<UserInfo, Refusal> {
        if let Some(user) = peer {
            return Ok(user.clone().authenticated());
        }
        if let Some(token) = authorization.and_then(bearer_token)
            && self.token_webhook
            && let Some(reviewer) = &self.reviewer
        {
            return match reviewer.review_token(token).await {
                Ok(TokenReviewed::User(user)) => Ok(user.authenticated()),
                Ok(TokenReviewed::Rejected(why)) => {
                    tracing::debug!(reason = why, "kubelet API: token rejected");
                    Err(Refusal::Unauthorized)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "kubelet API: token review failed");
                    Err(Refusal::Unauthorized)
                }
            };
        }
        if self.anonymous {
            return Ok(UserInfo::anonymous());
        }
        Err(Refusal::Unauthorized)
    }

    /// Allowed when any of the request's attributes is.
    pub async fn authorize(&self, attributes: &[Attributes]) -> Result<(), Refusal> {
        let Some(first) = attributes.first() else {
            return Err(Refusal::Forbidden("Forbidden (no attributes)".into()));
        };
        if self.mode == AuthorizationMode::AlwaysAllow {
            return Ok(());
        }
        let Some(reviewer) = &self.reviewer else {
            // Refused at configuration time; kept safe here.
            return Err(Refusal::AuthorizerError(
                "Webhook authorization without an API server".into(),
            ));
        };
        for attrs in attributes {
            match reviewer.review_access(attrs).await {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        user = attrs.user.name,
                        "kubelet API: authorization error"
                    );
                    return Err(Refusal::AuthorizerError(format!(
                        "Authorization error (user={}, verb={}, resource=nodes, subresource={})",
                        attrs.user.name, attrs.verb, attrs.subresource
                    )));
                }
            }
        }
        let subresources: Vec<&str> = attributes.iter().map(|a| a.subresource).collect();
        Err(Refusal::Forbidden(format!(
            "Forbidden (user={}, verb={}, resource=nodes, subresource(s)=[{}])",
            first.user.name,
            first.verb,
            subresources.join(" ")
        )))
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
pub fn bearer_token(header: &str) -> Option<&str> {
    let mut parts = header.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests;
