//! SSP user step (sufficient-statistics perturbation): the released statistics carry
//! noise of the stated scale, the pre-noise statistics have the stated sensitivity, the
//! charges follow the rule (and `dp-alt` plans exactly what it charges), the output does
//! not depend on the thread count, and with tiny noise it is the exact ridge solve.
//!
//! Statistical checks use fixed seeds; mean checks allow 5.33 standard errors (~1e-7
//! two-sided), variance checks 5.33 standard errors of the sample variance of normal
//! data (sqrt(2/(n-1)) relative), and the scale test also asserts that the same statistic
//! rejects a 10% wrong noise multiplier.
#![allow(clippy::needless_range_loop)]

use crate::common;

use dprec::data::{Interactions, RatingScale, Ratings};
use dprec::train::predictors::gaussian_mf::UserOffsets;
use dprec::train::predictors::ssp::{
    feature_row, noisy_statistics, packed_len, solve_statistics, ssp_user_step,
    sufficient_statistics, SspConfig,
};
use dprec::train::{build, FactorModel, Params, TrainData};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::charges::{Neighbour, PrivacyUnit};
use ndarray::{array, Array1, Array2};
use rand::Rng;

use crate::common::{identical_users, mean_var, var_ok, Z_CRIT};

fn cfg(z: f64, clip_y: f64, lambda_u: f64, b: f64) -> SspConfig {
    SspConfig {
        noise_multiplier: z,
        clip_y,
        lambda_u,
        bias_weight: b,
        neighbour: Neighbour::AddRemove,
        max_norm: 0.0,
    }
}

fn dist(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).powi(2))
        .sum::<f64>()
        .sqrt()
}

/// 4000 users with the same ratings: every released coordinate (upper triangle of A and
/// b) has mean = the pre-noise statistic (5.33 SE) and variance (z Delta)^2 with
/// Delta = sqrt(1 + c_y^2) (add/remove) or 2 c_y (replace); a 10% wrong z fails the same
/// pooled variance check. The ratings include a feature row of norm > 1 and a target far
/// outside [-c_y, c_y], so the means also check the clipping.
#[test]
fn released_statistics_have_variance_z_delta_squared_and_wrong_z_fails() {
    let feats = array![[3.0, 4.0], [0.3, -0.2], [0.0, 0.5]];
    let n = 4000u32;
    // Offsets 3: y = 2 (clipped to 1.5), -2 (clipped), 0.5.
    let m = identical_users(n, &[(0, 5.0), (1, 1.0), (2, 3.5)], 3);
    let offsets = UserOffsets {
        global: 3.0,
        item_bias: None,
    };
    let (z, cy, b): (f64, f64, f64) = (0.8, 1.5, 0.6);
    let dim = 3;
    let mut exact = vec![0.0; packed_len(dim)];
    let (items, values) = m.by_user.row(0);
    sufficient_statistics(items, values, &offsets, feats.view(), b, cy, &mut exact);
    // Hand check of the clipping: x_0 = [0.8 * 0.6, 0.8 * 0.8, 0.6], y_0 = 1.5.
    let a = 0.8;
    let x0 = [a * 0.6, a * 0.8, b];
    let x1 = [a * 0.3, a * -0.2, b];
    let x2 = [0.0, a * 0.5, b];
    let tri = dim * (dim + 1) / 2;
    for k in 0..dim {
        let want = 1.5 * x0[k] - 1.5 * x1[k] + 0.5 * x2[k];
        assert!((exact[tri + k] - want).abs() < 1e-12, "b[{k}]");
    }
    assert!((exact[0] - (x0[0] * x0[0] + x1[0] * x1[0])).abs() < 1e-12);
    for (neighbour, delta) in [
        (Neighbour::AddRemove, (1.0f64 + cy * cy).sqrt()),
        (Neighbour::Replace, 2.0 * cy),
    ] {
        let mut c = cfg(z, cy, 1.0, b);
        c.neighbour = neighbour;
        assert_eq!(c.sensitivity(), delta);
        let stats = noisy_statistics(
            &m.by_user,
            &offsets,
            feats.view(),
            None,
            &c,
            &mut dprec_dp::rng::seeded(11),
        )
        .unwrap();
        assert_eq!(stats.ncols(), packed_len(dim));
        let sd = z * delta;
        let mut pooled = Vec::new();
        for k in 0..stats.ncols() {
            let col = stats.column(k).to_vec();
            let (mean, var) = mean_var(&col);
            let se = sd / (n as f64).sqrt();
            assert!(
                (mean - exact[k]).abs() < Z_CRIT * se,
                "{neighbour:?} coord {k}: mean {mean} want {}",
                exact[k]
            );
            assert!(
                var_ok(var, sd * sd, col.len()),
                "{neighbour:?} coord {k}: var {var} want {}",
                sd * sd
            );
            pooled.extend(col.iter().map(|x| (x - exact[k]) / sd));
        }
        let (_, v) = mean_var(&pooled);
        assert!(
            var_ok(v, 1.0, pooled.len()),
            "{neighbour:?}: pooled var {v}"
        );
        for wrong in [1.1, 0.9] {
            let (_, vw) = mean_var(&pooled.iter().map(|x| x / wrong).collect::<Vec<_>>());
            assert!(
                !var_ok(vw, 1.0, pooled.len()),
                "{neighbour:?}: z x{wrong} not detected"
            );
        }
    }
}

/// Adding one rating moves the packed statistics by <= sqrt(1 + c_y^2), replacing one
/// rating's value by <= 2 c_y (A unchanged), for random feature rows (many of norm > 1)
/// and random targets (many far outside [-c_y, c_y]); the bound is attained by a unit
/// feature row and a clipped target, so it is tight.
#[test]
fn statistics_sensitivity_is_sqrt_one_plus_cy_squared() {
    let mut rng = dprec_dp::rng::seeded(3);
    let (n_items, d) = (30usize, 4usize);
    let feats = Array2::from_shape_fn((n_items, d), |_| rng.random_range(-2.0..2.0));
    let bias: Vec<f64> = (0..n_items)
        .map(|_| rng.random_range(-30.0..30.0))
        .collect();
    let offsets = UserOffsets {
        global: 3.0,
        item_bias: Some(&bias),
    };
    for trial in 0..300 {
        let cy = [0.3, 1.0, 2.5][trial % 3];
        let b = [0.0, 0.5, 0.9][(trial / 3) % 3];
        let dim = d + usize::from(b > 0.0);
        let len = rng.random_range(0..12usize);
        let items: Vec<u32> = (0..=len)
            .map(|_| rng.random_range(0..n_items as u32))
            .collect();
        let values: Vec<f32> = (0..=len).map(|_| rng.random_range(1..=5) as f32).collect();
        let mut full = vec![0.0; packed_len(dim)];
        let mut less = full.clone();
        let mut replaced = full.clone();
        sufficient_statistics(&items, &values, &offsets, feats.view(), b, cy, &mut full);
        sufficient_statistics(
            &items[..len],
            &values[..len],
            &offsets,
            feats.view(),
            b,
            cy,
            &mut less,
        );
        let diff = dist(&full, &less);
        let bound = (1.0 + cy * cy).sqrt();
        assert!(
            diff <= bound * (1.0 + 1e-12),
            "add/remove moved the statistics by {diff} > {bound}"
        );
        let mut other = values.clone();
        other[len] = if values[len] > 3.0 { 1.0 } else { 5.0 };
        sufficient_statistics(&items, &other, &offsets, feats.view(), b, cy, &mut replaced);
        let diff = dist(&full, &replaced);
        assert!(
            diff <= 2.0 * cy * (1.0 + 1e-12),
            "replace moved the statistics by {diff} > {}",
            2.0 * cy
        );
        let tri = dim * (dim + 1) / 2;
        assert_eq!(full[..tri], replaced[..tri], "replace changed A");
    }
    // Tight case: one latent coordinate of norm 5 (clipped to 1), no bias, a target of
    // 5 - (-100) = 105 (clipped to c_y): the change is exactly sqrt(1 + c_y^2).
    let feats = array![[5.0]];
    let far = UserOffsets {
        global: -100.0,
        item_bias: None,
    };
    let cy = 2.0;
    let mut one = vec![0.0; packed_len(1)];
    sufficient_statistics(&[0], &[5.0], &far, feats.view(), 0.0, cy, &mut one);
    assert!((one[0] - 1.0).abs() < 1e-15 && (one[1] - cy).abs() < 1e-15);
    let mut none = vec![0.0; packed_len(1)];
    sufficient_statistics(&[], &[], &far, feats.view(), 0.0, cy, &mut none);
    assert!((dist(&one, &none) - (1.0 + cy * cy).sqrt()).abs() < 1e-12);
    // Feature rows: norm <= 1 always, bias coordinate exactly b, latent part scaled by
    // sqrt(1 - b^2) / max(1, ||v||).
    let mut x = vec![0.0; 3];
    feature_row(array![3.0, 4.0].view(), 0.6, &mut x);
    assert!((x[0] - 0.48).abs() < 1e-15 && (x[1] - 0.64).abs() < 1e-15 && x[2] == 0.6);
    feature_row(array![0.1, 0.0].view(), 0.6, &mut x);
    assert!((x[0] - 0.08).abs() < 1e-15 && x[1] == 0.0);
}

/// Exactly one Gaussian { z, 1 } per eligible user with ratings; ineligible users zero
/// and uncharged; eligible users without ratings noisy and uncharged.
#[test]
fn charges_follow_the_rule() {
    let mut r = Ratings::with_dims(6, 3);
    for (u, i, v) in [
        (0, 0, 4.0),
        (0, 1, 2.0),
        (0, 2, 5.0),
        (2, 1, 3.0),
        (3, 0, 1.0),
        (4, 2, 4.0),
    ] {
        r.push(u, i, v);
    }
    let m = Interactions::new(&r);
    let feats = array![[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]];
    let eligible = [true, true, true, false, true, false];
    let c = cfg(1.3, 1.5, 2.0, 0.5);
    let out = ssp_user_step(
        &m.by_user,
        &UserOffsets {
            global: 3.0,
            item_bias: None,
        },
        feats.view(),
        Some(&eligible),
        &c,
        &mut dprec_dp::rng::seeded(1),
    )
    .unwrap();
    let want = PrivacyEvent::gaussian(1.3, 1).unwrap();
    assert_eq!(out.event, want);
    assert_eq!(out.noise_multiplier, 1.3);
    assert_eq!(out.noise_std, 1.3 * (1.0f64 + 1.5 * 1.5).sqrt());
    let charged: Vec<u32> = out.charges.users.iter().map(|c| c.user).collect();
    assert_eq!(charged, vec![0, 2, 4]);
    assert!(out.charges.users.iter().all(|c| c.event == want));
    assert!(out.charges.ratings.is_empty());
    assert_eq!(out.charges.mechanisms.len(), 1);
    let rec = &out.charges.mechanisms[0];
    assert_eq!(rec.name, "ssp-user-step");
    assert_eq!(
        (rec.unit, rec.neighbour),
        (PrivacyUnit::Rating, Neighbour::AddRemove)
    );
    assert_eq!(rec.params["noise_multiplier"], 1.3);
    let bias = out.user_bias.as_ref().unwrap();
    for u in [3usize, 5] {
        assert!(out.user_factors.row(u).iter().all(|&x| x == 0.0) && bias[u] == 0.0);
    }
    assert!(out.user_factors.row(1).iter().any(|&x| x != 0.0) && bias[1] != 0.0);

    for (bad, key) in [
        (cfg(0.0, 1.0, 1.0, 0.5), "user_sigma"),
        (cfg(1.0, f64::NAN, 1.0, 0.5), "clip_y"),
        (cfg(1.0, 1.0, f64::INFINITY, 0.5), "lambda_u"),
        (cfg(1.0, 1.0, 1.0, 1.0), "user_bias"),
    ] {
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains(key), "{e}");
    }
}

/// The step is the released statistics followed by post-processing only, and neither
/// depends on the thread count (the dp-alt trainer neither).
#[test]
fn outputs_do_not_depend_on_the_thread_count() {
    let (train, _) = common::low_rank(80, 40, 2, 0.4, 5);
    let m = Interactions::new(&train);
    let mut rng = dprec_dp::rng::seeded(2);
    let feats = Array2::from_shape_fn((40, 3), |_| rng.random_range(-1.0..1.0));
    let offsets = UserOffsets {
        global: 3.0,
        item_bias: None,
    };
    let c = cfg(2.0, 1.5, 3.0, 0.5);
    let run = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let step = ssp_user_step(
                &m.by_user,
                &offsets,
                feats.view(),
                None,
                &c,
                &mut dprec_dp::rng::seeded(9),
            )
            .unwrap();
            let stats = noisy_statistics(
                &m.by_user,
                &offsets,
                feats.view(),
                None,
                &c,
                &mut dprec_dp::rng::seeded(9),
            )
            .unwrap();
            (step, stats)
        })
    };
    let ((a, sa), (b, sb)) = (run(1), run(2));
    assert_eq!(a.user_factors, b.user_factors);
    assert_eq!(a.user_bias, b.user_bias);
    assert_eq!(a.charges, b.charges);
    assert_eq!(sa, sb);
    // Same key, same streams: the step's theta is the solve of the released statistics.
    let dim = 4;
    let step = c.lambda_u.max(c.noise_std());
    for u in 0..80 {
        let (theta, _) =
            solve_statistics(sa.row(u).as_slice().unwrap(), dim, c.lambda_u, step, 0.0).unwrap();
        let scale = (1.0f64 - 0.25).sqrt();
        for k in 0..3 {
            assert_eq!(a.user_factors[[u, k]], scale * theta[k]);
        }
        assert_eq!(a.user_bias.as_ref().unwrap()[u], 0.5 * theta[3]);
    }
    let data = TrainData::new(&train, &m, RatingScale::ONE_TO_FIVE);
    let t = build("dp-alt", &Params::parse(&["rounds=2", "d=3"]).unwrap()).unwrap();
    let fit = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| t.fit(&data, &mut dprec_dp::rng::seeded(4)).unwrap())
    };
    let (f1, f2) = (fit(1), fit(2));
    assert_eq!(f1.model.user_factors, f2.model.user_factors);
    assert_eq!(f1.model.item_factors, f2.model.item_factors);
    assert_eq!(f1.model.user_bias, f2.model.user_bias);
    assert_eq!(f1.charges, f2.charges);
}

/// A noisy matrix that is not positive definite is fixed by raising the shift (public
/// post-processing); the projection caps the norm.
#[test]
fn solve_fixes_indefinite_noise_by_post_processing() {
    // dim 2: A = [[-5, 0], [0, 1]], b = [1, 1]; lambda = 1 fails, 1 + 2 = 3 still fails
    // (-2), 1 + 4 = 5 fails (0 is not PD), 1 + 8 = 9 succeeds.
    let s = [-5.0, 0.0, 1.0, 1.0, 1.0];
    let (theta, shift) = solve_statistics(&s, 2, 1.0, 2.0, 0.0).unwrap();
    assert_eq!(shift, 9.0);
    assert!((theta[0] - 0.25).abs() < 1e-12 && (theta[1] - 0.1).abs() < 1e-12);
    let (theta, shift) = solve_statistics(&[4.0, 0.0, 4.0, 30.0, 40.0], 2, 1.0, 2.0, 2.0).unwrap();
    assert_eq!(shift, 1.0);
    assert!((dist(&theta, &[0.0, 0.0]) - 2.0).abs() < 1e-12);
}

/// With the TRUE item factors as public features and tiny noise, SSP is the exact
/// non-private ridge solve on the same (clipped) features: test RMSE within 0.005 and
/// profiles within 0.02.
#[test]
fn with_true_items_and_small_noise_it_matches_the_exact_ridge_solve() {
    let t = common::low_rank_with_truth(300, 100, 3, 0.3, 21);
    let (nu, ni, d) = (300usize, 100usize, 3usize);
    let q = Array2::from_shape_fn((ni, d), |(i, k)| t.item_factors[i][k]);
    let m = Interactions::new(&t.train);
    let offsets = UserOffsets {
        global: t.mean,
        item_bias: Some(&t.item_bias),
    };
    let (lambda, b, cy) = (1.0, 0.5, 10.0);
    let c = cfg(1e-4, cy, lambda, b);
    let out = ssp_user_step(
        &m.by_user,
        &offsets,
        q.view(),
        None,
        &c,
        &mut dprec_dp::rng::seeded(3),
    )
    .unwrap();
    let clipped = dprec::train::predictors::objpert::clip_rows(&q);
    let model = |uf: Array2<f64>, ub: Array1<f64>| FactorModel {
        global_mean: t.mean,
        user_bias: ub,
        item_bias: Array1::from(t.item_bias.clone()),
        user_factors: uf,
        item_factors: clipped.clone(),
        scale: RatingScale::ONE_TO_FIVE,
    };
    let dp = model(out.user_factors.clone(), out.user_bias.clone().unwrap());
    // Non-private reference: per-user ridge on x_j = [a clip(q_j), b] (y unclipped: c_y is
    // far above every residual), written from the definition.
    let a = (1.0f64 - b * b).sqrt();
    let mut uf = Array2::zeros((nu, d));
    let mut ub = Array1::zeros(nu);
    for u in 0..nu {
        let (items, vals) = m.by_user.row(u);
        let n = d + 1;
        let mut am = vec![0.0; n * n];
        let mut bv = vec![0.0; n];
        for (&i, &v) in items.iter().zip(vals) {
            let mut f: Vec<f64> = clipped.row(i as usize).iter().map(|x| a * x).collect();
            f.push(b);
            let y = v as f64 - t.mean - t.item_bias[i as usize];
            assert!(y.abs() < cy);
            for j in 0..n {
                bv[j] += y * f[j];
                for k in 0..n {
                    am[j * n + k] += f[j] * f[k];
                }
            }
        }
        for j in 0..n {
            am[j * n + j] += lambda;
        }
        assert!(dprec::numerics::linalg::cholesky_solve(&mut am, &mut bv, n));
        for k in 0..d {
            uf[[u, k]] = a * bv[k];
        }
        ub[u] = b * bv[d];
    }
    let exact = model(uf, ub);
    let rmse =
        |model: &FactorModel| dprec::model::factor::rmse(&model.predict_all(&t.test), &t.test);
    let (r_dp, r_exact) = (rmse(&dp), rmse(&exact));
    let mean_only = dprec::model::factor::rmse(&vec![t.train.mean(); t.test.len()], &t.test);
    eprintln!("ssp {r_dp:.4} exact {r_exact:.4} mean-only {mean_only:.4}");
    assert!(
        (r_dp - r_exact).abs() < 0.005,
        "ssp {r_dp} vs exact {r_exact}"
    );
    assert!(
        r_exact < mean_only - 0.2,
        "the reference should learn: {r_exact} vs {mean_only}"
    );
    let max_diff = (&dp.user_factors - &exact.user_factors)
        .mapv(f64::abs)
        .fold(0.0f64, |a, &b| a.max(b));
    assert!(max_diff < 0.02, "profiles differ by up to {max_diff}");
}
