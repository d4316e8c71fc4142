//! Serving from memory: the registry of the published model (swapped atomically as an
//! `Arc`), top-N recommendations with the DP-popularity fallback, and similar items.

pub mod cold;
pub mod facts;
pub mod lists;
pub mod predict;
pub mod user_lists;

use std::collections::HashSet;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use serde::{Deserialize, Serialize};

use crate::model::ranker::{top_k, SimilarBasis};
use crate::model::{FactorModel, Ranker, StoredRanker};
use dprec_dp::charges::Guarantee;

/// A release's stored model (the `model` column): the factor model and, for trainers
/// served through a ranker (item-side top-N models), that ranker. Rows written before
/// rankers existed are plain factor models and read back with `ranker: None`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredModel {
    #[serde(flatten)]
    pub factors: FactorModel,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranker: Option<StoredRanker>,
}

/// A published release as served: the model and its index maps, all immutable.
#[derive(Debug)]
pub struct Published {
    pub release_id: i64,
    pub trainer: String,
    pub guarantee: Guarantee,
    pub created_at: i64,
    pub model: FactorModel,
    pub users: Vec<String>,
    pub items: Vec<String>,
    user_index: foldhash::HashMap<String, usize>,
    item_index: foldhash::HashMap<String, usize>,
    /// DP (noisy) popularity count per item index.
    pub popularity: Vec<i64>,
    /// Item indices by descending noisy popularity (ties by id).
    by_popularity: Vec<usize>,
    /// Scores a user's list from the user's own ratings (joint DP) when the trainer
    /// published a ranker; `None`: the factor model's user rows answer.
    ranker: Option<Arc<dyn Ranker>>,
    /// Whether the ranker publishes its own DP counts (its non-personal lists are its
    /// popularity); otherwise the release's DP popularity answers them.
    ranker_popularity: bool,
    /// The orders of the ranker's DP counts, ready for [`Published::top_n_for`].
    lists: Option<lists::ModelLists>,
    /// [`Published::predicts_ratings`].
    predicts: bool,
}

/// One top-N request.
#[derive(Debug, Clone, Copy)]
pub struct TopNQuery<'a> {
    pub user: &'a str,
    pub n: usize,
    pub offset: usize,
    pub exclude: Exclude<'a>,
    /// The user's own current ratings `(item, value)`.
    pub own: &'a [facts::OwnRating],
    /// Answer with popularity whatever the user's data (a deleted user).
    pub force_fallback: bool,
}

/// The items a list leaves out.
#[derive(Debug, Clone, Copy)]
pub enum Exclude<'a> {
    Nothing,
    Items(&'a HashSet<String>),
    /// The items the user of these facts rated.
    Rated(&'a facts::UserFacts),
}

impl Exclude<'_> {
    fn contains(&self, item: &str) -> bool {
        match self {
            Self::Nothing => false,
            Self::Items(s) => s.contains(item),
            Self::Rated(f) => f.rated(item),
        }
    }

    fn items(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        match self {
            Self::Nothing => Box::new(std::iter::empty()),
            Self::Items(s) => Box::new(s.iter().map(|i| i.as_str())),
            Self::Rated(f) => Box::new(f.rated_items()),
        }
    }
}

/// Identity of a served release.
#[derive(Debug, Clone)]
pub struct ReleaseMeta {
    pub release_id: i64,
    pub trainer: String,
    /// Proven or non-private.
    pub guarantee: Guarantee,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// The DP popularity stored with a release.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Popularity {
    pub eps: f64,
    /// Noisy count per item, aligned with the release's item list.
    pub counts: Vec<i64>,
}

/// One scored item.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub item: String,
    pub score: f64,
    /// The user's own rated items that moved this score most ([`Ranker::explain`]);
    /// `None` when the served model does not explain.
    pub explanations: Option<Vec<Explanation>>,
}

/// One of the asking user's own rated items and its term in a recommended item's score.
#[derive(Debug, Clone, PartialEq)]
pub struct Explanation {
    pub item: String,
    /// The user's current rating of it.
    pub rating: f64,
    pub contribution: f64,
}

/// The answer of [`Published::top_n`].
#[derive(Debug, Clone)]
pub struct TopN {
    pub items: Vec<Scored>,
    /// True when the DP popularity answered (no published profile for the user).
    pub fallback: bool,
}

impl Published {
    pub fn new(
        meta: ReleaseMeta,
        model: FactorModel,
        users: Vec<String>,
        items: Vec<String>,
        popularity: Vec<i64>,
    ) -> anyhow::Result<Self> {
        anyhow::ensure!(
            popularity.len() == items.len(),
            "popularity has {} counts for {} items",
            popularity.len(),
            items.len()
        );
        anyhow::ensure!(
            model.item_bias.len() <= items.len() && model.user_bias.len() <= users.len(),
            "model dimensions do not match the id lists"
        );
        let user_index = users
            .iter()
            .enumerate()
            .map(|(i, u)| (u.clone(), i))
            .collect();
        let item_index = items
            .iter()
            .enumerate()
            .map(|(i, u)| (u.clone(), i))
            .collect();
        let mut by_popularity: Vec<usize> = (0..items.len()).collect();
        by_popularity.sort_by(|&a, &b| {
            popularity[b]
                .cmp(&popularity[a])
                .then(items[a].cmp(&items[b]))
        });
        Ok(Self {
            release_id: meta.release_id,
            trainer: meta.trainer,
            guarantee: meta.guarantee,
            created_at: meta.created_at,
            model,
            users,
            items,
            user_index,
            item_index,
            popularity,
            by_popularity,
            ranker: None,
            ranker_popularity: false,
            lists: None,
            predicts: true,
        })
    }

    /// Serves lists through `ranker` (its item indices are this release's).
    pub fn with_ranker(mut self, ranker: Option<Arc<dyn Ranker>>) -> anyhow::Result<Self> {
        if let Some(r) = &ranker {
            anyhow::ensure!(
                r.n_items() == self.items.len(),
                "the ranker scores {} items, the release has {}",
                r.n_items(),
                self.items.len()
            );
        }
        self.ranker_popularity = ranker
            .as_ref()
            .is_some_and(|r| r.popularity_counts().is_some());
        self.lists = ranker
            .as_deref()
            .and_then(|r| lists::ModelLists::of(r, self.items.len()));
        self.predicts = Self::ranker_predicts(ranker.as_deref());
        self.ranker = ranker;
        Ok(self)
    }

    /// The noise sd of the sum of [`Published::popularity`] when the served ranker states
    /// it: its counts are the filter's estimates ([`Ranker::count_history`]), whose
    /// variances are public (functions of the releases' noise scales and the plan's
    /// drift), plus each count's rounding to a whole number (1/12). `None` when the
    /// counts carry no stated noise (a separate DP popularity release, or a ranker
    /// without a filter state).
    pub fn popularity_total_sd(&self) -> Option<f64> {
        if !self.ranker_popularity {
            return None;
        }
        let h = self.ranker.as_ref()?.count_history()?;
        (h.var.len() == self.popularity.len() && h.var.iter().all(|v| v.is_finite()))
            .then(|| h.var.iter().map(|v| v + 1.0 / 12.0).sum::<f64>().sqrt())
    }

    /// What a personal list of the user of `facts` is made of (the API's `source` when
    /// `fallback` is false): the served ranker's [`Ranker::personal_source`], `profile`
    /// for a factor model. From the user's ready lists when the release has them.
    pub fn personal_source(&self, facts: &facts::UserFacts) -> &'static str {
        let Some(r) = &self.ranker else {
            return "profile";
        };
        if let Some(u) = self.lists.as_ref().and_then(|_| self.user_lists(facts)) {
            return u.source;
        }
        r.personal_source(&self.own_indices(facts))
    }

    /// Whether lists come from a ranker over the user's own ratings.
    pub fn has_ranker(&self) -> bool {
        self.ranker.is_some()
    }

    pub fn user_index(&self, user: &str) -> Option<usize> {
        self.user_index.get(user).copied()
    }

    pub fn item_index(&self, item: &str) -> Option<usize> {
        self.item_index.get(item).copied()
    }

    /// Whether the model has a DP profile for `user`.
    pub fn has_profile(&self, user: &str) -> bool {
        self.user_index
            .get(user)
            .is_some_and(|&u| u < self.model.user_bias.len())
    }

    /// Top-N items for the query's user (skipping `offset`), excluding `exclude`. With a
    /// ranker: scored from the published model and the user's own ratings, the same list
    /// function as `eval` ([`top_k`]). Otherwise users without a published profile (or
    /// `force_fallback`) get the DP popularity order.
    pub fn top_n(&self, q: &TopNQuery<'_>) -> TopN {
        if let Some(r) = &self.ranker {
            return self.ranked(r.as_ref(), q);
        }
        let TopNQuery {
            user,
            n,
            offset,
            exclude,
            force_fallback,
            ..
        } = *q;
        let profile = if force_fallback {
            None
        } else {
            self.user_index(user)
                .filter(|&u| u < self.model.user_bias.len())
        };
        let keep = |j: &usize| !exclude.contains(&self.items[*j]);
        match profile {
            Some(u) => {
                let mut scored: Vec<(usize, f64)> = (0..self.items.len())
                    .filter(keep)
                    .map(|j| (j, self.model.score(u, j)))
                    .collect();
                let order = |a: &(usize, f64), b: &(usize, f64)| {
                    b.1.total_cmp(&a.1)
                        .then_with(|| self.items[a.0].cmp(&self.items[b.0]))
                };
                // Only the first offset + n are needed: partition them out in O(items),
                // then sort just those (the catalogue can be tens of thousands of items).
                let k = offset.saturating_add(n);
                if k < scored.len() {
                    scored.select_nth_unstable_by(k, order);
                    scored.truncate(k);
                }
                scored.sort_by(order);
                TopN {
                    items: scored
                        .into_iter()
                        .skip(offset)
                        .take(n)
                        .map(|(j, s)| Scored {
                            item: self.items[j].clone(),
                            score: s,
                            explanations: None,
                        })
                        .collect(),
                    fallback: false,
                }
            }
            None => self.popular(q),
        }
    }

    /// The release's DP popularity order (the fallback list).
    fn popular(&self, q: &TopNQuery<'_>) -> TopN {
        TopN {
            items: self
                .by_popularity
                .iter()
                .filter(|&&j| !q.exclude.contains(&self.items[j]))
                .skip(q.offset)
                .take(q.n)
                .map(|&j| Scored {
                    item: self.items[j].clone(),
                    score: self.popularity[j] as f64,
                    explanations: None,
                })
                .collect(),
            fallback: true,
        }
    }

    /// A ranker's list: the user's rated items in this release's indices score the
    /// candidates; when they give it nothing, the ranker's own DP popularity answers, or
    /// the release's DP popularity for a ranker without counts (a neighbourhood model).
    /// A personal item carries the ranker's explanation (the user's own items only).
    fn ranked(&self, r: &dyn Ranker, q: &TopNQuery<'_>) -> TopN {
        let own: Vec<(usize, f64)> = if q.force_fallback {
            Vec::new()
        } else {
            q.own
                .iter()
                .filter_map(|(i, v)| self.item_index(i).map(|j| (j, *v)))
                .collect()
        };
        let personal = r.personalises(&own);
        if !personal && !self.ranker_popularity {
            return self.popular(q);
        }
        let mut scores = vec![0.0; r.n_items()];
        r.score_items(None, &own, &mut scores);
        let mut excluded = vec![false; self.items.len()];
        for j in q.exclude.items().filter_map(|i| self.item_index(i)) {
            excluded[j] = true;
        }
        let list = top_k(&scores, &excluded, q.offset.saturating_add(q.n));
        TopN {
            items: list
                .into_iter()
                .skip(q.offset)
                .map(|j| Scored {
                    item: self.items[j].clone(),
                    score: scores[j],
                    explanations: if personal {
                        r.explain(&own, j).map(|e| self.explanations(&own, e))
                    } else {
                        None
                    },
                })
                .collect(),
            fallback: !personal,
        }
    }

    /// A ranker's `(item index, contribution)` pairs with ids and the user's ratings.
    fn explanations(&self, own: &[(usize, f64)], e: Vec<(usize, f64)>) -> Vec<Explanation> {
        e.into_iter()
            .map(|(k, contribution)| Explanation {
                item: self.items[k].clone(),
                rating: own
                    .iter()
                    .find(|&&(j, _)| j == k)
                    .map_or(f64::NAN, |&(_, v)| v),
                contribution,
            })
            .collect()
    }

    /// This release's model re-indexed for new id lists (`users`, `items` in the new
    /// release's index order): rows are copied by id, unknown ids get zero rows. A
    /// trainer's `prior` must be indexed like its training data.
    pub fn reindexed(&self, users: &[String], items: &[String]) -> FactorModel {
        let m = &self.model;
        let d = m.rank();
        let mut out = FactorModel::zeros(users.len(), items.len(), d, m.global_mean, m.scale);
        for (new, id) in users.iter().enumerate() {
            if let Some(old) = self.user_index(id).filter(|&u| u < m.user_bias.len()) {
                out.user_bias[new] = m.user_bias[old];
                if old < m.user_factors.nrows() {
                    out.user_factors
                        .row_mut(new)
                        .assign(&m.user_factors.row(old));
                }
            }
        }
        for (new, id) in items.iter().enumerate() {
            if let Some(old) = self.item_index(id).filter(|&j| j < m.item_bias.len()) {
                out.item_bias[new] = m.item_bias[old];
                if old < m.item_factors.nrows() {
                    out.item_factors
                        .row_mut(new)
                        .assign(&m.item_factors.row(old));
                }
            }
        }
        out
    }

    /// The served ranker's counts filter state ([`Ranker::count_history`]), re-indexed to
    /// `items` by id (an item this release did not have starts with no earlier count).
    pub fn count_history(&self, items: &[String]) -> Option<crate::model::history::CountHistory> {
        let h = self.ranker.as_ref()?.count_history()?;
        Some(h.reindexed(items.len(), |j| self.item_index(&items[j])))
    }

    /// Items most similar to `item`: by the served ranker's own DP item-item statistics
    /// when it has them ([`Ranker::similar`]: a neighbourhood model's `s_ij`, or a top-N
    /// model's neighbours among its candidates from its DP Gram), else by
    /// cosine similarity of the DP item profiles. An item the model has no DP profile for
    /// (a zero row, a model without factors, or an item registered after the release)
    /// gets the release's DP popularity order instead ([`SimilarSource::Popularity`]):
    /// the answer depends on the published model only, never on whether anyone rated the
    /// item (issue 8 finding 1). Whether the item is in the catalogue at all is the
    /// caller's question (the store's).
    pub fn similar(&self, item: &str, n: usize) -> Similar {
        let Some(j) = self.item_index(item) else {
            return self.similar_by_popularity(None, n);
        };
        if let Some((basis, list)) = self.ranker.as_ref().and_then(|r| r.similar(j, n)) {
            return Similar {
                items: list.into_iter().map(|(k, s)| self.scored(k, s)).collect(),
                source: match basis {
                    SimilarBasis::Weights => SimilarSource::Weights,
                    SimilarBasis::Gram => SimilarSource::Gram,
                },
            };
        }
        let f = &self.model.item_factors;
        let norm = |k: usize| f.row(k).dot(&f.row(k)).sqrt();
        if f.ncols() == 0 || j >= f.nrows() || norm(j) == 0.0 {
            return self.similar_by_popularity(Some(j), n);
        }
        let nj = norm(j);
        let mut scored: Vec<(usize, f64)> = (0..f.nrows())
            .filter(|&k| k != j)
            .map(|k| {
                let d = nj * norm(k);
                let s = if d > 0.0 {
                    f.row(j).dot(&f.row(k)) / d
                } else {
                    0.0
                };
                (k, s)
            })
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        Similar {
            items: scored
                .into_iter()
                .take(n)
                .map(|(k, s)| self.scored(k, s))
                .collect(),
            source: SimilarSource::Profiles,
        }
    }

    fn scored(&self, k: usize, score: f64) -> Scored {
        Scored {
            item: self.items[k].clone(),
            score,
            explanations: None,
        }
    }

    /// The DP popularity order without `item` (scores: the DP counts).
    fn similar_by_popularity(&self, item: Option<usize>, n: usize) -> Similar {
        Similar {
            items: self
                .by_popularity
                .iter()
                .filter(|&&k| Some(k) != item)
                .take(n)
                .map(|&k| self.scored(k, self.popularity[k] as f64))
                .collect(),
            source: SimilarSource::Popularity,
        }
    }
}

/// Where a similar-items list comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimilarSource {
    /// A neighbourhood model's DP item-item weights.
    Weights,
    /// Cosine of the rows of a top-N model's DP Gram (its candidates only).
    Gram,
    /// Cosine similarity of the DP item profiles.
    Profiles,
    /// The release's DP popularity (the model has no DP profile for the item).
    Popularity,
    /// The release's items sharing the public labels of an item registered after it
    /// ([`cold`]).
    Labels,
}

impl SimilarSource {
    pub fn name(self) -> &'static str {
        match self {
            Self::Weights => "weights",
            Self::Gram => "gram",
            Self::Profiles => "profiles",
            Self::Popularity => "popularity",
            Self::Labels => "labels",
        }
    }
}

/// The answer of [`Published::similar`].
#[derive(Debug, Clone)]
pub struct Similar {
    pub items: Vec<Scored>,
    pub source: SimilarSource,
}

/// Holds the served model; readers get an `Arc` to a whole release, never a partial one.
#[derive(Default)]
pub struct Registry {
    current: ArcSwapOption<Published>,
    /// Items registered after a release, ranked by its label model ([`cold`]).
    cold: ArcSwapOption<crate::model::labels::ColdItems>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn current(&self) -> Option<Arc<Published>> {
        self.current.load_full()
    }

    /// Swaps in a newer release (an older one never replaces a newer one).
    pub fn publish(&self, p: Arc<Published>) {
        self.current.rcu(|cur| match cur {
            Some(c) if c.release_id > p.release_id => Some(c.clone()),
            _ => Some(p.clone()),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::RatingScale;

    const NO_RATINGS: &[facts::OwnRating] = &[];

    fn q<'a>(
        user: &'a str,
        n: usize,
        offset: usize,
        exclude: &'a HashSet<String>,
        force_fallback: bool,
    ) -> TopNQuery<'a> {
        TopNQuery {
            user,
            n,
            offset,
            exclude: Exclude::Items(exclude),
            own: NO_RATINGS,
            force_fallback,
        }
    }

    fn published() -> Published {
        let mut m = FactorModel::zeros(2, 3, 1, 3.0, RatingScale::ONE_TO_FIVE);
        m.item_factors[[0, 0]] = 1.0;
        m.item_factors[[1, 0]] = 2.0;
        m.item_factors[[2, 0]] = -1.0;
        m.user_factors[[0, 0]] = 1.0;
        m.user_factors[[1, 0]] = -1.0;
        Published::new(
            ReleaseMeta {
                release_id: 1,
                trainer: "t".into(),
                guarantee: Guarantee::Proven,
                created_at: 0,
            },
            m,
            vec!["u0".into(), "u1".into()],
            vec!["a".into(), "b".into(), "c".into()],
            vec![5, 1, 9],
        )
        .unwrap()
    }

    #[test]
    fn top_n_ranks_by_score_and_excludes() {
        let p = published();
        let none = HashSet::new();
        let t = p.top_n(&q("u0", 2, 0, &none, false));
        assert!(!t.fallback);
        assert_eq!(
            t.items.iter().map(|s| s.item.as_str()).collect::<Vec<_>>(),
            ["b", "a"]
        );
        let ex: HashSet<String> = ["b".to_string()].into();
        let t = p.top_n(&q("u1", 5, 0, &ex, false));
        assert_eq!(
            t.items.iter().map(|s| s.item.as_str()).collect::<Vec<_>>(),
            ["c", "a"]
        );
        let t = p.top_n(&q("u0", 5, 1, &none, false));
        assert_eq!(t.items.len(), 2);
        // offset + n below the catalogue size takes the partial-selection path.
        let t = p.top_n(&q("u0", 1, 1, &none, false));
        assert_eq!(
            t.items.iter().map(|s| s.item.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
    }

    #[test]
    fn unknown_users_get_popularity() {
        let p = published();
        let t = p.top_n(&q("new", 3, 0, &HashSet::new(), false));
        assert!(t.fallback);
        assert_eq!(
            t.items.iter().map(|s| s.item.as_str()).collect::<Vec<_>>(),
            ["c", "a", "b"]
        );
        assert!(p.top_n(&q("u0", 3, 0, &HashSet::new(), true)).fallback);
    }

    #[test]
    fn similar_uses_cosine() {
        let p = published();
        let s = p.similar("a", 2);
        assert_eq!(s.source, SimilarSource::Profiles);
        assert_eq!(s.items[0].item, "b");
        assert!((s.items[0].score - 1.0).abs() < 1e-12);
        // No profile in the model (not in the release): the DP popularity order.
        let s = p.similar("zz", 2);
        assert_eq!(s.source, SimilarSource::Popularity);
        let names: Vec<&str> = s.items.iter().map(|x| x.item.as_str()).collect();
        assert_eq!(names, ["c", "a"]);
    }

    #[test]
    fn similar_of_an_item_without_a_profile_is_popularity_without_it() {
        let mut m = FactorModel::zeros(0, 3, 1, 3.0, RatingScale::ONE_TO_FIVE);
        m.item_factors[[0, 0]] = 1.0;
        m.item_factors[[1, 0]] = 2.0;
        let meta = ReleaseMeta {
            release_id: 1,
            trainer: "t".into(),
            guarantee: Guarantee::Proven,
            created_at: 0,
        };
        let items = vec!["a".into(), "b".into(), "c".into()];
        let p = Published::new(meta, m, vec![], items, vec![5, 1, 9]).unwrap();
        let s = p.similar("c", 5);
        assert_eq!(s.source, SimilarSource::Popularity);
        let names: Vec<&str> = s.items.iter().map(|x| x.item.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(s.items[0].score, 5.0);
        assert_eq!(p.similar("a", 5).source, SimilarSource::Profiles);
    }

    #[test]
    fn reindexed_copies_rows_by_id() {
        let p = published();
        let m = p.reindexed(
            &["u1".into(), "new".into()],
            &["c".into(), "zz".into(), "a".into()],
        );
        assert_eq!(m.user_factors[[0, 0]], -1.0);
        assert_eq!(m.user_factors[[1, 0]], 0.0);
        assert_eq!(m.item_factors[[0, 0]], -1.0);
        assert_eq!(m.item_factors[[1, 0]], 0.0);
        assert_eq!(m.item_factors[[2, 0]], 1.0);
        assert_eq!(m.global_mean, 3.0);
    }

    #[test]
    fn registry_never_goes_back() {
        let r = Registry::new();
        assert!(r.current().is_none());
        let mut a = published();
        a.release_id = 2;
        r.publish(Arc::new(a));
        r.publish(Arc::new(published()));
        assert_eq!(r.current().unwrap().release_id, 2);
    }
}
