//! `/healthz` and `/metrics` over HTTP (axum).

use std::sync::{Arc, Mutex};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};

use crate::metrics::Metrics;

/// Health as the components report it: healthy until one says why it is not.
#[derive(Clone, Default)]
pub struct Health {
    problems: Arc<Mutex<Vec<(&'static str, String)>>>,
}

impl Health {
    /// Marks `component` unhealthy, replacing what it said before.
    pub fn set_unhealthy(&self, component: &'static str, why: String) {
        let mut problems = self.problems.lock().unwrap_or_else(|p| p.into_inner());
        problems.retain(|(c, _)| *c != component);
        problems.push((component, why));
    }

    pub fn set_healthy(&self, component: &'static str) {
        self.problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(c, _)| *c != component);
    }

    /// `None` when healthy, else one line per problem.
    pub fn problems(&self) -> Option<String> {
        let problems = self.problems.lock().unwrap_or_else(|p| p.into_inner());
        if problems.is_empty() {
            return None;
        }
        Some(
            problems
                .iter()
                .map(|(c, why)| format!("{c}: {why}"))
                .collect::<Vec<_>>()
                .join("\n"),
        )
    }
}

#[derive(Clone)]
pub struct HttpState {
    pub metrics: Metrics,
    pub health: Health,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn healthz(State(state): State<HttpState>) -> impl IntoResponse {
    match state.health.problems() {
        None => (StatusCode::OK, "ok\n".to_owned()),
        Some(problems) => (StatusCode::SERVICE_UNAVAILABLE, format!("{problems}\n")),
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    match state.metrics.render() {
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
    }
}
