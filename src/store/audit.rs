//! What the audit endpoints read: a user's rating slots and the releases that charged them.

use sqlx::Row;

use std::collections::BTreeMap;

use super::pending::{Pending, Spend, PENDING_SELECT};
use super::{id_runs, ReleaseRow, Store, StoreError};

/// A rating's budget slot for the audit.
#[derive(Debug, Clone)]
pub struct RatingAuditRow {
    pub item: String,
    pub eps: f64,
    pub spent: f64,
    pub releases: i64,
    pub deleted: bool,
    /// `raw` or `ldp`.
    pub origin: String,
}

/// What one release charged one user.
#[derive(Debug, Clone)]
pub struct UserReleaseCharge {
    pub release: ReleaseRow,
    pub events: serde_json::Value,
    pub admitted_order: f64,
    pub ratings_charged: i64,
    pub rating_eps_total: f64,
}

/// What one rating-level release charged a user's ratings (the audit's group-privacy
/// bound adds these up).
#[derive(Debug, Clone)]
pub struct RatingLevelCharge {
    pub release: ReleaseRow,
    pub ratings_charged: i64,
    /// Sum of the pure eps (training and DP popularity) charged to the user's ratings.
    pub eps: f64,
    /// Sum of Gaussian `rho` charged to them (0: a rating-level release charges pure eps
    /// only, `release::steps::collect_charges`).
    pub rho: f64,
}

impl Store {
    // ----- audit ------------------------------------------------------------------

    /// A user's rating budget slots, paginated by item id.
    pub async fn audit_ratings(
        &self,
        user: &str,
        limit: i64,
        offset: i64,
    ) -> Result<(i64, Vec<RatingAuditRow>), StoreError> {
        let total = self.count_of_user("ratings", user).await?;
        let rows = self
            .page_of_user(
                "SELECT item_id, eps, spent, releases, CASE WHEN value IS NULL THEN 1 ELSE 0 \
                 END, origin, rho, id FROM ratings WHERE user_id = $1 ORDER BY item_id \
                 LIMIT $2 OFFSET $3",
                user,
                limit,
                offset,
            )
            .await?;
        let pending = self.pending_of(user).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let deleted: i64 = r.try_get(4)?;
            let row = Spend {
                spent: r.try_get(2)?,
                rho: r.try_get(6)?,
                releases: r.try_get(3)?,
            };
            let s = row.with(r.try_get(7)?, pending.of(user));
            out.push(RatingAuditRow {
                item: r.try_get(0)?,
                eps: r.try_get(1)?,
                // The rating's loss bound: pure spend plus the converted Gaussian part.
                spent: dprec_dp::ledger::rating_loss(s.spent, s.rho),
                releases: s.releases,
                deleted: deleted != 0,
                origin: r.try_get(5)?,
            });
        }
        Ok((total, out))
    }

    /// `user`'s charge sets not yet written into the rating rows (`store::pending`).
    pub(crate) async fn pending_of(&self, user: &str) -> Result<Pending, StoreError> {
        let sql = format!("{PENDING_SELECT} AND s.user_id = $1 ORDER BY s.user_id, s.release_id");
        Pending::from_rows(&sqlx::query(&sql).bind(user).fetch_all(&self.pool).await?)
    }

    /// Every user's charge sets not yet written into the rating rows.
    pub(crate) async fn pending_of_all(&self) -> Result<Pending, StoreError> {
        let sql = format!("{PENDING_SELECT} ORDER BY s.user_id, s.release_id");
        Pending::from_rows(&sqlx::query(&sql).fetch_all(&self.pool).await?)
    }

    /// Every rating's id, eps_ij and ledger state with the pending charge sets folded
    /// in, by id: what the ledger holds, whatever has been settled (the invariant tests
    /// read it).
    pub async fn rating_spends(&self) -> Result<Vec<(i64, f64, Spend)>, StoreError> {
        let pending = self.pending_of_all().await?;
        let rows =
            sqlx::query("SELECT id, user_id, eps, spent, rho, releases FROM ratings ORDER BY id")
                .fetch_all(&self.pool)
                .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let id: i64 = r.try_get(0)?;
            let user: String = r.try_get(1)?;
            let row = Spend::from_row(&r, 3)?;
            out.push((id, r.try_get(2)?, row.with(id, pending.of(&user))));
        }
        Ok(out)
    }

    /// The releases that charged the user, newest first.
    pub async fn audit_releases(
        &self,
        user: &str,
        limit: i64,
        offset: i64,
    ) -> Result<(i64, Vec<UserReleaseCharge>), StoreError> {
        let total = self.count_of_user("user_charges", user).await?;
        let rows = self
            .page_of_user(
                "SELECT release_id, events, admitted_order FROM user_charges \
                 WHERE user_id = $1 ORDER BY release_id DESC LIMIT $2 OFFSET $3",
                user,
                limit,
                offset,
            )
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let id: i64 = r.try_get(0)?;
            let events: String = r.try_get(1)?;
            let release = self
                .release(id)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("charge of missing release {id}")))?;
            // Charge sets (migration 0012) and, for releases stored before them, one row
            // per rating.
            let agg = sqlx::query(
                "SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT), COALESCE(SUM(n * eps), 0.0) \
                 FROM rating_charge_sets \
                 WHERE release_id = $1 AND user_id = $2 \
                 UNION ALL SELECT CAST(COUNT(*) AS BIGINT), COALESCE(SUM(eps), 0.0) FROM rating_charges \
                 WHERE release_id = $1 AND user_id = $2",
            )
            .bind(id)
            .bind(user)
            .fetch_all(&self.pool)
            .await?;
            let (mut ratings_charged, mut rating_eps_total) = (0i64, 0.0f64);
            for a in &agg {
                ratings_charged += a.try_get::<i64, _>(0)?;
                rating_eps_total += a.try_get::<f64, _>(1)?;
            }
            out.push(UserReleaseCharge {
                release,
                events: serde_json::from_str(&events)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                admitted_order: r.try_get(2)?,
                ratings_charged,
                rating_eps_total,
            });
        }
        Ok((total, out))
    }

    /// Every rating-level release that charged the user's ratings, newest first, with what
    /// it charged them (deleted ratings included: the ledger keeps their history).
    pub async fn rating_level_charges(
        &self,
        user: &str,
    ) -> Result<Vec<RatingLevelCharge>, StoreError> {
        // Charge sets (one row per user and charge, `n` ratings) and per-rating rows from
        // before migration 0012, summed per release.
        let rows = sqlx::query(
            "SELECT release_id, CAST(SUM(n) AS BIGINT), COALESCE(SUM(eps), 0.0), \
             COALESCE(SUM(rho), 0.0) FROM (\
             SELECT c.release_id, c.n, c.n * (c.eps_train + c.eps_popularity) AS eps, \
             c.n * c.rho AS rho FROM rating_charge_sets c \
             JOIN releases r ON r.id = c.release_id \
             WHERE c.user_id = $1 AND r.guarantee = $2 \
             UNION ALL SELECT c.release_id, 1, c.eps_train + c.eps_popularity, c.rho \
             FROM rating_charges c JOIN releases r ON r.id = c.release_id \
             WHERE c.user_id = $1 AND r.guarantee = $2) AS charged \
             GROUP BY release_id ORDER BY release_id DESC",
        )
        .bind(user)
        .bind(dprec_dp::charges::Guarantee::RatingLevel.as_str())
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let id: i64 = r.try_get(0)?;
            let release = self
                .release(id)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("charge of missing release {id}")))?;
            out.push(RatingLevelCharge {
                release,
                ratings_charged: r.try_get(1)?,
                eps: r.try_get(2)?,
                rho: r.try_get(3)?,
            });
        }
        Ok(out)
    }

    /// The number of rows of `table` (a constant name) that belong to `user`.
    async fn count_of_user(&self, table: &'static str, user: &str) -> Result<i64, StoreError> {
        Ok(
            sqlx::query(&format!("SELECT COUNT(*) FROM {table} WHERE user_id = $1"))
                .bind(user)
                .fetch_one(&self.pool)
                .await?
                .try_get(0)?,
        )
    }

    /// One page of `sql`, whose binds are the user ($1), the limit ($2) and the offset ($3).
    async fn page_of_user(
        &self,
        sql: &'static str,
        user: &str,
        limit: i64,
        offset: i64,
    ) -> Result<Vec<sqlx::any::AnyRow>, StoreError> {
        Ok(sqlx::query(sql)
            .bind(user)
            .bind(limit)
            .bind(offset)
            .fetch_all(&self.pool)
            .await?)
    }
}

impl Store {
    /// The eps every release added to each rating's loss bound, summed per rating id:
    /// the ledger's history, which must equal each rating's stored `spent` when no charge
    /// had a Gaussian part (the invariant tests check it). Reads charge sets (expanded
    /// from their id runs) and per-rating rows from before migration 0012.
    pub async fn charged_per_rating(&self) -> Result<BTreeMap<i64, f64>, StoreError> {
        let mut out: BTreeMap<i64, f64> = BTreeMap::new();
        for r in sqlx::query("SELECT rating_id, eps FROM rating_charges")
            .fetch_all(&self.pool)
            .await?
        {
            *out.entry(r.try_get(0)?).or_default() += r.try_get::<f64, _>(1)?;
        }
        for r in sqlx::query("SELECT rating_ids, eps, n FROM rating_charge_sets")
            .fetch_all(&self.pool)
            .await?
        {
            let text: String = r.try_get(0)?;
            let eps: f64 = r.try_get(1)?;
            let n: i64 = r.try_get(2)?;
            let runs = id_runs::decode(&text)
                .ok_or_else(|| StoreError::Corrupt(format!("charge set ids {text:?}")))?;
            if id_runs::count(&runs) != n {
                return Err(StoreError::Corrupt(format!(
                    "charge set lists {} ids, n = {n}",
                    id_runs::count(&runs)
                )));
            }
            for id in id_runs::ids(&runs) {
                *out.entry(id).or_default() += eps;
            }
        }
        Ok(out)
    }
}
