//! Trainers over local-DP input: BLP-MoG-MF on client-perturbed ratings and the simulated
//! Private-GD protocol (the protocols themselves are in [`crate::ldp`]).

pub mod blp_mog_mf;
pub mod private_gd;
