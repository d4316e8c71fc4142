//! Rating-level privacy: the multipliers of one rating's participation, its RSM rate and
//! the Gaussian stages each step records.

use super::*;

/// Rating-level (add/remove one rating) Gaussian multiplier of the count + Gram release
/// at full participation. Removing a kept rating changes the user's capped binary row by
/// at most `sqrt 2` in L2 (the rating leaves and, when the user was over the cap, one
/// other rating takes its place); clipping (projection on a ball) is 1-Lipschitz, so the
/// count row moves by `<= min(sqrt 2, 2 count_clip)` and the Gram term
/// `x x^T - x' x'^T` by `<= min(sqrt 2 gram_clip^2, 2 sqrt 2 gram_clip)` in Frobenius
/// norm (`sqrt(|x|^4 + |x'|^4)`, resp. `(|x| + |x'|) |x - x'|`). The two Gaussian
/// releases compose to one Gaussian whose multiplier is returned.
pub fn rating_multiplier(z_c: f64, z_g: f64, c: &Contribution) -> f64 {
    let zc_r = z_c * c.count_clip / count_rating_sensitivity(c);
    let zg_r = z_g * c.gram_clip * c.gram_clip / gram_rating_sensitivity(c);
    compose_multipliers([zc_r, zg_r])
}

/// L2 change of a user's clipped count row when one rating is added or removed.
pub(super) fn count_rating_sensitivity(c: &Contribution) -> f64 {
    std::f64::consts::SQRT_2.min(2.0 * c.count_clip)
}

/// Frobenius change of a user's Gram term when one rating is added or removed.
pub(super) fn gram_rating_sensitivity(c: &Contribution) -> f64 {
    let s2 = std::f64::consts::SQRT_2;
    (s2 * c.gram_clip * c.gram_clip).min(2.0 * s2 * c.gram_clip)
}

/// The count stage (and a second count release): noise sd `sigma`; a user's clipped row
/// moves the counts by `count_clip`, a rating by [`count_rating_sensitivity`].
pub(super) fn count_stage(name: &'static str, sigma: f64, c: &Contribution) -> GaussianStage {
    GaussianStage {
        name,
        sigma,
        user_sensitivity: c.count_clip,
        rating_sensitivity: count_rating_sensitivity(c),
    }
}

/// The Gram stage: a user's term `x x^T` with `||x|| <= gram_clip` moves it by
/// `gram_clip^2` (Frobenius), a rating by [`gram_rating_sensitivity`].
pub(super) fn gram_stage(sigma: f64, c: &Contribution) -> GaussianStage {
    GaussianStage {
        name: "gram",
        sigma,
        user_sensitivity: c.gram_clip * c.gram_clip,
        rating_sensitivity: gram_rating_sensitivity(c),
    }
}

/// The trace stage: a user's `||x||^2` is at most `gram_clip^2`; a rating moves it by at
/// most `min(1, gram_clip^2)` (one entry of a binary row, clipped).
pub(super) fn trace_stage(sigma: f64, c: &Contribution) -> GaussianStage {
    let g2 = c.gram_clip * c.gram_clip;
    GaussianStage {
        name: "trace",
        sigma,
        user_sensitivity: g2,
        rating_sensitivity: g2.min(1.0),
    }
}

/// The selection statistic: a user's leave-one-out value is in `{-1, 0, 1}` (sensitivity
/// 1), a rating moves it by at most 2 (docs/privacy/dp-topn-releases.md, "Rating level").
pub(super) fn select_stage(sigma: f64) -> GaussianStage {
    GaussianStage {
        name: "select",
        sigma,
        user_sensitivity: 1.0,
        rating_sensitivity: 2.0,
    }
}

/// The rating-level loss `1 / z_r^2`, in units of `1 / z^2`, of one unit of user-level
/// share given to the counts and to the rest (the larger of its Gram and count
/// branches): `(sensitivity / clip)^2` of each.
pub(super) fn rating_losses_per_share(c: &Contribution) -> (f64, f64) {
    let g2 = c.gram_clip * c.gram_clip;
    let count = (count_rating_sensitivity(c) / c.count_clip).powi(2);
    let gram = (gram_rating_sensitivity(c) / g2).powi(2);
    (count, gram.max(count))
}

/// Rating-level multiplier of a release that tests the Gram's trace (a selecting release
/// without a state, [`Split::TRACE_TAU`]): the counts at
/// `z_c`, the Gram trace at `z_t` (a rating moves `||x_u||^2` by at most
/// `min(1, gram_clip^2)`) and, at `z_rest`, whichever of the Gram or a second count
/// release the trace picks, taken at the larger of the two rating-level losses.
pub fn traced_rating_multiplier(z_c: f64, z_t: f64, z_rest: f64, c: &Contribution) -> f64 {
    let g2 = c.gram_clip * c.gram_clip;
    steered_rating_multiplier(z_c, z_t * g2 / g2.min(1.0), z_rest, c)
}

/// Rating-level multiplier of a selecting release ([`Split::Select`]): the counts at
/// `z_c`, the leave-one-out difference at `z_s` (one rating moves it by at most 2,
/// docs/privacy/dp-topn.md 2b) and, at `z_rest`, the Gram or the second count release
/// taken at the larger of the two rating-level losses (the rule picks one per release).
pub fn select_rating_multiplier(z_c: f64, z_s: f64, z_rest: f64, c: &Contribution) -> f64 {
    steered_rating_multiplier(z_c, z_s / 2.0, z_rest, c)
}

/// The counts at `z_c`, a steering statistic at rating-level multiplier `steer_r`, and the
/// rest at `z_rest` taken at the larger rating-level loss of its two branches (Gram or
/// second counts), composed.
pub(super) fn steered_rating_multiplier(
    z_c: f64,
    steer_r: f64,
    z_rest: f64,
    c: &Contribution,
) -> f64 {
    let g2 = c.gram_clip * c.gram_clip;
    let zc_r = z_c * c.count_clip / count_rating_sensitivity(c);
    let rest_r = (z_rest * g2 / gram_rating_sensitivity(c))
        .min(z_rest * c.count_clip / count_rating_sensitivity(c));
    compose_multipliers([zc_r, steer_r, rest_r])
}

/// eps at `delta_r` of one rating's participation at RSM rate `q` in a release whose
/// rating-level multiplier is `z_r` (Poisson-subsampled Gaussian, accountant).
pub fn rating_eps(q: f64, z_r: f64, delta_r: f64) -> Result<f64, TrainError> {
    if q <= 0.0 {
        return Ok(0.0);
    }
    let event = if q >= 1.0 {
        PrivacyEvent::gaussian(z_r, 1)
    } else {
        PrivacyEvent::poisson_subsampled_gaussian(q, z_r, 1)
    }
    .map_err(numerical)?;
    dprec_dp::ledger::release_eps(&[event], delta_r).map_err(numerical)
}

/// The RSM rate of a rating with release budget `budget` (eps at `delta_r`): 1 when full
/// participation fits, else the largest `q` (bisection, 40 halvings) whose cost fits.
/// Returns `(q, charged eps)`, with `charged <= budget`.
pub fn rsm_rate(budget: f64, z_r: f64, delta_r: f64) -> Result<(f64, f64), TrainError> {
    if budget.is_nan() || budget <= 0.0 {
        return Ok((0.0, 0.0));
    }
    let full = rating_eps(1.0, z_r, delta_r)?;
    if full <= budget {
        return Ok((1.0, full));
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..40 {
        let mid = 0.5 * (lo + hi);
        if rating_eps(mid, z_r, delta_r)? <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if lo <= 0.0 {
        return Ok((0.0, 0.0));
    }
    Ok((lo, rating_eps(lo, z_r, delta_r)?))
}
