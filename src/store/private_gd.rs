//! Storage of Private-GD rounds and one-bit reports (issue 9), and the per-user ledger
//! charge of each report, written in the same transaction as the report (DESIGN 3).

use sqlx::Row;

use super::{curve_json, now_ms, parse_curve, Defaults, Store, StoreError, Tx};
use crate::ldp::private_gd::Report;
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::ledger::{charge_local, LocalCharge, UserBudget};

/// A stored round.
#[derive(Debug, Clone)]
pub struct LdpRoundRow {
    pub id: i64,
    /// `open` or `closed`.
    pub status: String,
    /// The published state as JSON (see `api::private_gd::PublishedRound`).
    pub state: String,
    pub n_reports: i64,
    pub created_at: i64,
    pub closed_at: Option<i64>,
}

/// Why a report was refused (nothing was stored or charged).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("unknown round {0}")]
    UnknownRound(u64),
    #[error("round {0} is closed")]
    Closed(u64),
    #[error("user {0:?} already reported in round {1}")]
    Duplicate(String, u64),
    #[error("user {0:?} is deleted")]
    Deleted(String),
    #[error("user {0:?}: the RDP budget does not admit another report of eps {1}")]
    Budget(String, f64),
    /// The report would leave too little of the user's budget for the charge of a
    /// release in flight (`store::holds`); it may be sent again once that release has
    /// committed.
    #[error(
        "user {0:?}: a report of eps {1} would leave too little budget for the charge of \
         the release in progress; retry once it has been published"
    )]
    Held(String, f64),
    #[error("{0}")]
    Invalid(crate::ldp::private_gd::ProtocolError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for ReportError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(StoreError::Db(e))
    }
}

/// The state of the next round, computed from the closing round's state and reports.
pub struct NextRound {
    pub state: String,
    pub rows: i64,
    pub rank: i64,
    pub eps_round: f64,
}

fn round_from_row(r: &sqlx::any::AnyRow) -> Result<LdpRoundRow, StoreError> {
    Ok(LdpRoundRow {
        id: r.try_get("id")?,
        status: r.try_get("status")?,
        state: r.try_get("state")?,
        n_reports: r.try_get("n_reports")?,
        created_at: r.try_get("created_at")?,
        closed_at: r.try_get("closed_at")?,
    })
}

const ROUND_COLS: &str = "id, status, state, n_reports, created_at, closed_at";

impl Store {
    /// The open round, if any.
    pub async fn open_ldp_round(&self) -> Result<Option<LdpRoundRow>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {ROUND_COLS} FROM ldp_rounds WHERE status = 'open' ORDER BY id DESC LIMIT 1"
        ))
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(round_from_row).transpose()
    }

    /// The public catalogue (item ids, sorted): the item axis of a new schedule.
    pub async fn catalogue(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query("SELECT id FROM items ORDER BY id")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>(0).map_err(StoreError::from))
            .collect()
    }

    /// Locks the report's round: it must exist and be open, and the report must fit its
    /// dimensions. Returns the round's id and its per-report eps.
    async fn lock_open_round(
        &self,
        tx: &mut Tx,
        report: &Report,
    ) -> Result<(i64, f64), ReportError> {
        let round =
            i64::try_from(report.round).map_err(|_| ReportError::UnknownRound(report.round))?;
        let row = sqlx::query(&format!(
            "SELECT status, report_rows, report_rank, eps_round FROM ldp_rounds WHERE id = $1{}",
            self.for_update()
        ))
        .bind(round)
        .fetch_optional(&mut **tx)
        .await?
        .ok_or(ReportError::UnknownRound(report.round))?;
        let status: String = row.try_get(0)?;
        if status != "open" {
            return Err(ReportError::Closed(report.round));
        }
        let rows: i64 = row.try_get(1)?;
        let rank: i64 = row.try_get(2)?;
        let eps_round: f64 = row.try_get(3)?;
        report
            .validate_dims(report.round, rows as usize, rank as usize)
            .map_err(ReportError::Invalid)?;
        Ok((round, eps_round))
    }

    /// Stores one report and charges its user `PureDp { eps_round }` in one transaction
    /// under the commit lock: the round must be open, the report must fit it, the user
    /// must not have reported in it, and the user's Renyi filter must admit the charge.
    /// A user without a row is created with the service defaults.
    pub async fn submit_ldp_report(
        &self,
        user: &str,
        report: &Report,
        defaults: Defaults,
    ) -> Result<f64, ReportError> {
        let mut tx = self.begin_exclusive().await?;
        // The hold of a release in flight before the user's row (`store::holds`).
        let held = super::holds::held_events(&mut tx, self.backend).await?;
        let (round, eps_round) = self.lock_open_round(&mut tx, report).await?;
        let dup = sqlx::query("SELECT 1 FROM ldp_reports WHERE round_id = $1 AND user_id = $2")
            .bind(round)
            .bind(user)
            .fetch_optional(&mut *tx)
            .await?;
        if dup.is_some() {
            return Err(ReportError::Duplicate(user.to_owned(), report.round));
        }
        let now = now_ms();
        let budget = self.reporting_user(&mut tx, user, defaults, now).await?;
        let event = PrivacyEvent::PureDp {
            eps: eps_round,
            count: 1,
        };
        let accounting = |source| StoreError::Accounting {
            user: user.to_owned(),
            source,
        };
        let next = match charge_local(&budget, &[event], &held).map_err(accounting)? {
            LocalCharge::Charged(next) => next,
            LocalCharge::NoRoom => return Err(ReportError::Budget(user.to_owned(), eps_round)),
            LocalCharge::Held => return Err(ReportError::Held(user.to_owned(), eps_round)),
        };
        sqlx::query("UPDATE users SET rdp_consumed = $2 WHERE id = $1")
            .bind(user)
            .bind(curve_json(&next))
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO ldp_reports (round_id, user_id, row_index, col_index, bit, eps, \
             created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(round)
        .bind(user)
        .bind(i64::from(report.row))
        .bind(i64::from(report.col))
        .bind(i64::from(report.bit))
        .bind(eps_round)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE ldp_rounds SET n_reports = n_reports + 1 WHERE id = $1")
            .bind(round)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(eps_round)
    }

    /// The reporting user's budget, its row locked (created with the service defaults
    /// when missing); a deleted user is refused.
    async fn reporting_user(
        &self,
        tx: &mut Tx,
        user: &str,
        defaults: Defaults,
        now: i64,
    ) -> Result<UserBudget, ReportError> {
        sqlx::query(
            "INSERT INTO users (id, default_eps, budget_eps, budget_delta, rdp_consumed, \
             deleted, created_at, updated_at) VALUES ($1, NULL, $2, $3, '', 0, $4, $4) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(user)
        .bind(defaults.user_eps)
        .bind(defaults.user_delta)
        .bind(now)
        .execute(&mut **tx)
        .await?;
        let u = sqlx::query(&format!(
            "SELECT budget_eps, budget_delta, rdp_consumed, deleted FROM users WHERE id = $1{}",
            self.for_update()
        ))
        .bind(user)
        .fetch_one(&mut **tx)
        .await?;
        let deleted: i64 = u.try_get(3)?;
        if deleted != 0 {
            return Err(ReportError::Deleted(user.to_owned()));
        }
        Ok(UserBudget {
            eps: u.try_get(0)?,
            delta: u.try_get(1)?,
            consumed: parse_curve(&u.try_get::<String, _>(2)?)?,
        })
    }

    /// Opens the first round (when none exists) with `first`'s state.
    pub async fn open_first_ldp_round(&self, first: &NextRound) -> Result<i64, StoreError> {
        let mut tx = self.begin_exclusive().await?;
        let any = sqlx::query("SELECT id FROM ldp_rounds LIMIT 1")
            .fetch_optional(&mut *tx)
            .await?;
        if any.is_some() {
            return Err(StoreError::Corrupt(
                "a Private-GD schedule already exists".into(),
            ));
        }
        insert_round(&mut tx, 1, first).await?;
        tx.commit().await?;
        Ok(1)
    }

    /// Closes the open round `id`: reads its reports `(row, col, bit)` and state inside
    /// the commit lock, lets `next` compute the next round (pure), marks `id` closed and
    /// opens `id + 1`, all in one transaction. Returns the number of reports aggregated.
    pub async fn close_ldp_round<F>(&self, id: i64, next: F) -> Result<i64, StoreError>
    where
        F: FnOnce(&str, &[(i64, i64, i64)]) -> Result<NextRound, String>,
    {
        let mut tx = self.begin_exclusive().await?;
        let row = sqlx::query(&format!(
            "SELECT {ROUND_COLS} FROM ldp_rounds WHERE id = $1{}",
            self.for_update()
        ))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let round = round_from_row(&row)?;
        if round.status != "open" {
            return Err(StoreError::Corrupt(format!("round {id} is not open")));
        }
        let reports: Vec<(i64, i64, i64)> =
            sqlx::query("SELECT row_index, col_index, bit FROM ldp_reports WHERE round_id = $1")
                .bind(id)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
                .collect::<Result<_, sqlx::Error>>()?;
        let n = reports.len() as i64;
        let following = next(&round.state, &reports).map_err(StoreError::Corrupt)?;
        sqlx::query("UPDATE ldp_rounds SET status = 'closed', closed_at = $2 WHERE id = $1")
            .bind(id)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
        insert_round(&mut tx, id + 1, &following).await?;
        tx.commit().await?;
        Ok(n)
    }

    /// A user's reports, newest first: `(round, eps, created_at)` (for the budget audit).
    pub async fn ldp_reports_of(&self, user: &str) -> Result<Vec<(i64, f64, i64)>, StoreError> {
        let rows = sqlx::query(
            "SELECT round_id, eps, created_at FROM ldp_reports WHERE user_id = $1 \
             ORDER BY round_id DESC",
        )
        .bind(user)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::from)
    }
}

async fn insert_round(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    id: i64,
    r: &NextRound,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO ldp_rounds (id, status, state, report_rows, report_rank, eps_round, \
         n_reports, created_at) VALUES ($1, 'open', $2, $3, $4, $5, 0, $6)",
    )
    .bind(id)
    .bind(&r.state)
    .bind(r.rows)
    .bind(r.rank)
    .bind(r.eps_round)
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(())
}
