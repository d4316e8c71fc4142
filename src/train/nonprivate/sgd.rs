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

use crate::data::Ratings;
use crate::train::{FactorModel, Fitted, Guarantee, Params, TrainData, TrainError, Trainer};
use dprec_dp::rng::{self, DpRng};

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
    /// Number of DSGD blocks (parallel strata); 0 = auto, see `effective_blocks`.
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

    /// `blocks = 0` (auto) uses 2 blocks from 50k ratings up (both cores of a small
    /// machine) and 1 below, where the fork-join per stratum costs more than it saves. It is
    /// a constant, not the thread count, so a seed gives the same model on any machine.
    fn effective_blocks(&self, nnz: usize) -> usize {
        match self.blocks {
            0 if nnz >= 50_000 => 2,
            0 => 1,
            b => b,
        }
    }
}

/// Mutable parameters of one block of rows (users or items).
struct RowBlock<'a> {
    first: usize,
    bias: &'a mut [f32],
    factors: &'a mut [f32],
}

/// Where each row (user or item) sits in the blocked layout: rows are dealt to blocks in
/// snake order of descending rating count, so every block carries about the same number
/// of ratings and the parallel blocks of a stratum finish together.
struct Layout {
    /// Position of row `r` in the blocked layout.
    pos: Vec<u32>,
    /// Block `b` owns positions `bounds[b]..bounds[b + 1]`.
    bounds: Vec<usize>,
}

impl Layout {
    fn balanced(rows: &[u32], n: usize, blocks: usize) -> Self {
        if blocks == 1 {
            return Self {
                pos: (0..n as u32).collect(),
                bounds: vec![0, n],
            };
        }
        let mut count = vec![0usize; n];
        for &r in rows {
            count[r as usize] += 1;
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&r| std::cmp::Reverse(count[r]));
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); blocks];
        for (k, &row) in order.iter().enumerate() {
            let j = k % blocks;
            let b = if (k / blocks).is_multiple_of(2) {
                j
            } else {
                blocks - 1 - j
            };
            members[b].push(row);
        }
        let mut pos = vec![0u32; n];
        let mut bounds = vec![0usize];
        let mut next = 0u32;
        for m in &members {
            for &row in m {
                pos[row] = next;
                next += 1;
            }
            bounds.push(next as usize);
        }
        Self { pos, bounds }
    }

    fn block_of(&self, row: u32) -> usize {
        let p = self.pos[row as usize] as usize;
        self.bounds.partition_point(|&b| b <= p) - 1
    }

    /// Rows of `blocked` (in layout order, `width` values per row) back in row order.
    fn unblock(&self, blocked: &[f32], width: usize) -> Vec<f64> {
        let mut out = vec![0.0; blocked.len()];
        for (row, &p) in self.pos.iter().enumerate() {
            let p = p as usize;
            for k in 0..width {
                out[row * width + k] = f64::from(blocked[p * width + k]);
            }
        }
        out
    }
}

fn split_rows<'a>(
    bounds: &[usize],
    d: usize,
    mut bias: &'a mut [f32],
    mut factors: &'a mut [f32],
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
    lr: f32,
    reg: f32,
    reg_bias: f32,
    mean: f32,
}

/// A training rating packed for a cache-friendly sequential pass.
#[derive(Clone, Copy)]
struct Entry {
    user: u32,
    item: u32,
    value: f32,
}

/// Dot product with eight independent accumulators, so the compiler can vectorise it
/// (a single running sum is a serial dependency chain it must not reorder).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 8;
    let mut acc = [0.0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..L {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
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
        let err = e.value - (s.mean + users.bias[u] + items.bias[i] + dot(pu, qi));
        users.bias[u] += s.lr * (err - s.reg_bias * users.bias[u]);
        items.bias[i] += s.lr * (err - s.reg_bias * items.bias[i]);
        for (a, b) in pu.iter_mut().zip(qi.iter_mut()) {
            let (pa, qb) = (*a, *b);
            *a += s.lr * (err * qb - s.reg * pa);
            *b += s.lr * (err * pa - s.reg * qb);
        }
    }
}

/// The ratings bucketed by (user block, item block), in layout positions: bucket
/// `a * blocks + b` holds the ratings of user block `a` and item block `b`.
fn bucket_ratings(r: &Ratings, users: &Layout, items: &Layout, blocks: usize) -> Vec<Vec<Entry>> {
    let mut buckets: Vec<Vec<Entry>> = vec![Vec::new(); blocks * blocks];
    for k in 0..r.len() {
        let (user, item) = (r.users[k], r.items[k]);
        let slot = users.block_of(user) * blocks + items.block_of(item);
        buckets[slot].push(Entry {
            user: users.pos[user as usize],
            item: items.pos[item as usize],
            value: r.values[k],
        });
    }
    buckets
}

impl Trainer for SgdMf {
    fn name(&self) -> &'static str {
        "sgd-mf"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::NonPrivate
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
        let init = Normal::new(0.0, self.init_sd)?;
        // Factors are trained in f32 (twice the SIMD width, half the memory traffic) and
        // widened to f64 in the published model.
        let mut p: Vec<f32> = (0..nu * d).map(|_| init.sample(rng) as f32).collect();
        let mut q: Vec<f32> = (0..ni * d).map(|_| init.sample(rng) as f32).collect();
        let mut bu = vec![0.0f32; nu];
        let mut bi = vec![0.0f32; ni];

        let blocks = self.effective_blocks(r.len());
        let users = Layout::balanced(&r.users, nu, blocks);
        let items = Layout::balanced(&r.items, ni, blocks);
        let (ub, ib) = (&users.bounds, &items.bounds);
        let mut buckets = bucket_ratings(r, &users, &items, blocks);
        let base_seed: u64 = rng.random();
        let mut step = Step {
            d,
            lr: self.lr as f32,
            reg: self.reg as f32,
            reg_bias: self.reg_bias as f32,
            mean: r.mean() as f32,
        };
        for epoch in 0..self.epochs {
            for stratum in 0..blocks {
                let mut ublocks = split_rows(ub, d, &mut bu, &mut p);
                let mut iblocks: Vec<Option<RowBlock>> = split_rows(ib, d, &mut bi, &mut q)
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
            step.lr *= self.lr_decay as f32;
        }
        if p.iter().chain(&q).any(|x| !x.is_finite()) {
            return Err(TrainError::Numerical(
                "SGD diverged (non-finite factors): lower lr or raise reg".into(),
            ));
        }
        let model = FactorModel {
            global_mean: r.mean(),
            user_bias: Array1::from(users.unblock(&bu, 1)),
            item_bias: Array1::from(items.unblock(&bi, 1)),
            user_factors: Array2::from_shape_vec((nu, d), users.unblock(&p, d)).expect("shape"),
            item_factors: Array2::from_shape_vec((ni, d), items.unblock(&q, d)).expect("shape"),
            scale: data.scale,
        };
        Ok(Fitted::non_private(model))
    }
}
