//! A release as the Gaussian statistics it ran, each with its noise scale and its
//! sensitivities side by side (the shape of OpenDP's `Measurement { function,
//! privacy_map }`): the release's charge is composed from the stages that ran and checked
//! against what the ledger charges, before anything is published.
//!
//! Gaussian mechanisms of multipliers `z_i` (noise sd over L2 sensitivity) compose, for
//! the same neighbour, to one Gaussian of multiplier `(sum_i z_i^-2)^-1/2` (Mironov 2017,
//! Proposition 1, at every Renyi order; adaptive choices between stages compose the same
//! way). A user-level charge of `Gaussian { z, 1 }` is honest when the user-level
//! multipliers of the stages compose to `z`; a rating's charge, computed for a
//! rating-level multiplier `z_r`, when the rating-level multipliers compose to at least
//! `z_r` (a release that may take either of two branches is charged the worse one).

use serde::Serialize;

/// One Gaussian statistic of a release: its noise sd and the L2 distance by which one
/// user's data, and one rating, can move it (its privacy map at each unit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GaussianStage {
    /// What the statistic is (`counts`, `gram`, ...).
    pub name: &'static str,
    /// The noise standard deviation actually drawn.
    pub sigma: f64,
    /// How far adding or removing one user's data moves the statistic (L2).
    pub user_sensitivity: f64,
    /// How far adding or removing one rating moves it (L2).
    pub rating_sensitivity: f64,
}

impl GaussianStage {
    /// The user-level noise multiplier `sigma / user_sensitivity`.
    pub fn user_multiplier(&self) -> f64 {
        self.sigma / self.user_sensitivity
    }

    /// The rating-level noise multiplier `sigma / rating_sensitivity`.
    pub fn rating_multiplier(&self) -> f64 {
        self.sigma / self.rating_sensitivity
    }
}

/// Multipliers composed: `(sum_i z_i^-2)^-1/2`; an infinite `z_i` drops out, no stage
/// at all is an infinite multiplier (nothing was released).
pub fn compose_multipliers(z: impl IntoIterator<Item = f64>) -> f64 {
    // A fold from +0 (a float `sum` of nothing is -0, whose inverse is -inf).
    1.0 / z.into_iter().fold(0.0, |a, z| a + 1.0 / (z * z)).sqrt()
}

/// What the check found wrong: the release must not be published.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StageError {
    #[error(
        "the stages that ran compose to user-level multiplier {actual}, the ledger charges \
         Gaussian {{ z: {planned} }}"
    )]
    UserLevel { actual: f64, planned: f64 },
    #[error(
        "the stages that ran compose to rating-level multiplier {actual}, below the {charged} \
         the ratings are charged for"
    )]
    RatingLevel { actual: f64, charged: f64 },
    #[error("stage {0} has a noise scale or sensitivity that is not a positive number")]
    Invalid(&'static str),
}

/// Relative tolerance of the user-level equality (floating rounding of the shares).
const RELATIVE_TOLERANCE: f64 = 1e-9;

/// Checks that what ran is what is charged: at user level the stages compose to the
/// planned multiplier `planned_user` (equal up to rounding: less noise would overspend,
/// more would waste the budget the user gave), at rating level to at least
/// `charged_rating`. Returns the composed `(user, rating)` multipliers.
pub fn check_release(
    stages: &[GaussianStage],
    planned_user: f64,
    charged_rating: f64,
) -> Result<(f64, f64), StageError> {
    for s in stages {
        let valid = |x: f64| x > 0.0 && !x.is_nan();
        if !(valid(s.sigma) && valid(s.user_sensitivity) && valid(s.rating_sensitivity)) {
            return Err(StageError::Invalid(s.name));
        }
    }
    let user = compose_multipliers(stages.iter().map(GaussianStage::user_multiplier));
    let rating = compose_multipliers(stages.iter().map(GaussianStage::rating_multiplier));
    if (user / planned_user - 1.0).abs() > RELATIVE_TOLERANCE || user.is_nan() {
        return Err(StageError::UserLevel {
            actual: user,
            planned: planned_user,
        });
    }
    if rating < charged_rating * (1.0 - RELATIVE_TOLERANCE) || rating.is_nan() {
        return Err(StageError::RatingLevel {
            actual: rating,
            charged: charged_rating,
        });
    }
    Ok((user, rating))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &'static str, sigma: f64, user: f64, rating: f64) -> GaussianStage {
        GaussianStage {
            name,
            sigma,
            user_sensitivity: user,
            rating_sensitivity: rating,
        }
    }

    /// Two stages at shares 0.25 and 0.75 of a release of multiplier 2 compose to 2; the
    /// same stages with one noise scale 0.9x or 1.1x do not.
    #[test]
    fn shares_of_a_plan_compose_to_the_plan() {
        let z = 2.0f64;
        let (c, g) = (z / 0.25f64.sqrt(), z / 0.75f64.sqrt());
        let ok = [
            stage("counts", c * 4.0, 4.0, 2f64.sqrt()),
            stage("gram", g, 1.0, 1.0),
        ];
        let (user, rating) = check_release(&ok, z, 0.0).unwrap();
        assert!((user - z).abs() < 1e-12);
        let by_hand = 1.0 / ((2.0 / (c * c * 16.0)) + 1.0 / (g * g)).sqrt();
        assert!((rating - by_hand).abs() < 1e-12);
        for scale in [0.9, 1.1] {
            let mut wrong = ok;
            wrong[1].sigma *= scale;
            assert!(matches!(
                check_release(&wrong, z, 0.0),
                Err(StageError::UserLevel { .. })
            ));
        }
        // A stage missing from the record is noise the charge does not cover, or budget
        // spent on nothing.
        assert!(check_release(&ok[..1], z, 0.0).is_err());
    }

    /// The rating level must reach at least the multiplier the ratings were charged for.
    #[test]
    fn rating_level_below_its_charge_is_refused() {
        let s = [stage("counts", 2.0, 1.0, 1.0)];
        assert!(check_release(&s, 2.0, 2.0).is_ok());
        assert!(check_release(&s, 2.0, 1.9).is_ok());
        assert!(matches!(
            check_release(&s, 2.0, 2.1),
            Err(StageError::RatingLevel { .. })
        ));
        let bad = [stage("counts", 2.0, 0.0, 1.0)];
        assert_eq!(
            check_release(&bad, 2.0, 1.0),
            Err(StageError::Invalid("counts"))
        );
    }

    #[test]
    fn infinite_multipliers_drop_out() {
        assert_eq!(compose_multipliers([2.0, f64::INFINITY]), 2.0);
        assert!((compose_multipliers([3.0, 4.0]) - 12.0 / 5.0).abs() < 1e-12);
        assert_eq!(compose_multipliers([]), f64::INFINITY);
    }
}
