//! Persistent state on SQLite (embedded default) or PostgreSQL, through sqlx's `Any`
//! driver so both backends run the same queries (`$N` placeholders work on both).
//!
//! Dialect differences are confined to the migrations (`migrations/{sqlite,postgres}`),
//! to the locking of [`Store::begin_exclusive`], and to rating ingestion, which on
//! PostgreSQL binds whole columns as arrays (`ratings_pg`) instead of chunked rows.

mod audit;
mod budgets;
mod catalogue;
pub mod foreground;
mod holds;
mod id_runs;
mod jobs;
mod keys;
mod ldp;
mod migrations;
mod pending;
pub mod private_gd;
mod rating_charges;
mod ratings;
mod ratings_pg;
mod releases;
mod series;
mod series_offers;
mod snapshot;
pub mod suffstats_pg;

/// A database URL with its credentials hidden, for logs and error messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***{}", &url[..s], &url[at..]),
        _ => url.to_string(),
    }
}

pub use audit::{RatingAuditRow, RatingLevelCharge, UserReleaseCharge};
pub use catalogue::Registered;
pub use foreground::Foreground;
pub use jobs::JobRow;
pub use keys::ApiKeyRow;
pub use pending::Spend;
pub use rating_charges::{Before, Charge, RatingChargeRow, RatingCharges};
pub use releases::{
    commit_charges_only, commit_release, public_deadline, CommitError, CommitPoint, Committed,
    InsideTxHook, ModelRow, ReleaseRecord, ReleaseRow, DEFAULT_COMMIT_ROWS,
};
pub use series::{SeriesRow, SeriesState, SeriesTick};
pub use series_offers::{OfferMark, OfferRead, OfferedRating, UPDATE_OVERLAP_MS};
pub use snapshot::{RatingInput, RatingRef, RatingRow, RatingState, Snapshot};

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use anyhow::Context;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::AnyPool;

use dprec_dp::accountant::RdpCurve;

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
    /// A locally perturbed rating (origin `ldp`): its claim was validated at the API edge;
    /// `eps` is then the local eps, charged once at ingestion.
    pub ldp: Option<crate::ldp::LdpClaim>,
}

/// Budget defaults applied to new users and ratings.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub rating_eps: f64,
    pub user_eps: f64,
    pub user_delta: f64,
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

/// What [`Store::put_user_settings`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingsWrite {
    Applied,
    /// A raise of a user who has been charged (never allowed).
    RaiseRefused,
    /// A lowering that would not admit the charge of a release in flight for this user
    /// (`store::holds`): allowed again once that release has committed.
    Held,
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
    /// The accountant rejected a user's stored budget or consumed curve (corrupt state).
    #[error("accounting user {user:?}: {source}")]
    Accounting {
        user: String,
        source: dprec_dp::accountant::AccountantError,
    },
    /// The request conflicts with the stored state (e.g. an LDP rating for a pair that
    /// is already rated, or a user budget that cannot take an LDP charge).
    #[error("{0}")]
    Conflict(String),
    /// A rating names an item outside the public catalogue (items are registered, never
    /// created by ratings: issue 8 finding 1).
    #[error("item {0:?} is not in the catalogue")]
    NotInCatalogue(String),
}

/// A failure injected by a crash test's hook (e.g. `release::Hooks::before_commit`); the
/// message says what was simulated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InjectedFailure(pub String);

impl From<&str> for InjectedFailure {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl From<String> for InjectedFailure {
    fn from(s: String) -> Self {
        Self(s)
    }
}

#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// SQLite only: the in-process queue of the writers that must not wait behind a
    /// release (ingestion and the release's ledger transactions), see [`Store::write_gate`].
    write_gate: Arc<tokio::sync::Mutex<()>>,
    /// Ledger rows per transaction of a release commit (shared by the clones).
    commit_rows: Arc<AtomicUsize>,
    /// A second, lazily connected pool for release work ([`Store::background`]); none for
    /// an in-memory SQLite database.
    background_pool: Option<AnyPool>,
    /// The requests this process serves, so a release commit steps aside only for them
    /// (shared by the clones).
    foreground: Foreground,
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

/// Creates the SQLite database file of `url` with mode 0600 (owner only) when it does
/// not exist yet; SQLite gives its `-wal` and `-shm` files the same mode. An existing
/// file keeps the mode its operator chose; in-memory databases have no file.
fn create_private_sqlite_file(url: &str) -> anyhow::Result<()> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let path = rest.split('?').next().unwrap_or("");
    if path.is_empty() || path == ":memory:" || rest.contains("mode=memory") {
        return Ok(());
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    match opts.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(anyhow::Error::new(e).context(format!("creating the SQLite file {path}"))),
    }
}

/// `n` groups of placeholders, group `k` made by `group(first bind number)` with `per`
/// binds per group, joined by commas: e.g. `($1, $2), ($3, $4)`.
pub(crate) fn placeholders(n: usize, per: usize, group: impl Fn(usize) -> String) -> String {
    (0..n)
        .map(|k| group(1 + k * per))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Store {
    /// Connects (creating a SQLite file if missing, in WAL mode) and runs the migrations.
    /// SQLite runs with `synchronous = NORMAL` (see [`Store::connect_with`]).
    pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<Self> {
        Self::connect_with(url, max_connections, false).await
    }

    /// [`Store::connect`] with SQLite's `synchronous` chosen: `full_sync` = FULL fsyncs the
    /// WAL at every commit (acknowledged writes survive power loss), otherwise NORMAL
    /// (they survive a process crash; the last ones may be lost on power loss; see
    /// docs/RELIABILITY.md). A new SQLite file is created with mode 0600.
    pub async fn connect_with(
        url: &str,
        max_connections: u32,
        full_sync: bool,
    ) -> anyhow::Result<Self> {
        static DRIVERS: Once = Once::new();
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        let backend = Backend::from_url(url)?;
        if backend == Backend::Sqlite {
            create_private_sqlite_file(url)?;
        }
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
        let pool = pool_options(backend, max_connections.max(2), full_sync)
            .connect_with(opts.clone())
            .await
            .with_context(|| {
                format!(
                    "connecting to the {} database at {} (database.url or DATABASE_URL)",
                    backend.name(),
                    redact_url(&url)
                )
            })?;
        // Opened on first use, i.e. by the release lane, whose threads run at nice 10.
        // SQLite: the per-connection worker thread is spawned by the thread that connects
        // and inherits its priority, so a release's snapshot read and ledger writes take
        // the CPU that requests leave over (crate::lanes).
        // PostgreSQL: a connection's socket is registered with the tokio runtime that
        // opened it, and its reads and writes wake up only when that runtime's thread
        // polls for I/O. A connection opened by the release lane (a nice-10 thread, busy
        // with the snapshot's rows and the commit's statements) and then handed to a
        // request by a shared pool made that request wait for the lane to be scheduled:
        // whole seconds of top-N p99 at 1M ratings (lab note bench-05, issue 22 item 4).
        // With a pool of their own, the release's connections serve only the release
        // ([`Store::background`], [`Store::release_writes`]) and never count against the
        // requests' `database.max_connections`.
        // (Not for an in-memory database: a second pool would open a second database.)
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let background_pool = (!in_memory).then(|| {
            pool_options(backend, background_connections(backend), full_sync)
                .connect_lazy_with(opts)
        });
        let store = Self {
            pool,
            backend,
            write_gate: Arc::new(tokio::sync::Mutex::new(())),
            commit_rows: Arc::new(AtomicUsize::new(DEFAULT_COMMIT_ROWS)),
            background_pool,
            foreground: Foreground::default(),
        };
        migrations::run(&store.pool, backend)
            .await
            .context("running database migrations")?;
        Ok(store)
    }

    /// The store as a release's reads should use it: through the background pool (see
    /// [`Store::connect_with`]). Shares the write queue and settings.
    pub fn background(&self) -> Store {
        let mut s = self.clone();
        if let Some(p) = &self.background_pool {
            s.pool = p.clone();
        }
        s
    }

    /// The store as the release lane's writes (ledger commit, trainer lease, job rows,
    /// continual-series rows) should use it. SQLite: the normal pool, whose connection
    /// threads run at normal priority: the commit's transactions hold SQLite's write
    /// queue, and at a low priority they made ingestion wait (p99 635 ms against 200 ms
    /// at 1M ratings). PostgreSQL: the background pool, so that no connection the lane
    /// opens is later lent to a request (see [`Store::connect_with`]).
    pub fn release_writes(&self) -> Store {
        match self.backend {
            Backend::Sqlite => self.clone(),
            Backend::Postgres => self.background(),
        }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }
}

/// Connections of the background pool. SQLite: the snapshot read and one more.
/// PostgreSQL, where the pool also takes the lane's writes ([`Store::release_writes`]): a
/// release's streamed snapshot read, its lease renewal beside it, and one for its job
/// and ledger rows.
fn background_connections(backend: Backend) -> u32 {
    match backend {
        Backend::Sqlite => 2,
        Backend::Postgres => 3,
    }
}

/// Pool options: bounded, and on SQLite every connection in WAL mode with a busy timeout
/// and the chosen `synchronous`.
fn pool_options(backend: Backend, max_connections: u32, full_sync: bool) -> AnyPoolOptions {
    let mut pool = AnyPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10));
    if backend == Backend::Sqlite {
        pool = pool.after_connect(move |conn, _| {
            Box::pin(async move {
                use sqlx::Executor;
                conn.execute("PRAGMA journal_mode = WAL").await?;
                conn.execute("PRAGMA busy_timeout = 10000").await?;
                conn.execute(if full_sync {
                    "PRAGMA synchronous = FULL"
                } else {
                    "PRAGMA synchronous = NORMAL"
                })
                .await?;
                Ok(())
            })
        });
    } else {
        // No JIT: the service's statements are short, and the planner's cost estimate
        // (high on a table not analysed yet, e.g. right after a bulk import) made
        // PostgreSQL JIT-compile each ledger read, about 1-2 s a statement at ML-20M size
        // (a release's commit ran at 1,500 ratings/s instead of tens of thousands).
        // The thread that opens a connection is the one whose runtime wakes its I/O (see
        // [`Store::connect_with`]): logged at debug level to check which pool a lane uses.
        pool = pool.after_connect(move |conn, _| {
            Box::pin(async move {
                use sqlx::Executor;
                conn.execute("SET jit = off").await?;
                log::debug!(
                    "PostgreSQL connection opened for the pool of {max_connections} on thread {}",
                    std::thread::current().name().unwrap_or("unnamed")
                );
                Ok(())
            })
        });
    }
    pool
}

impl Store {
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    pub async fn close(&self) {
        self.pool.close().await;
        if let Some(p) = &self.background_pool {
            p.close().await;
        }
    }

    /// Before a ledger commit on PostgreSQL: `ANALYZE` the ratings and the ledger's charge
    /// sets and settlements (which grow by a row a user each release), so the planner knows
    /// that a few users' ratings are a few rows. Without statistics (a table not analysed
    /// since a bulk import; autovacuum runs when it runs) it estimated 400,000 rows for 4
    /// users and read the commit's `user_id IN (...)` statements with a parallel sequential
    /// scan of the whole table, 3.7 s a statement at ML-20M size. It samples a fixed number
    /// of rows (about 1 s at 20M). SQLite plans these statements on the index without
    /// statistics.
    pub async fn refresh_planner_statistics(&self) -> Result<(), StoreError> {
        if self.backend == Backend::Postgres {
            for table in ["ratings", "rating_charge_sets", "rating_settlements"] {
                sqlx::query(&format!("ANALYZE {table}"))
                    .execute(&self.pool)
                    .await?;
            }
        }
        Ok(())
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

    /// On SQLite, a place in the fair (FIFO) queue of this process's writers, held until
    /// the guard is dropped (after COMMIT): SQLite has one writer at a time, and a writer
    /// waiting in its busy handler polls with growing sleeps, so between two of a
    /// release's short ledger transactions it would rarely find the lock free. Queued
    /// here, an ingestion batch waits for at most the ledger transaction in progress.
    /// Taken before a pooled connection, so queued writers hold no connection. `None`
    /// (no queue) on PostgreSQL, which has row locks.
    pub async fn write_gate(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        match self.backend {
            Backend::Sqlite => Some(self.write_gate.clone().lock_owned().await),
            Backend::Postgres => None,
        }
    }

    /// A transaction that writes: on SQLite its first statement takes the write lock
    /// (the effect of BEGIN IMMEDIATE), so a busy database is waited for in SQLite's busy
    /// handler. A deferred transaction that reads first cannot wait: its upgrade to a
    /// writer fails at once with SQLITE_BUSY while another writer holds the lock.
    pub async fn begin_write(&self) -> Result<Tx, StoreError> {
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Sqlite {
            sqlx::query("UPDATE leases SET expires_at = expires_at WHERE 1 = 0")
                .execute(&mut *tx)
                .await?;
        }
        Ok(tx)
    }

    /// Ledger rows per transaction of a release commit (default
    /// [`DEFAULT_COMMIT_ROWS`]; a rating charge counts 1, a user charge 32).
    pub fn commit_rows(&self) -> usize {
        self.commit_rows.load(Ordering::Relaxed)
    }

    /// The requests being served ([`foreground`]): the HTTP layer counts them, a release
    /// commit asks whether to step aside.
    pub fn foreground(&self) -> &Foreground {
        &self.foreground
    }

    /// Sets [`Store::commit_rows`] for this store and its clones (tests use small values
    /// to commit small releases in many transactions).
    pub fn set_commit_rows(&self, rows: usize) {
        self.commit_rows.store(rows.max(1), Ordering::Relaxed);
    }

    /// An aggregate of the grouped rows' `id`s as comma-separated text.
    pub(crate) fn id_list_aggregate(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "string_agg(CAST(id AS TEXT), ',')",
            Backend::Sqlite => "group_concat(id, ',')",
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[tokio::test]
    async fn sqlite_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dprec.sqlite");
        let url = format!("sqlite://{}", file.display());
        let store = Store::connect_with(&url, 2, true).await.unwrap();
        store.ping().await.unwrap();
        for name in ["dprec.sqlite", "dprec.sqlite-wal", "dprec.sqlite-shm"] {
            let p = dir.path().join(name);
            if p.exists() {
                let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
                assert_eq!(mode, 0o600, "{name}");
            }
        }
        let mut conn = store.pool().acquire().await.unwrap();
        let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(sync, 2, "FULL");
        drop(conn);
        store.close().await;
    }
}
