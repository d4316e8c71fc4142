//! Admin: trigger a retrain, job status, API keys.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{self, AdminKey};
use super::{json_body, optional_json_body, ApiError, AppState};
use crate::config::Role;

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Job {
    pub id: i64,
    /// `admin` or `scheduled`.
    pub kind: String,
    /// `running`, `succeeded`, `skipped`, `failed` or `refused` (the release's DP input
    /// total was below `retrain.min_input_ratio` times the served release's: its charges
    /// are committed, it is not served; retry with `"force": true` to publish it anyway).
    pub status: String,
    /// Why the job skipped, failed or was refused (with both DP totals), or `forced: ...`
    /// for a forced release that the rule would have refused.
    pub reason: Option<String>,
    /// The published release (`succeeded`), or the release that holds a refused job's
    /// charges (`refused`; not served, not listed in `GET /v1/models`).
    pub release_id: Option<i64>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
}

/// Options of an admin retrain (the body is optional).
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"force": false}))]
pub struct RetrainRequest {
    /// Publish even when the release's DP input total is below `retrain.min_input_ratio`
    /// times the served release's (default false: such a release is refused, job status
    /// `refused`). Scheduled retrains never force.
    #[serde(default)]
    pub force: bool,
}

/// Start a retrain job (runs in the background; poll the job). The optional body
/// `{"force": true}` publishes past the operator-safety rule (see `Job.status`).
#[utoipa::path(post, path = "/v1/admin/retrain", tag = "admin",
    request_body(content = RetrainRequest, description = "Optional (no body: `{\"force\": false}`)"),
    responses((status = 202, body = Job)), security(("api_key" = [])))]
pub async fn retrain(
    _auth: AdminKey,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body: RetrainRequest =
        optional_json_body(&req, payload, state.settings.server.max_body_bytes).await?;
    let id = state.retrainer.spawn_job("admin", body.force).await?;
    let job = state
        .store
        .job(id)
        .await?
        .ok_or_else(|| ApiError::internal("job vanished"))?;
    Ok(HttpResponse::Accepted().json(to_view(job)))
}

/// A stored job as the API shows it.
pub(crate) fn to_view(j: crate::store::JobRow) -> Job {
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

/// A key to create: its role, and for a user token the user it is bound to.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"role": "user", "user": "u42"}))]
pub struct NewKey {
    pub role: Role,
    /// Required for `user` (the token reaches this user's recommendations, budget,
    /// settings and profile only); refused for the other roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// A stored key (never the key itself: only its SHA-256 is stored).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeyView {
    /// The first 12 hex digits of the key's SHA-256 (what `DELETE` and `dprec keys revoke`
    /// take).
    pub id: String,
    pub role: Role,
    /// The user a `user` token is bound to.
    pub user: Option<String>,
    /// Milliseconds since the epoch; null for keys from the config file.
    pub created_at: Option<i64>,
    /// `database` (created by the API, `dprec keys` or the first start; revocable here)
    /// or `config` (`[[auth.keys]]`, changed in the file).
    pub source: String,
}

/// A created key: the only answer that contains the key.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CreatedKey {
    /// The secret, shown once: use it as `Authorization: Bearer KEY`.
    pub key: String,
    /// What is stored about it (as `GET /v1/admin/keys` lists it).
    pub stored: KeyView,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeyList {
    pub keys: Vec<KeyView>,
}

fn key_view(k: crate::store::ApiKeyRow) -> Result<KeyView, ApiError> {
    Ok(KeyView {
        id: crate::api::keyring::key_id(&k.hash).to_string(),
        role: auth::parse_role(&k.role)
            .ok_or_else(|| ApiError::internal(format!("stored key has role {:?}", k.role)))?,
        user: k.user,
        created_at: Some(k.created_at),
        source: "database".into(),
    })
}

/// Create an API key. The key is in this answer only; the store keeps its SHA-256.
/// Roles (DESIGN 6): `admin`, `writer`, `reader` (service reader: the curator's backend),
/// `user` (bound to `user`: that user's recommendations, budget audit, settings and
/// profile only) and `public` (the published DP model and release list).
#[utoipa::path(post, path = "/v1/admin/keys", tag = "admin", operation_id = "create_key",
    request_body = NewKey,
    responses((status = 201, body = CreatedKey)),
    security(("api_key" = [])))]
pub async fn create_key(
    _auth: AdminKey,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body: NewKey = json_body(&req, payload, state.settings.server.max_body_bytes).await?;
    let role = auth::role_name(body.role);
    let user = crate::api::keyring::check_role_user(
        role,
        body.user.as_deref(),
        state.settings.ratings.max_id_len,
    )
    .map_err(|e| ApiError::invalid("user", e))?;
    let key = auth::generate_key();
    let hash = auth::hash_key(&key);
    let created_at = state
        .store
        .insert_api_key(&hash, role, user.as_deref())
        .await?;
    state.keys.reload(&state.store).await?;
    Ok(HttpResponse::Created().json(CreatedKey {
        key,
        stored: KeyView {
            id: crate::api::keyring::key_id(&hash).to_string(),
            role: body.role,
            user,
            created_at: Some(created_at),
            source: "database".into(),
        },
    }))
}

/// List the API keys: stored keys, then the config file's.
#[utoipa::path(get, path = "/v1/admin/keys", tag = "admin", operation_id = "list_keys",
    responses((status = 200, body = KeyList)),
    security(("api_key" = [])))]
pub async fn list_keys(
    _auth: AdminKey,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let mut keys = state
        .store
        .api_key_rows()
        .await?
        .into_iter()
        .map(key_view)
        .collect::<Result<Vec<_>, _>>()?;
    keys.extend(state.settings.auth.keys.iter().map(|k| KeyView {
        id: crate::api::keyring::key_id(&auth::hash_key(&k.key)).to_string(),
        role: k.role,
        user: None,
        created_at: None,
        source: "config".into(),
    }));
    Ok(HttpResponse::Ok().json(KeyList { keys }))
}

/// Revoke a stored key by its id; it stops working at once on this server
/// and within `scheduler.reload_secs` on replicas.
#[utoipa::path(delete, path = "/v1/admin/keys/{id}", tag = "admin", operation_id = "revoke_key",
    params(("id" = String, Path, description = "Key id: at least 6 hex digits of the key's SHA-256")),
    responses((status = 204, description = "Revoked"),
        (status = 404, description = "No stored key has this id", body = super::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The id matches several keys", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn revoke_key(
    _auth: AdminKey,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    use crate::api::keyring::{find_by_id, KeyIdError};
    let rows = state.store.api_key_rows().await?;
    let k = find_by_id(rows, &path).map_err(|e| match e {
        KeyIdError::Malformed(_) => ApiError::invalid("id", e.to_string()),
        KeyIdError::Unknown(_) => ApiError::not_found(e.to_string()),
        KeyIdError::Ambiguous(..) => {
            ApiError::new(StatusCode::CONFLICT, "Ambiguous key id", e.to_string()).with_field("id")
        }
    })?;
    state.store.delete_api_key(&k.hash).await?;
    state.keys.reload(&state.store).await?;
    Ok(HttpResponse::NoContent().finish())
}
