//! Directly released DP statistics of a rating set: the global mean and per-item counts.
//!
//! These numbers are published as they are (the mean enters every prediction, the counts
//! drive the popularity fallback and noise-aware shrinkage), so they use the exact integer
//! samplers of [`crate::privacy::discrete`], not floating-point noise (Mironov 2012).
//!
//! Claims, unit = one rating, neighbour = add/remove:
//! - global mean: the count (sensitivity 1) and the sum of `(r - r_min) / step` (sensitivity
//!   `(r_max - r_min) / step` grid steps) each get half of `eps`: eps-DP by basic composition;
//!   the ratio is post-processing;
//! - item counts: a histogram where one rating changes one count by 1, so discrete Laplace
//!   of scale `1/eps` on every count is eps-DP (parallel composition over items).
//!
//! Each rating used is charged `eps` per statistic; each user with a used rating gets a
//! `PureDp { eps }` event (the worst of their ratings), see [`charge_every_rating`].

use rand::Rng;

use super::charges::{
    MechanismRecord, Neighbour, PrivacyUnit, RatingCharge, ReleaseCharges, UserCharge,
};
use super::TrainError;
use crate::accountant::PrivacyEvent;
use crate::data::{RatingScale, Ratings};
use crate::privacy::discrete::{release_count, release_steps};

fn privacy_err(e: crate::privacy::PrivacyError) -> TrainError {
    TrainError::Numerical(e.to_string())
}

/// Charges `eps` to every rating in `ratings` and a pure-DP event of `eps` to every user
/// who has one, for a mechanism in which each rating's influence is bounded as stated.
pub fn charge_every_rating(
    ratings: &Ratings,
    eps: f64,
    mechanism: MechanismRecord,
) -> ReleaseCharges {
    let mut users: Vec<bool> = vec![false; ratings.n_users];
    for &u in &ratings.users {
        users[u as usize] = true;
    }
    ReleaseCharges {
        mechanisms: vec![mechanism],
        ratings: (0..ratings.len() as u32)
            .map(|position| RatingCharge { position, eps })
            .collect(),
        users: users
            .iter()
            .enumerate()
            .filter(|(_, &has)| has)
            .map(|(u, _)| UserCharge {
                user: u as u32,
                event: PrivacyEvent::PureDp { eps, count: 1 },
            })
            .collect(),
    }
}

/// eps-DP global mean of `ratings` on `scale` (see the module docs). Returns the mean,
/// clamped to the scale (post-processing), and the charges.
pub fn dp_global_mean<R: Rng + ?Sized>(
    ratings: &Ratings,
    scale: RatingScale,
    eps: f64,
    rng: &mut R,
) -> Result<(f64, ReleaseCharges), TrainError> {
    if scale.step <= 0.0 {
        return Err(TrainError::Numerical(
            "a DP mean needs a rating scale with a step (ratings on a grid)".into(),
        ));
    }
    let width_steps = (scale.width() / scale.step).round() as u64;
    let mut sum: i64 = 0;
    for &v in &ratings.values {
        let k = ((v as f64 - scale.min) / scale.step).round();
        if !(0.0..=width_steps as f64).contains(&k) {
            return Err(TrainError::Numerical(format!(
                "rating {v} is off the scale [{}, {}]",
                scale.min, scale.max
            )));
        }
        sum += k as i64;
    }
    let (noisy_sum, _) =
        release_steps(sum, width_steps.max(1), eps / 2.0, rng).map_err(privacy_err)?;
    let noisy_count = release_count(ratings.len() as u64, eps / 2.0, rng).map_err(privacy_err)?;
    let mean = if noisy_count >= 1 {
        scale.clamp(scale.min + scale.step * noisy_sum as f64 / noisy_count as f64)
    } else {
        (scale.min + scale.max) / 2.0
    };
    let record = MechanismRecord {
        name: "dp-global-mean".into(),
        params: serde_json::json!({
            "eps": eps, "sampler": "discrete laplace (exact)",
            "sum_sensitivity_steps": width_steps, "count_sensitivity": 1,
        }),
        unit: PrivacyUnit::Rating,
        neighbour: Neighbour::AddRemove,
    };
    Ok((mean, charge_every_rating(ratings, eps, record)))
}

/// eps-DP item rating counts (noisy, clamped at 0 by post-processing) and the charges.
pub fn dp_item_counts<R: Rng + ?Sized>(
    ratings: &Ratings,
    eps: f64,
    rng: &mut R,
) -> Result<(Vec<f64>, ReleaseCharges), TrainError> {
    let mut counts = vec![0u64; ratings.n_items];
    for &i in &ratings.items {
        counts[i as usize] += 1;
    }
    let noisy = counts
        .iter()
        .map(|&c| release_count(c, eps, rng).map(|n| n.max(0) as f64))
        .collect::<Result<Vec<f64>, _>>()
        .map_err(privacy_err)?;
    let record = MechanismRecord {
        name: "dp-item-counts".into(),
        params: serde_json::json!({"eps": eps, "sampler": "discrete laplace (exact)", "sensitivity": 1}),
        unit: PrivacyUnit::Rating,
        neighbour: Neighbour::AddRemove,
    };
    Ok((noisy, charge_every_rating(ratings, eps, record)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Ratings {
        let mut r = Ratings::default();
        for k in 0..4000u32 {
            r.push(k % 50, k % 7, (1 + k % 5) as f32);
        }
        r
    }

    #[test]
    fn mean_is_close_and_noise_shrinks_with_eps() {
        let r = data();
        let truth = r.mean();
        let err = |eps: f64| {
            let mut rng = crate::rng::seeded(1);
            (0..200)
                .map(|_| {
                    (dp_global_mean(&r, RatingScale::ONE_TO_FIVE, eps, &mut rng)
                        .unwrap()
                        .0
                        - truth)
                        .abs()
                })
                .sum::<f64>()
                / 200.0
        };
        let (loose, tight) = (err(10.0), err(0.1));
        // Sum noise ~ 4 / (eps/2) steps over 4000 ratings: eps=0.1 gives ~0.02 mean error.
        assert!(loose < 0.002, "{loose}");
        assert!(tight > 5.0 * loose && tight < 0.1, "{tight} vs {loose}");
    }

    #[test]
    fn every_rating_and_user_is_charged_eps() {
        let r = data();
        let (_, c) = dp_global_mean(
            &r,
            RatingScale::ONE_TO_FIVE,
            0.2,
            &mut crate::rng::seeded(2),
        )
        .unwrap();
        assert_eq!(c.ratings.len(), r.len());
        assert!(c.ratings.iter().all(|x| x.eps == 0.2));
        assert_eq!(c.users.len(), 50);
        assert!(c
            .users
            .iter()
            .all(|u| u.event == PrivacyEvent::PureDp { eps: 0.2, count: 1 }));
        let (counts, c) = dp_item_counts(&r, 0.5, &mut crate::rng::seeded(3)).unwrap();
        assert_eq!(counts.len(), 7);
        assert!(
            counts.iter().all(|&n| (n - 4000.0 / 7.0).abs() < 60.0),
            "{counts:?}"
        );
        assert_eq!(
            c.rating_totals(r.len()).iter().sum::<f64>(),
            0.5 * r.len() as f64
        );
    }

    #[test]
    fn item_count_noise_has_the_calibrated_spread() {
        // 4000 items with 100 ratings each; discrete Laplace of scale 1/eps has variance
        // 2 e^{-eps} / (1 - e^{-eps})^2.
        let mut r = Ratings::default();
        for i in 0..4000u32 {
            for u in 0..100u32 {
                r.push(u, i, 3.0);
            }
        }
        let eps = 0.5f64;
        let (noisy, _) = dp_item_counts(&r, eps, &mut crate::rng::seeded(4)).unwrap();
        let var = noisy.iter().map(|c| (c - 100.0).powi(2)).sum::<f64>() / noisy.len() as f64;
        let q = (-eps).exp();
        let want = 2.0 * q / (1.0 - q).powi(2);
        // The sample variance of 4000 draws has relative sd ~ sqrt((kurtosis - 1)/n) ~ 0.04;
        // 0.16 is 4 sd (false-failure rate ~1e-4 for a random seed; the seed is fixed). A
        // 10% wrong scale moves the variance by ~21%, eps/2 by ~300%.
        assert!((var / want - 1.0).abs() < 0.16, "var {var} want {want}");
    }
}
