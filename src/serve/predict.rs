//! Predicted ratings and solved user profiles of the served release (DESIGN 6, joint DP):
//! a joint-DP rating predictor's user side is solved from the published item side and
//! the user's own current ratings, once per release and per version of those ratings
//! ([`UserFacts::solved`]), and never stored.

use std::sync::Arc;

use super::facts::UserFacts;
use super::Published;
use crate::model::joint_als::UserProfile;

impl Published {
    /// The user's own ratings in this release's item indices (items outside it dropped);
    /// none for a deleted user.
    pub fn own_indices(&self, facts: &UserFacts) -> Vec<(usize, f64)> {
        if facts.deleted {
            return Vec::new();
        }
        facts
            .ratings
            .iter()
            .filter_map(|(i, v)| self.item_index(i).map(|j| (j, *v)))
            .collect()
    }

    /// Whether the served model predicts ratings (a factor model, a neighbourhood model,
    /// a joint-DP rating predictor); a top-N ranker does not. Settled when the release is
    /// loaded ([`Self::with_ranker`]).
    pub fn predicts_ratings(&self) -> bool {
        self.predicts
    }

    /// [`Self::predicts_ratings`] of a release served through `ranker`: asks it for one
    /// prediction (a predictor solves an empty profile for it).
    pub(super) fn ranker_predicts(ranker: Option<&dyn crate::model::Ranker>) -> bool {
        ranker.is_none_or(|r| r.n_items() == 0 || r.predict(None, &[], 0).is_some())
    }

    /// The user's profile solved from the release and the user's own ratings, for a
    /// joint-DP rating predictor (`None` otherwise); cached in `facts` for this release.
    pub fn solved_profile(&self, facts: &UserFacts) -> Option<Arc<UserProfile>> {
        let r = self.ranker.as_ref()?;
        if let Some((id, p)) = facts.solved.get() {
            if *id == self.release_id {
                return Some(p.clone());
            }
        }
        let p = Arc::new(r.solve_profile(&self.own_indices(facts))?);
        // A concurrent request may have set it first: both solved the same facts.
        let _ = facts.solved.set((self.release_id, p.clone()));
        Some(p)
    }

    /// Predicted ratings (on the scale) of `items` (indices in this release; `None`: a
    /// catalogue item the release does not cover) for the user of `facts`, from the
    /// published model and the user's own ratings; `None` per item the model has no
    /// prediction for. Call only when [`Published::predicts_ratings`].
    pub fn predict_items(
        &self,
        user: &str,
        facts: &UserFacts,
        items: &[Option<usize>],
    ) -> Vec<Option<f64>> {
        if let Some(r) = &self.ranker {
            if let Some(p) = self.solved_profile(facts) {
                return items.iter().map(|&j| r.predict_with(&p, j)).collect();
            }
            let own = self.own_indices(facts);
            return items
                .iter()
                .map(|&j| j.and_then(|j| r.predict(None, &own, j)))
                .collect();
        }
        let m = &self.model;
        let row = self
            .user_index(user)
            .filter(|&u| !facts.deleted && u < m.user_bias.len());
        items
            .iter()
            .map(|&j| {
                let j = j?;
                Some(match row {
                    Some(u) => m.predict(u, j),
                    None => m
                        .scale
                        .clamp(m.global_mean + m.item_bias.get(j).copied().unwrap_or(0.0)),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::RatingScale;
    use crate::model::joint_als::JointAls;
    use crate::model::FactorModel;

    fn joint() -> Published {
        let side = JointAls {
            mean: 3.0,
            item_bias: vec![0.5, -0.5],
            item_factors: vec![1.0, -1.0],
            d: 1,
            lambda_user: 1e-6,
            max_norm: 10.0,
            scale: RatingScale::ONE_TO_FIVE,
            popularity: vec![1.0, 1.0],
            history: None,
        };
        let model = FactorModel::zeros(0, 2, 1, 3.0, RatingScale::ONE_TO_FIVE);
        Published::new(
            crate::serve::ReleaseMeta {
                release_id: 7,
                trainer: "dp-alt".into(),
                guarantee: dprec_dp::charges::Guarantee::Proven,
                created_at: 0,
            },
            model,
            Vec::new(),
            vec!["a".into(), "b".into()],
            vec![1, 1],
        )
        .unwrap()
        .with_ranker(Some(Arc::new(side)))
        .unwrap()
    }

    #[test]
    fn a_solved_profile_is_cached_per_release_and_per_ratings() {
        let p = joint();
        assert!(p.predicts_ratings());
        let facts = UserFacts::new(false, vec![("a".into(), 4.25), ("b".into(), 2.75)]);
        let first = p.solved_profile(&facts).unwrap();
        assert!((first.bias - 0.5).abs() < 1e-4 && (first.factors[0] - 0.25).abs() < 1e-4);
        // Cached: the same allocation answers again.
        assert!(Arc::ptr_eq(&first, &p.solved_profile(&facts).unwrap()));
        let got = p.predict_items("u", &facts, &[Some(0), Some(1), None]);
        assert!((got[0].unwrap() - 4.25).abs() < 1e-4, "{got:?}");
        assert!((got[2].unwrap() - 3.5).abs() < 1e-4, "{got:?}");
        // New ratings are new facts: solved afresh.
        let newer = UserFacts::new(false, vec![("a".into(), 1.0)]);
        assert!(p.solved_profile(&newer).unwrap().bias < 0.0);
        // A deleted user's own ratings play no part.
        let deleted = UserFacts::new(true, vec![("a".into(), 5.0)]);
        assert_eq!(p.solved_profile(&deleted).unwrap().bias, 0.0);
    }
}
