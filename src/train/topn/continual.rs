//! Continual release of the DP popularity counts by tree aggregation (issue 23): the
//! pure part of a release series (parameters and their calibration, who and what a tick
//! admits, which tree nodes close, node noise, the estimate). The store keeps the series
//! (`store::series`) and the release pipeline runs the ticks (`release::continual`).
//!
//! One series is `horizon` periods (ticks) of `privacy::tree`. Its counts are the
//! arrival-capped rows of [`dprec_dp::privacy::tree::ArrivalCap`], in COUNT units: a user's
//! first `cap` distinct items in arrival order, each counted once, nothing ever
//! subtracted. A user's lifetime row is then a nonnegative 0/1 vector with at most `cap`
//! ones, L2 norm `<= sqrt(cap)`, so every level of the tree is one Gaussian mechanism of
//! sensitivity `sqrt(cap)` and node noise `sigma = z_level sqrt(cap)` (discrete Gaussian:
//! the counts are integers). Proof and limits: docs/privacy/dp-topn.md section 4.
//!
//! Charges (all public constants, fixed when the series starts):
//! - user level: `Gaussian { z_level, levels }`, once per series, at the tick the user
//!   joins (an upper bound of what the user's nodes cost over the whole horizon);
//! - rating level: one rating moves at most two admitted entries (it leaves, a later
//!   rating takes its slot), in at most two nodes per level, so each level moves by at
//!   most `sqrt 2` and the `levels` levels compose to one Gaussian of multiplier
//!   `z_level sqrt(cap) / (sqrt 2 sqrt(levels))`: its zCDP `rho` is charged once, at the
//!   tick the rating is admitted.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rand::Rng;

use crate::train::{invalid, numerical, TrainError};
use dprec_dp::accountant::{plan::calibrate_gaussian, LifetimePlan, PrivacyEvent};
use dprec_dp::privacy::tree::{levels, Node};
use dprec_dp::privacy::{discrete_gaussian, Rational};

/// Default arrival cap: 16 distinct items per user and series (`count_clip^2` of the
/// served counts, the cap fixed before `crates/dprec-lab/examples/continual_bench/main.rs` was run).
pub const DEFAULT_CAP: usize = 16;

/// The public parameters of one series, fixed when it starts.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SeriesParams {
    /// Periods (ticks) of the series: the plan's planned releases.
    pub horizon: u64,
    /// Distinct items counted per user over the whole series.
    pub cap: usize,
    /// Per-node noise multiplier `z_level` (noise sd `z_level sqrt(cap)` in counts).
    pub z_level: f64,
}

impl SeriesParams {
    /// Checks the parameters.
    pub fn new(horizon: u64, cap: usize, z_level: f64) -> Result<Self, TrainError> {
        levels(horizon).map_err(numerical)?;
        if cap == 0 {
            return Err(invalid("cap", "must be >= 1"));
        }
        if !(z_level.is_finite() && z_level > 0.0) {
            return Err(invalid(
                "z_level",
                format!("must be finite and > 0, got {z_level}"),
            ));
        }
        Ok(Self {
            horizon,
            cap,
            z_level,
        })
    }

    /// The series of `plan`: `plan.releases` ticks, and the smallest `z_level` whose
    /// user-level event ([`Self::user_event`]) fits the plan's Renyi filter once, through
    /// the same filter the service admits users with (no other conversion).
    pub fn calibrated(plan: &LifetimePlan, cap: usize) -> Result<Self, TrainError> {
        let l = levels(u64::from(plan.releases)).map_err(numerical)?;
        let once = LifetimePlan::new(1, plan.eps, plan.delta).map_err(numerical)?;
        let z = calibrate_gaussian(&once, u64::from(l)).map_err(numerical)?;
        Self::new(u64::from(plan.releases), cap, z)
    }

    /// Levels of the tree: the Gaussian mechanisms the whole series composes.
    pub fn levels(&self) -> u32 {
        levels(self.horizon).expect("checked in new")
    }

    /// Node noise standard deviation, in counts.
    pub fn sigma(&self) -> f64 {
        self.z_level * (self.cap as f64).sqrt()
    }

    /// `sigma^2` as the discrete Gaussian's rational, rounded up (more noise, never less).
    pub fn sigma2(&self) -> Result<Rational, TrainError> {
        Rational::at_least(self.sigma() * self.sigma()).map_err(numerical)
    }

    /// What the whole series costs a user, charged once when the user joins.
    pub fn user_event(&self) -> PrivacyEvent {
        PrivacyEvent::Gaussian {
            noise_multiplier: self.z_level,
            count: u64::from(self.levels()),
        }
    }

    /// The rating-level Gaussian multiplier of the whole series (all levels composed).
    pub fn rating_multiplier(&self) -> f64 {
        self.z_level * (self.cap as f64).sqrt()
            / (std::f64::consts::SQRT_2 * f64::from(self.levels()).sqrt())
    }

    /// The zCDP `rho` charged to a rating once, when the series admits it.
    pub fn rating_rho(&self) -> f64 {
        let z = self.rating_multiplier();
        1.0 / (2.0 * z * z)
    }
}

/// The one node tick `t` (`>= 1`) releases: level `h` = the number of trailing zeros of
/// `t`, ending at `t`. A node of odd index (a right child) is in no prefix
/// decomposition, so of the nodes closing at `t` only this one is ever used; the others
/// are never drawn (releasing fewer nodes of a level is post-processing of that level's
/// mechanism).
pub fn tick_node(t: u64) -> Node {
    let h = t.trailing_zeros();
    Node {
        level: h,
        index: (t >> h) - 1,
    }
}

/// Whether `node` can be forgotten once tick `t` is released: no later tick's
/// decomposition uses it. Node `(h, k)` ends at `e = (k + 1) 2^h` and is in the
/// decomposition of exactly the ticks `e ..= e + 2^h - 1`, so it is retired when
/// `e + 2^h <= t + 1`, i.e. `(k + 2) 2^h <= t + 1` (the store deletes in that form).
pub fn node_retired(node: Node, t: u64) -> bool {
    (node.index + 2) << node.level <= t + 1
}

/// One node's noise: an independent discrete Gaussian of the series' `sigma` per item.
pub fn draw_node_noise<R: Rng + ?Sized>(
    params: &SeriesParams,
    n_items: usize,
    rng: &mut R,
) -> Result<Vec<i64>, TrainError> {
    let s2 = params.sigma2()?;
    (0..n_items)
        .map(|_| discrete_gaussian(s2, rng).map_err(numerical))
        .collect()
}

/// The estimate at a tick: the exact prefix counts (every admission of periods `1..=t`)
/// plus the noise of the nodes of `t`'s binary decomposition. Each admission lies in
/// exactly one of those nodes, so this is the sum of the released (noisy) nodes. An item
/// a node has no noise for did not exist when the node closed: the node's count for it is
/// 0, which is public, and it adds nothing.
pub fn estimate(exact: &[i64], node_noise: &[&HashMap<String, i64>], items: &[String]) -> Vec<i64> {
    exact
        .iter()
        .zip(items)
        .map(|(&x, item)| x + node_noise.iter().filter_map(|n| n.get(item)).sum::<i64>())
        .collect()
}

/// The arrival-cap state of a series: the (user, item) pairs admitted so far and each
/// member's count.
#[derive(Debug, Clone, Default)]
pub struct Admissions {
    pairs: HashSet<(Arc<str>, Arc<str>)>,
    per_user: HashMap<Arc<str>, usize>,
}

impl Admissions {
    /// The state after `pairs` were admitted (as the store lists them).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (Arc<str>, Arc<str>)>) -> Self {
        let mut a = Self::default();
        for (u, i) in pairs {
            if a.pairs.insert((u.clone(), i)) {
                *a.per_user.entry(u).or_default() += 1;
            }
        }
        a
    }

    /// The state of a series whose `full` users have `cap` items admitted (nothing more
    /// can be admitted for them, so their pairs are not needed) and whose other users
    /// have the `open` pairs: what a tick reads instead of every pair.
    pub fn resume(
        full: impl IntoIterator<Item = Arc<str>>,
        open: impl IntoIterator<Item = (Arc<str>, Arc<str>)>,
        cap: usize,
    ) -> Self {
        let mut a = Self::from_pairs(open);
        for u in full {
            a.per_user.insert(u, cap);
        }
        a
    }

    /// Items admitted for `user` so far.
    pub fn count(&self, user: &str) -> usize {
        self.per_user.get(user).copied().unwrap_or(0)
    }

    /// Admits the pair `(user, item)` of a member's affordable rating unless the pair is
    /// admitted already or the user is at `cap`; whether it was admitted.
    pub fn admit_one(&mut self, user: &Arc<str>, item: &Arc<str>, cap: usize) -> bool {
        if self.count(user) >= cap || !self.pairs.insert((user.clone(), item.clone())) {
            return false;
        }
        *self.per_user.entry(user.clone()).or_default() += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dprec_dp::accountant::{default_orders, RdpCurve};
    use dprec_dp::privacy::stats::{ks_critical, ks_statistic};
    use dprec_dp::rng::seeded;

    fn plan(t: u32) -> LifetimePlan {
        LifetimePlan::new(t, 10.0, 1e-6).unwrap()
    }

    /// The calibration: the series' user event fits the plan's filter once, and 0.999 x
    /// the multiplier does not (the smallest noise that fits). Its levels are the tree's.
    #[test]
    fn calibration_fits_the_filter_exactly() {
        let orders = default_orders();
        for t in [12, 52, 365] {
            let p = SeriesParams::calibrated(&plan(t), DEFAULT_CAP).unwrap();
            assert_eq!(p.levels(), levels(u64::from(t)).unwrap());
            let once = LifetimePlan::new(1, 10.0, 1e-6).unwrap();
            let curve = |z: f64| -> RdpCurve {
                PrivacyEvent::gaussian(z, u64::from(p.levels()))
                    .unwrap()
                    .rdp_curve(&orders)
                    .unwrap()
            };
            assert!(once.fits(&curve(p.z_level)).unwrap(), "T = {t}");
            assert!(!once.fits(&curve(p.z_level * 0.999)).unwrap(), "T = {t}");
        }
        // The same number as the plan's tree multiplier (one calibration).
        let rp = crate::train::topn::dp_topn::ReleasePlan {
            eps_u: 10.0,
            delta_u: 1e-6,
            releases: 365,
        };
        let z = SeriesParams::calibrated(&plan(365), 16).unwrap().z_level;
        assert!(
            (z / rp.tree_noise_multiplier().unwrap() - 1.0).abs() < 1e-8,
            "{z}"
        );
        // More ticks, more levels, more noise per node; far less than per release.
        let z52 = SeriesParams::calibrated(&plan(52), 16).unwrap().z_level;
        let z365 = SeriesParams::calibrated(&plan(365), 16).unwrap().z_level;
        assert!(z52 < z365 && z365 < 2.5, "{z52} {z365}");
    }

    /// The node noise has the series' scale: KS against the normal of sd `sigma` (the
    /// discrete Gaussian at sigma ~7 is within the KS tolerance of it) passes at the
    /// scale and fails at 0.9x and 1.1x. alpha = 1e-6 per check: three checks, a
    /// false-failure rate <= 3e-6 for a random seed (the seed is fixed).
    #[test]
    fn node_noise_has_the_series_scale() {
        let p = SeriesParams::new(52, 16, 1.7).unwrap();
        let mut rng = seeded(23);
        let x: Vec<f64> = draw_node_noise(&p, 40_000, &mut rng)
            .unwrap()
            .into_iter()
            .map(|v| v as f64)
            .collect();
        // Continuity correction: the discrete sample against the normal at half-integers.
        let jittered: Vec<f64> = x.iter().map(|v| v + rng.random::<f64>() - 0.5).collect();
        let crit = ks_critical(jittered.len(), 1e-6);
        let sd = |s: f64| {
            let s = s.sqrt();
            move |v: f64| dprec_dp::privacy::stats::normal_cdf(v / s)
        };
        // A uniform(-1/2, 1/2) jitter adds variance 1/12.
        let var = p.sigma() * p.sigma() + 1.0 / 12.0;
        assert!(ks_statistic(jittered.clone(), sd(var)) < crit);
        for wrong in [0.9, 1.1] {
            let v = (p.sigma() * wrong).powi(2) + 1.0 / 12.0;
            assert!(
                ks_statistic(jittered.clone(), sd(v)) > crit,
                "{wrong}x not caught"
            );
        }
    }

    /// The charges: user level is `levels` Gaussians of `z_level`; rating level is their
    /// composition at sensitivity `sqrt 2` in units of `sqrt(cap)`.
    #[test]
    fn charges_follow_levels_not_ticks() {
        let p = SeriesParams::new(365, 16, 2.0).unwrap();
        assert_eq!(p.levels(), 9);
        assert_eq!(
            p.user_event(),
            PrivacyEvent::Gaussian {
                noise_multiplier: 2.0,
                count: 9
            }
        );
        // Per level: z_level sqrt(cap) / sqrt 2 = 2 * 4 / 1.414 = 5.657; 9 levels compose
        // to 5.657 / 3 = 1.886.
        assert!((p.rating_multiplier() - 8.0 / (2f64.sqrt() * 3.0)).abs() < 1e-12);
        assert!((p.rating_rho() - 9.0 * 2.0 / (2.0 * 64.0)).abs() < 1e-12);
    }

    /// Each tick releases the last node of its own decomposition, so every node a
    /// decomposition uses was released at or before that tick, by exactly one tick.
    #[test]
    fn tick_nodes_cover_every_decomposition() {
        let spans = |t: u64| tick_node(t).periods();
        assert_eq!(spans(1), (1, 1));
        assert_eq!(spans(2), (1, 2));
        assert_eq!(spans(3), (3, 3));
        assert_eq!(spans(8), (1, 8));
        assert_eq!(spans(52), (49, 52));
        let mut released = HashMap::new();
        for t in 1..=365u64 {
            let n = tick_node(t);
            assert!(n.level < levels(365).unwrap());
            assert!(released.insert(n, t).is_none(), "{n:?} released twice");
            let d = dprec_dp::privacy::tree::decomposition(t);
            assert_eq!(d.last(), Some(&n));
            for m in d {
                assert!(released[&m] <= t, "t = {t}: {m:?} not released");
            }
        }
    }

    /// A retired node is in no later decomposition, and every node a later tick's
    /// decomposition needs is not retired (exhaustive up to T = 130).
    #[test]
    fn retired_nodes_are_never_needed_again() {
        for t in 1..=130u64 {
            for t2 in t + 1..=130 {
                for n in dprec_dp::privacy::tree::decomposition(t2) {
                    if n.periods().1 <= t {
                        assert!(!node_retired(n, t), "t = {t}: {n:?} needed at {t2}");
                    }
                }
            }
            for h in 0..8u32 {
                // Released nodes only: even index (see `tick_node`).
                for k in (0..(t >> h)).step_by(2) {
                    let n = Node { level: h, index: k };
                    let needed = (t + 1..=t + 300)
                        .any(|t2| dprec_dp::privacy::tree::decomposition(t2).contains(&n));
                    assert_eq!(node_retired(n, t), !needed, "t = {t}: {n:?}");
                }
            }
        }
    }

    /// A rating offered to the cap in a test (ratings in arrival order, i.e. rating id).
    #[derive(Debug, Clone)]
    struct Offer {
        rating_id: i64,
        user: Arc<str>,
        item: Arc<str>,
        /// The rating's own budget covers the series' rating charge.
        affordable: bool,
    }

    impl Admissions {
        /// What a tick does with each offer in order (`release::continual::TickAdmission`
        /// in the service): members' affordable ratings go to [`Admissions::admit_one`];
        /// returns those admitted.
        fn admit(
            &mut self,
            offers: impl IntoIterator<Item = Offer>,
            members: &HashSet<Arc<str>>,
            cap: usize,
        ) -> Vec<Offer> {
            offers
                .into_iter()
                .filter(|o| {
                    o.affordable
                        && members.contains(&o.user)
                        && self.admit_one(&o.user, &o.item, cap)
                })
                .collect()
        }
    }

    fn offer(id: i64, u: &str, i: &str, affordable: bool) -> Offer {
        Offer {
            rating_id: id,
            user: Arc::from(u),
            item: Arc::from(i),
            affordable,
        }
    }

    /// The arrival cap: first `cap` distinct items of members, affordable only;
    /// re-ratings add nothing; a later tick never lowers a count (nothing is removed
    /// when a rating disappears from the offers, e.g. deleted).
    #[test]
    fn arrival_cap_is_monotone() {
        let members: HashSet<Arc<str>> = [Arc::from("a"), Arc::from("b")].into_iter().collect();
        let mut a = Admissions::default();
        let first = vec![
            offer(1, "a", "x", true),
            offer(2, "a", "y", false), // cannot afford: no slot taken
            offer(3, "a", "z", true),
            offer(4, "c", "x", true), // not a member
            offer(5, "b", "x", true),
        ];
        let ids = |v: Vec<Offer>| v.iter().map(|o| o.rating_id).collect::<Vec<_>>();
        assert_eq!(ids(a.admit(first, &members, 2)), vec![1, 3, 5]);
        assert_eq!((a.count("a"), a.count("b"), a.count("c")), (2, 1, 0));
        // Next tick: "a" is full, x re-rated by "b" adds nothing, "a"/"x" deleted (absent).
        let second = vec![
            offer(5, "b", "x", true),
            offer(6, "a", "w", true),
            offer(7, "b", "y", true),
            offer(8, "b", "z", true),
        ];
        assert_eq!(ids(a.admit(second, &members, 2)), vec![7]);
        assert_eq!((a.count("a"), a.count("b")), (2, 2));
        // The same state rebuilt from the stored pairs admits the same next.
        let b = Admissions::from_pairs(a.pairs.iter().cloned());
        assert_eq!((b.count("a"), b.count("b")), (2, 2));
    }

    #[test]
    fn a_resumed_cap_admits_what_the_whole_state_admits() {
        let arc = |s: &str| -> Arc<str> { Arc::from(s) };
        let members: HashSet<Arc<str>> = ["a", "b"].into_iter().map(arc).collect();
        let mut whole = Admissions::default();
        let first = vec![
            offer(1, "a", "x", true),
            offer(2, "a", "y", true),
            offer(3, "b", "x", true),
        ];
        whole.admit(first, &members, 2);
        // "a" is full: only its count is read back; "b" is open: its pairs are.
        let mut resumed = Admissions::resume([arc("a")], [(arc("b"), arc("x"))], 2);
        let next = || {
            vec![
                offer(4, "a", "z", true),
                offer(3, "b", "x", true), // offered again (an update): nothing
                offer(5, "b", "z", true),
                offer(6, "b", "w", true), // over the cap
            ]
        };
        let ids = |v: Vec<Offer>| v.iter().map(|o| o.rating_id).collect::<Vec<_>>();
        assert_eq!(ids(whole.admit(next(), &members, 2)), vec![5]);
        assert_eq!(ids(resumed.admit(next(), &members, 2)), vec![5]);
        assert_eq!((resumed.count("a"), resumed.count("b")), (2, 2));
    }

    #[test]
    fn estimate_adds_the_decomposition_noise() {
        let items: Vec<String> = ["x", "y", "z"].iter().map(|s| s.to_string()).collect();
        let n1: HashMap<String, i64> = [("x".into(), 3), ("y".into(), -2)].into();
        let n2: HashMap<String, i64> = [("x".into(), -1), ("y".into(), 1), ("z".into(), 4)].into();
        // "z" did not exist when node 1 closed: only node 2 carries its noise.
        assert_eq!(estimate(&[10, 5, 0], &[&n1, &n2], &items), vec![12, 4, 4]);
    }
}
