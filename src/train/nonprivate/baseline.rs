//! Biases-only baseline: r_ui ~ mu + b_u + b_i, fitted by alternating closed-form
//! ridge updates (the "BaselineOnly" of Koren 2010 / Surprise, ALS flavour).

use crate::data::Interactions;
use crate::train::{FactorModel, Fitted, Guarantee, Params, TrainData, TrainError, Trainer};
use dprec_dp::rng::DpRng;

#[derive(Debug, Clone)]
pub struct Baseline {
    /// Ridge penalty of item biases.
    pub reg_item: f64,
    /// Ridge penalty of user biases.
    pub reg_user: f64,
    pub epochs: usize,
}

impl Default for Baseline {
    fn default() -> Self {
        Self {
            reg_item: 10.0,
            reg_user: 15.0,
            epochs: 10,
        }
    }
}

impl Baseline {
    pub fn from_params(p: &Params) -> Result<Self, TrainError> {
        let d = Self::default();
        let t = Self {
            reg_item: p.non_negative("reg_item", d.reg_item)?,
            reg_user: p.non_negative("reg_user", d.reg_user)?,
            epochs: p.usize_in("epochs", d.epochs, 1, 1000)?,
        };
        p.reject_unknown("baseline")?;
        Ok(t)
    }
}

/// Fits user and item biases around `mean` in place; shared by other trainers that
/// start from the baseline.
pub fn fit_biases(
    m: &Interactions,
    mean: f64,
    reg_user: f64,
    reg_item: f64,
    epochs: usize,
    user_bias: &mut [f64],
    item_bias: &mut [f64],
) {
    for _ in 0..epochs {
        for (i, bi) in item_bias.iter_mut().enumerate() {
            let (users, vals) = m.by_item().row(i);
            let s: f64 = users
                .iter()
                .zip(vals)
                .map(|(&u, &r)| r as f64 - mean - user_bias[u as usize])
                .sum();
            *bi = s / (reg_item + users.len() as f64);
        }
        for (u, bu) in user_bias.iter_mut().enumerate() {
            let (items, vals) = m.by_user.row(u);
            let s: f64 = items
                .iter()
                .zip(vals)
                .map(|(&i, &r)| r as f64 - mean - item_bias[i as usize])
                .sum();
            *bu = s / (reg_user + items.len() as f64);
        }
    }
}

impl Trainer for Baseline {
    fn name(&self) -> &'static str {
        "baseline"
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::NonPrivate
    }

    fn params(&self) -> serde_json::Value {
        serde_json::json!({"reg_item": self.reg_item, "reg_user": self.reg_user, "epochs": self.epochs})
    }

    fn fit(&self, data: &TrainData<'_>, _rng: &mut DpRng) -> Result<Fitted, TrainError> {
        if data.ratings.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let m = data.matrix;
        let mean = data.ratings.mean();
        let mut model = FactorModel::zeros(m.n_users, m.n_items, 0, mean, data.scale);
        fit_biases(
            m,
            mean,
            self.reg_user,
            self.reg_item,
            self.epochs,
            model.user_bias.as_slice_mut().expect("contiguous"),
            model.item_bias.as_slice_mut().expect("contiguous"),
        );
        Ok(Fitted::non_private(model))
    }
}
