//! Predicted ratings for a user and given items, answered from the served model in
//! memory and the user's own current ratings (joint DP).

use actix_web::{http::StatusCode, web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::UserKey;
use super::json_out::JsonOut;
use super::recommend::user_facts;
use super::{check_id, ApiError, AppState};
use crate::train::Guarantee;

/// At most this many items per request.
pub const MAX_ITEMS: usize = 1000;

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct PredictQuery {
    /// Comma-separated item ids (1..=1000), e.g. `i1,i7`.
    pub items: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PredictedRating {
    pub item: String,
    /// The predicted rating on the service's rating scale; `null` when the served model
    /// has no prediction for this catalogue item (registered after the release, for a
    /// model without a user-side solve).
    pub rating: Option<f64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"user": "u1", "model_version": 3, "guarantee": "proven",
    "predictions": [{"item": "i7", "rating": 4.1}]}))]
pub struct Predictions {
    pub user: String,
    /// Release id of the model that answered.
    pub model_version: i64,
    pub guarantee: Guarantee,
    /// In the order asked.
    pub predictions: Vec<PredictedRating>,
}

/// Predicted ratings of the given items for a user. A joint-DP rating predictor
/// (`dp-alt`) solves the user's bias and factors from the published DP item side and the
/// user's own current ratings (cached until they change; never stored, charges nothing);
/// a factor model uses the user's published profile. 409 when the served model ranks
/// items without predicting ratings; 404 for items outside the public catalogue.
#[utoipa::path(get, path = "/v1/users/{user}/predictions", tag = "recommendations",
    params(("user" = String, Path), PredictQuery),
    responses((status = 200, body = Predictions),
        (status = 404, description = "An item is not in the catalogue", body = super::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The served model does not predict ratings", body = super::Problem, content_type = "application/problem+json"),
        (status = 503, description = "No model published yet", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn predictions(
    auth: UserKey,
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: super::Query<PredictQuery>,
) -> Result<HttpResponse, ApiError> {
    let user: &str = &path;
    super::check_id(&state, "user", user)?;
    auth.for_user(user)?;
    let ids: Vec<&str> = q.items.split(',').map(str::trim).collect();
    if ids.is_empty() || ids.len() > MAX_ITEMS || ids.iter().any(|i| i.is_empty()) {
        return Err(ApiError::invalid(
            "items",
            format!("items must list 1..={MAX_ITEMS} non-empty ids, comma-separated"),
        ));
    }
    for i in &ids {
        check_id(&state, "items", i)?;
    }
    let model = state.registry.current().ok_or_else(|| {
        ApiError::unavailable("no model has been published yet; ingest ratings and retrain")
    })?;
    if !model.predicts_ratings() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "the served model ({}) ranks items and does not predict ratings",
                model.trainer
            ),
        ));
    }
    let mut index = Vec::with_capacity(ids.len());
    for i in &ids {
        let j = model.item_index(i);
        if j.is_none() && !state.store.in_catalogue(i).await? {
            return Err(ApiError::not_found(format!(
                "item {i:?} is not in the catalogue"
            )));
        }
        index.push(j);
    }
    let facts = user_facts(&state, user).await?;
    let ratings = model.predict_items(user, &facts, &index);
    let answer = PredictionsOut {
        user,
        model_version: model.release_id,
        guarantee: model.guarantee,
        items: &ids,
        ratings: &ratings,
    };
    Ok(answer.write().ok())
}

/// [`Predictions`], borrowing the ids asked for.
struct PredictionsOut<'a> {
    user: &'a str,
    model_version: i64,
    guarantee: Guarantee,
    /// The items asked for and their predictions, in that order.
    items: &'a [&'a str],
    ratings: &'a [Option<f64>],
}

impl PredictionsOut<'_> {
    /// The JSON of [`Predictions`], field by field in its order.
    fn write(&self) -> JsonOut {
        let mut o = JsonOut::user_answer(self.user, self.model_version, &self.guarantee);
        o.raw(",\"predictions\":[");
        for (k, (item, rating)) in self.items.iter().zip(self.ratings).enumerate() {
            o.raw(if k == 0 { "{\"item\":" } else { ",{\"item\":" })
                .str(item)
                .raw(",\"rating\":")
                .value(rating)
                .raw("}");
        }
        o.raw("]}");
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The written answer is [`Predictions`] as serde writes it, byte for byte.
    #[test]
    fn written_answer_is_the_documented_one() {
        let ids = ["i1", "x\"y", "\u{1f}", "é"];
        let ratings = [Some(3.25), None, Some(f64::NAN), Some(1.0 / 3.0)];
        for k in 0..=ids.len() {
            let want = Predictions {
                user: "u1".into(),
                model_version: 3,
                guarantee: Guarantee::Proven,
                predictions: ids[..k]
                    .iter()
                    .zip(ratings)
                    .map(|(i, rating)| PredictedRating {
                        item: i.to_string(),
                        rating,
                    })
                    .collect(),
            };
            let got = PredictionsOut {
                user: "u1",
                model_version: 3,
                guarantee: Guarantee::Proven,
                items: &ids[..k],
                ratings: &ratings[..k],
            };
            assert_eq!(
                String::from_utf8(got.write().into_bytes()).unwrap(),
                serde_json::to_string(&want).unwrap()
            );
        }
    }
}
