//! The HTTP endpoints (axum): the healthz address serves `/healthz` only (upstream's healthz
//! server, `cmd/kubelet/app/server.go`); the read-only port (and, behind authentication, the
//! kubelet server) serves `/healthz` (and `/healthz/<check>`), `/metrics`, `/metrics/probes`,
//! `/pods` (a PodList as the kubelet's read-only
//! port serves it) and `/node`. Upstream: kubelet `pkg/kubelet/server/server.go`
//! (`InstallDefaultHandlers`).

use crate::lock::MutexExt as _;
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use axum::{
    Router,
    extract::{Path, State},
    http::StatusCode,
    response::IntoResponse,
    routing::get,
};

use crate::{metrics::Metrics, status::StatusManager};

/// A component's live health: `None` when healthy, else why not.
pub type HealthCheck = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// Health as the components report it: healthy until one says why it is not, either by setting a
/// problem or through a check evaluated at each request. Apart from that, conditions that leave
/// the agent healthy but are worth telling (the node not ready because the container runtime is
/// down): the service manager's status line tells them, and they neither change `/healthz` (as
/// the kubelet's, which checks no runtime: its answer stays `ok`, what probes and tests expect)
/// nor hold back the watchdog (see `crate::notify`).
#[derive(Clone, Default)]
pub struct Health {
    problems: Arc<Mutex<Vec<(&'static str, String)>>>,
    checks: Arc<Mutex<Vec<(&'static str, HealthCheck)>>>,
    conditions: Arc<Mutex<Vec<(&'static str, HealthCheck)>>>,
    /// Facts worth telling with a healthy answer (e.g. a fallback in force).
    notes: Arc<Mutex<Vec<(&'static str, String)>>>,
}

impl Health {
    /// Marks `component` unhealthy, replacing what it said before.
    pub fn set_unhealthy(&self, component: &'static str, why: String) {
        let mut problems = self.problems.lock_unpoisoned();
        problems.retain(|(c, _)| *c != component);
        problems.push((component, why));
    }

    pub fn set_healthy(&self, component: &'static str) {
        self.problems
            .lock_unpoisoned()
            .retain(|(c, _)| *c != component);
    }

    /// Adds a line to every healthy answer.
    pub fn set_note(&self, component: &'static str, note: String) {
        let mut notes = self.notes.lock_unpoisoned();
        notes.retain(|(c, _)| *c != component);
        notes.push((component, note));
    }

    /// `ok`, then the notes, one per line.
    pub fn healthy_body(&self) -> String {
        let mut body = "ok\n".to_owned();
        for (component, note) in self.notes.lock_unpoisoned().iter() {
            body.push_str(&format!("{component}: {note}\n"));
        }
        body
    }

    /// Adds a condition evaluated at each look: told, never a failure.
    pub fn add_condition(&self, component: &'static str, check: HealthCheck) {
        self.conditions.lock_unpoisoned().push((component, check));
    }

    /// The conditions in force, one line each; `None` when there is none.
    pub fn conditions(&self) -> Option<String> {
        let conditions = self.conditions.lock_unpoisoned().clone();
        let lines: Vec<String> = conditions
            .iter()
            .filter_map(|(component, check)| check().map(|why| format!("{component}: {why}")))
            .collect();
        (!lines.is_empty()).then(|| lines.join("\n"))
    }

    /// Adds a check run at every health request.
    pub fn add_check(&self, component: &'static str, check: HealthCheck) {
        self.checks.lock_unpoisoned().push((component, check));
    }

    /// One check alone, as `/healthz/<name>` asks (upstream `healthz.InstallPathHandler`'s
    /// per-check paths): `None` for a name nothing reports under, else the check's answer
    /// (`None` when healthy). `ping` is always healthy (upstream `PingHealthz`).
    pub fn named(&self, name: &str) -> Option<Option<String>> {
        if name == "ping" {
            return Some(None);
        }
        let set = self
            .problems
            .lock_unpoisoned()
            .iter()
            .find(|(c, _)| *c == name)
            .map(|(_, why)| why.clone());
        if let Some(why) = set {
            return Some(Some(why));
        }
        let check = self
            .checks
            .lock_unpoisoned()
            .iter()
            .find(|(c, _)| *c == name)
            .map(|(_, check)| check.clone())?;
        Some(check())
    }

    /// `None` when healthy, else one line per problem.
    pub fn problems(&self) -> Option<String> {
        let mut lines: Vec<String> = self
            .problems
            .lock_unpoisoned()
            .iter()
            .map(|(c, why)| format!("{c}: {why}"))
            .collect();
        let checks = self.checks.lock_unpoisoned().clone();
        for (component, check) in checks {
            if let Some(why) = check() {
                lines.push(format!("{component}: {why}"));
            }
        }
        (!lines.is_empty()).then(|| lines.join("\n"))
    }
}

#[derive(Clone)]
pub struct HttpState {
    pub metrics: Metrics,
    pub health: Health,
    /// Pods and their statuses, for `/pods` (absent when the agent runs no pods).
    pub pods: Option<Arc<StatusManager>>,
    /// Annotations `/pods` adds to a pod, by pod UID (the CPU manager's assignments and what the
    /// scheduler audit saw on them).
    pub annotate: Option<Annotator>,
    /// The Node object the agent would report, for `/node` (absent when it runs no pods).
    pub node: Option<Arc<crate::sources::LocalNode>>,
}

/// Extra annotations for the pod with this UID.
pub type Annotator = Arc<dyn Fn(&str) -> BTreeMap<String, String> + Send + Sync>;

/// The healthz address: `/healthz`, nothing else (it is reachable without authentication by
/// design, so it tells nothing about pods or the node).
pub fn healthz_router(health: Health) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|State(health): State<Health>| async move { health_answer(&health) }),
        )
        .route("/healthz/{check}", get(named_check))
        .with_state(health)
}

/// The read-only port's routes (also the kubelet server's, behind its auth filter).
pub fn read_only_router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route(
            "/healthz/{check}",
            get(|State(state): State<HttpState>, path: Path<String>| {
                named_check(State(state.health), path)
            }),
        )
        .route("/metrics", get(metrics))
        .route("/metrics/probes", get(probe_metrics))
        .route("/pods", get(pods))
        .route("/node", get(node))
        .with_state(state)
}

/// The pods this node runs, with their statuses, as a `v1.PodList`.
async fn pods(State(state): State<HttpState>) -> impl IntoResponse {
    let items: Vec<serde_json::Value> = state
        .pods
        .iter()
        .flat_map(|m| m.pods())
        .filter_map(|p| {
            let mut pod = p.pod.clone();
            if let Some(annotate) = &state.annotate {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let extra = annotate(&uid);
                if !extra.is_empty() {
                    pod.metadata
                        .annotations
                        .get_or_insert_default()
                        .extend(extra);
                }
            }
            serde_json::to_value(&pod).ok()
        })
        .collect();
    let list = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items,
    });
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        list.to_string(),
    )
}

/// The Node object as the agent would post it to the API server (swiftlet's own endpoint: a
/// standalone node has no API server to read it from).
async fn node(State(state): State<HttpState>) -> impl IntoResponse {
    let Some(local) = &state.node else {
        return (
            StatusCode::NOT_FOUND,
            "this agent runs no pods\n".to_owned(),
        )
            .into_response();
    };
    match serde_json::to_string(&local.object()) {
        Ok(body) => (StatusCode::OK, [("content-type", "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn healthz(State(state): State<HttpState>) -> impl IntoResponse {
    health_answer(&state.health)
}

/// `/healthz/<check>`: upstream's `adaptCheckToHandler` answers, `ok` or a 500 with the
/// check's error; an unknown check is a 404 (upstream's mux has no such path).
async fn named_check(
    State(health): State<Health>,
    Path(check): Path<String>,
) -> (StatusCode, String) {
    match health.named(&check) {
        None => (StatusCode::NOT_FOUND, "404 page not found\n".to_owned()),
        Some(None) => (StatusCode::OK, "ok".to_owned()),
        Some(Some(why)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal server error: {why}\n"),
        ),
    }
}

fn health_answer(health: &Health) -> (StatusCode, String) {
    match health.problems() {
        None => (StatusCode::OK, health.healthy_body()),
        Some(problems) => (StatusCode::SERVICE_UNAVAILABLE, format!("{problems}\n")),
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    exposition(state.metrics.render())
}

async fn probe_metrics(State(state): State<HttpState>) -> impl IntoResponse {
    exposition(state.metrics.render_probes())
}

fn exposition(rendered: Result<String, prometheus::Error>) -> axum::response::Response {
    match rendered {
        Ok(text) => (
            StatusCode::OK,
            [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_reports_each_component_once() {
        let health = Health::default();
        assert_eq!(health.problems(), None);
        health.set_unhealthy("kernel", "stream ended".into());
        health.set_unhealthy("kernel", "stream failed".into());
        assert_eq!(health.problems().as_deref(), Some("kernel: stream failed"));
        health.set_healthy("kernel");
        assert_eq!(health.problems(), None);
        health.add_check("pleg", Arc::new(|| Some("stale".to_owned())));
        assert_eq!(health.problems().as_deref(), Some("pleg: stale"));
    }

    #[tokio::test]
    async fn a_named_check_answers_alone_as_upstream_words_it() {
        let health = Health::default();
        let wedged = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = wedged.clone();
        health.add_check(
            "syncloop",
            Arc::new(move || {
                seen.load(std::sync::atomic::Ordering::SeqCst)
                    .then(|| "sync Loop took longer than expected".to_owned())
            }),
        );
        health.set_unhealthy("kernel events", "stream ended".into());
        let ask = |name: &str| named_check(State(health.clone()), Path(name.to_owned()));
        assert_eq!(ask("syncloop").await, (StatusCode::OK, "ok".to_owned()));
        assert_eq!(ask("ping").await, (StatusCode::OK, "ok".to_owned()));
        assert_eq!(ask("nosuch").await.0, StatusCode::NOT_FOUND);
        assert_eq!(
            ask("kernel events").await,
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal server error: stream ended\n".to_owned()
            )
        );
        wedged.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(
            ask("syncloop").await,
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal server error: sync Loop took longer than expected\n".to_owned()
            )
        );
        assert!(
            health_answer(&health)
                .1
                .contains("syncloop: sync Loop took longer than expected")
        );
    }

    #[test]
    fn a_condition_is_told_but_never_changes_the_answer() {
        let health = Health::default();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let seen = down.clone();
        health.add_condition(
            "node not ready",
            Arc::new(move || {
                seen.load(std::sync::atomic::Ordering::SeqCst)
                    .then(|| "container runtime is down".to_owned())
            }),
        );
        assert_eq!(health.problems(), None);
        assert_eq!(
            health.conditions().as_deref(),
            Some("node not ready: container runtime is down")
        );
        assert_eq!(health_answer(&health), (StatusCode::OK, "ok\n".to_owned()));
        down.store(false, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(health.conditions(), None);
        assert_eq!(health_answer(&health), (StatusCode::OK, "ok\n".to_owned()));
    }
}
