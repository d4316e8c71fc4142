//! Trainer `private-gd`: simulates the Private-GD / GD-DR protocol
//! ([`crate::ldp::private_gd`]) with every user of the training data as a client.
//!
//! Each of the `rounds` rounds, every user fits its own profile against the public item
//! profiles, sends one `eps/rounds`-LDP bit about one coordinate of its clipped,
//! projected gradient, and the curator updates the item profiles from the bits. The
//! model's user side (bias and factors) is what each client computes on its own device
//! against the final item profiles; only the item profiles are a curator output.
//!
//! Charges: every user, once per round, `PureDp { eps: eps / rounds }` at user level
//! (the report is LDP for the user's whole data). The ratings themselves are charged
//! nothing more: training on LDP reports is post-processing (DESIGN 3).

use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::data::Interactions;
use crate::ldp::private_gd::{
    local_profile, next_state, report_with_profile, Aggregator, ClientSettings, LocalProfile,
    ProjectionSpec, Recovery, RoundState, Schedule,
};
use crate::train::{
    FactorModel, Fitted, Guarantee, Params, ReleaseCharges, TrainData, TrainError, Trainer,
};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::charges::{MechanismRecord, Neighbour, PrivacyUnit, UserCharge};
use dprec_dp::rng::DpRng;

/// Users per parallel task of the simulator.
const CHUNK_USERS: usize = 512;

#[derive(Debug, Clone, PartialEq)]
pub struct PrivateGd {
    /// User-level local eps over all rounds.
    pub eps: f64,
    /// Number of rounds `k` (the paper's iterations).
    pub rounds: u32,
    pub d: usize,
    /// GD-DR (random projection) when true, else Private-GD (Algorithm 1).
    pub project: bool,
    /// Projection dimension `q`; 0 = `ceil(m / 10)` (the paper's 2700 for 26,744 items).
    pub dim: usize,
    pub clip: f64,
    pub lr: f64,
    pub reg_item: f64,
    pub reg_user: f64,
    pub correction: bool,
    pub init_sd: f64,
    /// Public offset; `None` = the midpoint of the rating scale.
    pub offset: Option<f64>,
    pub user_bias: bool,
}

impl Default for PrivateGd {
    fn default() -> Self {
        Self {
            eps: 0.1,
            rounds: 10,
            d: 15,
            project: true,
            dim: 0,
            clip: 1.0,
            lr: 1.0,
            reg_item: 1e-8,
            reg_user: 5.0,
            correction: true,
            init_sd: 0.1,
            offset: None,
            user_bias: true,
        }
    }
}

impl PrivateGd {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let d = Self::default();
        let offset =
            match p.get_str("offset") {
                None | Some("mid") => None,
                Some(s) => Some(s.parse::<f64>().ok().filter(|x| x.is_finite()).ok_or_else(
                    || crate::train::ParamError::Invalid {
                        key: "offset".into(),
                        reason: format!("{s:?} is neither \"mid\" nor a finite number"),
                    },
                )?),
            };
        let t = Self {
            eps: p.positive("eps", d.eps)?,
            rounds: p.usize_in("rounds", d.rounds as usize, 1, 10_000)? as u32,
            d: p.usize_in("d", d.d, 1, 500)?,
            project: p.bool("project", d.project)?,
            dim: p.usize_in("dim", d.dim, 0, 10_000_000)?,
            clip: p.positive("clip", d.clip)?,
            lr: p.positive("lr", d.lr)?,
            reg_item: p.non_negative("reg_item", d.reg_item)?,
            reg_user: p.positive("reg_user", d.reg_user)?,
            correction: p.bool("correction", d.correction)?,
            init_sd: p.non_negative("init_sd", d.init_sd)?,
            offset,
            user_bias: p.bool("user_bias", d.user_bias)?,
        };
        p.reject_unknown("private-gd")?;
        Ok(t)
    }

    /// The protocol schedule for a catalogue of `n_items` with the projection seeded by
    /// `seed` (public).
    pub fn schedule(&self, n_items: usize, offset: f64, seed: u64) -> Schedule {
        let projection = self.project.then(|| ProjectionSpec {
            seed,
            dim: if self.dim == 0 {
                n_items.div_ceil(10).max(1)
            } else {
                self.dim
            },
        });
        Schedule {
            eps_total: self.eps,
            rounds: self.rounds,
            rank: self.d,
            projection,
            clip: self.clip,
            lr: self.lr,
            reg_item: self.reg_item,
            correction: self.correction,
            client: ClientSettings {
                offset,
                reg_user: self.reg_user,
                user_bias: self.user_bias,
            },
        }
    }
}

fn user_ratings(m: &Interactions, u: usize) -> Vec<(u32, f64)> {
    let (items, vals) = m.by_user.row(u);
    items
        .iter()
        .zip(vals)
        .map(|(&i, &v)| (i, f64::from(v)))
        .collect()
}

/// Plays one round with every user of `m` as a client (in parallel; user `u` draws from
/// ChaCha stream `u` of `key`) and returns the aggregated bits.
pub fn simulate_round(
    state: &RoundState,
    m: &Interactions,
    key: [u8; 32],
) -> Result<Aggregator, TrainError> {
    let starts: Vec<usize> = (0..m.n_users).step_by(CHUNK_USERS).collect();
    let parts: Vec<Aggregator> = starts
        .into_par_iter()
        .map(|start| {
            let mut agg = Aggregator::new(state);
            for u in start..(start + CHUNK_USERS).min(m.n_users) {
                let ratings = user_ratings(m, u);
                let profile = local_profile(state, &ratings)?;
                let mut rng = DpRng::from_seed(key);
                rng.set_stream(u as u64);
                let r = report_with_profile(state, &ratings, &profile, &mut rng)?;
                agg.add(state, &r)?;
            }
            Ok(agg)
        })
        .collect::<Result<_, TrainError>>()?;
    let mut total = Aggregator::new(state);
    for p in &parts {
        total.merge(p);
    }
    Ok(total)
}

/// Every user's own profile against the item profiles of `state`.
pub fn local_profiles(
    state: &RoundState,
    m: &Interactions,
) -> Result<Vec<LocalProfile>, TrainError> {
    (0..m.n_users)
        .into_par_iter()
        .map(|u| Ok(local_profile(state, &user_ratings(m, u))?))
        .collect()
}

impl Trainer for PrivateGd {
    fn name(&self) -> &'static str {
        "private-gd"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "eps": self.eps, "rounds": self.rounds, "d": self.d, "project": self.project,
            "dim": self.dim, "clip": self.clip, "lr": self.lr, "reg_item": self.reg_item,
            "reg_user": self.reg_user, "correction": self.correction, "init_sd": self.init_sd,
            "offset": self.offset.map_or(serde_json::json!("mid"), |o| serde_json::json!(o)),
            "user_bias": self.user_bias,
        })
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Proven
    }

    fn planned_user_event(&self) -> Option<PrivacyEvent> {
        Some(PrivacyEvent::PureDp {
            eps: self.eps / f64::from(self.rounds),
            count: u64::from(self.rounds),
        })
    }

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        if data.ratings.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let m = data.matrix;
        let offset = self
            .offset
            .unwrap_or((data.scale.min + data.scale.max) / 2.0);
        let schedule = self.schedule(m.n_items, offset, rng.random());
        schedule.validate(m.n_items).map_err(|e| {
            TrainError::Param(crate::train::ParamError::Invalid {
                key: "private-gd".into(),
                reason: e.to_string(),
            })
        })?;
        let recovery = Recovery::new(&schedule, m.n_items)?;
        let mut state = RoundState::initial(schedule.clone(), m.n_items, self.init_sd, rng)?;
        for _ in 0..self.rounds {
            let agg = simulate_round(&state, m, rng.random())?;
            state = next_state(&state, &recovery, &agg)?;
        }
        let profiles = local_profiles(&state, m)?;
        let mut model = FactorModel::zeros(m.n_users, m.n_items, self.d, offset, data.scale);
        for (u, p) in profiles.iter().enumerate() {
            model.user_bias[u] = p.bias;
            for (x, y) in model.user_factors.row_mut(u).iter_mut().zip(&p.factors) {
                *x = *y;
            }
        }
        model.item_factors = state.item_factors;
        let eps_round = schedule.eps_round();
        let event = PrivacyEvent::PureDp {
            eps: eps_round,
            count: 1,
        };
        let mut users = Vec::with_capacity(m.n_users * self.rounds as usize);
        for _ in 0..self.rounds {
            users.extend((0..m.n_users).map(|u| UserCharge {
                user: u as u32,
                event: event.clone(),
            }));
        }
        let charges = ReleaseCharges {
            mechanisms: vec![MechanismRecord {
                name: "private-gd-one-bit-report".into(),
                params: serde_json::json!({
                    "eps_round": eps_round, "rounds": self.rounds, "eps_total": self.eps,
                    "rows": schedule.report_rows(m.n_items), "rank": self.d, "clip": self.clip,
                    "projection_dim": schedule.projection.map(|p| p.dim),
                    "correction": self.correction, "local": true,
                }),
                unit: PrivacyUnit::User,
                neighbour: Neighbour::Replace,
            }],
            ratings: Vec::new(),
            users,
            rating_rho: Default::default(),
        };
        Ok(Fitted {
            model,
            charges,
            guarantee: Guarantee::Proven,
            ranker: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{RatingScale, Ratings};
    use dprec_dp::rng::seeded;

    fn small_data() -> Ratings {
        let mut r = Ratings::default();
        let mut rng = seeded(4);
        for u in 0..60u32 {
            for i in 0..30u32 {
                if rng.random_bool(0.3) {
                    let v = if (u + i) % 3 == 0 { 5.0 } else { 2.0 };
                    r.push(u, i, v);
                }
            }
        }
        r
    }

    #[test]
    fn params_parse_and_reject_unknown() {
        let p = Params::parse(&[
            "eps=0.5",
            "rounds=3",
            "dim=7",
            "offset=0",
            "user_bias=false",
        ])
        .unwrap();
        let t = PrivateGd::from_params(&p).unwrap();
        assert_eq!(
            (t.eps, t.rounds, t.dim, t.offset, t.user_bias),
            (0.5, 3, 7, Some(0.0), false)
        );
        assert!(PrivateGd::from_params(&Params::parse(&["offset=x"]).unwrap()).is_err());
        assert!(PrivateGd::from_params(&Params::parse(&["k=3"]).unwrap()).is_err());
    }

    /// Every user is charged eps/rounds once per round, at user level; the run is
    /// reproducible from its seed.
    #[test]
    fn charges_each_user_once_per_round_and_is_deterministic() {
        let r = small_data();
        let m = Interactions::new(&r);
        let data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
        let t = PrivateGd::from_params(
            &Params::parse(&["eps=1.5", "rounds=3", "d=4", "dim=5"]).unwrap(),
        )
        .unwrap();
        let a = t.fit(&data, &mut seeded(9)).unwrap();
        let b = t.fit(&data, &mut seeded(9)).unwrap();
        assert_eq!(a.model.item_factors, b.model.item_factors);
        assert_eq!(a.charges.users.len(), 3 * m.n_users);
        let per_user = a.charges.user_events();
        assert_eq!(per_user.len(), m.n_users);
        for events in per_user.values() {
            assert_eq!(events.len(), 3);
            for e in events {
                assert_eq!(e, &PrivacyEvent::PureDp { eps: 0.5, count: 1 });
            }
        }
        assert_eq!(a.charges.mechanisms[0].unit, PrivacyUnit::User);
        assert!(a.charges.ratings.is_empty());
        assert_eq!(a.guarantee, Guarantee::Proven);
        let c = t.fit(&data, &mut seeded(10)).unwrap();
        assert_ne!(a.model.item_factors, c.model.item_factors);
    }

    /// With a large budget the bits carry signal: on a rank-1 pattern (r = 5 when the
    /// user's and the item's type agree, else 1) with 4000 users, the profiles learned at
    /// eps = 200 fit the data far better than at eps = 0.05, where the bits are noise.
    #[test]
    fn large_eps_learns_more_than_tiny_eps() {
        let mut r = Ratings::default();
        let mut rng = seeded(4);
        for u in 0..4000u32 {
            for i in 0..8u32 {
                if rng.random_bool(0.6) {
                    r.push(u, i, if (u % 2) == (i % 2) { 5.0 } else { 1.0 });
                }
            }
        }
        let m = Interactions::new(&r);
        let data = TrainData::new(&r, &m, RatingScale::ONE_TO_FIVE);
        let rmse = |eps: &str| {
            let p = Params::parse(&[
                format!("eps={eps}"),
                "rounds=10".into(),
                "d=2".into(),
                "project=false".into(),
                "lr=1".into(),
                "correction=false".into(),
                "reg_user=1".into(),
                "user_bias=false".into(),
            ])
            .unwrap();
            let t = PrivateGd::from_params(&p).unwrap();
            let f = t.fit(&data, &mut seeded(1)).unwrap();
            crate::model::factor::rmse(&f.model.predict_all(&r), &r)
        };
        let hi = rmse("200");
        let lo = rmse("0.05");
        assert!(
            hi < 0.5 && hi < 0.5 * lo,
            "eps=200 rmse {hi}, eps=0.05 rmse {lo}"
        );
    }
}
