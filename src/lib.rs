//! dprec: a privacy-budgeted recommendation engine.
//!
//! The crate is organised by concern:
//! - [`data`]: rating data, loaders (MovieLens), sparse layouts, synthetic data, folds;
//! - [`numerics`]: small dense linear algebra (solves, symmetric eigen-decompositions)
//!   shared by [`train`] and [`ldp`], with no privacy logic;
//! - [`train`]: trainers, grouped by what they promise (top-N rankers, central-DP rating
//!   predictors, local-DP trainers, the neighbourhood model, non-private references);
//! - [`privacy`]: pure noise mechanisms and sampling primitives (no I/O);
//! - [`ldp`]: client-side local DP for ratings (the perturbed-rating form, BLP);
//! - [`accountant`]: Renyi-DP accounting, conversion and the Renyi filter (pure);
//! - [`eval`]: cross validation, metrics, reports and plots;
//! - [`cli`]: the `dprec` command line;
//! - the service (`dprec serve`): [`config`], [`store`] (SQLite/PostgreSQL), [`ledger`]
//!   (budget arithmetic and the admission plan, pure; the store commits), [`release`]
//!   (the release pipeline as named steps, the scheduler and replica watcher), [`serve`]
//!   (in-memory model registry, top-N), [`api`] (HTTP handlers, problem+json, auth, OpenAPI), [`metrics`] and [`startup`].

pub mod api;
pub mod cli;
pub mod config;
pub mod data;
pub mod lanes;
pub mod ldp;
pub mod link_secret;
pub mod metrics;
pub mod model;
pub mod numerics;
pub mod release;
/// The former name of [`release`], kept for callers written against it.
pub use release as retrain;
#[cfg(test)]
mod layering_tests;
pub mod serve;
#[cfg(test)]
mod shape_tests;
pub mod startup;
pub mod store;
pub mod train;
