//! API keys by id, and the role checks a new key passes: shared by the HTTP key endpoints
//! (`/v1/admin/keys`) and `dprec keys`, so both name, find and refuse keys alike.

use crate::api::auth;
use crate::store::ApiKeyRow;

/// Length of a key id (hex digits of the key's SHA-256).
pub const KEY_ID_LEN: usize = 12;

/// The id shown for a key hash.
pub fn key_id(hash: &str) -> &str {
    &hash[..KEY_ID_LEN.min(hash.len())]
}

/// Why a key id does not name exactly one stored key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyIdError {
    #[error("key id {0:?}: expected at least 6 hex digits, as printed by `dprec keys list`")]
    Malformed(String),
    #[error(
        "no stored key has id {0} (`dprec keys list` shows the ids; keys from the config \
         file are removed from the file)"
    )]
    Unknown(String),
    #[error("key id {0} matches {1} keys; give more digits")]
    Ambiguous(String, usize),
}

/// The one stored key whose hash starts with `id` (at least 6 hex digits).
pub fn find_by_id(rows: Vec<ApiKeyRow>, id: &str) -> Result<ApiKeyRow, KeyIdError> {
    let id = id.trim().to_ascii_lowercase();
    if id.len() < 6 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(KeyIdError::Malformed(id));
    }
    let mut matching: Vec<_> = rows
        .into_iter()
        .filter(|k| k.hash.starts_with(&id))
        .collect();
    match matching.len() {
        0 => Err(KeyIdError::Unknown(id)),
        1 => Ok(matching.remove(0)),
        n => Err(KeyIdError::Ambiguous(id, n)),
    }
}

/// Checks a role and user pair: a `user` token needs its user (a valid id), the other
/// roles take none. Returns the user to store.
pub fn check_role_user(
    role: &str,
    user: Option<&str>,
    max_id_len: usize,
) -> Result<Option<String>, String> {
    if auth::parse_role(role).is_none() {
        return Err(format!(
            "unknown role {role:?}: expected admin, writer, reader, user, public or metrics"
        ));
    }
    match (role, user) {
        ("user", None) => Err("a user token needs the user it is bound to".into()),
        ("user", Some(u)) => crate::api::domain::Id::parse(u, max_id_len)
            .map(|id| Some(id.into_string()))
            .map_err(|e| format!("user {e}")),
        (_, Some(_)) => Err(format!(
            "only a user token is bound to a user; role {role} takes no user"
        )),
        (_, None) => Ok(None),
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn time_utc(ms: i64) -> String {
    // Days since the epoch to a civil date (Howard Hinnant's algorithm).
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
