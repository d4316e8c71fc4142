//! What a continual tick reads (issue 23, steady ticks at scale): only what the series has
//! not offered to its arrival cap yet, and the series' own state in aggregate form. A
//! steady tick never reads the whole ratings table: the ratings that arrived since the
//! last tick (rating ids above its mark), the earlier ratings of users who join now,
//! ratings updated since the last tick, the per-item counts of the admitted pairs, and the
//! pairs of members still below the cap. The decisions are pure, in `release::continual`.

use std::collections::{BTreeMap, HashMap};

use futures_util::TryStreamExt;
use sqlx::Row;

use super::pending::Spend;
use super::{now_ms, Backend, Store, StoreError};
use dprec_dp::ledger::UserBudget;

/// How far a tick reaches: ratings with ids up to `id` were all committed when it read
/// (`Store::offer_mark`), at time `at` (ms).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OfferMark {
    pub id: i64,
    pub at: i64,
}

/// Ratings updated this long before the last tick's read are offered again: a write
/// takes its `updated_at` before it commits, so it can commit after a read that is later
/// than its timestamp. Offering a rating twice changes nothing (the arrival cap admits a
/// pair once), so the overlap only costs reading a few rows again.
pub const UPDATE_OVERLAP_MS: i64 = 10 * 60 * 1000;

/// One live, centrally held rating of a live user, as a tick offers it.
#[derive(Debug, Clone, Copy)]
pub struct OfferedRating<'a> {
    pub id: i64,
    pub user: &'a str,
    pub item: &'a str,
    pub eps: f64,
    pub spent: f64,
    pub rho: f64,
}

/// Which ratings one read offers (each user's ratings in rating-id order).
#[derive(Debug, Clone, Copy)]
pub enum OfferRead<'a> {
    /// Arrived since the last tick (`after < id <= through`), each user's first
    /// `per_user` only, a user's in id order (users in any order): a first tick reads
    /// every rating while the cap admits a few a user, and handing every row over was most
    /// of its time (lab note bench-03). The caller reads on for the users the cap still
    /// wants ([`OfferRead::OfUsers`]).
    ArrivedFirst {
        after: i64,
        through: i64,
        per_user: i64,
    },
    /// Earlier ratings (`id <= through`) of `users`, who join the series now.
    OfUsers { users: &'a [&'a str], through: i64 },
    /// Earlier ratings (`id <= through`) updated after their creation, at `since` or
    /// later (e.g. a pair deleted and rated again).
    Updated { since: i64, through: i64 },
}

/// Users per `IN (...)` list of [`OfferRead::OfUsers`].
const USERS_PER_READ: usize = 500;

const OFFER_COLUMNS: &str = "SELECT r.id, r.user_id, r.item_id, r.eps, r.spent, r.rho \
     FROM ratings r JOIN users u ON u.id = r.user_id \
     WHERE r.value IS NOT NULL AND u.deleted = 0 AND r.origin <> 'ldp'";

impl Store {
    /// The tick's reach. On SQLite a rating id is assigned under the database's write
    /// lock, so ids commit in order and the largest visible id is a mark. On PostgreSQL
    /// ids come from a sequence before commit, so a lower id can commit after a higher
    /// one: the largest id is read under `SHARE` mode on `ratings`, which waits for the
    /// writers in flight and holds new ones back until this short transaction ends.
    pub async fn offer_mark(&self) -> Result<OfferMark, StoreError> {
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Postgres {
            sqlx::query("LOCK TABLE ratings IN SHARE MODE")
                .execute(&mut *tx)
                .await?;
        }
        let at = now_ms();
        let id: i64 = sqlx::query("SELECT COALESCE(MAX(id), 0) FROM ratings")
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        tx.commit().await?;
        Ok(OfferMark { id, at })
    }

    /// Live users series `series` has not decided yet, with their budgets.
    pub async fn undecided_users(
        &self,
        series: i64,
    ) -> Result<BTreeMap<String, UserBudget>, StoreError> {
        let mut rows = sqlx::query(
            "SELECT u.id, u.budget_eps, u.budget_delta, u.rdp_consumed FROM users u \
             WHERE u.deleted = 0 AND NOT EXISTS (SELECT 1 FROM series_members m \
             WHERE m.series_id = $1 AND m.user_id = u.id)",
        )
        .bind(series)
        .fetch(&self.pool);
        super::budgets::BudgetReader::default()
            .read_all(&mut rows)
            .await
    }

    /// The users series `series` charged (its members), in any order.
    pub async fn series_members_admitted(&self, series: i64) -> Result<Vec<String>, StoreError> {
        let rows =
            sqlx::query("SELECT user_id FROM series_members WHERE series_id = $1 AND admitted = 1")
                .bind(series)
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|r| r.try_get(0).map_err(StoreError::from))
            .collect()
    }

    /// The arrival cap's state in the form a tick needs: the users with `cap` or more
    /// pairs (nothing more can be admitted for them, so their pairs are not read), and
    /// the pairs of the users below `cap`.
    pub async fn series_open_pairs(
        &self,
        series: i64,
        cap: usize,
    ) -> Result<(Vec<String>, Vec<(String, String)>), StoreError> {
        let cap = cap as i64;
        let full = sqlx::query(
            "SELECT user_id FROM series_admitted WHERE series_id = $1 \
             GROUP BY user_id HAVING COUNT(*) >= $2",
        )
        .bind(series)
        .bind(cap)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<Vec<String>, _>>()?;
        let open = sqlx::query(
            "SELECT a.user_id, a.item_id FROM series_admitted a WHERE a.series_id = $1 \
             AND a.user_id IN (SELECT user_id FROM series_admitted WHERE series_id = $1 \
             GROUP BY user_id HAVING COUNT(*) < $2)",
        )
        .bind(series)
        .bind(cap)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<Vec<(String, String)>, sqlx::Error>>()?;
        Ok((full, open))
    }

    /// Admitted pairs of series `series` per item (deleted ratings' pairs included).
    pub async fn series_item_counts(
        &self,
        series: i64,
    ) -> Result<HashMap<String, i64>, StoreError> {
        let rows = sqlx::query(
            "SELECT item_id, COUNT(*) FROM series_admitted WHERE series_id = $1 GROUP BY item_id",
        )
        .bind(series)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }

    /// Streams the ratings `read` selects to `offer`, each user's in rating-id order
    /// (nothing is buffered: a series' first tick reads a few of every user's ratings).
    pub async fn for_each_offer(
        &self,
        read: OfferRead<'_>,
        mut offer: impl FnMut(OfferedRating<'_>),
    ) -> Result<(), StoreError> {
        // Each offered rating's spend with its user's pending charge sets folded in.
        let pending = self.pending_of_all().await?;
        let mut offer = |r: OfferedRating<'_>| {
            let row = Spend {
                spent: r.spent,
                rho: r.rho,
                releases: 0,
            };
            let s = row.with(r.id, pending.of(r.user));
            offer(OfferedRating {
                spent: s.spent,
                rho: s.rho,
                ..r
            })
        };
        match read {
            OfferRead::ArrivedFirst {
                after,
                through,
                per_user,
            } => {
                // The window numbers a narrow row (id, user) and the rest is read back by
                // id for the rows kept; deleted users are dropped after it (their ratings
                // all go): 17 s of SQLite's work at 20M ratings against 25 s with every
                // column and the users' join under the window (lab note bench-03).
                let sql = "SELECT r.id, r.user_id, r.item_id, r.eps, r.spent, r.rho FROM ( \
                     SELECT id, user_id, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY id) AS n \
                     FROM ratings WHERE value IS NOT NULL AND origin <> 'ldp' \
                     AND id > $1 AND id <= $2) AS w \
                     JOIN ratings r ON r.id = w.id JOIN users u ON u.id = w.user_id \
                     WHERE w.n <= $3 AND u.deleted = 0 ORDER BY w.user_id, w.id";
                self.stream_offers(sql, &[after, through, per_user], &[], &mut offer)
                    .await
            }
            OfferRead::Updated { since, through } => {
                // Updated after creation only: a rating created at or below the mark
                // was offered by the tick that set it, however recent its creation.
                let sql = format!(
                    "{OFFER_COLUMNS} AND r.updated_at >= $1 AND r.updated_at > r.created_at \
                     AND r.id <= $2"
                );
                self.offer_sorted(&sql, &[since, through], &[], &mut offer)
                    .await
            }
            OfferRead::OfUsers { users, through } => {
                // A user's ratings all fall in one chunk, so each user's come in id order.
                for chunk in users.chunks(USERS_PER_READ) {
                    let list = super::placeholders(chunk.len(), 1, |b| format!("${b}"));
                    // The bound on the id is applied here: as a condition next to the
                    // users' index, PostgreSQL scanned the id index over the whole range.
                    let sql = format!("{OFFER_COLUMNS} AND r.user_id IN ({list})");
                    self.offer_sorted(&sql, &[], chunk, &mut |r| {
                        if r.id <= through {
                            offer(r)
                        }
                    })
                    .await?;
                }
                Ok(())
            }
        }
    }

    /// Offers the rows of `sql` in rating-id order, sorted here: these reads select few
    /// rows through another index (`updated_at`, the users'), and with an ORDER BY on the
    /// rating id a planner may walk the whole table in id order instead.
    async fn offer_sorted(
        &self,
        sql: &str,
        numbers: &[i64],
        users: &[&str],
        offer: &mut impl FnMut(OfferedRating<'_>),
    ) -> Result<(), StoreError> {
        let mut rows: Vec<(i64, String, String, f64, f64, f64)> = Vec::new();
        self.stream_offers(sql, numbers, users, &mut |r| {
            rows.push((r.id, r.user.into(), r.item.into(), r.eps, r.spent, r.rho))
        })
        .await?;
        rows.sort_by_key(|r| r.0);
        for (id, user, item, eps, spent, rho) in &rows {
            offer(OfferedRating {
                id: *id,
                user,
                item,
                eps: *eps,
                spent: *spent,
                rho: *rho,
            });
        }
        Ok(())
    }

    async fn stream_offers(
        &self,
        sql: &str,
        numbers: &[i64],
        users: &[&str],
        offer: &mut impl FnMut(OfferedRating<'_>),
    ) -> Result<(), StoreError> {
        let mut q = sqlx::query(sql);
        for n in numbers {
            q = q.bind(*n);
        }
        for u in users {
            q = q.bind(*u);
        }
        let mut rows = q.fetch(&self.pool);
        while let Some(r) = rows.try_next().await? {
            offer(OfferedRating {
                id: r.try_get(0)?,
                user: r.try_get(1)?,
                item: r.try_get(2)?,
                eps: r.try_get(3)?,
                spent: r.try_get(4)?,
                rho: r.try_get(5)?,
            });
        }
        Ok(())
    }
}
