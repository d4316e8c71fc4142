//! RFC 7807 problem+json errors, with the offending field (e.g. `ratings[3].eps`).

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::store::StoreError;

/// An RFC 7807 problem document.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"type": "about:blank", "title": "Invalid field", "status": 422,
    "detail": "eps must be > 0 and <= 10, got 0", "field": "ratings[3].eps"}))]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// The offending field, as a JSON path with batch indices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// Seconds a client waits before retrying a 503 (sent as `Retry-After`).
pub const RETRY_AFTER_SECS: u32 = 1;

/// Reference numbers that tie a 500's body to its log line (process-local, increasing).
fn next_reference() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Every error a handler returns.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub title: &'static str,
    pub detail: String,
    pub field: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, title: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            title,
            detail: detail.into(),
            field: None,
        }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn malformed(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Malformed request", detail)
    }

    pub fn invalid(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid field", detail).with_field(field)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "Not found", detail)
    }

    pub fn unauthorized(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", detail)
    }

    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", detail)
    }

    pub fn too_large(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "Payload too large", detail)
    }

    pub fn unsupported_media(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported media type",
            detail,
        )
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", detail)
    }

    /// A 500. The detail is logged server-side with a reference number; the body carries
    /// only that reference, never internal (database, file, stack) text.
    pub fn internal(detail: impl Into<String>) -> Self {
        let reference = next_reference();
        log::error!("internal error (reference {reference}): {}", detail.into());
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal error",
            format!("internal error; the server log has the details under reference {reference}"),
        )
    }

    /// A 503 for a store that is busy (lock contention, pool exhausted): the client retries
    /// after [`RETRY_AFTER_SECS`] (sent as `Retry-After`).
    pub fn busy(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "Busy", detail)
    }

    pub fn problem(&self) -> Problem {
        Problem {
            kind: "about:blank".into(),
            title: self.title.into(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            field: self.field.clone(),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.title,
            self.detail
        )
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut b = HttpResponse::build(self.status);
        b.insert_header((header::CONTENT_TYPE, "application/problem+json"));
        if self.status == StatusCode::UNAUTHORIZED {
            b.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            b.insert_header((header::RETRY_AFTER, RETRY_AFTER_SECS.to_string()));
        }
        b.body(serde_json::to_string(&self.problem()).unwrap_or_default())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => Self::not_found("not found"),
            StoreError::NotInCatalogue(item) => Self::invalid(
                "item",
                format!("item {item:?} is not in the catalogue (POST /v1/admin/items)"),
            ),
            StoreError::Conflict(detail) => {
                Self::new(StatusCode::CONFLICT, "Conflict", detail).with_field("ratings")
            }
            e if is_contention(&e) => {
                log::warn!("store busy, answered 503: {e}");
                Self::busy("the store is busy; retry shortly")
            }
            other => Self::internal(format!("store error: {other}")),
        }
    }
}

/// Lock contention or an exhausted pool: transient, so a 503 with `Retry-After`, not a 500.
/// SQLite reports a held write lock as SQLITE_BUSY (code 5, "database is locked") or
/// SQLITE_LOCKED (code 6) once `busy_timeout` has passed; the pool reports a wait longer
/// than its acquire timeout as `PoolTimedOut`. PostgreSQL's `lock_not_available` (55P03),
/// `serialization_failure` (40001) and `deadlock_detected` (40P01: the server aborted
/// this transaction to break a lock cycle; a retry succeeds) are the same kind of
/// condition (issue 12).
pub fn is_contention(e: &StoreError) -> bool {
    match e {
        StoreError::Db(e) => is_db_contention(e),
        _ => false,
    }
}

/// [`is_contention`] for a bare sqlx error.
pub fn is_db_contention(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(d) => {
            let code = d.code().unwrap_or_default();
            // Extended SQLite codes keep the primary code in the low byte (517 = BUSY_SNAPSHOT).
            let sqlite_busy = code
                .parse::<i64>()
                .map(|c| matches!(c & 0xff, 5 | 6))
                .unwrap_or(false);
            sqlite_busy || matches!(code.as_ref(), "55P03" | "40001" | "40P01")
        }
        _ => false,
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        let busy = e.downcast_ref::<StoreError>().is_some_and(is_contention)
            || e.downcast_ref::<sqlx::Error>()
                .is_some_and(is_db_contention);
        if busy {
            log::warn!("store busy, answered 503: {e:#}");
            return Self::busy("the store is busy; retry shortly");
        }
        Self::internal(format!("{e:#}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::MessageBody;

    fn body_of(e: &ApiError) -> (StatusCode, String, Option<String>) {
        let res = e.error_response();
        let retry = res
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_string());
        let status = res.status();
        let bytes = res.into_body().try_into_bytes().unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap(), retry)
    }

    #[test]
    fn internal_errors_carry_no_internal_text() {
        let secret = "no such table: ledger_secret_table at /var/lib/dprec/dprec.sqlite";
        let from_store: ApiError = StoreError::Db(sqlx::Error::Protocol(secret.to_string())).into();
        let from_corrupt: ApiError = StoreError::Corrupt(secret.to_string()).into();
        let from_anyhow: ApiError = anyhow::anyhow!(secret.to_string()).into();
        for e in [from_store, from_corrupt, from_anyhow] {
            let (status, body, _) = body_of(&e);
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
            assert!(!body.contains("ledger_secret_table"), "{body}");
            assert!(!body.contains("/var/lib"), "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["status"], 500);
            assert!(
                v["detail"].as_str().unwrap().contains("reference"),
                "{body}"
            );
        }
    }

    #[test]
    fn contention_is_503_with_retry_after() {
        let e: ApiError = StoreError::Db(sqlx::Error::PoolTimedOut).into();
        let (status, body, retry) = body_of(&e);
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry.as_deref(), Some("1"));
        assert!(body.contains("busy"), "{body}");
        let e: ApiError = anyhow::Error::from(StoreError::Db(sqlx::Error::PoolTimedOut)).into();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        // Not every database error is contention.
        let e: ApiError = StoreError::Db(sqlx::Error::RowNotFound).into();
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    /// A database error with a given SQLSTATE / SQLite code, as the drivers report it.
    #[derive(Debug)]
    struct CodedError(&'static str);

    impl std::fmt::Display for CodedError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error with code {} in table secret_ledger_table", self.0)
        }
    }

    impl std::error::Error for CodedError {}

    impl sqlx::error::DatabaseError for CodedError {
        fn message(&self) -> &str {
            "coded error in table secret_ledger_table"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn coded(code: &'static str) -> StoreError {
        StoreError::Db(sqlx::Error::Database(Box::new(CodedError(code))))
    }

    /// Issue 12: PostgreSQL's deadlock_detected (40P01) and serialization_failure (40001)
    /// are transient like SQLite's "database is locked": 503 + Retry-After, through both
    /// conversions (StoreError and anyhow), never a 500 with the database's text. Other
    /// SQLSTATEs (unique_violation 23505, the 40 class's other codes) stay 500.
    #[test]
    fn postgres_deadlock_and_serialization_failure_are_503() {
        for code in ["40P01", "40001", "55P03", "5", "6", "517", "262"] {
            let (status, body, retry) = body_of(&coded(code).into());
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{code}: {body}");
            assert_eq!(retry.as_deref(), Some("1"), "{code}");
            assert!(!body.contains("secret_ledger_table"), "{code}: {body}");
            let e: ApiError = anyhow::Error::from(coded(code))
                .context("ingesting a batch")
                .into();
            assert_eq!(
                e.status,
                StatusCode::SERVICE_UNAVAILABLE,
                "{code} via anyhow"
            );
        }
        for code in ["23505", "40002", "40003", "42P01", "1", "19"] {
            let (status, body, retry) = body_of(&coded(code).into());
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{code}: {body}");
            assert_eq!(retry, None, "{code}");
        }
    }
}
