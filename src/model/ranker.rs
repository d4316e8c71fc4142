//! Ranking interface shared by every model that serves top-N lists.
//!
//! Under joint DP (DESIGN 6) a user's list may depend on the published DP model and on
//! that user's OWN current ratings, nothing else. A [`Ranker`] makes that explicit: it is
//! given the user's own ratings at query time (eval and service alike), so a model whose
//! scores are `x_u B` (item-item, projection) and a factor model with a stored user row
//! rank through the same call.

use crate::model::profile::UserProfile;
use crate::model::FactorModel;

/// Scores items for one user from a published model and the user's own ratings.
pub trait Ranker: Send + Sync + std::fmt::Debug {
    /// Number of item indices the model scores (`0..n_items`).
    fn n_items(&self) -> usize;

    /// Writes a ranking score for every item index into `out` (`out.len() == n_items()`).
    /// `user` is the user's dense index in the training data when the model has a row
    /// for it; `own` is the user's own ratings as `(item index, value)`. Higher is better;
    /// scores need not be on the rating scale.
    fn score_items(&self, user: Option<usize>, own: &[(usize, f64)], out: &mut [f64]);

    /// Predicted rating of `item`, when the model predicts ratings (RMSE); `None` for
    /// models that only rank.
    fn predict(&self, user: Option<usize>, own: &[(usize, f64)], item: usize) -> Option<f64>;

    /// What a personal list for `own` is made of, as the API's `source` names it:
    /// `profile` (the published model and the user's own ratings) unless the model says
    /// otherwise (`labels`: the DP counts reweighted by the public labels of the user's
    /// own items, [`crate::model::labels`]).
    fn personal_source(&self, own: &[(usize, f64)]) -> &'static str {
        let _ = own;
        "profile"
    }

    /// Whether `own` gives this model anything to personalise from; `false` when the
    /// user's list is the model's popularity order (the response's `fallback`).
    fn personalises(&self, own: &[(usize, f64)]) -> bool {
        !own.is_empty()
    }

    /// The concrete model, for a release to store it and a restarted service to reload it
    /// (`train::stored_ranker::StoredRanker::of`); `None` for models that are not served
    /// through a ranker (factor models are stored as such).
    fn storable(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// The DP counts this model published with itself, per item index (the service's
    /// popularity fallback and listings); `None` when it publishes none.
    fn popularity_counts(&self) -> Option<Vec<f64>> {
        None
    }

    /// The state of the filter that combined this model's DP counts with the earlier
    /// releases' (post-processing; the next release continues it); `None` when the model
    /// keeps none.
    fn count_history(&self) -> Option<&crate::model::history::CountHistory> {
        None
    }

    /// Why `item` scores as it does for a user whose own ratings are `own`: at most
    /// [`EXPLANATIONS`] of the user's own rated items with their contribution to the
    /// score, the largest `|contribution|` first. Only items of `own` appear (the user's
    /// own data with the published model, DESIGN 6). `None` for models that do not
    /// explain (the API then omits the field).
    fn explain(&self, own: &[(usize, f64)], item: usize) -> Option<Vec<(usize, f64)>> {
        let _ = (own, item);
        None
    }

    /// The user's bias and factors solved from the published model and the user's own
    /// ratings (a joint-DP rating predictor: computed, never stored); `None` for models
    /// without such a profile.
    fn solve_profile(&self, own: &[(usize, f64)]) -> Option<UserProfile> {
        let _ = own;
        None
    }

    /// Predicted rating (on the scale) of `item` for a profile from
    /// [`Ranker::solve_profile`]; `item = None`: an item without published terms.
    fn predict_with(&self, profile: &UserProfile, item: Option<usize>) -> Option<f64> {
        let _ = (profile, item);
        None
    }

    /// The `n` items most similar to `item` by the model's own published item-item
    /// statistics, as `(item, score)`, best first, with what they are; `None` when the
    /// model has none for `item` (the service then uses the cosine of the factor model's
    /// item profiles).
    fn similar(&self, item: usize, n: usize) -> Option<(SimilarBasis, Vec<(usize, f64)>)> {
        let _ = (item, n);
        None
    }
}

/// What a model's own similar items ([`Ranker::similar`]) are computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimilarBasis {
    /// A neighbourhood model's DP item-item weights.
    Weights,
    /// Cosine of the rows of a top-N model's DP Gram over its candidates.
    Gram,
}

/// How many of the user's own items [`Ranker::explain`] names per recommended item.
pub const EXPLANATIONS: usize = 3;

/// The `k` best items of `scores` (descending score, ties to the smaller index),
/// skipping `excluded` items and items scored `-inf` or NaN.
pub fn top_k(scores: &[f64], excluded: &[bool], k: usize) -> Vec<usize> {
    let mut cand: Vec<usize> = (0..scores.len())
        .filter(|&j| !excluded.get(j).copied().unwrap_or(false))
        .filter(|&j| scores[j] > f64::NEG_INFINITY)
        .collect();
    let better = |a: &usize, b: &usize| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b));
    if cand.len() > k && k > 0 {
        cand.select_nth_unstable_by(k - 1, better);
        cand.truncate(k);
    }
    cand.sort_unstable_by(better);
    cand.truncate(k);
    cand
}

impl Ranker for FactorModel {
    fn n_items(&self) -> usize {
        self.item_bias.len()
    }

    fn score_items(&self, user: Option<usize>, _own: &[(usize, f64)], out: &mut [f64]) {
        for (j, s) in out.iter_mut().enumerate() {
            *s = match user {
                Some(u) => self.score(u, j),
                None => self.global_mean + self.item_bias.get(j).copied().unwrap_or(0.0),
            };
        }
    }

    fn predict(&self, user: Option<usize>, _own: &[(usize, f64)], item: usize) -> Option<f64> {
        Some(match user {
            Some(u) => self.predict(u, item),
            None => self
                .scale
                .clamp(self.global_mean + self.item_bias.get(item).copied().unwrap_or(0.0)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::RatingScale;

    #[test]
    fn factor_model_ranks_by_its_score() {
        let mut m = FactorModel::zeros(1, 3, 1, 3.0, RatingScale::new(1.0, 5.0, 1.0).unwrap());
        m.item_bias[1] = 1.0;
        m.user_factors[[0, 0]] = 1.0;
        m.item_factors[[2, 0]] = 2.0;
        let mut out = vec![0.0; 3];
        Ranker::score_items(&m, Some(0), &[], &mut out);
        assert_eq!(out, vec![3.0, 4.0, 5.0]);
        Ranker::score_items(&m, None, &[], &mut out);
        assert_eq!(out, vec![3.0, 4.0, 3.0]);
        assert_eq!(Ranker::predict(&m, Some(0), &[], 2), Some(5.0));
    }
}
