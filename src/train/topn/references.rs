//! Reference rankers every top-N model is judged against (DESIGN 6a):
//! - `popularity`: most-popular by exact training counts (non-private);
//! - `dp-popularity`: most-popular by DP counts, the count step of `dp-topn` with the
//!   whole release budget (same plan, same contribution bounds and charges, so it is the
//!   DP popularity a `dp-topn` release competes with at equal privacy);
//! - `ease`: EASE (Steck 2019) on the exact binary Gram of the whole catalogue
//!   (non-private, lambda 300 by default).

use crate::model::item_ranker::{ItemRanker, ItemScorer};
use crate::train::topn::contribution::{Contribution, Liked};
use crate::train::topn::dp_topn::{self, DpTopN, ReleasePlan};
use crate::train::{FactorModel, Fitted, Guarantee, Params, TrainData, TrainError, Trainer};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::rng::DpRng;

fn counts(data: &TrainData<'_>) -> Vec<f64> {
    (0..data.matrix.n_items)
        .map(|j| data.matrix.by_item().row_len(j) as f64)
        .collect()
}

fn item_model(data: &TrainData<'_>, popularity: &[f64]) -> FactorModel {
    popularity_model(popularity, data.scale)
}

/// The factor form of a popularity list: no users, no factors, item bias = count.
pub fn popularity_model(popularity: &[f64], scale: crate::data::RatingScale) -> FactorModel {
    let mid = (scale.min + scale.max) / 2.0;
    let mut m = FactorModel::zeros(0, popularity.len(), 0, mid, scale);
    for (b, &p) in m.item_bias.iter_mut().zip(popularity) {
        *b = p;
    }
    m
}

/// The DP popularity list of released counts `noisy` (post-processing): candidates are
/// the items whose count reaches `min_count`, by count; the rest fill a list in the
/// order of the same counts.
pub fn dp_popularity_ranker(noisy: Vec<f64>, min_count: f64) -> ItemRanker {
    let n = noisy.len();
    let candidates = dp_topn::select_candidates(&noisy, min_count, n);
    let pop: Vec<f64> = candidates.iter().map(|&j| noisy[j as usize]).collect();
    ItemRanker::new(n, candidates, pop, ItemScorer::Popularity, 0.0).with_fill(noisy)
}

fn fitted(model: FactorModel, ranker: ItemRanker) -> Fitted {
    Fitted {
        ranker: Some(std::sync::Arc::new(ranker)),
        ..Fitted::non_private(model)
    }
}

/// Most popular items by exact training counts (non-private).
#[derive(Debug, Clone, Default)]
pub struct Popularity;

impl Trainer for Popularity {
    fn name(&self) -> &'static str {
        "popularity"
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({})
    }
    fn guarantee(&self) -> Guarantee {
        Guarantee::NonPrivate
    }
    fn fit(&self, data: &TrainData<'_>, _rng: &mut DpRng) -> Result<Fitted, TrainError> {
        if data.ratings.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let c = counts(data);
        let all: Vec<u32> = (0..c.len() as u32).collect();
        let r = ItemRanker::new(c.len(), all, c.clone(), ItemScorer::Popularity, 0.0);
        Ok(fitted(item_model(data, &c), r))
    }
}

impl Popularity {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        p.reject_unknown("popularity")?;
        Ok(Self)
    }
}

/// Most popular items by DP counts: `dp-topn`'s count step with the whole budget.
#[derive(Debug, Clone)]
pub struct DpPopularity {
    pub inner: DpTopN,
}

impl DpPopularity {
    /// Parameters: `eps`, `delta`, `releases` (the plan; default the service's, as for
    /// `dp-topn`: 52 releases in eps_u 10, delta_u 1e-6), `cap`, `count_clip`, `liked`
    /// (default `all`: every rating counts 1) and `unliked_weight` (with `liked=top`),
    /// `threshold`, `delta_r`, `eps_r` (default the served first-release share, `none`:
    /// full part), `noise_factor`, `combine_releases` (default `true`: in the service the
    /// counts served combine the earlier releases', as `dp-topn`'s).
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let d = DpTopN::default();
        let eps_r = dp_topn::eps_r_param(p, d.eps_r)?;
        let inner = DpTopN {
            plan: ReleasePlan {
                eps_u: p.positive("eps", d.plan.eps_u)?,
                delta_u: p.positive("delta", d.plan.delta_u)?,
                releases: p.usize_in("releases", d.plan.releases as usize, 1, 1_000_000)? as u64,
            },
            count_share: 1.0,
            // Nothing follows the counts (a counts-only release spends it all).
            split: dp_topn::Split::Gram,
            contribution: Contribution {
                cap: p.usize_in("cap", d.contribution.cap, 1, 1 << 24)?,
                count_clip: p.positive("count_clip", d.contribution.count_clip)?,
                unliked_weight: p.non_negative("unliked_weight", d.contribution.unliked_weight)?,
                ..d.contribution
            },
            // The plain reference counts every rating (`liked=top`: the liked ones only).
            liked: Liked::from_params(p, Liked::All)?,
            threshold: p.non_negative("threshold", 0.0)?,
            delta_r: p.positive("delta_r", d.delta_r)?,
            eps_r,
            // As for dp-topn: 1 at the default plan; `eval` repeats a service's factor
            // for a stricter plan with it.
            noise_factor: p.positive("noise_factor", 1.0)?,
            combine_releases: p.bool("combine_releases", d.combine_releases)?,
            ..d
        };
        p.reject_unknown("dp-popularity")?;
        inner.contribution.check_weights(&inner.liked)?;
        if inner.noise_factor < 1.0 {
            return Err(TrainError::Param(crate::train::ParamError::Invalid {
                key: "noise_factor".into(),
                reason: "must be >= 1 (it only adds noise)".into(),
            }));
        }
        if !(inner.plan.delta_u < 1.0 && inner.delta_r < 1.0) {
            return Err(TrainError::Param(crate::train::ParamError::Invalid {
                key: "delta".into(),
                reason: "must be in (0, 1)".into(),
            }));
        }
        Ok(Self { inner })
    }
}

impl Trainer for DpPopularity {
    fn name(&self) -> &'static str {
        "dp-popularity"
    }
    fn params(&self) -> serde_json::Value {
        let t = &self.inner;
        serde_json::json!({
            "eps": t.plan.eps_u, "delta": t.plan.delta_u, "releases": t.plan.releases,
            "cap": t.contribution.cap, "count_clip": t.contribution.count_clip,
            "threshold": t.threshold, "delta_r": t.delta_r, "eps_r": t.eps_r,
            "noise_factor": t.noise_factor, "liked": t.liked.param(),
            "unliked_weight": t.contribution.unliked_weight,
            "combine_releases": t.combine_releases,
        })
    }
    fn guarantee(&self) -> Guarantee {
        Guarantee::Proven
    }
    fn planned_user_event(&self) -> Option<PrivacyEvent> {
        self.inner.planned_user_event()
    }
    fn user_level_event(&self, max_ratings: u64) -> Option<PrivacyEvent> {
        self.inner.user_level_event(max_ratings)
    }
    /// The counts alone: the rating-level multiplier without the Gram term.
    fn rating_cap(&self) -> Option<f64> {
        let (_, z_c, _) = self.inner.multipliers().ok()?;
        let z_r = dp_topn::rating_multiplier(z_c, f64::INFINITY, &self.inner.contribution);
        dp_topn::rating_eps(1.0, z_r, self.inner.delta_r).ok()
    }
    fn scaled(&self, factor: f64) -> Option<Box<dyn Trainer>> {
        (factor.is_finite() && factor >= 1.0).then(|| {
            let mut inner = self.inner.clone();
            inner.noise_factor *= factor;
            Box::new(Self { inner }) as Box<dyn Trainer>
        })
    }
    fn publishes_popularity(&self) -> bool {
        true
    }
    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        let mut rel = self.inner.release_counts_only(data, rng)?;
        let history = self.inner.combine_counts(&mut rel, data)?;
        let r = dp_popularity_ranker(
            rel.noisy_counts.clone(),
            self.inner.threshold * rel.sigma_count,
        )
        .with_history(history);
        Ok(Fitted {
            model: item_model(data, &rel.noisy_counts),
            charges: rel.charges,
            guarantee: Guarantee::Proven,
            ranker: Some(std::sync::Arc::new(r)),
        })
    }
}

/// EASE on the exact binary Gram of the whole catalogue (non-private reference).
#[derive(Debug, Clone)]
pub struct Ease {
    pub lambda: f64,
}

impl Ease {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let lambda = p.positive("lambda", 300.0)?;
        p.reject_unknown("ease")?;
        Ok(Self { lambda })
    }
}

impl Trainer for Ease {
    fn name(&self) -> &'static str {
        "ease"
    }
    fn params(&self) -> serde_json::Value {
        serde_json::json!({ "lambda": self.lambda })
    }
    fn guarantee(&self) -> Guarantee {
        Guarantee::NonPrivate
    }
    fn fit(&self, data: &TrainData<'_>, _rng: &mut DpRng) -> Result<Fitted, TrainError> {
        if data.ratings.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let n = data.matrix.n_items;
        let rows: Vec<Vec<u32>> = (0..data.matrix.n_users)
            .map(|u| data.matrix.by_user.row(u).0.to_vec())
            .collect();
        let all: Vec<u32> = (0..n as u32).collect();
        // Binary rows, unclipped: a clip above any row norm.
        let g = dp_topn::gram(&rows, n, &all, f64::INFINITY);
        let b = dp_topn::ease_weights(&g, n, self.lambda)?;
        let c = counts(data);
        let r = ItemRanker::new(n, all, c.clone(), ItemScorer::ItemItem { b }, 0.0);
        Ok(fitted(item_model(data, &c), r))
    }
}
