//! API keys with roles (admin > writer > reader). Keys are compared by SHA-256 digest.
//! `Authorization: Bearer KEY` or `X-Api-Key: KEY`.

use std::collections::HashMap;
use std::future::{ready, Ready};
use std::sync::{Arc, RwLock};

use actix_web::{dev::Payload, web, FromRequest, HttpRequest};
use sha2::{Digest, Sha256};

use super::problem::ApiError;
use super::AppState;
use crate::config::{AuthMode, Role};

/// The key table the server checks against: the configured keys (fixed for the life of
/// the process) and the keys stored in the database (replaced by [`Keys::set_stored`]
/// when the server reloads them, so `dprec keys create/revoke` reach a running server).
#[derive(Debug, Clone)]
pub struct Keys {
    pub mode: AuthMode,
    configured: HashMap<String, Role>,
    stored: Arc<RwLock<HashMap<String, Role>>>,
}

pub fn hash_key(key: &str) -> String {
    let d = Sha256::digest(key.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// A fresh random key (256 bits, hex).
pub fn generate_key() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "dprec_{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

pub fn parse_role(s: &str) -> Option<Role> {
    match s {
        "admin" => Some(Role::Admin),
        "writer" => Some(Role::Writer),
        "reader" => Some(Role::Reader),
        _ => None,
    }
}

impl Keys {
    /// `configured` and `stored`: (SHA-256 hex of the key, role).
    pub fn new(
        mode: AuthMode,
        configured: impl IntoIterator<Item = (String, Role)>,
        stored: impl IntoIterator<Item = (String, Role)>,
    ) -> Self {
        Self {
            mode,
            configured: configured.into_iter().collect(),
            stored: Arc::new(RwLock::new(stored.into_iter().collect())),
        }
    }

    /// Replaces the stored keys (e.g. after `dprec keys revoke`).
    pub fn set_stored(&self, stored: impl IntoIterator<Item = (String, Role)>) {
        let fresh: HashMap<String, Role> = stored.into_iter().collect();
        *self.stored.write().unwrap_or_else(|e| e.into_inner()) = fresh;
    }

    fn role_of(&self, hash: &str) -> Option<Role> {
        self.configured.get(hash).copied().or_else(|| {
            self.stored
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(hash)
                .copied()
        })
    }

    /// The role granted to the request, or the error to answer with.
    pub fn check(&self, req: &HttpRequest, need: Role) -> Result<Role, ApiError> {
        if self.mode == AuthMode::Disabled {
            return Ok(Role::Admin);
        }
        let h = req.headers();
        let key = h
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| {
                h.get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(|s| s.trim().to_string())
            });
        let Some(key) = key else {
            return Err(ApiError::unauthorized(
                "an API key is required (Authorization: Bearer KEY or X-Api-Key)",
            ));
        };
        let Some(role) = self.role_of(&hash_key(&key)) else {
            return Err(ApiError::unauthorized("unknown API key"));
        };
        if role < need {
            return Err(ApiError::forbidden(format!(
                "this operation needs the {need:?} role; the key has {role:?}"
            )));
        }
        Ok(role)
    }
}

macro_rules! role_extractor {
    ($name:ident, $role:expr) => {
        /// Request guard: the caller holds at least this role.
        pub struct $name;

        impl FromRequest for $name {
            type Error = ApiError;
            type Future = Ready<Result<Self, ApiError>>;

            fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
                let r = match req.app_data::<web::Data<AppState>>() {
                    Some(state) => state.keys.check(req, $role).map(|_| $name),
                    None => Err(ApiError::internal("application state missing")),
                };
                ready(r)
            }
        }
    };
}

role_extractor!(ReaderKey, Role::Reader);
role_extractor!(WriterKey, Role::Writer);
role_extractor!(AdminKey, Role::Admin);
