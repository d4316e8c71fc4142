//! dprec's privacy core: everything a release's privacy claim rests on, pure (no I/O).
//!
//! - [`accountant`]: Renyi-DP curves, events, conversion to (eps, delta), the Renyi
//!   filter and the lifetime plan of a user's budget;
//! - [`privacy`]: noise samplers (Laplace, Gaussian, discrete, bounded Laplace, local
//!   randomisers), sampling (RSM) and tree aggregation;
//! - [`ledger`]: the budget arithmetic: a rating's release share and loss, the per-user
//!   cost of a release, admission, the hold of a release in flight;
//! - [`charges`]: the privacy vocabulary a release records (`Guarantee`, `PrivacyUnit`,
//!   `Neighbour`, the per-rating and per-user charges);
//! - [`defaults`]: the public defaults of a user's budget and a rating's share;
//! - [`rng`]: the noise generator (OS-seeded ChaCha in production, seeded in tests).
//!
//! The service (`dprec`) stores and serves; this crate decides what a release may spend
//! and how much noise it takes. The proofs are in docs/privacy/.

pub mod accountant;
pub mod charges;
pub mod defaults;
pub mod ledger;
pub mod privacy;
pub mod rng;
