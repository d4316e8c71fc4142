//! What one user may put into a `dp-topn` release, public and fixed before data: the
//! contribution bounds (cap, clips, the weight of an unliked rating) and the rule that
//! says which ratings are liked. The sensitivities of docs/privacy/dp-topn.md are stated
//! in these bounds; the statistics (`suffstats`) and the trainer (`dp_topn`) both read
//! them.

use crate::train::{invalid, Params, TrainError};

/// Per-user contribution bounds, public and fixed before data.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Contribution {
    /// At most this many ratings per user enter a release (random subset by keyed hash).
    pub cap: usize,
    /// L2 bound of a user's count row.
    pub count_clip: f64,
    /// L2 bound of a user's Gram row (over the candidates).
    pub gram_clip: f64,
    /// Ratings with a value at or above this are the user's "liked" items ([`Liked`]);
    /// `None`: every rating is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub liked_min: Option<f64>,
    /// Weight of a rating below `liked_min` in the count row (in `[0, 1]`; liked ones
    /// weigh 1) before the row is clipped to `count_clip`. The Gram rows are binary.
    pub unliked_weight: f64,
}

impl Contribution {
    /// The count rows' sensitivities (`C_c` per user, `sqrt 2` per rating) assume every
    /// rating weighs at most 1: `unliked_weight` must be in `[0, 1]`, and a liked
    /// threshold must be a finite value.
    pub fn check_weights(&self, liked: &Liked) -> Result<(), TrainError> {
        if !(0.0..=1.0).contains(&self.unliked_weight) {
            return Err(invalid(
                "unliked_weight",
                "must be in [0, 1] (a rating weighs at most 1 in the count rows)",
            ));
        }
        if let Liked::AtLeast(v) | Liked::TopOfScale(v) = *liked {
            if !v.is_finite() {
                return Err(invalid("liked", "must be all, top or a finite value"));
            }
        }
        Ok(())
    }
}

/// Which ratings are a user's liked ones: a top-N list is for items users will like
/// (held-out ratings at the top of the scale, DESIGN 6a), so by default a release's count
/// rows weigh the liked ratings 1 and the others less ([`Contribution::unliked_weight`]).
/// A public rule on the configured scale, never on the data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Liked {
    /// Every rating, whatever its value.
    All,
    /// Values at or above `min + share (max - min)` of the scale.
    TopOfScale(f64),
    /// Values at or above this.
    AtLeast(f64),
}

impl Liked {
    /// The default: the top quarter of the scale (4 and 5 on 1..5, 4 to 5 in half stars
    /// on 0.5..5), the eval's relevance threshold (`eval::RankingConfig`).
    pub const DEFAULT: Liked = Liked::TopOfScale(0.75);

    /// `liked=all|top|<value>` (`top`: [`Liked::DEFAULT`]).
    pub fn from_params(p: &Params, default: Liked) -> Result<Self, TrainError> {
        Ok(match p.get_str("liked") {
            None => default,
            Some("all") => Liked::All,
            Some("top") => Liked::DEFAULT,
            Some(_) => Liked::AtLeast(p.f64("liked", 0.0)?),
        })
    }

    /// The parameter's value (`liked=...`) that gives this rule.
    pub fn param(&self) -> serde_json::Value {
        match *self {
            Liked::All => "all".into(),
            Liked::TopOfScale(_) => "top".into(),
            Liked::AtLeast(v) => v.into(),
        }
    }

    /// The smallest value counted on `scale` (`None`: all).
    pub fn min_value(&self, scale: crate::data::RatingScale) -> Option<f64> {
        match *self {
            Liked::All => None,
            Liked::TopOfScale(share) => Some(scale.min + share * scale.width()),
            Liked::AtLeast(v) => Some(v),
        }
    }
}
