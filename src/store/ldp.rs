//! Ingestion of locally perturbed (LDP) ratings: the checks and the user-level charge
//! that run inside the ingestion transaction of [`super::Store::upsert_ratings`].
//!
//! An LDP rating is stored with `origin = 'ldp'`, `eps = spent = ` its local eps: the
//! rating-level charge is made once, at ingestion, and the slot has nothing left, so no
//! release admits it again (central trainers skip it; DESIGN 3, LDP). The user-level
//! charge is the composition of the user's new LDP ratings (`PureDp { eps }` each) added
//! to the user's RDP ledger after the user's Renyi filter admits it. A pair that already
//! has a rating cannot be sent as LDP, and an LDP pair cannot be re-rated (either would
//! mix a raw and a perturbed value, or need a second charge the client never agreed to).

use std::collections::BTreeMap;

use sqlx::Row;

use super::{curve_json, parse_curve, NewRating, StoreError, Tx};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::ledger::{charge_local, pure_events, LocalCharge, UserBudget};

/// Rows per lookup of existing pairs (2 binds per row; small for the reason given at
/// `ratings::UPSERT_CHUNK`).
const PAIR_CHUNK: usize = 128;

/// Fails with [`StoreError::Conflict`] when a new LDP rating hits an existing pair, or
/// any new rating hits an existing LDP pair.
pub(super) async fn check_pairs(tx: &mut Tx, rows: &[&NewRating]) -> Result<(), StoreError> {
    let new_ldp: BTreeMap<(&str, &str), bool> = rows
        .iter()
        .map(|r| ((r.user.as_str(), r.item.as_str()), r.ldp.is_some()))
        .collect();
    for chunk in rows.chunks(PAIR_CHUNK) {
        let sql = format!(
            "SELECT user_id, item_id, origin FROM ratings WHERE {}",
            (0..chunk.len())
                .map(|k| format!("(user_id = ${} AND item_id = ${})", 2 * k + 1, 2 * k + 2))
                .collect::<Vec<_>>()
                .join(" OR ")
        );
        let mut q = sqlx::query(&sql);
        for r in chunk {
            q = q.bind(&r.user).bind(&r.item);
        }
        for row in q.fetch_all(&mut **tx).await? {
            let (user, item, origin): (String, String, String) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            let ldp_new = new_ldp
                .get(&(user.as_str(), item.as_str()))
                .copied()
                .unwrap_or(false);
            if let Some(e) = pair_conflict(&user, &item, &origin, ldp_new) {
                return Err(e);
            }
        }
    }
    Ok(())
}

/// The conflict, if any, of a stored pair (`origin`) with the batch's rating of it
/// (`ldp_new`: sent as LDP); shared by both backends' checks so they fail alike.
pub(super) fn pair_conflict(
    user: &str,
    item: &str,
    origin: &str,
    ldp_new: bool,
) -> Option<StoreError> {
    if origin == "ldp" {
        return Some(StoreError::Conflict(format!(
            "user {user:?} already sent item {item:?} as a locally perturbed rating; \
             LDP ratings cannot be re-rated"
        )));
    }
    if ldp_new {
        return Some(StoreError::Conflict(format!(
            "user {user:?} already has a rating of item {item:?}; a rating cannot \
             become locally perturbed"
        )));
    }
    None
}

/// Charges every user with new LDP ratings the composition of their local eps (unit: the
/// user's ratings, values replaced), after checking the user's Renyi filter.
pub(super) async fn charge_users(
    tx: &mut Tx,
    rows: &[&NewRating],
    for_update: &str,
    held: &[PrivacyEvent],
) -> Result<(), StoreError> {
    let mut by_user: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in rows {
        if let Some(c) = &r.ldp {
            by_user.entry(r.user.as_str()).or_default().push(c.eps);
        }
    }
    for (user, eps) in by_user {
        let row = sqlx::query(&format!(
            "SELECT budget_eps, budget_delta, rdp_consumed FROM users WHERE id = $1{for_update}"
        ))
        .bind(user)
        .fetch_one(&mut **tx)
        .await?;
        let (budget_eps, budget_delta): (f64, f64) = (row.try_get(0)?, row.try_get(1)?);
        let budget = UserBudget {
            eps: budget_eps,
            delta: budget_delta,
            consumed: parse_curve(&row.try_get::<String, _>(2)?)?,
        };
        let total: f64 = eps.iter().sum();
        let charge =
            charge_local(&budget, &pure_events(eps.iter().copied()), held).map_err(|source| {
                StoreError::Accounting {
                    user: user.to_owned(),
                    source,
                }
            })?;
        let next = match charge {
            LocalCharge::Charged(next) => next,
            LocalCharge::NoRoom => {
                return Err(StoreError::Conflict(format!(
                    "user {user:?}: the local eps of these LDP ratings ({total}) exceeds what \
                     the user's budget (eps {budget_eps}, delta {budget_delta}) has left"
                )))
            }
            LocalCharge::Held => {
                return Err(StoreError::Conflict(format!(
                    "user {user:?}: a release in progress will charge this user when it \
                     commits, and the local eps of these LDP ratings ({total}) would leave \
                     too little budget for that charge; retry once the release has been \
                     published"
                )))
            }
        };
        sqlx::query("UPDATE users SET rdp_consumed = $2 WHERE id = $1")
            .bind(user)
            .bind(curve_json(&next))
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// `(origin, spent)` of a new row: LDP ratings are fully spent at ingestion.
pub(super) fn origin_and_spent(r: &NewRating, eps: f64) -> (&'static str, f64) {
    match r.ldp {
        Some(_) => ("ldp", eps),
        None => ("raw", 0.0),
    }
}
