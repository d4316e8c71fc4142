//! Shared helpers of the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use dprec::data::Ratings;
use rand::Rng;
use rand_distr::{Distribution, Normal};

/// The MovieLens-100K directory: `$DPREC_ML100K_DIR`, else `../shared/datasets/ml-100k`
/// beside the repository. `None` (with a visible message) when absent, unless
/// `DPREC_REQUIRE_DATA=1` (CI), where a missing data set fails the test.
pub fn ml100k_dir(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("DPREC_ML100K_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/datasets/ml-100k")
        });
    if dir.join("u1.base").is_file() {
        return Some(dir);
    }
    if std::env::var("DPREC_REQUIRE_DATA").as_deref() == Ok("1") {
        panic!(
            "{test}: MovieLens-100K not found at {} and DPREC_REQUIRE_DATA=1",
            dir.display()
        );
    }
    // Written to the real stderr (not the captured test output), so a skip is visible in
    // a plain `cargo test`, as the PostgreSQL skips are.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: MovieLens-100K not found at {} (set DPREC_ML100K_DIR)",
        dir.display()
    );
    None
}

/// A small low-rank rating set: r = 3 + b_u + b_i + p_u . q_i + noise, clamped to 1..5,
/// with each (user, item) pair observed with probability `density`. Returns (train, test)
/// split 80/20 at random.
pub fn low_rank(
    n_users: u32,
    n_items: u32,
    rank: usize,
    density: f64,
    seed: u64,
) -> (Ratings, Ratings) {
    let t = low_rank_with_truth(n_users, n_items, rank, density, seed);
    (t.train, t.test)
}

/// A low-rank rating set with its generating factors (for tests that give a trainer the
/// true item factors as a public prior).
pub struct LowRankTruth {
    pub train: Ratings,
    pub test: Ratings,
    /// Global offset of the generator (3.0).
    pub mean: f64,
    /// n_users x rank.
    pub user_factors: Vec<Vec<f64>>,
    /// n_items x rank.
    pub item_factors: Vec<Vec<f64>>,
    pub user_bias: Vec<f64>,
    pub item_bias: Vec<f64>,
}

/// Same generator as [`low_rank`] (same seed, same ratings), also returning the factors
/// and biases it drew.
pub fn low_rank_with_truth(
    n_users: u32,
    n_items: u32,
    rank: usize,
    density: f64,
    seed: u64,
) -> LowRankTruth {
    let mut rng = dprec_dp::rng::seeded(seed);
    let n = Normal::new(0.0, 1.0).unwrap();
    let f = (0.8 / (rank as f64).sqrt()).sqrt();
    let p: Vec<Vec<f64>> = (0..n_users)
        .map(|_| (0..rank).map(|_| f * n.sample(&mut rng)).collect())
        .collect();
    let q: Vec<Vec<f64>> = (0..n_items)
        .map(|_| (0..rank).map(|_| f * n.sample(&mut rng)).collect())
        .collect();
    let bu: Vec<f64> = (0..n_users).map(|_| 0.3 * n.sample(&mut rng)).collect();
    let bi: Vec<f64> = (0..n_items).map(|_| 0.4 * n.sample(&mut rng)).collect();
    let mut train = Ratings::with_dims(n_users as usize, n_items as usize);
    let mut test = Ratings::with_dims(n_users as usize, n_items as usize);
    for u in 0..n_users {
        for i in 0..n_items {
            if !rng.random_bool(density) {
                continue;
            }
            let (uu, ii) = (u as usize, i as usize);
            let dot: f64 = p[uu].iter().zip(&q[ii]).map(|(a, b)| a * b).sum();
            let v = (3.0 + bu[uu] + bi[ii] + dot + 0.3 * n.sample(&mut rng)).clamp(1.0, 5.0);
            if rng.random_bool(0.8) {
                train.push(u, i, v as f32);
            } else {
                test.push(u, i, v as f32);
            }
        }
    }
    LowRankTruth {
        train,
        test,
        mean: 3.0,
        user_factors: p,
        item_factors: q,
        user_bias: bu,
        item_bias: bi,
    }
}

/// Two-sided tolerance of the moment checks, in standard errors (false failure ~1e-7).
pub const Z_CRIT: f64 = 5.33;

/// `n` users who all rated the same `(item, value)` list.
pub fn identical_users(
    n: u32,
    ratings: &[(u32, f32)],
    n_items: usize,
) -> dprec::data::Interactions {
    let mut r = Ratings::with_dims(n as usize, n_items);
    for u in 0..n {
        for &(i, v) in ratings {
            r.push(u, i, v);
        }
    }
    dprec::data::Interactions::new(&r)
}

/// Sample mean and (unbiased) variance.
pub fn mean_var(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let m = x.iter().sum::<f64>() / n;
    let v = x.iter().map(|a| (a - m).powi(2)).sum::<f64>() / (n - 1.0);
    (m, v)
}

/// A sample variance of `n` Gaussian draws within [`Z_CRIT`] standard errors of `want`.
pub fn var_ok(var: f64, want: f64, n: usize) -> bool {
    (var / want - 1.0).abs() <= Z_CRIT * (2.0 / (n as f64 - 1.0)).sqrt()
}

// Not every test binary uses every helper.
#[allow(unused_imports)]
pub use dprec_dp::privacy::stats::{freq_tolerance, gamma_int_cdf, ks_critical, ks_statistic};
