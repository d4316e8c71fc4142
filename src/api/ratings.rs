//! Batch rating ingestion and rating deletion.

use std::collections::HashSet;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::WriterKey;
use super::domain::{Epsilon, Id, RatingValue};
use super::{json_body, path_id, ApiError, AppState};
use crate::ldp::LdpClaim;
use crate::store::{Defaults, NewRating, StoreError};

/// One rating as sent by a client: either a raw rating (optionally with its lifetime
/// budget `eps`) or a rating perturbed on the client under local DP (with `ldp`, see
/// `dprec::ldp` and docs/privacy/blp-ldp.md).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"user": "u1", "item": "i42", "rating": 4.0, "eps": 0.5}))]
pub struct RatingIn {
    pub user: String,
    /// A registered item (`POST /v1/admin/items`, `dprec import`): a rating never
    /// creates an item, one outside the catalogue is refused (422 `ratings[k].item`).
    pub item: String,
    /// On the configured scale (default 1..5 in steps of 0.5). With `ldp`: the perturbed
    /// value, any real number in `[ldp.lower, ldp.upper]`.
    pub rating: f64,
    /// Lifetime privacy budget eps_ij of this rating; default: the user's default, else
    /// the service default. Ignored on a re-rating (the budget slot is kept). Must be
    /// absent with `ldp` (the local eps is `ldp.eps`).
    pub eps: Option<f64>,
    /// The local mechanism the client ran on `rating` (bounded Laplace). The service
    /// checks the claim against its scale, stores the rating as LDP and charges `ldp.eps`
    /// once, now, to the rating and to the user's ledger; releases never charge it again.
    #[schema(nullable = false)]
    pub ldp: Option<LdpClaim>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RatingBatch {
    pub ratings: Vec<RatingIn>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct IngestResult {
    /// Ratings stored (new and re-rated).
    pub accepted: usize,
    /// Of which new (user, item) pairs.
    pub created: usize,
}

/// Validates a whole batch; the first bad field is reported with its index.
pub fn validate_batch(state: &AppState, batch: RatingBatch) -> Result<Vec<NewRating>, ApiError> {
    let s = &state.settings;
    if batch.ratings.is_empty() {
        return Err(ApiError::invalid("ratings", "the batch is empty"));
    }
    if batch.ratings.len() > s.server.max_batch {
        return Err(ApiError::too_large(format!(
            "{} ratings exceed the batch limit of {}",
            batch.ratings.len(),
            s.server.max_batch
        ))
        .with_field("ratings"));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(batch.ratings.len());
    for (k, r) in batch.ratings.into_iter().enumerate() {
        let f = |name: &str| format!("ratings[{k}].{name}");
        let user = Id::parse(&r.user, s.ratings.max_id_len)
            .map_err(|e| ApiError::invalid(f("user"), format!("user {e}")))?;
        let item = Id::parse(&r.item, s.ratings.max_id_len)
            .map_err(|e| ApiError::invalid(f("item"), format!("item {e}")))?;
        let (value, eps) = match &r.ldp {
            None => {
                let value = RatingValue::parse(r.rating, state.scale)
                    .map_err(|e| ApiError::invalid(f("rating"), e))?
                    .get();
                let eps = r
                    .eps
                    .map(|e| Epsilon::parse(e, s.budget.max_rating_eps))
                    .transpose()
                    .map_err(|e| ApiError::invalid(f("eps"), e))?
                    .map(Epsilon::get);
                (value, eps)
            }
            Some(claim) => {
                if r.eps.is_some() {
                    return Err(ApiError::invalid(
                        f("eps"),
                        "an LDP rating carries its local eps in ldp.eps; eps must be absent",
                    ));
                }
                claim
                    .validate(r.rating, state.scale, s.budget.max_rating_eps)
                    .map_err(|e| ApiError::invalid(f(e.field), e.message))?;
                (r.rating, Some(claim.eps))
            }
        };
        if !seen.insert((user.clone(), item.clone())) {
            return Err(ApiError::invalid(
                format!("ratings[{k}]"),
                "duplicate (user, item) pair in the batch",
            ));
        }
        out.push(NewRating {
            user: user.into_string(),
            item: item.into_string(),
            value,
            eps,
            ldp: r.ldp,
        });
    }
    Ok(out)
}

/// Ingest a batch of ratings (all or nothing).
#[utoipa::path(post, path = "/v1/ratings", tag = "ratings",
    request_body = RatingBatch,
    responses(
        (status = 200, description = "Batch stored", body = IngestResult),
        (status = 400, description = "Malformed JSON", body = super::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No or unknown API key", body = super::Problem, content_type = "application/problem+json"),
        (status = 403, description = "Role too low (writer needed)", body = super::Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body or batch too large", body = super::Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not application/json", body = super::Problem, content_type = "application/problem+json"),
        (status = 409, description = "Conflict with stored state (LDP over a raw rating, re-rating an LDP pair, user budget cannot take a local eps, or would leave too little for the charge of a release in progress: retry after it is published); nothing stored", body = super::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field (path with index), or an item outside the catalogue (`ratings[k].item`; register it with POST /v1/admin/items)", body = super::Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = [])))]
pub async fn ingest(
    _auth: WriterKey,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let batch: RatingBatch = json_body(&req, payload, state.settings.server.max_body_bytes).await?;
    let ratings = validate_batch(&state, batch)?;
    let b = &state.settings.budget;
    let defaults = Defaults {
        rating_eps: b.default_rating_eps,
        user_eps: b.default_user_eps,
        user_delta: b.default_user_delta,
    };
    // On the write lane (crate::lanes): the transaction's awaits do not queue behind
    // the reads on this worker.
    let store = state.store.clone();
    let (ratings, stored) = state
        .write_lane
        .run(async move {
            let stored = store.upsert_ratings(&ratings, defaults).await;
            (ratings, stored)
        })
        .await
        .map_err(|e| ApiError::unavailable(e.to_string()))?;
    let created = match stored {
        Ok(n) => n,
        Err(StoreError::NotInCatalogue(item)) => return Err(not_in_catalogue(&ratings, &item)),
        Err(e) => {
            state.metrics.store_errors.inc();
            return Err(e.into());
        }
    };
    state.user_facts.apply_ratings(
        ratings
            .iter()
            .map(|r| (r.user.as_str(), r.item.as_str(), r.value)),
    );
    state.metrics.ratings_ingested.inc_by(ratings.len() as u64);
    Ok(HttpResponse::Ok().json(IngestResult {
        accepted: ratings.len(),
        created,
    }))
}

/// 422 for the first rating of the batch whose item is not registered.
fn not_in_catalogue(ratings: &[NewRating], item: &str) -> ApiError {
    let k = ratings.iter().position(|r| r.item == item).unwrap_or(0);
    ApiError::invalid(
        format!("ratings[{k}].item"),
        format!(
            "item {item:?} is not in the catalogue; register it first with POST \
             /v1/admin/items {{\"items\": [{item:?}]}} (writer key) or `dprec import`"
        ),
    )
}

/// Delete one rating: its value leaves future training; its budget slot and ledger
/// history stay.
#[utoipa::path(delete, path = "/v1/users/{user}/ratings/{item}", tag = "ratings",
    params(("user" = String, Path), ("item" = String, Path)),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such rating", body = super::Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = [])))]
pub async fn delete_rating(
    _auth: WriterKey,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (user, item) = path.into_inner();
    let user = path_id(&state, "user", &user)?;
    let item = path_id(&state, "item", &item)?;
    let deleted = state
        .store
        .delete_rating(user.as_str(), item.as_str())
        .await?;
    state.user_facts.invalidate([user.as_str()]);
    if deleted {
        Ok(HttpResponse::NoContent().finish())
    } else {
        Err(ApiError::not_found(format!(
            "user {:?} has no rating of item {:?}",
            user.as_str(),
            item.as_str()
        )))
    }
}
