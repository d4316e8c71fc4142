//! RDP of single mechanisms at one order `alpha > 1`.
//!
//! Parameters are assumed validated (see [`super::PrivacyEvent::validate`]);
//! these functions are the formulas only.

use super::logmath::{log_abs_binomials, log_add, log_erfc};

/// Gaussian mechanism with noise multiplier `sigma` (std / L2 sensitivity):
/// `alpha / (2 sigma^2)` (Mironov 2017, Prop. 7).
pub fn gaussian_rdp(noise_multiplier: f64, alpha: f64) -> f64 {
    alpha / (2.0 * noise_multiplier * noise_multiplier)
}

/// Laplace mechanism with `eps = 1/b` (scale `b` relative to L1 sensitivity 1),
/// Mironov 2017, Prop. 6, written so that nothing overflows:
///
/// `eps_a = eps + ln(1 + (a-1) expm1(eps (1-2a)) / (2a-1)) / (a-1)`.
///
/// `expm1` of a non-positive argument lies in `[-1, 0]`, so the argument of the
/// log lies in `(1/2, 1]`: no overflow for any `a` or `eps`. With
/// `c = expm1(eps(1-2a)) / (2a-1)` and `x = (a-1) c` the second term is
/// `c ln_1p(x) / x`, which stays accurate as `a -> 1` and tends to the KL
/// divergence `eps + expm1(-eps)` there. As `a -> inf` the value tends to
/// `eps` from below.
pub fn laplace_rdp(eps: f64, alpha: f64) -> f64 {
    if eps == 0.0 {
        return 0.0;
    }
    let c = (eps * (1.0 - 2.0 * alpha)).exp_m1() / (2.0 * alpha - 1.0);
    let x = (alpha - 1.0) * c;
    if x == 0.0 {
        eps + c
    } else {
        eps + c * x.ln_1p() / x
    }
}

/// Pure `eps`-DP as RDP: `min(eps, alpha eps^2 / 2)` (an eps-DP mechanism is
/// eps-RDP at every order, and `eps^2/2`-zCDP, Bun-Steinke 2016, Prop. 3.3).
pub fn pure_dp_rdp(eps: f64, alpha: f64) -> f64 {
    eps.min(alpha * eps * eps / 2.0)
}

/// Poisson-subsampled Gaussian mechanism (sampling rate `q`, noise multiplier
/// `sigma`), add/remove neighbours: `ln(A_alpha) / (alpha - 1)` with `A_alpha`
/// from Mironov, Talwar, Zhang 2019 ("Renyi Differential Privacy of the
/// Sampled Gaussian Mechanism", Sec. 3.3), computed as dp_accounting 0.6 does:
/// the exact binomial sum for integer orders and the two-sided series for
/// fractional orders. `q = 0` gives 0 and `q = 1` the plain Gaussian.
pub fn poisson_subsampled_gaussian_rdp(q: f64, sigma: f64, alpha: f64) -> f64 {
    if q == 0.0 {
        return 0.0;
    }
    if q == 1.0 {
        return gaussian_rdp(sigma, alpha);
    }
    let log_a = if alpha.fract() == 0.0 {
        log_a_int(q, sigma, alpha)
    } else {
        log_a_frac(q, sigma, alpha)
    };
    log_a / (alpha - 1.0)
}

/// Integer order: `A_alpha = sum_{i=0}^{alpha} binom(alpha, i) q^i (1-q)^(alpha-i)
/// exp((i^2 - i) / (2 sigma^2))`, every term positive, summed in log space.
fn log_a_int(q: f64, sigma: f64, alpha: f64) -> f64 {
    let n = alpha as usize;
    let log_q = q.ln();
    let log_1mq = (-q).ln_1p();
    let two_s2 = 2.0 * sigma * sigma;
    let log_binom = log_abs_binomials(alpha, n + 1);
    let mut log_a = f64::NEG_INFINITY;
    for (i, lb) in log_binom.iter().enumerate() {
        let fi = i as f64;
        let s = lb + fi * log_q + (alpha - fi) * log_1mq + (fi * fi - fi) / two_s2;
        log_a = log_add(log_a, s);
    }
    log_a
}

/// Cap on the number of series terms for fractional orders (as dp_accounting).
const MAX_FRAC_TERMS: usize = 1000;

/// Fractional order: `A_alpha` split at `z0 = sigma^2 ln(1/q - 1) + 1/2` into
/// two binomial series with Gaussian-tail (erfc) weights.
///
/// Like dp_accounting 0.6, the terms are added by absolute value (the
/// generalised binomial coefficients alternate in sign for `i > alpha + 1`),
/// which gives an upper bound on `A_alpha`, hence a valid (conservative) RDP
/// bound. The series stops once both parts decrease and the new terms are
/// below `e^-30` times the running total; if that does not happen within
/// [`MAX_FRAC_TERMS`] terms, the order gets `+inf` (it is then never the
/// optimal order of a conversion).
fn log_a_frac(q: f64, sigma: f64, alpha: f64) -> f64 {
    let log_q = q.ln();
    let log_1mq = (-q).ln_1p();
    let s2 = sigma * sigma;
    let z0 = s2 * (1.0 / q - 1.0).ln() + 0.5;
    let sqrt2_sigma = std::f64::consts::SQRT_2 * sigma;
    let ln_half = 0.5_f64.ln();
    let log_binom = log_abs_binomials(alpha, MAX_FRAC_TERMS);

    let (mut log_a0, mut log_a1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let (mut last0, mut last1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for (i, &lb) in log_binom.iter().enumerate() {
        let fi = i as f64;
        let j = alpha - fi;
        let log_t0 = lb + fi * log_q + j * log_1mq;
        let log_t1 = lb + j * log_q + fi * log_1mq;
        let log_e0 = ln_half + log_erfc((fi - z0) / sqrt2_sigma);
        let log_e1 = ln_half + log_erfc((z0 - j) / sqrt2_sigma);
        let log_s0 = log_t0 + (fi * fi - fi) / (2.0 * s2) + log_e0;
        let log_s1 = log_t1 + (j * j - j) / (2.0 * s2) + log_e1;
        log_a0 = log_add(log_a0, log_s0);
        log_a1 = log_add(log_a1, log_s1);
        let total = log_add(log_a0, log_a1);
        if log_s0 < last0 && log_s1 < last1 && log_s0.max(log_s1) < total - 30.0 {
            return total;
        }
        last0 = log_s0;
        last1 = log_s1;
    }
    f64::INFINITY
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laplace_limits() {
        for eps in [0.1_f64, 1.0, 5.0] {
            // a -> 1: KL divergence eps + e^-eps - 1.
            let kl = eps + (-eps).exp_m1();
            let near1 = laplace_rdp(eps, 1.0 + 1e-9);
            assert!((near1 - kl).abs() < 1e-8 * kl.max(1e-12), "{near1} vs {kl}");
            assert_eq!(laplace_rdp(eps, 1.0), kl);
            // large a: below eps, tending to it.
            let mut prev = 0.0;
            for a in [1.5, 2.0, 10.0, 1024.0, 1e6, 1e12] {
                let v = laplace_rdp(eps, a);
                assert!(
                    v.is_finite() && v <= eps && v >= prev,
                    "eps={eps} a={a} v={v}"
                );
                prev = v;
            }
            assert!(eps - laplace_rdp(eps, 1e12) < 1e-9);
        }
        assert_eq!(laplace_rdp(0.0, 2.0), 0.0);
        // Huge eps, huge order: no overflow.
        assert!(laplace_rdp(50.0, 1024.0).is_finite());
    }
}
