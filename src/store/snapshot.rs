//! The training snapshot: every live rating of every live user, with the users' budgets
//! and the catalogue, read in one transaction (one consistent state of the store).
//!
//! Compact on purpose (issue 22 item 2: a release at 20M ratings must fit in a small
//! machine): a rating is 24 bytes ([`RatingRow`]), its user and item are indices into
//! sorted name tables, and its budget state `(eps, spent, rho, origin)`, which most
//! ratings share, is an index into a table of the distinct states. The ratings are read
//! grouped by user (one result row per user, the ids, items, values and state indices as
//! text lists): a database driver hands over one row at a time, and at 20M rows the
//! hand-over, not the database, was the cost (lab note bench-02).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures_util::TryStreamExt;
use sqlx::Row;

use super::pending::{Pending, PendingSet, Spend, PENDING_SELECT};
use super::{Backend, Store, StoreError};
use dprec_dp::ledger::{PlanInput, UserBudget};

/// One live rating: 24 bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatingRow {
    pub id: i64,
    /// Index into [`Snapshot::user_names`] (sorted, so index order is id order).
    pub user: u32,
    /// Index into [`Snapshot::item_names`] (sorted).
    pub item: u32,
    /// The rating's value (training reads it as `f32` anyway).
    pub value: f32,
    /// Index into [`Snapshot::states`].
    pub state: u32,
}

/// A rating's budget state, shared by every rating in the same state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RatingState {
    pub eps: f64,
    /// Pure spend ([`dprec_dp::ledger::rating_loss`]).
    pub spent: f64,
    /// Gaussian part of the rating's loss (zCDP).
    pub rho: f64,
    /// Perturbed on the client (`origin = 'ldp'`): only local-DP trainers read it.
    pub ldp: bool,
}

/// One rating with its names and state resolved (what callers read).
#[derive(Debug, Clone, Copy)]
pub struct RatingRef<'a> {
    pub id: i64,
    pub user: &'a Arc<str>,
    pub item: &'a Arc<str>,
    pub value: f64,
    pub eps: f64,
    pub spent: f64,
    pub rho: f64,
    pub ldp: bool,
}

/// Everything a release plans from.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Ascending rating id (arrival order).
    pub ratings: Vec<RatingRow>,
    /// The distinct users of `ratings`, sorted.
    pub user_names: Vec<Arc<str>>,
    /// The distinct items of `ratings`, sorted.
    pub item_names: Vec<Arc<str>>,
    pub states: Vec<RatingState>,
    /// Every live user's budget (with or without ratings).
    pub users: BTreeMap<String, UserBudget>,
    /// The item catalogue (public metadata), sorted.
    pub items: Vec<String>,
    /// The ledger clock read with the ratings (`Store::snapshot`; none for a snapshot
    /// built in memory): a commit that finds it moved only by itself re-checks charges
    /// against the planned states (`store::releases`).
    pub ledger_clock: Option<i64>,
}

/// A rating as a test or an importer states it (owned names), for [`Snapshot::build`].
#[derive(Debug, Clone, PartialEq)]
pub struct RatingInput {
    pub id: i64,
    pub user: String,
    pub item: String,
    pub value: f64,
    pub eps: f64,
    pub spent: f64,
    pub rho: f64,
    pub ldp: bool,
}

impl Snapshot {
    /// A snapshot of `ratings` (any order), `users` and the catalogue `items`.
    pub fn build(
        ratings: impl IntoIterator<Item = RatingInput>,
        users: BTreeMap<String, UserBudget>,
        items: Vec<String>,
    ) -> Self {
        let mut b = Builder::default();
        for r in ratings {
            let state = RatingState {
                eps: r.eps,
                spent: r.spent,
                rho: r.rho,
                ldp: r.ldp,
            };
            let s = b.state(state);
            b.push(r.id, &r.user, &r.item, r.value, s);
        }
        b.finish(users, items)
    }

    pub fn len(&self) -> usize {
        self.ratings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ratings.is_empty()
    }

    /// Rating `k` (position in [`Snapshot::ratings`]) with its names and state.
    pub fn get(&self, k: usize) -> RatingRef<'_> {
        self.resolve(&self.ratings[k])
    }

    pub fn resolve(&self, r: &RatingRow) -> RatingRef<'_> {
        let s = &self.states[r.state as usize];
        RatingRef {
            id: r.id,
            user: &self.user_names[r.user as usize],
            item: &self.item_names[r.item as usize],
            value: f64::from(r.value),
            eps: s.eps,
            spent: s.spent,
            rho: s.rho,
            ldp: s.ldp,
        }
    }

    /// Every rating in id order.
    pub fn iter(&self) -> impl Iterator<Item = RatingRef<'_>> + '_ {
        self.ratings.iter().map(|r| self.resolve(r))
    }

    /// The planner's view of every rating, in id order ([`dprec_dp::ledger::plan_inputs`]).
    pub fn plan_inputs(&self) -> impl Iterator<Item = PlanInput<'_>> + '_ {
        self.ratings.iter().map(|r| {
            let s = &self.states[r.state as usize];
            PlanInput {
                user: &self.user_names[r.user as usize],
                eps: s.eps,
                spent: s.spent,
                rho: s.rho,
            }
        })
    }
}

/// Interns names and states while the rows arrive; [`Builder::finish`] sorts the name
/// tables (so that index order is name order) and the ratings by id.
#[derive(Default)]
struct Builder {
    ratings: Vec<RatingRow>,
    users: HashMap<Arc<str>, u32>,
    items: HashMap<Arc<str>, u32>,
    states: Vec<RatingState>,
    state_index: HashMap<[u64; 3], Vec<(bool, u32)>>,
}

fn intern(map: &mut HashMap<Arc<str>, u32>, name: &str) -> u32 {
    if let Some(&k) = map.get(name) {
        return k;
    }
    let k = map.len() as u32;
    map.insert(Arc::from(name), k);
    k
}

/// Name table sorted by name, and the new index of each old index.
fn sorted_names(map: HashMap<Arc<str>, u32>) -> (Vec<Arc<str>>, Vec<u32>) {
    let mut names: Vec<(Arc<str>, u32)> = map.into_iter().collect();
    names.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut new_index = vec![0u32; names.len()];
    for (k, (_, old)) in names.iter().enumerate() {
        new_index[*old as usize] = k as u32;
    }
    (names.into_iter().map(|(n, _)| n).collect(), new_index)
}

impl Builder {
    /// The index of `s` (states compare by their exact bits).
    fn state(&mut self, s: RatingState) -> u32 {
        let key = [s.eps.to_bits(), s.spent.to_bits(), s.rho.to_bits()];
        let slot = self.state_index.entry(key).or_default();
        if let Some(&(_, k)) = slot.iter().find(|(ldp, _)| *ldp == s.ldp) {
            return k;
        }
        let k = self.states.len() as u32;
        self.states.push(s);
        slot.push((s.ldp, k));
        k
    }

    fn push(&mut self, id: i64, user: &str, item: &str, value: f64, state: u32) {
        let user = intern(&mut self.users, user);
        let item = intern(&mut self.items, item);
        self.ratings.push(RatingRow {
            id,
            user,
            item,
            value: value as f32,
            state,
        });
    }

    fn finish(mut self, users: BTreeMap<String, UserBudget>, items: Vec<String>) -> Snapshot {
        let (user_names, user_index) = sorted_names(self.users);
        let (item_names, item_index) = sorted_names(self.items);
        for r in &mut self.ratings {
            r.user = user_index[r.user as usize];
            r.item = item_index[r.item as usize];
        }
        self.ratings.sort_unstable_by_key(|r| r.id);
        self.ratings.shrink_to_fit();
        Snapshot {
            ratings: self.ratings,
            user_names,
            item_names,
            states: self.states,
            users,
            items,
            ledger_clock: None,
        }
    }
}

/// The distinct budget states of the live ratings, numbered in a fixed order (the most
/// common first): the grouped read names each rating's state by this number.
const STATES: &str = "SELECT eps, spent, rho, origin, \
     ROW_NUMBER() OVER (ORDER BY n DESC, eps, spent, rho, origin) - 1 AS k, n \
     FROM (SELECT eps, spent, rho, origin, COUNT(*) AS n FROM ratings \
           WHERE value IS NOT NULL GROUP BY eps, spent, rho, origin) d";

/// Up to this many states, a rating's state number is a `CASE` over the states (bound
/// exactly, the most common first): a few comparisons a row. Beyond it, a join with the
/// numbered states (on SQLite an index search a row, about twice the read's CPU at 20M
/// ratings).
const CASE_STATES: usize = 32;

/// Separates item ids in the grouped read: ids never hold control characters
/// (`api::domain::Id`).
const ITEM_SEP: char = '\u{1f}';

/// How the grouped read numbers each rating's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StateNumbers {
    /// `CASE` over the `n` states, bound as `(eps, spent, rho, origin)` from `$1`.
    Case(usize),
    /// A join with [`STATES`].
    Join,
}

impl Store {
    /// Live ratings of live users, their budgets, and the item catalogue, in one read
    /// transaction (repeatable read on PostgreSQL; SQLite's read transaction is a
    /// snapshot of the database). See the module doc for the form.
    pub async fn snapshot(&self) -> Result<Snapshot, StoreError> {
        self.snapshot_with(CASE_STATES).await
    }

    /// [`Store::snapshot`] numbering the states by a join whatever their count (for the
    /// tests that compare both ways).
    #[doc(hidden)]
    pub async fn snapshot_joining_states(&self) -> Result<Snapshot, StoreError> {
        self.snapshot_with(0).await
    }

    async fn snapshot_with(&self, case_states: usize) -> Result<Snapshot, StoreError> {
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .execute(&mut *tx)
                .await?;
        }
        let mut b = Builder::default();
        let mut numbered: Vec<(RatingState, String)> = Vec::new();
        let mut live = 0usize;
        for (k, r) in sqlx::query(STATES)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .enumerate()
        {
            let origin: String = r.try_get(3)?;
            let s = RatingState {
                eps: r.try_get(0)?,
                spent: r.try_get(1)?,
                rho: r.try_get(2)?,
                ldp: origin == "ldp",
            };
            if r.try_get::<i64, _>(4)? != k as i64 {
                return Err(StoreError::Corrupt(format!(
                    "state {k} numbered out of order"
                )));
            }
            numbered.push((s, origin));
            live += usize::try_from(r.try_get::<i64, _>(5)?).unwrap_or(0);
        }
        // Charges not yet written into the rows (`store::pending`), folded in per user.
        let pending = read_pending(&mut tx).await?;
        let clock: i64 = sqlx::query("SELECT n FROM ledger_clock WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;
        // The live ratings, deleted users' included: the rows' room is taken once (a
        // doubling vector would hold up to twice, and copy itself at every growth).
        b.ratings.reserve_exact(live);
        let state_of: Vec<u32> = numbered.iter().map(|(s, _)| b.state(*s)).collect();
        let how = if numbered.len() <= case_states {
            StateNumbers::Case(numbered.len())
        } else {
            StateNumbers::Join
        };
        // No state: no live rating (and `CASE END` would not parse).
        if !numbered.is_empty() {
            let sql = grouped_ratings_sql(self.backend, how);
            let mut q = sqlx::query(&sql);
            if let StateNumbers::Case(_) = how {
                for (s, origin) in &numbered {
                    q = q
                        .bind(s.eps)
                        .bind(s.spent)
                        .bind(s.rho)
                        .bind(origin.as_str());
                }
            }
            let mut rows = q.fetch(&mut *tx);
            while let Some(r) = rows.try_next().await? {
                let user: &str = r.try_get(0)?;
                let lists: [&str; 4] = [r.try_get(1)?, r.try_get(2)?, r.try_get(3)?, r.try_get(4)?];
                push_user(&mut b, user, lists, &state_of, pending.of(user))?;
            }
        }
        let users = live_budgets(&mut tx).await?;
        let items = sqlx::query("SELECT id FROM items ORDER BY id")
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<Vec<String>, _>>()?;
        tx.commit().await?;
        let mut snap = b.finish(users, items);
        snap.ledger_clock = Some(clock);
        Ok(snap)
    }
}

/// Every user's pending charge sets, streamed (a user may have several: a release settles
/// one user in 8).
async fn read_pending(tx: &mut super::Tx) -> Result<Pending, StoreError> {
    let sql = format!("{PENDING_SELECT} ORDER BY s.user_id, s.release_id");
    let mut pending = Pending::default();
    let mut rows = sqlx::query(&sql).fetch(&mut **tx);
    while let Some(r) = rows.try_next().await? {
        pending.push_row(&r)?;
    }
    Ok(pending)
}

/// Every live user's budget (with or without ratings).
pub(super) async fn live_budgets(
    tx: &mut super::Tx,
) -> Result<BTreeMap<String, UserBudget>, StoreError> {
    let mut rows = sqlx::query(
        "SELECT id, budget_eps, budget_delta, rdp_consumed FROM users WHERE deleted = 0",
    )
    .fetch(&mut **tx);
    super::budgets::BudgetReader::default()
        .read_all(&mut rows)
        .await
}

/// One row per live user with live ratings: the user, then its ratings' ids, items, values
/// and state numbers ([`STATES`]) as lists in one order. Grouped by the ratings' user
/// (SQLite walks its `(user_id, item_id)` index), and only then joined with the users: a
/// lookup per user, not per rating. A rating in no numbered state (impossible inside the
/// transaction) would have no number and make its user's lists unequal: refused.
fn grouped_ratings_sql(backend: Backend, how: StateNumbers) -> String {
    let number = match how {
        StateNumbers::Case(n) => {
            let arms: String = (0..n)
                .map(|k| {
                    let b = 4 * k;
                    format!(
                        " WHEN r.eps = ${} AND r.spent = ${} AND r.rho = ${} AND r.origin = ${} \
                         THEN {k}",
                        b + 1,
                        b + 2,
                        b + 3,
                        b + 4
                    )
                })
                .collect();
            format!("CASE{arms} END")
        }
        StateNumbers::Join => "s.k".to_string(),
    };
    let (ids, items, values, states) = match backend {
        Backend::Sqlite => (
            "group_concat(r.id, ',')".to_string(),
            "group_concat(r.item_id, char(31))".to_string(),
            "group_concat(r.value, ',')".to_string(),
            format!("group_concat({number}, ',')"),
        ),
        // No `ORDER BY` inside the aggregates: the four lists of a group are built in one
        // pass over its rows, so they are in one order whatever it is, and the builder
        // sorts the ratings by id. Ordering each list sorted every group four times after
        // sorting the table by user (20M ratings: 40 s against 20 s by a hash, cold).
        Backend::Postgres => {
            let agg = |col: &str, sep: &str| format!("string_agg({col}, {sep})");
            (
                agg("CAST(r.id AS TEXT)", "','"),
                agg("r.item_id", "chr(31)"),
                agg("CAST(r.value AS TEXT)", "','"),
                agg(&format!("CAST({number} AS TEXT)"), "','"),
            )
        }
    };
    let (with, join) = match how {
        StateNumbers::Case(_) => (String::new(), ""),
        StateNumbers::Join => (
            format!("WITH s AS ({STATES}) "),
            "JOIN s ON s.eps = r.eps AND s.spent = r.spent AND s.rho = r.rho \
             AND s.origin = r.origin ",
        ),
    };
    format!(
        "{with}SELECT g.user_id, g.ids, g.items, g.vals, g.states FROM \
         (SELECT r.user_id AS user_id, {ids} AS ids, {items} AS items, {values} AS vals, \
          {states} AS states \
          FROM ratings r {join}WHERE r.value IS NOT NULL GROUP BY r.user_id) g \
         JOIN users u ON u.id = g.user_id WHERE u.deleted = 0"
    )
}

/// Parses one user's lists (`ids`, `items`, `values`, `states`) into the builder, each
/// rating's stored state with the user's pending charge sets (`sets`) folded in.
fn push_user(
    b: &mut Builder,
    user: &str,
    [ids, items, values, states]: [&str; 4],
    state_of: &[u32],
    sets: &[PendingSet],
) -> Result<(), StoreError> {
    // Most of a user's ratings have the same stored state and are listed by the same
    // sets: the folded state is made once per (stored state, sets listing the rating).
    let mut folded: Vec<((u32, u64), u32)> = Vec::new();
    let bad = |what: &str| StoreError::Corrupt(format!("snapshot: user {user:?}: bad {what} list"));
    let mut items = items.split(ITEM_SEP);
    let mut values = values.split(',');
    let mut states = states.split(',');
    for id in ids.split(',') {
        let id: i64 = id.parse().map_err(|_| bad("id"))?;
        let item = items.next().ok_or_else(|| bad("item"))?;
        let value: f64 = values
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("value"))?;
        let k: usize = states
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("state"))?;
        let mut state = *state_of.get(k).ok_or_else(|| bad("state"))?;
        if !sets.is_empty() {
            state = fold_state(b, &mut folded, state, id, sets);
        }
        b.push(id, user, item, value, state);
    }
    if items.next().is_some() || values.next().is_some() || states.next().is_some() {
        return Err(bad("length of a"));
    }
    Ok(())
}

/// The index of rating `id`'s state `state` with the `sets` that list it folded in.
fn fold_state(
    b: &mut Builder,
    folded: &mut Vec<((u32, u64), u32)>,
    state: u32,
    id: i64,
    sets: &[PendingSet],
) -> u32 {
    let stored = b.states[state as usize];
    let fold = |b: &mut Builder| {
        let row = Spend {
            spent: stored.spent,
            rho: stored.rho,
            releases: 0,
        };
        let s = row.with(id, sets);
        b.state(RatingState {
            spent: s.spent,
            rho: s.rho,
            ..stored
        })
    };
    // A user with more than 64 pending sets (a user charged by its due releases has at
    // most 8 releases' sets) is folded rating by rating.
    if sets.len() > 64 {
        return fold(b);
    }
    let mask = sets
        .iter()
        .enumerate()
        .filter(|(_, s)| s.lists(id))
        .fold(0u64, |m, (k, _)| m | 1 << k);
    if mask == 0 {
        return state;
    }
    // A user's ratings make a few (state, mask) pairs: a short list, searched.
    if let Some(&(_, k)) = folded.iter().find(|(key, _)| *key == (state, mask)) {
        return k;
    }
    let k = fold(b);
    folded.push(((state, mask), k));
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(id: i64, user: &str, item: &str, eps: f64, ldp: bool) -> RatingInput {
        RatingInput {
            id,
            user: user.into(),
            item: item.into(),
            value: 3.5,
            eps,
            spent: 0.0,
            rho: 0.0,
            ldp,
        }
    }

    /// Names are sorted tables (index order is name order), states are shared by exact
    /// value and origin, ratings come back in id order with everything resolved.
    #[test]
    fn build_interns_names_and_states_and_orders_by_id() {
        let snap = Snapshot::build(
            [
                input(9, "zoe", "b", 1.0, false),
                input(2, "amy", "c", 1.0, false),
                input(5, "zoe", "a", 0.1 + 0.2, false),
                input(7, "amy", "a", 1.0, true),
            ],
            BTreeMap::new(),
            vec![],
        );
        assert_eq!(
            snap.ratings.iter().map(|r| r.id).collect::<Vec<_>>(),
            [2, 5, 7, 9]
        );
        let names: Vec<&str> = snap.user_names.iter().map(|n| &**n).collect();
        assert_eq!(names, ["amy", "zoe"]);
        let items: Vec<&str> = snap.item_names.iter().map(|n| &**n).collect();
        assert_eq!(items, ["a", "b", "c"]);
        assert_eq!(snap.states.len(), 3, "1.0 raw, 0.1 + 0.2 raw, 1.0 ldp");
        let r = snap.get(1);
        assert_eq!((r.id, &**r.user, &**r.item), (5, "zoe", "a"));
        assert_eq!(r.eps.to_bits(), (0.1f64 + 0.2).to_bits(), "exact");
        assert!(snap.get(2).ldp && !snap.get(0).ldp);
        assert_eq!(snap.get(3).value, 3.5);
        let planned: Vec<&str> = snap.plan_inputs().map(|p| p.user).collect();
        assert_eq!(planned, ["amy", "zoe", "amy", "zoe"]);
    }

    #[test]
    fn a_rating_row_is_24_bytes() {
        assert_eq!(std::mem::size_of::<RatingRow>(), 24);
    }

    /// A list that does not parse, or lists of different lengths, are corrupt (never
    /// silently shortened).
    #[test]
    fn grouped_lists_of_different_lengths_are_refused() {
        let mut b = Builder::default();
        let s = b.state(RatingState {
            eps: 1.0,
            spent: 0.0,
            rho: 0.0,
            ldp: false,
        });
        let sep = ITEM_SEP.to_string();
        let items = format!("a{sep}b, c");
        push_user(&mut b, "u", ["1,2", &items, "4,5", "0,0"], &[s], &[]).unwrap();
        let r = b.finish(BTreeMap::new(), vec![]);
        assert_eq!(&**r.get(1).item, "b, c", "commas inside item ids survive");
        let mut b = Builder::default();
        for lists in [
            ["1,2", "a", "4,5", "0,0"],
            ["1", "a", "4,5", "0"],
            ["1", "a", "x", "0"],
            ["1", "a", "4", "3"],
        ] {
            assert!(
                push_user(&mut b, "u", lists, &[s], &[]).is_err(),
                "{lists:?}"
            );
        }
    }
}
