//! RDP to (eps, delta) conversion (pure functions).
//!
//! Both directions use the improved conversion of Balle, Barthe, Gaboardi,
//! Hsu, Sato 2020 ("Hypothesis testing interpretations and Renyi DP", Prop.
//! 12 in arXiv:2004.00010 v4; also Asoodeh et al. arXiv:2001.05990 eq. 20), as
//! dp_accounting (`compute_epsilon`, `compute_delta`) and Opacus do:
//!
//! `eps(alpha) = rdp_alpha + ln(1 - 1/alpha) - ln(delta alpha) / (alpha - 1)`,
//!
//! minimised over the orders of the grid. The edge cases follow
//! dp_accounting 0.6: `delta = 0`; an order at which
//! `delta^2 > 1 - exp(-rdp)` gives eps = 0 (the KL/Pinsker-type bound
//! `delta <= sqrt(1 - exp(-KL))`); orders `<= 1.01` are skipped by the
//! formula (numerically unstable); a negative minimum is clamped to 0.

use serde::Serialize;

use super::curve::{maybe_infinite, RdpCurve};
use super::AccountantError;

/// An (eps, delta) guarantee and the order that achieved it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PrivacyGuarantee {
    /// `+inf` when no finite bound exists (serialised as `null`).
    #[serde(serialize_with = "maybe_infinite::serialize")]
    pub eps: f64,
    pub delta: f64,
    /// The optimal order; `None` when the answer does not depend on an order
    /// (`delta = 0`).
    pub best_order: Option<f64>,
}

/// Index of the first minimum (ties resolved to the lowest order, as
/// `numpy.argmin`).
fn argmin(values: &[f64]) -> usize {
    let mut best = 0;
    for (k, &v) in values.iter().enumerate() {
        if v < values[best] {
            best = k;
        }
    }
    best
}

/// eps of `curve` at `delta` (improved conversion), with the optimal order.
pub fn eps_from_rdp(curve: &RdpCurve, delta: f64) -> Result<PrivacyGuarantee, AccountantError> {
    if !(0.0..=1.0).contains(&delta) {
        return Err(AccountantError::InvalidParameter {
            field: "delta".into(),
            value: delta,
            requirement: "in [0, 1]",
        });
    }
    if delta == 0.0 {
        let all_zero = curve.values().iter().all(|&r| r == 0.0);
        return Ok(PrivacyGuarantee {
            eps: if all_zero { 0.0 } else { f64::INFINITY },
            delta,
            best_order: None,
        });
    }
    let eps: Vec<f64> = curve
        .points()
        .map(|(a, r)| {
            if delta * delta + (-r).exp_m1() > 0.0 {
                0.0
            } else if a > 1.01 {
                r + (-1.0 / a).ln_1p() - (delta * a).ln() / (a - 1.0)
            } else {
                f64::INFINITY
            }
        })
        .collect();
    let k = argmin(&eps);
    Ok(PrivacyGuarantee {
        eps: eps[k].max(0.0),
        delta,
        best_order: Some(curve.orders()[k]),
    })
}

/// delta of `curve` at `eps` (improved conversion, and the KL bound
/// `sqrt(1 - exp(-rdp))`, whichever is smaller), with the optimal order.
pub fn delta_from_rdp(curve: &RdpCurve, eps: f64) -> Result<PrivacyGuarantee, AccountantError> {
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(AccountantError::InvalidParameter {
            field: "eps".into(),
            value: eps,
            requirement: "finite and >= 0",
        });
    }
    let log_deltas: Vec<f64> = curve
        .points()
        .map(|(a, r)| {
            let mut log_delta = if r == 0.0 {
                f64::NEG_INFINITY
            } else {
                0.5 * (-(-r).exp()).ln_1p()
            };
            if a > 1.01 {
                let bound = (a - 1.0) * (r - eps + (-1.0 / a).ln_1p()) - a.ln();
                log_delta = log_delta.min(bound);
            }
            log_delta
        })
        .collect();
    let k = argmin(&log_deltas);
    Ok(PrivacyGuarantee {
        eps,
        delta: log_deltas[k].exp().min(1.0),
        best_order: Some(curve.orders()[k]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accountant::{default_orders, PrivacyEvent};

    fn gaussian_curve(sigma: f64, steps: u64) -> RdpCurve {
        PrivacyEvent::gaussian(sigma, steps)
            .unwrap()
            .rdp_curve(&default_orders())
            .unwrap()
    }

    /// Single-order curve: the result is exactly the improved formula, and
    /// strictly below the classic `rdp + ln(1/delta)/(alpha - 1)`; this test
    /// fails if the classic conversion is used.
    #[test]
    fn conversion_is_the_improved_formula_not_the_classic_one() {
        let (a, r, delta) = (10.0_f64, 2.0_f64, 1e-5_f64);
        let curve = RdpCurve::new(vec![a], vec![r]).unwrap();
        let got = eps_from_rdp(&curve, delta).unwrap();
        let improved = r + (1.0 - 1.0 / a).ln() - (delta * a).ln() / (a - 1.0);
        let classic = r + (1.0 / delta).ln() / (a - 1.0);
        assert!(
            (got.eps - improved).abs() < 1e-12,
            "{} vs {improved}",
            got.eps
        );
        assert!(
            classic - got.eps > 0.3,
            "classic {classic} improved {}",
            got.eps
        );
        assert_eq!(got.best_order, Some(a));

        // And on the full grid for a real Gaussian: below the classic minimum.
        let g = gaussian_curve(2.0, 100);
        let classic_min = g
            .points()
            .map(|(a, r)| r + (1.0 / delta).ln() / (a - 1.0))
            .fold(f64::INFINITY, f64::min);
        let ours = eps_from_rdp(&g, delta).unwrap().eps;
        assert!(ours < classic_min - 0.1, "{ours} vs classic {classic_min}");
    }

    #[test]
    fn eps_is_monotone_decreasing_in_delta() {
        let g = gaussian_curve(1.5, 50);
        let mut prev = f64::INFINITY;
        for delta in [1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 1e-2, 0.1, 0.5] {
            let e = eps_from_rdp(&g, delta).unwrap().eps;
            assert!(e <= prev, "delta {delta}: {e} > {prev}");
            prev = e;
        }
    }

    #[test]
    fn delta_is_monotone_decreasing_in_eps_and_inverts_eps() {
        let g = gaussian_curve(3.0, 20);
        let mut prev = 1.0;
        for eps in [0.1, 0.5, 1.0, 2.0, 4.0, 8.0] {
            let d = delta_from_rdp(&g, eps).unwrap().delta;
            assert!(d <= prev, "eps {eps}");
            prev = d;
        }
        // delta(eps(delta)) <= delta: the same order certifies both.
        let e = eps_from_rdp(&g, 1e-6).unwrap();
        let d = delta_from_rdp(&g, e.eps).unwrap();
        assert!(d.delta <= 1e-6 * (1.0 + 1e-9), "{}", d.delta);
    }

    #[test]
    fn edge_cases_mirror_dp_accounting() {
        let zero = RdpCurve::zeros_default();
        let g = gaussian_curve(1.0, 1);
        // delta = 0.
        assert_eq!(eps_from_rdp(&zero, 0.0).unwrap().eps, 0.0);
        assert_eq!(eps_from_rdp(&g, 0.0).unwrap().eps, f64::INFINITY);
        assert_eq!(eps_from_rdp(&g, 0.0).unwrap().best_order, None);
        // Nothing spent: eps 0, delta 0.
        assert_eq!(eps_from_rdp(&zero, 1e-5).unwrap().eps, 0.0);
        assert_eq!(delta_from_rdp(&zero, 0.0).unwrap().delta, 0.0);
        // Tiny RDP with a large delta: KL branch gives eps 0.
        let tiny = RdpCurve::new(vec![2.0], vec![1e-4]).unwrap();
        assert_eq!(eps_from_rdp(&tiny, 0.1).unwrap().eps, 0.0);
        // Orders <= 1.01 are not used by the formula.
        let low = RdpCurve::new(vec![1.005], vec![0.5]).unwrap();
        assert_eq!(eps_from_rdp(&low, 1e-5).unwrap().eps, f64::INFINITY);
        // Infinite RDP: delta 1 at any eps.
        let inf = RdpCurve::new(vec![2.0], vec![f64::INFINITY]).unwrap();
        assert_eq!(delta_from_rdp(&inf, 3.0).unwrap().delta, 1.0);
        // Invalid inputs.
        assert!(eps_from_rdp(&g, -1e-5).is_err());
        assert!(eps_from_rdp(&g, f64::NAN).is_err());
        assert!(eps_from_rdp(&g, 1.5).is_err());
        assert!(delta_from_rdp(&g, -1.0).is_err());
    }
}
