//! The DP counts across releases: every release publishes fresh noisy counts of
//! everything rated so far, and the counts change slowly between releases, so the served
//! counts combine this release's with the earlier ones (a local-level Kalman filter per
//! item). The earlier releases were charged when they were published: a function of their
//! published counts and of this release's is post-processing, so the combination costs
//! nothing and the plan's charges stay exact (docs/privacy/dp-topn.md, "Counts across
//! releases").
//!
//! Model: release `t`'s counts are `y_t = c_t + N(0, sigma_t^2)` (the mechanism's public
//! noise sd) and the true counts drift between releases as `c_t = c_{t-1} + w_t`,
//! `w_t ~ N(0, drift * sigma_t^2)`. `drift` is public: [`drift_for`] sets it from the
//! plan (the drift variance over a whole lifetime of `T` releases is one release's noise
//! variance). An item seen for the first time starts from its own count.

use serde::{Deserialize, Serialize};

/// A refused parameter of a counts update: which, and why (a trainer reports it as its
/// own invalid parameter).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct InvalidUpdate {
    pub key: &'static str,
    pub reason: String,
}

/// The filter's state after a release, per catalogue item: the estimate served and its
/// variance. `basis` names what the counts count (the contribution rule); a state is only
/// combined with counts of the same basis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CountHistory {
    pub basis: String,
    pub mean: Vec<f64>,
    /// Variance of `mean` (`f64::INFINITY` for an item with no earlier count, in memory
    /// only: a stored state has a finite variance for every item).
    pub var: Vec<f64>,
    /// How many releases the state combines (1: this release alone).
    pub releases: u64,
    /// The sum of this release's own counts, before combining (a DP value), with the sd
    /// of its noise (public): the operator-safety rule (`retrain.min_input_ratio`)
    /// compares it, so that a sudden fall of the input shows at once rather than at the
    /// filter's pace, and weighs the difference by that sd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_total: Option<DpTotal>,
    /// The Gram carried across releases by `dp-topn:split=select` ([`GramState`]);
    /// `None` for every other rule. [`CountHistory::update`] keeps none of it: the
    /// trainer attaches the state after its release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gram: Option<Box<GramState>>,
    /// The item statistics carried across releases by `dp-alt` ([`ItemSideState`]);
    /// `None` for every other trainer. [`CountHistory::update`] keeps none of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_side: Option<Box<ItemSideState>>,
}

/// A DP total (a sum of `items` published DP counts) and the sd of its noise: the
/// counts' public noise sd times `sqrt(items)`, with the rounding of each count to a
/// whole number (variance 1/12 each) added. Both are functions of public values and
/// published outputs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(from = "DpTotalRepr")]
pub struct DpTotal {
    pub total: f64,
    pub sd: f64,
}

impl DpTotal {
    /// The total of `counts`, each a DP count of noise sd `sigma`, rounded to a whole
    /// count.
    pub fn of_counts(counts: &[f64], sigma: f64) -> Self {
        let n = counts.len() as f64;
        Self {
            total: counts.iter().sum(),
            sd: (n * (sigma * sigma + 1.0 / 12.0)).sqrt(),
        }
    }
}

/// A stored `own_total`: a bare number in states written before the sd was stored (its
/// sd unknown, 0; a stored total is never compared, only a fresh release's).
#[derive(Deserialize)]
#[serde(untagged)]
enum DpTotalRepr {
    Bare(f64),
    Full { total: f64, sd: f64 },
}

impl From<DpTotalRepr> for DpTotal {
    fn from(r: DpTotalRepr) -> Self {
        match r {
            DpTotalRepr::Bare(total) => Self { total, sd: 0.0 },
            DpTotalRepr::Full { total, sd } => Self { total, sd },
        }
    }
}

/// What `dp-topn:split=select` carries from release to release (docs/privacy/dp-topn.md,
/// 2b): the sum of the released noisy Grams over a held candidate set, and the sum of the
/// noised leave-one-out differences that choose between EASE on their average and the
/// counts. Every field is a function of published outputs (post-processing). `select_sum`
/// is float-noised: it stays in the store, never in a mechanism record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GramState {
    /// The held candidates (catalogue indices); empty until the first Gram release.
    pub candidates: Vec<u32>,
    /// Sum of the released noisy Grams over `candidates`, row-major `K x K`.
    pub sum: Vec<f64>,
    /// How many Gram releases `sum` holds.
    pub grams: u64,
    /// Sum of the entry noise variances of the summed Grams (the average's entry sd is
    /// `sqrt(noise_var) / grams`).
    pub noise_var: f64,
    /// Sum of the informative noised differences `D_t` (a float-noised value).
    pub select_sum: f64,
    /// How many `D_t` `select_sum` holds.
    pub select_n: u64,
    /// Sum of their noise variances (`z_s^2` each).
    pub select_var: f64,
    /// Whether the last release spent its rest on the Gram.
    pub last_was_gram: bool,
}

impl GramState {
    /// A state with nothing released yet.
    pub fn empty() -> Self {
        Self {
            candidates: Vec::new(),
            sum: Vec::new(),
            grams: 0,
            noise_var: 0.0,
            select_sum: 0.0,
            select_n: 0,
            select_var: 0.0,
            last_was_gram: false,
        }
    }

    /// The averaged Gram over [`GramState::candidates`] and its entry noise sd, once a
    /// Gram was released.
    pub fn average(&self) -> Option<(Vec<f64>, f64)> {
        if self.grams == 0 || self.candidates.is_empty() {
            return None;
        }
        let n = self.grams as f64;
        Some((
            self.sum.iter().map(|x| x / n).collect(),
            self.noise_var.sqrt() / n,
        ))
    }

    /// Whether the combined difference favours the Gram: its mean exceeds `margin` of
    /// its sd (`sum > margin sqrt(sum of variances)`, the same test at any `n`).
    pub fn favours_gram(&self, margin: f64) -> bool {
        self.select_n > 0 && self.select_sum > margin * self.select_var.sqrt()
    }

    /// Whether the served list is EASE on the average: a Gram is in and either the
    /// combined difference favours it or no difference is drawn yet (the state's first
    /// Gram, chosen by the trace test).
    pub fn serves_gram(&self, margin: f64) -> bool {
        self.grams > 0 && (self.select_n == 0 || self.favours_gram(margin))
    }
}

/// What `dp-alt` carries from release to release (docs/privacy/dp-alt.md, "Item side
/// across releases"): per item, its released statistics (the Gram `G_j`, `k x k`, and the
/// right-hand side `h_j`, `k`) combined over releases by the same local-level filter as
/// the counts, entry by entry, with the variances of the combination. Every field is
/// a function of published statistics and public noise scales (post-processing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemSideState {
    pub k: usize,
    /// Per item, row-major `k x k`.
    pub gram: Vec<f64>,
    /// Per item, `k` entries.
    pub rhs: Vec<f64>,
    /// Per item, the filter's variance of each entry of its combined Gram about the
    /// current truth (the releases' noise and the drift; `f64::INFINITY` for an item no
    /// earlier release had, in memory only): it sets the weights.
    pub var_gram: Vec<f64>,
    /// The same for the combined right-hand side.
    pub var_rhs: Vec<f64>,
    /// Per item, the variance of the releases' noise in each combined Gram entry (the
    /// squared weights times each release's noise variance): what the combination holds
    /// of noise whether or not the truth drifted, which the read of the item side
    /// subtracts. Equal to `var_gram` without drift.
    pub noise_gram: Vec<f64>,
    /// The same for the combined right-hand side.
    pub noise_rhs: Vec<f64>,
}

/// One release's item statistics and the sds of their noise (public).
#[derive(Debug, Clone, Copy)]
pub struct ReleasedStats<'a> {
    pub gram: &'a [f64],
    pub rhs: &'a [f64],
    pub k: usize,
    pub sd_gram: f64,
    pub sd_rhs: f64,
}

impl ItemSideState {
    /// The state after this release's statistics `st`, given the state after the previous
    /// release (`prev`, aligned with `st`; ignored when its `k` or length differs): per
    /// entry, the previous combination predicted with drift `drift` times this release's
    /// noise variance, then weighed against this release's value by precision. An item
    /// with no earlier statistics starts from its own.
    pub fn update(prev: Option<&ItemSideState>, st: ReleasedStats<'_>, drift: f64) -> Self {
        let (k, n) = (st.k, st.rhs.len() / st.k.max(1));
        let (vg, vh) = (st.sd_gram * st.sd_gram, st.sd_rhs * st.sd_rhs);
        let mut out = Self {
            k,
            gram: st.gram.to_vec(),
            rhs: st.rhs.to_vec(),
            var_gram: vec![vg; n],
            var_rhs: vec![vh; n],
            noise_gram: vec![vg; n],
            noise_rhs: vec![vh; n],
        };
        let Some(p) = prev.filter(|p| p.k == k && p.var_gram.len() == n) else {
            return out;
        };
        for j in 0..n {
            let g = j * k * k..(j + 1) * k * k;
            let before = (p.var_gram[j], p.noise_gram[j]);
            (out.var_gram[j], out.noise_gram[j]) =
                combine(&mut out.gram[g.clone()], &p.gram[g], before, vg, drift);
            let h = j * k..(j + 1) * k;
            let before = (p.var_rhs[j], p.noise_rhs[j]);
            (out.var_rhs[j], out.noise_rhs[j]) =
                combine(&mut out.rhs[h.clone()], &p.rhs[h], before, vh, drift);
        }
        out
    }

    /// The state re-indexed to another item list (`index(j)`: item `j`'s position here,
    /// `None` for a new item, which gets no earlier statistics).
    fn reindexed(&self, n_items: usize, index: &impl Fn(usize) -> Option<usize>) -> Self {
        let k = self.k;
        let mut out = Self {
            k,
            gram: vec![0.0; n_items * k * k],
            rhs: vec![0.0; n_items * k],
            var_gram: vec![f64::INFINITY; n_items],
            var_rhs: vec![f64::INFINITY; n_items],
            noise_gram: vec![f64::INFINITY; n_items],
            noise_rhs: vec![f64::INFINITY; n_items],
        };
        for j in 0..n_items {
            if let Some(old) = index(j).filter(|&o| o < self.var_gram.len()) {
                out.gram[j * k * k..(j + 1) * k * k]
                    .copy_from_slice(&self.gram[old * k * k..(old + 1) * k * k]);
                out.rhs[j * k..(j + 1) * k].copy_from_slice(&self.rhs[old * k..(old + 1) * k]);
                out.var_gram[j] = self.var_gram[old];
                out.var_rhs[j] = self.var_rhs[old];
                out.noise_gram[j] = self.noise_gram[old];
                out.noise_rhs[j] = self.noise_rhs[old];
            }
        }
        out
    }
}

/// One filter step on entries that share a noise variance: `new` (this release's values,
/// noise variance `v`) becomes the combination with `prev` (`before`: its filter and
/// noise variances; the filter's drifted by `drift v`); returns the combination's filter
/// and noise variances. No earlier value: `new` as it is.
fn combine(new: &mut [f64], prev: &[f64], before: (f64, f64), v: f64, drift: f64) -> (f64, f64) {
    let predicted = before.0 + drift * v;
    if !(predicted.is_finite() && before.1.is_finite()) {
        return (v, v);
    }
    let gain = predicted / (predicted + v);
    for (y, &m) in new.iter_mut().zip(prev) {
        *y = m + gain * (*y - m);
    }
    let keep = 1.0 - gain;
    (keep * predicted, keep * keep * before.1 + gain * gain * v)
}

/// The drift ratio of a plan of `releases` releases: `1 / T`.
pub fn drift_for(releases: u64) -> f64 {
    1.0 / releases.max(1) as f64
}

impl CountHistory {
    /// The state after this release's `counts` (noise sd `sigma`), given the state after
    /// the previous release (`prev`, aligned with `counts`; ignored when its basis or
    /// length differs). Pure post-processing of published values.
    pub fn update(
        prev: Option<&CountHistory>,
        basis: &str,
        counts: &[f64],
        sigma: f64,
        drift: f64,
    ) -> Result<Self, InvalidUpdate> {
        if !(sigma.is_finite() && sigma > 0.0) {
            return Err(InvalidUpdate {
                key: "sigma",
                reason: format!("the counts' noise sd must be finite and positive, got {sigma}"),
            });
        }
        if !(drift.is_finite() && drift >= 0.0) {
            return Err(InvalidUpdate {
                key: "drift",
                reason: format!("must be finite and >= 0, got {drift}"),
            });
        }
        let v = sigma * sigma;
        let prev = prev.filter(|p| p.basis == basis && p.mean.len() == counts.len());
        let Some(p) = prev else {
            return Ok(Self {
                basis: basis.to_string(),
                mean: counts.to_vec(),
                var: vec![v; counts.len()],
                releases: 1,
                own_total: Some(DpTotal::of_counts(counts, sigma)),
                gram: None,
                item_side: None,
            });
        };
        let mut mean = Vec::with_capacity(counts.len());
        let mut var = Vec::with_capacity(counts.len());
        for ((&y, &m), &pv) in counts.iter().zip(&p.mean).zip(&p.var) {
            // Predict (the counts drift), then weigh the prediction and the new count by
            // their precisions.
            let predicted = pv + drift * v;
            if !predicted.is_finite() {
                mean.push(y);
                var.push(v);
                continue;
            }
            let gain = predicted / (predicted + v);
            mean.push(m + gain * (y - m));
            var.push((1.0 - gain) * predicted);
        }
        Ok(Self {
            basis: basis.to_string(),
            mean,
            var,
            releases: p.releases + 1,
            own_total: Some(DpTotal::of_counts(counts, sigma)),
            gram: None,
            item_side: None,
        })
    }

    /// The state re-indexed to another item list: `index(j)` is item `j`'s position in
    /// this state (`None`: a new item, no earlier count). The Gram state follows its held
    /// candidates; when one of them is not in the new list it is dropped (the next release
    /// starts it anew). The item statistics follow their items.
    pub fn reindexed(&self, n_items: usize, index: impl Fn(usize) -> Option<usize>) -> Self {
        let (mut mean, mut var) = (vec![0.0; n_items], vec![f64::INFINITY; n_items]);
        let mut new_of = vec![None; self.mean.len()];
        for j in 0..n_items {
            if let Some(old) = index(j).filter(|&o| o < self.mean.len()) {
                mean[j] = self.mean[old];
                var[j] = self.var[old];
                new_of[old] = Some(j as u32);
            }
        }
        let gram = self.gram.as_ref().and_then(|g| {
            let candidates: Option<Vec<u32>> = g
                .candidates
                .iter()
                .map(|&old| new_of.get(old as usize).copied().flatten())
                .collect();
            Some(Box::new(GramState {
                candidates: candidates?,
                ..(**g).clone()
            }))
        });
        Self {
            basis: self.basis.clone(),
            mean,
            var,
            releases: self.releases,
            own_total: self.own_total,
            gram,
            item_side: self
                .item_side
                .as_ref()
                .map(|s| Box::new(s.reindexed(n_items, &index))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dprec_dp::rng::seeded;

    /// The state after one release with no earlier one.
    fn first(basis: &str, counts: &[f64], sigma: f64) -> Result<CountHistory, InvalidUpdate> {
        CountHistory::update(None, basis, counts, sigma, 0.0)
    }

    #[test]
    fn first_release_is_its_counts() {
        let h = first("b", &[3.0, -1.0], 2.0).unwrap();
        assert_eq!(h.mean, vec![3.0, -1.0]);
        assert_eq!(h.var, vec![4.0, 4.0]);
        assert_eq!(h.releases, 1);
    }

    /// One step by hand: prediction variance 4 + 0.25 * 4 = 5, gain 5 / 9.
    #[test]
    fn one_step_weighs_by_precision() {
        let h = first("b", &[10.0], 2.0).unwrap();
        let h2 = CountHistory::update(Some(&h), "b", &[19.0], 2.0, 0.25).unwrap();
        assert!((h2.mean[0] - (10.0 + 5.0 / 9.0 * 9.0)).abs() < 1e-12);
        assert!((h2.var[0] - 4.0 * 5.0 / 9.0).abs() < 1e-12);
        assert_eq!(h2.releases, 2);
        assert_eq!(
            h2.own_total,
            Some(DpTotal {
                total: 19.0,
                sd: (4.0f64 + 1.0 / 12.0).sqrt()
            })
        );
    }

    /// A state stored before the total's sd was (a bare `own_total`) still loads, with
    /// sd 0; a new one round-trips with its sd.
    #[test]
    fn own_total_loads_bare_or_with_its_sd() {
        let h = first("b", &[3.0, 1.0], 2.0).unwrap();
        let json = serde_json::to_value(&h).unwrap();
        let back: CountHistory = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, h);
        let mut old = json;
        old["own_total"] = serde_json::json!(4.0);
        let back: CountHistory = serde_json::from_value(old).unwrap();
        assert_eq!(
            back.own_total,
            Some(DpTotal {
                total: 4.0,
                sd: 0.0
            })
        );
    }

    #[test]
    fn another_basis_or_a_new_item_starts_from_the_counts() {
        let h = first("liked", &[10.0, 5.0], 2.0).unwrap();
        let other = CountHistory::update(Some(&h), "all", &[1.0, 2.0], 2.0, 0.1).unwrap();
        assert_eq!(other.mean, vec![1.0, 2.0]);
        assert_eq!(other.releases, 1);
        // Item 1 of the new list is new (no earlier count).
        let moved = h.reindexed(2, |j| (j == 0).then_some(0));
        assert_eq!(moved.var[1], f64::INFINITY);
        let next = CountHistory::update(Some(&moved), "liked", &[12.0, 7.0], 2.0, 0.1).unwrap();
        assert_eq!(next.mean[1], 7.0);
        assert_eq!(next.var[1], 4.0);
        assert!(next.mean[0] > 10.0 && next.mean[0] < 12.0);
    }

    /// The Gram state follows its held candidates to their new indices, and is dropped
    /// when one of them is gone; `update` keeps none of it.
    #[test]
    fn gram_state_follows_reindexing_and_is_dropped_without_its_items() {
        let mut h = first("b", &[1.0, 2.0, 3.0], 1.0).unwrap();
        h.gram = Some(Box::new(GramState {
            candidates: vec![2, 0],
            sum: vec![1.0, 2.0, 2.0, 5.0],
            grams: 2,
            noise_var: 8.0,
            select_sum: 3.5,
            select_n: 4,
            select_var: 100.0,
            last_was_gram: true,
        }));
        // New list: old item 2 at 0, old 0 at 3, old 1 gone, a new item at 1 and 2.
        let old = [Some(2), None, None, Some(0)];
        let moved = h.reindexed(4, |j| old[j]);
        let g = moved.gram.as_ref().unwrap();
        assert_eq!(g.candidates, vec![0, 3]);
        assert_eq!(g.sum, h.gram.as_ref().unwrap().sum);
        assert_eq!((g.grams, g.select_n, g.select_sum), (2, 4, 3.5));
        assert_eq!(moved.mean, vec![3.0, 0.0, 0.0, 1.0]);
        let (avg, sd) = g.average().unwrap();
        assert_eq!(avg, vec![0.5, 1.0, 1.0, 2.5]);
        assert!((sd - 8f64.sqrt() / 2.0).abs() < 1e-12);
        // Old item 0 (held) gone: the state is dropped.
        let lost = h.reindexed(2, |j| [Some(2), Some(1)][j]);
        assert!(lost.gram.is_none());
        assert_eq!(lost.mean, vec![3.0, 2.0]);
        let next = CountHistory::update(Some(&moved), "b", &[1.0; 4], 1.0, 0.1).unwrap();
        assert!(next.gram.is_none());
        // Serialised without a Gram state, a history reads back with none.
        let plain = serde_json::to_string(&next).unwrap();
        assert!(!plain.contains("gram"));
        assert_eq!(serde_json::from_str::<CountHistory>(&plain).unwrap(), next);
        let full = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<CountHistory>(&full).unwrap(), h);
    }

    fn stats<'a>(gram: &'a [f64], rhs: &'a [f64], sd_gram: f64, sd_rhs: f64) -> ReleasedStats<'a> {
        ReleasedStats {
            gram,
            rhs,
            k: 2,
            sd_gram,
            sd_rhs,
        }
    }

    /// Two releases of planted item statistics (2 items, k = 2), the first with noise sds
    /// (1, 0.5), the second (2, 1), no drift: every entry of the combination is the
    /// precision-weighted mean (weights 4/5 and 1/5 for both parts), with variances 4/5
    /// and 1/5. An equal-weight or a swapped-weight mean fails.
    #[test]
    fn item_side_combines_releases_by_precision() {
        let (g1, h1) = (
            [1.0, 2.0, 2.0, 5.0, 3.0, 0.5, 0.5, 3.0],
            [1.0, -1.0, 0.5, 0.5],
        );
        let (g2, h2) = (
            [6.0, -3.0, -3.0, 0.0, 8.0, 5.5, 5.5, -2.0],
            [6.0, 4.0, -4.5, 3.0],
        );
        let s1 = ItemSideState::update(None, stats(&g1, &h1, 1.0, 0.5), 0.3);
        assert_eq!((s1.gram.as_slice(), s1.rhs.as_slice()), (&g1[..], &h1[..]));
        assert_eq!(
            (s1.var_gram.clone(), s1.var_rhs.clone()),
            (vec![1.0; 2], vec![0.25; 2])
        );
        let s2 = ItemSideState::update(Some(&s1), stats(&g2, &h2, 2.0, 1.0), 0.0);
        for (got, a, b) in [(&s2.gram, &g1[..], &g2[..]), (&s2.rhs, &h1[..], &h2[..])] {
            for ((x, p), q) in got.iter().zip(a).zip(b) {
                assert!((x - (0.8 * p + 0.2 * q)).abs() < 1e-12, "{x} {p} {q}");
                assert!(
                    (x - (p + q) / 2.0).abs() > 0.1,
                    "equal weights not rejected"
                );
                assert!(
                    (x - (0.2 * p + 0.8 * q)).abs() > 0.1,
                    "swapped not rejected"
                );
            }
        }
        assert!(s2.var_gram.iter().all(|v| (v - 0.8).abs() < 1e-12));
        assert!(s2.var_rhs.iter().all(|v| (v - 0.2).abs() < 1e-12));
        // Without drift the noise in the combination is the filter's variance.
        assert!(s2.noise_gram.iter().all(|v| (v - 0.8).abs() < 1e-12));
        assert!(s2.noise_rhs.iter().all(|v| (v - 0.2).abs() < 1e-12));
        // With drift: predicted variance 1 + 0.25 * 4 = 2, gain 2 / 6.
        let s3 = ItemSideState::update(Some(&s1), stats(&g2, &h2, 2.0, 1.0), 0.25);
        assert!((s3.gram[0] - (1.0 + (6.0 - 1.0) / 3.0)).abs() < 1e-12);
        assert!((s3.var_gram[0] - 4.0 * 2.0 / 6.0).abs() < 1e-12);
        // Its noise: (2/3)^2 of the first release's variance 1 plus (1/3)^2 of 4.
        assert!((s3.noise_gram[0] - 8.0 / 9.0).abs() < 1e-12);
        // Another shape (another k, or another catalogue length) is not combined.
        let other = ItemSideState::update(Some(&s1), stats(&g2[..4], &h2[..2], 2.0, 1.0), 0.0);
        assert_eq!(other.gram, g2[..4].to_vec());
    }

    /// The item statistics follow their items when the catalogue changes: a new item has
    /// none (its next release starts from its own), a gone item is dropped.
    #[test]
    fn item_side_follows_reindexing() {
        let (g, h) = (
            [1.0, 2.0, 2.0, 5.0, 3.0, 0.5, 0.5, 3.0],
            [1.0, -1.0, 0.5, 0.5],
        );
        let mut c = first("b", &[1.0, 3.0], 1.0).unwrap();
        c.item_side = Some(Box::new(ItemSideState::update(
            None,
            stats(&g, &h, 1.0, 1.0),
            0.0,
        )));
        // New list: old item 1 at 0, a new item at 1; old item 0 gone.
        let moved = c.reindexed(2, |j| [Some(1), None][j]);
        let s = moved.item_side.as_deref().unwrap();
        assert_eq!(&s.gram[..4], &g[4..]);
        assert_eq!(&s.rhs[..2], &h[2..]);
        assert_eq!(s.var_gram, vec![1.0, f64::INFINITY]);
        let (g2, h2) = ([9.0; 8], [7.0; 4]);
        let next = ItemSideState::update(Some(s), stats(&g2, &h2, 1.0, 1.0), 0.0);
        assert_eq!(&next.gram[4..], &g2[4..], "a new item starts from its own");
        assert_eq!(next.var_gram, vec![0.5, 1.0]);
        assert!((next.gram[0] - 6.0).abs() < 1e-12);
        // Stored and read back; a state without item statistics reads back with none.
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<CountHistory>(&json).unwrap(), c);
        let plain = first("b", &[1.0], 1.0).unwrap();
        assert!(!serde_json::to_string(&plain).unwrap().contains("item_side"));
    }

    /// The favouring test is the mean against `margin` sds of the mean.
    #[test]
    fn favours_gram_compares_the_mean_with_its_sd() {
        let mut g = GramState::empty();
        assert!(!g.favours_gram(1.5));
        // 4 draws of variance 25: mean sd 2.5, so the mean must exceed 3.75 (sum 15).
        g.select_n = 4;
        g.select_var = 100.0;
        g.select_sum = 15.1;
        assert!(g.favours_gram(1.5));
        g.select_sum = 14.9;
        assert!(!g.favours_gram(1.5));
    }

    #[test]
    fn bad_sigma_or_drift_is_refused() {
        assert!(first("b", &[1.0], 0.0).is_err());
        assert!(first("b", &[1.0], f64::NAN).is_err());
        let h = first("b", &[1.0], 1.0).unwrap();
        assert!(CountHistory::update(Some(&h), "b", &[1.0], 1.0, -0.1).is_err());
    }

    /// Counts released 52 times with sd 10 (2,000 items). When the truth drifts as the
    /// model says (a random walk of variance q sigma^2 a release), the error variance is
    /// the filter's own `var`, whose steady state is 100 (sqrt(q^2 + 4q) - q) / 2 = 12.9
    /// at q = 1/52; when the truth stands still the filter is an average with weight
    /// `k` (the steady gain) and its error variance is 100 k / (2 - k) = 6.9: both far
    /// below one release's 100. The mean squared error over 2,000 items has relative sd
    /// 3.2% (chi-square), so 15% is over 4 sd (false failure < 1e-4; the seed is fixed).
    /// A filter that ignored the prior state, or weighed it wrongly, fails.
    #[test]
    fn repeated_releases_shrink_the_error_as_the_variance_says() {
        let (n, v) = (2000, 100.0);
        let q = drift_for(52);
        let steady = v * ((q * q + 4.0 * q).sqrt() - q) / 2.0;
        let k = (steady + q * v) / (steady + q * v + v);
        for (drifts, want) in [(true, steady), (false, v * k / (2.0 - k))] {
            let mut truth: Vec<f64> = (0..n).map(|j| (j % 97) as f64).collect();
            let mut rng = seeded(11);
            let mut h: Option<CountHistory> = None;
            for _ in 0..52 {
                if drifts {
                    for c in truth.iter_mut() {
                        *c += dprec_dp::privacy::gaussian((q * v).sqrt(), &mut rng).unwrap();
                    }
                }
                let y: Vec<f64> = truth
                    .iter()
                    .map(|c| c + dprec_dp::privacy::gaussian(v.sqrt(), &mut rng).unwrap())
                    .collect();
                h = Some(CountHistory::update(h.as_ref(), "b", &y, v.sqrt(), q).unwrap());
            }
            let h = h.unwrap();
            let mse = h
                .mean
                .iter()
                .zip(&truth)
                .map(|(m, c)| (m - c).powi(2))
                .sum::<f64>()
                / n as f64;
            assert!(
                (h.var[0] - steady).abs() < 0.01 * steady,
                "var {}",
                h.var[0]
            );
            assert!(
                (mse / want - 1.0).abs() < 0.15,
                "drifts {drifts}: mse {mse}, want {want}"
            );
        }
    }
}
