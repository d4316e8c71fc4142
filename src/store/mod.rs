//! Persistent state on SQLite (embedded default) or PostgreSQL, through sqlx's `Any`
//! driver so both backends run the same queries (`$N` placeholders work on both).
//!
//! Dialect differences are confined to the migrations (`migrations/{sqlite,postgres}`)
//! and to the locking of [`Store::begin_exclusive`].

mod audit;
mod jobs;
mod keys;
mod migrations;
mod ratings;
mod releases;

pub use audit::{RatingAuditRow, UserReleaseCharge};
pub use jobs::JobRow;
pub use releases::{
    commit_release, CommitError, InsideTxHook, ModelRow, RatingChargeRow, ReleaseRecord, ReleaseRow,
};

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Once;
use std::time::Duration;

use anyhow::Context;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::AnyPool;

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

pub(crate) fn parse_curve(s: &str) -> Result<RdpCurve, StoreError> {
    if s.is_empty() {
        return Ok(RdpCurve::zeros_default());
    }
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("stored RDP curve: {e}")))
}

pub(crate) fn curve_json(c: &RdpCurve) -> String {
    serde_json::to_string(c).expect("RDP curves serialise")
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
