//! A release in continual mode (`release.mode = "continual"`, issue 23): one tick of the
//! current series (`train::topn::continual`). The DP popularity counts are released by
//! tree aggregation; the served list is their post-processing.
//!
//! Order of a tick, and why it is safe to stop anywhere (kill -9):
//! 1. what the series has not offered yet (`store::series_offers`: the ratings since the
//!    last tick's mark, the earlier ratings of users who join now, updated ratings) and
//!    its state in aggregate form (members, per-item counts, pairs of users below the
//!    cap); the pure [`decide_users`] and [`TickAdmission`] decide who joins, which
//!    ratings the arrival cap admits, and the exact prefix counts: what [`plan_tick`]
//!    decides from a whole snapshot, without reading one;
//! 2. the noise of the node this tick releases (`tick_node`) is read from the store, or
//!    drawn and stored first (`Store::store_node_noise`: the stored one wins): nothing derived
//!    from a node is published before its noise is stored, and a restart reuses it;
//! 3. the charges and the model are committed (`store::commit_release`), then the tick is
//!    recorded (`Store::advance_series`), then the model is served. A crash between the
//!    commit and the record charges this tick's joiners and admissions again at the
//!    retry: more than they cost, never less.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::{ReleaseError, Released, Retrainer, StageClock};
use crate::serve::{Popularity, Published, ReleaseMeta, StoredModel};
use crate::store::{
    commit_release, OfferMark, OfferRead, OfferedRating, RatingChargeRow, RatingCharges,
    ReleaseRecord, SeriesRow, SeriesState, SeriesTick, Snapshot, UPDATE_OVERLAP_MS,
};
use crate::train::topn::continual::{
    draw_node_noise, estimate, tick_node, Admissions, SeriesParams,
};
use crate::train::topn::references::{dp_popularity_ranker, popularity_model};
use crate::train::{Guarantee, Ranker};
use dprec_dp::charges::{MechanismRecord, Neighbour, PrivacyUnit};
use dprec_dp::ledger::{fits_with_rho, UserBudget};

/// What one tick decides from the snapshot and the series' state (pure).
#[derive(Debug, Clone, Default)]
pub struct TickPlan {
    pub tick: SeriesTick,
    /// Exact arrival-capped counts over periods `1..=t`, per catalogue item.
    pub exact: Vec<i64>,
    /// Users charged the series' user event at this tick.
    pub joined: Vec<Arc<str>>,
    /// Members of the series after this tick (charged at this or an earlier tick).
    pub members: usize,
}

/// The users a tick decides (pure): every live user the series has not decided yet joins
/// iff the user's Renyi filter admits the series' whole user event (the same constant for
/// everyone, with or without ratings), else is left out of the series for good.
pub fn decide_users(
    params: &SeriesParams,
    undecided: &BTreeMap<String, UserBudget>,
) -> Result<Vec<(Arc<str>, bool)>, ReleaseError> {
    let event = [params.user_event()];
    undecided
        .iter()
        .map(|(user, budget)| {
            let admits = budget
                .admits(&event)
                .map_err(|e| ReleaseError::BadCharge(format!("user {user:?}: {e}")))?;
            Ok((Arc::from(user.as_str()), admits))
        })
        .collect()
}

/// A tick's arrival cap, fed one rating at a time in rating-id order (pure): it admits
/// members' not-yet-counted items up to `cap`, among ratings whose own budget covers the
/// series' rating charge. Offering a rating twice changes nothing.
pub struct TickAdmission {
    cap: usize,
    rho: f64,
    members: HashSet<Arc<str>>,
    state: Admissions,
    /// One allocation per item admitted.
    items: HashSet<Arc<str>>,
    /// Most ratings share (eps, spent, rho): each distinct triple is converted once (the
    /// conversion goes through the accountant).
    fits: HashMap<(u64, u64, u64), bool>,
    admitted: Vec<(Arc<str>, Arc<str>, i64)>,
}

impl TickAdmission {
    /// The cap of a series with `params`, its `members` (joined now included) and the
    /// arrival-cap `state` it resumes from.
    pub fn new(params: &SeriesParams, members: HashSet<Arc<str>>, state: Admissions) -> Self {
        Self {
            cap: params.cap,
            rho: params.rating_rho(),
            members,
            state,
            items: HashSet::new(),
            fits: HashMap::new(),
            admitted: Vec::new(),
        }
    }

    /// Offers one rating; non-members and users at the cap cost a lookup.
    pub fn offer(&mut self, r: &OfferedRating<'_>) {
        let Some(user) = self.members.get(r.user) else {
            return;
        };
        if self.state.count(user) >= self.cap {
            return;
        }
        let key = (r.eps.to_bits(), r.spent.to_bits(), r.rho.to_bits());
        let rho = self.rho;
        let affordable = *self
            .fits
            .entry(key)
            .or_insert_with(|| fits_with_rho(r.eps, r.spent, r.rho, 0.0, rho));
        if !affordable {
            return;
        }
        let item = match self.items.get(r.item) {
            Some(i) => i.clone(),
            None => {
                let i: Arc<str> = Arc::from(r.item);
                self.items.insert(i.clone());
                i
            }
        };
        if self.state.admit_one(user, &item, self.cap) {
            self.admitted.push((user.clone(), item, r.id));
        }
    }

    /// Whether the cap would admit more of `user`'s ratings (a member below the cap).
    pub fn wants_more(&self, user: &str) -> bool {
        self.members.contains(user) && self.state.count(user) < self.cap
    }

    /// Members of the series (charged at this or an earlier tick).
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// The pairs admitted by this tick: (user, item, rating id), in offer order.
    pub fn into_admitted(self) -> Vec<(Arc<str>, Arc<str>, i64)> {
        self.admitted
    }
}

/// How many of a user's arrived ratings a tick reads at first, per unit of the cap: the
/// cap admits at most `cap` a user, and only a rating its own budget cannot cover (or an
/// item admitted before) is passed over, so a second read is for the rare user with one
/// of those among the first. Twice the cap read 4.4M rows at 20M ratings instead of 2.2M
/// (offers 42 s against 32 s, lab note bench-03).
pub const FIRST_READ_PER_CAP: usize = 1;

/// Offers the ratings that arrived in `(after, through]` to `cap`, in each user's id
/// order: each user's first [`FIRST_READ_PER_CAP`] x cap of them, then the rest of those
/// users whom the cap still wants. The same decisions as offering every arrived rating
/// in id order (the cap decides a user from that user's ratings alone, in id order).
async fn offer_arrived(
    store: &crate::store::Store,
    cap: &mut TickAdmission,
    after: i64,
    through: i64,
) -> Result<(), ReleaseError> {
    let per_user = FIRST_READ_PER_CAP * cap.cap.max(1);
    // Per user: rows read, and the last rating id.
    let mut read: HashMap<String, (usize, i64)> = HashMap::new();
    let first = OfferRead::ArrivedFirst {
        after,
        through,
        per_user: per_user as i64,
    };
    store
        .for_each_offer(first, |r| {
            match read.get_mut(r.user) {
                Some(seen) => *seen = (seen.0 + 1, r.id),
                None => {
                    read.insert(r.user.to_owned(), (1, r.id));
                }
            }
            cap.offer(&r)
        })
        .await?;
    let more: HashMap<String, i64> = read
        .into_iter()
        .filter(|(u, (n, _))| *n >= per_user && cap.wants_more(u))
        .map(|(u, (_, last))| (u, last))
        .collect();
    if more.is_empty() {
        return Ok(());
    }
    let users: Vec<&str> = more.keys().map(String::as_str).collect();
    let rest = OfferRead::OfUsers {
        users: &users,
        through,
    };
    store
        .for_each_offer(rest, |r| {
            if more.get(r.user).is_some_and(|&last| r.id > last) {
                cap.offer(&r)
            }
        })
        .await?;
    Ok(())
}

/// Exact arrival-capped counts per catalogue item: the pairs admitted before (`old`, per
/// item) plus this tick's. Items outside the catalogue are dropped.
pub fn exact_counts<'a>(
    items: &[String],
    old: impl IntoIterator<Item = (&'a str, i64)>,
    new: &'a [(Arc<str>, Arc<str>, i64)],
) -> Vec<i64> {
    let index: HashMap<&str, usize> = items
        .iter()
        .enumerate()
        .map(|(k, i)| (i.as_str(), k))
        .collect();
    let mut exact = vec![0; items.len()];
    let news = new.iter().map(|(_, i, _)| (&**i, 1));
    for (item, n) in old.into_iter().chain(news) {
        if let Some(&k) = index.get(item) {
            exact[k] += n;
        }
    }
    exact
}

/// Tick `t` of a series with `params` and stored `state`, recomputed from a whole
/// snapshot (pure): what a tick means, and the reference the service's incremental read
/// ([`Retrainer::continual_release`] reads only what it has not offered yet) is checked
/// against in the tests. Users as [`decide_users`]; every centrally held rating of
/// `snap` is offered in rating-id order; exact counts are the admitted pairs, old and
/// new (deleted ratings' pairs included).
pub fn plan_tick(
    params: &SeriesParams,
    t: u64,
    state: &SeriesState,
    snap: &Snapshot,
) -> Result<TickPlan, ReleaseError> {
    let undecided: BTreeMap<String, UserBudget> = snap
        .users
        .iter()
        .filter(|(u, _)| !state.members.contains_key(u.as_str()))
        .map(|(u, b)| (u.clone(), b.clone()))
        .collect();
    let decided = decide_users(params, &undecided)?;
    let members = state
        .members
        .iter()
        .filter(|(_, &admitted)| admitted)
        .map(|(u, _)| u.clone())
        .chain(decided.iter().filter(|(_, a)| *a).map(|(u, _)| u.clone()))
        .collect();
    let pairs = state
        .admitted
        .iter()
        .map(|(u, i, _)| (u.clone(), i.clone()));
    let mut cap = TickAdmission::new(params, members, Admissions::from_pairs(pairs));
    for r in snap.iter().filter(|r| !r.ldp) {
        cap.offer(&OfferedRating {
            id: r.id,
            user: r.user,
            item: r.item,
            eps: r.eps,
            spent: r.spent,
            rho: r.rho,
        });
    }
    let members = cap.members();
    let admitted = cap.into_admitted();
    let old = state.admitted.iter().map(|(_, i, _)| (&**i, 1));
    Ok(TickPlan {
        exact: exact_counts(&snap.items, old, &admitted),
        joined: joined(&decided),
        members,
        tick: SeriesTick {
            period: t,
            offered: OfferMark::default(),
            members: decided,
            admitted,
        },
    })
}

fn joined(decided: &[(Arc<str>, bool)]) -> Vec<Arc<str>> {
    decided
        .iter()
        .filter(|(_, a)| *a)
        .map(|(u, _)| u.clone())
        .collect()
}

impl Retrainer {
    /// One tick of the current continual series (under the lease; see the module doc).
    pub(super) async fn continual_release(
        &self,
        job_id: Option<i64>,
        started_at: i64,
    ) -> Result<Released, ReleaseError> {
        let mut clock = StageClock::start();
        let series = self.current_series().await?;
        let p = series.params;
        let t = series.period + 1;
        // The series' user event, charged to the users this tick lets join: held before
        // their budgets are read (`store::holds`).
        self.lane_writes
            .set_hold(&self.holder, &[p.user_event()])
            .await?;
        let (plan, items) = self.read_tick(&series, t, &mut clock).await?;
        let mut rng = dprec_dp::rng::from_seed_or_os(self.config.seed);
        let node = tick_node(t);
        // The node needs noise for every item this tick can count. A noise stored by a
        // crashed earlier attempt may predate items registered since: they get fresh
        // noise added to the stored node (its existing entries never change).
        let stored = self.lane_writes.node_noise(series.id, node).await?;
        let missing: Vec<&String> = items
            .iter()
            .filter(|i| stored.as_ref().is_none_or(|n| !n.contains_key(*i)))
            .collect();
        if !missing.is_empty() {
            let fresh =
                draw_node_noise(&p, missing.len(), &mut rng).map_err(ReleaseError::Trainer)?;
            let fresh: HashMap<String, i64> = missing.into_iter().cloned().zip(fresh).collect();
            self.lane_writes
                .add_node_noise(series.id, node, &fresh)
                .await?;
        }
        clock.mark("node noise");
        if let Some(h) = &self.hooks.before_commit {
            h().map_err(ReleaseError::Injected)?;
        }
        let mut noises = Vec::new();
        for node in dprec_dp::privacy::tree::decomposition(t) {
            let n = self
                .lane_writes
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
        let counts = estimate(&plan.exact, &refs, &items);
        let rec = self.tick_record(&series, t, &plan, &items, &counts, job_id, started_at)?;
        let published = self.tick_published(&rec, items, counts)?;
        clock.mark("estimate, record");
        let committed =
            commit_release(&self.lane_writes, &rec, self.hooks.inside_commit.as_deref()).await?;
        let id = committed.release_id;
        clock.mark("commit");
        self.lane_writes
            .advance_series(series.id, &plan.tick)
            .await?;
        clock.mark("tick record");
        super::wait_until_visible(committed.visible_at).await;
        log::info!("tick stages: {clock}");
        self.publish(published, id, &rec, &dprec_dp::ledger::Plan::default());
        self.refresh_cold().await;
        log::info!(
            "release {id}: tick {t} of {} in series {} ({} joined, {} ratings admitted)",
            p.horizon,
            series.id,
            plan.joined.len(),
            plan.tick.admitted.len()
        );
        Ok(Released { id, note: None })
    }

    /// Tick `t` of `series` from what the series has not offered yet
    /// (`store::series_offers`), and the catalogue its counts are indexed by. The same
    /// decisions as [`plan_tick`] on a whole snapshot: a rating is offered at the first
    /// tick after it arrives, at the tick its user joins, and again after an update
    /// (offering twice changes nothing, and every rating at or below the last tick's mark
    /// was offered then, at the latest when its user joined).
    async fn read_tick(
        &self,
        series: &SeriesRow,
        t: u64,
        clock: &mut StageClock,
    ) -> Result<(TickPlan, Vec<String>), ReleaseError> {
        let store = &self.background;
        let p = &series.params;
        let mark = store.offer_mark().await?;
        let decided = decide_users(p, &store.undecided_users(series.id).await?)?;
        let joined = joined(&decided);
        let mut members: HashSet<Arc<str>> = (store.series_members_admitted(series.id).await?)
            .into_iter()
            .map(Arc::from)
            .collect();
        members.extend(joined.iter().cloned());
        let (full, open) = store.series_open_pairs(series.id, p.cap).await?;
        let open = open.into_iter().map(|(u, i)| (Arc::from(u), Arc::from(i)));
        let state = Admissions::resume(full.into_iter().map(Arc::from), open, p.cap);
        let mut cap = TickAdmission::new(p, members, state);
        clock.mark("users, cap state");
        let prev = series.offered;
        if prev.id > 0 {
            let users: Vec<&str> = joined.iter().map(|u| &**u).collect();
            let (through, since) = (prev.id, prev.at - UPDATE_OVERLAP_MS);
            store
                .for_each_offer(
                    OfferRead::OfUsers {
                        users: &users,
                        through,
                    },
                    |r| cap.offer(&r),
                )
                .await?;
            store
                .for_each_offer(OfferRead::Updated { since, through }, |r| cap.offer(&r))
                .await?;
        }
        offer_arrived(store, &mut cap, prev.id, mark.id).await?;
        clock.mark("offers");
        let old = store.series_item_counts(series.id).await?;
        let items = store.catalogue().await?;
        clock.mark("item counts");
        let members = cap.members();
        let admitted = cap.into_admitted();
        let plan = TickPlan {
            exact: exact_counts(&items, old.iter().map(|(i, n)| (i.as_str(), *n)), &admitted),
            joined,
            members,
            tick: SeriesTick {
                period: t,
                offered: mark,
                members: decided,
                admitted,
            },
        };
        Ok((plan, items))
    }

    /// The series this tick belongs to: the newest one if it has ticks left, else a new
    /// one calibrated to the plan (its users join it only if their filters still admit it).
    async fn current_series(&self) -> Result<SeriesRow, ReleaseError> {
        if let Some(s) = self.lane_writes.latest_series().await? {
            if s.period < s.params.horizon {
                return Ok(s);
            }
        }
        let plan = self.config.plan.ok_or_else(|| {
            ReleaseError::Calibration("continual mode needs budget.planned_releases >= 1".into())
        })?;
        let p = SeriesParams::calibrated(&plan, self.config.continual_cap)
            .map_err(ReleaseError::Trainer)?;
        Ok(self.lane_writes.start_series(&p).await?)
    }

    #[allow(clippy::too_many_arguments)]
    fn tick_record(
        &self,
        series: &SeriesRow,
        t: u64,
        plan: &TickPlan,
        items: &[String],
        counts: &[i64],
        job_id: Option<i64>,
        started_at: i64,
    ) -> Result<ReleaseRecord, ReleaseError> {
        let p = &series.params;
        let rho = p.rating_rho();
        let rating_charges =
            RatingCharges::from_rows(plan.tick.admitted.iter().map(|(u, _, id)| RatingChargeRow {
                rating_id: *id,
                user: u.clone(),
                eps_train: 0.0,
                eps_popularity: 0.0,
                rho,
            }));
        let user_charges: BTreeMap<String, Vec<dprec_dp::accountant::PrivacyEvent>> = plan
            .joined
            .iter()
            .map(|u| (u.to_string(), vec![p.user_event()]))
            .collect();
        let fill: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
        let stored = StoredModel {
            factors: popularity_model(&fill, self.config.scale),
            ranker: crate::train::StoredRanker::of(&dp_popularity_ranker(fill.clone(), 0.0)),
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
            n_items: items.len() as i64,
            job_id,
            started_at,
            rating_unit: PrivacyUnit::Rating,
            rating_neighbour: Neighbour::AddRemove,
            rating_charges,
            user_charges,
            model_json: serde_json::to_string(&stored)?,
            users_json: "[]".into(),
            items_json: serde_json::to_string(items)?,
            popularity_json: serde_json::to_string(&popularity)?,
            // Offers are read outside one snapshot: the commit reads the rows.
            snapshot_clock: None,
            publish_delay_ms: self.config.publish_delay_ms,
        })
    }

    /// The served form of a tick: the DP popularity list of the tree's estimate.
    fn tick_published(
        &self,
        rec: &ReleaseRecord,
        items: Vec<String>,
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
            items,
            counts,
        )
        .and_then(|p| p.with_ranker(Some(ranker)))
        .map_err(|e| ReleaseError::Unservable(e.to_string()))
    }
}
