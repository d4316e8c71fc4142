//! Local differential privacy protocols: the parts a user who does not trust the curator
//! runs on their own device, and the curator's aggregation of what those users send.
//!
//! - [`rating`]: ratings perturbed on the client with the bounded Laplace mechanism
//!   (BLP-MoG-MF), sent in the perturbed-rating JSON form that `POST /v1/ratings` accepts.
//! - [`private_gd`]: Private-GD / GD-DR (Shin, Kim, Shin, Xiao 2018): each round every
//!   user sends one bit about one randomly chosen coordinate of its (projected) clipped
//!   gradient; the curator aggregates with the paper's estimator and correction factor
//!   and updates the public item profiles.
//!
//! Everything here is pure (no I/O); the claims are in `docs/privacy/blp-ldp.md` and
//! `docs/privacy/private-gd.md`.

pub mod private_gd;
pub mod rating;

pub use rating::*;
