//! Probes, metrics, the OpenAPI document and the offline docs page.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ApiError, AppState};

/// Liveness answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"status": "ok"}))]
pub struct Health {
    /// Always `ok`.
    pub status: String,
}

/// Readiness answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"status": "ready", "backend": "sqlite", "model_version": 3}))]
pub struct Ready {
    /// Always `ready` (an unready service answers 503 with a problem document).
    pub status: String,
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Release id of the served model (null: nothing published yet).
    pub model_version: Option<i64>,
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "ops", operation_id = "healthz",
    responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health {
        status: "ok".into(),
    })
}

/// Readiness: the store answers a query.
#[utoipa::path(get, path = "/readyz", tag = "ops", operation_id = "readyz", responses(
    (status = 200, description = "Ready", body = Ready),
    (status = 503, description = "Store unreachable", body = super::Problem, content_type = "application/problem+json")))]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    state.store.ping().await.map_err(|e| {
        state.metrics.store_errors.inc();
        log::warn!("readyz: store unreachable: {e}");
        ApiError::unavailable("store unreachable")
    })?;
    Ok(HttpResponse::Ok().json(Ready {
        status: "ready".into(),
        backend: state.store.backend().name().into(),
        model_version: state.registry.current().map(|p| p.release_id),
    }))
}

/// Prometheus metrics (text format; names in docs/METRICS.md). Without a key, or with a
/// public, user, reader or writer key: only the series that do not depend on the data
/// (the served release id and its publication time). With a `metrics` key (a scraper's
/// bearer token, `dprec keys create --role metrics`) or an admin key: also HTTP request
/// counts, statuses and latencies, store errors, and the series that count data
/// (ratings ingested, training runs, budget spent, ratings exhausted, users excluded).
#[utoipa::path(get, path = "/metrics", tag = "ops", operation_id = "metrics",
    responses((status = 200, description = "Prometheus text format: without a metrics or admin key only the served release id and its publication time; with one, every series (request counts and latencies included)", content_type = "text/plain")))]
pub async fn metrics(state: web::Data<AppState>, req: HttpRequest) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(state.metrics.render(state.keys.may_scrape(&req)))
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "ops", operation_id = "openapi",
    responses((status = 200, description = "OpenAPI 3.1 document", content_type = "application/json", body = Object)))]
pub async fn openapi_json(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(state.documents.spec_json.clone())
}

/// This API's documentation as one HTML page, rendered on the server from this document:
/// operations grouped by purpose, descriptions rendered, schemas resolved; no script and
/// nothing loaded from anywhere else.
#[utoipa::path(get, path = "/docs", tag = "ops", operation_id = "docs", responses((status = 200, description = "HTML", content_type = "text/html")))]
pub async fn docs(state: web::Data<AppState>) -> HttpResponse {
    super::pages::html(state.documents.docs_page.clone())
}

/// The service's root: a redirect to the documentation page, `/docs`.
#[utoipa::path(get, path = "/", tag = "ops", operation_id = "root",
    responses((status = 307, description = "Redirect to `/docs` (the `Location` header)")))]
pub async fn root() -> HttpResponse {
    HttpResponse::TemporaryRedirect()
        .insert_header((actix_web::http::header::LOCATION, "/docs"))
        .finish()
}
