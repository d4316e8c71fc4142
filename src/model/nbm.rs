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
use crate::model::ranker::EXPLANATIONS;
use crate::model::Ranker;

/// Marks an item that is not an anchor (has no column in `sim`).
pub const NO_ANCHOR: u32 = u32::MAX;

/// A neighbourhood model: DP global offset, DP item biases and DP item-anchor weights.
/// Stored (with a release) as its published arrays ([`NbmModelParts`]); the anchor
/// lookup is rebuilt and the shapes are checked on load.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(into = "NbmModelParts", try_from = "NbmModelParts")]
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

/// The published arrays of an [`NbmModel`], as stored: nothing per user.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NbmModelParts {
    pub global_mean: f64,
    pub item_bias: Vec<f64>,
    pub anchors: Vec<u32>,
    pub sim: Vec<f64>,
    pub c_norm: f64,
    pub scale: RatingScale,
}

impl From<NbmModel> for NbmModelParts {
    fn from(m: NbmModel) -> Self {
        Self {
            global_mean: m.global_mean,
            item_bias: m.item_bias,
            anchors: m.anchors,
            sim: m.sim,
            c_norm: m.c_norm,
            scale: m.scale,
        }
    }
}

impl TryFrom<NbmModelParts> for NbmModel {
    type Error = String;
    /// Refuses arrays that do not fit together, so a corrupt row is an error, not a panic.
    fn try_from(p: NbmModelParts) -> Result<Self, String> {
        let (n, k) = (p.item_bias.len(), p.anchors.len());
        if p.sim.len() != n.saturating_mul(k) {
            return Err(format!(
                "nbm weights have {} entries for {n} items x {k} anchors",
                p.sim.len()
            ));
        }
        if p.c_norm.is_nan() || p.c_norm <= 0.0 {
            return Err(format!("nbm c_norm must be positive, got {}", p.c_norm));
        }
        let mut anchor_of = vec![NO_ANCHOR; n];
        for (a, &j) in p.anchors.iter().enumerate() {
            match anchor_of.get_mut(j as usize) {
                Some(slot) if *slot == NO_ANCHOR => *slot = a as u32,
                Some(_) => return Err(format!("nbm anchor {j} is listed twice")),
                None => return Err(format!("nbm anchor {j} outside 0..{n}")),
            }
        }
        Ok(Self {
            global_mean: p.global_mean,
            item_bias: p.item_bias,
            anchors: p.anchors,
            anchor_of,
            sim: p.sim,
            c_norm: p.c_norm,
            scale: p.scale,
        })
    }
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
    /// items with their terms, the largest `|contribution|` first (ties to the smaller
    /// item index), at most `limit`. Only items of `own` can appear.
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
        out.sort_by(|p, q| {
            q.contribution
                .abs()
                .total_cmp(&p.contribution.abs())
                .then(p.item.cmp(&q.item))
        });
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

    /// Only rated anchor items move a score; without one the list is the DP biases,
    /// so the service answers with its DP popularity instead.
    fn personalises(&self, own: &[(usize, f64)]) -> bool {
        own.iter()
            .any(|&(j, _)| self.anchor_of.get(j).is_some_and(|&a| a != NO_ANCHOR))
    }

    fn storable(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    /// The user's own items with a non-zero term in the score of `item`.
    fn explain(&self, own: &[(usize, f64)], item: usize) -> Option<Vec<(usize, f64)>> {
        let mut e = NbmModel::explain(self, own, item, usize::MAX);
        e.retain(|c| c.contribution != 0.0);
        e.truncate(EXPLANATIONS);
        Some(e.into_iter().map(|c| (c.item, c.contribution)).collect())
    }

    fn similar(
        &self,
        item: usize,
        n: usize,
    ) -> Option<(crate::model::ranker::SimilarBasis, Vec<(usize, f64)>)> {
        let list = NbmModel::similar(self, item, n);
        Some((crate::model::ranker::SimilarBasis::Weights, list))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StoredRanker;

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

    /// A release stores the model as JSON (its published arrays only) and a restarted
    /// service reloads it: the same scores, explanations and neighbours come back, and
    /// arrays that do not fit together are refused.
    #[test]
    fn stored_form_round_trips_and_refuses_bad_shapes() {
        let m = model();
        let json = serde_json::to_string(&StoredRanker::of(&m).unwrap()).unwrap();
        assert!(json.contains("\"kind\":\"nbm\""), "{json}");
        assert!(
            !json.contains("anchor_of"),
            "the lookup is not stored: {json}"
        );
        let back = serde_json::from_str::<StoredRanker>(&json)
            .unwrap()
            .into_ranker();
        let own = [(0, 5.0), (1, 2.0)];
        let (mut a, mut b) = (vec![0.0; 3], vec![0.0; 3]);
        m.score_items(None, &own, &mut a);
        back.score_items(None, &own, &mut b);
        assert_eq!(a, b);
        assert_eq!(back.explain(&own, 2), Ranker::explain(&m, &own, 2));
        assert_eq!(
            back.similar(2, 5),
            Some((
                crate::model::ranker::SimilarBasis::Weights,
                vec![(0, 2.0), (1, 1.0)]
            ))
        );
        assert!(back.popularity_counts().is_none());
        let StoredRanker::Nbm { model: parsed } = serde_json::from_str(&json).unwrap() else {
            panic!("not an nbm ranker");
        };
        assert_eq!(parsed, m);
        for (from, to) in [
            ("[0.0,1.0,1.0,0.0,2.0,1.0]", "[0.0,1.0,1.0,0.0,2.0]"),
            ("\"anchors\":[0,1]", "\"anchors\":[0,3]"),
            ("\"anchors\":[0,1]", "\"anchors\":[1,1]"),
            ("\"c_norm\":1.0", "\"c_norm\":0.0"),
        ] {
            let bad = json.replace(from, to);
            assert_ne!(bad, json, "{from}");
            assert!(serde_json::from_str::<StoredRanker>(&bad).is_err(), "{to}");
        }
    }

    /// The served explanation: at most three of the user's own items, the largest
    /// |contribution| first, zero terms left out; personal only with a rated anchor.
    #[test]
    fn trait_explanations_take_the_three_largest_terms_by_magnitude() {
        // 5 items, all anchors; item 4's row weights own items 0..3 by 1, -3, 2, 0.
        let mut sim = vec![0.0; 25];
        sim[4 * 5..4 * 5 + 4].copy_from_slice(&[1.0, -3.0, 2.0, 0.0]);
        let m = NbmModel {
            global_mean: 3.0,
            item_bias: vec![0.0; 5],
            anchors: vec![0, 1, 2, 3, 4],
            anchor_of: vec![0, 1, 2, 3, 4],
            sim,
            c_norm: 1.0,
            scale: RatingScale::new(1.0, 5.0, 1.0).unwrap(),
        };
        // x = 2, 1, -1, 2 for items 0..3: terms 2/6, -3/6, -2/6, 0.
        let own = [(0, 5.0), (1, 4.0), (2, 2.0), (3, 5.0)];
        let e = Ranker::explain(&m, &own, 4).unwrap();
        let items: Vec<usize> = e.iter().map(|p| p.0).collect();
        assert_eq!(items, vec![1, 0, 2]);
        assert!((e[0].1 + 0.5).abs() < 1e-12 && (e[1].1 - 1.0 / 3.0).abs() < 1e-12);
        let total: f64 = e.iter().map(|p| p.1).sum();
        assert!((m.score(&own, 4) - 3.0 - total).abs() < 1e-12);
        assert_eq!(Ranker::explain(&m, &[(3, 5.0)], 4), Some(vec![]));
        assert!(m.personalises(&own));
        let few = model();
        assert!(!few.personalises(&[(2, 5.0)]), "item 2 is no anchor");
        assert!(few.personalises(&[(2, 5.0), (1, 1.0)]));
    }
}
