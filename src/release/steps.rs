//! The steps of one release, each a function a test can call without HTTP: admission
//! (which ratings take part and at what share), the training set, the fit, the DP
//! popularity, the charges, and the record the store commits.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use super::{ReleaseConfig, ReleaseError};
use crate::data::{IdMap, Interactions, Ratings};
use crate::serve::Popularity;
use crate::store::{Before, Charge, RatingCharges, ReleaseRecord, Snapshot};
use crate::train::{
    dp_stats, units, FactorModel, Fitted, Guarantee, PerRating, ReleaseCharges, TrainData, Trainer,
};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::charges::{MechanismRecord, Neighbour, PrivacyUnit};
use dprec_dp::ledger::{self, plan_inputs, Plan, PlanParams};
use dprec_dp::rng::DpRng;

/// Which ratings a release uses and whether it is private.
pub struct Admission {
    pub plan: Plan,
    /// Proven trainer: charged and filtered; otherwise an allowed non-private release or
    /// a local-DP one (nothing charged either way).
    pub private: bool,
    /// The guarantee the release is recorded with.
    pub guarantee: Guarantee,
    /// The trainer this release runs: calibrated to the lifetime plan (private releases).
    pub trainer: Arc<dyn Trainer>,
    /// The popularity eps of this release (calibrated with the trainer).
    pub popularity_eps: f64,
    /// The per-release user-level event charged to every participating user.
    pub user_event: Option<PrivacyEvent>,
}

/// The release's costs from public values only (DESIGN 3, lifetime): `m` bounds any
/// user's ratings (the public catalogue's size: one rating per item), and the trainer and
/// the popularity eps are scaled so that `cfg.planned_releases` releases fit the default
/// user budget ([`units::calibrate_release`]). A trainer that cannot be scaled runs as
/// configured; a proven trainer without a user-level cost is refused.
///
/// A trainer that publishes its own DP counts ([`Trainer::publishes_popularity`]) gets no
/// separate popularity release: its popularity eps is 0 and its cost is its own.
pub fn calibrate(
    cfg: &ReleaseConfig,
    trainer: &Arc<dyn Trainer>,
    m: u64,
) -> Result<(Arc<dyn Trainer>, f64, PrivacyEvent), ReleaseError> {
    let popularity_eps = if trainer.publishes_popularity() {
        0.0
    } else {
        cfg.popularity_eps
    };
    if let Some(plan) = &cfg.plan {
        if trainer.scaled(1.0).is_some() {
            let c = units::calibrate_release(trainer.as_ref(), plan, m, popularity_eps)
                .map_err(ReleaseError::Calibration)?;
            return Ok((Arc::from(c.trainer), c.popularity_eps, c.user_event));
        }
    }
    let event =
        units::release_user_event(trainer.as_ref(), m, popularity_eps).ok_or_else(|| {
            ReleaseError::Calibration(format!(
                "trainer {} states no user-level cost (Trainer::user_level_event)",
                trainer.name()
            ))
        })?;
    Ok((trainer.clone(), popularity_eps, event))
}

/// Step 1: refuse trainers that may not be served, calibrate the release's costs to the
/// lifetime plan, then plan the admission from the snapshot's budgets (pure; see
/// [`dprec_dp::ledger::plan`]). A proven release with no rating admitted still runs (noise
/// only: no rating is charged; registered users with a live budget are charged its
/// user-level event, as on every release); only a non-private one is skipped.
pub fn admit(
    cfg: &ReleaseConfig,
    trainer: &Arc<dyn Trainer>,
    snap: &Snapshot,
) -> Result<Admission, ReleaseError> {
    let private = match trainer.guarantee() {
        Guarantee::Proven => true,
        Guarantee::LocalDp => return local_admission(trainer, snap),
        Guarantee::RatingLevel if cfg.allow_rating_level => {
            return Ok(rating_level_admission(cfg, trainer, snap))
        }
        Guarantee::RatingLevel => {
            return Err(ReleaseError::RatingLevelNotAllowed {
                trainer: trainer.name(),
            })
        }
        Guarantee::NonPrivate if cfg.allow_non_private => false,
        guarantee => {
            return Err(ReleaseError::NotServable {
                trainer: trainer.name(),
                guarantee,
            })
        }
    };
    let (trainer, popularity_eps, user_event) = if private {
        let m = snap.items.len().max(1) as u64;
        let (t, p, e) = calibrate(cfg, trainer, m)?;
        (t, p, Some(e))
    } else {
        (trainer.clone(), cfg.popularity_eps, None)
    };
    let params = PlanParams {
        policy: cfg.policy,
        min_release_eps: cfg.min_release_eps,
        popularity_eps,
        user_event: user_event.clone(),
        check_user_filter: private,
    };
    let plan = plan_inputs(&params, snap.plan_inputs(), &snap.users);
    // A proven release runs even when no rating is admitted: it is a DP release of noise
    // that charges no rating (registered users with a live budget are charged its
    // user-level event, as on every release: ledger::plan). Skipping it would publish
    // whether anything was admitted (D = {} and D = {r} would differ in whether the
    // release exists).
    if plan.admitted_len() == 0 && !private {
        return Err(ReleaseError::NothingAdmitted {
            ratings: snap.len(),
            exhausted: plan.ratings_exhausted,
            excluded: plan.users_excluded.len(),
        });
    }
    Ok(Admission {
        plan,
        private,
        guarantee: if private {
            Guarantee::Proven
        } else {
            Guarantee::NonPrivate
        },
        trainer,
        popularity_eps,
        user_event,
    })
}

/// A rating-level release (DESIGN 3, rating-level mode; the operator opted in): each
/// rating gets its share of eps_ij as in every release and is charged what the trainer's
/// proof covers (plus the DP popularity's eps); no user-level event is planned or
/// charged, and nothing is calibrated to the lifetime plan (that plan is a user-level
/// promise these trainers cannot keep). Users' Renyi filters still decide who takes
/// part, with a zero charge: a user whose filter is already full (used up by user-level
/// releases, or a budget lowered below its spend) is left out, a decision that depends
/// only on that user's own past charges. The group-privacy bound the release implies for
/// a user is read from the rating ledger by the audit (`Store::rating_level_bounds`).
fn rating_level_admission(
    cfg: &ReleaseConfig,
    trainer: &Arc<dyn Trainer>,
    snap: &Snapshot,
) -> Admission {
    let params = PlanParams {
        policy: cfg.policy,
        min_release_eps: cfg.min_release_eps,
        popularity_eps: cfg.popularity_eps,
        user_event: None,
        check_user_filter: true,
    };
    Admission {
        plan: plan_inputs(&params, snap.plan_inputs(), &snap.users),
        private: true,
        guarantee: Guarantee::RatingLevel,
        trainer: trainer.clone(),
        popularity_eps: cfg.popularity_eps,
        user_event: None,
    }
}

/// A local-DP release (DESIGN 3): the trainer reads only the ratings perturbed on the
/// client, each charged its local eps once at ingestion; training on them is
/// post-processing, so nothing is charged and no raw rating takes part.
fn local_admission(trainer: &Arc<dyn Trainer>, snap: &Snapshot) -> Result<Admission, ReleaseError> {
    let plan = Plan::from_admitted(snap.iter().enumerate().filter(|(_, r)| r.ldp).map(
        |(index, r)| ledger::Admitted {
            index: index as u32,
            share: 0.0,
            popularity: false,
            train_budget: 0.0,
            rho: r.rho,
            spent: r.spent,
            eps: r.eps,
        },
    ));
    if plan.admitted_len() == 0 {
        return Err(ReleaseError::NoLocalRatings {
            ratings: snap.len(),
        });
    }
    Ok(Admission {
        plan,
        private: false,
        guarantee: Guarantee::LocalDp,
        trainer: trainer.clone(),
        popularity_eps: 0.0,
        user_event: None,
    })
}

/// The admitted ratings in dense indices: participating users (sorted), the whole item
/// catalogue; position `k` is `plan.admitted[k]`.
#[derive(Debug, Clone)]
pub struct TrainingSet {
    pub users: IdMap,
    pub items: IdMap,
    pub user_ids: Vec<String>,
    pub item_ids: Vec<String>,
    pub ratings: Ratings,
    /// The store's id of each rating (what the charges are keyed by, so the snapshot can
    /// go before the fit).
    pub ids: SetIds,
    /// Each rating's terms in the plan (a few distinct ones for millions of ratings):
    /// an index into `budget_of` and `rho_of` ([`PerRating::Coded`]).
    terms: Vec<u32>,
    /// The share a rating of each terms may spend on training.
    budget_of: Vec<f64>,
    /// The Gaussian loss so far (zCDP `rho`) of a rating of each terms.
    rho_of: Vec<f64>,
    /// How many ratings the set holds (kept after [`TrainingSet::drop_ratings`]).
    n_ratings: usize,
}

impl TrainingSet {
    /// The number of admitted ratings.
    pub fn len(&self) -> usize {
        self.n_ratings
    }

    pub fn is_empty(&self) -> bool {
        self.n_ratings == 0
    }

    /// Frees the per-rating columns once the fit and the popularity have read them (the
    /// charges need only each rating's id, user and terms, and the record the count): at
    /// 20M ratings they are 160 MB that the charges would otherwise sit on top of.
    pub fn drop_ratings(&mut self) {
        let users = std::mem::take(&mut self.ratings.users);
        self.ratings = Ratings {
            users,
            ..Ratings::default()
        };
    }

    /// Each rating's index into [`Plan::terms`].
    pub fn terms(&self) -> &[u32] {
        &self.terms
    }

    /// The share of each rating this release may spend on training.
    pub fn budgets(&self) -> PerRating<'_> {
        PerRating::Coded {
            codes: &self.terms,
            values: &self.budget_of,
        }
    }

    /// Each rating's Gaussian loss so far (zCDP `rho`).
    pub fn rho(&self) -> PerRating<'_> {
        PerRating::Coded {
            codes: &self.terms,
            values: &self.rho_of,
        }
    }
}

/// A training set's rating ids, ascending (the snapshot's order): runs of consecutive ids
/// where that is smaller (ratings imported or arriving together, every one admitted: at
/// 20M ratings a few runs instead of 160 MB), else one id a rating.
#[derive(Debug, Clone, PartialEq)]
pub enum SetIds {
    /// Inclusive runs `(first, last)`, ascending.
    Runs(Vec<(i64, i64)>),
    Plain(Vec<i64>),
}

impl SetIds {
    /// Room for the `n` ascending `ids`, in the smaller form.
    fn for_ids(n: usize, ids: impl Iterator<Item = i64>) -> Self {
        let mut runs = 0usize;
        let mut last: Option<i64> = None;
        for id in ids {
            if last.is_none_or(|l| l + 1 != id) {
                runs += 1;
            }
            last = Some(id);
        }
        // A run is 16 bytes, an id 8.
        if 2 * runs <= n {
            Self::Runs(Vec::with_capacity(runs))
        } else {
            Self::Plain(vec![0; n])
        }
    }

    /// Sets id `k`, the ids coming from the last one back ([`SetIds::finish`] after).
    fn set_from_back(&mut self, k: usize, id: i64) {
        match self {
            Self::Plain(ids) => ids[k] = id,
            Self::Runs(runs) => match runs.last_mut() {
                Some((first, _)) if *first == id + 1 => *first = id,
                _ => runs.push((id, id)),
            },
        }
    }

    /// Puts the runs in ascending order once every id is set.
    fn finish(&mut self) {
        if let Self::Runs(runs) = self {
            runs.reverse();
        }
    }

    /// Every id, ascending.
    pub fn iter(&self) -> Box<dyn Iterator<Item = i64> + '_> {
        match self {
            Self::Plain(ids) => Box::new(ids.iter().copied()),
            Self::Runs(runs) => Box::new(runs.iter().flat_map(|&(a, b)| a..=b)),
        }
    }
}

/// Snapshot rows given back at a time while the training set is built (24 MB).
const GIVE_BACK_ROWS: usize = 1 << 20;

/// Step 2: the training set of an admission, built from the snapshot it consumes. The
/// set's columns are filled from the back while the snapshot is cut from the back, so the
/// two never both hold every rating (a large zeroed allocation's pages take memory only
/// once written, and a shrunk large allocation gives its tail back): at 20M ratings the
/// two side by side were the release's peak after the fit had shrunk (issue 22).
pub fn training_set(snap: Snapshot, plan: &Plan) -> Result<TrainingSet, ReleaseError> {
    training_set_giving_back(snap, plan, GIVE_BACK_ROWS)
}

/// [`training_set`], cutting the snapshot every `give_back` rows (tests cut it often).
// long: one pass that reads as the set's columns being filled, with the give-back.
fn training_set_giving_back(
    mut snap: Snapshot,
    plan: &Plan,
    give_back: usize,
) -> Result<TrainingSet, ReleaseError> {
    // The distinct users, sorted: the snapshot's user table is sorted, so its indices
    // in order are the users in order (one flag per user, nothing per rating).
    let mut taking_part = vec![false; snap.user_names.len()];
    for a in plan.admitted() {
        taking_part[snap.ratings[a.index as usize].user as usize] = true;
    }
    let user_ids: Vec<String> = snap
        .user_names
        .iter()
        .zip(&taking_part)
        .filter(|(_, &t)| t)
        .map(|(u, _)| u.to_string())
        .collect();
    let mut users = IdMap::new();
    for u in &user_ids {
        users.intern(u);
    }
    let mut items = IdMap::new();
    for i in &snap.items {
        items.intern(i);
    }
    let mut ratings = Ratings::with_dims(users.len(), items.len());
    let n = plan.admitted_len();
    let (mut user_col, mut item_col) = (vec![0u32; n], vec![0u32; n]);
    let (mut values, mut terms) = (vec![0f32; n], vec![0u32; n]);
    let mut ids = SetIds::for_ids(
        n,
        plan.admitted_pairs()
            .iter()
            .map(|&(index, _)| snap.ratings[index as usize].id),
    );
    // Each snapshot item's catalogue index, looked up once per item, not per rating.
    let item_of: Vec<Option<u32>> = snap.item_names.iter().map(|i| items.get(i)).collect();
    let user_of = dense_positions(&taking_part);
    // Admitted ratings come in snapshot order, so from the back every snapshot row past
    // the current one has been read.
    let mut held = snap.ratings.len();
    for (k, &(index, code)) in plan.admitted_pairs().iter().enumerate().rev() {
        let index = index as usize;
        let r = snap.ratings[index];
        let Some(i) = item_of[r.item as usize] else {
            return Err(ReleaseError::UnknownItem(r.id));
        };
        (user_col[k], item_col[k], values[k]) = (user_of[r.user as usize], i, r.value);
        terms[k] = code;
        ids.set_from_back(k, r.id);
        if held - index >= give_back {
            snap.ratings.truncate(index);
            snap.ratings.shrink_to_fit();
            held = index;
        }
    }
    drop(snap);
    ids.finish();
    (ratings.users, ratings.items, ratings.values) = (user_col, item_col, values);
    let (budget_of, rho_of) = plan.terms_values();
    let item_ids = (0..items.len() as u32)
        .map(|i| items.external(i).unwrap_or_default().to_string())
        .collect();
    Ok(TrainingSet {
        users,
        items,
        user_ids,
        item_ids,
        n_ratings: ratings.len(),
        ratings,
        ids,
        terms,
        budget_of,
        rho_of,
    })
}

/// The dense position of each flagged entry among the flagged ones (`u32::MAX` for the
/// others).
fn dense_positions(flags: &[bool]) -> Vec<u32> {
    let mut next = 0u32;
    flags
        .iter()
        .map(|&f| {
            if f {
                next += 1;
                next - 1
            } else {
                u32::MAX
            }
        })
        .collect()
}

/// Step 3: trains off the async runtime; a panic or a trainer error is a failed release
/// (nothing charged). Returns the fit, the generator for the release's further noise and
/// the set (moved to the training thread and back, not copied: at 20M ratings a copy is
/// half a gigabyte). `prior` is the last published proven model, re-indexed to this set,
/// `prior_counts` its counts filter state.
pub async fn fit(
    trainer: Arc<dyn Trainer>,
    set: TrainingSet,
    cfg: &ReleaseConfig,
    prior: Option<FactorModel>,
    prior_counts: Option<crate::model::history::CountHistory>,
) -> Result<(Fitted, DpRng, TrainingSet), ReleaseError> {
    let (scale, seed) = (cfg.scale, cfg.seed);
    let declared = trainer.guarantee();
    let (fit, set) = tokio::task::spawn_blocking(move || {
        // Training takes the CPU that requests leave over (crate::lanes).
        let _background = crate::lanes::lower_thread_priority();
        let fit = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let matrix = Interactions::new(&set.ratings);
            let data = TrainData {
                ratings: &set.ratings,
                matrix: &matrix,
                scale,
                budgets: Some(set.budgets()),
                rating_rho: Some(set.rho()),
                prior: prior.as_ref(),
                prior_counts: prior_counts.as_ref(),
                labels: Some(crate::train::Labels {
                    users: &set.user_ids,
                    items: &set.item_ids,
                }),
            };
            let mut rng = dprec_dp::rng::from_seed_or_os(seed);
            trainer.fit(&data, &mut rng).map(|f| (f, rng))
        }));
        (fit, set)
    })
    .await?;
    let (fitted, rng) = match fit {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => return Err(ReleaseError::Trainer(e)),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            return Err(ReleaseError::TrainerPanicked(msg));
        }
    };
    if fitted.guarantee != declared {
        return Err(ReleaseError::GuaranteeMismatch {
            reported: fitted.guarantee,
            declared,
        });
    }
    Ok((fitted, rng, set))
}

/// Step 4: the DP popularity counts of the ratings the plan lets be counted, with their
/// charges (see [`dp_stats::dp_popularity`]). A private release whose trainer published
/// its own DP counts (popularity eps 0, [`Trainer::publishes_popularity`]) takes those:
/// post-processing of a charged output, nothing more to charge.
pub fn popularity(
    set: &TrainingSet,
    plan: &Plan,
    eps: f64,
    fitted: &Fitted,
    rng: &mut DpRng,
) -> Result<(Vec<i64>, ReleaseCharges), ReleaseError> {
    if eps == 0.0 {
        if let Some(counts) = fitted.ranker.as_ref().and_then(|r| r.popularity_counts()) {
            if counts.len() != set.items.len() {
                return Err(ReleaseError::Popularity(format!(
                    "the trainer published {} counts for {} items",
                    counts.len(),
                    set.items.len()
                )));
            }
            let counts = counts.iter().map(|c| c.round() as i64).collect();
            return Ok((counts, ReleaseCharges::default()));
        }
    }
    let terms = plan.terms();
    let counted: Vec<bool> = set
        .terms
        .iter()
        .map(|&c| terms[c as usize].popularity)
        .collect();
    dp_stats::dp_popularity(&set.ratings, set.items.len(), &counted, eps, rng)
        .map_err(|e| ReleaseError::Popularity(e.to_string()))
}

/// What a release charges, keyed by the store's ids.
#[derive(Debug, Clone, Default)]
pub struct Charges {
    pub ratings: RatingCharges,
    pub users: BTreeMap<String, Vec<PrivacyEvent>>,
    pub mechanisms: Vec<MechanismRecord>,
    pub rating_unit: PrivacyUnit,
    pub rating_neighbour: Neighbour,
}

/// A local-DP release charges nothing; its record names what protects the ratings.
pub fn local_charges() -> Charges {
    Charges {
        mechanisms: vec![MechanismRecord {
            name: "ldp-ratings-post-processing".into(),
            params: serde_json::json!({
                "input": "ratings perturbed on the client (origin ldp) only",
                "charged": "each rating's local eps, once, at ingestion (rating and user ledger)",
                "protects": "each rating's value; which items a user rated is not protected",
            }),
            unit: PrivacyUnit::Rating,
            neighbour: Neighbour::Replace,
        }],
        rating_unit: PrivacyUnit::Rating,
        rating_neighbour: Neighbour::Replace,
        ..Charges::default()
    }
}

/// Step 5 (private releases): the trainer's charges and the popularity's, checked against
/// the plan and turned into ledger rows. Per rating (unit: rating): trainer + popularity
/// eps. Per user (unit: user): the release's constant user-level event, the same for
/// every participating user (the trainer's per-user rating-level events are not user
/// charges; they stay in the mechanism records). `user_event` is `None` for a
/// rating-level release: no user is charged, and its rating charges must be pure eps
/// (the audit's group-privacy bound adds them up; a Gaussian part would need another
/// group bound, so it is refused rather than shown wrong). The trainer's charges are
/// consumed: their per-rating lists are freed once summed, before the rows are made.
pub fn collect_charges(
    plan: &Plan,
    set: &TrainingSet,
    mut trainer: ReleaseCharges,
    popularity: &ReleaseCharges,
    user_event: Option<&PrivacyEvent>,
) -> Result<Charges, ReleaseError> {
    let n = set.len();
    if user_event.is_none() && !trainer.rating_rho.is_empty() {
        return Err(ReleaseError::BadCharge(
            "a rating-level release charged a Gaussian (rho) part to its ratings; the \
             group-privacy bound its audit shows is stated for pure-eps charges only"
                .into(),
        ));
    }
    let positions = trainer.ratings.iter().map(|c| c.position);
    let rho_positions = trainer.rating_rho.iter().map(|c| c.position);
    if let Some(bad) = positions.chain(rho_positions).find(|&p| p as usize >= n) {
        return Err(ReleaseError::BadCharge(format!(
            "trainer charged unknown rating position {bad}"
        )));
    }
    let n_users = set.users.len();
    if let Some(&u) = trainer
        .user_events()
        .keys()
        .find(|&&u| u as usize >= n_users)
    {
        return Err(ReleaseError::BadCharge(format!(
            "trainer charged unknown user index {u}"
        )));
    }
    let users = user_charges(plan, user_event);
    let mut mechanisms = std::mem::take(&mut trainer.mechanisms);
    let ratings = rating_rows(plan, set, trainer, popularity)?;
    let (mut rating_unit, mut rating_neighbour) = (PrivacyUnit::Rating, Neighbour::AddRemove);
    if let Some(m) = mechanisms.iter().find(|m| m.unit == PrivacyUnit::Rating) {
        rating_neighbour = m.neighbour;
    } else if let Some(m) = mechanisms.first() {
        (rating_unit, rating_neighbour) = (m.unit, m.neighbour);
    }
    mechanisms.extend(popularity.mechanisms.iter().cloned());
    Ok(Charges {
        ratings,
        users,
        mechanisms,
        rating_unit,
        rating_neighbour,
    })
}

/// A release's rating charges (the trainer's and the popularity's per rating), each
/// checked against the rating's budget for this release, grouped by user and charge.
fn rating_rows(
    plan: &Plan,
    set: &TrainingSet,
    trainer: ReleaseCharges,
    popularity: &ReleaseCharges,
) -> Result<RatingCharges, ReleaseError> {
    let n = set.len();
    // A column only for a kind of charge the release makes (the served default makes
    // one): at 20M ratings a column of zeros is 160 MB beside the charge rows.
    let column = |empty: bool, totals: &dyn Fn() -> Vec<f64>| (!empty).then(totals);
    let train = column(trainer.ratings.is_empty(), &|| trainer.rating_totals(n));
    // One bit a rating where every full participant got the same charge.
    let rho = (!trainer.rating_rho.is_empty()).then(|| trainer.rating_rho.totals(n));
    let pop = column(popularity.ratings.is_empty(), &|| {
        popularity.rating_totals(n)
    });
    // Summed: the trainer's lists go before the rows come.
    drop(trainer);
    let at = |c: &Option<Vec<f64>>, k: usize| c.as_ref().map_or(0.0, |c| c[k]);
    let rho = |k| rho.as_ref().map_or(0.0, |r| r.get(k));
    let (train, pop) = (|k| at(&train, k), |k| at(&pop, k));
    // Each admitted rating's charge as an index into the distinct charges (a release
    // charges few distinct ones: ratings in the same state are charged alike), then
    // grouped by user without a row per rating (`RatingCharges::by_user`).
    const NONE: u32 = u32::MAX;
    let mut distinct = DistinctCharges::default();
    let mut code = Vec::with_capacity(n);
    // Ratings in the same state charged the same add the same: the conversion (a
    // minimum over 156 orders, twice) runs once per distinct case, not once per rating.
    let mut added_of: HashMap<[u64; 4], f64> = HashMap::new();
    let terms = plan.terms();
    for (k, &c) in set.terms.iter().enumerate() {
        let a = &terms[c as usize];
        let (train_k, rho_k, pop_k) = (train(k), rho(k), pop(k));
        // What the trainer added to the rating's loss bound: its pure eps plus the
        // increase of the converted Gaussian part (exactly `train_k` without one).
        let added = if rho_k == 0.0 {
            train_k
        } else {
            let key = [a.spent, train_k, a.rho, rho_k].map(f64::to_bits);
            *added_of.entry(key).or_insert_with(|| {
                ledger::rating_loss(a.spent + train_k, a.rho + rho_k)
                    - ledger::rating_loss(a.spent, a.rho)
            })
        };
        // The Gaussian conversion is recomputed in another order of operations than the
        // trainer's: allow rounding here; the commit re-checks eps_ij exactly.
        let slack = if rho_k == 0.0 { 0.0 } else { 1e-9 };
        let valid = train_k.is_finite() && train_k >= 0.0 && rho_k.is_finite() && rho_k >= 0.0;
        if !(valid && added <= a.train_budget * (1.0 + slack)) {
            return Err(ReleaseError::BadCharge(format!(
                "trainer charged rating position {k} eps {added}, above its budget {}",
                a.train_budget
            )));
        }
        let charge = Charge {
            eps_train: train_k,
            eps_popularity: pop_k,
            rho: rho_k,
        };
        code.push(if charge.is_charge() {
            distinct.code(charge, a)
        } else {
            NONE
        });
    }
    let users = &set.ratings.users;
    let DistinctCharges {
        charges, befores, ..
    } = distinct;
    Ok(RatingCharges::by_user_from(
        &set.user_ids,
        &charges,
        &befores,
        || {
            (0..n)
                .zip(set.ids.iter())
                .filter(|&(k, _)| code[k] != NONE)
                .map(|(k, id)| (users[k], id, code[k]))
        },
    ))
}

/// The distinct (charge, planned state) pairs of a release, each with its code (a
/// release charges few: ratings in the same state are charged alike); the commit may
/// re-check a charge against its planned state (`store::Before`).
#[derive(Default)]
struct DistinctCharges {
    charges: Vec<Charge>,
    befores: Vec<Before>,
    index_of: HashMap<[u64; 6], u32>,
    /// Consecutive ratings are mostly charged alike: the last pair's code, before the map.
    last: Option<([u64; 6], u32)>,
}

impl DistinctCharges {
    /// The code of `charge` made from the planned state of `terms`.
    fn code(&mut self, charge: Charge, terms: &ledger::Terms) -> u32 {
        let before = Before {
            eps: terms.eps,
            spent: terms.spent,
            rho: terms.rho,
        };
        let [t, p, r] = charge.bits();
        let [e, s, h] = [before.eps, before.spent, before.rho].map(f64::to_bits);
        let key = [t, p, r, e, s, h];
        if let Some((_, c)) = self.last.filter(|(k, _)| *k == key) {
            return c;
        }
        let c = match self.index_of.get(&key) {
            Some(&c) => c,
            None => {
                self.charges.push(charge);
                self.befores.push(before);
                let c = self.charges.len() as u32 - 1;
                self.index_of.insert(key, c);
                c
            }
        };
        self.last = Some((key, c));
        c
    }
}

/// The user-level charges of a release: its event, stored as the list of its parts
/// (trainer, popularity) so the audit shows each, for every user the plan charges, with or
/// without admitted ratings (ledger::plan); none for a rating-level release (`None`).
fn user_charges(
    plan: &Plan,
    user_event: Option<&PrivacyEvent>,
) -> BTreeMap<String, Vec<PrivacyEvent>> {
    let parts = match user_event {
        Some(PrivacyEvent::Composed { events }) => events.clone(),
        Some(other) => vec![other.clone()],
        None => return BTreeMap::new(),
    };
    plan.users_charged
        .iter()
        .map(|u| (u.clone(), parts.clone()))
        .collect()
}

/// Step 6: the record the store commits in one transaction.
pub struct RecordInput<'a> {
    pub trainer: &'a dyn Trainer,
    pub guarantee: Guarantee,
    pub set: &'a TrainingSet,
    pub model: &'a FactorModel,
    /// The ranker the release is served through, stored with the model.
    pub ranker: Option<crate::train::StoredRanker>,
    pub popularity: &'a Popularity,
    pub charges: Charges,
    pub job_id: Option<i64>,
    /// When the release's job started (ms): its public time.
    pub started_at: i64,
}

pub fn record(input: RecordInput<'_>) -> Result<ReleaseRecord, ReleaseError> {
    let RecordInput {
        trainer,
        guarantee,
        set,
        model,
        ranker,
        popularity,
        charges,
        job_id,
        started_at,
    } = input;
    let stored = crate::serve::StoredModel {
        factors: model.clone(),
        ranker,
    };
    Ok(ReleaseRecord {
        trainer: trainer.name().to_string(),
        params: trainer.params(),
        guarantee,
        mechanisms: serde_json::to_value(&charges.mechanisms)?,
        popularity_eps: popularity.eps,
        n_ratings: set.len() as i64,
        n_users: set.users.len() as i64,
        n_items: set.items.len() as i64,
        job_id,
        started_at,
        rating_unit: charges.rating_unit,
        rating_neighbour: charges.rating_neighbour,
        rating_charges: charges.ratings,
        user_charges: charges.users,
        model_json: serde_json::to_string(&stored)?,
        users_json: serde_json::to_string(&set.user_ids)?,
        items_json: serde_json::to_string(&set.item_ids)?,
        popularity_json: serde_json::to_string(popularity)?,
        snapshot_clock: None,
        // Set by the release from its configuration.
        publish_delay_ms: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::RatingScale;
    use crate::store::RatingInput;
    use crate::train::{build, Params};
    use dprec_dp::accountant::{default_orders, LifetimePlan, RdpCurve};
    use dprec_dp::charges::{RatingCharge, RatingRho};
    use dprec_dp::ledger::{SharePolicy, UserBudget};

    fn config(allow_rating_level: bool) -> ReleaseConfig {
        ReleaseConfig {
            policy: SharePolicy::Fraction(0.5),
            scale: RatingScale::ONE_TO_FIVE,
            min_release_eps: 0.001,
            popularity_eps: 0.05,
            allow_non_private: false,
            allow_rating_level,
            seed: None,
            lease_secs: 60,
            plan: Some(LifetimePlan::new(52, 10.0, 1e-6).unwrap()),
            min_input_ratio: 0.0,
            mode: crate::config::ReleaseMode::Independent,
            continual_cap: 16,
            publish_delay_ms: 0,
        }
    }

    /// Users `a` (live budget) and `b` (a Renyi filter already full), two ratings each.
    fn snapshot() -> Snapshot {
        let orders = default_orders();
        let budget = |rdp: f64| UserBudget {
            eps: 10.0,
            delta: 1e-6,
            consumed: RdpCurve::new(orders.clone(), vec![rdp; orders.len()]).unwrap(),
        };
        let rating = |id: i64, user: &str, item: &str| RatingInput {
            id,
            user: user.into(),
            item: item.into(),
            value: 4.0,
            eps: 2.0,
            spent: 0.0,
            rho: 0.0,
            ldp: false,
        };
        Snapshot::build(
            [
                rating(1, "a", "x"),
                rating(2, "a", "y"),
                rating(3, "b", "x"),
                rating(4, "b", "y"),
            ],
            [("a".into(), budget(0.0)), ("b".into(), budget(1e6))].into(),
            vec!["x".into(), "y".into()],
        )
    }

    /// A rating-level trainer is refused by the release itself without the switch (the
    /// reason names it); with it, the release is planned as rating-level: no user-level
    /// event, no calibration, the popularity eps as configured, and a user whose filter
    /// is full takes no part.
    #[test]
    fn rating_level_admission_needs_the_switch_and_plans_no_user_charge() {
        let snap = snapshot();
        for name in ["pdp-pmf", "dp-pmf"] {
            let t: Arc<dyn Trainer> = Arc::from(build(name, &Params::new()).unwrap());
            let e = admit(&config(false), &t, &snap).err().unwrap();
            assert!(
                matches!(e, ReleaseError::RatingLevelNotAllowed { .. }),
                "{e}"
            );
            assert!(e.to_string().contains("trainer.allow_rating_level"), "{e}");
            let a = admit(&config(true), &t, &snap).unwrap();
            assert_eq!(a.guarantee, Guarantee::RatingLevel);
            assert!(a.private && a.user_event.is_none());
            assert_eq!(a.popularity_eps, 0.05);
            let admitted: Vec<u32> = a.plan.admitted().map(|r| r.index).collect();
            assert_eq!(admitted, vec![0, 1], "{name}");
            assert!(a.plan.users_excluded.contains_key("b"));
        }
        // The switch does not change a user-level trainer's release.
        let t: Arc<dyn Trainer> = Arc::from(build("dp-alt", &Params::new()).unwrap());
        let a = admit(&config(true), &t, &snap).unwrap();
        assert_eq!(a.guarantee, Guarantee::Proven);
        assert!(a.user_event.is_some());
    }

    /// A rating-level release writes its rating charges and no user charge (the user
    /// ledger is not charged as if it were user-level); a Gaussian part is refused, since
    /// the audit's group-privacy bound adds up pure eps only.
    #[test]
    fn rating_level_charges_write_no_user_charge() {
        let snap = snapshot();
        let t: Arc<dyn Trainer> = Arc::from(build("pdp-pmf", &Params::new()).unwrap());
        let a = admit(&config(true), &t, &snap).unwrap();
        let set = training_set(snap.clone(), &a.plan).unwrap();
        let mut trainer = ReleaseCharges {
            ratings: vec![
                RatingCharge {
                    position: 0,
                    eps: 0.4,
                },
                RatingCharge {
                    position: 1,
                    eps: 0.3,
                },
            ],
            ..ReleaseCharges::default()
        };
        let none = ReleaseCharges::default();
        let collect = |trainer: &ReleaseCharges, event: Option<&PrivacyEvent>| {
            collect_charges(&a.plan, &set, trainer.clone(), &none, event)
        };
        let c = collect(&trainer, None).unwrap();
        assert!(c.users.is_empty());
        let eps: Vec<f64> = c.ratings.all_rows().map(|r| r.eps_train).collect();
        assert_eq!(eps, vec![0.4, 0.3]);
        // The same charges with a user-level event charge every admitted user.
        let event = PrivacyEvent::pure_dp(0.1, 1).unwrap();
        let c = collect(&trainer, Some(&event)).unwrap();
        assert_eq!(c.users.keys().collect::<Vec<_>>(), vec!["a"]);
        trainer.rating_rho.push(RatingRho {
            position: 0,
            rho: 0.01,
        });
        let e = collect(&trainer, None).unwrap_err();
        assert!(e.to_string().contains("rating-level"), "{e}");
    }

    /// Each rating charge carries its own rating's planned state (the commit re-checks it
    /// against that state when nothing else was committed since the snapshot): ratings
    /// charged alike from different states stay apart, each with its own eps_ij, spend
    /// and Gaussian part.
    #[test]
    fn each_charge_carries_its_own_ratings_planned_state() {
        let orders = default_orders();
        let budget = UserBudget {
            eps: 10.0,
            delta: 1e-6,
            consumed: RdpCurve::new(orders.clone(), vec![0.0; orders.len()]).unwrap(),
        };
        let states = [(2.0, 0.0), (2.0, 0.5), (3.0, 0.0), (2.0, 0.0), (3.0, 0.25)];
        let ratings = states
            .iter()
            .enumerate()
            .map(|(k, &(eps, spent))| RatingInput {
                id: 10 + k as i64,
                user: "a".into(),
                item: format!("i{k}"),
                value: 4.0,
                eps,
                spent,
                rho: if k == 4 { 0.001 } else { 0.0 },
                ldp: false,
            });
        let items = (0..states.len()).map(|k| format!("i{k}")).collect();
        let snap = Snapshot::build(ratings, [("a".into(), budget)].into(), items);
        let t: Arc<dyn Trainer> = Arc::from(build("pdp-pmf", &Params::new()).unwrap());
        let a = admit(&config(true), &t, &snap).unwrap();
        let set = training_set(snap.clone(), &a.plan).unwrap();
        let trainer = ReleaseCharges {
            ratings: (0..set.len() as u32)
                .map(|position| RatingCharge { position, eps: 0.1 })
                .collect(),
            ..ReleaseCharges::default()
        };
        let none = ReleaseCharges::default();
        let c = collect_charges(&a.plan, &set, trainer, &none, None).unwrap();
        assert_eq!(c.ratings.len(), states.len());
        for (row, before) in c.ratings.rows_from(0..c.ratings.len()) {
            let r = snap.iter().find(|r| r.id == row.rating_id).unwrap();
            let before = before.expect("a planned state");
            assert_eq!(
                (before.eps, before.spent, before.rho),
                (r.eps, r.spent, r.rho),
                "rating {}",
                row.rating_id
            );
        }
    }

    /// Cutting the snapshot from the back while the set is filled builds the same set
    /// whatever the cut's size, also where ratings between admitted ones are left out.
    #[test]
    fn the_snapshot_given_back_in_parts_builds_the_same_set() {
        let rating = |id: i64| RatingInput {
            id,
            user: format!("u{}", id % 5),
            item: format!("i{}", id % 7),
            value: (id % 5) as f64 + 1.0,
            eps: 1.0,
            spent: if id % 3 == 0 { 0.25 } else { 0.0 },
            rho: 0.0,
            ldp: false,
        };
        let users = (0..5)
            .map(|u| {
                let b = UserBudget {
                    eps: 10.0,
                    delta: 1e-6,
                    consumed: RdpCurve::zeros_default(),
                };
                (format!("u{u}"), b)
            })
            .collect();
        let items = (0..7).map(|i| format!("i{i}")).collect();
        let snap = Snapshot::build((1..=40).map(rating), users, items);
        // Every rating but those with id % 4 == 1, two terms (spent 0 and 0.25).
        let plan = Plan::from_admitted(snap.iter().enumerate().filter(|(_, r)| r.id % 4 != 1).map(
            |(k, r)| ledger::Admitted {
                index: k as u32,
                share: 0.5,
                popularity: false,
                train_budget: 0.5,
                rho: 0.0,
                spent: r.spent,
                eps: r.eps,
            },
        ));
        let whole = training_set_giving_back(snap.clone(), &plan, usize::MAX).unwrap();
        assert_eq!(whole.len(), 30);
        assert_eq!(plan.terms().len(), 2);
        for give_back in [1, 2, 3, 7, 40] {
            let set = training_set_giving_back(snap.clone(), &plan, give_back).unwrap();
            assert_eq!(set.ids, whole.ids, "{give_back}");
            assert!(
                matches!(set.ids, SetIds::Runs(ref r) if r.len() == 10),
                "{give_back}"
            );
            assert_eq!(set.ratings.users, whole.ratings.users, "{give_back}");
            assert_eq!(set.ratings.items, whole.ratings.items, "{give_back}");
            assert_eq!(set.ratings.values, whole.ratings.values, "{give_back}");
            assert_eq!(set.terms(), whole.terms(), "{give_back}");
            assert_eq!(set.user_ids, whole.user_ids);
        }
        let want: Vec<i64> = (1..=40).filter(|id| id % 4 != 1).collect();
        assert_eq!(whole.ids.iter().collect::<Vec<_>>(), want);
        for (k, id) in whole.ids.iter().enumerate() {
            let r = rating(id);
            let user = &whole.user_ids[whole.ratings.users[k] as usize];
            assert_eq!((user, whole.ratings.values[k]), (&r.user, r.value as f32));
            let t = plan.terms()[whole.terms()[k] as usize];
            assert_eq!(t.spent, r.spent);
            assert_eq!(whole.budgets().get(k), 0.5);
        }
    }

    /// Ids filled from the back read back ascending, as runs where those are at most half
    /// as many as the ids, else one by one.
    #[test]
    fn set_ids_keep_every_id_in_the_smaller_form() {
        let build = |ids: &[i64]| {
            let mut s = SetIds::for_ids(ids.len(), ids.iter().copied());
            for (k, &id) in ids.iter().enumerate().rev() {
                s.set_from_back(k, id);
            }
            s.finish();
            assert_eq!(s.iter().collect::<Vec<_>>(), ids);
            s
        };
        assert_eq!(build(&[5, 6, 7, 9]), SetIds::Runs(vec![(5, 7), (9, 9)]));
        assert_eq!(build(&[1, 3, 5, 7]), SetIds::Plain(vec![1, 3, 5, 7]));
        assert_eq!(build(&[]), SetIds::Runs(vec![]));
        assert!(
            matches!(build(&[4, 5, 6, 8, 10]), SetIds::Plain(_)),
            "3 runs for 5 ids"
        );
    }
}
