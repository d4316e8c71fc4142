//! Train/test folds: the predefined MovieLens-100K splits and seeded random k-fold.

use std::path::Path;

use rand::seq::SliceRandom;

use dprec::data::movielens::{self, Format};
use dprec::data::{DataError, IdMap, RatingScale, Ratings};

/// One cross-validation fold. Both halves share one index space.
#[derive(Debug, Clone)]
pub struct Fold {
    pub name: String,
    pub train: Ratings,
    pub test: Ratings,
}

/// A set of folds with the id maps and scale they were read with.
#[derive(Debug, Clone)]
pub struct Folds {
    pub folds: Vec<Fold>,
    pub users: IdMap,
    pub items: IdMap,
    pub scale: RatingScale,
}

/// Loads the predefined MovieLens-100K folds u1..u5 (`uK.base` / `uK.test`) with one
/// shared id space, so indices agree across folds.
pub fn predefined_ml100k(dir: &Path) -> Result<Folds, DataError> {
    let scale = RatingScale::ONE_TO_FIVE;
    let mut users = IdMap::new();
    let mut items = IdMap::new();
    let mut folds = Vec::with_capacity(5);
    for k in 1..=5 {
        let mut train = Ratings::default();
        let mut test = Ratings::default();
        let base = dir.join(format!("u{k}.base"));
        let probe = dir.join(format!("u{k}.test"));
        movielens::read_into(
            &base,
            Format::Ml100k,
            Some(scale),
            &mut users,
            &mut items,
            &mut train,
        )?;
        movielens::read_into(
            &probe,
            Format::Ml100k,
            Some(scale),
            &mut users,
            &mut items,
            &mut test,
        )?;
        folds.push(Fold {
            name: format!("u{k}"),
            train,
            test,
        });
    }
    let (nu, ni) = (users.len(), items.len());
    for f in &mut folds {
        f.train.set_dims(nu, ni);
        f.test.set_dims(nu, ni);
    }
    Ok(Folds {
        folds,
        users,
        items,
        scale,
    })
}

/// Splits `ratings` into `k` folds after a seeded shuffle: fold `f` tests on the `f`-th
/// slice and trains on the rest.
pub fn random_kfold(ratings: &Ratings, k: usize, seed: u64) -> Result<Vec<Fold>, DataError> {
    if k < 2 || k > ratings.len() {
        return Err(DataError::Invalid(format!(
            "k-fold needs 2 <= k <= number of ratings ({}), got k = {k}",
            ratings.len()
        )));
    }
    let mut order: Vec<usize> = (0..ratings.len()).collect();
    order.shuffle(&mut dprec_dp::rng::seeded(seed));
    let n = order.len();
    Ok((0..k)
        .map(|f| {
            let (lo, hi) = (f * n / k, (f + 1) * n / k);
            let train: Vec<usize> = order[..lo].iter().chain(&order[hi..]).copied().collect();
            Fold {
                name: format!("fold{}", f + 1),
                train: ratings.select(&train),
                test: ratings.select(&order[lo..hi]),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_kfold_partitions_the_ratings() {
        let mut r = Ratings::default();
        for k in 0..103u32 {
            r.push(k % 7, k % 11, (k % 5 + 1) as f32);
        }
        let folds = random_kfold(&r, 5, 1).unwrap();
        assert_eq!(folds.len(), 5);
        let total_test: usize = folds.iter().map(|f| f.test.len()).sum();
        assert_eq!(total_test, 103);
        for f in &folds {
            assert_eq!(f.train.len() + f.test.len(), 103);
            assert_eq!((f.train.n_users, f.train.n_items), (7, 11));
        }
        // Same seed, same split; other seed, other split.
        let again = random_kfold(&r, 5, 1).unwrap();
        assert_eq!(again[0].test.users, folds[0].test.users);
        let other = random_kfold(&r, 5, 2).unwrap();
        assert_ne!(other[0].test.items, folds[0].test.items);
        assert!(random_kfold(&r, 1, 1).is_err());
    }
}
