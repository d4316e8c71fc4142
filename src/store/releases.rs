//! Releases, their models, and the one transaction that records a release with its
//! ledger charges (DESIGN 4).

use std::collections::BTreeMap;

use sqlx::Row;

use super::{curve_json, now_ms, parse_curve, Store, StoreError, Tx};
use crate::accountant::{AccountantError, PrivacyEvent, RenyiFilter};
use crate::ledger::{fits_with_rho, rating_loss, user_cost};
use crate::train::charges::{Guarantee, Neighbour, PrivacyUnit, UnknownName};

const RELEASE_COLS: &str = "id, trainer, params, guarantee, mechanisms, popularity_eps, \
     n_ratings, n_users, n_items, job_id, created_at";

#[derive(Debug, Clone)]
pub struct ReleaseRow {
    pub id: i64,
    pub trainer: String,
    pub params: serde_json::Value,
    pub guarantee: Guarantee,
    pub mechanisms: serde_json::Value,
    pub popularity_eps: f64,
    pub n_ratings: i64,
    pub n_users: i64,
    pub n_items: i64,
    pub job_id: Option<i64>,
    pub created_at: i64,
}

/// A stored model with what it needs to be served.
#[derive(Debug, Clone)]
pub struct ModelRow {
    pub release: ReleaseRow,
    pub model: String,
    pub users: String,
    pub items: String,
    pub popularity: String,
}

pub(crate) fn release_from_row(r: &sqlx::any::AnyRow) -> Result<ReleaseRow, StoreError> {
    let json = |s: String| {
        serde_json::from_str(&s).map_err(|e| StoreError::Corrupt(format!("release json: {e}")))
    };
    Ok(ReleaseRow {
        id: r.try_get("id")?,
        trainer: r.try_get("trainer")?,
        params: json(r.try_get("params")?)?,
        guarantee: r
            .try_get::<String, _>("guarantee")?
            .parse()
            .map_err(|e: UnknownName| StoreError::Corrupt(e.to_string()))?,
        mechanisms: json(r.try_get("mechanisms")?)?,
        popularity_eps: r.try_get("popularity_eps")?,
        n_ratings: r.try_get("n_ratings")?,
        n_users: r.try_get("n_users")?,
        n_items: r.try_get("n_items")?,
        job_id: r.try_get("job_id")?,
        created_at: r.try_get("created_at")?,
    })
}

impl Store {
    // ----- releases and models --------------------------------------------------

    pub async fn releases(&self, limit: i64, offset: i64) -> Result<Vec<ReleaseRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {RELEASE_COLS} FROM releases ORDER BY id DESC LIMIT $1 OFFSET $2"
        ))
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(release_from_row).collect()
    }

    pub async fn release(&self, id: i64) -> Result<Option<ReleaseRow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {RELEASE_COLS} FROM releases WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(release_from_row).transpose()
    }

    /// Id of the newest stored model, if any.
    pub async fn latest_model_id(&self) -> Result<Option<i64>, StoreError> {
        let r = sqlx::query("SELECT MAX(release_id) FROM models")
            .fetch_one(&self.pool)
            .await?;
        Ok(r.try_get(0)?)
    }

    /// The newest release that has a model.
    pub async fn latest_model(&self) -> Result<Option<ModelRow>, StoreError> {
        let row = sqlx::query(
            "SELECT release_id, model, users, items, popularity FROM models \
             ORDER BY release_id DESC LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        let Some(r) = row else { return Ok(None) };
        let id: i64 = r.try_get(0)?;
        let release = self
            .release(id)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("model {id} without release")))?;
        Ok(Some(ModelRow {
            release,
            model: r.try_get(1)?,
            users: r.try_get(2)?,
            items: r.try_get(3)?,
            popularity: r.try_get(4)?,
        }))
    }
}

// The one transaction that publishes a release (DESIGN 4).
//
// Inside a transaction that holds the commit lock ([`Store::begin_exclusive`]): insert
// the release row; for every charged rating, lock its row (`FOR UPDATE` on PostgreSQL),
// re-check `spent + charge <= eps_ij` with the stored values and write the new spend and
// the charge; for every charged user, lock the row, re-check the Renyi filter admission
// with the stored consumed curve and write the new curve and the charge; store the model.
// Any failed check aborts the transaction: nothing is charged and the model is dropped.

/// One rating's charge in a release.
#[derive(Debug, Clone, PartialEq)]
pub struct RatingChargeRow {
    pub rating_id: i64,
    pub user: String,
    pub item: String,
    /// Pure eps the trainer charged.
    pub eps_train: f64,
    pub eps_popularity: f64,
    /// Gaussian part the trainer charged (zCDP `rho`, [`crate::ledger::rating_loss`]).
    pub rho: f64,
}

impl RatingChargeRow {
    /// The pure eps of the charge (the Gaussian part is `rho`).
    pub fn total(&self) -> f64 {
        self.eps_train + self.eps_popularity
    }
}

/// Everything a release writes.
#[derive(Debug, Clone)]
pub struct ReleaseRecord {
    pub trainer: String,
    pub params: serde_json::Value,
    /// Proven or non-private (the release refuses anything else).
    pub guarantee: Guarantee,
    pub mechanisms: serde_json::Value,
    pub popularity_eps: f64,
    pub n_ratings: i64,
    pub n_users: i64,
    pub n_items: i64,
    pub job_id: Option<i64>,
    pub rating_unit: PrivacyUnit,
    pub rating_neighbour: Neighbour,
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
    Accounting(String, #[source] AccountantError),
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

/// Ratings per statement (10 binds each for the charge rows: within both backends' limits).
const CHUNK: usize = 400;

/// Records `rec` atomically; returns the release id.
pub async fn commit_release(
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
    .bind(rec.guarantee.as_str())
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
        charge_ratings(store, &mut tx, release_id, rec, chunk).await?;
    }
    // Per-user RDP ledger: lock, re-check the filter, compose, record.
    for (user, events) in &rec.user_charges {
        charge_user(store, &mut tx, release_id, user, events).await?;
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

/// One chunk of rating charges inside the release transaction: lock the rows, re-check
/// every charge against the stored spend, then one UPDATE and one multi-row INSERT.
async fn charge_ratings(
    store: &Store,
    tx: &mut Tx,
    release_id: i64,
    rec: &ReleaseRecord,
    chunk: &[RatingChargeRow],
) -> Result<(), CommitError> {
    let placeholders: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
    let sql = format!(
        "SELECT id, eps, spent, rho FROM ratings WHERE id IN ({}){}",
        placeholders.join(", "),
        store.for_update()
    );
    let mut q = sqlx::query(&sql);
    for c in chunk {
        q = q.bind(c.rating_id);
    }
    let mut stored: BTreeMap<i64, (f64, f64, f64)> = BTreeMap::new();
    for r in q.fetch_all(&mut **tx).await? {
        stored.insert(r.try_get(0)?, (r.try_get(1)?, r.try_get(2)?, r.try_get(3)?));
    }
    // Re-check every charge of the chunk against the stored state first (the rating's
    // loss bound, pure spend plus converted Gaussian part, must stay within eps_ij).
    let mut next = Vec::with_capacity(chunk.len());
    let mut increments = Vec::with_capacity(chunk.len());
    for c in chunk {
        let &(eps, spent, rho) = stored
            .get(&c.rating_id)
            .ok_or(CommitError::RatingMissing(c.rating_id))?;
        let charge = c.total();
        if !fits_with_rho(eps, spent, rho, charge, c.rho) {
            return Err(CommitError::RatingOverspend {
                rating_id: c.rating_id,
                eps,
                spent: rating_loss(spent, rho),
                charge: rating_loss(spent + charge, rho + c.rho) - rating_loss(spent, rho),
            });
        }
        // What the release added to the rating's loss bound (exactly the pure charge
        // when it has no Gaussian part).
        increments.push(if c.rho == 0.0 {
            charge
        } else {
            rating_loss(spent + charge, rho + c.rho) - rating_loss(spent, rho)
        });
        next.push((c.rating_id, spent + charge, rho + c.rho));
    }
    // One UPDATE (CASE over the ids) and one multi-row INSERT per chunk.
    let mut sql = String::from("UPDATE ratings SET spent = CASE id");
    for k in 0..next.len() {
        sql.push_str(&format!(" WHEN ${} THEN ${}", 3 * k + 1, 3 * k + 2));
    }
    sql.push_str(" ELSE spent END, rho = CASE id");
    for k in 0..next.len() {
        sql.push_str(&format!(" WHEN ${} THEN ${}", 3 * k + 1, 3 * k + 3));
    }
    sql.push_str(" ELSE rho END, releases = releases + 1 WHERE id IN (");
    let ids: Vec<String> = (0..next.len()).map(|k| format!("${}", 3 * k + 1)).collect();
    sql.push_str(&ids.join(", "));
    sql.push(')');
    let mut q = sqlx::query(&sql);
    for (id, spent, rho) in &next {
        q = q.bind(*id).bind(*spent).bind(*rho);
    }
    let updated = q.execute(&mut **tx).await?.rows_affected();
    if updated != next.len() as u64 {
        return Err(CommitError::Store(StoreError::Corrupt(format!(
            "updated {updated} of {} ratings",
            next.len()
        ))));
    }
    let mut sql = String::from(
        "INSERT INTO rating_charges (release_id, rating_id, user_id, item_id, eps_train, \
         eps_popularity, eps, unit, neighbour, rho) VALUES ",
    );
    let rows: Vec<String> = (0..chunk.len())
        .map(|k| {
            let b = 10 * k;
            format!(
                "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${}, ${}, ${})",
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5,
                b + 6,
                b + 7,
                b + 8,
                b + 9,
                b + 10
            )
        })
        .collect();
    sql.push_str(&rows.join(", "));
    let mut q = sqlx::query(&sql);
    for (c, increment) in chunk.iter().zip(&increments) {
        q = q
            .bind(release_id)
            .bind(c.rating_id)
            .bind(&c.user)
            .bind(&c.item)
            .bind(c.eps_train)
            .bind(c.eps_popularity)
            .bind(*increment)
            .bind(rec.rating_unit.as_str())
            .bind(rec.rating_neighbour.as_str())
            .bind(c.rho);
    }
    q.execute(&mut **tx).await?;
    Ok(())
}

/// One user's charge inside the release transaction: lock the row, re-check the Renyi
/// filter with the stored consumed curve, store the composed curve and the charge.
async fn charge_user(
    store: &Store,
    tx: &mut Tx,
    release_id: i64,
    user: &str,
    events: &[PrivacyEvent],
) -> Result<(), CommitError> {
    let row = sqlx::query(&format!(
        "SELECT budget_eps, budget_delta, rdp_consumed FROM users WHERE id = $1{}",
        store.for_update()
    ))
    .bind(user)
    .fetch_optional(&mut **tx)
    .await?
    .ok_or_else(|| CommitError::UserMissing(user.to_owned()))?;
    let (eps, delta): (f64, f64) = (row.try_get(0)?, row.try_get(1)?);
    let consumed = parse_curve(&row.try_get::<String, _>(2)?)?;
    let acc = |e: AccountantError| CommitError::Accounting(user.to_owned(), e);
    let filter = RenyiFilter::with_default_orders(eps, delta).map_err(acc)?;
    let cost = user_cost(events).map_err(acc)?;
    let order = filter
        .admitting_order(&consumed, &cost)
        .map_err(acc)?
        .ok_or_else(|| CommitError::UserRejected(user.to_owned()))?;
    let next = consumed.compose(&cost).map_err(acc)?;
    sqlx::query("UPDATE users SET rdp_consumed = $2 WHERE id = $1")
        .bind(user)
        .bind(curve_json(&next))
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "INSERT INTO user_charges (release_id, user_id, events, unit, neighbour, \
         admitted_order) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(release_id)
    .bind(user)
    .bind(serde_json::to_string(events).expect("events serialise"))
    .bind(PrivacyUnit::User.as_str())
    .bind(Neighbour::AddRemove.as_str())
    .bind(order)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
