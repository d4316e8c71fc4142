//! Local randomisers of Private-GD (Shin, Kim, Shin, Xiao 2018).
//!
//! - [`one_bit_report`]: Algorithm 1 lines 9-12. A value `x` in `[-1, 1]` becomes
//!   `+scale*B` with probability `(x (e^eps - 1) + e^eps + 1) / (2 (e^eps + 1))`, else
//!   `-scale*B`, with `B = (e^eps + 1)/(e^eps - 1)`. Then `E[report] = scale * x`, and
//!   the two output probabilities vary with `x` by a factor of at most `e^eps` (Lemma 1).
//!   The paper uses `scale = m d` because each user reports one uniformly chosen entry
//!   of the `m x d` gradient (`q d` for GD-DR); `eps` there is the per-iteration `eps/k`.
//! - [`randomized_response`]: section 4.1. An indicator `y` becomes 0 w.p. `p/2`, 1 w.p.
//!   `p/2`, `y` w.p. `1 - p`, `p = 2/(1 + e^eps)`; [`rr_unbiased_estimate`] gives
//!   `(y* - p/2)/(1 - p)`, whose expectation is `y`.

use rand::Rng;

use super::{check_finite, check_positive, invalid, Result};

/// `B = (e^eps + 1)/(e^eps - 1)`, the magnitude of a one-bit report before `scale`.
pub fn one_bit_bound(eps: f64) -> Result<f64> {
    let eps = check_positive("eps", eps)?;
    let em1 = eps.exp_m1();
    if !em1.is_finite() {
        return Err(invalid("eps", eps, "e^eps overflows"));
    }
    Ok((em1 + 2.0) / em1)
}

/// Probability that the one-bit report of `x` is `+scale*B`.
///
/// `x` is clipped to `[-1, 1]` first, as in Algorithm 1 (line 9); NaN is rejected.
pub fn one_bit_probability(x: f64, eps: f64) -> Result<f64> {
    let x = check_finite("x", x)?.clamp(-1.0, 1.0);
    let eps = check_positive("eps", eps)?;
    let em1 = eps.exp_m1();
    if !em1.is_finite() {
        return Err(invalid("eps", eps, "e^eps overflows"));
    }
    // (x (e^eps - 1) + e^eps + 1) / (2 (e^eps + 1)) written with em1 = e^eps - 1.
    Ok((x * em1 + em1 + 2.0) / (2.0 * (em1 + 2.0)))
}

/// One-bit eps-LDP report of `x` in `[-1, 1]`: `±scale*B`, unbiased for `scale * x`.
pub fn one_bit_report<R: Rng + ?Sized>(x: f64, eps: f64, scale: f64, rng: &mut R) -> Result<f64> {
    let scale = check_positive("scale", scale)?;
    let p = one_bit_probability(x, eps)?;
    let b = one_bit_bound(eps)? * scale;
    Ok(if rng.random_bool(p) { b } else { -b })
}

/// `p = 2/(1 + e^eps)`: the probability that randomized response replaces the bit by a
/// fair coin.
pub fn rr_flip_probability(eps: f64) -> Result<f64> {
    let eps = check_positive("eps", eps)?;
    // 2/(1+e^eps) = 2 e^-eps / (e^-eps + 1): no overflow for large eps.
    let e = (-eps).exp();
    Ok(2.0 * e / (1.0 + e))
}

/// `P(y* = out | y)` of randomized response (used by the ratio test and by auditors).
pub fn rr_output_probability(out: bool, y: bool, eps: f64) -> Result<f64> {
    let p = rr_flip_probability(eps)?;
    Ok(if out == y { 1.0 - p / 2.0 } else { p / 2.0 })
}

/// Randomized response of an item indicator (eps-LDP for that one indicator).
pub fn randomized_response<R: Rng + ?Sized>(y: bool, eps: f64, rng: &mut R) -> Result<bool> {
    let p = rr_flip_probability(eps)?;
    Ok(if rng.random_bool(p) {
        rng.random_bool(0.5)
    } else {
        y
    })
}

/// Unbiased estimate `(y* - p/2)/(1 - p)` of the true indicator from a reported `y*`.
pub fn rr_unbiased_estimate(y_star: bool, eps: f64) -> Result<f64> {
    let p = rr_flip_probability(eps)?;
    let v = if y_star { 1.0 } else { 0.0 };
    Ok((v - p / 2.0) / (1.0 - p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::stats::freq_tolerance;
    use crate::rng::seeded;

    /// Catches a wrong B or a wrong probability (either breaks unbiasedness): the mean of
    /// n = 100k reports for several x must equal scale*x within 5.33 standard errors
    /// (false-failure ~1e-7 each). A B that is 10% too large must fail the same check.
    #[test]
    fn one_bit_report_is_unbiased_and_wrong_b_detected() {
        let n = 100_000;
        let eps = 1.0;
        let scale = 3.0;
        let mut rng = seeded(5);
        let b = one_bit_bound(eps).unwrap() * scale;
        for &x in &[-1.0, -0.4, 0.0, 0.7, 1.0] {
            let p = one_bit_probability(x, eps).unwrap();
            let plus = (0..n)
                .filter(|_| one_bit_report(x, eps, scale, &mut rng).unwrap() > 0.0)
                .count();
            let mean = b * (2.0 * plus as f64 / n as f64 - 1.0);
            // sd of the mean = 2 B sqrt(p(1-p)/n).
            let tol = 2.0 * b * freq_tolerance(p, n);
            assert!((mean - scale * x).abs() < tol, "x={x} mean {mean}");
            // Where |scale x| is large enough for a 10% error to exceed the tolerance.
            if x.abs() >= 0.7 {
                let wrong = 1.1 * mean;
                assert!(
                    (wrong - scale * x).abs() > tol,
                    "1.1 B not detected at x={x}"
                );
            }
        }
    }

    /// Catches a probability that leaks more than eps: over x, x' in a grid of [-1, 1]
    /// and both outputs, P(out|x)/P(out|x') <= e^eps (1e-12 relative), attained at ±1.
    #[test]
    fn one_bit_likelihood_ratio_at_most_e_eps() {
        for &eps in &[0.1, 1.0, 4.0] {
            let mut worst: f64 = 0.0;
            for i in 0..=40 {
                for j in 0..=40 {
                    let x = -1.0 + i as f64 / 20.0;
                    let x2 = -1.0 + j as f64 / 20.0;
                    let p = one_bit_probability(x, eps).unwrap();
                    let q = one_bit_probability(x2, eps).unwrap();
                    worst = worst.max(p / q).max((1.0 - p) / (1.0 - q));
                }
            }
            assert!(worst <= eps.exp() * (1.0 + 1e-12), "eps={eps}: {worst}");
            assert!(worst >= eps.exp() * (1.0 - 1e-12));
        }
        // Out-of-range inputs are clipped, so the ratio bound still holds.
        assert_eq!(one_bit_probability(5.0, 1.0), one_bit_probability(1.0, 1.0));
    }

    /// Catches a wrong p: the likelihood ratio of randomized response equals e^eps, and
    /// the mean of the unbiased estimator over n = 100k reports equals y within 5.33
    /// standard errors (false-failure ~1e-7). Using p for 1.1 eps must fail the check.
    #[test]
    fn randomized_response_ratio_and_unbiased() {
        for &eps in &[0.2, 1.0, 3.0] {
            let r1 = rr_output_probability(true, true, eps).unwrap()
                / rr_output_probability(true, false, eps).unwrap();
            let r0 = rr_output_probability(false, false, eps).unwrap()
                / rr_output_probability(false, true, eps).unwrap();
            assert!((r1 - eps.exp()).abs() <= 1e-12 * eps.exp());
            assert!((r0 - eps.exp()).abs() <= 1e-12 * eps.exp());
        }
        let n = 100_000;
        let eps = 1.0;
        let p = rr_flip_probability(eps).unwrap();
        let mut rng = seeded(9);
        for &y in &[false, true] {
            let ones = (0..n)
                .filter(|_| randomized_response(y, eps, &mut rng).unwrap())
                .count();
            let freq = ones as f64 / n as f64;
            let est = (freq - p / 2.0) / (1.0 - p);
            let target = if y { 1.0 } else { 0.0 };
            let p1 = rr_output_probability(true, y, eps).unwrap();
            let tol = freq_tolerance(p1, n) / (1.0 - p);
            assert!((est - target).abs() < tol, "y={y}: estimate {est}");
            let mean_helper = (ones as f64 * rr_unbiased_estimate(true, eps).unwrap()
                + (n - ones) as f64 * rr_unbiased_estimate(false, eps).unwrap())
                / n as f64;
            assert!((mean_helper - est).abs() < 1e-12);
            // Debiasing with the p of a 10% larger eps is detectably biased.
            let p_wrong = rr_flip_probability(1.1 * eps).unwrap();
            let est_wrong = (freq - p_wrong / 2.0) / (1.0 - p_wrong);
            assert!((est_wrong - target).abs() > tol, "wrong p not detected");
        }
    }

    #[test]
    fn local_randomisers_reject_bad_parameters() {
        let mut rng = seeded(2);
        assert!(one_bit_report(f64::NAN, 1.0, 1.0, &mut rng).is_err());
        assert!(one_bit_report(0.5, 0.0, 1.0, &mut rng).is_err());
        assert!(one_bit_report(0.5, 1.0, -1.0, &mut rng).is_err());
        assert!(one_bit_bound(1e6).is_err());
        assert!(randomized_response(true, f64::NAN, &mut rng).is_err());
        assert!(rr_unbiased_estimate(true, -1.0).is_err());
        // Very large eps: no flips, estimator is the identity.
        assert!((rr_unbiased_estimate(true, 800.0).unwrap() - 1.0).abs() < 1e-12);
    }
}
