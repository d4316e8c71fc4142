//! The one transaction that publishes a release (DESIGN 4).
//!
//! Inside a transaction that holds the commit lock ([`Store::begin_exclusive`]): insert
//! the release row; for every charged rating, lock its row (`FOR UPDATE` on PostgreSQL),
//! re-check `spent + charge <= eps_ij` with the stored values and write the new spend and
//! the charge; for every charged user, lock the row, re-check the Renyi filter admission
//! with the stored consumed curve and write the new curve and the charge; store the model.
//! Any failed check aborts the transaction: nothing is charged and the model is dropped.

use std::collections::BTreeMap;

use sqlx::Row;

use super::fits;
use crate::accountant::{PrivacyEvent, RenyiFilter};
use crate::store::{curve_json, now_ms, parse_curve, Store, StoreError};

/// One rating's charge in a release.
#[derive(Debug, Clone, PartialEq)]
pub struct RatingChargeRow {
    pub rating_id: i64,
    pub user: String,
    pub item: String,
    pub eps_train: f64,
    pub eps_popularity: f64,
}

impl RatingChargeRow {
    pub fn total(&self) -> f64 {
        self.eps_train + self.eps_popularity
    }
}

/// Everything a release writes.
#[derive(Debug, Clone)]
pub struct ReleaseRecord {
    pub trainer: String,
    pub params: serde_json::Value,
    /// `proven` or `non-private`.
    pub guarantee: String,
    pub mechanisms: serde_json::Value,
    pub popularity_eps: f64,
    pub n_ratings: i64,
    pub n_users: i64,
    pub n_items: i64,
    pub job_id: Option<i64>,
    pub rating_unit: String,
    pub rating_neighbour: String,
    pub rating_charges: Vec<RatingChargeRow>,
    /// All RDP events charged to each user (trainer events and the pure-DP charges of
    /// the user's ratings).
    pub user_charges: BTreeMap<String, Vec<PrivacyEvent>>,
    pub model_json: String,
    pub users_json: String,
    pub items_json: String,
    pub popularity_json: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error(
        "rating {rating_id}: spent {spent} + charge {charge} would exceed eps_ij {eps}; release aborted"
    )]
    RatingOverspend {
        rating_id: i64,
        eps: f64,
        spent: f64,
        charge: f64,
    },
    #[error("rating {0} no longer exists; release aborted")]
    RatingMissing(i64),
    #[error("user {0:?}: the Renyi filter does not admit this release's charge; release aborted")]
    UserRejected(String),
    #[error("user {0:?} no longer exists; release aborted")]
    UserMissing(String),
    #[error("accounting error for user {0:?}: {1}")]
    Accounting(String, String),
    #[error("injected failure: {0}")]
    Injected(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CommitError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Db(e))
    }
}

/// A test hook called inside the transaction after the charges are written and before
/// COMMIT; an error aborts the transaction as a crash there would.
pub type InsideTxHook = dyn Fn() -> Result<(), String> + Send + Sync;

/// Ratings per statement (9 binds each for the charge rows: within both backends' limits).
const CHUNK: usize = 400;

/// Records `rec` atomically; returns the release id.
pub async fn commit(
    store: &Store,
    rec: &ReleaseRecord,
    inside_tx: Option<&InsideTxHook>,
) -> Result<i64, CommitError> {
    let now = now_ms();
    let mut tx = store.begin_exclusive().await?;
    let release_id: i64 = sqlx::query(
        "INSERT INTO releases (trainer, params, guarantee, mechanisms, popularity_eps, \
         n_ratings, n_users, n_items, job_id, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id",
    )
    .bind(&rec.trainer)
    .bind(rec.params.to_string())
    .bind(&rec.guarantee)
    .bind(rec.mechanisms.to_string())
    .bind(rec.popularity_eps)
    .bind(rec.n_ratings)
    .bind(rec.n_users)
    .bind(rec.n_items)
    .bind(rec.job_id)
    .bind(now)
    .fetch_one(&mut *tx)
    .await?
    .try_get(0)?;

    // Per-rating eps_ij ledger: lock, re-check, spend, record.
    for chunk in rec.rating_charges.chunks(CHUNK) {
        let placeholders: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT id, eps, spent FROM ratings WHERE id IN ({}){}",
            placeholders.join(", "),
            store.for_update()
        );
        let mut q = sqlx::query(&sql);
        for c in chunk {
            q = q.bind(c.rating_id);
        }
        let mut stored: BTreeMap<i64, (f64, f64)> = BTreeMap::new();
        for r in q.fetch_all(&mut *tx).await? {
            stored.insert(r.try_get(0)?, (r.try_get(1)?, r.try_get(2)?));
        }
        // Re-check every charge of the chunk against the stored state first.
        let mut next = Vec::with_capacity(chunk.len());
        for c in chunk {
            let &(eps, spent) = stored
                .get(&c.rating_id)
                .ok_or(CommitError::RatingMissing(c.rating_id))?;
            let charge = c.total();
            if !fits(eps, spent, charge) {
                return Err(CommitError::RatingOverspend {
                    rating_id: c.rating_id,
                    eps,
                    spent,
                    charge,
                });
            }
            next.push((c.rating_id, spent + charge));
        }
        // One UPDATE (CASE over the ids) and one multi-row INSERT per chunk.
        let mut sql = String::from("UPDATE ratings SET spent = CASE id");
        for k in 0..next.len() {
            sql.push_str(&format!(" WHEN ${} THEN ${}", 2 * k + 1, 2 * k + 2));
        }
        sql.push_str(" ELSE spent END, releases = releases + 1 WHERE id IN (");
        let ids: Vec<String> = (0..next.len()).map(|k| format!("${}", 2 * k + 1)).collect();
        sql.push_str(&ids.join(", "));
        sql.push(')');
        let mut q = sqlx::query(&sql);
        for (id, spent) in &next {
            q = q.bind(*id).bind(*spent);
        }
        let updated = q.execute(&mut *tx).await?.rows_affected();
        if updated != next.len() as u64 {
            return Err(CommitError::Store(StoreError::Corrupt(format!(
                "updated {updated} of {} ratings",
                next.len()
            ))));
        }
        let mut sql = String::from(
            "INSERT INTO rating_charges (release_id, rating_id, user_id, item_id, eps_train, \
             eps_popularity, eps, unit, neighbour) VALUES ",
        );
        let rows: Vec<String> = (0..chunk.len())
            .map(|k| {
                let b = 9 * k;
                format!(
                    "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${}, ${})",
                    b + 1,
                    b + 2,
                    b + 3,
                    b + 4,
                    b + 5,
                    b + 6,
                    b + 7,
                    b + 8,
                    b + 9
                )
            })
            .collect();
        sql.push_str(&rows.join(", "));
        let mut q = sqlx::query(&sql);
        for c in chunk {
            q = q
                .bind(release_id)
                .bind(c.rating_id)
                .bind(&c.user)
                .bind(&c.item)
                .bind(c.eps_train)
                .bind(c.eps_popularity)
                .bind(c.total())
                .bind(&rec.rating_unit)
                .bind(&rec.rating_neighbour);
        }
        q.execute(&mut *tx).await?;
    }

    // Per-user RDP ledger: lock, re-check the filter, compose, record.
    for (user, events) in &rec.user_charges {
        let row = sqlx::query(&format!(
            "SELECT budget_eps, budget_delta, rdp_consumed FROM users WHERE id = $1{}",
            store.for_update()
        ))
        .bind(user)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| CommitError::UserMissing(user.clone()))?;
        let (eps, delta): (f64, f64) = (row.try_get(0)?, row.try_get(1)?);
        let consumed = parse_curve(&row.try_get::<String, _>(2)?)?;
        let acc = |e: String| CommitError::Accounting(user.clone(), e);
        let filter =
            RenyiFilter::with_default_orders(eps, delta).map_err(|e| acc(e.to_string()))?;
        let cost = super::user_cost(events).map_err(acc)?;
        let order = filter
            .admitting_order(&consumed, &cost)
            .map_err(|e| acc(e.to_string()))?
            .ok_or_else(|| CommitError::UserRejected(user.clone()))?;
        let next = consumed.compose(&cost).map_err(|e| acc(e.to_string()))?;
        sqlx::query("UPDATE users SET rdp_consumed = $2 WHERE id = $1")
            .bind(user)
            .bind(curve_json(&next))
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO user_charges (release_id, user_id, events, unit, neighbour, \
             admitted_order) VALUES ($1, $2, $3, 'user', 'add-remove', $4)",
        )
        .bind(release_id)
        .bind(user)
        .bind(serde_json::to_string(events).expect("events serialise"))
        .bind(order)
        .execute(&mut *tx)
        .await?;
    }

    sqlx::query(
        "INSERT INTO models (release_id, model, users, items, popularity) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(release_id)
    .bind(&rec.model_json)
    .bind(&rec.users_json)
    .bind(&rec.items_json)
    .bind(&rec.popularity_json)
    .execute(&mut *tx)
    .await?;

    if let Some(hook) = inside_tx {
        hook().map_err(CommitError::Injected)?;
    }
    tx.commit().await?;
    Ok(release_id)
}
