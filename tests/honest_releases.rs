//! Issue 8 ("Honest releases") regression tests at the level of the pure pieces: the
//! admission plan, the lifetime plan and the trainers' published parameters and charges.
//! Each failed on the code before the fix (see the commit that added it).

use std::collections::{BTreeMap, BTreeSet};

use dprec::config::Settings;
use dprec::data::{Interactions, RatingScale, Ratings};
use dprec::train::{self, units, Params, TrainData, Trainer};
use dprec_dp::accountant::{LifetimePlan, RdpCurve, RenyiFilter};
use dprec_dp::ledger::{plan, user_cost, PlanParams, RatingBudget, UserBudget};

/// A public bound on any user's ratings (the catalogue size of MovieLens-100K).
const M: u64 = 1682;

/// The service's default plan parameters (default config, default trainer calibrated to
/// the default lifetime plan, as a release computes them).
fn default_params() -> PlanParams {
    let s = Settings::default();
    let trainer = train::build(&s.trainer.name, &Params::new()).unwrap();
    let life = LifetimePlan::new(
        s.budget.planned_releases,
        s.budget.default_user_eps,
        s.budget.default_user_delta,
    )
    .unwrap();
    let c = units::calibrate_release(trainer.as_ref(), &life, M, s.budget.popularity_eps).unwrap();
    PlanParams {
        policy: s.budget.share,
        min_release_eps: s.budget.min_release_eps,
        popularity_eps: c.popularity_eps,
        user_event: Some(c.user_event),
        check_user_filter: true,
    }
}

fn users(names: &[&str], consumed: &RdpCurve) -> BTreeMap<String, UserBudget> {
    let s = Settings::default();
    names
        .iter()
        .map(|u| {
            (
                u.to_string(),
                UserBudget {
                    eps: s.budget.default_user_eps,
                    delta: s.budget.default_user_delta,
                    consumed: consumed.clone(),
                },
            )
        })
        .collect()
}

/// What a release charges each participating user (`release::steps::collect_charges`):
/// the release's user-level event, for every user the plan charges.
fn charge(params: &PlanParams, p: &dprec_dp::ledger::Plan) -> BTreeMap<String, RdpCurve> {
    let users: BTreeSet<String> = p.users_charged.iter().cloned().collect();
    let cost = user_cost(&params.user_event.clone().into_iter().collect::<Vec<_>>()).unwrap();
    users.into_iter().map(|u| (u, cost.clone())).collect()
}

fn admitted_ids(ratings: &[RatingBudget], p: &dprec_dp::ledger::Plan) -> BTreeSet<i64> {
    p.admitted().map(|a| ratings[a.index as usize].id).collect()
}

/// Finding 2: with the defaults, one added rating with eps_ij = 10 must not change the
/// admission of any other rating or user. Both plans see the same stored state (the user
/// already took part in one release).
#[test]
fn one_rating_does_not_change_any_other_admission() {
    let params = default_params();
    let r = |id, user: &str, eps| RatingBudget {
        id,
        user: user.into(),
        eps,
        spent: 0.0,
        rho: 0.0,
    };
    let d_minus: Vec<RatingBudget> = vec![r(1, "u", 1.0), r(2, "u", 1.0), r(3, "v", 1.0)];
    let mut d = d_minus.clone();
    d.push(r(4, "u", 10.0));
    // The state after one release of D minus the rating (the same for both plans).
    let zero = RdpCurve::zeros_default();
    let first = plan(&params, &d_minus, &users(&["u", "v"], &zero));
    let after = charge(&params, &first);
    let consumed = after["u"].clone();
    let state = users(&["u", "v"], &consumed);
    let with = plan(&params, &d, &state);
    let without = plan(&params, &d_minus, &state);
    let mut with_ids = admitted_ids(&d, &with);
    with_ids.remove(&4);
    assert_eq!(
        with_ids,
        admitted_ids(&d_minus, &without),
        "adding one rating (eps_ij = 10) changed other ratings' admission"
    );
    assert_eq!(
        with.users_excluded.keys().collect::<Vec<_>>(),
        without.users_excluded.keys().collect::<Vec<_>>(),
        "adding one rating changed a user's admission"
    );
}

/// Finding 2, exhaustively on a small data set over several releases: for every rating r,
/// releases on D and on D - r admit exactly the same other ratings and users.
#[test]
fn removing_any_rating_leaves_every_other_admission_unchanged() {
    let params = default_params();
    // Mostly eps_ij = 1; one large preference for u0 (10) and u1 (5), a small one for u2.
    let mut d = Vec::new();
    for k in 0..24i64 {
        let eps = match k {
            0 => 10.0,
            5 => 5.0,
            10 => 0.1,
            _ => 1.0,
        };
        d.push(RatingBudget {
            id: k,
            user: format!("u{}", k % 4).into(),
            eps,
            spent: 0.0,
            rho: 0.0,
        });
    }
    let names = ["u0", "u1", "u2", "u3"];
    let run = |data: &[RatingBudget]| -> Vec<(BTreeSet<i64>, BTreeSet<String>)> {
        let mut data = data.to_vec();
        let mut state = users(&names, &RdpCurve::zeros_default());
        let mut out = Vec::new();
        for _ in 0..6 {
            let p = plan(&params, &data, &state);
            let users_in: BTreeSet<String> = p
                .admitted()
                .map(|a| data[a.index as usize].user.to_string())
                .collect();
            out.push((admitted_ids(&data, &p), users_in));
            for (u, c) in charge(&params, &p) {
                let b = state.get_mut(&u).unwrap();
                b.consumed = b.consumed.compose(&c).unwrap();
            }
            for a in p.admitted() {
                data[a.index as usize].spent += a.share;
            }
        }
        out
    };
    let full = run(&d);
    for k in 0..d.len() {
        let mut minus = d.clone();
        let gone = minus.remove(k);
        let other = run(&minus);
        for (release, ((a, _), (b, _))) in full.iter().zip(&other).enumerate() {
            let mut a = a.clone();
            a.remove(&gone.id);
            assert_eq!(
                a, *b,
                "release {release}: removing rating {} (user {}, eps {}) changed others' admission",
                gone.id, gone.user, gone.eps
            );
        }
    }
}

/// The end of a lifetime: user u's rating 2 is exhausted and rating 1 is alive. Over 60
/// releases (more than the 52 planned) on D and on D minus rating 1, the same users are
/// charged in every release, and afterwards u's new rating 4 and v's rating 3 are treated
/// alike. Under the old rule (a user is charged only with an admitted rating) u was not
/// charged without rating 1, so rating 4 was admitted only in D minus rating 1.
#[test]
fn one_rating_does_not_change_its_users_charges_at_the_end_of_a_lifetime() {
    let params = default_params();
    let rb = |id, user: &str, eps, spent| RatingBudget {
        id,
        user: user.into(),
        eps,
        spent,
        rho: 0.0,
    };
    let d = vec![
        rb(1, "u", 1e6, 0.0),
        rb(2, "u", 1.0, 1.0),
        rb(3, "v", 1e6, 0.0),
    ];
    type Run = (Vec<BTreeSet<String>>, BTreeSet<i64>, Vec<String>);
    let run = |data: &[RatingBudget]| -> Run {
        let mut state = users(&["u", "v"], &RdpCurve::zeros_default());
        let mut charged = Vec::new();
        for _ in 0..60 {
            let p = plan(&params, data, &state);
            let c = charge(&params, &p);
            charged.push(c.keys().cloned().collect());
            for (u, c) in c {
                let b = state.get_mut(&u).unwrap();
                b.consumed = b.consumed.compose(&c).unwrap();
            }
        }
        let mut later = data.to_vec();
        later.push(rb(4, "u", 1e6, 0.0));
        let p = plan(&params, &later, &state);
        let excluded = p.users_excluded.keys().cloned().collect();
        (charged, admitted_ids(&later, &p), excluded)
    };
    let (charged, mut admitted, excluded) = run(&d);
    let minus: Vec<RatingBudget> = d[1..].to_vec();
    let (charged_minus, admitted_minus, excluded_minus) = run(&minus);
    assert_eq!(charged, charged_minus, "rating 1 changed who is charged");
    admitted.remove(&1);
    assert_eq!(
        admitted, admitted_minus,
        "rating 1 changed others' admission"
    );
    assert_eq!(
        excluded, excluded_minus,
        "rating 1 changed a user's admission"
    );
    // The lifetime did end: neither u nor v is admitted after 60 releases.
    assert!(admitted_minus.is_empty(), "{admitted_minus:?}");
}

/// Lifetime: with the default configuration every user takes part in all planned
/// releases (52 by default), and every filter holds.
#[test]
fn default_config_gives_every_user_all_planned_releases() {
    let params = default_params();
    let planned = 52;
    let prefs = [0.1, 1.0, 1.0, 5.0];
    let mut data: Vec<RatingBudget> = (0..40i64)
        .map(|k| RatingBudget {
            id: k,
            user: format!("u{}", k % 5).into(),
            eps: prefs[k as usize % prefs.len()],
            spent: 0.0,
            rho: 0.0,
        })
        .collect();
    let names = ["u0", "u1", "u2", "u3", "u4"];
    let mut state = users(&names, &RdpCurve::zeros_default());
    let s = Settings::default();
    let filter =
        RenyiFilter::with_default_orders(s.budget.default_user_eps, s.budget.default_user_delta)
            .unwrap();
    for release in 0..planned {
        let p = plan(&params, &data, &state);
        assert!(
            p.users_excluded.is_empty(),
            "release {release}: users excluded {:?}",
            p.users_excluded
        );
        for (u, c) in charge(&params, &p) {
            let b = state.get_mut(&u).unwrap();
            assert!(
                filter.admits(&b.consumed, &c).unwrap(),
                "release {release}: {u}"
            );
            b.consumed = b.consumed.compose(&c).unwrap();
        }
        for a in p.admitted() {
            data[a.index as usize].spent += a.share;
        }
    }
}

fn synthetic(n_users: u32, n_items: u32) -> Ratings {
    let mut r = Ratings::with_dims(n_users as usize, n_items as usize);
    for u in 0..n_users {
        for i in 0..n_items {
            if (u * 7 + i * 3) % 4 != 0 {
                r.push(u, i, (1 + (u + 2 * i) % 5) as f32);
            }
        }
    }
    r
}

fn scale() -> RatingScale {
    RatingScale {
        min: 1.0,
        max: 5.0,
        step: 1.0,
    }
}

/// The published parameters of a release's mechanisms (what the release record and the
/// audit show).
fn published(trainer: &dyn Trainer, r: &Ratings, budgets: &[f64]) -> Vec<serde_json::Value> {
    let m = Interactions::new(r);
    let data = TrainData {
        ratings: r,
        matrix: &m,
        scale: scale(),
        budgets: Some(budgets.into()),
        rating_rho: None,
        prior: None,
        prior_counts: None,
        labels: None,
    };
    let mut rng = dprec_dp::rng::seeded(3);
    let fitted = trainer.fit(&data, &mut rng).unwrap();
    fitted
        .charges
        .mechanisms
        .iter()
        .map(|m| serde_json::json!({"name": m.name, "params": m.params}))
        .collect()
}

/// Finding 4: the default trainer's published mechanism parameters (t, lambda_v, eps_mean,
/// noise eps, ...) are the same on D and on D minus one rating whose budget differs from
/// the others' (they come from configuration, not from the data).
#[test]
fn published_parameters_do_not_depend_on_the_data() {
    let trainer = train::build("dp-alt", &Params::new()).unwrap();
    let r = synthetic(12, 9);
    let mut budgets = vec![0.25; r.len()];
    budgets[5] = 0.05;
    budgets[11] = 2.5;
    let full = published(trainer.as_ref(), &r, &budgets);
    for gone in [5usize, 11] {
        let keep: Vec<usize> = (0..r.len()).filter(|&k| k != gone).collect();
        let minus = r.select(&keep);
        let b: Vec<f64> = keep.iter().map(|&k| budgets[k]).collect();
        assert_eq!(
            full,
            published(trainer.as_ref(), &minus, &b),
            "removing rating {gone} (budget {}) changed the published parameters",
            budgets[gone]
        );
    }
}

/// Finding 3: a `gaussian-mf` release charges every rating it touches (eps at a public
/// delta_r), within the rating's release budget; a rating whose budget cannot pay for the
/// step is not used.
#[test]
fn gaussian_mf_charges_every_rating_it_touches() {
    let trainer = train::build("gaussian-mf", &Params::new()).unwrap();
    let r = synthetic(6, 5);
    let m = Interactions::new(&r);
    let mut budgets = vec![1000.0; r.len()];
    budgets[0] = 0.2;
    let data = TrainData {
        ratings: &r,
        matrix: &m,
        scale: scale(),
        budgets: Some((&budgets).into()),
        rating_rho: None,
        prior: None,
        prior_counts: None,
        labels: None,
    };
    let mut rng = dprec_dp::rng::seeded(5);
    let fitted = trainer.fit(&data, &mut rng).unwrap();
    let totals = fitted.charges.rating_totals(r.len());
    for (k, t) in totals.iter().enumerate().skip(1) {
        assert!(*t > 0.0, "rating {k} was used and not charged");
        assert!(*t <= budgets[k], "rating {k}: charge {t} above budget");
    }
    assert!(totals[0] <= 0.2, "rating 0 overcharged: {}", totals[0]);
}
