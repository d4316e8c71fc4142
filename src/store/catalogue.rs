//! The public item catalogue (DESIGN 6, issue 8 finding 1): items are registered through
//! the API (`POST /v1/admin/items`) or `dprec import`, never created by a rating. A
//! rating of an item outside the catalogue is refused ([`StoreError::NotInCatalogue`]),
//! so the catalogue, and every item list a release publishes, says nothing about who
//! rated what.

use std::collections::BTreeSet;

use sqlx::Row;

use super::placeholders;
use super::{now_ms, Store, StoreError, Tx};

/// Items per multi-row statement (2 binds per row for inserts, 1 per lookup).
const CHUNK: usize = 400;

impl Store {
    /// Registers `items` (idempotent: known ids are left as they are). Returns how many
    /// were new.
    pub async fn register_items(&self, items: &[String]) -> Result<usize, StoreError> {
        let distinct: BTreeSet<&str> = items.iter().map(String::as_str).collect();
        let distinct: Vec<&str> = distinct.into_iter().collect();
        let now = now_ms();
        let _gate = self.write_gate().await;
        let mut tx = self.begin_write().await?;
        let mut created = 0;
        for chunk in distinct.chunks(CHUNK) {
            let sql = format!(
                "INSERT INTO items (id, created_at) VALUES {} ON CONFLICT (id) DO NOTHING",
                placeholders(chunk.len(), 2, |b| format!("(${b}, ${})", b + 1))
            );
            let mut q = sqlx::query(&sql);
            for i in chunk {
                q = q.bind(*i).bind(now);
            }
            created += q.execute(&mut *tx).await?.rows_affected() as usize;
        }
        tx.commit().await?;
        Ok(created)
    }

    /// One page of the catalogue (ids in ascending order) and its size.
    pub async fn catalogue_page(
        &self,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<String>, i64), StoreError> {
        let ids = sqlx::query("SELECT id FROM items ORDER BY id LIMIT $1 OFFSET $2")
            .bind(limit)
            .bind(offset)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<Vec<_>, _>>()?;
        let total: i64 = sqlx::query("SELECT COUNT(*) FROM items")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok((ids, total))
    }

    /// Whether `item` is in the catalogue.
    pub async fn in_catalogue(&self, item: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query("SELECT 1 FROM items WHERE id = $1")
            .bind(item)
            .fetch_optional(&self.pool)
            .await?
            .is_some())
    }
}

/// Fails with [`StoreError::NotInCatalogue`] naming the first of `items` (sorted) that is
/// not registered.
pub(super) async fn require_registered(tx: &mut Tx, items: &[&str]) -> Result<(), StoreError> {
    for chunk in items.chunks(CHUNK) {
        let sql = format!(
            "SELECT id FROM items WHERE id IN ({})",
            placeholders(chunk.len(), 1, |b| format!("${b}"))
        );
        let mut q = sqlx::query(&sql);
        for i in chunk {
            q = q.bind(*i);
        }
        let known: BTreeSet<String> = q
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        if let Some(missing) = chunk.iter().find(|i| !known.contains(**i)) {
            return Err(StoreError::NotInCatalogue((*missing).to_string()));
        }
    }
    Ok(())
}
