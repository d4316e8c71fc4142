//! Public item labels in a published top-N model (DESIGN 6; docs/privacy/labels.md).
//!
//! An operator's catalogue labels (genres, categories, a brand) are public, so a list
//! computed from them, a published DP model and the asking user's own ratings is joint DP
//! at no charge. The model here scores an item by its DP count and by how much more the
//! user's own rated items carry its labels than the population does:
//!
//! `score_j = ln m_j + sum_{g in labels(j)} ln(p_ug / p_g)`,
//! `p_ug = (h_ug + alpha p_g) / (n_u + alpha)`,
//!
//! with `m_j` the posterior mean of item `j`'s true count given its DP count, under a
//! prior fitted to all the served DP counts ([`crate::model::count_prior`]: a count within
//! its noise is shrunk towards what such counts usually are, so that a lift never raises
//! noise that happened to land high above a popular item), `p_g` each label's share of the
//! label mass the DP counts carry (every item spreads a mass of 1 evenly over its labels),
//! `h_u` the same mass over the user's own rated items (`n_u` of them with a label) and
//! `alpha` the prior strength of a user's label profile: the Bayes (Dirichlet) estimate of
//! the user's label shares.
//! `alpha` is estimated by the release from a DP statistic of how far users' label
//! profiles spread beyond chance (`train::topn::label_stats`); where the statistic does
//! not show that spread, no label model is published and the lists are the counts'.

use serde::{Deserialize, Serialize};

use crate::model::history::CountHistory;
use crate::model::item_ranker::ItemRanker;
use crate::model::ranker::SimilarBasis;
use crate::model::Ranker;

/// The catalogue's labels by item index of a release: each item's label indices (sorted,
/// distinct) into `names`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ItemLabels {
    pub per_item: Vec<Vec<u32>>,
    pub names: Vec<String>,
}

/// What the DP counts say about the labels, before any user is read: each label's share
/// `p_g` of the label mass, and the expected chi-square of a user's label mass against
/// those shares when the user's items carry no label preference (whatever their number).
#[derive(Debug, Clone, PartialEq)]
pub struct LabelBase {
    pub share: Vec<f64>,
    pub null_chi: f64,
}

impl ItemLabels {
    /// Labels by item from each item's label names (`None` or empty: no label). Names
    /// are indexed in sorted order, so the same catalogue gives the same indices.
    pub fn from_names<'a>(items: impl IntoIterator<Item = Option<&'a [String]>>) -> Self {
        let items: Vec<Option<&[String]>> = items.into_iter().collect();
        let mut names: Vec<String> = items
            .iter()
            .flatten()
            .flat_map(|l| l.iter().cloned())
            .collect();
        names.sort();
        names.dedup();
        let per_item = items
            .iter()
            .map(|l| {
                let mut ids: Vec<u32> = l
                    .unwrap_or(&[])
                    .iter()
                    .filter_map(|n| names.binary_search(n).ok().map(|i| i as u32))
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                ids
            })
            .collect();
        Self { per_item, names }
    }

    /// Whether the labels can tell items apart at all: at least two labels in use.
    pub fn informative(&self) -> bool {
        self.names.len() >= 2 && self.per_item.iter().any(|l| !l.is_empty())
    }

    /// Adds item `j`'s label mass (1, spread evenly over its labels) to `h`; false when
    /// it has no label.
    pub fn add_mass(&self, j: usize, h: &mut [f64]) -> bool {
        add_mass(&self.per_item, j, h)
    }

    /// The label shares and the null chi-square under item weights `counts` (the DP
    /// counts, negative ones as 0; post-processing). `None` when no labelled item has a
    /// positive count. Under the null a user's items are independent draws of the
    /// weighted catalogue; one item's mass on label `g` is `w_g = x_jg / |labels(j)|`, so
    /// with `n` items `Var(h_g) = n Var(w_g)` and
    /// `E[chi^2] = sum_g Var(w_g) / p_g = sum_g (E[w_g^2] - p_g^2) / p_g`
    /// (`k - 1` when every item has one label).
    pub fn base(&self, counts: &[f64]) -> Option<LabelBase> {
        let k = self.names.len();
        let (mut share, mut square) = (vec![0.0; k], vec![0.0; k]);
        let mut total = 0.0;
        for (l, &c) in self.per_item.iter().zip(counts) {
            if l.is_empty() || c.is_nan() || c <= 0.0 {
                continue;
            }
            let w = 1.0 / l.len() as f64;
            for &g in l {
                share[g as usize] += c * w;
                square[g as usize] += c * w * w;
            }
            total += c;
        }
        if total <= 0.0 {
            return None;
        }
        share.iter_mut().for_each(|p| *p /= total);
        let null_chi = share
            .iter()
            .zip(&square)
            .filter(|(p, _)| **p > 0.0)
            .map(|(p, s)| (s / total - p * p) / p)
            .sum();
        Some(LabelBase { share, null_chi })
    }
}

/// Adds item `j`'s label mass to `h` ([`ItemLabels::add_mass`]).
fn add_mass(per_item: &[Vec<u32>], j: usize, h: &mut [f64]) -> bool {
    let Some(l) = per_item.get(j).filter(|l| !l.is_empty()) else {
        return false;
    };
    let w = 1.0 / l.len() as f64;
    l.iter().for_each(|&g| h[g as usize] += w);
    true
}

impl LabelBase {
    /// The user's chi-square `sum_g (h_g - n p_g)^2 / (n p_g)` over labels with a share.
    pub fn chi(&self, h: &[f64], n: usize) -> f64 {
        let n = n as f64;
        self.share
            .iter()
            .zip(h)
            .filter(|(p, _)| **p > 0.0)
            .map(|(p, x)| (x - n * p).powi(2) / (n * p))
            .sum()
    }
}

/// The published label model: public labels, the label shares of the served DP counts
/// and the prior strength `alpha` from the release's DP statistic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelLift {
    /// Per item of the release: its label indices.
    pub item_labels: Vec<Vec<u32>>,
    /// `p_g` per label (post-processing of the served DP counts).
    pub share: Vec<f64>,
    /// The prior strength of a user's label profile, rounded to a whole number.
    pub alpha: f64,
    /// Per item, `ln m_j`: the log of the posterior mean of its true count given its DP
    /// count ([`crate::model::count_prior`]), what the lift multiplies. Empty in a label
    /// model stored before it existed: that model serves its item-side lists unchanged.
    #[serde(default)]
    pub base: Vec<f64>,
    /// The label names by index (sorted): an item registered after the release is
    /// ranked by its label names ([`ColdItems`]). Empty in a model stored before it
    /// existed: such a model ranks no item outside its release.
    #[serde(default)]
    pub names: Vec<String>,
}

impl LabelLift {
    /// `ln(p_ug / p_g)` per label from the user's own rated items; `None` when none of
    /// them has a label (nothing personal to say).
    pub fn user_lift(&self, own: &[(usize, f64)]) -> Option<Vec<f64>> {
        let mut h = vec![0.0; self.share.len()];
        let n = own
            .iter()
            .filter(|&&(j, _)| add_mass(&self.item_labels, j, &mut h))
            .count();
        if n == 0 {
            return None;
        }
        let (n, a) = (n as f64, self.alpha);
        Some(
            self.share
                .iter()
                .zip(&h)
                .map(|(&p, &x)| {
                    if p > 0.0 {
                        ((x + a * p) / (n + a) / p).ln()
                    } else {
                        0.0
                    }
                })
                .collect(),
        )
    }

    /// Whether one of the user's own items has a label (a lift can be computed), without
    /// computing it: the per-request checks before the scoring need only this.
    pub fn has_labelled(&self, own: &[(usize, f64)]) -> bool {
        own.iter()
            .any(|&(j, _)| self.item_labels.get(j).is_some_and(|l| !l.is_empty()))
    }

    /// Item `j`'s label term: the sum of its labels' lifts.
    pub fn term(&self, lift: &[f64], j: usize) -> f64 {
        self.item_labels
            .get(j)
            .map_or(0.0, |l| labels_term(lift, l))
    }

    /// Per label, the expected count of an item of that label, as a log: `ln` of the mean
    /// of `m_j` over the release's items carrying it, each item weighing its label mass
    /// (`1 / |labels(j)|`); `NaN` for a label no item carries. An item's chance of being
    /// wanted grows with its count, so the mean (not the median) is what a list ranked by
    /// that chance needs; it sits below the label's popular items.
    pub fn typical_base(&self) -> Vec<f64> {
        let k = self.share.len();
        let (mut sum, mut mass) = (vec![0.0; k], vec![0.0; k]);
        for (l, &b) in self.item_labels.iter().zip(&self.base) {
            let w = 1.0 / l.len() as f64;
            for &g in l {
                sum[g as usize] += w * b.exp();
                mass[g as usize] += w;
            }
        }
        sum.iter()
            .zip(&mass)
            .map(|(s, m)| if *m > 0.0 { (s / m).ln() } else { f64::NAN })
            .collect()
    }

    /// The items of a catalogue that the release does not hold, as this label model
    /// ranks them: each by the mean of its labels' typical `ln m` ([`Self::typical_base`])
    /// plus the asking user's lift, like any item of the release. An item none of whose
    /// labels the release knows is left out (nothing honest can be said of it); so is
    /// every item when the model has no label names (stored before they were kept).
    /// Public catalogue information and the published model only: post-processing.
    pub fn cold_items<'a>(
        &self,
        release_id: i64,
        items: impl IntoIterator<Item = (&'a str, &'a [String])>,
    ) -> ColdItems {
        let typical = self.typical_base();
        let mut cold = ColdItems {
            release_id,
            ..ColdItems::default()
        };
        if self.base.is_empty() || self.names.is_empty() {
            return cold;
        }
        for (id, names) in items {
            let mut l: Vec<u32> = names
                .iter()
                .filter_map(|n| self.names.binary_search(n).ok())
                .filter(|&g| typical[g].is_finite())
                .map(|g| g as u32)
                .collect();
            l.sort_unstable();
            l.dedup();
            if l.is_empty() {
                continue;
            }
            let base = l.iter().map(|&g| typical[g as usize]).sum::<f64>() / l.len() as f64;
            cold.ids.push(id.to_owned());
            cold.labels.push(l);
            cold.base.push(base);
        }
        cold
    }
}

/// The sum of `lift` over labels `l`.
fn labels_term(lift: &[f64], l: &[u32]) -> f64 {
    l.iter().map(|&g| lift[g as usize]).sum()
}

/// Catalogue items registered after a release, ranked by the release's label model
/// ([`LabelLift::cold_items`]): ids, label indices into the model's names and the typical
/// `ln m` of their labels.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ColdItems {
    /// The release whose label model ranked them.
    pub release_id: i64,
    pub ids: Vec<String>,
    pub labels: Vec<Vec<u32>>,
    pub base: Vec<f64>,
}

impl ColdItems {
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Item `k`'s score for a user of label lift `lift` ([`LabelLift::user_lift`]): on the
    /// scale of the label model's scores of the release's items.
    pub fn score(&self, lift: &[f64], k: usize) -> f64 {
        self.base[k] + labels_term(lift, &self.labels[k])
    }
}

/// How one user's list scores the items outside its release ([`LabelledRanker::cold_scale`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ColdScale {
    /// The label list answers: a cold item's label score (its labels' typical count plus
    /// the user's lift) is on the list's scale. Holds the user's lift.
    Labels(Vec<f64>),
    /// The fused list: a cold item has no rank in the item-side list, so it holds only the
    /// label half of the fusion, `1 / (K + r)`, at the rank `r` its label score takes
    /// among the release's items (after those of an equal score). Holds that score per
    /// cold item.
    Fused(Vec<f64>),
}

impl ColdScale {
    /// Cold item `k`'s score in the user's list.
    pub fn score(&self, cold: &ColdItems, k: usize) -> f64 {
        match self {
            Self::Labels(lift) => cold.score(lift, k),
            Self::Fused(scores) => scores[k],
        }
    }
}

/// The constant of the reciprocal-rank fusion of a personalised item-side list with the
/// label list: an item scores `1 / (K + rank)` in each (ranks from 0) and the sums order
/// the list. 60 is the value of the method's authors (Cormack, Clarke and Buettcher,
/// SIGIR 2009), kept as published: the two lists weigh the same and nothing is fitted.
pub const FUSION_K: f64 = 60.0;

/// Each entry's rank in `scores` by descending score, ties to the smaller index (the
/// order of [`crate::model::ranker::top_k`]).
fn ranks(scores: &[f64]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..scores.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| {
        scores[b as usize]
            .total_cmp(&scores[a as usize])
            .then(a.cmp(&b))
    });
    let mut rank = vec![0u32; scores.len()];
    for (r, &j) in order.iter().enumerate() {
        rank[j as usize] = r as u32;
    }
    rank
}

/// An item-side model with a label model: a user the item-side model does not
/// personalise for (its lists are the DP counts' order) gets the counts reweighted by
/// their own labels ([`LabelLift`]); a user it personalises for (the EASE list on the
/// averaged Gram) gets that list and the label list fused by reciprocal rank
/// ([`FUSION_K`]); a user without a labelled item gets the item-side model's list.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabelledRanker {
    pub inner: ItemRanker,
    pub lift: LabelLift,
}

impl LabelledRanker {
    /// Whether `own` gets the label model's list (the inner model does not personalise
    /// for it and one of its items has a label).
    fn labelled(&self, own: &[(usize, f64)]) -> Option<Vec<f64>> {
        if self.lift.base.is_empty() || self.inner.personalises(own) {
            return None;
        }
        self.lift.user_lift(own)
    }

    /// The user's lift when the inner model personalises for `own` and one of its items
    /// has a label: the list is then the two lists fused ([`FUSION_K`]).
    fn fused(&self, own: &[(usize, f64)]) -> Option<Vec<f64>> {
        if self.lift.base.is_empty() || !self.inner.personalises(own) {
            return None;
        }
        self.lift.user_lift(own)
    }

    /// Item `j`'s score in the label list: `ln m_j` plus the user's label term.
    fn label_score(&self, lift: &[f64], j: usize) -> f64 {
        self.lift.base.get(j).copied().unwrap_or(f64::NEG_INFINITY) + self.lift.term(lift, j)
    }

    /// The published label model, when it ranks items outside its release
    /// ([`ColdItems`]: it has its posterior means and label names).
    pub fn label_model(&self) -> Option<&LabelLift> {
        (!self.lift.base.is_empty() && !self.lift.names.is_empty()).then_some(&self.lift)
    }

    /// How `own`'s list scores the items of `cold`: on the label list's scale when the
    /// label list answers, by the label half of the fusion when the list is fused; `None`
    /// when neither (the inner model's list, or no labelled item). A fused list ranks the
    /// cold items among the release's label scores in one pass over the release (each
    /// score placed among the sorted cold scores), not by sorting the catalogue.
    pub fn cold_scale(&self, own: &[(usize, f64)], cold: &ColdItems) -> Option<ColdScale> {
        if let Some(lift) = self.labelled(own) {
            return Some(ColdScale::Labels(lift));
        }
        let lift = self.fused(own)?;
        let mut by_score: Vec<(f64, usize)> = (0..cold.ids.len())
            .map(|c| (cold.score(&lift, c), c))
            .collect();
        by_score.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        // at[p]: release items whose label score is at least the p smallest cold scores
        // and below the next; cold item i (in ascending order) ranks after at[i+1..].
        let mut at = vec![0u32; by_score.len() + 1];
        for j in 0..self.inner.n_items {
            let x = self.label_score(&lift, j);
            at[by_score.partition_point(|&(s, _)| s <= x)] += 1;
        }
        let mut scores = vec![0.0; by_score.len()];
        let mut above = 0u32;
        for (i, &(_, c)) in by_score.iter().enumerate().rev() {
            above += at[i + 1];
            scores[c] = 1.0 / (FUSION_K + above as f64);
        }
        Some(ColdScale::Fused(scores))
    }

    /// The label model of `ranker`, when it is one.
    pub fn of(ranker: &dyn Ranker) -> Option<&Self> {
        ranker.storable()?.downcast_ref::<Self>()
    }

    /// Whether `own`'s list is the label list or the fused list (every item scored),
    /// not the inner model's list.
    pub fn reweights(&self, own: &[(usize, f64)]) -> bool {
        !self.lift.base.is_empty() && self.lift.has_labelled(own)
    }

    /// Whether the label model answers for `own` (as [`Self::labelled`], without
    /// computing the lift).
    fn answers(&self, own: &[(usize, f64)]) -> bool {
        !self.lift.base.is_empty() && !self.inner.personalises(own) && self.lift.has_labelled(own)
    }
}

impl Ranker for LabelledRanker {
    fn n_items(&self) -> usize {
        self.inner.n_items
    }

    fn personalises(&self, own: &[(usize, f64)]) -> bool {
        self.inner.personalises(own) || self.answers(own)
    }

    fn personal_source(&self, own: &[(usize, f64)]) -> &'static str {
        if self.answers(own) {
            "labels"
        } else {
            "profile"
        }
    }

    fn storable(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn count_history(&self) -> Option<&CountHistory> {
        self.inner.count_history()
    }

    fn popularity_counts(&self) -> Option<Vec<f64>> {
        self.inner.popularity_counts()
    }

    fn score_items(&self, user: Option<usize>, own: &[(usize, f64)], out: &mut [f64]) {
        if let Some(lift) = self.fused(own) {
            self.inner.score_items(user, own, out);
            let labelled: Vec<f64> = (0..out.len()).map(|j| self.label_score(&lift, j)).collect();
            let (by_inner, by_labels) = (ranks(out), ranks(&labelled));
            for (j, o) in out.iter_mut().enumerate() {
                if *o > f64::NEG_INFINITY || labelled[j] > f64::NEG_INFINITY {
                    *o = 1.0 / (FUSION_K + by_inner[j] as f64)
                        + 1.0 / (FUSION_K + by_labels[j] as f64);
                }
            }
            return;
        }
        let Some(lift) = self.labelled(own) else {
            return self.inner.score_items(user, own, out);
        };
        for (j, o) in out.iter_mut().enumerate() {
            *o = self.label_score(&lift, j);
        }
    }

    fn predict(&self, _user: Option<usize>, _own: &[(usize, f64)], _item: usize) -> Option<f64> {
        None
    }

    fn similar(&self, item: usize, n: usize) -> Option<(SimilarBasis, Vec<(usize, f64)>)> {
        self.inner.similar(item, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::item_ranker::ItemScorer;

    fn names(v: &[&[&str]]) -> Vec<Vec<String>> {
        v.iter()
            .map(|l| l.iter().map(|s| s.to_string()).collect())
            .collect()
    }

    #[test]
    fn labels_are_indexed_in_name_order_and_spread_their_mass() {
        let raw = names(&[&["drama", "comedy"], &[], &["drama"], &["drama", "drama"]]);
        let l = ItemLabels::from_names(raw.iter().map(|v| Some(v.as_slice())));
        assert_eq!(l.names, ["comedy", "drama"]);
        assert_eq!(l.per_item, vec![vec![0, 1], vec![], vec![1], vec![1]]);
        assert!(l.informative());
        let mut h = vec![0.0; 2];
        assert!(l.add_mass(0, &mut h) && !l.add_mass(1, &mut h));
        assert_eq!(h, [0.5, 0.5]);
        // Shares under counts 2, 5 (unlabelled), 1, 1: comedy 1 of 4, drama 3 of 4.
        let b = l.base(&[2.0, 5.0, 1.0, 1.0]).unwrap();
        assert_eq!(b.share, [0.25, 0.75]);
        // E[w^2]: comedy (2 * 0.25) / 4, drama (2 * 0.25 + 1 + 1) / 4.
        let by_hand = (0.125 - 0.0625) / 0.25 + (0.625 - 0.5625) / 0.75;
        assert!((b.null_chi - by_hand).abs() < 1e-12);
        assert!(l.base(&[0.0, 3.0, -1.0, 0.0]).is_none());
    }

    /// Under the null (items drawn by the weights, independently of any taste) a user's
    /// chi-square has mean `null_chi`: 20,000 simulated users of 30 items each on a
    /// catalogue with one, two and three labels per item come within 2% (the estimate's
    /// relative sd is under 0.5%; seed fixed).
    #[test]
    fn null_chi_is_the_mean_chi_square_of_users_without_taste() {
        use rand::Rng;
        let raw = names(&[
            &["a"],
            &["a", "b"],
            &["b", "c", "d"],
            &["c"],
            &["d", "a"],
            &["b"],
        ]);
        let l = ItemLabels::from_names(raw.iter().map(|v| Some(v.as_slice())));
        let counts = [5.0, 3.0, 2.0, 4.0, 1.0, 6.0];
        let b = l.base(&counts).unwrap();
        let total: f64 = counts.iter().sum();
        let mut rng = dprec_dp::rng::seeded(3);
        let (users, n) = (20_000, 30);
        let mut mean = 0.0;
        for _ in 0..users {
            let mut h = vec![0.0; l.names.len()];
            for _ in 0..n {
                let mut x = rng.random::<f64>() * total;
                let j = counts.iter().position(|&c| {
                    x -= c;
                    x < 0.0
                });
                l.add_mass(j.unwrap_or(counts.len() - 1), &mut h);
            }
            mean += b.chi(&h, n) / users as f64;
        }
        let expected = b.null_chi;
        assert!((mean / expected - 1.0).abs() < 0.02, "{mean} vs {expected}");
    }

    fn lift() -> LabelLift {
        LabelLift {
            item_labels: vec![vec![0], vec![1], vec![0, 1], vec![]],
            share: vec![0.5, 0.5],
            alpha: 2.0,
            base: [10.0f64, 12.0, 11.0, 3.0].iter().map(|c| c.ln()).collect(),
            names: vec!["comedy".into(), "drama".into()],
        }
    }

    /// An item-item model over candidates 0..3: rating item 0 favours item 3, then 1.
    fn item_item() -> ItemRanker {
        let b = vec![
            0.0, 0.5, 0.1, 0.9, //
            0.5, 0.0, 0.2, 0.1, //
            0.1, 0.2, 0.0, 0.3, //
            0.9, 0.1, 0.3, 0.0,
        ];
        ItemRanker::new(
            4,
            vec![0, 1, 2, 3],
            vec![10.0, 12.0, 11.0, 3.0],
            ItemScorer::ItemItem { b },
            0.0,
        )
        .with_fill(vec![10.0, 12.0, 11.0, 3.0])
    }

    /// A user the item-side model personalises for gets its list and the label list fused
    /// by reciprocal rank: each item `1 / (60 + rank)` in both, summed.
    #[test]
    fn a_personalised_list_is_fused_with_the_label_list_by_rank() {
        let inner = item_item();
        let r = LabelledRanker {
            inner: inner.clone(),
            lift: lift(),
        };
        let own = [(0, 5.0)];
        let (mut fused, mut alone) = (vec![0.0; 4], vec![0.0; 4]);
        r.score_items(None, &own, &mut fused);
        inner.score_items(None, &own, &mut alone);
        // The inner ranks by score: item 3 (0.9), 1 (0.5), 2 (0.1), 0 (0).
        let inner_rank = [3.0, 1.0, 2.0, 0.0];
        // Label scores for a user of label 0 only: items 0 and 2 carry it.
        let l = r.lift.user_lift(&own).unwrap();
        let label: Vec<f64> = (0..4)
            .map(|j| r.lift.base[j] + r.lift.term(&l, j))
            .collect();
        let label_rank: Vec<f64> = (0..4)
            .map(|j| {
                label
                    .iter()
                    .enumerate()
                    .filter(|&(k, &x)| x > label[j] || (x == label[j] && k < j))
                    .count() as f64
            })
            .collect();
        for j in 0..4 {
            let want = 1.0 / (60.0 + inner_rank[j]) + 1.0 / (60.0 + label_rank[j]);
            assert!((fused[j] - want).abs() < 1e-15, "{j}: {fused:?} vs {want}");
        }
        // Without a labelled item (item 3 has none) the inner list stands.
        r.score_items(None, &[(3, 4.0)], &mut fused);
        inner.score_items(None, &[(3, 4.0)], &mut alone);
        assert_eq!(fused, alone);
    }

    /// An item outside the release is ranked at its labels' typical count (the mean over
    /// the label's items, each weighing its label mass) plus the user's lift;
    /// labels the release does not know are ignored, and an item with none is left out.
    #[test]
    fn cold_items_rank_at_their_labels_typical_count() {
        let m = lift();
        let t = m.typical_base();
        // comedy: items 0 (mass 1) and 2 (mass 1/2); drama: items 1 (1) and 2 (1/2).
        let comedy = ((10.0 + 0.5 * 11.0) / 1.5f64).ln();
        let drama = ((12.0 + 0.5 * 11.0) / 1.5f64).ln();
        assert!((t[0] - comedy).abs() < 1e-12 && (t[1] - drama).abs() < 1e-12);
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (a, b, c) = (
            names(&["drama", "western"]),
            names(&["western"]),
            names(&["comedy", "drama"]),
        );
        let cold = m.cold_items(7, [("a", &a[..]), ("b", &b[..]), ("c", &c[..])]);
        assert_eq!(cold.release_id, 7);
        assert_eq!(cold.ids, ["a", "c"]);
        assert_eq!(cold.labels, vec![vec![1], vec![0, 1]]);
        assert!((cold.base[0] - drama).abs() < 1e-12);
        assert!((cold.base[1] - (comedy + drama) / 2.0).abs() < 1e-12);
        // Below the label's well-supported items, until the user's taste lifts it.
        assert!(cold.base[0] < 12.0f64.ln());
        let l = m.user_lift(&[(1, 5.0), (1, 4.0)]).unwrap();
        assert!((cold.score(&l, 0) - (drama + l[1])).abs() < 1e-12);
        // A model without label names (stored before them) ranks nothing outside it.
        let old = LabelLift {
            names: Vec::new(),
            ..m
        };
        assert!(old.cold_items(7, [("a", &a[..])]).is_empty());
    }

    /// A cold item in a label list scores its label score; in a fused list it holds the
    /// label half of the fusion only, `1 / (60 + r)` at the rank `r` its label score takes
    /// among the release's items, so items high in both lists stay ahead of it.
    #[test]
    fn cold_items_take_the_label_half_of_a_fused_list() {
        let (comedy, drama) = (["comedy".to_string()], ["drama".to_string()]);
        let labels_only = LabelledRanker {
            inner: ItemRanker::new(4, vec![0, 1], vec![10.0, 12.0], ItemScorer::Popularity, 0.0)
                .with_fill(vec![10.0, 12.0, 11.0, 3.0]),
            lift: lift(),
        };
        let cold = labels_only
            .lift
            .cold_items(7, [("comedy", &comedy[..]), ("drama", &drama[..])]);
        let own = [(0, 5.0)];
        let l = labels_only.lift.user_lift(&own).unwrap();
        let scale = labels_only.cold_scale(&own, &cold).unwrap();
        assert_eq!(scale, ColdScale::Labels(l.clone()));
        assert_eq!(scale.score(&cold, 0), cold.score(&l, 0));

        let fused = LabelledRanker {
            inner: item_item(),
            lift: lift(),
        };
        let scale = fused.cold_scale(&own, &cold).unwrap();
        // The user's label scores: comedy items 0 (count 10) and 2 (11, also drama) lifted,
        // drama item 1 (12) lowered, item 3 (3, no label) as is.
        let label: Vec<f64> = (0..4)
            .map(|j| fused.lift.base[j] + fused.lift.term(&l, j))
            .collect();
        let above = |k: usize| label.iter().filter(|&&x| x >= cold.score(&l, k)).count();
        // The typical comedy count (10.33) tops the user's label list; the typical drama
        // count (11.67), lowered by the user's taste, comes after items 0, 2 and 1.
        assert_eq!((above(0), above(1)), (0, 3), "{label:?}");
        assert_eq!(scale.score(&cold, 0), 1.0 / 60.0);
        assert_eq!(scale.score(&cold, 1), 1.0 / 63.0);
        // Below the fused list's best item, which is high in both lists.
        let mut out = vec![0.0; 4];
        fused.score_items(None, &own, &mut out);
        let best = out.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert!(scale.score(&cold, 0) < best, "{out:?}");
        // A user without a labelled item gets the inner list: no cold item in it.
        assert_eq!(fused.cold_scale(&[(3, 4.0)], &cold), None);
    }

    /// The Dirichlet estimate: a user whose two labelled items carry label 0 only has
    /// `p_u0 = (2 + 1) / (2 + 2)`, `p_u1 = 1 / 4`; items score by their labels' log ratios.
    #[test]
    fn a_users_lift_is_the_log_ratio_of_their_shrunk_label_shares() {
        let m = lift();
        let own = [(0, 4.0), (0, 5.0), (3, 1.0)];
        let l = m.user_lift(&own).unwrap();
        assert!((l[0] - (0.75f64 / 0.5).ln()).abs() < 1e-12);
        assert!((l[1] - (0.25f64 / 0.5).ln()).abs() < 1e-12);
        assert!((m.term(&l, 2) - (l[0] + l[1])).abs() < 1e-12);
        assert_eq!(m.term(&l, 3), 0.0);
        assert!(m.user_lift(&[(3, 4.0)]).is_none() && m.user_lift(&[]).is_none());
        assert!(m.has_labelled(&own) && !m.has_labelled(&[(3, 4.0)]) && !m.has_labelled(&[]));
    }

    /// The labelled list reorders the posterior-mean counts by the user's labels; a user
    /// without a labelled item gets the counts' order, and the stored form round-trips.
    #[test]
    fn labelled_ranker_reweights_the_counts_by_own_labels() {
        let inner = ItemRanker::new(4, vec![0, 1], vec![10.0, 12.0], ItemScorer::Popularity, 0.0)
            .with_fill(vec![10.0, 12.0, 11.0, 3.0]);
        let r = LabelledRanker {
            inner,
            lift: lift(),
        };
        let mut out = vec![0.0; 4];
        r.score_items(None, &[(3, 4.0)], &mut out);
        assert_eq!(out, [10.0, 12.0, 11.0, 3.0]);
        assert!(!r.personalises(&[(3, 4.0)]));
        let own = [(0, 4.0)];
        assert!(r.personalises(&own));
        r.score_items(None, &own, &mut out);
        let top = crate::model::ranker::top_k(&out, &[true, false, false, false], 3);
        // Item 2 (labels 0 and 1, count 11) now beats item 1 (label 1 only, count 12).
        assert_eq!(top, [2, 1, 3]);
        let back: LabelledRanker =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.lift, r.lift);
        // A label model stored before the posterior means existed (no `base`) serves the
        // item-side lists unchanged and says so.
        let mut stored = serde_json::to_value(&r).unwrap();
        stored["lift"].as_object_mut().unwrap().remove("base");
        stored["lift"]["threshold"] = 88.0.into();
        let old: LabelledRanker = serde_json::from_value(stored).unwrap();
        assert!(!old.personalises(&own));
        old.score_items(None, &own, &mut out);
        assert_eq!(out, [10.0, 12.0, 11.0, 3.0]);
    }
}
