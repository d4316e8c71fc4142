//! The published models: what a release writes and serving reads. A trainer (`train`)
//! produces one; the service stores it with its release and scores with it at query time
//! from the model and the asking user's own ratings (joint DP, DESIGN 6). Nothing here
//! trains or reads the store.
//!
//! - [`ranker`]: the `Ranker` interface every served model implements;
//! - [`factor`]: the factor model (biases and factors), and RMSE / MAE against ratings;
//! - [`item_ranker`]: `dp-topn`'s item-side model over DP candidates, with
//!   [`history`], the filter state of its DP counts across releases;
//! - [`joint_als`]: `dp-alt`'s published item side, and [`profile`], a user's profile
//!   solved from it; [`nbm`]: the neighbourhood models' DP biases and weights;
//! - [`labels`]: public catalogue labels in a top-N model (a user's own labels reweight
//!   the DP counts);
//! - [`stored`]: the closed set of rankers a release stores;
//! - [`catalogue`]: public item information (titles, labels) and MovieLens's catalogue
//!   files parsed into it.

pub mod catalogue;
pub mod count_prior;
pub mod factor;
pub mod history;
pub mod item_ranker;
pub mod joint_als;
pub mod labels;
pub mod nbm;
pub mod profile;
pub mod ranker;
pub mod stored;

pub use factor::FactorModel;
pub use ranker::Ranker;
pub use stored::StoredRanker;
