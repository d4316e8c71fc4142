//! Continual release series (issue 23): the series, its members, the arrival-capped
//! pairs it counts and its tree nodes' noise. What is stored here is exactly what a
//! tick needs to recompute every node from scratch: the admitted pairs with their tick
//! (exact node sums) and each closed node's noise (drawn once, reused after a crash or
//! restart). The logic is pure, in `train::topn::continual`.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::Row;

use super::{now_ms, Backend, OfferMark, Store, StoreError};
use crate::train::topn::continual::SeriesParams;
use dprec_dp::privacy::tree::Node;

/// A series as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesRow {
    pub id: i64,
    pub params: SeriesParams,
    /// The last tick committed (0: none yet).
    pub period: u64,
    /// How far the last tick read (zero before the first tick).
    pub offered: OfferMark,
    pub created_at: i64,
}

/// A series' persistent state: members (true: charged and counted; false: left out for
/// the whole series) and the admitted (user, item) pairs with their tick.
#[derive(Debug, Clone, Default)]
pub struct SeriesState {
    pub members: HashMap<Arc<str>, bool>,
    pub admitted: Vec<(Arc<str>, Arc<str>, u64)>,
}

/// What one tick adds to its series (written after the tick's charges are committed).
#[derive(Debug, Clone, Default)]
pub struct SeriesTick {
    pub period: u64,
    /// How far this tick read: the next tick offers what lies beyond.
    pub offered: OfferMark,
    /// Users decided at this tick: (user, admitted).
    pub members: Vec<(Arc<str>, bool)>,
    /// Pairs admitted at this tick: (user, item, rating id).
    pub admitted: Vec<(Arc<str>, Arc<str>, i64)>,
}

/// Rows per multi-row INSERT of a tick's record on SQLite: its integers (store-assigned
/// ids, the period) are literals and only the user and item ids binds, at most 200 a
/// statement: sqlx binds SQLite parameters by name, and `sqlite3_bind_parameter_name`
/// scans the statement's list, so a statement's binds cost O(binds^2). With 5 binds a row
/// and 200 rows a statement, recording a first tick's 2.2M admitted pairs at 20M ratings
/// took 21 s (13 s now, lab note bench-03).
const INSERT_ROWS: usize = 100;

fn bad(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("release series: {e}"))
}

impl Store {
    /// The newest series (complete or not), if any.
    pub async fn latest_series(&self) -> Result<Option<SeriesRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, params, period, created_at, offered_id, offered_at FROM release_series \
             ORDER BY id DESC LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let params: String = r.try_get(1)?;
            Ok(SeriesRow {
                id: r.try_get(0)?,
                params: serde_json::from_str(&params).map_err(bad)?,
                period: r.try_get::<i64, _>(2)? as u64,
                offered: OfferMark {
                    id: r.try_get(4)?,
                    at: r.try_get(5)?,
                },
                created_at: r.try_get(3)?,
            })
        })
        .transpose()
    }

    /// Starts a series with `params` (period 0).
    pub async fn start_series(&self, params: &SeriesParams) -> Result<SeriesRow, StoreError> {
        let at = now_ms();
        let json = serde_json::to_string(params).map_err(bad)?;
        let r = sqlx::query(
            "INSERT INTO release_series (params, period, created_at) VALUES ($1, 0, $2) \
             RETURNING id",
        )
        .bind(&json)
        .bind(at)
        .fetch_one(&self.pool)
        .await?;
        Ok(SeriesRow {
            id: r.try_get(0)?,
            params: *params,
            period: 0,
            offered: OfferMark::default(),
            created_at: at,
        })
    }

    /// The members and admitted pairs of series `id`.
    pub async fn series_state(&self, id: i64) -> Result<SeriesState, StoreError> {
        let mut ids: HashMap<String, Arc<str>> = HashMap::new();
        let mut intern = |s: String| -> Arc<str> {
            ids.entry(s.clone())
                .or_insert_with(|| Arc::from(s.as_str()))
                .clone()
        };
        let mut state = SeriesState::default();
        for r in sqlx::query("SELECT user_id, admitted FROM series_members WHERE series_id = $1")
            .bind(id)
            .fetch_all(&self.pool)
            .await?
        {
            let admitted: i64 = r.try_get(1)?;
            state.members.insert(intern(r.try_get(0)?), admitted != 0);
        }
        for r in
            sqlx::query("SELECT user_id, item_id, period FROM series_admitted WHERE series_id = $1")
                .bind(id)
                .fetch_all(&self.pool)
                .await?
        {
            let period: i64 = r.try_get(2)?;
            state
                .admitted
                .push((intern(r.try_get(0)?), intern(r.try_get(1)?), period as u64));
        }
        Ok(state)
    }

    /// Whether series `id` decided `user`: `(tick, admitted)`.
    pub async fn series_member(
        &self,
        id: i64,
        user: &str,
    ) -> Result<Option<(u64, bool)>, StoreError> {
        let row = sqlx::query(
            "SELECT joined_period, admitted FROM series_members \
             WHERE series_id = $1 AND user_id = $2",
        )
        .bind(id)
        .bind(user)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let t: i64 = r.try_get(0)?;
            let admitted: i64 = r.try_get(1)?;
            Ok((t as u64, admitted != 0))
        })
        .transpose()
    }

    /// The stored noise of `node` of series `id`, if it was drawn.
    pub async fn node_noise(
        &self,
        id: i64,
        node: Node,
    ) -> Result<Option<HashMap<String, i64>>, StoreError> {
        let row = sqlx::query(
            "SELECT noise FROM series_nodes WHERE series_id = $1 AND level = $2 \
             AND node_index = $3",
        )
        .bind(id)
        .bind(i64::from(node.level))
        .bind(node.index as i64)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            let json: String = r.try_get(0)?;
            serde_json::from_str(&json).map_err(bad)
        })
        .transpose()
    }

    /// Stores `noise` for `node` unless a noise is stored already, and returns the stored
    /// one: a node's noise is drawn once, whoever draws first (a crashed earlier attempt,
    /// another replica) wins, and everything published uses what is stored.
    pub async fn store_node_noise(
        &self,
        id: i64,
        node: Node,
        noise: &HashMap<String, i64>,
    ) -> Result<HashMap<String, i64>, StoreError> {
        let json = serde_json::to_string(noise).map_err(bad)?;
        sqlx::query(
            "INSERT INTO series_nodes (series_id, level, node_index, noise, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (series_id, level, node_index) DO NOTHING",
        )
        .bind(id)
        .bind(i64::from(node.level))
        .bind(node.index as i64)
        .bind(&json)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        self.node_noise(id, node)
            .await?
            .ok_or_else(|| bad("a stored node noise vanished"))
    }

    /// Adds `fresh` noise for items `node` has none for, storing the node if it is new,
    /// and returns the stored noise. Entries already stored are never changed (the first
    /// draw wins), so a crashed attempt's noise is reused and a concurrent draw for the
    /// same items is discarded.
    pub async fn add_node_noise(
        &self,
        id: i64,
        node: Node,
        fresh: &HashMap<String, i64>,
    ) -> Result<HashMap<String, i64>, StoreError> {
        let stored = self.store_node_noise(id, node, fresh).await?;
        if fresh.keys().all(|k| stored.contains_key(k)) {
            return Ok(stored);
        }
        let mut merged = fresh.clone();
        merged.extend(stored);
        let json = serde_json::to_string(&merged).map_err(bad)?;
        sqlx::query(
            "UPDATE series_nodes SET noise = $4 WHERE series_id = $1 AND level = $2 \
             AND node_index = $3",
        )
        .bind(id)
        .bind(i64::from(node.level))
        .bind(node.index as i64)
        .bind(&json)
        .execute(&self.pool)
        .await?;
        Ok(merged)
    }

    /// Records tick `tick.period` of series `id` in one transaction: its members, its
    /// admitted pairs, the new period and how far it read, and forgets the nodes no later
    /// tick needs. Refused unless the stored period is the one before (a tick is recorded
    /// once).
    pub async fn advance_series(&self, id: i64, tick: &SeriesTick) -> Result<(), StoreError> {
        let _gate = self.write_gate().await;
        let mut tx = self.begin_write().await?;
        let moved = sqlx::query(
            "UPDATE release_series SET period = $2, offered_id = $4, offered_at = $5 \
             WHERE id = $1 AND period = $3",
        )
        .bind(id)
        .bind(tick.period as i64)
        .bind(tick.period as i64 - 1)
        .bind(tick.offered.id)
        .bind(tick.offered.at)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if moved != 1 {
            return Err(StoreError::Conflict(format!(
                "series {id} is not at period {}",
                tick.period - 1
            )));
        }
        let t = tick.period as i64;
        if self.backend() == Backend::Postgres {
            record_tick_pg(&mut tx, id, t, tick).await?;
        } else {
            record_tick_sqlite(&mut tx, id, t, tick).await?;
        }
        // Nodes no later tick uses (`continual::node_retired`): keeps O(levels)
        // noise vectors per series instead of 2T - 1.
        sqlx::query(
            "DELETE FROM series_nodes WHERE series_id = $1 \
             AND ((node_index + 2) << CAST(level AS INTEGER)) <= $2",
        )
        .bind(id)
        .bind(t + 1)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// A tick's members and admitted pairs on SQLite: multi-row statements of
/// [`INSERT_ROWS`] rows, the integers as literals (store-assigned numbers).
async fn record_tick_sqlite(
    tx: &mut super::Tx,
    id: i64,
    t: i64,
    tick: &SeriesTick,
) -> Result<(), StoreError> {
    for chunk in tick.members.chunks(INSERT_ROWS) {
        let rows: Vec<String> = (0..chunk.len())
            .map(|k| format!("({id}, ${}, {t}, {})", k + 1, i64::from(chunk[k].1)))
            .collect();
        let sql = format!(
            "INSERT INTO series_members (series_id, user_id, joined_period, admitted) \
             VALUES {} ON CONFLICT (series_id, user_id) DO NOTHING",
            rows.join(", ")
        );
        let mut q = sqlx::query(&sql).persistent(false);
        for (user, _) in chunk {
            q = q.bind(&**user);
        }
        q.execute(&mut **tx).await?;
    }
    for chunk in tick.admitted.chunks(INSERT_ROWS) {
        let rows: Vec<String> = (0..chunk.len())
            .map(|k| {
                format!(
                    "({id}, ${}, ${}, {}, {t})",
                    2 * k + 1,
                    2 * k + 2,
                    chunk[k].2
                )
            })
            .collect();
        let sql = format!(
            "INSERT INTO series_admitted (series_id, user_id, item_id, rating_id, period) \
             VALUES {} ON CONFLICT (series_id, user_id, item_id) DO NOTHING",
            rows.join(", ")
        );
        let mut q = sqlx::query(&sql).persistent(false);
        for (user, item, _) in chunk {
            q = q.bind(&**user).bind(&**item);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Rows per statement of [`record_tick_pg`] (each column one array parameter).
const PG_ARRAY_ROWS: usize = 20_000;

/// A tick's members and admitted pairs on PostgreSQL: one statement per
/// [`PG_ARRAY_ROWS`] rows over array parameters (`unnest`), as ingestion writes
/// (`store::ratings_pg`); 100-row statements with literals were parsed one by one (23 s
/// for 2.2M pairs at 20M ratings against 16 s with binds, lab note bench-03).
async fn record_tick_pg(
    tx: &mut super::Tx,
    id: i64,
    t: i64,
    tick: &SeriesTick,
) -> Result<(), StoreError> {
    use super::ratings_pg::text_array;
    let ints = |xs: &mut dyn Iterator<Item = i64>| {
        format!(
            "{{{}}}",
            xs.map(|x| x.to_string()).collect::<Vec<_>>().join(",")
        )
    };
    for chunk in tick.members.chunks(PG_ARRAY_ROWS) {
        sqlx::query(
            "INSERT INTO series_members (series_id, user_id, joined_period, admitted) \
             SELECT $1, q.u, $2, q.a FROM unnest($3::text[], $4::bigint[]) AS q(u, a) \
             ON CONFLICT (series_id, user_id) DO NOTHING",
        )
        .bind(id)
        .bind(t)
        .bind(text_array(chunk.iter().map(|(u, _)| &**u)))
        .bind(ints(&mut chunk.iter().map(|(_, a)| i64::from(*a))))
        .execute(&mut **tx)
        .await?;
    }
    for chunk in tick.admitted.chunks(PG_ARRAY_ROWS) {
        sqlx::query(
            "INSERT INTO series_admitted (series_id, user_id, item_id, rating_id, period) \
             SELECT $1, q.u, q.i, q.r, $2 \
             FROM unnest($3::text[], $4::text[], $5::bigint[]) AS q(u, i, r) \
             ON CONFLICT (series_id, user_id, item_id) DO NOTHING",
        )
        .bind(id)
        .bind(t)
        .bind(text_array(chunk.iter().map(|(u, _, _)| &**u)))
        .bind(text_array(chunk.iter().map(|(_, i, _)| &**i)))
        .bind(ints(&mut chunk.iter().map(|(_, _, r)| *r)))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
