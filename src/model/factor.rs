//! The factor model every trainer produces: r_ui ~ mu + b_u + b_i + p_u . q_i.

use ndarray::{Array1, Array2};
use serde::{Deserialize, Serialize};

use crate::data::{RatingScale, Ratings};

/// A biased matrix-factorization model. A baseline model has `d == 0`. Indices outside
/// the trained range (users or items never seen) get zero bias and no factors.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FactorModel {
    pub global_mean: f64,
    pub user_bias: Array1<f64>,
    pub item_bias: Array1<f64>,
    /// n_users x d
    pub user_factors: Array2<f64>,
    /// n_items x d
    pub item_factors: Array2<f64>,
    pub scale: RatingScale,
}

impl FactorModel {
    /// A model with zero biases and zero factors of rank `d`.
    pub fn zeros(n_users: usize, n_items: usize, d: usize, mean: f64, scale: RatingScale) -> Self {
        Self {
            global_mean: mean,
            user_bias: Array1::zeros(n_users),
            item_bias: Array1::zeros(n_items),
            user_factors: Array2::zeros((n_users, d)),
            item_factors: Array2::zeros((n_items, d)),
            scale,
        }
    }

    pub fn rank(&self) -> usize {
        self.item_factors.ncols()
    }

    /// Unclamped score mu + b_u + b_i + p_u . q_i (used for ranking).
    pub fn score(&self, user: usize, item: usize) -> f64 {
        let mut s = self.global_mean;
        if let Some(b) = self.user_bias.get(user) {
            s += b;
        }
        if let Some(b) = self.item_bias.get(item) {
            s += b;
        }
        if user < self.user_factors.nrows() && item < self.item_factors.nrows() {
            s += self
                .user_factors
                .row(user)
                .dot(&self.item_factors.row(item));
        }
        s
    }

    /// Predicted rating, clamped to the scale.
    pub fn predict(&self, user: usize, item: usize) -> f64 {
        self.scale.clamp(self.score(user, item))
    }

    /// Predictions for every rating in `r`, in order.
    pub fn predict_all(&self, r: &Ratings) -> Vec<f64> {
        r.users
            .iter()
            .zip(&r.items)
            .map(|(&u, &i)| self.predict(u as usize, i as usize))
            .collect()
    }
}

/// Root mean squared error of `pred` against the values of `truth`.
pub fn rmse(pred: &[f64], truth: &Ratings) -> f64 {
    let n = truth.len().max(1) as f64;
    let se: f64 = pred
        .iter()
        .zip(&truth.values)
        .map(|(p, &t)| (p - t as f64).powi(2))
        .sum();
    (se / n).sqrt()
}

/// Mean absolute error of `pred` against the values of `truth`.
pub fn mae(pred: &[f64], truth: &Ratings) -> f64 {
    let n = truth.len().max(1) as f64;
    pred.iter()
        .zip(&truth.values)
        .map(|(p, &t)| (p - t as f64).abs())
        .sum::<f64>()
        / n
}
