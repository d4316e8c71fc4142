//! PostgreSQL's path of [`super::Store::upsert_ratings`]: each step of the ingestion
//! transaction is one statement over array binds (`UNNEST($1::text[], ...)`), so a batch
//! costs a handful of round trips whatever its size (issue 22 item 1). The chunked
//! multi-row statements SQLite is tuned for (64 rows each, because sqlx binds SQLite
//! parameters by name at O(binds^2)) made a 5,000-rating batch about 150 statements on
//! PostgreSQL, and its import of ML-100K 0.05x SQLite's rate (lab note bench-02).
//!
//! sqlx's `Any` driver binds no arrays, so each array travels as one text parameter in
//! PostgreSQL's array literal form (`{"a","b"}`) and is cast in the SQL (`$1::text[]`);
//! floats are written in Rust's shortest round-trip form, which PostgreSQL reads back to
//! the same f64. Semantics are those of the SQLite path, step for step: the same checks
//! in the same order, the same errors, and rows written in the batch's sorted order
//! (`WITH ORDINALITY ... ORDER BY k`), so row locks are taken in the same order (users by
//! id, then ratings by (user, item)) and new rating ids are assigned in the same order.

use std::collections::BTreeMap;

use sqlx::Row;

use super::{Defaults, NewRating, StoreError, Tx};

/// Writes `items` as a PostgreSQL text array literal: every element double-quoted (so
/// `NULL`, commas and braces are plain text), `"` and `\` escaped with a backslash.
pub(super) fn text_array<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = String::from("{");
    for (k, s) in items.into_iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        out.push('"');
        for c in s.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
    out.push('}');
    out
}

/// Writes `xs` as a PostgreSQL float8 array literal; `{:?}` is the shortest form that
/// reads back to the same f64 (exponent form for very large or small values).
pub(super) fn float_array(xs: impl IntoIterator<Item = f64>) -> String {
    let parts: Vec<String> = xs.into_iter().map(|x| format!("{x:?}")).collect();
    format!("{{{}}}", parts.join(","))
}

/// [`super::catalogue::require_registered`] in one statement: the first of `items` (in
/// the given, sorted, order) that is not registered.
pub(super) async fn require_registered(tx: &mut Tx, items: &[&str]) -> Result<(), StoreError> {
    let missing = sqlx::query(
        "SELECT q.id FROM unnest($1::text[]) WITH ORDINALITY AS q(id, k) \
         WHERE NOT EXISTS (SELECT 1 FROM items i WHERE i.id = q.id) ORDER BY q.k LIMIT 1",
    )
    .bind(text_array(items.iter().copied()))
    .fetch_optional(&mut **tx)
    .await?;
    match missing {
        Some(row) => Err(StoreError::NotInCatalogue(row.try_get(0)?)),
        None => Ok(()),
    }
}

/// [`super::ldp::check_pairs`] in one statement: the first pair of the batch (sorted)
/// that is stored as LDP, or stored at all when the batch sends it as LDP.
pub(super) async fn check_pairs(tx: &mut Tx, rows: &[&NewRating]) -> Result<(), StoreError> {
    let flags: Vec<&str> = rows
        .iter()
        .map(|r| if r.ldp.is_some() { "t" } else { "f" })
        .collect();
    let hit = sqlx::query(
        "SELECT r.user_id, r.item_id, r.origin, q.ldp \
         FROM unnest($1::text[], $2::text[], $3::bool[]) WITH ORDINALITY AS q(u, i, ldp, k) \
         JOIN ratings r ON r.user_id = q.u AND r.item_id = q.i \
         WHERE r.origin = 'ldp' OR q.ldp ORDER BY q.k LIMIT 1",
    )
    .bind(text_array(rows.iter().map(|r| r.user.as_str())))
    .bind(text_array(rows.iter().map(|r| r.item.as_str())))
    .bind(format!("{{{}}}", flags.join(",")))
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = hit else { return Ok(()) };
    let (user, item, origin): (String, String, String) =
        (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
    let ldp_new: bool = row.try_get(3)?;
    match super::ldp::pair_conflict(&user, &item, &origin, ldp_new) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `upsert_users` of the SQLite path in one statement: creates missing users (reviving
/// deleted ones) in id order, and returns every batch user's default rating eps (an
/// upsert's `RETURNING` yields inserted and updated rows alike).
pub(super) async fn upsert_users(
    tx: &mut Tx,
    users: &[&str],
    defaults: Defaults,
    zero: &str,
    now: i64,
) -> Result<BTreeMap<String, Option<f64>>, StoreError> {
    let rows = sqlx::query(
        "INSERT INTO users (id, default_eps, budget_eps, budget_delta, rdp_consumed, \
         deleted, created_at, updated_at) \
         SELECT q.id, NULL::float8, $2, $3, $4, 0, $5, $5 \
         FROM unnest($1::text[]) WITH ORDINALITY AS q(id, k) ORDER BY q.k \
         ON CONFLICT (id) DO UPDATE SET deleted = 0 \
         RETURNING id, default_eps",
    )
    .bind(text_array(users.iter().copied()))
    .bind(defaults.user_eps)
    .bind(defaults.user_delta)
    .bind(zero)
    .bind(now)
    .fetch_all(&mut **tx)
    .await?;
    let mut user_default = BTreeMap::new();
    for row in rows {
        user_default.insert(row.try_get(0)?, row.try_get(1)?);
    }
    Ok(user_default)
}

/// The rating upsert in one statement over the batch's columns; returns the number of
/// new ratings (rows whose `created_at` is this batch's `now`, as on SQLite). `eps`,
/// `spent` and `origin` are resolved by the caller, per row, exactly as on SQLite.
pub(super) async fn insert_ratings(
    tx: &mut Tx,
    rows: &[&NewRating],
    resolved: &[(f64, f64, &str)],
    now: i64,
) -> Result<usize, StoreError> {
    let created: i64 = sqlx::query(
        "WITH up AS (\
         INSERT INTO ratings (user_id, item_id, value, eps, spent, releases, origin, \
         created_at, updated_at) \
         SELECT q.u, q.i, q.v, q.e, q.s, 0, q.o, $7, $7 \
         FROM unnest($1::text[], $2::text[], $3::float8[], $4::float8[], $5::float8[], \
         $6::text[]) WITH ORDINALITY AS q(u, i, v, e, s, o, k) ORDER BY q.k \
         ON CONFLICT (user_id, item_id) DO UPDATE SET value = excluded.value, \
         updated_at = excluded.updated_at RETURNING created_at) \
         SELECT COUNT(*) FROM up WHERE created_at = $7",
    )
    .bind(text_array(rows.iter().map(|r| r.user.as_str())))
    .bind(text_array(rows.iter().map(|r| r.item.as_str())))
    .bind(float_array(rows.iter().map(|r| r.value)))
    .bind(float_array(resolved.iter().map(|x| x.0)))
    .bind(float_array(resolved.iter().map(|x| x.1)))
    .bind(text_array(resolved.iter().map(|x| x.2)))
    .bind(now)
    .fetch_one(&mut **tx)
    .await?
    .try_get(0)?;
    Ok(created as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_literals_quote_and_round_trip() {
        assert_eq!(
            text_array(["a", "b,c", "NULL", "x\"y\\z"]),
            r#"{"a","b,c","NULL","x\"y\\z"}"#
        );
        assert_eq!(text_array(std::iter::empty()), "{}");
        let xs = [4.0, 0.1, 1e-7, 1e300, 2.0 / 3.0];
        let lit = float_array(xs);
        let back: Vec<f64> = lit
            .trim_matches(|c| c == '{' || c == '}')
            .split(',')
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(back, xs);
    }
}
