//! Top-N recommendations and similar items, answered from the served model in memory.

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{AnyKey, UserKey};
use super::json_out::JsonOut;
use super::{path_id, ApiError, AppState};
use crate::serve::lists::{IndexedPage, ListPage};
use crate::train::Guarantee;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct RecommendQuery {
    /// Number of items (1..=1000, default 10).
    #[param(minimum = 1, maximum = 1000)]
    pub n: Option<i64>,
    /// Items to skip (0..=1000000000, default 0).
    #[param(minimum = 0, maximum = 1000000000)]
    pub offset: Option<i64>,
    /// Include items the user already rated (default false).
    pub include_rated: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ScoredItem {
    pub item: String,
    /// The served model's score: a factor model's `theta_u . v_j` + biases, a top-N
    /// model's ranking score (items beyond its DP candidates follow them in DP-count
    /// order, scored below the lowest candidate, so a list holds `n` items whenever the
    /// catalogue has them), a neighbourhood model's predicted rating (unclamped); the DP
    /// popularity count in fallback. For similar items: see `SimilarItems.items`.
    pub score: f64,
    /// Neighbourhood models only (`dpsgd-nbm`, `dpps-nbm`, `nbm`), on personal lists: the
    /// asking user's own rated items that contributed most to this item's score (at most
    /// 3, the largest |contribution| first; items with a zero term are left out). Built
    /// from the published DP weights and the user's own current ratings only. Absent for
    /// other models, in fallback and on similar items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanations: Option<Vec<Explanation>>,
}

/// One of the asking user's own rated items and its term in a recommended item's score.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"item": "i3", "rating": 5.0, "contribution": 0.41}))]
pub struct Explanation {
    /// An item the asking user rated.
    pub item: String,
    /// The user's current rating of it.
    pub rating: f64,
    /// Its term in the score, on the rating scale: `s_ij (r_uj - mu - b_j) /
    /// max(c_norm, sum_j |s_ij|)` (positive: it raised the score).
    pub contribution: f64,
}

fn scored(s: crate::serve::Scored) -> ScoredItem {
    ScoredItem {
        item: s.item,
        score: s.score,
        explanations: s.explanations.map(|e| {
            e.into_iter()
                .map(|x| Explanation {
                    item: x.item,
                    rating: x.rating,
                    contribution: x.contribution,
                })
                .collect()
        }),
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"user": "u1", "model_version": 3, "guarantee": "proven",
    "fallback": false, "source": "profile", "items": [{"item": "i7", "score": 4.2}]}))]
pub struct Recommendations {
    pub user: String,
    /// Release id of the model that answered.
    pub model_version: i64,
    /// `proven` (user-level and rating-level DP, the default), `rating-level` (proven for
    /// one rating only: the operator's opt-in, docs/privacy/guarantee.md), `local-dp` (a
    /// model trained on client-perturbed ratings only) or `non-private`.
    pub guarantee: Guarantee,
    /// True when the DP popularity answered (no published profile for the user).
    pub fallback: bool,
    /// What answered: `profile` (the published model and the user's own ratings),
    /// `labels` (the DP counts reweighted by the public catalogue labels of the user's
    /// own rated items, docs/privacy/labels.md) or `popularity` (the DP popularity, with
    /// `fallback` true).
    pub source: String,
    pub items: Vec<ScoredItem>,
}

/// The `n` query parameter: absent is 10; outside 1..=1000 is a 422 naming it.
fn parse_n(n: Option<i64>) -> Result<usize, ApiError> {
    let n = n.unwrap_or(10);
    if !(1..=1000).contains(&n) {
        return Err(ApiError::invalid(
            "n",
            format!("n must be in 1..=1000, got {n}"),
        ));
    }
    Ok(n as usize)
}

fn no_model() -> ApiError {
    ApiError::unavailable("no model has been published yet; ingest ratings and retrain")
}

/// The user's deleted flag and rated items, from memory when cached (see
/// [`crate::serve::facts`]).
pub(crate) async fn user_facts(
    state: &AppState,
    user: &str,
) -> Result<std::sync::Arc<crate::serve::facts::UserFacts>, ApiError> {
    if let Some(f) = state.user_facts.get(user) {
        return Ok(f);
    }
    let (deleted, ratings) = state.store.serving_facts(user).await?;
    let facts = std::sync::Arc::new(state.user_facts.facts(deleted, ratings));
    state.user_facts.insert(user, facts.clone());
    Ok(facts)
}

/// Top-N items for a user from the published DP model and the user's own ratings, with the
/// DP-popularity fallback; neighbourhood models explain each personal item.
#[utoipa::path(get, path = "/v1/users/{user}/recommendations", tag = "recommendations",
    params(("user" = String, Path), RecommendQuery),
    responses((status = 200, body = Recommendations),
        (status = 503, description = "No model published yet", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn recommendations(
    auth: UserKey,
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: super::Query<RecommendQuery>,
) -> Result<HttpResponse, ApiError> {
    let user: &str = &path;
    super::check_id(&state, "user", user)?;
    auth.for_user(user)?;
    let n = parse_n(q.n)?;
    let offset = super::parse_offset("offset", q.offset)? as usize;
    let model = state.registry.current().ok_or_else(no_model)?;
    let facts = user_facts(&state, user).await?;
    let include_rated = q.include_rated.unwrap_or(false);
    // Items registered after the release merge into label lists: a computed list then.
    let page = match state.registry.cold() {
        Some(cold) => ListPage::Scored(model.top_n_with_cold(
            Some(&cold),
            user,
            &facts,
            n,
            offset,
            include_rated,
        )),
        None => model.list_page(user, &facts, n, offset, include_rated),
    };
    let fallback = page.fallback();
    let items = match page {
        ListPage::Indexed(p) => PageItems::Indexed(&model.items, p),
        ListPage::Scored(top) => PageItems::Owned(top.items.into_iter().map(scored).collect()),
    };
    let source = if fallback {
        "popularity"
    } else {
        model.personal_source(&facts)
    };
    let answer = RecommendationsOut {
        user,
        model_version: model.release_id,
        guarantee: model.guarantee,
        fallback,
        source,
        items,
    };
    Ok(answer.write().ok())
}

/// [`Recommendations`] of one page, borrowing the served release's item ids.
struct RecommendationsOut<'a> {
    user: &'a str,
    model_version: i64,
    guarantee: Guarantee,
    fallback: bool,
    source: &'a str,
    items: PageItems<'a>,
}

/// A page's items: indices of the release (named from its ids) or [`ScoredItem`]s.
enum PageItems<'a> {
    Indexed(&'a [String], IndexedPage),
    Owned(Vec<ScoredItem>),
}

impl RecommendationsOut<'_> {
    /// The JSON of [`Recommendations`], field by field in its order.
    fn write(&self) -> JsonOut {
        let mut o = JsonOut::user_answer(self.user, self.model_version, &self.guarantee);
        o.raw(if self.fallback {
            ",\"fallback\":true"
        } else {
            ",\"fallback\":false"
        })
        .raw(",\"source\":")
        .str(self.source)
        .raw(",\"items\":");
        match &self.items {
            PageItems::Indexed(ids, page) => {
                o.raw("[");
                for (k, &(score, j)) in page.items.iter().enumerate() {
                    o.raw(if k == 0 { "{\"item\":" } else { ",{\"item\":" })
                        .str(&ids[j as usize])
                        .raw(",\"score\":")
                        .value(&score)
                        .raw("}");
                }
                o.raw("]");
            }
            PageItems::Owned(items) => {
                o.value(items);
            }
        }
        o.raw("}");
        o
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct SimilarQuery {
    /// Number of items (1..=1000, default 10).
    #[param(minimum = 1, maximum = 1000)]
    pub n: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"item": "i7", "model_version": 3, "guarantee": "proven",
    "fallback": false, "source": "profiles", "items": [{"item": "i9", "score": 0.93}]}))]
pub struct SimilarItems {
    pub item: String,
    pub model_version: i64,
    /// The served release's guarantee (see [`Recommendations::guarantee`]).
    pub guarantee: Guarantee,
    /// True when the DP popularity answered: the served model has no DP profile for this
    /// catalogue item (not among a top-N model's DP candidates, a zero row, a model without
    /// item factors, or registered after the release without labels a served label model
    /// knows). Never depends on whether anyone rated the item.
    pub fallback: bool,
    /// `weights` (a neighbourhood model's DP item-item weights), `gram` (a top-N model's
    /// candidates: cosine of the rows of the release's DP Gram over its candidates, at
    /// most 50 items), `profiles` (cosine of the DP item profiles), `labels` (an item
    /// registered after the release: the release's items by the cosine of their public
    /// label sets) or `popularity` (fallback; scores are DP counts).
    pub source: String,
    /// Best first. With `weights` the score is the published DP weight `s_ij` (how
    /// strongly a rating of the listed item moves the prediction of this item; anchor
    /// items only, may be negative); with `gram` and `profiles` the cosine similarity; with
    /// `popularity` the DP popularity count.
    pub items: Vec<ScoredItem>,
}

/// Items similar to a catalogue item: by a neighbourhood model's DP item-item weights
/// when one is served, by cosine of the rows of a top-N model's DP Gram for its
/// candidates, else by cosine similarity of the published DP item profiles; for an item
/// registered after the release, the release's items sharing its public labels when a
/// label model is served; else (no DP profile for the item) by DP popularity. 404 only for items outside the public
/// catalogue, so the answer is no oracle of which items were rated.
#[utoipa::path(get, path = "/v1/items/{item}/similar", tag = "recommendations", operation_id = "similar_items",
    params(("item" = String, Path), SimilarQuery),
    responses((status = 200, body = SimilarItems),
        (status = 404, description = "Item not in the catalogue", body = super::Problem, content_type = "application/problem+json"),
        (status = 503, description = "No model published yet", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn similar(
    _auth: AnyKey,
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: super::Query<SimilarQuery>,
) -> Result<HttpResponse, ApiError> {
    let item = path_id(&state, "item", &path)?;
    let n = parse_n(q.n)?;
    let model = state.registry.current().ok_or_else(no_model)?;
    // Items of the release are catalogue items (items are never removed); any other id
    // is looked up in the catalogue.
    if model.item_index(item.as_str()).is_none() && !state.store.in_catalogue(item.as_str()).await?
    {
        return Err(ApiError::not_found(format!(
            "item {:?} is not in the catalogue",
            item.as_str()
        )));
    }
    let cold = state.registry.cold();
    let s = cold
        .and_then(|c| model.similar_to_cold(&c, item.as_str(), n))
        .unwrap_or_else(|| model.similar(item.as_str(), n));
    let fallback = s.source == crate::serve::SimilarSource::Popularity;
    Ok(HttpResponse::Ok().json(SimilarItems {
        item: item.into_string(),
        model_version: model.release_id,
        guarantee: model.guarantee,
        fallback,
        source: s.source.name().into(),
        items: s.items.into_iter().map(scored).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The written answer is [`Recommendations`] as serde writes it, byte for byte:
    /// ids to escape, scores of every kind (non-finite ones are `null`), both kinds of
    /// page.
    #[test]
    fn written_answer_is_the_documented_one() {
        let ids: Vec<String> = ["a", "b\"q", "c\u{1}", "é"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.1 + 0.2, -1e-300, 4.0, f64::NAN, f64::INFINITY, 1e21, -0.0];
        for (k, fallback) in [(0, false), (1, true), (7, false)] {
            let page = IndexedPage {
                items: (0..k)
                    .map(|x| (scores[x % scores.len()], (x % ids.len()) as u32))
                    .collect(),
                fallback,
            };
            let named = || -> Vec<ScoredItem> {
                page.items
                    .iter()
                    .map(|&(score, j)| ScoredItem {
                        item: ids[j as usize].clone(),
                        score,
                        explanations: None,
                    })
                    .collect()
            };
            let want = |items| Recommendations {
                user: "u\"\u{e9}".into(),
                model_version: 7,
                guarantee: Guarantee::Proven,
                fallback,
                source: "profile".into(),
                items,
            };
            let got = |items| RecommendationsOut {
                user: "u\"\u{e9}",
                model_version: 7,
                guarantee: Guarantee::Proven,
                fallback,
                source: "profile",
                items,
            };
            let want = serde_json::to_string(&want(named())).unwrap();
            let indexed = got(PageItems::Indexed(&ids, page.clone())).write();
            assert_eq!(String::from_utf8(indexed.into_bytes()).unwrap(), want);
            let owned = got(PageItems::Owned(named())).write();
            assert_eq!(String::from_utf8(owned.into_bytes()).unwrap(), want);
        }
    }
}
