//! Evaluation: k-fold cross validation of any trainer, with ranking quality
//! (precision, recall, NDCG at k, coverage, popularity of the lists; [`ranking`]),
//! accuracy (RMSE, MAE, for models that predict ratings) and training time per fold,
//! JSON reports and SVG plots.

pub mod plot;
pub mod ranking;

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::folds::Fold;
use dprec::data::{Interactions, RatingScale, Ratings};
use dprec::train::{Guarantee, Ranker, TrainData, TrainError, Trainer};
use dprec_dp::charges::ChargeSummary;
use dprec_dp::rng;

pub use ranking::{ranking_metrics, RankingConfig, RankingMetrics};

pub use dprec::model::factor::{mae, rmse};
pub use dprec::train::AfterReleases;

/// Accuracy and cost of one trainer on one fold.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FoldResult {
    pub fold: String,
    /// RMSE of the predicted ratings; NaN (JSON `null`) for models that only rank.
    pub rmse: f64,
    /// MAE of the predicted ratings; NaN (JSON `null`) for models that only rank.
    pub mae: f64,
    /// Top-N quality (absent when the run was asked not to rank).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranking: Option<RankingMetrics>,
    /// Wall-clock seconds of `Trainer::fit` alone.
    pub train_seconds: f64,
    /// Wall-clock seconds to build the sparse views the trainer is given.
    pub prep_seconds: f64,
    pub n_train: usize,
    pub n_test: usize,
    /// What the run charged (absent for non-private trainers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub privacy: Option<ChargeSummary>,
    pub guarantee: Guarantee,
}

/// The delta at which per-user RDP charges are reported as (eps, delta) in eval reports.
pub const REPORT_DELTA: f64 = 1e-5;

/// Mean or standard deviation of the fold results.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Summary {
    pub rmse: f64,
    pub mae: f64,
    pub train_seconds: f64,
    /// Ranking figures (NaN, JSON `null`, when the folds were not ranked).
    pub precision: f64,
    pub recall: f64,
    pub ndcg: f64,
    pub coverage: f64,
    pub mean_popularity: f64,
}

/// One trainer configuration evaluated on every fold.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    pub trainer: String,
    /// How the run was asked for (e.g. the CLI trainer spec), to tell runs apart.
    pub label: String,
    /// Effective parameters, defaults included.
    pub params: serde_json::Value,
    /// The swept parameter and its value for this run, when sweeping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepPoint>,
    pub folds: Vec<FoldResult>,
    pub mean: Summary,
    /// Sample standard deviation over folds (0 with one fold).
    pub std: Summary,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepPoint {
    pub param: String,
    pub value: f64,
}

/// Trains on `fold.train` and scores on `fold.test` (RMSE/MAE and the default ranking
/// metrics). The run's randomness is seeded from `seed`, so the same call gives the same
/// model.
pub fn evaluate_fold(
    trainer: &dyn Trainer,
    fold: &Fold,
    scale: RatingScale,
    seed: u64,
) -> Result<FoldResult, TrainError> {
    evaluate_fold_with(trainer, fold, scale, seed, Some(&RankingConfig::default()))
}

/// [`evaluate_fold`] with explicit ranking settings (`None`: no ranking metrics).
pub fn evaluate_fold_with(
    trainer: &dyn Trainer,
    fold: &Fold,
    scale: RatingScale,
    seed: u64,
    ranking: Option<&RankingConfig>,
) -> Result<FoldResult, TrainError> {
    let mut rng = rng::seeded(seed);
    let start = Instant::now();
    let matrix = Interactions::new(&fold.train);
    let prep_seconds = start.elapsed().as_secs_f64();
    let data = TrainData::new(&fold.train, &matrix, scale);
    let start = Instant::now();
    let fitted = trainer.fit(&data, &mut rng)?;
    let train_seconds = start.elapsed().as_secs_f64();
    let ranker: &dyn Ranker = match &fitted.ranker {
        Some(r) => r.as_ref(),
        None => &fitted.model,
    };
    let (rmse_v, mae_v) = match predictions(ranker, &matrix, &fold.test) {
        Some(pred) => (rmse(&pred, &fold.test), mae(&pred, &fold.test)),
        None => (f64::NAN, f64::NAN),
    };
    let ranking = ranking.map(|cfg| ranking_metrics(ranker, &matrix, &fold.test, cfg));
    let privacy = if fitted.charges.is_empty() {
        None
    } else {
        Some(
            fitted
                .charges
                .summary(fold.train.len(), REPORT_DELTA)
                .map_err(|e| TrainError::Numerical(format!("accounting the charges: {e}")))?,
        )
    };
    Ok(FoldResult {
        fold: fold.name.clone(),
        rmse: rmse_v,
        mae: mae_v,
        ranking,
        train_seconds,
        prep_seconds,
        n_train: fold.train.len(),
        n_test: fold.test.len(),
        privacy,
        // Eval feeds raw ratings: a local-DP trainer's claim holds only for input
        // perturbed on the client, so here it is as private as its raw input.
        guarantee: match fitted.guarantee {
            Guarantee::LocalDp => Guarantee::NonPrivate,
            g => g,
        },
    })
}

/// Predicted ratings of `test` from the ranker and each user's own training ratings, or
/// `None` when the model does not predict ratings.
fn predictions(ranker: &dyn Ranker, train: &Interactions, test: &Ratings) -> Option<Vec<f64>> {
    let mut out = Vec::with_capacity(test.len());
    let mut own: Vec<(usize, f64)> = Vec::new();
    let mut own_of = usize::MAX;
    for k in 0..test.len() {
        let (u, j) = (test.users[k] as usize, test.items[k] as usize);
        if u != own_of {
            own.clear();
            if u < train.by_user.n_rows() {
                let (items, values) = train.by_user.row(u);
                own.extend(
                    items
                        .iter()
                        .zip(values)
                        .map(|(&i, &v)| (i as usize, v as f64)),
                );
            }
            own_of = u;
        }
        let user = (u < train.n_users).then_some(u);
        out.push(ranker.predict(user, &own, j)?);
    }
    Some(out)
}

/// Seed of fold `k` of a run seeded with `seed` (folds get distinct streams).
pub fn fold_seed(seed: u64, k: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(k as u64)
}

/// Mean and sample standard deviation of fold results.
pub fn summarize(folds: &[FoldResult]) -> (Summary, Summary) {
    let stat = |f: fn(&FoldResult) -> f64| stat_by(folds, f);
    let (rm, rs) = stat(|x| x.rmse);
    let (mm, ms) = stat(|x| x.mae);
    let (tm, ts) = stat(|x| x.train_seconds);
    let rank = |f: fn(&RankingMetrics) -> f64| {
        move |x: &FoldResult| x.ranking.as_ref().map(f).unwrap_or(f64::NAN)
    };
    let (pm, ps) = stat_by(folds, rank(|m| m.precision));
    let (cm, cs) = stat_by(folds, rank(|m| m.recall));
    let (nm, ns) = stat_by(folds, rank(|m| m.ndcg));
    let (vm, vs) = stat_by(folds, rank(|m| m.coverage));
    let (qm, qs) = stat_by(folds, rank(|m| m.mean_popularity));
    (
        Summary {
            rmse: rm,
            mae: mm,
            train_seconds: tm,
            precision: pm,
            recall: cm,
            ndcg: nm,
            coverage: vm,
            mean_popularity: qm,
        },
        Summary {
            rmse: rs,
            mae: ms,
            train_seconds: ts,
            precision: ps,
            recall: cs,
            ndcg: ns,
            coverage: vs,
            mean_popularity: qs,
        },
    )
}

/// Mean and sample standard deviation of `f` over the folds (NaN propagates).
fn stat_by(folds: &[FoldResult], f: impl Fn(&FoldResult) -> f64) -> (f64, f64) {
    let n = folds.len() as f64;
    let mean = folds.iter().map(&f).sum::<f64>() / n.max(1.0);
    let var = if folds.len() > 1 {
        folds.iter().map(|x| (f(x) - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Evaluates `trainer` on every fold in turn; `on_fold` is called after each (progress).
#[allow(clippy::too_many_arguments)]
pub fn cross_validate(
    trainer: &dyn Trainer,
    label: &str,
    folds: &[Fold],
    scale: RatingScale,
    seed: u64,
    sweep: Option<SweepPoint>,
    ranking: Option<&RankingConfig>,
    mut on_fold: impl FnMut(&FoldResult),
) -> Result<RunReport, TrainError> {
    let mut results = Vec::with_capacity(folds.len());
    for (k, fold) in folds.iter().enumerate() {
        let r = evaluate_fold_with(trainer, fold, scale, fold_seed(seed, k), ranking)?;
        on_fold(&r);
        results.push(r);
    }
    let (mean, std) = summarize(&results);
    Ok(RunReport {
        trainer: trainer.name().to_owned(),
        label: label.to_owned(),
        params: trainer.params(),
        sweep,
        folds: results,
        mean,
        std,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `AfterReleases` continues the counts filter state from fit to fit: after 3 fits the
    /// served state combines 3 releases (also when the store grows between them), and
    /// with one it is a first release.
    #[test]
    fn after_releases_continues_the_counts_state() {
        let mut r = Ratings::with_dims(60, 30);
        for u in 0..60u32 {
            for t in 0..6u32 {
                r.push(u, (u + t * t) % 30, 4.0);
            }
        }
        let m = Interactions::new(&r);
        let data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
        let inner: std::sync::Arc<dyn Trainer> = std::sync::Arc::from(
            dprec::train::build(
                "dp-popularity",
                &dprec::train::Params::parse(&["eps_r=none"]).unwrap(),
            )
            .unwrap(),
        );
        for (releases, want, arrivals) in [(1, 1, false), (3, 3, false), (3, 3, true)] {
            let t = AfterReleases {
                inner: inner.clone(),
                releases,
                arrivals,
            };
            let f = t.fit(&data, &mut rng::seeded(1)).unwrap();
            let h = f.ranker.as_ref().unwrap().count_history().unwrap();
            assert_eq!(h.releases, want);
            assert_eq!(t.params()["releases_seen"], releases);
        }
    }

    #[test]
    fn metrics_match_hand_computation() {
        let mut t = Ratings::default();
        t.push(0, 0, 3.0);
        t.push(0, 1, 5.0);
        let pred = [4.0, 3.0];
        assert!((rmse(&pred, &t) - (2.5f64).sqrt()).abs() < 1e-12);
        assert!((mae(&pred, &t) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn summary_is_mean_and_sample_std() {
        let f = |rmse| FoldResult {
            fold: String::new(),
            rmse,
            mae: 0.0,
            ranking: None,
            train_seconds: 1.0,
            prep_seconds: 0.0,
            n_train: 0,
            n_test: 0,
            privacy: None,
            guarantee: Guarantee::NonPrivate,
        };
        let (m, s) = summarize(&[f(1.0), f(3.0)]);
        assert_eq!(m.rmse, 2.0);
        assert!((s.rmse - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(s.train_seconds, 0.0);
    }
}
