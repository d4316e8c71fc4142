//! String hyper-parameters (`key=value`) as given on the command line or in config,
//! read into typed values with errors that name the parameter.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParamError {
    #[error("parameter {0:?} is not of the form key=value")]
    Syntax(String),
    #[error("parameter {key}: {reason}")]
    Invalid { key: String, reason: String },
    #[error("unknown parameter(s) {unknown} for trainer {trainer}; it accepts: {accepted}")]
    Unknown {
        trainer: String,
        unknown: String,
        accepted: String,
    },
}

/// A bag of `key=value` parameters that records which keys were read, so a trainer
/// can reject keys it does not know (a typo must not silently fall back to a default).
#[derive(Debug, Clone, Default)]
pub struct Params {
    values: BTreeMap<String, String>,
    read: RefCell<BTreeSet<String>>,
}

impl Params {
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `key=value` strings; later keys override earlier ones.
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Self, ParamError> {
        let mut p = Self::new();
        for item in items {
            let item = item.as_ref();
            let (k, v) = item
                .split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .ok_or_else(|| ParamError::Syntax(item.to_owned()))?;
            p.set(k.trim(), v.trim());
        }
        Ok(p)
    }

    pub fn set(&mut self, key: &str, value: &str) {
        self.values.insert(key.to_owned(), value.to_owned());
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.read.borrow_mut().insert(key.to_owned());
        self.values.get(key).map(String::as_str)
    }

    /// A finite float, or the default when absent.
    pub fn f64(&self, key: &str, default: f64) -> Result<f64, ParamError> {
        match self.get_str(key) {
            None => Ok(default),
            Some(s) => match s.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(v),
                _ => Err(invalid(key, format!("{s:?} is not a finite number"))),
            },
        }
    }

    /// A float that must be > 0.
    pub fn positive(&self, key: &str, default: f64) -> Result<f64, ParamError> {
        let v = self.f64(key, default)?;
        if v > 0.0 {
            Ok(v)
        } else {
            Err(invalid(key, format!("must be > 0, got {v}")))
        }
    }

    /// A float that must be >= 0.
    pub fn non_negative(&self, key: &str, default: f64) -> Result<f64, ParamError> {
        let v = self.f64(key, default)?;
        if v >= 0.0 {
            Ok(v)
        } else {
            Err(invalid(key, format!("must be >= 0, got {v}")))
        }
    }

    /// An integer in `min..=max`.
    pub fn usize_in(
        &self,
        key: &str,
        default: usize,
        min: usize,
        max: usize,
    ) -> Result<usize, ParamError> {
        let v = match self.get_str(key) {
            None => default,
            Some(s) => s
                .parse::<usize>()
                .map_err(|_| invalid(key, format!("{s:?} is not a whole number")))?,
        };
        if (min..=max).contains(&v) {
            Ok(v)
        } else {
            Err(invalid(key, format!("must be in {min}..={max}, got {v}")))
        }
    }

    /// A boolean (`true`/`false`/`1`/`0`).
    pub fn bool(&self, key: &str, default: bool) -> Result<bool, ParamError> {
        match self.get_str(key) {
            None => Ok(default),
            Some("true" | "1" | "yes") => Ok(true),
            Some("false" | "0" | "no") => Ok(false),
            Some(s) => Err(invalid(key, format!("{s:?} is not true or false"))),
        }
    }

    /// Fails when a key was given that the trainer never read.
    pub fn reject_unknown(&self, trainer: &str) -> Result<(), ParamError> {
        let read = self.read.borrow();
        let unknown: Vec<&str> = self
            .values
            .keys()
            .filter(|k| !read.contains(*k))
            .map(String::as_str)
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        Err(ParamError::Unknown {
            trainer: trainer.to_owned(),
            unknown: unknown.join(", "),
            accepted: read.iter().cloned().collect::<Vec<_>>().join(", "),
        })
    }
}

fn invalid(key: &str, reason: String) -> ParamError {
    ParamError::Invalid {
        key: key.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_reads_and_errors_name_the_key() {
        let p = Params::parse(&["d=20", "lr=0.01", "reg=-1", "x=abc"]).unwrap();
        assert_eq!(p.usize_in("d", 10, 1, 100).unwrap(), 20);
        assert_eq!(p.positive("lr", 0.1).unwrap(), 0.01);
        assert_eq!(p.positive("missing", 0.5).unwrap(), 0.5);
        let e = p.non_negative("reg", 0.0).unwrap_err().to_string();
        assert!(e.contains("reg") && e.contains(">= 0"), "{e}");
        let e = p.f64("x", 0.0).unwrap_err().to_string();
        assert!(e.contains("\"abc\""), "{e}");
        assert!(Params::parse(&["novalue"]).is_err());
        assert!(Params::parse(&["=3"]).is_err());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let p = Params::parse(&["d=20", "epochz=3"]).unwrap();
        p.usize_in("d", 1, 1, 100).unwrap();
        p.usize_in("epochs", 1, 1, 100).unwrap();
        let e = p.reject_unknown("sgd-mf").unwrap_err().to_string();
        assert!(e.contains("epochz") && e.contains("epochs"), "{e}");
    }
}
