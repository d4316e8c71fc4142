//! Items registered after the served release (cold items): the release holds no DP count
//! for them, but the catalogue gives their labels, which are public. Where the served
//! model has a label model ([`crate::model::labels::LabelLift`]), a user whose list the
//! label model answers gets these items scored on the same scale as the release's: their
//! labels' typical count plus the user's own label lift. In a fused list (the item-side
//! list and the label list) they hold the label half of the fusion only, at the rank their
//! label score takes among the release's items. A cold item's similar items are
//! the release's items that share its labels. Everything here is a function of the
//! published model, the public catalogue and the asking user's own ratings: no charge.
//!
//! The set is read from the store after each registration through this process, after each
//! release is swapped in and every `reload_secs` (`release::cold_items`); it belongs to one
//! release and is ignored under another.

use std::collections::HashSet;
use std::sync::Arc;

use crate::model::catalogue::ItemInfo;
use crate::model::labels::{ColdItems, LabelledRanker};

use super::facts::UserFacts;
use super::{Published, Registry, Scored, Similar, SimilarSource, TopN};

impl Registry {
    /// The cold items of the served release, when they were read for it.
    pub fn cold(&self) -> Option<Arc<ColdItems>> {
        let cold = self.cold.load_full()?;
        let current = self.current()?;
        (cold.release_id == current.release_id && !cold.is_empty()).then_some(cold)
    }
}

impl Registry {
    /// Ranks the catalogue items of `registered` (those registered since the served release
    /// started) that the release does not hold by its label model, and keeps them for
    /// it; how many. Nothing without a served label model.
    pub fn set_cold_items(&self, registered: &[ItemInfo]) -> usize {
        let Some(p) = self.current() else {
            return 0;
        };
        let Some(lift) = p
            .ranker
            .as_deref()
            .and_then(LabelledRanker::of)
            .and_then(|l| l.label_model())
        else {
            self.cold.store(None);
            return 0;
        };
        let cold = lift.cold_items(
            p.release_id,
            registered
                .iter()
                .filter(|i| p.item_index(&i.id).is_none())
                .map(|i| (i.id.as_str(), i.labels.as_slice())),
        );
        let n = cold.ids.len();
        // A newer release may have been swapped in meanwhile: its set is read next time.
        self.cold.store(Some(Arc::new(cold)));
        n
    }

    /// When the served release started (the items registered since may be outside it).
    pub fn served_since(&self) -> Option<i64> {
        self.current().map(|p| p.created_at)
    }
}

impl Published {
    /// [`Published::top_n_for`] with the cold items merged by score where the user's list
    /// is the label list or the fused list ([`crate::model::labels::ColdScale`]; a cold item the user rated is
    /// left out unless `include_rated`); the list is otherwise unchanged.
    pub fn top_n_with_cold(
        &self,
        cold: Option<&ColdItems>,
        user: &str,
        facts: &UserFacts,
        n: usize,
        offset: usize,
        include_rated: bool,
    ) -> TopN {
        let scale = cold
            .filter(|c| c.release_id == self.release_id && !c.is_empty() && !facts.deleted)
            .and_then(|c| {
                Some((
                    c,
                    LabelledRanker::of(self.ranker.as_deref()?)?
                        .cold_scale(&self.own_indices(facts), c)?,
                ))
            });
        let Some((cold, scale)) = scale else {
            return self.top_n_for(user, facts, n, offset, include_rated);
        };
        let k = offset.saturating_add(n);
        let mut top = self.top_n_for(user, facts, k, 0, include_rated);
        let rated: HashSet<&str> = if include_rated {
            HashSet::new()
        } else {
            facts.ratings.iter().map(|(i, _)| &**i).collect()
        };
        top.items.extend(
            cold.ids
                .iter()
                .enumerate()
                .filter(|(_, id)| !rated.contains(id.as_str()))
                .map(|(c, id)| Scored {
                    item: id.clone(),
                    score: scale.score(cold, c),
                    explanations: None,
                }),
        );
        // Stable: on equal scores the release's items stay ahead.
        top.items.sort_by(|a, b| b.score.total_cmp(&a.score));
        top.items.truncate(k);
        top.items.drain(..offset.min(top.items.len()));
        top
    }

    /// Items similar to cold item `item` of `cold`: the release's items by the cosine of
    /// their label sets with its labels, ties by the label model's `ln m` (the more
    /// supported first), then by index; `None` when `item` is not among them.
    pub fn similar_to_cold(&self, cold: &ColdItems, item: &str, n: usize) -> Option<Similar> {
        let c = cold.ids.iter().position(|i| i == item)?;
        let lift = LabelledRanker::of(self.ranker.as_deref()?)?.label_model()?;
        let mine = &cold.labels[c];
        let mut scored: Vec<(usize, f64, f64)> = lift
            .item_labels
            .iter()
            .enumerate()
            .filter_map(|(k, l)| {
                let shared = l.iter().filter(|g| mine.binary_search(g).is_ok()).count();
                (shared > 0).then(|| {
                    let cos = shared as f64 / ((l.len() * mine.len()) as f64).sqrt();
                    (
                        k,
                        cos,
                        lift.base.get(k).copied().unwrap_or(f64::NEG_INFINITY),
                    )
                })
            })
            .collect();
        scored.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then(b.2.total_cmp(&a.2))
                .then(a.0.cmp(&b.0))
        });
        Some(Similar {
            items: scored
                .into_iter()
                .take(n)
                .map(|(k, s, _)| self.scored(k, s))
                .collect(),
            source: SimilarSource::Labels,
        })
    }
}
