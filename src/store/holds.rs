//! The hold of a release in flight (migration 0018; docs/LEDGER.md, "Releases in
//! flight").
//!
//! A release admits users from its snapshot and charges them at its commit, seconds to a
//! minute later. In between, a user's budget may be lowered, and LDP ratings and
//! Private-GD reports charge the user's filter. Any of them could leave too little room
//! for the release's charge, and the commit would then have to abort. So before its
//! snapshot the release writes the user-level events it will charge ([`Store::set_hold`]),
//! and each of those three writes reads them first thing in its transaction and is
//! refused (409) when the user's filter, which admitted the held events before the write,
//! would not admit them after it ([`dprec_dp::ledger::keeps_hold`]). The refusal depends
//! only on public values (the held events are calibrated from the configuration and the
//! catalogue's size) and on the user's own state.
//!
//! Lock order on PostgreSQL: the hold's row (a share lock) before any user's row, in
//! every path that reads it; the release writes the hold in a transaction of its own that
//! locks nothing else.

use sqlx::Row;

use super::{Backend, Store, StoreError, Tx};
use dprec_dp::accountant::PrivacyEvent;

impl Store {
    /// Records that `holder`'s release will charge `events` to every user it admits.
    /// Written before the release's snapshot; replaces any earlier hold.
    pub async fn set_hold(&self, holder: &str, events: &[PrivacyEvent]) -> Result<(), StoreError> {
        let json = serde_json::to_string(events).expect("events serialise");
        let _gate = self.write_gate().await;
        let mut tx = self.begin_write().await?;
        sqlx::query("UPDATE release_holds SET holder = $1, events = $2 WHERE id = 1")
            .bind(holder)
            .bind(json)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Ends `holder`'s hold (after its commit, or when its release stops without one).
    pub async fn clear_hold(&self, holder: &str) -> Result<(), StoreError> {
        let _gate = self.write_gate().await;
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "UPDATE release_holds SET holder = '', events = '[]' WHERE id = 1 AND holder = $1",
        )
        .bind(holder)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The catalogue's size (public): what a release's user-level event is calibrated
    /// from, read before its snapshot to write its hold.
    pub async fn item_count(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM items")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok(n.max(0) as u64)
    }

    /// Every live user's budget, as a snapshot reads them (for a release that re-decides
    /// its users after changing its hold).
    pub async fn live_budgets(
        &self,
    ) -> Result<std::collections::BTreeMap<String, dprec_dp::ledger::UserBudget>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let budgets = super::snapshot::live_budgets(&mut tx).await?;
        tx.commit().await?;
        Ok(budgets)
    }

    /// The events held now (empty: no release in flight), outside any transaction.
    pub async fn held_events(&self) -> Result<Vec<PrivacyEvent>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let held = held_events(&mut tx, self.backend).await?;
        tx.commit().await?;
        Ok(held)
    }
}

/// The events held by a release in flight, read inside a write transaction before it
/// locks any user's row (PostgreSQL: with a share lock on the hold, so a release cannot
/// start holding between this read and the transaction's commit). A hold counts only
/// while its holder's trainer lease is live: a release whose process died holds nothing.
pub(super) async fn held_events(
    tx: &mut Tx,
    backend: Backend,
) -> Result<Vec<PrivacyEvent>, StoreError> {
    let lock = match backend {
        Backend::Postgres => " FOR SHARE OF h",
        Backend::Sqlite => "",
    };
    let row = sqlx::query(&format!(
        "SELECT h.holder, h.events, l.expires_at FROM release_holds h \
         LEFT JOIN leases l ON l.name = 'trainer' AND l.holder = h.holder \
         WHERE h.id = 1{lock}"
    ))
    .fetch_optional(&mut **tx)
    .await?;
    let Some(row) = row else {
        return Ok(Vec::new());
    };
    let holder: String = row.try_get(0)?;
    let expires: Option<i64> = row.try_get(2)?;
    let live = !holder.is_empty() && expires.is_some_and(|t| t >= super::now_ms());
    if !live {
        return Ok(Vec::new());
    }
    let events: String = row.try_get(1)?;
    serde_json::from_str(&events)
        .map_err(|e| StoreError::Corrupt(format!("release hold events: {e}")))
}
