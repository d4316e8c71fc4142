//! Privacy mechanisms: pure noise samplers and sampling primitives (no I/O).
//!
//! Every sampler takes `rng: &mut R` with `R: rand::Rng + ?Sized`: tests pass a seeded
//! [`crate::rng::DpRng`], production passes one keyed from the OS ([`crate::rng::from_os`]).
//! Every parameter is validated and a bad one yields a [`PrivacyError`] naming it; no
//! function here panics on bad input.
//!
//! # Which sampler is used where, and why
//!
//! | need | sampler | why |
//! | --- | --- | --- |
//! | noise inside training whose output is only released after further processing (gradients, SGLD steps) | [`continuous::laplace`], [`continuous::gaussian`] | fast floating-point samplers; the released object is a trained model, not `x + noise` for a single query, so Mironov's low-bit attack on a directly published noisy value does not apply |
//! | objective perturbation of an item's ridge problem (PDP-PMF, DESIGN 2.1) | [`continuous::objective_perturbation`] | density `exp(-eps ||eta|| / Delta)`: norm `Gamma(d, Delta/eps)`, uniform direction |
//! | client-side perturbation of a rating in `[l, u]` (BLP-MoG-MF) | [`mod@bounded_laplace`] | output must stay in the rating range; scale calibrated from the exact worst-case density ratio |
//! | user-level LDP gradient report (Private-GD) | [`local::one_bit_report`] | two-point output, unbiased |
//! | LDP item-indicator perturbation (Private-GD section 4.1) | [`local::randomized_response`] | Warner-style randomized response, unbiased estimator [`local::rr_unbiased_estimate`] |
//! | choosing which ratings enter a release under personalised budgets (PDP-PMF, DESIGN 2.6) | [`sampling`] | Jorgensen-Yu-Cormode sampling mechanism |
//! | a running sum released at every period of a public horizon (continual release) | [`tree`] ([`tree::TreeCounter`], [`tree::ArrivalCap`]) | binary-tree aggregation: the stream of `T` releases composes `levels(T) = floor(log2 T) + 1` Gaussian mechanisms instead of `T`, when each user's increments are nonnegative with a lifetime L2 bound |
//! | anything RELEASED DIRECTLY as a number (DP popularity counts, `dp-topn`'s counts, DP sums for a global mean) | [`discrete`] ([`discrete::release_steps`], [`discrete::release_count`], [`discrete::release_on_grid`], [`discrete::discrete_gaussian`]) | exact integer samplers (Canonne-Kamath-Steinke 2020): the output is an integer, every probability is realised with integer arithmetic on uniform integer draws, so there are no floating-point holes (Mironov 2012) |
//!
//! The ratings' privacy preferences `eps_ij` are public metadata (DESIGN 2.7): the
//! sampling probabilities and thresholds are computed from them in the clear.
//!
//! The claims, units, neighbour relations and the tests that guard each scale are listed
//! in `docs/privacy/mechanisms.md`.

pub mod bounded_laplace;
pub mod continuous;
pub mod discrete;
pub mod local;
pub mod sampling;
pub mod tree;

pub mod stats;

pub use bounded_laplace::{
    bounded_laplace, bounded_laplace_cdf, bounded_laplace_density, bounded_laplace_epsilon,
    bounded_laplace_normaliser, calibrate_bounded_laplace, BoundedLaplace,
};
pub use continuous::{gaussian, laplace, objective_perturbation};
pub use discrete::{
    bernoulli_exp, discrete_gaussian, discrete_laplace, release_count, release_on_grid,
    release_steps, GridRelease, Rational,
};
pub use local::{
    one_bit_bound, one_bit_probability, one_bit_report, randomized_response, rr_flip_probability,
    rr_output_probability, rr_unbiased_estimate,
};
pub use sampling::{
    amplify_pure, sample_in, sampled_epsilon, sampling_charge, sampling_probability, Threshold,
};

use thiserror::Error;

/// Errors of the privacy primitives: always names the offending parameter.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum PrivacyError {
    /// A parameter is outside its valid domain (NaN, infinite, non-positive, out of range).
    #[error("invalid parameter `{name}` = {value}: {reason}")]
    InvalidParameter {
        /// Name of the parameter as in the function signature.
        name: &'static str,
        /// The rejected value, formatted.
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A numerical procedure (e.g. the bounded Laplace calibration) did not converge.
    #[error("numerical failure in {what}: {reason}")]
    Numerical {
        /// The procedure that failed.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
}

/// Result alias for this module.
pub type Result<T> = std::result::Result<T, PrivacyError>;

pub(crate) fn invalid<T: std::fmt::Display>(
    name: &'static str,
    value: T,
    reason: &'static str,
) -> PrivacyError {
    PrivacyError::InvalidParameter {
        name,
        value: value.to_string(),
        reason,
    }
}

/// Rejects NaN, infinities and values `<= 0` (used for eps, scales, sensitivities).
pub(crate) fn check_positive(name: &'static str, v: f64) -> Result<f64> {
    if !v.is_finite() {
        return Err(invalid(name, v, "must be finite"));
    }
    if v <= 0.0 {
        return Err(invalid(name, v, "must be > 0"));
    }
    Ok(v)
}

/// Rejects NaN and infinities.
pub(crate) fn check_finite(name: &'static str, v: f64) -> Result<f64> {
    if !v.is_finite() {
        return Err(invalid(name, v, "must be finite"));
    }
    Ok(v)
}

/// Rejects anything outside `[0, 1]` (probabilities, sampling rates).
pub(crate) fn check_probability(name: &'static str, v: f64) -> Result<f64> {
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid(name, v, "must be a probability in [0, 1]"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_parameter_and_rejects_nan_inf_nonpositive() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -1.0] {
            let err = check_positive("eps", bad).unwrap_err();
            assert!(err.to_string().contains("`eps`"), "{err}");
        }
        assert!(check_probability("q", 1.5).is_err());
        assert!(check_probability("q", f64::NAN).is_err());
        assert_eq!(check_probability("q", 1.0), Ok(1.0));
    }
}
