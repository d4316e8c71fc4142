//! What a DP count says about an item's true count: the empirical-Bayes posterior mean
//! of each count under a prior estimated from all of them (post-processing of published
//! DP counts and their public noise sds; no charge).
//!
//! A DP count near its noise level is mostly noise: over a catalogue of 10,000 items
//! about 230 pure-noise counts land above two sds. Ranking by the noisy count is still
//! right (the posterior mean rises with the count), but a model that multiplies a count
//! by a user's label lift must not treat such a count as a popular item's: the
//! posterior mean shrinks it towards what items at that level usually are.
//!
//! The prior is the nonparametric maximum-likelihood estimate (Kiefer-Wolfowitz) on a
//! fixed grid, fitted by EM (Jiang and Zhang 2009, "General maximum likelihood empirical
//! Bayes estimation of normal means"): weights `pi_k` on grid points `x_k >= 0`, each
//! count `y_j ~ N(x, sd_j^2)` with `x ~ pi`. The posterior mean is
//! `sum_k pi_k phi_jk x_k / sum_k pi_k phi_jk` with `phi_jk = exp(-(y_j - x_k)^2 / 2 sd_j^2)`.
//! The grid covers the counts' noise region, `[0, 12 sd]` in steps of `sd / 5`; above
//! `8 sd` a count is its own evidence (no prior on that grid would move it by more than
//! its noise), so the posterior mean continues with slope 1 from its value at `8 sd`:
//! monotone, continuous, and exact in order among well-measured counts.

/// The grid `[0, GRID_SDS sd]` in steps of `sd / STEPS_PER_SD` (sd: the median sd).
const GRID_SDS: f64 = 12.0;
const STEPS_PER_SD: f64 = 5.0;
/// Above this many sds a count is taken at face value (plus the shrinkage at the edge).
const EDGE_SDS: f64 = 8.0;
/// EM iterations (the posterior means move by well under a tenth of a count past them on
/// the catalogues tested).
const ITERATIONS: usize = 200;

/// The prior fitted to the counts of the noise region, and where that region ends.
#[derive(Debug, Clone, PartialEq)]
pub struct CountPrior {
    pub points: Vec<f64>,
    pub weights: Vec<f64>,
    /// Counts above this are taken at face value ([`Self::log_posterior_mean`]).
    pub edge: f64,
}

impl CountPrior {
    /// Fits the prior (EM from uniform weights) to the counts within the grid; an
    /// infinite or non-positive sd marks a count that says nothing, which the fit skips.
    /// `None` when no count has a finite sd.
    pub fn fit(counts: &[f64], sd: &[f64]) -> Option<Self> {
        let known: Vec<(f64, f64)> = counts
            .iter()
            .zip(sd)
            .filter(|(y, s)| y.is_finite() && s.is_finite() && **s > 0.0)
            .map(|(&y, &s)| (y, s))
            .collect();
        if known.is_empty() {
            return None;
        }
        let mut sds: Vec<f64> = known.iter().map(|&(_, s)| s).collect();
        sds.sort_by(f64::total_cmp);
        let sd = sds[sds.len() / 2];
        let steps = (GRID_SDS * STEPS_PER_SD) as usize;
        let points: Vec<f64> = (0..=steps)
            .map(|i| GRID_SDS * sd * i as f64 / steps as f64)
            .collect();
        let top = GRID_SDS * sd;
        let inside: Vec<(f64, f64)> = known.into_iter().filter(|&(y, _)| y <= top).collect();
        let k = points.len();
        // Likelihoods, each row scaled by its largest entry (the posterior is unchanged).
        let mut like = vec![0.0; inside.len() * k];
        for (row, &(y, s)) in like.chunks_mut(k).zip(&inside) {
            for (l, &x) in row.iter_mut().zip(&points) {
                *l = -0.5 * ((y - x) / s).powi(2);
            }
            let top = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            row.iter_mut().for_each(|l| *l = (*l - top).exp());
        }
        let mut weights = vec![1.0 / k as f64; k];
        let mut next = vec![0.0; k];
        for _ in 0..ITERATIONS {
            next.iter_mut().for_each(|w| *w = 0.0);
            for row in like.chunks(k) {
                let total: f64 = row.iter().zip(&weights).map(|(l, w)| l * w).sum();
                if total > 0.0 {
                    for ((n, l), w) in next.iter_mut().zip(row).zip(&weights) {
                        *n += l * w / total;
                    }
                }
            }
            let sum: f64 = next.iter().sum();
            if sum <= 0.0 {
                break;
            }
            weights
                .iter_mut()
                .zip(&next)
                .for_each(|(w, n)| *w = n / sum);
        }
        Some(Self {
            points,
            weights,
            edge: EDGE_SDS * sd,
        })
    }

    /// The natural log of the posterior mean of a true count given its DP count `y`
    /// with noise sd `sd` (of the prior's mean when `sd` is infinite: the count says
    /// nothing). Computed from logs, so that counts deep in the noise keep their order
    /// instead of all rounding to 0. Above the edge: the posterior mean at the edge plus
    /// `y - edge`.
    pub fn log_posterior_mean(&self, y: f64, sd: f64) -> f64 {
        let known = y.is_finite() && sd.is_finite() && sd > 0.0;
        if known && y > self.edge {
            return (self.log_posterior_mean(self.edge, sd).exp() + (y - self.edge)).ln();
        }
        let mut num = f64::NEG_INFINITY;
        let mut den = f64::NEG_INFINITY;
        for (&x, &w) in self.points.iter().zip(&self.weights) {
            if w <= 0.0 {
                continue;
            }
            let l = w.ln()
                + if known {
                    -0.5 * ((y - x) / sd).powi(2)
                } else {
                    0.0
                };
            den = log_add(den, l);
            if x > 0.0 {
                num = log_add(num, l + x.ln());
            }
        }
        num - den
    }

    /// The posterior mean itself ([`Self::log_posterior_mean`]).
    pub fn posterior_mean(&self, y: f64, sd: f64) -> f64 {
        self.log_posterior_mean(y, sd).exp()
    }

    /// The prior's mean count (over the noise region's counts).
    pub fn mean(&self) -> f64 {
        self.points
            .iter()
            .zip(&self.weights)
            .map(|(x, w)| x * w)
            .sum()
    }
}

/// The log of each count's posterior mean under the prior fitted to all of them (`None`
/// when no count has a finite sd): what the counts say the true counts are, noise-level
/// ones shrunk; logs, so that counts deep in the noise keep their order.
pub fn log_posterior_means(counts: &[f64], sd: &[f64]) -> Option<Vec<f64>> {
    let prior = CountPrior::fit(counts, sd)?;
    Some(
        counts
            .iter()
            .zip(sd)
            .map(|(&y, &s)| prior.log_posterior_mean(y, s))
            .collect(),
    )
}

/// `ln(e^a + e^b)` without overflow (either may be `-inf`).
fn log_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        hi
    } else {
        hi + (lo - hi).exp().ln_1p()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;
    use rand_distr::{Distribution, Normal};

    /// A catalogue of 5,000 items, 95% of them never counted (true 0) and 5% popular
    /// (true 200), counts with noise sd 40: a count of 100 (2.5 sds) is far likelier
    /// noise than popularity, so its posterior mean is far below 100, while a count of
    /// 200 stays near 200; posterior means rise with the count.
    #[test]
    fn noise_level_counts_shrink_and_popular_ones_stay() {
        let mut rng = dprec_dp::rng::seeded(5);
        let noise = Normal::new(0.0, 40.0).unwrap();
        let counts: Vec<f64> = (0..5_000)
            .map(|_| {
                let truth = if rng.random::<f64>() < 0.05 {
                    200.0
                } else {
                    0.0
                };
                truth + noise.sample(&mut rng)
            })
            .collect();
        let prior = CountPrior::fit(&counts, &vec![40.0; counts.len()]).unwrap();
        let at = |y: f64| prior.posterior_mean(y, 40.0);
        assert!(at(100.0) < 40.0, "{}", at(100.0));
        assert!((at(220.0) - 200.0).abs() < 20.0, "{}", at(220.0));
        // Rising with the count, strictly even deep in the noise (computed from logs).
        let logs: Vec<f64> = (-30..30)
            .map(|i| prior.log_posterior_mean(i as f64 * 10.0, 40.0))
            .collect();
        assert!(logs.windows(2).all(|w| w[0] < w[1]), "{logs:?}");
        // The prior's mean is the catalogue's: about 5% of 200.
        assert!((prior.mean() - 10.0).abs() < 3.0, "{}", prior.mean());
        // A count with no information gets the prior's mean.
        for m in [at(f64::NAN), prior.posterior_mean(500.0, f64::INFINITY)] {
            assert!((m / prior.mean() - 1.0).abs() < 1e-9, "{m}");
        }
    }

    /// Counts far above their noise keep their distances (slope 1 past the edge), so
    /// that close precise counts keep their order; the mean is continuous at the edge.
    #[test]
    fn precise_counts_keep_their_order_and_distances() {
        let counts: Vec<f64> = (1..=300).map(|j| 10.0 * j as f64).collect();
        let prior = CountPrior::fit(&counts, &vec![1.0; counts.len()]).unwrap();
        let at = |y: f64| prior.posterior_mean(y, 1.0);
        for &y in &[50.0, 700.0, 2_500.0] {
            assert!((at(y) - y).abs() < 2.0, "{y} -> {}", at(y));
            assert!((at(y + 0.5) - at(y) - 0.5).abs() < 1e-9);
        }
        assert!((at(prior.edge + 1e-9) - at(prior.edge)).abs() < 1e-6);
        assert!(CountPrior::fit(&[1.0], &[f64::INFINITY]).is_none());
    }
}
