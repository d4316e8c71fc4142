//! The served form of `dp-alt`: a joint-DP rating predictor (DESIGN 6). The published
//! part is the item side only (item biases and factors, a DP release); a user's bias and
//! factors are solved at query time from that item side and the user's OWN current
//! ratings, never stored or released, so they charge nothing.
//!
//! The user-side solve is a small ridge regression:
//! `min_{b, p} sum_j (r_j - mu - c_j - b - p . q_j)^2 + lambda (b^2 + |p|^2)` over the
//! user's rated items, then `p` projected onto the ball of radius `max_norm` (the bound
//! the trainer's item steps rely on, so training and serving solve the same way).

use serde::{Deserialize, Serialize};

use crate::data::RatingScale;
pub use crate::model::profile::UserProfile;
use crate::model::ranker::Ranker;
use crate::numerics::linalg::cholesky_solve;

/// The published item side of a joint-DP rating predictor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JointAls {
    /// The public prior mean (the scale's midpoint unless configured).
    pub mean: f64,
    /// Per item: the DP item bias.
    pub item_bias: Vec<f64>,
    /// Per item, row-major `n_items x d`: the DP item factors.
    pub item_factors: Vec<f64>,
    pub d: usize,
    /// Ridge of the user-side solve (public).
    pub lambda_user: f64,
    /// Bound on the norm of a user's factors (public).
    pub max_norm: f64,
    pub scale: RatingScale,
    /// Per item: the DP (weighted) count of the last item step's Gram, the release's
    /// popularity (lists for users without ratings; post-processing of the release).
    #[serde(default)]
    pub popularity: Vec<f64>,
    /// The item statistics combined across releases, which `popularity` reads from and
    /// the next release continues (`model::history`); `None` in models stored before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<crate::model::history::CountHistory>,
}

impl JointAls {
    fn q(&self, j: usize) -> &[f64] {
        &self.item_factors[j * self.d..(j + 1) * self.d]
    }

    /// The user's bias and factors from the item side and the user's own ratings
    /// `(item index, value)`; items outside the model are ignored. No ratings: zeros.
    pub fn profile(&self, own: &[(usize, f64)]) -> UserProfile {
        let k = self.d + 1;
        let mut a = vec![0.0; k * k];
        let mut b = vec![0.0; k];
        let mut z = vec![0.0; k];
        let mut any = false;
        for &(j, r) in own {
            if j >= self.item_bias.len() {
                continue;
            }
            any = true;
            z[0] = 1.0;
            z[1..].copy_from_slice(self.q(j));
            let y = r - self.mean - self.item_bias[j];
            for s in 0..k {
                b[s] += y * z[s];
                for t in 0..k {
                    a[s * k + t] += z[s] * z[t];
                }
            }
        }
        if !any {
            return UserProfile {
                bias: 0.0,
                factors: vec![0.0; self.d],
            };
        }
        for s in 0..k {
            a[s * k + s] += self.lambda_user.max(1e-9);
        }
        if !cholesky_solve(&mut a, &mut b, k) {
            b.iter_mut().for_each(|x| *x = 0.0);
        }
        let mut factors = b[1..].to_vec();
        project(&mut factors, self.max_norm);
        UserProfile {
            bias: b[0],
            factors,
        }
    }

    /// Unclamped score `mu + b + c_j + p . q_j` of item `j` for `profile`.
    pub fn score(&self, profile: &UserProfile, j: usize) -> f64 {
        let dot: f64 = profile
            .factors
            .iter()
            .zip(self.q(j))
            .map(|(p, q)| p * q)
            .sum();
        self.mean + profile.bias + self.item_bias[j] + dot
    }
}

/// Projects `v` onto the L2 ball of radius `r`.
pub fn project(v: &mut [f64], r: f64) {
    let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    if n > r && n > 0.0 {
        v.iter_mut().for_each(|x| *x *= r / n);
    }
}

impl Ranker for JointAls {
    fn n_items(&self) -> usize {
        self.item_bias.len()
    }

    fn score_items(&self, _user: Option<usize>, own: &[(usize, f64)], out: &mut [f64]) {
        if !self.personalises(own) && self.popularity.len() == out.len() {
            out.copy_from_slice(&self.popularity);
            return;
        }
        let p = self.profile(own);
        for (j, s) in out.iter_mut().enumerate() {
            *s = self.score(&p, j);
        }
    }

    fn predict(&self, _user: Option<usize>, own: &[(usize, f64)], item: usize) -> Option<f64> {
        self.predict_with(&self.profile(own), Some(item))
    }

    fn personalises(&self, own: &[(usize, f64)]) -> bool {
        own.iter().any(|&(j, _)| j < self.item_bias.len())
    }

    fn popularity_counts(&self) -> Option<Vec<f64>> {
        (self.popularity.len() == self.item_bias.len()).then(|| self.popularity.clone())
    }

    fn solve_profile(&self, own: &[(usize, f64)]) -> Option<UserProfile> {
        Some(self.profile(own))
    }

    fn predict_with(&self, profile: &UserProfile, item: Option<usize>) -> Option<f64> {
        let s = match item.filter(|&j| j < self.item_bias.len()) {
            Some(j) => self.score(profile, j),
            None => self.mean + profile.bias,
        };
        Some(self.scale.clamp(s))
    }

    fn storable(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn count_history(&self) -> Option<&crate::model::history::CountHistory> {
        self.history.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> JointAls {
        JointAls {
            mean: 3.0,
            item_bias: vec![0.5, -0.5, 0.0],
            item_factors: vec![1.0, -1.0, 0.0],
            d: 1,
            lambda_user: 1e-6,
            max_norm: 10.0,
            scale: RatingScale::ONE_TO_FIVE,
            popularity: vec![3.0, 1.0, 2.0],
            history: None,
        }
    }

    #[test]
    fn profile_fits_the_users_own_ratings() {
        let m = model();
        // r = 3 + b + c_j + p q_j with b = 0.5, p = 0.25.
        let own = [(0, 4.25), (1, 2.75)];
        let p = m.profile(&own);
        assert!((p.bias - 0.5).abs() < 1e-4, "{p:?}");
        assert!((p.factors[0] - 0.25).abs() < 1e-4, "{p:?}");
        assert!((m.predict(None, &own, 2).unwrap() - 3.5).abs() < 1e-4);
        // No ratings: the prior mean plus the item bias.
        assert_eq!(m.profile(&[]).bias, 0.0);
        assert_eq!(m.predict(None, &[], 0), Some(3.5));
        // Without ratings a list is the DP popularity order.
        let mut out = vec![0.0; 3];
        m.score_items(None, &[], &mut out);
        assert_eq!(out, vec![3.0, 1.0, 2.0]);
        assert!(!m.personalises(&[]));
    }

    /// A model stored before the item side was combined across releases (no `history`)
    /// loads, with no state to continue; one with a state reads back with it.
    #[test]
    fn a_stored_model_loads_with_or_without_its_state() {
        use crate::model::StoredRanker;
        let json = serde_json::to_value(StoredRanker::of(&model()).unwrap()).unwrap();
        assert!(json["model"].get("history").is_none());
        let old = serde_json::to_string(&json).unwrap();
        let back = serde_json::from_str::<StoredRanker>(&old)
            .unwrap()
            .into_ranker();
        assert!(back.count_history().is_none());
        assert_eq!(
            back.predict(None, &[(0, 4.0)], 2),
            model().predict(None, &[(0, 4.0)], 2)
        );
        let mut with = model();
        with.history = Some(
            crate::model::history::CountHistory::update(None, "b", &[3.0, 1.0, 2.0], 1.0, 0.0)
                .unwrap(),
        );
        let json = serde_json::to_string(&StoredRanker::of(&with).unwrap()).unwrap();
        let back = serde_json::from_str::<StoredRanker>(&json)
            .unwrap()
            .into_ranker();
        assert_eq!(back.count_history(), with.history.as_ref());
    }

    #[test]
    fn factors_are_projected_onto_the_public_ball() {
        let mut m = model();
        m.max_norm = 0.1;
        let p = m.profile(&[(0, 5.0), (1, 1.0)]);
        assert!((p.factors[0].abs() - 0.1).abs() < 1e-12, "{p:?}");
    }
}
