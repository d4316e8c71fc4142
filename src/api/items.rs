//! The public item catalogue (DESIGN 6, issue 8 finding 1): registered by a writer or an
//! import, listed to any key. Ratings never create items, so neither this list nor any
//! item list of a release says which items were rated. An item may carry public
//! information (a title, labels): public like its id, it costs no privacy budget to read
//! or use, and must never hold anything derived from users' ratings.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{AnyKey, WriterKey};
use super::domain::Id;
use super::{json_body, ApiError, AppState, Page};
use crate::model::catalogue::ItemInfo;
use crate::store::Registered;

/// Items to add to the catalogue, each an id or an id with its public information.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"items": ["i1", "i2", {"id": "1", "title": "Toy Story (1995)", "labels": ["Animation", "Comedy"]}]}))]
pub struct ItemBatch {
    /// 1..=`server.max_batch` entries. A plain id registers the item and leaves a
    /// registered one as it is (its title and labels too); an object states the item's
    /// public information in full (an omitted title or labels clears it).
    pub items: Vec<ItemEntry>,
}

/// One entry of a batch: an item id, or an item with its public information.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ItemEntry {
    Id(String),
    Info(ItemInput),
}

/// An item with its public information: anyone with a key reads it (`GET /v1/items`),
/// it costs no privacy budget, and it must not contain anything derived from users'
/// ratings.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemInput {
    /// The item id.
    pub id: String,
    /// Display title, 1..=`ratings.max_title_chars` (200) characters, no control
    /// characters or surrounding whitespace; MovieLens style `"Toy Story (1995)"` gives
    /// the year.
    #[serde(default)]
    pub title: Option<String>,
    /// Public categorical attributes such as genres, a decade or a brand: at most
    /// `ratings.max_labels` (32), each 1..=`ratings.max_label_chars` (64) characters, no
    /// control characters or surrounding whitespace, no repeats.
    #[serde(default)]
    pub labels: Vec<String>,
}

impl<'de> Deserialize<'de> for ItemEntry {
    /// A string or an object; an object's fields are read (and their errors named, e.g.
    /// `items[2].labels`) as [`ItemInput`]'s.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = ItemEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an item id (a string) or an object {\"id\", \"title\", \"labels\"}")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ItemEntry, E> {
                Ok(ItemEntry::Id(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<ItemEntry, A::Error> {
                let de = serde::de::value::MapAccessDeserializer::new(map);
                ItemInput::deserialize(de).map(ItemEntry::Info)
            }
        }
        d.deserialize_any(Entry)
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RegisterResult {
    /// Ids in the request (duplicates counted once).
    pub accepted: usize,
    /// Of which newly registered.
    pub created: usize,
    /// Of which already registered and given a different title or labels.
    pub updated: usize,
}

/// A validated batch: the plain ids, and the items stated with their information.
#[derive(Debug, Default)]
pub struct ValidBatch {
    pub ids: Vec<String>,
    pub infos: Vec<ItemInfo>,
}

impl ValidBatch {
    /// Distinct ids of the batch.
    pub fn accepted(&self) -> usize {
        let ids = self.ids.iter().chain(self.infos.iter().map(|i| &i.id));
        ids.collect::<std::collections::BTreeSet<_>>().len()
    }
}

/// Validates a batch; the first bad entry is reported by its field (`items[k]`,
/// `items[k].id`, `items[k].title`, `items[k].labels`, `items[k].labels[j]`).
pub fn validate_items(state: &AppState, batch: ItemBatch) -> Result<ValidBatch, ApiError> {
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
    let mut out = ValidBatch::default();
    let id = |raw: &str, field: String| {
        Id::parse(raw, s.ratings.max_id_len)
            .map(Id::into_string)
            .map_err(|e| ApiError::invalid(field, format!("item {e}")))
    };
    for (k, entry) in batch.items.into_iter().enumerate() {
        match entry {
            ItemEntry::Id(raw) => out.ids.push(id(&raw, format!("items[{k}]"))?),
            ItemEntry::Info(input) => out.infos.push(ItemInfo {
                id: id(&input.id, format!("items[{k}].id"))?,
                title: match input.title {
                    Some(t) => Some(valid_text(t, "title", s.ratings.max_title_chars, || {
                        format!("items[{k}].title")
                    })?),
                    None => None,
                },
                labels: valid_labels(input.labels, &s.ratings, k)?,
            }),
        }
    }
    Ok(out)
}

/// An item's labels: at most `max_labels`, each a valid text, no repeats.
fn valid_labels(
    labels: Vec<String>,
    limits: &crate::config::RatingSettings,
    k: usize,
) -> Result<Vec<String>, ApiError> {
    if labels.len() > limits.max_labels {
        return Err(ApiError::invalid(
            format!("items[{k}].labels"),
            format!(
                "an item has at most {} labels, got {}",
                limits.max_labels,
                labels.len()
            ),
        ));
    }
    let mut out: Vec<String> = Vec::with_capacity(labels.len());
    for (j, l) in labels.into_iter().enumerate() {
        let field = || format!("items[{k}].labels[{j}]");
        let l = valid_text(l, "label", limits.max_label_chars, field)?;
        if out.contains(&l) {
            return Err(ApiError::invalid(
                field(),
                format!("label {l:?} is repeated"),
            ));
        }
        out.push(l);
    }
    Ok(out)
}

/// A title or label: 1..=`max` characters, no control characters, no surrounding
/// whitespace.
fn valid_text(
    text: String,
    what: &str,
    max: usize,
    field: impl Fn() -> String,
) -> Result<String, ApiError> {
    let chars = text.chars().count();
    let problem = if chars == 0 {
        Some(format!("{what} must not be empty (omit it instead)"))
    } else if chars > max {
        Some(format!(
            "{what} must be at most {max} characters, got {chars}"
        ))
    } else if text.chars().any(char::is_control) {
        Some(format!("{what} must not contain control characters"))
    } else if text.trim() != text {
        Some(format!("{what} must not start or end with whitespace"))
    } else {
        None
    };
    match problem {
        Some(p) => Err(ApiError::invalid(field(), p)),
        None => Ok(text),
    }
}

/// Register items in the public catalogue, with their public information (a title,
/// labels) when given. Only registered items can be rated; `dprec import` registers a
/// MovieLens catalogue with titles and genres. Catalogue data (ids, titles, labels) is
/// public: anyone with a key reads it, it costs no privacy budget, and it must not
/// contain anything derived from users' ratings.
#[utoipa::path(post, path = "/v1/admin/items", tag = "items", operation_id = "register_items",
    request_body = ItemBatch,
    responses(
        (status = 200, description = "Items registered (or already registered); those given with information have it replaced", body = RegisterResult),
        (status = 413, description = "Body or batch too large", body = super::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid entry (`field` names it: `items[k]`, `items[k].id`, `items[k].title`, `items[k].labels`, `items[k].labels[j]`) or empty batch", body = super::Problem, content_type = "application/problem+json"),
    ),
    security(("api_key" = [])))]
pub async fn register(
    _auth: WriterKey,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let batch: ItemBatch = json_body(&req, payload, state.settings.server.max_body_bytes).await?;
    let batch = validate_items(&state, batch)?;
    let Registered { created, updated } = state
        .store
        .register_item_info(&batch.ids, &batch.infos)
        .await
        .inspect_err(|_| {
            state.metrics.store_errors.inc();
        })?;
    if created + updated > 0 {
        // New or relabelled items rank in label lists at once (`serve::cold`).
        crate::release::cold_items::refresh_or_warn(&state.store, &state.registry).await;
    }
    Ok(HttpResponse::Ok().json(RegisterResult {
        accepted: batch.accepted(),
        created,
        updated,
    }))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Catalogue {
    pub limit: i64,
    pub offset: i64,
    /// Items in the catalogue (public, like the ids).
    pub total: i64,
    /// Item ids in ascending order.
    pub items: Vec<String>,
    /// The same items with their public information, in the same order.
    pub details: Vec<ItemDetails>,
}

/// An item's public information.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ItemDetails {
    pub id: String,
    /// Absent when the item has no title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Empty when the item has none.
    pub labels: Vec<String>,
}

impl From<ItemInfo> for ItemDetails {
    fn from(i: ItemInfo) -> Self {
        Self {
            id: i.id,
            title: i.title,
            labels: i.labels,
        }
    }
}

/// The public item catalogue, paginated (ascending ids), with each item's public
/// information. Catalogue data is public: reading it costs no privacy budget, and it says
/// nothing about who rated what.
#[utoipa::path(get, path = "/v1/items", tag = "items", operation_id = "list_items", params(Page),
    responses((status = 200, body = Catalogue)), security(("api_key" = [])))]
pub async fn list(
    _auth: AnyKey,
    state: web::Data<AppState>,
    page: super::Query<Page>,
) -> Result<HttpResponse, ApiError> {
    let (limit, offset) = page.parse()?;
    let (infos, total) = state.store.catalogue_page(limit, offset).await?;
    Ok(HttpResponse::Ok().json(Catalogue {
        limit,
        offset,
        total,
        items: infos.iter().map(|i| i.id.clone()).collect(),
        details: infos.into_iter().map(ItemDetails::from).collect(),
    }))
}
