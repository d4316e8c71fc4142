//! API keys (hashed).

use sqlx::Row;

use super::{now_ms, Store, StoreError};

impl Store {
    pub async fn api_key_count(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query("SELECT COUNT(*) FROM api_keys")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?)
    }

    pub async fn insert_api_key(&self, hash: &str, role: &str) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO api_keys (key_hash, role, created_at) VALUES ($1, $2, $3)")
            .bind(hash)
            .bind(role)
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn api_keys(&self) -> Result<Vec<(String, String)>, StoreError> {
        let rows = sqlx::query("SELECT key_hash, role FROM api_keys")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect()
    }

    /// Every stored key with its creation time (for `dprec keys list`).
    pub async fn api_key_rows(&self) -> Result<Vec<ApiKeyRow>, StoreError> {
        let rows =
            sqlx::query("SELECT key_hash, role, created_at FROM api_keys ORDER BY created_at")
                .fetch_all(&self.pool)
                .await?;
        rows.iter()
            .map(|r| {
                Ok(ApiKeyRow {
                    hash: r.try_get(0)?,
                    role: r.try_get(1)?,
                    created_at: r.try_get(2)?,
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
    pub created_at: i64,
}
