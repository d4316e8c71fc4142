//! `paper-gaussian-mf`: Algorithm 1 of Mugdho and Imtiaz as written, kept to reproduce the
//! paper's experiments. Its guarantee is [`Guarantee::PaperClaimed`] and its charges, what
//! the paper claims, are labelled [`PAPER_FAITHFUL`] (see the parent module for why the
//! claim does not hold).

use ndarray::{Array1, Array2};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use rayon::prelude::*;

use crate::data::{Compressed, Interactions};
use crate::train::invalid;
use crate::train::{FactorModel, Fitted, Guarantee, Params, TrainData, TrainError, Trainer};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::charges::{MechanismRecord, Neighbour, PrivacyUnit, PAPER_FAITHFUL};
use dprec_dp::privacy::gaussian;
use dprec_dp::rng::DpRng;

use super::{
    gaussian_steps_eps, paper_eps_opt, paper_noise_multiplier, user_rng, user_step_charges,
};

/// `paper-gaussian-mf`: Algorithm 1 of Mugdho and Imtiaz as written. NOT proven for this
/// code (X is fitted without noise on the same ratings); charges as the paper claims.
#[derive(Debug, Clone)]
pub struct PaperGaussianMf {
    /// Profile dimension n.
    pub d: usize,
    /// Number of iterations J (the paper iterates "until converged"; a fixed J here).
    pub steps: usize,
    /// Step size mu.
    pub lr: f64,
    /// Regulariser lambda (on X and Theta).
    pub lambda: f64,
    /// Norm clipping parameter C (rows of X in the Theta gradient, rows of Theta in the
    /// X gradient).
    pub clip: f64,
    /// Per-iteration (eps_i, delta).
    pub eps_i: f64,
    pub delta: f64,
    /// Target delta_r of Theorem 2.
    pub delta_r: f64,
    /// Range of ratings tau; 0 = the data's scale width (max - min).
    pub tau: f64,
}

impl Default for PaperGaussianMf {
    fn default() -> Self {
        Self {
            d: 20,
            steps: 300,
            lr: 0.0005,
            lambda: 0.1,
            clip: 1.0,
            eps_i: 0.5,
            delta: 0.01,
            delta_r: 1e-5,
            tau: 0.0,
        }
    }
}

impl PaperGaussianMf {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let def = Self::default();
        let t = Self {
            d: p.usize_in("d", def.d, 1, 1024)?,
            steps: p.usize_in("steps", def.steps, 1, 100_000)?,
            lr: p.positive("lr", def.lr)?,
            lambda: p.non_negative("lambda", def.lambda)?,
            clip: p.positive("clip", def.clip)?,
            eps_i: p.positive("eps_i", def.eps_i)?,
            delta: p.positive("delta", def.delta)?,
            delta_r: p.positive("delta_r", def.delta_r)?,
            tau: p.non_negative("tau", def.tau)?,
        };
        for (k, v) in [("delta", t.delta), ("delta_r", t.delta_r)] {
            if v >= 1.0 {
                return Err(invalid(k, format!("must be < 1, got {v}")));
            }
        }
        p.reject_unknown("paper-gaussian-mf")?;
        Ok(t)
    }

    /// The claimed per-step noise multiplier sigma / (tau C) = sqrt(2 ln(1.25/delta))/eps_i.
    pub fn claimed_noise_multiplier(&self) -> f64 {
        paper_noise_multiplier(self.eps_i, self.delta)
    }
}

/// Row `r` of a row-major `n x d` buffer scaled to norm <= `c` (the paper's clipping).
fn clipped_rows(m: &[f64], d: usize, c: f64) -> Vec<f64> {
    let mut out = m.to_vec();
    out.par_chunks_mut(d).for_each(|row| {
        let n = row.iter().map(|x| x * x).sum::<f64>().sqrt();
        if n > c {
            row.iter_mut().for_each(|x| *x *= c / n);
        }
    });
    out
}

/// Rows of i.i.d. N(0, 1) entries normalised to unit norm (the paper's initialisation).
fn unit_rows(n: usize, d: usize, rng: &mut DpRng) -> Vec<f64> {
    let mut v: Vec<f64> = (0..n * d)
        .map(|_| <StandardNormal as Distribution<f64>>::sample(&StandardNormal, rng))
        .collect();
    for row in v.chunks_mut(d) {
        let n = row.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-300);
        row.iter_mut().for_each(|x| *x /= n);
    }
    v
}

/// grad[row] = sum over the row's entries of (self . other_c[col] - r) other_c[col]
/// + lambda self, where residuals use the unclipped `other` (V_hat = X Theta^T).
fn half_gradient(
    rows: &Compressed,
    this: &[f64],
    other: &[f64],
    other_clipped: &[f64],
    d: usize,
    lambda: f64,
) -> Vec<f64> {
    let mut grad = vec![0.0; this.len()];
    grad.par_chunks_mut(d).enumerate().for_each(|(r, g)| {
        let me = &this[r * d..(r + 1) * d];
        let (cols, vals) = rows.row(r);
        for (&c, &v) in cols.iter().zip(vals) {
            let c = c as usize;
            let o = &other[c * d..(c + 1) * d];
            let pred: f64 = me.iter().zip(o).map(|(a, b)| a * b).sum();
            let e = pred - v as f64;
            let oc = &other_clipped[c * d..(c + 1) * d];
            for (gk, &x) in g.iter_mut().zip(oc) {
                *gk += e * x;
            }
        }
        for (gk, &m) in g.iter_mut().zip(me) {
            *gk += lambda * m;
        }
    });
    grad
}

impl PaperGaussianMf {
    /// Algorithm 1's loop: `steps` gradient steps on X (no noise) and Theta (clipped
    /// gradients plus `N(0, sigma^2)` noise, user `u` drawing from stream `u` of a key
    /// drawn from `rng`), from random unit rows. Returns (X, Theta), row-major.
    fn algorithm1(
        &self,
        m: &Interactions,
        sigma: f64,
        rng: &mut DpRng,
    ) -> Result<(Vec<f64>, Vec<f64>), TrainError> {
        let (nu, ni, d) = (m.n_users, m.n_items, self.d);
        let mut x = unit_rows(ni, d, rng);
        let mut theta = unit_rows(nu, d, rng);
        let key: [u8; 32] = rng.random();
        let mut user_rngs: Vec<DpRng> = (0..nu).map(|u| user_rng(key, u)).collect();
        for _ in 0..self.steps {
            let theta_c = clipped_rows(&theta, d, self.clip);
            let x_c = clipped_rows(&x, d, self.clip);
            // Line 5: grad_X = (V_hat - V) Theta_c + lambda X (no noise).
            let gx = half_gradient(m.by_item(), &x, &theta, &theta_c, d, self.lambda);
            // Line 6: grad_Theta = (V_hat - V)^T X_c + lambda Theta; line 7-8: + eta.
            let mut gt = half_gradient(&m.by_user, &theta, &x, &x_c, d, self.lambda);
            gt.par_chunks_mut(d)
                .zip(user_rngs.par_iter_mut())
                .try_for_each(|(g, r)| -> Result<(), TrainError> {
                    for gk in g.iter_mut() {
                        *gk += gaussian(sigma, r)?;
                    }
                    Ok(())
                })?;
            // Lines 9-10.
            x.iter_mut().zip(&gx).for_each(|(a, g)| *a -= self.lr * g);
            theta
                .iter_mut()
                .zip(&gt)
                .for_each(|(a, g)| *a -= self.lr * g);
        }
        if x.iter().chain(&theta).any(|v| !v.is_finite()) {
            return Err(TrainError::Numerical(
                "paper-gaussian-mf diverged (non-finite factors): lower lr".into(),
            ));
        }
        Ok((x, theta))
    }
}

impl Trainer for PaperGaussianMf {
    fn name(&self) -> &'static str {
        "paper-gaussian-mf"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::PaperClaimed
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "d": self.d, "steps": self.steps, "lr": self.lr, "lambda": self.lambda,
            "clip": self.clip, "eps_i": self.eps_i, "delta": self.delta,
            "delta_r": self.delta_r, "tau": self.tau,
        })
    }

    /// The event the paper claims for each user (NOT proven for this code).
    fn planned_user_event(&self) -> Option<PrivacyEvent> {
        PrivacyEvent::gaussian(self.claimed_noise_multiplier(), self.steps as u64).ok()
    }

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        if data.ratings.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let m = data.matrix;
        let (nu, ni, d) = (m.n_users, m.n_items, self.d);
        let tau = if self.tau > 0.0 {
            self.tau
        } else {
            data.scale.width()
        };
        let z = self.claimed_noise_multiplier();
        let sigma = z * tau * self.clip;
        let (x, theta) = self.algorithm1(m, sigma, rng)?;
        let steps = self.steps as u64;
        let event = PrivacyEvent::gaussian(z, steps)?;
        let eps_opt = paper_eps_opt(steps, self.eps_i, self.delta, self.delta_r);
        let accountant_eps = gaussian_steps_eps(z, steps, self.delta_r)?;
        let record = MechanismRecord {
            name: "paper-gaussian-mf".into(),
            params: serde_json::json!({
                "label": PAPER_FAITHFUL,
                "eps_i": self.eps_i, "delta": self.delta, "delta_r": self.delta_r,
                "steps": steps, "tau": tau, "clip": self.clip, "sigma": sigma,
                "noise_multiplier": z, "lr": self.lr, "lambda": self.lambda, "d": d,
                "paper_eps_opt": eps_opt,
                "accountant_eps_of_claimed_event": accountant_eps,
                "why_not_proven": "X is updated without noise from the same ratings, so \
                    each user's profile depends on other users' ratings through X",
            }),
            unit: PrivacyUnit::Rating,
            neighbour: Neighbour::Replace,
        };
        // Every user with a rating is charged the claimed event.
        let charges = user_step_charges(&m.by_user, None, &event, record);
        let model = FactorModel {
            global_mean: 0.0,
            user_bias: Array1::zeros(nu),
            item_bias: Array1::zeros(ni),
            user_factors: Array2::from_shape_vec((nu, d), theta).expect("shape"),
            item_factors: Array2::from_shape_vec((ni, d), x).expect("shape"),
            scale: data.scale,
        };
        Ok(Fitted {
            model,
            charges,
            guarantee: Guarantee::PaperClaimed,
            ranker: None,
        })
    }
}
