//! `dp-alt`, the joint-DP rating predictor: its rating-level charges follow the ledger
//! rules of DESIGN 3, its user side is solved from the DP item side and the user's own
//! ratings only, and it learns.

use crate::common;

use dprec::data::{Interactions, RatingScale, Ratings};
use dprec::train::predictors::dp_alt::DpAlt;
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

/// Personalised budgets: a rating whose ledger affords full part is charged the Gaussian
/// `rho` of the rating-level multiplier (the bias-only bound), a poorer one an RSM-sampled pure eps
/// within its budget, a rating not offered nothing; every user with an offered rating is
/// charged exactly the planned user-level event, once.
#[test]
fn charges_follow_the_ledger_rules() {
    let r = small();
    let m = Interactions::new(&r);
    let budgets: Vec<f64> = (0..r.len())
        .map(|k| match k % 3 {
            0 => 0.0,
            1 => 0.5,
            _ => 100.0,
        })
        .collect();
    let t = alt(&[]);
    let mut data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
    data.budgets = Some((&budgets).into());
    let fit = t.fit(&data, &mut dprec_dp::rng::seeded(1)).unwrap();
    assert_eq!(fit.guarantee, Guarantee::Proven);
    let eps = fit.charges.rating_totals(r.len());
    let rho = fit.charges.rating_rho_totals(r.len());
    // Biases only, one round (the default): the direct rating bound, far above z / 2.
    let z_r = t.rating_multiplier_on(RatingScale::ONE_TO_FIVE).unwrap();
    assert!(z_r > 2.0 * t.rating_multiplier().unwrap(), "{z_r}");
    for k in 0..r.len() {
        match k % 3 {
            0 => assert_eq!((eps[k], rho[k]), (0.0, 0.0), "rating {k} not offered"),
            1 => {
                assert_eq!(rho[k], 0.0);
                assert!(
                    eps[k] > 0.0 && eps[k] <= 0.5 + 1e-12,
                    "rating {k}: {}",
                    eps[k]
                );
            }
            _ => {
                assert_eq!(eps[k], 0.0);
                assert!((rho[k] - 1.0 / (2.0 * z_r * z_r)).abs() < 1e-12);
            }
        }
    }
    let planned = t.planned_user_event().unwrap();
    let per_user = fit.charges.user_events();
    assert_eq!(per_user.len(), 30);
    assert!(per_user.values().all(|e| e == &vec![planned.clone()]));
    for rec in &fit.charges.mechanisms {
        assert_eq!(rec.neighbour, dprec_dp::charges::Neighbour::AddRemove);
    }
}

/// The served predictions come from the released item side and the user's own ratings
/// only: the same item side gives a user with other ratings other predictions, and the
/// model publishes no user rows.
#[test]
fn the_user_side_is_solved_from_the_users_own_ratings() {
    let (train, _) = common::low_rank(120, 60, 2, 0.3, 3);
    let m = Interactions::new(&train);
    let fit = alt(&["eps=50", "releases=1", "eps_r=none"])
        .fit(
            &TrainData::new(&train, &m, RatingScale::ONE_TO_FIVE),
            &mut dprec_dp::rng::seeded(2),
        )
        .unwrap();
    assert_eq!(fit.model.user_factors.nrows(), 0);
    let ranker = fit.ranker.unwrap();
    let high: Vec<(usize, f64)> = (0..20).map(|j| (j, 5.0)).collect();
    let low: Vec<(usize, f64)> = (0..20).map(|j| (j, 1.0)).collect();
    let (h, l) = (
        ranker.predict(Some(0), &high, 40).unwrap(),
        ranker.predict(Some(0), &low, 40).unwrap(),
    );
    assert!(h > l + 1.0, "{h} vs {l}");
    // The user index plays no part: only the own ratings do.
    assert_eq!(
        ranker.predict(None, &high, 40),
        ranker.predict(Some(7), &high, 40)
    );
    // Stored and reloaded, it predicts the same.
    let stored = dprec::train::StoredRanker::of(ranker.as_ref()).unwrap();
    let json = serde_json::to_string(&stored).unwrap();
    let back: dprec::train::StoredRanker = serde_json::from_str(&json).unwrap();
    assert_eq!(back.into_ranker().predict(None, &high, 40), Some(h));
}

#[test]
fn learns_on_low_rank_data_and_rejects_bad_parameters() {
    let (train, test) = common::low_rank(300, 200, 2, 0.3, 3);
    let fold = dprec_lab::folds::Fold {
        name: "low-rank".into(),
        train: train.clone(),
        test: test.clone(),
    };
    let t = build(
        "dp-alt",
        &Params::parse(&["eps=50", "releases=1", "eps_r=none"]).unwrap(),
    )
    .unwrap();
    let res =
        dprec_lab::eval::evaluate_fold_with(t.as_ref(), &fold, RatingScale::ONE_TO_FIVE, 2, None)
            .unwrap();
    let mu = train.mean();
    let mean_only = dprec::model::factor::rmse(&vec![mu; test.len()], &test);
    assert!(
        res.rmse < mean_only - 0.05,
        "dp-alt {} vs mean-only {mean_only}",
        res.rmse
    );
    let err = |p: &[&str]| {
        build("dp-alt", &Params::parse(p).unwrap())
            .err()
            .unwrap()
            .to_string()
    };
    assert!(err(&["rounds=0"]).contains("rounds"));
    assert!(err(&["d=2", "beta=1"]).contains("beta"));
    assert!(err(&["beta=1.5"]).contains("beta"));
    assert!(err(&["gram_share=1"]).contains("gram_share"));
    assert!(err(&["noise_factor=0.5"]).contains("noise_factor"));
    assert!(err(&["threshold=0.2"]).contains("threshold"));
    assert!(err(&["solve=exact"]).contains("solve"));
    // Both item reads learn on low-rank data.
    let ridge = build(
        "dp-alt",
        &Params::parse(&["eps=50", "releases=1", "eps_r=none", "solve=ridge"]).unwrap(),
    )
    .unwrap();
    assert_eq!(ridge.params()["solve"], "ridge");
    assert_eq!(t.params()["solve"], "eb", "the default read");
    let res = dprec_lab::eval::evaluate_fold_with(
        ridge.as_ref(),
        &fold,
        RatingScale::ONE_TO_FIVE,
        2,
        None,
    )
    .unwrap();
    assert!(
        res.rmse < mean_only - 0.05,
        "ridge {} vs {mean_only}",
        res.rmse
    );
}
