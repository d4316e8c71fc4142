//! Trainers: each turns a rating set into a [`FactorModel`].
//!
//! A trainer is a value built by name from string parameters ([`build`]), so the CLI,
//! the evaluation harness and the service run them the same way. The registry below
//! names every trainer; the families are submodules ([`topn`], [`predictors`],
//! [`local`], [`nbm`], [`nonprivate`]).

// The families, by what a trainer promises.
pub mod local;
pub mod nbm;
pub mod nonprivate;
pub mod predictors;
pub mod topn;

// What every family shares: charges, DP statistics, the model, parameters, the ranking
// interface and the two units; and a trainer as served after several releases.
pub mod after_releases;
pub mod dp_stats;
pub mod params;
pub mod per_rating;
pub mod units;

use local::{blp_mog_mf, private_gd};
use nonprivate::{als, baseline, sgd};
use predictors::{dp_alt, gaussian_mf, objpert};
use topn::{dp_topn, references};

pub use crate::model::FactorModel;
pub use crate::model::Ranker;
pub use crate::model::StoredRanker;
pub use after_releases::AfterReleases;
pub use dprec_dp::charges::{Guarantee, ReleaseCharges};
pub use params::{ParamError, Params};
pub use per_rating::PerRating;

use crate::data::{Interactions, RatingScale, Ratings};
use dprec_dp::rng::DpRng;

/// A refused trainer parameter: which key, and why (every trainer's `from_params`).
pub(crate) fn invalid(key: &str, reason: impl Into<String>) -> TrainError {
    TrainError::Param(ParamError::Invalid {
        key: key.to_owned(),
        reason: reason.into(),
    })
}

impl From<crate::model::history::InvalidUpdate> for TrainError {
    fn from(e: crate::model::history::InvalidUpdate) -> Self {
        invalid(e.key, e.reason)
    }
}

/// A numerical failure of a solve or a decomposition, with its message.
pub(crate) fn numerical(e: impl std::fmt::Display) -> TrainError {
    TrainError::Numerical(e.to_string())
}

/// The trainer `dprec serve` runs when `trainer.name` is not set.
pub const SERVED_DEFAULT: &str = "dp-topn";

/// Errors raised by trainers.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error(
        "unknown trainer {0:?}; the served default is {SERVED_DEFAULT}; known trainers: {known}",
        known = names().join(", ")
    )]
    UnknownTrainer(String),
    #[error("training data is empty")]
    EmptyData,
    #[error("{0}")]
    Numerical(String),
    /// A noise mechanism refused its parameters.
    #[error(transparent)]
    Privacy(#[from] dprec_dp::privacy::PrivacyError),
    /// The accountant refused an event, a curve or a conversion.
    #[error(transparent)]
    Accounting(#[from] dprec_dp::accountant::AccountantError),
    /// The Private-GD protocol refused its state or a report.
    #[error(transparent)]
    Protocol(#[from] crate::ldp::private_gd::ProtocolError),
    /// A random initialisation refused its spread.
    #[error(transparent)]
    Normal(#[from] rand_distr::NormalError),
    /// A source of a release's sums (a database) failed or disagreed with the data.
    #[error("computing a release's sums: {0}")]
    Source(String),
}

/// Training input: the ratings, both sparse views, the rating scale, and what the
/// curator knows beyond the ratings.
#[derive(Clone, Copy)]
pub struct TrainData<'a> {
    pub ratings: &'a Ratings,
    pub matrix: &'a Interactions,
    pub scale: RatingScale,
    /// Per-rating privacy budget this release may spend (the eps_ij share the ledger
    /// allows), aligned with `ratings`. `None`: the trainer's own eps parameters apply.
    /// Preferences are public metadata (DESIGN 2.7).
    pub budgets: Option<PerRating<'a>>,
    /// Per rating (aligned with `ratings`): the Gaussian part of its loss so far (zCDP
    /// `rho`, [`dprec_dp::ledger::rating_loss`]); `None`: 0 for every rating.
    pub rating_rho: Option<PerRating<'a>>,
    /// The last published DP model, if any. Its release was charged already, so its
    /// factors are public inputs (post-processing), e.g. the public V of a user step.
    pub prior: Option<&'a FactorModel>,
    /// The last published release's counts filter state ([`topn::history`]), re-indexed to
    /// these items: published outputs, so public inputs of this release's counts.
    pub prior_counts: Option<&'a crate::model::history::CountHistory>,
    /// The external user and item ids of the indices (the store's), when known: the
    /// keyed subset hash of `dp-topn` reads them so that a database computes the same
    /// rows (`train::topn::suffstats`). `None`: the decimal indices stand for them.
    pub labels: Option<Labels<'a>>,
}

/// External ids by index: `users[u]`, `items[j]`.
#[derive(Debug, Clone, Copy)]
pub struct Labels<'a> {
    pub users: &'a [String],
    pub items: &'a [String],
}

impl<'a> TrainData<'a> {
    /// Per-rating release budgets of a fit: the ledger's (borrowed: at 20M ratings a copy
    /// is 160 MB at a release's peak), else `eps_r` for every rating, else unbounded; the
    /// budgets and the Gaussian parts must have one entry a rating.
    pub fn release_budgets(&self, eps_r: Option<f64>) -> Result<PerRating<'a>, TrainError> {
        let n = self.ratings.len();
        if self.rating_rho.is_some_and(|r| r.len() != n) {
            return Err(invalid("rating_rho", "one rho per rating"));
        }
        Ok(match (self.budgets, eps_r) {
            (Some(b), _) if b.len() != n => {
                return Err(invalid(
                    "budgets",
                    format!("{} budgets for {n} ratings", b.len()),
                ))
            }
            (Some(b), _) => b,
            (None, Some(e)) => PerRating::Same { value: e, len: n },
            (None, None) => PerRating::Same {
                value: f64::INFINITY,
                len: n,
            },
        })
    }

    /// Input with no budgets and no prior model (evaluation, baselines).
    pub fn new(ratings: &'a Ratings, matrix: &'a Interactions, scale: RatingScale) -> Self {
        Self {
            ratings,
            matrix,
            scale,
            budgets: None,
            rating_rho: None,
            prior: None,
            prior_counts: None,
            labels: None,
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
    /// The claim this trainer's output carries. [`Guarantee::Proven`] is served;
    /// [`Guarantee::RatingLevel`] only in the operator's rating-level mode
    /// (`trainer.allow_rating_level`); non-private and local-DP ones by their own rules.
    fn guarantee(&self) -> Guarantee;
    /// The RDP event each participating user will be charged by one release, known before
    /// training so the curator can leave out users whose Renyi filter would not admit it.
    /// `None` when the trainer charges no per-user RDP.
    fn planned_user_event(&self) -> Option<dprec_dp::accountant::PrivacyEvent> {
        None
    }
    /// User level (DESIGN 3, issue 8 finding 6): the RDP event one release costs ANY user
    /// with at most `max_ratings` ratings (all of the user's ratings added or removed), a
    /// constant known before data. `None`: the trainer states no user-level bound (the
    /// service refuses to serve a proven trainer without one).
    fn user_level_event(&self, max_ratings: u64) -> Option<dprec_dp::accountant::PrivacyEvent> {
        let _ = max_ratings;
        None
    }
    /// The largest eps one release charges any single rating (rating level, a public
    /// constant); `None` when unknown.
    fn rating_cap(&self) -> Option<f64> {
        None
    }
    /// The same trainer with every per-release privacy cost scaled down by `factor >= 1`
    /// (noise multipliers times `factor`, pure eps divided by it), for the lifetime plan's
    /// calibration. `None`: the trainer cannot be calibrated.
    fn scaled(&self, factor: f64) -> Option<Box<dyn Trainer>> {
        let _ = factor;
        None
    }
    /// The same trainer with the public catalogue labels of the release's items (by item
    /// index), for a trainer whose lists use them (`dp-topn`: docs/privacy/labels.md).
    /// `None`: the trainer does not use labels (the release runs it as it is).
    fn with_item_labels(
        &self,
        labels: std::sync::Arc<crate::model::labels::ItemLabels>,
    ) -> Option<Box<dyn Trainer>> {
        let _ = labels;
        None
    }
    /// Whether the fitted ranker carries its own DP counts (charged in the trainer's own
    /// charges and user-level event), so the service publishes no separate DP popularity
    /// for the release and spends no popularity eps on it.
    fn publishes_popularity(&self) -> bool {
        false
    }
    /// Trains on `data`; all randomness comes from `rng`.
    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError>;
}

/// Where a proven trainer's claim is proven: the document under docs/privacy/ and the
/// test that fails on a wrong noise scale (checked by `every_proven_trainer_names_its_proof`).
#[derive(Debug, Clone, Copy)]
pub struct Proof {
    pub doc: &'static str,
    pub noise_scale_test: &'static str,
}

/// One row of the trainer table: adding a trainer is adding a row.
pub struct TrainerEntry {
    pub name: &'static str,
    pub about: &'static str,
    pub build: fn(&Params) -> Result<Box<dyn Trainer>, TrainError>,
    /// `Some` exactly for trainers whose guarantee is [`Guarantee::Proven`] or
    /// [`Guarantee::RatingLevel`] (proven at the rating unit).
    pub proof: Option<Proof>,
}

/// Boxes a trainer constructor's result (keeps the table rows one line each).
fn boxed<T: Trainer + 'static, E: Into<TrainError>>(
    r: Result<T, E>,
) -> Result<Box<dyn Trainer>, TrainError> {
    Ok(Box::new(r.map_err(Into::into)?))
}

const fn proof(doc: &'static str, noise_scale_test: &'static str) -> Option<Proof> {
    Some(Proof {
        doc,
        noise_scale_test,
    })
}

/// Every trainer [`build`] accepts.
#[rustfmt::skip]
pub const TRAINERS: &[TrainerEntry] = &[
    TrainerEntry { name: "dp-alt", about: "joint-DP rating predictor: DP alternating least squares, the item side a user-level Gaussian release of per-item Gram matrices and right-hand sides with a catalogue-free contribution bound; each user's bias and factors solved from it and the user's own ratings (never released); proven", build: |p| boxed(dp_alt::DpAlt::from_params(p)), proof: proof("docs/privacy/dp-alt.md", "item_step_noise_has_the_planned_scale") },
    TrainerEntry { name: "dp-topn", about: "top-N: DP counts -> DP-popular candidates -> DP Gram of norm-clipped user rows -> PureSVD (or EASE) item model; user-level Gaussian from the release plan + RSM per rating; defaults: the service's calibration (52 releases in eps_u 10, delta_u 1e-6, eps_r 1.2; releases=1,eps_r=none for one release); proven", build: |p| boxed(dp_topn::DpTopN::from_params(p)), proof: proof("docs/privacy/dp-topn.md", "gram_and_count_noise_have_the_planned_scale") },
    TrainerEntry { name: "dp-popularity", about: "most popular by DP counts (dp-topn's count step with the whole budget; reference); proven", build: |p| boxed(references::DpPopularity::from_params(p)), proof: proof("docs/privacy/dp-topn.md", "gram_and_count_noise_have_the_planned_scale") },
    TrainerEntry { name: "popularity", about: "most popular by exact training counts (non-private reference)", build: |p| boxed(references::Popularity::from_params(p)), proof: None },
    TrainerEntry { name: "ease", about: "EASE item-item closed form on the exact Gram (non-private reference, Steck 2019)", build: |p| boxed(references::Ease::from_params(p)), proof: None },
    TrainerEntry { name: "baseline", about: "global mean + regularised user and item biases (non-private)", build: |p| boxed(baseline::Baseline::from_params(p)), proof: None },
    TrainerEntry { name: "sgd-mf", about: "biased matrix factorization by SGD, Funk-SVD style (non-private)", build: |p| boxed(sgd::SgdMf::from_params(p)), proof: None },
    TrainerEntry { name: "als-mf", about: "biased matrix factorization by alternating least squares (non-private)", build: |p| boxed(als::AlsMf::from_params(p)), proof: None },
    TrainerEntry { name: "gaussian-mf", about: "DP user profiles: clipped, Gaussian-noised gradient steps on public item factors (RDP-charged per user)", build: |p| boxed(gaussian_mf::GaussianMf::from_params(p)), proof: proof("docs/privacy/gaussian-mf.md", "one_step_noise_scale_is_lr_sigma_c_and_wrong_sigma_fails") },
    TrainerEntry { name: "paper-gaussian-mf", about: "Gaussian-MF as in Mugdho-Imtiaz (noise on user gradients only; paper-claimed, not proven)", build: |p| boxed(gaussian_mf::PaperGaussianMf::from_params(p)), proof: None },
    TrainerEntry { name: "pdp-pmf", about: "PDP-PMF production form: RSM sampling + objective perturbation of item profiles on public/DP U (proven for one rating: rating-level, served only with trainer.allow_rating_level)", build: |p| boxed(objpert::PdpPmf::from_params(p, false)), proof: proof("docs/privacy/pdp-pmf.md", "item_noise_norm_is_gamma_dim_c_over_eps_noise") },
    TrainerEntry { name: "dp-pmf", about: "DP-PMF production form: one uniform eps, objective perturbation of item profiles on public/DP U (proven for one rating: rating-level, served only with trainer.allow_rating_level)", build: |p| boxed(objpert::PdpPmf::from_params(p, true)), proof: proof("docs/privacy/pdp-pmf.md", "item_noise_norm_is_gamma_dim_c_over_eps_noise") },
    TrainerEntry { name: "paper-pdp-pmf", about: "PDP-PMF as in the paper (non-private U, eta per iteration); paper-faithful, claim not proven", build: |p| boxed(objpert::PaperPmf::from_params(p, false)), proof: None },
    TrainerEntry { name: "paper-dp-pmf", about: "DP-PMF as in the paper (uniform eps, non-private U); paper-faithful, claim not proven", build: |p| boxed(objpert::PaperPmf::from_params(p, true)), proof: None },
    TrainerEntry { name: "blp-mog-mf", about: "BLP-MoG-MF: mixture-of-Gaussians EM with weighted MF on client-perturbed (LDP) ratings; eps=E simulates the clients (eval, paper-claimed); docs/privacy/blp-ldp.md", build: |p| boxed(blp_mog_mf::BlpMogMf::from_params(p)), proof: None },
    TrainerEntry { name: "private-gd", about: "Private-GD / GD-DR simulated: every user sends one eps/rounds-LDP bit per round about its clipped, projected gradient (user-level local eps, proven)", build: |p| boxed(private_gd::PrivateGd::from_params(p)), proof: proof("docs/privacy/private-gd.md", "client_bit_frequency_matches_the_paper_randomiser") },
    TrainerEntry { name: "dpsgd-nbm", about: "DP neighbourhood model (Wang-Tang DPSGD-PNBM): DP-SGD, clipped per-user gradients, Poisson sampling, Gaussian noise; explains by the user's own items (proven)", build: |p| boxed(nbm::Nbm::from_params(nbm::Method::DpSgd, p)), proof: proof(nbm::PROOF_DOC, "noise_scale_is_z_times_clip") },
    TrainerEntry { name: "dpps-nbm", about: "DP neighbourhood model (Wang-Tang DPPS-PNBM): SGLD on clipped per-user gradients, accounted as subsampled Gaussian steps (proven; the paper's 4B claim only reported)", build: |p| boxed(nbm::Nbm::from_params(nbm::Method::DpPs, p)), proof: proof(nbm::PROOF_DOC, "loop_counts_steps_and_noise_never_below_z") },
    TrainerEntry { name: "nbm", about: "the neighbourhood model of dpsgd-nbm/dpps-nbm trained by plain SGD (non-private)", build: |p| boxed(nbm::Nbm::from_params(nbm::Method::NonPrivate, p)), proof: None },
];

/// One paragraph per trainer: name, description and parameters with their defaults
/// (taken from the trainers themselves, so help text cannot drift from the code).
pub fn describe() -> String {
    let mut out = String::new();
    for e in TRAINERS {
        out.push_str(&format!("  {}: {}\n", e.name, e.about));
        if let Ok(t) = (e.build)(&Params::new()) {
            if let serde_json::Value::Object(m) = t.params() {
                let defaults: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push_str(&format!("      defaults: {}\n", defaults.join(" ")));
            }
        }
    }
    out
}

pub fn names() -> Vec<&'static str> {
    TRAINERS.iter().map(|e| e.name).collect()
}

/// The table row of trainer `name`.
pub fn entry(name: &str) -> Option<&'static TrainerEntry> {
    TRAINERS.iter().find(|e| e.name == name)
}

/// Builds a trainer by name; unknown parameters are an error naming the parameter.
pub fn build(name: &str, params: &Params) -> Result<Box<dyn Trainer>, TrainError> {
    let e = entry(name).ok_or_else(|| TrainError::UnknownTrainer(name.to_owned()))?;
    (e.build)(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ledger's budgets are lent, not copied; otherwise `eps_r` or no bound; a
    /// budget or Gaussian part list of the wrong length is refused.
    #[test]
    fn release_budgets_borrow_the_ledgers() {
        let mut r = Ratings::with_dims(2, 2);
        r.push(0, 0, 3.0);
        r.push(1, 1, 4.0);
        let m = Interactions::new(&r);
        let mut data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
        let all = |b: PerRating<'_>| b.iter().collect::<Vec<f64>>();
        assert_eq!(all(data.release_budgets(None).unwrap()), [f64::INFINITY; 2]);
        assert_eq!(all(data.release_budgets(Some(0.5)).unwrap()), [0.5; 2]);
        let ledger = [0.25, 1.0];
        data.budgets = Some(ledger[..].into());
        let got = data.release_budgets(Some(0.5)).unwrap();
        assert!(matches!(got, PerRating::Plain(b) if std::ptr::eq(b, &ledger[..])));
        data.budgets = Some(ledger[..1].into());
        assert!(data.release_budgets(None).is_err());
        data.budgets = None;
        data.rating_rho = Some(ledger[..1].into());
        assert!(data.release_budgets(None).is_err());
    }

    fn read(path: &str) -> String {
        let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
    }

    /// Every source file under `dir` (recursively), concatenated.
    fn sources(dir: &str) -> String {
        let mut out = String::new();
        let mut stack = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)];
        while let Some(d) = stack.pop() {
            for f in std::fs::read_dir(&d).unwrap().map(|f| f.unwrap().path()) {
                if f.is_dir() {
                    stack.push(f);
                } else if f.extension().is_some_and(|x| x == "rs") {
                    out.push_str(&std::fs::read_to_string(&f).unwrap());
                }
            }
        }
        out
    }

    /// The OpenDP-style link from a proven trainer to its proof: the table names a doc
    /// under docs/privacy/ for exactly the proven trainers (at both units, or at the
    /// rating unit only), the doc exists and names the trainer and its noise-scale test,
    /// and that test exists in the code.
    #[test]
    fn every_proven_trainer_names_its_proof() {
        let code = format!(
            "{}{}{}",
            sources("src"),
            sources("crates"),
            sources("tests")
        );
        for e in TRAINERS {
            let t = (e.build)(&Params::new()).unwrap();
            assert_eq!(t.name(), e.name);
            let proven = matches!(t.guarantee(), Guarantee::Proven | Guarantee::RatingLevel);
            assert_eq!(proven, e.proof.is_some(), "{}: proof iff proven", e.name);
            let Some(p) = e.proof else { continue };
            assert!(p.doc.starts_with("docs/privacy/"), "{}", p.doc);
            let doc = read(p.doc);
            assert!(doc.contains(e.name), "{} does not name {}", p.doc, e.name);
            assert!(
                doc.contains(p.noise_scale_test),
                "{} does not name {}",
                p.doc,
                p.noise_scale_test
            );
            assert!(
                code.contains(&format!("fn {}(", p.noise_scale_test)),
                "no test fn {}",
                p.noise_scale_test
            );
        }
    }

    #[test]
    fn names_are_unique_and_unknown_names_are_refused() {
        let mut n = names();
        n.sort();
        n.dedup();
        assert_eq!(n.len(), TRAINERS.len());
        let e = build("no-such", &Params::new()).err().unwrap();
        assert!(matches!(e, TrainError::UnknownTrainer(_)));
        assert!(
            e.to_string().contains("the served default is dp-topn"),
            "{e}"
        );
        assert!(entry(SERVED_DEFAULT).is_some());
    }
}
