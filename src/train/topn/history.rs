//! The DP counts across releases: every release publishes fresh noisy counts of
//! everything rated so far, and the counts change slowly between releases, so the served
//! counts combine this release's with the earlier ones (a local-level Kalman filter per
//! item). The earlier releases were charged when they were published: a function of their
//! published counts and of this release's is post-processing, so the combination costs
//! nothing and the plan's charges stay exact (docs/privacy/dp-topn.md, "Counts across
//! releases").
//!
//! Model: release `t`'s counts are `y_t = c_t + N(0, sigma_t^2)` (the mechanism's public
//! noise sd) and the true counts drift between releases as `c_t = c_{t-1} + w_t`,
//! `w_t ~ N(0, drift * sigma_t^2)`. `drift` is public: [`drift_for`] sets it from the
//! plan (the drift variance over a whole lifetime of `T` releases is one release's noise
//! variance). An item seen for the first time starts from its own count.

use serde::{Deserialize, Serialize};

use crate::train::{invalid, TrainError};

/// The filter's state after a release, per catalogue item: the estimate served and its
/// variance. `basis` names what the counts count (the contribution rule); a state is only
/// combined with counts of the same basis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CountHistory {
    pub basis: String,
    pub mean: Vec<f64>,
    /// Variance of `mean` (`f64::INFINITY` for an item with no earlier count, in memory
    /// only: a stored state has a finite variance for every item).
    pub var: Vec<f64>,
    /// How many releases the state combines (1: this release alone).
    pub releases: u64,
    /// The sum of this release's own counts, before combining (a DP value): the
    /// operator-safety rule (`retrain.min_input_ratio`) compares it, so that a sudden fall
    /// of the input shows at once rather than at the filter's pace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_total: Option<f64>,
}

/// The drift ratio of a plan of `releases` releases: `1 / T`.
pub fn drift_for(releases: u64) -> f64 {
    1.0 / releases.max(1) as f64
}

impl CountHistory {
    /// The state after this release's `counts` (noise sd `sigma`), given the state after
    /// the previous release (`prev`, aligned with `counts`; ignored when its basis or
    /// length differs). Pure post-processing of published values.
    pub fn update(
        prev: Option<&CountHistory>,
        basis: &str,
        counts: &[f64],
        sigma: f64,
        drift: f64,
    ) -> Result<Self, TrainError> {
        if !(sigma.is_finite() && sigma > 0.0) {
            return Err(invalid(
                "sigma",
                format!("the counts' noise sd must be finite and positive, got {sigma}"),
            ));
        }
        if !(drift.is_finite() && drift >= 0.0) {
            return Err(invalid(
                "drift",
                format!("must be finite and >= 0, got {drift}"),
            ));
        }
        let v = sigma * sigma;
        let prev = prev.filter(|p| p.basis == basis && p.mean.len() == counts.len());
        let Some(p) = prev else {
            return Ok(Self {
                basis: basis.to_string(),
                mean: counts.to_vec(),
                var: vec![v; counts.len()],
                releases: 1,
                own_total: Some(counts.iter().sum()),
            });
        };
        let mut mean = Vec::with_capacity(counts.len());
        let mut var = Vec::with_capacity(counts.len());
        for ((&y, &m), &pv) in counts.iter().zip(&p.mean).zip(&p.var) {
            // Predict (the counts drift), then weigh the prediction and the new count by
            // their precisions.
            let predicted = pv + drift * v;
            if !predicted.is_finite() {
                mean.push(y);
                var.push(v);
                continue;
            }
            let gain = predicted / (predicted + v);
            mean.push(m + gain * (y - m));
            var.push((1.0 - gain) * predicted);
        }
        Ok(Self {
            basis: basis.to_string(),
            mean,
            var,
            releases: p.releases + 1,
            own_total: Some(counts.iter().sum()),
        })
    }

    /// The state re-indexed to another item list: `index(j)` is item `j`'s position in
    /// this state (`None`: a new item, no earlier count).
    pub fn reindexed(&self, n_items: usize, index: impl Fn(usize) -> Option<usize>) -> Self {
        let (mut mean, mut var) = (vec![0.0; n_items], vec![f64::INFINITY; n_items]);
        for j in 0..n_items {
            if let Some(old) = index(j).filter(|&o| o < self.mean.len()) {
                mean[j] = self.mean[old];
                var[j] = self.var[old];
            }
        }
        Self {
            basis: self.basis.clone(),
            mean,
            var,
            releases: self.releases,
            own_total: self.own_total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::seeded;

    /// The state after one release with no earlier one.
    fn first(basis: &str, counts: &[f64], sigma: f64) -> Result<CountHistory, TrainError> {
        CountHistory::update(None, basis, counts, sigma, 0.0)
    }

    #[test]
    fn first_release_is_its_counts() {
        let h = first("b", &[3.0, -1.0], 2.0).unwrap();
        assert_eq!(h.mean, vec![3.0, -1.0]);
        assert_eq!(h.var, vec![4.0, 4.0]);
        assert_eq!(h.releases, 1);
    }

    /// One step by hand: prediction variance 4 + 0.25 * 4 = 5, gain 5 / 9.
    #[test]
    fn one_step_weighs_by_precision() {
        let h = first("b", &[10.0], 2.0).unwrap();
        let h2 = CountHistory::update(Some(&h), "b", &[19.0], 2.0, 0.25).unwrap();
        assert!((h2.mean[0] - (10.0 + 5.0 / 9.0 * 9.0)).abs() < 1e-12);
        assert!((h2.var[0] - 4.0 * 5.0 / 9.0).abs() < 1e-12);
        assert_eq!(h2.releases, 2);
        assert_eq!(h2.own_total, Some(19.0));
    }

    #[test]
    fn another_basis_or_a_new_item_starts_from_the_counts() {
        let h = first("liked", &[10.0, 5.0], 2.0).unwrap();
        let other = CountHistory::update(Some(&h), "all", &[1.0, 2.0], 2.0, 0.1).unwrap();
        assert_eq!(other.mean, vec![1.0, 2.0]);
        assert_eq!(other.releases, 1);
        // Item 1 of the new list is new (no earlier count).
        let moved = h.reindexed(2, |j| (j == 0).then_some(0));
        assert_eq!(moved.var[1], f64::INFINITY);
        let next = CountHistory::update(Some(&moved), "liked", &[12.0, 7.0], 2.0, 0.1).unwrap();
        assert_eq!(next.mean[1], 7.0);
        assert_eq!(next.var[1], 4.0);
        assert!(next.mean[0] > 10.0 && next.mean[0] < 12.0);
    }

    #[test]
    fn bad_sigma_or_drift_is_refused() {
        assert!(first("b", &[1.0], 0.0).is_err());
        assert!(first("b", &[1.0], f64::NAN).is_err());
        let h = first("b", &[1.0], 1.0).unwrap();
        assert!(CountHistory::update(Some(&h), "b", &[1.0], 1.0, -0.1).is_err());
    }

    /// Counts released 52 times with sd 10 (2,000 items). When the truth drifts as the
    /// model says (a random walk of variance q sigma^2 a release), the error variance is
    /// the filter's own `var`, whose steady state is 100 (sqrt(q^2 + 4q) - q) / 2 = 12.9
    /// at q = 1/52; when the truth stands still the filter is an average with weight
    /// `k` (the steady gain) and its error variance is 100 k / (2 - k) = 6.9: both far
    /// below one release's 100. The mean squared error over 2,000 items has relative sd
    /// 3.2% (chi-square), so 15% is over 4 sd (false failure < 1e-4; the seed is fixed).
    /// A filter that ignored the prior state, or weighed it wrongly, fails.
    #[test]
    fn repeated_releases_shrink_the_error_as_the_variance_says() {
        let (n, v) = (2000, 100.0);
        let q = drift_for(52);
        let steady = v * ((q * q + 4.0 * q).sqrt() - q) / 2.0;
        let k = (steady + q * v) / (steady + q * v + v);
        for (drifts, want) in [(true, steady), (false, v * k / (2.0 - k))] {
            let mut truth: Vec<f64> = (0..n).map(|j| (j % 97) as f64).collect();
            let mut rng = seeded(11);
            let mut h: Option<CountHistory> = None;
            for _ in 0..52 {
                if drifts {
                    for c in truth.iter_mut() {
                        *c += crate::privacy::gaussian((q * v).sqrt(), &mut rng).unwrap();
                    }
                }
                let y: Vec<f64> = truth
                    .iter()
                    .map(|c| c + crate::privacy::gaussian(v.sqrt(), &mut rng).unwrap())
                    .collect();
                h = Some(CountHistory::update(h.as_ref(), "b", &y, v.sqrt(), q).unwrap());
            }
            let h = h.unwrap();
            let mse = h
                .mean
                .iter()
                .zip(&truth)
                .map(|(m, c)| (m - c).powi(2))
                .sum::<f64>()
                / n as f64;
            assert!(
                (h.var[0] - steady).abs() < 0.01 * steady,
                "var {}",
                h.var[0]
            );
            assert!(
                (mse / want - 1.0).abs() < 0.15,
                "drifts {drifts}: mse {mse}, want {want}"
            );
        }
    }
}
