//! Reading users' budget rows (`users.budget_eps`, `budget_delta`, `rdp_consumed`) into
//! the ledger's `UserBudget`s: for settings changes, snapshots and continual ticks.

use std::collections::{BTreeMap, HashMap};

use dprec_dp::accountant::RdpCurve;
use dprec_dp::ledger::UserBudget;
use sqlx::Row;

use super::{parse_curve, StoreError};

/// Reads users' `(id, budget_eps, budget_delta, rdp_consumed)` rows as `(id, budget)`,
/// one stored curve text parsed once and shared by every user who has it (users who took
/// part in the same releases have the same curve): at 138,493 users a curve each was 346
/// MB of a release's snapshot, and 15 GB at 6M users.
#[derive(Default)]
pub(super) struct BudgetReader {
    curves: HashMap<String, RdpCurve>,
}

impl BudgetReader {
    pub(super) fn row(
        &mut self,
        r: &sqlx::any::AnyRow,
    ) -> Result<(String, UserBudget), StoreError> {
        let text: &str = r.try_get(3)?;
        let consumed = match self.curves.get(text) {
            Some(c) => c.clone(),
            None => {
                let c = parse_curve(text)?;
                self.curves.insert(text.to_owned(), c.clone());
                c
            }
        };
        Ok((
            r.try_get(0)?,
            UserBudget {
                eps: r.try_get(1)?,
                delta: r.try_get(2)?,
                consumed,
            },
        ))
    }

    /// Every row of a query's stream, as it passes (the texts are not all held at once).
    pub(super) async fn read_all<S>(
        &mut self,
        rows: &mut S,
    ) -> Result<BTreeMap<String, UserBudget>, StoreError>
    where
        S: futures_util::Stream<Item = Result<sqlx::any::AnyRow, sqlx::Error>> + Unpin,
    {
        use futures_util::TryStreamExt;
        let mut out = BTreeMap::new();
        while let Some(r) = rows.try_next().await? {
            let (id, b) = self.row(&r)?;
            out.insert(id, b);
        }
        Ok(out)
    }
}
