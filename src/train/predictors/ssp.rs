//! The SSP user step: DP user profiles by sufficient-statistics perturbation (Sheffet 2017,
//! "Differentially private ordinary least squares"; Wang 2018, "Revisiting differentially
//! private linear regression"), an alternative to the gradient-descent step
//! [`dp_user_step`](crate::train::predictors::gaussian_mf::dp_user_step) with the same shape, so a trainer can call either.
//!
//! # Mechanism ([`ssp_user_step`])
//!
//! With the item features PUBLIC and fixed (DESIGN 2.2), user u's profile is a ridge
//! regression on u's ratings only. For every eligible user:
//!
//! 1. features `x_j = [a v_j / max(1, ||v_j||), b]` with `a = sqrt(1 - b^2)` and the public
//!    bias weight `b` in `[0, 1)` (`b = 0`: no bias coordinate, `x_j = v_j / max(1, ||v_j||)`).
//!    So `||x_j|| <= 1` for every item, whatever `V` is; this is post-processing of the
//!    public `V`. The bias coordinate is `b`, not 1: the released profile is
//!    `(a theta_lat, b theta_bias)` so that predictions are
//!    `user_factor . clip(v_j) + user_bias` with `clip(v) = v / max(1, ||v||)`;
//!    a caller publishing the profiles MUST pair them with the clipped item rows
//!    ([`crate::train::predictors::objpert::clip_rows`]), which a caller must do;
//! 2. targets `y_uj = clamp(r_uj - o_j, -c_y, c_y)` with public offsets `o_j`
//!    (DP global mean + DP item bias);
//! 3. statistics `A_u = sum_j x_j x_j^T` (its upper triangle with the diagonal, in row-major
//!    order) and `b_u = sum_j y_uj x_j`, packed in one vector `s_u` ([`sufficient_statistics`]);
//! 4. release `s_u + N(0, (z Delta)^2 I)` ([`noisy_statistics`]), `Delta` as below, and
//!    rebuild the symmetric noisy `A_u` from the noisy upper triangle;
//! 5. post-processing only ([`solve_statistics`]): `theta_u = (A_u + lambda I)^-1 b_u`
//!    with the public `lambda = lambda_u`; if `A_u + lambda I` is not positive definite
//!    (noise), the shift is raised (`lambda + s 2^k`, `k = 0, 1, ...`, public `s`) until
//!    the Cholesky factorisation succeeds; then optionally `theta_u` is projected onto the
//!    L2 ball of the public radius `max_norm`.
//!
//! # Claim (unit: one rating; neighbour: add/remove, or replace)
//!
//! Adding or removing one rating `(u, j)` changes only `s_u`, by
//! `(upper(x_j x_j^T), y_uj x_j)`, whose squared L2 norm is
//! `sum_{k <= l} x_k^2 x_l^2 + y^2 ||x||^2 <= ||x||^4 + c_y^2 ||x||^2 <= 1 + c_y^2`
//! (the upper triangle is a subset of the entries of `x x^T`, whose Frobenius norm is
//! `||x||^2 <= 1`; `|y| <= c_y`). So `Delta = sqrt(1 + c_y^2)`. Replacing one rating's value
//! (the indicator, hence `A_u`, fixed) changes only `b_u`, by `(y - y') x_j`:
//! `Delta = 2 c_y`. Adding `N(0, (z Delta)^2)` to every released coordinate is ONE Gaussian
//! mechanism with noise multiplier `z`: `(alpha, alpha / (2 z^2))`-RDP (Mironov 2017,
//! Prop. 7). Solving, symmetrising, the PD fix and the projection are post-processing.
//! `theta_u` depends only on u's ratings, public inputs and u's own noise, so users
//! compose in parallel: each eligible user with at least one rating is charged
//! `PrivacyEvent::Gaussian { noise_multiplier: z, count: 1 }`; nobody else.
//!
//! Eligible users without ratings get the same release (`s_u = 0` plus the same noise) and
//! no charge: a deterministic profile for empty users would reveal a user's first rating
//! with certainty. Ineligible users get a zero profile and use nothing.
//!
//! Randomness: one 256-bit ChaCha20 key per call, user u uses stream u of it (the output
//! does not depend on the thread count). Cost `O(n_u dim^2 + dim^3)` per user.
//!
//! The proof and the tests that guard each scale are in `docs/privacy/gaussian-mf.md`
//! (section "SSP").

use ndarray::{Array1, Array2, ArrayView1, ArrayView2};
use rand::Rng;
use rayon::prelude::*;

use crate::data::Compressed;
use crate::numerics::linalg::cholesky_solve;
use crate::train::invalid;
use crate::train::predictors::gaussian_mf::{
    check_user_step_inputs, user_rng, user_step_charges, UserOffsets, UserStepOutput,
};
use crate::train::TrainError;
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::charges::{MechanismRecord, Neighbour, PrivacyUnit};
use dprec_dp::privacy::gaussian;
use dprec_dp::rng::DpRng;

/// Hyper-parameters of [`ssp_user_step`]. All public.
#[derive(Debug, Clone, PartialEq)]
pub struct SspConfig {
    /// Noise multiplier z = sigma / Delta (one Gaussian release per user per step).
    pub noise_multiplier: f64,
    /// Target clip c_y: `y = clamp(r - offset, -c_y, c_y)`.
    pub clip_y: f64,
    /// Ridge penalty lambda on theta (the starting diagonal shift of the solve).
    pub lambda_u: f64,
    /// Weight b in `[0, 1)` of the constant (user-bias) feature; latent part scaled by
    /// `sqrt(1 - b^2)`. 0 = no user bias.
    pub bias_weight: f64,
    /// AddRemove: Delta = sqrt(1 + c_y^2); Replace: Delta = 2 c_y.
    pub neighbour: Neighbour,
    /// Project theta_u onto the L2 ball of this radius (0 = no projection).
    pub max_norm: f64,
}

impl Default for SspConfig {
    fn default() -> Self {
        Self {
            noise_multiplier: 4.0,
            clip_y: 1.5,
            lambda_u: 10.0,
            bias_weight: 0.7,
            neighbour: Neighbour::AddRemove,
            max_norm: 0.0,
        }
    }
}

impl SspConfig {
    /// Checks every field; errors name it (`user_sigma`, `clip_y`, `lambda_u`, `user_bias`,
    /// `max_norm`: the parameter names of the earlier `dp-alt`).
    pub fn validate(&self) -> Result<(), TrainError> {
        let z = self.noise_multiplier;
        if !(z.is_finite() && z > 0.0) {
            return Err(invalid(
                "user_sigma",
                format!("must be finite and > 0, got {z}"),
            ));
        }
        if !(self.clip_y.is_finite() && self.clip_y > 0.0) {
            return Err(invalid(
                "clip_y",
                format!("must be finite and > 0, got {}", self.clip_y),
            ));
        }
        if !(self.lambda_u.is_finite() && self.lambda_u >= 0.0) {
            return Err(invalid(
                "lambda_u",
                format!("must be finite and >= 0, got {}", self.lambda_u),
            ));
        }
        if !(0.0..1.0).contains(&self.bias_weight) {
            return Err(invalid(
                "user_bias",
                format!("must be in [0, 1), got {}", self.bias_weight),
            ));
        }
        if !(self.max_norm.is_finite() && self.max_norm >= 0.0) {
            return Err(invalid(
                "max_norm",
                format!("must be finite and >= 0, got {}", self.max_norm),
            ));
        }
        Ok(())
    }

    /// L2 sensitivity of the packed statistics: sqrt(1 + c_y^2) (add/remove) or 2 c_y
    /// (replace; A_u does not change).
    pub fn sensitivity(&self) -> f64 {
        match self.neighbour {
            Neighbour::AddRemove => (1.0 + self.clip_y * self.clip_y).sqrt(),
            Neighbour::Replace => 2.0 * self.clip_y,
        }
    }

    /// Noise standard deviation per released coordinate: z * Delta.
    pub fn noise_std(&self) -> f64 {
        self.noise_multiplier * self.sensitivity()
    }

    /// The event each eligible user with ratings is charged: Gaussian { z, count: 1 }.
    pub fn event(&self) -> Result<PrivacyEvent, TrainError> {
        Ok(PrivacyEvent::gaussian(self.noise_multiplier, 1)?)
    }

    /// Dimension of theta for `d` latent coordinates (`d + 1` with a bias coordinate).
    pub fn dim(&self, d: usize) -> usize {
        d + usize::from(self.bias_weight > 0.0)
    }
}

/// Length of the packed statistics for `dim`: `dim (dim + 1) / 2` (upper triangle of A,
/// with the diagonal) `+ dim` (b).
pub fn packed_len(dim: usize) -> usize {
    dim * (dim + 1) / 2 + dim
}

/// Writes `x = [a v / max(1, ||v||), b]` (`a = sqrt(1 - b^2)`; no bias coordinate when
/// `b = 0`) into `out` (length `v.len() + [b > 0]`). `||x|| <= 1`.
pub fn feature_row(v: ArrayView1<'_, f64>, bias_weight: f64, out: &mut [f64]) {
    let n = v.dot(&v).sqrt();
    let a = (1.0 - bias_weight * bias_weight).sqrt() / n.max(1.0);
    for (o, &x) in out.iter_mut().zip(v.iter()) {
        *o = a * x;
    }
    if bias_weight > 0.0 {
        out[v.len()] = bias_weight;
    }
}

/// The pre-noise statistics of one user, packed: upper triangle of
/// `A = sum_j x_j x_j^T` (row-major, diagonal included), then `b = sum_j y_j x_j`, with
/// `x_j` = [`feature_row`] of item j's row of `item_features` (raw: the clipping is done
/// here) and `y_j = clamp(r_j - offsets.of(j), -clip_y, clip_y)`. `out` has length
/// [`packed_len`]`(dim)`.
///
/// Adding or removing one rating changes the result by a vector of L2 norm
/// `<= sqrt(1 + clip_y^2)`; replacing one rating's value, by `<= 2 clip_y`.
pub fn sufficient_statistics(
    items: &[u32],
    values: &[f32],
    offsets: &UserOffsets<'_>,
    item_features: ArrayView2<'_, f64>,
    bias_weight: f64,
    clip_y: f64,
    out: &mut [f64],
) {
    let dim = item_features.ncols() + usize::from(bias_weight > 0.0);
    debug_assert_eq!(out.len(), packed_len(dim));
    out.iter_mut().for_each(|s| *s = 0.0);
    let tri = dim * (dim + 1) / 2;
    let mut x = vec![0.0; dim];
    for (&j, &r) in items.iter().zip(values) {
        let j = j as usize;
        feature_row(item_features.row(j), bias_weight, &mut x);
        let y = (r as f64 - offsets.of(j)).clamp(-clip_y, clip_y);
        let mut p = 0;
        for k in 0..dim {
            for l in k..dim {
                out[p] += x[k] * x[l];
                p += 1;
            }
        }
        for (o, &xk) in out[tri..].iter_mut().zip(&x) {
            *o += y * xk;
        }
    }
}

/// Shared input checks of [`noisy_statistics`] and [`ssp_user_step`].
fn check_inputs(
    by_user: &Compressed,
    item_features: ArrayView2<'_, f64>,
    eligible: Option<&[bool]>,
    cfg: &SspConfig,
) -> Result<(), TrainError> {
    cfg.validate()?;
    if cfg.dim(item_features.ncols()) == 0 {
        return Err(invalid(
            "d",
            "d = 0 needs a bias coordinate (user_bias > 0)",
        ));
    }
    check_user_step_inputs(by_user, item_features, eligible)
}

/// The released statistics of every user (`n_users x packed_len(dim)`): for eligible
/// users the [`sufficient_statistics`] (zeros without ratings) plus i.i.d.
/// `N(0, (z Delta)^2)` per coordinate from the user's own stream; zero rows for
/// ineligible users. One 256-bit key is drawn from `rng`; user u uses stream u.
/// [`ssp_user_step`] is exactly this followed by [`solve_statistics`] per user.
pub fn noisy_statistics(
    by_user: &Compressed,
    offsets: &UserOffsets<'_>,
    item_features: ArrayView2<'_, f64>,
    eligible: Option<&[bool]>,
    cfg: &SspConfig,
    rng: &mut DpRng,
) -> Result<Array2<f64>, TrainError> {
    check_inputs(by_user, item_features, eligible, cfg)?;
    let n_users = by_user.n_rows();
    let dim = cfg.dim(item_features.ncols());
    let len = packed_len(dim);
    let std = cfg.noise_std();
    let key: [u8; 32] = rng.random();
    let mut stats = Array2::zeros((n_users, len));
    stats
        .as_slice_mut()
        .expect("standard layout")
        .par_chunks_mut(len)
        .enumerate()
        .try_for_each(|(u, s)| -> Result<(), TrainError> {
            if eligible.is_some_and(|e| !e[u]) {
                return Ok(());
            }
            let (items, values) = by_user.row(u);
            sufficient_statistics(
                items,
                values,
                offsets,
                item_features,
                cfg.bias_weight,
                cfg.clip_y,
                s,
            );
            let mut urng = user_rng(key, u);
            for v in s.iter_mut() {
                *v += gaussian(std, &mut urng)?;
            }
            Ok(())
        })?;
    Ok(stats)
}

/// Post-processing of one user's released statistics `s` (packed, [`packed_len`]`(dim)`):
/// `theta = (A + shift I)^-1 b` with `A` the symmetric matrix of the upper triangle, where
/// `shift = lambda` if `A + lambda I` is positive definite, else the first of
/// `lambda + step 2^k` (`k = 0, 1, ...`) that is; then theta is scaled to norm
/// `<= max_norm` when `max_norm > 0`. Returns theta and the shift used. Uses nothing but
/// `s` and public constants.
pub fn solve_statistics(
    s: &[f64],
    dim: usize,
    lambda: f64,
    step: f64,
    max_norm: f64,
) -> Result<(Vec<f64>, f64), TrainError> {
    debug_assert_eq!(s.len(), packed_len(dim));
    let tri = dim * (dim + 1) / 2;
    let mut a0 = vec![0.0; dim * dim];
    let mut p = 0;
    for k in 0..dim {
        for l in k..dim {
            a0[k * dim + l] = s[p];
            a0[l * dim + k] = s[p];
            p += 1;
        }
    }
    let step = step.max(1e-12);
    let mut shift = lambda;
    for k in 0..=200 {
        let mut a = a0.clone();
        for i in 0..dim {
            a[i * dim + i] += shift;
        }
        let mut theta = s[tri..].to_vec();
        if cholesky_solve(&mut a, &mut theta, dim) && theta.iter().all(|t| t.is_finite()) {
            if max_norm > 0.0 {
                let n = theta.iter().map(|t| t * t).sum::<f64>().sqrt();
                if n > max_norm {
                    theta.iter_mut().for_each(|t| *t *= max_norm / n);
                }
            }
            return Ok((theta, shift));
        }
        shift = lambda + step * 2f64.powi(k);
    }
    Err(TrainError::Numerical(
        "ssp: no positive definite shift found (non-finite statistics?)".into(),
    ))
}

/// The SSP user step; see the module documentation for the mechanism and the claim.
/// Arguments as [`gaussian_mf::dp_user_step`](crate::train::predictors::gaussian_mf::dp_user_step):
/// `item_features` are PUBLIC raw rows (clipped to norm 1 here); `eligible` users
/// (`None` = all) get a noisy profile, those with ratings are charged
/// `Gaussian { z, count: 1 }`; ineligible users get zeros.
///
/// Output: `user_factors[u] = sqrt(1 - b^2) theta_lat`, `user_bias[u] = b theta_bias`
/// (`None` when `b = 0`), so the prediction offset is
/// `user_factors[u] . clip(v_j) + user_bias[u]` with `clip(v) = v / max(1, ||v||)`.
pub fn ssp_user_step(
    by_user: &Compressed,
    offsets: &UserOffsets<'_>,
    item_features: ArrayView2<'_, f64>,
    eligible: Option<&[bool]>,
    cfg: &SspConfig,
    rng: &mut DpRng,
) -> Result<UserStepOutput, TrainError> {
    let stats = noisy_statistics(by_user, offsets, item_features, eligible, cfg, rng)?;
    let n_users = by_user.n_rows();
    let d = item_features.ncols();
    let dim = cfg.dim(d);
    let noise_std = cfg.noise_std();
    // Public step of the positive-definiteness fix: the noise scale of the diagonal.
    let step = cfg.lambda_u.max(noise_std);
    let solved: Vec<Result<Vec<f64>, TrainError>> = (0..n_users)
        .into_par_iter()
        .map(|u| {
            if eligible.is_some_and(|e| !e[u]) {
                return Ok(vec![0.0; dim]);
            }
            let s = stats.row(u);
            let s = s.as_slice().expect("standard layout");
            Ok(solve_statistics(s, dim, cfg.lambda_u, step, cfg.max_norm)?.0)
        })
        .collect();
    let b = cfg.bias_weight;
    let a = (1.0 - b * b).sqrt();
    let mut user_factors = Array2::zeros((n_users, d));
    let mut user_bias = (b > 0.0).then(|| Array1::zeros(n_users));
    for (u, theta) in solved.into_iter().enumerate() {
        let theta = theta?;
        for k in 0..d {
            user_factors[[u, k]] = a * theta[k];
        }
        if let Some(ub) = user_bias.as_mut() {
            ub[u] = b * theta[d];
        }
    }
    let event = cfg.event()?;
    let params = serde_json::json!({
        "noise_multiplier": cfg.noise_multiplier, "noise_std": noise_std,
        "sensitivity": cfg.sensitivity(), "clip_y": cfg.clip_y, "lambda_u": cfg.lambda_u,
        "bias_weight": cfg.bias_weight, "max_norm": cfg.max_norm, "d": d,
        "released": "upper triangle of A_u = sum x_j x_j^T and b_u = sum y_uj x_j, ||x_j|| <= 1, |y_uj| <= clip_y",
        "item_features": "public (fixed during the step), rows clipped to norm 1",
    });
    let record = MechanismRecord {
        name: "ssp-user-step".into(),
        params,
        unit: PrivacyUnit::Rating,
        neighbour: cfg.neighbour,
    };
    let charges = user_step_charges(by_user, eligible, &event, record);
    Ok(UserStepOutput {
        user_factors,
        user_bias,
        charges,
        noise_multiplier: cfg.noise_multiplier,
        noise_std,
        event,
    })
}
