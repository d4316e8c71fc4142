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
}
