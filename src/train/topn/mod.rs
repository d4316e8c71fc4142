//! Top-N rankers: `dp-topn` (DP counts, DP candidates, DP Gram of clipped user rows),
//! the item-side ranking models it serves, and the reference rankers (popularity, DP
//! popularity, EASE) every served list is judged against.

pub mod continual;
pub mod contribution;
pub mod dp_topn;
pub mod label_stats;
pub mod references;
pub mod selection;
pub mod suffstats;
