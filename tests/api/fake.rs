//! A test-only "DP" trainer: a small model plus controllable charges (per-rating eps =
//! the budgets it was given; one configurable RDP event per user), and switchable
//! failure modes (panic, error) to simulate crashes.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use dprec::train::{FactorModel, Fitted, Guarantee, TrainData, TrainError, Trainer};
use dprec_dp::accountant::PrivacyEvent;
use dprec_dp::charges::{
    MechanismRecord, Neighbour, PrivacyUnit, RatingCharge, ReleaseCharges, UserCharge,
};
use dprec_dp::rng::DpRng;

pub const OK: u8 = 0;
pub const PANIC: u8 = 1;
pub const FAIL: u8 = 2;
/// Charges twice the budget it was given (a buggy trainer the service must refuse).
pub const OVERCHARGE: u8 = 3;

pub struct FakeDp {
    pub mode: Arc<AtomicU8>,
    pub user_event: Option<PrivacyEvent>,
}

impl FakeDp {
    pub fn new(user_event: Option<PrivacyEvent>) -> (Arc<Self>, Arc<AtomicU8>) {
        let mode = Arc::new(AtomicU8::new(OK));
        (
            Arc::new(Self {
                mode: mode.clone(),
                user_event,
            }),
            mode,
        )
    }

    /// Gaussian user steps with noise multiplier `sigma`.
    pub fn gaussian(sigma: f64) -> (Arc<Self>, Arc<AtomicU8>) {
        Self::new(Some(PrivacyEvent::gaussian(sigma, 1).unwrap()))
    }
}

impl Trainer for FakeDp {
    fn name(&self) -> &'static str {
        "fake-dp"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({"rank": 2})
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::Proven
    }

    fn planned_user_event(&self) -> Option<PrivacyEvent> {
        self.user_event.clone()
    }

    /// The fake declares its user event as its user-level cost (whatever `m`); with no
    /// event it states a free user level (it charges only ratings).
    fn user_level_event(&self, _m: u64) -> Option<PrivacyEvent> {
        Some(
            self.user_event
                .clone()
                .unwrap_or(PrivacyEvent::PureDp { eps: 0.0, count: 1 }),
        )
    }

    fn fit(&self, data: &TrainData<'_>, _rng: &mut DpRng) -> Result<Fitted, TrainError> {
        let mode = self.mode.load(Ordering::SeqCst);
        if mode == PANIC {
            panic!("fake trainer crashed on purpose");
        }
        if mode == FAIL {
            return Err(TrainError::Numerical(
                "fake trainer failed on purpose".into(),
            ));
        }
        let r = data.ratings;
        if let Some(p) = data.prior {
            // The prior must be indexed like the training data.
            if p.item_factors.nrows() != r.n_items || p.user_bias.len() != r.n_users {
                return Err(TrainError::Numerical(format!(
                    "prior model is {}x{}, data is {}x{}",
                    p.user_bias.len(),
                    p.item_factors.nrows(),
                    r.n_users,
                    r.n_items
                )));
            }
        }
        let mut m = FactorModel::zeros(r.n_users, r.n_items, 2, r.mean(), data.scale);
        // Item factor = (number of ratings, mean rating); user factor = (1, 0): users'
        // top-N is the most rated item first.
        let mut sums = vec![(0.0f64, 0.0f64); r.n_items];
        for k in 0..r.len() {
            let s = &mut sums[r.items[k] as usize];
            s.0 += 1.0;
            s.1 += r.values[k] as f64;
        }
        for (j, (n, sum)) in sums.iter().enumerate() {
            m.item_factors[[j, 0]] = *n;
            m.item_factors[[j, 1]] = if *n > 0.0 { sum / n } else { 0.0 };
        }
        for u in 0..r.n_users {
            m.user_factors[[u, 0]] = 1.0;
        }
        let budgets = data.budgets.expect("the service always passes budgets");
        let factor = if mode == OVERCHARGE { 2.0 } else { 1.0 };
        let ratings = budgets
            .iter()
            .enumerate()
            .map(|(p, b)| RatingCharge {
                position: p as u32,
                eps: b * factor,
            })
            .collect();
        let mut users: Vec<u32> = r.users.clone();
        users.sort_unstable();
        users.dedup();
        let users = match &self.user_event {
            Some(e) => users
                .into_iter()
                .map(|u| UserCharge {
                    user: u,
                    event: e.clone(),
                })
                .collect(),
            None => Vec::new(),
        };
        Ok(Fitted {
            model: m,
            charges: ReleaseCharges {
                mechanisms: vec![MechanismRecord {
                    name: "fake-dp".into(),
                    // `offered` is a data count, as some trainers recorded one: the API
                    // must not publish it (tests/api/keys.rs).
                    params: serde_json::json!({"rank": 2, "offered": r.len()}),
                    unit: PrivacyUnit::Rating,
                    neighbour: Neighbour::AddRemove,
                }],
                ratings,
                users,
                rating_rho: Default::default(),
            },
            guarantee: Guarantee::Proven,
            ranker: None,
        })
    }
}
