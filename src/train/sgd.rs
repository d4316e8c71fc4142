//! Biased matrix factorization trained by stochastic gradient descent (Funk-SVD style,
//! as in Koren, Bell, Volinsky 2009):
//!   e = r - (mu + b_u + b_i + p_u . q_i)
//!   b_u += lr (e - reg_bias b_u);  b_i += lr (e - reg_bias b_i)
//!   p_u += lr (e q_i - reg p_u);   q_i += lr (e p_u - reg q_i)
//!
//! With `blocks > 1` an epoch is run as stratified SGD (DSGD, Gemulla et al. 2011): users
//! and items are cut into `blocks` contiguous ranges; in each of `blocks` sub-epochs the
//! blocks (b, b + s mod blocks) touch disjoint rows of P and Q, so they run in parallel
//! with no locking and the result does not depend on thread scheduling.

use ndarray::{Array1, Array2};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;

use super::{FactorModel, Fitted, Params, TrainData, TrainError, Trainer};
use crate::rng::{self, DpRng};

#[derive(Debug, Clone)]
pub struct SgdMf {
    pub d: usize,
    pub epochs: usize,
    pub lr: f64,
    /// L2 penalty on factors.
    pub reg: f64,
    /// L2 penalty on biases.
    pub reg_bias: f64,
    /// Standard deviation of the Gaussian initialisation of factors.
    pub init_sd: f64,
    /// Learning rate multiplier applied after each epoch.
    pub lr_decay: f64,
    /// Number of DSGD blocks; 0 picks one per thread for large data, 1 otherwise.
    pub blocks: usize,
}

impl Default for SgdMf {
    fn default() -> Self {
        Self {
            d: 100,
            epochs: 40,
            lr: 0.005,
            reg: 0.06,
            reg_bias: 0.02,
            init_sd: 0.1,
            lr_decay: 0.99,
            blocks: 0,
        }
    }
}

impl SgdMf {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let d = Self::default();
        let reg = p.non_negative("reg", d.reg)?;
        let t = Self {
            d: p.usize_in("d", d.d, 1, 4096)?,
            epochs: p.usize_in("epochs", d.epochs, 1, 10_000)?,
            lr: p.positive("lr", d.lr)?,
            reg,
            reg_bias: p.non_negative("reg_bias", d.reg_bias)?,
            init_sd: p.non_negative("init_sd", d.init_sd)?,
            lr_decay: p.positive("lr_decay", d.lr_decay)?,
            blocks: p.usize_in("blocks", d.blocks, 0, 1024)?,
        };
        p.reject_unknown("sgd-mf")?;
        Ok(t)
    }

    fn effective_blocks(&self, nnz: usize) -> usize {
        match self.blocks {
            0 if nnz >= 1_000_000 => rayon::current_num_threads().max(1),
            0 => 1,
            b => b,
        }
    }
}

/// Mutable parameters of one block of rows (users or items).
struct RowBlock<'a> {
    first: usize,
    bias: &'a mut [f64],
    factors: &'a mut [f64],
}

/// Splits `n` rows into `blocks` contiguous ranges: boundaries[b]..boundaries[b + 1].
fn boundaries(n: usize, blocks: usize) -> Vec<usize> {
    (0..=blocks).map(|b| b * n / blocks).collect()
}

fn split_rows<'a>(
    bounds: &[usize],
    d: usize,
    mut bias: &'a mut [f64],
    mut factors: &'a mut [f64],
) -> Vec<RowBlock<'a>> {
    let mut out = Vec::with_capacity(bounds.len() - 1);
    for w in bounds.windows(2) {
        let len = w[1] - w[0];
        let (b, rest_b) = bias.split_at_mut(len);
        let (f, rest_f) = factors.split_at_mut(len * d);
        bias = rest_b;
        factors = rest_f;
        out.push(RowBlock {
            first: w[0],
            bias: b,
            factors: f,
        });
    }
    out
}

/// Hyper-parameters of one SGD pass.
struct Step {
    d: usize,
    lr: f64,
    reg: f64,
    reg_bias: f64,
    mean: f64,
}

/// A training rating packed for a cache-friendly sequential pass.
#[derive(Clone, Copy)]
struct Entry {
    user: u32,
    item: u32,
    value: f32,
}

/// Dot product with four independent accumulators, so the compiler can vectorise it
/// (a single running sum is a serial dependency chain it must not reorder).
#[inline(always)]
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut acc = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        acc[0] += x[0] * y[0];
        acc[1] += x[1] * y[1];
        acc[2] += x[2] * y[2];
        acc[3] += x[3] * y[3];
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// Runs [`pass`] compiled for AVX2 when the CPU has it (twice the vector width of the
/// x86-64 baseline), else the portable build.
fn run_pass(s: &Step, entries: &[Entry], users: &mut RowBlock<'_>, items: &mut RowBlock<'_>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked just above.
        unsafe { pass_avx2(s, entries, users, items) };
        return;
    }
    pass(s, entries, users, items)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pass_avx2(
    s: &Step,
    entries: &[Entry],
    users: &mut RowBlock<'_>,
    items: &mut RowBlock<'_>,
) {
    pass(s, entries, users, items)
}

/// One pass of SGD over `entries` (all inside the two blocks), in the given order.
#[inline(always)]
fn pass(s: &Step, entries: &[Entry], users: &mut RowBlock<'_>, items: &mut RowBlock<'_>) {
    let d = s.d;
    for e in entries {
        let u = e.user as usize - users.first;
        let i = e.item as usize - items.first;
        let pu = &mut users.factors[u * d..(u + 1) * d];
        let qi = &mut items.factors[i * d..(i + 1) * d];
        let err = e.value as f64 - (s.mean + users.bias[u] + items.bias[i] + dot(pu, qi));
        users.bias[u] += s.lr * (err - s.reg_bias * users.bias[u]);
        items.bias[i] += s.lr * (err - s.reg_bias * items.bias[i]);
        for (a, b) in pu.iter_mut().zip(qi.iter_mut()) {
            let (pa, qb) = (*a, *b);
            *a += s.lr * (err * qb - s.reg * pa);
            *b += s.lr * (err * pa - s.reg * qb);
        }
    }
}

impl Trainer for SgdMf {
    fn name(&self) -> &'static str {
        "sgd-mf"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "d": self.d, "epochs": self.epochs, "lr": self.lr, "reg": self.reg,
            "reg_bias": self.reg_bias, "init_sd": self.init_sd, "lr_decay": self.lr_decay,
            "blocks": self.blocks,
        })
    }

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        let r = data.ratings;
        if r.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let (nu, ni, d) = (r.n_users, r.n_items, self.d);
        let init =
            Normal::new(0.0, self.init_sd).map_err(|e| TrainError::Numerical(e.to_string()))?;
        let mut p: Vec<f64> = (0..nu * d).map(|_| init.sample(rng)).collect();
        let mut q: Vec<f64> = (0..ni * d).map(|_| init.sample(rng)).collect();
        let mut bu = vec![0.0; nu];
        let mut bi = vec![0.0; ni];

        let blocks = self.effective_blocks(r.len());
        let ub = boundaries(nu, blocks);
        let ib = boundaries(ni, blocks);
        let block_of = |bounds: &[usize], x: usize| bounds.partition_point(|&b| b <= x) - 1;
        // Bucket the ratings by (user block, item block) once.
        let mut buckets: Vec<Vec<Entry>> = vec![Vec::new(); blocks * blocks];
        for k in 0..r.len() {
            let (user, item) = (r.users[k], r.items[k]);
            let a = block_of(&ub, user as usize);
            let b = block_of(&ib, item as usize);
            buckets[a * blocks + b].push(Entry {
                user,
                item,
                value: r.values[k],
            });
        }
        let base_seed: u64 = rng.random();
        let mut step = Step {
            d,
            lr: self.lr,
            reg: self.reg,
            reg_bias: self.reg_bias,
            mean: r.mean(),
        };
        for epoch in 0..self.epochs {
            for stratum in 0..blocks {
                let mut ublocks = split_rows(&ub, d, &mut bu, &mut p);
                let mut iblocks: Vec<Option<RowBlock>> = split_rows(&ib, d, &mut bi, &mut q)
                    .into_iter()
                    .map(Some)
                    .collect();
                let mut work: Vec<(usize, RowBlock, RowBlock, Vec<Entry>)> =
                    Vec::with_capacity(blocks);
                for (a, ublock) in ublocks.drain(..).enumerate() {
                    let b = (a + stratum) % blocks;
                    let iblock = iblocks[b]
                        .take()
                        .expect("each item block used once per stratum");
                    let bucket = std::mem::take(&mut buckets[a * blocks + b]);
                    work.push((a * blocks + b, ublock, iblock, bucket));
                }
                let step_ref = &step;
                let done: Vec<(usize, Vec<Entry>)> = work
                    .into_par_iter()
                    .map(|(slot, mut ublock, mut iblock, mut bucket)| {
                        let seed = base_seed ^ ((epoch as u64) << 32) ^ slot as u64;
                        bucket.shuffle(&mut rng::seeded(seed));
                        run_pass(step_ref, &bucket, &mut ublock, &mut iblock);
                        (slot, bucket)
                    })
                    .collect();
                for (slot, bucket) in done {
                    buckets[slot] = bucket;
                }
            }
            step.lr *= self.lr_decay;
        }
        if p.iter().chain(&q).any(|x| !x.is_finite()) {
            return Err(TrainError::Numerical(
                "SGD diverged (non-finite factors): lower lr or raise reg".into(),
            ));
        }
        let model = FactorModel {
            global_mean: step.mean,
            user_bias: Array1::from(bu),
            item_bias: Array1::from(bi),
            user_factors: Array2::from_shape_vec((nu, d), p).expect("shape"),
            item_factors: Array2::from_shape_vec((ni, d), q).expect("shape"),
            scale: data.scale,
        };
        Ok(Fitted { model })
    }
}
