//! Committing a release: its record, the plan of its ledger transactions and the
//! transaction that publishes it.

use super::*;

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
pub(super) const USER_STMT: usize = 50;
/// Users per statement that reads pending charge sets (one bind each).
pub(super) const PENDING_USERS: usize = 200;

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
pub(super) struct UserCost {
    pub(super) events_json: String,
    pub(super) cost: RdpCurve,
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
    stretch: &mut crate::store::foreground::Mark,
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
pub(super) struct RatingSteps {
    pub(super) lock_read: std::time::Duration,
    pub(super) update: std::time::Duration,
    pub(super) sets: std::time::Duration,
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
    if store.backend() == crate::store::Backend::Postgres {
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
    if store.backend() == crate::store::Backend::Postgres {
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
    let ready = crate::store::now_ms().saturating_add(VISIBLE_MARGIN_MS);
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
    .bind(crate::store::ratings_pg::text_array(lock))
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
}
