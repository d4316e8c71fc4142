//! Non-private rating predictors, the baselines every DP predictor is judged against:
//! biases only, and biased matrix factorization by SGD or ALS.

pub mod als;
pub mod baseline;
pub mod sgd;
