//! Trainers: each turns a rating set into a [`FactorModel`].
//!
//! A trainer is a value built by name from string parameters ([`build`]), so the CLI,
//! the evaluation harness and the service run them the same way. Non-private trainers
//! live here as the baselines every private model is judged against.

pub mod als;
pub mod baseline;
pub mod charges;
pub mod dp_alt;
pub mod dp_stats;
pub mod gaussian_mf;
pub mod linalg;
pub mod model;
pub mod nbm;
pub mod objpert;
pub mod params;
pub mod ranker;
pub mod sgd;
pub mod ssp;

pub use charges::{Guarantee, ReleaseCharges};
pub use model::FactorModel;
pub use params::{ParamError, Params};
pub use ranker::Ranker;

use crate::data::{Interactions, RatingScale, Ratings};
use crate::rng::DpRng;

/// Errors raised by trainers.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error("unknown trainer {0:?}; known trainers: {known}", known = names().join(", "))]
    UnknownTrainer(String),
    #[error("training data is empty")]
    EmptyData,
    #[error("{0}")]
    Numerical(String),
}

/// Training input: the ratings, both sparse views, the rating scale, and what the
/// curator knows beyond the ratings.
pub struct TrainData<'a> {
    pub ratings: &'a Ratings,
    pub matrix: &'a Interactions,
    pub scale: RatingScale,
    /// Per-rating privacy budget this release may spend (the eps_ij share the ledger
    /// allows), aligned with `ratings`. `None`: the trainer's own eps parameters apply.
    /// Preferences are public metadata (DESIGN 2.7).
    pub budgets: Option<&'a [f64]>,
    /// The last published DP model, if any. Its release was charged already, so its
    /// factors are public inputs (post-processing), e.g. the public V of a user step.
    pub prior: Option<&'a FactorModel>,
}

impl<'a> TrainData<'a> {
    /// Input with no budgets and no prior model (evaluation, baselines).
    pub fn new(ratings: &'a Ratings, matrix: &'a Interactions, scale: RatingScale) -> Self {
        Self {
            ratings,
            matrix,
            scale,
            budgets: None,
            prior: None,
        }
    }
}

/// What a training run produced: the model and the exact charges it incurred.
#[derive(Debug, Clone)]
pub struct Fitted {
    pub model: FactorModel,
    pub charges: ReleaseCharges,
    pub guarantee: Guarantee,
    /// A model that ranks from the user's own ratings (item-item, projection), when
    /// `model` alone cannot express it; `None`: `model` ranks and predicts.
    pub ranker: Option<std::sync::Arc<dyn Ranker>>,
}

impl Fitted {
    /// A non-private model: no charges, no claim.
    pub fn non_private(model: FactorModel) -> Self {
        Self {
            model,
            charges: ReleaseCharges::default(),
            guarantee: Guarantee::NonPrivate,
            ranker: None,
        }
    }
}

/// A training method with its hyper-parameters.
pub trait Trainer: Send + Sync {
    /// Registry name, e.g. `sgd-mf`.
    fn name(&self) -> &'static str;
    /// The effective hyper-parameters (after defaults), for reports.
    fn params(&self) -> serde_json::Value;
    /// The claim this trainer's output carries; only [`Guarantee::Proven`] may be served.
    fn guarantee(&self) -> Guarantee;
    /// The RDP event each participating user will be charged by one release, known before
    /// training so the curator can leave out users whose Renyi filter would not admit it.
    /// `None` when the trainer charges no per-user RDP.
    fn planned_user_event(&self) -> Option<crate::accountant::PrivacyEvent> {
        None
    }
    /// Trains on `data`; all randomness comes from `rng`.
    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError>;
}

/// Names accepted by [`build`], with a one-line description each.
pub const TRAINERS: &[(&str, &str)] = &[
    (
        "dp-alt",
        "production default: DP mean, DP user profiles (Gaussian sufficient statistics, RDP) alternating with DP item profiles (RSM + objective perturbation); proven",
    ),
    (
        "baseline",
        "global mean + regularised user and item biases (non-private)",
    ),
    (
        "sgd-mf",
        "biased matrix factorization by SGD, Funk-SVD style (non-private)",
    ),
    (
        "als-mf",
        "biased matrix factorization by alternating least squares (non-private)",
    ),
    (
        "gaussian-mf",
        "DP user profiles: clipped, Gaussian-noised gradient steps on public item factors (RDP-charged per user)",
    ),
    (
        "paper-gaussian-mf",
        "Gaussian-MF as in Mugdho-Imtiaz (noise on user gradients only; paper-claimed, not proven)",
    ),
    (
        "pdp-pmf",
        "PDP-PMF production form: RSM sampling + objective perturbation of item profiles on public/DP U (proven)",
    ),
    (
        "dp-pmf",
        "DP-PMF production form: one uniform eps, objective perturbation of item profiles on public/DP U (proven)",
    ),
    (
        "paper-pdp-pmf",
        "PDP-PMF as in the paper (non-private U, eta per iteration); paper-faithful, claim not proven",
    ),
    (
        "paper-dp-pmf",
        "DP-PMF as in the paper (uniform eps, non-private U); paper-faithful, claim not proven",
    ),
    ("dpsgd-nbm", "DP neighbourhood model (Wang-Tang DPSGD-PNBM): DP-SGD, clipped per-user gradients, Poisson sampling, Gaussian noise; explains by the user's own items (proven)"),
    ("dpps-nbm", "DP neighbourhood model (Wang-Tang DPPS-PNBM): SGLD on clipped per-user gradients, accounted as subsampled Gaussian steps (proven; the paper's 4B claim only reported)"),
    ("nbm", "the neighbourhood model of dpsgd-nbm/dpps-nbm trained by plain SGD (non-private)"),
];

/// One paragraph per trainer: name, description and parameters with their defaults
/// (taken from the trainers themselves, so help text cannot drift from the code).
pub fn describe() -> String {
    let mut out = String::new();
    for (name, about) in TRAINERS {
        out.push_str(&format!("  {name}: {about}\n"));
        if let Ok(t) = build(name, &Params::new()) {
            if let serde_json::Value::Object(m) = t.params() {
                let defaults: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push_str(&format!("      defaults: {}\n", defaults.join(" ")));
            }
        }
    }
    out
}

pub fn names() -> Vec<&'static str> {
    TRAINERS.iter().map(|(n, _)| *n).collect()
}

/// Builds a trainer by name; unknown parameters are an error naming the parameter.
pub fn build(name: &str, params: &Params) -> Result<Box<dyn Trainer>, TrainError> {
    let t: Box<dyn Trainer> = match name {
        "dp-alt" => Box::new(dp_alt::DpAlt::from_params(params)?),
        "baseline" => Box::new(baseline::Baseline::from_params(params)?),
        "sgd-mf" => Box::new(sgd::SgdMf::from_params(params)?),
        "als-mf" => Box::new(als::AlsMf::from_params(params)?),
        "gaussian-mf" => Box::new(gaussian_mf::GaussianMf::from_params(params)?),
        "paper-gaussian-mf" => Box::new(gaussian_mf::PaperGaussianMf::from_params(params)?),
        "pdp-pmf" => Box::new(objpert::PdpPmf::from_params(params, false)?),
        "dp-pmf" => Box::new(objpert::PdpPmf::from_params(params, true)?),
        "paper-pdp-pmf" => Box::new(objpert::PaperPmf::from_params(params, false)?),
        "paper-dp-pmf" => Box::new(objpert::PaperPmf::from_params(params, true)?),
        "dpsgd-nbm" => Box::new(nbm::Nbm::from_params(nbm::Method::DpSgd, params)?),
        "dpps-nbm" => Box::new(nbm::Nbm::from_params(nbm::Method::DpPs, params)?),
        "nbm" => Box::new(nbm::Nbm::from_params(nbm::Method::NonPrivate, params)?),
        other => return Err(TrainError::UnknownTrainer(other.to_owned())),
    };
    Ok(t)
}
