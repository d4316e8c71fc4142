//! dprec's lab: what measures the service without being part of it.
//!
//! - [`eval`]: cross validation of any trainer the service can run (RMSE, ranking
//!   metrics, charges per fold), reports and plots; `releases_seen` evaluates what a
//!   store serves after several releases ([`dprec::train::AfterReleases`]);
//! - [`synthetic`]: seeded rating sets of chosen shapes (sizes, popularity and activity
//!   curves, taste groups), and [`folds`]: the k-fold and MovieLens splits;
//! - [`audit`]: the empirical privacy auditor (a lower bound on eps from a distinguishing
//!   test), run by the tests against the ledger's charge;
//! - [`cli`]: the `dprec-lab` command line (`eval`, `synth`).
//!
//! The service binary (`dprec`) keeps what an operator runs; everything here reads the
//! same trainers through `dprec::train::build`, so an evaluation measures what is served.

pub mod audit;
pub mod cli;
pub mod eval;
pub mod folds;
pub mod synthetic;
