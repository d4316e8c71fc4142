//! `dp-alt`: a joint-DP rating predictor by DP alternating least squares (DESIGN 5, 6;
//! DPALS in the manner of Chien et al. 2021 and Krichene et al. 2023). Proof and
//! parameters: docs/privacy/dp-alt.md.
//!
//! Model: `r_uj ~ mu + b_u + c_j + p_u . q_j`. The item side (`c_j`, `q_j`) is a
//! user-level DP release; the user side (`b_u`, `p_u`) is solved from the item side and
//! the user's own ratings ([`JointAls::profile`]), never released, and charges nothing.
//!
//! One release, pure (no I/O), every parameter public:
//! 1. Noise from the plan before any data: the per-release user-level multiplier `z`
//!    ([`ReleasePlan::noise_multiplier`] times `noise_factor`); each of the `rounds` item
//!    steps gets `z sqrt(rounds)`, split between the Gram (`/ sqrt(gram_share)`) and the
//!    right-hand sides (`/ sqrt(1 - gram_share)`): all of them compose to one Gaussian
//!    of multiplier `z`.
//! 2. Rating level: each rating with a positive release budget takes part fully or
//!    RSM-sampled ([`participation`]) at the rating-level multiplier
//!    ([`DpAlt::rating_multiplier_on`]: `z / 2` by the triangle bound, or the direct
//!    bound of the biases-only, one-round release, the default).
//! 3. Item factors start data-independent (random); each round solves every user's
//!    profile from the current item side and the user's own sampled ratings, then
//!    releases per item `G_j = sum_u w_u x_u x_u^T` and `h_j = sum_u w_u y_uj x_u`
//!    with `x_u = (beta, p_u)` (`|p_u| <= sqrt(1 - beta^2)`, so `|x_u| <= 1`),
//!    `y_uj = clip(r_uj - mu - b_u, clip_y)` and `w_u = min(1, sqrt(cap / n_u))`: a
//!    user's contribution to all items together has L2 norm `<= sqrt(cap)` (Gram) and
//!    `<= sqrt(cap) clip_y` (right-hand sides), whatever the catalogue's size.
//! 4. Post-processing: the bias coordinate by empirical Bayes (`solve=eb`, the default:
//!    prior spread read off the release by moments), the factors by ridge; or the whole
//!    `theta_j = (G_j + lambda I)^-1 h_j` (`solve=ridge`, `lambda = lambda_item
//!    sigma_G`, raised until positive definite); `c_j = beta theta_j0`, `q_j = theta_j1..`.

use rand::Rng;

use crate::data::RatingScale;
use crate::model::history::{drift_for, CountHistory, DpTotal, ItemSideState, ReleasedStats};
use crate::model::joint_als::{project, JointAls};
use crate::numerics::linalg::cholesky_solve;
use crate::train::topn::dp_topn::{
    eps_r_param, participation, rating_eps, served_eps_r, ReleasePlan,
};
use crate::train::PerRating;
use crate::train::{invalid, numerical};
use crate::train::{FactorModel, Fitted, Guarantee, Params, TrainData, TrainError, Trainer};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::charges::{
    MechanismRecord, Neighbour, PrivacyUnit, RatingCharge, RatingRho, ReleaseCharges, UserCharge,
};
use dprec_dp::privacy::continuous::gaussian;
use dprec_dp::rng::DpRng;

/// Hyper-parameters of `dp-alt` (all public).
#[derive(Debug, Clone)]
pub struct DpAlt {
    /// The user's lifetime plan the per-release noise is calibrated from.
    pub plan: ReleasePlan,
    /// Multiplies the plan's noise multiplier (>= 1; set by [`Trainer::scaled`] when the
    /// service's plan is stricter than `plan`, 1 at the default plan).
    pub noise_factor: f64,
    /// Latent dimension (0: biases only).
    pub d: usize,
    /// Item steps per release.
    pub rounds: usize,
    /// A user's squared weights sum to at most `cap` (the contribution bound).
    pub cap: f64,
    /// Residuals are clipped to `[-clip_y, clip_y]`.
    pub clip_y: f64,
    /// Weight of the constant (bias) feature, in (0, 1].
    pub beta: f64,
    /// Share of each item step's RDP spent on the Gram (the rest on the right-hand sides).
    pub gram_share: f64,
    /// Item ridge in units of the Gram noise's standard deviation.
    pub lambda_item: f64,
    /// How item biases are read from the release: `false` the joint ridge
    /// `(G + lambda I)^-1 h`, `true` empirical-Bayes shrinkage of the bias (`solve=eb`).
    pub eb: bool,
    /// Ridge of the user-side solve.
    pub lambda_user: f64,
    /// Public prior mean; `None`: the scale's midpoint.
    pub mean: Option<f64>,
    /// Public delta at which rating-level RDP is converted (RSM-sampled ratings).
    pub delta_r: f64,
    /// Per-rating budget of the release when the ledger gives none (`eps_r=none`: every
    /// rating takes full part). The service always gives the ledger's.
    pub eps_r: Option<f64>,
    /// Whether the item side combines this release's statistics with the earlier
    /// releases' (`model::history`; post-processing, no charge).
    pub combine_releases: bool,
}

impl Default for DpAlt {
    /// The service's calibration (`dprec-lab eval` runs what is served): the default user
    /// budget and lifetime plan of the configuration (calibrated through the same Renyi
    /// filter as the service's, so the service adds no factor), and as the per-rating
    /// budget the share a rating with the default eps_ij may spend on its first release.
    fn default() -> Self {
        Self {
            plan: ReleasePlan::served(),
            noise_factor: 1.0,
            d: 0,
            rounds: 1,
            cap: 4.0,
            clip_y: 1.0,
            beta: 1.0,
            gram_share: 0.15,
            lambda_item: 10.0,
            eb: true,
            lambda_user: 5.0,
            mean: None,
            delta_r: dprec_dp::ledger::RATING_DELTA,
            eps_r: served_eps_r(),
            combine_releases: true,
        }
    }
}

/// The default weight of the bias feature when the model has factors (`d > 0`).
const FACTOR_BETA: f64 = 0.8;

/// The largest per-user rating count the bias-only rating bound is maximised over; past
/// it every term of [`DpAlt::bias_only_rating_rho`] falls like `1/n` (the weights like
/// `1/sqrt(n)`, the bias shift like `1/n`), so the maximum lies below it
/// (`bias_only_rating_bound_is_attained_early` checks 10x and 100x further).
const BIAS_ONLY_MAX_N: usize = 100_000;

/// The released item-side statistics of one item step.
#[derive(Debug, Clone)]
pub struct ItemStats {
    /// Per item, row-major `k x k` with `k = d + 1`.
    pub gram: Vec<f64>,
    /// Per item, `k` entries.
    pub rhs: Vec<f64>,
    pub k: usize,
}

impl DpAlt {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let d = Self::default();
        let eps_r = eps_r_param(p, d.eps_r)?;
        let mean = match p.get_str("mean") {
            None | Some("midpoint") => None,
            Some(_) => Some(p.f64("mean", 3.0)?),
        };
        let dim = p.usize_in("d", d.d, 0, 64)?;
        let t = Self {
            plan: ReleasePlan {
                eps_u: p.positive("eps", d.plan.eps_u)?,
                delta_u: p.positive("delta", d.plan.delta_u)?,
                releases: p.usize_in("releases", d.plan.releases as usize, 1, 1_000_000)? as u64,
            },
            noise_factor: p.positive("noise_factor", d.noise_factor)?,
            d: dim,
            rounds: p.usize_in("rounds", d.rounds, 1, 20)?,
            cap: p.positive("cap", d.cap)?,
            clip_y: p.positive("clip_y", d.clip_y)?,
            // With factors the bias feature shares the unit bound with them.
            beta: p.positive("beta", if dim > 0 { FACTOR_BETA } else { d.beta })?,
            gram_share: p.positive("gram_share", d.gram_share)?,
            lambda_item: p.positive("lambda_item", d.lambda_item)?,
            eb: match p.get_str("solve") {
                None => d.eb,
                Some("ridge") => false,
                Some("eb") => true,
                Some(_) => return Err(invalid("solve", "must be ridge or eb")),
            },
            lambda_user: p.positive("lambda_user", d.lambda_user)?,
            mean,
            delta_r: p.positive("delta_r", d.delta_r)?,
            eps_r,
            combine_releases: p.bool("combine_releases", d.combine_releases)?,
        };
        p.reject_unknown("dp-alt")?;
        if t.noise_factor < 1.0 {
            return Err(invalid("noise_factor", "must be >= 1 (it only adds noise)"));
        }
        if t.beta > 1.0 || (t.d > 0 && t.beta >= 1.0) {
            return Err(invalid("beta", "must be in (0, 1) (1 only with d = 0)"));
        }
        if t.gram_share >= 1.0 {
            return Err(invalid("gram_share", "must be in (0, 1)"));
        }
        if !(t.plan.delta_u < 1.0 && t.delta_r < 1.0) {
            return Err(invalid("delta", "must be in (0, 1)"));
        }
        Ok(t)
    }

    /// The per-release user-level multiplier `z` (plan times `noise_factor`).
    pub fn multiplier(&self) -> Result<f64, TrainError> {
        Ok(self.plan.noise_multiplier()? * self.noise_factor)
    }

    /// The Gram and right-hand-side noise standard deviations of one item step.
    pub fn sigmas(&self) -> Result<(f64, f64), TrainError> {
        let z_step = self.multiplier()? * (self.rounds as f64).sqrt();
        let s = self.cap.sqrt();
        let z_g = z_step / self.gram_share.sqrt();
        let z_h = z_step / (1.0 - self.gram_share).sqrt();
        Ok((z_g * s, z_h * s * self.clip_y))
    }

    /// The rating-level multiplier of the whole release: removing one rating changes its
    /// user's weights and profile, so the user's contribution moves by at most twice its
    /// bound (triangle inequality). Valid for every setting and every scale.
    pub fn rating_multiplier(&self) -> Result<f64, TrainError> {
        Ok(self.multiplier()? / 2.0)
    }

    /// The rating-level multiplier for ratings on `scale`: with biases only and one
    /// round (`d = 0`, `rounds = 1`) the per-rating sensitivity is bounded directly
    /// ([`Self::bias_only_rating_rho`], docs/privacy/dp-alt.md section 2), which is far
    /// tighter than the triangle bound; otherwise [`Self::rating_multiplier`].
    pub fn rating_multiplier_on(&self, scale: RatingScale) -> Result<f64, TrainError> {
        let loose = self.rating_multiplier()?;
        if self.d > 0 || self.rounds > 1 {
            return Ok(loose);
        }
        let mu = self.mean.unwrap_or((scale.min + scale.max) / 2.0);
        let half = (mu - scale.min).max(scale.max - mu).max(0.0);
        let (sg, sh) = self.sigmas()?;
        let rho = (1..=BIAS_ONLY_MAX_N)
            .map(|n| self.bias_only_rho(n, half, sg, sh))
            .fold(0.0, f64::max);
        Ok(loose.max(1.0 / (2.0 * rho).sqrt()))
    }

    /// The zCDP cost `rho` one release (`d = 0`, `rounds = 1`) has for removing one of
    /// the `n` sampled ratings of a user whose ratings lie within `half` of the prior
    /// mean. The user's bias `b = sum (r - mu) / (n + lambda_user)` (the first round's
    /// item biases are 0) moves by at most `D = half (2n + lambda) / ((n + lambda)
    /// (n - 1 + lambda))`; every other rating's clipped residual by at most
    /// `min(D, 2 clip_y)` and its weight from `w(n)` to `w(n - 1)`; the removed rating's
    /// terms go. So the Gram moves by `beta^2 sqrt(w(n)^2 + (n-1) (w(n) - w(n-1))^2)`
    /// and the right-hand sides by `beta sqrt(w(n)^2 c^2 + (n-1) (|w(n) - w(n-1)| c +
    /// w(n-1) min(D, 2c))^2)`; `rho` is the sum of the two parts' `S^2 / (2 sigma^2)`.
    pub fn bias_only_rating_rho(&self, n: usize, half: f64) -> Result<f64, TrainError> {
        let (sg, sh) = self.sigmas()?;
        Ok(self.bias_only_rho(n, half, sg, sh))
    }

    fn bias_only_rho(&self, n: usize, half: f64, sg: f64, sh: f64) -> f64 {
        let (s_g2, s_h2) = self.bias_only_sensitivities(n, half);
        s_g2 / (2.0 * sg * sg) + s_h2 / (2.0 * sh * sh)
    }

    /// The squared L2 sensitivities (Gram, right-hand sides) behind
    /// [`Self::bias_only_rating_rho`].
    pub fn bias_only_sensitivities(&self, n: usize, half: f64) -> (f64, f64) {
        let w = |m: usize| (self.cap / m.max(1) as f64).sqrt().min(1.0);
        let (c, lam, nf) = (self.clip_y, self.lambda_user.max(1e-9), n as f64);
        let (wn, wm) = (w(n), w(n.saturating_sub(1)));
        let dw = (wn - wm).abs();
        let others = nf - 1.0;
        let d_bias = half * (2.0 * nf + lam) / ((nf + lam) * (nf - 1.0 + lam));
        let b2 = self.beta * self.beta;
        let s_g2 = b2 * b2 * (wn * wn + others * dw * dw);
        let s_h2 = b2 * (wn * wn * c * c + others * (dw * c + wm * d_bias.min(2.0 * c)).powi(2));
        (s_g2, s_h2)
    }

    /// The bound on a user's factors' norm (so `|(beta, p)| <= 1`).
    pub fn max_norm(&self) -> f64 {
        (1.0 - self.beta * self.beta).max(0.0).sqrt()
    }

    fn mean_of(&self, data: &TrainData<'_>) -> f64 {
        self.mean.unwrap_or((data.scale.min + data.scale.max) / 2.0)
    }

    /// The exact (noise-free) item statistics of one step: every user's profile solved
    /// from `side` and the user's own `rows` (`(item, rating)`), weighted and clipped.
    pub fn item_statistics(&self, side: &JointAls, rows: &[Vec<(usize, f64)>]) -> ItemStats {
        let k = self.d + 1;
        let n = side.item_bias.len();
        let mut gram = vec![0.0; n * k * k];
        let mut rhs = vec![0.0; n * k];
        let mut x = vec![0.0; k];
        for row in rows.iter().filter(|r| !r.is_empty()) {
            let prof = side.profile(row);
            x[0] = self.beta;
            x[1..].copy_from_slice(&prof.factors);
            project(&mut x[1..], self.max_norm());
            let w = (self.cap / row.len() as f64).sqrt().min(1.0);
            for &(j, r) in row {
                let y = (r - side.mean - prof.bias).clamp(-self.clip_y, self.clip_y);
                let g = &mut gram[j * k * k..(j + 1) * k * k];
                for s in 0..k {
                    rhs[j * k + s] += w * y * x[s];
                    for t in 0..k {
                        g[s * k + t] += w * x[s] * x[t];
                    }
                }
            }
        }
        ItemStats { gram, rhs, k }
    }

    /// Gaussian noise on every item's Gram (upper triangle, mirrored) and right-hand side.
    pub fn add_noise(&self, st: &mut ItemStats, rng: &mut DpRng) -> Result<(), TrainError> {
        let (sg, sh) = self.sigmas()?;
        let k = st.k;
        for g in st.gram.chunks_mut(k * k) {
            for s in 0..k {
                for t in s..k {
                    let e = gaussian(sg, rng).map_err(numerical)?;
                    g[s * k + t] += e;
                    if s != t {
                        g[t * k + s] += e;
                    }
                }
            }
        }
        for h in st.rhs.iter_mut() {
            *h += gaussian(sh, rng).map_err(numerical)?;
        }
        Ok(())
    }

    /// Post-processing, empirical Bayes for the biases: each item's bias coordinate is
    /// the posterior mean of `h_j0 = G_j00 theta_j0 + e` under a prior
    /// `theta_0 ~ N(0, tau2)` whose `tau2` is read off the release by moments
    /// (`E h0^2 = G00^2 tau2 + sigma_h^2`, `E G00^2 = G00_true^2 + sigma_G^2`), with the
    /// noisy `G_j00` floored at its noise sd. The factors (when `d > 0`) are then the
    /// ridge solve of the rest of the system with the bias coordinate fixed.
    fn solve_eb(
        &self,
        st: &ItemStats,
        noise: Noise<'_>,
        side: &mut JointAls,
    ) -> Result<(), TrainError> {
        let (k, d) = (st.k, self.d);
        let g00 = |j: usize| st.gram[j * k * k];
        let h0 = |j: usize| st.rhs[j * k];
        let n = side.item_bias.len();
        let tau2 = eb_prior_variance(st, noise);
        for j in (0..n).filter(|&j| noise.known(j)) {
            let g = g00(j).max(noise.sd_g(j));
            let theta0 = g * h0(j) / (g * g + noise.var_h(j) / tau2);
            side.item_bias[j] = self.beta * theta0;
            if d == 0 {
                continue;
            }
            let gj = &st.gram[j * k * k..(j + 1) * k * k];
            let mut a: Vec<f64> = (1..k)
                .flat_map(|s| (1..k).map(move |t| gj[s * k + t]))
                .collect();
            let mut b: Vec<f64> = (1..k)
                .map(|s| st.rhs[j * k + s] - gj[s * k] * theta0)
                .collect();
            let theta = ridge_solve(&mut a, &mut b, d, self.lambda_item * noise.sd_g(j))?;
            side.item_factors[j * d..(j + 1) * d].copy_from_slice(&theta);
        }
        Ok(())
    }

    /// Post-processing: the item side from one release's statistics.
    pub fn solve_items(&self, st: &ItemStats, side: &mut JointAls) -> Result<(), TrainError> {
        let (sg, sh) = self.sigmas()?;
        self.solve_with(st, Noise::Release { sg, sh }, side)
    }

    /// Post-processing: the item side from statistics of the given noise.
    fn solve_with(
        &self,
        st: &ItemStats,
        noise: Noise<'_>,
        side: &mut JointAls,
    ) -> Result<(), TrainError> {
        if self.eb {
            return self.solve_eb(st, noise, side);
        }
        let k = st.k;
        for j in (0..side.item_bias.len()).filter(|&j| noise.known(j)) {
            let mut a = st.gram[j * k * k..(j + 1) * k * k].to_vec();
            let mut b = st.rhs[j * k..(j + 1) * k].to_vec();
            let theta = ridge_solve(&mut a, &mut b, k, self.lambda_item * noise.sd_g(j))?;
            side.item_bias[j] = self.beta * theta[0];
            side.item_factors[j * self.d..(j + 1) * self.d].copy_from_slice(&theta[1..]);
        }
        Ok(())
    }

    /// What the statistics of a release mean (a state is only combined with statistics
    /// of the same basis): the features, weights, clipping and user-side solve.
    pub fn basis(&self, mean: f64) -> String {
        format!(
            "dp-alt:k={}:beta={}:cap={}:clip_y={}:mean={}:lambda_user={}",
            self.d + 1,
            self.beta,
            self.cap,
            self.clip_y,
            mean,
            self.lambda_user
        )
    }

    /// The earlier releases' state this release continues: the last release's (re-indexed
    /// to this catalogue) when it has item statistics of this basis and shape.
    fn prior_state<'a>(&self, data: &TrainData<'a>, side: &JointAls) -> Option<&'a CountHistory> {
        let (basis, n) = (self.basis(side.mean), side.item_bias.len());
        data.prior_counts.filter(|h| {
            self.combine_releases
                && h.basis == basis
                && h.item_side
                    .as_ref()
                    .is_some_and(|s| s.k == self.d + 1 && s.var_gram.len() == n)
        })
    }

    /// With factors, the item steps start from the item side solved from the earlier
    /// releases' combined statistics (published; the triangle bound holds for any
    /// starting side), so this release's statistics share their basis; items new to the
    /// state keep their random start. Biases only: the steps start from zero biases, as
    /// the direct rating bound assumes.
    fn start_from(&self, prior: &CountHistory, side: &mut JointAls) -> Result<(), TrainError> {
        let Some(state) = prior.item_side.as_deref().filter(|_| self.d > 0) else {
            return Ok(());
        };
        let st = ItemStats {
            gram: state.gram.clone(),
            rhs: state.rhs.clone(),
            k: state.k,
        };
        self.solve_with(&st, Noise::Combined(state), side)
    }

    /// The release's item steps: each releases noisy statistics, combines them with the
    /// earlier releases' (`prior`; post-processing) and solves the item side from the
    /// combination. Returns the state after the last step (`None` when releases are not
    /// combined). Without `prior` the item side is solved from the release alone, as the
    /// first release of a state.
    fn item_steps(
        &self,
        rows: &[Vec<(usize, f64)>],
        prior: Option<&CountHistory>,
        side: &mut JointAls,
        rng: &mut DpRng,
    ) -> Result<Option<CountHistory>, TrainError> {
        let (sg, sh) = self.sigmas()?;
        let b2 = self.beta * self.beta;
        let n_items = side.item_bias.len();
        let mut out = None;
        for _ in 0..self.rounds {
            let mut st = self.item_statistics(side, rows);
            self.add_noise(&mut st, rng)?;
            let k2 = st.k * st.k;
            // The DP weighted count of each item (post-processing of the Gram).
            let own: Vec<f64> = (0..n_items).map(|j| st.gram[j * k2] / b2).collect();
            let Some(p) = prior else {
                self.solve_items(&st, side)?;
                side.popularity = own.clone();
                out = self.combine_releases.then(|| CountHistory {
                    basis: self.basis(side.mean),
                    mean: own.clone(),
                    var: vec![sg * sg / (b2 * b2); n_items],
                    releases: 1,
                    own_total: Some(DpTotal::of_counts(&own, sg / b2)),
                    gram: None,
                    item_side: Some(Box::new(ItemSideState::update(
                        None,
                        released(&st, sg, sh),
                        0.0,
                    ))),
                });
                continue;
            };
            let drift = drift_for(self.plan.releases);
            let mut c = ItemSideState::update(p.item_side.as_deref(), released(&st, sg, sh), drift);
            let pooled = ItemStats {
                gram: std::mem::take(&mut c.gram),
                rhs: std::mem::take(&mut c.rhs),
                k: st.k,
            };
            self.solve_with(&pooled, Noise::Combined(&c), side)?;
            (c.gram, c.rhs) = (pooled.gram, pooled.rhs);
            side.popularity = (0..n_items).map(|j| c.gram[j * k2] / b2).collect();
            out = Some(CountHistory {
                basis: self.basis(side.mean),
                mean: side.popularity.clone(),
                var: c.var_gram.iter().map(|v| v / (b2 * b2)).collect(),
                releases: p.releases + 1,
                own_total: Some(DpTotal::of_counts(&own, sg / b2)),
                gram: None,
                item_side: Some(Box::new(c)),
            });
        }
        Ok(out)
    }
}

/// One release's statistics with their public noise sds.
fn released(st: &ItemStats, sg: f64, sh: f64) -> ReleasedStats<'_> {
    ReleasedStats {
        gram: &st.gram,
        rhs: &st.rhs,
        k: st.k,
        sd_gram: sg,
        sd_rhs: sh,
    }
}

/// The noise of the statistics an item side is solved from: one release's (the same sds
/// for every item) or a combination's across releases (per item, public).
#[derive(Clone, Copy)]
enum Noise<'a> {
    Release { sg: f64, sh: f64 },
    Combined(&'a ItemSideState),
}

impl Noise<'_> {
    /// Whether item `j` has statistics (an item new to a state has none).
    fn known(&self, j: usize) -> bool {
        self.var_g(j).is_finite()
    }

    fn sd_g(&self, j: usize) -> f64 {
        match self {
            Noise::Release { sg, .. } => *sg,
            Noise::Combined(s) => s.noise_gram[j].sqrt(),
        }
    }

    fn var_g(&self, j: usize) -> f64 {
        match self {
            Noise::Release { sg, .. } => sg * sg,
            Noise::Combined(s) => s.noise_gram[j],
        }
    }

    fn var_h(&self, j: usize) -> f64 {
        match self {
            Noise::Release { sh, .. } => sh * sh,
            Noise::Combined(s) => s.noise_rhs[j],
        }
    }

    /// The sds of `sum_j (G_j00^2 - var_g)` and `sum_j (h_j0^2 - var_h)` over the `n`
    /// known items when there is no signal (`sqrt(2 sum v^2)`).
    fn spread(&self, n: usize) -> (f64, f64) {
        match self {
            Noise::Release { sg, sh } => {
                let r = (2.0 * n as f64).sqrt();
                (sg * sg * r, sh * sh * r)
            }
            Noise::Combined(s) => {
                let sum2 = |v: &[f64]| {
                    let t: f64 = v.iter().filter(|x| x.is_finite()).map(|x| x * x).sum();
                    (2.0 * t).sqrt()
                };
                (sum2(&s.noise_gram), sum2(&s.noise_rhs))
            }
        }
    }
}

/// The prior variance of the bias coordinate read off a release by moments:
/// `E h0^2 = G00^2 tau2 + sigma_h^2` and `E G00^2 = G00_true^2 + sigma_G^2` summed over
/// items, each sum moved one noise standard error toward a smaller spread
/// (post-processing: released statistics and public noise scales only).
fn eb_prior_variance(st: &ItemStats, noise: Noise<'_>) -> f64 {
    let k2 = st.k * st.k;
    let known: Vec<usize> = (0..st.rhs.len() / st.k)
        .filter(|&j| noise.known(j))
        .collect();
    let (num, den) = known.iter().fold((0.0, 0.0), |(a, b), &j| {
        let (g, h) = (st.gram[j * k2], st.rhs[j * st.k]);
        (a + h * h - noise.var_h(j), b + g * g - noise.var_g(j))
    });
    // One standard error to the cautious side: with pure noise each sum has sd
    // `sigma^2 sqrt(2 J)` over `J` items, and on a wide, thinly rated catalogue the plain
    // ratio sometimes read a large spread off noise and left noisy biases unshrunk
    // (heavy-raters: a fold at 0.979 against 0.945 for the user biases alone).
    let (spread_g, spread_h) = noise.spread(known.len());
    let num = num - 2.0 * spread_h;
    let den = den + 2.0 * spread_g;
    if den > 0.0 {
        (num / den).max(1e-6)
    } else {
        1e-6
    }
}

/// `(a + lambda I)^-1 b` for a symmetric `k x k` matrix `a` (row-major), the ridge
/// doubled until the matrix is positive definite (a noisy Gram need not be).
fn ridge_solve(
    a: &mut [f64],
    b: &mut [f64],
    k: usize,
    lambda: f64,
) -> Result<Vec<f64>, TrainError> {
    let (a0, b0) = (a.to_vec(), b.to_vec());
    let mut lam = lambda;
    for _ in 0..60 {
        a.copy_from_slice(&a0);
        b.copy_from_slice(&b0);
        for s in 0..k {
            a[s * k + s] += lam;
        }
        if cholesky_solve(a, b, k) {
            return Ok(b.to_vec());
        }
        lam = if lam > 0.0 { lam * 2.0 } else { 1e-6 };
    }
    Err(numerical("dp-alt: no ridge made a Gram PD"))
}

/// Which ratings a release uses, per user `(item, rating)`, with the rating-level charges.
struct Sampled {
    rows: Vec<Vec<(usize, f64)>>,
    charges: Vec<f64>,
    rho: Vec<f64>,
    offered_users: Vec<bool>,
}

fn sample(
    data: &TrainData<'_>,
    budgets: PerRating<'_>,
    z_r: f64,
    delta_r: f64,
    rng: &mut DpRng,
) -> Result<Sampled, TrainError> {
    let m = data.matrix;
    let n = data.ratings.len();
    let mut out = Sampled {
        rows: vec![Vec::new(); m.n_users],
        charges: vec![0.0; n],
        rho: vec![0.0; n],
        offered_users: vec![false; m.n_users],
    };
    let mut cache: std::collections::HashMap<(u64, u64), (f64, f64, f64)> = Default::default();
    for u in 0..m.n_users {
        let (items, values) = m.by_user.row(u);
        let src = m.by_user.row_source(u);
        for ((&j, &v), &pos) in items.iter().zip(values).zip(src) {
            let b = budgets.get(pos as usize);
            if b.is_nan() || b <= 0.0 {
                continue;
            }
            out.offered_users[u] = true;
            let r0 = data.rating_rho.map_or(0.0, |r| r.get(pos as usize));
            let key = (b.to_bits(), r0.to_bits());
            let (q, eps, rho) = match cache.get(&key) {
                Some(&x) => x,
                None => {
                    let x = participation(b, r0, z_r, delta_r)?;
                    cache.insert(key, x);
                    x
                }
            };
            out.charges[pos as usize] = eps;
            out.rho[pos as usize] = rho;
            if q >= 1.0 || rng.random::<f64>() < q {
                out.rows[u].push((j as usize, f64::from(v)));
            }
        }
    }
    Ok(out)
}

impl DpAlt {
    fn charges(&self, s: &Sampled, z: f64, z_r: f64) -> Result<ReleaseCharges, TrainError> {
        let (sigma_gram, sigma_rhs) = self.sigmas()?;
        let params = serde_json::json!({
            "plan": self.plan, "z": z, "rounds": self.rounds, "cap": self.cap,
            "clip_y": self.clip_y, "beta": self.beta, "sigma_gram": sigma_gram,
            "sigma_rhs": sigma_rhs, "rating_multiplier": z_r, "delta_r": self.delta_r,
        });
        let record = |name: &str, unit| MechanismRecord {
            name: name.into(),
            params: params.clone(),
            unit,
            neighbour: Neighbour::AddRemove,
        };
        let event = PrivacyEvent::gaussian(z, 1).map_err(numerical)?;
        let positive = |v: &[f64]| -> Vec<(u32, f64)> {
            v.iter()
                .enumerate()
                .filter(|(_, &x)| x > 0.0)
                .map(|(k, &x)| (k as u32, x))
                .collect()
        };
        Ok(ReleaseCharges {
            mechanisms: vec![
                record("dp-alt-item-side", PrivacyUnit::User),
                record("dp-alt-rsm", PrivacyUnit::Rating),
            ],
            ratings: positive(&s.charges)
                .into_iter()
                .map(|(position, eps)| RatingCharge { position, eps })
                .collect(),
            users: (0..s.offered_users.len())
                .filter(|&u| s.offered_users[u])
                .map(|u| UserCharge {
                    user: u as u32,
                    event: event.clone(),
                })
                .collect(),
            rating_rho: positive(&s.rho)
                .into_iter()
                .map(|(position, rho)| RatingRho { position, rho })
                .collect(),
        })
    }
}

impl Trainer for DpAlt {
    fn name(&self) -> &'static str {
        "dp-alt"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "eps": self.plan.eps_u, "delta": self.plan.delta_u, "releases": self.plan.releases,
            "noise_factor": self.noise_factor, "d": self.d, "rounds": self.rounds,
            "cap": self.cap, "clip_y": self.clip_y, "beta": self.beta,
            "gram_share": self.gram_share, "lambda_item": self.lambda_item,
            "solve": if self.eb { "eb" } else { "ridge" },
            "lambda_user": self.lambda_user,
            "mean": self.mean.map_or(serde_json::json!("midpoint"), |m| serde_json::json!(m)),
            "delta_r": self.delta_r, "eps_r": self.eps_r,
            "combine_releases": self.combine_releases,
        })
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Proven
    }

    fn planned_user_event(&self) -> Option<PrivacyEvent> {
        PrivacyEvent::gaussian(self.multiplier().ok()?, 1).ok()
    }

    /// One Gaussian of multiplier `z` for the add/remove of a whole user, whatever the
    /// user's number of ratings: the weights bound the user's contribution by
    /// `sqrt(cap)`, so the catalogue's size `m` plays no part.
    fn user_level_event(&self, _max_ratings: u64) -> Option<PrivacyEvent> {
        self.planned_user_event()
    }

    fn rating_cap(&self) -> Option<f64> {
        rating_eps(1.0, self.rating_multiplier().ok()?, self.delta_r).ok()
    }

    fn scaled(&self, factor: f64) -> Option<Box<dyn Trainer>> {
        (factor.is_finite() && factor >= 1.0).then(|| {
            Box::new(Self {
                noise_factor: self.noise_factor * factor,
                ..self.clone()
            }) as Box<dyn Trainer>
        })
    }

    /// The item side carries DP counts (the Gram's constant-feature entry), so the
    /// service publishes no separate popularity and its `m`-fold cost does not arise.
    fn publishes_popularity(&self) -> bool {
        true
    }

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        if data.ratings.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let budgets = data.release_budgets(self.eps_r)?;
        let z = self.multiplier()?;
        // Sampling, initialisation and noise from streams split off before any data is
        // read (the noise draws never depend on the data's coin flips).
        let (mut sampling, mut init, mut noise) = (
            dprec_dp::rng::split(rng),
            dprec_dp::rng::split(rng),
            dprec_dp::rng::split(rng),
        );
        // The bias-only rating bound assumes every rating lies on the public scale.
        if data
            .ratings
            .values
            .iter()
            .any(|&v| !(data.scale.min..=data.scale.max).contains(&f64::from(v)))
        {
            return Err(invalid("ratings", "a rating lies outside the rating scale"));
        }
        let z_r = self.rating_multiplier_on(data.scale)?;
        let s = sample(data, budgets, z_r, self.delta_r, &mut sampling)?;
        let n_items = data.matrix.n_items;
        let mut side = JointAls {
            mean: self.mean_of(data),
            item_bias: vec![0.0; n_items],
            item_factors: (0..n_items * self.d)
                .map(|_| gaussian(0.1, &mut init).map_err(numerical))
                .collect::<Result<_, _>>()?,
            d: self.d,
            lambda_user: self.lambda_user,
            max_norm: self.max_norm(),
            scale: data.scale,
            popularity: Vec::new(),
            history: None,
        };
        let prior = self.prior_state(data, &side);
        if let Some(p) = prior {
            self.start_from(p, &mut side)?;
        }
        side.history = self.item_steps(&s.rows, prior, &mut side, &mut noise)?;
        let charges = self.charges(&s, z, z_r)?;
        let mut model = FactorModel::zeros(0, n_items, self.d, side.mean, data.scale);
        for j in 0..n_items {
            model.item_bias[j] = side.item_bias[j];
            for c in 0..self.d {
                model.item_factors[[j, c]] = side.item_factors[j * self.d + c];
            }
        }
        Ok(Fitted {
            model,
            charges,
            guarantee: Guarantee::Proven,
            ranker: Some(std::sync::Arc::new(side)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Interactions, RatingScale, Ratings};

    fn side(n: usize, d: usize) -> JointAls {
        JointAls {
            mean: 3.0,
            item_bias: vec![0.1; n],
            item_factors: (0..n * d).map(|i| ((i % 7) as f64 - 3.0) / 3.0).collect(),
            d,
            lambda_user: 5.0,
            max_norm: DpAlt::default().max_norm(),
            scale: RatingScale::ONE_TO_FIVE,
            popularity: Vec::new(),
            history: None,
        }
    }

    /// L2 distance between two statistics (Gram and right-hand sides scaled by 1/clip_y).
    fn moved(t: &DpAlt, a: &ItemStats, b: &ItemStats) -> (f64, f64) {
        let g = a.gram.iter().zip(&b.gram).map(|(x, y)| (x - y).powi(2));
        let h = a.rhs.iter().zip(&b.rhs).map(|(x, y)| (x - y).powi(2));
        (g.sum::<f64>().sqrt(), h.sum::<f64>().sqrt() / t.clip_y)
    }

    /// A user with 10x the ratings (and any ratings at all, over a large catalogue) moves
    /// the released statistics by at most sqrt(cap) (Gram) and sqrt(cap) clip_y (rhs).
    #[test]
    fn a_users_contribution_is_bounded_whatever_its_ratings() {
        let t = DpAlt::default();
        let n = 3000;
        let s = side(n, t.d);
        let others: Vec<Vec<(usize, f64)>> = (0..20)
            .map(|u| (0..15).map(|i| ((u * 37 + i * 11) % n, 4.0)).collect())
            .collect();
        let without = t.item_statistics(&s, &others);
        let mut moved_by = Vec::new();
        for count in [1usize, 10, 30, 300, 3000] {
            let mut rows = others.clone();
            rows.push(
                (0..count)
                    .map(|i| (i, if i % 2 == 0 { 5.0 } else { 1.0 }))
                    .collect(),
            );
            let (g, h) = moved(&t, &t.item_statistics(&s, &rows), &without);
            let bound = t.cap.sqrt() * (1.0 + 1e-9);
            assert!(
                g <= bound && h <= bound,
                "{count} ratings: {g} {h} > {bound}"
            );
            moved_by.push(h);
        }
        // The bound is nearly reached (so it is not loose), and 10x the ratings (300 ->
        // 3000) move the statistics no further.
        assert!(moved_by[3] > 0.5 * t.cap.sqrt(), "{moved_by:?}");
        assert!(moved_by[4] <= moved_by[3] * 1.05, "{moved_by:?}");
    }

    /// The released noise has the planned standard deviations: a KS-free check on many
    /// entries of an all-zero release (sample sd within 2% of the plan's) that a 10%
    /// error of the scale in either direction would fail.
    #[test]
    fn item_step_noise_has_the_planned_scale() {
        let t = DpAlt::default();
        let (sg, sh) = t.sigmas().unwrap();
        // The plan: z composes to (eps_u, delta_u) over the releases; rounds x (Gram, rhs)
        // compose back to z.
        let z = t.multiplier().unwrap();
        let zs = z * (t.rounds as f64).sqrt();
        let back = 1.0 / ((t.gram_share / zs.powi(2)) + (1.0 - t.gram_share) / zs.powi(2));
        assert!((back.sqrt() - zs).abs() < 1e-9);
        let n = 20_000;
        let mut st = ItemStats {
            gram: vec![0.0; n * 9],
            rhs: vec![0.0; n * 3],
            k: 3,
        };
        t.add_noise(&mut st, &mut dprec_dp::rng::seeded(7)).unwrap();
        let diag: Vec<f64> = (0..n).map(|j| st.gram[j * 9]).collect();
        let sd = |v: &[f64]| (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
        for (got, want) in [(sd(&diag), sg), (sd(&st.rhs), sh)] {
            assert!((got / want - 1.0).abs() < 0.02, "{got} vs {want}");
            assert!((got / (0.9 * want) - 1.0).abs() > 0.05, "0.9x not rejected");
            assert!((got / (1.1 * want) - 1.0).abs() > 0.05, "1.1x not rejected");
        }
        // sigma_G = z sqrt(rounds / gram_share) sqrt(cap).
        let want_g = z * (t.rounds as f64 / t.gram_share).sqrt() * t.cap.sqrt();
        assert!((sg - want_g).abs() < 1e-9 * want_g);
    }

    /// Released statistics of `n` items whose true bias coordinates are drawn with sd
    /// `tau` and whose true weight masses `g` spread from 0 to 200, with the planned
    /// noise added; returns the statistics and the true coordinates.
    fn planted(t: &DpAlt, n: usize, tau: f64, seed: u64) -> (ItemStats, Vec<f64>) {
        use rand_distr::{Distribution, Normal};
        let mut rng = dprec_dp::rng::seeded(seed);
        let prior = Normal::new(0.0, tau).unwrap();
        let (k, mut theta) = (t.d + 1, Vec::with_capacity(n));
        let mut st = ItemStats {
            gram: vec![0.0; n * k * k],
            rhs: vec![0.0; n * k],
            k,
        };
        for j in 0..n {
            let g = 200.0 * (j as f64 / n as f64).powi(2);
            let th = prior.sample(&mut rng);
            for s in 0..k {
                st.gram[j * k * k + s * k + s] = g;
            }
            st.rhs[j * k] = g * th;
            theta.push(th);
        }
        t.add_noise(&mut st, &mut rng).unwrap();
        (st, theta)
    }

    /// The prior variance is read off the release: within 10% of the planted one over
    /// 20,000 items, at two spreads, and not at half or double the truth.
    #[test]
    fn eb_reads_the_bias_spread_off_the_release() {
        let t = DpAlt::default();
        let (sg, sh) = t.sigmas().unwrap();
        for tau in [0.3, 0.6] {
            let (st, _) = planted(&t, 20_000, tau, 11);
            let got = eb_prior_variance(&st, Noise::Release { sg, sh });
            assert!(
                (got / (tau * tau) - 1.0).abs() < 0.1,
                "{got} vs {}",
                tau * tau
            );
        }
    }

    /// A release of noise alone (no item has raters) reads at most a small spread over
    /// 20 seeds (prior sd <= 0.15), so noise is shrunk to near 0 instead of published as
    /// signal; the plain moment ratio reads spreads up to sd 1 and more here.
    #[test]
    fn eb_reads_little_spread_off_noise() {
        let t = DpAlt::default();
        let (sg, sh) = t.sigmas().unwrap();
        let mut most: f64 = 0.0;
        for seed in 0..20 {
            let mut st = ItemStats {
                gram: vec![0.0; 2_000],
                rhs: vec![0.0; 2_000],
                k: 1,
            };
            t.add_noise(&mut st, &mut dprec_dp::rng::seeded(200 + seed))
                .unwrap();
            most = most.max(eb_prior_variance(&st, Noise::Release { sg, sh }));
        }
        assert!(most <= 0.15 * 0.15, "spread {most} read off noise");
    }

    /// On planted biases the empirical-Bayes read is closer to the truth than the ridge
    /// read (whose shrinkage is fixed in units of the Gram noise).
    #[test]
    fn eb_biases_beat_the_ridge_on_planted_data() {
        let eb = DpAlt::default();
        let ridge = DpAlt {
            eb: false,
            ..eb.clone()
        };
        let n = 5_000;
        let (st, theta) = planted(&eb, n, 0.4, 5);
        let err = |t: &DpAlt| {
            let mut s = side(n, t.d);
            t.solve_items(&st, &mut s).unwrap();
            let se: f64 = (0..n)
                .map(|j| (s.item_bias[j] - t.beta * theta[j]).powi(2))
                .sum();
            (se / n as f64).sqrt()
        };
        let (e, r) = (err(&eb), err(&ridge));
        assert!(e < 0.9 * r, "eb {e} vs ridge {r}");
    }

    /// The bias-only rating bound, checked by brute force: for users with 1 to 400
    /// ratings (extreme values, so the bias shift is large), removing each rating moves
    /// the exact statistics by a `rho` (at the release's noise) within the bound for
    /// that `n`, and within the maximum the release charges; the bound is not loose
    /// (some removal reaches 40% of it).
    #[test]
    fn bias_only_rating_bound_holds_by_brute_force() {
        let t = DpAlt::default();
        assert_eq!(
            (t.d, t.rounds),
            (0, 1),
            "the default is the bias-only release"
        );
        let (sg, sh) = t.sigmas().unwrap();
        let scale = RatingScale::ONE_TO_FIVE;
        let z_r = t.rating_multiplier_on(scale).unwrap();
        let max_rho = 1.0 / (2.0 * z_r * z_r);
        let n_items = 500;
        // The first round's side: item biases 0 (no factors).
        let s0 = JointAls {
            item_bias: vec![0.0; n_items],
            item_factors: Vec::new(),
            d: 0,
            ..side(n_items, 0)
        };
        let mut closest: f64 = 0.0;
        for n in [1usize, 2, 3, 4, 5, 6, 8, 12, 30, 100, 400] {
            for pattern in 0..3 {
                let row: Vec<(usize, f64)> = (0..n)
                    .map(|i| {
                        let v = match pattern {
                            0 => 5.0,
                            1 => {
                                if i == 0 {
                                    1.0
                                } else {
                                    5.0
                                }
                            }
                            _ => {
                                if i % 2 == 0 {
                                    1.0
                                } else {
                                    5.0
                                }
                            }
                        };
                        ((i * 7) % n_items, v)
                    })
                    .collect();
                let full = t.item_statistics(&s0, std::slice::from_ref(&row));
                let bound = t.bias_only_rating_rho(n, 2.0).unwrap();
                let (b_g2, b_h2) = t.bias_only_sensitivities(n, 2.0);
                assert!(
                    bound <= max_rho * (1.0 + 1e-12),
                    "n {n}: {bound} > {max_rho}"
                );
                for k in 0..n {
                    let mut less = row.clone();
                    less.remove(k);
                    let part = t.item_statistics(&s0, &[less]);
                    let (g, h) = moved(&t, &full, &part);
                    let h = h * t.clip_y;
                    assert!(
                        g * g <= b_g2 * (1.0 + 1e-9),
                        "n {n} k {k}: Gram {g}^2 > {b_g2}"
                    );
                    assert!(
                        h * h <= b_h2 * (1.0 + 1e-9),
                        "n {n} k {k}: rhs {h}^2 > {b_h2}"
                    );
                    let rho = g * g / (2.0 * sg * sg) + h * h / (2.0 * sh * sh);
                    assert!(rho <= bound * (1.0 + 1e-9), "n {n} k {k}: {rho} > {bound}");
                    closest = closest.max(rho / max_rho);
                }
            }
        }
        assert!(
            closest > 0.4,
            "the bound is loose: at most {closest} of it reached"
        );
    }

    /// Past the largest count the maximum is taken over, the bound keeps falling.
    #[test]
    fn bias_only_rating_bound_is_attained_early() {
        let t = DpAlt::default();
        let inside = (1..=1000)
            .map(|n| t.bias_only_rating_rho(n, 2.0).unwrap())
            .fold(0.0, f64::max);
        for n in [BIAS_ONLY_MAX_N, 10 * BIAS_ONLY_MAX_N, 100 * BIAS_ONLY_MAX_N] {
            assert!(t.bias_only_rating_rho(n, 2.0).unwrap() < 1e-3 * inside);
        }
        // With factors or several rounds the triangle bound applies.
        let d2 = DpAlt {
            d: 2,
            beta: FACTOR_BETA,
            ..t.clone()
        };
        let scale = RatingScale::ONE_TO_FIVE;
        assert_eq!(
            d2.rating_multiplier_on(scale).unwrap(),
            d2.rating_multiplier().unwrap()
        );
        let r2 = DpAlt {
            rounds: 2,
            ..t.clone()
        };
        assert_eq!(
            r2.rating_multiplier_on(scale).unwrap(),
            r2.rating_multiplier().unwrap()
        );
        assert!(t.rating_multiplier_on(scale).unwrap() > 2.0 * t.rating_multiplier().unwrap());
    }

    fn grid(users: u32, items: u32) -> Ratings {
        let mut r = Ratings::with_dims(users as usize, items as usize);
        for u in 0..users {
            for i in 0..items {
                if (u + 2 * i) % 3 != 0 {
                    r.push(u, i, (1 + (u * 7 + i * 3) % 5) as f32);
                }
            }
        }
        r
    }

    fn joint(f: &Fitted) -> &JointAls {
        let any = f.ranker.as_ref().unwrap().storable().unwrap();
        any.downcast_ref::<JointAls>().unwrap()
    }

    /// A first release (no earlier state) serves what a release that combines nothing
    /// serves, to the bit, and starts a state of one release from its own statistics.
    #[test]
    fn a_first_release_is_the_release_alone() {
        let r = grid(40, 25);
        let m = Interactions::new(&r);
        let data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
        for d in [0, 2] {
            let on = DpAlt::from_params(&Params::parse(&[&format!("d={d}")]).unwrap()).unwrap();
            let off = DpAlt {
                combine_releases: false,
                ..on.clone()
            };
            let a = on.fit(&data, &mut dprec_dp::rng::seeded(4)).unwrap();
            let b = off.fit(&data, &mut dprec_dp::rng::seeded(4)).unwrap();
            assert_eq!(a.model.item_bias, b.model.item_bias);
            assert_eq!(a.model.item_factors, b.model.item_factors);
            assert_eq!(joint(&a).popularity, joint(&b).popularity);
            assert!(joint(&b).history.is_none());
            let h = joint(&a).history.as_ref().unwrap();
            assert_eq!((h.releases, &h.mean), (1, &joint(&a).popularity));
            let (sg, _) = on.sigmas().unwrap();
            let st = h.item_side.as_deref().unwrap();
            assert!(st.var_gram.iter().all(|&v| v == sg * sg));
        }
    }

    /// A second release combines its statistics with the first's state: the state it
    /// publishes is the filter step from that state at the plan's drift, and its item side
    /// is solved from the combination; a state of another basis is ignored (the fit is
    /// the first release's, to the bit).
    #[test]
    fn a_second_release_continues_the_first() {
        let r = grid(60, 30);
        let m = Interactions::new(&r);
        let data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
        let t = DpAlt::default();
        let first = t.fit(&data, &mut dprec_dp::rng::seeded(1)).unwrap();
        let prior = joint(&first).history.clone().unwrap();
        let with = TrainData {
            prior_counts: Some(&prior),
            ..data
        };
        let second = t.fit(&with, &mut dprec_dp::rng::seeded(2)).unwrap();
        let alone = t.fit(&data, &mut dprec_dp::rng::seeded(2)).unwrap();
        let h = joint(&second).history.as_ref().unwrap();
        assert_eq!(h.releases, 2);
        assert!(h.var.iter().zip(&prior.var).all(|(a, b)| a < b));
        // This release's own statistics are the first state of the fit without a prior.
        let own = joint(&alone).history.as_ref().unwrap();
        let (sg, sh) = t.sigmas().unwrap();
        let own_stats = own.item_side.as_deref().unwrap();
        let want = ItemSideState::update(
            prior.item_side.as_deref(),
            ReleasedStats {
                gram: &own_stats.gram,
                rhs: &own_stats.rhs,
                k: own_stats.k,
                sd_gram: sg,
                sd_rhs: sh,
            },
            drift_for(t.plan.releases),
        );
        assert_eq!(h.item_side.as_deref(), Some(&want));
        let mut side = joint(&alone).clone();
        let st = ItemStats {
            gram: want.gram.clone(),
            rhs: want.rhs.clone(),
            k: want.k,
        };
        t.solve_with(&st, Noise::Combined(&want), &mut side)
            .unwrap();
        assert_eq!(joint(&second).item_bias, side.item_bias);
        assert_ne!(second.model.item_bias, alone.model.item_bias);
        // Another basis (another clipping): not combined.
        let other = CountHistory {
            basis: DpAlt {
                clip_y: 2.0,
                ..t.clone()
            }
            .basis(3.0),
            ..prior.clone()
        };
        let data_other = TrainData {
            prior_counts: Some(&other),
            ..data
        };
        let ignored = t.fit(&data_other, &mut dprec_dp::rng::seeded(2)).unwrap();
        assert_eq!(ignored.model.item_bias, alone.model.item_bias);
        assert_eq!(joint(&ignored).history.as_ref().unwrap().releases, 1);
    }

    #[test]
    fn user_level_cost_does_not_grow_with_the_catalogue() {
        let t = DpAlt::default();
        assert_eq!(t.user_level_event(1), t.user_level_event(100_000));
        assert_eq!(t.user_level_event(1), t.planned_user_event());
    }

    #[test]
    fn fit_charges_every_offered_user_the_planned_event_and_nothing_else() {
        let mut r = Ratings::with_dims(12, 8);
        for u in 0..12u32 {
            for i in 0..8u32 {
                if (u + i) % 3 != 0 {
                    r.push(u, i, (1 + (u * i) % 5) as f32);
                }
            }
        }
        let m = Interactions::new(&r);
        let data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
        let t = DpAlt {
            eps_r: None,
            ..DpAlt::default()
        };
        let fit = t.fit(&data, &mut dprec_dp::rng::seeded(3)).unwrap();
        let planned = t.planned_user_event().unwrap();
        assert_eq!(fit.charges.users.len(), 12);
        assert!(fit.charges.users.iter().all(|c| c.event == planned));
        // Every rating takes full part at the bias-only rating-level multiplier.
        let z_r = t.rating_multiplier_on(RatingScale::ONE_TO_FIVE).unwrap();
        assert_eq!(fit.charges.rating_rho.len(), r.len());
        for c in fit.charges.rating_rho.iter() {
            assert!((c.rho - 1.0 / (2.0 * z_r * z_r)).abs() < 1e-12);
        }
        assert!(fit.charges.ratings.is_empty());
        assert!(fit.ranker.is_some());
        assert_eq!(fit.model.user_bias.len(), 0, "no user side is released");
    }
}
