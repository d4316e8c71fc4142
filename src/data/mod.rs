//! Rating data: the in-memory representation every trainer works on.
//!
//! Ratings are kept as parallel arrays (user index, item index, value) with dense
//! indices; [`IdMap`] maps external ids to those indices. [`Interactions`] adds a
//! user-major (CSR) and an item-major (CSC) view built once, so trainers can make
//! per-user and per-item passes every epoch without copying the data.

pub mod movielens;
pub mod sparse;

use std::collections::HashMap;

pub use sparse::{Compressed, Interactions};

/// Errors raised while reading or building rating data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {reason}")]
    Malformed {
        path: String,
        line: usize,
        reason: movielens::LineError,
    },
    #[error("{0}")]
    Invalid(String),
}

/// The range of valid rating values. `step` is the granularity of the scale
/// (1 for MovieLens-100K/1M, 0.5 for MovieLens "latest").
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RatingScale {
    pub min: f64,
    pub max: f64,
    pub step: f64,
}

impl RatingScale {
    /// Builds a scale, rejecting empty or non-finite ranges.
    pub fn new(min: f64, max: f64, step: f64) -> Result<Self, DataError> {
        if !(min.is_finite() && max.is_finite() && step.is_finite()) || min >= max || step < 0.0 {
            return Err(DataError::Invalid(format!(
                "invalid rating scale [{min}, {max}] step {step}"
            )));
        }
        Ok(Self { min, max, step })
    }

    /// The 1..5 integer scale of MovieLens-100K and 1M.
    pub const ONE_TO_FIVE: RatingScale = RatingScale {
        min: 1.0,
        max: 5.0,
        step: 1.0,
    };

    /// Width of the scale, the sensitivity of one rating value under replacement.
    pub fn width(&self) -> f64 {
        self.max - self.min
    }

    pub fn contains(&self, v: f64) -> bool {
        v >= self.min && v <= self.max
    }

    pub fn clamp(&self, v: f64) -> f64 {
        v.clamp(self.min, self.max)
    }

    /// Infers the scale from observed values: min, max and the largest step that divides
    /// every value's offset from the minimum (1, 0.5, 0.25 or 0 for continuous data).
    pub fn detect(values: &[f32]) -> Result<Self, DataError> {
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for &v in values {
            lo = lo.min(v as f64);
            hi = hi.max(v as f64);
        }
        if values.is_empty() || lo >= hi {
            return Err(DataError::Invalid(
                "cannot detect a rating scale: need at least two distinct values".into(),
            ));
        }
        let step = [1.0, 0.5, 0.25]
            .into_iter()
            .find(|s| {
                values.iter().all(|&v| {
                    let k = (v as f64 - lo) / s;
                    (k - k.round()).abs() < 1e-6
                })
            })
            .unwrap_or(0.0);
        Self::new(lo, hi, step)
    }
}

/// Maps external ids (strings as they appear in the source) to dense indices 0..n.
#[derive(Debug, Clone, Default)]
pub struct IdMap {
    to_index: HashMap<String, u32>,
    to_external: Vec<String>,
}

impl IdMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns the index of `id`, assigning the next free one on first sight.
    pub fn intern(&mut self, id: &str) -> u32 {
        if let Some(&ix) = self.to_index.get(id) {
            return ix;
        }
        let ix = self.to_external.len() as u32;
        self.to_index.insert(id.to_owned(), ix);
        self.to_external.push(id.to_owned());
        ix
    }

    pub fn get(&self, id: &str) -> Option<u32> {
        self.to_index.get(id).copied()
    }

    pub fn external(&self, ix: u32) -> Option<&str> {
        self.to_external.get(ix as usize).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.to_external.len()
    }

    pub fn is_empty(&self) -> bool {
        self.to_external.is_empty()
    }
}

/// Ratings as parallel arrays with dense indices. `n_users`/`n_items` give the index
/// space, which may be larger than the set of indices present (e.g. a test fold that
/// shares the id maps of its training fold).
#[derive(Debug, Clone, Default)]
pub struct Ratings {
    pub users: Vec<u32>,
    pub items: Vec<u32>,
    pub values: Vec<f32>,
    pub n_users: usize,
    pub n_items: usize,
}

impl Ratings {
    pub fn with_dims(n_users: usize, n_items: usize) -> Self {
        Self {
            n_users,
            n_items,
            ..Self::default()
        }
    }

    /// Appends one rating, growing the index space if needed.
    pub fn push(&mut self, user: u32, item: u32, value: f32) {
        self.users.push(user);
        self.items.push(item);
        self.values.push(value);
        self.n_users = self.n_users.max(user as usize + 1);
        self.n_items = self.n_items.max(item as usize + 1);
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Mean rating value (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.values.is_empty() {
            return 0.0;
        }
        self.values.iter().map(|&v| v as f64).sum::<f64>() / self.values.len() as f64
    }

    /// The ratings at the given positions, keeping the index space.
    pub fn select(&self, positions: &[usize]) -> Ratings {
        let mut out = Ratings::with_dims(self.n_users, self.n_items);
        out.users.reserve(positions.len());
        out.items.reserve(positions.len());
        out.values.reserve(positions.len());
        for &p in positions {
            out.users.push(self.users[p]);
            out.items.push(self.items[p]);
            out.values.push(self.values[p]);
        }
        out
    }

    /// Widens the index space (never shrinks it).
    pub fn set_dims(&mut self, n_users: usize, n_items: usize) {
        self.n_users = self.n_users.max(n_users);
        self.n_items = self.n_items.max(n_items);
    }
}

/// A loaded data set: ratings with the id maps and scale they were read with.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub ratings: Ratings,
    pub users: IdMap,
    pub items: IdMap,
    pub scale: RatingScale,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_integer_and_half_star_scales() {
        let s = RatingScale::detect(&[1.0, 3.0, 5.0, 2.0]).unwrap();
        assert_eq!((s.min, s.max, s.step), (1.0, 5.0, 1.0));
        let s = RatingScale::detect(&[0.5, 3.5, 5.0]).unwrap();
        assert_eq!((s.min, s.max, s.step), (0.5, 5.0, 0.5));
        assert!(RatingScale::detect(&[3.0, 3.0]).is_err());
    }

    #[test]
    fn id_map_is_dense_and_stable() {
        let mut m = IdMap::new();
        assert_eq!(m.intern("a"), 0);
        assert_eq!(m.intern("b"), 1);
        assert_eq!(m.intern("a"), 0);
        assert_eq!(m.external(1), Some("b"));
        assert_eq!(m.get("c"), None);
    }
}
