//! Privacy events: what a trainer did, as data.

use serde::{Deserialize, Serialize};

use super::curve::RdpCurve;
use super::rdp::{gaussian_rdp, laplace_rdp, poisson_subsampled_gaussian_rdp, pure_dp_rdp};
use super::AccountantError;

fn one() -> u64 {
    1
}

/// One mechanism application (or `count` identical ones), recorded as data.
///
/// JSON is internally tagged by `mechanism`, for example
/// `{"mechanism":"gaussian","noise_multiplier":2.0,"count":100}`; `count`
/// defaults to 1. A composition is
/// `{"mechanism":"composed","events":[...]}`.
///
/// The unit of privacy and the neighbour relation are those of the
/// sensitivity the noise was calibrated to (add/remove one rating by default,
/// DESIGN 3); the subsampled Gaussian bound is for add/remove neighbours with
/// Poisson sampling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mechanism", rename_all = "snake_case", deny_unknown_fields)]
pub enum PrivacyEvent {
    /// Gaussian mechanism; `noise_multiplier` = sigma / L2 sensitivity.
    Gaussian {
        noise_multiplier: f64,
        #[serde(default = "one")]
        count: u64,
    },
    /// Gaussian mechanism on a Poisson subsample with rate `sampling_rate`.
    PoissonSubsampledGaussian {
        sampling_rate: f64,
        noise_multiplier: f64,
        #[serde(default = "one")]
        count: u64,
    },
    /// Laplace mechanism; `scale` = b / L1 sensitivity, so eps = 1 / scale.
    Laplace {
        scale: f64,
        #[serde(default = "one")]
        count: u64,
    },
    /// Any pure `eps`-DP mechanism, charged as `min(eps, alpha eps^2 / 2)`.
    PureDp {
        eps: f64,
        #[serde(default = "one")]
        count: u64,
    },
    /// Sequential composition of the listed events.
    Composed { events: Vec<PrivacyEvent> },
    /// `event`, whose curve bounds ADD/REMOVE neighbours of a unit (e.g. a user), applied
    /// to two inputs that differ by the REPLACEMENT of one unit's record (e.g. one rating
    /// of that user added or removed). Bounded through the input without the unit by the
    /// weak triangle inequality of Renyi divergence (Mironov 2017, "Renyi Differential
    /// Privacy", Prop. 11 with p = q = 2):
    /// `D_a(P||R) <= (a - 1/2)/(a - 1) eps(2a) + eps(2a - 1)`.
    ReplaceOne { event: Box<PrivacyEvent> },
}

fn check(
    ok: bool,
    prefix: &str,
    field: &str,
    value: f64,
    requirement: &'static str,
) -> Result<(), AccountantError> {
    if ok {
        Ok(())
    } else {
        Err(AccountantError::InvalidParameter {
            field: format!("{prefix}{field}"),
            value,
            requirement,
        })
    }
}

impl PrivacyEvent {
    /// `count` Gaussian steps (validated).
    pub fn gaussian(noise_multiplier: f64, count: u64) -> Result<Self, AccountantError> {
        let e = Self::Gaussian {
            noise_multiplier,
            count,
        };
        e.validate()?;
        Ok(e)
    }

    /// `count` Poisson-subsampled Gaussian steps (validated).
    pub fn poisson_subsampled_gaussian(
        sampling_rate: f64,
        noise_multiplier: f64,
        count: u64,
    ) -> Result<Self, AccountantError> {
        let e = Self::PoissonSubsampledGaussian {
            sampling_rate,
            noise_multiplier,
            count,
        };
        e.validate()?;
        Ok(e)
    }

    /// `count` Laplace mechanisms of scale `scale` (validated).
    pub fn laplace(scale: f64, count: u64) -> Result<Self, AccountantError> {
        let e = Self::Laplace { scale, count };
        e.validate()?;
        Ok(e)
    }

    /// `count` pure `eps`-DP mechanisms (validated).
    pub fn pure_dp(eps: f64, count: u64) -> Result<Self, AccountantError> {
        let e = Self::PureDp { eps, count };
        e.validate()?;
        Ok(e)
    }

    /// `event` (an add/remove bound) for inputs differing by one replaced unit
    /// (validated); see [`PrivacyEvent::ReplaceOne`].
    pub fn replace_one(event: PrivacyEvent) -> Result<Self, AccountantError> {
        let e = Self::ReplaceOne {
            event: Box::new(event),
        };
        e.validate()?;
        Ok(e)
    }

    /// Checks every parameter; the error names the offending field (with its
    /// path inside compositions, e.g. `events[2].noise_multiplier`).
    pub fn validate(&self) -> Result<(), AccountantError> {
        self.validate_at("")
    }

    fn validate_at(&self, prefix: &str) -> Result<(), AccountantError> {
        const POSITIVE: &str = "finite and > 0";
        match *self {
            Self::Gaussian {
                noise_multiplier, ..
            } => check(
                noise_multiplier.is_finite() && noise_multiplier > 0.0,
                prefix,
                "noise_multiplier",
                noise_multiplier,
                POSITIVE,
            ),
            Self::PoissonSubsampledGaussian {
                sampling_rate,
                noise_multiplier,
                ..
            } => {
                check(
                    (0.0..=1.0).contains(&sampling_rate),
                    prefix,
                    "sampling_rate",
                    sampling_rate,
                    "in [0, 1]",
                )?;
                check(
                    noise_multiplier.is_finite() && noise_multiplier > 0.0,
                    prefix,
                    "noise_multiplier",
                    noise_multiplier,
                    POSITIVE,
                )
            }
            Self::Laplace { scale, .. } => check(
                scale.is_finite() && scale > 0.0,
                prefix,
                "scale",
                scale,
                POSITIVE,
            ),
            Self::PureDp { eps, .. } => check(
                eps.is_finite() && eps >= 0.0,
                prefix,
                "eps",
                eps,
                "finite and >= 0",
            ),
            Self::Composed { ref events } => {
                for (i, e) in events.iter().enumerate() {
                    e.validate_at(&format!("{prefix}events[{i}]."))?;
                }
                Ok(())
            }
            Self::ReplaceOne { ref event } => event.validate_at(&format!("{prefix}event.")),
        }
    }

    /// The RDP curve of this event on `orders` (validated first).
    pub fn rdp_curve(&self, orders: &[f64]) -> Result<RdpCurve, AccountantError> {
        self.validate()?;
        self.curve_unchecked(orders)
    }

    fn curve_unchecked(&self, orders: &[f64]) -> Result<RdpCurve, AccountantError> {
        let orders = orders.to_vec();
        match *self {
            Self::Gaussian {
                noise_multiplier,
                count,
            } => Ok(RdpCurve::from_fn(orders, |a| gaussian_rdp(noise_multiplier, a))?.scale(count)),
            Self::PoissonSubsampledGaussian {
                sampling_rate,
                noise_multiplier,
                count,
            } => Ok(RdpCurve::from_fn(orders, |a| {
                poisson_subsampled_gaussian_rdp(sampling_rate, noise_multiplier, a)
            })?
            .scale(count)),
            Self::Laplace { scale, count } => {
                Ok(RdpCurve::from_fn(orders, |a| laplace_rdp(1.0 / scale, a))?.scale(count))
            }
            Self::PureDp { eps, count } => {
                Ok(RdpCurve::from_fn(orders, |a| pure_dp_rdp(eps, a))?.scale(count))
            }
            Self::Composed { ref events } => {
                let mut acc = RdpCurve::zeros(orders.clone())?;
                for e in events {
                    acc = acc.compose(&e.curve_unchecked(&orders)?)?;
                }
                Ok(acc)
            }
            Self::ReplaceOne { ref event } => {
                // Both grids are strictly increasing and > 1 because `orders` is.
                let double: Vec<f64> = orders.iter().map(|a| 2.0 * a).collect();
                let minus: Vec<f64> = orders.iter().map(|a| 2.0 * a - 1.0).collect();
                let at_double = event.curve_unchecked(&double)?;
                let at_minus = event.curve_unchecked(&minus)?;
                let values = orders
                    .iter()
                    .zip(at_double.values().iter().zip(at_minus.values()))
                    .map(|(a, (d, m))| (a - 0.5) / (a - 1.0) * d + m)
                    .collect();
                RdpCurve::new(orders, values)
            }
        }
    }
}

/// The composed RDP curve of a sequence of events on `orders`.
pub fn compose_events(
    events: &[PrivacyEvent],
    orders: &[f64],
) -> Result<RdpCurve, AccountantError> {
    let mut acc = RdpCurve::zeros(orders.to_vec())?;
    for (i, e) in events.iter().enumerate() {
        e.validate_at(&format!("events[{i}]."))?;
        acc = acc.compose(&e.curve_unchecked(orders)?)?;
    }
    Ok(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_is_tagged_and_count_defaults_to_one() {
        let e = PrivacyEvent::gaussian(2.0, 100).unwrap();
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"mechanism":"gaussian","noise_multiplier":2.0,"count":100}"#
        );
        let parsed: PrivacyEvent =
            serde_json::from_str(r#"{"mechanism":"laplace","scale":0.5}"#).unwrap();
        assert_eq!(
            parsed,
            PrivacyEvent::Laplace {
                scale: 0.5,
                count: 1
            }
        );
        let composed: PrivacyEvent = serde_json::from_str(
            r#"{"mechanism":"composed","events":[{"mechanism":"pure_dp","eps":0.1,"count":3},
               {"mechanism":"poisson_subsampled_gaussian","sampling_rate":0.01,"noise_multiplier":1.1,"count":10}]}"#,
        )
        .unwrap();
        let back: PrivacyEvent =
            serde_json::from_str(&serde_json::to_string(&composed).unwrap()).unwrap();
        assert_eq!(back, composed);
        assert!(serde_json::from_str::<PrivacyEvent>(
            r#"{"mechanism":"gaussian","noise_multiplier":2.0,"sigma":1}"#
        )
        .is_err());
    }

    /// The replace-one bound of a Gaussian (sensitivity 1 for add/remove) is the closed
    /// form of the weak triangle inequality, and it is never below the exact curve of a
    /// Gaussian with sensitivity 2 (the true replace-one loss when both records shift the
    /// output by 1 in opposite directions): the bound is sound where it can be checked.
    #[test]
    fn replace_one_is_the_weak_triangle_bound_and_covers_sensitivity_two() {
        let orders = super::super::default_orders();
        for z in [0.8, 1.5, 4.0] {
            let e = PrivacyEvent::replace_one(PrivacyEvent::gaussian(z, 3).unwrap()).unwrap();
            let c = e.rdp_curve(&orders).unwrap();
            for (a, r) in c.points() {
                let g = |x: f64| 3.0 * x / (2.0 * z * z);
                let want = (a - 0.5) / (a - 1.0) * g(2.0 * a) + g(2.0 * a - 1.0);
                assert!((r - want).abs() <= 1e-12 * want, "z {z} a {a}");
                let exact_sensitivity_two = 3.0 * a * 4.0 / (2.0 * z * z);
                assert!(r >= exact_sensitivity_two, "z {z} a {a}");
            }
        }
        let json = serde_json::to_string(
            &PrivacyEvent::replace_one(PrivacyEvent::gaussian(2.0, 1).unwrap()).unwrap(),
        )
        .unwrap();
        assert_eq!(
            json,
            r#"{"mechanism":"replace_one","event":{"mechanism":"gaussian","noise_multiplier":2.0,"count":1}}"#
        );
        let bad = PrivacyEvent::ReplaceOne {
            event: Box::new(PrivacyEvent::Gaussian {
                noise_multiplier: 0.0,
                count: 1,
            }),
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("event.noise_multiplier"));
    }

    #[test]
    fn validation_names_the_field() {
        let err = PrivacyEvent::gaussian(0.0, 1).unwrap_err();
        assert!(err.to_string().contains("noise_multiplier"), "{err}");
        let err = PrivacyEvent::poisson_subsampled_gaussian(1.5, 1.0, 1).unwrap_err();
        assert!(err.to_string().contains("sampling_rate"), "{err}");
        let err = PrivacyEvent::laplace(f64::NAN, 1).unwrap_err();
        assert!(err.to_string().contains("scale"), "{err}");
        let err = PrivacyEvent::pure_dp(-1.0, 1).unwrap_err();
        assert!(err.to_string().contains("eps"), "{err}");
        let nested = PrivacyEvent::Composed {
            events: vec![
                PrivacyEvent::pure_dp(1.0, 1).unwrap(),
                PrivacyEvent::Gaussian {
                    noise_multiplier: -2.0,
                    count: 1,
                },
            ],
        };
        let err = nested.validate().unwrap_err();
        assert!(
            err.to_string().contains("events[1].noise_multiplier"),
            "{err}"
        );
    }
}
