//! The background loops of a [`Retrainer`]: the scheduler that releases on a fixed
//! schedule, and the replica watcher that serves releases committed by another
//! instance on the same database.

use std::sync::Arc;
use std::time::Duration;

use super::Retrainer;
use crate::store::now_ms;

impl Retrainer {
    /// Replicas: every `scheduler.reload_secs`, serve a newer release committed by another
    /// instance on the same database.
    pub async fn watch_releases(self: Arc<Self>) {
        let secs = self.settings.scheduler.reload_secs;
        if secs == 0 {
            return;
        }
        let every = Duration::from_secs(secs);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tick.tick().await;
            self.reload_if_newer().await;
        }
    }

    /// One check of the replica watcher.
    async fn reload_if_newer(&self) {
        let current = self.registry.current().map(|p| p.release_id).unwrap_or(0);
        match self.store.latest_model_id().await {
            Ok(Some(id)) if id > current => match self.load_latest().await {
                Ok(_) => log::info!("serving release {id} published by another instance"),
                Err(e) => log::error!("loading release {id}: {e:#}"),
            },
            Ok(_) => {}
            Err(e) => {
                self.metrics.store_errors.inc();
                log::error!("checking for new releases: {e}");
            }
        }
    }

    /// The scheduler: a release every `retrain_interval_secs`, whatever the data. A
    /// trigger on the exact number of new ratings would publish that number through the
    /// release times (issue 8, finding 7); the schedule is public.
    pub async fn schedule(self: Arc<Self>) {
        let every = Duration::from_secs(self.settings.scheduler.retrain_interval_secs);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            // The scheduled instant, not when the tick fired: a release that outlasts the
            // interval makes the next tick fire late (by a time that grows with the
            // data), and the job's start is the release's public time.
            let at = tick.tick().await;
            let late = tokio::time::Instant::now().saturating_duration_since(at);
            let started = now_ms() - late.as_millis() as i64;
            let me = self.clone();
            // On the release lane, like a triggered job; waited for, so ticks never overlap.
            if self
                .lane
                .run(async move { me.scheduled_tick(started).await })
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// One tick of the scheduler, scheduled at `started` (ms): a scheduled release (never
    /// forced past the operator-safety rule).
    async fn scheduled_tick(&self, started: i64) {
        match self.store.create_job_at("scheduled", started).await {
            Ok(id) => {
                self.run_job(id, started, false).await;
            }
            Err(e) => {
                self.metrics.store_errors.inc();
                log::error!("scheduler: {e}");
            }
        }
    }
}
