//! The privacy ledger (DESIGN 3-4).
//!
//! This module is the pure budget arithmetic (no I/O): the per-release share of a
//! rating's eps_ij ([`SharePolicy`], [`release_share`]), the exact spend check
//! ([`fits`]), a rating's loss with its Gaussian part in zCDP ([`rating_loss`]), the
//! per-user RDP cost of a release ([`user_cost`]) and the admission plan
//! of a release ([`plan`]). The transaction that records a release re-checks these with the
//! stored state; its SQL lives with the store (the service's store).
//! The semantics are written down in docs/LEDGER.md.

use std::collections::{BTreeMap, HashMap};

use crate::accountant::{
    compose_events, default_orders, eps_from_rdp, plan::releases_left, AccountantError,
    PrivacyEvent, PrivacyGuarantee, RdpCurve, RenyiFilter,
};

/// How much of a rating's lifetime eps_ij one release may spend. Parsed once, from the
/// configuration's `budget.share` (`fraction:F` or `split:K`), and written back in the
/// same form.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SharePolicy {
    /// `F * eps_ij` per release (capped by what remains), `0 < F <= 1`.
    Fraction(f64),
    /// `eps_ij / K` per release: at most K releases.
    Split(u32),
}

/// The textual form of a [`SharePolicy`], for error messages.
pub const SHARE_POLICY_FORMAT: &str = "fraction:F (0 < F <= 1) or split:K (K >= 1)";

/// Why a share policy did not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SharePolicyError {
    #[error("{0:?} names no kind")]
    NoKind(String),
    #[error("unknown share policy {0:?}")]
    UnknownKind(String),
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("fraction {0} must be in (0, 1]")]
    FractionOutOfRange(f64),
    #[error("{0:?} is not a positive integer")]
    NotAnInteger(String),
    #[error("split:K needs K >= 1")]
    ZeroSplit,
}

impl SharePolicy {
    /// Parses `fraction:F` or `split:K` (white space around the kind and the number is
    /// allowed).
    pub fn parse(s: &str) -> Result<Self, SharePolicyError> {
        let (kind, arg) = s
            .split_once(':')
            .ok_or_else(|| SharePolicyError::NoKind(s.into()))?;
        match kind.trim() {
            "fraction" => {
                let f: f64 = arg
                    .trim()
                    .parse()
                    .map_err(|_| SharePolicyError::NotANumber(arg.into()))?;
                if !(f > 0.0 && f <= 1.0) {
                    return Err(SharePolicyError::FractionOutOfRange(f));
                }
                Ok(Self::Fraction(f))
            }
            "split" => {
                let k: u32 = arg
                    .trim()
                    .parse()
                    .map_err(|_| SharePolicyError::NotAnInteger(arg.into()))?;
                if k == 0 {
                    return Err(SharePolicyError::ZeroSplit);
                }
                Ok(Self::Split(k))
            }
            other => Err(SharePolicyError::UnknownKind(other.into())),
        }
    }

    /// The share one release wants of a rating with lifetime budget `eps`.
    pub fn want(&self, eps: f64) -> f64 {
        match *self {
            Self::Fraction(f) => f * eps,
            Self::Split(k) => eps / k as f64,
        }
    }
}

impl std::str::FromStr for SharePolicy {
    type Err = SharePolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The form [`SharePolicy::parse`] reads (`fraction:0.25`, `split:4`).
impl std::fmt::Display for SharePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fraction(x) => write!(f, "fraction:{x}"),
            Self::Split(k) => write!(f, "split:{k}"),
        }
    }
}

impl serde::Serialize for SharePolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for SharePolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Text;
        impl serde::de::Visitor<'_> for Text {
            type Value = SharePolicy;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(SHARE_POLICY_FORMAT)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SharePolicy, E> {
                SharePolicy::parse(v)
                    .map_err(|e| E::custom(format!("{e}; expected {SHARE_POLICY_FORMAT}")))
            }
        }
        d.deserialize_str(Text)
    }
}

/// The public delta at which a rating's Gaussian loss (its `rho`) is stated in eps.
pub const RATING_DELTA: f64 = 1e-6;

/// eps at [`RATING_DELTA`] of a `rho`-zCDP loss (Renyi divergence `alpha * rho` at every
/// order: the composition of Gaussian mechanisms, `rho = sum 1 / (2 z^2)` for
/// multipliers `z`), by the accountant's conversion on the default orders. 0 for 0.
pub fn gaussian_eps(rho: f64) -> f64 {
    if rho.is_nan() {
        return f64::INFINITY;
    }
    if rho <= 0.0 {
        return 0.0;
    }
    let orders = default_orders();
    let values = orders.iter().map(|a| a * rho).collect();
    RdpCurve::new(orders, values)
        .and_then(|c| crate::accountant::eps_from_rdp(&c, RATING_DELTA))
        .map_or(f64::INFINITY, |g| g.eps)
}

/// A rating's privacy-loss bound at [`RATING_DELTA`] (rating level, DESIGN 3): its pure
/// spend (`spent`: pure-DP charges and per-release conversions, added up) plus its
/// Gaussian part `rho`, composed in zCDP and converted once. Full-participation Gaussian
/// releases compose as `sqrt(T)`, not `T`, so a rating can take part in a lifetime of
/// releases within a moderate eps_ij (docs/LEDGER.md).
pub fn rating_loss(spent: f64, rho: f64) -> f64 {
    spent + gaussian_eps(rho)
}

/// Whether a charge of pure `charge` and Gaussian `rho_add` keeps a rating at
/// `(spent, rho)` within `eps`, in the arithmetic the ledger stores (no tolerance).
pub fn fits_with_rho(eps: f64, spent: f64, rho: f64, charge: f64, rho_add: f64) -> bool {
    charge.is_finite()
        && charge >= 0.0
        && rho_add.is_finite()
        && rho_add >= 0.0
        && rating_loss(spent + charge, rho + rho_add) <= eps
}

/// The commit-time re-check of rating charges (DESIGN 4: charged before anything is
/// published, never overspent): each charge against the rating's stored `(eps, spent,
/// rho)`, in exactly the arithmetic of [`fits_with_rho`]. A release's ratings mostly share
/// their Gaussian part, so each distinct `rho` is converted once (the conversion minimises
/// over the order grid, and the store runs this under its lock).
#[derive(Debug, Default)]
pub struct RatingRecheck {
    eps_of_rho: HashMap<u64, f64>,
}

/// A charge that does not fit: the rating's loss bound before and after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Overspend {
    pub before: f64,
    pub after: f64,
}

impl RatingRecheck {
    fn gaussian(&mut self, rho: f64) -> f64 {
        *self
            .eps_of_rho
            .entry(rho.to_bits())
            .or_insert_with(|| gaussian_eps(rho))
    }

    /// What a charge of pure `charge` and Gaussian `rho_add` adds to the loss bound of a
    /// rating at `(eps, spent, rho)` (exactly `charge` when it has no Gaussian part), or
    /// [`Overspend`] when the rating cannot take it.
    pub fn check(
        &mut self,
        eps: f64,
        spent: f64,
        rho: f64,
        charge: f64,
        rho_add: f64,
    ) -> Result<f64, Overspend> {
        let before = spent + self.gaussian(rho);
        let after = (spent + charge) + self.gaussian(rho + rho_add);
        let valid = charge.is_finite() && charge >= 0.0 && rho_add.is_finite() && rho_add >= 0.0;
        if !(valid && after <= eps) {
            return Err(Overspend { before, after });
        }
        Ok(if rho_add == 0.0 {
            charge
        } else {
            after - before
        })
    }
}

/// Whether charging `charge` on top of `spent` keeps the rating within `eps`, in the
/// floating-point arithmetic that the ledger stores (no tolerance).
pub fn fits(eps: f64, spent: f64, charge: f64) -> bool {
    charge.is_finite() && charge >= 0.0 && spent + charge <= eps
}

/// The share of a rating this release may spend: the policy's share capped by what
/// remains, rounded down until `spent + share <= eps` holds exactly. `None` when less
/// than `min_eps` remains (the rating is exhausted and takes no part).
pub fn release_share(policy: SharePolicy, eps: f64, spent: f64, min_eps: f64) -> Option<f64> {
    let remaining = eps - spent;
    if remaining.is_nan() || remaining < min_eps {
        return None;
    }
    let mut share = policy.want(eps).min(remaining);
    while share > 0.0 && !fits(eps, spent, share) {
        share = f64::from_bits(share.to_bits() - 1);
    }
    (share >= min_eps).then_some(share)
}

/// The pure-DP charges of one user's ratings as privacy events, equal amounts grouped.
pub fn pure_events(charges: impl IntoIterator<Item = f64>) -> Vec<PrivacyEvent> {
    let mut by_bits: BTreeMap<u64, u64> = BTreeMap::new();
    for c in charges {
        if c > 0.0 {
            *by_bits.entry(c.to_bits()).or_default() += 1;
        }
    }
    by_bits
        .into_iter()
        .map(|(bits, count)| PrivacyEvent::PureDp {
            eps: f64::from_bits(bits),
            count,
        })
        .collect()
}

/// The RDP curve of `events` on the default grid (zero for no events).
pub fn user_cost(events: &[PrivacyEvent]) -> Result<RdpCurve, AccountantError> {
    compose_events(events, &default_orders())
}

/// What the planner reads of a rating: its user and its budget (no value needed to plan).
/// The store's snapshot rows implement it, so a release plans without a copy of them.
pub trait PlannedRating {
    fn user(&self) -> &str;
    fn eps(&self) -> f64;
    fn spent(&self) -> f64;
    fn rho(&self) -> f64;
}

impl PlannedRating for RatingBudget {
    fn user(&self) -> &str {
        &self.user
    }
    fn eps(&self) -> f64 {
        self.eps
    }
    fn spent(&self) -> f64 {
        self.spent
    }
    fn rho(&self) -> f64 {
        self.rho
    }
}

/// A rating as the planner sees it (no value needed to plan).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RatingBudget {
    pub id: i64,
    pub user: std::sync::Arc<str>,
    pub eps: f64,
    /// Pure spend (see [`rating_loss`]).
    pub spent: f64,
    /// Gaussian part, zCDP `rho` (see [`rating_loss`]).
    pub rho: f64,
}

/// A user's RDP budget and what it has consumed.
#[derive(Debug, Clone)]
pub struct UserBudget {
    pub eps: f64,
    pub delta: f64,
    pub consumed: RdpCurve,
}

impl UserBudget {
    /// Whether the user's Renyi filter `(eps, delta)` admits `events` on top of what the
    /// user has consumed.
    pub fn admits(&self, events: &[PrivacyEvent]) -> Result<bool, AccountantError> {
        RenyiFilter::with_default_orders(self.eps, self.delta)?
            .admits(&self.consumed, &user_cost(events)?)
    }

    /// The commit's charge of a release's user-level `cost`: the order at which the
    /// user's filter admits it and the consumed curve after it; `None` when the filter
    /// does not admit it (nothing is charged then).
    pub fn charge_cost(&self, cost: &RdpCurve) -> Result<Option<(f64, RdpCurve)>, AccountantError> {
        let filter = RenyiFilter::with_default_orders(self.eps, self.delta)?;
        let Some(order) = filter.admitting_order(&self.consumed, cost)? else {
            return Ok(None);
        };
        Ok(Some((order, self.consumed.compose(cost)?)))
    }

    /// The filter's eps in use (what it compares with eps_u) and whether no order has room
    /// left: the operator overview's figures for every user, without the audit's
    /// conversion.
    pub fn filter_use(&self) -> Result<(f64, bool), AccountantError> {
        self.filter_use_in(&RenyiFilter::with_default_orders(self.eps, self.delta)?)
    }

    fn filter_use_in(&self, filter: &RenyiFilter) -> Result<(f64, bool), AccountantError> {
        let used = filter.filter_eps(&self.consumed)?;
        let exhausted = filter.remaining(&self.consumed)?.iter().all(|&r| r <= 0.0);
        Ok((used, exhausted))
    }

    /// What the user's audit shows of the ledger: the spend as (eps, delta_u) and the
    /// filter's eps in use, whether the filter is full, and how many more releases of a
    /// given per-release cost (the newest release's events) it admits.
    pub fn audit(
        &self,
        per_release: Option<&[PrivacyEvent]>,
    ) -> Result<AuditSummary, AccountantError> {
        let filter = RenyiFilter::with_default_orders(self.eps, self.delta)?;
        let spent = filter.spent(&self.consumed)?;
        let (filter_eps, exhausted) = self.filter_use_in(&filter)?;
        let releases_left = match per_release {
            Some(events) => compose_events(events, filter.orders())
                .and_then(|cost| releases_left(&filter, &self.consumed, &cost))
                .ok(),
            None => None,
        };
        Ok(AuditSummary {
            spent,
            filter_eps,
            exhausted,
            releases_left,
        })
    }

    /// The user's consumed curve after charging `events`, or `None` when the user's
    /// Renyi filter does not admit them (nothing is charged then).
    pub fn charge(&self, events: &[PrivacyEvent]) -> Result<Option<RdpCurve>, AccountantError> {
        Ok(self.charge_cost(&user_cost(events)?)?.map(|(_, next)| next))
    }
}

/// The audit numbers of one user's ledger state ([`UserBudget::audit`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditSummary {
    /// The consumed curve converted at the user's delta.
    pub spent: PrivacyGuarantee,
    /// The filter's eps in use (what the filter compares with eps_u).
    pub filter_eps: f64,
    /// No order has room left.
    pub exhausted: bool,
    /// Further releases of the given per-release cost the filter admits (`None`: no cost
    /// given, or it could not be composed).
    pub releases_left: Option<u64>,
}

/// The user's filter eps before any release and after each release, oldest first, from
/// each release's charged events (`releases` newest first, as the audit lists them).
pub fn spend_history(
    eps: f64,
    delta: f64,
    releases: &[(i64, Vec<PrivacyEvent>)],
) -> Result<Vec<(Option<i64>, f64)>, AccountantError> {
    let filter = RenyiFilter::with_default_orders(eps, delta)?;
    let mut acc = RdpCurve::zeros(filter.orders().to_vec())?;
    let mut out = vec![(None, filter.filter_eps(&acc)?)];
    for (id, events) in releases.iter().rev() {
        acc = acc.compose(&compose_events(events, filter.orders())?)?;
        out.push((Some(*id), filter.filter_eps(&acc)?));
    }
    Ok(out)
}

/// One release's cost to a user alone, as eps at `delta`, from its charged events.
pub fn release_eps(events: &[PrivacyEvent], delta: f64) -> Result<f64, AccountantError> {
    let curve = compose_events(events, &default_orders())?;
    Ok(eps_from_rdp(&curve, delta)?.eps)
}

/// Whether a change of one user's ledger state, from `before` (`None`: no such user yet)
/// to `after` (a lowered budget, or a local charge added to the consumed curve), keeps
/// the charge `held` by a release in flight admissible: a user whose filter admitted the
/// held events before the change may be in that release, and its commit will charge
/// them, so the filter must still admit them after it. A user the filter did not admit
/// is not charged by that release (the planner admits exactly the users whose filter
/// admits the release's constant event, and a filter only loses room while the user has
/// been charged). Public values and the user's own state only: the refusal leaks nothing
/// about anyone else (docs/LEDGER.md, "Releases in flight").
pub fn keeps_hold(
    before: Option<&UserBudget>,
    after: &UserBudget,
    held: &[PrivacyEvent],
) -> Result<bool, AccountantError> {
    if held.is_empty() {
        return Ok(true);
    }
    match before {
        Some(b) if b.admits(held)? => after.admits(held),
        _ => Ok(true),
    }
}

/// What a local charge (LDP ratings, a Private-GD report: charged when received) does to
/// a user's filter.
#[derive(Debug, Clone, PartialEq)]
pub enum LocalCharge {
    /// Admitted: the consumed curve after it.
    Charged(RdpCurve),
    /// The filter does not admit it.
    NoRoom,
    /// Admitted alone, but it would leave too little for the charge `held` by a release in
    /// flight ([`keeps_hold`]): refused until that release has committed.
    Held,
}

/// Charges `events` to `budget` unless the filter refuses them or they break a hold.
pub fn charge_local(
    budget: &UserBudget,
    events: &[PrivacyEvent],
    held: &[PrivacyEvent],
) -> Result<LocalCharge, AccountantError> {
    let Some(next) = budget.charge(events)? else {
        return Ok(LocalCharge::NoRoom);
    };
    let after = UserBudget {
        consumed: next,
        ..budget.clone()
    };
    if !keeps_hold(Some(budget), &after, held)? {
        return Ok(LocalCharge::Held);
    }
    Ok(LocalCharge::Charged(after.consumed))
}

/// Why a rating or user takes no part in a release.
#[derive(Debug, Clone, PartialEq)]
pub enum Exclusion {
    /// Less than `min_release_eps` of eps_ij remains.
    RatingExhausted,
    /// The user's Renyi filter would not admit the planned cost of this release.
    UserFilterFull,
    /// The user's budget is unusable (e.g. invalid stored values).
    UserInvalid(String),
}

/// A rating admitted to a release (built on the fly by [`Plan::admitted`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admitted {
    /// Index into the planner's input.
    pub index: u32,
    /// The share of eps_ij this release may spend in total.
    pub share: f64,
    /// Whether the rating is counted in the DP popularity (charged `popularity_eps`).
    pub popularity: bool,
    /// What the trainer may spend: `share - popularity_eps` if counted, else `share`.
    pub train_budget: f64,
    /// The rating's Gaussian loss so far (zCDP `rho`): a Gaussian trainer's charge is
    /// the increase of [`gaussian_eps`] from here.
    pub rho: f64,
    /// The rating's pure spend so far (with `rho`, what the release's charges are checked
    /// against without the snapshot, which goes before the fit).
    pub spent: f64,
    /// The rating's eps_ij (with `spent` and `rho`, the state the commit re-checks the
    /// charge against when the ledger has not moved since the snapshot).
    pub eps: f64,
}

/// What an admitted rating may spend: the same for every rating in the same budget state,
/// so a plan stores each distinct one once (the fields as in [`Admitted`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Terms {
    pub share: f64,
    pub popularity: bool,
    pub train_budget: f64,
    pub rho: f64,
    pub spent: f64,
    pub eps: f64,
}

impl Terms {
    fn key(&self) -> [u64; 6] {
        [
            self.share.to_bits(),
            u64::from(self.popularity),
            self.train_budget.to_bits(),
            self.rho.to_bits(),
            self.spent.to_bits(),
            self.eps.to_bits(),
        ]
    }
}

/// The admission plan of one release. The admitted ratings are 8 bytes each (their
/// index and the index of their terms): a plan holds one per admitted rating, tens of
/// millions at scale.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    admitted: Vec<(u32, u32)>,
    terms: Vec<Terms>,
    terms_index: HashMap<[u64; 6], u32>,
    pub ratings_exhausted: usize,
    /// Users left out, with the reason.
    pub users_excluded: BTreeMap<String, Exclusion>,
    /// Users charged the release's user-level event (sorted): every registered user whose
    /// filter admits it, whether or not any of the user's ratings is admitted, so no
    /// rating's presence decides whether its user is charged (private releases only).
    pub users_charged: Vec<String>,
}

impl Plan {
    /// A plan admitting `admitted` (in order) and nothing else decided.
    pub fn from_admitted(admitted: impl IntoIterator<Item = Admitted>) -> Self {
        let mut p = Self::default();
        for a in admitted {
            p.push(a);
        }
        p
    }

    fn push(&mut self, a: Admitted) {
        let t = Terms {
            share: a.share,
            popularity: a.popularity,
            train_budget: a.train_budget,
            rho: a.rho,
            spent: a.spent,
            eps: a.eps,
        };
        let next = self.terms.len() as u32;
        let k = *self.terms_index.entry(t.key()).or_insert(next);
        if k == next {
            self.terms.push(t);
        }
        self.admitted.push((a.index, k));
    }

    /// The admitted ratings, in input order; position `k` is the training set's rating `k`.
    pub fn admitted(&self) -> impl ExactSizeIterator<Item = Admitted> + '_ {
        self.admitted.iter().map(|&pair| self.resolve(pair))
    }

    /// The `k`-th admitted rating (panics when `k >= admitted_len()`).
    pub fn admitted_at(&self, k: usize) -> Admitted {
        self.resolve(self.admitted[k])
    }

    fn resolve(&self, (index, k): (u32, u32)) -> Admitted {
        let t = self.terms[k as usize];
        Admitted {
            index,
            share: t.share,
            popularity: t.popularity,
            train_budget: t.train_budget,
            rho: t.rho,
            spent: t.spent,
            eps: t.eps,
        }
    }

    pub fn admitted_len(&self) -> usize {
        self.admitted.len()
    }

    /// Each admitted rating as (index into the planner's input, index into
    /// [`Plan::terms`]), in admission order.
    pub fn admitted_pairs(&self) -> &[(u32, u32)] {
        &self.admitted
    }

    /// The distinct terms of the admitted ratings ([`Plan::admitted_pairs`] index them).
    pub fn terms(&self) -> &[Terms] {
        &self.terms
    }

    /// Each terms' training budget and Gaussian loss so far: what a trainer reads per
    /// rating through the terms' index (`PerRating::Coded`).
    pub fn terms_values(&self) -> (Vec<f64>, Vec<f64>) {
        let budget = self.terms.iter().map(|t| t.train_budget).collect();
        let rho = self.terms.iter().map(|t| t.rho).collect();
        (budget, rho)
    }

    /// Frees the list of admitted ratings once a training set holds each one's terms
    /// index (8 bytes a rating: 160 MB at 20M ratings beside the fit). After it the plan
    /// admits nothing ([`Plan::admitted`] is empty); its terms, users and counts stay.
    pub fn release_admitted(&mut self) {
        self.admitted = Vec::new();
    }
}

/// Parameters of [`plan`].
#[derive(Debug, Clone)]
pub struct PlanParams {
    pub policy: SharePolicy,
    pub min_release_eps: f64,
    pub popularity_eps: f64,
    /// User level (DESIGN 3): the RDP event one release costs every user who takes part,
    /// the same constant for every user (`train::units::release_user_event`: the
    /// trainer's user-level event and the popularity's, for users with at most `m`
    /// ratings). `None`: nothing is charged per user.
    pub user_event: Option<PrivacyEvent>,
    /// Apply the users' Renyi filters (false only for non-private releases, which
    /// charge nothing).
    pub check_user_filter: bool,
}

/// Decides which ratings take part in a release and with which shares.
///
/// 1. Each rating gets [`release_share`]; exhausted ratings are left out.
/// 2. A rating is counted in the popularity release iff its share is at least twice
///    `popularity_eps` (eps preferences are public metadata, so this selection is too).
/// 3. A user takes part (and is charged) iff the user's Renyi filter admits `user_event`,
///    the constant user-level cost of the release (the same for every user), whether or
///    not any of the user's ratings is admitted. So a rating's admission
///    depends only on its own eps_ij and spend (and its user's), and a user's only on the
///    user's own past charges: adding or removing one rating never changes the admission
///    of any other rating or user (DESIGN 3; issue 8, finding 2). Users whose filter is
///    full are left out with their ratings (skipped for non-private releases, which
///    charge nothing). The commit re-checks the filter with the charges actually made.
pub fn plan<R: PlannedRating>(
    params: &PlanParams,
    ratings: &[R],
    users: &BTreeMap<String, UserBudget>,
) -> Plan {
    let inputs = ratings.iter().map(|r| PlanInput {
        user: r.user(),
        eps: r.eps(),
        spent: r.spent(),
        rho: r.rho(),
    });
    plan_inputs(params, inputs, users)
}

/// A rating as the planner reads it: its user and its budget state (no value, no id).
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    pub user: &'a str,
    pub eps: f64,
    pub spent: f64,
    pub rho: f64,
}

/// [`plan`] over ratings in any form (e.g. a compact snapshot's rows resolved on the
/// fly); [`Admitted::index`] is the position in `ratings`.
pub fn plan_inputs<'a>(
    params: &PlanParams,
    ratings: impl Iterator<Item = PlanInput<'a>>,
    users: &BTreeMap<String, UserBudget>,
) -> Plan {
    let mut out = Plan::default();
    // Ratings with a share, in input order, each with its user's index in `names`: one
    // flat list (no per-user lists: a snapshot may hold tens of millions of ratings).
    let mut names: HashMap<&str, u32> = HashMap::new();
    let mut user_of: Vec<u32> = Vec::new();
    let mut loss_of: HashMap<(u64, u64), f64> = HashMap::new();
    for (index, r) in ratings.enumerate() {
        // Most ratings share the same (spent, rho): convert each pair once.
        let loss = *loss_of
            .entry((r.spent.to_bits(), r.rho.to_bits()))
            .or_insert_with(|| rating_loss(r.spent, r.rho));
        match release_share(params.policy, r.eps, loss, params.min_release_eps) {
            None => out.ratings_exhausted += 1,
            Some(share) => {
                let popularity = share >= 2.0 * params.popularity_eps;
                let train_budget = if popularity {
                    share - params.popularity_eps
                } else {
                    share
                };
                let next = names.len() as u32;
                user_of.push(*names.entry(r.user).or_insert(next));
                out.push(Admitted {
                    index: u32::try_from(index).expect("at most 2^32 ratings a release"),
                    share,
                    popularity,
                    train_budget,
                    rho: r.rho,
                    spent: r.spent,
                    eps: r.eps,
                });
            }
        }
    }
    if !params.check_user_filter {
        return out;
    }
    // The same constant for every user: nothing about the user's ratings enters. Every
    // registered user is charged while the filter admits it, with or without admitted
    // ratings: otherwise a user's only admissible rating would decide whether the user
    // is charged, and so (at the end of the lifetime) whether the user's other ratings
    // are used later (docs/LEDGER.md, "The user-level event").
    let events: Vec<PrivacyEvent> = params.user_event.iter().cloned().collect();
    let mut keep = vec![false; names.len()];
    for (user, budget) in users {
        match budget.admits(&events).map_err(|e| e.to_string()) {
            Ok(true) => {
                out.users_charged.push(user.clone());
                if let Some(&u) = names.get(user.as_str()) {
                    keep[u as usize] = true;
                }
            }
            Ok(false) => {
                out.users_excluded
                    .insert(user.clone(), Exclusion::UserFilterFull);
            }
            Err(e) => {
                out.users_excluded
                    .insert(user.clone(), Exclusion::UserInvalid(e));
            }
        }
    }
    // Ratings of users the store does not know (no budget): left out.
    for name in names.keys().filter(|n| !users.contains_key(**n)) {
        out.users_excluded
            .insert(name.to_string(), Exclusion::UserInvalid("no budget".into()));
    }
    let mut user = user_of.into_iter();
    out.admitted
        .retain(|_| user.next().is_some_and(|u| keep[u as usize]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Gaussian part is converted as the accountant converts a Gaussian: `rho` of
    /// multiplier `z` is `1 / (2 z^2)` (a wrong factor of 2 in either place fails), and
    /// T full participations cost far less than T times one (sqrt composition).
    #[test]
    fn gaussian_part_matches_the_accountant_and_composes_sublinearly() {
        for z in [0.5, 1.0, 3.0] {
            let curve = compose_events(&[PrivacyEvent::gaussian(z, 1).unwrap()], &default_orders())
                .unwrap();
            let want = crate::accountant::eps_from_rdp(&curve, RATING_DELTA)
                .unwrap()
                .eps;
            let got = gaussian_eps(1.0 / (2.0 * z * z));
            assert!((got - want).abs() < 1e-9 * want, "z {z}: {got} vs {want}");
            assert!(gaussian_eps(1.0 / (z * z)) > want * 1.2, "z {z}");
        }
        let rho = 1.0 / (2.0 * 3.0 * 3.0);
        let one = gaussian_eps(rho);
        let fifty_two = gaussian_eps(52.0 * rho);
        assert!(fifty_two < 52.0 * one / 4.0, "{fifty_two} vs 52 x {one}");
        assert_eq!(gaussian_eps(0.0), 0.0);
        assert_eq!(rating_loss(0.25, 0.0), 0.25);
        assert!(gaussian_eps(f64::NAN).is_infinite());
        // The exact check the commit applies.
        assert!(fits_with_rho(one + 0.1, 0.1, 0.0, 0.0, rho));
        assert!(!fits_with_rho(one + 0.1, 0.1 + 1e-9, 0.0, 0.0, rho));
        assert!(!fits_with_rho(10.0, 0.0, 0.0, 0.0, -rho));
    }

    /// Admission sees a rating's whole loss bound (pure + converted Gaussian part).
    #[test]
    fn plan_counts_the_gaussian_part_of_a_rating() {
        let params = PlanParams {
            policy: SharePolicy::Fraction(1.0),
            min_release_eps: 0.001,
            popularity_eps: 0.0,
            user_event: None,
            check_user_filter: false,
        };
        let rho = 0.05;
        let r = RatingBudget {
            id: 1,
            user: "u".into(),
            eps: 2.0,
            spent: 0.5,
            rho,
        };
        let p = plan(&params, &[r], &BTreeMap::new());
        let a = p.admitted_at(0);
        assert_eq!(a.rho, rho);
        let left = 2.0 - rating_loss(0.5, rho);
        assert!((a.train_budget - left).abs() < 1e-12 && a.train_budget <= left);
    }

    #[test]
    fn policy_parsing() {
        assert_eq!(
            SharePolicy::parse("fraction:0.25"),
            Ok(SharePolicy::Fraction(0.25))
        );
        assert_eq!(SharePolicy::parse("split:4"), Ok(SharePolicy::Split(4)));
        // The textual form is what parse reads back (configuration round trip).
        for p in [SharePolicy::Fraction(0.25), SharePolicy::Split(4)] {
            assert_eq!(SharePolicy::parse(&p.to_string()), Ok(p));
        }
        assert_eq!(SharePolicy::parse(" split : 3 "), Ok(SharePolicy::Split(3)));
        for bad in [
            "fraction:0",
            "fraction:1.5",
            "split:0",
            "half",
            "x:1",
            "fraction:nan",
        ] {
            assert!(SharePolicy::parse(bad).is_err(), "{bad}");
        }
    }

    /// Repeated releases never spend more than eps_ij, in exact floating point, for
    /// awkward budgets and both policies; the number of releases is the expected one.
    #[test]
    fn cumulative_spend_never_exceeds_eps() {
        for policy in [
            SharePolicy::Fraction(0.25),
            SharePolicy::Fraction(0.3),
            SharePolicy::Split(3),
            SharePolicy::Split(7),
            SharePolicy::Fraction(1.0),
        ] {
            for eps in [0.1, 0.3, 1.0, 0.7, 2.9, 10.0, 1e-3] {
                let mut spent = 0.0;
                let mut releases = 0;
                while let Some(s) = release_share(policy, eps, spent, 1e-9) {
                    assert!(fits(eps, spent, s));
                    spent += s;
                    assert!(spent <= eps, "{policy:?} eps {eps} spent {spent}");
                    releases += 1;
                    assert!(releases < 100, "{policy:?} eps {eps} never exhausts");
                }
                let k = match policy {
                    SharePolicy::Split(k) => k as usize,
                    SharePolicy::Fraction(f) => (1.0 / f).ceil() as usize,
                };
                assert!(
                    releases >= k && releases <= k + 1,
                    "{policy:?} {eps}: {releases}"
                );
            }
        }
    }

    #[test]
    fn share_is_capped_by_remaining_and_min() {
        let p = SharePolicy::Fraction(0.25);
        assert_eq!(release_share(p, 1.0, 0.0, 0.01), Some(0.25));
        assert_eq!(release_share(p, 1.0, 0.9, 0.01), Some(1.0 - 0.9));
        assert_eq!(release_share(p, 1.0, 0.995, 0.01), None);
        assert_eq!(release_share(p, 1.0, 1.0, 0.01), None);
        assert!(!fits(1.0, 0.9, 0.2));
        assert!(!fits(1.0, 0.0, f64::NAN));
        assert!(!fits(1.0, 0.0, -0.1));
    }

    #[test]
    fn pure_events_group_equal_amounts() {
        let e = pure_events([0.25, 0.25, 0.1, 0.0]);
        assert_eq!(e.len(), 2);
        assert!(e.contains(&PrivacyEvent::PureDp {
            eps: 0.25,
            count: 2
        }));
    }

    fn budgets(users: &[(&str, f64)]) -> BTreeMap<String, UserBudget> {
        users
            .iter()
            .map(|(u, e)| {
                (
                    u.to_string(),
                    UserBudget {
                        eps: *e,
                        delta: 1e-6,
                        consumed: RdpCurve::zeros_default(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn plan_excludes_exhausted_ratings_and_full_users() {
        let params = PlanParams {
            policy: SharePolicy::Fraction(0.5),
            min_release_eps: 0.01,
            popularity_eps: 0.05,
            user_event: Some(PrivacyEvent::gaussian(5.0, 1).unwrap()),
            check_user_filter: true,
        };
        let r = |id, user: &str, eps, spent| RatingBudget {
            id,
            user: user.into(),
            eps,
            spent,
            rho: 0.0,
        };
        let ratings = vec![
            r(1, "a", 1.0, 0.0),
            r(2, "a", 1.0, 1.0), // exhausted
            r(3, "b", 1.0, 0.0),
            r(4, "poor", 1.0, 0.0),
            r(5, "a", 0.15, 0.0), // share 0.075 < 2 * popularity eps
        ];
        let users = budgets(&[("a", 10.0), ("b", 10.0), ("poor", 0.5)]);
        let p = plan(&params, &ratings, &users);
        let ids: Vec<i64> = p.admitted().map(|a| ratings[a.index as usize].id).collect();
        assert_eq!(ids, vec![1, 3, 5]);
        assert_eq!(p.ratings_exhausted, 1);
        assert_eq!(
            p.users_excluded.get("poor"),
            Some(&Exclusion::UserFilterFull)
        );
        let a1 = p.admitted_at(0);
        assert!(a1.popularity && (a1.share - 0.5).abs() < 1e-15);
        assert!((a1.train_budget - 0.45).abs() < 1e-12);
        let a5 = p.admitted_at(2);
        assert!(!a5.popularity && a5.train_budget == a5.share);
    }

    /// Every user is charged the same constant: a heavy user with a large eps_ij rating
    /// and a light user are admitted or excluded together, whatever their ratings.
    #[test]
    fn plan_charges_every_user_the_same_constant() {
        let params = PlanParams {
            policy: SharePolicy::Fraction(0.25),
            min_release_eps: 0.001,
            popularity_eps: 0.05,
            user_event: Some(PrivacyEvent::gaussian(1.5, 2).unwrap()),
            check_user_filter: true,
        };
        let mut many: Vec<RatingBudget> = (0..300)
            .map(|k| RatingBudget {
                id: k,
                user: "heavy".into(),
                eps: if k == 7 { 10.0 } else { 1.0 },
                spent: 0.0,
                rho: 0.0,
            })
            .collect();
        many.push(RatingBudget {
            id: 300,
            user: "light".into(),
            eps: 0.1,
            spent: 0.0,
            rho: 0.0,
        });
        let p = plan(
            &params,
            &many,
            &budgets(&[("heavy", 10.0), ("light", 10.0)]),
        );
        assert!(p.users_excluded.is_empty(), "{:?}", p.users_excluded);
        assert_eq!(p.admitted_len(), 301);
        let p = plan(&params, &many, &budgets(&[("heavy", 0.4), ("light", 0.4)]));
        assert_eq!(p.users_excluded.len(), 2, "{:?}", p.users_excluded);
    }

    /// A change that leaves too little room for the held event is refused only for a
    /// user the filter admitted before it; without a hold, or for a user the release
    /// cannot be charging (filter already full, or no such user), anything goes.
    #[test]
    fn a_hold_refuses_only_changes_that_would_break_the_release() {
        let held = [PrivacyEvent::gaussian(5.0, 1).unwrap()];
        let at = |eps: f64| UserBudget {
            eps,
            delta: 1e-6,
            consumed: RdpCurve::zeros_default(),
        };
        // The smallest budget that admits the held event, to 1e-3.
        let (mut lo, mut hi) = (0.0, 10.0);
        while hi - lo > 1e-3 {
            let mid = (lo + hi) / 2.0;
            if at(mid).admits(&held).unwrap() {
                hi = mid
            } else {
                lo = mid
            }
        }
        let before = at(10.0);
        assert!(keeps_hold(Some(&before), &at(hi), &held).unwrap());
        assert!(!keeps_hold(Some(&before), &at(lo), &held).unwrap());
        assert!(keeps_hold(Some(&before), &at(lo), &[]).unwrap());
        assert!(keeps_hold(None, &at(lo), &held).unwrap());
        // Full before the change: not in the release.
        assert!(keeps_hold(Some(&at(lo)), &at(lo / 2.0), &held).unwrap());
        // A local charge on top of the consumed curve counts like a lowered budget.
        let charged = UserBudget {
            consumed: before
                .charge(&[PrivacyEvent::PureDp { eps: 9.5, count: 1 }])
                .unwrap()
                .unwrap(),
            ..before.clone()
        };
        assert!(!keeps_hold(Some(&before), &charged, &held).unwrap());
    }

    /// A user whose consumed curve leaves no room is excluded even with a tiny charge.
    #[test]
    fn plan_respects_consumed_curve() {
        let f = RenyiFilter::with_default_orders(1.0, 1e-6).unwrap();
        let cap: Vec<f64> = f.capacity().iter().map(|c| c.max(0.0)).collect();
        let full = RdpCurve::new(default_orders(), cap).unwrap();
        let mut users = budgets(&[("u", 1.0)]);
        users.get_mut("u").unwrap().consumed = full;
        let params = PlanParams {
            policy: SharePolicy::Split(10),
            min_release_eps: 1e-6,
            popularity_eps: 0.01,
            user_event: Some(PrivacyEvent::PureDp {
                eps: 1e-6,
                count: 1,
            }),
            check_user_filter: true,
        };
        let ratings = vec![RatingBudget {
            id: 1,
            user: "u".into(),
            eps: 0.01,
            spent: 0.0,
            rho: 0.0,
        }];
        let p = plan(&params, &ratings, &users);
        assert_eq!(p.admitted_len(), 0);
        assert_eq!(p.users_excluded.get("u"), Some(&Exclusion::UserFilterFull));
        // Non-private releases charge nothing and skip the filter.
        let open = PlanParams {
            check_user_filter: false,
            ..params
        };
        assert_eq!(plan(&open, &ratings, &users).admitted_len(), 1);
    }
    #[test]
    fn history_ends_at_the_composed_total() {
        let f = RenyiFilter::with_default_orders(10.0, 1e-6).unwrap();
        let e = vec![PrivacyEvent::gaussian(5.0, 1).unwrap()];
        // Newest first, as the audit lists them.
        let h = spend_history(10.0, 1e-6, &[(2, e.clone()), (1, e.clone())]).unwrap();
        assert_eq!(
            h.iter().map(|p| p.0).collect::<Vec<_>>(),
            [None, Some(1), Some(2)]
        );
        let both = compose_events(&[e[0].clone(), e[0].clone()], f.orders()).unwrap();
        assert_eq!(h[2].1, f.filter_eps(&both).unwrap());
        let zero = RdpCurve::zeros(f.orders().to_vec()).unwrap();
        assert_eq!(h[0].1, f.filter_eps(&zero).unwrap());
        assert!(h[0].1 < h[1].1 && h[1].1 < h[2].1);
    }

    /// The commit's re-check is `fits_with_rho` (same arithmetic, memoised), and its
    /// increment is the loss bound's change.
    #[test]
    fn the_commit_recheck_is_fits_with_rho() {
        let mut r = RatingRecheck::default();
        let mut g = crate::rng::seeded(3);
        use rand::Rng;
        for _ in 0..2_000 {
            let eps = g.random_range(0.5..20.0);
            let spent = g.random_range(0.0..eps);
            let rho = if g.random_bool(0.5) {
                g.random_range(0.0..0.2)
            } else {
                0.0
            };
            let charge = g.random_range(0.0..2.0);
            let rho_add = if g.random_bool(0.5) {
                g.random_range(0.0..0.05)
            } else {
                0.0
            };
            let fits = fits_with_rho(eps, spent, rho, charge, rho_add);
            match r.check(eps, spent, rho, charge, rho_add) {
                Ok(added) => {
                    assert!(fits);
                    let want = rating_loss(spent + charge, rho + rho_add) - rating_loss(spent, rho);
                    assert!(if rho_add == 0.0 {
                        added == charge
                    } else {
                        added == want
                    });
                }
                Err(o) => {
                    assert!(!fits);
                    assert!(o.after > eps);
                }
            }
        }
        assert!(r.check(1.0, 0.0, 0.0, f64::NAN, 0.0).is_err());
        assert!(r.check(1.0, 0.0, 0.0, 0.1, -0.01).is_err());
    }

    /// A user's filter admits a cost, charges exactly the composed curve, and refuses
    /// once full; the audit's numbers are the filter's.
    #[test]
    fn charge_cost_and_audit_are_the_filters() {
        let cost = compose_events(
            &[PrivacyEvent::gaussian(3.0, 1).unwrap()],
            &default_orders(),
        )
        .unwrap();
        let mut u = UserBudget {
            eps: 10.0,
            delta: 1e-6,
            consumed: RdpCurve::zeros_default(),
        };
        let f = RenyiFilter::with_default_orders(10.0, 1e-6).unwrap();
        let mut n = 0;
        while let Some((order, next)) = u.charge_cost(&cost).unwrap() {
            assert!(f.admits(&u.consumed, &cost).unwrap() && order > 1.0);
            assert_eq!(next, u.consumed.compose(&cost).unwrap());
            u.consumed = next;
            n += 1;
        }
        assert!(n > 0, "n={n}");
        assert!(!f.admits(&u.consumed, &cost).unwrap());
        let a = u
            .audit(Some(&[PrivacyEvent::gaussian(3.0, 1).unwrap()]))
            .unwrap();
        assert_eq!(a.releases_left, Some(0));
        assert_eq!(a.filter_eps, f.filter_eps(&u.consumed).unwrap());
        assert_eq!(a.spent, f.spent(&u.consumed).unwrap());
    }
}
