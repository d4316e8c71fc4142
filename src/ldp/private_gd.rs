//! Private-GD and GD-DR (Shin, Kim, Shin, Xiao 2018, Algorithms 1 and 2) as a protocol
//! between an untrusted curator and clients that each hold one user's ratings.
//!
//! A round `t` (1-based) of a [`Schedule`]:
//!
//! 1. The curator publishes a [`RoundState`]: the public item profiles `V` (m x d), the
//!    random projection's seed and dimension `q` (GD-DR; none for Private-GD), the
//!    round id and the schedule's public parameters.
//! 2. Each client ([`client_report`]) fits its own profile `(b_u, u)` locally against the
//!    public `V` ([`local_profile`]), draws one coordinate `(s, l)` of the `q x d` matrix
//!    `x = Phi grad_V^u` uniformly (data-independent), computes that single entry of its
//!    gradient, clips it to `[-C, C]` and sends ONE bit drawn by the paper's randomiser
//!    ([`dprec_dp::privacy::local::one_bit_probability`] of `x/C`, at `eps_round = eps / k`).
//!    Only the bit and the coordinate leave the device.
//! 3. The curator adds the bits ([`Aggregator`]), estimates
//!    `grad_B* = C q d B / n * sum of bits per coordinate` (unbiased for the mean clipped
//!    projected gradient, `B = (e^eps_round + 1)/(e^eps_round - 1)`), recovers
//!    `grad_V* = Phi^+ grad_B*` with the pseudo-inverse `Phi^T (Phi Phi^T)^-1` ([`Recovery`])
//!    and updates `V <- V - (lr / t) / f (grad_V* + 2 lambda_v V)`, where `f = k^2` is the
//!    paper's correction factor (or 1 when switched off) ([`next_state`]).
//!
//! Privacy (Lemma 1 / Corollary 1): every report is `eps_round`-LDP for the user's whole
//! data, whatever the data (the clipped value lies in `[-1, 1]` after scaling by `1/C`,
//! and the coordinate is drawn independently of the data); the curator's state is
//! post-processing of reports. A user who reports in `k` rounds spends `k * eps_round`
//! by sequential composition. The full claim is in `docs/privacy/private-gd.md`.
//!
//! The projection `Phi` has i.i.d. `N(0, 1/q)` entries produced by a counter-based hash
//! of `(seed, row, item)` ([`phi`]), so client and curator compute the same entries
//! without shipping a `q x m` matrix. `Phi` is public and data-independent; it is not
//! privacy noise, so it need not come from the CSPRNG.

use ndarray::{Array2, Axis};
use rand::Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::numerics::linalg::cholesky_solve;
use dprec_dp::privacy::local::{one_bit_bound, one_bit_probability};

/// Errors of the protocol: a bad parameter, a report that does not fit the round, or a
/// projection whose Gram matrix cannot be factorised.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("the report is for round {got}, the open round is {open}")]
    WrongRound { got: u64, open: u64 },
    #[error("the projection's Gram matrix Phi Phi^T is not positive definite (q={q}, m={m})")]
    Singular { q: usize, m: usize },
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ProtocolError {
    ProtocolError::Invalid {
        field,
        reason: reason.into(),
    }
}

pub type Result<T> = std::result::Result<T, ProtocolError>;

/// The random projection of GD-DR: `q` rows, entries from `seed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProjectionSpec {
    pub seed: u64,
    /// The projection dimension `q` (the paper uses 2700 for 26,744 items).
    pub dim: usize,
}

/// What a client needs besides `V` to fit its own profile. These settings only shape
/// the client's local computation; the privacy of a report does not depend on them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClientSettings {
    /// Public offset subtracted from every rating (e.g. the scale's midpoint; 0 in the paper).
    pub offset: f64,
    /// Ridge penalty of the client's own profile solve.
    pub reg_user: f64,
    /// Whether the client fits a personal bias `b_u` beside `u`.
    pub user_bias: bool,
}

/// Public parameters of a Private-GD schedule (configuration, never data statistics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Schedule {
    /// User-level local eps of the whole schedule: every report costs `eps_total / rounds`.
    pub eps_total: f64,
    /// Planned number of rounds `k` (the paper's number of iterations).
    pub rounds: u32,
    /// Latent dimension `d`.
    pub rank: usize,
    /// `None`: Private-GD (Algorithm 1, one entry of the `m x d` gradient);
    /// `Some`: GD-DR (Algorithm 2, one entry of the `q x d` projected gradient).
    pub projection: Option<ProjectionSpec>,
    /// Clipping bound `C` of the reported entry (the paper uses 1).
    pub clip: f64,
    /// Learning-rate constant: `gamma_t = lr / t`.
    pub lr: f64,
    /// `lambda_v`, the item ridge penalty (the paper uses 1e-8).
    pub reg_item: f64,
    /// Apply the paper's correction factor `1/k^2` to every update.
    pub correction: bool,
    pub client: ClientSettings,
}

impl Schedule {
    /// The local eps each report costs.
    pub fn eps_round(&self) -> f64 {
        self.eps_total / f64::from(self.rounds.max(1))
    }

    /// Checks every parameter; `n_items` is the public catalogue size `m`.
    pub fn validate(&self, n_items: usize) -> Result<()> {
        let pos = |field, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(invalid(field, format!("must be finite and > 0, got {v}")))
            }
        };
        pos("eps_total", self.eps_total)?;
        pos("clip", self.clip)?;
        pos("lr", self.lr)?;
        pos("reg_user", self.client.reg_user)?;
        if !(self.reg_item.is_finite() && self.reg_item >= 0.0) {
            return Err(invalid("reg_item", "must be finite and >= 0"));
        }
        if !self.client.offset.is_finite() {
            return Err(invalid("offset", "must be finite"));
        }
        if self.rounds == 0 {
            return Err(invalid("rounds", "must be >= 1"));
        }
        if self.rank == 0 {
            return Err(invalid("rank", "must be >= 1"));
        }
        one_bit_bound(self.eps_round()).map_err(|e| invalid("eps_total", e.to_string()))?;
        if n_items == 0 {
            return Err(invalid("n_items", "the catalogue is empty"));
        }
        if let Some(p) = self.projection {
            if p.dim == 0 || p.dim > n_items {
                return Err(invalid(
                    "projection.dim",
                    format!(
                        "must be in 1..={n_items} (the catalogue size), got {}",
                        p.dim
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Rows of the reported matrix: `q` with a projection, else `m`.
    pub fn report_rows(&self, n_items: usize) -> usize {
        self.projection.map_or(n_items, |p| p.dim)
    }
}

/// What the curator publishes for one round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundState {
    /// Round id, 1-based; also the `t` of the learning rate `lr / t`.
    pub round: u64,
    pub schedule: Schedule,
    /// The public item profiles `V`, m x d.
    pub item_factors: Array2<f64>,
}

impl RoundState {
    /// Round 1 of `schedule` over a catalogue of `n_items`, with `V` drawn i.i.d.
    /// `N(0, init_sd^2)` (data-independent).
    pub fn initial<R: Rng + ?Sized>(
        schedule: Schedule,
        n_items: usize,
        init_sd: f64,
        rng: &mut R,
    ) -> Result<Self> {
        schedule.validate(n_items)?;
        if !(init_sd.is_finite() && init_sd >= 0.0) {
            return Err(invalid("init_sd", "must be finite and >= 0"));
        }
        let normal = rand_distr::Normal::new(0.0, init_sd.max(f64::MIN_POSITIVE))
            .map_err(|e| invalid("init_sd", e.to_string()))?;
        let d = schedule.rank;
        let v = Array2::from_shape_fn((n_items, d), |_| {
            if init_sd == 0.0 {
                0.0
            } else {
                rng.sample(normal)
            }
        });
        Ok(Self {
            round: 1,
            schedule,
            item_factors: v,
        })
    }

    pub fn n_items(&self) -> usize {
        self.item_factors.nrows()
    }

    pub fn rank(&self) -> usize {
        self.item_factors.ncols()
    }

    /// Rows of the reported matrix (`q` or `m`).
    pub fn report_rows(&self) -> usize {
        self.schedule.report_rows(self.n_items())
    }
}

/// A round as the service publishes it: the protocol state plus the item ids of the
/// catalogue axis, with `V` as rows (`item_factors[j]` is the profile of `items[j]`).
/// The client maps its own ratings to indices with [`PublishedRound::ratings_by_index`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PublishedRound {
    pub round: u64,
    pub schedule: Schedule,
    pub items: Vec<String>,
    pub item_factors: Vec<Vec<f64>>,
    /// Rows of the reported matrix (`q`, or the number of items without a projection).
    pub report_rows: usize,
    /// The local eps each report costs (`eps_total / rounds`).
    pub eps_round: f64,
}

impl PublishedRound {
    pub fn new(state: &RoundState, items: Vec<String>) -> Result<Self> {
        if items.len() != state.n_items() {
            return Err(invalid("items", "one id per row of the item profiles"));
        }
        Ok(Self {
            round: state.round,
            schedule: state.schedule.clone(),
            items,
            item_factors: state
                .item_factors
                .outer_iter()
                .map(|r| r.to_vec())
                .collect(),
            report_rows: state.report_rows(),
            eps_round: state.schedule.eps_round(),
        })
    }

    /// The protocol state (checks the shape and the schedule).
    pub fn state(&self) -> Result<RoundState> {
        let m = self.items.len();
        let d = self.schedule.rank;
        if self.item_factors.len() != m || self.item_factors.iter().any(|r| r.len() != d) {
            return Err(invalid("item_factors", format!("must be {m} rows of {d}")));
        }
        self.schedule.validate(m)?;
        let flat: Vec<f64> = self.item_factors.iter().flatten().copied().collect();
        if flat.iter().any(|x| !x.is_finite()) {
            return Err(invalid("item_factors", "must be finite"));
        }
        let v = Array2::from_shape_vec((m, d), flat)
            .map_err(|e| invalid("item_factors", e.to_string()))?;
        Ok(RoundState {
            round: self.round,
            schedule: self.schedule.clone(),
            item_factors: v,
        })
    }

    /// The user's ratings `(item id, value)` as `(item index, value)`; items outside the
    /// schedule's catalogue are left out (they have no public profile).
    pub fn ratings_by_index(&self, ratings: &[(&str, f64)]) -> Vec<(u32, f64)> {
        let index: std::collections::HashMap<&str, u32> = self
            .items
            .iter()
            .enumerate()
            .map(|(j, id)| (id.as_str(), j as u32))
            .collect();
        ratings
            .iter()
            .filter_map(|(id, v)| index.get(id).map(|&j| (j, *v)))
            .collect()
    }
}

/// One user's report for one round: a coordinate and one bit. `rows` and `rank` echo the
/// round's dimensions so a report computed against a stale state is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Report {
    pub round: u64,
    /// Rows of the reported matrix: `q` (GD-DR) or `m` (Private-GD).
    pub rows: u32,
    /// Columns: the rank `d`.
    pub rank: u32,
    /// Row of the reported entry, in `0..rows`.
    pub row: u32,
    /// Column of the reported entry, in `0..rank`.
    pub col: u32,
    /// The randomised bit, `+1` or `-1`.
    pub bit: i8,
}

impl Report {
    /// Checks that the report fits the open round `state` (round id, dimensions, ranges,
    /// bit). The curator calls this before storing or aggregating anything.
    pub fn validate(&self, state: &RoundState) -> Result<()> {
        self.validate_dims(state.round, state.report_rows(), state.rank())
    }

    /// [`Report::validate`] against the open round's id and dimensions only (the store
    /// checks reports without loading the item profiles).
    pub fn validate_dims(&self, round: u64, rows: usize, rank: usize) -> Result<()> {
        if self.round != round {
            return Err(ProtocolError::WrongRound {
                got: self.round,
                open: round,
            });
        }
        if self.rows as usize != rows {
            return Err(invalid(
                "rows",
                format!(
                    "the round reports a {rows} x {rank} matrix, got rows={}",
                    self.rows
                ),
            ));
        }
        if self.rank as usize != rank {
            return Err(invalid(
                "rank",
                format!(
                    "the round reports a {rows} x {rank} matrix, got rank={}",
                    self.rank
                ),
            ));
        }
        if self.row as usize >= rows {
            return Err(invalid(
                "row",
                format!("must be < {rows}, got {}", self.row),
            ));
        }
        if self.col as usize >= rank {
            return Err(invalid(
                "col",
                format!("must be < {rank}, got {}", self.col),
            ));
        }
        if self.bit != 1 && self.bit != -1 {
            return Err(invalid(
                "bit",
                format!("must be +1 or -1, got {}", self.bit),
            ));
        }
        Ok(())
    }
}

/// SplitMix64 finaliser: a bijective 64-bit mixer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Entry `(row, item)` of the projection `Phi` of `spec`: `N(0, 1/q)` by Box-Muller from
/// two hashed 53-bit uniforms of `(seed, row, item)`. Deterministic and public.
pub fn phi(spec: ProjectionSpec, row: usize, item: usize) -> f64 {
    let key = mix(spec.seed ^ 0x6A09_E667_F3BC_C908);
    let z = mix(key ^ mix(((row as u64) << 32) ^ item as u64));
    let h1 = mix(z ^ 0x9E37_79B9_7F4A_7C15);
    let h2 = mix(z.wrapping_add(0xD1B5_4A32_D192_ED03));
    // u1 in (0, 1], u2 in [0, 1).
    let u1 = ((h1 >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
    let u2 = (h2 >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    let g = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    g / (spec.dim as f64).sqrt()
}

/// A client's own profile: personal bias and factors, fitted on the device.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalProfile {
    pub bias: f64,
    pub factors: Vec<f64>,
}

fn check_ratings(state: &RoundState, ratings: &[(u32, f64)]) -> Result<()> {
    let m = state.n_items();
    for &(item, value) in ratings {
        if item as usize >= m {
            return Err(invalid(
                "item",
                format!("{item} is outside the catalogue of {m}"),
            ));
        }
        if !value.is_finite() {
            return Err(invalid("rating", format!("{value} is not finite")));
        }
    }
    Ok(())
}

/// The client's profile against the public `V`: the ridge solution of
/// `min sum_j (r_j - offset - b - u.v_j)^2 + reg_user (|u|^2 + b^2)` (`b = 0` without a
/// user bias). Depends only on the user's own ratings and public data.
pub fn local_profile(state: &RoundState, ratings: &[(u32, f64)]) -> Result<LocalProfile> {
    check_ratings(state, ratings)?;
    Ok(fit_profile(state, ratings))
}

fn fit_profile(state: &RoundState, ratings: &[(u32, f64)]) -> LocalProfile {
    let d = state.rank();
    let c = &state.schedule.client;
    let with_bias = c.user_bias;
    let n = d + usize::from(with_bias);
    let mut a = vec![0.0; n * n];
    let mut b = vec![0.0; n];
    let mut feat = vec![0.0; n];
    for &(item, value) in ratings {
        let v = state.item_factors.row(item as usize);
        for (f, x) in feat.iter_mut().zip(v.iter()) {
            *f = *x;
        }
        if with_bias {
            feat[d] = 1.0;
        }
        let y = value - c.offset;
        for i in 0..n {
            b[i] += feat[i] * y;
            let fi = feat[i];
            for (aij, fj) in a[i * n..i * n + n].iter_mut().zip(&feat) {
                *aij += fi * fj;
            }
        }
    }
    for i in 0..n {
        a[i * n + i] += c.reg_user;
    }
    if ratings.is_empty() || !cholesky_solve(&mut a, &mut b, n) {
        // No ratings (or a degenerate V): the zero profile.
        return LocalProfile {
            bias: 0.0,
            factors: vec![0.0; d],
        };
    }
    let bias = if with_bias { b[d] } else { 0.0 };
    b.truncate(d);
    LocalProfile { bias, factors: b }
}

/// Entry `(row, col)` of the client's (projected) gradient `x = Phi grad_V^u`, with
/// `grad_V^u[j] = -2 u (r_j - offset - b - u.v_j)` on the rated items (zero elsewhere);
/// without a projection, `row` is an item. Not clipped.
pub fn gradient_entry(
    state: &RoundState,
    ratings: &[(u32, f64)],
    profile: &LocalProfile,
    row: usize,
    col: usize,
) -> f64 {
    let u = &profile.factors;
    let offset = state.schedule.client.offset + profile.bias;
    let residual = |item: u32, value: f64| {
        let v = state.item_factors.row(item as usize);
        let pred: f64 = u.iter().zip(v.iter()).map(|(a, b)| a * b).sum();
        value - offset - pred
    };
    let weighted: f64 = match state.schedule.projection {
        Some(spec) => ratings
            .iter()
            .map(|&(item, value)| phi(spec, row, item as usize) * residual(item, value))
            .sum(),
        None => ratings
            .iter()
            .filter(|&&(item, _)| item as usize == row)
            .map(|&(item, value)| residual(item, value))
            .sum(),
    };
    -2.0 * u[col] * weighted
}

/// The report of a client whose profile is already fitted (the simulator reuses it).
pub fn report_with_profile<R: Rng + ?Sized>(
    state: &RoundState,
    ratings: &[(u32, f64)],
    profile: &LocalProfile,
    rng: &mut R,
) -> Result<Report> {
    let rows = state.report_rows();
    let rank = state.rank();
    // The coordinate is drawn before looking at the data and independently of it.
    let row = rng.random_range(0..rows);
    let col = rng.random_range(0..rank);
    let x = gradient_entry(state, ratings, profile, row, col);
    // A non-finite entry (overflow) carries no usable signal: report it as 0.
    let x = if x.is_finite() { x } else { 0.0 };
    let p = one_bit_probability(x / state.schedule.clip, state.schedule.eps_round())
        .map_err(|e| invalid("eps_total", e.to_string()))?;
    let bit = if rng.random_bool(p) { 1 } else { -1 };
    Ok(Report {
        round: state.round,
        rows: rows as u32,
        rank: rank as u32,
        row: row as u32,
        col: col as u32,
        bit,
    })
}

/// The client: from the published round state and the user's own ratings
/// `(item index, value)`, the one-bit report for this round (`eps_round`-LDP).
pub fn client_report<R: Rng + ?Sized>(
    state: &RoundState,
    ratings: &[(u32, f64)],
    rng: &mut R,
) -> Result<Report> {
    let profile = local_profile(state, ratings)?;
    report_with_profile(state, ratings, &profile, rng)
}

/// The curator's running sum of one round's bits.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregator {
    pub round: u64,
    pub rows: usize,
    pub rank: usize,
    /// Sum of bits per coordinate, row-major `rows x rank`.
    pub sums: Vec<i64>,
    /// Number of reports added.
    pub n: u64,
}

impl Aggregator {
    pub fn new(state: &RoundState) -> Self {
        let rows = state.report_rows();
        let rank = state.rank();
        Self {
            round: state.round,
            rows,
            rank,
            sums: vec![0; rows * rank],
            n: 0,
        }
    }

    /// Adds a validated report.
    pub fn add(&mut self, state: &RoundState, r: &Report) -> Result<()> {
        r.validate(state)?;
        self.sums[r.row as usize * self.rank + r.col as usize] += i64::from(r.bit);
        self.n += 1;
        Ok(())
    }

    /// Adds another partial sum of the same round (e.g. from another worker).
    pub fn merge(&mut self, other: &Aggregator) {
        debug_assert_eq!(
            (self.round, self.rows, self.rank),
            (other.round, other.rows, other.rank)
        );
        for (a, b) in self.sums.iter_mut().zip(&other.sums) {
            *a += b;
        }
        self.n += other.n;
    }

    /// The paper's estimate `grad_B* = (1/n) sum_i x_i*` with each report worth
    /// `bit * C * rows * rank * B`: unbiased for the mean clipped (projected) gradient.
    /// Zero when no report arrived.
    pub fn estimate(&self, schedule: &Schedule) -> Result<Array2<f64>> {
        let mut g = Array2::zeros((self.rows, self.rank));
        if self.n == 0 {
            return Ok(g);
        }
        let b =
            one_bit_bound(schedule.eps_round()).map_err(|e| invalid("eps_total", e.to_string()))?;
        let w = schedule.clip * (self.rows * self.rank) as f64 * b / self.n as f64;
        for (x, &s) in g.iter_mut().zip(&self.sums) {
            *x = w * s as f64;
        }
        Ok(g)
    }
}

/// The curator's map from the reported `rows x d` gradient back to items: the identity
/// (Private-GD) or `Phi^+ = Phi^T (Phi Phi^T)^-1` (GD-DR). Built once per projection
/// (it depends only on public parameters): `Phi` is kept as `f32` (q x m) and the
/// Cholesky factor of `Phi Phi^T` as `f64`.
pub struct Recovery {
    n_items: usize,
    projection: Option<ProjectionSpec>,
    phi: Array2<f32>,
    /// Lower Cholesky factor of `Phi Phi^T`, row-major `q x q`.
    chol: Vec<f64>,
}

impl std::fmt::Debug for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recovery")
            .field("n_items", &self.n_items)
            .field("projection", &self.projection)
            .finish()
    }
}

/// Dot product with four accumulators (lets the compiler pipeline the loop).
fn dot4(a: &[f64], b: &[f64]) -> f64 {
    let mut s = [0.0; 4];
    let chunks = a.len() / 4;
    for k in 0..chunks {
        for (t, acc) in s.iter_mut().enumerate() {
            *acc += a[4 * k + t] * b[4 * k + t];
        }
    }
    let mut tail = 0.0;
    for k in 4 * chunks..a.len() {
        tail += a[k] * b[k];
    }
    (s[0] + s[1]) + (s[2] + s[3]) + tail
}

/// In-place lower Cholesky factor of a symmetric positive definite `n x n` row-major
/// matrix (the upper triangle is left as is). `false` when not positive definite.
fn cholesky_lower(a: &mut [f64], n: usize) -> bool {
    for i in 0..n {
        for j in 0..=i {
            let (head, tail) = a.split_at_mut(i * n);
            let row_i = &mut tail[..n];
            let lj: &[f64] = if j < i { &head[j * n..j * n + j] } else { &[] };
            let s = if j < i {
                row_i[j] - dot4(&row_i[..j], lj)
            } else {
                row_i[i] - dot4(&row_i[..i], &row_i[..i])
            };
            if j == i {
                if s <= 0.0 || !s.is_finite() {
                    return false;
                }
                row_i[i] = s.sqrt();
            } else {
                row_i[j] = s / head[j * n + j];
            }
        }
    }
    true
}

impl Recovery {
    /// Builds the recovery map for `state`'s schedule over `n_items`.
    pub fn new(schedule: &Schedule, n_items: usize) -> Result<Self> {
        schedule.validate(n_items)?;
        let Some(spec) = schedule.projection else {
            return Ok(Self {
                n_items,
                projection: None,
                phi: Array2::zeros((0, 0)),
                chol: Vec::new(),
            });
        };
        let q = spec.dim;
        let mut phi_m = Array2::<f32>::zeros((q, n_items));
        phi_m
            .axis_iter_mut(Axis(0))
            .into_par_iter()
            .enumerate()
            .for_each(|(s, mut row)| {
                for (j, x) in row.iter_mut().enumerate() {
                    *x = phi(spec, s, j) as f32;
                }
            });
        // Gram matrix Phi Phi^T, by row blocks in parallel.
        let block = q.div_ceil(rayon::current_num_threads().max(1) * 4).max(1);
        let blocks: Vec<Array2<f32>> = (0..q)
            .step_by(block)
            .collect::<Vec<_>>()
            .into_par_iter()
            .map(|start| {
                let end = (start + block).min(q);
                phi_m.slice(ndarray::s![start..end, ..]).dot(&phi_m.t())
            })
            .collect();
        let mut chol = Vec::with_capacity(q * q);
        for b in &blocks {
            chol.extend(b.iter().map(|&x| f64::from(x)));
        }
        if !cholesky_lower(&mut chol, q) {
            return Err(ProtocolError::Singular { q, m: n_items });
        }
        Ok(Self {
            n_items,
            projection: Some(spec),
            phi: phi_m,
            chol,
        })
    }

    /// `Phi^+ g` for a `rows x d` gradient `g` (the identity without a projection).
    pub fn apply(&self, g: &Array2<f64>) -> Array2<f64> {
        let Some(spec) = self.projection else {
            return g.clone();
        };
        let q = spec.dim;
        let d = g.ncols();
        let l = &self.chol;
        // z = (L L^T)^-1 g, column by column.
        let mut z = Array2::<f32>::zeros((q, d));
        for c in 0..d {
            let mut y: Vec<f64> = g.column(c).to_vec();
            for i in 0..q {
                let s = y[i] - dot4(&l[i * q..i * q + i], &y[..i]);
                y[i] = s / l[i * q + i];
            }
            for i in (0..q).rev() {
                let mut s = y[i];
                for k in i + 1..q {
                    s -= l[k * q + i] * y[k];
                }
                y[i] = s / l[i * q + i];
            }
            for (i, v) in y.iter().enumerate() {
                z[[i, c]] = *v as f32;
            }
        }
        self.phi.t().dot(&z).mapv(f64::from)
    }
}

/// Closes round `state` with the aggregated reports: the next round's state with
/// `V <- V - (lr / t) / f (Phi^+ grad_B* + 2 lambda_v V)`, `f = k^2` with the correction.
pub fn next_state(state: &RoundState, recovery: &Recovery, agg: &Aggregator) -> Result<RoundState> {
    if agg.round != state.round {
        return Err(ProtocolError::WrongRound {
            got: agg.round,
            open: state.round,
        });
    }
    if recovery.n_items != state.n_items() || recovery.projection != state.schedule.projection {
        return Err(invalid(
            "recovery",
            "built for another projection or catalogue",
        ));
    }
    let s = &state.schedule;
    let grad_b = agg.estimate(s)?;
    let grad_v = recovery.apply(&grad_b);
    let k = f64::from(s.rounds);
    let f = if s.correction { k * k } else { 1.0 };
    let step = s.lr / state.round as f64 / f;
    let mut v = state.item_factors.clone();
    v.zip_mut_with(&grad_v, |x, g| *x -= step * (g + 2.0 * s.reg_item * *x));
    Ok(RoundState {
        round: state.round + 1,
        schedule: s.clone(),
        item_factors: v,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dprec_dp::privacy::stats::freq_tolerance;
    use dprec_dp::rng::seeded;

    fn schedule(projection: Option<ProjectionSpec>) -> Schedule {
        Schedule {
            eps_total: 2.0,
            rounds: 2,
            rank: 3,
            projection,
            clip: 1.0,
            lr: 1.0,
            reg_item: 0.0,
            correction: false,
            client: ClientSettings {
                offset: 3.0,
                reg_user: 1.0,
                user_bias: true,
            },
        }
    }

    #[test]
    fn phi_is_deterministic_with_variance_one_over_q() {
        let spec = ProjectionSpec { seed: 7, dim: 50 };
        assert_eq!(phi(spec, 3, 9), phi(spec, 3, 9));
        assert_ne!(phi(spec, 3, 9), phi(spec, 9, 3));
        assert_ne!(
            phi(spec, 3, 9),
            phi(ProjectionSpec { seed: 8, dim: 50 }, 3, 9)
        );
        let n = 200_000;
        let (mut s1, mut s2) = (0.0, 0.0);
        for k in 0..n {
            let x = phi(spec, k / 1000, k % 1000) * (50f64).sqrt();
            s1 += x;
            s2 += x * x;
        }
        let mean = s1 / n as f64;
        let var = s2 / n as f64 - mean * mean;
        // sd of the mean 1/sqrt(n) = 0.0022; of the variance sqrt(2/n) = 0.0032.
        assert!(mean.abs() < 0.012, "mean {mean}");
        assert!((var - 1.0).abs() < 0.017, "variance {var}");
    }

    #[test]
    fn recovery_is_the_pseudo_inverse() {
        let spec = ProjectionSpec { seed: 3, dim: 6 };
        let s = schedule(Some(spec));
        let m = 20;
        let rec = Recovery::new(&s, m).unwrap();
        // Phi Phi^+ g = g for any q x d matrix g.
        let g = Array2::from_shape_fn((6, 3), |(i, j)| (i as f64 - 2.5) * 0.3 + j as f64);
        let back = rec.apply(&g);
        assert_eq!(back.dim(), (m, 3));
        for i in 0..6 {
            for c in 0..3 {
                let x: f64 = (0..m).map(|j| phi(spec, i, j) * back[[j, c]]).sum();
                assert!(
                    (x - g[[i, c]]).abs() < 1e-4,
                    "({i},{c}): {x} vs {}",
                    g[[i, c]]
                );
            }
        }
        // Without a projection the map is the identity.
        let id = Recovery::new(&schedule(None), m).unwrap();
        let g = Array2::from_shape_fn((m, 3), |(i, j)| (i * 3 + j) as f64);
        assert_eq!(id.apply(&g), g);
    }

    #[test]
    fn cholesky_lower_factorises() {
        let n = 9;
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                a[i * n + j] =
                    1.0 / (1.0 + (i as f64 - j as f64).abs()) + if i == j { n as f64 } else { 0.0 };
            }
        }
        let orig = a.clone();
        assert!(cholesky_lower(&mut a, n));
        for i in 0..n {
            for j in 0..=i {
                let x: f64 = (0..=j).map(|k| a[i * n + k] * a[j * n + k]).sum();
                assert!((x - orig[i * n + j]).abs() < 1e-12);
            }
        }
        let mut bad = vec![1.0, 2.0, 2.0, 1.0];
        assert!(!cholesky_lower(&mut bad, 2));
    }

    /// The local profile is the ridge solution: its normal equations hold.
    #[test]
    fn local_profile_solves_the_ridge_problem() {
        let mut rng = seeded(1);
        let state = RoundState::initial(schedule(None), 10, 0.5, &mut rng).unwrap();
        let ratings = [(0u32, 4.0), (3, 2.0), (7, 5.0), (9, 1.0)];
        let p = local_profile(&state, &ratings).unwrap();
        let reg = state.schedule.client.reg_user;
        // d/du: sum_j (pred_j - y_j) v_j + reg u = 0; d/db: sum_j (pred_j - y_j) + reg b = 0.
        let mut gu = [0.0; 3];
        let mut gb = 0.0;
        for &(j, r) in &ratings {
            let v = state.item_factors.row(j as usize);
            let pred = p.bias
                + p.factors
                    .iter()
                    .zip(v.iter())
                    .map(|(a, b)| a * b)
                    .sum::<f64>();
            let e = pred - (r - 3.0);
            gb += e;
            for (g, vl) in gu.iter_mut().zip(v.iter()) {
                *g += e * vl;
            }
        }
        assert!((gb + reg * p.bias).abs() < 1e-9);
        for (g, f) in gu.iter().zip(&p.factors) {
            assert!((g + reg * f).abs() < 1e-9);
        }
        assert!(local_profile(&state, &[(10, 3.0)]).is_err());
        assert!(local_profile(&state, &[(1, f64::NAN)]).is_err());
        assert_eq!(local_profile(&state, &[]).unwrap().factors, vec![0.0; 3]);
    }

    /// The reported entry is the (projected) gradient: checked against the full
    /// `Phi grad_V` computed the long way.
    #[test]
    fn gradient_entry_matches_full_projection() {
        let spec = ProjectionSpec { seed: 11, dim: 4 };
        let mut rng = seeded(2);
        let state = RoundState::initial(schedule(Some(spec)), 12, 0.5, &mut rng).unwrap();
        let ratings = [(1u32, 4.0), (5, 2.0), (11, 5.0)];
        let p = local_profile(&state, &ratings).unwrap();
        for s in 0..4 {
            for l in 0..3 {
                let mut full = 0.0;
                for &(j, r) in &ratings {
                    let v = state.item_factors.row(j as usize);
                    let pred = 3.0
                        + p.bias
                        + p.factors
                            .iter()
                            .zip(v.iter())
                            .map(|(a, b)| a * b)
                            .sum::<f64>();
                    full += phi(spec, s, j as usize) * (-2.0 * p.factors[l] * (r - pred));
                }
                let x = gradient_entry(&state, &ratings, &p, s, l);
                assert!((x - full).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn reports_are_validated_against_the_round() {
        let mut rng = seeded(3);
        let state = RoundState::initial(
            schedule(Some(ProjectionSpec { seed: 1, dim: 5 })),
            8,
            0.1,
            &mut rng,
        )
        .unwrap();
        let good = client_report(&state, &[(2, 4.0)], &mut rng).unwrap();
        assert!(good.validate(&state).is_ok());
        assert_eq!((good.rows, good.rank), (5, 3));
        let bad = |f: fn(&mut Report)| {
            let mut r = good;
            f(&mut r);
            r.validate(&state).unwrap_err()
        };
        assert!(matches!(
            bad(|r| r.round = 2),
            ProtocolError::WrongRound { got: 2, open: 1 }
        ));
        assert!(bad(|r| r.rows = 8).to_string().contains("rows"));
        assert!(bad(|r| r.rank = 4).to_string().contains("rank"));
        assert!(bad(|r| r.row = 5).to_string().contains("row"));
        assert!(bad(|r| r.col = 3).to_string().contains("col"));
        assert!(bad(|r| r.bit = 0).to_string().contains("bit"));
        let mut agg = Aggregator::new(&state);
        let mut r = good;
        r.bit = 2;
        assert!(agg.add(&state, &r).is_err());
        assert_eq!(agg.n, 0);
    }

    /// Catches a wrong report probability or a wrong `B` (scale) in the aggregation:
    /// many clients whose reported entry is the same known value `x`; the estimate of
    /// that coordinate must equal the mean clipped value within 5.33 standard errors
    /// (false-failure about 1e-7 per check, 4 checks), and an estimate with `B` 10% too
    /// large (or too small) must fall outside the tolerance.
    #[test]
    fn aggregation_is_unbiased_and_wrong_scale_detected() {
        // Private-GD (no projection) over m = 1 item and d = 1: every report lands on
        // coordinate (0, 0), so the estimate is a plain mean of n reports.
        let mut s = schedule(None);
        s.rank = 1;
        s.clip = 2.0;
        s.eps_total = 1.6; // eps_round = 0.8
        let n = 200_000usize;
        for &target in &[1.5f64, -1.2, 3.0, -0.4] {
            let state = RoundState {
                round: 1,
                schedule: s.clone(),
                item_factors: Array2::zeros((1, 1)),
            };
            let clipped = target.clamp(-s.clip, s.clip);
            let eps = s.eps_round();
            let p = one_bit_probability(clipped / s.clip, eps).unwrap();
            let mut agg = Aggregator::new(&state);
            let mut rng = seeded(40 + (target * 10.0) as u64);
            for _ in 0..n {
                let bit = if rng.random_bool(p) { 1 } else { -1 };
                let r = Report {
                    round: 1,
                    rows: 1,
                    rank: 1,
                    row: 0,
                    col: 0,
                    bit,
                };
                agg.add(&state, &r).unwrap();
            }
            let est = agg.estimate(&s).unwrap()[[0, 0]];
            let w = s.clip * one_bit_bound(eps).unwrap();
            let tol = 2.0 * w * freq_tolerance(p, n);
            assert!(
                (est - clipped).abs() < tol,
                "target {target}: {est} vs {clipped} (tol {tol})"
            );
            if clipped.abs() >= 1.0 {
                assert!(
                    (1.1 * est - clipped).abs() > tol,
                    "10% larger B not detected"
                );
                assert!(
                    (0.9 * est - clipped).abs() > tol,
                    "10% smaller B not detected"
                );
            }
        }
    }

    /// Catches a client that randomises at the wrong eps (e.g. `eps_total` instead of
    /// `eps_total / k`) or forgets to divide by the clipping bound: with one coordinate
    /// (m = 1, d = 1), the frequency of `+1` over n = 100k reports of the same data must
    /// equal `P(+1) = one_bit_probability(x / C, eps / k)` within 5.33 standard errors
    /// (false-failure about 1e-7), and the probability at a 10% larger eps must not.
    #[test]
    fn client_bit_frequency_matches_the_paper_randomiser() {
        let mut s = schedule(None);
        s.rank = 1;
        s.rounds = 4;
        s.eps_total = 3.2; // eps_round = 0.8
        let state = RoundState {
            round: 1,
            schedule: s.clone(),
            item_factors: Array2::from_elem((1, 1), 0.7),
        };
        let data = [(0u32, 5.0)];
        let p = local_profile(&state, &data).unwrap();
        let x = gradient_entry(&state, &data, &p, 0, 0);
        assert!(x.abs() > 0.1, "degenerate test data: x = {x}");
        // Clip so that x / C = 0.9 (inside the range: the scaling by C matters).
        let mut state = state;
        state.schedule.clip = x.abs() / 0.9;
        let eps = state.schedule.eps_round();
        let want = one_bit_probability(x.signum() * 0.9, eps).unwrap();
        let n = 100_000;
        let mut rng = seeded(8);
        let plus = (0..n)
            .filter(|_| {
                report_with_profile(&state, &data, &p, &mut rng)
                    .unwrap()
                    .bit
                    == 1
            })
            .count();
        let freq = plus as f64 / n as f64;
        let tol = freq_tolerance(want, n);
        assert!((freq - want).abs() < tol, "{freq} vs {want}");
        let wrong_eps = one_bit_probability(x.signum() * 0.9, 1.1 * eps).unwrap();
        assert!(
            (freq - wrong_eps).abs() > tol,
            "10% larger eps not detected"
        );
        let unclipped = one_bit_probability(x.signum(), eps).unwrap();
        assert!((freq - unclipped).abs() > tol, "missing 1/C not detected");
        // Any two data sets: the probabilities differ by at most e^eps (Lemma 1).
        let lo = one_bit_probability(-1.0, eps).unwrap();
        let hi = one_bit_probability(1.0, eps).unwrap();
        assert!(want >= lo && want <= hi && (hi / lo - eps.exp()).abs() < 1e-12);
    }

    /// With exact (noise-free) gradients the update is plain gradient descent on the
    /// item profiles: one round with huge eps moves V along the true gradient.
    #[test]
    fn next_state_applies_the_scaled_update() {
        let mut s = schedule(None);
        s.rank = 1;
        s.rounds = 2;
        s.correction = true;
        s.reg_item = 0.5;
        s.lr = 8.0;
        let state = RoundState {
            round: 1,
            schedule: s.clone(),
            item_factors: Array2::from_elem((2, 1), 1.0),
        };
        let rec = Recovery::new(&s, 2).unwrap();
        let mut agg = Aggregator::new(&state);
        agg.sums = vec![3, -1];
        agg.n = 4;
        let g = agg.estimate(&s).unwrap();
        let next = next_state(&state, &rec, &agg).unwrap();
        assert_eq!(next.round, 2);
        // step = lr / t / k^2 = 8 / 1 / 4 = 2.
        for j in 0..2 {
            let want = 1.0 - 2.0 * (g[[j, 0]] + 2.0 * 0.5 * 1.0);
            assert!((next.item_factors[[j, 0]] - want).abs() < 1e-12);
        }
        let mut other = agg.clone();
        other.round = 5;
        assert!(next_state(&state, &rec, &other).is_err());
    }

    #[test]
    fn schedule_validation_names_the_field() {
        let mut s = schedule(Some(ProjectionSpec { seed: 1, dim: 30 }));
        assert!(s
            .validate(20)
            .unwrap_err()
            .to_string()
            .contains("projection.dim"));
        s.projection = None;
        s.eps_total = f64::NAN;
        assert!(s
            .validate(20)
            .unwrap_err()
            .to_string()
            .contains("eps_total"));
        s.eps_total = 1.0;
        s.rounds = 0;
        assert!(s.validate(20).unwrap_err().to_string().contains("rounds"));
    }
}
