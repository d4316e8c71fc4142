//! Persistent state on SQLite (embedded default) or PostgreSQL, through sqlx's `Any`
//! driver so both backends run the same queries (`$N` placeholders work on both).
//!
//! Dialect differences are confined to the migrations (`migrations/{sqlite,postgres}`)
//! and to the locking of [`Store::begin_exclusive`].

mod migrations;
pub mod private_gd;

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Once;
use std::time::Duration;

use anyhow::Context;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, Row};

use crate::accountant::RdpCurve;
use crate::ledger::{RatingBudget, UserBudget};

pub type Tx = sqlx::Transaction<'static, sqlx::Any>;

/// The database engine behind a [`Store`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn from_url(url: &str) -> anyhow::Result<Self> {
        if url.starts_with("sqlite:") {
            Ok(Self::Sqlite)
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Ok(Self::Postgres)
        } else {
            anyhow::bail!("database.url must start with sqlite: or postgres:, got {url:?}")
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A validated rating to ingest (ids and values are checked at the API edge).
#[derive(Debug, Clone)]
pub struct NewRating {
    pub user: String,
    pub item: String,
    pub value: f64,
    /// `None`: the user's default, else the service default.
    pub eps: Option<f64>,
}

/// Budget defaults applied to new users and ratings.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub rating_eps: f64,
    pub user_eps: f64,
    pub user_delta: f64,
}

/// One rating row as the trainer snapshot reads it.
#[derive(Debug, Clone)]
pub struct RatingRow {
    pub id: i64,
    pub user: String,
    pub item: String,
    pub value: f64,
    pub eps: f64,
    pub spent: f64,
}

/// Everything a release plans from.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub ratings: Vec<RatingRow>,
    pub users: BTreeMap<String, UserBudget>,
    /// The item catalogue (public metadata), sorted.
    pub items: Vec<String>,
}

impl Snapshot {
    pub fn budgets(&self) -> Vec<RatingBudget> {
        self.ratings
            .iter()
            .map(|r| RatingBudget {
                id: r.id,
                user: r.user.clone(),
                eps: r.eps,
                spent: r.spent,
            })
            .collect()
    }
}

/// A user's privacy settings and ledger state.
#[derive(Debug, Clone)]
pub struct UserRow {
    pub id: String,
    pub default_eps: Option<f64>,
    pub budget_eps: f64,
    pub budget_delta: f64,
    pub consumed: RdpCurve,
    pub deleted: bool,
}

/// A rating's budget slot for the audit.
#[derive(Debug, Clone)]
pub struct RatingAuditRow {
    pub item: String,
    pub eps: f64,
    pub spent: f64,
    pub releases: i64,
    pub deleted: bool,
}

#[derive(Debug, Clone)]
pub struct ReleaseRow {
    pub id: i64,
    pub trainer: String,
    pub params: serde_json::Value,
    pub guarantee: String,
    pub mechanisms: serde_json::Value,
    pub popularity_eps: f64,
    pub n_ratings: i64,
    pub n_users: i64,
    pub n_items: i64,
    pub job_id: Option<i64>,
    pub created_at: i64,
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

#[derive(Debug, Clone)]
pub struct JobRow {
    pub id: i64,
    pub kind: String,
    pub status: String,
    pub reason: Option<String>,
    pub release_id: Option<i64>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
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

/// Errors of the store that the API maps to statuses.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error("{0}")]
    Corrupt(String),
}

#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
}

const RELEASE_COLS: &str = "id, trainer, params, guarantee, mechanisms, popularity_eps, \
     n_ratings, n_users, n_items, job_id, created_at";

fn release_from_row(r: &sqlx::any::AnyRow) -> Result<ReleaseRow, StoreError> {
    let json = |s: String| {
        serde_json::from_str(&s).map_err(|e| StoreError::Corrupt(format!("release json: {e}")))
    };
    Ok(ReleaseRow {
        id: r.try_get("id")?,
        trainer: r.try_get("trainer")?,
        params: json(r.try_get("params")?)?,
        guarantee: r.try_get("guarantee")?,
        mechanisms: json(r.try_get("mechanisms")?)?,
        popularity_eps: r.try_get("popularity_eps")?,
        n_ratings: r.try_get("n_ratings")?,
        n_users: r.try_get("n_users")?,
        n_items: r.try_get("n_items")?,
        job_id: r.try_get("job_id")?,
        created_at: r.try_get("created_at")?,
    })
}

fn job_from_row(r: &sqlx::any::AnyRow) -> Result<JobRow, StoreError> {
    Ok(JobRow {
        id: r.try_get("id")?,
        kind: r.try_get("kind")?,
        status: r.try_get("status")?,
        reason: r.try_get("reason")?,
        release_id: r.try_get("release_id")?,
        created_at: r.try_get("created_at")?,
        finished_at: r.try_get("finished_at")?,
    })
}

pub(crate) fn parse_curve(s: &str) -> Result<RdpCurve, StoreError> {
    if s.is_empty() {
        return Ok(RdpCurve::zeros_default());
    }
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("stored RDP curve: {e}")))
}

pub(crate) fn curve_json(c: &RdpCurve) -> String {
    serde_json::to_string(c).expect("RDP curves serialise")
}

/// Rows per multi-row statement of [`Store::upsert_ratings`] (at most 5 binds per row).
const UPSERT_CHUNK: usize = 400;

/// `n` groups of placeholders, group `k` made by `group(first bind number)` with `per`
/// binds per group, joined by commas: e.g. `($1, $2), ($3, $4)`.
fn placeholders(n: usize, per: usize, group: impl Fn(usize) -> String) -> String {
    (0..n)
        .map(|k| group(1 + k * per))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Store {
    /// Connects (creating a SQLite file if missing, in WAL mode) and runs the migrations.
    pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        static DRIVERS: Once = Once::new();
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        let backend = Backend::from_url(url)?;
        let url = match backend {
            Backend::Sqlite if !url.contains('?') => format!("{url}?mode=rwc"),
            _ => url.to_string(),
        };
        use sqlx::ConnectOptions;
        // Statements waiting on SQLite's write lock under concurrent batches are "slow" by
        // sqlx's default 1 s threshold, and its warning prints the whole multi-row SQL:
        // log them at debug level only.
        let opts = AnyConnectOptions::from_str(&url)
            .context("invalid database.url")?
            .log_slow_statements(log::LevelFilter::Debug, Duration::from_secs(1));
        let mut pool = AnyPoolOptions::new()
            .max_connections(max_connections.max(2))
            .acquire_timeout(Duration::from_secs(10));
        if backend == Backend::Sqlite {
            pool = pool.after_connect(|conn, _| {
                Box::pin(async move {
                    use sqlx::Executor;
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    conn.execute("PRAGMA busy_timeout = 10000").await?;
                    conn.execute("PRAGMA synchronous = NORMAL").await?;
                    Ok(())
                })
            });
        }
        let pool = pool
            .connect_with(opts)
            .await
            .with_context(|| format!("connecting to the {} database", backend.name()))?;
        let store = Self { pool, backend };
        migrations::run(&store.pool, backend)
            .await
            .context("running database migrations")?;
        Ok(store)
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Readiness probe: the store answers a query.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// A transaction that holds the trainer's commit lock from its first statement:
    /// on PostgreSQL a transaction-scoped advisory lock (released at commit/rollback);
    /// on SQLite the database write lock (taken by a write as the first statement, the
    /// effect of BEGIN IMMEDIATE). Every ledger commit runs inside one, so commits are
    /// serialised and each re-check sees the state left by the previous commit.
    pub async fn begin_exclusive(&self) -> Result<Tx, StoreError> {
        let mut tx = self.pool.begin().await?;
        match self.backend {
            Backend::Postgres => {
                sqlx::query("SELECT pg_advisory_xact_lock(7215441307)")
                    .execute(&mut *tx)
                    .await?;
            }
            Backend::Sqlite => {
                sqlx::query(
                    "INSERT INTO leases (name, holder, expires_at) VALUES ('commit', '', 0) \
                     ON CONFLICT (name) DO UPDATE SET expires_at = leases.expires_at + 1",
                )
                .execute(&mut *tx)
                .await?;
            }
        }
        Ok(tx)
    }

    /// `FOR UPDATE` on PostgreSQL (row locks), nothing on SQLite (already exclusive).
    pub fn for_update(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => " FOR UPDATE",
            Backend::Sqlite => "",
        }
    }

    // ----- ingestion and settings -------------------------------------------------

    /// Upserts a batch in one transaction (all or nothing). A re-rating replaces the
    /// value and keeps the budget slot (eps_ij, spent, releases). Returns the number of
    /// new ratings.
    pub async fn upsert_ratings(
        &self,
        batch: &[NewRating],
        defaults: Defaults,
    ) -> Result<usize, StoreError> {
        let now = now_ms();
        // A pair rated twice in one batch: the last value wins, as if sent one by one
        // (a multi-row upsert may touch each row once).
        let mut last: BTreeMap<(&str, &str), &NewRating> = BTreeMap::new();
        for r in batch {
            last.insert((r.user.as_str(), r.item.as_str()), r);
        }
        let rows: Vec<&NewRating> = last.into_values().collect();
        let users: Vec<&str> = {
            let set: std::collections::BTreeSet<&str> =
                rows.iter().map(|r| r.user.as_str()).collect();
            set.into_iter().collect()
        };
        let items: Vec<&str> = {
            let set: std::collections::BTreeSet<&str> =
                rows.iter().map(|r| r.item.as_str()).collect();
            set.into_iter().collect()
        };
        // A new user's consumed curve is stored as '' (read back as the zero curve by
        // `parse_curve`) instead of 156 zeros of JSON per row.
        let zero = "";
        let mut tx = self.pool.begin().await?;
        // Multi-row statements, a few hundred rows each (well under both backends'
        // bind-parameter limits): one round trip per chunk instead of one per rating.
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
            q.execute(&mut *tx).await?;
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
            for row in q.fetch_all(&mut *tx).await? {
                user_default.insert(row.try_get(0)?, row.try_get(1)?);
            }
        }
        for chunk in items.chunks(UPSERT_CHUNK) {
            let sql = format!(
                "INSERT INTO items (id, created_at) VALUES {} ON CONFLICT (id) DO NOTHING",
                placeholders(chunk.len(), 2, |b| format!("(${}, ${})", b, b + 1))
            );
            let mut q = sqlx::query(&sql);
            for i in chunk {
                q = q.bind(*i).bind(now);
            }
            q.execute(&mut *tx).await?;
        }
        let mut created = 0;
        for chunk in rows.chunks(UPSERT_CHUNK) {
            let sql = format!(
                "INSERT INTO ratings (user_id, item_id, value, eps, spent, releases, origin, \
                 created_at, updated_at) VALUES {} \
                 ON CONFLICT (user_id, item_id) DO UPDATE SET value = excluded.value, \
                 updated_at = excluded.updated_at RETURNING created_at",
                placeholders(chunk.len(), 5, |b| {
                    format!(
                        "(${}, ${}, ${}, ${}, 0, 0, 'raw', ${}, ${})",
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
            for r in chunk {
                let eps = r
                    .eps
                    .or(user_default.get(r.user.as_str()).copied().flatten())
                    .unwrap_or(defaults.rating_eps);
                q = q
                    .bind(&r.user)
                    .bind(&r.item)
                    .bind(r.value)
                    .bind(eps)
                    .bind(now);
            }
            for row in q.fetch_all(&mut *tx).await? {
                let created_at: i64 = row.try_get(0)?;
                if created_at == now {
                    created += 1;
                }
            }
        }
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

    /// Creates or updates a user's settings; the consumed curve is never touched.
    pub async fn put_user_settings(
        &self,
        id: &str,
        default_eps: Option<f64>,
        budget_eps: f64,
        budget_delta: f64,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        sqlx::query(
            "INSERT INTO users (id, default_eps, budget_eps, budget_delta, rdp_consumed, deleted, \
             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, 0, $6, $6) \
             ON CONFLICT (id) DO UPDATE SET default_eps = excluded.default_eps, \
             budget_eps = excluded.budget_eps, budget_delta = excluded.budget_delta, \
             updated_at = excluded.updated_at",
        )
        .bind(id)
        .bind(default_eps)
        .bind(budget_eps)
        .bind(budget_delta)
        .bind(curve_json(&RdpCurve::zeros_default()))
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
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

    /// Items the user has a live rating for.
    pub async fn rated_items(&self, user: &str) -> Result<Vec<String>, StoreError> {
        let rows =
            sqlx::query("SELECT item_id FROM ratings WHERE user_id = $1 AND value IS NOT NULL")
                .bind(user)
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|r| r.try_get(0).map_err(StoreError::from))
            .collect()
    }

    pub async fn item_exists(&self, item: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query("SELECT 1 FROM items WHERE id = $1")
            .bind(item)
            .fetch_optional(&self.pool)
            .await?
            .is_some())
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
            rating_charges: n("SELECT COUNT(*) FROM rating_charges").await?,
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

    /// Live ratings of live users, their budgets, and the item catalogue.
    pub async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        let rows = sqlx::query(
            "SELECT r.id, r.user_id, r.item_id, r.value, r.eps, r.spent FROM ratings r \
             JOIN users u ON u.id = r.user_id \
             WHERE r.value IS NOT NULL AND u.deleted = 0 ORDER BY r.id",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut ratings = Vec::with_capacity(rows.len());
        for r in &rows {
            ratings.push(RatingRow {
                id: r.try_get(0)?,
                user: r.try_get(1)?,
                item: r.try_get(2)?,
                value: r.try_get(3)?,
                eps: r.try_get(4)?,
                spent: r.try_get(5)?,
            });
        }
        let mut users = BTreeMap::new();
        for r in sqlx::query(
            "SELECT id, budget_eps, budget_delta, rdp_consumed FROM users WHERE deleted = 0",
        )
        .fetch_all(&self.pool)
        .await?
        {
            let consumed: String = r.try_get(3)?;
            users.insert(
                r.try_get::<String, _>(0)?,
                UserBudget {
                    eps: r.try_get(1)?,
                    delta: r.try_get(2)?,
                    consumed: parse_curve(&consumed)?,
                },
            );
        }
        let items = sqlx::query("SELECT id FROM items ORDER BY id")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<Vec<String>, _>>()?;
        Ok(Snapshot {
            ratings,
            users,
            items,
        })
    }

    /// Ratings created or re-rated after `since_ms` (scheduler trigger).
    pub async fn ratings_updated_since(&self, since_ms: i64) -> Result<i64, StoreError> {
        let r =
            sqlx::query("SELECT COUNT(*) FROM ratings WHERE updated_at > $1 AND value IS NOT NULL")
                .bind(since_ms)
                .fetch_one(&self.pool)
                .await?;
        Ok(r.try_get(0)?)
    }

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

    // ----- audit ------------------------------------------------------------------

    /// A user's rating budget slots, paginated by item id.
    pub async fn audit_ratings(
        &self,
        user: &str,
        limit: i64,
        offset: i64,
    ) -> Result<(i64, Vec<RatingAuditRow>), StoreError> {
        let total: i64 = sqlx::query("SELECT COUNT(*) FROM ratings WHERE user_id = $1")
            .bind(user)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        let rows = sqlx::query(
            "SELECT item_id, eps, spent, releases, CASE WHEN value IS NULL THEN 1 ELSE 0 END \
             FROM ratings WHERE user_id = $1 ORDER BY item_id LIMIT $2 OFFSET $3",
        )
        .bind(user)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let deleted: i64 = r.try_get(4)?;
            out.push(RatingAuditRow {
                item: r.try_get(0)?,
                eps: r.try_get(1)?,
                spent: r.try_get(2)?,
                releases: r.try_get(3)?,
                deleted: deleted != 0,
            });
        }
        Ok((total, out))
    }

    /// The releases that charged the user, newest first.
    pub async fn audit_releases(
        &self,
        user: &str,
        limit: i64,
        offset: i64,
    ) -> Result<(i64, Vec<UserReleaseCharge>), StoreError> {
        let total: i64 = sqlx::query("SELECT COUNT(*) FROM user_charges WHERE user_id = $1")
            .bind(user)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        let rows = sqlx::query(
            "SELECT release_id, events, admitted_order FROM user_charges WHERE user_id = $1 \
             ORDER BY release_id DESC LIMIT $2 OFFSET $3",
        )
        .bind(user)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let id: i64 = r.try_get(0)?;
            let events: String = r.try_get(1)?;
            let release = self
                .release(id)
                .await?
                .ok_or_else(|| StoreError::Corrupt(format!("charge of missing release {id}")))?;
            let agg = sqlx::query(
                "SELECT COUNT(*), COALESCE(SUM(eps), 0.0) FROM rating_charges \
                 WHERE release_id = $1 AND user_id = $2",
            )
            .bind(id)
            .bind(user)
            .fetch_one(&self.pool)
            .await?;
            out.push(UserReleaseCharge {
                release,
                events: serde_json::from_str(&events)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                admitted_order: r.try_get(2)?,
                ratings_charged: agg.try_get(0)?,
                rating_eps_total: agg.try_get(1)?,
            });
        }
        Ok((total, out))
    }

    // ----- jobs, lease, keys -------------------------------------------------------

    pub async fn create_job(&self, kind: &str) -> Result<i64, StoreError> {
        let r = sqlx::query(
            "INSERT INTO jobs (kind, status, created_at) VALUES ($1, 'running', $2) RETURNING id",
        )
        .bind(kind)
        .bind(now_ms())
        .fetch_one(&self.pool)
        .await?;
        Ok(r.try_get(0)?)
    }

    pub async fn finish_job(
        &self,
        id: i64,
        status: &str,
        reason: Option<&str>,
        release_id: Option<i64>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE jobs SET status = $2, reason = $3, release_id = $4, finished_at = $5 \
             WHERE id = $1",
        )
        .bind(id)
        .bind(status)
        .bind(reason)
        .bind(release_id)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Jobs still `running` after a lease lifetime belong to a process that stopped
    /// (nothing of theirs was committed, or they would be finished): mark them failed.
    pub async fn fail_abandoned_jobs(&self, lease_secs: u64) -> Result<u64, StoreError> {
        let now = now_ms();
        let r = sqlx::query(
            "UPDATE jobs SET status = 'failed', reason = 'abandoned: the process running it stopped', \
             finished_at = $1 WHERE status = 'running' AND created_at < $2",
        )
        .bind(now)
        .bind(now - (lease_secs as i64) * 1000)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    pub async fn job(&self, id: i64) -> Result<Option<JobRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, kind, status, reason, release_id, created_at, finished_at \
             FROM jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// Takes (or renews) the trainer lease for `holder` until now + `secs`; false when
    /// another holder's lease has not expired.
    pub async fn acquire_lease(&self, holder: &str, secs: u64) -> Result<bool, StoreError> {
        let now = now_ms();
        let r = sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES ('trainer', $1, $2) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
             expires_at = excluded.expires_at \
             WHERE leases.expires_at < $3 OR leases.holder = $1",
        )
        .bind(holder)
        .bind(now + (secs as i64) * 1000)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    pub async fn release_lease(&self, holder: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM leases WHERE name = 'trainer' AND holder = $1")
            .bind(holder)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn api_key_count(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query("SELECT COUNT(*) FROM api_keys")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?)
    }

    pub async fn insert_api_key(&self, hash: &str, role: &str) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO api_keys (key_hash, role, created_at) VALUES ($1, $2, $3)")
            .bind(hash)
            .bind(role)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn api_keys(&self) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query("SELECT key_hash, role FROM api_keys")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreCounts {
    pub users: i64,
    pub items: i64,
    pub ratings: i64,
    pub releases: i64,
    pub rating_charges: i64,
    pub user_charges: i64,
    pub models: i64,
}
