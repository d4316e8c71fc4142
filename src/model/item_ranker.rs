//! Item-side ranking models: popularity, a projection `x_u V V^T` (PureSVD form) and an
//! item-item matrix `x_u B` (EASE form), each over a candidate set of items.
//!
//! A user's scores come from the published model and the user's OWN ratings (DESIGN 6):
//! `x_u` is the user's binary row over the candidates, scaled to unit norm (the same
//! normalisation the training rows get; the scale does not change a user's ranking but
//! keeps the popularity term `pop_weight * pop_j / max pop` on a fixed footing).
//! Items outside the candidate set score `-inf` (never listed) unless the model carries
//! catalogue-wide DP counts (`fill`): then they rank after every candidate, by DP count,
//! so a list holds `n` items whenever the catalogue has them. A user with no rated
//! candidate is answered by popularity (the fallback). None of these models predicts a
//! rating value.

use serde::{Deserialize, Serialize};

use crate::model::history::CountHistory;
use crate::model::ranker::SimilarBasis;
use crate::model::Ranker;

/// How candidate items are scored from the user's row.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ItemScorer {
    /// Popularity alone.
    Popularity,
    /// `x_u V V^T`; `factors` is row-major `K x d` (row `a` = candidate `a`).
    Projection { d: usize, factors: Vec<f64> },
    /// `x_u B`; `b` is row-major `K x K`.
    ItemItem { b: Vec<f64> },
}

/// A published item-side model over `candidates` (catalogue indices). Stored as its
/// published arrays ([`ItemRankerParts`]); the lookup tables are rebuilt on load.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(into = "ItemRankerParts", try_from = "ItemRankerParts")]
pub struct ItemRanker {
    pub n_items: usize,
    pub candidates: Vec<u32>,
    /// Popularity of each candidate (DP counts for private models), aligned with
    /// `candidates`.
    pub popularity: Vec<f64>,
    pub scorer: ItemScorer,
    /// Weight of the normalised popularity added to every personalised score.
    pub pop_weight: f64,
    /// DP count of every catalogue item (the release's counts), or empty (rows stored
    /// before it existed: items outside the candidates are then never listed).
    pub fill: Vec<f64>,
    /// Similar items among the candidates ([`Neighbours`]); empty for rows stored before
    /// they existed (the service then uses the item profiles).
    pub neighbours: Neighbours,
    /// The counts filter's state after this release ([`CountHistory`]; `fill` and the
    /// candidates' popularity are its estimates), kept for the next release; `None` for
    /// rows stored before it existed or models that do not combine releases.
    pub history: Option<CountHistory>,
    cand_pos: Vec<u32>,
    pop_max: f64,
}

const NONE: u32 = u32::MAX;

/// Writes `sum_{a in pos} B[a, :]` for own candidate positions `pos` into the slice
/// ([`ItemRanker::score_items_with`]).
pub type ItemItemSums<'a> = dyn Fn(&[usize], &mut [f64]) + 'a;

/// The published arrays of an [`ItemRanker`], as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemRankerParts {
    pub n_items: usize,
    pub candidates: Vec<u32>,
    pub popularity: Vec<f64>,
    pub scorer: ItemScorer,
    pub pop_weight: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fill: Vec<f64>,
    #[serde(default, skip_serializing_if = "Neighbours::is_empty")]
    pub neighbours: Neighbours,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<CountHistory>,
}

/// Up to `per_item` most similar other candidates of every candidate, best first:
/// row `a` of `items` (candidate positions) and of `scores`, each `per_item` long.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Neighbours {
    pub per_item: usize,
    pub items: Vec<u32>,
    pub scores: Vec<f64>,
}

/// How many neighbours [`Neighbours::from_gram`] keeps per candidate (public).
pub const NEIGHBOURS: usize = 50;

impl Neighbours {
    pub fn is_empty(&self) -> bool {
        self.per_item == 0
    }

    /// Cosine similarity of the rows of a (noisy) `k x k` Gram `g`: row `a` is candidate
    /// `a`'s co-occurrence with every candidate, so two items are close when they are
    /// rated together with the same items. `cos(a, b) = (G^2)_ab / sqrt((G^2)_aa (G^2)_bb)`.
    /// A function of the Gram only: applied to the DP Gram it is post-processing. Keeps
    /// the `min(per_item, k - 1)` best of every row (ties to the smaller position).
    pub fn from_gram(g: &[f64], k: usize, per_item: usize) -> Self {
        assert_eq!(g.len(), k * k, "a k x k Gram");
        let per_item = per_item.min(k.saturating_sub(1));
        if per_item == 0 {
            return Self::default();
        }
        let norm: Vec<f64> = (0..k)
            .map(|a| {
                g[a * k..(a + 1) * k]
                    .iter()
                    .map(|x| x * x)
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        let mut items = Vec::with_capacity(k * per_item);
        let mut scores = Vec::with_capacity(k * per_item);
        let mut row: Vec<(u32, f64)> = Vec::with_capacity(k);
        for a in 0..k {
            let ga = &g[a * k..(a + 1) * k];
            row.clear();
            row.extend((0..k).filter(|&b| b != a).map(|b| {
                let d = norm[a] * norm[b];
                let dot: f64 = ga
                    .iter()
                    .zip(&g[b * k..(b + 1) * k])
                    .map(|(x, y)| x * y)
                    .sum();
                (b as u32, if d > 0.0 { dot / d } else { 0.0 })
            }));
            row.sort_by(|p, q| q.1.total_cmp(&p.1).then(p.0.cmp(&q.0)));
            for &(b, s) in &row[..per_item] {
                items.push(b);
                scores.push(s);
            }
        }
        Self {
            per_item,
            items,
            scores,
        }
    }
}

impl From<ItemRanker> for ItemRankerParts {
    fn from(r: ItemRanker) -> Self {
        Self {
            n_items: r.n_items,
            candidates: r.candidates,
            popularity: r.popularity,
            scorer: r.scorer,
            pop_weight: r.pop_weight,
            fill: r.fill,
            neighbours: r.neighbours,
            history: r.history,
        }
    }
}

impl TryFrom<ItemRankerParts> for ItemRanker {
    type Error = String;
    /// Checks the shapes [`ItemRanker::new`] asserts, so a corrupt row is an error.
    fn try_from(p: ItemRankerParts) -> Result<Self, String> {
        let k = p.candidates.len();
        let shape_ok = match &p.scorer {
            ItemScorer::Projection { d, factors } => factors.len() == k * d,
            ItemScorer::ItemItem { b } => b.len() == k * k,
            ItemScorer::Popularity => true,
        };
        if p.popularity.len() != k || !shape_ok {
            return Err(format!("item ranker arrays do not match {k} candidates"));
        }
        if p.candidates.iter().any(|&j| j as usize >= p.n_items) {
            return Err(format!("item ranker candidate outside 0..{}", p.n_items));
        }
        let nb = &p.neighbours;
        if nb.items.len() != k * nb.per_item
            || nb.scores.len() != nb.items.len()
            || nb.items.iter().any(|&b| b as usize >= k)
        {
            return Err(format!(
                "item ranker neighbours do not match {k} candidates"
            ));
        }
        if let Some(h) = &p.history {
            let finite = h.var.iter().all(|v| v.is_finite() && *v > 0.0);
            if h.mean.len() != p.n_items || h.var.len() != p.n_items || !finite {
                return Err(format!(
                    "item ranker count history does not match {} items",
                    p.n_items
                ));
            }
            if let Some(g) = &h.gram {
                let k = g.candidates.len();
                let shape = g.sum.len() == k * k || (k == 0 && g.sum.is_empty());
                if !shape || g.candidates.iter().any(|&j| j as usize >= p.n_items) {
                    return Err(format!(
                        "item ranker Gram state does not match its {k} held candidates"
                    ));
                }
            }
        }
        if !p.fill.is_empty() && p.fill.len() != p.n_items {
            return Err(format!(
                "item ranker fill does not match {} items",
                p.n_items
            ));
        }
        Ok(ItemRanker::new(
            p.n_items,
            p.candidates,
            p.popularity,
            p.scorer,
            p.pop_weight,
        )
        .with_fill(p.fill)
        .with_neighbours(p.neighbours)
        .with_history(p.history))
    }
}

impl ItemRanker {
    pub fn new(
        n_items: usize,
        candidates: Vec<u32>,
        popularity: Vec<f64>,
        scorer: ItemScorer,
        pop_weight: f64,
    ) -> Self {
        assert_eq!(
            candidates.len(),
            popularity.len(),
            "one popularity per candidate"
        );
        let k = candidates.len();
        match &scorer {
            ItemScorer::Projection { d, factors } => assert_eq!(factors.len(), k * d),
            ItemScorer::ItemItem { b } => assert_eq!(b.len(), k * k),
            ItemScorer::Popularity => {}
        }
        let mut cand_pos = vec![NONE; n_items];
        for (a, &j) in candidates.iter().enumerate() {
            cand_pos[j as usize] = a as u32;
        }
        let pop_max = popularity.iter().copied().fold(0.0, f64::max);
        Self {
            n_items,
            candidates,
            popularity,
            scorer,
            pop_weight,
            fill: Vec::new(),
            neighbours: Neighbours::default(),
            history: None,
            cand_pos,
            pop_max: if pop_max > 0.0 { pop_max } else { 1.0 },
        }
    }

    /// The same model with catalogue-wide DP counts `fill` (one per item): items
    /// outside the candidates then rank after every candidate, by DP count.
    pub fn with_fill(mut self, fill: Vec<f64>) -> Self {
        assert!(
            fill.is_empty() || fill.len() == self.n_items,
            "one count per item"
        );
        self.fill = fill;
        self
    }

    /// The same model with the counts filter's state after its release.
    pub fn with_history(mut self, history: Option<CountHistory>) -> Self {
        if let Some(h) = &history {
            assert_eq!(h.mean.len(), self.n_items, "one estimate per item");
        }
        self.history = history;
        self
    }

    /// The same model with similar items among its candidates.
    pub fn with_neighbours(mut self, neighbours: Neighbours) -> Self {
        let k = self.candidates.len();
        assert_eq!(neighbours.items.len(), k * neighbours.per_item);
        assert_eq!(neighbours.scores.len(), neighbours.items.len());
        self.neighbours = neighbours;
        self
    }

    /// Scores of the items outside the candidates: below `lowest` (the lowest candidate
    /// score), in the order of their DP counts. Without `fill` they stay `-inf`.
    fn fill_outside(&self, lowest: f64, out: &mut [f64]) {
        let Some((lo, span)) = self.fill_span() else {
            return;
        };
        for (j, o) in out.iter_mut().enumerate() {
            if self.position(j).is_none() {
                *o = lowest - 2.0 + (self.fill[j] - lo) / span;
            }
        }
    }

    /// The smallest DP count of `fill` and the span that scales the counts into `[0, 1]`;
    /// `None` without `fill`.
    fn fill_span(&self) -> Option<(f64, f64)> {
        if self.fill.is_empty() {
            return None;
        }
        let (lo, hi) = self
            .fill
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        Some((lo, if hi > lo { hi - lo } else { 1.0 }))
    }

    /// Each item's term in its score outside the candidates: an item outside them scores
    /// `(lowest - 2) + term` ([`ItemRanker::score_items_with`]), the same operations in
    /// the same order. `None` without `fill`.
    pub fn fill_terms(&self) -> Option<Vec<f64>> {
        let (lo, span) = self.fill_span()?;
        Some(self.fill.iter().map(|&f| (f - lo) / span).collect())
    }

    /// Candidate position of catalogue item `j`, if it is a candidate.
    pub fn position(&self, j: usize) -> Option<usize> {
        self.cand_pos
            .get(j)
            .copied()
            .filter(|&p| p != NONE)
            .map(|p| p as usize)
    }

    /// [`Ranker::score_items`] with the item-item sums `sum_{a in pos} B[a, :]` over the
    /// own candidate positions `pos` written by `item_item` instead of read from the
    /// stored `B` (the selection statistic's leave-user-out weights,
    /// [`crate::train::topn::selection::ListHits`]); other scorers ignore it.
    pub fn score_items_with(
        &self,
        own: &[(usize, f64)],
        item_item: Option<&ItemItemSums<'_>>,
        out: &mut [f64],
    ) {
        out.iter_mut().for_each(|s| *s = f64::NEG_INFINITY);
        let Some(cand) = self.candidate_scores(own, item_item) else {
            // Not personal: the DP counts order the whole catalogue.
            out.copy_from_slice(&self.fill);
            return;
        };
        for (a, &j) in self.candidates.iter().enumerate() {
            if let Some(o) = out.get_mut(j as usize) {
                *o = cand[a];
            }
        }
        let lowest = cand.iter().copied().fold(f64::INFINITY, f64::min);
        self.fill_outside(if lowest.is_finite() { lowest } else { 0.0 }, out);
    }

    /// The scores of the candidates (aligned with `candidates`) as
    /// [`ItemRanker::score_items_with`] writes them; every other item scores below all of
    /// them, in the order of `fill` (or `-inf` without it). `None` when the list is not
    /// personal and has `fill`: then `fill` orders the whole catalogue.
    pub fn candidate_scores(
        &self,
        own: &[(usize, f64)],
        item_item: Option<&ItemItemSums<'_>>,
    ) -> Option<Vec<f64>> {
        let pos = self.own_positions(own);
        let k = self.candidates.len();
        let mut cand = vec![0.0; k];
        let personal = self.personalises(own);
        if personal {
            let w = 1.0 / (pos.len() as f64).sqrt();
            match &self.scorer {
                ItemScorer::Projection { d, factors } => {
                    let d = *d;
                    let mut p = vec![0.0; d];
                    for &a in &pos {
                        for (x, v) in p.iter_mut().zip(&factors[a * d..(a + 1) * d]) {
                            *x += w * v;
                        }
                    }
                    for (b, s) in cand.iter_mut().enumerate() {
                        *s = factors[b * d..(b + 1) * d]
                            .iter()
                            .zip(&p)
                            .map(|(v, x)| v * x)
                            .sum();
                    }
                }
                ItemScorer::ItemItem { b } => match item_item {
                    Some(sums) => {
                        sums(&pos, &mut cand);
                        cand.iter_mut().for_each(|s| *s *= w);
                    }
                    None => {
                        for &a in &pos {
                            for (s, x) in cand.iter_mut().zip(&b[a * k..(a + 1) * k]) {
                                *s += w * x;
                            }
                        }
                    }
                },
                ItemScorer::Popularity => unreachable!("popularity is not personal"),
            }
            for (s, p) in cand.iter_mut().zip(&self.popularity) {
                *s += self.pop_weight * p / self.pop_max;
            }
        } else if !self.fill.is_empty() {
            return None;
        } else {
            cand.copy_from_slice(&self.popularity);
        }
        Some(cand)
    }

    /// Candidate positions of the user's own rated items.
    fn own_positions(&self, own: &[(usize, f64)]) -> Vec<usize> {
        own.iter().filter_map(|&(j, _)| self.position(j)).collect()
    }
}

impl Ranker for ItemRanker {
    fn n_items(&self) -> usize {
        self.n_items
    }

    fn personalises(&self, own: &[(usize, f64)]) -> bool {
        !matches!(self.scorer, ItemScorer::Popularity)
            && own.iter().any(|&(j, _)| self.position(j).is_some())
    }

    fn storable(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn count_history(&self) -> Option<&CountHistory> {
        self.history.as_ref()
    }

    fn popularity_counts(&self) -> Option<Vec<f64>> {
        if !self.fill.is_empty() {
            return Some(self.fill.clone());
        }
        let mut counts = vec![0.0; self.n_items];
        for (&j, &p) in self.candidates.iter().zip(&self.popularity) {
            counts[j as usize] = p;
        }
        Some(counts)
    }

    fn score_items(&self, _user: Option<usize>, own: &[(usize, f64)], out: &mut [f64]) {
        self.score_items_with(own, None, out);
    }

    fn predict(&self, _user: Option<usize>, _own: &[(usize, f64)], _item: usize) -> Option<f64> {
        None
    }

    /// The stored neighbours of a candidate (at most [`Neighbours::per_item`]); `None`
    /// for items outside the candidates or a model stored without neighbours.
    fn similar(&self, item: usize, n: usize) -> Option<(SimilarBasis, Vec<(usize, f64)>)> {
        let nb = &self.neighbours;
        let a = self.position(item).filter(|_| !nb.is_empty())?;
        let row = a * nb.per_item..(a + 1) * nb.per_item;
        let list = nb.items[row.clone()]
            .iter()
            .zip(&nb.scores[row])
            .take(n)
            .map(|(&b, &s)| (self.candidates[b as usize] as usize, s))
            .collect();
        Some((SimilarBasis::Gram, list))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projection_scores_from_own_row_and_falls_back_to_popularity() {
        // Candidates 4 and 1 and 2 of a 5-item catalogue; d = 1, V = [1, 2, -1].
        let r = ItemRanker::new(
            5,
            vec![4, 1, 2],
            vec![10.0, 20.0, 5.0],
            ItemScorer::Projection {
                d: 1,
                factors: vec![1.0, 2.0, -1.0],
            },
            0.0,
        );
        let mut out = vec![0.0; 5];
        // Own: item 4 (candidate 0) and item 3 (not a candidate): p = 1 * 1, scores V p.
        r.score_items(None, &[(4, 5.0), (3, 1.0)], &mut out);
        assert_eq!(out[0], f64::NEG_INFINITY);
        assert_eq!(out[3], f64::NEG_INFINITY);
        assert_eq!((out[4], out[1], out[2]), (1.0, 2.0, -1.0));
        // No rated candidate: popularity answers.
        r.score_items(None, &[(3, 1.0)], &mut out);
        assert_eq!((out[4], out[1], out[2]), (10.0, 20.0, 5.0));
    }

    /// A release stores the ranker as JSON and a restarted service reloads it: the same
    /// scores come back, and arrays that do not match the candidates are refused.
    #[test]
    fn stored_form_round_trips_and_refuses_bad_shapes() {
        let r = ItemRanker::new(
            4,
            vec![3, 0],
            vec![7.0, 9.0],
            ItemScorer::Projection {
                d: 2,
                factors: vec![0.5, -1.0, 2.0, 0.25],
            },
            0.5,
        );
        let json = serde_json::to_string(&crate::model::StoredRanker::of(&r).unwrap()).unwrap();
        let back = serde_json::from_str::<crate::model::StoredRanker>(&json)
            .unwrap()
            .into_ranker();
        let own = [(3, 4.0), (1, 2.0)];
        let (mut a, mut b) = (vec![0.0; 4], vec![0.0; 4]);
        r.score_items(None, &own, &mut a);
        back.score_items(None, &own, &mut b);
        assert_eq!(a, b);
        assert!(back.personalises(&own) && !back.personalises(&[(1, 2.0)]));
        assert_eq!(back.popularity_counts().unwrap(), vec![9.0, 0.0, 0.0, 7.0]);
        let bad = json.replace("[0.5,-1.0,2.0,0.25]", "[0.5,-1.0,2.0]");
        assert_ne!(bad, json);
        assert!(serde_json::from_str::<crate::model::StoredRanker>(&bad).is_err());
    }

    /// Neighbours are the cosine of the Gram's rows, best first, the item itself left
    /// out; the ranker answers them for its candidates (catalogue indices) and nothing
    /// for other items, and the stored form keeps them.
    #[test]
    fn neighbours_are_the_cosine_of_gram_rows() {
        // Candidates 0 and 1 are rated together, 2 with 1 a little, 3 alone.
        let g = vec![
            4.0, 3.0, 0.0, 0.0, //
            3.0, 4.0, 1.0, 0.0, //
            0.0, 1.0, 2.0, 0.0, //
            0.0, 0.0, 0.0, 1.0,
        ];
        let nb = Neighbours::from_gram(&g, 4, 2);
        let cos = |a: usize, b: usize| {
            let r = |i: usize| &g[i * 4..i * 4 + 4];
            let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f64>();
            dot(r(a), r(b)) / (dot(r(a), r(a)) * dot(r(b), r(b))).sqrt()
        };
        // Row 0: 24 / (5 * sqrt 26) with 1, 3 / (5 sqrt 5) with 2, 0 with 3.
        assert_eq!(nb.per_item, 2);
        assert_eq!(&nb.items[0..2], &[1, 2]);
        assert!((nb.scores[0] - 24.0 / (5.0 * 26f64.sqrt())).abs() < 1e-12);
        assert!((nb.scores[1] - cos(0, 2)).abs() < 1e-12);
        // Row 2: closer to 1 (8 / sqrt(26 * 5)) than to 0 (3 / (5 sqrt 5)).
        assert_eq!(&nb.items[4..6], &[1, 0]);
        assert!((nb.scores[4] - cos(2, 1)).abs() < 1e-12 && nb.scores[4] > nb.scores[5]);
        // Row 3: orthogonal to all, ties to the smaller position.
        assert_eq!(
            (&nb.items[6..8], &nb.scores[6..8]),
            (&[0, 1][..], &[0.0, 0.0][..])
        );
        // Never more than k - 1 neighbours; none for one candidate.
        assert_eq!(Neighbours::from_gram(&g, 4, 50).per_item, 3);
        assert!(Neighbours::from_gram(&[1.0], 1, 50).is_empty());

        // Served through the ranker: candidates 7, 5, 6, 1 of 8 items.
        let r = ItemRanker::new(
            8,
            vec![7, 5, 6, 1],
            vec![1.0; 4],
            ItemScorer::Popularity,
            0.0,
        )
        .with_neighbours(nb.clone());
        let (basis, list) = r.similar(6, 1).unwrap();
        assert_eq!(basis, SimilarBasis::Gram);
        assert_eq!(list, vec![(5, nb.scores[4])]);
        assert!(r.similar(0, 3).is_none(), "not a candidate");
        let json = serde_json::to_string(&crate::model::StoredRanker::of(&r).unwrap()).unwrap();
        let back = serde_json::from_str::<crate::model::StoredRanker>(&json)
            .unwrap()
            .into_ranker();
        assert_eq!(back.similar(7, 5), r.similar(7, 5));
        let bad = json.replace("\"per_item\":2", "\"per_item\":3");
        assert!(serde_json::from_str::<crate::model::StoredRanker>(&bad).is_err());
    }

    #[test]
    fn item_item_sums_rows_of_own_items() {
        let b = vec![0.0, 1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 6.0, 0.0];
        let r = ItemRanker::new(
            3,
            vec![0, 1, 2],
            vec![1.0, 2.0, 4.0],
            ItemScorer::ItemItem { b },
            1.0,
        );
        let mut out = vec![0.0; 3];
        r.score_items(Some(0), &[(0, 4.0), (2, 3.0)], &mut out);
        let w = 1.0 / 2f64.sqrt();
        // rows 0 and 2 summed, scaled by 1/sqrt(2), plus pop / 4.
        assert!((out[0] - (5.0 * w + 0.25)).abs() < 1e-12);
        assert!((out[1] - (7.0 * w + 0.5)).abs() < 1e-12);
        assert!((out[2] - (2.0 * w + 1.0)).abs() < 1e-12);
    }

    /// A stored count history that does not fit the model is refused on load (a corrupt
    /// row is an error, not a panic or a wrong combination later).
    #[test]
    fn stored_history_must_fit_the_catalogue() {
        let h = |n: usize, v: f64| CountHistory {
            basis: "b".into(),
            mean: vec![1.0; n],
            var: vec![v; n],
            releases: 2,
            own_total: None,
            gram: None,
            item_side: None,
        };
        let parts = |history| ItemRankerParts {
            n_items: 3,
            candidates: vec![0],
            popularity: vec![1.0],
            scorer: ItemScorer::Popularity,
            pop_weight: 0.0,
            fill: Vec::new(),
            neighbours: Neighbours::default(),
            history,
        };
        let ok = ItemRanker::try_from(parts(Some(h(3, 2.0)))).unwrap();
        assert_eq!(ok.count_history().unwrap().releases, 2);
        for bad in [h(2, 2.0), h(3, 0.0), h(3, f64::INFINITY)] {
            assert!(ItemRanker::try_from(parts(Some(bad))).is_err());
        }
        // A Gram state must be K x K over held candidates inside the catalogue.
        let with_gram = |candidates: Vec<u32>, sum_len: usize| CountHistory {
            gram: Some(Box::new(crate::model::history::GramState {
                candidates,
                sum: vec![0.0; sum_len],
                ..crate::model::history::GramState::empty()
            })),
            ..h(3, 2.0)
        };
        assert!(ItemRanker::try_from(parts(Some(with_gram(vec![0, 2], 4)))).is_ok());
        assert!(ItemRanker::try_from(parts(Some(with_gram(vec![], 0)))).is_ok());
        for (c, n) in [(vec![0, 2], 3), (vec![0, 3], 4)] {
            assert!(ItemRanker::try_from(parts(Some(with_gram(c, n)))).is_err());
        }
    }

    /// With catalogue-wide DP counts a list holds `n` items whatever the candidates: one
    /// candidate (the user rated it, or not) or none; the rest by DP count, after every
    /// candidate, the user's items excluded by the caller.
    #[test]
    fn fill_lists_the_catalogue_after_the_candidates() {
        let fill = vec![3.0, 9.0, -1.0, 5.0, 7.0, 0.5];
        let top = |r: &ItemRanker, own: &[(usize, f64)]| {
            let mut s = vec![0.0; 6];
            r.score_items(None, own, &mut s);
            let mut ex = vec![false; 6];
            own.iter().for_each(|&(j, _)| ex[j] = true);
            crate::model::ranker::top_k(&s, &ex, 10)
        };
        let proj = ItemScorer::Projection {
            d: 1,
            factors: vec![1.0],
        };
        let one = ItemRanker::new(6, vec![3], vec![5.0], proj, 0.0).with_fill(fill.clone());
        // Rated the candidate: personal (a score of 1 on it, excluded), then the counts.
        assert_eq!(top(&one, &[(3, 5.0)]), vec![1, 4, 0, 5, 2]);
        // Rated something else: popularity over the catalogue.
        assert_eq!(top(&one, &[(0, 5.0)]), vec![1, 4, 3, 5, 2]);
        let none =
            ItemRanker::new(6, vec![], vec![], ItemScorer::Popularity, 0.0).with_fill(fill.clone());
        assert_eq!(top(&none, &[(4, 1.0)]), vec![1, 3, 0, 5, 2]);
        assert_eq!(none.popularity_counts().unwrap(), fill);
        // Without fill (rows stored before it) only candidates are listed.
        let old = ItemRanker::new(6, vec![3, 1], vec![5.0, 9.0], ItemScorer::Popularity, 0.0);
        assert_eq!(top(&old, &[]), vec![1, 3]);
        // The stored form keeps the counts.
        let json = serde_json::to_string(&crate::model::StoredRanker::of(&one).unwrap()).unwrap();
        let back = serde_json::from_str::<crate::model::StoredRanker>(&json)
            .unwrap()
            .into_ranker();
        assert_eq!(back.popularity_counts().unwrap(), fill);
    }
}
