//! The lifetime release plan (DESIGN 3, "Lifetime"): a service retrains for as long as
//! it runs, so every user is promised a stated number of releases `T` (default 52,
//! weekly for a year) inside their per-user budget (eps_u, delta_u). The per-release
//! noise is calibrated from that plan BEFORE any data is seen: the smallest noise whose
//! per-release RDP curve, composed `T` times, is admitted by the user's Renyi filter.
//!
//! Everything here is pure arithmetic on public numbers (the plan and the mechanism's
//! curve family); no data, no I/O.

use super::curve::RdpCurve;
use super::event::PrivacyEvent;
use super::filter::RenyiFilter;
use super::AccountantError;

/// Default number of releases every user takes part in (weekly for a year).
pub const DEFAULT_PLANNED_RELEASES: u32 = 52;

/// How many releases every user is promised, and the per-user budget they must fit in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LifetimePlan {
    /// Planned releases per user, `>= 1`.
    pub releases: u32,
    /// Per-user target eps_u (the Renyi filter's target).
    pub eps: f64,
    /// Per-user target delta_u.
    pub delta: f64,
}

fn invalid(field: &str, value: f64, requirement: &'static str) -> AccountantError {
    AccountantError::InvalidParameter {
        field: field.into(),
        value,
        requirement,
    }
}

impl LifetimePlan {
    /// A validated plan.
    pub fn new(releases: u32, eps: f64, delta: f64) -> Result<Self, AccountantError> {
        if releases == 0 {
            return Err(invalid("releases", 0.0, ">= 1"));
        }
        // The filter validates eps and delta.
        RenyiFilter::with_default_orders(eps, delta)?;
        Ok(Self {
            releases,
            eps,
            delta,
        })
    }

    /// The per-user Renyi filter of this plan (default order grid).
    pub fn filter(&self) -> Result<RenyiFilter, AccountantError> {
        RenyiFilter::with_default_orders(self.eps, self.delta)
    }

    /// Whether `releases` sequential releases, each costing `per_release`, are admitted by
    /// a fresh filter (the lifetime promise holds for this per-release cost).
    pub fn fits(&self, per_release: &RdpCurve) -> Result<bool, AccountantError> {
        let f = self.filter()?;
        let zero = RdpCurve::zeros(f.orders().to_vec())?;
        f.admits(&zero, &per_release.scale(u64::from(self.releases)))
    }
}

/// How many more releases of cost `per_release` the filter admits on top of `consumed`
/// (`u64::MAX` when `per_release` costs nothing at an order that still has room).
///
/// The filter admits a charge iff some order fits, so `k` more releases fit iff
/// `consumed_a + k cost_a <= capacity_a` at some order `a`: the answer is
/// `max_a floor((capacity_a - consumed_a) / cost_a)` over orders with room. The result is
/// checked against the filter itself (floating-point rounding can only lower it).
pub fn releases_left(
    filter: &RenyiFilter,
    consumed: &RdpCurve,
    per_release: &RdpCurve,
) -> Result<u64, AccountantError> {
    let remaining = filter.remaining(consumed)?;
    if !per_release.same_grid(consumed) {
        return Err(AccountantError::GridMismatch);
    }
    let mut best: u64 = 0;
    for (room, &cost) in remaining.iter().zip(per_release.values()) {
        if *room < 0.0 {
            continue;
        }
        if cost == 0.0 {
            return Ok(u64::MAX);
        }
        let k = (room / cost).floor();
        let k = if k >= u64::MAX as f64 {
            u64::MAX
        } else {
            k as u64
        };
        best = best.max(k);
    }
    // Rounding guard: step down until the filter agrees.
    while best > 0 && best != u64::MAX && !filter.admits(consumed, &per_release.scale(best))? {
        best -= 1;
    }
    Ok(best)
}

/// Calibrates a noise parameter from the plan: the smallest `x` in `[lo, hi]` such that
/// `plan.releases` copies of `family(x)` fit the filter, for a family whose cost
/// decreases as `x` grows (e.g. a noise multiplier). Bisection in log space to a relative
/// width of `1e-9`; the returned `x` always fits (it is the upper end of the bracket).
///
/// Errors when even `hi` does not fit (the plan is impossible in that range).
pub fn calibrate_noise<F>(
    plan: &LifetimePlan,
    lo: f64,
    hi: f64,
    family: F,
) -> Result<f64, AccountantError>
where
    F: Fn(f64) -> Result<RdpCurve, AccountantError>,
{
    calibrate_monotone(plan, lo, hi, &family, true)
}

/// The calibration of [`calibrate_noise`] (`fits_high`: the cost falls as `x` grows)
/// and [`calibrate_budget`] (it grows), written (and tested) once: checks the bracket,
/// requires its fitting end to fit, returns the other end when that fits too, else
/// bisects between them and returns a value that fits.
fn calibrate_monotone<F>(
    plan: &LifetimePlan,
    lo: f64,
    hi: f64,
    family: &F,
    fits_high: bool,
) -> Result<f64, AccountantError>
where
    F: Fn(f64) -> Result<RdpCurve, AccountantError>,
{
    if !(lo.is_finite() && lo > 0.0) {
        return Err(invalid("lo", lo, "finite and > 0"));
    }
    if !(hi.is_finite() && hi > lo) {
        return Err(invalid("hi", hi, "finite and > lo"));
    }
    let (fitting, other) = if fits_high { (hi, lo) } else { (lo, hi) };
    if !plan.fits(&family(fitting)?)? {
        let (name, requirement) = if fits_high {
            (
                "hi",
                "large enough that the planned releases fit the user budget",
            )
        } else {
            (
                "lo",
                "small enough that the planned releases fit the user budget",
            )
        };
        return Err(invalid(name, fitting, requirement));
    }
    if plan.fits(&family(other)?)? {
        return Ok(other);
    }
    // Bisection in log space between the two ends, to a relative width of 1e-9.
    let (mut a, mut b) = (lo.ln(), hi.ln());
    while b - a > 1e-9 {
        let mid = 0.5 * (a + b);
        if plan.fits(&family(mid.exp())?)? == fits_high {
            b = mid;
        } else {
            a = mid;
        }
    }
    let x = if fits_high { b.exp() } else { a.exp() };
    // exp(ln(x)) may round past the bracket's fitting end; make sure the answer fits.
    if plan.fits(&family(x)?)? {
        Ok(x)
    } else if fits_high {
        Ok(x * (1.0 + 1e-9))
    } else {
        Ok(x * (1.0 - 1e-9))
    }
}

/// Calibrates a per-release budget from the plan: the largest `x` in `[lo, hi]` such that
/// `plan.releases` copies of `family(x)` fit, for a family whose cost grows with `x`
/// (e.g. a pure-DP eps per release). The returned `x` always fits.
pub fn calibrate_budget<F>(
    plan: &LifetimePlan,
    lo: f64,
    hi: f64,
    family: F,
) -> Result<f64, AccountantError>
where
    F: Fn(f64) -> Result<RdpCurve, AccountantError>,
{
    calibrate_monotone(plan, lo, hi, &family, false)
}

/// The Gaussian noise multiplier z such that `plan.releases` releases of `per_release`
/// Gaussian steps each (`Gaussian { z, count: per_release }`) fit the plan's filter.
///
/// A trainer asks for the same calibration at every release (and an audit or an eval
/// runs thousands of releases), while each is a bisection of about 70 filter checks: the
/// answer, a pure function of the four numbers, is remembered ([`GaussianCalibrations`]).
pub fn calibrate_gaussian(plan: &LifetimePlan, per_release: u64) -> Result<f64, AccountantError> {
    if per_release == 0 {
        return Err(invalid("per_release", 0.0, ">= 1"));
    }
    GaussianCalibrations::get_or_compute(plan, per_release, || {
        let orders = plan.filter()?.orders().to_vec();
        calibrate_noise(plan, 1e-3, 1e6, |z| {
            PrivacyEvent::gaussian(z, per_release)?.rdp_curve(&orders)
        })
    })
}

/// The process's remembered Gaussian calibrations, keyed by the exact plan
/// (`releases`, the bits of `eps` and `delta`) and `per_release`. Errors are not
/// remembered (they are cheap and rare). Bounded: emptied when it reaches
/// [`GaussianCalibrations::MAX`] entries, which only a sweep over plans reaches.
struct GaussianCalibrations;

type CalibrationKey = (u32, u64, u64, u64);

static GAUSSIAN_CALIBRATIONS: std::sync::Mutex<
    Option<std::collections::HashMap<CalibrationKey, f64>>,
> = std::sync::Mutex::new(None);

impl GaussianCalibrations {
    const MAX: usize = 4096;

    fn get_or_compute(
        plan: &LifetimePlan,
        per_release: u64,
        compute: impl FnOnce() -> Result<f64, AccountantError>,
    ) -> Result<f64, AccountantError> {
        let key = (
            plan.releases,
            plan.eps.to_bits(),
            plan.delta.to_bits(),
            per_release,
        );
        let lock = || {
            GAUSSIAN_CALIBRATIONS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        };
        if let Some(&z) = lock().as_ref().and_then(|m| m.get(&key)) {
            return Ok(z);
        }
        // Computed outside the lock: two threads may both compute it, with the same result.
        let z = compute()?;
        let mut memo = lock();
        let map = memo.get_or_insert_with(Default::default);
        if map.len() >= Self::MAX {
            map.clear();
        }
        map.insert(key, z);
        Ok(z)
    }
}

/// The pure-DP eps per release such that `plan.releases` releases of
/// `PureDp { eps, count: per_release }` fit the plan's filter.
pub fn calibrate_pure(plan: &LifetimePlan, per_release: u64) -> Result<f64, AccountantError> {
    if per_release == 0 {
        return Err(invalid("per_release", 0.0, ">= 1"));
    }
    let orders = plan.filter()?.orders().to_vec();
    calibrate_budget(plan, 1e-9, 1e3, |e| {
        PrivacyEvent::pure_dp(e, per_release)?.rdp_curve(&orders)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accountant::default_orders;

    /// Closed form: `T` releases of `c` Gaussian steps of multiplier z cost
    /// `T c a / (2 z^2)` at order a, so the smallest z that fits the filter is
    /// `sqrt(min_a T c a / (2 capacity_a))` over orders with positive capacity.
    fn gaussian_closed_form(plan: &LifetimePlan, c: u64) -> f64 {
        let f = plan.filter().unwrap();
        f.orders()
            .iter()
            .zip(f.capacity())
            .filter(|(_, cap)| **cap > 0.0)
            .map(|(a, cap)| (plan.releases as f64 * c as f64 * a / (2.0 * cap)).sqrt())
            .fold(f64::INFINITY, f64::min)
    }

    /// Every part of the key matters: plans that differ in one number only get their own
    /// calibration, asked twice in either order, equal to a calibration computed afresh.
    #[test]
    fn remembered_calibrations_are_keyed_by_the_whole_plan() {
        let fresh = |plan: &LifetimePlan, c: u64| {
            let orders = plan.filter().unwrap().orders().to_vec();
            calibrate_noise(plan, 1e-3, 1e6, |z| {
                PrivacyEvent::gaussian(z, c)?.rdp_curve(&orders)
            })
            .unwrap()
        };
        let cases = [
            (LifetimePlan::new(37, 3.0, 1e-6).unwrap(), 1),
            (LifetimePlan::new(38, 3.0, 1e-6).unwrap(), 1),
            (LifetimePlan::new(37, 3.5, 1e-6).unwrap(), 1),
            (LifetimePlan::new(37, 3.0, 1e-7).unwrap(), 1),
            (LifetimePlan::new(37, 3.0, 1e-6).unwrap(), 2),
        ];
        let first: Vec<f64> = cases
            .iter()
            .map(|(p, c)| calibrate_gaussian(p, *c).unwrap())
            .collect();
        for (i, (p, c)) in cases.iter().enumerate().rev() {
            let again = calibrate_gaussian(p, *c).unwrap();
            assert_eq!(again.to_bits(), first[i].to_bits());
            assert_eq!(again.to_bits(), fresh(p, *c).to_bits(), "case {i}");
        }
        for i in 1..cases.len() {
            assert_ne!(
                first[0], first[i],
                "case {i} answered with case 0's calibration"
            );
        }
    }

    #[test]
    fn gaussian_calibration_matches_closed_form() {
        for (t, eps, delta, c) in [
            (52, 10.0, 1e-6, 1),
            (52, 10.0, 1e-6, 3),
            (10, 1.0, 1e-5, 1),
            (1, 2.0, 1e-6, 20),
            (200, 8.0, 1e-8, 2),
        ] {
            let plan = LifetimePlan::new(t, eps, delta).unwrap();
            let z = calibrate_gaussian(&plan, c).unwrap();
            let want = gaussian_closed_form(&plan, c);
            assert!(
                (z - want).abs() <= 1e-7 * want,
                "T {t} eps {eps} c {c}: {z} vs {want}"
            );
            // It fits, and 0.1% less noise does not.
            let g = |z| {
                PrivacyEvent::gaussian(z, c)
                    .unwrap()
                    .rdp_curve(&default_orders())
                    .unwrap()
            };
            assert!(plan.fits(&g(z)).unwrap());
            assert!(!plan.fits(&g(z * 0.999)).unwrap());
        }
    }

    /// The default plan (52 releases, eps_u = 10, delta_u = 1e-6): one Gaussian step per
    /// release needs z around 5 (hand computation: best order ~ 5.2, capacity ~ 5.5).
    #[test]
    fn default_plan_gaussian_noise() {
        let plan = LifetimePlan::new(DEFAULT_PLANNED_RELEASES, 10.0, 1e-6).unwrap();
        let z = calibrate_gaussian(&plan, 1).unwrap();
        assert!(z > 4.0 && z < 6.0, "{z}");
    }

    /// Pure DP: `T` releases of eps each cost `T min(eps, a eps^2 / 2)`; the calibrated
    /// eps is the closed-form maximum over orders.
    #[test]
    fn pure_calibration_matches_closed_form() {
        for (t, eps_u, delta) in [(52, 10.0, 1e-6), (4, 1.0, 1e-5), (1000, 5.0, 1e-7)] {
            let plan = LifetimePlan::new(t, eps_u, delta).unwrap();
            let got = calibrate_pure(&plan, 1).unwrap();
            let f = plan.filter().unwrap();
            let t = t as f64;
            let want = f
                .orders()
                .iter()
                .zip(f.capacity())
                .filter(|(_, cap)| **cap > 0.0)
                .map(|(a, cap)| {
                    // Largest eps with T min(eps, a eps^2/2) <= cap.
                    let quad = (2.0 * cap / (t * a)).sqrt();
                    if quad <= 2.0 / a {
                        quad
                    } else {
                        cap / t
                    }
                })
                .fold(0.0, f64::max);
            assert!((got - want).abs() <= 1e-7 * want, "{got} vs {want}");
        }
    }

    #[test]
    fn releases_left_counts_what_the_filter_admits() {
        let plan = LifetimePlan::new(52, 10.0, 1e-6).unwrap();
        let f = plan.filter().unwrap();
        let z = calibrate_gaussian(&plan, 1).unwrap();
        let step = PrivacyEvent::gaussian(z, 1)
            .unwrap()
            .rdp_curve(f.orders())
            .unwrap();
        let mut consumed = RdpCurve::zeros_default();
        assert_eq!(releases_left(&f, &consumed, &step).unwrap(), 52);
        for left in (0..52).rev() {
            consumed = f.try_charge(&consumed, &step).unwrap().expect("planned");
            assert_eq!(releases_left(&f, &consumed, &step).unwrap(), left);
        }
        assert!(f.try_charge(&consumed, &step).unwrap().is_none());
        let free = RdpCurve::zeros_default();
        assert_eq!(
            releases_left(&f, &RdpCurve::zeros_default(), &free).unwrap(),
            u64::MAX
        );
    }

    #[test]
    fn impossible_plans_are_errors() {
        assert!(LifetimePlan::new(0, 1.0, 1e-6).is_err());
        assert!(LifetimePlan::new(5, 0.0, 1e-6).is_err());
        // eps_u = 0.01 cannot hold even one step of z = 1e6? It can; but 1e6 releases of a
        // pure eps above 1e-3 cannot.
        let plan = LifetimePlan::new(1_000_000, 0.01, 1e-6).unwrap();
        let orders = default_orders();
        assert!(calibrate_budget(&plan, 1e-3, 1.0, |e| {
            PrivacyEvent::pure_dp(e, 1)?.rdp_curve(&orders)
        })
        .is_err());
    }
}
