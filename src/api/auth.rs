//! Scoped API keys (DESIGN 6). `Authorization: Bearer KEY` or `X-Api-Key: KEY`; keys are
//! compared by SHA-256 digest.
//!
//! | role     | may call                                                                    |
//! |----------|-----------------------------------------------------------------------------|
//! | `public` | the published DP model, the release list and the item catalogue            |
//! |          | (`/v1/models*`, `/v1/items`, similar items)                                 |
//! | `user`   | the above, and its OWN user's recommendations, budget audit, settings and   |
//! |          | published profile (a token is bound to one user id; 403 for any other user) |
//! | `reader` | service reader (the curator's backend): every read, for every user          |
//! | `writer` | reader, plus ingestion, deletion, settings and item registration            |
//! | `admin`  | everything, including retrains, jobs and key management                     |
//! | `metrics`| the full `/metrics` only (a Prometheus scraper's bearer token)              |
//!
//! Without a metrics or admin key `/metrics` shows only series that do not depend on the
//! data (the served release id and its publication time); request counts, statuses and
//! latencies count what callers send and stay behind the key.
//!
//! Roles are ordered metrics < public < user < reader < writer < admin (a metrics key
//! passes no route's check but `/metrics`'s); a route names the lowest
//! role it accepts ([`AnyKey`], [`UserKey`], [`ReaderKey`], [`WriterKey`], [`AdminKey`]).
//! A route about one user that a user token may call takes [`UserKey`] and asks
//! [`Grant::for_user`] before it looks anything up, so the 403 does not depend on whether
//! the other user exists.

use std::future::{ready, Ready};
use std::sync::Arc;

use arc_swap::ArcSwap;

use actix_web::http::header::{self, HeaderName};
use actix_web::{dev::Payload, web, FromRequest, HttpRequest};
use sha2::{Digest, Sha256};

use super::problem::ApiError;
use super::AppState;
use crate::config::{AuthMode, Role};
use crate::store::{Store, StoreError};

/// What a key grants: its role and, for a user token, the user it is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub role: Role,
    /// `Some` exactly for `Role::User`.
    pub user: Option<String>,
}

impl Grant {
    pub fn role(role: Role) -> Self {
        Self { role, user: None }
    }

    /// A user token bound to `user`.
    pub fn user_token(user: impl Into<String>) -> Self {
        Self {
            role: Role::User,
            user: Some(user.into()),
        }
    }

    /// Whether the key may read `user`'s own data: a service reader (or higher), or a
    /// user token bound to `user`.
    pub fn may_read_user(&self, user: &str) -> bool {
        self.role >= Role::Reader || self.is_token_of(user)
    }

    /// Whether this is a user token bound to `user`.
    pub fn is_token_of(&self, user: &str) -> bool {
        self.role == Role::User && self.user.as_deref() == Some(user)
    }

    /// `Ok` when the key may read `user`'s data, else 403.
    pub fn for_user(&self, user: &str) -> Result<(), ApiError> {
        if self.may_read_user(user) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "this key may not read or change user {user:?} (a user token reaches its own \
                 user only; a public key reaches no user)"
            )))
        }
    }
}

/// The key table the server checks against: the configured keys (fixed for the life of
/// the process) and the keys stored in the database (replaced by [`Keys::set_stored`]
/// when the server reloads them, so `dprec keys create/revoke` and `/v1/admin/keys` reach
/// a running server).
#[derive(Debug, Clone)]
pub struct Keys {
    pub mode: AuthMode,
    configured: KeyMap,
    /// Read on every request without a lock; replaced whole.
    stored: Arc<ArcSwap<KeyMap>>,
}

/// SHA-256 hex of a key -> its grant.
type KeyMap = foldhash::HashMap<String, Grant>;

pub fn hash_key(key: &str) -> String {
    HexDigest::of(key).as_str().to_string()
}

/// The SHA-256 of a key in hex, on the stack: a request's key is checked without an
/// allocation.
struct HexDigest([u8; 64]);

impl HexDigest {
    fn of(key: &str) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let d = Sha256::digest(key.as_bytes());
        let mut hex = [0u8; 64];
        for (k, b) in d.iter().enumerate() {
            hex[2 * k] = HEX[usize::from(b >> 4)];
            hex[2 * k + 1] = HEX[usize::from(b & 15)];
        }
        Self(hex)
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

/// A fresh random key (256 bits, hex).
pub fn generate_key() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "dprec_{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// The stored and JSON name of a role.
pub fn role_name(r: Role) -> &'static str {
    match r {
        Role::Metrics => "metrics",
        Role::Public => "public",
        Role::User => "user",
        Role::Reader => "reader",
        Role::Writer => "writer",
        Role::Admin => "admin",
    }
}

pub fn parse_role(s: &str) -> Option<Role> {
    match s {
        "admin" => Some(Role::Admin),
        "writer" => Some(Role::Writer),
        "reader" => Some(Role::Reader),
        "user" => Some(Role::User),
        "public" => Some(Role::Public),
        "metrics" => Some(Role::Metrics),
        _ => None,
    }
}

/// A stored key row as a grant: `None` for an unknown role, or a user token without its
/// user (or another role with one), which then grants nothing.
pub fn grant_of(role: &str, user: Option<String>) -> Option<Grant> {
    let role = parse_role(role)?;
    match (role, user) {
        (Role::User, Some(u)) => Some(Grant::user_token(u)),
        (Role::User, None) | (_, Some(_)) => None,
        (r, None) => Some(Grant::role(r)),
    }
}

/// The keys stored in the database (created by the first start, `dprec keys` or
/// `/v1/admin/keys`) as (SHA-256, grant).
pub async fn stored_grants(store: &Store) -> Result<Vec<(String, Grant)>, StoreError> {
    Ok(store
        .api_key_rows()
        .await?
        .into_iter()
        .filter_map(|k| grant_of(&k.role, k.user).map(|g| (k.hash, g)))
        .collect())
}

impl Keys {
    /// `configured` and `stored`: (SHA-256 hex of the key, grant).
    pub fn new(
        mode: AuthMode,
        configured: impl IntoIterator<Item = (String, Grant)>,
        stored: impl IntoIterator<Item = (String, Grant)>,
    ) -> Self {
        Self {
            mode,
            configured: configured.into_iter().collect(),
            stored: Arc::new(ArcSwap::from_pointee(stored.into_iter().collect())),
        }
    }

    /// Replaces the stored keys (e.g. after `dprec keys revoke`).
    pub fn set_stored(&self, stored: impl IntoIterator<Item = (String, Grant)>) {
        let fresh: KeyMap = stored.into_iter().collect();
        self.stored.store(Arc::new(fresh));
    }

    /// Re-reads the stored keys now (after a key is created or revoked through the API).
    pub async fn reload(&self, store: &Store) -> Result<(), StoreError> {
        self.set_stored(stored_grants(store).await?);
        Ok(())
    }

    fn grant_of(&self, hash: &str) -> Option<Grant> {
        self.configured
            .get(hash)
            .cloned()
            .or_else(|| self.stored.load().get(hash).cloned())
    }

    /// The key of the request, if any.
    fn presented(req: &HttpRequest) -> Option<&str> {
        // Header names as constants: a `&str` name is parsed on every lookup.
        const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
        let h = req.headers();
        h.get(X_API_KEY).and_then(|v| v.to_str().ok()).or_else(|| {
            h.get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
        })
    }

    /// The grant of the request's key when its role is at least `need`, or the error to
    /// answer with.
    pub fn check(&self, req: &HttpRequest, need: Role) -> Result<Grant, ApiError> {
        if self.mode == AuthMode::Disabled {
            return Ok(Grant::role(Role::Admin));
        }
        let Some(key) = Self::presented(req) else {
            return Err(ApiError::unauthorized(
                "an API key is required (Authorization: Bearer KEY or X-Api-Key)",
            ));
        };
        let Some(grant) = self.grant_of(HexDigest::of(key).as_str()) else {
            return Err(ApiError::unauthorized("unknown API key"));
        };
        if grant.role < need {
            return Err(ApiError::forbidden(format!(
                "this operation needs the {} role or higher (public < user < reader < writer \
                 < admin; a metrics key reads /metrics only); the key has {}",
                role_name(need),
                role_name(grant.role)
            )));
        }
        Ok(grant)
    }

    /// The SHA-256 of the request's key, if it carries one (the caller checked its role).
    pub fn presented_hash(req: &HttpRequest) -> Option<String> {
        Self::presented(req).map(hash_key)
    }

    /// The SHA-256 digests of the keys (configured and stored) that start with `prefix`
    /// and whose role is at least `need`: the keys that may have minted a page link
    /// carrying `prefix` ([`super::pages::links`]). A revoked key is not among them.
    pub fn hashes_with_prefix(&self, prefix: &str, need: Role) -> Vec<String> {
        let stored = self.stored.load();
        self.configured
            .iter()
            .chain(stored.iter())
            .filter(|(h, g)| h.starts_with(prefix) && g.role >= need)
            .map(|(h, _)| h.clone())
            .collect()
    }

    /// Whether the request carries an admin key (or authentication is disabled); used
    /// where an unauthenticated caller gets a reduced answer instead of an error.
    pub fn is_admin(&self, req: &HttpRequest) -> bool {
        self.check(req, Role::Admin).is_ok()
    }

    /// Whether the request may read the full `/metrics`: a metrics key or an admin key
    /// (or authentication is disabled).
    pub fn may_scrape(&self, req: &HttpRequest) -> bool {
        self.is_admin(req)
            || matches!(self.check(req, Role::Metrics), Ok(g) if g.role == Role::Metrics)
    }
}

/// Which keys each authenticated operation accepts (path pattern, lower-case method,
/// keys), written into the OpenAPI description of the operation; a test checks that
/// every operation with a security requirement is listed.
pub const ROUTE_SCOPES: &[(&str, &str, &str)] = &[
    ("/v1/ratings", "post", "writer, admin"),
    ("/v1/users/{user}/ratings/{item}", "delete", "writer, admin"),
    ("/v1/users/{user}", "delete", "writer, admin"),
    (
        "/v1/users/{user}/settings",
        "get",
        "that user's `user` token, reader, writer, admin (403 for a public key or another \
         user's token)",
    ),
    (
        "/v1/users/{user}/settings",
        "put",
        "that user's `user` token, writer, admin (403 for a public key, a reader or another \
         user's token)",
    ),
    (
        "/v1/users/{user}/budget",
        "get",
        "that user's `user` token, reader, writer, admin (403 for a public key or another \
         user's token)",
    ),
    (
        "/v1/users/{user}/receipt",
        "get",
        "that user's `user` token, reader, writer, admin as a bearer header; or no header \
         and `?link=` minted for that user (`POST /v1/users/{user}/receipt/links`). Every \
         other request, and any request for a user that does not exist, gets the same 403 \
         (never 401)",
    ),
    (
        "/v1/users/{user}/receipt/links",
        "post",
        "reader, writer, admin (the link is signed under the server's link secret for \
         the minting key: revoking the key, or rotating the secret with `dprec keys \
         rotate-link-secret`, invalidates the link)",
    ),
    (
        "/v1/users/{user}/recommendations",
        "get",
        "that user's `user` token, reader, writer, admin (403 for a public key or another \
         user's token)",
    ),
    (
        "/v1/users/{user}/predictions",
        "get",
        "that user's `user` token, reader, writer, admin (403 for a public key or another \
         user's token)",
    ),
    (
        "/v1/items",
        "get",
        "any key: public, user, reader, writer, admin",
    ),
    ("/v1/admin/items", "post", "writer, admin"),
    (
        "/v1/items/{item}/similar",
        "get",
        "any key: public, user, reader, writer, admin",
    ),
    (
        "/v1/models",
        "get",
        "any key: public, user, reader, writer, admin",
    ),
    (
        "/v1/models/current",
        "get",
        "any key: public, user, reader, writer, admin",
    ),
    (
        "/v1/models/current/items",
        "get",
        "any key: public, user, reader, writer, admin",
    ),
    (
        "/v1/models/current/users/{user}",
        "get",
        "that user's `user` token, reader, writer, admin (403 for a public key or another \
         user's token)",
    ),
    ("/v1/admin/retrain", "post", "admin"),
    ("/v1/admin/jobs/{id}", "get", "admin"),
    ("/v1/admin/keys", "get", "admin"),
    ("/v1/admin/keys", "post", "admin"),
    ("/v1/admin/keys/{id}", "delete", "admin"),
    (
        "/v1/admin/overview",
        "get",
        "admin as a bearer header, or no header and `?link=` minted by an admin key \
         (`POST /v1/admin/overview/links`); every other request gets 403 (never 401)",
    ),
    ("/v1/admin/overview/links", "post", "admin"),
    (
        "/v1/private-gd/round",
        "get",
        "a client of the protocol: any `user` token, reader, writer, admin (403 for a public \
         key)",
    ),
    ("/v1/private-gd/reports", "post", "writer, admin"),
    ("/v1/admin/private-gd/rounds", "post", "admin"),
];

/// The keys an operation accepts, from [`ROUTE_SCOPES`].
pub fn route_scope(path: &str, method: &str) -> Option<&'static str> {
    ROUTE_SCOPES
        .iter()
        .find(|(p, m, _)| *p == path && *m == method)
        .map(|(_, _, k)| *k)
}

macro_rules! role_extractor {
    ($(#[$doc:meta])* $name:ident, $role:expr) => {
        $(#[$doc])*
        pub struct $name(pub Grant);

        impl FromRequest for $name {
            type Error = ApiError;
            type Future = Ready<Result<Self, ApiError>>;

            fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
                let r = match req.app_data::<web::Data<AppState>>() {
                    Some(state) => state.keys.check(req, $role).map($name),
                    None => Err(ApiError::internal("application state missing")),
                };
                ready(r)
            }
        }
    };
}

role_extractor!(
    /// Request guard: any valid key (public and above): the published DP model only.
    AnyKey,
    Role::Public
);
role_extractor!(
    /// Request guard: a user token or a service key; the handler must call
    /// [`Grant::for_user`] (`auth.0.for_user(user)?`) before reading the user's data.
    UserKey,
    Role::User
);
role_extractor!(
    /// Request guard: a service reader or higher.
    ReaderKey,
    Role::Reader
);
role_extractor!(
    /// Request guard: a writer or admin.
    WriterKey,
    Role::Writer
);
role_extractor!(
    /// Request guard: an admin key.
    AdminKey,
    Role::Admin
);

impl UserKey {
    /// `Ok` when the key may read `user`'s data (see [`Grant::for_user`]).
    pub fn for_user(&self, user: &str) -> Result<(), ApiError> {
        self.0.for_user(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored digests are lower-case hex SHA-256 (keys stored before stay valid).
    #[test]
    fn key_hash_is_lower_case_hex_sha256() {
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn grants_and_scopes() {
        let t = Grant::user_token("u");
        assert!(t.may_read_user("u"));
        assert!(!t.may_read_user("v"));
        assert!(!Grant::role(Role::Public).may_read_user("u"));
        assert!(Grant::role(Role::Reader).may_read_user("v"));
        assert!(Role::Public < Role::User && Role::User < Role::Reader);
        // A metrics key passes no route's check (every route needs public or higher).
        assert!(Role::Metrics < Role::Public);
        assert_eq!(grant_of("metrics", None), Some(Grant::role(Role::Metrics)));
        assert_eq!(grant_of("user", Some("u".into())), Some(t));
        assert_eq!(grant_of("user", None), None);
        assert_eq!(grant_of("reader", Some("u".into())), None);
        assert_eq!(grant_of("root", None), None);
        for r in [
            Role::Metrics,
            Role::Public,
            Role::User,
            Role::Reader,
            Role::Writer,
            Role::Admin,
        ] {
            assert_eq!(parse_role(role_name(r)), Some(r));
        }
    }
}
