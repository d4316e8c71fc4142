//! PostgreSQL computes a `dp-topn` release's sums (issue 22 item 3, docs/SCALING.md): the
//! per-user cap by the release's keyed hash (HMAC-SHA256 from `sha256()` in SQL, the
//! digest of [`SubsetKey::digest`]), the clipped weights, the count sums (`GROUP BY
//! item`) and the Gram over the candidates (a self-join of each user's candidate items),
//! all as SQL aggregates; the service only adds the noise and post-processes
//! ([`crate::train::topn::dp_topn::DpTopN::release_with_source`]).
//!
//! The sums are the exact ones of [`crate::train::topn::suffstats`]: the counts are
//! integers (equal), the Gram entries and the trace floats summed in the database's order
//! (within [`GramSums::tolerance`]). A source is one table of `(user_id, item_id, value)`
//! rows (a partition of a hash-partitioned table, a shard) holding a release's admitted
//! ratings: the sums of any partition of the users merge to the whole's. There is no
//! source over the live `ratings` table: it would skip admission (exhausted ratings,
//! full filters, ratings after the snapshot, RSM sampling) and a release over it would
//! publish uncharged sums (issue 44, 2.6).
//!
//! Only PostgreSQL: SQLite computes the same sums in process (`suffstats::InProcess`, in shards or not).
//! The RSM coin flips of step 1 are not done here: the database path counts every rating
//! of its source in full (rate 1), which is what the trainer does when every rating's
//! ledger affords full participation; a source for RSM-sampled ratings needs their rates
//! in the database (docs/SCALING.md, "What is left").

use std::collections::HashMap;

use sqlx::AnyPool;
use sqlx::Row;

use crate::train::topn::contribution::Contribution;
use crate::train::topn::suffstats::{CountSums, GramSums, StatsSource, SubsetKey};
use crate::train::TrainError;

/// Where the ratings are read from.
#[derive(Debug, Clone)]
pub enum PgSource {
    /// A table (or partition) with `user_id` and `item_id` text columns and a `value`
    /// (float8, not null); its name is checked to be a plain identifier
    /// (`[a-z_][a-z0-9_]*`).
    Table(String),
}

impl PgSource {
    fn relation(&self) -> Result<String, TrainError> {
        match self {
            PgSource::Table(t) => {
                let ok = t
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                    && t.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if ok {
                    Ok(t.clone())
                } else {
                    Err(TrainError::Source(format!(
                        "{t:?} is not a plain table name"
                    )))
                }
            }
        }
    }
}

/// The capped rows as SQL: `kept(user_id, item_id, value, m)` with `m` the user's capped row
/// length. Users within the cap keep every rating without hashing; the others their
/// `$2` ratings with the smallest digests `sha256($5 || sha256($1 || be32(len) || user ||
/// item))`, i.e. HMAC-SHA256 with `$1`, `$5` the key's padded blocks
/// ([`SubsetKey::pads`]).
fn kept_sql(src: &str) -> String {
    format!(
        "n AS (SELECT user_id, count(*)::int8 AS n FROM {src} s GROUP BY user_id), \
         kept AS ( \
           SELECT s.user_id, s.item_id, s.value, n.n AS m FROM {src} s JOIN n USING (user_id) \
             WHERE n.n <= $2 \
           UNION ALL \
           SELECT user_id, item_id, value, $2::int8 AS m FROM ( \
             SELECT s.user_id, s.item_id, s.value, row_number() OVER ( \
               PARTITION BY s.user_id ORDER BY sha256($5 || sha256($1 \
                 || int4send(octet_length(convert_to(s.user_id, 'UTF8'))) \
                 || convert_to(s.user_id, 'UTF8') || convert_to(s.item_id, 'UTF8')))) AS rk \
             FROM {src} s JOIN n USING (user_id) WHERE n.n > $2) x \
           WHERE rk <= $2)"
    )
}

/// The users' candidate rows: `kc(user_id, pos)` and `w(user_id, m)`, `m` the number of
/// the user's capped items among the candidates (`$4`: JSON array of item ids).
fn candidate_sql(src: &str) -> String {
    format!(
        "{}, \
         cand AS (SELECT value AS item_id, (ordinality - 1)::int4 AS pos \
           FROM json_array_elements_text($4::json) WITH ORDINALITY), \
         kc AS (SELECT k.user_id, c.pos FROM kept k JOIN cand c USING (item_id)), \
         w AS (SELECT user_id, count(*)::int8 AS m FROM kc GROUP BY user_id)",
        kept_sql(src)
    )
}

/// The count sums of a source: per item id, the sum over its users of the weighted units
/// of [`crate::train::topn::suffstats::weighted_count_units`] (`floor(s 2^bits)` for a
/// liked rating, `floor(omega s 2^bits)` for one below `liked_min`, `s = min(1, clip /
/// sqrt(liked + omega^2 unliked))`: the same float operations in the same order).
pub async fn count_sums(
    pool: &AnyPool,
    src: &PgSource,
    key: &SubsetKey,
    c: &Contribution,
    bits: u32,
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let sql = format!(
        "WITH {}, \
         ko AS (SELECT user_id, (count(*) FILTER (WHERE value < $6))::int8 AS o \
           FROM kept GROUP BY user_id), \
         ks AS (SELECT k.item_id, k.value < $6 AS below, least(1.0::float8, $3::float8 \
           / sqrt((k.m - ko.o)::float8 + $7::float8 * $7::float8 * ko.o::float8)) AS s \
           FROM kept k JOIN ko USING (user_id)) \
         SELECT item_id, sum(CASE WHEN below THEN floor($7::float8 * s * $4::float8) \
           ELSE floor(s * $4::float8) END)::int8 \
         FROM ks GROUP BY item_id",
        kept_sql(
            &src.relation()
                .map_err(|e| sqlx::Error::Protocol(e.to_string()))?
        )
    );
    let rows = sqlx::query(&sql)
        .bind(key.pads().0.to_vec())
        .bind(c.cap as i64)
        .bind(c.count_clip)
        .bind((1u64 << bits) as f64)
        .bind(key.pads().1.to_vec())
        .bind(c.liked_min.unwrap_or(f64::NEG_INFINITY))
        .bind(c.unliked_weight)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}

/// The trace statistic over the candidates: `(sum_u min(m_u, clip^2), users)`.
pub async fn trace(
    pool: &AnyPool,
    src: &PgSource,
    key: &SubsetKey,
    c: &Contribution,
    candidates: &[&str],
) -> Result<(f64, i64), sqlx::Error> {
    let sql = format!(
        "WITH {} SELECT coalesce(sum(least(m::float8, $3::float8 * $3::float8)), 0)::float8, \
           count(*)::int8 FROM w",
        candidate_sql(
            &src.relation()
                .map_err(|e| sqlx::Error::Protocol(e.to_string()))?
        )
    );
    let row = sqlx::query(&sql)
        .bind(key.pads().0.to_vec())
        .bind(c.cap as i64)
        .bind(c.gram_clip)
        .bind(serde_json::to_string(candidates).expect("ids serialise"))
        .bind(key.pads().1.to_vec())
        .fetch_one(pool)
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// The Gram sums over the candidates (positions in `candidates`) and the trace.
pub async fn gram_sums(
    pool: &AnyPool,
    src: &PgSource,
    key: &SubsetKey,
    c: &Contribution,
    candidates: &[&str],
) -> Result<GramSums, sqlx::Error> {
    let sql = format!(
        "WITH {}, \
         ww AS (SELECT user_id, w * w AS w2 FROM ( \
           SELECT user_id, least(1.0::float8, $3::float8 / sqrt(m::float8)) AS w FROM w) x) \
         SELECT a.pos, b.pos, sum(ww.w2)::float8 FROM kc a \
           JOIN kc b ON b.user_id = a.user_id AND a.pos <= b.pos \
           JOIN ww ON ww.user_id = a.user_id \
         GROUP BY a.pos, b.pos",
        candidate_sql(
            &src.relation()
                .map_err(|e| sqlx::Error::Protocol(e.to_string()))?
        )
    );
    let k = candidates.len();
    let mut g = GramSums::zeros(k);
    let rows = sqlx::query(&sql)
        .bind(key.pads().0.to_vec())
        .bind(c.cap as i64)
        .bind(c.gram_clip)
        .bind(serde_json::to_string(candidates).expect("ids serialise"))
        .bind(key.pads().1.to_vec())
        .fetch_all(pool)
        .await?;
    for r in &rows {
        let (a, b): (i32, i32) = (r.try_get(0)?, r.try_get(1)?);
        g.upper[a as usize * k + b as usize] = r.try_get(2)?;
    }
    let (t, users) = trace(pool, src, key, c, candidates).await?;
    g.trace = t;
    g.users = users as u64;
    Ok(g)
}

/// A [`StatsSource`] over PostgreSQL shards, for the trainer (which runs off the async
/// runtime, in `spawn_blocking`): each call runs the shards' queries concurrently on the
/// runtime of `handle`, maps item ids to the trainer's indices and merges the parts.
pub struct PgStats<'a> {
    pub pool: &'a AnyPool,
    pub shards: Vec<PgSource>,
    /// The trainer's item ids by index.
    pub items: &'a [String],
    pub handle: tokio::runtime::Handle,
}

fn db(e: sqlx::Error) -> TrainError {
    TrainError::Source(e.to_string())
}

impl PgStats<'_> {
    fn index(&self) -> HashMap<&str, u32> {
        (self.items.iter().enumerate())
            .map(|(j, s)| (s.as_str(), j as u32))
            .collect()
    }

    /// One query per shard, run concurrently (the pool's connections), waited for here.
    fn each<'s, T, F, Fut>(&'s self, query: F) -> Result<Vec<T>, TrainError>
    where
        F: Fn(&'s PgSource) -> Fut,
        Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
    {
        let all = futures_util::future::try_join_all(self.shards.iter().map(query));
        self.handle.block_on(all).map_err(db)
    }

    fn labels(&self, candidates: &[u32]) -> Vec<&str> {
        candidates
            .iter()
            .map(|&j| self.items[j as usize].as_str())
            .collect()
    }
}

impl StatsSource for PgStats<'_> {
    fn count_sums(
        &self,
        key: &SubsetKey,
        c: &Contribution,
        bits: u32,
    ) -> Result<CountSums, TrainError> {
        let parts = self.each(|s| count_sums(self.pool, s, key, c, bits))?;
        let index = self.index();
        let mut sums = CountSums::zeros(self.items.len(), bits);
        for (item, units) in parts.into_iter().flatten() {
            let j = index.get(item.as_str()).ok_or_else(|| {
                TrainError::Source(format!("item {item:?} is not in the training set"))
            })?;
            sums.units[*j as usize] += units;
        }
        Ok(sums)
    }

    fn trace(
        &self,
        key: &SubsetKey,
        c: &Contribution,
        candidates: &[u32],
    ) -> Result<f64, TrainError> {
        let labels = self.labels(candidates);
        let parts = self.each(|s| trace(self.pool, s, key, c, &labels))?;
        Ok(parts.iter().map(|(t, _)| t).sum())
    }

    fn gram_sums(
        &self,
        key: &SubsetKey,
        c: &Contribution,
        candidates: &[u32],
    ) -> Result<GramSums, TrainError> {
        let labels = self.labels(candidates);
        let parts = self.each(|s| gram_sums(self.pool, s, key, c, &labels))?;
        let zero = GramSums::zeros(candidates.len());
        Ok(parts.iter().fold(zero, |a, b| a.merge(b)))
    }
}

#[cfg(test)]
mod tests {
    /// Issue 44 (2.6): no query of this module reads the live `ratings` or `users`
    /// tables, whose rows include ratings the release's admission left out; a source is
    /// only a table of admitted rows.
    #[test]
    fn no_source_reads_the_live_ratings() {
        let code = include_str!("suffstats_pg.rs");
        let code = &code[..code.find("#[cfg(test)]").unwrap()];
        for table in ["ratings", "users"] {
            for kw in ["FROM", "JOIN"] {
                let needle = format!("{kw} {table} ");
                assert!(!code.contains(&needle), "{needle:?} in suffstats_pg.rs");
            }
        }
    }
}
