//! Retrain jobs and the trainer lease.

use sqlx::Row;

use super::{now_ms, Store, StoreError};

#[derive(Debug, Clone)]
pub struct JobRow {
    pub id: i64,
    pub kind: String,
    pub status: String,
    pub reason: Option<String>,
    pub release_id: Option<i64>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
}

fn job_from_row(r: &sqlx::any::AnyRow) -> Result<JobRow, StoreError> {
    Ok(JobRow {
        id: r.try_get("id")?,
        kind: r.try_get("kind")?,
        status: r.try_get("status")?,
        reason: r.try_get("reason")?,
        release_id: r.try_get("release_id")?,
        created_at: r.try_get("created_at")?,
        finished_at: r.try_get("finished_at")?,
    })
}

impl Store {
    // ----- jobs, lease, keys -------------------------------------------------------

    pub async fn create_job(&self, kind: &str) -> Result<i64, StoreError> {
        self.create_job_at(kind, now_ms()).await
    }

    /// A running job created at `created_at` (ms): the release's start, its public time.
    pub async fn create_job_at(&self, kind: &str, created_at: i64) -> Result<i64, StoreError> {
        let r = sqlx::query(
            "INSERT INTO jobs (kind, status, created_at) VALUES ($1, 'running', $2) RETURNING id",
        )
        .bind(kind)
        .bind(created_at)
        .fetch_one(&self.pool)
        .await?;
        Ok(r.try_get(0)?)
    }

    pub async fn finish_job(
        &self,
        id: i64,
        status: &str,
        reason: Option<&str>,
        release_id: Option<i64>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE jobs SET status = $2, reason = $3, release_id = $4, finished_at = $5 \
             WHERE id = $1",
        )
        .bind(id)
        .bind(status)
        .bind(reason)
        .bind(release_id)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Jobs still `running` after a lease lifetime belong to a process that stopped
    /// (nothing of theirs was committed, or they would be finished): mark them failed.
    pub async fn fail_abandoned_jobs(&self, lease_secs: u64) -> Result<u64, StoreError> {
        let now = now_ms();
        let r = sqlx::query(
            "UPDATE jobs SET status = 'failed', reason = 'abandoned: the process running it stopped', \
             finished_at = $1 WHERE status = 'running' AND created_at < $2",
        )
        .bind(now)
        .bind(now - (lease_secs as i64) * 1000)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    pub async fn job(&self, id: i64) -> Result<Option<JobRow>, StoreError> {
        let row = sqlx::query(
            "SELECT id, kind, status, reason, release_id, created_at, finished_at \
             FROM jobs WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// The newest `limit` jobs, newest first.
    pub async fn recent_jobs(&self, limit: i64) -> Result<Vec<JobRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, kind, status, reason, release_id, created_at, finished_at \
             FROM jobs ORDER BY id DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// Takes (or renews) the trainer lease for `holder` until now + `secs`; false when
    /// another holder's lease has not expired.
    pub async fn acquire_lease(&self, holder: &str, secs: u64) -> Result<bool, StoreError> {
        let now = now_ms();
        let r = sqlx::query(
            "INSERT INTO leases (name, holder, expires_at) VALUES ('trainer', $1, $2) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
             expires_at = excluded.expires_at \
             WHERE leases.expires_at < $3 OR leases.holder = $1",
        )
        .bind(holder)
        .bind(now + (secs as i64) * 1000)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    pub async fn release_lease(&self, holder: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM leases WHERE name = 'trainer' AND holder = $1")
            .bind(holder)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Deletes the trainer lease when a previous run of this instance holds it (holder
    /// `"{instance}#..."`, not `holder`): that process is gone, since this instance
    /// name is held by one live process at a time. True when a lease was taken over.
    pub async fn take_over_own_lease(
        &self,
        instance: &str,
        holder: &str,
    ) -> Result<bool, StoreError> {
        let prefix = format!("{instance}#");
        let r = sqlx::query(
            "DELETE FROM leases WHERE name = 'trainer' AND holder <> $1 \
             AND substr(holder, 1, $2) = $3",
        )
        .bind(holder)
        .bind(prefix.chars().count() as i32)
        .bind(&prefix)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() > 0)
    }

    /// Marks jobs still `running` that were created before `before_ms` failed with
    /// `reason` (their process is gone). Returns how many.
    pub async fn fail_running_jobs(&self, before_ms: i64, reason: &str) -> Result<u64, StoreError> {
        let r = sqlx::query(
            "UPDATE jobs SET status = 'failed', reason = $1, finished_at = $2 \
             WHERE status = 'running' AND created_at < $3",
        )
        .bind(reason)
        .bind(now_ms())
        .bind(before_ms)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }
}
