//! Ranking metrics: how the top-N lists a model serves feel to users (DESIGN 6a).
//!
//! Protocol (the one of issue 13, used for every model through [`Ranker`]):
//! - a test user counts when it has at least one held-out rating `>= relevant_min`
//!   (default 4 on a 1..5 scale); those items are its relevant set;
//! - the user's list is the top `k` items by the ranker's score, computed from the model
//!   and the user's own TRAINING ratings (as the service would), with the items the user
//!   rated in training excluded; items scored `-inf` (not candidates) are never listed,
//!   so a list may be shorter than `k`; ties go to the smaller item index;
//! - precision@k = hits / k, recall@k = hits / |relevant|, NDCG@k with binary gains
//!   `1 / log2(rank + 1)` normalised by the ideal DCG of `min(|relevant|, k)` hits;
//!   each is averaged over the counted users;
//! - catalogue coverage = distinct items in any list / items in the index space;
//! - mean popularity = mean number of training ratings of the listed items (over all
//!   list entries).
//!
//! [`ranking_metrics`] is the one entry point; it takes any [`Ranker`], so every trainer
//! (factor models, item-item, projection, popularity) is measured by the same code.

use serde::{Deserialize, Serialize};

use dprec::data::{Interactions, Ratings};
use dprec::train::Ranker;

/// Settings of [`ranking_metrics`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankingConfig {
    /// List length (the "@k").
    pub k: usize,
    /// A held-out rating at or above this value is relevant.
    pub relevant_min: f64,
    /// Evaluate at most this many test users (a seeded, evenly spaced subset of the
    /// qualifying users, for very large data); `None`: all of them.
    pub max_users: Option<usize>,
}

impl Default for RankingConfig {
    fn default() -> Self {
        Self {
            k: 10,
            relevant_min: 4.0,
            max_users: None,
        }
    }
}

/// Ranking quality of one model on one fold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankingMetrics {
    pub k: usize,
    pub precision: f64,
    pub recall: f64,
    pub ndcg: f64,
    /// Distinct listed items / items in the index space.
    pub coverage: f64,
    /// Number of distinct listed items.
    pub distinct_items: usize,
    /// Mean training-rating count of the listed items.
    pub mean_popularity: f64,
    /// Test users counted (those with a relevant held-out item).
    pub users: usize,
}

/// The list function the service uses too (serving equals eval).
pub use dprec::model::ranker::top_k;

/// Precision, recall and NDCG at `k` of one list against a relevant set.
pub fn list_metrics(list: &[usize], relevant: &[usize], k: usize) -> (f64, f64, f64) {
    if relevant.is_empty() || k == 0 {
        return (0.0, 0.0, 0.0);
    }
    let mut hits = 0usize;
    let mut dcg = 0.0;
    for (rank, j) in list.iter().take(k).enumerate() {
        if relevant.contains(j) {
            hits += 1;
            dcg += 1.0 / ((rank + 2) as f64).log2();
        }
    }
    let ideal: f64 = (0..relevant.len().min(k))
        .map(|rank| 1.0 / ((rank + 2) as f64).log2())
        .sum();
    (
        hits as f64 / k as f64,
        hits as f64 / relevant.len() as f64,
        dcg / ideal,
    )
}

/// User `u`'s training ratings as a ranker reads them (item index, value); none for a
/// user outside `train`.
pub fn own_ratings(train: &Interactions, u: usize) -> Vec<(usize, f64)> {
    if u >= train.by_user.n_rows() {
        return Vec::new();
    }
    let (items, values) = train.by_user.row(u);
    items
        .iter()
        .zip(values)
        .map(|(&j, &v)| (j as usize, v as f64))
        .collect()
}

/// Ranking metrics of `ranker` on `test`, with the user's `train` ratings as its own
/// data (see the module docs for the protocol).
pub fn ranking_metrics(
    ranker: &dyn Ranker,
    train: &Interactions,
    test: &Ratings,
    cfg: &RankingConfig,
) -> RankingMetrics {
    let n_items = ranker.n_items().max(train.n_items).max(test.n_items);
    // Relevant held-out items per user.
    let mut relevant: Vec<Vec<usize>> = vec![Vec::new(); test.n_users.max(train.n_users)];
    for k in 0..test.len() {
        if test.values[k] as f64 >= cfg.relevant_min {
            relevant[test.users[k] as usize].push(test.items[k] as usize);
        }
    }
    let mut users: Vec<usize> = (0..relevant.len())
        .filter(|&u| !relevant[u].is_empty())
        .collect();
    if let Some(m) = cfg.max_users {
        if users.len() > m && m > 0 {
            let step = users.len() as f64 / m as f64;
            users = (0..m).map(|i| users[(i as f64 * step) as usize]).collect();
        }
    }
    let pop: Vec<usize> = (0..n_items)
        .map(|j| {
            if j < train.by_item().n_rows() {
                train.by_item().row_len(j)
            } else {
                0
            }
        })
        .collect();
    let mut scores = vec![0.0; ranker.n_items()];
    let mut excluded = vec![false; n_items];
    let mut listed = vec![false; n_items];
    let (mut p, mut r, mut g) = (0.0, 0.0, 0.0);
    let (mut pop_sum, mut entries) = (0.0, 0usize);
    for &u in &users {
        let own = own_ratings(train, u);
        for &(j, _) in &own {
            excluded[j] = true;
        }
        let user = (u < train.n_users).then_some(u);
        ranker.score_items(user, &own, &mut scores);
        let list = top_k(&scores, &excluded, cfg.k);
        for &(j, _) in &own {
            excluded[j] = false;
        }
        let (pu, ru, gu) = list_metrics(&list, &relevant[u], cfg.k);
        p += pu;
        r += ru;
        g += gu;
        for &j in &list {
            listed[j] = true;
            pop_sum += pop[j] as f64;
            entries += 1;
        }
    }
    let n = users.len().max(1) as f64;
    let distinct = listed.iter().filter(|&&x| x).count();
    RankingMetrics {
        k: cfg.k,
        precision: p / n,
        recall: r / n,
        ndcg: g / n,
        coverage: distinct as f64 / n_items.max(1) as f64,
        distinct_items: distinct,
        mean_popularity: pop_sum / entries.max(1) as f64,
        users: users.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores item j as `weights[j]`, whatever the user.
    #[derive(Debug)]
    struct Fixed(Vec<f64>);

    impl Ranker for Fixed {
        fn n_items(&self) -> usize {
            self.0.len()
        }
        fn score_items(&self, _: Option<usize>, _: &[(usize, f64)], out: &mut [f64]) {
            out.copy_from_slice(&self.0);
        }
        fn predict(&self, _: Option<usize>, _: &[(usize, f64)], _: usize) -> Option<f64> {
            None
        }
    }

    #[test]
    fn top_k_orders_by_score_then_index_and_skips() {
        let s = [1.0, 3.0, 3.0, f64::NEG_INFINITY, 2.0, 0.5];
        let ex = [false, false, false, false, false, true];
        assert_eq!(top_k(&s, &ex, 3), vec![1, 2, 4]);
        assert_eq!(top_k(&s, &ex, 10), vec![1, 2, 4, 0]);
        assert_eq!(top_k(&s, &ex, 0), Vec::<usize>::new());
    }

    /// A hand-computed example. Items 0..6 scored 6,5,4,3,2,1,0 (item 0 best).
    /// User 0 trained on item 0 (excluded), test: item 1 (5, relevant), item 3 (4,
    /// relevant), item 5 (2, not relevant). k = 3: list [1, 2, 3] -> hits at ranks 1 and
    /// 3: precision 2/3, recall 2/2, DCG = 1 + 1/log2(4) = 1.5, IDCG = 1 + 1/log2(3).
    /// User 1 trained on items 1, 2; test: item 6 (5, relevant). List [0, 3, 4]: no hit.
    /// User 2 has only a non-relevant test rating: not counted.
    #[test]
    fn metrics_match_a_hand_computed_example() {
        let mut train = Ratings::with_dims(3, 7);
        train.push(0, 0, 4.0);
        train.push(1, 1, 3.0);
        train.push(1, 2, 5.0);
        train.push(2, 0, 1.0);
        let mut test = Ratings::with_dims(3, 7);
        test.push(0, 1, 5.0);
        test.push(0, 3, 4.0);
        test.push(0, 5, 2.0);
        test.push(1, 6, 5.0);
        test.push(2, 4, 3.0);
        let m = Interactions::new(&train);
        let ranker = Fixed(vec![6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]);
        let cfg = RankingConfig {
            k: 3,
            ..RankingConfig::default()
        };
        let got = ranking_metrics(&ranker, &m, &test, &cfg);
        let idcg = 1.0 + 1.0 / 3f64.log2();
        assert_eq!(got.users, 2);
        assert!((got.precision - (2.0 / 3.0) / 2.0).abs() < 1e-12, "{got:?}");
        assert!((got.recall - 0.5).abs() < 1e-12, "{got:?}");
        assert!((got.ndcg - (1.5 / idcg) / 2.0).abs() < 1e-12, "{got:?}");
        // Listed: {1, 2, 3} and {0, 3, 4} -> 5 distinct of 7 items.
        assert_eq!(got.distinct_items, 5);
        assert!((got.coverage - 5.0 / 7.0).abs() < 1e-12);
        // Training counts: item 0: 2, items 1, 2: 1, others 0. Lists hold 1,2,3 and 0,3,4.
        assert!((got.mean_popularity - (1.0 + 1.0 + 0.0 + 2.0 + 0.0 + 0.0) / 6.0).abs() < 1e-12);
    }

    #[test]
    fn perfect_list_scores_one() {
        let (p, r, g) = list_metrics(&[4, 7], &[7, 4], 2);
        assert_eq!((p, r, g), (1.0, 1.0, 1.0));
        let (p, r, g) = list_metrics(&[1, 2], &[3], 2);
        assert_eq!((p, r, g), (0.0, 0.0, 0.0));
    }
}
