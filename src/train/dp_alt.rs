//! `dp-alt`, the production trainer (DESIGN 5): DP item profiles and DP user profiles by
//! alternation, every step on inputs that are public or already DP, so the release's
//! privacy is the composition of the steps' charges and nothing else.
//!
//! One release:
//! 1. DP global mean (exact discrete Laplace on sum and count, [`dp_stats`]), a small
//!    `mean_share` of the smallest per-rating budget, charged to every rating;
//! 2. a DP user step on data-independent random item features: user biases and a first,
//!    rough user profile;
//! 3. `rounds` times: a DP item step ([`objpert::dp_item_step`]: RSM sampling + objective
//!    perturbation, eta once per step) on the DP user profiles of the step before, with the
//!    DP user biases as offsets, spending `1/rounds` of each rating's remaining budget;
//!    then a DP user step on the item profiles just released (public from then on);
//! 4. publish (global mean, user biases, item biases, user profiles, item profiles).
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

use super::charges::ReleaseCharges;
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
    /// Share of the smallest per-rating budget spent on the DP global mean.
    pub mean_share: f64,
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
            mean_share: 0.02,
            item: ItemStepConfig {
                threshold: Threshold::Mean,
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
            threshold: objpert::parse_threshold(p, d.item.threshold)?,
            lambda_v: p.positive("lambda_v", d.item.lambda_v)?,
            jacobian_share: p.non_negative("jacobian_share", d.item.jacobian_share)?,
            loss_scale: p.positive("c", d.item.loss_scale)?,
            bias_weight: p.non_negative("bias", d.item.bias_weight)?,
            mean: None,
        };
        item.validate()?;
        let rounds = p.usize_in("rounds", d.rounds, 1, 20)?;
        let default_solver = match d.user {
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
        let user = if solver == "gd" {
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
        };
        let t = Self {
            eps: p.positive("eps", d.eps)?,
            d: p.usize_in("d", d.d, 1, 256)?,
            rounds,
            mean_share: p.f64("mean_share", d.mean_share)?,
            item,
            user,
        };
        if !(0.0..0.5).contains(&t.mean_share) {
            return Err(invalid(
                "mean_share",
                format!("must be in [0, 0.5), got {}", t.mean_share),
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
            "eps": self.eps, "d": self.d, "rounds": self.rounds, "mean_share": self.mean_share,
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

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        let r = data.ratings;
        if r.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let m = data.matrix;
        let budgets = objpert::preferences(data, Some(self.eps), &Default::default(), rng)?;
        let offered = |k: &usize| budgets[*k] > 0.0;
        // 1. DP global mean over the offered ratings, at a share of the smallest budget.
        let min_budget = (0..r.len())
            .filter(offered)
            .map(|k| budgets[k])
            .fold(f64::INFINITY, f64::min);
        if !min_budget.is_finite() {
            return Err(TrainError::EmptyData);
        }
        let mut charges = ReleaseCharges::default();
        let (mean, eps_mean) = if self.mean_share > 0.0 {
            let eps_mean = self.mean_share * min_budget;
            let positions: Vec<usize> = (0..r.len()).filter(offered).collect();
            let used = r.select(&positions);
            let (mean, mut c) = dp_stats::dp_global_mean(&used, data.scale, eps_mean, rng)?;
            // Map the charges back to positions in `r`.
            for ch in &mut c.ratings {
                ch.position = positions[ch.position as usize] as u32;
            }
            charges.extend(c);
            (mean, eps_mean)
        } else {
            ((data.scale.min + data.scale.max) / 2.0, 0.0)
        };
        // Each item step spends an equal part of what the mean left of each budget.
        let per_round: Vec<f64> = budgets
            .iter()
            .map(|&b| {
                if b > 0.0 {
                    (b - eps_mean) / self.rounds as f64
                } else {
                    0.0
                }
            })
            .collect();
        // Users with an offered rating take part in the user steps.
        let mut eligible_users = vec![false; m.n_users];
        for k in (0..r.len()).filter(offered) {
            eligible_users[r.users[k] as usize] = true;
        }
        // The user steps see only offered ratings: the others are zeroed out of the view.
        let by_user = restrict(&m.by_user, &budgets);

        // 2. First user step on data-independent random item features.
        let v0 = objpert::random_unit_rows(m.n_items, self.d, rng);
        let mut user = self.user_step(
            &by_user,
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
        // 3. Alternate: DP item step on the DP user profiles, then a DP user step on the
        // item profiles just released.
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
                &per_round,
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
                &by_user,
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

/// The user-major view without the entries whose budget is 0 (not offered).
fn restrict(view: &crate::data::Compressed, budgets: &[f64]) -> crate::data::Compressed {
    if budgets.iter().all(|&b| b > 0.0) {
        return view.clone();
    }
    let mut out = crate::data::Compressed {
        indptr: Vec::with_capacity(view.indptr.len()),
        ..Default::default()
    };
    out.indptr.push(0);
    for row in 0..view.n_rows() {
        let span = view.indptr[row]..view.indptr[row + 1];
        for k in span {
            if budgets[view.source[k] as usize] > 0.0 {
                out.indices.push(view.indices[k]);
                out.values.push(view.values[k]);
                out.source.push(view.source[k]);
            }
        }
        out.indptr.push(out.indices.len());
    }
    out
}
