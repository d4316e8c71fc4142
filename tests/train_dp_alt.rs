//! The production trainer `dp-alt`: its charges follow the ledger rules of DESIGN 3, and
//! the noise of its item profiles has the scale its per-round budget calibrates.

use crate::common;

use dprec::accountant::PrivacyEvent;
use dprec::data::{Interactions, RatingScale, Ratings};
use dprec::train::dp_alt::DpAlt;
use dprec::train::objpert::budget_split;
use dprec::train::{build, Guarantee, Params, TrainData, Trainer};

fn small() -> Ratings {
    // 30 users x 40 items, items 30..39 never rated.
    let mut r = Ratings::with_dims(30, 40);
    for u in 0..30u32 {
        for i in 0..30u32 {
            if (u + 2 * i) % 3 != 0 {
                r.push(u, i, (1 + (u + i) % 5) as f32);
            }
        }
    }
    r
}

fn alt(p: &[&str]) -> DpAlt {
    DpAlt::from_params(&Params::parse(p).unwrap()).unwrap()
}

#[test]
fn charges_follow_the_ledger_rules() {
    let r = small();
    let m = Interactions::new(&r);
    // Personalised budgets, some ratings not offered (budget 0).
    let budgets: Vec<f64> = (0..r.len())
        .map(|k| match k % 4 {
            0 => 0.0,
            1 => 0.3,
            2 => 1.0,
            _ => 2.0,
        })
        .collect();
    let rounds = 2;
    // z = 30: the user steps cost a rating ~0.28 at delta_r, so ratings with budget 1 and
    // 2 take part in them (those with 0.3 do not).
    let t = alt(&["rounds=2", "user_sigma=30"]);
    let mut data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
    data.budgets = Some(&budgets);
    let fit = t.fit(&data, &mut dprec::rng::seeded(1)).unwrap();
    assert_eq!(fit.guarantee, Guarantee::Proven);
    let totals = fit.charges.rating_totals(r.len());
    let eps_mean = t.mean_eps; // public, from the parameters (issue 8, finding 4)
    let g = t.user_steps_rating_eps().unwrap();
    for (k, (&spent, &b)) in totals.iter().zip(&budgets).enumerate() {
        if b == 0.0 {
            assert_eq!(spent, 0.0, "rating {k} not offered but charged");
            continue;
        }
        // Never more than the budget, and at least the mean's share.
        assert!(spent <= b + 1e-12, "rating {k}: spent {spent} > budget {b}");
        assert!(spent >= eps_mean - 1e-12, "rating {k}: spent {spent}");
        // Ratings whose budget pays for the Gaussian user steps are charged for them.
        if b >= 1.0 {
            assert!(
                spent >= eps_mean + g - 1e-12,
                "rating {k}: user steps not charged"
            );
        }
    }
    // Every mechanism states a unit and a neighbour relation (serialised as kebab-case).
    for mech in &fit.charges.mechanisms {
        let j = serde_json::to_value(mech).unwrap();
        assert_eq!(j["unit"], "rating", "{j}");
        assert_eq!(j["neighbour"], "add-remove", "{j}");
    }
    // Each user with an offered rating: rounds + 1 user steps (SSP: one Gaussian release
    // each).
    let planned = t.planned_user_event().unwrap();
    let (z, steps) = match planned {
        PrivacyEvent::Gaussian {
            noise_multiplier,
            count,
        } => (noise_multiplier, count),
        other => panic!("planned {other:?}"),
    };
    let per_user = fit.charges.user_events();
    assert_eq!(per_user.len(), 30);
    for (u, events) in &per_user {
        let gaussian: u64 = events
            .iter()
            .map(|e| match e {
                PrivacyEvent::Gaussian {
                    noise_multiplier,
                    count,
                } => {
                    assert_eq!(*noise_multiplier, z, "user {u}");
                    *count
                }
                _ => 0,
            })
            .sum();
        assert_eq!(gaussian, steps, "user {u}: Gaussian steps charged");
        assert_eq!(steps, rounds + 1);
        // Pure-DP events (mean and item steps) never exceed the user's largest budget.
        let pure: f64 = events
            .iter()
            .map(|e| match e {
                PrivacyEvent::PureDp { eps, count } => eps * *count as f64,
                _ => 0.0,
            })
            .sum();
        assert!(pure > 0.0 && pure <= 2.0 + 1e-12, "user {u}: pure {pure}");
    }
}

/// An item nobody rated gets v_j = -eta_j / lambda_v, so lambda_v ||v_j|| must follow
/// Gamma(dim, c / eps_noise) where eps_noise comes from dp-alt's public threshold t
/// (0.9 here, below the per-round budget (2 - mean_eps) / 2) minus the Jacobian term. A
/// trainer that used the wrong budget per round, or left the noise out, fails this KS
/// test.
#[test]
fn unrated_item_noise_has_the_per_round_scale() {
    let r = small();
    let m = Interactions::new(&r);
    let t = alt(&[
        "eps=2",
        "rounds=2",
        "d=2",
        "bias=0.8",
        "c=1",
        "threshold=0.9",
    ]);
    let split = budget_split(0.9, &t.item).unwrap();
    let (lat, b) = ((1.0f64 - 0.64).sqrt(), 0.8);
    let mut norms = Vec::new();
    for seed in 0..1500 {
        let fit = t
            .fit(
                &TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE),
                &mut dprec::rng::seeded(seed),
            )
            .unwrap();
        for j in 30..40 {
            let mut v: Vec<f64> = fit
                .model
                .item_factors
                .row(j)
                .iter()
                .map(|a| a / lat)
                .collect();
            v.push(fit.model.item_bias[j] / b);
            norms.push(split.lambda_v * v.iter().map(|a| a * a).sum::<f64>().sqrt());
        }
    }
    let dim = 3;
    let ks =
        |scale: f64| common::ks_statistic(norms.clone(), |x| common::gamma_int_cdf(dim, x / scale));
    // alpha = 1e-6 per test (fixed seeds: deterministic).
    let crit = common::ks_critical(norms.len(), 1e-6);
    let right = 1.0 / split.eps_noise;
    assert!(ks(right) < crit, "KS {} >= {crit}", ks(right));
    // The same samples reject a 10% wrong scale and the whole-budget-per-round scale.
    assert!(ks(right * 1.1) > crit, "10% larger scale not detected");
    assert!(ks(right / 1.1) > crit, "10% smaller scale not detected");
    let whole = budget_split(1.8, &t.item).unwrap();
    assert!(
        ks(1.0 / whole.eps_noise) > crit,
        "whole budget per round not detected"
    );
}

#[test]
fn learns_on_low_rank_data_and_rejects_bad_parameters() {
    let (train, test) = common::low_rank(300, 200, 2, 0.3, 3);
    let m = Interactions::new(&train);
    let fit = alt(&["eps=50", "user_sigma=0.5", "threshold=20"])
        .fit(
            &TrainData::new(&train, &m, RatingScale::ONE_TO_FIVE),
            &mut dprec::rng::seeded(2),
        )
        .unwrap();
    let pred = fit.model.predict_all(&test);
    let rmse = dprec::eval::rmse(&pred, &test);
    let mu = train.mean();
    let mean_only = dprec::eval::rmse(&vec![mu; test.len()], &test);
    assert!(
        rmse < mean_only - 0.05,
        "dp-alt {rmse} vs mean-only {mean_only}"
    );
    let err = |p: &[&str]| {
        build("dp-alt", &Params::parse(p).unwrap())
            .err()
            .unwrap()
            .to_string()
    };
    assert!(err(&["rounds=0"]).contains("rounds"));
    assert!(err(&["user_sigma=1", "user_eps=1"]).contains("user_sigma"));
    assert!(err(&["mean_share=0.9"]).contains("mean_share"));
    // Data-dependent thresholds are refused (issue 8, finding 4).
    assert!(err(&["threshold=mean"]).contains("threshold"));
    assert!(err(&["lamda_v=3"]).contains("lamda_v"));
}
