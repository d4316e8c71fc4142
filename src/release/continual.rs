//! A release in continual mode (`release.mode = "continual"`, issue 23): one tick of the
//! current series (`train::topn::continual`). The DP popularity counts are released by
//! tree aggregation; the served list is their post-processing.
//!
//! Order of a tick, and why it is safe to stop anywhere (kill -9):
//! 1. snapshot, series and its stored state; [`plan_tick`] (pure) decides who joins and
//!    which ratings the arrival cap admits, and the exact prefix counts;
//! 2. the noise of the node this tick releases (`tick_node`) is read from the store, or
//!    drawn and stored first (`Store::store_node_noise`: the stored one wins): nothing derived
//!    from a node is published before its noise is stored, and a restart reuses it;
//! 3. the charges and the model are committed (`store::commit_release`), then the tick is
//!    recorded (`Store::advance_series`), then the model is served. A crash between the
//!    commit and the record charges this tick's joiners and admissions again at the
//!    retry: more than they cost, never less.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::{ReleaseError, Released, Retrainer};
use crate::ledger::fits_with_rho;
use crate::serve::{Popularity, Published, ReleaseMeta, StoredModel};
use crate::store::{
    commit_release, RatingChargeRow, ReleaseRecord, SeriesRow, SeriesState, SeriesTick, Snapshot,
};
use crate::train::charges::{MechanismRecord, Neighbour, PrivacyUnit};
use crate::train::topn::continual::{
    draw_node_noise, estimate, tick_node, Admissions, Offer, SeriesParams,
};
use crate::train::topn::references::{dp_popularity_ranker, popularity_model};
use crate::train::{Guarantee, Ranker};

/// What one tick decides from the snapshot and the series' state (pure).
#[derive(Debug, Clone, Default)]
pub struct TickPlan {
    pub tick: SeriesTick,
    /// Exact arrival-capped counts over periods `1..=t`, per snapshot item.
    pub exact: Vec<i64>,
    /// Users charged the series' user event at this tick.
    pub joined: Vec<Arc<str>>,
    /// Members of the series after this tick (charged at this or an earlier tick).
    pub members: usize,
}

/// Tick `t` of a series with `params` and stored `state`, on `snap` (pure):
/// - every live user the series has not decided yet joins iff the user's Renyi filter
///   admits the series' whole user event (the same constant for everyone; with or
///   without ratings), else is left out of the series for good;
/// - the arrival cap admits, in rating-id order, members' not-yet-counted items up to
///   `cap`, among ratings whose own budget covers the series' rating charge (local-DP
///   ratings never: they are read by local-DP trainers only);
/// - exact counts are the admitted pairs, old and new (deleted ratings' pairs included).
pub fn plan_tick(
    params: &SeriesParams,
    t: u64,
    state: &SeriesState,
    snap: &Snapshot,
) -> Result<TickPlan, ReleaseError> {
    let event = [params.user_event()];
    let mut out = TickPlan::default();
    out.tick.period = t;
    let mut members: HashSet<Arc<str>> = state
        .members
        .iter()
        .filter(|(_, &admitted)| admitted)
        .map(|(u, _)| u.clone())
        .collect();
    for (user, budget) in &snap.users {
        if state.members.contains_key(user.as_str()) {
            continue;
        }
        let admits = budget
            .admits(&event)
            .map_err(|e| ReleaseError::BadCharge(format!("user {user:?}: {e}")))?;
        let user: Arc<str> = Arc::from(user.as_str());
        out.tick.members.push((user.clone(), admits));
        if admits {
            members.insert(user.clone());
            out.joined.push(user);
        }
    }
    out.members = members.len();
    let rho = params.rating_rho();
    // Most ratings share (eps, spent, rho): each distinct triple is converted once (the
    // conversion goes through the accountant).
    let mut fits: HashMap<(u64, u64, u64), bool> = HashMap::new();
    let offers = snap.ratings.iter().filter(|r| !r.ldp).map(move |r| {
        let key = (r.eps.to_bits(), r.spent.to_bits(), r.rho.to_bits());
        let affordable = *fits
            .entry(key)
            .or_insert_with(|| fits_with_rho(r.eps, r.spent, r.rho, 0.0, rho));
        Offer {
            rating_id: r.id,
            user: r.user.clone(),
            item: r.item.clone(),
            affordable,
        }
    });
    let mut cap = Admissions::from_pairs(
        state
            .admitted
            .iter()
            .map(|(u, i, _)| (u.clone(), i.clone())),
    );
    for o in cap.admit(offers, &members, params.cap) {
        out.tick.admitted.push((o.user, o.item, o.rating_id));
    }
    let index: HashMap<&str, usize> = snap
        .items
        .iter()
        .enumerate()
        .map(|(k, i)| (i.as_str(), k))
        .collect();
    out.exact = vec![0; snap.items.len()];
    let old = state.admitted.iter().map(|(_, i, _)| i);
    let new = out.tick.admitted.iter().map(|(_, i, _)| i);
    for item in old.chain(new) {
        if let Some(&k) = index.get(&**item) {
            out.exact[k] += 1;
        }
    }
    Ok(out)
}

impl Retrainer {
    /// One tick of the current continual series (under the lease; see the module doc).
    pub(super) async fn continual_release(
        &self,
        job_id: Option<i64>,
        started_at: i64,
    ) -> Result<Released, ReleaseError> {
        let snap = self.background.snapshot().await?;
        let series = self.current_series().await?;
        let p = series.params;
        let t = series.period + 1;
        let state = self.store.series_state(series.id).await?;
        let plan = plan_tick(&p, t, &state, &snap)?;
        let mut rng = crate::rng::from_seed_or_os(self.config.seed);
        let node = tick_node(t);
        // The node needs noise for every item this tick can count. A noise stored by a
        // crashed earlier attempt may predate items registered since: they get fresh
        // noise added to the stored node (its existing entries never change).
        let stored = self.store.node_noise(series.id, node).await?;
        let missing: Vec<&String> = snap
            .items
            .iter()
            .filter(|i| stored.as_ref().is_none_or(|n| !n.contains_key(*i)))
            .collect();
        if !missing.is_empty() {
            let fresh =
                draw_node_noise(&p, missing.len(), &mut rng).map_err(ReleaseError::Trainer)?;
            let fresh: HashMap<String, i64> = missing.into_iter().cloned().zip(fresh).collect();
            self.store.add_node_noise(series.id, node, &fresh).await?;
        }
        if let Some(h) = &self.hooks.before_commit {
            h().map_err(ReleaseError::Injected)?;
        }
        let mut noises = Vec::new();
        for node in crate::privacy::tree::decomposition(t) {
            let n = self
                .store
                .node_noise(series.id, node)
                .await?
                .ok_or_else(|| {
                    ReleaseError::Unservable(format!(
                        "series {}: node {node:?} has no noise",
                        series.id
                    ))
                })?;
            noises.push(n);
        }
        let refs: Vec<&HashMap<String, i64>> = noises.iter().collect();
        let counts = estimate(&plan.exact, &refs, &snap.items);
        let rec = self.tick_record(&series, t, &plan, &snap, &counts, job_id, started_at)?;
        let published = self.tick_published(&rec, &snap, counts)?;
        let id = commit_release(&self.store, &rec, self.hooks.inside_commit.as_deref()).await?;
        self.store.advance_series(series.id, &plan.tick).await?;
        self.publish(published, id, &rec, &crate::ledger::Plan::default());
        log::info!(
            "release {id}: tick {t} of {} in series {} ({} joined, {} ratings admitted)",
            p.horizon,
            series.id,
            plan.joined.len(),
            plan.tick.admitted.len()
        );
        Ok(Released { id, note: None })
    }

    /// The series this tick belongs to: the newest one if it has ticks left, else a new
    /// one calibrated to the plan (its users join it only if their filters still admit it).
    async fn current_series(&self) -> Result<SeriesRow, ReleaseError> {
        if let Some(s) = self.store.latest_series().await? {
            if s.period < s.params.horizon {
                return Ok(s);
            }
        }
        let plan = self.config.plan.ok_or_else(|| {
            ReleaseError::Calibration("continual mode needs budget.planned_releases >= 1".into())
        })?;
        let p = SeriesParams::calibrated(&plan, self.config.continual_cap)
            .map_err(ReleaseError::Trainer)?;
        Ok(self.store.start_series(&p).await?)
    }

    #[allow(clippy::too_many_arguments)]
    fn tick_record(
        &self,
        series: &SeriesRow,
        t: u64,
        plan: &TickPlan,
        snap: &Snapshot,
        counts: &[i64],
        job_id: Option<i64>,
        started_at: i64,
    ) -> Result<ReleaseRecord, ReleaseError> {
        let p = &series.params;
        let rho = p.rating_rho();
        let rating_charges: Vec<RatingChargeRow> = plan
            .tick
            .admitted
            .iter()
            .map(|(u, i, id)| RatingChargeRow {
                rating_id: *id,
                user: u.clone(),
                item: i.clone(),
                eps_train: 0.0,
                eps_popularity: 0.0,
                rho,
            })
            .collect();
        let user_charges: BTreeMap<String, Vec<crate::accountant::PrivacyEvent>> = plan
            .joined
            .iter()
            .map(|u| (u.to_string(), vec![p.user_event()]))
            .collect();
        let fill: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
        let stored = StoredModel {
            factors: popularity_model(&fill, self.config.scale),
            ranker: dp_popularity_ranker(fill.clone(), 0.0).stored(),
        };
        let popularity = Popularity {
            eps: 0.0,
            counts: counts.to_vec(),
        };
        let params = serde_json::json!({
            "mode": "continual", "series": series.id, "period": t, "horizon": p.horizon,
            "cap": p.cap, "z_level": p.z_level, "levels": p.levels(),
        });
        let about = serde_json::json!({
            "series": series.id, "period": t, "horizon": p.horizon, "levels": p.levels(),
            "z_level": p.z_level, "sigma": p.sigma(), "cap": p.cap,
            "node": {"level": tick_node(t).level, "periods": tick_node(t).periods()},
        });
        let mechanisms = vec![
            MechanismRecord {
                name: "tree-aggregated discrete Gaussian counts, user level (charged once \
                       per series, at the tick a user joins)"
                    .into(),
                params: serde_json::json!({"event": p.user_event(), "tree": about}),
                unit: PrivacyUnit::User,
                neighbour: Neighbour::AddRemove,
            },
            MechanismRecord {
                name: "tree-aggregated discrete Gaussian counts, rating level (charged once \
                       per series, at the tick a rating is admitted)"
                    .into(),
                params: serde_json::json!({
                    "rating_multiplier": p.rating_multiplier(), "rho": rho, "tree": about,
                }),
                unit: PrivacyUnit::Rating,
                neighbour: Neighbour::AddRemove,
            },
        ];
        Ok(ReleaseRecord {
            trainer: "dp-popularity".into(),
            params,
            guarantee: Guarantee::Proven,
            mechanisms: serde_json::to_value(&mechanisms)?,
            popularity_eps: 0.0,
            n_ratings: (plan.exact.iter().sum::<i64>()),
            n_users: plan.members as i64,
            n_items: snap.items.len() as i64,
            job_id,
            started_at,
            rating_unit: PrivacyUnit::Rating,
            rating_neighbour: Neighbour::AddRemove,
            rating_charges,
            user_charges,
            model_json: serde_json::to_string(&stored)?,
            users_json: "[]".into(),
            items_json: serde_json::to_string(&snap.items)?,
            popularity_json: serde_json::to_string(&popularity)?,
        })
    }

    /// The served form of a tick: the DP popularity list of the tree's estimate.
    fn tick_published(
        &self,
        rec: &ReleaseRecord,
        snap: &Snapshot,
        counts: Vec<i64>,
    ) -> Result<Published, ReleaseError> {
        let fill: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
        let meta = ReleaseMeta {
            release_id: 0,
            trainer: rec.trainer.clone(),
            guarantee: rec.guarantee,
            created_at: rec.started_at,
        };
        let ranker: Arc<dyn Ranker> = Arc::new(dp_popularity_ranker(fill.clone(), 0.0));
        Published::new(
            meta,
            popularity_model(&fill, self.config.scale),
            Vec::new(),
            snap.items.clone(),
            counts,
        )
        .and_then(|p| p.with_ranker(Some(ranker)))
        .map_err(|e| ReleaseError::Unservable(e.to_string()))
    }
}
