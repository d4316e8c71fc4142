//! Ratings, users and their settings (the training snapshot is in `snapshot`).

use std::collections::{BTreeMap, BTreeSet};

use sqlx::Row;

use super::{
    curve_json, now_ms, parse_curve, placeholders, Backend, Defaults, NewRating, SettingsWrite,
    Store, StoreCounts, StoreError, Tx, UserRow,
};
use dprec_dp::accountant::RdpCurve;
use dprec_dp::ledger::UserBudget;

/// Rows per multi-row statement of [`Store::upsert_ratings`] (at most 7 binds per row).
/// Small on purpose: sqlx binds SQLite parameters by name, and each lookup scans the
/// statement's parameter list, so a statement costs O(binds^2) (lab note bench-02,
/// "chunked release commit"); 64 rows is the size the release commit uses too.
const UPSERT_CHUNK: usize = 64;

impl Store {
    // ----- ingestion and settings -------------------------------------------------

    /// Upserts a batch in one transaction (all or nothing). A re-rating replaces the
    /// value and keeps the budget slot (eps_ij, spent, releases). Locally perturbed
    /// ratings (`ldp`) are stored as origin `ldp`, fully spent, and charged to their
    /// user's RDP ledger in the same transaction (`store::ldp`). Returns the number of
    /// new ratings. The checks and writes run as chunked multi-row statements on SQLite
    /// and as one array-bound statement each on PostgreSQL (`store::ratings_pg`), with
    /// the same results, errors and lock order.
    pub async fn upsert_ratings(
        &self,
        batch: &[NewRating],
        defaults: Defaults,
    ) -> Result<usize, StoreError> {
        let batch = Batch::new(batch);
        // In the writers' queue, then holding SQLite's write lock from the first statement:
        // never behind a whole release, and never failing at once on a busy database.
        let _gate = self.write_gate().await;
        let mut tx = self.begin_write().await?;
        // Taken once the writers' queue is behind: `updated_at` then precedes the commit
        // by the transaction's own time only (serving's check for changes made by other
        // processes reads by it, `serve::facts`).
        let now = now_ms();
        // LDP ratings charge their users: the hold of a release in flight first, before
        // any user's row (the lock order of `store::holds`).
        let held = if batch.rows.iter().any(|r| r.ldp.is_some()) {
            super::holds::held_events(&mut tx, self.backend).await?
        } else {
            Vec::new()
        };
        let created = match self.backend {
            Backend::Sqlite => upsert_sqlite(&mut tx, &batch, defaults, now).await?,
            Backend::Postgres => upsert_postgres(&mut tx, &batch, defaults, now).await?,
        };
        super::ldp::charge_users(&mut tx, &batch.rows, self.for_update(), &held).await?;
        tx.commit().await?;
        Ok(created)
    }

    pub async fn user(&self, id: &str) -> Result<Option<UserRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, default_eps, budget_eps, budget_delta, rdp_consumed, deleted \
             FROM users WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Ok(None) };
        let consumed: String = r.try_get("rdp_consumed")?;
        let deleted: i64 = r.try_get("deleted")?;
        Ok(Some(UserRow {
            id: r.try_get("id")?,
            default_eps: r.try_get("default_eps")?,
            budget_eps: r.try_get("budget_eps")?,
            budget_delta: r.try_get("budget_delta")?,
            consumed: parse_curve(&consumed)?,
            deleted: deleted != 0,
        }))
    }

    /// Creates or updates a user's settings; the consumed curve is never touched. A
    /// budget (eps_u, delta_u) may be lowered at any time but raised only while the user
    /// has not been charged (DESIGN 4): the update is refused, atomically with any release
    /// that charges the user, when it raises either value of a charged user. While a
    /// release is in flight, a budget that would not admit its held charge for a user it
    /// may be charging is refused too ([`dprec_dp::ledger::keeps_hold`]), so a settings change
    /// never makes a release fail (docs/LEDGER.md, "Releases in flight").
    pub async fn put_user_settings(
        &self,
        id: &str,
        default_eps: Option<f64>,
        budget_eps: f64,
        budget_delta: f64,
    ) -> Result<SettingsWrite, StoreError> {
        let now = now_ms();
        let _gate = self.write_gate().await;
        let mut tx = self.begin_write().await?;
        // The hold before the user's row (the lock order of `store::holds`).
        let held = super::holds::held_events(&mut tx, self.backend).await?;
        if !held.is_empty() {
            let row = sqlx::query(&format!(
                "SELECT budget_eps, budget_delta, rdp_consumed FROM users WHERE id = $1{}",
                self.for_update()
            ))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(r) = row {
                let before = UserBudget {
                    eps: r.try_get(0)?,
                    delta: r.try_get(1)?,
                    consumed: parse_curve(&r.try_get::<String, _>(2)?)?,
                };
                let after = UserBudget {
                    eps: budget_eps.min(before.eps),
                    delta: budget_delta.min(before.delta),
                    consumed: before.consumed.clone(),
                };
                let keeps = dprec_dp::ledger::keeps_hold(Some(&before), &after, &held).map_err(
                    |source| StoreError::Accounting {
                        user: id.to_owned(),
                        source,
                    },
                )?;
                if !keeps {
                    return Ok(SettingsWrite::Held);
                }
            }
        }
        // `default_eps` is bound as a number and a flag, never as a NULL: on PostgreSQL a
        // statement cached with a NULL-typed parameter rejects a later f64 ("incorrect
        // binary data format in bind parameter 2").
        let r = sqlx::query(
            "INSERT INTO users (id, default_eps, budget_eps, budget_delta, rdp_consumed, deleted, \
             created_at, updated_at) \
             VALUES ($1, CASE WHEN $7 = 1 THEN $2 ELSE NULL END, $3, $4, $5, 0, $6, $6) \
             ON CONFLICT (id) DO UPDATE SET default_eps = excluded.default_eps, \
             budget_eps = excluded.budget_eps, budget_delta = excluded.budget_delta, \
             updated_at = excluded.updated_at \
             WHERE (excluded.budget_eps <= users.budget_eps \
                    AND excluded.budget_delta <= users.budget_delta) \
                OR users.rdp_consumed = '' OR users.rdp_consumed = $5",
        )
        .bind(id)
        .bind(default_eps.unwrap_or(0.0))
        .bind(budget_eps)
        .bind(budget_delta)
        .bind(curve_json(&RdpCurve::zeros_default()))
        .bind(now)
        .bind(i64::from(default_eps.is_some()))
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() == 0 {
            return Ok(SettingsWrite::RaiseRefused);
        }
        tx.commit().await?;
        Ok(SettingsWrite::Applied)
    }

    /// Deletes a rating's value (the budget slot and its ledger history stay).
    pub async fn delete_rating(&self, user: &str, item: &str) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE ratings SET value = NULL, updated_at = $3 \
             WHERE user_id = $1 AND item_id = $2 AND value IS NOT NULL",
        )
        .bind(user)
        .bind(item)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() > 0)
    }

    /// Deletes all of a user's rating values and marks the user deleted.
    pub async fn delete_user(&self, user: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let u = sqlx::query("UPDATE users SET deleted = 1, updated_at = $2 WHERE id = $1")
            .bind(user)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE ratings SET value = NULL, updated_at = $2 WHERE user_id = $1")
            .bind(user)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(u.rows_affected() > 0)
    }

    /// What serving needs of a user in one statement: whether the user is deleted and
    /// the user's rated items with their values, ordered by item (an unknown user: not
    /// deleted, no ratings). A top-N request whose user is not cached reads this; as two
    /// statements ([`Store::user`], [`Store::user_ratings`]) it took two round trips to
    /// SQLite's connection thread and parsed the user's consumed RDP curve for nothing.
    pub async fn serving_facts(
        &self,
        user: &str,
    ) -> Result<(bool, Vec<(String, f64)>), StoreError> {
        if self.backend == Backend::Sqlite {
            if let Some(facts) = self.serving_facts_packed(user).await? {
                return Ok(facts);
            }
        }
        let rows = sqlx::query(
            "SELECT u.deleted, r.item_id, r.value FROM users u \
             LEFT JOIN ratings r ON r.user_id = u.id AND r.value IS NOT NULL \
             WHERE u.id = $1 ORDER BY r.item_id",
        )
        .bind(user)
        .fetch_all(&self.pool)
        .await?;
        let mut deleted = false;
        let mut ratings = Vec::with_capacity(rows.len());
        for r in &rows {
            deleted = r.try_get::<i64, _>(0)? != 0;
            if let Some(item) = r.try_get::<Option<String>, _>(1)? {
                ratings.push((item, r.try_get(2)?));
            }
        }
        Ok((deleted, ratings))
    }

    /// [`Store::serving_facts`] on SQLite in one row: sqlx hands SQLite's rows from the
    /// connection's thread to the task one at a time (a thread wake-up and a copy of
    /// every value each), which made the read of a user of 150 ratings cost about 1 ms at
    /// 20M ratings, most of a first top-N request's time. The ratings come packed in one
    /// text value (item, unit separator, value with 17 significant digits, which reads
    /// back as the same f64; record separator between ratings) and are sorted here by
    /// item (SQLite's BINARY order is byte order, as the row-wise read's ORDER BY).
    /// `None` when the text does not unpack to the user's count of ratings (an id that
    /// holds a separator; ids from the API hold no control characters): the row-wise
    /// read answers then.
    async fn serving_facts_packed(
        &self,
        user: &str,
    ) -> Result<Option<(bool, Vec<(String, f64)>)>, StoreError> {
        let row = sqlx::query(
            "SELECT u.deleted, p.n, p.packed FROM users u, \
             (SELECT COUNT(*) AS n, group_concat(item_id || char(31) || \
                     printf('%!.17g', value), char(30)) AS packed \
              FROM ratings WHERE user_id = $1 AND value IS NOT NULL) AS p \
             WHERE u.id = $1",
        )
        .bind(user)
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else {
            return Ok(Some((false, Vec::new())));
        };
        let deleted = r.try_get::<i64, _>(0)? != 0;
        let n: i64 = r.try_get(1)?;
        let packed: Option<String> = r.try_get(2)?;
        let mut ratings = Vec::with_capacity(n.max(0) as usize);
        for rec in packed.as_deref().unwrap_or("").split('\u{1e}') {
            let Some((item, value)) = rec.rsplit_once('\u{1f}') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                return Ok(None);
            };
            ratings.push((item.to_owned(), value));
        }
        if ratings.len() as i64 != n {
            return Ok(None);
        }
        ratings.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Some((deleted, ratings)))
    }

    /// The ratings changed at `since` (Unix ms) or later, of the users `keep` accepts,
    /// with their current value (`None`: deleted) and whether their user is deleted now:
    /// what another process wrote, for the serving cache
    /// (`serve::facts`), as `(user, item, value, user deleted)`. Read through the
    /// `updated_at` index, streamed, so only the kept rows are held.
    pub async fn ratings_changed_since(
        &self,
        since: i64,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<(String, String, Option<f64>, bool)>, StoreError> {
        use futures_util::TryStreamExt;
        let mut rows = sqlx::query(
            "SELECT r.user_id, r.item_id, r.value, u.deleted FROM ratings r \
             JOIN users u ON u.id = r.user_id WHERE r.updated_at >= $1",
        )
        .bind(since)
        .fetch(&self.pool);
        let mut out = Vec::new();
        while let Some(r) = rows.try_next().await? {
            let user: &str = r.try_get(0)?;
            if keep(user) {
                out.push((
                    user.to_owned(),
                    r.try_get(1)?,
                    r.try_get(2)?,
                    r.try_get::<i64, _>(3)? != 0,
                ));
            }
        }
        Ok(out)
    }

    /// The user's own current ratings `(item, value)`: what serving may use for that user
    /// (joint DP, DESIGN 6).
    pub async fn user_ratings(&self, user: &str) -> Result<Vec<(String, f64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT item_id, value FROM ratings WHERE user_id = $1 AND value IS NOT NULL \
             ORDER BY item_id",
        )
        .bind(user)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Counts of the whole store (tests and metrics).
    pub async fn counts(&self) -> Result<StoreCounts, StoreError> {
        let n = |sql: &'static str| async move {
            let r = sqlx::query(sql).fetch_one(&self.pool).await?;
            r.try_get::<i64, _>(0).map_err(StoreError::from)
        };
        Ok(StoreCounts {
            users: n("SELECT COUNT(*) FROM users").await?,
            items: n("SELECT COUNT(*) FROM items").await?,
            ratings: n("SELECT COUNT(*) FROM ratings WHERE value IS NOT NULL").await?,
            releases: n("SELECT COUNT(*) FROM releases").await?,
            // Ratings charged, summed over releases (one row each before migration 0012,
            // charge sets after).
            rating_charges: n("SELECT (SELECT COUNT(*) FROM rating_charges) + \
                 (SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) FROM rating_charge_sets)")
            .await?,
            user_charges: n("SELECT COUNT(*) FROM user_charges").await?,
            models: n("SELECT COUNT(*) FROM models").await?,
        })
    }

    /// A digest of every mutable table (tests assert bad input changes nothing).
    pub async fn fingerprint(&self) -> Result<String, StoreError> {
        let mut out = String::new();
        for sql in [
            "SELECT id, COALESCE(default_eps, -1.0), budget_eps, budget_delta, deleted FROM users ORDER BY id",
            "SELECT user_id, item_id, COALESCE(value, -1.0), eps, spent FROM ratings ORDER BY user_id, item_id",
            "SELECT id, '', CAST(0 AS DOUBLE PRECISION), CAST(0 AS DOUBLE PRECISION), 0 FROM items ORDER BY id",
        ] {
            for r in sqlx::query(sql).fetch_all(&self.pool).await? {
                let a: String = r.try_get(0)?;
                let b: String = match r.try_get::<String, _>(1) {
                    Ok(s) => s,
                    Err(_) => r.try_get::<f64, _>(1)?.to_string(),
                };
                let c: f64 = r.try_get(2)?;
                let d: f64 = r.try_get(3)?;
                out.push_str(&format!("{a}|{b}|{c}|{d};"));
            }
        }
        Ok(out)
    }

    // ----- training snapshot --------------------------------------------------------

    /// Every live (not deleted) user's budget and consumed RDP curve.
    pub async fn user_budgets(&self) -> Result<BTreeMap<String, UserBudget>, StoreError> {
        let mut rows = sqlx::query(
            "SELECT id, budget_eps, budget_delta, rdp_consumed FROM users WHERE deleted = 0",
        )
        .fetch(&self.pool);
        super::budgets::BudgetReader::default()
            .read_all(&mut rows)
            .await
    }
}

/// A batch as both backends write it: one row per (user, item) pair, sorted by pair,
/// and its distinct users and items, sorted.
struct Batch<'a> {
    rows: Vec<&'a NewRating>,
    users: Vec<&'a str>,
    items: Vec<&'a str>,
}

impl<'a> Batch<'a> {
    fn new(batch: &'a [NewRating]) -> Self {
        // A pair rated twice in one batch: the last value wins, as if sent one by one
        // (a multi-row upsert may touch each row once).
        let mut last: BTreeMap<(&str, &str), &NewRating> = BTreeMap::new();
        for r in batch {
            last.insert((r.user.as_str(), r.item.as_str()), r);
        }
        let rows: Vec<&NewRating> = last.into_values().collect();
        let users: BTreeSet<&str> = rows.iter().map(|r| r.user.as_str()).collect();
        let items: BTreeSet<&str> = rows.iter().map(|r| r.item.as_str()).collect();
        Self {
            rows,
            users: users.into_iter().collect(),
            items: items.into_iter().collect(),
        }
    }
}

/// A new user's consumed curve is stored as '' (read back as the zero curve by
/// `parse_curve`) instead of 156 zeros of JSON per row.
const ZERO_CURVE: &str = "";

/// A new rating's `(eps, spent, origin)`: its own eps, else its user's default, else the
/// service default; LDP ratings fully spent (`ldp::origin_and_spent`).
fn resolve(
    r: &NewRating,
    user_default: &BTreeMap<String, Option<f64>>,
    defaults: Defaults,
) -> (f64, f64, &'static str) {
    let eps = r
        .eps
        .or(user_default.get(r.user.as_str()).copied().flatten())
        .unwrap_or(defaults.rating_eps);
    let (origin, spent) = super::ldp::origin_and_spent(r, eps);
    (eps, spent, origin)
}

/// SQLite's path: multi-row statements of [`UPSERT_CHUNK`] rows (well under the
/// bind-parameter limit): one round trip per chunk instead of one per rating.
async fn upsert_sqlite(
    tx: &mut Tx,
    batch: &Batch<'_>,
    defaults: Defaults,
    now: i64,
) -> Result<usize, StoreError> {
    // Items are registered, never created by a rating (issue 8 finding 1).
    super::catalogue::require_registered(tx, &batch.items).await?;
    super::ldp::check_pairs(tx, &batch.rows).await?;
    let user_default = upsert_users(tx, &batch.users, defaults, ZERO_CURVE, now).await?;
    let mut created = 0;
    for chunk in batch.rows.chunks(UPSERT_CHUNK) {
        let sql = format!(
            "INSERT INTO ratings (user_id, item_id, value, eps, spent, releases, origin, \
             created_at, updated_at) VALUES {} \
             ON CONFLICT (user_id, item_id) DO UPDATE SET value = excluded.value, \
             updated_at = excluded.updated_at RETURNING created_at",
            placeholders(chunk.len(), 7, |b| {
                format!(
                    "(${}, ${}, ${}, ${}, ${}, 0, ${}, ${}, ${})",
                    b,
                    b + 1,
                    b + 2,
                    b + 3,
                    b + 4,
                    b + 5,
                    b + 6,
                    b + 6
                )
            })
        );
        let mut q = sqlx::query(&sql);
        for r in chunk {
            let (eps, spent, origin) = resolve(r, &user_default, defaults);
            q = q
                .bind(&r.user)
                .bind(&r.item)
                .bind(r.value)
                .bind(eps)
                .bind(spent)
                .bind(origin)
                .bind(now);
        }
        for row in q.fetch_all(&mut **tx).await? {
            let created_at: i64 = row.try_get(0)?;
            if created_at == now {
                created += 1;
            }
        }
    }
    Ok(created)
}

/// PostgreSQL's path: the same steps in the same order, each one array-bound statement
/// (`store::ratings_pg`), so a batch is four round trips whatever its size.
async fn upsert_postgres(
    tx: &mut Tx,
    batch: &Batch<'_>,
    defaults: Defaults,
    now: i64,
) -> Result<usize, StoreError> {
    use super::ratings_pg as pg;
    pg::require_registered(tx, &batch.items).await?;
    pg::check_pairs(tx, &batch.rows).await?;
    let user_default = pg::upsert_users(tx, &batch.users, defaults, ZERO_CURVE, now).await?;
    let resolved: Vec<_> = batch
        .rows
        .iter()
        .map(|r| resolve(r, &user_default, defaults))
        .collect();
    pg::insert_ratings(tx, &batch.rows, &resolved, now).await
}

/// Creates missing users (and revives deleted ones) with the default budgets; returns
/// each user's default rating eps.
async fn upsert_users(
    tx: &mut Tx,
    users: &[&str],
    defaults: Defaults,
    zero: &str,
    now: i64,
) -> Result<BTreeMap<String, Option<f64>>, StoreError> {
    for chunk in users.chunks(UPSERT_CHUNK) {
        let sql = format!(
            "INSERT INTO users (id, default_eps, budget_eps, budget_delta, rdp_consumed, \
             deleted, created_at, updated_at) VALUES {} \
             ON CONFLICT (id) DO UPDATE SET deleted = 0",
            placeholders(chunk.len(), 5, |b| {
                format!(
                    "(${}, NULL, ${}, ${}, ${}, 0, ${}, ${})",
                    b,
                    b + 1,
                    b + 2,
                    b + 3,
                    b + 4,
                    b + 4
                )
            })
        );
        let mut q = sqlx::query(&sql);
        for u in chunk {
            q = q
                .bind(*u)
                .bind(defaults.user_eps)
                .bind(defaults.user_delta)
                .bind(zero)
                .bind(now);
        }
        q.execute(&mut **tx).await?;
    }
    let mut user_default: BTreeMap<String, Option<f64>> = BTreeMap::new();
    for chunk in users.chunks(UPSERT_CHUNK) {
        let sql = format!(
            "SELECT id, default_eps FROM users WHERE id IN ({})",
            placeholders(chunk.len(), 1, |b| format!("${b}"))
        );
        let mut q = sqlx::query(&sql);
        for u in chunk {
            q = q.bind(*u);
        }
        for row in q.fetch_all(&mut **tx).await? {
            user_default.insert(row.try_get(0)?, row.try_get(1)?);
        }
    }
    Ok(user_default)
}
