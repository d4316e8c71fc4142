//! HTML pages served by dprec (issue 25): a user's privacy receipt and the operator's
//! overview, plus the signed links that open them from a plain browser navigation.
//!
//! - `GET /v1/users/{user}/receipt`: that user's token, or a reader key or above, as a
//!   bearer header; or `?link=TOKEN` minted by `POST /v1/users/{user}/receipt/links`
//!   (reader key or above). Every other request (another user's token, a public key, no
//!   key, a bad, expired or revoked link, a user that does not exist) gets the same 403.
//! - `GET /v1/admin/overview`: an admin key, or `?link=TOKEN` minted by
//!   `POST /v1/admin/overview/links` (admin key).
//!
//! The handlers read the store and hand plain values to the pure renderers
//! ([`receipt::render`], [`overview::render`]); the receipt's numbers come from
//! [`build_audit`], the code that answers `GET /v1/users/{user}/budget`. Every page is one
//! document with inline CSS and SVG, no script and no external resource, and is sent
//! with a Content-Security-Policy that lets it load nothing.

pub mod html;
pub mod links;
pub mod overview;
pub mod receipt;
pub mod secret;
pub mod serving;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use self::links::LinkScope;
use super::auth::{AdminKey, Grant, Keys, ReaderKey};
use super::users::{build_audit, AuditPages, RatingOrder, RatingSort};
use super::{optional_json_body, parse_offset, path_id, ApiError, AppState};
use crate::config::Role;
use crate::store::now_ms;
use dprec_dp::accountant::PrivacyEvent;

/// Ratings per page of the receipt, unless `limit` says otherwise.
pub const RATINGS_PER_PAGE: i64 = 50;
/// Releases per page of the receipt.
pub const RELEASES_PER_PAGE: i64 = 10;
/// Releases and jobs on the overview.
pub const OVERVIEW_ROWS: i64 = 20;
/// The most releases drawn on the receipt's line (the newest).
const HISTORY_RELEASES: i64 = 1000;

/// What the pages may load: nothing but their own inline style and SVG.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; \
                   base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A page's response: HTML with the headers that let it load nothing and leak nothing.
pub(crate) fn html(body: String) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("Content-Security-Policy", CSP))
        .insert_header(("Referrer-Policy", "no-referrer"))
        .insert_header(("Cache-Control", "no-store"))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        .body(body)
}

/// Whether the request opens the page of `scope`: a valid `link` minted by a key whose
/// role is still at least `minter`, or (without a link) a key whose grant passes `ok`.
fn may_open(
    keys: &Keys,
    secret: &secret::LinkKeys,
    req: &HttpRequest,
    link: Option<&str>,
    scope: &LinkScope,
    minter: Role,
    ok: impl Fn(&Grant) -> bool,
) -> bool {
    match link {
        Some(token) => links::parse(token).is_some_and(|t| {
            let now = now_ms();
            let secret = secret.current();
            keys.hashes_with_prefix(t.key_id, minter)
                .iter()
                .any(|h| t.opens(scope, &secret, h, now))
        }),
        None => keys.check(req, Role::Metrics).is_ok_and(|g| ok(&g)),
    }
}

/// The one answer to every request that may not open a receipt: the same bytes whether
/// the user exists or not, whoever asks and however (no id in it).
fn receipt_refused() -> ApiError {
    ApiError::forbidden(
        "a receipt page opens with its user's own token or a reader key (bearer header), or \
         with an unexpired link minted for that user by a key that is not revoked",
    )
}

/// Query of the receipt page.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ReceiptQuery {
    /// A signed link token from `POST /v1/users/{user}/receipt/links` (instead of a
    /// bearer header).
    pub link: Option<String>,
    /// Ratings per page (1..=1000, default 50).
    pub limit: Option<i64>,
    /// Ratings to skip (0..=1000000000, default 0).
    pub offset: Option<i64>,
    /// Column the ratings are sorted by (default `item`).
    pub sort: Option<RatingSort>,
    /// Sort descending (default false).
    pub desc: Option<bool>,
    /// Releases to skip (10 per page; 0..=1000000000, default 0).
    pub roffset: Option<i64>,
}

impl ReceiptQuery {
    fn pages(&self) -> Result<AuditPages, ApiError> {
        let limit = self.limit.unwrap_or(RATINGS_PER_PAGE);
        if !(1..=1000).contains(&limit) {
            return Err(ApiError::invalid("limit", "limit must be in 1..=1000"));
        }
        let offset = parse_offset("offset", self.offset)?;
        let roffset = parse_offset("roffset", self.roffset)?;
        Ok(AuditPages {
            ratings: (limit, offset),
            order: RatingOrder {
                by: self.sort.unwrap_or_default(),
                descending: self.desc.unwrap_or(false),
            },
            releases: (RELEASES_PER_PAGE, roffset),
            numeric_items: true,
        })
    }
}

/// A user's privacy receipt (HTML): the user-level budget as a picture, the per-rating
/// budgets (sortable, paged), each release that used the user's data in plain words, and
/// what the service promises. The numbers are the budget audit's
/// (`GET /v1/users/{user}/budget`). Opens with that user's token or a reader key as a
/// bearer header, or with `?link=` from `POST /v1/users/{user}/receipt/links`; every
/// other request, and any request for a user that does not exist, gets the same 403.
#[utoipa::path(get, path = "/v1/users/{user}/receipt", tag = "pages",
    operation_id = "receipt_page",
    params(("user" = String, Path), ReceiptQuery),
    responses((status = 200, description = "The receipt page: one HTML document, no script, no external resource", content_type = "text/html")),
    security((), ("api_key" = [])))]
pub async fn receipt(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    query: super::Query<ReceiptQuery>,
) -> Result<HttpResponse, ApiError> {
    let user = path_id(&state, "user", &path)?;
    let pages = query.pages()?;
    let scope = LinkScope::Receipt(user.as_str().to_string());
    let opens = may_open(
        &state.keys,
        &state.link_keys,
        &req,
        query.link.as_deref(),
        &scope,
        Role::Reader,
        |g| g.may_read_user(user.as_str()),
    );
    if !opens {
        return Err(receipt_refused());
    }
    let Some(u) = state.store.user(user.as_str()).await? else {
        return Err(receipt_refused());
    };
    let (_, charges) = state
        .store
        .audit_releases(&u.id, HISTORY_RELEASES, 0)
        .await?;
    let events: Vec<(i64, Vec<PrivacyEvent>)> = charges
        .into_iter()
        .map(|c| {
            serde_json::from_value(c.events)
                .map(|e| (c.release.id, e))
                .map_err(|e| ApiError::internal(format!("stored events: {e}")))
        })
        .collect::<Result<_, _>>()?;
    let history = dprec_dp::ledger::spend_history(u.budget_eps, u.budget_delta, &events)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let audit = build_audit(&state, u, &pages).await?;
    let served = state.registry.current();
    let facts = super::recommend::user_facts(&state, user.as_str()).await?;
    let list = serving::list_source(
        served.as_deref(),
        served.as_deref().is_some_and(serving::release_personalises),
        user.as_str(),
        facts.deleted,
        &facts.ratings,
    );
    Ok(html(receipt::render(&receipt::ReceiptView {
        audit,
        history,
        planned_releases: state.settings.budget.planned_releases,
        order: pages.order,
        link: query.into_inner().link,
        generated_at: now_ms(),
        served_release: served.map(|p| p.release_id),
        list,
    })))
}

/// How long a link should live.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ttl_secs": 900}))]
pub struct LinkRequest {
    /// Seconds until the link expires: 1..=3600, default 900.
    pub ttl_secs: Option<u64>,
}

/// A minted page link.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PageLink {
    /// The page's path with the link token (`?link=...`): prefix it with the service's
    /// origin and hand it to the browser.
    pub path: String,
    /// When the link stops working (ms since the epoch).
    pub expires_at: i64,
    /// The id of the key that minted it (as `GET /v1/admin/keys` lists it): revoking that
    /// key (`DELETE /v1/admin/keys/{id}`) invalidates the link at once.
    pub key_id: String,
}

/// A link for `scope` minted by the request's key, answering `path` + `?link=`.
async fn mint(
    state: &AppState,
    req: &HttpRequest,
    payload: web::Payload,
    scope: &LinkScope,
    path: String,
) -> Result<HttpResponse, ApiError> {
    let body: LinkRequest =
        optional_json_body(req, payload, state.settings.server.max_body_bytes).await?;
    let expires_at =
        links::expiry(now_ms(), body.ttl_secs).map_err(|e| ApiError::invalid("ttl_secs", e))?;
    // With auth.mode = disabled no key is presented: every page is open, no link needed.
    let hash = Keys::presented_hash(req).ok_or_else(|| {
        ApiError::forbidden("links are signed with the minting key; this request has none")
    })?;
    let token = links::mint(scope, &state.link_keys.current(), &hash, expires_at);
    Ok(HttpResponse::Created().json(PageLink {
        path: format!("{path}{}", html::query(&[("link", token)])),
        expires_at,
        key_id: crate::api::keyring::key_id(&hash).to_string(),
    }))
}

/// Mint a short-lived link to one user's receipt page, for the curator's backend to hand
/// to that user's browser (which cannot send a bearer header on a plain navigation). The
/// link opens that user's page only, until it expires (default 15 minutes, at most an
/// hour) or the minting key is revoked. The body is optional.
#[utoipa::path(post, path = "/v1/users/{user}/receipt/links", tag = "pages",
    operation_id = "mint_receipt_link",
    params(("user" = String, Path)),
    request_body(content = LinkRequest, description = "Optional (no body: 900 seconds)"),
    responses((status = 201, body = PageLink)),
    security(("api_key" = [])))]
pub async fn receipt_link(
    _auth: ReaderKey,
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let user = path_id(&state, "user", &path)?;
    let page = format!("/v1/users/{}/receipt", html::url_part(user.as_str()));
    let scope = LinkScope::Receipt(user.into_string());
    mint(&state, &req, payload, &scope, page).await
}

/// Mint a short-lived link to the operator overview (admin key), for a browser.
#[utoipa::path(post, path = "/v1/admin/overview/links", tag = "pages",
    operation_id = "mint_overview_link",
    request_body(content = LinkRequest, description = "Optional (no body: 900 seconds)"),
    responses((status = 201, body = PageLink)),
    security(("api_key" = [])))]
pub async fn overview_link(
    _auth: AdminKey,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let page = "/v1/admin/overview".to_string();
    mint(&state, &req, payload, &LinkScope::Overview, page).await
}

/// Query of the overview page.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct OverviewQuery {
    /// A signed link token from `POST /v1/admin/overview/links` (instead of a bearer
    /// header).
    pub link: Option<String>,
}

/// The operator overview (HTML, admin): releases and their mechanisms, the plan and
/// where the service is in it, the newest jobs, live users by the share of their budget
/// left (an exact aggregate, admin only), the mean figures of the `dprec-lab eval` report
/// named by `pages.eval_report`, and links to `/docs` and `/metrics`. Opens with an admin
/// key as a bearer header or `?link=` from `POST /v1/admin/overview/links`; every other
/// request gets 403.
#[utoipa::path(get, path = "/v1/admin/overview", tag = "pages",
    operation_id = "overview_page",
    params(OverviewQuery),
    responses((status = 200, description = "The overview page: one HTML document, no script, no external resource", content_type = "text/html")),
    security((), ("api_key" = [])))]
pub async fn overview(
    state: web::Data<AppState>,
    req: HttpRequest,
    query: super::Query<OverviewQuery>,
) -> Result<HttpResponse, ApiError> {
    let opens = may_open(
        &state.keys,
        &state.link_keys,
        &req,
        query.link.as_deref(),
        &LinkScope::Overview,
        Role::Admin,
        |g| g.role == Role::Admin,
    );
    if !opens {
        return Err(ApiError::forbidden(
            "the operator overview opens with an admin key (bearer header) or an unexpired \
             link minted by an admin key that is not revoked",
        ));
    }
    let s = &state.settings;
    let releases = state
        .store
        .releases(OVERVIEW_ROWS, 0)
        .await?
        .into_iter()
        .map(super::models::Release::try_from)
        .collect::<Result<Vec<_>, _>>()?;
    let jobs = state
        .store
        .recent_jobs(OVERVIEW_ROWS)
        .await?
        .into_iter()
        .map(super::admin::to_view)
        .collect();
    let budgets = state.store.user_budgets().await?;
    let served = served_users(&state, budgets.keys()).await?;
    let eval = match &s.pages.eval_report {
        None => None,
        Some(p) => Some(read_eval(p).await),
    };
    Ok(html(overview::render(&overview::OverviewView {
        generated_at: now_ms(),
        served_release: state.registry.current().map(|p| p.release_id),
        releases,
        release_count: state.store.release_count().await?,
        plan: overview::PlanView {
            trainer: s.trainer.name.clone(),
            planned_releases: s.budget.planned_releases,
            user_eps: s.budget.default_user_eps,
            user_delta: s.budget.default_user_delta,
            scheduler_enabled: s.scheduler.enabled,
            interval_secs: s.scheduler.retrain_interval_secs,
        },
        jobs,
        budget_left: overview::budget_left(budgets.values()),
        served,
        eval,
        link: query.into_inner().link,
    })))
}

/// What the live users get from the served release: whether it personalises anybody,
/// and (up to [`serving::COUNT_USERS_UP_TO`] users, each one's ratings read from the
/// store) how many get a personal list.
async fn served_users<'a>(
    state: &AppState,
    live: impl ExactSizeIterator<Item = &'a String>,
) -> Result<serving::Served, ApiError> {
    let live_users = live.len() as u64;
    let Some(p) = state.registry.current() else {
        return Ok(serving::Served {
            release: None,
            personalises: false,
            live_users,
            counts: None,
        });
    };
    let personalises = serving::release_personalises(&p);
    let counts = if !personalises {
        Some((0, live_users))
    } else if live_users <= serving::COUNT_USERS_UP_TO {
        let mut personal = 0;
        for user in live {
            let (deleted, own) = state.store.serving_facts(user).await?;
            let own = crate::serve::facts::UserFacts::new(deleted, own).ratings;
            let source = serving::list_source(Some(&p), true, user, deleted, &own);
            personal += u64::from(matches!(
                source,
                serving::ListSource::Personal | serving::ListSource::Labels
            ));
        }
        Some((personal, live_users - personal))
    } else {
        None
    };
    Ok(serving::Served {
        release: Some((p.release_id, p.trainer.clone())),
        personalises,
        live_users,
        counts,
    })
}

/// The configured eval report, parsed, with the file's modification time.
async fn read_eval(path: &str) -> Result<overview::EvalFigures, String> {
    let p = path.to_string();
    let read = web::block(move || {
        let text = std::fs::read_to_string(&p)?;
        let written_at = std::fs::metadata(&p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as i64);
        Ok::<_, std::io::Error>((text, written_at))
    })
    .await
    .map_err(|e| format!("pages.eval_report {path}: {e}"))?;
    let (text, written_at) = read.map_err(|e| format!("pages.eval_report {path}: {e}"))?;
    overview::parse_eval(path, &text, written_at)
}
