//! Rating spends written lazily (issue 22: a release at 20M ratings rewrote every
//! rating's row, the commit's floor). A release's rating charges are its charge sets
//! (`rating_charge_sets`, one row per user and distinct charge, ids as runs); a rating's
//! row (`spent`, `rho`, `releases`) holds the sets its user has been *settled* through
//! (`rating_settlements`, migration 0016), and the sets of later releases are *pending*: the rating's
//! state is its row with its user's pending sets that list it folded in, in release
//! order, with the same IEEE additions the commit used to make in SQL (`spent + charge`,
//! `rho + rho`, `releases + 1`), so the values are the same bits.
//!
//! A release settles a user (writes the folded rows and moves the mark) when the user is
//! due ([`due`]): one release in [`SETTLE_EVERY`] by a hash of the user. So a release
//! rewrites about 1/8 of the rows it charges, and a reader folds at most a few sets a user
//! (a user not charged by its due releases keeps its sets pending longer: correct, only
//! slower to read). Every reader of a rating's
//! spend goes through [`Pending`]: the training snapshot, the commit's re-check, a
//! continual tick's offers and the audit.

use std::collections::HashMap;

use sqlx::Row;

use super::{id_runs, StoreError};

/// A user is settled by one release in this many (by a hash of the user), and at the
/// latest once its pending releases reach twice this.
pub const SETTLE_EVERY: i64 = 8;

/// One pending charge set: what one release added to each listed rating of one user.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingSet {
    pub release_id: i64,
    /// Pure eps added to `spent` (`eps_train + eps_popularity`, as the commit adds it).
    pub charge: f64,
    /// Gaussian part added to `rho`.
    pub rho: f64,
    pub runs: id_runs::Runs,
}

impl PendingSet {
    /// Whether the set lists rating `id` (its runs are ascending and disjoint).
    pub fn lists(&self, id: i64) -> bool {
        let k = self.runs.partition_point(|&(_, b)| b < id);
        self.runs.get(k).is_some_and(|&(a, _)| a <= id)
    }
}

/// A rating's ledger state as a row stores it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spend {
    pub spent: f64,
    pub rho: f64,
    pub releases: i64,
}

impl Spend {
    /// The `spent, rho, releases` columns of a row, from column `first` on.
    pub fn from_row(r: &sqlx::any::AnyRow, first: usize) -> Result<Spend, StoreError> {
        Ok(Spend {
            spent: r.try_get(first)?,
            rho: r.try_get(first + 1)?,
            releases: r.try_get(first + 2)?,
        })
    }

    /// This state with `sets` (in release order) folded in where they list `id`.
    pub fn with(self, id: i64, sets: &[PendingSet]) -> Spend {
        let mut s = self;
        for set in sets.iter().filter(|set| set.lists(id)) {
            s = s.plus(set.charge, set.rho);
        }
        s
    }

    /// One more release's charge, in the commit's arithmetic.
    pub fn plus(self, charge: f64, rho: f64) -> Spend {
        Spend {
            spent: self.spent + charge,
            rho: self.rho + rho,
            releases: self.releases + 1,
        }
    }
}

/// The pending sets of some users, each user's in release order.
#[derive(Debug, Clone, Default)]
pub struct Pending {
    by_user: HashMap<String, Vec<PendingSet>>,
}

impl Pending {
    /// The sets of `user` (none: settled, or never charged).
    pub fn of(&self, user: &str) -> &[PendingSet] {
        self.by_user.get(user).map_or(&[], Vec::as_slice)
    }

    /// Adds `other`'s users (disjoint from these).
    pub fn extend(&mut self, other: Pending) {
        self.by_user.extend(other.by_user);
    }

    /// Adds a set of `user` (sets must come in release order per user).
    pub fn push(&mut self, user: &str, set: PendingSet) -> Result<(), StoreError> {
        if !self.by_user.contains_key(user) {
            self.by_user.insert(user.to_owned(), Vec::with_capacity(1));
        }
        let sets = self.by_user.get_mut(user).expect("inserted");
        if sets.last().is_some_and(|l| l.release_id > set.release_id) {
            return Err(StoreError::Corrupt(format!(
                "pending charge sets of {user:?} out of release order"
            )));
        }
        sets.push(set);
        Ok(())
    }

    /// Reads the rows of a pending-set query ([`PENDING_SELECT`]).
    pub fn from_rows(rows: &[sqlx::any::AnyRow]) -> Result<Pending, StoreError> {
        let mut out = Pending::default();
        for r in rows {
            out.push_row(r)?;
        }
        Ok(out)
    }

    /// Adds one row of a pending-set query: `user_id, release_id, eps_train,
    /// eps_popularity, rho, rating_ids`, rows ordered by user and release.
    pub fn push_row(&mut self, r: &sqlx::any::AnyRow) -> Result<(), StoreError> {
        let user: &str = r.try_get(0)?;
        let ids: &str = r.try_get(5)?;
        let mut runs = id_runs::decode(ids)
            .ok_or_else(|| StoreError::Corrupt(format!("charge set ids {ids:?}")))?;
        runs.shrink_to_fit();
        let eps_train: f64 = r.try_get(2)?;
        let eps_popularity: f64 = r.try_get(3)?;
        self.push(
            user,
            PendingSet {
                release_id: r.try_get(1)?,
                charge: eps_train + eps_popularity,
                rho: r.try_get(4)?,
                runs,
            },
        )
    }
}

/// The rating ids of a grouped read's id list (`"4,9,12"`, the store's id aggregate).
pub fn id_list(ids: &str) -> impl Iterator<Item = Result<i64, StoreError>> + '_ {
    ids.split(',').map(move |id| {
        id.parse()
            .map_err(|_| StoreError::Corrupt(format!("rating id list {ids:?}")))
    })
}

/// The columns [`Pending::from_rows`] reads, of the pending charge sets `s` (those after
/// their user's settlement `t`): append conditions and `ORDER BY s.user_id,
/// s.release_id`.
pub const PENDING_SELECT: &str = "SELECT s.user_id, s.release_id, s.eps_train, \
     s.eps_popularity, s.rho, s.rating_ids FROM rating_charge_sets s \
     LEFT JOIN rating_settlements t ON t.user_id = s.user_id \
     WHERE s.release_id > COALESCE(t.release_id, 0)";

/// Whether release `release_id` settles `user`: one release in [`SETTLE_EVERY`] by a
/// hash of the user, so each release settles about the same share of users and a user
/// charged by every release has at most that many pending.
pub fn due(user: &str, release_id: i64) -> bool {
    // FNV-1a: stable across builds and platforms (the std hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in user.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h % SETTLE_EVERY as u64 == release_id.rem_euclid(SETTLE_EVERY) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(release_id: i64, charge: f64, runs: &[(i64, i64)]) -> PendingSet {
        PendingSet {
            release_id,
            charge,
            rho: charge / 10.0,
            runs: runs.to_vec(),
        }
    }

    #[test]
    fn a_set_lists_exactly_the_ids_of_its_runs() {
        let s = set(1, 0.1, &[(3, 5), (9, 9), (12, 20)]);
        let listed: Vec<i64> = (0..25).filter(|&id| s.lists(id)).collect();
        assert_eq!(listed, [3, 4, 5, 9, 12, 13, 14, 15, 16, 17, 18, 19, 20]);
    }

    /// Folding pending sets gives the same bits as the commit's additions one release at
    /// a time (what the eager ledger stored), and skips the sets that do not list it.
    #[test]
    fn folding_equals_adding_release_by_release() {
        let row = Spend {
            spent: 0.1,
            rho: 0.0,
            releases: 1,
        };
        let sets = [
            set(4, 0.2, &[(1, 3)]),
            set(5, 0.7 / 3.0, &[(2, 2)]),
            set(7, 0.3, &[(1, 1), (3, 3)]),
        ];
        let eager = |id: i64| {
            let mut s = row;
            for x in &sets {
                if x.runs.iter().any(|&(a, b)| a <= id && id <= b) {
                    s.spent += x.charge;
                    s.rho += x.rho;
                    s.releases += 1;
                }
            }
            s
        };
        for id in 1..=4 {
            let lazy = row.with(id, &sets);
            let e = eager(id);
            assert_eq!(lazy.spent.to_bits(), e.spent.to_bits(), "id {id}");
            assert_eq!(lazy.rho.to_bits(), e.rho.to_bits(), "id {id}");
            assert_eq!(lazy.releases, e.releases, "id {id}");
        }
        assert_eq!(row.with(4, &sets), row, "listed by none");
        assert_eq!(row.with(2, &sets).releases, 3);
    }

    /// Over any 8 consecutive releases every user is due exactly once.
    #[test]
    fn every_user_is_due_once_in_every_settle_every_releases() {
        for user in ["a", "b", "user-1", "user-2", "zoë", ""] {
            for start in [1i64, 9, 100] {
                let n = (start..start + SETTLE_EVERY)
                    .filter(|&r| due(user, r))
                    .count();
                assert_eq!(n, 1, "{user:?} from {start}");
            }
        }
        // The hash spreads users over the releases (not all due together).
        let first: Vec<bool> = (0..200).map(|u| due(&format!("u{u}"), 8)).collect();
        let n = first.iter().filter(|d| **d).count();
        assert!((10..=40).contains(&n), "{n} of 200 due at one release");
    }

    #[test]
    fn pending_keeps_release_order_and_refuses_disorder() {
        let mut p = Pending::default();
        p.push("u", set(3, 0.1, &[(1, 1)])).unwrap();
        p.push("u", set(3, 0.2, &[(2, 2)])).unwrap();
        p.push("u", set(5, 0.1, &[(1, 2)])).unwrap();
        let releases: Vec<i64> = p.of("u").iter().map(|s| s.release_id).collect();
        assert_eq!(releases, [3, 3, 5]);
        assert!(p.of("v").is_empty());
        assert!(p.push("u", set(4, 0.1, &[(1, 1)])).is_err());
    }
}
