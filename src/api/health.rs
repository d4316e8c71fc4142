//! Probes, metrics, the OpenAPI document and the offline docs page.

use actix_web::{web, HttpResponse};

use super::{ApiError, AppState};

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "ops", responses((status = 200, description = "Alive")))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// Readiness: the store answers a query.
#[utoipa::path(get, path = "/readyz", tag = "ops", responses(
    (status = 200, description = "Ready"),
    (status = 503, description = "Store unreachable", body = super::Problem, content_type = "application/problem+json")))]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    state.store.ping().await.map_err(|e| {
        state.metrics.store_errors.inc();
        log::warn!("readyz: store unreachable: {e}");
        ApiError::unavailable("store unreachable")
    })?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "status": "ready",
        "backend": state.store.backend().name(),
        "model_version": state.registry.current().map(|p| p.release_id),
    })))
}

/// Prometheus metrics (text format; names in docs/METRICS.md).
#[utoipa::path(get, path = "/metrics", tag = "ops", responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render())
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "ops", responses((status = 200, description = "OpenAPI 3.1 document")))]
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(super::openapi::spec_json())
}

/// Self-contained HTML page that renders /openapi.json (no network access needed).
#[utoipa::path(get, path = "/docs", tag = "ops", responses((status = 200, description = "HTML", content_type = "text/html")))]
pub async fn docs() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(include_str!("docs.html"))
}
