//! The release plan: the user's lifetime plan and the rating-level budget parameter.

use super::*;

/// A user's lifetime plan: `releases` releases inside `(eps_u, delta_u)`.
///
/// Its noise is calibrated exactly as the service calibrates a release: the per-release
/// multiplier is the smallest whose `releases` compositions the user's Renyi filter
/// admits ([`accountant::plan::calibrate_gaussian`] on [`Self::lifetime`]), so a trainer
/// built on the service's plan needs no further factor there
/// (`units::calibrate_release` returns 1).
///
/// [`accountant::plan::calibrate_gaussian`]: dprec_dp::accountant::plan::calibrate_gaussian
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ReleasePlan {
    pub eps_u: f64,
    pub delta_u: f64,
    pub releases: u64,
}

impl ReleasePlan {
    /// The service's default plan: [`DEFAULT_PLANNED_RELEASES`] releases inside the
    /// default user budget (`dprec_dp::defaults`).
    ///
    /// [`DEFAULT_PLANNED_RELEASES`]: dprec_dp::accountant::DEFAULT_PLANNED_RELEASES
    pub fn served() -> Self {
        use dprec_dp::defaults as b;
        Self {
            eps_u: b::USER_EPS,
            delta_u: b::USER_DELTA,
            releases: u64::from(dprec_dp::accountant::DEFAULT_PLANNED_RELEASES),
        }
    }

    /// The plan as the accountant's lifetime plan (the per-user Renyi filter it is
    /// calibrated against).
    pub fn lifetime(&self) -> Result<LifetimePlan, TrainError> {
        self.lifetime_of(self.releases)
    }

    /// `compositions` releases inside this plan's `(eps_u, delta_u)`.
    pub(super) fn lifetime_of(&self, compositions: u64) -> Result<LifetimePlan, TrainError> {
        let t = u32::try_from(compositions)
            .map_err(|_| invalid("releases", format!("{compositions} is too many")))?;
        Ok(LifetimePlan::new(t, self.eps_u, self.delta_u)?)
    }

    /// The per-release Gaussian noise multiplier `z`: the smallest for which `releases`
    /// compositions fit the user's Renyi filter of `(eps_u, delta_u)` (the service's
    /// admission rule, so the plan's user-level charges are always admitted).
    pub fn noise_multiplier(&self) -> Result<f64, TrainError> {
        Ok(calibrate_gaussian(&self.lifetime()?, 1)?)
    }

    /// The node multiplier of a continual release by tree aggregation over `releases`
    /// periods (`privacy::tree`): the whole stream is `levels(releases)` Gaussian
    /// mechanisms, so they (not `releases`) must fit `(eps_u, delta_u)`, calibrated as
    /// [`Self::noise_multiplier`] (through the Renyi filter). Valid only for statistics
    /// that meet the tree's condition (docs/privacy/dp-topn.md section 4).
    pub fn tree_noise_multiplier(&self) -> Result<f64, TrainError> {
        let l = dprec_dp::privacy::tree::levels(self.releases).map_err(numerical)?;
        Ok(calibrate_gaussian(&self.lifetime_of(u64::from(l))?, 1)?)
    }
}

/// The per-rating budget the service gives a rating with the default eps_ij on its first
/// release (`dprec_dp::defaults`: share 0.1 of eps_ij 12, so 1.2): the default `eps_r` of
/// the trainers `dprec-lab eval` runs as served (a trainer that publishes its own DP counts
/// gets the whole share: the service runs no separate popularity release for it).
pub fn served_eps_r() -> Option<f64> {
    use dprec_dp::defaults as b;
    dprec_dp::ledger::release_share(b::SHARE, b::RATING_EPS, 0.0, b::MIN_RELEASE_EPS)
}

/// The `eps_r` parameter: a number, `none` (every rating takes full part: one-release or
/// paper settings), or `default` when absent.
pub fn eps_r_param(p: &Params, default: Option<f64>) -> Result<Option<f64>, TrainError> {
    Ok(match p.get_str("eps_r") {
        None => default,
        Some("none") => None,
        Some(_) => Some(p.positive("eps_r", 1.0)?),
    })
}
