//! What a training run cost, as data: the charges the ledger records before the model is
//! served (DESIGN 3-4). Trainers never compute a user's (eps, delta) themselves; they
//! report mechanisms and [`PrivacyEvent`]s and the accountant composes them.

use serde::{Deserialize, Serialize};

use crate::accountant::{compose_events, default_orders, eps_from_rdp, PrivacyEvent};

/// The unit of privacy a charge protects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum PrivacyUnit {
    /// One rating (user i, item j): the default unit.
    #[default]
    Rating,
    /// A user's whole rating vector (user-level DP, e.g. Private-GD).
    User,
}

/// The neighbouring relation the guarantee is stated for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Neighbour {
    /// One unit added or removed.
    #[default]
    AddRemove,
    /// One unit's value replaced (the indicator of which ratings exist is fixed).
    Replace,
}

/// How far the output's privacy claim is proven for the code that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    /// No privacy claim (baselines). Never served unless explicitly allowed.
    NonPrivate,
    /// The charges are proven for this code (DESIGN 2) at both units: each rating's eps_ij
    /// and each user's (eps_u, delta_u) are enforced. The served default.
    Proven,
    /// Proven for this code at the rating unit only (DESIGN 3, rating-level mode): the
    /// proof covers adding or removing ONE rating (PDP-PMF, DP-PMF objective
    /// perturbation) and states no user-level bound. Served only when the operator opts in
    /// (`trainer.allow_rating_level`); each rating's eps_ij is enforced as always, the
    /// user-level Renyi ledger is not charged, and each user's audit shows the
    /// group-privacy bound these releases imply (shown, not enforced;
    /// docs/privacy/guarantee.md).
    RatingLevel,
    /// Faithful to a paper whose proof does not cover the code; see [`PAPER_FAITHFUL`].
    /// Never served, never used to justify a ledger charge.
    PaperClaimed,
    /// Trained only on ratings perturbed on the client (DESIGN 3): each value was charged
    /// its local eps once, at ingestion, and training on it is post-processing, so the
    /// release charges nothing. It protects each rating's VALUE (replacement); which items
    /// a user rated is seen by the curator and is not protected.
    LocalDp,
}

/// The stored and JSON name of each enum (the same kebab-case serde uses), and its parse.
macro_rules! named_enum {
    ($t:ident { $($v:ident => $s:literal),+ $(,)? }) => {
        impl $t {
            pub const fn as_str(self) -> &'static str {
                match self { $(Self::$v => $s),+ }
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl std::str::FromStr for $t {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, UnknownName> {
                match s {
                    $($s => Ok(Self::$v),)+
                    _ => Err(UnknownName { kind: stringify!($t), name: s.to_owned() }),
                }
            }
        }
    };
}

/// A stored or configured name that none of an enum's variants has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {name:?}")]
pub struct UnknownName {
    pub kind: &'static str,
    pub name: String,
}

named_enum!(PrivacyUnit { Rating => "rating", User => "user" });
named_enum!(Neighbour { AddRemove => "add-remove", Replace => "replace" });
named_enum!(Guarantee {
    NonPrivate => "non-private",
    Proven => "proven",
    RatingLevel => "rating-level",
    PaperClaimed => "paper-claimed",
    LocalDp => "local-dp",
});

/// The largest charge of each user's ratings: `users[k]` is the dense user of rating
/// position `k`, `charges` yields `(position, eps)`; users without a positive charge get 0.
/// The one place a user's worst rating charge is computed (the per-user pure-DP event of
/// a per-rating mechanism, and the ledger's completion of a user's events).
pub fn largest_per_user(
    users: &[u32],
    n_users: usize,
    charges: impl IntoIterator<Item = (usize, f64)>,
) -> Vec<f64> {
    let mut worst = vec![0.0f64; n_users];
    for (k, eps) in charges {
        let u = users[k] as usize;
        worst[u] = worst[u].max(eps);
    }
    worst
}

/// The label every paper-faithful trainer's output carries.
pub const PAPER_FAITHFUL: &str =
    "paper-faithful: guarantee as claimed by the paper, not proven for this code";

/// One mechanism a release ran, with its parameters, unit and neighbour relation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MechanismRecord {
    pub name: String,
    pub params: serde_json::Value,
    pub unit: PrivacyUnit,
    pub neighbour: Neighbour,
}

/// A pure-DP charge to one rating's eps_ij ledger.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatingCharge {
    /// Position of the rating in the training ratings (the trainer's `Ratings`).
    pub position: u32,
    pub eps: f64,
}

/// An RDP charge to one user's ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserCharge {
    /// Dense user index of the training data.
    pub user: u32,
    pub event: PrivacyEvent,
}

/// Everything one release charges. Empty for non-private trainers.
///
/// Contract with the ledger (unit: one rating): `ratings` holds every rating's pure-DP
/// charge; `users` must hold, for every user, events whose composition bounds the loss of
/// any single rating of that user in this release (e.g. `PureDp { eps: max charge of the
/// user's ratings }` per pure-DP step, plus the user's Gaussian steps). The curator adds
/// only the charges of its own releases (e.g. DP popularity counts).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReleaseCharges {
    pub mechanisms: Vec<MechanismRecord>,
    /// Pure eps per rating (added up in the rating's ledger).
    pub ratings: Vec<RatingCharge>,
    pub users: Vec<UserCharge>,
    /// Gaussian (zCDP `rho`) charges per rating: a rating that takes full part in a
    /// Gaussian release of rating-level multiplier `z` is charged `1 / (2 z^2)`, composed
    /// with its earlier Gaussian charges before conversion ([`crate::ledger::rating_loss`]).
    #[serde(default)]
    pub rating_rho: RatingRhos,
}

/// A Gaussian charge to one rating, in zCDP `rho`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RatingRho {
    /// Position of the rating in the training ratings (the trainer's `Ratings`).
    pub position: u32,
    pub rho: f64,
}

/// Gaussian charges to ratings, in the order pushed, stored as rating positions with
/// one `rho` a run of equal charges: a release charges every full participant the same
/// `1 / (2 z_r^2)`, so a charge takes 4 bytes instead of a [`RatingRho`]'s 16 (320 MB of
/// a release's peak at 20M ratings, lab note bench-02). Serialised as the list of
/// [`RatingRho`] it holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "Vec<RatingRho>", into = "Vec<RatingRho>")]
pub struct RatingRhos {
    positions: Vec<u32>,
    /// `(first index into positions, rho)`, a new run whenever the charge changes (by
    /// bits), so equal lists are equal values.
    runs: Vec<(usize, f64)>,
}

impl RatingRhos {
    /// An empty list with room for `n` charges (of one run).
    pub fn with_capacity(n: usize) -> Self {
        Self {
            positions: Vec::with_capacity(n),
            runs: Vec::new(),
        }
    }

    pub fn push(&mut self, c: RatingRho) {
        if self
            .runs
            .last()
            .is_none_or(|r| r.1.to_bits() != c.rho.to_bits())
        {
            self.runs.push((self.positions.len(), c.rho));
        }
        self.positions.push(c.position);
    }

    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    pub fn shrink_to_fit(&mut self) {
        self.positions.shrink_to_fit();
        self.runs.shrink_to_fit();
    }

    /// The charges in the order pushed.
    pub fn iter(&self) -> impl Iterator<Item = RatingRho> + '_ {
        self.runs
            .iter()
            .enumerate()
            .flat_map(move |(k, &(start, rho))| {
                let end = self.runs.get(k + 1).map_or(self.positions.len(), |r| r.0);
                self.positions[start..end]
                    .iter()
                    .map(move |&position| RatingRho { position, rho })
            })
    }
}

impl RatingRhos {
    /// Each rating position's total Gaussian charge (`n` positions), held as one bit a
    /// rating when every charge is the same value and no position is charged twice (a
    /// release's full participants), else as a dense column (8 bytes a rating, 160 MB at
    /// 20M ratings beside the charge rows).
    pub fn totals(&self, n: usize) -> RhoTotals {
        if let [(_, rho)] = self.runs[..] {
            let mut charged = vec![0u64; n.div_ceil(64)];
            let mut once = true;
            for &p in &self.positions {
                let (word, bit) = (p as usize / 64, 1u64 << (p % 64));
                once &= charged[word] & bit == 0;
                charged[word] |= bit;
            }
            if once {
                return RhoTotals::Uniform { rho, charged };
            }
        }
        let mut t = vec![0.0; n];
        for c in self.iter() {
            t[c.position as usize] += c.rho;
        }
        RhoTotals::Dense(t)
    }
}

/// [`RatingRhos::totals`]: the total Gaussian charge of each rating position.
#[derive(Debug, Clone, PartialEq)]
pub enum RhoTotals {
    /// The positions whose bit is set were charged `rho` once; the others nothing.
    Uniform {
        rho: f64,
        charged: Vec<u64>,
    },
    Dense(Vec<f64>),
}

impl RhoTotals {
    pub fn get(&self, k: usize) -> f64 {
        match self {
            Self::Uniform { rho, charged } => {
                if charged[k / 64] & (1 << (k % 64)) != 0 {
                    *rho
                } else {
                    0.0
                }
            }
            Self::Dense(t) => t[k],
        }
    }
}

impl FromIterator<RatingRho> for RatingRhos {
    fn from_iter<I: IntoIterator<Item = RatingRho>>(iter: I) -> Self {
        let mut out = Self::default();
        for c in iter {
            out.push(c);
        }
        out
    }
}

impl From<Vec<RatingRho>> for RatingRhos {
    fn from(v: Vec<RatingRho>) -> Self {
        v.into_iter().collect()
    }
}

impl From<RatingRhos> for Vec<RatingRho> {
    fn from(r: RatingRhos) -> Self {
        r.iter().collect()
    }
}

/// A summary of a release's charges for reports: per-rating eps and per-user (eps, delta).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ChargeSummary {
    pub ratings_charged: usize,
    pub max_rating_eps: f64,
    pub mean_rating_eps: f64,
    pub users_charged: usize,
    /// The largest per-user eps at `delta`, from the composed RDP curve of that user.
    pub max_user_eps: f64,
    pub delta: f64,
}

impl ReleaseCharges {
    /// The charges of a per-rating pure-DP mechanism: `ratings` as given, and for every
    /// user with a positive charge one `PureDp` event of the largest charge among the
    /// user's ratings (unit: one rating; see the contract above). `users[k]` is the dense
    /// user of rating position `k`.
    pub fn per_rating(
        mechanism: MechanismRecord,
        users: &[u32],
        n_users: usize,
        ratings: Vec<RatingCharge>,
    ) -> Self {
        let worst = largest_per_user(
            users,
            n_users,
            ratings.iter().map(|c| (c.position as usize, c.eps)),
        );
        let users = worst
            .iter()
            .enumerate()
            .filter(|(_, &w)| w > 0.0)
            .map(|(u, &eps)| UserCharge {
                user: u as u32,
                event: PrivacyEvent::PureDp { eps, count: 1 },
            })
            .collect();
        Self {
            mechanisms: vec![mechanism],
            ratings,
            users,
            rating_rho: RatingRhos::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ratings.is_empty() && self.users.is_empty()
    }

    /// Total pure-DP eps charged to each rating position (`n` = number of ratings).
    pub fn rating_totals(&self, n: usize) -> Vec<f64> {
        let mut t = vec![0.0; n];
        for c in &self.ratings {
            t[c.position as usize] += c.eps;
        }
        t
    }

    /// Total Gaussian `rho` per rating position (length `n`).
    pub fn rating_rho_totals(&self, n: usize) -> Vec<f64> {
        let totals = self.rating_rho.totals(n);
        (0..n).map(|k| totals.get(k)).collect()
    }

    /// The events charged to each user, grouped by user index.
    pub fn user_events(&self) -> std::collections::BTreeMap<u32, Vec<PrivacyEvent>> {
        let mut m: std::collections::BTreeMap<u32, Vec<PrivacyEvent>> = Default::default();
        for c in &self.users {
            m.entry(c.user).or_default().push(c.event.clone());
        }
        m
    }

    /// Summary for reports; user eps via the accountant at `delta`.
    pub fn summary(&self, n_ratings: usize, delta: f64) -> anyhow::Result<ChargeSummary> {
        let totals = self.rating_totals(n_ratings);
        let charged: Vec<f64> = totals.iter().copied().filter(|&e| e > 0.0).collect();
        let orders = default_orders();
        let mut max_user_eps: f64 = 0.0;
        let per_user = self.user_events();
        // Users charged the same events have the same eps: compute each distinct list once.
        let mut seen: Vec<&Vec<PrivacyEvent>> = Vec::new();
        for events in per_user.values() {
            if seen.contains(&events) {
                continue;
            }
            seen.push(events);
            let curve = compose_events(events, &orders)?;
            max_user_eps = max_user_eps.max(eps_from_rdp(&curve, delta)?.eps);
        }
        Ok(ChargeSummary {
            ratings_charged: charged.len(),
            max_rating_eps: charged.iter().copied().fold(0.0, f64::max),
            mean_rating_eps: if charged.is_empty() {
                0.0
            } else {
                charged.iter().sum::<f64>() / charged.len() as f64
            },
            users_charged: per_user.len(),
            max_user_eps,
            delta,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The compact list gives back what was pushed, in order, through runs of equal and
    /// changing charges; equal lists are equal values; its JSON is the plain list's.
    #[test]
    fn rating_rhos_keep_every_charge_in_order() {
        let rhos = [0.5, 0.5, 0.25, 0.5, 0.5, 0.5, 1e-300, 0.0, 0.0];
        let list: Vec<RatingRho> = rhos
            .iter()
            .enumerate()
            .map(|(k, &rho)| RatingRho {
                position: (7 * k % 11) as u32,
                rho,
            })
            .collect();
        let mut compact = RatingRhos::with_capacity(2);
        for c in &list {
            compact.push(*c);
        }
        assert_eq!(compact.len(), list.len());
        assert_eq!(compact.iter().collect::<Vec<_>>(), list);
        assert_eq!(compact.runs.len(), 5, "{:?}", compact.runs);
        assert_eq!(list.iter().copied().collect::<RatingRhos>(), compact);
        let json = serde_json::to_string(&compact).unwrap();
        assert_eq!(json, serde_json::to_string(&list).unwrap());
        let back: RatingRhos = serde_json::from_str(&json).unwrap();
        assert_eq!(back, compact);
        // Totals: dense here (several values, a position charged twice), one bit a
        // rating for one value charged once each; the same numbers either way.
        let n = 11;
        let mut dense = vec![0.0; n];
        for c in &list {
            dense[c.position as usize] += c.rho;
        }
        let totals = compact.totals(n);
        assert!(matches!(totals, RhoTotals::Dense(_)));
        assert_eq!((0..n).map(|k| totals.get(k)).collect::<Vec<_>>(), dense);
        let uniform: RatingRhos = [9, 0, 130, 64, 63]
            .map(|position| RatingRho {
                position,
                rho: 0.125,
            })
            .into_iter()
            .collect();
        let totals = uniform.totals(131);
        assert!(matches!(totals, RhoTotals::Uniform { .. }));
        for k in 0..131 {
            let want = if [9, 0, 130, 64, 63].contains(&k) {
                0.125
            } else {
                0.0
            };
            assert_eq!(totals.get(k), want, "position {k}");
        }
        let twice: RatingRhos = [3, 5, 3]
            .map(|position| RatingRho {
                position,
                rho: 0.125,
            })
            .into_iter()
            .collect();
        assert_eq!(twice.totals(6).get(3), 0.25);
        assert!(RatingRhos::default().is_empty());
        assert_eq!(RatingRhos::default().iter().count(), 0);
    }
}
