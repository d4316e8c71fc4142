//! Personalised sampling (Jorgensen, Yu, Cormode 2015; PDP-PMF eq. 11; DESIGN 2.6) and
//! amplification by subsampling for pure DP (DESIGN 2.3).
//!
//! Keeping rating (i, j) with probability `pi = (e^eps_ij - 1)/(e^t - 1)` when
//! `eps_ij < t` (else 1) and then running a `t`-DP mechanism on the kept ratings is
//! `eps_ij`-DP for that rating, because `ln(1 + pi (e^t - 1)) = eps_ij`
//! (PDP-PMF Theorem, eqs. 14-16). The charge of a sampled rating is `min(eps_ij, t)`.

use rand::Rng;

use super::{check_positive, check_probability, invalid, PrivacyError, Result};

/// How the sampling threshold `t` is chosen from the (public) preferences.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// Mean of the preferences (the paper's default): ratings with `eps_ij >= t` are
    /// always kept and charged `t`.
    Mean,
    /// Maximum of the preferences: every rating is charged its full `eps_ij`, and all
    /// ratings below the maximum are subsampled.
    Max,
    /// A fixed value from configuration.
    Fixed(f64),
}

impl Threshold {
    /// The threshold `t` for a slice of preferences `eps_ij` (all must be finite and > 0).
    pub fn compute(&self, prefs: &[f64]) -> Result<f64> {
        for &e in prefs {
            check_positive("prefs[..]", e)?;
        }
        match *self {
            Threshold::Fixed(t) => check_positive("t", t),
            Threshold::Mean | Threshold::Max if prefs.is_empty() => {
                Err(invalid("prefs", "[]", "needs at least one preference"))
            }
            Threshold::Mean => Ok(prefs.iter().sum::<f64>() / prefs.len() as f64),
            Threshold::Max => Ok(prefs.iter().copied().fold(f64::MIN, f64::max)),
        }
    }
}

/// `pi(eps_ij, t)`: probability of keeping a rating with preference `eps_ij`.
pub fn sampling_probability(eps_ij: f64, t: f64) -> Result<f64> {
    let e = check_positive("eps_ij", eps_ij)?;
    let t = check_positive("t", t)?;
    if e >= t {
        return Ok(1.0);
    }
    // expm1 keeps small budgets accurate; for a huge t the ratio underflows towards 0,
    // which is the correct limit.
    let den = t.exp_m1();
    let pi = if den.is_finite() {
        e.exp_m1() / den
    } else {
        (e - t).exp()
    };
    Ok(pi.clamp(0.0, 1.0))
}

/// Bernoulli(`pi(eps_ij, t)`): whether the rating enters this release.
pub fn sample_in<R: Rng + ?Sized>(eps_ij: f64, t: f64, rng: &mut R) -> Result<bool> {
    let pi = sampling_probability(eps_ij, t)?;
    Ok(rng.random_bool(pi))
}

/// Charge of a sampled-in rating for a `t`-DP release: `min(eps_ij, t)`.
pub fn sampling_charge(eps_ij: f64, t: f64) -> Result<f64> {
    let e = check_positive("eps_ij", eps_ij)?;
    let t = check_positive("t", t)?;
    Ok(e.min(t))
}

/// Privacy of "keep with probability `pi`, then run a `t`-DP mechanism":
/// `ln(1 + pi (e^t - 1))`.
pub fn sampled_epsilon(pi: f64, t: f64) -> Result<f64> {
    let pi = check_probability("pi", pi)?;
    let t = check_positive("t", t)?;
    Ok(amplify(t, pi))
}

/// Amplification by subsampling for pure DP: an eps-DP mechanism run on a Poisson
/// subsample with rate `q` is `ln(1 + q (e^eps - 1))`-DP (exact; DESIGN 2.3 replaces the
/// paper's `q * eps`).
pub fn amplify_pure(eps: f64, q: f64) -> Result<f64> {
    let eps = check_positive("eps", eps)?;
    let q = check_probability("q", q)?;
    let r = amplify(eps, q);
    if !r.is_finite() {
        return Err(PrivacyError::Numerical {
            what: "amplify_pure",
            reason: format!("ln(1 + q(e^eps - 1)) overflows for eps = {eps}"),
        });
    }
    Ok(r)
}

fn amplify(eps: f64, q: f64) -> f64 {
    if q == 0.0 {
        return 0.0;
    }
    let em1 = eps.exp_m1();
    if em1.is_finite() {
        (q * em1).ln_1p()
    } else {
        // e^eps overflows: ln(1 + q(e^eps - 1)) = eps + ln(q (1 - e^-eps) + e^-eps).
        eps + (q * -(-eps).exp_m1() + (-eps).exp()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::stats::freq_tolerance;
    use crate::rng::seeded;

    /// Catches a wrong sampling probability: for eps_ij < t, sampling followed by a t-DP
    /// mechanism costs exactly eps_ij (identity to 1e-12); for eps_ij >= t, pi = 1 and
    /// the cost is t <= eps_ij. A pi that is 10% too large would cost more than eps_ij.
    #[test]
    fn sampling_then_t_dp_is_eps_ij_dp() {
        for &t in &[0.05, 0.445, 1.0, 3.0, 10.0] {
            for &e in &[0.01, 0.1, 0.2, 0.44, 0.9, 2.0, 9.9, 20.0] {
                let pi = sampling_probability(e, t).unwrap();
                let cost = sampled_epsilon(pi, t).unwrap();
                if e < t {
                    assert!(
                        (cost - e).abs() <= 1e-12 * e.max(1.0),
                        "t={t} e={e}: {cost}"
                    );
                    let too_big = sampled_epsilon((1.1 * pi).min(1.0), t).unwrap();
                    assert!(too_big > e, "1.1 pi not detected");
                } else {
                    assert_eq!(pi, 1.0);
                    assert!(cost <= e);
                }
                assert_eq!(sampling_charge(e, t).unwrap(), e.min(t));
            }
        }
    }

    /// Catches a sampler that does not use pi: the kept fraction over n = 100k draws is
    /// pi within 5.33 standard errors (false-failure ~1e-7).
    #[test]
    fn sample_in_frequency_matches_pi() {
        let n = 100_000;
        let (e, t) = (0.2, 1.0);
        let pi = sampling_probability(e, t).unwrap();
        let mut rng = seeded(13);
        let kept = (0..n)
            .filter(|_| sample_in(e, t, &mut rng).unwrap())
            .count();
        let f = kept as f64 / n as f64;
        assert!((f - pi).abs() < freq_tolerance(pi, n), "{f} vs {pi}");
        assert!((1.1 * pi - f).abs() > freq_tolerance(pi, n));
    }

    #[test]
    fn thresholds_from_preferences() {
        let prefs = [0.1, 0.2, 1.0, 0.3];
        assert!((Threshold::Mean.compute(&prefs).unwrap() - 0.4).abs() < 1e-12);
        assert_eq!(Threshold::Max.compute(&prefs).unwrap(), 1.0);
        assert_eq!(Threshold::Fixed(0.7).compute(&prefs).unwrap(), 0.7);
        assert_eq!(Threshold::Fixed(0.7).compute(&[]).unwrap(), 0.7);
        assert!(Threshold::Mean.compute(&[]).is_err());
        assert!(Threshold::Max.compute(&[0.1, f64::NAN]).is_err());
        assert!(Threshold::Fixed(-1.0).compute(&prefs).is_err());
        assert!(Threshold::Fixed(f64::INFINITY).compute(&prefs).is_err());
    }

    /// Catches the paper's linear `q * eps` (or any other formula): exact values of
    /// ln(1 + q(e^eps - 1)) at known points, limits q = 0, 1, and validation of q.
    #[test]
    fn amplification_by_subsampling_exact() {
        let e = 1.0f64;
        assert!((amplify_pure(e, 0.1).unwrap() - (1.0 + 0.1 * (e.exp() - 1.0)).ln()).abs() < 1e-15);
        assert!((amplify_pure(e, 1.0).unwrap() - e).abs() < 1e-15);
        assert_eq!(amplify_pure(e, 0.0).unwrap(), 0.0);
        // Amplified eps is above q*eps (the paper's figure under-charges).
        assert!(amplify_pure(2.0, 0.1).unwrap() > 0.2 * 1.5);
        // Small eps stays accurate (expm1/ln_1p): ln(1 + q(e^e - 1)) = qe + q(1-q)e^2/2 + O(e^3);
        // a naive exp(e) - 1 would be off by ~1e-16 absolute, i.e. 1e-8 relative.
        let small = 0.5e-8 + 0.125e-16;
        assert!((amplify_pure(1e-8, 0.5).unwrap() - small).abs() < 1e-22);
        assert!((amplify_pure(800.0, 0.5).unwrap() - (800.0 + 0.5f64.ln())).abs() < 1e-9);
        for bad in [-0.1, 1.1, f64::NAN] {
            assert!(amplify_pure(1.0, bad).is_err());
        }
        assert!(amplify_pure(f64::INFINITY, 0.5).is_err());
        assert!(amplify_pure(0.0, 0.5).is_err());
    }

    #[test]
    fn sampling_rejects_bad_parameters() {
        let mut rng = seeded(4);
        assert!(sampling_probability(0.0, 1.0).is_err());
        assert!(sampling_probability(0.5, f64::NAN).is_err());
        assert!(sample_in(f64::INFINITY, 1.0, &mut rng).is_err());
        assert!(sampled_epsilon(1.5, 1.0).is_err());
        // Huge thresholds do not overflow: pi tends to 0.
        let pi = sampling_probability(1.0, 1000.0).unwrap();
        assert!((0.0..1e-300).contains(&pi));
    }
}
