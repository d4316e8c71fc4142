//! Releases and downloads of the published DP profiles.

use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::ReaderKey;
use super::{path_id, ApiError, AppState, Page};
use crate::store::ReleaseRow;

#[derive(Debug, Serialize, ToSchema)]
pub struct Release {
    pub id: i64,
    pub trainer: String,
    #[schema(value_type = Object)]
    pub params: serde_json::Value,
    /// `proven` or `non-private`.
    pub guarantee: String,
    /// Mechanisms with parameters, unit and neighbour relation.
    #[schema(value_type = Object)]
    pub mechanisms: serde_json::Value,
    pub popularity_eps: f64,
    pub n_ratings: i64,
    pub n_users: i64,
    pub n_items: i64,
    pub job_id: Option<i64>,
    pub created_at: i64,
}

impl From<ReleaseRow> for Release {
    fn from(r: ReleaseRow) -> Self {
        Self {
            id: r.id,
            trainer: r.trainer,
            params: r.params,
            guarantee: r.guarantee.to_string(),
            mechanisms: r.mechanisms,
            popularity_eps: r.popularity_eps,
            n_ratings: r.n_ratings,
            n_users: r.n_users,
            n_items: r.n_items,
            job_id: r.job_id,
            created_at: r.created_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReleaseList {
    pub limit: i64,
    pub offset: i64,
    pub releases: Vec<Release>,
}

/// All releases, newest first.
#[utoipa::path(get, path = "/v1/models", tag = "models", params(Page),
    responses((status = 200, body = ReleaseList)), security(("api_key" = [])))]
pub async fn list(
    _auth: ReaderKey,
    state: web::Data<AppState>,
    page: web::Query<Page>,
) -> Result<HttpResponse, ApiError> {
    let (limit, offset) = page.parse()?;
    let releases = state.store.releases(limit, offset).await?;
    Ok(HttpResponse::Ok().json(ReleaseList {
        limit,
        offset,
        releases: releases.into_iter().map(Release::from).collect(),
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CurrentModel {
    pub release: Release,
    /// Seconds since the served release was published.
    pub age_seconds: f64,
}

/// The served release.
#[utoipa::path(get, path = "/v1/models/current", tag = "models",
    responses((status = 200, body = CurrentModel),
        (status = 404, description = "Nothing published yet", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn current(
    _auth: ReaderKey,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let p = state
        .registry
        .current()
        .ok_or_else(|| ApiError::not_found("no model has been published yet"))?;
    let r = state
        .store
        .release(p.release_id)
        .await?
        .ok_or_else(|| ApiError::internal("served release missing from the store"))?;
    Ok(HttpResponse::Ok().json(CurrentModel {
        age_seconds: (crate::store::now_ms() - r.created_at) as f64 / 1000.0,
        release: r.into(),
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ItemProfile {
    pub item: String,
    pub bias: f64,
    pub factors: Vec<f64>,
    /// DP popularity count.
    pub popularity: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ItemProfiles {
    pub model_version: i64,
    pub guarantee: String,
    pub global_mean: f64,
    pub rank: usize,
    pub items: Vec<ItemProfile>,
}

/// Download the published DP item profiles (and DP popularity).
#[utoipa::path(get, path = "/v1/models/current/items", tag = "models",
    responses((status = 200, body = ItemProfiles)), security(("api_key" = [])))]
pub async fn item_profiles(
    _auth: ReaderKey,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let p = state
        .registry
        .current()
        .ok_or_else(|| ApiError::not_found("no model has been published yet"))?;
    let m = &p.model;
    let items = p
        .items
        .iter()
        .enumerate()
        .map(|(j, id)| ItemProfile {
            item: id.clone(),
            bias: m.item_bias.get(j).copied().unwrap_or(0.0),
            factors: if j < m.item_factors.nrows() {
                m.item_factors.row(j).to_vec()
            } else {
                Vec::new()
            },
            popularity: p.popularity[j],
        })
        .collect();
    Ok(HttpResponse::Ok().json(ItemProfiles {
        model_version: p.release_id,
        guarantee: p.guarantee.to_string(),
        global_mean: m.global_mean,
        rank: m.rank(),
        items,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UserProfile {
    pub user: String,
    pub model_version: i64,
    pub guarantee: String,
    pub bias: f64,
    pub factors: Vec<f64>,
}

/// Download one user's published DP profile.
#[utoipa::path(get, path = "/v1/models/current/users/{user}", tag = "models",
    params(("user" = String, Path)),
    responses((status = 200, body = UserProfile),
        (status = 404, description = "No profile for this user", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn user_profile(
    _auth: ReaderKey,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let user = path_id(&state, "user", &path)?;
    let p = state
        .registry
        .current()
        .ok_or_else(|| ApiError::not_found("no model has been published yet"))?;
    let u = p
        .user_index(user.as_str())
        .filter(|_| p.has_profile(user.as_str()))
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "user {:?} has no profile in release {}",
                user.as_str(),
                p.release_id
            ))
        })?;
    let m = &p.model;
    Ok(HttpResponse::Ok().json(UserProfile {
        user: user.into_string(),
        model_version: p.release_id,
        guarantee: p.guarantee.to_string(),
        bias: m.user_bias.get(u).copied().unwrap_or(0.0),
        factors: if u < m.user_factors.nrows() {
            m.user_factors.row(u).to_vec()
        } else {
            Vec::new()
        },
    }))
}
