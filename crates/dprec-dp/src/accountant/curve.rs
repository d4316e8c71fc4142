//! The order grid and RDP curves on it.

use std::sync::Arc;

use serde::{Deserialize, Serialize, Serializer};

use super::AccountantError;

/// Number of orders in [`default_orders`] (the `|A|` of the Renyi filter).
pub const NUM_DEFAULT_ORDERS: usize = 99 + 53 + 4;

/// The fixed order grid of DESIGN 3 (the same as dp_accounting's
/// `DEFAULT_RDP_ORDERS`): `1 + x/10` for `x = 1..=99`, the integers `11..=63`,
/// then 128, 256, 512, 1024. 156 orders, strictly increasing.
pub fn default_orders() -> Vec<f64> {
    let mut orders = Vec::with_capacity(NUM_DEFAULT_ORDERS);
    orders.extend((1..=99).map(|x| 1.0 + f64::from(x) / 10.0));
    orders.extend((11..=63).map(f64::from));
    orders.extend([128.0, 256.0, 512.0, 1024.0]);
    orders
}

/// Checks that `orders` is a usable grid: non-empty, finite, every order > 1,
/// strictly increasing.
pub fn validate_orders(orders: &[f64]) -> Result<(), AccountantError> {
    if orders.is_empty() {
        return Err(AccountantError::InvalidOrders(
            "the order grid is empty".into(),
        ));
    }
    for (i, &a) in orders.iter().enumerate() {
        if !(a.is_finite() && a > 1.0) {
            return Err(AccountantError::InvalidOrders(format!(
                "orders[{i}] = {a}: every order must be finite and > 1"
            )));
        }
        if i > 0 && orders[i - 1] >= a {
            return Err(AccountantError::InvalidOrders(format!(
                "orders[{i}] = {a}: orders must be strictly increasing"
            )));
        }
    }
    Ok(())
}

/// A Renyi-DP curve: `values[k]` is an upper bound on the Renyi divergence of
/// order `orders[k]` (the mechanism is `(orders[k], values[k])`-RDP).
///
/// Invariants (checked by every constructor, including deserialisation): the
/// grid passes [`validate_orders`], the two vectors have the same length, and
/// every value is `>= 0` and not NaN. `+inf` is allowed (a non-private event,
/// or an order at which a bound could not be computed); in JSON it is written
/// as `null`.
///
/// Immutable, and shared when cloned: a service holds one consumed curve per user, 156
/// orders and values each (2.5 kB), and users who took part in the same releases have the
/// same curve (the store reads them as one, `store::ratings::BudgetReader`); the orders
/// of every curve composed from another are the same allocation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RdpCurveRepr", into = "RdpCurveRepr")]
pub struct RdpCurve {
    orders: Arc<[f64]>,
    values: Arc<[f64]>,
}

impl RdpCurve {
    /// A curve from its orders and values (see the type's invariants).
    pub fn new(orders: Vec<f64>, values: Vec<f64>) -> Result<Self, AccountantError> {
        validate_orders(&orders)?;
        if orders.len() != values.len() {
            return Err(AccountantError::InvalidCurve(format!(
                "{} orders but {} values",
                orders.len(),
                values.len()
            )));
        }
        for (i, &v) in values.iter().enumerate() {
            if v.is_nan() || v < 0.0 {
                return Err(AccountantError::InvalidCurve(format!(
                    "values[{i}] = {v} at order {}: RDP values must be >= 0",
                    orders[i]
                )));
            }
        }
        Ok(Self {
            orders: orders.into(),
            values: values.into(),
        })
    }

    /// The zero curve (nothing spent) on `orders`.
    pub fn zeros(orders: Vec<f64>) -> Result<Self, AccountantError> {
        let values = vec![0.0; orders.len()];
        Self::new(orders, values)
    }

    /// The zero curve on [`default_orders`].
    pub fn zeros_default() -> Self {
        static ZEROS: std::sync::OnceLock<RdpCurve> = std::sync::OnceLock::new();
        ZEROS
            .get_or_init(|| {
                let orders = default_orders();
                let values = vec![0.0; orders.len()];
                Self {
                    orders: orders.into(),
                    values: values.into(),
                }
            })
            .clone()
    }

    /// Evaluates `f(order)` on every order of the grid. Values in `[-1e-12, 0)`
    /// are rounding noise of a non-negative quantity and are clamped to 0.
    pub fn from_fn(orders: Vec<f64>, f: impl Fn(f64) -> f64) -> Result<Self, AccountantError> {
        let values = orders
            .iter()
            .map(|&a| {
                let v = f(a);
                if (-1e-12..0.0).contains(&v) {
                    0.0
                } else {
                    v
                }
            })
            .collect();
        Self::new(orders, values)
    }

    /// The orders of the grid.
    pub fn orders(&self) -> &[f64] {
        &self.orders
    }

    /// The RDP values, aligned with [`RdpCurve::orders`].
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// Whether `other` is a clone of this curve (one allocation of values): what the
    /// store's reads share among users with the same stored curve.
    pub fn shares_storage_with(&self, other: &RdpCurve) -> bool {
        Arc::ptr_eq(&self.values, &other.values)
    }

    /// `(order, value)` pairs.
    pub fn points(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.orders.iter().copied().zip(self.values.iter().copied())
    }

    /// The value at `order`, if `order` is on the grid.
    pub fn value_at(&self, order: f64) -> Option<f64> {
        self.orders
            .iter()
            .position(|&a| a == order)
            .map(|k| self.values[k])
    }

    /// Whether `other` is on exactly the same grid.
    pub fn same_grid(&self, other: &RdpCurve) -> bool {
        self.orders == other.orders
    }

    /// Composition: RDP adds up order by order (Mironov 2017, Prop. 1).
    /// Both curves must be on the same grid.
    pub fn compose(&self, other: &RdpCurve) -> Result<RdpCurve, AccountantError> {
        if !self.same_grid(other) {
            return Err(AccountantError::GridMismatch);
        }
        let values = self
            .values
            .iter()
            .zip(other.values.iter())
            .map(|(a, b)| a + b)
            .collect();
        Ok(RdpCurve {
            orders: self.orders.clone(),
            values,
        })
    }

    /// `count`-fold self-composition: every value multiplied by `count`
    /// (`0 * inf` is taken as 0: an event applied zero times costs nothing).
    pub fn scale(&self, count: u64) -> RdpCurve {
        let k = count as f64;
        let values = self
            .values
            .iter()
            .map(|&v| if count == 0 { 0.0 } else { k * v })
            .collect();
        RdpCurve {
            orders: self.orders.clone(),
            values,
        }
    }
}

/// Serialised form: `{"orders": [...], "values": [...]}` with `null` for `+inf`.
#[derive(Serialize, Deserialize)]
struct RdpCurveRepr {
    orders: Vec<f64>,
    values: Vec<Option<f64>>,
}

impl TryFrom<RdpCurveRepr> for RdpCurve {
    type Error = AccountantError;
    fn try_from(r: RdpCurveRepr) -> Result<Self, Self::Error> {
        let values = r
            .values
            .into_iter()
            .map(|v| v.unwrap_or(f64::INFINITY))
            .collect();
        RdpCurve::new(r.orders, values)
    }
}

impl From<RdpCurve> for RdpCurveRepr {
    fn from(c: RdpCurve) -> Self {
        RdpCurveRepr {
            orders: c.orders.to_vec(),
            values: c
                .values
                .iter()
                .copied()
                .map(|v| if v.is_finite() { Some(v) } else { None })
                .collect(),
        }
    }
}

/// Serde helper: an `f64` that may be `+inf` is written as `null`.
pub(crate) mod maybe_infinite {
    use super::*;

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_none()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_grid_has_156_increasing_orders_matching_design() {
        let o = default_orders();
        assert_eq!(o.len(), NUM_DEFAULT_ORDERS);
        assert_eq!(o.len(), 156);
        validate_orders(&o).unwrap();
        assert_eq!(o[0], 1.1);
        assert_eq!(o[9], 2.0);
        assert_eq!(o[98], 10.9);
        assert_eq!(o[99], 11.0);
        assert_eq!(o[151], 63.0);
        assert_eq!(&o[152..], &[128.0, 256.0, 512.0, 1024.0]);
    }

    #[test]
    fn curve_rejects_bad_input() {
        assert!(RdpCurve::new(vec![], vec![]).is_err());
        assert!(RdpCurve::new(vec![1.0], vec![0.0]).is_err());
        assert!(RdpCurve::new(vec![3.0, 2.0], vec![0.0, 0.0]).is_err());
        assert!(RdpCurve::new(vec![2.0], vec![-0.1]).is_err());
        assert!(RdpCurve::new(vec![2.0], vec![f64::NAN]).is_err());
        assert!(RdpCurve::new(vec![2.0, 3.0], vec![0.0]).is_err());
        assert!(RdpCurve::new(vec![2.0], vec![f64::INFINITY]).is_ok());
    }

    #[test]
    fn compose_adds_and_scale_multiplies() {
        let a = RdpCurve::new(vec![2.0, 4.0], vec![0.5, 1.0]).unwrap();
        let b = RdpCurve::new(vec![2.0, 4.0], vec![0.25, 2.0]).unwrap();
        assert_eq!(a.compose(&b).unwrap().values(), &[0.75, 3.0]);
        assert_eq!(a.scale(3).values(), &[1.5, 3.0]);
        assert_eq!(a.scale(0).values(), &[0.0, 0.0]);
        let c = RdpCurve::new(vec![2.0, 5.0], vec![0.0, 0.0]).unwrap();
        assert!(matches!(a.compose(&c), Err(AccountantError::GridMismatch)));
    }

    #[test]
    fn curve_serde_round_trips_with_infinity_as_null() {
        let a = RdpCurve::new(vec![2.0, 4.0], vec![0.5, f64::INFINITY]).unwrap();
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, r#"{"orders":[2.0,4.0],"values":[0.5,null]}"#);
        let back: RdpCurve = serde_json::from_str(&json).unwrap();
        assert_eq!(back, a);
        let bad = r#"{"orders":[2.0,4.0],"values":[0.5,-1.0]}"#;
        assert!(serde_json::from_str::<RdpCurve>(bad).is_err());
    }
}
