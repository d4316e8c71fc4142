//! A per-rating column of `f64` (a budget, a Gaussian loss so far) that a trainer reads by
//! position. Most ratings of a release share their budget state, so the service hands the
//! column over as a code per rating into a table of the distinct values (4 bytes a rating
//! instead of 8, for two columns sharing the codes: at 20M ratings 240 MB less at the
//! release's peak, issue 22); tests and evaluation hand over plain slices or a constant.

/// One `f64` per rating, read by position.
#[derive(Debug, Clone, Copy)]
pub enum PerRating<'a> {
    /// The values themselves.
    Plain(&'a [f64]),
    /// Rating `k`'s value is `values[codes[k]]`.
    Coded { codes: &'a [u32], values: &'a [f64] },
    /// The same value for `len` ratings.
    Same { value: f64, len: usize },
}

impl<'a> PerRating<'a> {
    pub fn len(&self) -> usize {
        match self {
            Self::Plain(v) => v.len(),
            Self::Coded { codes, .. } => codes.len(),
            Self::Same { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rating `k`'s value (panics when `k >= len()`, or on a code outside the table).
    pub fn get(&self, k: usize) -> f64 {
        match self {
            Self::Plain(v) => v[k],
            Self::Coded { codes, values } => values[codes[k] as usize],
            Self::Same { value, len } => {
                assert!(k < *len, "rating {k} of {len}");
                *value
            }
        }
    }

    /// Every value, in rating order.
    pub fn iter(&self) -> impl Iterator<Item = f64> + 'a {
        let this = *self;
        (0..this.len()).map(move |k| this.get(k))
    }
}

impl<'a> From<&'a [f64]> for PerRating<'a> {
    fn from(v: &'a [f64]) -> Self {
        Self::Plain(v)
    }
}

impl<'a> From<&'a Vec<f64>> for PerRating<'a> {
    fn from(v: &'a Vec<f64>) -> Self {
        Self::Plain(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three forms of one column read the same values.
    #[test]
    fn every_form_reads_the_same_values() {
        let plain = [0.5, 0.25, 0.5, 0.5];
        let (codes, values) = ([1u32, 0, 1, 1], [0.25, 0.5]);
        let coded = PerRating::Coded {
            codes: &codes,
            values: &values,
        };
        assert_eq!(coded.len(), 4);
        let p = PerRating::from(&plain[..]);
        assert_eq!(
            coded.iter().collect::<Vec<_>>(),
            p.iter().collect::<Vec<_>>()
        );
        let same = PerRating::Same { value: 2.0, len: 3 };
        assert_eq!(same.iter().collect::<Vec<_>>(), vec![2.0; 3]);
        assert!(PerRating::Same { value: 1.0, len: 0 }.is_empty());
        assert!(std::panic::catch_unwind(|| same.get(3)).is_err());
    }
}
