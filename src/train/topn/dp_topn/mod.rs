//! `dp-topn`: the DP top-N trainer (DESIGN 5, issue 13). Proof and parameters:
//! docs/privacy/dp-topn.md.
//!
//! One release, pure (no I/O), every parameter public (configuration and release plan):
//! 1. Noise from the plan, before any data is seen: the per-release user-level noise
//!    multiplier `z` is calibrated through the accountant so that `releases` Gaussian
//!    releases fit the user's Renyi filter of `(eps_u, delta_u)`, the service's own
//!    admission rule ([`ReleasePlan::noise_multiplier`]); the
//!    count step gets `z_c = z / sqrt(count_share)`, the Gram step
//!    `z_g = z / sqrt(1 - count_share)` (two Gaussians compose to one of multiplier `z`).
//! 2. Rating level (PDP): each rating `r` with release budget `b_r > 0` is kept with the
//!    RSM probability `pi_r`, the largest rate at which the Poisson-subsampled Gaussian of
//!    the rating-level multiplier `z_r` ([`rating_multiplier`]) costs at most `b_r` at
//!    the public `delta_r` ([`rsm_rate`]); the rating is charged that eps.
//! 3. User level: of the kept ratings, at most `cap` per user (the smallest digests under
//!    the release's secret subset key, [`SubsetKey`]: a uniformly random subset for a
//!    random function, and the same rows whoever computes them). The user's binary row
//!    `y_u` is clipped to L2 norm `count_clip` for the counts and, restricted to the
//!    candidates, to `gram_clip` for the Gram.
//! 4. DP counts: `sum_u clip(y_u)` + N(0, (z_c count_clip)^2) on every item.
//! 5. Candidates: items whose noisy count is at least `threshold` count-noise standard
//!    deviations, the `k` largest (post-processing of step 4).
//! 6. DP Gram over the candidates: `sum_u x_u x_u^T` with `||x_u|| <= gram_clip`, plus
//!    symmetric Gaussian noise N(0, (z_g gram_clip^2)^2) on the upper triangle.
//! 7. Post-processing: the EASE solve `B = I - P / diag(P)`, `P = (G + lambda I)^-1`
//!    (scores `x_u B`), its ridge in noise edges of the released Gram; published with
//!    the DP counts (popularity fallback and the `pop_weight` shrinkage) and, as the DP
//!    item profiles, the Gram's eigenvectors above its noise edge.
//!
//! Charges: every user with an offered rating gets `Gaussian { z, 1 }` at user level
//! (the release's planned event); every offered rating its RSM-amplified eps at
//! `delta_r` ([`ReleaseCharges::ratings`]). The noise-scale test is
//! `dp_topn::tests::gram_and_count_noise_have_the_planned_scale`.

use std::collections::HashMap;

use rayon::prelude::*;

use crate::model::count_prior::log_posterior_means;
use crate::model::history::{drift_for, CountHistory, GramState};
use crate::model::item_ranker::{ItemRanker, ItemScorer, Neighbours, NEIGHBOURS};
use crate::model::labels::{ItemLabels, LabelLift, LabelledRanker};
use crate::model::Ranker;
use crate::numerics::sym_eigen::{spd_inverse, top_eigen};
use crate::train::topn::contribution::{Contribution, Liked};
use crate::train::topn::label_stats::{self, LabelRelease};
use crate::train::topn::selection::{loo_values, noised_difference, select_rest_is_gram, ListHits};
use crate::train::topn::suffstats::{
    candidate_positions, coin, CountSums, GramSums, InProcess, StatsSource, SubsetKey,
};
use crate::train::PerRating;
use crate::train::{invalid, numerical};
use crate::train::{FactorModel, Fitted, Guarantee, Params, TrainData, TrainError, Trainer};
use dprec_dp::accountant::plan::calibrate_gaussian;
pub use dprec_dp::accountant::stages::compose_multipliers;
use dprec_dp::accountant::stages::{check_release, GaussianStage};
use dprec_dp::accountant::{LifetimePlan, PrivacyEvent};
use dprec_dp::charges::{
    MechanismRecord, Neighbour, PrivacyUnit, RatingCharge, RatingRho, RatingRhos, ReleaseCharges,
    UserCharge,
};
use dprec_dp::privacy::continuous::gaussian;
use dprec_dp::rng::DpRng;

mod plan;
mod rating;
mod sample;
mod select;
mod solve;
mod split;
mod stages;

pub use plan::*;
pub use rating::*;
pub use sample::*;
use select::*;
pub use solve::*;
pub use split::*;
pub use stages::*;

/// Hyper-parameters of `dp-topn` (all public).
#[derive(Debug, Clone)]
pub struct DpTopN {
    pub plan: ReleasePlan,
    /// Share of the release's user-level RDP spent on the counts.
    pub count_share: f64,
    /// What the rest is spent on.
    pub split: Split,
    pub contribution: Contribution,
    /// At most this many candidates.
    pub k: usize,
    /// A candidate's noisy count must reach this many count-noise standard deviations.
    pub threshold: f64,
    /// EASE's ridge in noise edges of the released Gram (`split=gram`; the selecting
    /// rule has its own, `select_edges`).
    pub lambda_edges: f64,
    /// Weight of the normalised DP popularity added to the personal scores.
    pub pop_weight: f64,
    /// Public delta at which rating-level RDP is converted to the eps charged.
    pub delta_r: f64,
    /// Per-rating budget of the release when the ledger gives none (the default: what the
    /// service gives a default rating on its first release, [`served_eps_r`]); `None`:
    /// every rating takes full part and is charged what that costs.
    pub eps_r: Option<f64>,
    /// Multiplies the plan's noise multiplier (>= 1): set by [`Trainer::scaled`] when the
    /// service's lifetime plan needs more noise than this trainer's own `plan` (1 at the
    /// default plan: both are calibrated through the same Renyi filter).
    pub noise_factor: f64,
    /// Which ratings a release counts.
    pub liked: Liked,
    /// Whether the served counts combine this release's with the earlier releases'
    /// ([`history`](crate::model::history); post-processing, no charge).
    pub combine_releases: bool,
    /// The public catalogue labels of the release's items, when the catalogue has them
    /// ([`Trainer::with_item_labels`]; not a parameter: public input). With them a
    /// release draws the label statistic and may publish a label model
    /// (docs/privacy/labels.md); without them it runs exactly as before.
    pub item_labels: Option<std::sync::Arc<ItemLabels>>,
    /// `labels` (`on`, the default; `off`): use the catalogue's public labels, when it
    /// has them (the label statistic and model).
    pub use_labels: bool,
    /// `label_prior`: the label model's prior strength in units of the release's
    /// estimate `alpha` (>= 1; default [`Self::DEFAULT_LABEL_PRIOR`]). The estimate fits
    /// the spread of users' label shares; ranking against DP counts, whose noise leaves
    /// most of a catalogue's popularity unknown, needs a user's labels trusted less
    /// (docs/privacy/labels.md, "The prior's strength").
    pub label_prior: f64,
}

impl Default for DpTopN {
    fn default() -> Self {
        Self {
            plan: ReleasePlan::served(),
            count_share: 0.2,
            split: Split::DEFAULT,
            contribution: Contribution {
                cap: 256,
                count_clip: 4.0,
                gram_clip: 1.0,
                liked_min: None,
                unliked_weight: 0.5,
            },
            k: 200,
            threshold: 2.0,
            lambda_edges: Self::DEFAULT_EDGES,
            pop_weight: 0.0,
            delta_r: dprec_dp::ledger::RATING_DELTA,
            eps_r: served_eps_r(),
            noise_factor: 1.0,
            liked: Liked::DEFAULT,
            combine_releases: true,
            item_labels: None,
            use_labels: true,
            label_prior: Self::DEFAULT_LABEL_PRIOR,
        }
    }
}

/// `labels` (`on` or `off`) and, with labels on, `label_prior` (>= 1).
fn label_params(p: &Params, d: &DpTopN) -> Result<(bool, f64), TrainError> {
    let on = match p.get_str("labels") {
        None => d.use_labels,
        Some("off") => false,
        Some("on") => true,
        Some(other) => return Err(invalid("labels", format!("{other:?} is not on or off"))),
    };
    if !on {
        return Ok((false, d.label_prior));
    }
    let prior = p.positive("label_prior", d.label_prior)?;
    if prior < 1.0 {
        return Err(invalid(
            "label_prior",
            "must be >= 1 (it only weakens the label model)",
        ));
    }
    Ok((true, prior))
}

/// What one release computed before post-processing (kept for tests and the service).
#[derive(Debug, Clone)]
pub struct GramRelease {
    pub noisy_counts: Vec<f64>,
    pub candidates: Vec<u32>,
    /// Noisy Gram over `candidates`, row-major `K x K`.
    pub gram: Vec<f64>,
    pub charges: ReleaseCharges,
    /// Noise standard deviations actually used (counts, Gram entries).
    pub sigma_count: f64,
    pub sigma_gram: f64,
    /// `split=select`: the state to carry on after this release (its Gram added, its
    /// noised difference drawn); `combine_counts` attaches it to the counts' state.
    pub select: Option<GramState>,
    /// The label statistic, on a catalogue with labels ([`label_stats`]).
    pub labels: Option<LabelRelease>,
}

impl DpTopN {
    /// The default ridge of `split=gram`'s EASE: two noise edges
    /// (lab note eval-06, "Liked counts and EASE on the DP Gram": chosen on the 5M-rating
    /// ML-20M-taste scale, reported on every shape).
    pub const DEFAULT_EDGES: f64 = 2.0;

    /// The default `label_prior`: four times the estimated prior strength. Chosen on the
    /// label shapes (docs/QUALITY.md, "Public labels"): at 1 the label model ranks below
    /// DP popularity on heavy raters over a wide catalogue and on half-informative labels
    /// (first release, worst seeds 0.91x and 0.97x); at 4 every shape's mean is above it,
    /// its worst seeds within the DP counts' own spread, at a cost of 2-3% on
    /// MovieLens-100K and on strong-taste stores (whose best is 1-2).
    pub const DEFAULT_LABEL_PRIOR: f64 = 4.0;

    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let d = Self::default();
        let eps_r = eps_r_param(p, d.eps_r)?;
        let split = Split::from_params(p)?;
        let mut t = Self {
            plan: ReleasePlan {
                eps_u: p.positive("eps", d.plan.eps_u)?,
                delta_u: p.positive("delta", d.plan.delta_u)?,
                releases: p.usize_in("releases", d.plan.releases as usize, 1, 1_000_000)? as u64,
            },
            count_share: p.positive("count_share", d.count_share)?,
            split,
            contribution: Contribution {
                cap: p.usize_in("cap", d.contribution.cap, 1, 1 << 24)?,
                count_clip: p.positive("count_clip", d.contribution.count_clip)?,
                gram_clip: p.positive("gram_clip", d.contribution.gram_clip)?,
                liked_min: None,
                unliked_weight: p.non_negative("unliked_weight", d.contribution.unliked_weight)?,
            },
            k: p.usize_in("k", d.k, 1, 8192)?,
            threshold: p.non_negative("threshold", d.threshold)?,
            lambda_edges: if split == Split::Gram {
                p.positive("lambda_edges", d.lambda_edges)?
            } else {
                d.lambda_edges
            },
            pop_weight: p.non_negative("pop_weight", d.pop_weight)?,
            delta_r: p.positive("delta_r", d.delta_r)?,
            eps_r,
            // The service sets it through `scaled` when its plan is stricter than `plan`
            // (never at the default plan); as a parameter it lets `eval` repeat such a
            // release (its params show the factor).
            noise_factor: p.positive("noise_factor", 1.0)?,
            liked: Liked::from_params(p, d.liked)?,
            combine_releases: p.bool("combine_releases", d.combine_releases)?,
            item_labels: None,
            use_labels: d.use_labels,
            label_prior: d.label_prior,
        };
        (t.use_labels, t.label_prior) = label_params(p, &d)?;
        p.reject_unknown("dp-topn")?;
        if t.noise_factor < 1.0 {
            return Err(invalid("noise_factor", "must be >= 1 (it only adds noise)"));
        }
        t.contribution.check_weights(&t.liked)?;
        if t.count_share.is_nan() || t.count_share >= 1.0 {
            return Err(invalid("count_share", "must be in (0, 1)"));
        }
        if t.count_share + t.split.steering_share() >= 1.0 {
            return Err(invalid(
                "select_share",
                format!(
                    "count_share + select_share must be below 1 (they are \
                     {} + {})",
                    t.count_share,
                    t.split.steering_share()
                ),
            ));
        }
        if matches!(t.split, Split::Select { .. }) && !t.combine_releases {
            return Err(invalid(
                "combine_releases",
                "split=select carries its state across releases with the counts",
            ));
        }
        if !(t.plan.delta_u < 1.0 && t.delta_r < 1.0) {
            return Err(invalid("delta", "must be in (0, 1)"));
        }
        Ok(t)
    }

    /// The per-release user-level multipliers `(z, z_c, z_g)` from the plan (times
    /// `noise_factor`): `z_g` is the multiplier of what follows the counts (the Gram or
    /// the second count release).
    pub fn multipliers(&self) -> Result<(f64, f64, f64), TrainError> {
        let z = self.plan.noise_multiplier()? * self.noise_factor;
        let (count, rest) = self.shares();
        Ok((z, z / count.sqrt(), z / rest.max(0.0).sqrt()))
    }

    /// The user-level shares `(counts, rest)` of a release (the steering step takes
    /// [`Split::steering_share`]). A selecting release keeps the rating-level multiplier
    /// of the trace rule it replaced at the same `count_share` ([`Split::TRACE_RULE_SHARE`]) (so that a rating at the service's
    /// default `eps_ij` takes full part, and is not RSM-sampled): its statistic costs four
    /// times its share at the rating level (sensitivity 2 against 1), so the rest takes
    /// what the rating level leaves and the counts, cheap at the rating level, take the
    /// remaining user-level share (docs/privacy/dp-topn.md 2b). Where that has no solution
    /// above `count_share`, the shares are `count_share` and the remainder.
    pub fn shares(&self) -> (f64, f64) {
        let c = self.count_share;
        let plain = (c, 1.0 - c - self.split.steering_share());
        let Split::Select { share: s, .. } = self.split else {
            return plain;
        };
        let k = &self.contribution;
        let (count_loss, rest_loss) = rating_losses_per_share(k);
        let t = Split::TRACE_RULE_SHARE;
        let target = traced_rating_multiplier(
            1.0 / c.sqrt(),
            1.0 / t.sqrt(),
            1.0 / (1.0 - c - t).max(0.0).sqrt(),
            k,
        );
        // Solve count + rest = 1 - s and count_loss count + 4 s + rest_loss rest = target^-2;
        // a relative margin keeps the rounding on the side of a larger multiplier.
        let count = (target.powi(-2) * (1.0 - 1e-12) - 4.0 * s - rest_loss * (1.0 - s))
            / (count_loss - rest_loss);
        if count.is_finite() && count >= c && count < 1.0 - s {
            (count, 1.0 - s - count)
        } else {
            plain
        }
    }

    /// The selection statistic's multiplier `z_s = z / sqrt(select_share)` (select only).
    pub fn select_multiplier(&self) -> Result<Option<f64>, TrainError> {
        self.share_multiplier(self.split.select_share())
    }

    /// `z / sqrt(share)` for a step given `share` of the release (`None` at 0).
    fn share_multiplier(&self, share: f64) -> Result<Option<f64>, TrainError> {
        if share == 0.0 {
            return Ok(None);
        }
        Ok(Some(
            self.plan.noise_multiplier()? * self.noise_factor / share.sqrt(),
        ))
    }

    /// The rating-level multiplier of a full release (`with_gram`) or of the counts alone.
    pub fn rating_z(&self, with_gram: bool) -> Result<f64, TrainError> {
        let (_, z_c, z_g) = self.multipliers()?;
        let c = &self.contribution;
        Ok(match (with_gram, self.split) {
            (false, _) => rating_multiplier(z_c, f64::INFINITY, c),
            (true, Split::Gram) => rating_multiplier(z_c, z_g, c),
            (true, Split::Select { .. }) => {
                let z_s = self.select_multiplier()?.unwrap_or(f64::INFINITY);
                select_rating_multiplier(z_c, z_s, z_g, c)
            }
            // The second counts, at the larger of the rest's two rating-level losses.
            (true, Split::Counts) => steered_rating_multiplier(z_c, f64::INFINITY, z_g, c),
        })
    }

    /// Steps 1-6: sample, DP counts, candidates, DP Gram, and the charges.
    pub fn release(
        &self,
        data: &TrainData<'_>,
        rng: &mut DpRng,
    ) -> Result<GramRelease, TrainError> {
        self.release_steps(data, None, rng, true)
    }

    /// [`DpTopN::release`] with the sums computed by `source` (a database, or shards
    /// merged) instead of the trainer's own rows: the trainer still draws the subset key,
    /// the sample (for the charges) and every noise, once, on the merged sums. `source`
    /// must hold the same ratings as `data`; with the same generator the release equals
    /// the in-process one up to the floating tolerance of the Gram sums.
    pub fn release_with_source(
        &self,
        data: &TrainData<'_>,
        source: &dyn StatsSource,
        rng: &mut DpRng,
    ) -> Result<GramRelease, TrainError> {
        self.release_steps(data, Some(source), rng, true)
    }

    /// Steps 1-4 only (DP popularity): the counts get the whole user-level budget, so
    /// `count_share` must be 1; no candidates, no Gram.
    pub fn release_counts_only(
        &self,
        data: &TrainData<'_>,
        rng: &mut DpRng,
    ) -> Result<GramRelease, TrainError> {
        self.release_steps(data, None, rng, false)
    }

    // long: the release's steps in order, each a call; its record names a dozen locals.
    fn release_steps(
        &self,
        data: &TrainData<'_>,
        source: Option<&dyn StatsSource>,
        rng: &mut DpRng,
        with_gram: bool,
    ) -> Result<GramRelease, TrainError> {
        // No ratings is a valid input: the release is noise (counts, candidates and
        // Gram of nothing), charges nobody, and runs like any other, so that whether a
        // release exists does not tell an empty store from one with a rating.
        let budgets = data.release_budgets(self.eps_r)?;
        let (z, z_c, z_g) = self.multipliers()?;
        if !with_gram && self.count_share != 1.0 {
            return Err(invalid(
                "count_share",
                "a counts-only release spends it all",
            ));
        }
        self.contribution.check_weights(&self.liked)?;
        let c = Contribution {
            liked_min: self.liked.min_value(data.scale),
            ..self.contribution
        };
        // Without the Gram step its term vanishes (z_g = inf).
        let z_r = self.rating_z(with_gram)?;
        // The subset key and the noise from two streams split off the release's generator
        // before any data is read: the noise draws never depend on the data (issue 8
        // finding 1: a new user must not shift the noise).
        let (mut sampling, mut noise) = (dprec_dp::rng::split(rng), dprec_dp::rng::split(rng));
        let key = SubsetKey::draw(&mut sampling);
        let sample = sample_ratings(data, budgets, z_r, self.delta_r, c.cap, c.liked_min, &key)?;
        let n_items = data.matrix.n_items;
        let local = InProcess {
            liked: &sample.liked,
            ..InProcess::one(&sample.rows, &key, n_items)
        };
        let stats = Stats {
            source: source.unwrap_or(&local),
            key: &key,
        };
        let sigma_count = z_c * c.count_clip;
        let bits = count_grid_bits(sigma_count, c.cap)?;
        let noisy = counts_from_sums(&stats.counts(&c, bits, n_items)?, sigma_count, &mut noise)?;
        // Every Gaussian statistic drawn, in order: composed and checked against the
        // charges below before anything is returned.
        let mut stages = vec![count_stage("counts", sigma_count, &c)];
        let mut candidates = if with_gram {
            select_candidates(&noisy, self.threshold * sigma_count, self.k)
        } else {
            Vec::new()
        };
        let prior_gram = match self.prior_gram(data) {
            Some(g) if self.held_is_stale(data, g, &noisy, sigma_count)? => None,
            g => g,
        };
        // The rest's multiplier: `z_g`, but for a selecting release without a state, whose
        // trace test needs only a sliver of the steering share (`stateless_multipliers`).
        let mut z_rest = z_g;
        let (branch, trace) = match (with_gram, self.split) {
            (false, _) => (None, None),
            (true, Split::Select { .. }) if prior_gram.is_none() => {
                // No selecting state yet: nothing to compare, so the steering share pays
                // for the trace test instead, and what the test does not need goes to the
                // rest (docs/privacy/dp-topn.md 2b).
                let (z_t, z_r) = self.stateless_multipliers()?;
                z_rest = self.rest_after_labels(z, z_r)?;
                let (b, t) = self.trace_choice(
                    &stats,
                    &noisy,
                    &candidates,
                    (Split::TRACE_TAU, z_t, z_rest),
                    (&mut noise, &mut stages),
                )?;
                (Some(b), t)
            }
            (true, Split::Select { .. }) => {
                z_rest = self.rest_after_labels(z, z_rest)?;
                let b = self.select_rest(data, prior_gram, &noisy, sigma_count)?;
                if let Some(held) = &b {
                    candidates.clone_from(held);
                }
                (
                    Some(if b.is_some() {
                        Split::Gram
                    } else {
                        Split::Counts
                    }),
                    None,
                )
            }
            (true, split) => {
                z_rest = self.rest_after_labels(z, z_rest)?;
                (Some(split), None)
            }
        };
        // The label statistic (public labels only; its shares come out of the rest).
        let labels = match (&self.item_labels, branch) {
            (Some(l), Some(_)) => Some(label_stats::release(
                l,
                &noisy,
                &sample.rows,
                (
                    z / label_stats::EXCESS_SHARE.sqrt(),
                    z / label_stats::SIZE_SHARE.sqrt(),
                    c.cap,
                ),
                &mut noise,
                &mut stages,
            )?),
            _ => None,
        };
        let (counts, g, sigma_count, sigma_gram) = match branch {
            None => (noisy, Vec::new(), sigma_count, f64::INFINITY),
            Some(Split::Counts) => {
                let (pooled, sigma) =
                    self.second_counts(&stats, &noisy, n_items, z_rest, (&mut noise, &mut stages))?;
                candidates = select_candidates(&pooled, self.threshold * sigma, self.k);
                (pooled, Vec::new(), sigma, f64::INFINITY)
            }
            Some(_) => {
                let (g, sigma_gram) =
                    self.noisy_gram(&stats, &candidates, z_rest, (&mut noise, &mut stages))?;
                (noisy, g, sigma_count, sigma_gram)
            }
        };

        let (select, select_record) = if with_gram && self.split.select_share() > 0.0 {
            let step = SelectStep {
                sample: &sample,
                key: &key,
                prior: prior_gram,
                counts: &counts,
                sigma_count,
                candidates: &candidates,
                gram: &g,
                sigma_gram,
            };
            let state = self.select_step(data, &step, (&mut noise, &mut stages))?;
            let record = self.select_record(&state)?;
            (Some(state), Some(record))
        } else {
            (None, None)
        };
        // What ran is what is charged: the stages compose to the planned user-level event
        // and to at least the rating-level multiplier the sample was charged for.
        check_release(&stages, z, z_r).map_err(numerical)?;
        let user_event = PrivacyEvent::gaussian(z, 1).map_err(numerical)?;
        let params = serde_json::json!({
            "select": select_record,
            "plan": self.plan, "contribution": c, "count_share": self.count_share,
            "shares": { "count": self.shares().0, "rest": (z / z_rest).powi(2) },
            "split": self.split, "spent_on": match branch {
                None => "counts-only", Some(Split::Counts) => "counts", Some(_) => "gram",
            },
            "trace": trace,
            "z": z, "z_count": z_c, "z_gram": z_rest, "sigma_count": sigma_count,
            "sigma_gram": sigma_gram, "k": self.k, "threshold_sd": self.threshold,
            "rating_multiplier": z_r, "delta_r": self.delta_r,
        });
        let mut params = params;
        if let Some(l) = &labels {
            // Only the decision and the rounded prior strength: the noisy sums are
            // float-noised values, never published (docs/privacy/mechanisms.md).
            params["labels"] = serde_json::json!({
                "sd_excess": l.sd_excess, "sd_size": l.sd_size,
                "margin": label_stats::MARGIN, "alpha": l.alpha, "prior": self.label_prior,
            });
        }
        let name = mechanism_name(branch, self.split);
        let charges = release_charges(sample, params, &user_event, name);
        Ok(GramRelease {
            noisy_counts: counts,
            candidates,
            gram: g,
            charges,
            sigma_count,
            sigma_gram,
            select,
            labels,
        })
    }

    /// The rest's multiplier once the label statistic took its shares out of it
    /// ([`label_stats::EXCESS_SHARE`] + [`label_stats::SIZE_SHARE`]); unchanged without
    /// labels.
    fn rest_after_labels(&self, z: f64, z_rest: f64) -> Result<f64, TrainError> {
        if self.item_labels.is_none() {
            return Ok(z_rest);
        }
        let left = (z / z_rest).powi(2) - label_stats::EXCESS_SHARE - label_stats::SIZE_SHARE;
        if left.is_nan() || left <= 0.0 {
            return Err(invalid(
                "count_share",
                "no share left for the rest beside the labels",
            ));
        }
        Ok(z / left.sqrt())
    }

    /// The served ranker, with the label model when the release's label statistic
    /// published one.
    fn labelled(
        &self,
        ranker: ItemRanker,
        labels: Option<&LabelRelease>,
        sigma_count: f64,
    ) -> std::sync::Arc<dyn crate::model::Ranker> {
        match self.label_lift(&ranker, labels, sigma_count) {
            Some(lift) => std::sync::Arc::new(LabelledRanker {
                inner: ranker,
                lift,
            }),
            None => std::sync::Arc::new(ranker),
        }
    }

    /// The label model over `ranker`'s counts, when the release's label statistic
    /// published a prior strength: the posterior means of the served counts and their
    /// label shares (post-processing), and the release's prior strength times
    /// `label_prior`.
    fn label_lift(
        &self,
        ranker: &ItemRanker,
        labels: Option<&LabelRelease>,
        sigma_count: f64,
    ) -> Option<LabelLift> {
        let l = self.item_labels.as_ref()?;
        let alpha = labels.and_then(|r| r.alpha)?;
        let counts = ranker.popularity_counts().unwrap_or_default();
        // Each served count's noise sd: the filter's where counts are combined.
        let sd: Vec<f64> = match ranker.count_history() {
            Some(h) if h.var.len() == counts.len() => h.var.iter().map(|v| v.sqrt()).collect(),
            _ => vec![sigma_count; counts.len()],
        };
        let base = log_posterior_means(&counts, &sd)?;
        let means: Vec<f64> = base.iter().map(|b| b.exp()).collect();
        Some(LabelLift {
            item_labels: l.per_item.clone(),
            share: l.base(&means)?.share,
            alpha: alpha * self.label_prior,
            base,
            names: l.names.clone(),
        })
    }

    /// What the counts count (the contribution rule on this scale): a release's counts
    /// are combined only with earlier counts of the same basis.
    pub fn count_basis(&self, scale: crate::data::RatingScale) -> String {
        let c = Contribution {
            liked_min: self.liked.min_value(scale),
            ..self.contribution
        };
        serde_json::to_string(&c).unwrap_or_default()
    }

    /// Step 6a (post-processing): the served counts combine this release's counts with
    /// the previous release's filter state (`data.prior_counts`, published outputs) by
    /// [`CountHistory::update`] at the plan's drift; where no Gram was released the
    /// candidates are re-selected from the combined counts at the same threshold. The
    /// candidates of a Gram release stay (the Gram is over them). Returns the state to
    /// publish (`None` when `combine_releases` is off).
    pub fn combine_counts(
        &self,
        rel: &mut GramRelease,
        data: &TrainData<'_>,
    ) -> Result<Option<CountHistory>, TrainError> {
        if !self.combine_releases {
            return Ok(None);
        }
        let h = CountHistory::update(
            data.prior_counts,
            &self.count_basis(data.scale),
            &rel.noisy_counts,
            rel.sigma_count,
            drift_for(self.plan.releases),
        )?;
        let mut h = h;
        h.gram = rel.select.take().map(Box::new);
        if h.releases > 1 {
            rel.noisy_counts.clone_from(&h.mean);
            if rel.gram.is_empty() && !rel.candidates.is_empty() {
                rel.candidates =
                    select_candidates(&h.mean, self.threshold * rel.sigma_count, self.k);
            }
        }
        Ok(Some(h))
    }
}

/// The mechanism record's name: what the release ran after the counts.
fn mechanism_name(branch: Option<Split>, split: Split) -> &'static str {
    match (branch, split) {
        (None, _) => "dp-topn-counts",
        (Some(_), Split::Gram) => "dp-topn-counts+gram",
        (Some(_), Split::Counts) => "dp-topn-counts+counts",
        (Some(Split::Gram), Split::Select { .. }) => "dp-topn-counts+select+gram",
        (Some(_), Split::Select { .. }) => "dp-topn-counts+select+counts",
    }
}

impl Trainer for DpTopN {
    fn name(&self) -> &'static str {
        "dp-topn"
    }

    /// The parameters this trainer uses, and only those: a split's own keys with it.
    fn params(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "eps": self.plan.eps_u, "delta": self.plan.delta_u, "releases": self.plan.releases,
            "count_share": self.count_share, "cap": self.contribution.cap,
            "count_clip": self.contribution.count_clip, "gram_clip": self.contribution.gram_clip,
            "k": self.k, "threshold": self.threshold,
            "pop_weight": self.pop_weight, "delta_r": self.delta_r,
            "eps_r": self.eps_r, "noise_factor": self.noise_factor,
            "liked": self.liked.param(), "unliked_weight": self.contribution.unliked_weight,
            "combine_releases": self.combine_releases,
        });
        // Labels are on by default; a release records them only where the catalogue had
        // labels to use (so a catalogue without them records what it always did).
        if !self.use_labels {
            v["labels"] = "off".into();
        } else if self.item_labels.is_some() {
            v["labels"] = "on".into();
            v["label_prior"] = self.label_prior.into();
        }
        match self.split {
            Split::Gram => {
                v["split"] = "gram".into();
                v["lambda_edges"] = self.lambda_edges.into();
            }
            Split::Counts => v["split"] = "counts".into(),
            Split::Select {
                share,
                explore,
                margin,
                edges,
                refresh,
            } => {
                v["split"] = "select".into();
                v["select_share"] = share.into();
                v["select_explore"] = explore.into();
                v["select_margin"] = margin.into();
                v["select_edges"] = edges.into();
                v["select_refresh"] = refresh.into();
            }
        }
        v
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Proven
    }

    fn planned_user_event(&self) -> Option<PrivacyEvent> {
        let (z, _, _) = self.multipliers().ok()?;
        PrivacyEvent::gaussian(z, 1).ok()
    }

    /// The counts and the Gram are one Gaussian of multiplier `z` for the add/remove of a
    /// whole user, whatever the user's number of ratings: the user's row is capped at
    /// `cap` ratings and norm-clipped before it enters either sum, so `m` plays no part.
    fn user_level_event(&self, _max_ratings: u64) -> Option<PrivacyEvent> {
        self.planned_user_event()
    }

    /// A rating kept at RSM rate 1 costs the rating-level Gaussian of [`rating_multiplier`]
    /// at `delta_r`; a rating sampled at a lower rate costs less.
    fn rating_cap(&self) -> Option<f64> {
        rating_eps(1.0, self.rating_z(true).ok()?, self.delta_r).ok()
    }

    fn scaled(&self, factor: f64) -> Option<Box<dyn Trainer>> {
        (factor.is_finite() && factor >= 1.0).then(|| {
            Box::new(Self {
                noise_factor: self.noise_factor * factor,
                ..self.clone()
            }) as Box<dyn Trainer>
        })
    }

    fn publishes_popularity(&self) -> bool {
        true
    }

    fn with_item_labels(&self, labels: std::sync::Arc<ItemLabels>) -> Option<Box<dyn Trainer>> {
        self.use_labels.then(|| -> Box<dyn Trainer> {
            Box::new(Self {
                item_labels: Some(labels),
                ..self.clone()
            })
        })
    }

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        let mut rel = self.release(data, rng)?;
        let history = self.combine_counts(&mut rel, data)?;
        if let Split::Select { margin, .. } = self.split {
            return self.fit_select(rel, history, margin, data);
        }
        let ranker = self.solve(&rel, data.matrix.n_items)?.with_history(history);
        let model = item_side_model(&ranker, &rel, data);
        Ok(Fitted {
            model,
            charges: rel.charges,
            guarantee: Guarantee::Proven,
            ranker: Some(self.labelled(ranker, rel.labels.as_ref(), rel.sigma_count)),
        })
    }
}

#[cfg(test)]
mod tests;
