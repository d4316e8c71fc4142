//! The ledger writes of a commit's transactions: the re-check of every charge against
//! the stored state, the rating charge sets, the settlements and the user charges.

use super::*;

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
/// its ratings stored as runs of ids ([`crate::store::id_runs`], migration 0012), and settle the
/// users this release is due to settle (write their folded rows, [`crate::store::pending`]); the
/// other charged ratings' rows are not written: their sets are their new spend. The state
/// is the one the release was planned from (`planned`, when the ledger clock shows that
/// nothing else was committed since the snapshot), else the stored rows with the users'
/// pending sets folded in. Binds grow with users, not with ratings.
#[allow(clippy::too_many_arguments)]
pub(super) async fn charge_ratings(
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
pub(super) async fn charge_users(
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
