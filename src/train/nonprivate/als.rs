//! Biased matrix factorization by alternating least squares.
//!
//! With the item side fixed, each user's (b_u, p_u) is a ridge regression on the rows
//! z_i = [1, q_i] against r_ui - mu - b_i, solved in closed form; then symmetrically for
//! items. Rows are independent, so each half-step runs in parallel over rows (rayon).
//! `weighted = true` scales the penalty by the row's rating count (ALS-WR, Zhou et al. 2008).

use ndarray::{Array1, Array2};
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;

use crate::data::Compressed;
use crate::numerics::linalg::cholesky_solve;
use crate::train::{FactorModel, Fitted, Guarantee, Params, TrainData, TrainError, Trainer};
use dprec_dp::rng::DpRng;

#[derive(Debug, Clone)]
pub struct AlsMf {
    pub d: usize,
    pub epochs: usize,
    /// Ridge penalty on factors and biases (per rating when `weighted`).
    pub reg: f64,
    pub weighted: bool,
    pub init_sd: f64,
}

impl Default for AlsMf {
    fn default() -> Self {
        Self {
            d: 20,
            epochs: 15,
            reg: 0.1,
            weighted: true,
            init_sd: 0.1,
        }
    }
}

impl AlsMf {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let d = Self::default();
        let t = Self {
            d: p.usize_in("d", d.d, 1, 1024)?,
            epochs: p.usize_in("epochs", d.epochs, 1, 1000)?,
            reg: p.positive("reg", d.reg)?,
            weighted: p.bool("weighted", d.weighted)?,
            init_sd: p.non_negative("init_sd", d.init_sd)?,
        };
        p.reject_unknown("als-mf")?;
        Ok(t)
    }
}

/// Ridge penalty and the fixed side of one half-step.
struct HalfStep<'a> {
    d: usize,
    reg: f64,
    weighted: bool,
    mean: f64,
    other_bias: &'a [f64],
    other_factors: &'a [f64],
}

/// Solves every row of `rows` for (bias, factors) given the other side.
fn solve_rows(h: &HalfStep<'_>, rows: &Compressed, bias: &mut [f64], factors: &mut [f64]) {
    let d = h.d;
    let n = d + 1;
    factors
        .par_chunks_mut(d)
        .zip(bias.par_iter_mut())
        .enumerate()
        .for_each_init(
            || (vec![0.0; n * n], vec![0.0; n]),
            |(a, b), (row, (f, bias))| {
                let (cols, vals) = rows.row(row);
                if cols.is_empty() {
                    f.iter_mut().for_each(|x| *x = 0.0);
                    *bias = 0.0;
                    return;
                }
                a.iter_mut().for_each(|x| *x = 0.0);
                b.iter_mut().for_each(|x| *x = 0.0);
                for (&c, &v) in cols.iter().zip(vals) {
                    let c = c as usize;
                    let q = &h.other_factors[c * d..(c + 1) * d];
                    let y = v as f64 - h.mean - h.other_bias[c];
                    // z = [1, q]; accumulate the upper triangle of z z^T and z y.
                    a[0] += 1.0;
                    b[0] += y;
                    for j in 0..d {
                        a[j + 1] += q[j];
                        b[j + 1] += y * q[j];
                        let row_j = (j + 1) * n;
                        for k in j..d {
                            a[row_j + k + 1] += q[j] * q[k];
                        }
                    }
                }
                let lambda = if h.weighted {
                    h.reg * cols.len() as f64
                } else {
                    h.reg
                };
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

impl Trainer for AlsMf {
    fn name(&self) -> &'static str {
        "als-mf"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::NonPrivate
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "d": self.d, "epochs": self.epochs, "reg": self.reg,
            "weighted": self.weighted, "init_sd": self.init_sd,
        })
    }

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        let r = data.ratings;
        if r.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let m = data.matrix;
        let (nu, ni, d) = (m.n_users, m.n_items, self.d);
        let mean = r.mean();
        let init = Normal::new(0.0, self.init_sd)?;
        let mut p = vec![0.0; nu * d];
        let mut q: Vec<f64> = (0..ni * d).map(|_| init.sample(rng)).collect();
        let mut bu = vec![0.0; nu];
        let mut bi = vec![0.0; ni];
        for _ in 0..self.epochs {
            let users = HalfStep {
                d,
                reg: self.reg,
                weighted: self.weighted,
                mean,
                other_bias: &bi,
                other_factors: &q,
            };
            solve_rows(&users, &m.by_user, &mut bu, &mut p);
            let items = HalfStep {
                d,
                reg: self.reg,
                weighted: self.weighted,
                mean,
                other_bias: &bu,
                other_factors: &p,
            };
            solve_rows(&items, m.by_item(), &mut bi, &mut q);
        }
        let model = FactorModel {
            global_mean: mean,
            user_bias: Array1::from(bu),
            item_bias: Array1::from(bi),
            user_factors: Array2::from_shape_vec((nu, d), p).expect("shape"),
            item_factors: Array2::from_shape_vec((ni, d), q).expect("shape"),
            scale: data.scale,
        };
        Ok(Fitted::non_private(model))
    }
}
