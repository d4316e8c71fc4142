//! Parse, don't validate: values that exist are valid. The ledger and trainers never see
//! an unchecked id, rating or eps.

use crate::data::RatingScale;

/// A number as an error message echoes it: as Rust prints it when that is short, else
/// in scientific notation (`1e308`, not 309 digits; `1e-320`, not 320 zeros).
pub fn echo(v: f64) -> String {
    let plain = v.to_string();
    if plain.len() <= 24 {
        plain
    } else {
        format!("{v:e}")
    }
}

/// A user or item id: non-empty, at most `max` bytes, no control characters, no
/// surrounding whitespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(String);

impl Id {
    pub fn parse(s: &str, max: usize) -> Result<Self, String> {
        Self::check(s, max)?;
        Ok(Self(s.to_string()))
    }

    /// Whether `s` is a valid id ([`Self::parse`] without the copy).
    pub fn check(s: &str, max: usize) -> Result<(), String> {
        if s.is_empty() {
            return Err("must not be empty".into());
        }
        if s.len() > max {
            return Err(format!("must be at most {max} bytes, got {}", s.len()));
        }
        if s.chars().any(char::is_control) {
            return Err("must not contain control characters".into());
        }
        if s.trim() != s {
            return Err("must not start or end with whitespace".into());
        }
        Ok(())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// A privacy parameter eps: finite, at least [`Epsilon::MIN`] and at most the configured
/// maximum.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Epsilon(f64);

impl Epsilon {
    /// The smallest eps the API takes. Below it a rating's noise or a budget is so large
    /// that nothing useful is released, and values near the subnormal range (1e-320) would
    /// turn into infinities in the accountant (1 / eps) and the noise scales. The bound is
    /// a constant, so it reveals nothing about the data.
    pub const MIN: f64 = 1e-6;

    pub fn parse(v: f64, max: f64) -> Result<Self, String> {
        if !v.is_finite() || v < Self::MIN || v > max {
            return Err(format!(
                "eps must be >= {} and <= {}, got {}",
                Self::MIN,
                echo(max),
                echo(v)
            ));
        }
        Ok(Self(v))
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

/// A delta in (0, 1).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Delta(f64);

impl Delta {
    pub fn parse(v: f64) -> Result<Self, String> {
        if !(v.is_normal() && v > 0.0 && v < 1.0) {
            return Err(format!("delta must be in (0, 1), got {}", echo(v)));
        }
        Ok(Self(v))
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

/// A rating on the service's scale (a multiple of the step when the step is > 0).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct RatingValue(f64);

impl RatingValue {
    /// How far (in steps) a rating may sit from a point of the scale and still count as
    /// that point: enough for decimal-to-binary rounding of values like 3.3 on a 0.1 step
    /// (about 1e-15 steps), far below any deliberate offset such as 1e-9.
    pub const STEP_TOLERANCE: f64 = 1e-12;

    /// Parses a rating. With a step, the stored value is the exact scale point
    /// `min + k * step` (so 3.3 sent on a 0.1 step is stored as the same double every
    /// time); a value further than [`Self::STEP_TOLERANCE`] steps from every point is
    /// refused.
    pub fn parse(v: f64, scale: RatingScale) -> Result<Self, String> {
        if !v.is_finite() || !scale.contains(v) {
            return Err(format!(
                "rating must be in [{}, {}], got {}",
                scale.min,
                scale.max,
                echo(v)
            ));
        }
        if scale.step > 0.0 {
            let k = (v - scale.min) / scale.step;
            if (k - k.round()).abs() > Self::STEP_TOLERANCE {
                return Err(format!(
                    "rating must be a multiple of {} from {}, got {}",
                    scale.step,
                    scale.min,
                    echo(v)
                ));
            }
            let snapped = (scale.min + k.round() * scale.step).clamp(scale.min, scale.max);
            return Ok(Self(snapped));
        }
        Ok(Self(v))
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 44 (2.8): an error echoes a huge or tiny number compactly.
    #[test]
    fn numbers_are_echoed_compactly() {
        let e = Epsilon::parse(1e308, 10.0).unwrap_err();
        assert_eq!(e, "eps must be >= 0.000001 and <= 10, got 1e308");
        let e = Epsilon::parse(1e-320, 10.0).unwrap_err();
        assert!(e.ends_with("got 1e-320"), "{e}");
        let s = RatingScale::new(1.0, 5.0, 0.5).unwrap();
        let e = RatingValue::parse(-1e300, s).unwrap_err();
        assert!(e.ends_with("got -1e300"), "{e}");
        assert!(Delta::parse(1e200).unwrap_err().ends_with("got 1e200"));
        assert_eq!(echo(0.5), "0.5");
        assert_eq!(echo(1234.25), "1234.25");
    }

    #[test]
    fn ids() {
        assert!(Id::parse("u1", 8).is_ok());
        for bad in ["", " u", "u ", "a\nb", "123456789"] {
            assert!(Id::parse(bad, 8).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn eps_delta_rating() {
        assert!(Epsilon::parse(0.5, 10.0).is_ok());
        for bad in [
            0.0,
            -1.0,
            10.5,
            f64::NAN,
            f64::INFINITY,
            1e-320,
            1e-300,
            9e-7,
        ] {
            assert!(Epsilon::parse(bad, 10.0).is_err(), "{bad}");
        }
        assert!(Epsilon::parse(Epsilon::MIN, 10.0).is_ok());
        assert!(Delta::parse(1e-320).is_err());
        assert!(Delta::parse(1e-6).is_ok());
        assert!(Delta::parse(0.0).is_err() && Delta::parse(1.0).is_err());
        let s = RatingScale::new(1.0, 5.0, 0.5).unwrap();
        assert!(RatingValue::parse(3.5, s).is_ok());
        assert!(RatingValue::parse(3.2, s).is_err());
        assert!(RatingValue::parse(5.5, s).is_err());
        assert!(RatingValue::parse(f64::NAN, s).is_err());
        // 1e-9 off a step is refused, not stored as sent.
        assert!(RatingValue::parse(3.0 + 1e-9, s).is_err());
        assert!(RatingValue::parse(3.0 - 1e-9, s).is_err());
        // Decimal values on a 0.1 step are snapped to the exact scale point.
        let tenth = RatingScale::new(0.0, 10.0, 0.1).unwrap();
        let v = RatingValue::parse(3.3, tenth).unwrap().get();
        assert_eq!(v, 0.0 + 33.0 * 0.1);
        assert!(RatingValue::parse(3.3 + 1e-9, tenth).is_err());
    }
}
