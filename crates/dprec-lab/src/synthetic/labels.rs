//! Public item labels for the synthetic shapes, with a knob for how much they explain
//! taste: an item's label is its taste group ([`super::item_groups`]) with probability
//! `signal` (a public hash of the item decides), and a group drawn by another hash
//! otherwise. `signal` 1: the labels are the groups that make which items a user rates
//! personal; 0: labels unrelated to taste (pure noise), the case where a label model must
//! not rank below DP popularity.

use std::io::Write;
use std::path::Path;

use dprec::data::DataError;

use super::{item_groups, splitmix64, SyntheticConfig};

/// Mixed into the seed for the label hashes.
const LABEL_SALT: u64 = 0x1abe_1500_c0de_0001;

/// One label per item (`g0`, `g1`, ...); `None` without taste groups.
pub fn item_labels(cfg: &SyntheticConfig, signal: f64) -> Option<Vec<String>> {
    let groups = item_groups(cfg);
    if groups.is_empty() {
        return None;
    }
    let g = cfg.taste.groups as u64;
    let key = splitmix64(cfg.seed ^ LABEL_SALT);
    Some(
        groups
            .iter()
            .enumerate()
            .map(|(i, &own)| {
                let h = splitmix64(key ^ i as u64);
                // The top 53 bits as a uniform in [0, 1).
                let u = (h >> 11) as f64 / (1u64 << 53) as f64;
                let label = if u < signal {
                    own as u64
                } else {
                    splitmix64(h) % g
                };
                format!("g{label}")
            })
            .collect(),
    )
}

/// Writes the catalogue as MovieLens's `movies.csv` (`movieId,title,genres`, ids the
/// dense indices plus one, as [`super::write_csv`] writes them), so that `dprec-lab eval`
/// and `dprec import` read the labels beside the ratings.
pub fn write_catalogue_csv(labels: &[String], path: &Path) -> Result<(), DataError> {
    let io = |source| DataError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut w = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    let mut body = || -> std::io::Result<()> {
        w.write_all(b"movieId,title,genres\n")?;
        for (i, l) in labels.iter().enumerate() {
            writeln!(w, "{},Item {} (2000),{l}", i + 1, i + 1)?;
        }
        w.flush()
    };
    body().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At signal 1 the labels are the groups, at 0 they agree with them about as often as
    /// chance (1 in `groups`), in between about `signal + (1 - signal) / groups`.
    #[test]
    fn the_knob_sets_how_often_a_label_is_the_taste_group() {
        let cfg = SyntheticConfig::movielens_100k_taste();
        let groups = item_groups(&cfg);
        let g = cfg.taste.groups as f64;
        for (signal, tolerance) in [(1.0, 0.0), (0.0, 0.03), (0.5, 0.05)] {
            let labels = item_labels(&cfg, signal).unwrap();
            let same = labels
                .iter()
                .zip(&groups)
                .filter(|(l, &own)| **l == format!("g{own}"))
                .count() as f64
                / groups.len() as f64;
            let expected = signal + (1.0 - signal) / g;
            assert!((same - expected).abs() <= tolerance, "{signal}: {same}");
        }
        assert!(item_labels(&SyntheticConfig::movielens_100k_like(), 1.0).is_none());
    }
}
