//! Gaussian-MF: the DP user step adds noise of the stated scale, clips what it says it
//! clips, charges exactly the rule, and the trainers carry the right guarantee.
//!
//! Statistical checks use fixed seeds; mean checks allow 5.33 standard errors (~1e-7
//! two-sided), variance checks 5.33 standard errors of the sample variance of normal
//! data (sqrt(2/(n-1)) relative), and each scale test also asserts that the same
//! statistic rejects a 10% wrong sigma.
// Index loops mirror the formulas (coordinates k, steps t).
#![allow(clippy::needless_range_loop)]

use crate::common;

use dprec::data::{Interactions, RatingScale, Ratings};
use dprec::train::predictors::gaussian_mf::{
    calibrate_noise_multiplier, clipped_gradient_sum, dp_user_step, gaussian_steps_eps,
    paper_eps_opt, paper_noise_multiplier, UserNoise, UserOffsets, UserStepConfig,
};
use dprec::train::{build, FactorModel, Guarantee, Params, TrainData, TrainError};
use dprec_dp::accountant::{compose_events, default_orders, eps_from_rdp, PrivacyEvent};
use dprec_dp::charges::{Neighbour, PrivacyUnit, PAPER_FAITHFUL};
use ndarray::{array, Array1, Array2};

use crate::common::{identical_users, mean_var, var_ok, Z_CRIT};

/// Kolmogorov-Smirnov distance of `x` from N(0, 1).
fn ks_normal(x: &mut [f64]) -> f64 {
    fn phi(z: f64) -> f64 {
        // Abramowitz-Stegun 7.1.26 erf (|error| < 1.5e-7).
        let t = 1.0 / (1.0 + 0.327_591_1 * z.abs() / 2f64.sqrt());
        let poly = t
            * (0.254_829_592
                + t * (-0.284_496_736
                    + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
        let erf = 1.0 - poly * (-(z * z) / 2.0).exp();
        0.5 * (1.0 + if z >= 0.0 { erf } else { -erf })
    }
    x.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = x.len() as f64;
    x.iter()
        .enumerate()
        .map(|(k, &v)| {
            let c = phi(v);
            (c - k as f64 / n).abs().max(((k + 1) as f64 / n - c).abs())
        })
        .fold(0.0, f64::max)
}

fn step_cfg(steps: usize, lr: f64, z: f64, clip: f64) -> UserStepConfig {
    UserStepConfig {
        steps,
        lr,
        lr_decay: 1.0,
        clip,
        noise: UserNoise::Multiplier(z),
        lambda_u: 0.0,
        neighbour: Neighbour::AddRemove,
        user_bias: false,
        max_norm: 0.0,
    }
}

/// One step from theta = 0: theta_u = -lr (clipped sum + N(0, (z Delta)^2 I)), with
/// Delta = C (add/remove) or 2C (replace). Both ratings' contributions exceed C, so the
/// mean also checks the clipping inside the step.
#[test]
fn one_step_noise_scale_is_lr_sigma_c_and_wrong_sigma_fails() {
    let feats = array![[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]];
    let n = 4000u32;
    // y = r - 3: +2 on item 0 (contribution [-2,0,0], norm 2), -2 on item 1
    // (contribution [0,1,1], norm 1.41); both clipped to C = 1.
    let m = identical_users(n, &[(0, 5.0), (1, 1.0)], 2);
    let offsets = UserOffsets {
        global: 3.0,
        item_bias: None,
    };
    let clipped_sum = [-1.0, 0.5f64.sqrt(), 0.5f64.sqrt()];
    let (lr, z, c) = (0.1, 2.0, 1.0);
    for (neighbour, delta) in [(Neighbour::AddRemove, c), (Neighbour::Replace, 2.0 * c)] {
        let mut cfg = step_cfg(1, lr, z, c);
        cfg.neighbour = neighbour;
        let out = dp_user_step(
            &m.by_user,
            &offsets,
            feats.view(),
            None,
            &cfg,
            &mut dprec_dp::rng::seeded(17),
        )
        .unwrap();
        assert_eq!(out.noise_std, z * delta);
        let sd = lr * z * delta;
        let mut pooled = Vec::new();
        for k in 0..3 {
            let col: Vec<f64> = out.user_factors.column(k).to_vec();
            let (mean, var) = mean_var(&col);
            let want_mean = -lr * clipped_sum[k];
            let se = sd / (n as f64).sqrt();
            assert!(
                (mean - want_mean).abs() < Z_CRIT * se,
                "{neighbour:?} coord {k}: mean {mean} want {want_mean} (se {se})"
            );
            assert!(
                var_ok(var, sd * sd, col.len()),
                "{neighbour:?} coord {k}: var {var} want {}",
                sd * sd
            );
            pooled.extend(col.iter().map(|x| (x - want_mean) / sd));
        }
        let (_, v) = mean_var(&pooled);
        assert!(
            var_ok(v, 1.0, pooled.len()),
            "{neighbour:?}: pooled var {v}"
        );
        // A 10% wrong sigma (either way) is rejected by the same statistic.
        for wrong in [1.1, 0.9] {
            let (_, vw) = mean_var(&pooled.iter().map(|x| x / wrong).collect::<Vec<_>>());
            assert!(
                !var_ok(vw, 1.0, pooled.len()),
                "{neighbour:?}: sigma x{wrong} not detected"
            );
        }
        // Shape: coordinate 0 standardised is N(0, 1) (KS at alpha = 1e-6).
        let mut first: Vec<f64> = pooled[..n as usize].to_vec();
        let ks = ks_normal(&mut first);
        let crit = ((2.0f64 / 1e-6).ln() / 2.0).sqrt() / (n as f64).sqrt();
        assert!(ks < crit, "{neighbour:?}: KS {ks} >= {crit}");
    }
}

/// J = 3 steps with a decaying learning rate and a ridge term, clipping inactive: the
/// released theta is the noiseless trajectory plus sum_t A_t (-lr_t xi_t), with
/// A_t = prod_{s>t} (I - lr_s H), H = v v^T + lambda I (diagonal here).
#[test]
fn multi_step_noise_is_the_linear_transform_of_the_accumulated_noise() {
    let feats = array![[1.0, 0.0]];
    let n = 6000u32;
    let m = identical_users(n, &[(0, 4.0)], 1); // y = 1
    let offsets = UserOffsets {
        global: 3.0,
        item_bias: None,
    };
    let (lr, decay, lambda, z, c, steps) = (0.1, 0.5, 0.5, 0.1, 10.0, 3usize);
    let mut cfg = step_cfg(steps, lr, z, c);
    cfg.lr_decay = decay;
    cfg.lambda_u = lambda;
    let out = dp_user_step(
        &m.by_user,
        &offsets,
        feats.view(),
        None,
        &cfg,
        &mut dprec_dp::rng::seeded(5),
    )
    .unwrap();
    let sigma = z * c;
    let h = [1.0 + lambda, lambda];
    let b = [1.0, 0.0];
    let lrs: Vec<f64> = (0..steps).map(|t| lr * decay.powi(t as i32)).collect();
    let mut pooled = Vec::new();
    for k in 0..2 {
        let mut mean = 0.0;
        for &l in &lrs {
            mean = (1.0 - l * h[k]) * mean + l * b[k];
        }
        let mut var = 0.0;
        for t in 0..steps {
            let a: f64 = lrs[t + 1..].iter().map(|&l| 1.0 - l * h[k]).product();
            var += (a * lrs[t] * sigma).powi(2);
        }
        let col = out.user_factors.column(k).to_vec();
        let (m_hat, v_hat) = mean_var(&col);
        assert!(
            (m_hat - mean).abs() < Z_CRIT * (var / n as f64).sqrt(),
            "coord {k}: mean {m_hat} want {mean}"
        );
        assert!(
            var_ok(v_hat, var, col.len()),
            "coord {k}: var {v_hat} want {var}"
        );
        pooled.extend(col.iter().map(|x| (x - mean) / var.sqrt()));
    }
    let (_, v) = mean_var(&pooled);
    assert!(var_ok(v, 1.0, pooled.len()), "pooled var {v}");
    for wrong in [1.1, 0.9] {
        let (_, vw) = mean_var(&pooled.iter().map(|x| x / wrong).collect::<Vec<_>>());
        assert!(
            !var_ok(vw, 1.0, pooled.len()),
            "sigma x{wrong} not detected"
        );
    }
}

/// Adding one rating changes the pre-noise sum by at most C (one clipped contribution);
/// replacing one rating's value by at most 2C; every over-size contribution is clipped.
#[test]
fn clipped_sum_has_sensitivity_c() {
    use rand::Rng;
    let mut rng = dprec_dp::rng::seeded(3);
    let (n_items, d, clip) = (30usize, 5usize, 0.7);
    let feats = Array2::from_shape_fn((n_items, d), |_| rng.random_range(-2.0..2.0));
    let bias: Vec<f64> = (0..n_items).map(|_| rng.random_range(-1.0..1.0)).collect();
    let offsets = UserOffsets {
        global: 3.0,
        item_bias: Some(&bias),
    };
    for trial in 0..200 {
        let with_bias = trial % 2 == 0;
        let k = d + usize::from(with_bias);
        let theta: Vec<f64> = (0..k).map(|_| rng.random_range(-1.5..1.5)).collect();
        let len = rng.random_range(0..12usize);
        let items: Vec<u32> = (0..=len)
            .map(|_| rng.random_range(0..n_items as u32))
            .collect();
        let values: Vec<f32> = (0..=len).map(|_| rng.random_range(1..=5) as f32).collect();
        let mut full = vec![0.0; k];
        let mut less = vec![0.0; k];
        clipped_gradient_sum(
            &theta,
            &items,
            &values,
            &offsets,
            feats.view(),
            clip,
            &mut full,
        );
        clipped_gradient_sum(
            &theta,
            &items[..len],
            &values[..len],
            &offsets,
            feats.view(),
            clip,
            &mut less,
        );
        let diff = full
            .iter()
            .zip(&less)
            .map(|(a, b)| (a - b).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(
            diff <= clip * (1.0 + 1e-12),
            "add/remove moved the sum by {diff}"
        );
        let mut other = values.clone();
        other[len] = if values[len] > 3.0 { 1.0 } else { 5.0 };
        let mut replaced = vec![0.0; k];
        clipped_gradient_sum(
            &theta,
            &items,
            &other,
            &offsets,
            feats.view(),
            clip,
            &mut replaced,
        );
        let diff = full
            .iter()
            .zip(&replaced)
            .map(|(a, b)| (a - b).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(
            diff <= 2.0 * clip * (1.0 + 1e-12),
            "replace moved the sum by {diff}"
        );
    }
    // Every contribution far above C: all are clipped to exactly C; parallel ones add up.
    let feats = array![[3.0, 4.0], [3.0, 4.0], [6.0, 8.0]];
    let zero = UserOffsets {
        global: 0.0,
        item_bias: None,
    };
    let mut out = vec![0.0; 2];
    let n = clipped_gradient_sum(
        &[0.0, 0.0],
        &[0, 1, 2],
        &[5.0, 2.0, 1.0],
        &zero,
        feats.view(),
        1.0,
        &mut out,
    );
    assert_eq!(n, 3);
    let norm = (out[0] * out[0] + out[1] * out[1]).sqrt();
    assert!((norm - 3.0).abs() < 1e-12, "norm {norm}");
    assert!(
        (out[0] + 3.0 * 0.6).abs() < 1e-12 && (out[1] + 3.0 * 0.8).abs() < 1e-12,
        "{out:?}"
    );
    // Below C: unclipped, exactly -(y - theta.v) v.
    let n = clipped_gradient_sum(
        &[0.0, 0.0],
        &[0],
        &[0.1],
        &zero,
        array![[0.6, 0.8]].view(),
        1.0,
        &mut out,
    );
    assert_eq!(n, 0);
    assert!(
        (out[0] + 0.06).abs() < 1e-7 && (out[1] + 0.08).abs() < 1e-7,
        "{out:?}"
    );
}

/// Each eligible user with ratings is charged exactly Gaussian { z, J }; nobody else.
/// Eligible users without ratings still get a noisy (not a deterministic) profile.
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
    let mut cfg = step_cfg(7, 0.05, 1.3, 1.0);
    cfg.user_bias = true;
    let out = dp_user_step(
        &m.by_user,
        &UserOffsets {
            global: 3.0,
            item_bias: None,
        },
        feats.view(),
        Some(&eligible),
        &cfg,
        &mut dprec_dp::rng::seeded(1),
    )
    .unwrap();
    let want = PrivacyEvent::gaussian(1.3, 7).unwrap();
    assert_eq!(out.event, want);
    let charged: Vec<u32> = out.charges.users.iter().map(|c| c.user).collect();
    assert_eq!(charged, vec![0, 2, 4]);
    assert!(out.charges.users.iter().all(|c| c.event == want));
    assert!(out.charges.ratings.is_empty());
    assert_eq!(out.charges.mechanisms.len(), 1);
    let rec = &out.charges.mechanisms[0];
    assert_eq!(
        (rec.unit, rec.neighbour),
        (PrivacyUnit::Rating, Neighbour::AddRemove)
    );
    assert_eq!(rec.params["noise_multiplier"], 1.3);
    // Ineligible users: zero profile; eligible without ratings: noisy profile, no charge.
    let bias = out.user_bias.as_ref().unwrap();
    for u in [3usize, 5] {
        assert!(out.user_factors.row(u).iter().all(|&x| x == 0.0) && bias[u] == 0.0);
    }
    assert!(out.user_factors.row(1).iter().any(|&x| x != 0.0));

    // The trainer: every user with ratings, the planned event, nothing else.
    let t = build(
        "gaussian-mf",
        &Params::parse(&["d=2", "sigma=1.3", "steps=7"]).unwrap(),
    )
    .unwrap();
    let data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
    let fitted = t.fit(&data, &mut dprec_dp::rng::seeded(2)).unwrap();
    assert_eq!(t.planned_user_event(), Some(want.clone()));
    let charged: Vec<u32> = fitted.charges.users.iter().map(|c| c.user).collect();
    assert_eq!(charged, vec![0, 2, 3, 4]);
    assert!(fitted.charges.users.iter().all(|c| c.event == want));
}

/// Calibration from (eps, delta) hits eps within 1e-6 through the accountant, from below.
#[test]
fn calibration_from_eps_hits_eps_via_the_accountant() {
    for (eps, delta, steps) in [
        (1.0, 1e-5, 20u64),
        (0.5, 1e-6, 100),
        (4.0, 1e-5, 1),
        (10.0, 1e-5, 50),
        (0.1, 1e-3, 5),
    ] {
        let z = calibrate_noise_multiplier(eps, delta, steps).unwrap();
        let curve = compose_events(
            &[PrivacyEvent::gaussian(z, steps).unwrap()],
            &default_orders(),
        )
        .unwrap();
        let got = eps_from_rdp(&curve, delta).unwrap().eps;
        assert!(
            got <= eps && eps - got < 1e-6,
            "eps {eps} delta {delta} J {steps}: got {got}"
        );
        let cfg = UserStepConfig {
            steps: steps as usize,
            noise: UserNoise::Target { eps, delta },
            ..UserStepConfig::default()
        };
        assert_eq!(cfg.noise_multiplier().unwrap(), z);
        // Remembered per thread: a second call, and a fresh thread's first, agree.
        assert_eq!(calibrate_noise_multiplier(eps, delta, steps).unwrap(), z);
        let fresh = std::thread::spawn(move || calibrate_noise_multiplier(eps, delta, steps));
        assert_eq!(fresh.join().unwrap().unwrap(), z);
    }
    // The trainer calibrates at construction and charges that multiplier.
    let t = build(
        "gaussian-mf",
        &Params::parse(&["eps=2", "delta=1e-5", "steps=30"]).unwrap(),
    )
    .unwrap();
    let z = calibrate_noise_multiplier(2.0, 1e-5, 30).unwrap();
    assert_eq!(
        t.planned_user_event(),
        Some(PrivacyEvent::gaussian(z, 30).unwrap())
    );
    assert!(calibrate_noise_multiplier(0.0, 1e-5, 3)
        .unwrap_err()
        .to_string()
        .contains("eps"));
    assert!(calibrate_noise_multiplier(1.0, 1.5, 3)
        .unwrap_err()
        .to_string()
        .contains("delta"));
}

/// The grid accountant (improved conversion) is never worse than the paper's closed form
/// (classic conversion at the continuous optimum) for the paper's noise.
#[test]
fn grid_accountant_is_at_most_paper_theorem_2() {
    for steps in [1u64, 10, 100, 300, 1000] {
        for eps_i in [0.15, 0.25, 0.5, 1.0] {
            for (delta, delta_r) in [(0.01, 1e-5), (1e-3, 1e-6), (0.01, 1e-3)] {
                let z = paper_noise_multiplier(eps_i, delta);
                let grid = gaussian_steps_eps(z, steps, delta_r).unwrap();
                let opt = paper_eps_opt(steps, eps_i, delta, delta_r);
                assert!(
                    grid <= opt,
                    "J {steps} eps_i {eps_i} delta {delta} delta_r {delta_r}: {grid} > {opt}"
                );
            }
        }
    }
    // The closed form itself, at one point: J = 100, eps_i = 0.5, delta = 0.01, delta_r = 1e-5.
    let l = (1.25f64 / 0.01).ln();
    let rho = 100.0 * 0.25 / (4.0 * l);
    assert!(
        (paper_eps_opt(100, 0.5, 0.01, 1e-5) - (rho + 2.0 * (rho * 1e5f64.ln()).sqrt())).abs()
            < 1e-12
    );
}

#[test]
fn trainer_outputs_do_not_depend_on_the_thread_count() {
    let (train, _) = common::low_rank(80, 40, 2, 0.4, 5);
    let m = Interactions::new(&train);
    let data = TrainData::new(&train, &m, RatingScale::ONE_TO_FIVE);
    for (name, params) in [
        ("gaussian-mf", vec!["d=4", "steps=5", "sigma=1"]),
        ("paper-gaussian-mf", vec!["d=4", "steps=5"]),
    ] {
        let t = build(name, &Params::parse(&params).unwrap()).unwrap();
        let run = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| t.fit(&data, &mut dprec_dp::rng::seeded(9)).unwrap())
        };
        let (a, b) = (run(1), run(2));
        assert_eq!(a.model.user_factors, b.model.user_factors, "{name}");
        assert_eq!(a.model.user_bias, b.model.user_bias, "{name}");
        assert_eq!(a.model.item_factors, b.model.item_factors, "{name}");
        assert_eq!(a.charges, b.charges, "{name}");
    }
}

#[test]
fn guarantees_labels_and_parameter_errors() {
    let (train, _) = common::low_rank(30, 20, 2, 0.5, 1);
    let m = Interactions::new(&train);
    let data = TrainData::new(&train, &m, RatingScale::ONE_TO_FIVE);
    let mut rng = dprec_dp::rng::seeded(4);

    let paper = build(
        "paper-gaussian-mf",
        &Params::parse(&["steps=10", "eps_i=0.25"]).unwrap(),
    )
    .unwrap();
    assert_eq!(paper.guarantee(), Guarantee::PaperClaimed);
    let f = paper.fit(&data, &mut rng).unwrap();
    assert_eq!(f.guarantee, Guarantee::PaperClaimed);
    let rec = &f.charges.mechanisms[0];
    assert_eq!(rec.params["label"], PAPER_FAITHFUL);
    let opt = paper_eps_opt(10, 0.25, 0.01, 1e-5);
    assert_eq!(rec.params["paper_eps_opt"], opt);
    let z = paper_noise_multiplier(0.25, 0.01);
    assert_eq!(rec.params["sigma"], z * 4.0); // tau = 4 (1..5), C = 1
    assert!(f
        .charges
        .users
        .iter()
        .all(|c| c.event == PrivacyEvent::gaussian(z, 10).unwrap()));

    let dp = build(
        "gaussian-mf",
        &Params::parse(&["d=3", "steps=5", "sigma=2"]).unwrap(),
    )
    .unwrap();
    assert_eq!(dp.guarantee(), Guarantee::Proven);
    let f = dp.fit(&data, &mut rng).unwrap();
    assert_eq!(f.guarantee, Guarantee::Proven);
    let rec = &f.charges.mechanisms[0];
    let eps = rec.params["per_user_eps"].as_f64().unwrap();
    assert_eq!(
        eps,
        gaussian_steps_eps(2.0, 5, dprec_dp::ledger::RATING_DELTA).unwrap()
    );
    assert!(eps <= rec.params["paper_eps_opt"].as_f64().unwrap());
    let summary = f
        .charges
        .summary(train.len(), dprec_dp::ledger::RATING_DELTA)
        .unwrap();
    assert_eq!(summary.max_user_eps, eps);

    // items=prior (or offsets=prior) without a prior model is an error naming it.
    for (p, key) in [("items=prior", "items"), ("offsets=prior", "offsets")] {
        let t = build("gaussian-mf", &Params::parse(&[p]).unwrap()).unwrap();
        let e = t.fit(&data, &mut rng).unwrap_err();
        assert!(
            matches!(e, TrainError::Param(_)) && e.to_string().contains(key),
            "{e}"
        );
    }
    // Bad and unknown parameters name the parameter.
    for (args, key) in [
        (vec!["sigma=1", "eps=1"], "sigma"),
        (vec!["items=learned"], "items"),
        (vec!["neighbour=swap"], "neighbour"),
        (vec!["clip=0"], "clip"),
        (vec!["delta=2"], "delta"),
        (vec!["lambda_u=-1"], "lambda_u"),
        (vec!["epochs=3"], "epochs"),
    ] {
        let e = build("gaussian-mf", &Params::parse(&args).unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(key), "{args:?}: {e}");
    }
    for (args, key) in [
        (vec!["eps_i=-1"], "eps_i"),
        (vec!["delta_r=1"], "delta_r"),
        (vec!["sigma=1"], "sigma"),
    ] {
        let e = build("paper-gaussian-mf", &Params::parse(&args).unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(key), "{args:?}: {e}");
    }
    // A prior of the wrong rank is rejected.
    let prior = FactorModel::zeros(30, 20, 5, 3.0, RatingScale::ONE_TO_FIVE);
    let mut with_prior = TrainData::new(&train, &m, RatingScale::ONE_TO_FIVE);
    with_prior.prior = Some(&prior);
    let t = build(
        "gaussian-mf",
        &Params::parse(&["items=prior", "d=3"]).unwrap(),
    )
    .unwrap();
    assert!(t
        .fit(&with_prior, &mut rng)
        .unwrap_err()
        .to_string()
        .contains("rank"));
}

/// With the TRUE item factors as the public prior and a tiny noise multiplier, the DP
/// user step converges to the non-private ridge solve of the same model.
#[test]
fn with_true_items_and_large_eps_it_matches_the_nonprivate_user_solve() {
    let t = common::low_rank_with_truth(300, 100, 3, 0.3, 21);
    let (nu, ni, d) = (300usize, 100usize, 3usize);
    let q = Array2::from_shape_fn((ni, d), |(i, k)| t.item_factors[i][k]);
    let prior = FactorModel {
        global_mean: t.mean,
        user_bias: Array1::zeros(nu),
        item_bias: Array1::from(t.item_bias.clone()),
        user_factors: Array2::zeros((nu, d)),
        item_factors: q.clone(),
        scale: RatingScale::ONE_TO_FIVE,
    };
    let m = Interactions::new(&t.train);
    let mut data = TrainData::new(&t.train, &m, RatingScale::ONE_TO_FIVE);
    data.prior = Some(&prior);
    let lambda = 1.0;
    let params = [
        "d=3",
        "items=prior",
        "offsets=prior",
        "sigma=0.01",
        "clip=10",
        "steps=200",
        "lr=0.02",
        "lambda_u=1",
    ];
    let trainer = build("gaussian-mf", &Params::parse(&params).unwrap()).unwrap();
    let dp = trainer
        .fit(&data, &mut dprec_dp::rng::seeded(3))
        .unwrap()
        .model;

    // Non-private reference: per-user ridge on [q_i, 1] against r - mu - b_i.
    let mut exact = prior.clone();
    for u in 0..nu {
        let (items, vals) = m.by_user.row(u);
        let n = d + 1;
        let mut a = vec![0.0; n * n];
        let mut b = vec![0.0; n];
        for (&i, &v) in items.iter().zip(vals) {
            let mut f: Vec<f64> = q.row(i as usize).to_vec();
            f.push(1.0);
            let y = v as f64 - t.mean - t.item_bias[i as usize];
            for j in 0..n {
                b[j] += y * f[j];
                for k in 0..n {
                    a[j * n + k] += f[j] * f[k];
                }
            }
        }
        for j in 0..n {
            a[j * n + j] += lambda;
        }
        assert!(dprec::numerics::linalg::cholesky_solve(&mut a, &mut b, n));
        for k in 0..d {
            exact.user_factors[[u, k]] = b[k];
        }
        exact.user_bias[u] = b[d];
    }
    let rmse =
        |model: &FactorModel| dprec::model::factor::rmse(&model.predict_all(&t.test), &t.test);
    let (r_dp, r_exact) = (rmse(&dp), rmse(&exact));
    let mean_only = dprec::model::factor::rmse(&vec![t.train.mean(); t.test.len()], &t.test);
    eprintln!("dp {r_dp:.4} exact {r_exact:.4} mean-only {mean_only:.4}");
    assert!(
        (r_dp - r_exact).abs() < 0.01,
        "dp {r_dp} vs exact {r_exact}"
    );
    assert!(
        r_exact < mean_only - 0.2,
        "the reference should learn: {r_exact} vs {mean_only}"
    );
    let max_diff = (&dp.user_factors - &exact.user_factors)
        .mapv(f64::abs)
        .fold(0.0f64, |a, &b| a.max(b));
    assert!(max_diff < 0.05, "profiles differ by up to {max_diff}");
}

/// paper-gaussian-mf adds N(0, sigma^2) to every user-gradient coordinate with the paper's
/// sigma = tau C sqrt(2 ln(1.25/delta)) / eps_i. With one step, lambda = 0 and users that
/// have no ratings, theta_1 = theta_0 - lr * noise with ||theta_0|| = 1, so
/// E ||theta_1||^2 = 1 + lr^2 d sigma^2: the mean over 2,000 empty users estimates sigma^2.
/// Noise left out (or mis-scaled by 10%) fails.
#[test]
fn paper_gaussian_mf_noise_has_the_papers_sigma() {
    let (n_users, d, lr, eps_i, delta) = (2_000u32, 40usize, 0.1, 1.0, 0.01);
    let mut r = dprec::data::Ratings::with_dims(n_users as usize, 5);
    for i in 0..5u32 {
        r.push(0, i, 4.0); // one rated user; the others are empty
    }
    let m = Interactions::new(&r);
    let t = dprec::train::build(
        "paper-gaussian-mf",
        &Params::parse(&[
            "d=40",
            "steps=1",
            "lambda=0",
            "lr=0.1",
            "eps_i=1",
            "delta=0.01",
            "clip=1",
        ])
        .unwrap(),
    )
    .unwrap();
    let fit = t
        .fit(
            &TrainData::new(&r, &m, dprec::data::RatingScale::ONE_TO_FIVE),
            &mut dprec_dp::rng::seeded(5),
        )
        .unwrap();
    let tau = 4.0; // the scale's width
    let sigma = tau * 1.0 * (2.0 * (1.25f64 / delta).ln()).sqrt() / eps_i;
    let est: Vec<f64> = (1..n_users as usize)
        .map(|u| {
            let row = fit.model.user_factors.row(u);
            (row.dot(&row) - 1.0) / (lr * lr * d as f64)
        })
        .collect();
    let mean = est.iter().sum::<f64>() / est.len() as f64;
    // Each estimate is sigma^2 chi^2_d / d (relative sd sqrt(2/d) = 0.22) plus a cross term
    // of sd 2 sigma / (lr d) (relative 2 / (lr d sigma) ~ 0.04 here): the mean over 1,999
    // users has relative sd ~0.005, so 0.05 is ~10 sd (false failure negligible for a
    // random seed; the seed is fixed). A 10% wrong sigma moves sigma^2 by 21%; no noise ~0.
    assert!(
        (mean / (sigma * sigma) - 1.0).abs() < 0.05,
        "estimated sigma^2 {mean}, paper's {}",
        sigma * sigma
    );
}
