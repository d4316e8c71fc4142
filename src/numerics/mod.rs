//! Small dense numerics below both the trainers and the local-DP protocols: per-user /
//! per-item solves ([`linalg`]) and symmetric eigen-decompositions of released Gram
//! matrices ([`sym_eigen`]). Pure arithmetic; no privacy logic and no I/O here.

pub mod linalg;
pub mod sym_eigen;
