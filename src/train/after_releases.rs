//! A trainer as served after several releases: the state each release combines its
//! outputs into (`model::history`: the DP counts, or `dp-alt`'s item statistics) carries
//! into the next, so an evaluation, a test or a bench sees the model a store serves after
//! `N` releases, not after its first.

use dprec_dp::rng;

use crate::data::Interactions;
use crate::train::{Guarantee, TrainData, TrainError, Trainer};

/// A trainer as the service serves it after `releases` releases of a store whose ratings
/// do not change: fitted `releases` times on the same data (fresh noise each time), each
/// fit continuing the previous one's counts filter state (`model::history`); the
/// last fit is the result and its charges are one release's. The upper end of what
/// combining releases buys: a live store's counts also drift between releases (the replay
/// by time, `scripts/continual_replay.sh`, measures that). A trainer without such a state
/// is fitted once (with `arrivals`: for the first and the last release). With `arrivals`, the store grows instead:
/// release `r` of `N` sees a random `r / N` of the ratings (uniform random arrival order,
/// drawn from the run's generator), the last one all of them.
pub struct AfterReleases {
    pub inner: std::sync::Arc<dyn Trainer>,
    pub releases: u64,
    pub arrivals: bool,
}

impl AfterReleases {
    /// `trainer` as served after `releases` releases of an unchanged store: itself for 0
    /// or 1, wrapped otherwise.
    pub fn served(
        trainer: std::sync::Arc<dyn Trainer>,
        releases: u64,
    ) -> std::sync::Arc<dyn Trainer> {
        match releases {
            0 | 1 => trainer,
            releases => std::sync::Arc::new(Self {
                inner: trainer,
                releases,
                arrivals: false,
            }),
        }
    }
}

impl Trainer for AfterReleases {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn params(&self) -> serde_json::Value {
        let mut p = self.inner.params();
        if let Some(o) = p.as_object_mut() {
            o.insert("releases_seen".into(), self.releases.into());
        }
        p
    }
    fn guarantee(&self) -> Guarantee {
        self.inner.guarantee()
    }
    fn planned_user_event(&self) -> Option<dprec_dp::accountant::PrivacyEvent> {
        self.inner.planned_user_event()
    }
    fn user_level_event(&self, max_ratings: u64) -> Option<dprec_dp::accountant::PrivacyEvent> {
        self.inner.user_level_event(max_ratings)
    }
    fn rating_cap(&self) -> Option<f64> {
        self.inner.rating_cap()
    }
    fn scaled(&self, factor: f64) -> Option<Box<dyn Trainer>> {
        let inner = self.inner.scaled(factor)?;
        Some(Box::new(Self {
            inner: std::sync::Arc::from(inner),
            releases: self.releases,
            arrivals: self.arrivals,
        }))
    }
    fn publishes_popularity(&self) -> bool {
        self.inner.publishes_popularity()
    }
    fn fit(
        &self,
        data: &TrainData<'_>,
        rng: &mut rng::DpRng,
    ) -> Result<crate::train::Fitted, TrainError> {
        let n = self.releases.max(1);
        let mut order: Vec<usize> = Vec::new();
        if self.arrivals {
            use rand::seq::SliceRandom;
            order = (0..data.ratings.len()).collect();
            order.shuffle(rng);
        }
        let mut state = data.prior_counts.cloned();
        let mut fitted = None;
        let mut r = 0;
        while r < n {
            r += 1;
            // The store as release `r` sees it (all of it without arrivals, or at the last).
            let part = (self.arrivals && r < n).then(|| {
                let mut idx = order[..(order.len() as u64 * r / n) as usize].to_vec();
                idx.sort_unstable();
                let ratings = data.ratings.select(&idx);
                let matrix = Interactions::new(&ratings);
                (ratings, matrix)
            });
            let base = match &part {
                Some((ratings, matrix)) => TrainData::new(ratings, matrix, data.scale),
                None => *data,
            };
            let d = TrainData {
                prior_counts: state.as_ref(),
                ..base
            };
            let f = self.inner.fit(&d, rng)?;
            state = f.ranker.as_ref().and_then(|r| r.count_history().cloned());
            fitted = Some(f);
            if state.is_none() && r < n {
                // Nothing carries over (a trainer without a counts state): only the last
                // release's fit matters, and without arrivals this one saw what it sees.
                if !self.arrivals {
                    break;
                }
                r = n - 1;
            }
        }
        fitted.ok_or(TrainError::EmptyData)
    }
}
