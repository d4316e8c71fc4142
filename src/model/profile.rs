//! A user's profile solved from a published model and the user's own ratings (joint DP,
//! DESIGN 6): computed at query time, never stored.

use serde::Serialize;

/// A user's profile under a joint-DP rating predictor (`JointAls`): solved, not stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UserProfile {
    pub bias: f64,
    pub factors: Vec<f64>,
}
