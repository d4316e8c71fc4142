//! The public defaults of a new user's budget and of a rating's release share: below
//! the configuration, the ledger and the trainers, so that a trainer's own defaults
//! (an evaluation runs what is served) repeat the service's without reading its
//! configuration. They are configuration values, public (DESIGN 6b).

use crate::ledger::SharePolicy;

/// eps_u of a new user.
pub const USER_EPS: f64 = 10.0;
/// delta_u of a new user.
pub const USER_DELTA: f64 = 1e-6;
/// eps_ij of a rating sent without eps, for a user without a default. With the served
/// default (dp-topn, 52 planned releases) a rating's full part in every release costs
/// eps ~10.7 at delta_r (its Gaussian part in zCDP, docs/LEDGER.md): 12 lets every
/// rating take part for the whole plan, and a tenth of it per release covers the
/// largest (first) step, ~1.18.
pub const RATING_EPS: f64 = 12.0;
/// Share of eps_ij one release may spend.
pub const SHARE: SharePolicy = SharePolicy::Fraction(0.1);
/// A rating whose remaining budget is below this is exhausted.
pub const MIN_RELEASE_EPS: f64 = 0.001;
