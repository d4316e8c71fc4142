//! Renyi-DP accounting (pure functions, no I/O).
//!
//! - [`PrivacyEvent`]: what a trainer did, as data (serde, tagged JSON);
//! - [`RdpCurve`]: an RDP curve on an order grid ([`default_orders`], DESIGN 3),
//!   with composition ([`RdpCurve::compose`]) and self-composition
//!   ([`RdpCurve::scale`]);
//! - [`PrivacyEvent::rdp_curve`] / [`compose_events`]: events to curves;
//! - [`eps_from_rdp`] / [`delta_from_rdp`]: the improved RDP to (eps, delta)
//!   conversion of dp_accounting and Opacus;
//! - [`RenyiFilter`]: admission control for a per-user (eps_u, delta_u) budget;
//! - [`plan`]: the lifetime plan (T releases per user) and the calibration of
//!   per-release noise from it, before any data is seen;
//! - [`stages`]: a release as the Gaussian statistics it ran, composed and checked
//!   against its charge before it is published.
//!
//! Tested against closed forms (unit tests here) and against golden vectors
//! produced by Google's dp_accounting (`tests/accountant_golden.rs`, generated
//! by `scripts/accountant_vectors.sh`). See `docs/ACCOUNTANT.md`.

mod conversion;
mod curve;
mod event;
mod filter;
mod logmath;
pub mod plan;
pub mod rdp;
pub mod stages;

pub use conversion::{delta_from_rdp, eps_from_rdp, PrivacyGuarantee};
pub use curve::{default_orders, validate_orders, RdpCurve, NUM_DEFAULT_ORDERS};
pub use event::{compose_events, PrivacyEvent};
pub use filter::RenyiFilter;
pub use plan::{
    calibrate_gaussian, calibrate_pure, releases_left, LifetimePlan, DEFAULT_PLANNED_RELEASES,
};

/// Errors of the accountant; every parameter error names its field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AccountantError {
    /// A mechanism or conversion parameter is out of range.
    #[error("invalid {field} = {value}: must be {requirement}")]
    InvalidParameter {
        field: String,
        value: f64,
        requirement: &'static str,
    },
    /// The order grid is unusable.
    #[error("invalid order grid: {0}")]
    InvalidOrders(String),
    /// An RDP curve breaks its invariants.
    #[error("invalid RDP curve: {0}")]
    InvalidCurve(String),
    /// Two curves (or a curve and a filter) are on different order grids.
    #[error("RDP curves are on different order grids")]
    GridMismatch,
}

#[cfg(test)]
mod tests {
    use super::rdp::*;
    use super::*;

    /// Equal within `rel` relative error (both `+inf` counts as equal).
    fn close(got: f64, want: f64, rel: f64) -> bool {
        got == want || (got - want).abs() <= rel * want.abs()
    }

    fn curve(e: PrivacyEvent) -> RdpCurve {
        e.rdp_curve(&default_orders()).unwrap()
    }

    #[test]
    fn gaussian_rdp_is_linear_in_alpha() {
        for sigma in [0.5, 1.0, 2.0, 10.0] {
            let c = curve(PrivacyEvent::gaussian(sigma, 1).unwrap());
            for (a, r) in c.points() {
                let want = a / (2.0 * sigma * sigma);
                assert!((r - want).abs() <= 1e-15 * want, "sigma {sigma} a {a}");
            }
        }
    }

    #[test]
    fn composition_is_additive() {
        let a = PrivacyEvent::gaussian(2.0, 3).unwrap();
        let b = PrivacyEvent::poisson_subsampled_gaussian(0.1, 1.2, 7).unwrap();
        let c = PrivacyEvent::laplace(4.0, 2).unwrap();
        let d = PrivacyEvent::pure_dp(0.3, 5).unwrap();
        let events = vec![a.clone(), b.clone(), c.clone(), d.clone()];
        let composed = compose_events(&events, &default_orders()).unwrap();
        let nested = curve(PrivacyEvent::Composed {
            events: events.clone(),
        });
        let by_hand = curve(a)
            .compose(&curve(b.clone()))
            .unwrap()
            .compose(&curve(c))
            .unwrap()
            .compose(&curve(d))
            .unwrap();
        for k in 0..NUM_DEFAULT_ORDERS {
            let want = by_hand.values()[k];
            assert!(close(composed.values()[k], want, 1e-13));
            assert!(close(nested.values()[k], want, 1e-13));
        }
        // count = n is n-fold composition.
        let one = curve(PrivacyEvent::poisson_subsampled_gaussian(0.1, 1.2, 1).unwrap());
        let seven = curve(b);
        for k in 0..NUM_DEFAULT_ORDERS {
            assert!(close(seven.values()[k], 7.0 * one.values()[k], 1e-13));
        }
    }

    #[test]
    fn subsampled_gaussian_with_q_one_is_gaussian_and_q_zero_is_free() {
        for sigma in [0.7, 1.1, 4.0] {
            let full = curve(PrivacyEvent::poisson_subsampled_gaussian(1.0, sigma, 3).unwrap());
            let plain = curve(PrivacyEvent::gaussian(sigma, 3).unwrap());
            assert_eq!(full, plain);
            let none = curve(PrivacyEvent::poisson_subsampled_gaussian(0.0, sigma, 3).unwrap());
            assert!(none.values().iter().all(|&v| v == 0.0));
        }
    }

    /// The sampled Gaussian approaches the plain Gaussian as q -> 1 (through
    /// the series, not the q = 1 shortcut), is increasing in q, and is below
    /// the plain Gaussian. Like dp_accounting 0.6, the fractional-order series
    /// may fail to converge at small orders when q is large; such orders are
    /// `+inf` (no bound, never selected by a conversion), and only there.
    #[test]
    fn subsampled_gaussian_is_monotone_in_q_and_below_gaussian() {
        let sigma = 1.5;
        let plain = curve(PrivacyEvent::gaussian(sigma, 1).unwrap());
        let mut prev = RdpCurve::zeros_default();
        for q in [0.001, 0.01, 0.1, 0.5, 0.9] {
            let c = curve(PrivacyEvent::poisson_subsampled_gaussian(q, sigma, 1).unwrap());
            for k in 0..NUM_DEFAULT_ORDERS {
                let (a, v, p, g) = (
                    c.orders()[k],
                    c.values()[k],
                    prev.values()[k],
                    plain.values()[k],
                );
                if v.is_infinite() {
                    assert!(a.fract() != 0.0 && a < 2.0 && q >= 0.1, "q {q} order {a}");
                    continue;
                }
                assert!(v >= p || p.is_infinite(), "q {q} order {a}");
                assert!(v <= g * (1.0 + 1e-9), "q {q} order {a}: {v} > {g}");
            }
            prev = c;
        }
        let near = curve(PrivacyEvent::poisson_subsampled_gaussian(1.0 - 1e-9, sigma, 1).unwrap());
        for k in 0..NUM_DEFAULT_ORDERS {
            let (v, g) = (near.values()[k], plain.values()[k]);
            assert!(
                v.is_infinite() || (v - g).abs() < 1e-5 * g,
                "order {}",
                plain.orders()[k]
            );
        }
        assert!(near.values()[9..].iter().all(|v| v.is_finite()));
    }

    /// Small q: A_alpha ~ 1 + binom(alpha, 2) q^2 (e^{1/sigma^2} - 1), so
    /// rdp ~ alpha q^2 (e^{1/sigma^2} - 1) / 2 (Mironov-Talwar-Zhang 2019).
    #[test]
    fn subsampled_gaussian_small_q_matches_second_order_expansion() {
        let (q, sigma) = (1e-4, 2.0);
        for a in [2.0, 3.0, 2.5, 5.5] {
            let got = poisson_subsampled_gaussian_rdp(q, sigma, a);
            let want = a * q * q * (1.0 / (sigma * sigma)).exp_m1() / 2.0;
            assert!((got - want).abs() < 1e-3 * want, "a {a}: {got} vs {want}");
        }
    }

    #[test]
    fn pure_dp_is_min_of_eps_and_quadratic() {
        let eps = 0.5;
        let c = curve(PrivacyEvent::pure_dp(eps, 2).unwrap());
        for (a, r) in c.points() {
            let want = 2.0 * eps.min(a * eps * eps / 2.0);
            assert_eq!(r, want, "a {a}");
        }
        // Quadratic branch below alpha = 2/eps = 4, eps above.
        assert_eq!(c.value_at(2.0), Some(2.0 * 0.25));
        assert_eq!(c.value_at(11.0), Some(2.0 * 0.5));
    }

    #[test]
    fn laplace_rdp_below_eps_and_tends_to_eps() {
        for b in [0.25, 1.0, 3.0] {
            let eps = 1.0 / b;
            let c = curve(PrivacyEvent::laplace(b, 1).unwrap());
            let mut prev = 0.0;
            for (a, r) in c.points() {
                assert!(r > 0.0 && r < eps && r >= prev, "b {b} a {a}");
                prev = r;
            }
            assert!(eps - c.value_at(1024.0).unwrap() < 2.0 * eps.min(1.0) / 1024.0 + 1e-3);
        }
    }

    /// Independent check of the Laplace formula: direct numerical integration
    /// of `1/(a-1) ln int p(x)^a q(x)^(1-a) dx` for P = Lap(0, b),
    /// Q = Lap(1, b), by Simpson's rule on the three pieces where the
    /// integrand is a smooth exponential (split at the kinks 0 and 1), in
    /// log space (the integrand peaks at e^{(a-1)/b}).
    #[test]
    fn laplace_rdp_matches_numerical_integration() {
        fn simpson(f: impl Fn(f64) -> f64, lo: f64, hi: f64, n: usize) -> f64 {
            let h = (hi - lo) / n as f64;
            let mut s = f(lo) + f(hi);
            for i in 1..n {
                let w = if i % 2 == 1 { 4.0 } else { 2.0 };
                s += w * f(lo + i as f64 * h);
            }
            s * h / 3.0
        }
        for b in [0.5, 1.0, 2.0] {
            for a in [1.1, 1.5, 2.0, 3.7, 10.0, 32.0] {
                let g = |x: f64| -(a * x.abs() + (1.0 - a) * (x - 1.0).abs()) / b;
                let peak = (a - 1.0) / b;
                let f = |x: f64| (g(x) - peak).exp() / (2.0 * b);
                let tail = 80.0 * b;
                let n = 20_000;
                let integral = simpson(f, -tail, 0.0, n)
                    + simpson(f, 0.0, 1.0, n)
                    + simpson(f, 1.0, 1.0 + tail, n);
                let numeric = (integral.ln() + peak) / (a - 1.0);
                let formula = laplace_rdp(1.0 / b, a);
                assert!(
                    (numeric - formula).abs() < 1e-9 * formula,
                    "b {b} a {a}: numeric {numeric} formula {formula}"
                );
            }
        }
    }
}
