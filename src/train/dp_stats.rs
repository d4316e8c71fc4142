//! Directly released DP statistics of a rating set: the global mean and per-item counts.
//!
//! These numbers are published as they are (the mean enters every prediction, the counts
//! drive the popularity fallback and noise-aware shrinkage), so they use the exact integer
//! samplers of [`dprec_dp::privacy::discrete`], not floating-point noise (Mironov 2012).
//!
//! Claims, unit = one rating, neighbour = add/remove:
//! - global mean: the count (sensitivity 1) and the sum of `(r - r_min) / step` (sensitivity
//!   `(r_max - r_min) / step` grid steps) each get half of `eps`: eps-DP by basic composition;
//!   the ratio is post-processing;
//! - counts ([`noisy_counts`]): a histogram where one rating changes one count by 1, so discrete Laplace
//!   of scale `1/eps` on every count is eps-DP (parallel composition over items).
//!
//! Each rating used is charged `eps` per statistic; each user with a used rating gets a
//! `PureDp { eps }` event (the worst of their ratings), see [`charge_every_rating`].

use rand::Rng;

use super::TrainError;
use crate::data::{RatingScale, Ratings};
use dprec_dp::charges::{MechanismRecord, Neighbour, PrivacyUnit, RatingCharge, ReleaseCharges};
use dprec_dp::privacy::discrete::{release_count, release_steps};

/// Charges `eps` to every rating in `ratings` and a pure-DP event of `eps` to every user
/// who has one, for a mechanism in which each rating's influence is bounded as stated.
pub fn charge_every_rating(
    ratings: &Ratings,
    eps: f64,
    mechanism: MechanismRecord,
) -> ReleaseCharges {
    let charges = (0..ratings.len() as u32)
        .map(|position| RatingCharge { position, eps })
        .collect();
    ReleaseCharges::per_rating(mechanism, &ratings.users, ratings.n_users, charges)
}

/// The noise of every DP mean in this crate (the global mean here, step B of PDP-PMF):
/// `values` (already on `scale`) as grid steps `round((v - min) / grid)` in
/// `[0, width_steps]`; discrete Laplace on the step sum (add/remove sensitivity
/// `width_steps`) and on the count (sensitivity 1), `eps/2` each, so eps-DP by basic
/// composition. The ratio, clamped to the scale (the midpoint if the noisy count is < 1),
/// is post-processing. The caller charges `eps` to every value it passed.
pub fn dp_mean_on_grid<R: Rng + ?Sized>(
    values: impl IntoIterator<Item = f64>,
    scale: RatingScale,
    grid: f64,
    eps: f64,
    rng: &mut R,
) -> Result<f64, TrainError> {
    let width_steps = (scale.width() / grid).round() as u64;
    let mut sum: i64 = 0;
    let mut count: u64 = 0;
    for v in values {
        sum += ((scale.clamp(v) - scale.min) / grid).round() as i64;
        count += 1;
    }
    let (noisy_sum, _) = release_steps(sum, width_steps.max(1), eps / 2.0, rng)?;
    let noisy_count = release_count(count, eps / 2.0, rng)?;
    Ok(if noisy_count >= 1 {
        scale.clamp(scale.min + grid * noisy_sum as f64 / noisy_count as f64)
    } else {
        (scale.min + scale.max) / 2.0
    })
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
    if let Some(v) = ratings.values.iter().find(|&&v| {
        let k = ((v as f64 - scale.min) / scale.step).round();
        !(0.0..=(scale.width() / scale.step).round()).contains(&k)
    }) {
        return Err(TrainError::Numerical(format!(
            "rating {v} is off the scale [{}, {}]",
            scale.min, scale.max
        )));
    }
    let values = ratings.values.iter().map(|&v| v as f64);
    let mean = dp_mean_on_grid(values, scale, scale.step, eps, rng)?;
    let record = MechanismRecord {
        name: "dp-global-mean".into(),
        params: serde_json::json!({
            "eps": eps, "sampler": "discrete laplace (exact)",
            "sum_sensitivity_steps": (scale.width() / scale.step).round() as u64,
            "count_sensitivity": 1,
        }),
        unit: PrivacyUnit::Rating,
        neighbour: Neighbour::AddRemove,
    };
    Ok((mean, charge_every_rating(ratings, eps, record)))
}

/// eps-DP counts of a histogram in which one rating adds 1 to one count (add/remove
/// sensitivity 1): exact discrete Laplace of scale `1/eps` on every count (parallel
/// composition). Noisy counts may be negative; clamping is post-processing.
fn noisy_counts<R: Rng + ?Sized>(
    counts: &[u64],
    eps: f64,
    rng: &mut R,
) -> Result<Vec<i64>, dprec_dp::privacy::PrivacyError> {
    counts.iter().map(|&c| release_count(c, eps, rng)).collect()
}

/// The service's DP popularity release with its charges: one count per catalogue item
/// (`n_items`) of the ratings with `counted[k]`, made eps-DP by [`noisy_counts`]; every
/// counted rating is charged `eps` and each user with a counted rating one `PureDp { eps }`
/// (each rating is in exactly one count). Docs: docs/privacy/mechanisms.md.
pub fn dp_popularity<R: Rng + ?Sized>(
    ratings: &Ratings,
    n_items: usize,
    counted: &[bool],
    eps: f64,
    rng: &mut R,
) -> Result<(Vec<i64>, ReleaseCharges), TrainError> {
    let mut counts = vec![0u64; n_items];
    let mut charges = Vec::new();
    for (k, _) in counted.iter().enumerate().filter(|(_, &c)| c) {
        counts[ratings.items[k] as usize] += 1;
        charges.push(RatingCharge {
            position: k as u32,
            eps,
        });
    }
    let noisy = noisy_counts(&counts, eps, rng)?;
    let record = MechanismRecord {
        name: "popularity-discrete-laplace".into(),
        params: serde_json::json!({"eps": eps, "sensitivity": 1,
            "selection": "ratings whose release share >= 2 * eps"}),
        unit: PrivacyUnit::Rating,
        neighbour: Neighbour::AddRemove,
    };
    let charges = ReleaseCharges::per_rating(record, &ratings.users, ratings.n_users, charges);
    Ok((noisy, charges))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dprec_dp::accountant::PrivacyEvent;

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
            let mut rng = dprec_dp::rng::seeded(1);
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
            &mut dprec_dp::rng::seeded(2),
        )
        .unwrap();
        assert_eq!(c.ratings.len(), r.len());
        assert!(c.ratings.iter().all(|x| x.eps == 0.2));
        assert_eq!(c.users.len(), 50);
        assert!(c
            .users
            .iter()
            .all(|u| u.event == PrivacyEvent::PureDp { eps: 0.2, count: 1 }));
    }

    /// The popularity release pays for exactly what it counts: each counted rating `eps`,
    /// each user with a counted rating one `PureDp { eps }`, nobody else; the noisy counts
    /// are per catalogue item (also items nobody rated).
    #[test]
    fn popularity_charges_exactly_the_counted_ratings() {
        let mut r = Ratings::with_dims(3, 4);
        r.push(0, 0, 4.0);
        r.push(0, 1, 3.0);
        r.push(1, 1, 5.0);
        r.push(2, 2, 1.0);
        let counted = [true, true, false, false];
        let (noisy, c) =
            dp_popularity(&r, 4, &counted, 0.3, &mut dprec_dp::rng::seeded(5)).unwrap();
        assert_eq!(noisy.len(), 4);
        assert_eq!(
            c.ratings,
            vec![
                RatingCharge {
                    position: 0,
                    eps: 0.3
                },
                RatingCharge {
                    position: 1,
                    eps: 0.3
                }
            ]
        );
        assert_eq!(c.users.len(), 1);
        assert_eq!(c.users[0].user, 0);
        assert_eq!(
            c.users[0].event,
            PrivacyEvent::PureDp { eps: 0.3, count: 1 }
        );
        assert_eq!(c.mechanisms[0].name, "popularity-discrete-laplace");
        assert_eq!(c.mechanisms[0].unit, PrivacyUnit::Rating);
    }

    #[test]
    fn count_noise_has_the_calibrated_spread() {
        // 4000 counts of 100; discrete Laplace of scale 1/eps has variance
        // 2 e^{-eps} / (1 - e^{-eps})^2.
        let eps = 0.5f64;
        let noisy = noisy_counts(&[100; 4000], eps, &mut dprec_dp::rng::seeded(4)).unwrap();
        let var = noisy
            .iter()
            .map(|&c| (c as f64 - 100.0).powi(2))
            .sum::<f64>()
            / 4000.0;
        let q = (-eps).exp();
        let want = 2.0 * q / (1.0 - q).powi(2);
        // The sample variance of 4000 draws has relative sd ~ sqrt((kurtosis - 1)/n) ~ 0.04;
        // 0.16 is 4 sd (false-failure rate ~1e-4 for a random seed; the seed is fixed). A
        // 10% wrong scale moves the variance by ~21%, eps/2 by ~300%.
        assert!((var / want - 1.0).abs() < 0.16, "var {var} want {want}");
    }

    /// The DP mean's error has the variance its two releases imply: in grid steps,
    /// mean = (S + a) / (n + b) ~ S/n + (a - m b)/n with a, b discrete Laplace of scales
    /// width_steps/(eps/2) and 1/(eps/2), so Var = (Var a + m^2 Var b) / n^2. A wrong
    /// split of eps (or a wrong sensitivity) fails this; so does a 10% wrong scale.
    #[test]
    fn mean_noise_has_the_calibrated_spread() {
        let mut r = Ratings::default();
        for k in 0..1000u32 {
            r.push(k % 20, k % 7, (1 + k % 5) as f32);
        }
        let (eps, n) = (0.4f64, 1000.0);
        let m = r.mean() - 1.0; // mean in grid steps (step 1, min 1)
        let dl_var = |t: f64| {
            let q = (-1.0 / t).exp();
            2.0 * q / (1.0 - q).powi(2)
        };
        let want = (dl_var(4.0 / (eps / 2.0)) + m * m * dl_var(1.0 / (eps / 2.0))) / (n * n);
        let mut rng = dprec_dp::rng::seeded(9);
        let reps = 8000;
        let var = (0..reps)
            .map(|_| {
                let (mean, _) =
                    dp_global_mean(&r, RatingScale::ONE_TO_FIVE, eps, &mut rng).unwrap();
                (mean - r.mean()).powi(2)
            })
            .sum::<f64>()
            / reps as f64;
        // Relative sd of this variance estimate ~ sqrt(5/8000) = 0.025 (Laplace-like
        // kurtosis 6); 0.12 is ~5 sd (false failure < 1e-6 for a random seed; the seed is
        // fixed). The linearisation error is O(1/n), far below that.
        assert!((var / want - 1.0).abs() < 0.12, "var {var} want {want}");
    }
}
