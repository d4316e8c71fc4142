//! The empirical privacy test (issue 8): for a small synthetic data set, run the service's
//! real mechanisms many times on D and on D' (one rating added; one user added), apply a
//! threshold distinguisher to a released statistic, and check that the Clopper-Pearson
//! lower bound on eps it implies (`dprec::privacy::audit`) is BELOW the eps the ledger
//! charges; and that the same audit finds a bound ABOVE the charged eps when the noise
//! scale is halved or the noise is missing, so these tests would catch either defect.
//!
//! False failures: the seeds are fixed, so the suite is deterministic. Over seeds, a
//! correct mechanism's bound exceeds its charged eps with probability at most 5% (the
//! bound holds with confidence 0.95); the defective mechanisms' bounds are checked against
//! 1.1 times the charged eps, which they exceed by a wide margin at these trial counts.

use dprec::accountant::{default_orders, eps_from_rdp, PrivacyEvent};
use dprec::data::{Interactions, Ratings};
use dprec::privacy::audit::{audit, AuditConfig};
use dprec::rng::seeded;
use dprec::train::dp_stats::dp_popularity;
use dprec::train::gaussian_mf::UserOffsets;
use dprec::train::ssp::{noisy_statistics, SspConfig};

fn pure(trials: usize) -> AuditConfig {
    AuditConfig {
        trials,
        confidence: 0.95,
        delta: 0.0,
    }
}

/// D: item counts of a small data set; D' adds one rating of item 2.
const COUNTS: [u64; 4] = [7, 3, 12, 1];

/// The service's popularity release (`dp_stats::dp_popularity`, exact discrete Laplace
/// on every count) on a data set with these item counts (one user per rating).
fn noisy_counts(c: &[u64; 4], eps: f64, rng: &mut dprec::rng::DpRng) -> Vec<i64> {
    let mut r = Ratings::with_dims(c.iter().sum::<u64>() as usize, 4);
    let mut u = 0;
    for (j, &n) in c.iter().enumerate() {
        for _ in 0..n {
            r.push(u, j as u32, 4.0);
            u += 1;
        }
    }
    let counted = vec![true; r.len()];
    dp_popularity(&r, 4, &counted, eps, rng).unwrap().0
}

/// The popularity release (`noisy_counts`, exact discrete Laplace) run at `eps_run`;
/// `None` = the noise is missing (exact counts). The statistic is item 2's noisy count.
fn popularity_statistic(eps_run: Option<f64>) -> impl FnMut(bool, &mut dprec::rng::DpRng) -> f64 {
    move |neighbour, rng| {
        let mut c = COUNTS;
        if neighbour {
            c[2] += 1;
        }
        match eps_run {
            Some(e) => noisy_counts(&c, e, rng)[2] as f64,
            None => c[2] as f64,
        }
    }
}

/// One rating added: the DP popularity counts, charged eps = 1 per counted rating.
#[test]
fn popularity_counts_one_rating_added() {
    let charged = 1.0;
    let cfg = pure(60_000);
    let ok = audit(&cfg, popularity_statistic(Some(charged)), &mut seeded(11));
    // Pure eps-DP counts have a likelihood ratio of exactly e^eps in the tail, so a
    // strong distinguisher's bound comes close to the charged eps: only "below" is claimed.
    assert!(
        ok.eps_lower < charged,
        "correct mechanism: lower bound {ok:?} not below the charged eps {charged}"
    );
    assert!(ok.eps_lower > 0.5, "the audit has no power: {ok:?}");
    let halved = audit(
        &cfg,
        popularity_statistic(Some(2.0 * charged)),
        &mut seeded(12),
    );
    assert!(
        halved.eps_lower > 1.1 * charged,
        "halved noise scale not caught: {halved:?}"
    );
    let missing = audit(&cfg, popularity_statistic(None), &mut seeded(13));
    assert!(
        missing.eps_lower > 1.1 * charged,
        "missing noise not caught: {missing:?}"
    );
}

/// One user added: a new user rates items 0, 1 and 3 (one rating each, the per-release
/// contribution bound m = 3). Each count is eps-DP for one rating, so the user-level
/// charge is 3 eps (group privacy over the user's 3 ratings in 3 disjoint counts). The
/// statistic is the sum of the three noisy counts.
fn user_statistic(eps_run: Option<f64>) -> impl FnMut(bool, &mut dprec::rng::DpRng) -> f64 {
    move |neighbour, rng| {
        let mut c = COUNTS;
        if neighbour {
            for j in [0, 1, 3] {
                c[j] += 1;
            }
        }
        let noisy: Vec<f64> = match eps_run {
            Some(e) => noisy_counts(&c, e, rng)
                .into_iter()
                .map(|x| x as f64)
                .collect(),
            None => c.iter().map(|&x| x as f64).collect(),
        };
        noisy[0] + noisy[1] + noisy[3]
    }
}

#[test]
fn popularity_counts_one_user_added() {
    let per_count = 0.5;
    let charged = 3.0 * per_count;
    let cfg = pure(60_000);
    let ok = audit(&cfg, user_statistic(Some(per_count)), &mut seeded(21));
    assert!(
        ok.eps_lower < 0.8 * charged,
        "correct mechanism: {ok:?} vs user-level charge {charged}"
    );
    let halved = audit(&cfg, user_statistic(Some(2.0 * per_count)), &mut seeded(22));
    assert!(
        halved.eps_lower > 1.1 * charged,
        "halved noise scale not caught at user level: {halved:?}"
    );
    let missing = audit(&cfg, user_statistic(None), &mut seeded(23));
    assert!(missing.eps_lower > 1.1 * charged, "{missing:?}");
}

/// One rating added to a user: the SSP user step's Gaussian release of the user's
/// sufficient statistics (`ssp::noisy_statistics`), charged `Gaussian { z, count: 1 }`,
/// i.e. eps at delta = 1e-5 by the accountant's conversion. D: the user rated item 0;
/// D' adds a rating of item 1. Both items have the public feature 1 (d = 1, no bias), the
/// ratings are 5 with offset 0 and clip_y = 2, so the added rating moves the statistics
/// (A, b) by (1, 2); the released statistic is their projection on that direction.
fn ssp_statistic(z: f64, noise: bool) -> impl FnMut(bool, &mut dprec::rng::DpRng) -> f64 {
    let cfg = SspConfig {
        noise_multiplier: z,
        clip_y: 2.0,
        lambda_u: 1.0,
        bias_weight: 0.0,
        ..SspConfig::default()
    };
    let features = ndarray::Array2::from_elem((2, 1), 1.0);
    let views: Vec<Interactions> = [false, true]
        .iter()
        .map(|&add| {
            let mut r = Ratings::with_dims(1, 2);
            r.push(0, 0, 5.0);
            if add {
                r.push(0, 1, 5.0);
            }
            Interactions::new(&r)
        })
        .collect();
    let offsets = UserOffsets {
        global: 0.0,
        item_bias: None,
    };
    move |neighbour, rng| {
        let m = &views[usize::from(neighbour)];
        let s = if noise {
            noisy_statistics(&m.by_user, &offsets, features.view(), None, &cfg, rng).unwrap()
        } else {
            // Missing noise: the exact statistics (1 or 2, 2 or 4).
            let k = if neighbour { 2.0 } else { 1.0 };
            ndarray::Array2::from_shape_vec((1, 2), vec![k, 2.0 * k]).unwrap()
        };
        (s[[0, 0]] + 2.0 * s[[0, 1]]) / 5f64.sqrt()
    }
}

#[test]
fn ssp_gaussian_one_rating_added() {
    let z = 1.0;
    let delta = 1e-5;
    let curve = PrivacyEvent::gaussian(z, 1)
        .unwrap()
        .rdp_curve(&default_orders())
        .unwrap();
    let charged = eps_from_rdp(&curve, delta).unwrap().eps;
    let cfg = AuditConfig {
        trials: 160_000,
        confidence: 0.95,
        delta,
    };
    let ok = audit(&cfg, ssp_statistic(z, true), &mut seeded(31));
    assert!(
        ok.eps_lower < 0.8 * charged,
        "correct mechanism: {ok:?} vs charged {charged}"
    );
    assert!(ok.eps_lower > 1.0, "the audit has no power: {ok:?}");
    let halved = audit(&cfg, ssp_statistic(z / 2.0, true), &mut seeded(32));
    assert!(
        halved.eps_lower > 1.1 * charged,
        "halved noise scale not caught: {halved:?} vs charged {charged}"
    );
    let missing = audit(&cfg, ssp_statistic(z, false), &mut seeded(33));
    assert!(missing.eps_lower > 1.1 * charged, "{missing:?}");
}
