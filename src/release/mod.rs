//! Releases: a trained model with its DP popularity, charged to the ledger and then
//! served. [`Retrainer::release`] is the pipeline as a list of named steps
//! ([`steps`]: admit, training set, fit, popularity, charges, record), followed by the
//! store's commit (short ledger transactions, then the one that stores the model) and
//! the swap of the served model. Jobs, the lease and
//! the one error type of a release ([`ReleaseError`]) are here; the scheduler and the
//! replica watcher are in [`scheduler`].

mod scheduler;
pub mod steps;

use std::sync::Arc;
use std::time::Instant;

use crate::accountant::LifetimePlan;
use crate::config::Settings;
use crate::data::RatingScale;
use crate::ledger::SharePolicy;
use crate::metrics::Metrics;
use crate::serve::{Popularity, Published, Registry, ReleaseMeta};
use crate::store::{
    commit_release, now_ms, CommitError, InjectedFailure, InsideTxHook, Store, StoreError,
};
use crate::train::{Guarantee, ReleaseCharges, TrainError, Trainer};
use steps::{Admission, RecordInput, TrainingSet};

/// Test-only hooks: failure injection points for the crash tests, and a noise seed.
/// `dprec serve` passes `Hooks::default()`.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Seeds the release noise, for tests that need deterministic releases. Never set by
    /// `dprec serve`: a fixed seed replays the same noise in every release, and the
    /// configuration refuses `trainer.seed` for that reason (issue 8 finding 8).
    pub seed: Option<u64>,
    /// Called after training, before the ledger transaction starts.
    pub before_commit: Option<Arc<dyn Fn() -> Result<(), InjectedFailure> + Send + Sync>>,
    /// Called inside each ledger transaction of the commit (after its writes, before its
    /// COMMIT) with its position; the last one stores the model (`store::commit_release`).
    pub inside_commit: Option<Arc<InsideTxHook>>,
}

/// The release settings, parsed and validated once from [`Settings`].
#[derive(Debug, Clone, Copy)]
pub struct ReleaseConfig {
    pub policy: SharePolicy,
    pub scale: RatingScale,
    pub min_release_eps: f64,
    pub popularity_eps: f64,
    pub allow_non_private: bool,
    pub seed: Option<u64>,
    pub lease_secs: u64,
    /// The lifetime plan the per-release costs are calibrated to (`None`: as configured).
    pub plan: Option<LifetimePlan>,
}

impl ReleaseConfig {
    pub fn from_settings(s: &Settings) -> anyhow::Result<Self> {
        Ok(Self {
            policy: s.budget.share,
            scale: s.scale()?,
            min_release_eps: s.budget.min_release_eps,
            popularity_eps: s.budget.popularity_eps,
            allow_non_private: s.trainer.allow_non_private,
            // `Settings::validate` refuses trainer.seed; tests seed through `Hooks::seed`.
            seed: None,
            lease_secs: s.scheduler.lease_secs,
            plan: match s.budget.planned_releases {
                0 => None,
                t => Some(LifetimePlan::new(
                    t,
                    s.budget.default_user_eps,
                    s.budget.default_user_delta,
                )?),
            },
        })
    }
}

/// Why a release did not publish. [`ReleaseError::is_skip`] tells a normal skip (nothing
/// to do, or someone else is doing it) from a failure; in both cases nothing is charged.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("a training run is already in progress here")]
    Busy,
    #[error("the trainer lease is held by another instance")]
    LeaseHeld,
    #[error("lease: {0}")]
    Lease(StoreError),
    #[error(
        "no rating has budget left ({ratings} ratings, {exhausted} exhausted, \
         {excluded} users excluded)"
    )]
    NothingAdmitted {
        ratings: usize,
        exhausted: usize,
        excluded: usize,
    },
    #[error(
        "the local-DP trainer reads only ratings perturbed on the client, and none of the \
         {ratings} ratings is (send them in the perturbed form, see `dprec perturb`)"
    )]
    NoLocalRatings { ratings: usize },
    #[error(
        "trainer {trainer} has guarantee {guarantee:?}; only proven trainers are served \
         (set trainer.allow_non_private for non-private ones)"
    )]
    NotServable {
        trainer: &'static str,
        guarantee: Guarantee,
    },
    #[error("rating {0} refers to an unknown item")]
    UnknownItem(i64),
    #[error("trainer failed: {0}")]
    Trainer(TrainError),
    #[error("trainer panicked: {0}")]
    TrainerPanicked(String),
    #[error("trainer reported guarantee {reported:?} but declared {declared:?}")]
    GuaranteeMismatch {
        reported: Guarantee,
        declared: Guarantee,
    },
    /// A trainer's charges break the ledger contract (unknown position or user, over
    /// the rating's share).
    #[error("{0}")]
    BadCharge(String),
    #[error("popularity release: {0}")]
    Popularity(String),
    /// The release's costs could not be fixed from the plan (no user-level cost, or no
    /// noise level fits).
    #[error("calibration to the release plan: {0}")]
    Calibration(String),
    #[error("injected failure before commit: {0}")]
    Injected(InjectedFailure),
    #[error("the trained model cannot be served: {0}")]
    Unservable(String),
    #[error("ledger commit: {0}")]
    Commit(#[from] CommitError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("training task: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("serialising the release: {0}")]
    Json(#[from] serde_json::Error),
}

impl ReleaseError {
    /// Skips: the release had nothing to do or was not this instance's to run.
    pub fn is_skip(&self) -> bool {
        matches!(
            self,
            Self::Busy
                | Self::LeaseHeld
                | Self::NothingAdmitted { .. }
                | Self::NoLocalRatings { .. }
        )
    }
}

/// How a retrain job ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Published(i64),
    Skipped(String),
    Failed(String),
}

impl Outcome {
    pub fn status(&self) -> &'static str {
        match self {
            Self::Published(_) => "succeeded",
            Self::Skipped(_) => "skipped",
            Self::Failed(_) => "failed",
        }
    }
}

impl From<Result<i64, ReleaseError>> for Outcome {
    fn from(r: Result<i64, ReleaseError>) -> Self {
        match r {
            Ok(id) => Self::Published(id),
            Err(e) if e.is_skip() => Self::Skipped(e.to_string()),
            Err(e) => Self::Failed(e.to_string()),
        }
    }
}

/// Runs releases; one at a time per process (mutex) and per database (lease).
pub struct Retrainer {
    pub store: Store,
    pub registry: Arc<Registry>,
    pub trainer: Arc<dyn Trainer>,
    pub settings: Arc<Settings>,
    pub config: ReleaseConfig,
    pub metrics: Arc<Metrics>,
    pub hooks: Hooks,
    holder: String,
    busy: tokio::sync::Mutex<()>,
}

impl Retrainer {
    /// Fails when the release settings do not parse (see [`ReleaseConfig`]).
    pub fn new(
        store: Store,
        registry: Arc<Registry>,
        trainer: Arc<dyn Trainer>,
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        hooks: Hooks,
    ) -> anyhow::Result<Self> {
        let holder = format!(
            "{}#{}-{}-{:016x}",
            settings.instance_id().unwrap_or_default(),
            std::process::id(),
            now_ms(),
            rand::random::<u64>()
        );
        Ok(Self {
            store,
            registry,
            trainer,
            config: ReleaseConfig {
                seed: hooks.seed,
                ..ReleaseConfig::from_settings(&settings)?
            },
            settings,
            metrics,
            hooks,
            holder,
            busy: tokio::sync::Mutex::new(()),
        })
    }

    /// The trainer lease holder name of this process (`"{instance}#{pid}-{ms}-{random}"`).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Creates a job row and runs it in the background; returns the job id.
    pub async fn spawn_job(self: &Arc<Self>, kind: &str) -> anyhow::Result<i64> {
        let id = self.store.create_job(kind).await?;
        let me = self.clone();
        tokio::spawn(async move { me.run_job(id).await });
        Ok(id)
    }

    /// Runs job `id` to completion and records its outcome.
    pub async fn run_job(&self, id: i64) -> Outcome {
        let started = Instant::now();
        let outcome = self.run_release(Some(id)).await;
        self.metrics
            .training_duration
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .training_runs
            .with_label_values(&[outcome.status()])
            .inc();
        let (reason, release) = match &outcome {
            Outcome::Published(r) => (None, Some(*r)),
            Outcome::Skipped(s) | Outcome::Failed(s) => (Some(s.as_str()), None),
        };
        match &outcome {
            Outcome::Failed(r) => log::error!("retrain job {id} failed: {r}"),
            Outcome::Skipped(r) => log::info!("retrain job {id} skipped: {r}"),
            Outcome::Published(r) => log::info!("retrain job {id} published release {r}"),
        }
        if let Err(e) = self
            .store
            .finish_job(id, outcome.status(), reason, release)
            .await
        {
            self.metrics.store_errors.inc();
            log::error!("recording job {id}: {e}");
        }
        outcome
    }

    /// One release attempt (no job bookkeeping).
    pub async fn run_release(&self, job_id: Option<i64>) -> Outcome {
        Outcome::from(self.locked_release(job_id).await)
    }

    /// Takes the process mutex and the database lease, runs [`Self::release`], gives the
    /// lease back.
    async fn locked_release(&self, job_id: Option<i64>) -> Result<i64, ReleaseError> {
        let Ok(_local) = self.busy.try_lock() else {
            return Err(ReleaseError::Busy);
        };
        match self
            .store
            .acquire_lease(&self.holder, self.config.lease_secs)
            .await
        {
            Ok(true) => {}
            Ok(false) => return Err(ReleaseError::LeaseHeld),
            Err(e) => {
                self.metrics.store_errors.inc();
                return Err(ReleaseError::Lease(e));
            }
        }
        // Renew the lease while the release runs (training can outlast `lease_secs`), so
        // no second trainer starts on the same data. The renewer finishes its query
        // before stopping, so it cannot re-create the lease after it is given back.
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let renewer = {
            let store = self.store.clone();
            let holder = self.holder.clone();
            let secs = self.config.lease_secs;
            let period = std::time::Duration::from_millis((secs * 1000 / 3).max(100));
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        _ = tokio::time::sleep(period) => {}
                    }
                    match store.acquire_lease(&holder, secs).await {
                        Ok(true) => log::debug!("trainer lease renewed"),
                        Ok(false) => {
                            log::error!("trainer lease lost to another instance during a release");
                            break;
                        }
                        Err(e) => log::warn!("renewing the trainer lease: {e}"),
                    }
                }
            })
        };
        let result = self.release(job_id).await;
        let _ = stop.send(());
        let _ = renewer.await;
        if let Err(e) = self.store.release_lease(&self.holder).await {
            log::warn!("releasing the trainer lease: {e}");
        }
        result
    }

    /// The release pipeline (under the lease). Nothing is charged unless the commit
    /// succeeds; the served model changes only after it.
    pub async fn release(&self, job_id: Option<i64>) -> Result<i64, ReleaseError> {
        let snap = self.store.snapshot().await?;
        let Admission {
            plan,
            private,
            guarantee,
            trainer,
            popularity_eps: pop_eps,
            user_event,
        } = steps::admit(&self.config, &self.trainer, &snap)?;
        let set = steps::training_set(&snap, &plan)?;
        let (fitted, mut rng) =
            steps::fit(trainer.clone(), &set, &self.config, self.prior(&set)).await?;
        let (counts, pop_charges) = match guarantee {
            // Nothing charged pays for counts of who rated what: no popularity.
            Guarantee::LocalDp => (vec![0; set.items.len()], ReleaseCharges::default()),
            _ => steps::popularity(&set, &plan, pop_eps, &fitted, &mut rng)?,
        };
        let charges = match (&user_event, private) {
            (Some(e), true) => {
                steps::collect_charges(&snap, &plan, &set, &fitted.charges, &pop_charges, e)?
            }
            _ if guarantee == Guarantee::LocalDp => steps::local_charges(),
            _ => steps::Charges::default(),
        };
        if let Some(h) = &self.hooks.before_commit {
            h().map_err(ReleaseError::Injected)?;
        }
        let popularity = Popularity {
            eps: if private { pop_eps } else { 0.0 },
            counts,
        };
        let stored_ranker = fitted.ranker.as_ref().and_then(|r| r.stored());
        let stored = stored_ranker.is_some();
        let rec = steps::record(RecordInput {
            trainer: &*trainer,
            guarantee,
            set: &set,
            model: &fitted.model,
            ranker: stored_ranker,
            popularity: &popularity,
            charges,
            job_id,
        })?;
        // The served form is built before committing, so a model that cannot be served
        // (e.g. dimensions that do not match the id lists) is refused with nothing charged.
        // Served through the ranker only if it was stored with the release (a restart
        // must answer the same).
        let ranker = if stored { fitted.ranker } else { None };
        let published = self.served_form(&rec, fitted.model, ranker, set, popularity.counts)?;
        let release_id =
            commit_release(&self.store, &rec, self.hooks.inside_commit.as_deref()).await?;
        self.publish(published, release_id, &rec, &plan);
        Ok(release_id)
    }

    /// The last published proven model, re-indexed to this release's users and items
    /// (its factors are already-charged DP outputs, so public inputs).
    fn prior(&self, set: &TrainingSet) -> Option<crate::train::FactorModel> {
        self.registry
            .current()
            .filter(|p| p.guarantee == Guarantee::Proven)
            .map(|p| p.reindexed(&set.user_ids, &set.item_ids))
    }

    fn served_form(
        &self,
        rec: &crate::store::ReleaseRecord,
        model: crate::train::FactorModel,
        ranker: Option<Arc<dyn crate::train::Ranker>>,
        set: TrainingSet,
        counts: Vec<i64>,
    ) -> Result<Published, ReleaseError> {
        let meta = ReleaseMeta {
            release_id: 0,
            trainer: rec.trainer.clone(),
            guarantee: rec.guarantee,
            created_at: now_ms(),
        };
        Published::new(meta, model, set.user_ids, set.item_ids, counts)
            .and_then(|p| p.with_ranker(ranker))
            .map_err(|e| ReleaseError::Unservable(e.to_string()))
    }

    /// Swaps the served model and updates the release metrics.
    fn publish(
        &self,
        mut published: Published,
        release_id: i64,
        rec: &crate::store::ReleaseRecord,
        plan: &crate::ledger::Plan,
    ) {
        published.release_id = release_id;
        self.registry.publish(Arc::new(published));
        let charged: f64 = rec.rating_charges.iter().map(|c| c.total()).sum();
        self.metrics.model_version.set(release_id);
        self.metrics
            .model_published_at
            .set(now_ms() as f64 / 1000.0);
        self.metrics.budget_spent.inc_by(charged);
        self.metrics
            .ratings_exhausted
            .set(plan.ratings_exhausted as i64);
        self.metrics
            .users_excluded
            .set(plan.users_excluded.len() as i64);
    }

    /// Loads the last published model from the store (start-up).
    pub async fn load_latest(&self) -> anyhow::Result<Option<i64>> {
        let Some(row) = self.store.latest_model().await? else {
            return Ok(None);
        };
        let p = Published::from_row(&row)?;
        let id = p.release_id;
        self.metrics.model_version.set(id);
        self.metrics
            .model_published_at
            .set(row.release.created_at as f64 / 1000.0);
        self.registry.publish(Arc::new(p));
        Ok(Some(id))
    }
}
