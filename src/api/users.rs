//! User privacy settings, user deletion and the budget audit (DESIGN 4).
//!
//! Scopes (DESIGN 6): settings and the audit (which lists the items a user rated) reach
//! that user's token or a service key (reader and above read; writer and above change
//! settings), never a public key or another user's token. Deleting a user needs a writer.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{UserKey, WriterKey};
use super::domain::{Delta, Epsilon};
use super::models::{public_mechanisms, public_params, MechanismView};
use super::{json_body, path_id, ApiError, AppState, Page};
use crate::config::Role;
use crate::store::SettingsWrite;
use crate::train::Guarantee;
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::charges::PrivacyUnit;
use dprec_dp::ledger::UserBudget;

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UserSettings {
    pub user: String,
    /// eps_ij given to this user's new ratings sent without eps (null: service default).
    pub default_eps: Option<f64>,
    /// The user's RDP budget target (eps_u, delta_u).
    pub budget_eps: f64,
    pub budget_delta: f64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"default_eps": 0.5, "budget_eps": 8.0, "budget_delta": 1e-6}))]
pub struct UserSettingsIn {
    pub default_eps: Option<f64>,
    /// eps_u: at most `budget.max_user_eps` (422 above). May be lowered at any time;
    /// raised only before the user's first charge (409 after).
    pub budget_eps: Option<f64>,
    /// delta_u: at most `budget.max_user_delta` (422 above). Like `budget_eps`, never
    /// raised once the user has been charged (409).
    pub budget_delta: Option<f64>,
}

/// A user's privacy settings (service defaults for an unknown user).
#[utoipa::path(get, path = "/v1/users/{user}/settings", tag = "users",
    params(("user" = String, Path)),
    responses((status = 200, body = UserSettings)),
    security(("api_key" = [])))]
pub async fn get_settings(
    auth: UserKey,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let user = path_id(&state, "user", &path)?;
    auth.for_user(user.as_str())?;
    let b = &state.settings.budget;
    let s = match state.store.user(user.as_str()).await? {
        Some(u) => UserSettings {
            user: u.id,
            default_eps: u.default_eps,
            budget_eps: u.budget_eps,
            budget_delta: u.budget_delta,
        },
        None => UserSettings {
            user: user.into_string(),
            default_eps: None,
            budget_eps: b.default_user_eps,
            budget_delta: b.default_user_delta,
        },
    };
    Ok(HttpResponse::Ok().json(s))
}

/// A 409 for a budget raise after the user's first charge.
fn raise_refused(field: &str, current: f64, requested: f64) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "Budget cannot be raised",
        format!(
            "{field} may be lowered at any time but never raised once the user has been \
             charged (current {current}, requested {requested}): the user's guarantee is \
             stated against this budget"
        ),
    )
    .with_field(field)
}

/// `(default_eps, budget_eps, budget_delta)` of a settings request, each optional.
type SettingsFields = (Option<Epsilon>, Option<Epsilon>, Option<Delta>);

/// The fields of a settings request, each checked against its bound (422 naming it).
fn parse_settings(
    body: &UserSettingsIn,
    b: &crate::config::BudgetSettings,
) -> Result<SettingsFields, ApiError> {
    let max = b.max_rating_eps;
    let default_eps = body
        .default_eps
        .map(|e| Epsilon::parse(e, max))
        .transpose()
        .map_err(|e| ApiError::invalid("default_eps", e))?;
    let budget_eps = body
        .budget_eps
        .map(|e| {
            Epsilon::parse(e, b.max_user_eps).map_err(|why| {
                format!(
                    "budget_eps: {why} (at most budget.max_user_eps = {})",
                    b.max_user_eps
                )
            })
        })
        .transpose()
        .map_err(|e| ApiError::invalid("budget_eps", e))?;
    let budget_delta = body
        .budget_delta
        .map(|d| {
            Delta::parse(d)
                .and_then(|d| {
                    if d.get() <= b.max_user_delta {
                        Ok(d)
                    } else {
                        Err(format!(
                            "delta must be <= {}, got {}",
                            b.max_user_delta,
                            d.get()
                        ))
                    }
                })
                .map_err(|why| {
                    format!(
                        "budget_delta: {why} (at most budget.max_user_delta = {})",
                        b.max_user_delta
                    )
                })
        })
        .transpose()
        .map_err(|e| ApiError::invalid("budget_delta", e))?;
    Ok((default_eps, budget_eps, budget_delta))
}

/// Set a user's privacy settings; omitted fields keep their value. The budget
/// (`budget_eps`, `budget_delta`) is bounded by `budget.max_user_eps` /
/// `budget.max_user_delta` (422) and may be lowered at any time but never raised once
/// the user has been charged by a release or an LDP report (409).
#[utoipa::path(put, path = "/v1/users/{user}/settings", tag = "users",
    params(("user" = String, Path)),
    request_body = UserSettingsIn,
    responses((status = 200, body = UserSettings),
        (status = 409, description = "A budget raise after the user has been charged, or a lowering that would not cover the charge of a release in progress (retry after it is published); the problem's `field` names budget_eps or budget_delta", body = super::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid field, or a budget above budget.max_user_eps / budget.max_user_delta", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn put_settings(
    auth: UserKey,
    state: web::Data<AppState>,
    path: web::Path<String>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let user = path_id(&state, "user", &path)?;
    if !(auth.0.role >= Role::Writer || auth.0.is_token_of(user.as_str())) {
        return Err(ApiError::forbidden(format!(
            "changing user {:?}'s settings needs a writer key or that user's token",
            user.as_str()
        )));
    }
    let body: UserSettingsIn =
        json_body(&req, payload, state.settings.server.max_body_bytes).await?;
    let b = &state.settings.budget;
    let (default_eps, budget_eps, budget_delta) = parse_settings(&body, b)?;
    let current = state.store.user(user.as_str()).await?;
    let (cur_default, cur_eps, cur_delta) = match &current {
        Some(u) => (u.default_eps, u.budget_eps, u.budget_delta),
        None => (None, b.default_user_eps, b.default_user_delta),
    };
    let s = UserSettings {
        user: user.into_string(),
        default_eps: default_eps.map(Epsilon::get).or(cur_default),
        budget_eps: budget_eps.map(Epsilon::get).unwrap_or(cur_eps),
        budget_delta: budget_delta.map(Delta::get).unwrap_or(cur_delta),
    };
    let charged = current
        .as_ref()
        .is_some_and(|u| u.consumed.points().any(|(_, r)| r != 0.0));
    if charged && s.budget_eps > cur_eps {
        return Err(raise_refused("budget_eps", cur_eps, s.budget_eps));
    }
    if charged && s.budget_delta > cur_delta {
        return Err(raise_refused("budget_delta", cur_delta, s.budget_delta));
    }
    // The store refuses a raise atomically if a release charged the user meanwhile, and
    // a lowering that a release in flight could not be charged within.
    let written = state
        .store
        .put_user_settings(&s.user, s.default_eps, s.budget_eps, s.budget_delta)
        .await?;
    match written {
        SettingsWrite::Applied => {}
        SettingsWrite::RaiseRefused => {
            let field = if s.budget_eps > cur_eps {
                "budget_eps"
            } else {
                "budget_delta"
            };
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "Budget cannot be raised",
                "the user was charged while the settings were changed; a budget is never \
                 raised once the user has been charged",
            )
            .with_field(field));
        }
        SettingsWrite::Held => {
            let field = if s.budget_eps < cur_eps {
                "budget_eps"
            } else {
                "budget_delta"
            };
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "A release in progress holds part of this budget",
                format!(
                    "a release started before this change and will charge user {:?} its \
                     user-level cost when it commits; this budget would not cover that \
                     charge. Retry once the release has been published (GET /v1/models \
                     lists it; a release takes seconds to a minute), or choose a budget \
                     that covers one more release",
                    s.user
                ),
            )
            .with_field(field));
        }
    }
    Ok(HttpResponse::Ok().json(s))
}

/// Delete a user: all rating values leave future training; the ledger stays.
#[utoipa::path(delete, path = "/v1/users/{user}", tag = "users",
    params(("user" = String, Path)),
    responses((status = 204, description = "Deleted"),
        (status = 404, description = "Unknown user", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn delete_user(
    _auth: WriterKey,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let user = path_id(&state, "user", &path)?;
    let deleted = state.store.delete_user(user.as_str()).await?;
    state.user_facts.invalidate([user.as_str()]);
    if deleted {
        Ok(HttpResponse::NoContent().finish())
    } else {
        Err(ApiError::not_found(format!(
            "unknown user {:?}",
            user.as_str()
        )))
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Budget {
    pub eps: f64,
    pub delta: f64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RdpPoint {
    pub order: f64,
    /// Consumed RDP at this order (null: unbounded).
    pub rdp: Option<f64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Spent {
    /// eps at delta_u of the consumed RDP curve (improved conversion), as if the charges
    /// had been fixed in advance.
    pub eps: Option<f64>,
    pub delta: f64,
    pub best_order: Option<f64>,
    /// The consumed curve on the filter's scale (min over orders of consumed +
    /// ln(|A|/delta_u)/(alpha-1)); a charge is admitted while this stays <= eps_u.
    pub filter_eps: Option<f64>,
    /// eps_u - filter_eps.
    pub remaining_eps: Option<f64>,
    /// Releases the user can still take part in at the per-release user-level cost of
    /// the user's last release (the lifetime plan, DESIGN 3); null before the first. A
    /// member of a continual series: the series' ticks left plus the ticks of the further
    /// whole series the filter admits.
    pub releases_left: Option<u64>,
    /// Summary of the consumed RDP curve at a few orders.
    pub curve: Vec<RdpPoint>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RatingBudgetView {
    pub item: String,
    pub eps: f64,
    pub spent: f64,
    pub remaining: f64,
    /// Releases that charged this rating.
    pub releases: i64,
    /// `active`, `exhausted` (remaining below budget.min_release_eps) or `deleted`.
    pub status: String,
    /// `raw` (perturbed centrally by releases) or `ldp` (perturbed on the client: `eps`
    /// is the local eps, spent in full at ingestion and never charged again).
    pub origin: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ReleaseChargeView {
    pub release_id: i64,
    pub trainer: String,
    pub guarantee: Guarantee,
    pub created_at: i64,
    /// Mechanisms with parameters, unit and neighbour relation (one object each).
    pub mechanisms: Vec<MechanismView>,
    #[schema(value_type = Object)]
    pub params: serde_json::Value,
    /// RDP events charged to the user's filter by this release (one object each).
    #[schema(value_type = Vec<Object>)]
    pub events: serde_json::Value,
    /// The order at which the filter admitted the charge.
    pub admitted_order: f64,
    pub ratings_charged: i64,
    /// Sum of eps charged to the user's ratings by this release.
    pub rating_eps_total: f64,
}

/// What all of a user's ratings together may lose in the rating-level releases (DESIGN 3,
/// rating-level mode): a group-privacy bound, SHOWN, NOT ENFORCED. These releases are
/// proven for one rating; they charge each rating's eps_ij (the per-rating list) and
/// nothing to the user's Renyi budget (`budget`, `spent`), and no release is refused
/// because of this figure.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RatingLevelBound {
    /// `eps = sum over rating-level releases R, over the user's ratings r charged by R, of
    /// eps_R(r)` (training and DP popularity, pure eps, delta 0): group privacy over the
    /// user's ratings (adding or removing them one at a time costs each its own charge),
    /// composed over the releases. Null if a release charged a Gaussian part (not summed).
    pub eps: Option<f64>,
    /// Always false: the bound is shown, not enforced.
    pub enforced: bool,
    /// The formula and what it means, in words.
    pub note: String,
    /// The rating-level releases that charged the user's ratings, newest first.
    pub releases: Vec<RatingLevelReleaseView>,
}

/// One rating-level release's part of [`RatingLevelBound`].
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RatingLevelReleaseView {
    pub release_id: i64,
    pub trainer: String,
    /// `rating-level`.
    pub guarantee: Guarantee,
    pub created_at: i64,
    /// Mechanisms with parameters, unit and neighbour relation (one object each).
    pub mechanisms: Vec<MechanismView>,
    pub ratings_charged: i64,
    /// Sum of the pure eps this release charged the user's ratings (its term of the bound).
    pub eps: f64,
}

/// The note every [`RatingLevelBound`] carries.
pub const RATING_LEVEL_NOTE: &str = "group-privacy bound of the rating-level releases: \
     eps = sum, over the rating-level releases and the ratings of yours each charged, of the \
     eps charged to that rating (delta 0). Those releases are proven for one rating only: \
     they spend each rating's eps_ij (enforced) and charge nothing to your user-level budget; \
     this bound on all your ratings together is shown, not enforced";

/// The group-privacy bound of the user's rating-level charges (`None`: no rating-level
/// release charged the user's ratings).
fn rating_level_bound(
    charges: Vec<crate::store::RatingLevelCharge>,
) -> Result<Option<RatingLevelBound>, ApiError> {
    if charges.is_empty() {
        return Ok(None);
    }
    let pure = charges.iter().all(|c| c.rho == 0.0);
    let eps = pure.then(|| charges.iter().map(|c| c.eps).sum::<f64>());
    let releases = charges
        .into_iter()
        .map(|c| {
            Ok(RatingLevelReleaseView {
                release_id: c.release.id,
                trainer: c.release.trainer,
                guarantee: c.release.guarantee,
                created_at: c.release.created_at,
                mechanisms: public_mechanisms(&c.release.mechanisms)?,
                ratings_charged: c.ratings_charged,
                eps: c.eps,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Some(RatingLevelBound {
        eps,
        enforced: false,
        note: RATING_LEVEL_NOTE.into(),
        releases,
    }))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Paged<T> {
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
    pub entries: Vec<T>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Audit {
    pub user: String,
    pub deleted: bool,
    pub budget: Budget,
    pub spent: Spent,
    /// Whether the filter has no room left at any order.
    pub exhausted: bool,
    /// Why recommendations come from the fallback, if they do.
    pub note: Option<String>,
    pub ratings: Paged<RatingBudgetView>,
    pub releases: Paged<ReleaseChargeView>,
    /// The rating-level releases that used the user's ratings and the group-privacy bound
    /// they imply (shown, not enforced); null when none did. They are not in `releases`
    /// (which lists the charges to the user-level budget) and not in `spent`.
    pub rating_level: Option<RatingLevelBound>,
    /// Private-GD one-bit reports received from the user, newest first: each was charged
    /// `PureDp { eps }` to the user's RDP ledger when it was received (unit user, LDP).
    pub local_reports: Vec<LocalReportView>,
    /// The user's place in the newest continual release series (`release.mode =
    /// "continual"`); null when the service has never run one.
    pub continual: Option<ContinualView>,
}

/// A continual release series as one user sees it: the levels it charged the user (once,
/// at the tick the user joined) and the ticks it has left.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ContinualView {
    pub series: i64,
    /// Ticks of the series (the plan's releases).
    pub horizon: u64,
    /// Ticks released so far.
    pub period: u64,
    pub ticks_left: u64,
    /// Levels of the series' tree: the Gaussian mechanisms it composes.
    pub levels: u32,
    /// Per-level noise multiplier.
    pub z_level: f64,
    /// `joined` (charged the series' levels at `joined_period`), `left_out` (the user's
    /// filter could not take them: nothing of the user's is counted in this series) or
    /// `pending` (decided at the next tick).
    pub status: String,
    pub joined_period: Option<u64>,
    /// Levels this series charged the user (all of them once, or none).
    pub levels_charged: u32,
}

/// One received LDP report and its ledger charge.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LocalReportView {
    pub mechanism: String,
    pub round: i64,
    pub eps: f64,
    pub unit: PrivacyUnit,
    pub received_at: i64,
}

fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// The audit's rating rows: status from the rating's loss bound and `min_release_eps`.
fn rating_views(rows: Vec<crate::store::RatingAuditRow>, min: f64) -> Vec<RatingBudgetView> {
    rows.into_iter()
        .map(|r| RatingBudgetView {
            status: if r.deleted {
                "deleted"
            } else if r.eps - r.spent < min {
                "exhausted"
            } else {
                "active"
            }
            .into(),
            remaining: (r.eps - r.spent).max(0.0),
            item: r.item,
            eps: r.eps,
            spent: r.spent,
            releases: r.releases,
            origin: r.origin,
        })
        .collect()
}

/// The audit's release rows, with the public form of each release's mechanisms.
fn release_views(
    rel: Vec<crate::store::UserReleaseCharge>,
) -> Result<Vec<ReleaseChargeView>, ApiError> {
    rel.into_iter()
        .map(|c| {
            Ok(ReleaseChargeView {
                release_id: c.release.id,
                trainer: c.release.trainer,
                guarantee: c.release.guarantee,
                created_at: c.release.created_at,
                mechanisms: public_mechanisms(&c.release.mechanisms)?,
                params: public_params(c.release.params),
                events: c.events,
                admitted_order: c.admitted_order,
                ratings_charged: c.ratings_charged,
                rating_eps_total: c.rating_eps_total,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()
}

/// Why a user's recommendations may not be personal, if they may not be.
fn audit_note(
    u: &crate::store::UserRow,
    exhausted: bool,
    served: Option<&crate::serve::Published>,
) -> Option<String> {
    if u.deleted {
        Some("user deleted: no data is used; recommendations use the DP popularity".into())
    } else if exhausted {
        Some("the user's RDP budget is used up: the user takes no part in new releases".into())
    } else {
        match served {
            // A ranker scores from the user's own current ratings: no profile needed.
            Some(p) if p.has_ranker() => None,
            Some(p) if !p.has_profile(&u.id) => Some(
                "no DP profile in the served release (new user, no rating with budget left, \
                 or the filter did not admit the release): recommendations use the DP popularity"
                    .into(),
            ),
            None => Some("no release published yet".into()),
            _ => None,
        }
    }
}

/// The consumed curve at a few orders (what the audit lists of it).
fn curve_points(consumed: &dprec_dp::accountant::RdpCurve) -> Vec<RdpPoint> {
    consumed
        .points()
        .filter(|(a, _)| [1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 256.0].contains(a))
        .map(|(order, rdp)| RdpPoint {
            order,
            rdp: finite(rdp),
        })
        .collect()
}

/// Budget audit of a user: budget, spent, remaining, per-rating slots and releases.
/// `limit`/`offset` page both lists. The per-rating list names the items the user rated,
/// so only that user's token and service keys reach it.
#[utoipa::path(get, path = "/v1/users/{user}/budget", tag = "users",
    params(("user" = String, Path), Page),
    responses((status = 200, body = Audit),
        (status = 404, description = "Unknown user", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn audit(
    auth: UserKey,
    state: web::Data<AppState>,
    path: web::Path<String>,
    page: web::Query<Page>,
) -> Result<HttpResponse, ApiError> {
    let user = path_id(&state, "user", &path)?;
    auth.for_user(user.as_str())?;
    let (limit, offset) = page.parse()?;
    let Some(u) = state.store.user(user.as_str()).await? else {
        return Err(ApiError::not_found(format!(
            "unknown user {:?}",
            user.as_str()
        )));
    };
    let pages = AuditPages {
        ratings: (limit, offset),
        order: RatingOrder::default(),
        releases: (limit, offset),
        numeric_items: false,
    };
    Ok(HttpResponse::Ok().json(build_audit(&state, u, &pages).await?))
}

/// A column of the audit's rating list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RatingSort {
    #[default]
    Item,
    Eps,
    Spent,
    Remaining,
    Releases,
    Status,
}

impl RatingSort {
    pub const ALL: [RatingSort; 6] = [
        Self::Item,
        Self::Eps,
        Self::Spent,
        Self::Remaining,
        Self::Releases,
        Self::Status,
    ];

    /// The query value (`item`, `eps`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Item => "item",
            Self::Eps => "eps",
            Self::Spent => "spent",
            Self::Remaining => "remaining",
            Self::Releases => "releases",
            Self::Status => "status",
        }
    }
}

/// The order of the audit's rating list: by item id ascending unless asked otherwise;
/// ties keep item order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RatingOrder {
    pub by: RatingSort,
    pub descending: bool,
}

/// Which page of each of the audit's lists to show: `(limit, offset)`.
#[derive(Debug, Clone, Copy)]
pub struct AuditPages {
    pub ratings: (i64, i64),
    pub order: RatingOrder,
    pub releases: (i64, i64),
    /// Item ids that are numbers in numeric order (1, 2, 10, 100), other ids after them
    /// in string order (the receipt page, for a person); `false`: the store's string
    /// order, paged by the store (the JSON audit).
    pub numeric_items: bool,
}

/// Item ids in the order a person expects: ids that are whole numbers by value (1, 2,
/// 10, 100; "007" beside "7", before it), before every other id; other ids as strings.
pub fn item_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn number(s: &str) -> Option<&str> {
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())).then(|| s.trim_start_matches('0'))
    }
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x.len().cmp(&y.len()).then(x.cmp(y)).then(a.cmp(b)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// Sorts rating rows by `order`; ties keep their order (sort by [`item_order`] first to
/// break ties by item).
pub fn sort_ratings(rows: &mut [RatingBudgetView], order: RatingOrder) {
    use std::cmp::Ordering;
    let key = |a: &RatingBudgetView, b: &RatingBudgetView| -> Ordering {
        match order.by {
            RatingSort::Item => item_order(&a.item, &b.item),
            RatingSort::Eps => a.eps.total_cmp(&b.eps),
            RatingSort::Spent => a.spent.total_cmp(&b.spent),
            RatingSort::Remaining => a.remaining.total_cmp(&b.remaining),
            RatingSort::Releases => a.releases.cmp(&b.releases),
            RatingSort::Status => a.status.cmp(&b.status),
        }
    };
    if order.descending {
        rows.sort_by(|a, b| key(b, a));
    } else {
        rows.sort_by(key);
    }
}

/// One page of a user's rating slots in `order`: paged by the store in its item order,
/// or all read, sorted and cut here for another order or numeric item ids (a user's
/// ratings fit in memory).
async fn rating_page(
    state: &AppState,
    user: &str,
    (limit, offset): (i64, i64),
    order: RatingOrder,
    numeric_items: bool,
) -> Result<(i64, Vec<RatingBudgetView>), ApiError> {
    let min = state.settings.budget.min_release_eps;
    if order == RatingOrder::default() && !numeric_items {
        let (total, rows) = state.store.audit_ratings(user, limit, offset).await?;
        return Ok((total, rating_views(rows, min)));
    }
    let (total, rows) = state.store.audit_ratings(user, i64::MAX, 0).await?;
    let mut all = rating_views(rows, min);
    if numeric_items {
        all.sort_by(|a, b| item_order(&a.item, &b.item));
    }
    sort_ratings(&mut all, order);
    let page = all
        .into_iter()
        .skip(usize::try_from(offset).unwrap_or(usize::MAX))
        .take(usize::try_from(limit).unwrap_or(0))
        .collect();
    Ok((total, page))
}

/// The ledger's numbers of user `u`; releases left at the per-release cost of the
/// user's newest release.
async fn ledger_summary(
    state: &AppState,
    u: &crate::store::UserRow,
) -> Result<dprec_dp::ledger::AuditSummary, ApiError> {
    let (_, newest) = state.store.audit_releases(&u.id, 1, 0).await?;
    let newest_events = newest
        .first()
        .and_then(|c| serde_json::from_value::<Vec<PrivacyEvent>>(c.events.clone()).ok());
    let budget = UserBudget {
        eps: u.budget_eps,
        delta: u.budget_delta,
        consumed: u.consumed.clone(),
    };
    budget
        .audit(newest_events.as_deref())
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// The budget audit of user `u` (the JSON of `GET /v1/users/{user}/budget`, and what
/// the receipt page shows).
pub async fn build_audit(
    state: &AppState,
    u: crate::store::UserRow,
    pages: &AuditPages,
) -> Result<Audit, ApiError> {
    let (total, entries) = rating_page(
        state,
        &u.id,
        pages.ratings,
        pages.order,
        pages.numeric_items,
    )
    .await?;
    let (limit, offset) = pages.ratings;
    let (rlimit, roffset) = pages.releases;
    let (rtotal, rel) = state.store.audit_releases(&u.id, rlimit, roffset).await?;
    let summary = ledger_summary(state, &u).await?;
    let (spent, filter_eps, exhausted) = (summary.spent, summary.filter_eps, summary.exhausted);
    let curve = curve_points(&u.consumed);
    let releases_left = summary.releases_left;
    let continual = continual_view(state, &u.id).await?;
    let releases_left = releases_left.map(|n| series_releases_left(n, continual.as_ref()));
    let releases = release_views(rel)?;
    let local_reports = state
        .store
        .ldp_reports_of(&u.id)
        .await?
        .into_iter()
        .map(|(round, eps, at)| LocalReportView {
            mechanism: "private-gd-one-bit-report".into(),
            round,
            eps,
            unit: PrivacyUnit::User,
            received_at: at,
        })
        .collect();
    let rating_level = rating_level_bound(state.store.rating_level_charges(&u.id).await?)?;
    let note = audit_note(&u, exhausted, state.registry.current().as_deref());
    Ok(Audit {
        user: u.id,
        deleted: u.deleted,
        budget: Budget {
            eps: u.budget_eps,
            delta: u.budget_delta,
        },
        spent: Spent {
            eps: finite(spent.eps),
            delta: spent.delta,
            best_order: spent.best_order,
            filter_eps: finite(filter_eps),
            remaining_eps: finite(u.budget_eps - filter_eps),
            releases_left,
            curve,
        },
        exhausted,
        note,
        ratings: Paged {
            total,
            limit,
            offset,
            entries,
        },
        releases: Paged {
            total: rtotal,
            limit: rlimit,
            offset: roffset,
            entries: releases,
        },
        rating_level,
        local_reports,
        continual,
    })
}

/// Releases left for a member of a continual series: the series' ticks left (charged
/// already) plus the ticks of the `whole` further series the filter admits (`whole`:
/// releases left at the cost of the user's newest charge, the series' charge). Anyone
/// else: `whole` as it is.
fn series_releases_left(whole: u64, continual: Option<&ContinualView>) -> u64 {
    match continual {
        Some(c) if c.status == "joined" => {
            whole.saturating_mul(c.horizon).saturating_add(c.ticks_left)
        }
        _ => whole,
    }
}

/// The user's place in the newest continual series (null: none was ever run).
async fn continual_view(state: &AppState, user: &str) -> Result<Option<ContinualView>, ApiError> {
    let Some(s) = state.store.latest_series().await? else {
        return Ok(None);
    };
    let member = state.store.series_member(s.id, user).await?;
    let levels = s.params.levels();
    let (status, joined_period, levels_charged) = match member {
        Some((t, true)) => ("joined", Some(t), levels),
        Some((_, false)) => ("left_out", None, 0),
        None => ("pending", None, 0),
    };
    Ok(Some(ContinualView {
        series: s.id,
        horizon: s.params.horizon,
        period: s.period,
        ticks_left: s.params.horizon - s.period,
        levels,
        z_level: s.params.z_level,
        status: status.into(),
        joined_period,
        levels_charged,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Numeric ids by value, other ids as strings after them.
    #[test]
    fn numeric_item_ids_sort_by_value() {
        let mut ids = vec!["100", "b", "10", "2", "1", "a10", "007", "7", "a9", "0"];
        ids.sort_by(|a, b| item_order(a, b));
        assert_eq!(
            ids,
            ["0", "1", "2", "007", "7", "10", "100", "a10", "a9", "b"]
        );
        let mut big = vec!["99999999999999999999999", "100000000000000000000000", "3"];
        big.sort_by(|a, b| item_order(a, b));
        assert_eq!(
            big,
            ["3", "99999999999999999999999", "100000000000000000000000"]
        );
    }
}
