//! Releases and their models: the rows and their reads. The one transaction that records
//! a release with its ledger charges (DESIGN 4) is in `commit`, the ledger writes it makes
//! (the re-check, the rating and user charges, the settlements) in `charges`.

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

mod charges;
mod commit;

use charges::*;
pub use commit::*;
