//! Top-N lists of an item-side ranker (the default `dp-topn`, [`ItemRanker`]) without
//! work over the whole catalogue per request. What depends only on the release (the
//! order of its DP counts) is computed once when the release is loaded ([`ModelLists`]);
//! what depends on the user's own ratings (their items in this release, their candidates
//! ranked) once per release and per version of those ratings ([`UserLists`], kept with
//! the user's cached facts). A request then merges two ready orders and stops after
//! `offset + n` items, or, for a user the model does not personalise for, reads the DP
//! counts' order without the user's rated items, ready too. The lists are exactly [`Published::top_n`]'s (a test compares
//! them on random models, users, offsets and exclusions).

use std::cmp::Ordering;
use std::sync::Arc;

use super::facts::UserFacts;
pub use super::user_lists::{ListsSlot, UserLists};
use super::user_lists::{Personal, Ranked};
use super::{Exclude, Published, Scored, TopN, TopNQuery};
use crate::model::item_ranker::ItemRanker;
use crate::model::labels::LabelledRanker;
use crate::model::Ranker;

/// A user's cached ranking keeps the best candidates up to this many that the user has
/// not rated (all candidates when fewer), and a user without a personal list this many
/// items of the DP counts' order: deeper pages are computed per request.
const KEEP: usize = 64;

/// The orders of a release's DP counts, for [`ItemRanker`]s with catalogue-wide counts.
#[derive(Debug)]
pub(crate) struct ModelLists {
    /// Every item by descending count (ties to the smaller index): the list of a user
    /// the model does not personalise for.
    by_count: Vec<u32>,
    /// The items outside the candidates as `(term, item)` by descending term (ties to the
    /// smaller index); such an item scores `base + term` ([`ItemRanker::fill_terms`]).
    outside: Vec<(f64, u32)>,
}

impl ModelLists {
    /// `None` when the ranker is not an [`ItemRanker`] with finite catalogue-wide counts
    /// and distinct candidates (such releases are served by [`Published::top_n`]).
    pub(crate) fn of(ranker: &dyn Ranker, n_items: usize) -> Option<Self> {
        let r = item_ranker(ranker)?;
        let terms = r.fill_terms()?;
        if r.fill.len() != n_items || r.fill.iter().any(|f| !f.is_finite()) {
            return None;
        }
        let mut seen = vec![false; n_items];
        for &j in &r.candidates {
            if std::mem::replace(seen.get_mut(j as usize)?, true) {
                return None;
            }
        }
        let mut by_count: Vec<u32> = (0..n_items as u32).collect();
        by_count.sort_unstable_by(|&a, &b| {
            r.fill[b as usize]
                .total_cmp(&r.fill[a as usize])
                .then(a.cmp(&b))
        });
        let mut outside: Vec<(f64, u32)> = (0..n_items)
            .filter(|&j| !seen[j])
            .map(|j| (terms[j], j as u32))
            .collect();
        outside.sort_unstable_by(better);
        Some(Self { by_count, outside })
    }
}

/// The item-side model of a release: the ranker itself, or the inner model of a label
/// model (whose lists are the inner model's where the labels do not reweight them).
fn item_ranker(r: &dyn Ranker) -> Option<&ItemRanker> {
    let any = r.storable()?;
    any.downcast_ref::<ItemRanker>()
        .or_else(|| LabelledRanker::of(r).map(|l| &l.inner))
}

/// A page of a user's list as `(score, item index in the release)`.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexedPage {
    pub items: Vec<(f64, u32)>,
    /// True when the DP counts answered (see [`TopN::fallback`]).
    pub fallback: bool,
}

/// A page of a user's list ([`Published::list_page`]).
#[derive(Debug, Clone)]
pub enum ListPage {
    /// From the ready orders.
    Indexed(IndexedPage),
    /// Computed for this request ([`Published::top_n`]).
    Scored(TopN),
}

impl ListPage {
    pub fn fallback(&self) -> bool {
        match self {
            Self::Indexed(p) => p.fallback,
            Self::Scored(t) => t.fallback,
        }
    }
}

/// Descending score, ties to the smaller item index: the order of
/// [`crate::model::ranker::top_k`].
fn better(a: &(f64, u32), b: &(f64, u32)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// The items outside the candidates in list order for one user's `base`: `base + term`
/// is monotone in the term, so the precomputed order holds except that terms which
/// round to the same score tie and go by index, as in a full sort.
struct Outside<'a> {
    items: &'a [(f64, u32)],
    base: f64,
    /// The current group of equal scores, by descending index (popped from the end).
    group: Vec<(f64, u32)>,
}

impl Iterator for Outside<'_> {
    type Item = (f64, u32);

    fn next(&mut self) -> Option<(f64, u32)> {
        if self.group.is_empty() {
            let (&(t, j), rest) = self.items.split_first()?;
            let s = self.base + t;
            let same = rest
                .iter()
                .take_while(|&&(t, _)| (self.base + t).total_cmp(&s).is_eq())
                .count();
            if same == 0 {
                self.items = rest;
                return Some((s, j));
            }
            self.group
                .extend(self.items[..=same].iter().map(|&(_, j)| (s, j)));
            self.group.sort_unstable_by_key(|b| std::cmp::Reverse(b.1));
            self.items = &self.items[same + 1..];
        }
        self.group.pop()
    }
}

impl Published {
    /// The user's top-N list from the user's cached facts: [`Published::top_n`] with the
    /// user's own ratings and, unless `include_rated`, their rated items excluded; from
    /// the ready orders when the release has them ([`ModelLists`]).
    pub fn top_n_for(
        &self,
        user: &str,
        facts: &UserFacts,
        n: usize,
        offset: usize,
        include_rated: bool,
    ) -> TopN {
        match self.list_page(user, facts, n, offset, include_rated) {
            ListPage::Indexed(p) => self.named(p),
            ListPage::Scored(top) => top,
        }
    }

    /// [`Self::top_n_for`] with the items of the ready orders as indices of this
    /// release, named by the caller from [`Published::items`] (no id copied per item).
    pub fn list_page(
        &self,
        user: &str,
        facts: &UserFacts,
        n: usize,
        offset: usize,
        include_rated: bool,
    ) -> ListPage {
        if let Some(page) = self.cached_page(facts, n, offset, include_rated) {
            return ListPage::Indexed(page);
        }
        ListPage::Scored(self.top_n(&TopNQuery {
            user,
            n,
            offset,
            exclude: if include_rated {
                Exclude::Nothing
            } else {
                Exclude::Rated(facts)
            },
            own: &facts.ratings,
            force_fallback: facts.deleted,
        }))
    }

    fn named(&self, page: IndexedPage) -> TopN {
        TopN {
            items: page
                .items
                .iter()
                .map(|&(score, j)| Scored {
                    item: self.items[j as usize].clone(),
                    score,
                    explanations: None,
                })
                .collect(),
            fallback: page.fallback,
        }
    }

    #[cfg(test)]
    fn cached_top_n(
        &self,
        facts: &UserFacts,
        n: usize,
        offset: usize,
        include_rated: bool,
    ) -> Option<TopN> {
        let page = self.cached_page(facts, n, offset, include_rated)?;
        Some(self.named(page))
    }

    /// The page from the ready orders; `None` when the release has none or the page lies
    /// beyond the user's cached ranking.
    pub(super) fn cached_page(
        &self,
        facts: &UserFacts,
        n: usize,
        offset: usize,
        include_rated: bool,
    ) -> Option<IndexedPage> {
        let model = self.lists.as_ref()?;
        let user = self.user_lists(facts)?;
        let excluded = |j: u32| !include_rated && user.rated.binary_search(&j).is_ok();
        let Some(p) = &user.personal else {
            let counts = &item_ranker(self.ranker.as_deref()?)?.fill;
            let ready = &user.popular;
            let items = if !include_rated
                && (offset.saturating_add(n) <= ready.len() || ready.len() < KEEP)
            {
                ready
                    .iter()
                    .skip(offset)
                    .take(n)
                    .map(|&j| (counts[j as usize], j))
                    .collect()
            } else {
                model
                    .by_count
                    .iter()
                    .filter(|&&j| !excluded(j))
                    .skip(offset)
                    .take(n)
                    .map(|&j| (counts[j as usize], j))
                    .collect()
            };
            return Some(IndexedPage {
                items,
                fallback: true,
            });
        };
        let mut ranked = p
            .ranked
            .iter()
            .filter(|c| include_rated || !c.rated)
            .map(|c| (c.score, c.item));
        let mut outside = Outside {
            items: if p.whole { &[] } else { &model.outside },
            base: p.base,
            group: Vec::new(),
        }
        .filter(|&(_, j)| !excluded(j));
        let (mut a, mut b) = (ranked.next(), outside.next());
        let mut items = Vec::with_capacity(n.min(KEEP));
        for k in 0..offset.saturating_add(n) {
            let next = match (a, b) {
                (None, _) if !p.complete => return None,
                (Some(x), Some(y)) if better(&x, &y).is_gt() => {
                    b = outside.next();
                    y
                }
                (Some(x), _) => {
                    a = ranked.next();
                    x
                }
                (None, Some(y)) => {
                    b = outside.next();
                    y
                }
                (None, None) => break,
            };
            if k >= offset {
                items.push(next);
            }
        }
        Some(IndexedPage {
            items,
            fallback: false,
        })
    }

    /// The user's lists under this release: cached in `facts`, computed on first use.
    pub(super) fn user_lists(&self, facts: &UserFacts) -> Option<Arc<UserLists>> {
        if let Some(u) = facts.lists.0.load_full() {
            if u.release_id == self.release_id {
                return Some(u);
            }
        }
        let r = item_ranker(self.ranker.as_deref()?)?;
        let mut rated: Vec<u32> = facts
            .rated_items()
            .filter_map(|i| self.item_index(i))
            .map(|j| j as u32)
            .collect();
        rated.sort_unstable();
        let own = self.own_indices(facts);
        let whole = LabelledRanker::of(self.ranker.as_deref()?).filter(|l| l.reweights(&own));
        let personal = if let Some(l) = whole {
            Some(whole_ranking(l, &own, &rated))
        } else {
            r.personalises(&own).then(|| {
                let cand = r
                    .candidate_scores(&own, None)
                    .expect("a personal list has candidate scores");
                let lowest = cand.iter().copied().fold(f64::INFINITY, f64::min);
                let mut ranked: Vec<(f64, u32)> = cand
                    .iter()
                    .zip(&r.candidates)
                    .filter(|&(&s, _)| s > f64::NEG_INFINITY)
                    .map(|(&s, &j)| (s, j))
                    .collect();
                ranked.sort_unstable_by(better);
                let all = ranked.len();
                let ranked = cut(ranked, &rated);
                Personal {
                    complete: ranked.len() == all,
                    ranked,
                    base: (if lowest.is_finite() { lowest } else { 0.0 }) - 2.0,
                    whole: false,
                }
            })
        };
        let popular = match (&personal, &self.lists) {
            (None, Some(model)) => model
                .by_count
                .iter()
                .copied()
                .filter(|j| rated.binary_search(j).is_err())
                .take(KEEP)
                .collect(),
            _ => Vec::new(),
        };
        let u = Arc::new(UserLists {
            release_id: self.release_id,
            popular,
            rated,
            source: self.ranker.as_deref()?.personal_source(&own),
            personal,
        });
        facts.lists.0.store(Some(u.clone()));
        Some(u)
    }
}

/// A user's list order (`ranked`, best first) with each item's rated flag (`rated`
/// sorted), cut after the `KEEP`-th unrated item.
fn cut(ranked: Vec<(f64, u32)>, rated: &[u32]) -> Vec<Ranked> {
    let mut unrated = 0;
    ranked
        .into_iter()
        .map(|(score, item)| Ranked {
            score,
            item,
            rated: rated.binary_search(&item).is_ok(),
        })
        .take_while(|c| {
            let more = unrated < KEEP;
            unrated += usize::from(!c.rated);
            more
        })
        .collect()
}

/// A label model's list for a user whose labels reweight it: every item scored once,
/// the best `KEEP` unrated ones (and the rated ones among them) kept in list order.
fn whole_ranking(l: &LabelledRanker, own: &[(usize, f64)], rated: &[u32]) -> Personal {
    let mut scores = vec![0.0; l.n_items()];
    l.score_items(None, own, &mut scores);
    let mut ranked: Vec<(f64, u32)> = scores
        .iter()
        .enumerate()
        .filter(|&(_, &s)| s > f64::NEG_INFINITY)
        .map(|(j, &s)| (s, j as u32))
        .collect();
    let all = ranked.len();
    // At most `KEEP` unrated items precede the cut, so `KEEP + rated` suffice.
    let k = KEEP.saturating_add(rated.len()).min(all);
    if k < all {
        ranked.select_nth_unstable_by(k, better);
        ranked.truncate(k);
    }
    ranked.sort_unstable_by(better);
    let ranked = cut(ranked, rated);
    Personal {
        complete: ranked.len() == all,
        ranked,
        base: f64::NEG_INFINITY,
        whole: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::RatingScale;
    use crate::model::item_ranker::{ItemRanker, ItemScorer};
    use crate::model::labels::LabelLift;
    use crate::model::FactorModel;
    use crate::serve::ReleaseMeta;
    use dprec_dp::charges::Guarantee;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// A random item-side release of `n` items: `k` candidates, an item-item or a
    /// projection scorer, DP counts with ties (whole numbers from a small range).
    fn release(rng: &mut StdRng, n: usize, k: usize) -> Published {
        let mut all: Vec<u32> = (0..n as u32).collect();
        for i in (1..all.len()).rev() {
            all.swap(i, rng.random_range(0..=i));
        }
        let candidates: Vec<u32> = all[..k].to_vec();
        let popularity: Vec<f64> = (0..k).map(|_| rng.random_range(0..20) as f64).collect();
        let scorer = if rng.random_bool(0.5) {
            ItemScorer::ItemItem {
                b: (0..k * k).map(|_| rng.random_range(-1.0..1.0)).collect(),
            }
        } else {
            ItemScorer::Projection {
                d: 2,
                factors: (0..k * 2).map(|_| rng.random_range(-1.0..1.0)).collect(),
            }
        };
        let fill: Vec<f64> = (0..n).map(|_| rng.random_range(-3..12) as f64).collect();
        let r = ItemRanker::new(n, candidates, popularity, scorer, 0.3).with_fill(fill.clone());
        // Half of the releases carry a label model over it (three labels, some items
        // without one): its users with a labelled item get label or fused lists.
        let ranker: Arc<dyn Ranker> = if rng.random_bool(0.5) {
            let item_labels: Vec<Vec<u32>> = (0..n)
                .map(|_| match rng.random_range(0..4) {
                    3 => Vec::new(),
                    g => vec![g],
                })
                .collect();
            let lift = LabelLift {
                item_labels,
                share: vec![0.3, 0.5, 0.2],
                alpha: rng.random_range(1.0..20.0),
                base: fill.iter().map(|&f| f.max(0.5).ln()).collect(),
                names: vec!["a".into(), "b".into(), "c".into()],
            };
            Arc::new(LabelledRanker { inner: r, lift })
        } else {
            Arc::new(r)
        };
        let items: Vec<String> = (0..n).map(|j| format!("i{j}")).collect();
        let meta = ReleaseMeta {
            release_id: 3,
            trainer: "dp-topn".into(),
            guarantee: Guarantee::Proven,
            created_at: 0,
        };
        let model = FactorModel::zeros(0, n, 1, 3.0, RatingScale::ONE_TO_FIVE);
        Published::new(
            meta,
            model,
            Vec::new(),
            items,
            fill.iter().map(|&f| f as i64).collect(),
        )
        .unwrap()
        .with_ranker(Some(ranker))
        .unwrap()
    }

    /// The ready orders give the lists of the reference ([`Published::top_n`]: every
    /// item scored, then sorted) for random users (none, a few or many rated items, some
    /// outside the release, deleted or not), pages and `include_rated`, and deeper pages
    /// than the cached ranking holds, with and without a label model.
    #[test]
    fn cached_lists_are_the_reference_lists() {
        let mut rng = StdRng::seed_from_u64(47);
        let mut fast = 0;
        let mut popular = [0; 2];
        let mut whole = 0;
        for case in 0..60 {
            let n = rng.random_range(1..120);
            let k = rng.random_range(0..=n.min(90));
            let p = release(&mut rng, n, k);
            assert!(p.lists.is_some());
            for _ in 0..8 {
                let rated = rng.random_range(0..=n.min(100));
                let mut ratings: Vec<(String, f64)> = (0..rated)
                    .map(|_| (format!("i{}", rng.random_range(0..n + 5)), 4.0))
                    .collect();
                ratings.sort_by(|a, b| a.0.cmp(&b.0));
                ratings.dedup_by(|a, b| a.0 == b.0);
                let facts = UserFacts::new(rng.random_bool(0.1), ratings);
                for _ in 0..6 {
                    let n_ = rng.random_range(1..40);
                    let offset = if rng.random_bool(0.3) {
                        rng.random_range(0..n + 10)
                    } else {
                        rng.random_range(0..3)
                    };
                    let include_rated = rng.random_bool(0.3);
                    let want = p.top_n(&TopNQuery {
                        user: "u",
                        n: n_,
                        offset,
                        exclude: if include_rated {
                            Exclude::Nothing
                        } else {
                            Exclude::Rated(&facts)
                        },
                        own: &facts.ratings,
                        force_fallback: facts.deleted,
                    });
                    fast +=
                        usize::from(p.cached_top_n(&facts, n_, offset, include_rated).is_some());
                    let user = p.user_lists(&facts).unwrap();
                    whole += usize::from(user.personal.as_ref().is_some_and(|p| p.whole));
                    if user.personal.is_none() && !include_rated {
                        let deep = offset + n_ > user.popular.len();
                        popular[usize::from(deep && user.popular.len() == KEEP)] += 1;
                    }
                    let got = p.top_n_for("u", &facts, n_, offset, include_rated);
                    assert_eq!(got.fallback, want.fallback, "case {case}");
                    assert_eq!(
                        got.items, want.items,
                        "case {case}, offset {offset}, n {n_}"
                    );
                }
            }
        }
        assert!(fast > 2000, "most lists come from the ready orders: {fast}");
        assert!(whole > 300, "label and fused lists: {whole}");
        // Lists of the DP counts' order: from the ready part, and beyond it.
        assert!(popular[0] > 100 && popular[1] > 5, "{popular:?}");
    }

    /// Scores that round to the same value outside the candidates go by index, as in the
    /// reference's full sort, and a newer release recomputes the user's part.
    #[test]
    fn equal_rounded_scores_go_by_index_and_a_new_release_recomputes() {
        let n = 6;
        // Candidate 0; outside it counts that differ by less than the rounding of
        // base + term near 1e16.
        let fill = vec![0.0, 1.0, 1.0 + 1e-9, 1.0 - 1e-9, 1.0, 0.5];
        let r = ItemRanker::new(
            n,
            vec![0],
            vec![1.0],
            ItemScorer::Projection {
                d: 1,
                factors: vec![1e16],
            },
            0.0,
        )
        .with_fill(fill.clone());
        let meta = |id| ReleaseMeta {
            release_id: id,
            trainer: "dp-topn".into(),
            guarantee: Guarantee::Proven,
            created_at: 0,
        };
        let items: Vec<String> = (0..n).map(|j| format!("i{j}")).collect();
        let model = || FactorModel::zeros(0, n, 1, 3.0, RatingScale::ONE_TO_FIVE);
        let r: Arc<dyn Ranker> = Arc::new(r);
        let p = Published::new(meta(1), model(), vec![], items.clone(), vec![0; n])
            .unwrap()
            .with_ranker(Some(r.clone()))
            .unwrap();
        let facts = UserFacts::new(false, vec![("i0".into(), 5.0)]);
        let want = p.top_n(&TopNQuery {
            user: "u",
            n: 10,
            offset: 0,
            exclude: Exclude::Nothing,
            own: &facts.ratings,
            force_fallback: false,
        });
        let got = p.cached_top_n(&facts, 10, 0, true).unwrap();
        assert_eq!(got.items, want.items);
        let first = facts.lists.0.load_full().unwrap();
        let q = Published::new(meta(2), model(), vec![], items, vec![0; n])
            .unwrap()
            .with_ranker(Some(r))
            .unwrap();
        q.cached_top_n(&facts, 10, 0, false).unwrap();
        let second = facts.lists.0.load_full().unwrap();
        assert_eq!((first.release_id, second.release_id), (1, 2));
    }
}
