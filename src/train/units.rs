//! The two units a release is charged for (DESIGN 3; issue 8 findings 2, 6 and the
//! lifetime plan), as a small interface every proven trainer implements:
//!
//! - **Rating level** (unit: one rating, add/remove): the trainer's [`ReleaseCharges`]
//!   list every rating it touched with its eps (pure DP, or RDP converted at a public
//!   `delta_r`); [`Trainer::rating_cap`] is the most any single rating can be charged by
//!   one release, a public constant.
//! - **User level** (unit: all of one user's ratings, add/remove of the user):
//!   [`Trainer::user_level_event`] is the RDP event one release costs ANY user with at
//!   most `m` ratings, a constant known before data (group privacy over the user's
//!   ratings for the pure-DP steps, `m` times the one-rating sensitivity for the Gaussian
//!   ones). `m` is a public bound on a user's ratings: the size of the public catalogue
//!   (a user rates each item at most once).
//!
//! The service composes the trainer's user-level event with its own releases' (the DP
//! popularity counts: `PureDp(m popularity_eps)`) into one per-release user cost
//! ([`release_user_event`]) and admits a user iff that user's Renyi filter admits it:
//! the same cost for every user, whatever their ratings, so a user's admission depends
//! only on the user's own past charges (finding 2).
//!
//! Lifetime ([`calibrate_release`]): before any data is seen, the trainer and the
//! popularity eps are scaled down by one common factor until `T` planned releases
//! (default 52) of that cost fit the default user budget (eps_u, delta_u).
//!
//! [`ReleaseCharges`]: dprec_dp::charges::ReleaseCharges

use super::Trainer;
use dprec_dp::accountant::{
    default_orders, plan::calibrate_noise, LifetimePlan, PrivacyEvent, RdpCurve,
};

/// The per-release user-level event of a release: the trainer's user-level event and the
/// DP popularity counts (each of the user's at most `m` ratings is in one count of eps
/// `popularity_eps`: group privacy, `PureDp(m popularity_eps)`). `None` when the trainer
/// states no user-level bound.
pub fn release_user_event(
    trainer: &dyn Trainer,
    m: u64,
    popularity_eps: f64,
) -> Option<PrivacyEvent> {
    let trainer_event = trainer.user_level_event(m)?;
    let mut events = vec![trainer_event];
    if popularity_eps > 0.0 {
        events.push(PrivacyEvent::PureDp {
            eps: m.max(1) as f64 * popularity_eps,
            count: 1,
        });
    }
    Some(PrivacyEvent::Composed { events })
}

/// A trainer and popularity eps calibrated to a lifetime plan.
pub struct Calibrated {
    pub trainer: Box<dyn Trainer>,
    pub popularity_eps: f64,
    /// The common factor the configured costs were divided by (1: they already fit).
    pub factor: f64,
    /// The per-release user-level event ([`release_user_event`]).
    pub user_event: PrivacyEvent,
}

/// Scales the trainer's and the popularity's per-release costs down by the smallest
/// common factor `x >= 1` such that `plan.releases` releases fit the plan's budget, for
/// users with at most `m` ratings. Pure arithmetic on public values (the configuration,
/// the plan and `m`); errors when the trainer cannot state or scale its user-level cost.
pub fn calibrate_release(
    trainer: &dyn Trainer,
    plan: &LifetimePlan,
    m: u64,
    popularity_eps: f64,
) -> Result<Calibrated, String> {
    let orders = default_orders();
    let curve_at = |x: f64| -> Result<RdpCurve, String> {
        let t = trainer
            .scaled(x)
            .ok_or_else(|| format!("trainer {} cannot be calibrated", trainer.name()))?;
        let e = release_user_event(t.as_ref(), m, popularity_eps / x).ok_or_else(|| {
            format!(
                "trainer {} states no user-level cost (Trainer::user_level_event)",
                trainer.name()
            )
        })?;
        e.rdp_curve(&orders).map_err(|e| e.to_string())
    };
    let fits_at_one = plan.fits(&curve_at(1.0)?).map_err(|e| e.to_string())?;
    let factor = if fits_at_one {
        1.0
    } else {
        calibrate_noise(plan, 1.0, 1e12, |x| {
            curve_at(x).map_err(dprec_dp::accountant::AccountantError::InvalidCurve)
        })
        .map_err(|e| format!("no noise level fits the plan: {e}"))?
    };
    let t = trainer
        .scaled(factor)
        .ok_or_else(|| format!("trainer {} cannot be calibrated", trainer.name()))?;
    let pop = popularity_eps / factor;
    let user_event = release_user_event(t.as_ref(), m, pop)
        .ok_or_else(|| format!("trainer {} states no user-level cost", trainer.name()))?;
    Ok(Calibrated {
        trainer: t,
        popularity_eps: pop,
        factor,
        user_event,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::{build, Params};

    /// The default trainer calibrated to the default plan: 52 releases fit the default
    /// budget exactly (one more step of the factor would not be needed, a slightly
    /// smaller factor does not fit), and the calibrated trainer's user-level event is the
    /// one returned.
    #[test]
    fn default_plan_calibration_fits_exactly() {
        let t = build("dp-alt", &Params::new()).unwrap();
        let plan = LifetimePlan::new(52, 10.0, 1e-6).unwrap();
        let m = 1682;
        let c = calibrate_release(t.as_ref(), &plan, m, 0.05).unwrap();
        assert!(c.factor > 1.0, "{}", c.factor);
        let orders = default_orders();
        let curve = c.user_event.rdp_curve(&orders).unwrap();
        assert!(plan.fits(&curve).unwrap());
        let tighter = t.scaled(c.factor * 0.999).unwrap();
        let e = release_user_event(tighter.as_ref(), m, 0.05 / (c.factor * 0.999)).unwrap();
        assert!(!plan.fits(&e.rdp_curve(&orders).unwrap()).unwrap());
        assert_eq!(
            release_user_event(c.trainer.as_ref(), m, c.popularity_eps),
            Some(c.user_event.clone())
        );
    }

    /// Group privacy: the user-level event of a user with m ratings is m times the
    /// rating-level pure part and m times the Gaussian sensitivity (a trainer without a
    /// per-user contribution bound); `dp-alt` bounds each user's contribution, so only
    /// the popularity part grows with m.
    #[test]
    fn user_level_event_scales_with_the_contribution_bound() {
        let alt = build("dp-alt", &Params::new()).unwrap();
        assert_eq!(alt.user_level_event(1), alt.user_level_event(1682));
        let t = build("gaussian-mf", &Params::new()).unwrap();
        let orders = default_orders();
        let one = release_user_event(t.as_ref(), 1, 0.05)
            .unwrap()
            .rdp_curve(&orders)
            .unwrap();
        let ten = release_user_event(t.as_ref(), 10, 0.05)
            .unwrap()
            .rdp_curve(&orders)
            .unwrap();
        // At a low order both parts are quadratic in the scale: 100 times.
        let k = 0; // order 1.1
        let ratio = ten.values()[k] / one.values()[k];
        assert!(ratio > 50.0 && ratio <= 100.0 + 1e-9, "{ratio}");
    }
}
