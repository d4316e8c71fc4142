//! Gaussian-MF: DP user profiles by noisy gradient descent (Mugdho and Imtiaz,
//! "Privacy-Preserving Matrix Factorization for Recommendation Systems using Gaussian
//! Mechanism"), in two forms:
//!
//! - [`dp_user_step`] and the `gaussian-mf` trainer ([`GaussianMf`], [`Guarantee::Proven`]):
//!   the production user step of DESIGN 2.2 and 5. The item features V are PUBLIC (the
//!   already-published DP item profiles, or data-independent random features) and fixed.
//!   Each user's profile theta_u runs J full-batch gradient steps; at each step the
//!   gradient is the sum over u's ratings of per-rating contributions
//!   g_uj = -(y_uj - theta_u . v_j) v_j, each clipped to L2 norm <= C, plus Gaussian
//!   noise N(0, (z Delta)^2 I) with Delta = C (add/remove one rating) or 2C (replace one
//!   rating's value), plus the data-independent ridge term lambda_u theta_u. Each step is a
//!   Gaussian mechanism with noise multiplier z on a query of L2 sensitivity Delta, so the
//!   J steps compose to the RDP curve alpha J / (2 z^2) (Mironov 2017, Prop. 1 and 7).
//!   theta_u depends only on u's ratings and public inputs, so users compose in parallel:
//!   each user with ratings is charged `PrivacyEvent::Gaussian { noise_multiplier: z,
//!   count: J }`, nobody else.
//! - The `paper-gaussian-mf` trainer ([`PaperGaussianMf`], [`Guarantee::PaperClaimed`]):
//!   Algorithm 1 of the paper as written (noise on the user gradient only, the item matrix
//!   X updated WITHOUT noise from the same ratings, sigma = tau C sqrt(2 ln(1.25/delta)) /
//!   eps_i, Theorem 2's eps_opt), to reproduce the paper's experiments. Its charges are
//!   what the paper claims, labelled [`PAPER_FAITHFUL`], and never justify a ledger entry:
//!   X depends on the data, so theta_u depends on other users' ratings through X and the
//!   per-user parallel composition the claim needs does not hold.
//!
//! The claim, the proof sketch and the tests that guard each scale are in
//! `docs/privacy/gaussian-mf.md`.
//!
//! [`PAPER_FAITHFUL`]: dprec_dp::charges::PAPER_FAITHFUL

use ndarray::{Array1, Array2, ArrayView2};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;

use crate::data::Compressed;
use crate::train::invalid;
use crate::train::{
    FactorModel, Fitted, Guarantee, Params, ReleaseCharges, TrainData, TrainError, Trainer,
};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::charges::{MechanismRecord, Neighbour, PrivacyUnit, RatingCharge, UserCharge};
use dprec_dp::privacy::gaussian;
use dprec_dp::rng::DpRng;

pub mod paper;
pub use paper::PaperGaussianMf;

// ---------------------------------------------------------------------------------------
// Accounting helpers (all eps values come from the accountant, except the paper's own
// closed form, which is reported beside them for comparison only).
// ---------------------------------------------------------------------------------------

/// eps at `delta` of `steps` Gaussian steps of noise multiplier `z`, by the accountant
/// (default order grid, improved conversion).
pub fn gaussian_steps_eps(z: f64, steps: u64, delta: f64) -> Result<f64, TrainError> {
    let event = PrivacyEvent::gaussian(z, steps)?;
    Ok(dprec_dp::ledger::release_eps(&[event], delta)?)
}

/// The noise multiplier z for which `steps` composed Gaussian steps give exactly `eps`
/// at `delta` through the accountant (bisection on z; eps is decreasing in z). Returns the
/// upper end of the final bracket, so the accountant's eps at the result is `<= eps`
/// (and within 1e-9 relative of it).
pub fn calibrate_noise_multiplier(eps: f64, delta: f64, steps: u64) -> Result<f64, TrainError> {
    if !(eps.is_finite() && eps > 0.0) {
        return Err(invalid("eps", format!("must be finite and > 0, got {eps}")));
    }
    if !(delta > 0.0 && delta < 1.0) {
        return Err(invalid("delta", format!("must be in (0, 1), got {delta}")));
    }
    if steps == 0 {
        return Err(invalid("steps", "must be >= 1"));
    }
    // A pure function of public values, asked for by every release of a trainer that
    // calibrates its noise to a plan (hundreds of bisection steps through the
    // accountant): remembered per thread.
    thread_local! {
        static CALIBRATED: std::cell::RefCell<std::collections::HashMap<(u64, u64, u64), f64>> =
            Default::default();
    }
    let key = (eps.to_bits(), delta.to_bits(), steps);
    if let Some(z) = CALIBRATED.with(|c| c.borrow().get(&key).copied()) {
        return Ok(z);
    }
    let z = calibrate_decreasing(
        eps,
        |z| gaussian_steps_eps(z, steps, delta),
        1.0,
        (1e-12, 1e12),
        1e-13,
    )?;
    CALIBRATED.with(|c| c.borrow_mut().insert(key, z));
    Ok(z)
}

/// The smallest `z` (to `rel_tol` relative) at which `eps_of(z) <= eps`, for an `eps_of`
/// that decreases as `z` grows (a noise multiplier's eps from the accountant): doubles
/// and halves from `start` to bracket it within `range`, then bisects geometrically.
/// Returns the upper end of the final bracket, so `eps_of` at the result is `<= eps`.
pub(crate) fn calibrate_decreasing(
    eps: f64,
    eps_of: impl Fn(f64) -> Result<f64, TrainError>,
    start: f64,
    range: (f64, f64),
    rel_tol: f64,
) -> Result<f64, TrainError> {
    let (mut lo, mut hi) = (start, start);
    while eps_of(hi)? > eps {
        hi *= 2.0;
        if hi > range.1 {
            return Err(invalid("eps", format!("{eps} is too small to calibrate")));
        }
    }
    while eps_of(lo)? <= eps {
        lo /= 2.0;
        if lo < range.0 {
            return Err(invalid("eps", format!("{eps} is too large to calibrate")));
        }
    }
    // Invariant: eps_of(lo) > eps >= eps_of(hi).
    for _ in 0..200 {
        if hi / lo - 1.0 < rel_tol {
            break;
        }
        let mid = (lo * hi).sqrt();
        if eps_of(mid)? > eps {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(hi)
}

/// The paper's Theorem 2 (eq. 9):
/// `eps_opt = J eps_i^2 / (4 ln(1.25/delta)) + 2 sqrt(J eps_i^2 ln(1/delta_r) / (4 ln(1.25/delta)))`.
/// It is the classic RDP
/// conversion rdp + ln(1/delta_r)/(alpha - 1) minimised over a continuous alpha, for the
/// noise multiplier sqrt(2 ln(1.25/delta)) / eps_i of the paper's Theorem 1.
pub fn paper_eps_opt(steps: u64, eps_i: f64, delta: f64, delta_r: f64) -> f64 {
    let l = (1.25 / delta).ln();
    let rho = steps as f64 * eps_i * eps_i / (4.0 * l);
    rho + 2.0 * (rho * (1.0 / delta_r).ln()).sqrt()
}

/// The noise multiplier sigma / Delta that the paper's Theorem 1 (classic Gaussian
/// mechanism) assigns to a per-step (eps_i, delta): sqrt(2 ln(1.25/delta)) / eps_i.
pub fn paper_noise_multiplier(eps_i: f64, delta: f64) -> f64 {
    (2.0 * (1.25 / delta).ln()).sqrt() / eps_i
}

/// The inverse of [`paper_noise_multiplier`]: the per-step eps_i the paper would state
/// for noise multiplier `z` at `delta`.
pub fn paper_step_eps(z: f64, delta: f64) -> f64 {
    (2.0 * (1.25 / delta).ln()).sqrt() / z
}

// ---------------------------------------------------------------------------------------
// The production user step.
// ---------------------------------------------------------------------------------------

/// How the Gaussian noise of the user step is set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UserNoise {
    /// Noise multiplier z = sigma / Delta (per step).
    Multiplier(f64),
    /// Calibrate z so that the J composed steps give `eps` at `delta` (accountant).
    Target { eps: f64, delta: f64 },
}

/// Hyper-parameters of [`dp_user_step`].
#[derive(Debug, Clone, PartialEq)]
pub struct UserStepConfig {
    /// Number of full-batch gradient steps J.
    pub steps: usize,
    /// Learning rate of step 0; step t uses `lr * lr_decay^t` (public schedule).
    pub lr: f64,
    pub lr_decay: f64,
    /// Per-rating contribution clip C (L2 norm).
    pub clip: f64,
    pub noise: UserNoise,
    /// Ridge penalty lambda_u on theta_u (data-independent term of the gradient).
    pub lambda_u: f64,
    /// AddRemove: sensitivity C; Replace: sensitivity 2C. The noise std is z * sensitivity.
    pub neighbour: Neighbour,
    /// Learn a user bias too: the features get a constant 1 appended (so the clip covers
    /// the bias part of each contribution as well).
    pub user_bias: bool,
    /// After each step, project theta_u onto the L2 ball of this radius (0 = no
    /// projection). A public post-processing of the noisy iterate.
    pub max_norm: f64,
}

impl Default for UserStepConfig {
    fn default() -> Self {
        Self {
            steps: 20,
            lr: 0.002,
            lr_decay: 1.0,
            clip: 1.0,
            noise: UserNoise::Multiplier(4.0),
            lambda_u: 1.0,
            neighbour: Neighbour::AddRemove,
            user_bias: true,
            max_norm: 0.0,
        }
    }
}

impl UserStepConfig {
    /// Checks every field; errors name it.
    pub fn validate(&self) -> Result<(), TrainError> {
        let pos = |k: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(invalid(k, format!("must be finite and > 0, got {v}")))
            }
        };
        if self.steps == 0 {
            return Err(invalid("steps", "must be >= 1"));
        }
        pos("lr", self.lr)?;
        pos("lr_decay", self.lr_decay)?;
        pos("clip", self.clip)?;
        if !(self.lambda_u.is_finite() && self.lambda_u >= 0.0) {
            return Err(invalid(
                "lambda_u",
                format!("must be finite and >= 0, got {}", self.lambda_u),
            ));
        }
        if !(self.max_norm.is_finite() && self.max_norm >= 0.0) {
            return Err(invalid(
                "max_norm",
                format!("must be finite and >= 0, got {}", self.max_norm),
            ));
        }
        match self.noise {
            UserNoise::Multiplier(z) => pos("sigma", z),
            UserNoise::Target { eps, delta } => {
                pos("eps", eps)?;
                if delta > 0.0 && delta < 1.0 {
                    Ok(())
                } else {
                    Err(invalid("delta", format!("must be in (0, 1), got {delta}")))
                }
            }
        }
    }

    /// L2 sensitivity of one step's clipped gradient sum for the neighbour relation.
    pub fn sensitivity(&self) -> f64 {
        match self.neighbour {
            Neighbour::AddRemove => self.clip,
            Neighbour::Replace => 2.0 * self.clip,
        }
    }

    /// The noise multiplier z (calibrated through the accountant for a target).
    pub fn noise_multiplier(&self) -> Result<f64, TrainError> {
        self.validate()?;
        match self.noise {
            UserNoise::Multiplier(z) => Ok(z),
            UserNoise::Target { eps, delta } => {
                calibrate_noise_multiplier(eps, delta, self.steps as u64)
            }
        }
    }

    /// The event each participating user is charged: Gaussian { z, count: J }.
    pub fn event(&self) -> Result<PrivacyEvent, TrainError> {
        Ok(PrivacyEvent::gaussian(
            self.noise_multiplier()?,
            self.steps as u64,
        )?)
    }
}

/// Public offsets subtracted from each rating before the user step:
/// y_uj = r_uj - global - `item_bias[j]`. Both MUST be public (data-independent, or from
/// an already-charged DP release).
#[derive(Debug, Clone, Copy)]
pub struct UserOffsets<'a> {
    pub global: f64,
    /// Item biases by item index (items beyond its length get 0).
    pub item_bias: Option<&'a [f64]>,
}

impl UserOffsets<'_> {
    /// The offset of `item`: `global + item_bias[item]` (0 bias beyond the slice).
    pub fn of(&self, item: usize) -> f64 {
        self.global
            + self
                .item_bias
                .and_then(|b| b.get(item))
                .copied()
                .unwrap_or(0.0)
    }
}

/// What [`dp_user_step`] released and charged.
#[derive(Debug, Clone)]
pub struct UserStepOutput {
    /// n_users x d.
    pub user_factors: Array2<f64>,
    /// Per-user biases when `cfg.user_bias`, else `None`.
    pub user_bias: Option<Array1<f64>>,
    /// One mechanism record and one `Gaussian { z, J }` charge per eligible user with
    /// at least one rating.
    pub charges: ReleaseCharges,
    /// z = sigma / Delta.
    pub noise_multiplier: f64,
    /// Noise standard deviation per coordinate and step: z * Delta.
    pub noise_std: f64,
    pub event: PrivacyEvent,
}

/// Sum over one user's ratings of the per-rating contributions
/// g_j = -(y_j - theta . f_j) f_j, each scaled to L2 norm <= `clip`, written to `out`.
/// `f_j` is item j's feature row, with a trailing 1 when `theta.len() == d + 1` (user
/// bias). Returns how many contributions were clipped.
///
/// Adding or removing one rating changes the result by exactly one clipped contribution,
/// so by at most `clip` in L2 norm (replacing one: at most `2 clip`).
pub fn clipped_gradient_sum(
    theta: &[f64],
    items: &[u32],
    values: &[f32],
    offsets: &UserOffsets<'_>,
    item_features: ArrayView2<'_, f64>,
    clip: f64,
    out: &mut [f64],
) -> usize {
    let d = item_features.ncols();
    let with_bias = theta.len() == d + 1;
    debug_assert!(theta.len() == d || with_bias);
    out.iter_mut().for_each(|x| *x = 0.0);
    let mut clipped = 0;
    for (&j, &r) in items.iter().zip(values) {
        let j = j as usize;
        let f = item_features.row(j);
        let mut pred = 0.0;
        let mut norm2 = 0.0;
        for (k, &x) in f.iter().enumerate() {
            pred += theta[k] * x;
            norm2 += x * x;
        }
        if with_bias {
            pred += theta[d];
            norm2 += 1.0;
        }
        let resid = r as f64 - offsets.of(j) - pred;
        let norm = resid.abs() * norm2.sqrt();
        let mut coef = -resid;
        if norm > clip {
            coef *= clip / norm;
            clipped += 1;
        }
        for (k, &x) in f.iter().enumerate() {
            out[k] += coef * x;
        }
        if with_bias {
            out[d] += coef;
        }
    }
    clipped
}

/// The generator of user `u`: one ChaCha20 key for the release, one stream per user, so
/// the noise does not depend on the thread count or the order users are processed in.
pub(crate) fn user_rng(key: [u8; 32], u: usize) -> DpRng {
    let mut r = DpRng::from_seed(key);
    r.set_stream(u as u64);
    r
}

/// Input checks shared by the DP user steps (GD here, SSP in [`crate::train::predictors::ssp`]): `eligible`
/// has one entry per user, every rated item has a feature row, features are finite.
pub(crate) fn check_user_step_inputs(
    by_user: &Compressed,
    item_features: ArrayView2<'_, f64>,
    eligible: Option<&[bool]>,
) -> Result<(), TrainError> {
    let n_users = by_user.n_rows();
    let n_items = item_features.nrows();
    if let Some(e) = eligible {
        if e.len() != n_users {
            return Err(invalid(
                "eligible",
                format!("has {} entries for {n_users} users", e.len()),
            ));
        }
    }
    if let Some(&j) = by_user.indices.iter().max() {
        if j as usize >= n_items {
            return Err(invalid(
                "item_features",
                format!("has {n_items} rows but a rating names item {j}"),
            ));
        }
    }
    if item_features.iter().any(|x| !x.is_finite()) {
        return Err(invalid("item_features", "must be finite"));
    }
    Ok(())
}

/// The DP user step (DESIGN 2.2): J noisy full-batch gradient steps per user on theta_u
/// with the item features fixed and PUBLIC. See the module docs for the mechanism and
/// `docs/privacy/gaussian-mf.md` for the proof.
///
/// - `by_user`: the ratings, user-major (its row count is the number of users);
/// - `offsets`: public offsets subtracted from each rating;
/// - `item_features`: PUBLIC item profiles (already-published DP ones, or
///   data-independent), one row per item index;
/// - `eligible`: users the ledger admits (`None` = all). Every eligible user gets a noisy
///   profile, with or without ratings (a user's rating count must not decide whether
///   noise is added: with a deterministic profile for empty users, adding a user's first
///   rating would be detectable with certainty); only eligible users with at least one
///   rating are charged. Ineligible users get a zero profile and use no rating.
///
/// Randomness: one 256-bit key is drawn from `rng`; user u uses stream u of it.
pub fn dp_user_step(
    by_user: &Compressed,
    offsets: &UserOffsets<'_>,
    item_features: ArrayView2<'_, f64>,
    eligible: Option<&[bool]>,
    cfg: &UserStepConfig,
    rng: &mut DpRng,
) -> Result<UserStepOutput, TrainError> {
    cfg.validate()?;
    let n_users = by_user.n_rows();
    let d = item_features.ncols();
    if d == 0 {
        return Err(invalid("d", "item features have no columns"));
    }
    check_user_step_inputs(by_user, item_features, eligible)?;
    let z = cfg.noise_multiplier()?;
    let noise_std = z * cfg.sensitivity();
    let event = PrivacyEvent::gaussian(z, cfg.steps as u64)?;
    let key: [u8; 32] = rng.random();
    let theta = noisy_gd_profiles(
        by_user,
        offsets,
        item_features,
        eligible,
        cfg,
        key,
        noise_std,
    )?;
    let (user_factors, user_bias) = split_profiles(&theta, n_users, d, cfg.user_bias);
    let mut params = serde_json::json!({
        "steps": cfg.steps, "lr": cfg.lr, "lr_decay": cfg.lr_decay, "clip": cfg.clip,
        "lambda_u": cfg.lambda_u, "noise_multiplier": z, "noise_std": noise_std,
        "sensitivity": cfg.sensitivity(), "user_bias": cfg.user_bias, "max_norm": cfg.max_norm,
        "item_features": "public (fixed during the step)",
    });
    if let UserNoise::Target { eps, delta } = cfg.noise {
        params["calibrated_to"] = serde_json::json!({"eps": eps, "delta": delta});
    }
    let record = MechanismRecord {
        name: "gaussian-mf-user-step".into(),
        params,
        unit: PrivacyUnit::Rating,
        neighbour: cfg.neighbour,
    };
    let charges = user_step_charges(by_user, eligible, &event, record);
    Ok(UserStepOutput {
        user_factors,
        user_bias,
        charges,
        noise_multiplier: z,
        noise_std,
        event,
    })
}

/// The noisy gradient descent of [`dp_user_step`]: each eligible user's parameters (the
/// factors, then the bias if any) after `cfg.steps` clipped steps with noise of standard
/// deviation `noise_std` (user `u` draws from stream `u` of `key`); row-major, ineligible
/// users left at zero.
fn noisy_gd_profiles(
    by_user: &Compressed,
    offsets: &UserOffsets<'_>,
    item_features: ArrayView2<'_, f64>,
    eligible: Option<&[bool]>,
    cfg: &UserStepConfig,
    key: [u8; 32],
    noise_std: f64,
) -> Result<Vec<f64>, TrainError> {
    let k = item_features.ncols() + usize::from(cfg.user_bias);
    let mut theta = vec![0.0; by_user.n_rows() * k];
    theta.par_chunks_mut(k).enumerate().try_for_each_init(
        || vec![0.0; k],
        |grad, (u, th)| -> Result<(), TrainError> {
            if eligible.is_some_and(|e| !e[u]) {
                return Ok(());
            }
            let (items, values) = by_user.row(u);
            let mut urng = user_rng(key, u);
            let mut lr = cfg.lr;
            for _ in 0..cfg.steps {
                clipped_gradient_sum(th, items, values, offsets, item_features, cfg.clip, grad);
                for (t, g) in th.iter_mut().zip(grad.iter()) {
                    let noise = gaussian(noise_std, &mut urng)?;
                    *t -= lr * (g + cfg.lambda_u * *t + noise);
                }
                if cfg.max_norm > 0.0 {
                    let n = th.iter().map(|x| x * x).sum::<f64>().sqrt();
                    if n > cfg.max_norm {
                        th.iter_mut().for_each(|x| *x *= cfg.max_norm / n);
                    }
                }
                lr *= cfg.lr_decay;
            }
            Ok(())
        },
    )?;
    if theta.iter().any(|x| !x.is_finite()) {
        return Err(TrainError::Numerical(
            "user step diverged (non-finite profiles): lower lr".into(),
        ));
    }
    Ok(theta)
}

/// Row-major parameters (`d` factors, then the bias if `with_bias`) as the profiles.
fn split_profiles(
    theta: &[f64],
    n_users: usize,
    d: usize,
    with_bias: bool,
) -> (Array2<f64>, Option<Array1<f64>>) {
    let k = d + usize::from(with_bias);
    let mut user_factors = Array2::zeros((n_users, d));
    let mut user_bias = with_bias.then(|| Array1::zeros(n_users));
    for u in 0..n_users {
        let th = &theta[u * k..(u + 1) * k];
        user_factors
            .row_mut(u)
            .assign(&ndarray::ArrayView1::from(&th[..d]));
        if let Some(b) = user_bias.as_mut() {
            b[u] = th[d];
        }
    }
    (user_factors, user_bias)
}

/// The charges of a user step (Gaussian or SSP): `event` for every eligible user with at
/// least one rating (a user without data releases noise only and is not charged), and
/// the step's mechanism record.
pub(crate) fn user_step_charges(
    by_user: &Compressed,
    eligible: Option<&[bool]>,
    event: &PrivacyEvent,
    record: MechanismRecord,
) -> ReleaseCharges {
    let users: Vec<UserCharge> = (0..by_user.n_rows())
        .filter(|&u| eligible.is_none_or(|e| e[u]) && by_user.row_len(u) > 0)
        .map(|u| UserCharge {
            user: u as u32,
            event: event.clone(),
        })
        .collect();
    ReleaseCharges {
        mechanisms: vec![record],
        ratings: Vec::new(),
        users,
        rating_rho: Default::default(),
    }
}

// ---------------------------------------------------------------------------------------
// The `gaussian-mf` trainer.
// ---------------------------------------------------------------------------------------

/// Where the public item features of `gaussian-mf` come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemSource {
    /// The prior (already-published, already-charged) DP model's item factors.
    Prior,
    /// Data-independent random features, entries N(0, 1/d).
    Random,
}

/// Where the public offsets (global mean, item biases) come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSource {
    /// Global mean = midpoint of the rating scale, no item biases (data-independent).
    Midpoint,
    /// The prior DP model's global mean and item biases (public: already published).
    Prior,
}

/// The `gaussian-mf` trainer: [`dp_user_step`] with public item features.
#[derive(Debug, Clone)]
pub struct GaussianMf {
    pub d: usize,
    pub step: UserStepConfig,
    pub items: ItemSource,
    pub offsets: OffsetSource,
    /// delta at which the per-user (eps, delta_r) is reported.
    pub delta_r: f64,
    /// delta of the paper's per-step (eps_i, delta) view, for the eps_opt comparison (and
    /// the calibration delta when `eps` is given).
    pub delta: f64,
    /// Noise multiplier z, fixed at construction (calibrated if `eps` was given).
    noise_multiplier: f64,
}

impl GaussianMf {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let def = UserStepConfig::default();
        let d = p.usize_in("d", 20, 1, 1024)?;
        let steps = p.usize_in("steps", def.steps, 1, 100_000)?;
        let delta = p.positive("delta", 1e-5)?;
        let delta_r = p.positive("delta_r", dprec_dp::ledger::RATING_DELTA)?;
        for (k, v) in [("delta", delta), ("delta_r", delta_r)] {
            if v >= 1.0 {
                return Err(invalid(k, format!("must be < 1, got {v}")));
            }
        }
        let sigma = p
            .get_str("sigma")
            .map(|_| p.positive("sigma", 1.0))
            .transpose()?;
        let eps = p
            .get_str("eps")
            .map(|_| p.positive("eps", 1.0))
            .transpose()?;
        let noise = match (sigma, eps) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "sigma",
                    "give either sigma or eps (+ delta), not both",
                ))
            }
            (Some(z), None) => UserNoise::Multiplier(z),
            (None, Some(eps)) => UserNoise::Target { eps, delta },
            (None, None) => def.noise,
        };
        let neighbour = match p.get_str("neighbour").unwrap_or("add-remove") {
            "add-remove" => Neighbour::AddRemove,
            "replace" => Neighbour::Replace,
            s => {
                return Err(invalid(
                    "neighbour",
                    format!("{s:?}: use add-remove or replace"),
                ))
            }
        };
        let items = match p.get_str("items").unwrap_or("random") {
            "prior" => ItemSource::Prior,
            "random" => ItemSource::Random,
            s => return Err(invalid("items", format!("{s:?}: use prior or random"))),
        };
        let offsets = match p.get_str("offsets").unwrap_or("midpoint") {
            "midpoint" => OffsetSource::Midpoint,
            "prior" => OffsetSource::Prior,
            s => return Err(invalid("offsets", format!("{s:?}: use midpoint or prior"))),
        };
        let step = UserStepConfig {
            steps,
            lr: p.positive("lr", def.lr)?,
            lr_decay: p.positive("lr_decay", def.lr_decay)?,
            clip: p.positive("clip", def.clip)?,
            noise,
            lambda_u: p.non_negative("lambda_u", def.lambda_u)?,
            neighbour,
            user_bias: p.bool("user_bias", def.user_bias)?,
            max_norm: p.non_negative("max_norm", def.max_norm)?,
        };
        p.reject_unknown("gaussian-mf")?;
        let noise_multiplier = step.noise_multiplier()?;
        Ok(Self {
            d,
            step,
            items,
            offsets,
            delta_r,
            delta,
            noise_multiplier,
        })
    }

    /// The calibrated (or given) noise multiplier z.
    pub fn noise_multiplier(&self) -> f64 {
        self.noise_multiplier
    }
}

impl Trainer for GaussianMf {
    fn name(&self) -> &'static str {
        "gaussian-mf"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Proven
    }

    fn params(&self) -> serde_json::Value {
        let s = &self.step;
        let mut v = serde_json::json!({
            "d": self.d, "steps": s.steps, "lr": s.lr, "lr_decay": s.lr_decay, "clip": s.clip,
            "lambda_u": s.lambda_u, "user_bias": s.user_bias, "max_norm": s.max_norm,
            "neighbour": match s.neighbour { Neighbour::AddRemove => "add-remove", Neighbour::Replace => "replace" },
            "items": match self.items { ItemSource::Prior => "prior", ItemSource::Random => "random" },
            "offsets": match self.offsets { OffsetSource::Prior => "prior", OffsetSource::Midpoint => "midpoint" },
            "delta": self.delta, "delta_r": self.delta_r, "sigma": self.noise_multiplier,
        });
        if let UserNoise::Target { eps, .. } = s.noise {
            v["eps"] = serde_json::json!(eps);
        }
        v
    }

    fn planned_user_event(&self) -> Option<PrivacyEvent> {
        PrivacyEvent::gaussian(self.noise_multiplier, self.step.steps as u64).ok()
    }

    /// A user's at most `m` ratings move the user's clipped gradient sum by at most `m`
    /// times the one-rating sensitivity: `Gaussian { z / m, count: J }`.
    fn user_level_event(&self, m: u64) -> Option<PrivacyEvent> {
        PrivacyEvent::gaussian(
            self.noise_multiplier / m.max(1) as f64,
            self.step.steps as u64,
        )
        .ok()
    }

    fn rating_cap(&self) -> Option<f64> {
        gaussian_steps_eps(self.noise_multiplier, self.step.steps as u64, self.delta_r).ok()
    }

    fn scaled(&self, factor: f64) -> Option<Box<dyn Trainer>> {
        if !(factor.is_finite() && factor >= 1.0) {
            return None;
        }
        let mut out = self.clone();
        out.noise_multiplier = self.noise_multiplier * factor;
        Some(Box::new(out))
    }

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        let m = data.matrix;
        if data.ratings.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let (nu, ni) = (m.n_users, m.n_items);
        let prior = match (self.items, self.offsets, data.prior) {
            (ItemSource::Prior, _, None) | (_, OffsetSource::Prior, None) => {
                return Err(invalid(
                    if self.items == ItemSource::Prior {
                        "items"
                    } else {
                        "offsets"
                    },
                    "=prior needs a published DP model (TrainData.prior); none was given",
                ))
            }
            (_, _, p) => p,
        };
        let features = self.item_features(ni, prior, rng)?;
        let (global, item_bias) = self.offsets(data, prior);
        let mut step = self.step.clone();
        step.noise = UserNoise::Multiplier(self.noise_multiplier);
        let offsets = UserOffsets {
            global,
            item_bias: Some(&item_bias),
        };
        // Rating level (DESIGN 3): the J Gaussian steps cost every rating they touch
        // `eps` at the public delta_r (RDP of J steps, converted). A rating whose own
        // release budget cannot pay for that is left out of the step (the choice depends
        // on that rating's public budget alone); every rating used is charged.
        let steps = self.step.steps as u64;
        let eps = gaussian_steps_eps(self.noise_multiplier, steps, self.delta_r)?;
        let usable = |k: usize| data.budgets.is_none_or(|b| b.get(k) >= eps);
        let view = m.by_user.retain(usable);
        let out = dp_user_step(&view, &offsets, features.view(), None, &step, rng)?;
        let mut charges = out.charges;
        charges.ratings = view
            .source
            .iter()
            .map(|&position| RatingCharge { position, eps })
            .collect();
        if let Some(rec) = charges.mechanisms.first_mut() {
            self.describe_rating_level(rec, eps, out.noise_multiplier);
        }
        let model = FactorModel {
            global_mean: global,
            user_bias: out.user_bias.unwrap_or_else(|| Array1::zeros(nu)),
            item_bias: Array1::from(item_bias),
            user_factors: out.user_factors,
            item_factors: features,
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

impl GaussianMf {
    /// The public item features of the step: the prior model's (zero rows for items it
    /// never published) or random `N(0, 1/d)` ones.
    fn item_features(
        &self,
        ni: usize,
        prior: Option<&FactorModel>,
        rng: &mut DpRng,
    ) -> Result<Array2<f64>, TrainError> {
        Ok(match self.items {
            ItemSource::Prior => {
                let p = prior.expect("checked by fit");
                if p.rank() != self.d {
                    return Err(invalid(
                        "d",
                        format!("is {} but the prior model has rank {}", self.d, p.rank()),
                    ));
                }
                // Items the prior never published get zero features (public).
                let mut f = Array2::zeros((ni, self.d));
                let n = ni.min(p.item_factors.nrows());
                f.slice_mut(ndarray::s![..n, ..])
                    .assign(&p.item_factors.slice(ndarray::s![..n, ..]));
                f
            }
            ItemSource::Random => {
                let s = 1.0 / (self.d as f64).sqrt();
                Array2::from_shape_fn((ni, self.d), |_| {
                    s * <StandardNormal as Distribution<f64>>::sample(&StandardNormal, rng)
                })
            }
        })
    }

    /// The public offsets `(global mean, item biases)`: the scale's midpoint and zeros,
    /// or the prior model's.
    fn offsets(&self, data: &TrainData<'_>, prior: Option<&FactorModel>) -> (f64, Vec<f64>) {
        let ni = data.matrix.n_items;
        match self.offsets {
            OffsetSource::Midpoint => (0.5 * (data.scale.min + data.scale.max), vec![0.0; ni]),
            OffsetSource::Prior => {
                let p = prior.expect("checked by fit");
                let mut b = vec![0.0; ni];
                for (j, x) in b.iter_mut().enumerate() {
                    *x = p.item_bias.get(j).copied().unwrap_or(0.0);
                }
                (p.global_mean, b)
            }
        }
    }

    /// Adds the rating-level cost (`eps` per rating at `delta_r`) and the paper's view of
    /// the same steps to the step's mechanism record.
    fn describe_rating_level(&self, rec: &mut MechanismRecord, eps: f64, noise_multiplier: f64) {
        let steps = self.step.steps as u64;
        let eps_i = paper_step_eps(noise_multiplier, self.delta);
        rec.params["per_user_eps"] = serde_json::json!(eps);
        rec.params["per_rating_eps"] = serde_json::json!(eps);
        rec.params["rating_selection"] =
            serde_json::json!("ratings whose release budget >= per_rating_eps");
        rec.params["delta_r"] = serde_json::json!(self.delta_r);
        rec.params["paper_step_eps_i"] = serde_json::json!(eps_i);
        rec.params["paper_delta"] = serde_json::json!(self.delta);
        rec.params["paper_eps_opt"] =
            serde_json::json!(paper_eps_opt(steps, eps_i, self.delta, self.delta_r));
        rec.params["items"] = self.params()["items"].clone();
        rec.params["offsets"] = self.params()["offsets"].clone();
    }
}
