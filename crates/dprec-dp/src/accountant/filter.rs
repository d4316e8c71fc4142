//! The Renyi filter that guards a per-user (eps_u, delta_u) budget (DESIGN 3).

use super::conversion::{eps_from_rdp, PrivacyGuarantee};
use super::curve::{default_orders, validate_orders, RdpCurve};
use super::AccountantError;

/// A Renyi filter for a target `(eps_u, delta_u)` on a fixed order grid `A`.
///
/// Capacity at order `alpha`:
///
/// `capacity_alpha = eps_u - ln(|A| / delta_u) / (alpha - 1)`.
///
/// A charge `cost` (an RDP curve) on top of the already `consumed` curve is
/// admitted iff **some** order satisfies
/// `consumed_alpha + cost_alpha <= capacity_alpha`; a rejected charge is not
/// applied (and the data it would have used is not used).
///
/// Why the `|A|` (a union bound over the grid): the sequence of charges is
/// adaptive (each release's parameters and whether it runs may depend on
/// earlier outputs), and the order that keeps the filter open is not fixed
/// in advance: it is whichever order still has room, which depends on the
/// realised charges. For one *fixed* order, the Renyi filter theorem
/// (Feldman and Zrnic 2021, "Individual Privacy Accounting via a Renyi
/// Filter"; Lecuyer 2021, "Practical Privacy Filters and Odometers with Renyi
/// Differential Privacy") says the adaptively composed, halted interaction is
/// `(alpha, B_alpha)`-RDP, hence (classic conversion, Mironov 2017 Prop. 3)
/// `(B_alpha + ln(1/delta')/(alpha - 1), delta')`-DP. Running the filter over
/// all `|A|` orders at once and stopping only when every order is exhausted
/// means the privacy-loss tail event may be the one of any order; taking
/// `delta' = delta_u / |A|` for each order and a union bound over the `|A|`
/// orders gives `(eps_u, delta_u)` overall. Without the `|A|` term the filter
/// would let the adversary (or the scheduler) pick the most favourable order
/// after the fact, and the stated delta would not hold.
///
/// The grid must stay the same for the whole life of the budget: every
/// method rejects curves on another grid.
#[derive(Clone, Debug, PartialEq)]
pub struct RenyiFilter {
    eps: f64,
    delta: f64,
    orders: Vec<f64>,
    capacity: Vec<f64>,
}

impl RenyiFilter {
    /// A filter for `(eps, delta)` on `orders`; `eps` finite and > 0,
    /// `delta` in (0, 1).
    pub fn new(eps: f64, delta: f64, orders: Vec<f64>) -> Result<Self, AccountantError> {
        if !(eps.is_finite() && eps > 0.0) {
            return Err(AccountantError::InvalidParameter {
                field: "eps".into(),
                value: eps,
                requirement: "finite and > 0",
            });
        }
        if !(delta > 0.0 && delta < 1.0) {
            return Err(AccountantError::InvalidParameter {
                field: "delta".into(),
                value: delta,
                requirement: "in (0, 1)",
            });
        }
        validate_orders(&orders)?;
        let log_term = (orders.len() as f64 / delta).ln();
        let capacity = orders.iter().map(|&a| eps - log_term / (a - 1.0)).collect();
        Ok(Self {
            eps,
            delta,
            orders,
            capacity,
        })
    }

    /// A filter for `(eps, delta)` on [`default_orders`] (`|A| = 156`).
    pub fn with_default_orders(eps: f64, delta: f64) -> Result<Self, AccountantError> {
        Self::new(eps, delta, default_orders())
    }

    /// The target eps_u.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// The target delta_u.
    pub fn delta(&self) -> f64 {
        self.delta
    }

    /// The order grid `A`.
    pub fn orders(&self) -> &[f64] {
        &self.orders
    }

    /// `capacity_alpha` for every order (negative at orders that can never
    /// admit anything).
    pub fn capacity(&self) -> &[f64] {
        &self.capacity
    }

    fn check_grid(&self, curve: &RdpCurve) -> Result<(), AccountantError> {
        if curve.orders() == self.orders.as_slice() {
            Ok(())
        } else {
            Err(AccountantError::GridMismatch)
        }
    }

    /// `capacity_alpha - consumed_alpha` for every order (negative where the
    /// order is exhausted).
    pub fn remaining(&self, consumed: &RdpCurve) -> Result<Vec<f64>, AccountantError> {
        self.check_grid(consumed)?;
        Ok(self
            .capacity
            .iter()
            .zip(consumed.values())
            .map(|(c, u)| c - u)
            .collect())
    }

    /// The lowest order at which `consumed + cost` fits, if any.
    pub fn admitting_order(
        &self,
        consumed: &RdpCurve,
        cost: &RdpCurve,
    ) -> Result<Option<f64>, AccountantError> {
        self.check_grid(consumed)?;
        self.check_grid(cost)?;
        Ok((0..self.orders.len())
            .find(|&k| consumed.values()[k] + cost.values()[k] <= self.capacity[k])
            .map(|k| self.orders[k]))
    }

    /// Whether the charge `cost` is admitted on top of `consumed`.
    pub fn admits(&self, consumed: &RdpCurve, cost: &RdpCurve) -> Result<bool, AccountantError> {
        Ok(self.admitting_order(consumed, cost)?.is_some())
    }

    /// The new consumed curve if `cost` is admitted, `None` if rejected.
    pub fn try_charge(
        &self,
        consumed: &RdpCurve,
        cost: &RdpCurve,
    ) -> Result<Option<RdpCurve>, AccountantError> {
        if self.admits(consumed, cost)? {
            Ok(Some(consumed.compose(cost)?))
        } else {
            Ok(None)
        }
    }

    /// The consumed curve on the filter's scale:
    /// `min_alpha consumed_alpha + ln(|A| / delta_u) / (alpha - 1)`.
    /// A charge is admitted iff this value, computed for `consumed + cost`,
    /// is `<= eps_u` (up to rounding), so it is the share of eps_u in use.
    pub fn filter_eps(&self, consumed: &RdpCurve) -> Result<f64, AccountantError> {
        self.check_grid(consumed)?;
        let log_term = (self.orders.len() as f64 / self.delta).ln();
        Ok(consumed
            .points()
            .map(|(a, r)| r + log_term / (a - 1.0))
            .fold(f64::INFINITY, f64::min))
    }

    /// The (eps, delta_u) equivalent of the consumed curve by the improved
    /// conversion ([`eps_from_rdp`]): what the charges so far would cost if
    /// they had been fixed in advance (for the audit endpoint). The guarantee
    /// under adaptive admission is the filter's target (eps_u, delta_u).
    pub fn spent(&self, consumed: &RdpCurve) -> Result<PrivacyGuarantee, AccountantError> {
        self.check_grid(consumed)?;
        eps_from_rdp(consumed, self.delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accountant::PrivacyEvent;

    #[test]
    fn capacity_formula_uses_grid_size() {
        let f = RenyiFilter::with_default_orders(2.0, 1e-6).unwrap();
        let k = f.orders().iter().position(|&a| a == 32.0).unwrap();
        let want = 2.0 - (156.0_f64 / 1e-6).ln() / 31.0;
        assert!((f.capacity()[k] - want).abs() < 1e-14);
        assert!(RenyiFilter::with_default_orders(0.0, 1e-6).is_err());
        assert!(RenyiFilter::with_default_orders(1.0, 0.0).is_err());
        assert!(RenyiFilter::with_default_orders(1.0, 1.0).is_err());
    }

    /// A cost equal to the capacity at one order (and larger everywhere else)
    /// is admitted; the same cost plus a tiny amount is rejected.
    #[test]
    fn admits_exactly_up_to_capacity() {
        let f = RenyiFilter::with_default_orders(3.0, 1e-5).unwrap();
        let orders = f.orders().to_vec();
        let k = orders.iter().position(|&a| a == 20.0).unwrap();
        assert!(f.capacity()[k] > 0.0);
        let consumed = RdpCurve::zeros(orders.clone()).unwrap();
        let exact: Vec<f64> = (0..orders.len())
            .map(|i| if i == k { f.capacity()[k] } else { 1e3 })
            .collect();
        let exact = RdpCurve::new(orders.clone(), exact).unwrap();
        assert_eq!(f.admitting_order(&consumed, &exact).unwrap(), Some(20.0));
        let over: Vec<f64> = exact.values().iter().map(|v| v + 1e-9).collect();
        let over = RdpCurve::new(orders.clone(), over).unwrap();
        assert!(!f.admits(&consumed, &over).unwrap());
        // Also split between consumed and cost.
        let half: Vec<f64> = exact.values().iter().map(|v| v / 2.0).collect();
        let half = RdpCurve::new(orders, half).unwrap();
        assert!(f.admits(&half, &half).unwrap());
    }

    /// Gaussian steps until the budget runs out: the number admitted is the
    /// closed-form max over orders of floor(capacity_alpha / cost_alpha), and
    /// one more step would overspend at every order.
    #[test]
    fn gaussian_steps_fill_the_budget_and_one_more_is_rejected() {
        let f = RenyiFilter::with_default_orders(2.0, 1e-5).unwrap();
        let step = PrivacyEvent::gaussian(20.0, 1)
            .unwrap()
            .rdp_curve(f.orders())
            .unwrap();
        let expected = f
            .capacity()
            .iter()
            .zip(step.values())
            .map(|(c, s)| if *c > 0.0 { (c / s).floor() } else { 0.0 })
            .fold(0.0, f64::max) as u64;
        assert!(expected > 5, "{expected}");
        let mut consumed = RdpCurve::zeros(f.orders().to_vec()).unwrap();
        let mut n = 0;
        while let Some(next) = f.try_charge(&consumed, &step).unwrap() {
            consumed = next;
            n += 1;
            assert!(f.filter_eps(&consumed).unwrap() <= 2.0 + 1e-12);
            assert!(n < 10_000);
        }
        assert_eq!(n, expected);
        assert!(f.remaining(&consumed).unwrap().iter().any(|&r| r >= 0.0));
        let one_more = consumed.compose(&step).unwrap();
        assert!(f.remaining(&one_more).unwrap().iter().all(|&r| r < 0.0));
        assert!(f.filter_eps(&one_more).unwrap() > 2.0);
        // The improved conversion at delta_u (no union bound) is below eps_u.
        let spent = f.spent(&consumed).unwrap();
        assert!(spent.eps < 2.0 && spent.eps > 1.0, "{spent:?}");
    }

    #[test]
    fn grid_mismatch_is_an_error() {
        let f = RenyiFilter::with_default_orders(1.0, 1e-5).unwrap();
        let other = RdpCurve::zeros(vec![2.0, 3.0]).unwrap();
        assert!(f.admits(&other, &other).is_err());
        assert!(f.remaining(&other).is_err());
    }
}
