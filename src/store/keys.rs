//! API keys (hashed), with the user a user token is bound to.

use sqlx::Row;

use super::{now_ms, Store, StoreError};

impl Store {
    pub async fn api_key_count(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query("SELECT COUNT(*) FROM api_keys")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?)
    }

    /// Stores a key's SHA-256 with its role; `user` is the user a `user` token is bound
    /// to (`None` for every other role). Returns the creation time (ms).
    pub async fn insert_api_key(
        &self,
        hash: &str,
        role: &str,
        user: Option<&str>,
    ) -> Result<i64, StoreError> {
        let now = now_ms();
        sqlx::query(
            "INSERT INTO api_keys (key_hash, role, user_id, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(hash)
        .bind(role)
        .bind(user)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(now)
    }

    /// Every stored key with its creation time (for `dprec keys list` and
    /// `GET /v1/admin/keys`), oldest first.
    pub async fn api_key_rows(&self) -> Result<Vec<ApiKeyRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT key_hash, role, user_id, created_at FROM api_keys \
             ORDER BY created_at, key_hash",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(ApiKeyRow {
                    hash: r.try_get(0)?,
                    role: r.try_get(1)?,
                    user: r.try_get(2)?,
                    created_at: r.try_get(3)?,
                })
            })
            .collect()
    }

    /// Deletes a stored key by its hash; false when there was none.
    pub async fn delete_api_key(&self, hash: &str) -> Result<bool, StoreError> {
        let r = sqlx::query("DELETE FROM api_keys WHERE key_hash = $1")
            .bind(hash)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }
}

/// A stored API key (its SHA-256, never the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRow {
    pub hash: String,
    pub role: String,
    /// The user a `user` token is bound to.
    pub user: Option<String>,
    pub created_at: i64,
}
