//! Releases and downloads of the published DP profiles.
//!
//! Scopes (DESIGN 6): the release list, the current release, the item profiles and
//! similar items are the published DP model (any key, `public` included); a user's
//! profile is that user's (its user token, or a service reader). No answer here carries
//! an exact count of the data (issue 8 finding 1): the stored `n_ratings`, `n_users` and
//! `n_items` of a release stay in the store, and [`public_mechanisms`] drops count
//! fields from the mechanism records.

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{AnyKey, Grant, UserKey};
use super::{path_id, ApiError, AppState, Page};
use crate::config::Role;
use crate::store::ReleaseRow;
use crate::train::Guarantee;
use dprec_dp::charges::{Neighbour, PrivacyUnit};

/// Keys of a mechanism's parameters that would count the data (exact counts are private
/// under add/remove). Dropped, at any depth, from every mechanism record the API returns.
pub const DATA_COUNT_KEYS: &[&str] = &[
    "offered",
    "sampled",
    "n_ratings",
    "n_users",
    "n_items",
    "ratings_exhausted",
    // A float-noised statistic that only steers the release (dp-topn's adaptive split):
    // published directly it would leak through its floating-point representation.
    "noisy_trace",
    "users_excluded",
];

/// Parameters as the API shows them: without data counts ([`DATA_COUNT_KEYS`]).
pub fn public_params(mut v: serde_json::Value) -> serde_json::Value {
    strip_counts(&mut v);
    v
}

fn strip_counts(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|k, _| !DATA_COUNT_KEYS.contains(&k.as_str()));
            m.values_mut().for_each(strip_counts);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_counts),
        _ => {}
    }
}

/// One mechanism a release ran: public parameters, the unit it protects and the
/// neighbour relation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct MechanismView {
    pub name: String,
    /// Parameters (configuration, plan, noise scales), without data counts.
    #[schema(value_type = Object)]
    pub params: serde_json::Value,
    #[serde(default)]
    pub unit: PrivacyUnit,
    #[serde(default)]
    pub neighbour: Neighbour,
}

/// The stored mechanism records as the API shows them: typed, without data counts.
pub fn public_mechanisms(stored: &serde_json::Value) -> Result<Vec<MechanismView>, ApiError> {
    let mut v: Vec<MechanismView> = serde_json::from_value(stored.clone())
        .map_err(|e| ApiError::internal(format!("stored mechanism records: {e}")))?;
    for m in &mut v {
        strip_counts(&mut m.params);
    }
    Ok(v)
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Release {
    pub id: i64,
    pub trainer: String,
    #[schema(value_type = Object)]
    pub params: serde_json::Value,
    pub guarantee: Guarantee,
    /// Mechanisms with parameters, unit and neighbour relation (one object each).
    pub mechanisms: Vec<MechanismView>,
    pub popularity_eps: f64,
    /// The job that published the release: for a reader, writer or admin key only (null
    /// for a public key or a user token: job ids count skipped and failed jobs too).
    pub job_id: Option<i64>,
    /// When the release's job started (ms since the epoch): a time that does not depend
    /// on the data.
    pub created_at: i64,
}

impl Release {
    /// The release as `grant` may see it: without its job id below reader.
    fn seen_by(mut self, grant: &Grant) -> Self {
        if grant.role < Role::Reader {
            self.job_id = None;
        }
        self
    }
}

impl TryFrom<ReleaseRow> for Release {
    type Error = ApiError;

    fn try_from(r: ReleaseRow) -> Result<Self, ApiError> {
        let mut params = r.params;
        strip_counts(&mut params);
        Ok(Self {
            id: r.id,
            trainer: r.trainer,
            params,
            guarantee: r.guarantee,
            mechanisms: public_mechanisms(&r.mechanisms)?,
            popularity_eps: r.popularity_eps,
            job_id: r.job_id,
            created_at: r.created_at,
        })
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReleaseList {
    pub limit: i64,
    pub offset: i64,
    pub releases: Vec<Release>,
}

/// All releases, newest first.
#[utoipa::path(get, path = "/v1/models", tag = "models", operation_id = "list_models", params(Page),
    responses((status = 200, body = ReleaseList)), security(("api_key" = [])))]
pub async fn list(
    auth: AnyKey,
    state: web::Data<AppState>,
    page: super::Query<Page>,
) -> Result<HttpResponse, ApiError> {
    let (limit, offset) = page.parse()?;
    let releases = state.store.releases(limit, offset).await?;
    Ok(HttpResponse::Ok().json(ReleaseList {
        limit,
        offset,
        releases: releases
            .into_iter()
            .map(|r| Release::try_from(r).map(|r| r.seen_by(&auth.0)))
            .collect::<Result<_, _>>()?,
    }))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CurrentModel {
    pub release: Release,
    /// Seconds since the served release was published.
    pub age_seconds: f64,
}

/// The served release.
#[utoipa::path(get, path = "/v1/models/current", tag = "models", operation_id = "current_model",
    responses((status = 200, body = CurrentModel),
        (status = 404, description = "Nothing published yet", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn current(auth: AnyKey, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
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
        release: Release::try_from(r)?.seen_by(&auth.0),
    }))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ItemProfile {
    pub item: String,
    pub bias: f64,
    pub factors: Vec<f64>,
    /// DP popularity count.
    pub popularity: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ItemProfiles {
    pub model_version: i64,
    pub guarantee: Guarantee,
    pub global_mean: f64,
    pub rank: usize,
    pub items: Vec<ItemProfile>,
}

/// Download the published DP item profiles (and DP popularity).
#[utoipa::path(get, path = "/v1/models/current/items", tag = "models",
    responses((status = 200, body = ItemProfiles)), security(("api_key" = [])))]
pub async fn item_profiles(
    _auth: AnyKey,
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
        guarantee: p.guarantee,
        global_mean: m.global_mean,
        rank: m.rank(),
        items,
    }))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UserProfile {
    pub user: String,
    pub model_version: i64,
    pub guarantee: Guarantee,
    pub bias: f64,
    pub factors: Vec<f64>,
    /// `release`: the profile published with the release; `own-ratings`: solved now from
    /// the release's DP item side and the user's own current ratings (a joint-DP rating
    /// predictor: never stored or released, readable by the user's own key).
    pub source: String,
}

/// Download one user's DP profile: the published one, or, for a joint-DP rating
/// predictor, the one solved from the published item side and the user's own current
/// ratings (computed, not stored). A deleted user has none (404), from the moment of
/// deletion.
#[utoipa::path(get, path = "/v1/models/current/users/{user}", tag = "models",
    params(("user" = String, Path)),
    responses((status = 200, body = UserProfile),
        (status = 404, description = "No profile for this user (none published, or the user is deleted)", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn user_profile(
    auth: UserKey,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let user = path_id(&state, "user", &path)?;
    auth.for_user(user.as_str())?;
    let p = state
        .registry
        .current()
        .ok_or_else(|| ApiError::not_found("no model has been published yet"))?;
    let none = || {
        ApiError::not_found(format!(
            "user {:?} has no profile in release {}",
            user.as_str(),
            p.release_id
        ))
    };
    // The served release predates a deletion: the deleted user's profile is gone at once.
    let deleted = state
        .store
        .user(user.as_str())
        .await?
        .is_some_and(|u| u.deleted);
    if deleted {
        return Err(none());
    }
    let facts = super::recommend::user_facts(&state, user.as_str()).await?;
    if let Some(solved) = p.solved_profile(&facts) {
        return Ok(HttpResponse::Ok().json(UserProfile {
            user: user.as_str().to_owned(),
            model_version: p.release_id,
            guarantee: p.guarantee,
            bias: solved.bias,
            factors: solved.factors.clone(),
            source: "own-ratings".into(),
        }));
    }
    let u = p
        .user_index(user.as_str())
        .filter(|_| p.has_profile(user.as_str()))
        .ok_or_else(none)?;
    let m = &p.model;
    Ok(HttpResponse::Ok().json(UserProfile {
        user: user.into_string(),
        model_version: p.release_id,
        guarantee: p.guarantee,
        bias: m.user_bias.get(u).copied().unwrap_or(0.0),
        factors: if u < m.user_factors.nrows() {
            m.user_factors.row(u).to_vec()
        } else {
            Vec::new()
        },
        source: "release".into(),
    }))
}
