//! Admin: trigger a retrain, job status.

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::AdminKey;
use super::{ApiError, AppState};

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Job {
    pub id: i64,
    /// `admin` or `scheduled`.
    pub kind: String,
    /// `running`, `succeeded`, `skipped` or `failed`.
    pub status: String,
    pub reason: Option<String>,
    pub release_id: Option<i64>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
}

/// Start a retrain job (runs in the background; poll the job).
#[utoipa::path(post, path = "/v1/admin/retrain", tag = "admin",
    responses((status = 202, body = Job)), security(("api_key" = [])))]
pub async fn retrain(
    _auth: AdminKey,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = state.retrainer.spawn_job("admin").await?;
    let job = state
        .store
        .job(id)
        .await?
        .ok_or_else(|| ApiError::internal("job vanished"))?;
    Ok(HttpResponse::Accepted().json(to_view(job)))
}

fn to_view(j: crate::store::JobRow) -> Job {
    Job {
        id: j.id,
        kind: j.kind,
        status: j.status,
        reason: j.reason,
        release_id: j.release_id,
        created_at: j.created_at,
        finished_at: j.finished_at,
    }
}

/// Status of a retrain job.
#[utoipa::path(get, path = "/v1/admin/jobs/{id}", tag = "admin", operation_id = "get_job",
    params(("id" = i64, Path)),
    responses((status = 200, body = Job),
        (status = 404, description = "Unknown job", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn job(
    _auth: AdminKey,
    state: web::Data<AppState>,
    path: web::Path<i64>,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let job = state
        .store
        .job(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("unknown job {id}")))?;
    Ok(HttpResponse::Ok().json(to_view(job)))
}
