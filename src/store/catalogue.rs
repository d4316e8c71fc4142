//! The public item catalogue (DESIGN 6, issue 8 finding 1): items are registered through
//! the API (`POST /v1/admin/items`) or `dprec import`, never created by a rating. A
//! rating of an item outside the catalogue is refused ([`StoreError::NotInCatalogue`]),
//! so the catalogue, and every item list a release publishes, says nothing about who
//! rated what. An item's public information (a title, labels) is kept in its row, the
//! labels as a JSON array (migration 0020 says why).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sqlx::Row;

use super::placeholders;
use super::{now_ms, Store, StoreError, Tx};
use crate::model::catalogue::ItemInfo;

/// Items per multi-row statement (2 binds per row for inserts, 1 per lookup; half as
/// many rows for the 4 binds of an upsert with information).
const CHUNK: usize = 400;

/// What a registration did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Registered {
    /// Items that were not in the catalogue.
    pub created: usize,
    /// Known items whose title or labels changed.
    pub updated: usize,
}

impl Store {
    /// Registers `items` (idempotent: known ids are left as they are, their information
    /// too). Returns how many were new.
    pub async fn register_items(&self, items: &[String]) -> Result<usize, StoreError> {
        Ok(self.register_item_info(items, &[]).await?.created)
    }

    /// Registers `plain` ids as [`Store::register_items`] does, and `infos` with their
    /// public information: a new item is created with it, a known one gets it (its title
    /// and labels replaced, so an info with no title or labels clears them). An id in
    /// both lists is registered with its information; of two infos for one id, the last
    /// counts.
    pub async fn register_item_info(
        &self,
        plain: &[String],
        infos: &[ItemInfo],
    ) -> Result<Registered, StoreError> {
        let stated: BTreeMap<&str, &ItemInfo> = infos.iter().map(|i| (i.id.as_str(), i)).collect();
        let plain: Vec<&str> = plain
            .iter()
            .map(String::as_str)
            .filter(|i| !stated.contains_key(i))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let now = now_ms();
        let _gate = self.write_gate().await;
        let mut tx = self.begin_write().await?;
        let mut done = Registered {
            created: insert_ids(&mut tx, &plain, now).await?,
            updated: 0,
        };
        let ids: Vec<&str> = stated.keys().copied().collect();
        let known = read_info(&mut tx, &ids).await?;
        let mut changed = Vec::new();
        for info in stated.values() {
            match known.get(&info.id) {
                None => done.created += 1,
                Some(k) if k != *info => done.updated += 1,
                Some(_) => continue,
            }
            changed.push(*info);
        }
        upsert_info(&mut tx, &changed, now).await?;
        tx.commit().await?;
        Ok(done)
    }

    /// One page of the catalogue (ascending ids) with each item's information, and the
    /// catalogue's size.
    pub async fn catalogue_page(
        &self,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<ItemInfo>, i64), StoreError> {
        let rows =
            sqlx::query("SELECT id, title, labels FROM items ORDER BY id LIMIT $1 OFFSET $2")
                .bind(limit)
                .bind(offset)
                .fetch_all(&self.pool)
                .await?;
        let items = rows
            .iter()
            .map(info_of_row)
            .collect::<Result<Vec<_>, _>>()?;
        let total: i64 = sqlx::query("SELECT COUNT(*) FROM items")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok((items, total))
    }

    /// Every catalogue item with its information, in ascending id order.
    pub async fn catalogue_info(&self) -> Result<Vec<ItemInfo>, StoreError> {
        sqlx::query("SELECT id, title, labels FROM items ORDER BY id")
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(info_of_row)
            .collect()
    }

    /// The catalogue items registered at or after `since_ms` (a release's start: the items
    /// a release may not hold), with their information, in ascending id order.
    pub async fn items_registered_since(&self, since_ms: i64) -> Result<Vec<ItemInfo>, StoreError> {
        sqlx::query("SELECT id, title, labels FROM items WHERE created_at >= $1 ORDER BY id")
            .bind(since_ms)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(info_of_row)
            .collect()
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

/// Inserts `ids` without information, leaving known ones as they are; how many were new.
async fn insert_ids(tx: &mut Tx, ids: &[&str], now: i64) -> Result<usize, StoreError> {
    let mut created = 0;
    for chunk in ids.chunks(CHUNK) {
        let sql = format!(
            "INSERT INTO items (id, created_at) VALUES {} ON CONFLICT (id) DO NOTHING",
            placeholders(chunk.len(), 2, |b| format!("(${b}, ${})", b + 1))
        );
        let mut q = sqlx::query(&sql);
        for i in chunk {
            q = q.bind(*i).bind(now);
        }
        created += q.execute(&mut **tx).await?.rows_affected() as usize;
    }
    Ok(created)
}

/// The stored information of those of `ids` that are registered.
async fn read_info(tx: &mut Tx, ids: &[&str]) -> Result<HashMap<String, ItemInfo>, StoreError> {
    let mut out = HashMap::new();
    for chunk in ids.chunks(CHUNK) {
        let sql = format!(
            "SELECT id, title, labels FROM items WHERE id IN ({})",
            placeholders(chunk.len(), 1, |b| format!("${b}"))
        );
        let mut q = sqlx::query(&sql);
        for i in chunk {
            q = q.bind(*i);
        }
        for row in q.fetch_all(&mut **tx).await? {
            let info = info_of_row(&row)?;
            out.insert(info.id.clone(), info);
        }
    }
    Ok(out)
}

/// Inserts `items` with their information, or replaces the title and labels of those
/// already registered (their `created_at` stays).
async fn upsert_info(tx: &mut Tx, items: &[&ItemInfo], now: i64) -> Result<(), StoreError> {
    for chunk in items.chunks(CHUNK / 2) {
        let sql = format!(
            "INSERT INTO items (id, created_at, title, labels) VALUES {} \
             ON CONFLICT (id) DO UPDATE SET title = excluded.title, labels = excluded.labels",
            placeholders(chunk.len(), 4, |b| format!(
                "(${b}, ${}, ${}, ${})",
                b + 1,
                b + 2,
                b + 3
            ))
        );
        let mut q = sqlx::query(&sql);
        for i in chunk {
            let labels = serde_json::to_string(&i.labels).expect("strings serialise");
            q = q
                .bind(i.id.as_str())
                .bind(now)
                .bind(i.title.as_deref())
                .bind(labels);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// An item from a row `(id, title, labels)`.
fn info_of_row(row: &sqlx::any::AnyRow) -> Result<ItemInfo, StoreError> {
    let id: String = row.try_get(0)?;
    let labels: String = row.try_get(2)?;
    let labels = serde_json::from_str(&labels)
        .map_err(|e| StoreError::Corrupt(format!("labels of item {id:?}: {e}")))?;
    Ok(ItemInfo {
        title: row.try_get(1)?,
        labels,
        id,
    })
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
