//! Client-side local differential privacy for ratings (BLP-MoG-MF, Neera et al.).
//!
//! A client that does not trust the curator perturbs each rating on its own device with
//! the bounded Laplace mechanism ([`dprec_dp::privacy::bounded_laplace`]) and sends only the
//! perturbed value together with the mechanism parameters it used: a [`PerturbedRating`].
//! The JSON form is exactly one element of the `POST /v1/ratings` batch body, so a file of
//! them (or a `{"ratings": [...]}` body) can be posted as is:
//!
//! ```json
//! {"user": "u1", "item": "i42", "rating": 3.7183,
//!  "ldp": {"mechanism": "bounded-laplace", "eps": 1.0, "lower": 1.0, "upper": 5.0, "scale": 4.0}}
//! ```
//!
//! - `rating`: the perturbed value, a real number in `[lower, upper]` (not on the step grid);
//! - `ldp.mechanism`: `bounded-laplace` (the only local mechanism for ratings);
//! - `ldp.eps`: the local privacy loss of this value;
//! - `ldp.lower`, `ldp.upper`: the input and output domain, the service's rating scale;
//! - `ldp.scale`: the Laplace scale `b` used, `(upper - lower)/eps`.
//!
//! Claim (docs/privacy/blp-ldp.md): unit one rating VALUE, neighbour relation replacement
//! (any value in `[lower, upper]` replaced by any other), eps-LDP. The sensitivity is the
//! full width `upper - lower`, for which the bounded Laplace normaliser cancels in the
//! worst-case density ratio and `b = width/eps` is exactly eps-DP (Holohan et al. 2018;
//! the calibration of [`dprec_dp::privacy::calibrate_bounded_laplace`] returns it). The
//! user and item ids and the fact that a rating exists are NOT hidden from the curator.
//!
//! Everything here is pure (no I/O); randomness comes from the caller's generator
//! (production: [`dprec_dp::rng::from_os`]).

use rand::Rng;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::data::RatingScale;
use dprec_dp::privacy::{bounded_laplace, calibrate_bounded_laplace, PrivacyError};

/// The local mechanisms a client may claim to have run on a rating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LdpMechanism {
    /// Bounded Laplace on `[lower, upper]` with sensitivity `upper - lower`.
    BoundedLaplace,
}

impl LdpMechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            LdpMechanism::BoundedLaplace => "bounded-laplace",
        }
    }
}

/// The mechanism parameters a client claims for one perturbed rating.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"mechanism": "bounded-laplace", "eps": 1.0, "lower": 1.0, "upper": 5.0, "scale": 4.0}))]
pub struct LdpClaim {
    pub mechanism: LdpMechanism,
    /// Local privacy loss of the value (eps-LDP, replacement of the value).
    pub eps: f64,
    /// Lower end of the input and output domain (the service's rating minimum).
    pub lower: f64,
    /// Upper end of the input and output domain (the service's rating maximum).
    pub upper: f64,
    /// Laplace scale b = (upper - lower) / eps.
    pub scale: f64,
}

/// Why a claim is inconsistent: the offending field (relative to the claim, e.g.
/// `ldp.eps` or `rating`) and a message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ClaimError {
    pub field: &'static str,
    pub message: String,
}

fn claim_err(field: &'static str, message: String) -> ClaimError {
    ClaimError { field, message }
}

/// Relative tolerance on the claimed scale (client and server compute `width/eps` in
/// floating point; anything further off is a different mechanism).
pub const SCALE_TOLERANCE: f64 = 1e-9;

impl LdpClaim {
    /// The claim of the bounded Laplace mechanism with local `eps` on `scale`'s range.
    pub fn bounded_laplace(eps: f64, scale: RatingScale) -> Result<Self, PrivacyError> {
        let width = scale.width();
        let b = calibrate_bounded_laplace(scale.min, scale.max, width, eps)?;
        Ok(Self {
            mechanism: LdpMechanism::BoundedLaplace,
            eps,
            lower: scale.min,
            upper: scale.max,
            scale: b,
        })
    }

    /// Checks the claim against the service's rating scale and eps limit, and the
    /// perturbed `value` against the claimed bounds. Every float must be finite; the
    /// bounds must equal the scale's; `0 < eps <= max_eps`; the scale must be the
    /// calibrated one for `eps`; the value must lie in `[lower, upper]`.
    pub fn validate(&self, value: f64, scale: RatingScale, max_eps: f64) -> Result<(), ClaimError> {
        let LdpMechanism::BoundedLaplace = self.mechanism;
        for (field, v) in [
            ("ldp.eps", self.eps),
            ("ldp.lower", self.lower),
            ("ldp.upper", self.upper),
            ("ldp.scale", self.scale),
            ("rating", value),
        ] {
            if !v.is_finite() {
                return Err(claim_err(
                    field,
                    format!("must be a finite number, got {v}"),
                ));
            }
        }
        if self.lower != scale.min {
            return Err(claim_err(
                "ldp.lower",
                format!(
                    "must equal the service's rating minimum {}, got {}",
                    scale.min, self.lower
                ),
            ));
        }
        if self.upper != scale.max {
            return Err(claim_err(
                "ldp.upper",
                format!(
                    "must equal the service's rating maximum {}, got {}",
                    scale.max, self.upper
                ),
            ));
        }
        if !(self.eps > 0.0 && self.eps <= max_eps) {
            return Err(claim_err(
                "ldp.eps",
                format!("eps must be > 0 and <= {max_eps}, got {}", self.eps),
            ));
        }
        let expected = calibrate_bounded_laplace(self.lower, self.upper, scale.width(), self.eps)
            .map_err(|e| claim_err("ldp.eps", e.to_string()))?;
        if (self.scale - expected).abs() > SCALE_TOLERANCE * expected {
            return Err(claim_err(
                "ldp.scale",
                format!(
                    "bounded Laplace with eps {} on [{}, {}] has scale {expected}, got {}",
                    self.eps, self.lower, self.upper, self.scale
                ),
            ));
        }
        if value < self.lower || value > self.upper {
            return Err(claim_err(
                "rating",
                format!(
                    "a perturbed rating must lie in [{}, {}], got {value}",
                    self.lower, self.upper
                ),
            ));
        }
        Ok(())
    }
}

/// Width of the grid a perturbed value is snapped to before it leaves the client.
///
/// The perturbed value is published directly, so the low bits of a floating-point sample
/// could tell inputs apart (Mironov 2012: the set of doubles reachable from `x + noise`
/// depends on `x`). Snapping to cells of width `2^-10` is post-processing of the ideal
/// mechanism (the cell probabilities of the ideal bounded Laplace keep every ratio within
/// `e^eps`), and each cell collects so many of the sampler's `2^-53` uniform atoms that
/// the implemented cell probabilities match the ideal ones to a relative error of order
/// `1e-8` at eps <= 10 (cell mass >= 2^-10 * e^-eps / (2 * width)). That last step is an
/// argument about floating point, not a proof: see docs/privacy/blp-ldp.md.
pub const OUTPUT_GRID: f64 = 1.0 / 1024.0;

/// `lower + round((y - lower)/grid) * grid`, kept inside `[lower, upper]`.
fn snap(y: f64, lower: f64, upper: f64) -> f64 {
    (lower + ((y - lower) / OUTPUT_GRID).round() * OUTPUT_GRID).clamp(lower, upper)
}

/// One rating as a client sends it after local perturbation (an element of the
/// `POST /v1/ratings` batch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerturbedRating {
    pub user: String,
    pub item: String,
    /// The perturbed value.
    pub rating: f64,
    pub ldp: LdpClaim,
}

/// A client-side perturber: the calibrated bounded Laplace mechanism for one local eps on
/// one rating scale.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatingPerturber {
    claim: LdpClaim,
}

impl RatingPerturber {
    /// Calibrates the mechanism (fails on a non-positive or non-finite eps).
    pub fn new(eps: f64, scale: RatingScale) -> Result<Self, PrivacyError> {
        Ok(Self {
            claim: LdpClaim::bounded_laplace(eps, scale)?,
        })
    }

    pub fn claim(&self) -> LdpClaim {
        self.claim
    }

    /// Perturbs one rating value (which must lie on the scale) and snaps the result to
    /// the output grid `lower + k * OUTPUT_GRID` (see [`OUTPUT_GRID`]).
    pub fn perturb_value<R: Rng + ?Sized>(
        &self,
        value: f64,
        rng: &mut R,
    ) -> Result<f64, PrivacyError> {
        let c = &self.claim;
        let y = bounded_laplace(value, c.scale, c.lower, c.upper, rng)?;
        Ok(snap(y, c.lower, c.upper))
    }

    /// Perturbs one rating into its JSON form.
    pub fn perturb<R: Rng + ?Sized>(
        &self,
        user: &str,
        item: &str,
        value: f64,
        rng: &mut R,
    ) -> Result<PerturbedRating, PrivacyError> {
        Ok(PerturbedRating {
            user: user.to_owned(),
            item: item.to_owned(),
            rating: self.perturb_value(value, rng)?,
            ldp: self.claim,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dprec_dp::privacy::stats::{ks_critical, ks_statistic};
    use dprec_dp::rng::seeded;

    const S: RatingScale = RatingScale::ONE_TO_FIVE;

    /// Truncated-Laplace CDF written out independently of the crate's sampler and
    /// calibration, so a wrong scale in either shows up as a distribution mismatch.
    fn reference_cdf(y: f64, x: f64, b: f64, l: f64, u: f64) -> f64 {
        let lap = |t: f64| {
            if t < x {
                0.5 * ((t - x) / b).exp()
            } else {
                1.0 - 0.5 * (-(t - x) / b).exp()
            }
        };
        ((lap(y.clamp(l, u)) - lap(l)) / (lap(u) - lap(l))).clamp(0.0, 1.0)
    }

    /// Noise-scale test of the client perturbation (brief item 5): the values produced by
    /// `RatingPerturber` match the truncated Laplace law with b = width/eps (KS at
    /// alpha = 1e-6 per check, 4 inputs x 2 eps: false-failure rate < 1e-5), and the same
    /// check rejects samples drawn at 1.1 b and 0.9 b (10% wrong scale; expected D about
    /// 3-4 times the critical value at n = 1e5) and unperturbed values.
    #[test]
    fn perturbation_has_the_claimed_scale_and_a_10pct_wrong_scale_fails() {
        let n = 100_000usize;
        let crit = ks_critical(n, 1e-6);
        let mut rng = seeded(11);
        for eps in [1.0, 3.0] {
            let p = RatingPerturber::new(eps, S).unwrap();
            let b = (S.max - S.min) / eps;
            assert!((p.claim().scale - b).abs() < 1e-12 * b);
            for x in [1.0, 2.0, 3.0, 5.0] {
                let ys: Vec<f64> = (0..n)
                    .map(|_| p.perturb_value(x, &mut rng).unwrap())
                    .collect();
                assert!(ys.iter().all(|y| S.contains(*y)));
                let d = ks_statistic(ys, |y| reference_cdf(y, x, b, S.min, S.max));
                assert!(d < crit, "eps={eps} x={x}: KS {d} >= {crit}");
            }
        }
        // A perturber that used a 10% wrong scale (or none) is rejected by the same check.
        let eps = 3.0;
        let b = (S.max - S.min) / eps;
        for wrong in [1.1 * b, 0.9 * b] {
            let ys: Vec<f64> = (0..n)
                .map(|_| bounded_laplace(2.0, wrong, S.min, S.max, &mut rng).unwrap())
                .collect();
            let d = ks_statistic(ys, |y| reference_cdf(y, 2.0, b, S.min, S.max));
            assert!(
                d > crit,
                "scale {wrong} (true {b}) not detected: {d} <= {crit}"
            );
        }
        let d = ks_statistic(vec![2.0; n], |y| reference_cdf(y, 2.0, b, S.min, S.max));
        assert!(d > crit, "missing noise not detected");
    }

    /// The exact privacy loss of the claimed mechanism is eps: the density ratio over a
    /// grid of inputs and outputs on the service's scale reaches but never exceeds e^eps.
    #[test]
    fn claimed_mechanism_is_exactly_eps_ldp_on_a_grid() {
        for eps in [0.1, 1.0, 3.0] {
            let c = LdpClaim::bounded_laplace(eps, S).unwrap();
            let g: Vec<f64> = (0..=40).map(|k| 1.0 + 0.1 * k as f64).collect();
            let mut worst: f64 = 0.0;
            for &x in &g {
                for &x2 in &g {
                    for &y in &g {
                        let p = dprec_dp::privacy::bounded_laplace_density(y, x, c.scale, 1.0, 5.0)
                            .unwrap();
                        let q =
                            dprec_dp::privacy::bounded_laplace_density(y, x2, c.scale, 1.0, 5.0)
                                .unwrap();
                        worst = worst.max(p / q);
                    }
                }
            }
            assert!(
                worst.ln() <= eps * (1.0 + 1e-9),
                "eps={eps}: {}",
                worst.ln()
            );
            assert!(
                worst.ln() >= eps * (1.0 - 1e-9),
                "eps={eps}: {}",
                worst.ln()
            );
        }
    }

    #[test]
    fn perturbed_values_are_on_the_output_grid() {
        let p = RatingPerturber::new(0.5, S).unwrap();
        let mut rng = seeded(3);
        for _ in 0..1000 {
            let y = p.perturb_value(3.0, &mut rng).unwrap();
            let k = (y - S.min) / OUTPUT_GRID;
            assert!((k - k.round()).abs() < 1e-9 && S.contains(y), "{y}");
        }
    }

    #[test]
    fn json_form_round_trips_and_is_documented_shape() {
        let p = RatingPerturber::new(1.0, S).unwrap();
        let r = p.perturb("u1", "i42", 4.0, &mut seeded(1)).unwrap();
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["ldp"]["mechanism"], "bounded-laplace");
        assert_eq!(v["ldp"]["eps"], 1.0);
        assert_eq!(v["ldp"]["lower"], 1.0);
        assert_eq!(v["ldp"]["upper"], 5.0);
        assert_eq!(v["ldp"]["scale"], 4.0);
        assert_eq!(v["user"], "u1");
        let back: PerturbedRating = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        assert!(r.ldp.validate(r.rating, S, 10.0).is_ok());
    }

    #[test]
    fn validation_names_the_inconsistent_field() {
        let c = LdpClaim::bounded_laplace(1.0, S).unwrap();
        let field = |c: LdpClaim, v: f64| c.validate(v, S, 5.0).unwrap_err().field;
        assert_eq!(field(LdpClaim { lower: 0.0, ..c }, 3.0), "ldp.lower");
        assert_eq!(field(LdpClaim { upper: 10.0, ..c }, 3.0), "ldp.upper");
        assert_eq!(
            field(
                LdpClaim {
                    eps: 6.0,
                    scale: 4.0 / 6.0,
                    ..c
                },
                3.0
            ),
            "ldp.eps"
        );
        assert_eq!(field(LdpClaim { eps: 0.0, ..c }, 3.0), "ldp.eps");
        assert_eq!(field(LdpClaim { eps: f64::NAN, ..c }, 3.0), "ldp.eps");
        assert_eq!(field(LdpClaim { scale: 4.4, ..c }, 3.0), "ldp.scale");
        assert_eq!(field(LdpClaim { eps: 2.0, ..c }, 3.0), "ldp.scale");
        assert_eq!(field(c, 5.5), "rating");
        assert_eq!(field(c, f64::NAN), "rating");
        assert!(c.validate(1.0, S, 5.0).is_ok() && c.validate(4.999, S, 5.0).is_ok());
        let bad: Result<LdpClaim, _> = serde_json::from_value(serde_json::json!(
            {"mechanism": "laplace", "eps": 1.0, "lower": 1.0, "upper": 5.0, "scale": 4.0}
        ));
        assert!(bad.is_err());
    }
}
