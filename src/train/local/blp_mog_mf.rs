//! BLP-MoG-MF (Neera, Chen, Aslam, Wang, Shen): matrix factorization of ratings that the
//! clients perturbed locally with the bounded Laplace mechanism, with the perturbation
//! noise modelled as a mixture of Gaussians (MoG) and fitted by EM.
//!
//! Model (paper eq. 5-8): `r*_ij = s_ij + e_ij` with `s_ij = mu + b_i + c_j + u_i . v_j`
//! and `e_ij ~ sum_k pi_k N(0, sigma_k^2)`. EM (paper section 3.4, Algorithm 2), every
//! iteration:
//! - E-step (eq. 10): responsibilities `gamma_ijk` of each component for each residual;
//! - M-step for the mixture (eq. 12): `N_k = sum gamma_ijk`, `pi_k = N_k / N`,
//!   `sigma_k^2 = sum gamma_ijk e_ij^2 / N_k`;
//! - M-step for the factors (eq. 13-14): weighted least squares with
//!   `w_ij = sum_k gamma_ijk / (2 sigma_k^2)`, solved here by one sweep of weighted
//!   alternating ridge regressions (users, then items).
//!
//! It stops after `em_iters` iterations or when the user factors change by less than
//! `tol` (relative Frobenius norm), the paper's convergence rule.
//!
//! Choices the paper leaves open (documented in docs/privacy/blp-ldp.md): the number of
//! components (default 3), the iterations, the weighted solver (the paper used WPCA; we
//! use weighted ALS), a ridge penalty (weighted ALS-WR: `reg` times the row's normalised
//! weight), global mean and bias terms (a biased factorization is a low-rank one with two
//! constrained columns), the initialisation of the mixture (equal weights, scales spread
//! by factors of 2 around the residual spread) and the rating units (the raw scale; the
//! paper's min-max normalisation to [0, 1] only rescales b, sigma and reg).
//!
//! Privacy: training is post-processing of the perturbed ratings and charges nothing
//! (DESIGN 3, LDP). With `eps` set the trainer first plays the clients itself, perturbing
//! every training rating with [`crate::ldp::RatingPerturber`] (or, with
//! `mechanism=laplace`, the naive clamped Laplace of ISGD, the paper's baseline): an
//! evaluation of the paper's experiment, reported with the per-rating LDP charge and
//! labelled paper-claimed (the curator sees which ratings exist, so no add/remove claim
//! covers it), never served.

use ndarray::{Array1, Array2};
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use serde_json::json;

use crate::data::{Compressed, Interactions, RatingScale, Ratings};
use crate::ldp::RatingPerturber;
use crate::numerics::linalg::cholesky_solve;
use crate::train::{
    FactorModel, Fitted, Guarantee, Params, ReleaseCharges, TrainData, TrainError, Trainer,
};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::charges::{MechanismRecord, Neighbour, PrivacyUnit, RatingCharge, UserCharge};
use dprec_dp::rng::DpRng;

/// The client perturbation played by the trainer in evaluation (`eps` set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Simulated {
    /// Bounded Laplace, b = width/eps (the paper's mechanism, the service's LDP form).
    BoundedLaplace,
    /// Laplace with b = width/eps, then clamped to the scale (ISGD, the paper's baseline).
    ClampedLaplace,
}

impl Simulated {
    fn name(self) -> &'static str {
        match self {
            Simulated::BoundedLaplace => "bounded-laplace",
            Simulated::ClampedLaplace => "laplace",
        }
    }
}

#[derive(Debug, Clone)]
pub struct BlpMogMf {
    /// Rank of the factors.
    pub d: usize,
    /// Number of Gaussian components K (1: plain weighted MF, i.e. plain ALS).
    pub components: usize,
    /// Maximum EM iterations (one factor sweep each).
    pub em_iters: usize,
    /// Stop when ||U_new - U_old||_F / ||U_old||_F < tol.
    pub tol: f64,
    /// Ridge penalty (prior precision) of every bias and factor row.
    pub reg: f64,
    /// With `eps` set: map each perturbed value through the affine inverse of the
    /// bounded Laplace mean (see [`blp_debias`]) before fitting (not in the paper).
    pub debias: bool,
    pub init_sd: f64,
    /// Local eps of the simulated clients (evaluation only); `None`: the input ratings
    /// are already perturbed.
    pub eps: Option<f64>,
    pub mechanism: Simulated,
}

impl Default for BlpMogMf {
    fn default() -> Self {
        Self {
            d: 10,
            components: 3,
            em_iters: 20,
            tol: 1e-4,
            reg: 10.0,
            init_sd: 0.1,
            debias: false,
            eps: None,
            mechanism: Simulated::BoundedLaplace,
        }
    }
}

impl BlpMogMf {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let d = Self::default();
        let eps = match p.get_str("eps") {
            None => None,
            Some(_) => Some(p.positive("eps", 1.0)?),
        };
        let mechanism = match p.get_str("mechanism").unwrap_or("bounded-laplace") {
            "bounded-laplace" | "blp" => Simulated::BoundedLaplace,
            "laplace" => Simulated::ClampedLaplace,
            other => {
                return Err(crate::train::ParamError::Invalid {
                    key: "mechanism".into(),
                    reason: format!("{other:?} is not bounded-laplace or laplace"),
                }
                .into())
            }
        };
        let t = Self {
            d: p.usize_in("d", d.d, 1, 1024)?,
            components: p.usize_in("components", d.components, 1, 16)?,
            em_iters: p.usize_in("em_iters", d.em_iters, 1, 1000)?,
            tol: p.non_negative("tol", d.tol)?,
            reg: p.positive("reg", d.reg)?,
            init_sd: p.non_negative("init_sd", d.init_sd)?,
            debias: p.bool("debias", d.debias)?,
            eps,
            mechanism,
        };
        p.reject_unknown("blp-mog-mf")?;
        Ok(t)
    }
}

/// Plays the clients: every value perturbed independently with local `eps`.
pub fn simulate_clients(
    ratings: &Ratings,
    scale: RatingScale,
    eps: f64,
    mechanism: Simulated,
    rng: &mut DpRng,
) -> Result<Ratings, TrainError> {
    let mut out = ratings.clone();
    match mechanism {
        Simulated::BoundedLaplace => {
            let p = RatingPerturber::new(eps, scale)?;
            for v in out.values.iter_mut() {
                *v = p.perturb_value(*v as f64, rng)? as f32;
            }
        }
        Simulated::ClampedLaplace => {
            let b = scale.width() / eps;
            for v in out.values.iter_mut() {
                let y = *v as f64 + dprec_dp::privacy::laplace(b, rng)?;
                *v = scale.clamp(y) as f32;
            }
        }
    }
    Ok(out)
}

/// The LDP charges of the simulated clients: eps per rating (value replacement), and per
/// user the composition over that user's ratings.
fn simulated_charges(r: &Ratings, eps: f64, mechanism: Simulated) -> ReleaseCharges {
    let mut per_user = vec![0u64; r.n_users];
    for &u in &r.users {
        per_user[u as usize] += 1;
    }
    ReleaseCharges {
        mechanisms: vec![MechanismRecord {
            name: format!("{} (simulated clients, LDP)", mechanism.name()),
            params: json!({"eps": eps, "sensitivity": "scale width"}),
            unit: PrivacyUnit::Rating,
            neighbour: Neighbour::Replace,
        }],
        ratings: (0..r.len() as u32)
            .map(|position| RatingCharge { position, eps })
            .collect(),
        users: per_user
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(u, &count)| UserCharge {
                user: u as u32,
                event: PrivacyEvent::PureDp { eps, count },
            })
            .collect(),
        rating_rho: Default::default(),
    }
}

/// The bounded Laplace output is biased towards the middle of the scale:
/// `g(x) = E[Y | x] = x + b (h(u - x) - h(x - l)) / (m(x - l) + m(u - x))` with
/// `h(a) = 1 - e^(-a/b)(1 + a/b)` and `m(a) = 1 - e^(-a/b)`, and `g(mid) = mid`. Returns
/// `(mid, slope)` with `slope = (g(u) - g(l))/(u - l)`, so `mid + (y - mid)/slope` is the
/// affine map that sends `g(l)` to `l` and `g(u)` to `u` (an approximately unbiased
/// estimate of the input; exact at the ends and the middle).
pub fn blp_debias(eps: f64, scale: RatingScale) -> (f64, f64) {
    let w = scale.width();
    let b = w / eps;
    let t = w / b;
    let h = -(-t).exp_m1() - (-t).exp() * t;
    let g_l = scale.min + b * h / (-(-t).exp_m1());
    let mid = 0.5 * (scale.min + scale.max);
    (mid, 2.0 * (mid - g_l) / w)
}

/// A mixture of zero-mean Gaussians.
#[derive(Debug, Clone, PartialEq)]
pub struct Mixture {
    pub weights: Vec<f64>,
    pub variances: Vec<f64>,
}

impl Mixture {
    /// Equal weights, standard deviations `spread * 2^(k - (K-1)/2)`.
    pub fn initial(k: usize, spread: f64) -> Self {
        let c = (k as f64 - 1.0) / 2.0;
        Self {
            weights: vec![1.0 / k as f64; k],
            variances: (0..k)
                .map(|i| (spread * 2f64.powf(i as f64 - c)).powi(2))
                .collect(),
        }
    }

    /// E-step for one residual: writes the responsibilities into `gamma`.
    pub fn responsibilities(&self, e: f64, gamma: &mut [f64]) {
        let mut max = f64::NEG_INFINITY;
        for (k, g) in gamma.iter_mut().enumerate() {
            let v = self.variances[k];
            *g = self.weights[k].ln()
                - 0.5 * (2.0 * std::f64::consts::PI * v).ln()
                - e * e / (2.0 * v);
            max = max.max(*g);
        }
        let mut sum = 0.0;
        for g in gamma.iter_mut() {
            *g = (*g - max).exp();
            sum += *g;
        }
        for g in gamma.iter_mut() {
            *g /= sum;
        }
    }

    /// One EM update of the mixture (eq. 10 and 12) from the residuals; returns the factor
    /// weights `w_ij = sum_k gamma_ijk / (2 sigma_k^2)` under the OLD mixture's
    /// responsibilities and the NEW variances, as in Algorithm 2. Variances are floored
    /// at `floor` so a component cannot collapse onto one residual.
    pub fn em_step(&mut self, residuals: &[f64], floor: f64) -> Vec<f64> {
        let k = self.weights.len();
        let n = residuals.len();
        let mut gammas = vec![0.0; n * k];
        gammas
            .par_chunks_mut(k)
            .zip(residuals.par_iter())
            .for_each(|(g, &e)| self.responsibilities(e, g));
        let mut nk = vec![0.0; k];
        let mut se = vec![0.0; k];
        for (g, &e) in gammas.chunks(k).zip(residuals) {
            for c in 0..k {
                nk[c] += g[c];
                se[c] += g[c] * e * e;
            }
        }
        for c in 0..k {
            self.weights[c] = (nk[c] / n.max(1) as f64).max(1e-12);
            self.variances[c] = if nk[c] > 0.0 {
                (se[c] / nk[c]).max(floor)
            } else {
                floor
            };
        }
        let total: f64 = self.weights.iter().sum();
        self.weights.iter_mut().for_each(|w| *w /= total);
        gammas
            .par_chunks(k)
            .map(|g| {
                g.iter()
                    .zip(&self.variances)
                    .map(|(g, v)| g / (2.0 * v))
                    .sum()
            })
            .collect()
    }
}

/// Fixed side of one weighted half-step.
struct Side<'a> {
    d: usize,
    reg: f64,
    mean: f64,
    other_bias: &'a [f64],
    other_factors: &'a [f64],
    /// Weight of each rating, by source position.
    weights: &'a [f64],
}

/// Weighted ridge solve of (bias, factors) for every row of `rows`:
/// `min sum_j w_ij (y_ij - b - f . q_j)^2 + reg * (b^2 + |f|^2)`: with `w_ij` the MoG
/// precisions this is the MAP estimate under a N(0, 1/(2 reg)) prior, so rows with few or
/// noisy ratings are shrunk more.
fn solve_weighted(s: &Side<'_>, rows: &Compressed, bias: &mut [f64], factors: &mut [f64]) {
    let d = s.d;
    let n = d + 1;
    factors
        .par_chunks_mut(d)
        .zip(bias.par_iter_mut())
        .enumerate()
        .for_each_init(
            || (vec![0.0; n * n], vec![0.0; n]),
            |(a, b), (row, (f, bias))| {
                let (cols, vals) = rows.row(row);
                let src = rows.row_source(row);
                if cols.is_empty() {
                    f.iter_mut().for_each(|x| *x = 0.0);
                    *bias = 0.0;
                    return;
                }
                a.iter_mut().for_each(|x| *x = 0.0);
                b.iter_mut().for_each(|x| *x = 0.0);
                for ((&c, &v), &p) in cols.iter().zip(vals).zip(src) {
                    let c = c as usize;
                    let w = s.weights[p as usize];
                    let q = &s.other_factors[c * d..(c + 1) * d];
                    let y = v as f64 - s.mean - s.other_bias[c];
                    a[0] += w;
                    b[0] += w * y;
                    for j in 0..d {
                        a[j + 1] += w * q[j];
                        b[j + 1] += w * y * q[j];
                        let row_j = (j + 1) * n;
                        for k in j..d {
                            a[row_j + k + 1] += w * q[j] * q[k];
                        }
                    }
                }
                let lambda = s.reg;
                for j in 0..n {
                    a[j * n + j] += lambda;
                    for k in 0..j {
                        a[j * n + k] = a[k * n + j];
                    }
                }
                if cholesky_solve(a, b, n) {
                    *bias = b[0];
                    f.copy_from_slice(&b[1..]);
                }
            },
        );
}

fn residuals(r: &Ratings, model: &FactorModel) -> Vec<f64> {
    (0..r.len())
        .into_par_iter()
        .map(|k| r.values[k] as f64 - model.score(r.users[k] as usize, r.items[k] as usize))
        .collect()
}

/// One side's half of an EM iteration: the biases and factors of the rows of `by` (users
/// or items) solved with the other side fixed and the ratings weighted by `weights`.
fn weighted_update(
    t: &BlpMogMf,
    mean: f64,
    weights: &[f64],
    by: &Compressed,
    other_bias: &Array1<f64>,
    other_factors: &Array2<f64>,
) -> (Array1<f64>, Array2<f64>) {
    let side = Side {
        d: t.d,
        reg: t.reg,
        mean,
        other_bias: other_bias.as_slice().expect("contiguous"),
        other_factors: other_factors.as_slice().expect("contiguous"),
        weights,
    };
    let n = by.n_rows();
    let mut bias = Array1::zeros(n);
    let mut factors = Array2::zeros((n, t.d));
    solve_weighted(
        &side,
        by,
        bias.as_slice_mut().expect("contiguous"),
        factors.as_slice_mut().expect("contiguous"),
    );
    (bias, factors)
}

/// EM for the MoG-weighted factorization of (already perturbed) ratings. Returns the
/// model and the fitted mixture.
pub fn fit_mog_mf(
    t: &BlpMogMf,
    r: &Ratings,
    m: &Interactions,
    scale: RatingScale,
    rng: &mut DpRng,
) -> Result<(FactorModel, Mixture), TrainError> {
    if r.is_empty() {
        return Err(TrainError::EmptyData);
    }
    let d = t.d;
    let mean = r.mean();
    let mut model = FactorModel::zeros(m.n_users, m.n_items, d, mean, scale);
    let normal = Normal::new(0.0, t.init_sd.max(1e-12))
        .map_err(|e| TrainError::Numerical(format!("init_sd: {e}")))?;
    for x in model.user_factors.iter_mut() {
        *x = normal.sample(rng);
    }
    for x in model.item_factors.iter_mut() {
        *x = normal.sample(rng);
    }
    let e0 = residuals(r, &model);
    let spread = (e0.iter().map(|e| e * e).sum::<f64>() / e0.len() as f64)
        .sqrt()
        .max(1e-6 * scale.width());
    let mut mix = Mixture::initial(t.components, spread);
    let floor = (1e-3 * scale.width()).powi(2);
    let mut e = e0;
    for _ in 0..t.em_iters {
        let w = mix.em_step(&e, floor);
        if !w.iter().all(|x| x.is_finite()) {
            return Err(TrainError::Numerical("MoG weights degenerate".into()));
        }
        let old_u = model.user_factors.clone();
        let (ub, uf) = weighted_update(
            t,
            mean,
            &w,
            &m.by_user,
            &model.item_bias,
            &model.item_factors,
        );
        model.user_bias = ub;
        model.user_factors = uf;
        let (ib, itf) = weighted_update(
            t,
            mean,
            &w,
            m.by_item(),
            &model.user_bias,
            &model.user_factors,
        );
        model.item_bias = ib;
        model.item_factors = itf;
        e = residuals(r, &model);
        let change = (&model.user_factors - &old_u)
            .iter()
            .map(|x| x * x)
            .sum::<f64>()
            .sqrt();
        let base = old_u.iter().map(|x| x * x).sum::<f64>().sqrt();
        if change <= t.tol * base.max(1e-12) {
            break;
        }
    }
    Ok((model, mix))
}

impl Trainer for BlpMogMf {
    fn name(&self) -> &'static str {
        "blp-mog-mf"
    }

    fn params(&self) -> serde_json::Value {
        let mut v = json!({
            "d": self.d,
            "components": self.components,
            "em_iters": self.em_iters,
            "tol": self.tol,
            "reg": self.reg,
            "init_sd": self.init_sd,
        });
        if let Some(eps) = self.eps {
            v["eps"] = json!(eps);
            v["mechanism"] = json!(self.mechanism.name());
            v["debias"] = json!(self.debias);
        }
        v
    }

    fn guarantee(&self) -> Guarantee {
        match self.eps {
            // Simulated clients: the per-value LDP claim holds, but the curator sees
            // which ratings exist, so the add/remove claim the ledger needs does not.
            Some(_) => Guarantee::PaperClaimed,
            // Post-processing of its input: in the service, the ratings perturbed on the
            // client (charged at ingestion); the release reads nothing else.
            None => Guarantee::LocalDp,
        }
    }

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        let (model, charges) = match self.eps {
            Some(eps) => {
                let mut perturbed =
                    simulate_clients(data.ratings, data.scale, eps, self.mechanism, rng)?;
                if self.debias {
                    let (mid, slope) = blp_debias(eps, data.scale);
                    for v in perturbed.values.iter_mut() {
                        *v = (mid + (*v as f64 - mid) / slope) as f32;
                    }
                }
                let m = Interactions::new(&perturbed);
                let (model, _) = fit_mog_mf(self, &perturbed, &m, data.scale, rng)?;
                (model, simulated_charges(data.ratings, eps, self.mechanism))
            }
            None => {
                let (model, _) = fit_mog_mf(self, data.ratings, data.matrix, data.scale, rng)?;
                (model, ReleaseCharges::default())
            }
        };
        Ok(Fitted {
            model,
            charges,
            guarantee: self.guarantee(),
            ranker: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dprec_dp::rng::seeded;

    /// Low-rank ratings on 1..5 with a few users and items.
    fn low_rank(n_users: usize, n_items: usize, seed: u64) -> Ratings {
        let mut rng = seeded(seed);
        let normal = Normal::new(0.0, 1.0).unwrap();
        let u: Vec<[f64; 2]> = (0..n_users)
            .map(|_| [normal.sample(&mut rng), normal.sample(&mut rng)])
            .collect();
        let v: Vec<[f64; 2]> = (0..n_items)
            .map(|_| [normal.sample(&mut rng), normal.sample(&mut rng)])
            .collect();
        let mut r = Ratings::default();
        for (i, ui) in u.iter().enumerate() {
            for (j, vj) in v.iter().enumerate() {
                let s = 3.0 + 0.8 * (ui[0] * vj[0] + ui[1] * vj[1]);
                r.push(i as u32, j as u32, s.clamp(1.0, 5.0) as f32);
            }
        }
        r
    }

    #[test]
    fn responsibilities_and_em_step_match_hand_computation() {
        let mix = Mixture {
            weights: vec![0.5, 0.5],
            variances: vec![1.0, 4.0],
        };
        let mut g = [0.0; 2];
        mix.responsibilities(1.0, &mut g);
        // N(1|0,1) = 0.24197, N(1|0,4) = 0.17603.
        let (a, b) = (0.241_970_724_519_143_37, 0.176_032_663_382_150_1);
        assert!((g[0] - a / (a + b)).abs() < 1e-12);
        assert!((g.iter().sum::<f64>() - 1.0).abs() < 1e-15);
        let mut m = mix.clone();
        let e = [0.1, -0.2, 3.0, -2.5];
        let w = m.em_step(&e, 1e-9);
        let mut gam = [[0.0; 2]; 4];
        for (k, x) in e.iter().enumerate() {
            mix.responsibilities(*x, &mut gam[k]);
        }
        for c in 0..2 {
            let nk: f64 = gam.iter().map(|g| g[c]).sum();
            let se: f64 = gam.iter().zip(&e).map(|(g, x)| g[c] * x * x).sum();
            assert!((m.weights[c] - nk / 4.0).abs() < 1e-12);
            assert!((m.variances[c] - se / nk).abs() < 1e-12);
        }
        for k in 0..4 {
            let want = gam[k][0] / (2.0 * m.variances[0]) + gam[k][1] / (2.0 * m.variances[1]);
            assert!((w[k] - want).abs() < 1e-12);
        }
    }

    /// EM recovers a two-component mixture from its samples (weights and scales within a
    /// few percent at n = 20 000, fixed seed).
    #[test]
    fn em_recovers_a_known_mixture() {
        let mut rng = seeded(5);
        let a = Normal::new(0.0, 0.2).unwrap();
        let b = Normal::new(0.0, 1.5).unwrap();
        let e: Vec<f64> = (0..20_000)
            .map(|k| {
                if k % 10 < 7 {
                    a.sample(&mut rng)
                } else {
                    b.sample(&mut rng)
                }
            })
            .collect();
        let mut m = Mixture::initial(2, 0.8);
        for _ in 0..200 {
            m.em_step(&e, 1e-9);
        }
        let (lo, hi) = if m.variances[0] < m.variances[1] {
            (0, 1)
        } else {
            (1, 0)
        };
        assert!((m.weights[lo] - 0.7).abs() < 0.03, "{m:?}");
        assert!((m.variances[lo].sqrt() - 0.2).abs() < 0.02, "{m:?}");
        assert!((m.variances[hi].sqrt() - 1.5).abs() < 0.08, "{m:?}");
    }

    /// With one component the weights are uniform: the fit is ALS-WR on the same data, and
    /// on clean low-rank data it fits well.
    #[test]
    fn fits_clean_low_rank_data() {
        let r = low_rank(60, 40, 1);
        let m = Interactions::new(&r);
        let t = BlpMogMf {
            d: 2,
            reg: 0.01,
            em_iters: 40,
            ..Default::default()
        };
        let (model, _) = fit_mog_mf(&t, &r, &m, RatingScale::ONE_TO_FIVE, &mut seeded(2)).unwrap();
        let pred = model.predict_all(&r);
        let rmse = crate::model::factor::rmse(&pred, &r);
        assert!(rmse < 0.15, "rmse {rmse}");
    }

    /// The point of the paper: on BLP-perturbed ratings, a model fitted to the perturbed
    /// values predicts the TRUE ratings far better than the perturbed values themselves.
    #[test]
    fn simulated_ldp_fit_beats_the_perturbed_values() {
        let r = low_rank(150, 80, 3);
        let scale = RatingScale::ONE_TO_FIVE;
        // reg 1: the service default (10) is tuned for MovieLens-sized rows; this
        // 150 x 80 synthetic matrix has ~40 ratings per user and underfits at 10.
        let t = BlpMogMf {
            d: 2,
            eps: Some(2.0),
            reg: 1.0,
            ..Default::default()
        };
        let mut rng = seeded(4);
        let fitted = t
            .fit(&TrainData::new(&r, &Interactions::new(&r), scale), &mut rng)
            .unwrap();
        let pred = fitted.model.predict_all(&r);
        let model_rmse = crate::model::factor::rmse(&pred, &r);
        let noisy =
            simulate_clients(&r, scale, 2.0, Simulated::BoundedLaplace, &mut seeded(4)).unwrap();
        let raw: Vec<f64> = noisy.values.iter().map(|&v| v as f64).collect();
        let noisy_rmse = crate::model::factor::rmse(&raw, &r);
        assert!(
            model_rmse < 0.6 * noisy_rmse,
            "{model_rmse} vs {noisy_rmse}"
        );
        assert_eq!(fitted.guarantee, Guarantee::PaperClaimed);
        let s = fitted.charges.summary(r.len(), 1e-5).unwrap();
        assert_eq!(s.ratings_charged, r.len());
        assert_eq!(s.max_rating_eps, 2.0);
    }

    /// `blp_debias` against numerical integration of the bounded Laplace density.
    #[test]
    fn debias_slope_matches_numerical_mean() {
        let s = RatingScale::ONE_TO_FIVE;
        for eps in [0.1, 1.0, 3.0] {
            let b = s.width() / eps;
            let mean_at = |x: f64| {
                let n = 200_000;
                let h = s.width() / n as f64;
                (0..n)
                    .map(|k| {
                        let y = s.min + (k as f64 + 0.5) * h;
                        y * dprec_dp::privacy::bounded_laplace_density(y, x, b, s.min, s.max)
                            .unwrap()
                            * h
                    })
                    .sum::<f64>()
            };
            let (mid, slope) = blp_debias(eps, s);
            assert_eq!(mid, 3.0);
            let want = (mean_at(5.0) - mean_at(1.0)) / 4.0;
            assert!((slope - want).abs() < 1e-6, "eps={eps}: {slope} vs {want}");
            assert!((mean_at(3.0) - 3.0).abs() < 1e-9);
        }
        // Large b: slope ~ width/(6b) = eps/6.
        assert!((blp_debias(0.01, s).1 - 0.01 / 6.0).abs() < 1e-5);
    }

    #[test]
    fn params_are_validated() {
        let p = Params::parse(&["components=0"]).unwrap();
        assert!(BlpMogMf::from_params(&p).is_err());
        let p = Params::parse(&["mechanism=gauss", "eps=1"]).unwrap();
        assert!(BlpMogMf::from_params(&p).is_err());
        let p = Params::parse(&["eps=-1"]).unwrap();
        assert!(BlpMogMf::from_params(&p).is_err());
        let p = Params::parse(&["eps=0.5", "mechanism=laplace", "components=1"]).unwrap();
        let t = BlpMogMf::from_params(&p).unwrap();
        assert_eq!(
            (t.eps, t.mechanism, t.components),
            (Some(0.5), Simulated::ClampedLaplace, 1)
        );
        assert!(BlpMogMf::from_params(&Params::parse(&["k=3"]).unwrap()).is_err());
    }
}
