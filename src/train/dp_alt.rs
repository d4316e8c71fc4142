//! `dp-alt`, the production trainer (DESIGN 5): DP item profiles and DP user profiles by
//! alternation, every step on inputs that are public or already DP, so the release's
//! privacy is the composition of the steps' charges and nothing else.
//!
//! One release:
//! 1. DP global mean (exact discrete Laplace on sum and count, [`dp_stats`]) at the public
//!    `mean_eps`, over the ratings whose release budget exceeds twice that, each charged
//!    `mean_eps`;
//! 2. a DP user step on data-independent random item features: user biases and a first,
//!    rough user profile;
//! 3. `rounds` times: a DP item step ([`objpert::dp_item_step`]: RSM sampling + objective
//!    perturbation at the PUBLIC threshold `t`, eta once per step) on the DP user profiles
//!    of the step before, with the DP user biases as offsets, spending `1/rounds` of what
//!    is left of each rating's budget; then a DP user step on the item profiles just
//!    released (public from then on);
//! 4. publish (global mean, user biases, item biases, user profiles, item profiles).
//!
//! Every parameter is public (issue 8, finding 4): `t` and `mean_eps` come from the
//! parameters (or the release plan), never from the eps_ij of the ratings present.
//!
//! Rating level (issue 8, finding 3): the Gaussian user steps touch a rating, so they
//! charge it: the RDP of all `(rounds + 1) J` Gaussian releases of one release, converted
//! at the public `delta_r` ([`DpAlt::user_steps_rating_eps`]). A rating takes part in the
//! user steps only if its own release budget pays for that with as much again to spare;
//! every user of the release gets a user-step release (noise only without usable ratings).
//!
//! The user step is chosen by `user_solver`:
//! - `ssp` ([`ssp::ssp_user_step`]): each user's ridge sufficient statistics
//!   (A_u = sum x_j x_j^T, b_u = sum y_uj x_j, `||x_j|| <= 1`, `|y_uj| <= clip_y`) released
//!   once with Gaussian noise of multiplier z, then solved with the public ridge `lambda_u`
//!   (post-processing). Parameters: `clip_y`, `lambda_u`, `user_bias` (weight b of the
//!   constant feature), `max_norm`. Item rows are clipped to norm 1 for the step and the
//!   clipped rows are published with the profiles.
//! - `gd` ([`gaussian_mf::dp_user_step`]): `user_steps` (J) noisy clipped gradient steps
//!   from 0. Parameters: `user_steps`, `user_lr`, `user_lr_decay`, `clip`, `lambda_u`,
//!   `max_norm`. Its public learning rate barely moves the latent part of the profiles of
//!   light users (the gradient is a sum over a private count), so latent factors give
//!   little; kept for comparison.
//!
//! Both take `user_sigma` (z), or `user_eps` + `user_delta` (default 1e-5), from which z is
//! calibrated through the accountant over ALL the Gaussian releases a user gets in one
//! release: `rounds + 1` for SSP, `(rounds + 1) J` for GD.
//!
//! Charges: per rating, the mean's eps plus each item step's `min(eps_k, t)`, whose sum is
//! at most the rating's budget for the release; per user, the item steps' and the mean's
//! pure-DP events and `rounds + 1` Gaussian user steps (`Gaussian { z, count: 1 }` each
//! for SSP, `Gaussian { z, count: J }` for GD). The user steps' noise multiplier is fixed
//! (or calibrated) before any data is seen, so [`Trainer::planned_user_event`]
//! (`Gaussian { z, rounds + 1 }`, resp. `Gaussian { z, (rounds + 1) J }`) is exactly the
//! composition of the Gaussian charges of every participating user. (The pure-DP charges
//! depend on the ratings' public budgets and are not part of the planned event.)

use ndarray::Array1;

use super::charges::{RatingCharge, ReleaseCharges};
use super::dp_stats;
use super::gaussian_mf::{self, UserNoise, UserOffsets, UserStepConfig, UserStepOutput};
use super::objpert::{self, ItemStepConfig};
use super::ssp::{self, SspConfig};
use super::{FactorModel, Fitted, Guarantee, Params, TrainData, TrainError, Trainer};
use crate::accountant::PrivacyEvent;
use crate::privacy::Threshold;
use crate::rng::DpRng;

/// Which DP user step `dp-alt` runs (both on the public item profiles of the step before).
#[derive(Debug, Clone, PartialEq)]
pub enum UserSolver {
    /// [`gaussian_mf::dp_user_step`]: J noisy clipped gradient steps per user, charged
    /// `Gaussian { z, count: J }` per user and step.
    Gd(UserStepConfig),
    /// [`ssp::ssp_user_step`]: one Gaussian release of the user's ridge sufficient
    /// statistics, charged `Gaussian { z, count: 1 }` per user and step.
    Ssp(SspConfig),
}

impl UserSolver {
    /// Gaussian releases per user in one user step (J for GD, 1 for SSP).
    pub fn releases_per_step(&self) -> usize {
        match self {
            UserSolver::Gd(c) => c.steps,
            UserSolver::Ssp(_) => 1,
        }
    }
}

/// Hyper-parameters of `dp-alt`.
#[derive(Debug, Clone)]
pub struct DpAlt {
    /// Per-rating budget of the release when the ledger gives none (`TrainData::budgets`).
    pub eps: f64,
    /// Latent dimension.
    pub d: usize,
    /// Item/user alternations after the first user step.
    pub rounds: usize,
    /// eps of the DP global mean (public, from configuration; 0 = no mean, the scale's
    /// midpoint). Only ratings whose release budget exceeds it take part in the mean.
    pub mean_eps: f64,
    /// The public delta_r at which the user steps' Gaussian RDP is converted to a
    /// per-rating eps (rating level, DESIGN 3).
    pub delta_r: f64,
    /// Item step: objective-perturbation settings (threshold, lambda_v, c, bias weight).
    pub item: ItemStepConfig,
    /// User steps: SSP or Gaussian gradient steps (noise multiplier fixed or calibrated).
    pub user: UserSolver,
}

impl Default for DpAlt {
    /// Tuned on MovieLens-100K (5 predefined folds; docs/privacy/gaussian-mf.md, section
    /// 6): SSP user steps with z = 1.5 (the two Gaussian releases of `rounds = 1` give a
    /// user eps of 4.42 at delta 1e-5 before the pure-DP charges), a bias-heavy item step.
    fn default() -> Self {
        Self {
            eps: 1.0,
            d: 1,
            rounds: 1,
            mean_eps: 0.005,
            delta_r: crate::ledger::RATING_DELTA,
            item: ItemStepConfig {
                // Public (DESIGN 2.6): never the mean or max of the eps_ij present.
                threshold: Threshold::Fixed(0.25),
                lambda_v: 2.0,
                jacobian_share: 0.2,
                loss_scale: 0.7,
                bias_weight: 0.95,
                mean: None,
            },
            user: UserSolver::Ssp(default_ssp()),
        }
    }
}

/// The GD user step's defaults in `dp-alt`.
fn default_gd() -> UserStepConfig {
    UserStepConfig {
        steps: 20,
        noise: UserNoise::Multiplier(4.0),
        ..UserStepConfig::default()
    }
}

/// The SSP user step's defaults in `dp-alt`.
fn default_ssp() -> SspConfig {
    SspConfig {
        noise_multiplier: 1.5,
        clip_y: 2.0,
        lambda_u: 10.0,
        bias_weight: 0.85,
        ..SspConfig::default()
    }
}

fn invalid(key: &str, reason: String) -> TrainError {
    TrainError::Param(super::ParamError::Invalid {
        key: key.to_owned(),
        reason,
    })
}

impl DpAlt {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let d = Self::default();
        let item = ItemStepConfig {
            threshold: public_threshold(p, d.item.threshold)?,
            lambda_v: p.positive("lambda_v", d.item.lambda_v)?,
            jacobian_share: p.non_negative("jacobian_share", d.item.jacobian_share)?,
            loss_scale: p.positive("c", d.item.loss_scale)?,
            bias_weight: p.non_negative("bias", d.item.bias_weight)?,
            mean: None,
        };
        item.validate()?;
        let rounds = p.usize_in("rounds", d.rounds, 1, 20)?;
        let user = user_solver_from_params(p, &d.user, rounds)?;
        let t = Self {
            eps: p.positive("eps", d.eps)?,
            d: p.usize_in("d", d.d, 1, 256)?,
            rounds,
            mean_eps: p.non_negative("mean_eps", d.mean_eps)?,
            delta_r: p.positive("delta_r", d.delta_r)?,
            item,
            user,
        };
        if t.delta_r >= 1.0 {
            return Err(invalid(
                "delta_r",
                format!("must be < 1, got {}", t.delta_r),
            ));
        }
        p.reject_unknown("dp-alt")?;
        Ok(t)
    }

    fn noise_multiplier(&self) -> f64 {
        match &self.user {
            UserSolver::Gd(c) => match c.noise {
                UserNoise::Multiplier(z) => z,
                // from_params always resolves a target to a multiplier.
                UserNoise::Target { .. } => unreachable!("calibrated in from_params"),
            },
            UserSolver::Ssp(c) => c.noise_multiplier,
        }
    }

    /// One DP user step with the configured solver.
    fn user_step(
        &self,
        by_user: &crate::data::Compressed,
        offsets: &UserOffsets<'_>,
        item_features: ndarray::ArrayView2<'_, f64>,
        eligible: &[bool],
        rng: &mut DpRng,
    ) -> Result<UserStepOutput, TrainError> {
        match &self.user {
            UserSolver::Gd(c) => {
                gaussian_mf::dp_user_step(by_user, offsets, item_features, Some(eligible), c, rng)
            }
            UserSolver::Ssp(c) => {
                ssp::ssp_user_step(by_user, offsets, item_features, Some(eligible), c, rng)
            }
        }
    }
}

impl Trainer for DpAlt {
    fn name(&self) -> &'static str {
        "dp-alt"
    }

    fn params(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "eps": self.eps, "d": self.d, "rounds": self.rounds, "mean_eps": self.mean_eps,
            "delta_r": self.delta_r,
            "threshold": format!("{:?}", self.item.threshold), "lambda_v": self.item.lambda_v,
            "jacobian_share": self.item.jacobian_share, "c": self.item.loss_scale,
            "bias": self.item.bias_weight, "user_sigma": self.noise_multiplier(),
        });
        let extra = match &self.user {
            UserSolver::Gd(u) => serde_json::json!({
                "user_solver": "gd", "user_steps": u.steps, "user_lr": u.lr,
                "user_lr_decay": u.lr_decay, "clip": u.clip, "lambda_u": u.lambda_u,
                "max_norm": u.max_norm,
            }),
            UserSolver::Ssp(u) => serde_json::json!({
                "user_solver": "ssp", "clip_y": u.clip_y, "lambda_u": u.lambda_u,
                "user_bias": u.bias_weight, "max_norm": u.max_norm,
            }),
        };
        if let (Some(m), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
            m.extend(e);
        }
        v
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Proven
    }

    fn planned_user_event(&self) -> Option<PrivacyEvent> {
        Some(PrivacyEvent::Gaussian {
            noise_multiplier: self.noise_multiplier(),
            count: ((self.rounds + 1) * self.user.releases_per_step()) as u64,
        })
    }

    /// Group privacy over the user's at most `m` ratings: each is charged at most
    /// `mean_eps + rounds t` by the pure-DP steps (so `PureDp(m (mean_eps + rounds t))`),
    /// and the user's sufficient statistics / clipped gradients move by at most `m` times
    /// the one-rating sensitivity (so `Gaussian { z / m }` for each user-step release).
    fn user_level_event(&self, m: u64) -> Option<PrivacyEvent> {
        let Threshold::Fixed(t) = self.item.threshold else {
            return None;
        };
        let m = m.max(1) as f64;
        let pure = m * (self.mean_eps + self.rounds as f64 * t);
        let count = ((self.rounds + 1) * self.user.releases_per_step()) as u64;
        Some(PrivacyEvent::Composed {
            events: vec![
                PrivacyEvent::PureDp {
                    eps: pure,
                    count: 1,
                },
                PrivacyEvent::Gaussian {
                    noise_multiplier: self.noise_multiplier() / m,
                    count,
                },
            ],
        })
    }

    fn rating_cap(&self) -> Option<f64> {
        let Threshold::Fixed(t) = self.item.threshold else {
            return None;
        };
        let g = self.user_steps_rating_eps().ok()?;
        Some(self.mean_eps + g + self.rounds as f64 * t)
    }

    fn scaled(&self, factor: f64) -> Option<Box<dyn Trainer>> {
        if !(factor.is_finite() && factor >= 1.0) {
            return None;
        }
        let Threshold::Fixed(t) = self.item.threshold else {
            return None;
        };
        let mut out = self.clone();
        out.item.threshold = Threshold::Fixed(t / factor);
        out.mean_eps = self.mean_eps / factor;
        let z = self.noise_multiplier() * factor;
        match &mut out.user {
            UserSolver::Gd(c) => c.noise = UserNoise::Multiplier(z),
            UserSolver::Ssp(c) => c.noise_multiplier = z,
        }
        Some(Box::new(out))
    }

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        let r = data.ratings;
        if r.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let m = data.matrix;
        let budgets = objpert::preferences(data, Some(self.eps), &Default::default(), rng)?;
        let split = self.split_budgets(&budgets)?;
        if split.item_round.iter().all(|&b| b <= 0.0) && split.in_user_steps.iter().all(|u| !u) {
            return Err(TrainError::EmptyData);
        }
        let mut charges = ReleaseCharges::default();
        // 1. DP global mean over the ratings whose budget pays for it (public eps).
        let mean = self.dp_mean(data, &split, &mut charges, rng)?;
        // The user steps see only the ratings that pay for them; every one is charged the
        // user steps' eps at delta_r (rating level), once per release.
        let by_user = m.by_user.retain(|k| split.in_user_steps[k]);
        charges
            .ratings
            .extend(
                (0..r.len())
                    .filter(|&k| split.in_user_steps[k])
                    .map(|k| RatingCharge {
                        position: k as u32,
                        eps: split.user_steps_eps,
                    }),
            );
        // 2. and 3.: the user and item steps.
        let Alternated {
            user,
            item_factors,
            item_bias,
        } = self.alternate(data, &by_user, &split.item_round, mean, &mut charges, rng)?;
        let user_bias = user.user_bias.unwrap_or_else(|| Array1::zeros(m.n_users));
        let model = FactorModel {
            global_mean: mean,
            user_bias,
            item_bias,
            user_factors: user.user_factors,
            item_factors,
            scale: data.scale,
        };
        Ok(Fitted {
            model,
            charges,
            guarantee: Guarantee::Proven,
            ranker: None,
        })
    }
}

/// The user step's solver (`user_solver`: `gd` or `ssp`) and its noise, from
/// `user_sigma` or from a `(user_eps, user_delta)` budget over the `rounds + 1` user steps.
fn user_solver_from_params(
    p: &Params,
    default: &UserSolver,
    rounds: usize,
) -> Result<UserSolver, TrainError> {
    let default_solver = match default {
        UserSolver::Gd(_) => "gd",
        UserSolver::Ssp(_) => "ssp",
    };
    let solver = p
        .get_str("user_solver")
        .unwrap_or(default_solver)
        .to_owned();
    // Gaussian releases per user per user step, known before any data is seen.
    let per_step = match solver.as_str() {
        "gd" => p.usize_in("user_steps", default_gd().steps, 1, 10_000)?,
        "ssp" => 1,
        s => return Err(invalid("user_solver", format!("{s:?}: use ssp or gd"))),
    };
    let default_z = match solver.as_str() {
        "gd" => 4.0,
        _ => default_ssp().noise_multiplier,
    };
    let z = match (p.get_str("user_sigma"), p.get_str("user_eps")) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "user_sigma",
                "give user_sigma or user_eps, not both".into(),
            ))
        }
        (_, Some(_)) => {
            // The budget covers all rounds + 1 user steps (J releases each for GD,
            // one for SSP).
            let eps = p.positive("user_eps", 1.0)?;
            let delta = p.positive("user_delta", 1e-5)?;
            let total = ((rounds + 1) * per_step) as u64;
            gaussian_mf::calibrate_noise_multiplier(eps, delta, total)?
        }
        _ => p.positive("user_sigma", default_z)?,
    };
    Ok(if solver == "gd" {
        let g = default_gd();
        let user = UserStepConfig {
            steps: per_step,
            lr: p.positive("user_lr", g.lr)?,
            lr_decay: p.positive("user_lr_decay", g.lr_decay)?,
            clip: p.positive("clip", g.clip)?,
            noise: UserNoise::Multiplier(z),
            lambda_u: p.non_negative("lambda_u", g.lambda_u)?,
            neighbour: g.neighbour,
            user_bias: true,
            max_norm: p.non_negative("max_norm", g.max_norm)?,
        };
        user.validate()?;
        UserSolver::Gd(user)
    } else {
        let s = default_ssp();
        let user = SspConfig {
            noise_multiplier: z,
            clip_y: p.positive("clip_y", s.clip_y)?,
            lambda_u: p.non_negative("lambda_u", s.lambda_u)?,
            bias_weight: p.non_negative("user_bias", s.bias_weight)?,
            neighbour: s.neighbour,
            max_norm: p.non_negative("max_norm", s.max_norm)?,
        };
        user.validate()?;
        UserSolver::Ssp(user)
    })
}

/// Rows scaled to unit L2 norm (zero rows stay zero).
fn unit_rows(u: &ndarray::Array2<f64>) -> ndarray::Array2<f64> {
    let mut out = u.clone();
    for mut row in out.rows_mut() {
        let n = row.dot(&row).sqrt();
        if n > 0.0 {
            row /= n;
        }
    }
    out
}

/// Parses `threshold` as a public number; `mean` and `max` (statistics of the eps_ij
/// present, private under add/remove) are refused (DESIGN 2.6, issue 8 finding 4).
fn public_threshold(p: &Params, default: Threshold) -> Result<Threshold, TrainError> {
    match objpert::parse_threshold(p, default)? {
        t @ Threshold::Fixed(_) => Ok(t),
        other => Err(invalid(
            "threshold",
            format!(
                "{other:?} is computed from the eps_ij of the ratings present, which is not \
                 public; give a number"
            ),
        )),
    }
}

/// How one release divides each rating's budget (all from public values: the rating's own
/// release budget and the trainer's parameters).
#[derive(Debug, Clone)]
/// The last user step's output and the last released item profiles of a fit.
struct Alternated {
    user: UserStepOutput,
    item_factors: ndarray::Array2<f64>,
    item_bias: Array1<f64>,
}

struct BudgetSplitPerRating {
    in_mean: Vec<bool>,
    in_user_steps: Vec<bool>,
    /// eps of all the user steps of one release at delta_r (charged once per release).
    user_steps_eps: f64,
    /// What each item step may spend on the rating (0: not offered).
    item_round: Vec<f64>,
}

impl DpAlt {
    /// Step 1 of a fit: the DP global mean of the ratings whose budget pays for it (the
    /// scale's midpoint when none does or `mean_eps` is 0); its charges go to `charges`.
    fn dp_mean(
        &self,
        data: &TrainData<'_>,
        split: &BudgetSplitPerRating,
        charges: &mut ReleaseCharges,
        rng: &mut DpRng,
    ) -> Result<f64, TrainError> {
        let r = data.ratings;
        let positions: Vec<usize> = (0..r.len()).filter(|&k| split.in_mean[k]).collect();
        let paid_for = self.mean_eps > 0.0 && !positions.is_empty();
        if !paid_for {
            return Ok((data.scale.min + data.scale.max) / 2.0);
        }
        let used = r.select(&positions);
        let (mean, mut c) = dp_stats::dp_global_mean(&used, data.scale, self.mean_eps, rng)?;
        // Map the charges back to positions in `r`.
        for ch in &mut c.ratings {
            ch.position = positions[ch.position as usize] as u32;
        }
        charges.extend(c);
        Ok(mean)
    }

    /// Steps 2 and 3 of a fit: a first user step on data-independent random item
    /// features, then `rounds` times a DP item step on the DP user profiles followed by
    /// a DP user step on the item profiles just released. Charges go to `charges`.
    fn alternate(
        &self,
        data: &TrainData<'_>,
        by_user: &crate::data::Compressed,
        per_round: &[f64],
        mean: f64,
        charges: &mut ReleaseCharges,
        rng: &mut DpRng,
    ) -> Result<Alternated, TrainError> {
        let (r, m) = (data.ratings, data.matrix);
        // Every user of the release gets a user-step release (noise only without usable
        // ratings), so whether a user has ratings does not show in its profile.
        let eligible_users = vec![true; m.n_users];
        let v0 = objpert::random_unit_rows(m.n_items, self.d, rng);
        let mut user = self.user_step(
            by_user,
            &UserOffsets {
                global: mean,
                item_bias: None,
            },
            v0.view(),
            &eligible_users,
            rng,
        )?;
        charges.extend(std::mem::take(&mut user.charges));
        let mut item_bias = Array1::zeros(m.n_items);
        let mut item_factors = v0;
        for _ in 0..self.rounds {
            let user_bias = user
                .user_bias
                .clone()
                .unwrap_or_else(|| Array1::zeros(m.n_users));
            let users = &r.users;
            // Unit-norm user rows (post-processing of a DP output): the item step clips rows
            // to norm 1 for its sensitivity, and short rows would leave the latent part of
            // its Hessian at lambda_v alone, i.e. latent item coordinates of pure noise.
            let features = unit_rows(&user.user_factors);
            let item = objpert::dp_item_step(
                r,
                &m.by_item,
                |k| mean + user_bias[users[k] as usize],
                &features,
                per_round,
                &self.item,
                rng,
            )?;
            charges.extend(item.charges);
            item_bias = item.item_bias;
            item_factors = match self.user {
                // SSP profiles pair with the item rows clipped to norm 1 (post-processing
                // of the released item profiles); publish those.
                UserSolver::Ssp(_) => objpert::clip_rows(&item.item_factors),
                UserSolver::Gd(_) => item.item_factors,
            };
            user = self.user_step(
                by_user,
                &UserOffsets {
                    global: mean,
                    item_bias: item_bias.as_slice(),
                },
                item_factors.view(),
                &eligible_users,
                rng,
            )?;
            charges.extend(std::mem::take(&mut user.charges));
        }
        Ok(Alternated {
            user,
            item_factors,
            item_bias,
        })
    }

    /// The per-rating eps (at `delta_r`) of all the Gaussian user steps of one release.
    pub fn user_steps_rating_eps(&self) -> Result<f64, TrainError> {
        let steps = ((self.rounds + 1) * self.user.releases_per_step()) as u64;
        gaussian_mf::gaussian_steps_eps(self.noise_multiplier(), steps, self.delta_r)
    }

    /// Rating k: takes part in the mean iff its budget exceeds `mean_eps`; in the user
    /// steps iff what is left pays for them with some budget to spare for the item steps
    /// (at least as much again); the rest is split evenly over the item steps.
    fn split_budgets(&self, budgets: &[f64]) -> Result<BudgetSplitPerRating, TrainError> {
        let g = self.user_steps_rating_eps()?;
        let n = budgets.len();
        let mut out = BudgetSplitPerRating {
            in_mean: vec![false; n],
            in_user_steps: vec![false; n],
            user_steps_eps: g,
            item_round: vec![0.0; n],
        };
        for (k, &b) in budgets.iter().enumerate() {
            if b <= 0.0 {
                continue;
            }
            let mut left = b;
            if self.mean_eps > 0.0 && left > 2.0 * self.mean_eps {
                out.in_mean[k] = true;
                left -= self.mean_eps;
            }
            if left >= 2.0 * g {
                out.in_user_steps[k] = true;
                left -= g;
            }
            // A hair below the exact split, so that the sum of the charges never exceeds
            // the budget by rounding.
            out.item_round[k] = (left / self.rounds as f64 * (1.0 - 1e-12)).max(0.0);
        }
        Ok(out)
    }
}
