//! What a release spends the budget left after the counts on.

use super::*;

/// What a release spends the budget left after the counts on (issue 20).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "split")]
pub enum Split {
    /// The DP Gram over the candidates (personal lists).
    Gram,
    /// A second DP count release, pooled with the first by inverse variance: the lists
    /// are DP popularity at exactly the noise of a counts-only release of the same plan
    /// (less the trace share, if any).
    Counts,
    /// Opt-in (docs/privacy/dp-topn.md 2b): `share` of the budget releases a noised
    /// leave-one-out difference between EASE on the Gram averaged over the releases (ridge
    /// `edges` noise edges of the average) and the combined counts; the rest goes to the
    /// Gram while exploring (alternating until `explore` Gram releases) and then while
    /// the combined difference exceeds `margin` of its sd, to counts otherwise. The list
    /// served is EASE on the average under the same condition, else the counts.
    Select {
        share: f64,
        explore: u64,
        margin: f64,
        edges: f64,
        /// The state restarts (a release without a state) when fewer than this share of
        /// the held candidates are among the combined counts' candidates (0: never; 0.5
        /// by default, a round value not tuned: docs/privacy/dp-topn.md 2b).
        refresh: f64,
    },
}

impl Split {
    /// The default rule: the selecting split
    /// (lab note eval-08, "The selecting rule as the default").
    pub const DEFAULT: Split = Split::SELECT;

    /// A release without a selecting state tests the DP trace of the candidates' Gram
    /// (`sum_u ||x_u||^2`, the energy the Gram would hold) against this many noise edges
    /// of the Gram ([`noise_edge`]): the Gram when it reaches them, a second count release
    /// otherwise (the threshold of the trace rule the selecting rule replaced, lab note
    /// eval-05, "Every shape of data").
    pub const TRACE_TAU: f64 = 160.0;

    /// The rating-level multiplier a selecting release keeps is that of the trace rule
    /// it replaced at the same `count_share`, whose trace took this share
    /// ([`DpTopN::shares`]): a rating at the service's default eps_ij takes full part.
    pub const TRACE_RULE_SHARE: f64 = 0.02;

    /// The selecting rule's measured settings
    /// (lab note eval-07, "Measured, not built: choosing between
    /// the averaged Gram and the counts").
    pub const SELECT: Split = Split::Select {
        share: 0.05,
        explore: 5,
        margin: 1.5,
        edges: 4.0,
        refresh: 0.5,
    };

    /// `split=select|gram|counts`, with `select_share`, `select_explore`,
    /// `select_margin`, `select_edges` and `select_refresh` for select (given with another
    /// split they are unknown parameters: a release records only what it used).
    pub(super) fn from_params(p: &Params) -> Result<Self, TrainError> {
        Ok(match p.get_str("split").unwrap_or("select") {
            "gram" => Split::Gram,
            "counts" => Split::Counts,
            "select" => {
                let Split::Select {
                    share,
                    explore,
                    margin,
                    edges,
                    refresh,
                } = Split::SELECT
                else {
                    unreachable!("the selecting default is select")
                };
                Split::Select {
                    share: p.positive("select_share", share)?,
                    explore: p.usize_in("select_explore", explore as usize, 0, 1_000_000)? as u64,
                    margin: p.non_negative("select_margin", margin)?,
                    edges: p.positive("select_edges", edges)?,
                    refresh: match p.non_negative("select_refresh", refresh)? {
                        r if r <= 1.0 => r,
                        r => {
                            return Err(invalid(
                                "select_refresh",
                                format!("a share of the held candidates, at most 1, got {r}"),
                            ))
                        }
                    },
                }
            }
            other => {
                return Err(invalid(
                    "split",
                    format!("{other:?} is not select, gram or counts"),
                ))
            }
        })
    }

    /// The share of the selection statistic (select only).
    pub(super) fn select_share(&self) -> f64 {
        match self {
            Split::Select { share, .. } => *share,
            _ => 0.0,
        }
    }

    /// What the share before the rest takes: the selection's.
    pub(super) fn steering_share(&self) -> f64 {
        self.select_share()
    }
}
