//! How close a user-level DP item side can bring a bias predictor to the non-private
//! baseline at a given release plan: an oracle bound for issue 21's RMSE target.
//!
//! ```text
//! cargo run --release --example rmse_bound -- --data /path/to/ml-100k [--seeds 3]
//! cargo run --release --example rmse_bound -- --data ratings.csv --k 5 [--seeds 3]
//! ```
//!
//! The item side of a joint-DP bias predictor (`dp-alt`'s family) releases, per item, a
//! weighted sum of its raters' clipped residuals with Gaussian noise; each user's weights
//! over ALL items have L2 norm at most 1 (the catalogue-free contribution bound), so the
//! sum's noise sd is `z c` for clip `c` and per-release multiplier `z`. Whatever the
//! weights, Cauchy-Schwarz gives `sum_j W_j^2 / n_j <= U` (`W_j` an item's weight mass,
//! `n_j` its raters, `U` the users). The first column (the floor) gives the estimator
//! more than any such mechanism has:
//!
//! - the weight masses that minimise its error under that aggregate constraint alone
//!   (water-filling; no per-user weights need reach them),
//! - each item's exact weight mass (its noisy count for free) and no Gram noise,
//! - the whole release's budget on the item biases (no factors, one round),
//! - the clip `c` that is best on the test fold, an oracle rescaling of the clipped mean
//!   to the true bias, and posterior shrinkage toward a prior fitted to the true biases
//!   (a line in log(raters): popular items rate higher) with the true spread about it,
//! - the user biases then solved from the user's own ratings (free under joint DP).
//!
//! The other two columns give the same oracle the masses of two real weightings: uniform
//! over a user's items (`dp-alt`'s) and in inverse proportion to `sqrt(n_j)`.
//! Printed per plan (releases in eps_u 10, delta_u 1e-6; the service's lifetime factor
//! on the served 52): the mean RMSE over folds and seeds beside the non-private bias
//! baseline and the user-bias-only predictor. A floor above 1.03x the baseline means no
//! release of this family meets issue 21's target at that plan.

use std::path::PathBuf;

use dprec::data::{movielens, Interactions, RatingScale};
use dprec::train::nonprivate::baseline::fit_biases;
use dprec::train::predictors::dp_alt::DpAlt;
use dprec::train::topn::dp_topn::ReleasePlan;
use dprec_dp::rng::DpRng;
use dprec_lab::folds::{self, Fold};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};

const REG_USER: f64 = 15.0;
const REG_ITEM: f64 = 10.0;
const CLIPS: [f64; 8] = [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0];

struct Args {
    data: PathBuf,
    k: usize,
    seeds: u64,
}

fn args() -> Args {
    let mut a = Args {
        data: PathBuf::from("../shared/datasets/ml-100k"),
        k: 5,
        seeds: 3,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    for w in v.chunks(2) {
        let val = w.get(1).unwrap_or_else(|| panic!("{} needs a value", w[0]));
        match w[0].as_str() {
            "--data" => a.data = PathBuf::from(val),
            "--k" => a.k = val.parse().expect("--k: a number"),
            "--seeds" => a.seeds = val.parse().expect("--seeds: a number"),
            o => panic!("unknown argument {o} (--data, --k, --seeds)"),
        }
    }
    a
}

fn load(a: &Args) -> (Vec<Fold>, RatingScale) {
    if a.data.is_dir() && movielens::has_predefined_folds(&a.data) {
        let f = folds::predefined_ml100k(&a.data).expect("folds");
        return (f.folds, f.scale);
    }
    let ds = movielens::load(&a.data, None, None).expect("data");
    let f = folds::random_kfold(&ds.ratings, a.k, 0).expect("folds");
    (f, ds.scale)
}

/// Test RMSE of `mean + b_u + c_j`, clamped to the scale as eval and the service do.
fn rmse(f: &Fold, scale: RatingScale, mean: f64, ub: &[f64], ib: &[f64]) -> f64 {
    let t = &f.test;
    let pred: Vec<f64> = (0..t.len())
        .map(|p| scale.clamp(mean + ub[t.users[p] as usize] + ib[t.items[p] as usize]))
        .collect();
    dprec::model::factor::rmse(&pred, t)
}

/// User biases from the user's own ratings given item biases (the joint-DP user side).
fn user_side(m: &Interactions, mean: f64, ib: &[f64]) -> Vec<f64> {
    (0..m.n_users)
        .map(|u| {
            let (items, vals) = m.by_user.row(u);
            let s: f64 = items
                .iter()
                .zip(vals)
                .map(|(&j, &r)| f64::from(r) - mean - ib[j as usize])
                .sum();
            s / (REG_USER + items.len() as f64)
        })
        .collect()
}

/// The fold's exact pieces the oracle may use.
struct Exact {
    m: Interactions,
    scale: RatingScale,
    mass: [Vec<f64>; 2],
    mean: f64,
    ub: Vec<f64>,
    ib: Vec<f64>,
    base: f64,
    user_only: f64,
}

fn exact(f: &Fold, scale: RatingScale) -> Exact {
    let m = Interactions::new(&f.train);
    let mean = f.train.mean();
    let (mut ub, mut ib) = (vec![0.0; m.n_users], vec![0.0; m.n_items]);
    fit_biases(&m, mean, REG_USER, REG_ITEM, 10, &mut ub, &mut ib);
    let base = rmse(f, scale, mean, &ub, &ib);
    let zero = vec![0.0; m.n_items];
    let user_only = rmse(f, scale, mean, &user_side(&m, mean, &zero), &zero);
    Exact {
        mass: masses(&m),
        m,
        scale,
        mean,
        ub,
        ib,
        base,
        user_only,
    }
}

/// Each item's weight mass `W_j = sum_u w_uj` under two ways of spending a user's unit
/// L2 bound: uniform over the user's items `1 / sqrt(n_u)` (`dp-alt`'s weights), and in
/// inverse proportion to the square root of the item's raters `a_u / sqrt(n_j)`.
fn masses(m: &Interactions) -> [Vec<f64>; 2] {
    let raters = |j: usize| m.by_item().row(j).0.len() as f64;
    let (mut uniform, mut inverse) = (vec![0.0; m.n_items], vec![0.0; m.n_items]);
    for u in 0..m.n_users {
        let (its, _) = m.by_user.row(u);
        if its.is_empty() {
            continue;
        }
        let a = 1.0
            / its
                .iter()
                .map(|&j| 1.0 / raters(j as usize))
                .sum::<f64>()
                .sqrt();
        for &j in its {
            let j = j as usize;
            uniform[j] += 1.0 / (its.len() as f64).sqrt();
            inverse[j] += a / raters(j).sqrt();
        }
    }
    [uniform, inverse]
}

/// The weight masses that minimise the test-weighted error of the shrunk estimates
/// under the relaxed constraint only: by Cauchy-Schwarz any per-user weights with unit
/// L2 norm give `sum_j W_j^2 / n_j <= U`. With `x_j = W_j^2 / n_j` an item's error is
/// `n_j tau2 / (1 + kappa n_j x_j)`, `kappa = tau2 / noise^2`; the convex problem is
/// solved by water-filling, `x_j = max(0, t - 1 / (kappa n_j))` with `sum x_j = U`.
fn relaxed_masses(m: &Interactions, kappa: f64) -> Vec<f64> {
    let n: Vec<f64> = (0..m.n_items)
        .map(|j| m.by_item().row(j).0.len() as f64)
        .collect();
    let users = (0..m.n_users)
        .filter(|&u| !m.by_user.row(u).0.is_empty())
        .count() as f64;
    let spent = |t: f64| -> f64 {
        n.iter()
            .filter(|&&nj| nj > 0.0)
            .map(|&nj| (t - 1.0 / (kappa * nj)).max(0.0))
            .sum()
    };
    let (mut lo, mut hi) = (0.0, users + 1.0 / kappa);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if spent(mid) > users {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    n.iter()
        .map(|&nj| {
            if nj > 0.0 {
                (nj * (lo - 1.0 / (kappa * nj)).max(0.0)).sqrt()
            } else {
                0.0
            }
        })
        .collect()
}

/// Which weight masses the oracle gets.
#[derive(Clone, Copy)]
enum Scheme {
    Relaxed,
    Fixed(usize),
}

/// The best RMSE over clips of the oracle estimator at per-release multiplier `z` with
/// the items' weight masses `mass`.
fn oracle(f: &Fold, e: &Exact, scheme: Scheme, z: f64, rng: &mut DpRng) -> f64 {
    let n_items = e.m.n_items;
    let rated: Vec<usize> = (0..n_items)
        .filter(|&j| !e.m.by_item().row(j).0.is_empty())
        .collect();
    let items = rated.len() as f64;
    // The prior: the true biases regressed on log(raters) (popular items rate higher),
    // weighted by raters; the prior variance is what the regression leaves.
    let ln_n = |j: usize| (e.m.by_item().row(j).0.len() as f64).ln();
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &j in &rated {
        let (w, x, y) = (e.m.by_item().row(j).0.len() as f64, ln_n(j), e.ib[j]);
        (sw, sx, sy, sxx, sxy) = (
            sw + w,
            sx + w * x,
            sy + w * y,
            sxx + w * x * x,
            sxy + w * x * y,
        );
    }
    let b1 = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
    let b0 = (sy - b1 * sx) / sw;
    let prior = |j: usize| b0 + b1 * ln_n(j);
    let tau2 = rated
        .iter()
        .map(|&j| (e.ib[j] - prior(j)).powi(2))
        .sum::<f64>()
        / items;
    let mut best = f64::INFINITY;
    for c in CLIPS {
        // Clipped mean residual per item and the oracle slope back to the true bias.
        let ybar: Vec<f64> = (0..n_items)
            .map(|j| {
                let (us, vs) = e.m.by_item().row(j);
                let s: f64 = us
                    .iter()
                    .zip(vs)
                    .map(|(&u, &r)| (f64::from(r) - e.mean - e.ub[u as usize]).clamp(-c, c))
                    .sum();
                if us.is_empty() {
                    0.0
                } else {
                    s / us.len() as f64
                }
            })
            .collect();
        // Weighted by raters, so rarely rated items' sampling noise does not dilute it.
        let (sxy, sxx) = rated.iter().fold((0.0, 0.0), |(a, b), &j| {
            let n = e.m.by_item().row(j).0.len() as f64;
            (a + n * ybar[j] * e.ib[j], b + n * ybar[j] * ybar[j])
        });
        let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
        // The spread of one rater's clipped residual about its item's mean (the sampling
        // noise of an item's mean, which the baseline's ridge shrinks as well).
        let (ss, cnt) = rated.iter().fold((0.0, 0.0), |(a, b), &j| {
            let (us, vs) = e.m.by_item().row(j);
            let d: f64 = us
                .iter()
                .zip(vs)
                .map(|(&u, &r)| {
                    let y = (f64::from(r) - e.mean - e.ub[u as usize]).clamp(-c, c);
                    (y - ybar[j]).powi(2)
                })
                .sum();
            (a + d, b + us.len() as f64)
        });
        let s2 = ss / cnt;
        let relaxed;
        let mass: &[f64] = match scheme {
            Scheme::Fixed(k) => &e.mass[k],
            Scheme::Relaxed => {
                let noise2 = (slope * z * c).powi(2);
                relaxed = relaxed_masses(&e.m, tau2 / noise2.max(1e-12));
                &relaxed
            }
        };
        let mut ib = vec![0.0; n_items];
        for &j in &rated {
            let n = e.m.by_item().row(j).0.len() as f64;
            let sd = if mass[j] > 0.0 {
                z * c / mass[j]
            } else {
                f64::INFINITY
            };
            if sd.is_infinite() {
                ib[j] = prior(j); // no weight on this item: its bias stays at the prior
                continue;
            }
            let noise = if sd > 0.0 {
                Normal::new(0.0, sd).unwrap().sample(rng)
            } else {
                0.0
            };
            let obs = slope * (ybar[j] + noise);
            let v = slope * slope * (sd * sd + s2 / n);
            ib[j] = prior(j) + (obs - prior(j)) * tau2 / (tau2 + v);
        }
        let ub = user_side(&e.m, e.mean, &ib);
        best = best.min(rmse(f, e.scale, e.mean, &ub, &ib));
    }
    best
}

fn main() {
    let a = args();
    let (folds, scale) = load(&a);
    let exact: Vec<Exact> = folds.iter().map(|f| exact(f, scale)).collect();
    let mean_of = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let base = mean_of(&exact.iter().map(|e| e.base).collect::<Vec<_>>());
    let user_only = mean_of(&exact.iter().map(|e| e.user_only).collect::<Vec<_>>());
    println!(
        "data {} ({} folds, {} seeds)",
        a.data.display(),
        folds.len(),
        a.seeds
    );
    println!("baseline (non-private biases)  RMSE {base:.4}");
    println!(
        "user bias only                 RMSE {user_only:.4}  ({:.3}x)",
        user_only / base
    );
    println!("target 1.03x                   RMSE {:.4}", 1.03 * base);
    println!(
        "| releases in eps_u 10 | z per release | floor, relaxed weights | x baseline | \
         uniform per user (dp-alt) | x baseline | 1/sqrt(raters) per item | x baseline |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let served = DpAlt::default();
    let mut rows: Vec<(String, f64)> = vec![
        ("no noise (check)".into(), 0.0),
        (
            "52, service factor (served)".into(),
            served.multiplier().expect("z"),
        ),
    ];
    for t in [52u64, 26, 12, 4, 1] {
        let plan = ReleasePlan {
            releases: t,
            ..served.plan
        };
        rows.push((t.to_string(), plan.noise_multiplier().expect("z")));
    }
    for (label, z) in rows {
        let mut line = format!("| {label} | {z:.3} |");
        for scheme in [Scheme::Relaxed, Scheme::Fixed(0), Scheme::Fixed(1)] {
            let mut all = Vec::new();
            for seed in 0..a.seeds {
                let mut rng = DpRng::seed_from_u64(seed);
                for (f, e) in folds.iter().zip(&exact) {
                    all.push(oracle(f, e, scheme, z, &mut rng));
                }
            }
            let r = mean_of(&all);
            line += &format!(" {r:.4} | {:.3} |", r / base);
        }
        println!("{line}");
    }
}
