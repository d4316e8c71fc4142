//! Ranking interface shared by every model that serves top-N lists.
//!
//! Under joint DP (DESIGN 6) a user's list may depend on the published DP model and on
//! that user's OWN current ratings, nothing else. A [`Ranker`] makes that explicit: it is
//! given the user's own ratings at query time (eval and service alike), so a model whose
//! scores are `x_u B` (item-item, projection) and a factor model with a stored user row
//! rank through the same call.

use crate::train::FactorModel;

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
