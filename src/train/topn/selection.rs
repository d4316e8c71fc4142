//! The statistic `dp-topn:split=select` draws each release (docs/privacy/dp-topn.md, 2b):
//! a noised leave-one-out difference between two published lists, pure (no I/O).
//!
//! For each user of the release's sample with at least two rows and a liked one, the
//! liked row whose item has the smallest keyed digest (data-independent randomness: the
//! release's secret subset key) is hidden; `v_u = hit(a) - hit(b)`, where a hit is the
//! hidden item among the top [`LOO_TOP`] of the items outside the user's other rows, as
//! each list ranks them from those rows alone. `v_u` is in `{-1, 0, 1}`: one user moves
//! the sum by at most 1, and one rating (which changes the rows, the hidden row or
//! whether the user counts) by at most 2. The release adds `N(0, z_s^2)` to the sum
//! ([`noised_difference`]) from its noise stream.

use rayon::prelude::*;

use crate::model::history::GramState;
use crate::model::item_ranker::{ItemItemSums, ItemRanker, ItemScorer};
use crate::train::topn::suffstats::gram_weight;
use crate::train::{numerical, TrainError};
use dprec_dp::privacy::continuous::gaussian;
use dprec_dp::rng::DpRng;

/// The list length a hit is counted in (the eval's NDCG@10).
pub const LOO_TOP: usize = 10;

/// Per user of `rows`: `v_u` in `{-1, 0, 1}` (0 for a user who does not count).
/// `liked[u]` is how many of row `u`'s items, at the front, are liked (empty: all are,
/// as in [`super::dp_topn::Sample::liked`]); `digest(u, j)` orders user `u`'s liked items
/// for the hidden one (the smallest is hidden). The rows are binary (value 1).
pub fn loo_values<D>(
    rows: &[Vec<u32>],
    liked: &[u32],
    digest: D,
    a: &ListHits<'_>,
    b: &ListHits<'_>,
) -> Vec<i8>
where
    D: Fn(usize, u32) -> [u8; 32] + Sync,
{
    let n = a.n_items().min(b.n_items());
    rows.par_iter()
        .enumerate()
        .map(|(u, row)| {
            let n_liked = liked.get(u).map_or(row.len(), |&l| l as usize);
            if row.len() < 2 || n_liked == 0 {
                return 0;
            }
            let Some(&hidden) = row[..n_liked.min(row.len())]
                .iter()
                .min_by_key(|&&j| digest(u, j))
            else {
                return 0;
            };
            if hidden as usize >= n {
                return 0;
            }
            let own: Vec<(usize, f64)> = row
                .iter()
                .filter(|&&j| j != hidden && (j as usize) < n)
                .map(|&j| (j as usize, 1.0))
                .collect();
            let t = hidden as usize;
            a.hit(&own, row, t) as i8 - b.hit(&own, row, t) as i8
        })
        .collect()
}

/// A list a user's hidden item is looked for in, as the service would list it from the
/// user's other rows (`own`): an [`ItemRanker`], optionally scored leave-user-out (EASE
/// with the user's own term `x_u x_u^T` taken out of the Gram it was fitted on, from the
/// user's whole sampled row). Holds the `fill` order, computed once, so that a hit costs
/// `O(K + |own|)` instead of a pass over the catalogue.
///
/// Leave-user-out: scored in sample, the hidden item's co-occurrence with the user's other
/// items, which the user put in the Gram, favours EASE. Sherman-Morrison on
/// `P = (G + lambda I)^-1` (the row clipped as the Gram's rows are): `P' = P + a y y^T`
/// with `y = P x_u` and `a = 1 / (1 - x_u^T y)`, `O(K |row|)` a user. Where
/// `1 - x_u^T y` is not positive (the noisy `G` minus the term would not be positive
/// definite) the user is scored on `G`. The statistic stays a function of the published
/// Gram and the user's own rows, so its bounds (a user moves the sum by 1, a rating by 2)
/// are unchanged.
pub struct ListHits<'a> {
    ranker: &'a ItemRanker,
    /// `P` (row-major `K x K` over the ranker's candidates) and the Gram's clip, for
    /// leave-user-out scoring.
    inverse: Option<(&'a [f64], f64)>,
    /// Per item, how many items have a strictly larger `fill`: over the catalogue, and
    /// over the items outside the candidates.
    above_all: Vec<u32>,
    above_outside: Vec<u32>,
}

impl<'a> ListHits<'a> {
    /// The list as served.
    pub fn plain(ranker: &'a ItemRanker) -> Self {
        let n = ranker.fill.len();
        let above_all = strictly_above(&ranker.fill, &vec![true; n]);
        let outside: Vec<bool> = (0..n).map(|j| ranker.position(j).is_none()).collect();
        let above_outside = strictly_above(&ranker.fill, &outside);
        Self {
            ranker,
            inverse: None,
            above_all,
            above_outside,
        }
    }

    /// EASE scored leave-user-out: `ranker` must be EASE over `P`'s candidates
    /// ([`ItemScorer::ItemItem`]), `clip` the Gram's `gram_clip`.
    pub fn leave_user_out(
        ranker: &'a ItemRanker,
        p: &'a [f64],
        clip: f64,
    ) -> Result<Self, TrainError> {
        let k = ranker.candidates.len();
        if p.len() != k * k || !matches!(ranker.scorer, ItemScorer::ItemItem { .. }) {
            return Err(crate::train::invalid(
                "gram",
                "leave-user-out needs EASE over the inverse's candidates",
            ));
        }
        Ok(Self {
            inverse: Some((p, clip)),
            ..Self::plain(ranker)
        })
    }

    pub fn n_items(&self) -> usize {
        self.ranker.n_items
    }

    /// The candidates' scores for a user (`None`: `fill` orders the catalogue).
    fn candidate_scores(&self, own: &[(usize, f64)], row: &[u32]) -> Option<Vec<f64>> {
        self.with_item_item(row, |sums| self.ranker.candidate_scores(own, sums))
    }

    /// Calls `f` with the item-item sums of the user's leave-user-out EASE (`None` for a
    /// plain list): the row sums of `B' = I - P' diag(1 / diag P')` over the own positions.
    fn with_item_item<R>(&self, row: &[u32], f: impl FnOnce(Option<&ItemItemSums<'_>>) -> R) -> R {
        let Some((p, clip)) = self.inverse else {
            return f(None);
        };
        let k = self.ranker.candidates.len();
        let (y, a) = self.correction(p, clip, row);
        let sums = |pos: &[usize], raw: &mut [f64]| {
            let ys: f64 = pos.iter().map(|&i| y[i]).sum();
            let mut col = vec![0.0; k];
            for &i in pos {
                for (c, v) in col.iter_mut().zip(&p[i * k..(i + 1) * k]) {
                    *c += v;
                }
            }
            let mut is_own = vec![false; k];
            pos.iter().for_each(|&i| is_own[i] = true);
            for j in 0..k {
                let diag = p[j * k + j] + a * y[j] * y[j];
                let mut s = col[j] + a * ys * y[j];
                if is_own[j] {
                    s -= diag;
                }
                raw[j] = -s / diag;
            }
        };
        f(Some(&sums))
    }

    /// `y = P x_u` and `a` for the user's whole row (`a = 0`: no correction).
    fn correction(&self, p: &[f64], clip: f64, row: &[u32]) -> (Vec<f64>, f64) {
        let k = self.ranker.candidates.len();
        let x: Vec<usize> = row
            .iter()
            .filter_map(|&j| self.ranker.position(j as usize))
            .collect();
        let mut y = vec![0.0; k];
        if x.is_empty() {
            return (y, 0.0);
        }
        let c = gram_weight(x.len(), clip).sqrt();
        for &a in &x {
            for (v, q) in y.iter_mut().zip(&p[a * k..(a + 1) * k]) {
                *v += c * q;
            }
        }
        let xy: f64 = x.iter().map(|&a| c * y[a]).sum();
        let denom = 1.0 - xy;
        (y, if denom > 1e-9 { 1.0 / denom } else { 0.0 })
    }

    /// Every item's score for the user, as the served list computes them.
    pub fn scores(&self, own: &[(usize, f64)], row: &[u32], out: &mut [f64]) {
        self.with_item_item(row, |sums| self.ranker.score_items_with(own, sums, out));
    }

    /// Whether `target` is among the top [`LOO_TOP`] of the items outside `own` (ties
    /// count for the target): [`hit`] on [`ListHits::scores`], from the candidates'
    /// scores and the `fill` order alone.
    pub fn hit(&self, own: &[(usize, f64)], row: &[u32], target: usize) -> bool {
        let fill = &self.ranker.fill;
        let above_in_fill = |above: &[u32], outside_only: bool| {
            let t = fill[target];
            let own_above = own
                .iter()
                .filter(|&&(j, _)| {
                    fill[j] > t && (!outside_only || self.ranker.position(j).is_none())
                })
                .count();
            above[target] as usize - own_above
        };
        let above = match self.candidate_scores(own, row) {
            None => above_in_fill(&self.above_all, false),
            Some(cand) => {
                let mut own_cand = vec![false; cand.len()];
                own.iter()
                    .filter_map(|&(j, _)| self.ranker.position(j))
                    .for_each(|a| own_cand[a] = true);
                match self.ranker.position(target) {
                    Some(pt) => (0..cand.len())
                        .filter(|&a| a != pt && !own_cand[a] && cand[a] > cand[pt])
                        .count(),
                    None => {
                        let others = own_cand.iter().filter(|&&o| !o).count();
                        let outside = if fill.is_empty() {
                            0
                        } else {
                            above_in_fill(&self.above_outside, true)
                        };
                        others + outside
                    }
                }
            }
        };
        above < LOO_TOP
    }
}

/// Per item of `values`, how many items marked in `counted` have a strictly larger value.
fn strictly_above(values: &[f64], counted: &[bool]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..values.len()).filter(|&j| counted[j]).collect();
    order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
    let sorted: Vec<f64> = order.iter().map(|&j| values[j]).collect();
    values
        .iter()
        .map(|v| sorted.partition_point(|x| x > v) as u32)
        .collect()
}

/// Whether `target` is among the top [`LOO_TOP`] of the items not in `mine` (ties count
/// for the target): the reference the fast [`ListHits::hit`] is tested against.
#[cfg(test)]
fn hit(scores: &[f64], target: usize, mine: &[bool]) -> bool {
    let t = scores[target];
    let above = (0..mine.len())
        .filter(|&j| j != target && !mine[j] && scores[j] > t)
        .take(LOO_TOP)
        .count();
    above < LOO_TOP
}

/// `D = sum + N(0, z_s^2)`, drawn from the release's noise stream.
pub fn noised_difference(sum: i64, z_s: f64, noise: &mut DpRng) -> Result<f64, TrainError> {
    Ok(sum as f64 + gaussian(z_s, noise).map_err(numerical)?)
}

/// Whether a selecting release spends its rest on the Gram, from the last release's
/// state only (public): the first release (no state) on counts; while fewer than
/// `explore` Grams are in, alternately (a Gram after a counts release); then while the
/// combined difference favours the Gram ([`GramState::favours_gram`]).
pub fn select_rest_is_gram(prior: Option<&GramState>, explore: u64, margin: f64) -> bool {
    match prior {
        None => false,
        Some(g) if g.grams < explore => !g.last_was_gram,
        Some(g) => g.favours_gram(margin),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ranker::Ranker;
    use rand::Rng;

    /// The noise of `D` has sd `z_s`: 4,000 draws at a fixed seed, the sample sd within
    /// 4% (its relative sd is 1/sqrt(8000) = 1.1%, so 4% is 3.6 sd); a scale of 0.9 or
    /// 1.1 times is outside.
    #[test]
    fn noised_difference_has_the_planned_scale() {
        let z_s = 4.472;
        let mut rng = dprec_dp::rng::seeded(5);
        let n = 4000;
        let draws: Vec<f64> = (0..n)
            .map(|_| noised_difference(7, z_s, &mut rng).unwrap() - 7.0)
            .collect();
        let mean = draws.iter().sum::<f64>() / n as f64;
        let sd = (draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
        let ok = |scale: f64| (sd / (scale * z_s) - 1.0).abs() < 0.04;
        assert!(ok(1.0), "sd {sd}");
        assert!(!ok(0.9) && !ok(1.1), "sd {sd}");
        assert!(mean.abs() < 4.0 * z_s / (n as f64).sqrt(), "mean {mean}");
    }

    /// Two lists over 30 items: one by popularity, one item-item ranker with random
    /// weights.
    fn lists(rng: &mut DpRng) -> (ItemRanker, ItemRanker) {
        let n = 30;
        let cand: Vec<u32> = (0..20).collect();
        let pop: Vec<f64> = (0..20).map(|j| (40 - j) as f64).collect();
        let fill: Vec<f64> = (0..n).map(|j| (n - j) as f64).collect();
        let b: Vec<f64> = (0..400).map(|_| rng.random::<f64>() - 0.5).collect();
        let counts = ItemRanker::new(n, cand.clone(), pop.clone(), ItemScorer::Popularity, 0.0)
            .with_fill(fill.clone());
        let ease = ItemRanker::new(n, cand, pop, ItemScorer::ItemItem { b }, 0.0).with_fill(fill);
        (ease, counts)
    }

    fn digest(u: usize, j: u32) -> [u8; 32] {
        let mut d = [0u8; 32];
        // A fixed pseudo-random order per (user, item).
        let h = (u as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ (j as u64).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        d[..8].copy_from_slice(&h.rotate_left(17).to_be_bytes());
        d
    }

    /// Liked counts of `rows` where item `j` is liked when `j % 3 != 0`: liked first.
    fn split_liked(rows: &mut [Vec<u32>]) -> Vec<u32> {
        rows.iter_mut()
            .map(|r| {
                r.sort_by_key(|&j| (j % 3 == 0, j));
                r.iter().filter(|&&j| j % 3 != 0).count() as u32
            })
            .collect()
    }

    fn total(rows: &[Vec<u32>], a: &ItemRanker, b: &ItemRanker) -> i64 {
        let mut rows = rows.to_vec();
        let liked = split_liked(&mut rows);
        loo_values(
            &rows,
            &liked,
            digest,
            &ListHits::plain(a),
            &ListHits::plain(b),
        )
        .iter()
        .map(|&v| v as i64)
        .sum()
    }

    /// On random small data: every `v_u` is in {-1, 0, 1}, removing a user moves the sum
    /// by at most 1, adding or removing one rating by at most 2; and the values do move
    /// (some edits change the sum), so the bounds are not vacuous.
    #[test]
    fn one_user_moves_the_sum_by_one_and_one_rating_by_two() {
        let mut rng = dprec_dp::rng::seeded(9);
        let (mut moved_user, mut moved_rating, mut by_two) = (0, 0, 0);
        for _ in 0..40 {
            let (a, b) = lists(&mut rng);
            let rows: Vec<Vec<u32>> = (0..25)
                .map(|_| {
                    let mut r: Vec<u32> = (0..30).filter(|_| rng.random::<f64>() < 0.2).collect();
                    r.dedup();
                    r
                })
                .collect();
            let mut sorted = rows.clone();
            let liked = split_liked(&mut sorted);
            let v = loo_values(
                &sorted,
                &liked,
                digest,
                &ListHits::plain(&a),
                &ListHits::plain(&b),
            );
            assert!(v.iter().all(|x| (-1..=1).contains(x)));
            let base = total(&rows, &a, &b);
            for u in 0..rows.len() {
                // Removed: an empty row (the digest is keyed by the user's index here,
                // as by its label in a release, so the others keep their index).
                let mut less = rows.clone();
                less[u].clear();
                let d = (total(&less, &a, &b) - base).abs();
                assert!(d <= 1, "user {u}: {d}");
                moved_user += (d != 0) as u32;
                // Toggle one random rating of this user.
                let j = rng.random_range(0..30u32);
                let mut edit = rows.clone();
                match edit[u].iter().position(|&x| x == j) {
                    Some(p) => {
                        edit[u].remove(p);
                    }
                    None => edit[u].push(j),
                }
                let d = (total(&edit, &a, &b) - base).abs();
                assert!(d <= 2, "user {u} item {j}: {d}");
                moved_rating += (d != 0) as u32;
                by_two += (d == 2) as u32;
            }
        }
        assert!(
            moved_user > 0 && moved_rating > 0,
            "{moved_user} {moved_rating}"
        );
        assert!(by_two > 0, "no edit reached the bound of 2");
    }

    /// c G c G ... until `explore` Grams, then the state decides.
    #[test]
    fn the_rest_explores_alternately_then_follows_the_state() {
        let mut state: Option<GramState> = None;
        let mut trail = String::new();
        for _ in 0..14 {
            let gram = select_rest_is_gram(state.as_ref(), 3, 1.5);
            trail.push(if gram { 'G' } else { 'c' });
            let mut g = state.unwrap_or_else(GramState::empty);
            g.grams += gram as u64;
            g.last_was_gram = gram;
            // Each difference 10 with variance 100: the mean is 1 sd per draw, so
            // n draws favour the Gram once sqrt(n) > 1.5 (from the 3rd draw).
            g.select_n += 1;
            g.select_var += 100.0;
            g.select_sum += 10.0;
            state = Some(g);
        }
        assert_eq!(trail, "cGcGcGGGGGGGGG");
        let mut g = state.unwrap();
        g.select_sum = -50.0;
        assert!(!select_rest_is_gram(Some(&g), 3, 1.5));
        // Still exploring: alternates whatever the difference.
        g.grams = 1;
        g.last_was_gram = false;
        assert!(select_rest_is_gram(Some(&g), 3, 1.5));
        g.last_was_gram = true;
        assert!(!select_rest_is_gram(Some(&g), 3, 1.5));
    }

    /// A user with fewer than two rows, or no liked row, does not count; the hidden row
    /// is the liked one of smallest digest.
    #[test]
    fn users_without_two_rows_or_a_liked_row_do_not_count() {
        let mut rng = dprec_dp::rng::seeded(2);
        let (a, b) = lists(&mut rng);
        // Identical lists: every v is 0 whoever counts.
        let (pa, pb) = (ListHits::plain(&a), ListHits::plain(&b));
        assert!(loo_values(&[vec![1, 2, 4]], &[], digest, &pa, &pa)
            .iter()
            .all(|&v| v == 0));
        // Only unliked rows (liked count 0), or a single row: 0 against any list.
        let v = loo_values(&[vec![3, 6], vec![1]], &[0, 1], digest, &pa, &pb);
        assert_eq!(v, vec![0, 0]);
        // The hidden item: an item the counts list ranks first (item 0 is the top of
        // the popularity order) and the other list cannot reach (weights from item 1
        // only push 0 down) gives -1 when it is the liked item hidden.
        let n = 30;
        let cand: Vec<u32> = (0..20).collect();
        let pop: Vec<f64> = (0..20).map(|j| (40 - j) as f64).collect();
        let mut w = vec![0.0; 400];
        for c in 1..20 {
            w[20 + c] = 1.0;
        }
        w[20] = -5.0;
        let down = ItemRanker::new(
            n,
            cand.clone(),
            pop.clone(),
            ItemScorer::ItemItem { b: w },
            0.0,
        );
        let counts = ItemRanker::new(n, cand, pop, ItemScorer::Popularity, 0.0);
        // Row [0, 1], both liked; hide 0 when its digest is the smaller.
        let by = |u: usize, j: u32| {
            let mut d = [0u8; 32];
            d[0] = if j == 0 { 0 } else { 1 };
            let _ = u;
            d
        };
        assert_eq!(
            loo_values(
                &[vec![0, 1]],
                &[2],
                by,
                &ListHits::plain(&down),
                &ListHits::plain(&counts)
            ),
            vec![-1]
        );
        // Item 0 unliked (liked count 1 over [1, 0]): item 1 is hidden instead.
        let v = loo_values(
            &[vec![1, 0]],
            &[1],
            by,
            &ListHits::plain(&down),
            &ListHits::plain(&counts),
        );
        assert_ne!(v, vec![-1]);
    }

    /// Sherman-Morrison is exact: a user's leave-user-out scores equal EASE refitted on the
    /// Gram of the other users' clipped rows (same ridge), for random rows and both clips
    /// (a row over the clip is scaled), and differ from EASE on the whole Gram (the
    /// correction is not vacuous).
    #[test]
    fn leave_user_out_equals_ease_refitted_without_the_user() {
        use crate::train::topn::dp_topn::{ease_inverse, ease_weights, gram};
        let mut rng = dprec_dp::rng::seeded(11);
        let (n, k, lambda) = (30usize, 20usize, 3.0);
        let cand: Vec<u32> = (0..k as u32).collect();
        let pop: Vec<f64> = (0..k).map(|j| (40 - j) as f64).collect();
        let rows: Vec<Vec<u32>> = (0..40)
            .map(|_| {
                (0..n as u32)
                    .filter(|_| rng.random::<f64>() < 0.25)
                    .collect()
            })
            .collect();
        let mut moved = 0;
        for clip in [1.0, 2.0] {
            let whole = gram(&rows, n, &cand, clip);
            let p = ease_inverse(&whole, k, lambda).unwrap();
            let b = ease_weights(&whole, k, lambda).unwrap();
            let full = ItemRanker::new(
                n,
                cand.clone(),
                pop.clone(),
                ItemScorer::ItemItem { b },
                0.3,
            );
            let luo = ListHits::leave_user_out(&full, &p, clip).unwrap();
            for u in 0..rows.len() {
                let mut others = rows.clone();
                others.remove(u);
                let bu = ease_weights(&gram(&others, n, &cand, clip), k, lambda).unwrap();
                let refit = ItemRanker::new(
                    n,
                    cand.clone(),
                    pop.clone(),
                    ItemScorer::ItemItem { b: bu },
                    0.3,
                );
                // Hide the first row item, as the statistic hides one.
                let own: Vec<(usize, f64)> =
                    rows[u].iter().skip(1).map(|&j| (j as usize, 1.0)).collect();
                let (mut got, mut want, mut plain) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
                luo.scores(&own, &rows[u], &mut got);
                refit.score_items(None, &own, &mut want);
                full.score_items(None, &own, &mut plain);
                for j in 0..n {
                    assert!(
                        got[j] == want[j]
                            || (got[j] - want[j]).abs() < 1e-9 * (1.0 + want[j].abs()),
                        "clip {clip} user {u} item {j}: {} vs {}",
                        got[j],
                        want[j]
                    );
                }
                moved += (0..n).any(|j| (got[j] - plain[j]).abs() > 1e-6) as u32;
            }
        }
        assert!(
            moved > 40,
            "the correction moved only {moved} of 80 users' scores"
        );
    }

    /// The fast hit (candidates' scores and the `fill` order) equals the scan over every
    /// item's score, on random lists: with and without `fill`, popularity and item-item,
    /// plain and leave-user-out, with targets inside and outside the candidates, tied
    /// fills, and users who own most candidates (fewer than 10 others left).
    #[test]
    // long: one random table of lists, users and targets, each checked against the scan.
    fn fast_hit_equals_the_scan_over_all_scores() {
        use crate::train::topn::dp_topn::{ease_inverse, ease_weights, gram};
        let mut rng = dprec_dp::rng::seeded(21);
        let (n, k) = (40usize, 16usize);
        let (mut checked, mut hits) = (0, 0);
        for round in 0..30 {
            let cand: Vec<u32> = {
                let mut c: Vec<u32> = (0..n as u32).collect();
                use rand::seq::SliceRandom;
                c.shuffle(&mut rng);
                c.truncate(k);
                c
            };
            let pop: Vec<f64> = (0..k).map(|_| rng.random_range(0..20) as f64).collect();
            // Fill with ties (integer values).
            let fill: Vec<f64> = (0..n).map(|_| rng.random_range(0..8) as f64).collect();
            let rows: Vec<Vec<u32>> = (0..30)
                .map(|_| {
                    (0..n as u32)
                        .filter(|_| rng.random::<f64>() < 0.3)
                        .collect()
                })
                .collect();
            let g = gram(&rows, n, &cand, 1.0);
            let p = ease_inverse(&g, k, 2.0).unwrap();
            let b = ease_weights(&g, k, 2.0).unwrap();
            let with_fill = round % 3 != 0;
            let mk = |scorer: ItemScorer| {
                let r = ItemRanker::new(n, cand.clone(), pop.clone(), scorer, 0.5);
                if with_fill {
                    r.with_fill(fill.clone())
                } else {
                    r
                }
            };
            let ease = mk(ItemScorer::ItemItem { b });
            let counts = mk(ItemScorer::Popularity);
            let lists = [
                ListHits::plain(&ease),
                ListHits::plain(&counts),
                ListHits::leave_user_out(&ease, &p, 1.0).unwrap(),
            ];
            for _ in 0..20 {
                // A user who owns a random share (up to all but 2) of the candidates.
                let share = rng.random::<f64>();
                let row: Vec<u32> = (0..n as u32)
                    .filter(|j| {
                        let in_cand = cand.contains(j);
                        rng.random::<f64>() < if in_cand { share } else { 0.2 }
                    })
                    .collect();
                if row.len() < 2 {
                    continue;
                }
                let target = row[rng.random_range(0..row.len())] as usize;
                let own: Vec<(usize, f64)> = row
                    .iter()
                    .filter(|&&j| j as usize != target)
                    .map(|&j| (j as usize, 1.0))
                    .collect();
                let mut mine = vec![false; n];
                own.iter().for_each(|&(j, _)| mine[j] = true);
                let mut scores = vec![0.0; n];
                for l in &lists {
                    l.scores(&own, &row, &mut scores);
                    let want = hit(&scores, target, &mine);
                    assert_eq!(l.hit(&own, &row, target), want, "round {round}");
                    checked += 1;
                    hits += want as u32;
                }
            }
        }
        assert!(
            checked > 1000 && hits > 100 && hits < checked - 100,
            "{hits} of {checked}"
        );
        // The plain list's scores are the ranker's own.
        let r = ItemRanker::new(5, vec![1, 3], vec![2.0, 1.0], ItemScorer::Popularity, 0.0)
            .with_fill(vec![0.5, 3.0, 0.2, 1.0, 0.9]);
        let (mut a, mut b) = (vec![0.0; 5], vec![0.0; 5]);
        ListHits::plain(&r).scores(&[(3, 1.0)], &[3], &mut a);
        r.score_items(None, &[(3, 1.0)], &mut b);
        assert_eq!(a, b);
    }
}
