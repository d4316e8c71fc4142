//! Floating-point noise used *inside* training (gradients, objective perturbation).
//!
//! These samplers are not used for values released directly as `query + noise`: a
//! floating-point Laplace sample leaks low-order bits (Mironov 2012). Directly released
//! numbers go through [`super::discrete`].

use rand::Rng;
use rand_distr::{Distribution, Gamma, StandardNormal};

use super::{check_positive, invalid, PrivacyError, Result};

/// Largest dimension accepted by [`objective_perturbation`] (latent factor dimensions
/// are tens to hundreds; the cap turns an absurd request into an error, not an OOM).
pub const MAX_DIM: usize = 1 << 20;

/// One draw of Laplace(0, `scale`): density `exp(-|z|/scale) / (2 scale)`.
///
/// Sampled as a random sign times `scale * Exp(1)`, with `Exp(1) = -ln(1 - U)`,
/// `U` in `[0, 1)` so the logarithm is always finite.
pub fn laplace<R: Rng + ?Sized>(scale: f64, rng: &mut R) -> Result<f64> {
    let b = check_positive("scale", scale)?;
    let e = -(-rng.random::<f64>()).ln_1p();
    let s = if rng.random_bool(0.5) { 1.0 } else { -1.0 };
    Ok(s * b * e)
}

/// One draw of N(0, `sigma`^2).
pub fn gaussian<R: Rng + ?Sized>(sigma: f64, rng: &mut R) -> Result<f64> {
    let s = check_positive("sigma", sigma)?;
    let z: f64 = StandardNormal.sample(rng);
    Ok(s * z)
}

/// Objective-perturbation noise `eta` in R^`dim` with density `∝ exp(-eps ||eta||_2 / sensitivity)`.
///
/// In polar coordinates that density factorises into a norm with density
/// `∝ r^(d-1) exp(-r eps / Delta)`, i.e. `Gamma(shape d, scale Delta/eps)`, times a
/// direction uniform on the unit sphere (a normalised standard Gaussian vector).
/// `sensitivity` must bound the L2 change of the perturbed gradient term (DESIGN 2.1).
pub fn objective_perturbation<R: Rng + ?Sized>(
    dim: usize,
    eps: f64,
    sensitivity: f64,
    rng: &mut R,
) -> Result<Vec<f64>> {
    if dim == 0 || dim > MAX_DIM {
        return Err(invalid("dim", dim, "must be in [1, 2^20]"));
    }
    let eps = check_positive("eps", eps)?;
    let delta = check_positive("sensitivity", sensitivity)?;
    let scale = delta / eps;
    if !scale.is_finite() {
        return Err(invalid("eps", eps, "sensitivity/eps overflows"));
    }
    let gamma = Gamma::new(dim as f64, scale).map_err(|e| PrivacyError::Numerical {
        what: "objective perturbation Gamma law",
        reason: e.to_string(),
    })?;
    let norm = gamma.sample(rng);
    // A zero Gaussian vector has probability zero; redraw instead of dividing by zero.
    let dir = loop {
        let v: Vec<f64> = (0..dim).map(|_| StandardNormal.sample(rng)).collect();
        let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if n > 0.0 && n.is_finite() {
            break v.into_iter().map(|x| x / n).collect::<Vec<f64>>();
        }
    };
    Ok(dir.into_iter().map(|x| x * norm).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::stats::{gamma_int_cdf, ks_critical, ks_statistic, normal_cdf};
    use crate::rng::seeded;

    const N: usize = 100_000;
    /// KS false-failure rate per test: alpha = 1e-6.
    const ALPHA: f64 = 1e-6;

    fn laplace_cdf(x: f64, b: f64) -> f64 {
        if x < 0.0 {
            0.5 * (x / b).exp()
        } else {
            1.0 - 0.5 * (-x / b).exp()
        }
    }

    fn laplace_samples(b: f64, seed: u64) -> Vec<f64> {
        let mut rng = seeded(seed);
        (0..N).map(|_| laplace(b, &mut rng).unwrap()).collect()
    }

    /// Catches a wrong Laplace scale: KS at alpha = 1e-6 (D_crit = 0.0085 for n = 1e5),
    /// and samples drawn with 1.1 b must exceed it (expected D ≈ 0.017).
    #[test]
    fn laplace_ks_and_wrong_scale_detected() {
        let b = 2.5;
        let crit = ks_critical(N, ALPHA);
        let d = ks_statistic(laplace_samples(b, 11), |x| laplace_cdf(x, b));
        assert!(d < crit, "KS {d} >= {crit}");
        let d_wrong = ks_statistic(laplace_samples(1.1 * b, 12), |x| laplace_cdf(x, b));
        assert!(d_wrong > crit, "1.1b not detected: {d_wrong} <= {crit}");
    }

    /// Catches a wrong Gaussian sigma: KS at alpha = 1e-6; 1.1 sigma must exceed it
    /// (expected D ≈ 0.023).
    #[test]
    fn gaussian_ks_and_wrong_scale_detected() {
        let s = 0.7;
        let crit = ks_critical(N, ALPHA);
        let mut rng = seeded(21);
        let xs: Vec<f64> = (0..N).map(|_| gaussian(s, &mut rng).unwrap()).collect();
        let d = ks_statistic(xs, |x| normal_cdf(x / s));
        assert!(d < crit, "KS {d} >= {crit}");
        let xs: Vec<f64> = (0..N)
            .map(|_| gaussian(1.1 * s, &mut rng).unwrap())
            .collect();
        let d_wrong = ks_statistic(xs, |x| normal_cdf(x / s));
        assert!(
            d_wrong > crit,
            "1.1 sigma not detected: {d_wrong} <= {crit}"
        );
    }

    fn op_samples(d: usize, eps: f64, delta: f64, n: usize, seed: u64) -> Vec<Vec<f64>> {
        let mut rng = seeded(seed);
        (0..n)
            .map(|_| objective_perturbation(d, eps, delta, &mut rng).unwrap())
            .collect()
    }

    /// Catches a wrong norm law or scale of the objective-perturbation vector:
    /// KS of ||eta|| against Gamma(d, Delta/eps) at alpha = 1e-6, mean norm = d Delta/eps
    /// within 6 standard errors (false-failure ~2e-9), a 1.1x scale must fail the KS,
    /// and a wrong shape (d+1, the classic r^(d-1) Jacobian slip) must fail too.
    #[test]
    fn objective_perturbation_norm_is_gamma_d() {
        let (d, eps, delta) = (5usize, 0.8, 1.5);
        let n = 40_000;
        let scale = delta / eps;
        let crit = ks_critical(n, ALPHA);
        let norms = |v: &[Vec<f64>]| -> Vec<f64> {
            v.iter()
                .map(|x| x.iter().map(|a| a * a).sum::<f64>().sqrt())
                .collect()
        };
        let s = op_samples(d, eps, delta, n, 31);
        assert!(s.iter().all(|v| v.len() == d));
        let r = norms(&s);
        let mean = r.iter().sum::<f64>() / n as f64;
        let sd = (d as f64).sqrt() * scale / (n as f64).sqrt();
        assert!((mean - d as f64 * scale).abs() < 6.0 * sd, "mean {mean}");
        let ks = ks_statistic(r, |x| gamma_int_cdf(d, x / scale));
        assert!(ks < crit, "KS {ks} >= {crit}");

        let wrong = norms(&op_samples(d, eps / 1.1, delta, n, 32));
        let ks_wrong = ks_statistic(wrong, |x| gamma_int_cdf(d, x / scale));
        assert!(ks_wrong > crit, "1.1x scale not detected: {ks_wrong}");
        let ks_shape = ks_statistic(norms(&s), |x| gamma_int_cdf(d + 1, x / scale));
        assert!(ks_shape > crit, "shape d+1 not detected: {ks_shape}");
    }

    /// Catches a non-uniform direction: each coordinate of eta/||eta|| has mean 0 and
    /// E[u_k^2] = 1/d; tolerances are 6 standard errors (false-failure ~2e-9 each).
    #[test]
    fn objective_perturbation_direction_is_uniform() {
        let (d, n) = (4usize, 40_000usize);
        let s = op_samples(d, 1.0, 1.0, n, 41);
        for k in 0..d {
            let u: Vec<f64> = s
                .iter()
                .map(|v| v[k] / v.iter().map(|a| a * a).sum::<f64>().sqrt())
                .collect();
            let m = u.iter().sum::<f64>() / n as f64;
            let m2 = u.iter().map(|a| a * a).sum::<f64>() / n as f64;
            // Var(u_k) = 1/d, Var(u_k^2) <= 1/d.
            let se = (1.0 / d as f64 / n as f64).sqrt();
            assert!(m.abs() < 6.0 * se, "coord {k} mean {m}");
            assert!(
                (m2 - 1.0 / d as f64).abs() < 6.0 * se,
                "coord {k} E[u^2] {m2}"
            );
        }
    }

    #[test]
    fn continuous_samplers_reject_bad_parameters() {
        let mut rng = seeded(1);
        assert!(laplace(0.0, &mut rng).is_err());
        assert!(laplace(f64::NAN, &mut rng).is_err());
        assert!(gaussian(-1.0, &mut rng).is_err());
        assert!(gaussian(f64::INFINITY, &mut rng).is_err());
        assert!(objective_perturbation(0, 1.0, 1.0, &mut rng).is_err());
        assert!(objective_perturbation(usize::MAX, 1.0, 1.0, &mut rng).is_err());
        assert!(objective_perturbation(3, f64::NAN, 1.0, &mut rng).is_err());
        assert!(objective_perturbation(3, 1.0, 0.0, &mut rng).is_err());
        assert!(objective_perturbation(3, 1e-320, 1e10, &mut rng).is_err());
    }
}
