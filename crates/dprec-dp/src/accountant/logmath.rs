//! Log-space arithmetic used by the RDP formulas.
//!
//! Every quantity that can overflow (moment-generating sums of the subsampled
//! Gaussian at order 1024, Gaussian tails far from the mean) is carried as its
//! natural logarithm.

use std::f64::consts::PI;

/// `ln(e^x + e^y)`, exact for `-inf` arguments.
pub(crate) fn log_add(x: f64, y: f64) -> f64 {
    let (lo, hi) = if x < y { (x, y) } else { (y, x) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    hi + (lo - hi).exp().ln_1p()
}

/// `ln |binom(alpha, i)|` for every `i` in `0..n`, by the product recursion
/// `binom(alpha, i + 1) = binom(alpha, i) (alpha - i) / (i + 1)`.
///
/// `alpha` may be fractional (the generalised binomial coefficient); for an
/// integer `alpha` and `i > alpha` the coefficient is 0 and the log is `-inf`.
pub(crate) fn log_abs_binomials(alpha: f64, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(n);
    let mut acc = 0.0_f64;
    for i in 0..n {
        out.push(acc);
        let factor = (alpha - i as f64).abs();
        acc += factor.ln() - ((i + 1) as f64).ln();
    }
    out
}

/// `ln erfc(x)`, accurate to a few ulps of the log for every real `x`,
/// including arguments where `erfc(x)` underflows (x > 26).
pub(crate) fn log_erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 0.0 {
        // erfc(x) = 2 - erfc(-x) lies in (1, 2]: no cancellation.
        return (2.0 - erfc_nonneg(-x)).ln();
    }
    if x < ERFC_SWITCH {
        return erfc_nonneg(x).ln();
    }
    // erfc(x) = exp(-x^2) / (sqrt(pi) * K(x)) with K the continued fraction.
    -x * x - 0.5 * PI.ln() - erfc_continued_fraction(x).ln()
}

/// `erfc(x)` for `x >= 0` (underflows to 0 for large `x`; use [`log_erfc`] there).
pub(crate) fn erfc_nonneg(x: f64) -> f64 {
    debug_assert!(x >= 0.0);
    if x < ERFC_SWITCH {
        1.0 - erf_series(x)
    } else if x > 27.5 {
        0.0
    } else {
        (-x * x).exp() / (PI.sqrt() * erfc_continued_fraction(x))
    }
}

/// Below this argument erf comes from its all-positive power series,
/// above it erfc comes from its continued fraction.
const ERFC_SWITCH: f64 = 2.0;

/// `erf(x) = 2x/sqrt(pi) exp(-x^2) sum_n (2x^2)^n / (1*3*...*(2n+1))`: every
/// term is positive, so the sum has no cancellation.
fn erf_series(x: f64) -> f64 {
    let two_x2 = 2.0 * x * x;
    let mut term = 1.0_f64;
    let mut sum = 1.0_f64;
    let mut n = 0.0_f64;
    while term > sum * 1e-17 {
        n += 1.0;
        term *= two_x2 / (2.0 * n + 1.0);
        sum += term;
    }
    2.0 * x / PI.sqrt() * (-x * x).exp() * sum
}

/// `K(x) = x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + ...))))`, evaluated with the
/// modified Lentz algorithm; `erfc(x) = exp(-x^2) / (sqrt(pi) K(x))`.
fn erfc_continued_fraction(x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut f = x;
    let mut c = x;
    let mut d = 0.0_f64;
    for n in 1..500 {
        let a = n as f64 / 2.0;
        d = x + a * d;
        if d.abs() < TINY {
            d = TINY;
        }
        d = 1.0 / d;
        c = x + a / c;
        if c.abs() < TINY {
            c = TINY;
        }
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference values: scipy 1.17 `log(2) + log_ndtr(-x * sqrt(2))`.
    #[test]
    fn log_erfc_matches_reference_values() {
        let cases = [
            (-3.0, 0.6931361352504468_f64),
            (-0.5, 0.4190391477755596),
            (0.0, 0.0),
            (0.5, -0.7350111298370848),
            (1.0, -1.849605509933249),
            (1.999, -5.360524027545018),
            (2.0, -5.36494126461664),
            (3.0, -10.720363041981116),
            (10.0, -102.87988902484493),
            (26.0, -679.8311997631946),
            (30.0, -903.9741171106442),
            (100.0, -10005.177585122668),
        ];
        for (x, want) in cases {
            let got = log_erfc(x);
            let err = (got - want).abs() / want.abs().max(1e-300);
            assert!(
                err < 1e-13 || (got - want).abs() < 1e-15,
                "x={x}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn log_add_is_exact_for_neg_infinity_and_symmetric() {
        assert_eq!(log_add(f64::NEG_INFINITY, 3.0), 3.0);
        assert_eq!(log_add(3.0, f64::NEG_INFINITY), 3.0);
        let v = log_add(2.0_f64.ln(), 3.0_f64.ln());
        assert!((v - 5.0_f64.ln()).abs() < 1e-15);
        assert!((log_add(1000.0, 1000.0) - (1000.0 + 2.0_f64.ln())).abs() < 1e-12);
    }

    #[test]
    fn log_binomials_match_small_integer_values() {
        let l = log_abs_binomials(5.0, 7);
        let want = [1.0_f64, 5.0, 10.0, 10.0, 5.0, 1.0];
        for (i, w) in want.iter().enumerate() {
            assert!((l[i] - w.ln()).abs() < 1e-13, "i={i}");
        }
        assert_eq!(l[6], f64::NEG_INFINITY);
        // binom(1.5, 3) = 1.5 * 0.5 * (-0.5) / 6 = -0.0625
        let f = log_abs_binomials(1.5, 4);
        assert!((f[3] - 0.0625_f64.ln()).abs() < 1e-14);
    }
}
