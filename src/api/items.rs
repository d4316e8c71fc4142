//! The public item catalogue (DESIGN 6, issue 8 finding 1): registered by a writer or an
//! import, listed to any key. Ratings never create items, so neither this list nor any
//! item list of a release says which items were rated.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{AnyKey, WriterKey};
use super::domain::Id;
use super::{json_body, ApiError, AppState, Page};

/// Items to add to the catalogue.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"items": ["i1", "i2", "i42"]}))]
pub struct ItemBatch {
    /// Item ids (1..=`server.max_batch` per request; ids already registered are accepted
    /// again and left as they are).
    pub items: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RegisterResult {
    /// Ids in the request (duplicates counted once).
    pub accepted: usize,
    /// Of which newly registered.
    pub created: usize,
}

/// Validates a batch of item ids; the first bad one is reported as `items[k]`.
pub fn validate_items(state: &AppState, batch: ItemBatch) -> Result<Vec<String>, ApiError> {
    let s = &state.settings;
    if batch.items.is_empty() {
        return Err(ApiError::invalid("items", "the batch is empty"));
    }
    if batch.items.len() > s.server.max_batch {
        return Err(ApiError::too_large(format!(
            "{} items exceed the batch limit of {}",
            batch.items.len(),
            s.server.max_batch
        ))
        .with_field("items"));
    }
    batch
        .items
        .iter()
        .enumerate()
        .map(|(k, i)| {
            Id::parse(i, s.ratings.max_id_len)
                .map(Id::into_string)
                .map_err(|e| ApiError::invalid(format!("items[{k}]"), format!("item {e}")))
        })
        .collect()
}

/// Register items in the public catalogue (idempotent). Only registered items can be
/// rated; `dprec import` registers a MovieLens catalogue.
#[utoipa::path(post, path = "/v1/admin/items", tag = "items", operation_id = "register_items",
    request_body = ItemBatch,
    responses(
        (status = 200, description = "Items registered (or already registered)", body = RegisterResult),
        (status = 413, description = "Body or batch too large", body = super::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid item id (`field` is `items[k]`) or empty batch", body = super::Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = [])))]
pub async fn register(
    _auth: WriterKey,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let batch: ItemBatch = json_body(&req, payload, state.settings.server.max_body_bytes).await?;
    let items = validate_items(&state, batch)?;
    let created = state.store.register_items(&items).await.inspect_err(|_| {
        state.metrics.store_errors.inc();
    })?;
    let accepted = items
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    Ok(HttpResponse::Ok().json(RegisterResult { accepted, created }))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Catalogue {
    pub limit: i64,
    pub offset: i64,
    /// Items in the catalogue (public, like the ids).
    pub total: i64,
    /// Item ids in ascending order.
    pub items: Vec<String>,
}

/// The public item catalogue, paginated (ascending ids).
#[utoipa::path(get, path = "/v1/items", tag = "items", operation_id = "list_items", params(Page),
    responses((status = 200, body = Catalogue)), security(("api_key" = [])))]
pub async fn list(
    _auth: AnyKey,
    state: web::Data<AppState>,
    page: super::Query<Page>,
) -> Result<HttpResponse, ApiError> {
    let (limit, offset) = page.parse()?;
    let (items, total) = state.store.catalogue_page(limit, offset).await?;
    Ok(HttpResponse::Ok().json(Catalogue {
        limit,
        offset,
        total,
        items,
    }))
}
