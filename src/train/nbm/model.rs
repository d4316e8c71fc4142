//! The published neighbourhood model and how a user's own ratings turn it into scores,
//! predictions and explanations (DESIGN 6: the published model is DP; a user's answers
//! use that model and the user's OWN ratings only).
//!
//! Prediction (Wang and Tang 2017, eq. 2, with learned DP biases in place of item means
//! and a public lower bound on the normaliser, their `C`):
//!
//! `r_hat(u, i) = mu + b_i + sum_j s_ij x_uj / max(c_norm, sum_j |s_ij|)`,
//! `x_uj = r_uj - (mu + b_j)`, the sums over u's own rated anchor items j != i.

use serde::{Deserialize, Serialize};

use crate::data::RatingScale;
use crate::train::Ranker;

/// Marks an item that is not an anchor (has no column in `sim`).
pub const NO_ANCHOR: u32 = u32::MAX;

/// A neighbourhood model: DP global offset, DP item biases and DP item-anchor weights.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NbmModel {
    pub global_mean: f64,
    /// One bias per item index.
    pub item_bias: Vec<f64>,
    /// The K anchor items (columns of `sim`), chosen by a public rule.
    pub anchors: Vec<u32>,
    /// For every item index its column in `sim`, or [`NO_ANCHOR`].
    pub anchor_of: Vec<u32>,
    /// `n_items x K`, row-major: `sim[i * K + a]` is the weight of anchor `a` for item `i`.
    pub sim: Vec<f64>,
    /// Public lower bound on the normaliser `sum_j |s_ij|`.
    pub c_norm: f64,
    pub scale: RatingScale,
}

/// One of the user's own rated items and how much it moved a score.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Contribution {
    /// Item index of the user's own rated item.
    pub item: usize,
    /// The user's rating of it.
    pub rating: f64,
    /// The DP weight `s_ij` between the explained item and this one.
    pub weight: f64,
    /// Its term in the score: `s_ij x_uj / max(c_norm, sum |s_ij|)`, on the rating scale.
    pub contribution: f64,
}

impl NbmModel {
    pub fn n_items(&self) -> usize {
        self.item_bias.len()
    }

    pub fn k(&self) -> usize {
        self.anchors.len()
    }

    /// The row of weights of `item` (one per anchor).
    pub fn row(&self, item: usize) -> &[f64] {
        let k = self.k();
        &self.sim[item * k..(item + 1) * k]
    }

    fn offset(&self, item: usize) -> f64 {
        self.global_mean + self.item_bias.get(item).copied().unwrap_or(0.0)
    }

    /// The user's own anchor inputs `(item, anchor column, x_uj)`.
    fn inputs(&self, own: &[(usize, f64)]) -> Vec<(usize, usize, f64)> {
        own.iter()
            .filter_map(|&(j, r)| {
                let a = *self.anchor_of.get(j)?;
                (a != NO_ANCHOR).then(|| (j, a as usize, r - self.offset(j)))
            })
            .collect()
    }

    /// Unclamped score from pre-computed inputs.
    fn score_with(&self, inputs: &[(usize, usize, f64)], item: usize) -> f64 {
        let base = self.offset(item);
        if item >= self.n_items() {
            return base;
        }
        let row = self.row(item);
        let (mut num, mut den) = (0.0, 0.0);
        for &(j, a, x) in inputs {
            if j != item {
                num += row[a] * x;
                den += row[a].abs();
            }
        }
        base + num / den.max(self.c_norm)
    }

    /// Unclamped score of `item` for a user whose own ratings are `own`.
    pub fn score(&self, own: &[(usize, f64)], item: usize) -> f64 {
        self.score_with(&self.inputs(own), item)
    }

    /// Why `item` scores as it does for a user with ratings `own`: the user's own rated
    /// items with their terms, the largest first, at most `limit`. Only items of `own`
    /// can appear.
    pub fn explain(&self, own: &[(usize, f64)], item: usize, limit: usize) -> Vec<Contribution> {
        if item >= self.n_items() {
            return Vec::new();
        }
        let inputs: Vec<_> = self
            .inputs(own)
            .into_iter()
            .filter(|&(j, _, _)| j != item)
            .collect();
        let row = self.row(item);
        let den = inputs
            .iter()
            .map(|&(_, a, _)| row[a].abs())
            .sum::<f64>()
            .max(self.c_norm);
        let mut out: Vec<Contribution> = inputs
            .iter()
            .map(|&(j, a, x)| Contribution {
                item: j,
                rating: x + self.offset(j),
                weight: row[a],
                contribution: row[a] * x / den,
            })
            .collect();
        out.sort_by(|p, q| q.contribution.total_cmp(&p.contribution));
        out.truncate(limit);
        out
    }

    /// The `n` items most similar to `item` by its DP weight row, as `(item, weight)`,
    /// the largest first (anchors only; the item itself excluded).
    pub fn similar(&self, item: usize, n: usize) -> Vec<(usize, f64)> {
        if item >= self.n_items() {
            return Vec::new();
        }
        let mut v: Vec<(usize, f64)> = self
            .row(item)
            .iter()
            .zip(&self.anchors)
            .filter(|(_, &j)| j as usize != item)
            .map(|(&w, &j)| (j as usize, w))
            .collect();
        v.sort_by(|p, q| q.1.total_cmp(&p.1).then(p.0.cmp(&q.0)));
        v.truncate(n);
        v
    }
}

impl Ranker for NbmModel {
    fn n_items(&self) -> usize {
        self.item_bias.len()
    }

    fn score_items(&self, _user: Option<usize>, own: &[(usize, f64)], out: &mut [f64]) {
        let inputs = self.inputs(own);
        for (i, s) in out.iter_mut().enumerate() {
            *s = self.score_with(&inputs, i);
        }
    }

    fn predict(&self, _user: Option<usize>, own: &[(usize, f64)], item: usize) -> Option<f64> {
        Some(self.scale.clamp(self.score(own, item)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3 items, anchors {0, 1}.
    fn model() -> NbmModel {
        NbmModel {
            global_mean: 3.0,
            item_bias: vec![0.5, -0.5, 0.0],
            anchors: vec![0, 1],
            anchor_of: vec![0, 1, NO_ANCHOR],
            sim: vec![0.0, 1.0, 1.0, 0.0, 2.0, 1.0],
            c_norm: 1.0,
            scale: RatingScale::new(1.0, 5.0, 1.0).unwrap(),
        }
    }

    #[test]
    fn prediction_is_the_normalised_weighted_deviation() {
        let m = model();
        // u rated item 0 with 5 (x = 1.5) and item 1 with 2 (x = -0.5).
        let own = [(0, 5.0), (1, 2.0)];
        // Item 2: (2 * 1.5 + 1 * -0.5) / max(1, 3) = 2.5 / 3.
        assert!((m.score(&own, 2) - (3.0 + 2.5 / 3.0)).abs() < 1e-12);
        // Item 0 ignores its own rating: 1 * -0.5 / max(1, 1).
        assert!((m.score(&own, 0) - (3.5 - 0.5)).abs() < 1e-12);
        // No ratings: the biases.
        assert_eq!(m.score(&[], 1), 2.5);
        let mut out = vec![0.0; 3];
        m.score_items(None, &own, &mut out);
        assert_eq!(out[2], m.score(&own, 2));
        assert_eq!(Ranker::predict(&m, None, &own, 2), Some(m.score(&own, 2)));
    }

    #[test]
    fn explanations_sum_to_the_score_and_name_only_own_items() {
        let m = model();
        let own = [(0, 5.0), (1, 2.0)];
        let e = m.explain(&own, 2, 10);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].item, 0);
        assert!(e[0].contribution >= e[1].contribution);
        let total: f64 = e.iter().map(|c| c.contribution).sum();
        assert!((m.score(&own, 2) - 3.0 - total).abs() < 1e-12);
        assert_eq!(m.explain(&own, 2, 1).len(), 1);
        assert!(m.explain(&[], 2, 5).is_empty());
        assert_eq!(m.similar(2, 5), vec![(0, 2.0), (1, 1.0)]);
        assert_eq!(m.similar(0, 5), vec![(1, 1.0)]);
    }
}
