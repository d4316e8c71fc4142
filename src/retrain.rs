//! The release pipeline: lease, snapshot, admission plan, training, DP popularity,
//! charges, the ledger commit, and the atomic swap of the served model. Also the
//! scheduler that runs it every `retrain_interval_secs` when enough ratings arrived.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::accountant::PrivacyEvent;
use crate::config::Settings;
use crate::data::{IdMap, Interactions, Ratings};
use crate::ledger::commit::{commit, InsideTxHook, RatingChargeRow, ReleaseRecord};
use crate::ledger::{complete_user_events, plan, PlanParams, SharePolicy};
use crate::metrics::Metrics;
use crate::serve::{Popularity, Published, Registry, ReleaseMeta};
use crate::store::{now_ms, Store};
use crate::train::charges::{MechanismRecord, Neighbour, PrivacyUnit};
use crate::train::dp_stats::noisy_counts;
use crate::train::{Guarantee, TrainData, Trainer};

/// Failure injection points for the crash tests.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Called after training, before the ledger transaction starts.
    pub before_commit: Option<Arc<dyn Fn() -> Result<(), String> + Send + Sync>>,
    /// Called inside the ledger transaction after every write, before COMMIT.
    pub inside_commit: Option<Arc<InsideTxHook>>,
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

/// Runs releases; one at a time per process (mutex) and per database (lease).
pub struct Retrainer {
    pub store: Store,
    pub registry: Arc<Registry>,
    pub trainer: Arc<dyn Trainer>,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    pub hooks: Hooks,
    holder: String,
    busy: tokio::sync::Mutex<()>,
}

impl Retrainer {
    pub fn new(
        store: Store,
        registry: Arc<Registry>,
        trainer: Arc<dyn Trainer>,
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        hooks: Hooks,
    ) -> Self {
        let holder = format!(
            "{}-{}-{:016x}",
            std::process::id(),
            now_ms(),
            rand::random::<u64>()
        );
        Self {
            store,
            registry,
            trainer,
            settings,
            metrics,
            hooks,
            holder,
            busy: tokio::sync::Mutex::new(()),
        }
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
        let Ok(_local) = self.busy.try_lock() else {
            return Outcome::Skipped("a training run is already in progress here".into());
        };
        match self
            .store
            .acquire_lease(&self.holder, self.settings.scheduler.lease_secs)
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                return Outcome::Skipped("the trainer lease is held by another instance".into())
            }
            Err(e) => {
                self.metrics.store_errors.inc();
                return Outcome::Failed(format!("lease: {e}"));
            }
        }
        let outcome = match self.release_under_lease(job_id).await {
            Ok(o) => o,
            Err(e) => Outcome::Failed(format!("{e:#}")),
        };
        if let Err(e) = self.store.release_lease(&self.holder).await {
            log::warn!("releasing the trainer lease: {e}");
        }
        outcome
    }

    async fn release_under_lease(&self, job_id: Option<i64>) -> anyhow::Result<Outcome> {
        let s = &self.settings;
        let policy: SharePolicy = s.share_policy()?;
        let scale = s.scale()?;
        let snap = self.store.snapshot().await?;
        let budgets = snap.budgets();
        let guarantee = self.trainer.guarantee();
        let private = match guarantee {
            Guarantee::Proven => true,
            Guarantee::NonPrivate if s.trainer.allow_non_private => false,
            g => anyhow::bail!(
                "trainer {} has guarantee {g:?}; only proven trainers are served \
                 (set trainer.allow_non_private for non-private ones)",
                self.trainer.name()
            ),
        };
        let params = PlanParams {
            policy,
            min_release_eps: s.budget.min_release_eps,
            popularity_eps: s.budget.popularity_eps,
            planned_user_event: self.trainer.planned_user_event(),
            check_user_filter: private,
        };
        let plan = plan(&params, &budgets, &snap.users);
        if plan.admitted.is_empty() {
            return Ok(Outcome::Skipped(format!(
                "no rating has budget left ({} ratings, {} exhausted, {} users excluded)",
                snap.ratings.len(),
                plan.ratings_exhausted,
                plan.users_excluded.len()
            )));
        }

        // Dense indices: participating users (sorted), the whole item catalogue.
        let mut user_ids: Vec<String> = plan
            .admitted
            .iter()
            .map(|a| snap.ratings[a.index].user.clone())
            .collect();
        user_ids.sort();
        user_ids.dedup();
        let mut users = IdMap::new();
        for u in &user_ids {
            users.intern(u);
        }
        let mut items = IdMap::new();
        for i in &snap.items {
            items.intern(i);
        }
        let mut ratings = Ratings::with_dims(users.len(), items.len());
        let mut train_budgets = Vec::with_capacity(plan.admitted.len());
        for a in &plan.admitted {
            let r = &snap.ratings[a.index];
            let (Some(u), Some(i)) = (users.get(&r.user), items.get(&r.item)) else {
                anyhow::bail!("rating {} refers to an unknown item", r.id);
            };
            ratings.push(u, i, r.value as f32);
            train_budgets.push(a.train_budget);
        }

        // Train off the async runtime; a panic is a failed job, nothing is charged.
        let trainer = self.trainer.clone();
        let seed = s.trainer.seed;
        let fit = {
            let ratings = ratings.clone();
            let budgets = train_budgets.clone();
            // The last published DP model, re-indexed to this release's users and items
            // (only proven releases: their factors are already-charged DP outputs).
            let prior = self
                .registry
                .current()
                .filter(|p| p.guarantee == "proven")
                .map(|p| {
                    let items: Vec<String> = snap.items.clone();
                    p.reindexed(&user_ids, &items)
                });
            tokio::task::spawn_blocking(move || {
                std::panic::catch_unwind(AssertUnwindSafe(|| {
                    let matrix = Interactions::new(&ratings);
                    let data = TrainData {
                        ratings: &ratings,
                        matrix: &matrix,
                        scale,
                        budgets: Some(&budgets),
                        prior: prior.as_ref(),
                    };
                    let mut rng = crate::rng::from_seed_or_os(seed);
                    trainer.fit(&data, &mut rng).map(|f| (f, rng))
                }))
            })
            .await?
        };
        let (fitted, mut rng) = match fit {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Ok(Outcome::Failed(format!("trainer failed: {e}"))),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                return Ok(Outcome::Failed(format!("trainer panicked: {msg}")));
            }
        };
        if fitted.guarantee != guarantee {
            anyhow::bail!(
                "trainer reported guarantee {:?} but declared {:?}",
                fitted.guarantee,
                guarantee
            );
        }

        // DP popularity: one count per catalogue item, discrete Laplace, sensitivity 1
        // per rating (add/remove one rating changes one count by one).
        let pop_eps = s.budget.popularity_eps;
        let mut counts = vec![0u64; items.len()];
        for (k, a) in plan.admitted.iter().enumerate() {
            if a.popularity {
                counts[ratings.items[k] as usize] += 1;
            }
        }
        let noisy: Vec<i64> = noisy_counts(&counts, pop_eps, &mut rng)
            .map_err(|e| anyhow::anyhow!("popularity release: {e}"))?;

        // Charges: per rating (trainer + popularity), per user (the trainer's events, and
        // the popularity once; see ReleaseCharges for the rating-unit contract).
        let mut rating_charges = Vec::new();
        let mut user_charges: BTreeMap<String, Vec<PrivacyEvent>> = BTreeMap::new();
        let mut mechanisms: Vec<MechanismRecord> = Vec::new();
        let mut rating_unit = "rating".to_string();
        let mut rating_neighbour = "add-remove".to_string();
        if private {
            let n = ratings.len();
            if let Some(bad) = fitted
                .charges
                .ratings
                .iter()
                .find(|c| c.position as usize >= n)
            {
                anyhow::bail!("trainer charged unknown rating position {}", bad.position);
            }
            let totals = fitted.charges.rating_totals(n);
            let mut per_user_pure: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
            for (k, a) in plan.admitted.iter().enumerate() {
                let train = totals[k];
                if !(train.is_finite() && train >= 0.0 && train <= a.train_budget) {
                    anyhow::bail!(
                        "trainer charged rating position {k} eps {train}, above its budget {}",
                        a.train_budget
                    );
                }
                let popularity = if a.popularity { pop_eps } else { 0.0 };
                if train + popularity > 0.0 {
                    let r = &snap.ratings[a.index];
                    rating_charges.push(RatingChargeRow {
                        rating_id: r.id,
                        user: r.user.clone(),
                        item: r.item.clone(),
                        eps_train: train,
                        eps_popularity: popularity,
                    });
                    // Per user: the largest trainer charge and whether the user is in the
                    // popularity counts (unit: one rating, see ReleaseCharges).
                    let v = per_user_pure.entry(&r.user).or_default();
                    v.0 = v.0.max(train);
                    v.1 = v.1.max(popularity);
                }
            }
            for (u, events) in fitted.charges.user_events() {
                let id = users
                    .external(u)
                    .ok_or_else(|| anyhow::anyhow!("trainer charged unknown user index {u}"))?;
                user_charges
                    .entry(id.to_string())
                    .or_default()
                    .extend(events);
            }
            for (u, (max_train, popularity)) in per_user_pure {
                let events = user_charges.entry(u.to_string()).or_default();
                complete_user_events(events, max_train, popularity);
            }
            mechanisms = fitted.charges.mechanisms.clone();
            if let Some(m) = mechanisms.iter().find(|m| m.unit == PrivacyUnit::Rating) {
                rating_neighbour = neighbour_name(m.neighbour).into();
            } else if let Some(m) = mechanisms.first() {
                rating_unit = unit_name(m.unit).into();
                rating_neighbour = neighbour_name(m.neighbour).into();
            }
            mechanisms.push(MechanismRecord {
                name: "popularity-discrete-laplace".into(),
                params: serde_json::json!({"eps": pop_eps, "sensitivity": 1,
                    "selection": "ratings whose release share >= 2 * eps"}),
                unit: PrivacyUnit::Rating,
                neighbour: Neighbour::AddRemove,
            });
        }

        if let Some(h) = &self.hooks.before_commit {
            h().map_err(|e| anyhow::anyhow!("injected failure before commit: {e}"))?;
        }
        let popularity = Popularity {
            eps: if private { pop_eps } else { 0.0 },
            counts: noisy.clone(),
        };
        let guarantee_label = if private { "proven" } else { "non-private" };
        let item_list: Vec<String> = (0..items.len() as u32)
            .map(|i| items.external(i).unwrap_or_default().to_string())
            .collect();
        let rec = ReleaseRecord {
            trainer: self.trainer.name().to_string(),
            params: self.trainer.params(),
            guarantee: guarantee_label.into(),
            mechanisms: serde_json::to_value(&mechanisms)?,
            popularity_eps: popularity.eps,
            n_ratings: ratings.len() as i64,
            n_users: users.len() as i64,
            n_items: items.len() as i64,
            job_id,
            rating_unit,
            rating_neighbour,
            rating_charges,
            user_charges,
            model_json: serde_json::to_string(&fitted.model)?,
            users_json: serde_json::to_string(&user_ids)?,
            items_json: serde_json::to_string(&item_list)?,
            popularity_json: serde_json::to_string(&popularity)?,
        };
        let charged: f64 = rec.rating_charges.iter().map(|c| c.total()).sum();
        // Build the served form before committing, so a model that cannot be served
        // (e.g. dimensions that do not match the id lists) is refused with nothing charged.
        let mut published = Published::new(
            ReleaseMeta {
                release_id: 0,
                trainer: rec.trainer.clone(),
                guarantee: rec.guarantee.clone(),
                created_at: now_ms(),
            },
            fitted.model,
            user_ids,
            item_list,
            noisy,
        )
        .map_err(|e| anyhow::anyhow!("the trained model cannot be served: {e}"))?;
        let release_id = match commit(&self.store, &rec, self.hooks.inside_commit.as_deref()).await
        {
            Ok(id) => id,
            Err(e) => return Ok(Outcome::Failed(format!("ledger commit: {e}"))),
        };
        published.release_id = release_id;
        self.registry.publish(Arc::new(published));
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
        Ok(Outcome::Published(release_id))
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
    }

    /// The scheduler: every interval, retrain when `min_new_ratings` arrived since the
    /// last release (or since start-up when there is none).
    pub async fn schedule(self: Arc<Self>) {
        let every = Duration::from_secs(self.settings.scheduler.retrain_interval_secs);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tick.tick().await;
            let since = self.registry.current().map(|p| p.created_at).unwrap_or(0);
            match self.store.ratings_updated_since(since).await {
                Ok(n) if n as u64 >= self.settings.scheduler.min_new_ratings => {
                    match self.store.create_job("scheduled").await {
                        Ok(id) => {
                            self.run_job(id).await;
                        }
                        Err(e) => log::error!("scheduler: {e}"),
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    self.metrics.store_errors.inc();
                    log::error!("scheduler: {e}");
                }
            }
        }
    }
}

fn unit_name(u: PrivacyUnit) -> &'static str {
    match u {
        PrivacyUnit::Rating => "rating",
        PrivacyUnit::User => "user",
    }
}

fn neighbour_name(n: Neighbour) -> &'static str {
    match n {
        Neighbour::AddRemove => "add-remove",
        Neighbour::Replace => "replace",
    }
}
