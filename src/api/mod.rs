//! The HTTP API: thin handlers over the store, the ledger and the served model.

pub mod admin;
pub mod auth;
pub mod docs;
pub mod domain;
pub mod health;
pub mod items;
pub mod json_out;
pub mod keyring;
pub mod models;
pub mod openapi;
pub mod pages;
pub mod predict;
pub mod private_gd;
pub mod problem;
pub mod ratings;
pub mod recommend;
pub mod users;

use std::sync::Arc;

use actix_web::{http::header, web, HttpRequest};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use utoipa::IntoParams;

use crate::config::Settings;
use crate::data::RatingScale;
use crate::metrics::Metrics;
use crate::release::Retrainer;
use crate::serve::Registry;
use crate::store::Store;
pub use problem::{ApiError, Problem};

/// Shared state of every handler.
pub struct AppState {
    pub store: Store,
    pub registry: Arc<Registry>,
    pub retrainer: Arc<Retrainer>,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    pub keys: auth::Keys,
    /// The server secret page links are signed with (`pages::secret`), not in the store.
    pub link_keys: pages::secret::LinkKeys,
    pub scale: RatingScale,
    /// Deleted flags and rated items per user, so top-N is served from memory.
    pub user_facts: Arc<crate::serve::facts::UserFactsCache>,
    /// Ingestion's store transactions run here ([`crate::lanes`]).
    pub write_lane: Arc<crate::lanes::Lane>,
    /// The API document and its HTML page, made once at start-up (the handlers that serve
    /// them need not know how the document is built).
    pub documents: Arc<Documents>,
}

/// The API document (`/openapi.json`) and its page (`/docs`).
#[derive(Debug, Clone)]
pub struct Documents {
    pub spec_json: String,
    pub docs_page: String,
}

/// Reads a JSON body: `application/json` only, at most `max_body_bytes`, unknown fields
/// and trailing data rejected, type errors reported with the JSON path of the field.
pub async fn json_body<T: DeserializeOwned>(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<T, ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if mime != "application/json" {
        return Err(ApiError::unsupported_media(format!(
            "expected Content-Type application/json, got {ct:?}"
        )));
    }
    if let Some(charset) = charset_param(ct) {
        if !charset.eq_ignore_ascii_case("utf-8") {
            return Err(ApiError::unsupported_media(format!(
                "JSON bodies must be UTF-8 (RFC 8259); charset={charset} is not accepted"
            )));
        }
    }
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
    {
        if len > limit {
            return Err(ApiError::too_large(format!(
                "body of {len} bytes exceeds the limit of {limit}"
            )));
        }
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| ApiError::malformed(format!("reading body: {e}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::too_large(format!(
                "body exceeds the limit of {limit} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    // Every body this API reads is an object (or `null` where the body is optional);
    // serde would read an array positionally into a struct and then complain about its
    // first element, so an array is refused here, in JSON's words.
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ApiError::invalid(
            "body",
            "expected an object, got an array",
        ));
    }
    parse_json(&body)
}

/// An optional JSON body: an empty one (or none) means `T::default()`; otherwise a JSON
/// `T` or `null` (415 for another content type), read as [`json_body`] reads it.
pub async fn optional_json_body<T: DeserializeOwned + Default>(
    req: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<T, ApiError> {
    let len = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_string());
    let typed = req.headers().contains_key(header::CONTENT_TYPE);
    if len.as_deref() == Some("0") || (!typed && len.is_none()) {
        return Ok(T::default());
    }
    // The spec allows a JSON `null` too (an optional body, as generated clients send it).
    let body: Option<T> = json_body(req, payload, limit).await?;
    Ok(body.unwrap_or_default())
}

/// The `charset` parameter of a Content-Type value, unquoted (`None` when absent).
fn charset_param(ct: &str) -> Option<String> {
    ct.split(';').skip(1).find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches('"').to_string())
    })
}

/// Parses JSON with the path of the failing field.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let field = if path == "." {
            "body".to_string()
        } else {
            path
        };
        match inner.classify() {
            serde_json::error::Category::Data => {
                ApiError::invalid(field, json_type_error(&inner.to_string()))
            }
            serde_json::error::Category::Syntax if not_a_json_number(body, &inner) => {
                ApiError::malformed(format!(
                    "{field} must be a finite JSON number: NaN and Infinity are not JSON \
                     (RFC 8259), at line {} column {}",
                    inner.line(),
                    inner.column()
                ))
                .with_field(field)
            }
            _ => ApiError::malformed(format!("malformed JSON: {inner}")),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::malformed(format!("malformed JSON: {e}")))?;
    Ok(value)
}

/// A query string parsed into `T` (actix's `web::Query` with better errors): a value
/// that does not parse, or an unknown parameter, is a 422 "Invalid query" whose `field`
/// is the parameter's name and whose detail says what it must be.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<T> Query<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> std::ops::Deref for Query<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: DeserializeOwned> actix_web::FromRequest for Query<T> {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        std::future::ready(parse_query(req.query_string()).map(Query))
    }
}

/// Parses a query string into `T`, naming the failing parameter ([`Query`]).
pub fn parse_query<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
    let de = || serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    // The path of a failing field is tracked only when there is one to name (the same
    // parse again): tracking costs every request.
    if let Ok(v) = T::deserialize(de()) {
        return Ok(v);
    }
    serde_path_to_error::deserialize(de()).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        let unknown = message
            .strip_prefix("unknown field `")
            .and_then(|m| m.split('`').next())
            .map(str::to_string);
        let field = unknown.unwrap_or(path);
        let value = form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| *k == field)
            .map(|(_, v)| v.into_owned());
        query_error(&field, &message, value.as_deref())
    })
}

/// The 422 for query parameter `field` that failed with serde's `message`.
fn query_error(field: &str, message: &str, value: Option<&str>) -> ApiError {
    let field = if field.is_empty() || field == "." || field == "?" {
        "query"
    } else {
        field
    };
    let rule = if message.contains("digit")
        || message.contains("parse integer")
        || message.contains("fit in target type")
    {
        format!("{field} must be a whole number in the parameter's range")
    } else if message.contains("`true` or `false`") {
        format!("{field} must be true or false")
    } else if message.contains("float") {
        format!("{field} must be a number")
    } else if message.starts_with("unknown field") {
        format!("unknown query parameter {field}: {message}")
    } else {
        format!("{field}: {message}")
    };
    let detail = match value {
        Some(v) if !message.starts_with("unknown field") => format!("{rule}, got {v:?}"),
        _ => rule,
    };
    ApiError::new(
        actix_web::http::StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid query",
        detail,
    )
    .with_field(field)
}

/// The answer to a query actix's own `web::Query` refused (only `users::audit` still
/// takes one, a [`Page`]): the query is parsed again as a [`Page`] to name the
/// parameter; failing that, the field is `query`.
pub fn untyped_query_error(req: &HttpRequest, message: &str) -> ApiError {
    match parse_query::<Page>(req.query_string()) {
        Err(e) if e.field.as_deref().is_some_and(|f| f != "query") => e,
        _ => query_error("query", message, None),
    }
}

/// Whether a JSON syntax error sits on `NaN`, `Infinity` or `-Infinity` (what some
/// encoders write for non-finite floats).
fn not_a_json_number(body: &[u8], e: &serde_json::Error) -> bool {
    let Some(line) = body.split(|&b| b == b'\n').nth(e.line().saturating_sub(1)) else {
        return false;
    };
    let at = e.column().saturating_sub(1).min(line.len());
    let from = at.saturating_sub(9);
    let near = String::from_utf8_lossy(&line[from..(at + 9).min(line.len())]).into_owned();
    near.contains("NaN") || near.contains("Infinity")
}

/// serde's "invalid type: sequence, expected struct RatingBatch" in JSON's words:
/// "expected an object, got an array". Other messages are kept.
fn json_type_error(message: &str) -> String {
    let Some(rest) = message.strip_prefix("invalid type: ") else {
        return message.to_string();
    };
    let Some((got, expected)) = rest.split_once(", expected ") else {
        return message.to_string();
    };
    let (expected, at) = match expected.find(" at line ") {
        Some(i) => expected.split_at(i),
        None => (expected, ""),
    };
    let got_json = if got == "sequence" {
        "an array".to_string()
    } else if got == "map" {
        "an object".to_string()
    } else if got.starts_with("string") {
        format!("a {got}")
    } else if got.starts_with("integer") || got.starts_with("floating point") {
        let value = got.find('`').map_or("", |i| &got[i..]);
        format!("a number {value}").trim_end().to_string()
    } else if got.starts_with("boolean") {
        format!("a {got}")
    } else if got == "null" || got == "unit value" {
        "null".to_string()
    } else {
        got.to_string()
    };
    let expected_json =
        if expected.starts_with("struct ") || expected.starts_with("a map") || expected == "map" {
            "an object".to_string()
        } else if expected.contains("sequence") {
            "an array".to_string()
        } else if ["f64", "f32"].contains(&expected) {
            "a number".to_string()
        } else if expected.starts_with('u') || expected.starts_with('i') {
            if expected[1..].parse::<u32>().is_ok() {
                "an integer".to_string()
            } else {
                expected.to_string()
            }
        } else {
            expected.to_string()
        };
    format!("expected {expected_json}, got {got_json}{at}")
}

/// Pagination parameters.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct Page {
    /// At most this many entries (1..=1000, default 100).
    pub limit: Option<i64>,
    /// Entries to skip (0..=1000000000, default 0).
    pub offset: Option<i64>,
}

/// The largest `offset` (and `roffset`) any list takes: far above any store's row
/// count, and small enough that `offset + limit` and the pages' "showing a to b" never
/// overflow.
pub const MAX_OFFSET: i64 = 1_000_000_000;

/// An offset query parameter named `field`: absent is 0; outside `0..=MAX_OFFSET` is a
/// 422 naming the field.
pub fn parse_offset(field: &str, v: Option<i64>) -> Result<i64, ApiError> {
    let v = v.unwrap_or(0);
    if !(0..=MAX_OFFSET).contains(&v) {
        return Err(ApiError::invalid(
            field,
            format!("{field} must be in 0..={MAX_OFFSET}, got {v}"),
        ));
    }
    Ok(v)
}

impl Page {
    pub fn parse(&self) -> Result<(i64, i64), ApiError> {
        let limit = self.limit.unwrap_or(100);
        if !(1..=1000).contains(&limit) {
            return Err(ApiError::invalid("limit", "limit must be in 1..=1000"));
        }
        Ok((limit, parse_offset("offset", self.offset)?))
    }
}

/// Parses a path id (user or item) with the configured length limit.
pub fn path_id(state: &AppState, field: &str, raw: &str) -> Result<domain::Id, ApiError> {
    domain::Id::parse(raw, state.settings.ratings.max_id_len)
        .map_err(|e| ApiError::invalid(field, format!("{field} {e}")))
}

/// [`path_id`] without the copy (ids only checked, e.g. items named in a query).
pub fn check_id(state: &AppState, field: &str, raw: &str) -> Result<(), ApiError> {
    domain::Id::check(raw, state.settings.ratings.max_id_len)
        .map_err(|e| ApiError::invalid(field, format!("{field} {e}")))
}

/// Every route's pattern and the methods it answers, in the form of an `Allow` header.
/// The 405 handler sends this list; a test checks it against the routes below.
pub const ALLOWED_METHODS: &[(&str, &str)] = &[
    ("/", "GET, HEAD"),
    ("/healthz", "GET, HEAD"),
    ("/readyz", "GET, HEAD"),
    ("/metrics", "GET, HEAD"),
    ("/openapi.json", "GET, HEAD"),
    ("/docs", "GET, HEAD"),
    ("/v1/ratings", "POST"),
    ("/v1/users/{user}/ratings/{item}", "DELETE"),
    ("/v1/users/{user}", "DELETE"),
    ("/v1/users/{user}/settings", "GET, HEAD, PUT"),
    ("/v1/users/{user}/budget", "GET, HEAD"),
    ("/v1/users/{user}/receipt", "GET, HEAD"),
    ("/v1/users/{user}/receipt/links", "POST"),
    ("/v1/users/{user}/recommendations", "GET, HEAD"),
    ("/v1/users/{user}/predictions", "GET, HEAD"),
    ("/v1/items", "GET, HEAD"),
    ("/v1/items/{item}/similar", "GET, HEAD"),
    ("/v1/models", "GET, HEAD"),
    ("/v1/models/current", "GET, HEAD"),
    ("/v1/models/current/items", "GET, HEAD"),
    ("/v1/models/current/users/{user}", "GET, HEAD"),
    ("/v1/admin/items", "POST"),
    ("/v1/admin/retrain", "POST"),
    ("/v1/admin/jobs/{id}", "GET, HEAD"),
    ("/v1/admin/keys", "GET, HEAD, POST"),
    ("/v1/admin/keys/{id}", "DELETE"),
    ("/v1/admin/overview", "GET, HEAD"),
    ("/v1/admin/overview/links", "POST"),
    ("/v1/private-gd/round", "GET, HEAD"),
    ("/v1/private-gd/reports", "POST"),
    ("/v1/admin/private-gd/rounds", "POST"),
];

/// The `Allow` value of a matched route pattern.
pub fn allowed_methods(pattern: &str) -> Option<&'static str> {
    ALLOWED_METHODS
        .iter()
        .find(|(p, _)| *p == pattern)
        .map(|(_, m)| *m)
}

/// The longest request target (path and query) the service reads, in bytes. Longer ones
/// get 414 problem+json. (Targets over 65,534 bytes never reach the application: actix-http
/// refuses them while parsing the request head, with an empty 400; over 128 KiB of head,
/// an empty 431. A reverse proxy in front should cap URLs below that, see deploy/.)
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// GET routes also answer HEAD (RFC 9110 9.3.2: same headers, no body; actix drops the
/// body of a response to HEAD).
fn get() -> actix_web::Route {
    use actix_web::guard;
    web::route().guard(guard::Any(guard::Get()).or(guard::Head()))
}

/// Routes of the service. Each path is one resource, so a wrong method is a 405 (with
/// `Allow` from [`ALLOWED_METHODS`]).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/").route(get().to(health::root)))
        .service(web::resource("/healthz").route(get().to(health::healthz)))
        .service(web::resource("/readyz").route(get().to(health::readyz)))
        .service(web::resource("/metrics").route(get().to(health::metrics)))
        .service(web::resource("/openapi.json").route(get().to(health::openapi_json)))
        .service(web::resource("/docs").route(get().to(health::docs)))
        .service(
            // Patterns with a `{segment}` are tried in this order, each a regex match:
            // the hot reads first (no two patterns here match the same path).
            web::scope("/v1")
                .service(
                    web::resource("/users/{user}/recommendations")
                        .route(get().to(recommend::recommendations)),
                )
                .service(
                    web::resource("/users/{user}/predictions")
                        .route(get().to(predict::predictions)),
                )
                .service(web::resource("/ratings").post(ratings::ingest))
                .service(
                    web::resource("/users/{user}/ratings/{item}").delete(ratings::delete_rating),
                )
                .service(web::resource("/users/{user}").delete(users::delete_user))
                .service(
                    web::resource("/users/{user}/settings")
                        .route(get().to(users::get_settings))
                        .put(users::put_settings),
                )
                .service(web::resource("/users/{user}/budget").route(get().to(users::audit)))
                .service(web::resource("/users/{user}/receipt").route(get().to(pages::receipt)))
                .service(web::resource("/users/{user}/receipt/links").post(pages::receipt_link))
                .service(web::resource("/items").route(get().to(items::list)))
                .service(web::resource("/items/{item}/similar").route(get().to(recommend::similar)))
                .service(web::resource("/models").route(get().to(models::list)))
                .service(web::resource("/models/current").route(get().to(models::current)))
                .service(
                    web::resource("/models/current/items").route(get().to(models::item_profiles)),
                )
                .service(
                    web::resource("/models/current/users/{user}")
                        .route(get().to(models::user_profile)),
                )
                .service(web::resource("/admin/items").post(items::register))
                .service(web::resource("/admin/retrain").post(admin::retrain))
                .service(web::resource("/admin/jobs/{id}").route(get().to(admin::job)))
                .service(
                    web::resource("/admin/keys")
                        .route(get().to(admin::list_keys))
                        .post(admin::create_key),
                )
                .service(web::resource("/admin/keys/{id}").delete(admin::revoke_key))
                .service(web::resource("/admin/overview").route(get().to(pages::overview)))
                .service(web::resource("/admin/overview/links").post(pages::overview_link))
                .service(web::resource("/private-gd/round").route(get().to(private_gd::round)))
                .service(web::resource("/private-gd/reports").post(private_gd::report))
                .service(web::resource("/admin/private-gd/rounds").post(private_gd::advance)),
        );
}
