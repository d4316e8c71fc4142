//! Empirical privacy auditing (pure; no I/O): a statistical LOWER bound on the eps of a
//! mechanism, from many runs on two neighbouring inputs D and D'.
//!
//! Method (Jagielski, Ullman, Oprea 2020, "Auditing differentially private machine
//! learning"; Nasr et al. 2021, "Adversary instantiation"): a distinguisher guesses "D'"
//! when a released statistic crosses a threshold. If the mechanism is (eps, delta)-DP,
//! every such test has `FPR + e^eps FNR >= 1 - delta` and `FNR + e^eps FPR >= 1 - delta`,
//! so
//!
//! `eps >= max( ln((1 - delta - FNR) / FPR), ln((1 - delta - FPR) / FNR) )`.
//!
//! FPR and FNR are replaced by their one-sided Clopper-Pearson upper bounds, each at level
//! `(1 - confidence) / 2`, so the returned bound holds with probability at least
//! `confidence` over the runs (union bound). The threshold and its direction are chosen on
//! one half of the runs and the bound is computed on the other half, so the choice does
//! not bias the bound.
//!
//! Use: a test runs the real mechanism (a release's noisy statistic) on D and D', and
//! asserts that the bound is below the eps the ledger charges, and that the same audit
//! finds a bound ABOVE the charged eps when the noise scale is halved or the noise is
//! missing (so the test can fail).

use rand::Rng;

/// Settings of [`audit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AuditConfig {
    /// Runs on each of D and D' (half choose the threshold, half give the bound).
    pub trials: usize,
    /// Probability that the bound holds (e.g. 0.95).
    pub confidence: f64,
    /// The delta of the (eps, delta) claim being audited (0 for pure DP).
    pub delta: f64,
}

/// What [`audit`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AuditResult {
    /// Lower bound on eps, valid with probability `confidence` (0 when nothing is found).
    pub eps_lower: f64,
    /// The chosen threshold of the released statistic.
    pub threshold: f64,
    /// `true`: the test guesses D' when the statistic is above the threshold.
    pub above: bool,
    /// Clopper-Pearson upper bounds of the false positive / false negative rates.
    pub fpr_upper: f64,
    pub fnr_upper: f64,
}

/// ln(exp(a) + exp(b)) without overflow (either may be -inf).
fn log_add(a: f64, b: f64) -> f64 {
    if a == f64::NEG_INFINITY {
        return b;
    }
    if b == f64::NEG_INFINITY {
        return a;
    }
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    hi + (lo - hi).exp().ln_1p()
}

/// `P[X <= k]` for `X ~ Binomial(n, p)`, `0 < p < 1`, summed in log space.
pub fn binomial_cdf(k: u64, n: u64, p: f64) -> f64 {
    if k >= n {
        return 1.0;
    }
    let lp = p.ln();
    let lq = (-p).ln_1p();
    let mut term = n as f64 * lq;
    let mut acc = term;
    for j in 1..=k {
        term += ((n - j + 1) as f64 / j as f64).ln() + lp - lq;
        acc = log_add(acc, term);
    }
    acc.exp().min(1.0)
}

/// One-sided Clopper-Pearson upper bound on p from `k` successes in `n` trials:
/// the largest p with `P[X <= k | p] >= alpha`.
pub fn clopper_pearson_upper(k: u64, n: u64, alpha: f64) -> f64 {
    assert!(n > 0 && k <= n && alpha > 0.0 && alpha < 1.0);
    if k == n {
        return 1.0;
    }
    let (mut lo, mut hi) = (k as f64 / n as f64, 1.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= 0.0 || mid >= 1.0 {
            break;
        }
        if binomial_cdf(k, n, mid) >= alpha {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-12 * hi {
            break;
        }
    }
    hi
}

/// One-sided Clopper-Pearson lower bound on p from `k` successes in `n` trials:
/// the smallest p with `P[X >= k | p] >= alpha`.
pub fn clopper_pearson_lower(k: u64, n: u64, alpha: f64) -> f64 {
    assert!(n > 0 && k <= n);
    if k == 0 {
        return 0.0;
    }
    1.0 - clopper_pearson_upper(n - k, n, alpha)
}

/// The eps lower bound implied by false positive / negative rate bounds at `delta`.
pub fn eps_from_rates(fpr: f64, fnr: f64, delta: f64) -> f64 {
    let one = |a: f64, b: f64| {
        let num = 1.0 - delta - a;
        if num <= 0.0 {
            0.0
        } else if b <= 0.0 {
            f64::INFINITY
        } else {
            (num / b).ln().max(0.0)
        }
    };
    one(fnr, fpr).max(one(fpr, fnr))
}

/// Counts of `xs` (sorted) strictly above `t`.
fn above(xs: &[f64], t: f64) -> usize {
    xs.len() - xs.partition_point(|&x| x <= t)
}

/// Candidate thresholds: quantiles of the pooled sample.
fn candidates(a: &[f64], b: &[f64]) -> Vec<f64> {
    let mut all: Vec<f64> = a.iter().chain(b).copied().collect();
    all.sort_by(f64::total_cmp);
    let k = 400.min(all.len());
    let mut c: Vec<f64> = (0..k)
        .map(|i| all[i * (all.len() - 1) / k.max(1)])
        .collect();
    c.push(all[all.len() - 1]);
    c.dedup();
    c
}

/// Rates of the test "guess D' iff statistic > t" (or `< =`, `above = false`).
fn rates(d: &[f64], d1: &[f64], t: f64, above_dir: bool) -> (u64, u64) {
    let (n0, n1) = (d.len(), d1.len());
    if above_dir {
        // false positive: D run above t; false negative: D' run at or below t.
        (above(d, t) as u64, (n1 - above(d1, t)) as u64)
    } else {
        ((n0 - above(d, t)) as u64, above(d1, t) as u64)
    }
}

/// A quick, slightly pessimistic eps estimate for choosing the threshold (not a bound).
fn rough(fp: u64, n0: usize, fn_: u64, n1: usize, delta: f64) -> f64 {
    let pess = |k: u64, n: usize| (k as f64 + 2.0 * (k as f64).sqrt() + 2.0) / n as f64;
    eps_from_rates(pess(fp, n0), pess(fn_, n1), delta)
}

/// Audits a mechanism: `run(neighbour, rng)` returns the released statistic of one run on
/// D (`neighbour = false`) or on D' (`true`); see the module documentation.
pub fn audit<R, F>(cfg: &AuditConfig, mut run: F, rng: &mut R) -> AuditResult
where
    R: Rng + ?Sized,
    F: FnMut(bool, &mut R) -> f64,
{
    assert!(cfg.trials >= 4, "at least 4 trials");
    assert!(cfg.confidence > 0.0 && cfg.confidence < 1.0);
    let mut d: Vec<f64> = Vec::with_capacity(cfg.trials);
    let mut d1: Vec<f64> = Vec::with_capacity(cfg.trials);
    // Interleave the runs so a drifting generator cannot bias one side.
    for _ in 0..cfg.trials {
        d.push(run(false, rng));
        d1.push(run(true, rng));
    }
    assert!(
        d.iter().chain(&d1).all(|x| !x.is_nan()),
        "the statistic is NaN"
    );
    let half = cfg.trials / 2;
    let (mut sel0, mut est0) = (d[..half].to_vec(), d[half..].to_vec());
    let (mut sel1, mut est1) = (d1[..half].to_vec(), d1[half..].to_vec());
    for v in [&mut sel0, &mut est0, &mut sel1, &mut est1] {
        v.sort_by(f64::total_cmp);
    }
    // Choose the threshold and direction on the selection half.
    let mut best = (f64::NEG_INFINITY, 0.0, true);
    for t in candidates(&sel0, &sel1) {
        for dir in [true, false] {
            let (fp, fn_) = rates(&sel0, &sel1, t, dir);
            let e = rough(fp, sel0.len(), fn_, sel1.len(), cfg.delta);
            if e > best.0 {
                best = (e, t, dir);
            }
        }
    }
    let (_, threshold, dir) = best;
    // Bound on the estimation half.
    let alpha = (1.0 - cfg.confidence) / 2.0;
    let (fp, fn_) = rates(&est0, &est1, threshold, dir);
    let fpr_upper = clopper_pearson_upper(fp, est0.len() as u64, alpha);
    let fnr_upper = clopper_pearson_upper(fn_, est1.len() as u64, alpha);
    AuditResult {
        eps_lower: eps_from_rates(fpr_upper, fnr_upper, cfg.delta),
        threshold,
        above: dir,
        fpr_upper,
        fnr_upper,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dprec_dp::rng::seeded;

    #[test]
    fn binomial_cdf_small_cases() {
        // n = 3, p = 0.5: P[X <= 1] = 4/8.
        assert!((binomial_cdf(1, 3, 0.5) - 0.5).abs() < 1e-14);
        assert!((binomial_cdf(0, 10, 0.1) - 0.9f64.powi(10)).abs() < 1e-14);
        assert_eq!(binomial_cdf(10, 10, 0.3), 1.0);
        // Large n stays finite and accurate: P[X <= np] ~ 1/2 for n = 1e5, p = 0.5.
        let c = binomial_cdf(50_000, 100_000, 0.5);
        assert!((c - 0.5).abs() < 0.01, "{c}");
    }

    /// Known values: zero successes out of n at alpha gives 1 - alpha^(1/n); the bounds
    /// bracket k/n and shrink like 1/sqrt(n).
    #[test]
    fn clopper_pearson_known_values() {
        let u = clopper_pearson_upper(0, 100, 0.025);
        assert!((u - (1.0 - 0.025f64.powf(0.01))).abs() < 1e-9, "{u}");
        let l = clopper_pearson_lower(100, 100, 0.025);
        assert!((l - 0.025f64.powf(0.01)).abs() < 1e-9, "{l}");
        for (k, n) in [(5u64, 100u64), (500, 10_000), (1, 3)] {
            let (lo, hi) = (
                clopper_pearson_lower(k, n, 0.025),
                clopper_pearson_upper(k, n, 0.025),
            );
            let p = k as f64 / n as f64;
            assert!(lo < p && p < hi, "{k}/{n}: {lo} {hi}");
            // At the bounds the tail probabilities equal alpha.
            assert!((binomial_cdf(k, n, hi) - 0.025).abs() < 1e-6);
            assert!((1.0 - binomial_cdf(k - 1, n, lo) - 0.025).abs() < 1e-6);
        }
    }

    #[test]
    fn eps_from_rates_cases() {
        assert_eq!(eps_from_rates(0.5, 0.5, 0.0), 0.0);
        assert!((eps_from_rates(0.1, 0.5, 0.0) - (0.5f64 / 0.1).ln()).abs() < 1e-12);
        assert!(eps_from_rates(0.0, 0.5, 0.0).is_infinite());
        // delta eats into the numerator.
        assert!(eps_from_rates(0.1, 0.5, 0.4) < eps_from_rates(0.1, 0.5, 0.0));
    }

    /// Identical distributions on D and D': the bound is 0 or tiny; shifted point
    /// masses (no noise): the bound is large.
    #[test]
    fn audit_of_trivial_mechanisms() {
        let cfg = AuditConfig {
            trials: 20_000,
            confidence: 0.95,
            delta: 0.0,
        };
        let mut rng = seeded(1);
        let same = audit(&cfg, |_, r| r.random::<f64>(), &mut rng);
        assert!(same.eps_lower < 0.1, "{same:?}");
        let exact = audit(&cfg, |n, _| if n { 1.0 } else { 0.0 }, &mut rng);
        assert!(exact.eps_lower > 7.0, "{exact:?}");
    }
}
