//! The empirical privacy test (issue 8): for a small synthetic data set, run the service's
//! real mechanisms many times on D and on D' (one rating added; one user added), apply a
//! threshold distinguisher to a released statistic, and check that the Clopper-Pearson
//! lower bound on eps it implies (`dprec_lab::audit`) is BELOW the eps the ledger
//! charges; and that the same audit finds a bound ABOVE the charged eps when the noise
//! scale is halved or the noise is missing, so these tests would catch either defect.
//!
//! False failures: the seeds are fixed, so the suite is deterministic. Over seeds, a
//! correct mechanism's bound exceeds its charged eps with probability at most 5% (the
//! bound holds with confidence 0.95); the defective mechanisms' bounds are checked against
//! 1.1 times the charged eps, which they exceed by a wide margin at these trial counts.

use dprec::data::{Interactions, Ratings};
use dprec::train::dp_stats::dp_popularity;
use dprec::train::predictors::gaussian_mf::UserOffsets;
use dprec::train::predictors::ssp::{noisy_statistics, SspConfig};
use dprec_dp::accountant::{default_orders, eps_from_rdp, PrivacyEvent};
use dprec_dp::rng::seeded;
use dprec_lab::audit::{audit, AuditConfig};

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
fn noisy_counts(c: &[u64; 4], eps: f64, rng: &mut dprec_dp::rng::DpRng) -> Vec<i64> {
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
fn popularity_statistic(
    eps_run: Option<f64>,
) -> impl FnMut(bool, &mut dprec_dp::rng::DpRng) -> f64 {
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
fn user_statistic(eps_run: Option<f64>) -> impl FnMut(bool, &mut dprec_dp::rng::DpRng) -> f64 {
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
fn ssp_statistic(z: f64, noise: bool) -> impl FnMut(bool, &mut dprec_dp::rng::DpRng) -> f64 {
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

// ---------------------------------------------------------------------------------------
// The served default, `dp-topn`, audited end to end: each run is the trainer's own release
// (`DpTopN::release`: RSM, cap, clipping, exact DP counts, candidates, DP Gram) on a small
// synthetic data set at a one-release plan (releases = 1, delta_u = 1e-6). The
// distinguisher is the likelihood-ratio statistic of the Gaussian shift the canary causes,
// `sum_i shift_i * value_i / sigma_i^2` over the published counts and the Gram entries the
// canary touches. Base users rate the two items (A = 0, B = 1) so both are candidates in
// every run (their counts are > 6 count-noise sds above the threshold 0).
//
// The charge is audited at delta' = 0.01: the ledger charges an RDP curve, which is
// (eps(delta'), delta')-DP for every delta'; eps(delta') is the accountant's conversion
// of the charged curve. At delta = 1e-6 a threshold test would need millions of runs to
// see the tail that sets the charge (docs/privacy/dp-topn.md, "Empirical audit").

use dprec::data::RatingScale;
use dprec::train::topn::dp_topn::DpTopN;
use dprec::train::{Params, TrainData};

const BASE_USERS: u32 = 40;
const AUDIT_DELTA: f64 = 0.01;

/// Base data (`BASE_USERS` users rated A, as many others B: one rating each, so no cap
/// binds) plus the canary user's `canary` items.
fn topn_data(canary: &[u32]) -> (Ratings, Interactions) {
    let mut r = Ratings::with_dims(2 * BASE_USERS as usize + 1, 2);
    for u in 0..2 * BASE_USERS {
        r.push(u, u % 2, 4.0);
    }
    for &j in canary {
        r.push(2 * BASE_USERS, j, 5.0);
    }
    let m = Interactions::new(&r);
    (r, m)
}

/// `dp-topn` at a one-release plan of `eps_u`, both clips 1, the given cap and split
/// (`gram`, `counts`, a second count release pooled with the first, or the served
/// `select`); its noise multiplied by `noise_factor` (below 1 only here: a defective
/// trainer to be caught).
fn topn(eps_u: f64, cap: usize, split: &str, noise_factor: f64) -> DpTopN {
    let (eps, cap) = (format!("eps={eps_u}"), format!("cap={cap}"));
    let split = format!("split={split}");
    let p = [
        eps.as_str(),
        cap.as_str(),
        split.as_str(),
        "delta=1e-6",
        "releases=1",
        "threshold=0",
        "k=2",
        "count_clip=1",
        "gram_clip=1",
        // Every rating takes full part: the mechanism whose loss is claimed.
        "eps_r=none",
    ];
    let mut t = DpTopN::from_params(&Params::parse(&p).unwrap()).unwrap();
    t.noise_factor = noise_factor;
    t
}

/// One `dp-topn` release on D (`false`) or D' (`true`); the statistic is
/// `sum_j dc_j c_j / sigma_c^2 + sum_{a<=b} dg_ab G_ab / sigma_g^2` with the canary's
/// shifts `dc` (counts of A, B) and `dg` (Gram entries AA, AB, BB, upper triangle).
fn topn_statistic(
    t: DpTopN,
    canary: [&'static [u32]; 2],
    dc: [f64; 2],
    dg: [f64; 3],
) -> impl FnMut(bool, &mut dprec_dp::rng::DpRng) -> f64 {
    let views = [topn_data(canary[0]), topn_data(canary[1])];
    move |neighbour, rng| {
        let (r, m) = &views[usize::from(neighbour)];
        let data = TrainData::new(r, m, RatingScale::ONE_TO_FIVE);
        let rel = t.release(&data, rng).unwrap();
        let (sc, sg) = (rel.sigma_count.powi(2), rel.sigma_gram.powi(2));
        let mut s = (dc[0] * rel.noisy_counts[0] + dc[1] * rel.noisy_counts[1]) / sc;
        let k = rel.candidates.len();
        let pos = |j: u32| rel.candidates.iter().position(|&c| c == j);
        if let (Some(a), Some(b), false) = (pos(0), pos(1), rel.gram.is_empty()) {
            let g = |x: usize, y: usize| rel.gram[x * k + y];
            s += (dg[0] * g(a, a) + dg[1] * g(a, b) + dg[2] * g(b, b)) / sg;
        }
        s
    }
}

/// The audited unit: one user added, or one rating added.
#[derive(Clone, Copy, Debug)]
enum Unit {
    User,
    Rating,
}

/// User: the canary rated A only; with both clips 1 its row moves the count of A and the
/// Gram entry AA by 1 each, the full user-level sensitivity (eps_u = 7.5: z = 0.89 through
/// the Renyi filter, about the noise eps_u 6 gave by the plain conversion before the plan
/// was calibrated through the filter; with much less noise a halved noise shows too little
/// above the charge, e.g. 6.3 against 5.8 at z 0.57).
/// Rating: with cap 1, the canary rated A and D' adds B; the capped row is {A} in D and
/// {A} or {B} (probability 1/2) in D', and the swap moves counts and Gram by `sqrt 2`,
/// the full rating-level bound (eps_u = 5: z = 1.31 through the filter, about eps_u 4's
/// noise by the plain conversion, so the charge stays within what 20,000 runs can show
/// and the attack keeps its power: at z = 1.61, eps_u 4 through the filter, it reached
/// under a third of the charge).
fn topn_case(
    unit: Unit,
    split: &str,
    noise_factor: f64,
) -> (DpTopN, impl FnMut(bool, &mut dprec_dp::rng::DpRng) -> f64) {
    match unit {
        Unit::User => {
            let t = topn(7.5, 256, split, noise_factor);
            let f = topn_statistic(t.clone(), [&[], &[0]], [1.0, 0.0], [1.0, 0.0, 0.0]);
            (t, f)
        }
        Unit::Rating => {
            let t = topn(5.0, 1, split, noise_factor);
            let f = topn_statistic(t.clone(), [&[0], &[0, 1]], [-1.0, 1.0], [-1.0, 0.0, 1.0]);
            (t, f)
        }
    }
}

/// The charged eps at `AUDIT_DELTA` of the correct trainer (noise factor 1): the user's
/// planned event, or the rating-level Gaussian of a full participation (for a split that
/// may take either branch, at the larger of the two branches' losses).
fn topn_charged(unit: Unit, split: &str) -> f64 {
    let (t, _) = topn_case(unit, split, 1.0);
    let (z, _, _) = t.multipliers().unwrap();
    let z = match unit {
        Unit::User => z,
        Unit::Rating => t.rating_z(true).unwrap(),
    };
    let curve = PrivacyEvent::gaussian(z, 1)
        .unwrap()
        .rdp_curve(&default_orders())
        .unwrap();
    eps_from_rdp(&curve, AUDIT_DELTA).unwrap().eps
}

fn topn_audit(unit: Unit, split: &str, noise_factor: f64, trials: usize, seed: u64) -> f64 {
    let cfg = AuditConfig {
        trials,
        confidence: 0.95,
        delta: AUDIT_DELTA,
    };
    let (_, f) = topn_case(unit, split, noise_factor);
    audit(&cfg, f, &mut seeded(seed)).eps_lower
}

/// Both units, for the Gram split and the counts split (the counts and the second counts
/// compose to the charge), and the user level for the served selecting split's first
/// release (the trace test, the counts and the rest). A
/// correct release's bound is below the charge (and at least a third of it: the attack
/// has power); the same audit with the noise halved, or scaled by 1e-3 (missing), finds
/// a bound above 1.1 times the charge. The counts split's rating case weakens the noise
/// to 0.4 instead: its pooled counts are rounded to whole counts, which at this scale
/// (sd about 1) costs the attack power (halved: eps_lower 2.8 against a charge of 3.2).
///
/// Each case is 45,000 pairs of releases, 6-7 s on 2 cores: the five are `#[ignore]`d
/// in a plain `cargo test` and run by CI as its own step (`cargo test -- --ignored
/// repeated::`, docs/DEVELOPING.md), where they run side by side.
fn dp_topn_release_audited(unit: Unit, split: &str, weak: f64, seed: u64) {
    let charged = topn_charged(unit, split);
    let ok = topn_audit(unit, split, 1.0, 20_000, seed);
    eprintln!(
        "dp-topn audit, {unit:?} level, split {split}, delta' {AUDIT_DELTA}: eps_lower \
         {ok:.3} / charged {charged:.3} = {:.3}",
        ok / charged
    );
    assert!(ok < charged, "correct mechanism: {ok} vs charged {charged}");
    assert!(
        ok > charged / 3.0,
        "the audit has no power: {ok} vs {charged}"
    );
    let halved = topn_audit(unit, split, weak, 20_000, seed + 1);
    eprintln!("noise x{weak}: eps_lower {halved:.3}");
    assert!(
        halved > 1.1 * charged,
        "noise x{weak}: {halved} vs {charged}"
    );
    let missing = topn_audit(unit, split, 1e-3, 5_000, seed + 2);
    assert!(
        missing > 1.1 * charged,
        "missing noise: {missing} vs {charged}"
    );
}

/// The `dp-topn` audits, one test per case ([`dp_topn_release_audited`]).
mod repeated {
    use super::*;

    #[test]
    #[ignore = "6-7 s: CI runs it (cargo test -- --ignored repeated::)"]
    fn dp_topn_release_audited_user_gram() {
        dp_topn_release_audited(Unit::User, "gram", 0.5, 41);
    }

    #[test]
    #[ignore = "6-7 s: CI runs it (cargo test -- --ignored repeated::)"]
    fn dp_topn_release_audited_rating_gram() {
        dp_topn_release_audited(Unit::Rating, "gram", 0.5, 51);
    }

    #[test]
    #[ignore = "6-7 s: CI runs it (cargo test -- --ignored repeated::)"]
    fn dp_topn_release_audited_user_counts() {
        dp_topn_release_audited(Unit::User, "counts", 0.5, 61);
    }

    #[test]
    #[ignore = "6-7 s: CI runs it (cargo test -- --ignored repeated::)"]
    fn dp_topn_release_audited_rating_counts() {
        dp_topn_release_audited(Unit::Rating, "counts", 0.4, 71);
    }

    /// The served split's first release (no state: the trace test at the selection's
    /// share). Not at the rating level: there the charge also covers the difference,
    /// which a first release does not draw (its own noise scale is unit-tested), so the
    /// attack reaches under a third of it (0.33).
    #[test]
    #[ignore = "6-7 s: CI runs it (cargo test -- --ignored repeated::)"]
    fn dp_topn_release_audited_user_select() {
        dp_topn_release_audited(Unit::User, "select", 0.5, 81);
    }
}

use dprec::model::joint_als::JointAls;
use dprec::train::predictors::dp_alt::DpAlt;

/// `dp-alt`'s served form (biases only, one round) at a one-release plan of eps_u 4 (z =
/// 1.61 through the Renyi filter, about eps_u 3's noise by the plain conversion: with
/// z = 2.13 the attack reaches under a third of the charge),
/// every rating taking full part, its noise multiplied by `noise_factor`.
fn alt(noise_factor: f64) -> DpAlt {
    let p = ["eps=4", "releases=1", "eps_r=none", "noise_factor=1"];
    let mut t = DpAlt::from_params(&Params::parse(&p).unwrap()).unwrap();
    t.noise_factor = noise_factor;
    t
}

/// One `dp-alt` item step on D (a user who rated items 0-2 with 2) or D' (the same user
/// also rated item 3 with 5: the removal that comes nearest the rating-level bound, 81%
/// of its `rho`, found by enumerating users with up to 6 ratings). The first round's
/// side is public (item biases 0), so the step is exactly the released statistics; the
/// statistic is the likelihood-ratio direction `sum dG G / sigma_G^2 + sum dh h /
/// sigma_h^2`.
fn alt_statistic(t: DpAlt) -> impl FnMut(bool, &mut dprec_dp::rng::DpRng) -> f64 {
    let side = JointAls {
        mean: 3.0,
        item_bias: vec![0.0; 4],
        item_factors: Vec::new(),
        d: 0,
        lambda_user: t.lambda_user,
        max_norm: t.max_norm(),
        scale: RatingScale::ONE_TO_FIVE,
        popularity: Vec::new(),
        history: None,
    };
    let d: Vec<(usize, f64)> = vec![(0, 2.0), (1, 2.0), (2, 2.0)];
    let mut d1 = d.clone();
    d1.push((3, 5.0));
    let views = [
        t.item_statistics(&side, &[d]),
        t.item_statistics(&side, &[d1]),
    ];
    let (sg, sh) = t.sigmas().unwrap();
    let dg: Vec<f64> = views[1]
        .gram
        .iter()
        .zip(&views[0].gram)
        .map(|(a, b)| a - b)
        .collect();
    let dh: Vec<f64> = views[1]
        .rhs
        .iter()
        .zip(&views[0].rhs)
        .map(|(a, b)| a - b)
        .collect();
    move |neighbour, rng| {
        let mut st = views[usize::from(neighbour)].clone();
        t.add_noise(&mut st, rng).unwrap();
        let g: f64 = dg.iter().zip(&st.gram).map(|(a, b)| a * b).sum();
        let h: f64 = dh.iter().zip(&st.rhs).map(|(a, b)| a * b).sum();
        g / (sg * sg) + h / (sh * sh)
    }
}

/// The rating-level charge of `dp-alt`'s default release is the direct bias-only bound
/// (`z_r` far above the triangle bound's `z / 2`). A correct release's audit bound stays
/// below it and reaches a third of it; with the noise halved or missing it exceeds 1.1
/// times the charge.
#[test]
fn dp_alt_rating_level_audited() {
    let t = alt(1.0);
    let z_r = t.rating_multiplier_on(RatingScale::ONE_TO_FIVE).unwrap();
    assert!(z_r > 2.0 * t.rating_multiplier().unwrap());
    let curve = PrivacyEvent::gaussian(z_r, 1)
        .unwrap()
        .rdp_curve(&default_orders())
        .unwrap();
    let charged = eps_from_rdp(&curve, AUDIT_DELTA).unwrap().eps;
    let cfg = |trials| AuditConfig {
        trials,
        confidence: 0.95,
        delta: AUDIT_DELTA,
    };
    let ok = audit(&cfg(20_000), alt_statistic(alt(1.0)), &mut seeded(81)).eps_lower;
    eprintln!("dp-alt rating-level audit: eps_lower {ok:.3} / charged {charged:.3}");
    assert!(ok < charged, "correct mechanism: {ok} vs charged {charged}");
    assert!(
        ok > charged / 3.0,
        "the audit has no power: {ok} vs {charged}"
    );
    let halved = audit(&cfg(20_000), alt_statistic(alt(0.5)), &mut seeded(82)).eps_lower;
    eprintln!("noise x0.5: eps_lower {halved:.3}");
    assert!(halved > 1.1 * charged, "noise x0.5: {halved} vs {charged}");
    let missing = audit(&cfg(5_000), alt_statistic(alt(1e-3)), &mut seeded(83)).eps_lower;
    assert!(
        missing > 1.1 * charged,
        "missing noise: {missing} vs {charged}"
    );
}
