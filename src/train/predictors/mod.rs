//! Central-DP rating predictors: the joint-DP `dp-alt` (item side released, user side
//! solved at serving time), Gaussian-MF and the SSP user step (DP user profiles), and the
//! objective-perturbation trainers PDP-PMF / DP-PMF.

pub mod dp_alt;
pub mod gaussian_mf;
pub mod objpert;
pub mod ssp;
