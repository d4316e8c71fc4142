//! Exact integer samplers for values that are RELEASED DIRECTLY (Canonne, Kamath,
//! Steinke 2020, "The Discrete Gaussian for Differential Privacy", Algorithms 1-3).
//!
//! A floating-point Laplace sample added to a published number leaks through the
//! uneven set of representable outputs (Mironov 2012). Here every random decision is a
//! comparison of a uniform integer draw (`random_range` on `u128`, which is unbiased)
//! with an integer threshold, and the outputs are integers, so the realised
//! distribution is exactly the stated one (up to the overflow guards documented on
//! [`discrete_gaussian`], whose effect is below `e^(-2^29)`).
//!
//! Real-valued queries are released on an integer grid: [`release_on_grid`] divides by
//! the grid step (e.g. the rating step 0.5), adds discrete Laplace noise calibrated to the
//! sensitivity *in grid steps*, and multiplies back, so published values are exact
//! multiples of the step.

use rand::Rng;

use super::{check_finite, check_positive, invalid, PrivacyError, Result};

/// A non-negative rational `num/den` with `den >= 1` (scales, `sigma^2`, `gamma`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rational {
    /// Numerator.
    pub num: u64,
    /// Denominator (>= 1).
    pub den: u64,
}

/// Denominator used when a real scale is rounded up to a rational (2^20: the rounding
/// adds at most ~1e-6 to the scale, always in the safe direction).
const ROUNDING_DEN: u64 = 1 << 20;

/// Bound on the parts of `sigma^2` for the discrete Gaussian so that every intermediate
/// fits in `u128` (see [`discrete_gaussian`]).
pub const MAX_SIGMA2_PART: u64 = 1 << 48;

impl Rational {
    /// `num/den`; rejects `den = 0`.
    pub fn new(num: u64, den: u64) -> Result<Self> {
        if den == 0 {
            return Err(invalid("den", den, "denominator must be >= 1"));
        }
        Ok(Self { num, den })
    }

    /// The smallest `k / 2^20` that is `>=` `x` plus one grid unit of slack, so that
    /// floating-point error in computing `x` (e.g. `Delta/eps`) can only make the
    /// resulting noise scale larger, never smaller.
    pub fn at_least(x: f64) -> Result<Self> {
        let x = check_positive("x", x)?;
        // Multiplying by a power of two is exact; the ceiling is then exact too.
        let scaled = (x * ROUNDING_DEN as f64).ceil() + 1.0;
        if scaled >= (1u64 << 62) as f64 {
            return Err(invalid(
                "x",
                x,
                "too large to represent as a scale (max ~2^42)",
            ));
        }
        Ok(Self {
            num: scaled as u64,
            den: ROUNDING_DEN,
        })
    }

    /// Value as `f64` (for display and tests only; samplers never use it).
    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }
}

/// Bernoulli(n/d) from one uniform integer draw in `[0, d)`; requires `n <= d`, `d >= 1`.
fn bern_frac<R: Rng + ?Sized>(n: u128, d: u128, rng: &mut R) -> bool {
    rng.random_range(0..d) < n
}

/// Bernoulli(exp(-n/d)), CKS Algorithm 1, integer arithmetic only; `d >= 1`.
fn bern_exp<R: Rng + ?Sized>(n: u128, d: u128, rng: &mut R) -> bool {
    if n == 0 {
        return true;
    }
    if n <= d {
        // K = first k with A_k = 0, A_k ~ Bernoulli(gamma/k); return [K odd].
        // Bernoulli(n/(d k)) is drawn as Bernoulli(n/d) AND Bernoulli(1/k) to avoid d*k.
        let mut k: u128 = 1;
        loop {
            let a = bern_frac(n, d, rng) && bern_frac(1, k, rng);
            if !a {
                break;
            }
            k += 1;
        }
        return k % 2 == 1;
    }
    // exp(-gamma) = exp(-1)^floor(gamma) * exp(-(gamma - floor(gamma))).
    let whole = n / d;
    let rest = n % d;
    let mut i: u128 = 0;
    while i < whole {
        if !bern_exp(1, 1, rng) {
            return false;
        }
        i += 1;
    }
    bern_exp(rest, d, rng)
}

/// Bernoulli(exp(-`gamma`)) for a rational `gamma >= 0`, exactly (CKS Algorithm 1).
pub fn bernoulli_exp<R: Rng + ?Sized>(gamma: Rational, rng: &mut R) -> Result<bool> {
    let g = Rational::new(gamma.num, gamma.den)?;
    Ok(bern_exp(g.num as u128, g.den as u128, rng))
}

/// Discrete Laplace with scale `num/den` (CKS Algorithm 2, their `t = num`, `s = den`).
fn dlap<R: Rng + ?Sized>(num: u128, den: u128, rng: &mut R) -> i64 {
    loop {
        let u = rng.random_range(0..num);
        if !bern_exp(u, num, rng) {
            continue;
        }
        let mut v: u128 = 0;
        while bern_exp(1, 1, rng) {
            v += 1;
        }
        // Overflow needs v > 2^64 geometric successes (probability e^-(2^64)); redraw.
        let Some(x) = num.checked_mul(v).and_then(|nv| nv.checked_add(u)) else {
            continue;
        };
        let y = x / den;
        let negative: bool = rng.random();
        if negative && y == 0 {
            continue;
        }
        let Ok(y) = i64::try_from(y) else {
            continue;
        };
        return if negative { -y } else { y };
    }
}

/// One draw of the discrete Laplace law on the integers with scale `t = scale`:
/// `P(k) ∝ exp(-|k| / t)`. Adding it to an integer query of sensitivity `Delta` is
/// `Delta/t`-DP.
pub fn discrete_laplace<R: Rng + ?Sized>(scale: Rational, rng: &mut R) -> Result<i64> {
    let s = Rational::new(scale.num, scale.den)?;
    if s.num == 0 {
        return Err(invalid("scale", "0", "must be > 0"));
    }
    Ok(dlap(s.num as u128, s.den as u128, rng))
}

/// `floor(sqrt(a/b))` exactly.
fn floor_sqrt_ratio(a: u128, b: u128) -> u128 {
    let mut k = ((a as f64) / (b as f64)).sqrt().floor() as u128;
    while k > 0 && k * k * b > a {
        k -= 1;
    }
    while (k + 1) * (k + 1) * b <= a {
        k += 1;
    }
    k
}

/// One draw of the discrete Gaussian `P(k) ∝ exp(-k^2 / (2 sigma^2))`, `sigma^2 = sigma2`
/// (CKS Algorithm 3: discrete Laplace proposal with `t = floor(sigma) + 1`, accepted with
/// probability `exp(-(|y| - sigma^2/t)^2 / (2 sigma^2))`).
///
/// With `sigma^2 = a/b` the acceptance exponent is the rational
/// `(|y| b t - a)^2 / (2 a b t^2)`. Both parts of `sigma2` must be in
/// `[1, 2^48]`, which keeps the denominator below `2^99`; a numerator that overflows
/// `u128` then means an exponent above `2^29`, whose acceptance probability
/// `< e^(-2^29)` is treated as 0 (the proposal is redrawn).
pub fn discrete_gaussian<R: Rng + ?Sized>(sigma2: Rational, rng: &mut R) -> Result<i64> {
    let s = Rational::new(sigma2.num, sigma2.den)?;
    if s.num == 0 || s.num > MAX_SIGMA2_PART {
        return Err(invalid("sigma2.num", s.num, "must be in [1, 2^48]"));
    }
    if s.den > MAX_SIGMA2_PART {
        return Err(invalid("sigma2.den", s.den, "must be in [1, 2^48]"));
    }
    let (a, b) = (s.num as u128, s.den as u128);
    let t = floor_sqrt_ratio(a, b) + 1;
    let bt = b * t;
    let den = 2 * a * b * t * t;
    loop {
        let y = dlap(t, 1, rng);
        let Some(ybt) = bt.checked_mul(y.unsigned_abs() as u128) else {
            continue;
        };
        let w = ybt.abs_diff(a);
        let Some(num) = w.checked_mul(w) else {
            continue;
        };
        if bern_exp(num, den, rng) {
            return Ok(y);
        }
    }
}

/// A value released on an integer grid with discrete Laplace noise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GridRelease {
    /// Noisy value in grid units (an integer: this is what the guarantee is about).
    pub steps: i64,
    /// `steps * step` (post-processing; an exact multiple of the step).
    pub value: f64,
    /// Discrete Laplace scale actually used, in grid units (`>= sensitivity_steps/eps`).
    pub scale: Rational,
}

/// Releases an integer query `steps` (a value in grid units) with eps-DP: adds discrete
/// Laplace noise with scale `t >= sensitivity_steps/eps` (rounded up to a rational), so
/// the release is `sensitivity_steps/t <= eps`-DP. Returns the noisy integer and `t`.
///
/// This is the preferred entry point: accumulate sums directly in integer grid units
/// (e.g. ratings times 2 for a 0.5 step) so no floating-point rounding is involved.
pub fn release_steps<R: Rng + ?Sized>(
    steps: i64,
    sensitivity_steps: u64,
    eps: f64,
    rng: &mut R,
) -> Result<(i64, Rational)> {
    let eps = check_positive("eps", eps)?;
    if sensitivity_steps == 0 {
        return Err(invalid("sensitivity_steps", 0, "must be >= 1"));
    }
    let scale = Rational::at_least(sensitivity_steps as f64 / eps)?;
    let noise = discrete_laplace(scale, rng)?;
    let noisy = steps
        .checked_add(noise)
        .ok_or_else(|| PrivacyError::Numerical {
            what: "release_steps",
            reason: "noisy value overflows i64 grid units".to_string(),
        })?;
    Ok((noisy, scale))
}

/// Releases a real query `value` that lives on the grid `step * Z` (e.g. a sum of
/// ratings in units of the rating step) with eps-DP, via [`release_steps`].
///
/// `sensitivity_steps` is the largest change of `value / step` between neighbours, in
/// grid steps: for a sum of ratings in `[r_min, r_max]` on a `step` grid under add/remove
/// of one rating it is `max(|r_min|, |r_max|) / step` (e.g. 10 for ratings 0.5..5 step
/// 0.5; under value replacement it is `(r_max - r_min)/step`); for a count it is 1.
/// `value / step` must be within 1e-3 of an integer of magnitude `< 2^53` (so the
/// rounding recovers the exact integer query whose sensitivity is claimed); off-grid
/// values are rejected rather than silently rounded.
pub fn release_on_grid<R: Rng + ?Sized>(
    value: f64,
    step: f64,
    sensitivity_steps: u64,
    eps: f64,
    rng: &mut R,
) -> Result<GridRelease> {
    let value = check_finite("value", value)?;
    let step = check_positive("step", step)?;
    let units = value / step;
    let k = units.round();
    if !k.is_finite() || k.abs() >= (1u64 << 53) as f64 {
        return Err(invalid(
            "value",
            value,
            "too large in grid units (max 2^53)",
        ));
    }
    if (units - k).abs() > 1e-3 {
        return Err(invalid(
            "value",
            value,
            "must be an integer multiple of step",
        ));
    }
    let (steps, scale) = release_steps(k as i64, sensitivity_steps, eps, rng)?;
    Ok(GridRelease {
        steps,
        value: steps as f64 * step,
        scale,
    })
}

/// eps-DP count (sensitivity 1 under add/remove of one rating), e.g. item popularity for
/// the cold-start fallback. May be negative; clamping afterwards is post-processing.
pub fn release_count<R: Rng + ?Sized>(count: u64, eps: f64, rng: &mut R) -> Result<i64> {
    let k = i64::try_from(count).map_err(|_| invalid("count", count, "must be < 2^63"))?;
    Ok(release_steps(k, 1, eps, rng)?.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::stats::{chi_square, chi_square_critical_1e6, freq_tolerance};
    use crate::rng::seeded;

    const N: usize = 50_000;

    /// Catches a wrong Bernoulli(exp(-gamma)) for gamma below, at and above 1: frequency
    /// within 5.33 standard errors of exp(-gamma) (false-failure ~1e-7 each); the value
    /// for 1.1 gamma must be outside that tolerance.
    #[test]
    fn bernoulli_exp_frequencies_and_wrong_gamma_detected() {
        let n = 100_000;
        let mut rng = seeded(17);
        for &(num, den) in &[(0u64, 1u64), (1, 3), (1, 1), (5, 2), (7, 3), (9, 4)] {
            let g = Rational::new(num, den).unwrap();
            let p = (-g.to_f64()).exp();
            let hits = (0..n)
                .filter(|_| bernoulli_exp(g, &mut rng).unwrap())
                .count();
            let f = hits as f64 / n as f64;
            let tol = freq_tolerance(p, n).max(1e-12);
            assert!((f - p).abs() <= tol, "gamma={num}/{den}: {f} vs {p}");
            if num > 0 {
                let wrong = (-1.1 * g.to_f64()).exp();
                assert!(
                    (f - wrong).abs() > tol,
                    "1.1 gamma not detected at {num}/{den}"
                );
            }
        }
        assert!(bernoulli_exp(Rational { num: 1, den: 0 }, &mut rng).is_err());
    }

    fn dlap_pmf(k: i64, t: f64) -> f64 {
        let q = (-1.0 / t).exp();
        (1.0 - q) / (1.0 + q) * q.powi(k.unsigned_abs() as i32)
    }

    fn dgauss_pmf_table(sigma2: f64) -> impl Fn(i64) -> f64 {
        let lim = (40.0 * sigma2.sqrt()).ceil() as i64 + 40;
        let z: f64 = (-lim..=lim)
            .map(|k| (-(k * k) as f64 / (2.0 * sigma2)).exp())
            .sum();
        move |k: i64| (-(k * k) as f64 / (2.0 * sigma2)).exp() / z
    }

    /// Support of cells with expected count >= 5 (rest pooled).
    fn support<P: Fn(i64) -> f64>(pmf: &P, n: usize) -> Vec<i64> {
        let mut k = 0;
        while pmf(k + 1) * n as f64 >= 5.0 {
            k += 1;
        }
        (-k..=k).collect()
    }

    /// Catches a wrong discrete Laplace scale: Pearson chi-square against
    /// P(k) = (1-q)/(1+q) q^|k|, q = e^(-1/t), at alpha = 1e-6 (Wilson-Hilferty critical
    /// value), n = 50k; samples with scale 1.1 t must exceed the critical value.
    #[test]
    fn discrete_laplace_chi_square_and_wrong_scale_detected() {
        let mut rng = seeded(23);
        for &(num, den) in &[(3u64, 2u64), (7, 1), (2, 5)] {
            let t = num as f64 / den as f64;
            let s = Rational::new(num, den).unwrap();
            let xs: Vec<i64> = (0..N)
                .map(|_| discrete_laplace(s, &mut rng).unwrap())
                .collect();
            let pmf = |k| dlap_pmf(k, t);
            let sup = support(&pmf, N);
            let (stat, df) = chi_square(&xs, &sup, pmf);
            let crit = chi_square_critical_1e6(df);
            assert!(stat < crit, "t={t}: chi2 {stat} >= {crit} (df {df})");
            let wrong = Rational::new(11 * num, 10 * den).unwrap();
            let xs: Vec<i64> = (0..N)
                .map(|_| discrete_laplace(wrong, &mut rng).unwrap())
                .collect();
            let (stat, df) = chi_square(&xs, &sup, pmf);
            assert!(
                stat > chi_square_critical_1e6(df),
                "1.1t not detected at t={t}"
            );
        }
        assert!(discrete_laplace(Rational { num: 0, den: 1 }, &mut rng).is_err());
    }

    /// Catches a wrong discrete Gaussian sigma (including the sigma < 1 branch where
    /// t = 1): chi-square against exp(-k^2/(2 sigma^2))/Z at alpha = 1e-6, n = 50k; sigma^2
    /// multiplied by 1.21 (sigma by 1.1) must exceed the critical value.
    #[test]
    fn discrete_gaussian_chi_square_and_wrong_scale_detected() {
        let mut rng = seeded(29);
        for &(num, den) in &[(5u64, 2u64), (49, 1), (1, 4)] {
            let s2 = num as f64 / den as f64;
            let s = Rational::new(num, den).unwrap();
            let xs: Vec<i64> = (0..N)
                .map(|_| discrete_gaussian(s, &mut rng).unwrap())
                .collect();
            let pmf = dgauss_pmf_table(s2);
            let sup = support(&pmf, N);
            let (stat, df) = chi_square(&xs, &sup, &pmf);
            let crit = chi_square_critical_1e6(df);
            assert!(stat < crit, "s2={s2}: chi2 {stat} >= {crit} (df {df})");
            let wrong = Rational::new(121 * num, 100 * den).unwrap();
            let xs: Vec<i64> = (0..N)
                .map(|_| discrete_gaussian(wrong, &mut rng).unwrap())
                .collect();
            let (stat, df) = chi_square(&xs, &sup, &pmf);
            assert!(
                stat > chi_square_critical_1e6(df),
                "1.1 sigma not detected at {s2}"
            );
        }
    }

    #[test]
    fn discrete_gaussian_large_sigma_and_validation() {
        let mut rng = seeded(31);
        // sigma = 2^20 (the large-integer path): sample variance / sigma^2 within
        // [0.8, 1.2], i.e. > 6 standard errors (sd sqrt(2/n) = 0.032, n = 2000; false-failure
        // ~1e-9). A 10% wrong sigma gives 1.21, outside the band.
        let s = Rational::new(1 << 40, 1).unwrap();
        let xs: Vec<f64> = (0..2000)
            .map(|_| discrete_gaussian(s, &mut rng).unwrap() as f64)
            .collect();
        let var = xs.iter().map(|x| x * x).sum::<f64>() / xs.len() as f64;
        let ratio = var / (1u64 << 40) as f64;
        assert!((0.8..1.2).contains(&ratio), "variance ratio {ratio}");
        assert!(discrete_gaussian(Rational { num: 0, den: 1 }, &mut rng).is_err());
        assert!(discrete_gaussian(Rational { num: 1, den: 0 }, &mut rng).is_err());
        assert!(discrete_gaussian(Rational::new(1 << 49, 1).unwrap(), &mut rng).is_err());
        assert!(discrete_gaussian(Rational::new(1, 1 << 49).unwrap(), &mut rng).is_err());
        assert_eq!(floor_sqrt_ratio(49, 1), 7);
        assert_eq!(floor_sqrt_ratio(48, 1), 6);
        assert_eq!(floor_sqrt_ratio(5, 2), 1);
        assert_eq!(floor_sqrt_ratio(1, 4), 0);
    }

    /// Catches a wrong sensitivity-to-scale conversion in the grid release: the noise
    /// (steps - true steps) follows discrete Laplace with scale Delta_steps/eps (chi-square,
    /// alpha = 1e-6); 10% less noise (eps * 1.1) fails the same test. Outputs are exact
    /// multiples of the step.
    #[test]
    fn release_on_grid_noise_law_and_wrong_scale_detected() {
        let mut rng = seeded(37);
        let (step, sens, eps) = (0.5, 10u64, 4.0);
        let value = 1234.5; // 2469 steps
        let t = sens as f64 / eps;
        let pmf = |k| dlap_pmf(k, t);
        let sup = support(&pmf, N);
        let mut noise = Vec::with_capacity(N);
        for _ in 0..N {
            let r = release_on_grid(value, step, sens, eps, &mut rng).unwrap();
            assert_eq!(r.value, r.steps as f64 * step);
            assert!(r.scale.to_f64() >= t && r.scale.to_f64() < t + 3e-6);
            noise.push(r.steps - 2469);
        }
        let (stat, df) = chi_square(&noise, &sup, pmf);
        assert!(stat < chi_square_critical_1e6(df), "chi2 {stat} (df {df})");
        let wrong: Vec<i64> = (0..N)
            .map(|_| {
                release_on_grid(value, step, sens, 1.1 * eps, &mut rng)
                    .unwrap()
                    .steps
                    - 2469
            })
            .collect();
        let (stat, df) = chi_square(&wrong, &sup, pmf);
        assert!(stat > chi_square_critical_1e6(df), "eps*1.1 not detected");
    }

    #[test]
    fn release_validation_and_counts() {
        let mut rng = seeded(41);
        assert!(release_on_grid(1.25, 0.5, 10, 1.0, &mut rng).is_err());
        assert!(release_on_grid(f64::NAN, 0.5, 10, 1.0, &mut rng).is_err());
        assert!(release_on_grid(1.0, 0.0, 10, 1.0, &mut rng).is_err());
        assert!(release_on_grid(1.0, 0.5, 0, 1.0, &mut rng).is_err());
        assert!(release_on_grid(1.0, 0.5, 1, f64::INFINITY, &mut rng).is_err());
        assert!(release_on_grid(1e300, 0.5, 1, 1.0, &mut rng).is_err());
        // A float sum slightly off the grid (0.1 + 0.2) is accepted as 3 steps of 0.1.
        assert!(release_on_grid(0.1 + 0.2, 0.1, 1, 1.0, &mut rng).is_ok());
        assert!(release_count(u64::MAX, 1.0, &mut rng).is_err());
        assert!(release_steps(1, 1, 0.0, &mut rng).is_err());
        // Overflow of the noisy value is an error, never a panic.
        for _ in 0..20 {
            let _ = release_steps(i64::MAX, 1, 1.0, &mut rng);
        }
        // Counts above 2^53 are handled exactly in integers.
        let big = (1u64 << 60) + 1;
        let c = release_count(big, 1e3, &mut rng).unwrap();
        assert!((c - big as i64).abs() <= 1);
        let c = release_count(100, 1e3, &mut rng).unwrap();
        assert!((99..=101).contains(&c));
        let r = Rational::at_least(2.5).unwrap();
        assert!(r.to_f64() >= 2.5 && r.to_f64() - 2.5 < 2e-6);
        assert!(Rational::at_least(f64::NAN).is_err());
        assert!(Rational::at_least(1e20).is_err());
    }
}
