//! Private-GD / GD-DR rounds (issue 9): the published round state, users' one-bit
//! reports (each charged to the user's RDP ledger when received), and the admin call
//! that closes a round (aggregates, updates the item profiles, opens the next).
//! The protocol itself is `ldp::private_gd`; the claim is `docs/privacy/private-gd.md`.

use actix_web::{http::StatusCode, web, HttpRequest, HttpResponse};
use rand::Rng;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::{AdminKey, UserKey, WriterKey};
use super::{json_body, path_id, ApiError, AppState};
use crate::ldp::private_gd::{
    next_state, Aggregator, ClientSettings, ProjectionSpec, PublishedRound, Recovery, Report,
    RoundState, Schedule,
};
use crate::store::private_gd::{NextRound, ReportError};
use crate::store::{Defaults, StoreError};

/// Largest admin or report body accepted.
const BODY_LIMIT: usize = 16 * 1024;

/// A user's report for the open round (made by the client in `ldp::private_gd`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportBody {
    pub user: String,
    pub round: u64,
    pub rows: u32,
    pub rank: u32,
    pub row: u32,
    pub col: u32,
    /// `+1` or `-1`.
    pub bit: i8,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReportReceipt {
    pub user: String,
    pub round: u64,
    /// User-level local eps charged to the user's RDP ledger for this report.
    pub eps_charged: f64,
}

/// Parameters of a new schedule (only when no round exists yet); defaults in brackets.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleBody {
    /// User-level local eps over all rounds [0.1].
    pub eps_total: Option<f64>,
    /// Planned rounds k [10].
    pub rounds: Option<u32>,
    /// Latent dimension d [15].
    pub rank: Option<usize>,
    /// Projection dimension q; 0 = no projection (Private-GD) [ceil(m/10)].
    pub dim: Option<usize>,
    /// Clipping bound C [1].
    pub clip: Option<f64>,
    /// Learning-rate constant [1].
    pub lr: Option<f64>,
    /// Client ridge penalty [5].
    pub reg_user: Option<f64>,
    /// Standard deviation of the initial item profiles [0.1].
    pub init_sd: Option<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RoundTransition {
    /// The round that was closed (none when the first round was opened).
    pub closed: Option<i64>,
    /// Reports aggregated into the closed round.
    pub reports: i64,
    /// The round now open.
    pub open: i64,
}

/// The open Private-GD round: schedule, item ids and item profiles, for the protocol's
/// clients (a user token, or the service's reader, writer or admin key). The item
/// profiles are post-processing of LDP reports, but two consecutive rounds give the
/// exact number of reports of the closed one (docs/privacy/private-gd.md), so the round
/// is not published to key-less or public callers.
#[utoipa::path(get, path = "/v1/private-gd/round", tag = "private-gd",
    responses((status = 200, body = PublishedRound),
        (status = 404, description = "No round open", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn round(_auth: UserKey, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let Some(r) = state.store.open_ldp_round().await? else {
        return Err(ApiError::not_found("no Private-GD round is open"));
    };
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(r.state))
}

fn report_error(e: ReportError) -> ApiError {
    match e {
        ReportError::UnknownRound(r) => {
            ApiError::not_found(format!("unknown round {r}")).with_field("round")
        }
        ReportError::Closed(r) => ApiError::new(
            StatusCode::CONFLICT,
            "Round closed",
            format!("round {r} is closed"),
        )
        .with_field("round"),
        ReportError::Duplicate(u, r) => ApiError::new(
            StatusCode::CONFLICT,
            "Already reported",
            format!("user {u:?} already reported in round {r}"),
        ),
        ReportError::Deleted(u) => ApiError::forbidden(format!("user {u:?} is deleted")),
        ReportError::Budget(u, eps) => ApiError::forbidden(format!(
            "user {u:?}: the RDP budget does not admit another report (eps {eps})"
        )),
        e @ ReportError::Held(..) => ApiError::new(
            StatusCode::CONFLICT,
            "A release in progress holds part of this budget",
            e.to_string(),
        ),
        ReportError::Invalid(p) => match p {
            crate::ldp::private_gd::ProtocolError::Invalid { field, reason } => {
                ApiError::invalid(field, reason)
            }
            other => ApiError::invalid("report", other.to_string()),
        },
        ReportError::Store(s) => s.into(),
    }
}

/// Submit a user's one-bit report for the open round. The report's local eps is
/// charged to the user's RDP ledger in the same transaction; a second report of the
/// same user in the same round, a report for a closed or unknown round, or one that
/// does not fit the round is refused and nothing is stored.
#[utoipa::path(post, path = "/v1/private-gd/reports", tag = "private-gd",
    request_body = ReportBody,
    responses((status = 201, body = ReportReceipt),
        (status = 404, description = "Unknown round", body = super::Problem, content_type = "application/problem+json"),
        (status = 409, description = "Round closed, the user already reported in it, or the report would leave too little budget for the charge of a release in progress (retry after it is published)", body = super::Problem, content_type = "application/problem+json"),
        (status = 403, description = "User deleted or budget exhausted", body = super::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Report does not fit the round", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn report(
    _auth: WriterKey,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body: ReportBody = json_body(&req, payload, BODY_LIMIT).await?;
    let user = path_id(&state, "user", &body.user)?;
    let r = Report {
        round: body.round,
        rows: body.rows,
        rank: body.rank,
        row: body.row,
        col: body.col,
        bit: body.bit,
    };
    let b = &state.settings.budget;
    let defaults = Defaults {
        rating_eps: b.default_rating_eps,
        user_eps: b.default_user_eps,
        user_delta: b.default_user_delta,
    };
    let eps = state
        .store
        .submit_ldp_report(user.as_str(), &r, defaults)
        .await
        .map_err(report_error)?;
    Ok(HttpResponse::Created().json(ReportReceipt {
        user: user.as_str().to_owned(),
        round: r.round,
        eps_charged: eps,
    }))
}

fn next_round(stored: &str, reports: &[(i64, i64, i64)]) -> Result<NextRound, String> {
    let published: PublishedRound =
        serde_json::from_str(stored).map_err(|e| format!("stored round state: {e}"))?;
    let st = published.state().map_err(|e| e.to_string())?;
    let mut agg = Aggregator::new(&st);
    for &(row, col, bit) in reports {
        let r = Report {
            round: st.round,
            rows: st.report_rows() as u32,
            rank: st.rank() as u32,
            row: row as u32,
            col: col as u32,
            bit: bit as i8,
        };
        agg.add(&st, &r)
            .map_err(|e| format!("stored report: {e}"))?;
    }
    let recovery = Recovery::new(&st.schedule, st.n_items()).map_err(|e| e.to_string())?;
    let next = next_state(&st, &recovery, &agg).map_err(|e| e.to_string())?;
    to_row(&next, published.items)
}

fn to_row(st: &RoundState, items: Vec<String>) -> Result<NextRound, String> {
    let p = PublishedRound::new(st, items).map_err(|e| e.to_string())?;
    Ok(NextRound {
        rows: p.report_rows as i64,
        rank: st.rank() as i64,
        eps_round: p.eps_round,
        state: serde_json::to_string(&p).map_err(|e| e.to_string())?,
    })
}

/// Close the open round (aggregate its reports, update the item profiles) and open the
/// next; with no round yet, open round 1 of a new schedule over the item catalogue
/// (the body's parameters; all optional).
#[utoipa::path(post, path = "/v1/admin/private-gd/rounds", tag = "admin",
    request_body = ScheduleBody,
    responses((status = 201, body = RoundTransition),
        (status = 422, description = "Bad schedule, or schedule parameters while a schedule runs", body = super::Problem, content_type = "application/problem+json")),
    security(("api_key" = [])))]
pub async fn advance(
    _auth: AdminKey,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body: ScheduleBody = json_body(&req, payload, BODY_LIMIT).await?;
    if let Some(open) = state.store.open_ldp_round().await? {
        let given = body.eps_total.is_some()
            || body.rounds.is_some()
            || body.rank.is_some()
            || body.dim.is_some()
            || body.clip.is_some()
            || body.lr.is_some()
            || body.reg_user.is_some()
            || body.init_sd.is_some();
        if given {
            return Err(ApiError::invalid(
                "body",
                "a schedule is running: its parameters are fixed (send {} to close the round)",
            ));
        }
        let n = state
            .store
            .close_ldp_round(open.id, next_round)
            .await
            .map_err(|e| match e {
                StoreError::Corrupt(m) => {
                    ApiError::new(StatusCode::CONFLICT, "Round not closed", m)
                }
                other => other.into(),
            })?;
        return Ok(HttpResponse::Created().json(RoundTransition {
            closed: Some(open.id),
            reports: n,
            open: open.id + 1,
        }));
    }
    let items = state.store.catalogue().await?;
    if items.is_empty() {
        return Err(ApiError::invalid("items", "the item catalogue is empty"));
    }
    let m = items.len();
    let mut rng = dprec_dp::rng::from_os();
    let dim = body.dim.unwrap_or(m.div_ceil(10).max(1));
    let schedule = Schedule {
        eps_total: body.eps_total.unwrap_or(0.1),
        rounds: body.rounds.unwrap_or(10),
        rank: body.rank.unwrap_or(15),
        projection: (dim > 0).then(|| ProjectionSpec {
            seed: rng.random(),
            dim,
        }),
        clip: body.clip.unwrap_or(1.0),
        lr: body.lr.unwrap_or(1.0),
        reg_item: 1e-8,
        correction: true,
        client: ClientSettings {
            offset: (state.scale.min + state.scale.max) / 2.0,
            reg_user: body.reg_user.unwrap_or(5.0),
            user_bias: true,
        },
    };
    let proto = |e: crate::ldp::private_gd::ProtocolError| match e {
        crate::ldp::private_gd::ProtocolError::Invalid { field, reason } => {
            ApiError::invalid(field, reason)
        }
        other => ApiError::invalid("body", other.to_string()),
    };
    let first =
        RoundState::initial(schedule, m, body.init_sd.unwrap_or(0.1), &mut rng).map_err(proto)?;
    let row = to_row(&first, items).map_err(ApiError::internal)?;
    let id = state.store.open_first_ldp_round(&row).await?;
    Ok(HttpResponse::Created().json(RoundTransition {
        closed: None,
        reports: 0,
        open: id,
    }))
}
