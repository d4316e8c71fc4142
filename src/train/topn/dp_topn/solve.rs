//! Post-processing: the EASE solve, the DP item profiles and the published arrays.

use super::*;

/// The noise edge of the released Gram's spectrum: `2 sigma_g sqrt(K)`.
pub fn noise_edge(sigma_gram: f64, k: usize) -> f64 {
    2.0 * sigma_gram * (k as f64).sqrt()
}

/// The DP item profiles: the eigenvectors of the DP Gram whose eigenvalue is above its
/// [`noise_edge`] (at least one, at most `max_d`), as a projection (post-processing).
pub(super) fn projection(rel: &GramRelease, k: usize, max_d: usize) -> ItemScorer {
    // The Gram is PSD; its noise (a Wigner matrix of entry sd sigma) has spectral norm
    // ~ 2 sigma sqrt(K): shifting by more keeps the shifted matrix PSD with high
    // probability (only convergence speed depends on it).
    let shift = rel.sigma_gram * (2.0 * (k as f64).sqrt() + 6.0);
    let d = max_d.min(k);
    let (vals, v) = top_eigen(&rel.gram, k, d, shift);
    let edge = noise_edge(rel.sigma_gram, k);
    let keep = vals.iter().take_while(|&&l| l > edge).count().max(1);
    let factors = if keep == d {
        v
    } else {
        (0..k)
            .flat_map(|i| v[i * d..i * d + keep].iter().copied())
            .collect()
    };
    ItemScorer::Projection { d: keep, factors }
}

/// EASE (Steck 2019): `B = I - P diag(1/diag P)`, `P = (G + lambda I)^-1`, zero diagonal.
/// The ridge is raised until `G + lambda I` is positive definite (a noisy Gram may not be).
pub fn ease_weights(g: &[f64], k: usize, lambda: f64) -> Result<Vec<f64>, TrainError> {
    Ok(ease_from_inverse(&ease_inverse(g, k, lambda)?, k))
}

/// `P = (G + lambda I)^-1`, the ridge doubled until `G + lambda I` is positive definite.
pub fn ease_inverse(g: &[f64], k: usize, lambda: f64) -> Result<Vec<f64>, TrainError> {
    let mut lam = lambda;
    for _ in 0..60 {
        let mut a = g.to_vec();
        for i in 0..k {
            a[i * k + i] += lam;
        }
        if let Some(p) = spd_inverse(&a, k) {
            return Ok(p);
        }
        lam *= 2.0;
    }
    Err(TrainError::Numerical(
        "EASE: no ridge made the Gram positive definite".into(),
    ))
}

/// EASE's `B = I - P diag(1/diag P)` (zero diagonal) from `P`.
pub fn ease_from_inverse(p: &[f64], k: usize) -> Vec<f64> {
    let mut b = vec![0.0; k * k];
    for i in 0..k {
        for j in 0..k {
            b[i * k + j] = if i == j {
                0.0
            } else {
                -p[i * k + j] / p[j * k + j]
            };
        }
    }
    b
}

/// At most this many dimensions of DP item profiles are published.
pub(super) const PROFILE_MAX_D: usize = 32;

/// The published arrays as a [`FactorModel`] (no users): item factors = the projection
/// rows on candidates (zero elsewhere), item bias = DP count.
pub(super) fn item_side_model(
    r: &ItemRanker,
    rel: &GramRelease,
    data: &TrainData<'_>,
) -> FactorModel {
    // The published DP item profiles are the Gram's top eigenvectors above its noise
    // edge (post-processing of the same release; EASE serves the lists).
    let projected = if rel.gram.is_empty() {
        ItemScorer::Popularity
    } else {
        projection(rel, rel.candidates.len(), PROFILE_MAX_D)
    };
    let (d, factors) = match &projected {
        ItemScorer::Projection { d, factors } => (*d, factors.as_slice()),
        _ => (0, &[][..]),
    };
    let mid = (data.scale.min + data.scale.max) / 2.0;
    let mut m = FactorModel::zeros(0, r.n_items, d, mid, data.scale);
    for (a, &j) in r.candidates.iter().enumerate() {
        m.item_bias[j as usize] = r.popularity[a];
        for c in 0..d {
            m.item_factors[[j as usize, c]] = factors[a * d + c];
        }
    }
    m
}

impl DpTopN {
    /// Step 7 (post-processing): the published item-side ranker.
    pub fn solve(&self, rel: &GramRelease, n_items: usize) -> Result<ItemRanker, TrainError> {
        let k = rel.candidates.len();
        let popularity: Vec<f64> = rel
            .candidates
            .iter()
            .map(|&j| rel.noisy_counts[j as usize])
            .collect();
        // No Gram (no candidates, or the rest went to counts): the
        // candidates in the order of their DP counts.
        let scorer = if k == 0 || rel.gram.is_empty() {
            ItemScorer::Popularity
        } else {
            let ridge = self.lambda_edges * noise_edge(rel.sigma_gram, k);
            ItemScorer::ItemItem {
                b: ease_weights(&rel.gram, k, ridge)?,
            }
        };
        let ranker = ItemRanker::new(
            n_items,
            rel.candidates.clone(),
            popularity,
            scorer,
            self.pop_weight,
        )
        .with_fill(rel.noisy_counts.clone());
        Ok(if rel.gram.is_empty() {
            ranker
        } else {
            ranker.with_neighbours(Neighbours::from_gram(&rel.gram, k, NEIGHBOURS))
        })
    }
}
