//! Releases, their models, and the one transaction that records a release with its
//! ledger charges (DESIGN 4).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Instant;

use sqlx::Row;

use super::pending::{self, Pending, Spend, PENDING_SELECT};
use super::rating_charges::{Before, RatingChargeRow, RatingCharges};
use super::{curve_json, id_runs, parse_curve, Store, StoreError, Tx};
use dprec_dp::accountant::{AccountantError, PrivacyEvent, RdpCurve};
use dprec_dp::charges::{Guarantee, Neighbour, PrivacyUnit, UnknownName};
use dprec_dp::ledger::{user_cost, RatingRecheck, UserBudget};

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

    /// Published releases (those with a stored model, from their visible time on),
    /// newest first. A release whose commit did not finish has no model and is not listed
    /// (its charges are in the audit).
    pub async fn releases(&self, limit: i64, offset: i64) -> Result<Vec<ReleaseRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {RELEASE_COLS} FROM releases WHERE visible_at <= $3 AND EXISTS \
             (SELECT 1 FROM models m WHERE m.release_id = releases.id) \
             ORDER BY id DESC LIMIT $1 OFFSET $2"
        ))
        .bind(limit)
        .bind(offset)
        .bind(super::now_ms())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(release_from_row).collect()
    }

    /// The number of published releases (those [`Store::releases`] lists).
    pub async fn release_count(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query(
            "SELECT COUNT(*) FROM releases WHERE visible_at <= $1 AND EXISTS \
             (SELECT 1 FROM models m WHERE m.release_id = releases.id)",
        )
        .bind(super::now_ms())
        .fetch_one(&self.pool)
        .await?
        .try_get(0)?)
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

    /// Id of the newest visible stored model, if any.
    pub async fn latest_model_id(&self) -> Result<Option<i64>, StoreError> {
        let r = sqlx::query(
            "SELECT MAX(m.release_id) FROM models m JOIN releases r ON r.id = m.release_id \
             WHERE r.visible_at <= $1",
        )
        .bind(super::now_ms())
        .fetch_one(&self.pool)
        .await?;
        Ok(r.try_get(0)?)
    }

    /// The newest release that has a model and is visible.
    pub async fn latest_model(&self) -> Result<Option<ModelRow>, StoreError> {
        let row = sqlx::query(
            "SELECT m.release_id, m.model, m.users, m.items, m.popularity FROM models m \
             JOIN releases r ON r.id = m.release_id WHERE r.visible_at <= $1 \
             ORDER BY m.release_id DESC LIMIT 1",
        )
        .bind(super::now_ms())
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

// Committing a release (DESIGN 4): short ledger transactions, then a publishing one.
//
// Everything that does not need the stored state is prepared first, outside any lock
// (each distinct user charge's RDP curve and JSON, the statement shapes). Then the
// ledger work is written in bounded transactions ("chunks"), each holding the commit
// lock ([`Store::begin_exclusive`], on SQLite the database write lock) only for its own
// rows: the first also inserts the release row; each re-checks its users (lock the row,
// `FOR UPDATE` on PostgreSQL; the Renyi filter admits the charge with the stored consumed
// curve; store the composed curve and the charge) and its ratings (`spent + charge <=
// eps_ij` against the planned states while the ledger clock shows nothing else committed
// since the snapshot, else against the stored rows with the pending charge sets folded
// in; the charge sets; the rows of the users due to settle, `store::pending`); the last
// also stores the model, which is what publishes the release (the served model and
// `GET /v1/models` are read from `models`). A small release is one transaction.
//
// Crash argument (docs/RELIABILITY.md, "Release commits"): a model row exists only after
// every chunk committed, so a served model always has all its charges; a crash or failed
// re-check after k >= 1 chunks leaves a release row without a model and charges that are
// all within budget (each chunk re-checked them under the lock): an over-charge for
// nothing published, which is safe, and is shown by the audit. A failure in the first
// chunk leaves nothing.

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
    /// The public time of the release (ms): when its job started, a time that does not
    /// depend on the data (not when the fit or the commit ended, which grows with it).
    pub started_at: i64,
    pub rating_unit: PrivacyUnit,
    pub rating_neighbour: Neighbour,
    /// Grouped by user, in the lock order.
    pub rating_charges: RatingCharges,
    /// All RDP events charged to each user (trainer events and the pure-DP charges of
    /// the user's ratings).
    pub user_charges: BTreeMap<String, Vec<PrivacyEvent>>,
    pub model_json: String,
    pub users_json: String,
    pub items_json: String,
    pub popularity_json: String,
    /// The ledger clock of the snapshot the charges were planned from (their planned
    /// states are in `rating_charges`): while the commit finds the clock moved only by
    /// its own transactions, it re-checks against those states without reading the rows.
    /// `None`: it reads them.
    pub snapshot_clock: Option<i64>,
    /// `release.publish_delay_secs` in ms: the release becomes visible at
    /// [`public_deadline`] of its start (0: at its commit).
    pub publish_delay_ms: i64,
}

/// The public time at which a release started at `started_at` (ms) becomes visible when
/// its model is stored at `ready` (ms): the first `started_at + k * delay_ms` (k >= 1) not
/// before `ready`, so that the time depends on the data only when a release outlasts the
/// delay, and then only by whole multiples of it. `delay_ms <= 0`: visible at once (0).
pub fn public_deadline(started_at: i64, delay_ms: i64, ready: i64) -> i64 {
    if delay_ms <= 0 {
        return 0;
    }
    let waited = ready.saturating_sub(started_at).max(0);
    let k = (waited.saturating_add(delay_ms - 1) / delay_ms).max(1);
    started_at.saturating_add(k.saturating_mul(delay_ms))
}

/// How long before the model's COMMIT its visible time is fixed at the latest: a deadline
/// closer than this to the model's insert moves to the next one, so the row is never
/// committed after its own visible time.
const VISIBLE_MARGIN_MS: i64 = 1_000;

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
    /// A later release charged or settled a user of this one first (only releases
    /// committing at the same time can; `store::pending`).
    #[error(
        "user {0:?}: a later release committed charges first (releases committing at \
         once); release aborted"
    )]
    LedgerMoved(String),
    #[error("accounting error for user {0:?}: {1}")]
    Accounting(String, #[source] AccountantError),
    #[error("injected failure: {0}")]
    Injected(String),
    /// A failure after the first `committed` of `chunks` ledger transactions: release
    /// `release_id` keeps the charges written so far (an over-charge, never an
    /// overspend) and is not published.
    #[error(
        "release {release_id} not published: ledger transaction {} of {chunks} failed ({source}); \
         the charges of the {committed} committed ones stay (over-charge, nothing served)",
        committed + 1
    )]
    Aborted {
        release_id: i64,
        committed: usize,
        chunks: usize,
        #[source]
        source: Box<CommitError>,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CommitError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Db(e))
    }
}

/// Where a commit is when the test hook runs: inside ledger transaction `chunk`
/// (0-based) of `chunks`, after its writes, before its COMMIT. The last one also stores
/// the model (publishes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitPoint {
    pub chunk: usize,
    pub chunks: usize,
}

/// A test hook called inside every ledger transaction of a commit after its writes and
/// before its COMMIT; an error aborts that transaction as a crash there would.
pub type InsideTxHook = dyn Fn(CommitPoint) -> Result<(), String> + Send + Sync;

/// Default ledger rows per transaction of a commit (a rating charge counts 1, a user
/// charge `USER_WEIGHT`, 32); see [`Store::set_commit_rows`] and lab note bench-04. When
/// every charged rating's row was rewritten, 8,000 rows measured worse than 2,000 under
/// mixed load at 1M ratings (top-N p99 10.7 s, ingestion p99 903 ms, against 768 ms and
/// 229 ms, single runs). Since spends are lazy (`store::pending`) a transaction rewrites
/// one charged rating in 8, and 8,000 take about as long as 2,000 did (longest 30-50 ms
/// at ML-20M size), while a commit's fixed cost (a sync and about ten statements a
/// transaction) is paid a quarter as often.
pub const DEFAULT_COMMIT_ROWS: usize = 8_000;
/// Weight of a user charge in a chunk: it reads, parses, composes and rewrites the
/// user's RDP curve (156 orders of JSON) besides inserting its charge row (250 users a
/// transaction at the default, as before).
const USER_WEIGHT: usize = 32;
/// Users per statement (6 binds per charge row; see [`literal_ids`] for why few).
const USER_STMT: usize = 50;
/// Users per statement that reads pending charge sets (one bind each).
const PENDING_USERS: usize = 200;

/// The ranges of users and of ratings written by one ledger transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chunk {
    users: std::ops::Range<usize>,
    ratings: std::ops::Range<usize>,
}

/// Packs `users` user charges then `ratings` rating charges into transactions of at
/// most `rows` weighted rows (at least one unit each; at least one transaction).
fn plan_chunks(users: usize, ratings: usize, rows: usize) -> Vec<Chunk> {
    let rows = rows.max(1);
    let mut out = Vec::new();
    let mut cur = Chunk {
        users: 0..0,
        ratings: 0..0,
    };
    let mut weight = 0;
    for u in 0..users {
        if weight > 0 && weight + USER_WEIGHT > rows {
            out.push(cur.clone());
            cur = Chunk {
                users: u..u,
                ratings: 0..0,
            };
            weight = 0;
        }
        cur.users.end = u + 1;
        weight += USER_WEIGHT;
    }
    let mut r = 0;
    while r < ratings {
        if weight >= rows {
            out.push(cur.clone());
            cur = Chunk {
                users: users..users,
                ratings: r..r,
            };
            weight = 0;
        }
        if cur.ratings.is_empty() {
            cur.ratings = r..r;
        }
        let take = (rows - weight).min(ratings - r);
        r += take;
        cur.ratings.end = r;
        weight += take;
    }
    out.push(cur);
    out
}

/// One distinct user charge: its events as stored and its RDP curve.
struct UserCost {
    events_json: String,
    cost: RdpCurve,
}

/// Each charged user with the index of its [`UserCost`].
type UserCostIndex<'a> = Vec<(&'a str, usize)>;

/// Outside any lock: the curve and JSON of each distinct user charge (usually one for all
/// users), computed once; each user with the index of its charge.
fn user_costs(rec: &ReleaseRecord) -> Result<(Vec<UserCost>, UserCostIndex<'_>), CommitError> {
    let mut costs: Vec<UserCost> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut users: Vec<(&str, usize)> = Vec::with_capacity(rec.user_charges.len());
    for (user, events) in &rec.user_charges {
        let json = serde_json::to_string(events).expect("events serialise");
        let k = match index.get(&json) {
            Some(&k) => k,
            None => {
                let cost =
                    user_cost(events).map_err(|e| CommitError::Accounting(user.to_owned(), e))?;
                costs.push(UserCost {
                    events_json: json.clone(),
                    cost,
                });
                index.insert(json, costs.len() - 1);
                costs.len() - 1
            }
        };
        users.push((user.as_str(), k));
    }
    Ok((costs, users))
}

/// What a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    pub release_id: i64,
    /// Ledger transactions it took.
    pub transactions: usize,
    /// Times it stepped aside between two of them for requests ([`Store::foreground`]).
    pub pauses: usize,
    /// Short gaps it left without requests, one every 8 transactions (for writers in
    /// other processes).
    pub gaps: usize,
    /// Whether it re-read the charged ratings' rows to re-check the charges (something
    /// else was committed since the release's snapshot, or it had none), rather than
    /// re-checking them against the states the release was planned from.
    pub rows_reread: bool,
    /// When the release becomes visible ([`public_deadline`]; 0: at once; `i64::MAX`:
    /// never, a release whose model was not stored).
    pub visible_at: i64,
}

/// Records `rec` (see the comment above), once its model is stored, i.e. published.
pub async fn commit_release(
    store: &Store,
    rec: &ReleaseRecord,
    hook: Option<&InsideTxHook>,
) -> Result<Committed, CommitError> {
    commit(store, rec, hook, true).await
}

/// Records `rec`'s charges exactly as [`commit_release`] does, without storing its model:
/// the release row and its charges exist (audited), nothing is served or listed. For a
/// release refused after its mechanisms ran (the refusal reveals their output, so their
/// charges stand; docs/LEDGER.md, "Refused releases").
pub async fn commit_charges_only(
    store: &Store,
    rec: &ReleaseRecord,
    hook: Option<&InsideTxHook>,
) -> Result<Committed, CommitError> {
    commit(store, rec, hook, false).await
}

async fn commit(
    store: &Store,
    rec: &ReleaseRecord,
    hook: Option<&InsideTxHook>,
    publish: bool,
) -> Result<Committed, CommitError> {
    let started = Instant::now();
    let (costs, users) = user_costs(rec)?;
    // On PostgreSQL a ledger transaction locks its users' rows first, in the order
    // ingestion locks them in (its batches are sorted), so the two never wait for each
    // other in a cycle (deadlock_detected): [`lock_users`] takes the users it charges and
    // those it may settle; the charges are grouped in user order, so the users of
    // consecutive transactions ascend.
    let ratings = &rec.rating_charges;
    if !ratings.users_in_order() {
        return Err(CommitError::Store(StoreError::Corrupt(
            "rating charges out of user order (the lock order)".into(),
        )));
    }
    store.refresh_planner_statistics().await?;
    let chunks = plan_chunks(users.len(), ratings.len(), store.commit_rows());
    let n = chunks.len();
    let mut release_id: Option<i64> = None;
    // Where the time goes (logged at the end): user and rating work inside the
    // transactions, and the pauses between them.
    let mut progress = Progress {
        phases: PhaseTimes::default(),
        clock: rec.snapshot_clock,
        settled: HashSet::new(),
        visible_at: i64::MAX,
    };
    // The stretch since the last pause (or the start): did a request start or run in it?
    let mut stretch = store.foreground().mark();
    for (k, chunk) in chunks.iter().enumerate() {
        let t = Instant::now();
        let point = CommitPoint {
            chunk: k,
            chunks: n,
        };
        let ctx = ChunkCtx {
            rec,
            users: &users,
            ratings,
            costs: &costs,
            publish,
        };
        let res = commit_chunk(store, &ctx, chunk, point, release_id, hook, &mut progress).await;
        match res {
            Ok(id) => release_id = Some(id),
            Err(e) => return Err(aborted(release_id, k, n, e)),
        }
        let took = t.elapsed();
        let phases = &mut progress.phases;
        phases.longest = phases.longest.max(took);
        if k + 1 < n {
            step_aside(store, took, &mut stretch, phases).await;
        }
    }
    let id = release_id.expect("at least one chunk");
    log_commit(id, rec, users.len(), n, started, &progress);
    Ok(Committed {
        release_id: id,
        transactions: n,
        pauses: progress.phases.pauses,
        gaps: progress.phases.gaps,
        rows_reread: progress.clock.is_none(),
        visible_at: progress.visible_at,
    })
}

/// The error of a commit whose ledger transaction `k` of `n` failed with `e`: as it is
/// when nothing was committed yet, else [`CommitError::Aborted`] (the committed
/// transactions' charges stay; nothing is published).
fn aborted(release_id: Option<i64>, k: usize, n: usize, e: CommitError) -> CommitError {
    let Some(release_id) = release_id else {
        return e;
    };
    log::warn!(
        "release {release_id}: ledger transaction {} of {n} failed: {e}; {k} committed \
         (charges stay, nothing published)",
        k + 1
    );
    CommitError::Aborted {
        release_id,
        committed: k,
        chunks: n,
        source: Box::new(e),
    }
}

/// The commit's line in the log: what it wrote and where the time went.
fn log_commit(
    id: i64,
    rec: &ReleaseRecord,
    users: usize,
    transactions: usize,
    started: Instant,
    progress: &Progress,
) {
    log::info!(
        "release {id}: {} rating and {users} user charges committed in {transactions} ledger \
         transaction(s), {:.0} ms in all, {}; rows re-read: {}",
        rec.rating_charges.len(),
        started.elapsed().as_secs_f64() * 1e3,
        progress.phases,
        if progress.clock.is_some() {
            "no (ledger untouched since the snapshot)"
        } else {
            "yes"
        },
    );
}

/// What a commit carries from one ledger transaction to the next.
struct Progress {
    phases: PhaseTimes,
    /// Where the ledger clock should stand if nothing but this commit moved it since the
    /// release's snapshot ([`tick_clock`]); `None` once anything else did (or with no
    /// snapshot): the charges are then re-checked against the rows.
    clock: Option<i64>,
    /// Users this commit has settled (their later charges are written to the rows too).
    settled: HashSet<String>,
    /// The visible time written with the model.
    visible_at: i64,
}

/// Moves the ledger clock on (in a transaction that charges ratings, under the commit
/// lock) and tells whether it stood where `expected` says: only this commit's own
/// transactions moved it since the snapshot, so every rating's state is the one the
/// release was planned from (ratings' eps_ij never change, and their spends change only
/// in ledger transactions that charge ratings, each of which moves the clock). Once it
/// did not, `expected` stays `None`.
async fn tick_clock(tx: &mut Tx, expected: &mut Option<i64>) -> Result<bool, CommitError> {
    let n: i64 = sqlx::query("UPDATE ledger_clock SET n = n + 1 WHERE id = 1 RETURNING n")
        .fetch_one(&mut **tx)
        .await?
        .try_get(0)?;
    let untouched = *expected == Some(n - 1);
    *expected = untouched.then_some(n);
    Ok(untouched)
}

/// With no request to step aside for, a commit still leaves the write lock free this
/// long after every this many transactions: a writer in another process (`dprec keys
/// create` on the SQLite file) waits in SQLite's busy handler, which sleeps and retries,
/// and back to back the gaps between transactions are too short for it to land in.
const QUIET_GAP: std::time::Duration = std::time::Duration::from_millis(2);
const QUIET_GAP_EVERY: usize = 8;

/// Between two ledger transactions of a commit: a pause as long as the last one took if
/// requests came since the last pause (`stretch`), else a short gap now and then.
async fn step_aside(
    store: &Store,
    took: std::time::Duration,
    stretch: &mut super::foreground::Mark,
    phases: &mut PhaseTimes,
) {
    phases.since_gap += 1;
    if !store.foreground().busy_since(*stretch) {
        if phases.since_gap >= QUIET_GAP_EVERY {
            tokio::time::sleep(QUIET_GAP).await;
            phases.paused += QUIET_GAP;
            phases.gaps += 1;
            phases.since_gap = 0;
        }
        return;
    }
    // Writers queued on the in-process gate get it first (it is fair); the pause also
    // lets writers polling SQLite's lock (other processes, writes that do not take the
    // gate) in between chunks. It lasts as long as the transaction did (2 ms to 200 ms),
    // so a commit holds the writers' queue and a core at most half the time: at 1M
    // ratings the back-to-back commit otherwise raised the top-N p99 above 20 ms
    // (lab note bench-01, "After: lanes"). Only when requests came
    // (`store::foreground`): with none, the pauses were half of a release's commit at
    // ML-20M size and served nobody.
    let pause = took.clamp(
        std::time::Duration::from_millis(2),
        std::time::Duration::from_millis(200),
    );
    tokio::time::sleep(pause).await;
    phases.paused += pause;
    phases.pauses += 1;
    phases.since_gap = 0;
    *stretch = store.foreground().mark();
}

/// What every ledger transaction of one commit shares.
struct ChunkCtx<'a> {
    rec: &'a ReleaseRecord,
    users: &'a [(&'a str, usize)],
    ratings: &'a RatingCharges,
    costs: &'a [UserCost],
    /// Whether the last transaction stores the model (publishes the release).
    publish: bool,
}

/// Time a commit spent on each kind of work.
#[derive(Debug, Default)]
struct PhaseTimes {
    users: std::time::Duration,
    ratings: std::time::Duration,
    paused: std::time::Duration,
    /// How many times it stepped aside for requests.
    pauses: usize,
    /// Short gaps left with no request ([`QUIET_GAP`]), and transactions since the last
    /// pause or gap.
    gaps: usize,
    since_gap: usize,
    /// The longest transaction.
    longest: std::time::Duration,
    rating_steps: RatingSteps,
}

/// Where the rating work of a commit goes: locking (PostgreSQL) and reading the rows'
/// stored state, writing the new spends, inserting the charge sets.
#[derive(Debug, Default)]
struct RatingSteps {
    lock_read: std::time::Duration,
    update: std::time::Duration,
    sets: std::time::Duration,
}

impl std::fmt::Display for PhaseTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "longest {:.1} ms (users {:.0} ms, ratings {:.0} ms: lock and read {:.0}, update \
             {:.0}, sets {:.0}; paused {:.0} ms in {} pauses for requests and {} short gaps)",
            ms(self.longest),
            ms(self.users),
            ms(self.ratings),
            ms(self.rating_steps.lock_read),
            ms(self.rating_steps.update),
            ms(self.rating_steps.sets),
            ms(self.paused),
            self.pauses,
            self.gaps
        )
    }
}

/// One ledger transaction of a commit; returns the release id (inserted by the first).
async fn commit_chunk(
    store: &Store,
    ctx: &ChunkCtx<'_>,
    chunk: &Chunk,
    point: CommitPoint,
    release_id: Option<i64>,
    hook: Option<&InsideTxHook>,
    progress: &mut Progress,
) -> Result<i64, CommitError> {
    let ChunkCtx {
        rec,
        users,
        ratings,
        costs,
        publish,
    } = *ctx;
    let _gate = store.write_gate().await;
    let mut tx = store.begin_exclusive().await?;
    if store.backend() == super::Backend::Postgres {
        // Every read here selects a few users' rows through an index. The charge sets
        // grow by a row a user during the commit, past what the planner's statistics
        // said (none on a first release): planned as sequential scans, or as parallel
        // bitmap scans whose worker start-up took 5 ms a statement, the reads of pending
        // sets took most of a 20M release's commit (lab note bench-04).
        for set in [
            "SET LOCAL enable_seqscan = off",
            "SET LOCAL max_parallel_workers_per_gather = 0",
        ] {
            sqlx::query(set).execute(&mut *tx).await?;
        }
    }
    let id = match release_id {
        Some(id) => id,
        None => insert_release(&mut tx, rec).await?,
    };
    if store.backend() == super::Backend::Postgres {
        lock_users(&mut tx, users, chunk, ratings, id).await?;
    }
    let t = Instant::now();
    for part in users[chunk.users.clone()].chunks(USER_STMT) {
        charge_users(store, &mut tx, id, part, costs).await?;
    }
    progress.phases.users += t.elapsed();
    let t = Instant::now();
    // This transaction's charges as rows (at most `commit_rows` of them), with the
    // states they were planned from.
    let rows: Vec<(RatingChargeRow, Option<Before>)> =
        ratings.rows_from(chunk.ratings.clone()).collect();
    if !rows.is_empty() {
        let untouched = tick_clock(&mut tx, &mut progress.clock).await?;
        let planned: Option<Vec<Before>> = untouched
            .then(|| {
                rows.iter()
                    .map(|(_, b)| *b)
                    .collect::<Option<Vec<Before>>>()
            })
            .flatten();
        let part: Vec<&RatingChargeRow> = rows.iter().map(|(r, _)| r).collect();
        let steps = &mut progress.phases.rating_steps;
        let settled = &mut progress.settled;
        let planned = planned.as_deref();
        charge_ratings(store, &mut tx, id, rec, &part, planned, settled, steps).await?;
    }
    progress.phases.ratings += t.elapsed();
    if publish && point.chunk + 1 == point.chunks {
        progress.visible_at = store_model(&mut tx, id, rec).await?;
    }
    if let Some(hook) = hook {
        hook(point).map_err(CommitError::Injected)?;
    }
    tx.commit().await?;
    Ok(id)
}

/// Stores the model of release `id` (what publishes it) with its public time
/// ([`public_deadline`]), which it returns.
async fn store_model(tx: &mut Tx, id: i64, rec: &ReleaseRecord) -> Result<i64, CommitError> {
    sqlx::query(
        "INSERT INTO models (release_id, model, users, items, popularity) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(&rec.model_json)
    .bind(&rec.users_json)
    .bind(&rec.items_json)
    .bind(&rec.popularity_json)
    .execute(&mut **tx)
    .await?;
    let ready = super::now_ms().saturating_add(VISIBLE_MARGIN_MS);
    let visible_at = public_deadline(rec.started_at, rec.publish_delay_ms, ready);
    sqlx::query("UPDATE releases SET visible_at = $2 WHERE id = $1")
        .bind(id)
        .bind(visible_at)
        .execute(&mut **tx)
        .await?;
    Ok(visible_at)
}

/// PostgreSQL: locks, before any other row, the rows of the users this transaction
/// charges and of the users among its rating charges that it may settle (due by the hash:
/// their rating rows are rewritten), in one statement in byte order, the order in which
/// ingestion locks a batch's users. Every transaction that writes more than one rating
/// row (ingestion, a user's deletion, this settlement) holds the users' rows first, so
/// the settled rows themselves need no lock in (user, item) order, and a ledger
/// transaction and an ingestion batch cannot wait for each other in a cycle. (Locking the
/// settled rows instead, an eighth of every charged rating, wrote a lock into each of them
/// first: 2.5M rows at 20M ratings, lab note bench-04.)
async fn lock_users(
    tx: &mut Tx,
    users: &[(&str, usize)],
    chunk: &Chunk,
    ratings: &RatingCharges,
    release_id: i64,
) -> Result<(), CommitError> {
    let mut lock: Vec<&str> = users[chunk.users.clone()].iter().map(|(u, _)| *u).collect();
    lock.extend(
        ratings
            .users_of(chunk.ratings.clone())
            .filter(|u| pending::due(u, release_id)),
    );
    lock.sort_unstable();
    lock.dedup();
    if lock.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "SELECT COUNT(*) FROM (SELECT u.id FROM unnest($1::text[]) WITH ORDINALITY AS q(id, k) \
         JOIN users u ON u.id = q.id ORDER BY q.k FOR UPDATE OF u) AS locked",
    )
    .bind(super::ratings_pg::text_array(lock))
    .fetch_one(&mut **tx)
    .await?;
    Ok(())
}

async fn insert_release(tx: &mut Tx, rec: &ReleaseRecord) -> Result<i64, CommitError> {
    Ok(sqlx::query(
        "INSERT INTO releases (trainer, params, guarantee, mechanisms, popularity_eps, \
         n_ratings, n_users, n_items, job_id, created_at, visible_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id",
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
    .bind(rec.started_at)
    // Never visible until the model is stored with its visible time.
    .bind(i64::MAX)
    .fetch_one(&mut **tx)
    .await?
    .try_get(0)?)
}

/// `n` groups of `per` placeholders, e.g. `($1, $2), ($3, $4)`.
fn value_rows(n: usize, per: usize) -> String {
    (0..n)
        .map(|k| {
            let b = k * per;
            let cols: Vec<String> = (1..=per).map(|j| format!("${}", b + j)).collect();
            format!("({})", cols.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A derived table `(SELECT $1 AS i, $2 AS v UNION ALL SELECT $3, $4 ...)` of `n` pairs
/// (portable between SQLite and PostgreSQL, unlike a column-aliased VALUES list).
fn pairs_table(n: usize) -> String {
    let rows: Vec<String> = (0..n)
        .map(|k| {
            if k == 0 {
                "SELECT $1 AS i, $2 AS v".to_string()
            } else {
                format!("SELECT ${}, ${}", 2 * k + 1, 2 * k + 2)
            }
        })
        .collect();
    format!("({})", rows.join(" UNION ALL "))
}

fn in_list(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the release adds to each charged rating's loss bound, after checking every charge
/// against the rating's `(eps, spent, rho)` as `state_of` gives it: the stored row with
/// the user's pending sets folded in, or the state the release was planned from when
/// nothing else has been committed since its snapshot.
fn recheck_ratings(
    part: &[&RatingChargeRow],
    mut state_of: impl FnMut(usize, &RatingChargeRow) -> Result<(f64, f64, f64), CommitError>,
) -> Result<Vec<f64>, CommitError> {
    // Re-check every charge against the stored state first (the rating's loss bound,
    // pure spend plus converted Gaussian part, must stay within eps_ij).
    let mut increments = Vec::with_capacity(part.len());
    let mut recheck = RatingRecheck::default();
    for (k, c) in part.iter().enumerate() {
        let (eps, spent, rho) = state_of(k, c)?;
        let charge = c.total();
        let added = recheck.check(eps, spent, rho, charge, c.rho).map_err(|o| {
            CommitError::RatingOverspend {
                rating_id: c.rating_id,
                eps,
                spent: o.before,
                charge: o.after - o.before,
            }
        })?;
        increments.push(added);
    }
    Ok(increments)
}

/// The stored state of `c` (its row with its user's pending sets folded in).
fn stored_state(
    stored: &Stored,
    pending: &Pending,
    c: &RatingChargeRow,
) -> Result<(f64, f64, f64), CommitError> {
    let &(eps, row) = stored
        .rows
        .get(&c.rating_id)
        .ok_or(CommitError::RatingMissing(c.rating_id))?;
    let s = row.with(c.rating_id, pending.of(&c.user));
    Ok((eps, s.spent, s.rho))
}

/// Charged ratings per statement that locks and reads them (whole users, so a
/// statement may take more).
const LOCK_IDS: usize = 2_000;
/// Charged ratings a user (on average over a statement's users) from which the statement
/// selects by user rather than by id: twice the default arrival cap of a continual tick
/// ([`crate::train::topn::continual::DEFAULT_CAP`]), and well under a full release's
/// typical user (every rating charged). Either way is correct; this is speed only.
const DENSE_PER_USER: usize = 2 * crate::train::topn::continual::DEFAULT_CAP;
/// Ratings per UPDATE (their ids are literals, [`literal_ids`]).
const UPDATE_IDS: usize = 5_000;
/// Charge-set rows per INSERT (10 binds each).
const SET_ROWS: usize = 25;

/// Rating charges inside a ledger transaction (`part` sorted by (user, item)): re-check
/// every charge against the rating's state, insert one charge-set row per (user, charge),
/// its ratings stored as runs of ids ([`super::id_runs`], migration 0012), and settle the
/// users this release is due to settle (write their folded rows, [`super::pending`]); the
/// other charged ratings' rows are not written: their sets are their new spend. The state
/// is the one the release was planned from (`planned`, when the ledger clock shows that
/// nothing else was committed since the snapshot), else the stored rows with the users'
/// pending sets folded in. Binds grow with users, not with ratings.
#[allow(clippy::too_many_arguments)]
async fn charge_ratings(
    store: &Store,
    tx: &mut Tx,
    release_id: i64,
    rec: &ReleaseRecord,
    part: &[&RatingChargeRow],
    planned: Option<&[Before]>,
    settled: &mut HashSet<String>,
    steps: &mut RatingSteps,
) -> Result<(), CommitError> {
    if part.is_empty() {
        return Ok(());
    }
    let mut users: Vec<&str> = part.iter().map(|c| &*c.user).collect();
    users.dedup();
    // Due: by the hash, or settled by this commit in an earlier transaction (a user's
    // ratings may span two), whose further charges are written into the rows too.
    let due = |u: &&str| settled.contains(*u) || pending::due(u, release_id);
    let t = Instant::now();
    let (ledger, stored, increments) = match planned {
        Some(planned) => {
            // Only the due users' pending sets are needed (to write their rows).
            let due_users: Vec<&str> = users.iter().copied().filter(due).collect();
            let ledger = read_pending(tx, &due_users, release_id).await?;
            steps.lock_read += t.elapsed();
            let increments = recheck_ratings(part, |k, _| {
                let b = planned[k];
                Ok((b.eps, b.spent, b.rho))
            })?;
            (ledger, None, increments)
        }
        None => {
            let ledger = read_pending(tx, &users, release_id).await?;
            steps.lock_read += t.elapsed();
            let stored = read_ratings(store, tx, part, steps).await?;
            let increments =
                recheck_ratings(part, |_, c| stored_state(&stored, &ledger.pending, c))?;
            (ledger, Some(stored), increments)
        }
    };
    let t = Instant::now();
    insert_charge_sets(tx, release_id, rec, part, &increments).await?;
    steps.sets += t.elapsed();
    let t = Instant::now();
    let due_users: Vec<&str> = users
        .iter()
        .copied()
        .filter(|u| due(u) || ledger.settled_here.contains(*u))
        .collect();
    settle_due(
        store,
        tx,
        release_id,
        &due_users,
        &ledger.pending,
        part,
        stored.as_ref(),
    )
    .await?;
    settled.extend(due_users.iter().map(|u| u.to_string()));
    steps.update += t.elapsed();
    Ok(())
}

/// What a ledger transaction knows of its users' lazy spends: their pending charge sets,
/// and which of them this release has settled already (in an earlier transaction).
#[derive(Default)]
struct ChunkLedger {
    pending: Pending,
    settled_here: HashSet<String>,
}

/// The pending charge sets of `users`, after checking that no release later than this
/// one has charged or settled any of them: the sets are folded in release order, so a
/// later release's set written before this one's would be folded in a different order
/// than its re-check added them (and a user settled past this release would never fold
/// this one's). Only releases committing at once can do that (two replicas whose
/// release leases overlapped); the commit is refused.
async fn read_pending(
    tx: &mut Tx,
    users: &[&str],
    release_id: i64,
) -> Result<ChunkLedger, CommitError> {
    let mut out = ChunkLedger::default();
    for part in users.chunks(PENDING_USERS) {
        let list = in_list(part.len());
        let sql = format!(
            "SELECT user_id, release_id FROM rating_settlements WHERE user_id IN ({list}) \
             AND release_id >= ${}",
            part.len() + 1
        );
        let mut q = sqlx::query(&sql);
        for u in part {
            q = q.bind(*u);
        }
        for r in q.bind(release_id).fetch_all(&mut **tx).await? {
            let (user, settled): (String, i64) = (r.try_get(0)?, r.try_get(1)?);
            if settled > release_id {
                return Err(CommitError::LedgerMoved(user));
            }
            out.settled_here.insert(user);
        }
        let sql =
            format!("{PENDING_SELECT} AND s.user_id IN ({list}) ORDER BY s.user_id, s.release_id");
        let mut q = sqlx::query(&sql);
        for u in part {
            q = q.bind(*u);
        }
        let read = Pending::from_rows(&q.fetch_all(&mut **tx).await?)?;
        // This release's own sets (of a user's ratings in an earlier transaction) list
        // other ratings than this transaction's: folding them changes nothing here.
        if let Some(u) = part
            .iter()
            .find(|u| read.of(u).last().is_some_and(|s| s.release_id > release_id))
        {
            return Err(CommitError::LedgerMoved((*u).to_owned()));
        }
        out.pending.extend(read);
    }
    Ok(out)
}

/// Settles the users of `users` that release `release_id` is due to settle
/// ([`pending::due`], or settled by it in an earlier transaction): every rating of theirs
/// that a pending set or this release's charges list gets its folded state written (the
/// same values a reader folds), and the users' mark moves to this release. On PostgreSQL
/// the users' rows are locked already ([`lock_users`]).
async fn settle_due(
    store: &Store,
    tx: &mut Tx,
    release_id: i64,
    due: &[&str],
    pending: &Pending,
    part: &[&RatingChargeRow],
    stored: Option<&Stored>,
) -> Result<(), CommitError> {
    if due.is_empty() {
        return Ok(());
    }
    let due_set: HashSet<&str> = due.iter().copied().collect();
    let charged: HashMap<i64, &RatingChargeRow> = part
        .iter()
        .filter(|c| due_set.contains(&*c.user))
        .map(|c| (c.rating_id, *c))
        .collect();
    let mut by_state: BTreeMap<[u64; 3], Vec<i64>> = BTreeMap::new();
    let mut fold = |id: i64, user: &str, row: Spend| {
        let mut s = row.with(id, pending.of(user));
        if let Some(c) = charged.get(&id) {
            s = s.plus(c.total(), c.rho);
        }
        if s != row {
            let key = [s.spent.to_bits(), s.rho.to_bits(), s.releases as u64];
            by_state.entry(key).or_default().push(id);
        }
    };
    for group in due.chunks(USER_STMT) {
        let list = in_list(group.len());
        // Rows the re-check read whole are folded from there; the others are read here,
        // grouped by state as the re-check reads them.
        if let Some(stored) = stored.filter(|s| group.iter().all(|u| s.whole.contains_key(*u))) {
            for u in group {
                for &id in &stored.whole[*u] {
                    fold(id, u, stored.rows[&id].1);
                }
            }
            continue;
        }
        let sql = format!(
            "SELECT user_id, spent, rho, releases, {} FROM ratings WHERE user_id IN ({list}) \
             GROUP BY user_id, spent, rho, releases",
            store.id_list_aggregate()
        );
        for r in users_query(&sql, group).fetch_all(&mut **tx).await? {
            let user: String = r.try_get(0)?;
            let row = Spend::from_row(&r, 1)?;
            let ids: String = r.try_get(4)?;
            for id in pending::id_list(&ids) {
                fold(id?, &user, row);
            }
        }
    }
    write_settled(tx, release_id, due, by_state).await
}

/// Writes the folded states (`by_state`: each distinct state's rating ids) and moves the
/// settlement of `due` to release `release_id`.
async fn write_settled(
    tx: &mut Tx,
    release_id: i64,
    due: &[&str],
    by_state: BTreeMap<[u64; 3], Vec<i64>>,
) -> Result<(), CommitError> {
    for ([spent, rho, releases], ids) in by_state {
        for ids in ids.chunks(UPDATE_IDS) {
            let sql = format!(
                "UPDATE ratings SET spent = $1, rho = $2, releases = $3 WHERE id IN ({})",
                literal_ids(ids)
            );
            sqlx::query(&sql)
                .persistent(false)
                .bind(f64::from_bits(spent))
                .bind(f64::from_bits(rho))
                .bind(releases as i64)
                .execute(&mut **tx)
                .await?;
        }
    }
    for group in due.chunks(USER_STMT) {
        let sql = format!(
            "INSERT INTO rating_settlements (user_id, release_id) VALUES {} \
             ON CONFLICT (user_id) DO UPDATE SET release_id = excluded.release_id",
            value_rows(group.len(), 2)
        );
        let mut q = sqlx::query(&sql);
        for u in group {
            q = q.bind(*u).bind(release_id);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// `sql` with `users` bound in order (not kept as a prepared statement: its list length
/// varies).
fn users_query<'q>(
    sql: &'q str,
    users: &[&'q str],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    let mut q = sqlx::query(sql).persistent(false);
    for u in users {
        q = q.bind(*u);
    }
    q
}

/// The rating rows a ledger transaction read: each one's eps_ij and stored ledger state,
/// and, for the users whose every rating was read (selected by user), their rating ids.
#[derive(Default)]
struct Stored {
    rows: HashMap<i64, (f64, Spend)>,
    whole: HashMap<String, Vec<i64>>,
}

/// The stored rows of the charged ratings of `part` (the pending sets are folded in by
/// [`recheck_ratings`]), and of all the ratings of the users read whole.
async fn read_ratings(
    store: &Store,
    tx: &mut Tx,
    part: &[&RatingChargeRow],
    steps: &mut RatingSteps,
) -> Result<Stored, CommitError> {
    // Statements take the charged ratings of consecutive users (`part` is sorted by
    // user, and a user is never split between two statements). Where the group charges
    // many ratings a user (a release charges them all) the statements select the users'
    // ratings through the (user, item) index, charged or not; where few (a continual tick
    // charges its arrival cap's few), only the charged ones by id (lab note bench-03).
    // Nothing is locked: only a settled user's rows are written, and `settle_due` locks
    // them; no other commit can run meanwhile ([`Store::begin_exclusive`]).
    let mut stored = Stored {
        rows: HashMap::with_capacity(part.len()),
        whole: HashMap::new(),
    };
    for group in user_groups(part, LOCK_IDS) {
        let mut users: Vec<&str> = group.iter().map(|c| &*c.user).collect();
        users.dedup();
        let by_users = group.len() >= DENSE_PER_USER * users.len();
        // The users as binds, or the ids as literals (no binds: see `literal_ids`).
        let (filter, binds) = if by_users {
            (format!("user_id IN ({})", in_list(users.len())), &users[..])
        } else {
            let ids: Vec<i64> = group.iter().map(|c| c.rating_id).collect();
            (format!("id IN ({})", literal_ids(&ids)), &[][..])
        };
        // Read the state grouped: ratings that took part in the same releases share
        // their state, so a few rows a user carry their ids as text instead of a row per
        // rating (sqlx's SQLite driver hands every row across threads: that transport, not
        // SQLite, was most of the commit's time). The values come back as doubles, exact.
        let sql = format!(
            "SELECT user_id, eps, spent, rho, releases, {} FROM ratings WHERE {filter} \
             GROUP BY user_id, eps, spent, rho, releases",
            store.id_list_aggregate()
        );
        let t = Instant::now();
        let mut q = sqlx::query(&sql).persistent(by_users);
        for u in binds {
            q = q.bind(*u);
        }
        for r in q.fetch_all(&mut **tx).await? {
            let user: String = r.try_get(0)?;
            let eps: f64 = r.try_get(1)?;
            let row = Spend::from_row(&r, 2)?;
            let ids: String = r.try_get(5)?;
            let mut whole = by_users.then(|| stored.whole.entry(user).or_default());
            for id in pending::id_list(&ids) {
                let id = id?;
                stored.rows.insert(id, (eps, row));
                if let Some(w) = whole.as_mut() {
                    w.push(id);
                }
            }
        }
        steps.lock_read += t.elapsed();
    }
    Ok(stored)
}

/// `part` (sorted by user) cut into runs of whole users of at least `ids` ratings each
/// (the last may be shorter; one user's ratings may make a longer one).
fn user_groups<'p, 'r>(
    part: &'p [&'r RatingChargeRow],
    ids: usize,
) -> impl Iterator<Item = &'p [&'r RatingChargeRow]> {
    let mut rest = part;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = ids.min(rest.len());
        while end < rest.len() && rest[end].user == rest[end - 1].user {
            end += 1;
        }
        let (group, tail) = rest.split_at(end);
        rest = tail;
        Some(group)
    })
}

/// Rating ids written into the statement as integer literals (`1, 2, 5`): they are
/// `i64`s the store assigned, so nothing from a request reaches the SQL text, and the
/// statement needs no binds: sqlx binds SQLite parameters by name and
/// `sqlite3_bind_parameter_name` scans the statement's list, so one statement's binds cost
/// O(binds^2) (4,500 binds took ~470 ms, 576 a few ms).
fn literal_ids(ids: &[i64]) -> String {
    let mut out = String::with_capacity(ids.len() * 9);
    for (k, id) in ids.iter().enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        out.push_str(&id.to_string());
    }
    out
}

/// One charge-set row per (user, charge, increment), in user order.
async fn insert_charge_sets(
    tx: &mut Tx,
    release_id: i64,
    rec: &ReleaseRecord,
    part: &[&RatingChargeRow],
    increments: &[f64],
) -> Result<(), CommitError> {
    type Key<'a> = (&'a str, [u64; 4]);
    let mut sets: BTreeMap<Key<'_>, Vec<i64>> = BTreeMap::new();
    for (c, inc) in part.iter().zip(increments) {
        let bits = [
            c.eps_train.to_bits(),
            c.eps_popularity.to_bits(),
            c.rho.to_bits(),
            inc.to_bits(),
        ];
        sets.entry((&*c.user, bits)).or_default().push(c.rating_id);
    }
    let rows: Vec<(&str, [f64; 4], id_runs::Runs)> = sets
        .into_iter()
        .map(|((user, bits), ids)| (user, bits.map(f64::from_bits), id_runs::runs_of(ids)))
        .collect();
    for batch in rows.chunks(SET_ROWS) {
        let sql = format!(
            "INSERT INTO rating_charge_sets (release_id, user_id, n, eps_train, eps_popularity, \
             rho, eps, unit, neighbour, rating_ids) VALUES {}",
            value_rows(batch.len(), 10)
        );
        let mut q = sqlx::query(&sql);
        for (user, [eps_train, eps_popularity, rho, eps], runs) in batch {
            q = q
                .bind(release_id)
                .bind(*user)
                .bind(id_runs::count(runs))
                .bind(*eps_train)
                .bind(*eps_popularity)
                .bind(*rho)
                .bind(*eps)
                .bind(rec.rating_unit.as_str())
                .bind(rec.rating_neighbour.as_str())
                .bind(id_runs::encode(runs));
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// User charges inside a ledger transaction: lock the rows, re-check each user's Renyi
/// filter with the stored consumed curve, store the composed curves and the charges.
async fn charge_users(
    store: &Store,
    tx: &mut Tx,
    release_id: i64,
    part: &[(&str, usize)],
    costs: &[UserCost],
) -> Result<(), CommitError> {
    let sql = format!(
        "SELECT id, budget_eps, budget_delta, rdp_consumed FROM users WHERE id IN ({}) \
         ORDER BY id{}",
        in_list(part.len()),
        store.for_update()
    );
    let mut q = sqlx::query(&sql);
    for (u, _) in part {
        q = q.bind(*u);
    }
    let mut stored: HashMap<String, (f64, f64, String)> = HashMap::with_capacity(part.len());
    for r in q.fetch_all(&mut **tx).await? {
        stored.insert(r.try_get(0)?, (r.try_get(1)?, r.try_get(2)?, r.try_get(3)?));
    }
    let mut next: Vec<(&str, String, f64, usize)> = Vec::with_capacity(part.len());
    for &(user, k) in part {
        let (eps, delta, consumed) = stored
            .get(user)
            .ok_or_else(|| CommitError::UserMissing(user.to_owned()))?;
        let budget = UserBudget {
            eps: *eps,
            delta: *delta,
            consumed: parse_curve(consumed)?,
        };
        let (order, composed) = budget
            .charge_cost(&costs[k].cost)
            .map_err(|e| CommitError::Accounting(user.to_owned(), e))?
            .ok_or_else(|| CommitError::UserRejected(user.to_owned()))?;
        next.push((user, curve_json(&composed), order, k));
    }
    let sql = format!(
        "UPDATE users SET rdp_consumed = v.v FROM {} AS v WHERE users.id = v.i",
        pairs_table(next.len())
    );
    let mut q = sqlx::query(&sql);
    for (user, curve, _, _) in &next {
        q = q.bind(*user).bind(curve.as_str());
    }
    q.execute(&mut **tx).await?;
    let sql = format!(
        "INSERT INTO user_charges (release_id, user_id, events, unit, neighbour, \
         admitted_order) VALUES {}",
        value_rows(next.len(), 6)
    );
    let mut q = sqlx::query(&sql);
    for (user, _, order, k) in &next {
        q = q
            .bind(release_id)
            .bind(*user)
            .bind(costs[*k].events_json.as_str())
            .bind(PrivacyUnit::User.as_str())
            .bind(Neighbour::AddRemove.as_str())
            .bind(*order);
    }
    q.execute(&mut **tx).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(chunks: &[Chunk], users: usize, ratings: usize) {
        let mut u = 0;
        let mut r = 0;
        for c in chunks {
            assert_eq!(c.users.start, u, "{chunks:?}");
            assert_eq!(c.ratings.start.min(r), r, "{chunks:?}");
            if !c.ratings.is_empty() {
                assert_eq!(c.ratings.start, r, "{chunks:?}");
            }
            u = c.users.end;
            r = r.max(c.ratings.end);
        }
        assert_eq!((u, r), (users, ratings), "{chunks:?}");
    }

    #[test]
    fn the_public_deadline_is_the_first_multiple_of_the_delay_not_before_ready() {
        assert_eq!(public_deadline(1_000, 10_000, 1_500), 11_000);
        assert_eq!(public_deadline(1_000, 10_000, 11_000), 11_000);
        assert_eq!(public_deadline(1_000, 10_000, 11_001), 21_000);
        // A clock behind the start still waits one whole delay.
        assert_eq!(public_deadline(1_000, 10_000, 0), 11_000);
        assert_eq!(public_deadline(1_000, 0, 5_000), 0);
        for ready in [1_000, 7_000, 20_999, 50_000, 1_000_000_007] {
            let v = public_deadline(1_000, 10_000, ready);
            assert!(
                v >= ready && (v - 1_000) % 10_000 == 0 && v - ready <= 10_000,
                "{ready}"
            );
        }
    }

    #[test]
    fn chunks_cover_everything_once_within_the_budget() {
        for (users, ratings, rows) in [
            (0, 0, 10),
            (3, 16, 5),
            (0, 10, 3),
            (943, 100_000, DEFAULT_COMMIT_ROWS),
            (5, 0, 1),
            (2, 2, 1000),
        ] {
            let chunks = plan_chunks(users, ratings, rows);
            covered(&chunks, users, ratings);
            for c in &chunks {
                let w = c.users.len() * USER_WEIGHT + c.ratings.len();
                assert!(
                    w <= rows.max(USER_WEIGHT) && w > 0 || users + ratings == 0,
                    "{users} {ratings} {rows}: {chunks:?}"
                );
            }
        }
        // A small release is one transaction (atomic as before).
        assert_eq!(plan_chunks(2, 2, 1000).len(), 1);
        assert_eq!(plan_chunks(0, 0, 10).len(), 1);
        assert_eq!(plan_chunks(3, 16, 5).len(), 3 + 4);
    }

    /// The lock statements' groups: every charge once, in order, no user split between
    /// two groups (the lock order), each group at least `ids` long except the last.
    #[test]
    fn lock_groups_take_whole_users_in_order() {
        let user_sizes = [3, 1, 7, 2, 2, 1, 5];
        let rows: Vec<RatingChargeRow> = user_sizes
            .iter()
            .enumerate()
            .flat_map(|(u, &n)| {
                let user: std::sync::Arc<str> = format!("u{u}").into();
                (0..n).map(move |k| RatingChargeRow {
                    rating_id: (100 * u + k) as i64,
                    user: user.clone(),
                    eps_train: 0.0,
                    eps_popularity: 0.0,
                    rho: 0.1,
                })
            })
            .collect();
        let part: Vec<&RatingChargeRow> = rows.iter().collect();
        for ids in [1, 2, 4, 8, 100] {
            let groups: Vec<_> = user_groups(&part, ids).collect();
            let flat: Vec<i64> = groups
                .iter()
                .flat_map(|g| g.iter().map(|c| c.rating_id))
                .collect();
            let want: Vec<i64> = rows.iter().map(|c| c.rating_id).collect();
            assert_eq!(flat, want, "ids {ids}");
            for (k, g) in groups.iter().enumerate() {
                assert!(!g.is_empty());
                if k + 1 < groups.len() {
                    assert!(g.len() >= ids, "ids {ids}: group {k} {}", g.len());
                    assert_ne!(g.last().unwrap().user, groups[k + 1][0].user, "ids {ids}");
                }
            }
        }
        assert_eq!(user_groups(&part, 4).count(), 4, "u0+u1, u2, u3+u4, u5+u6");
        assert_eq!(user_groups(&[], 4).count(), 0);
    }
}
