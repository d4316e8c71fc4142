//! `paper-pdp-pmf` and `paper-dp-pmf`: PDP-PMF / DP-PMF as the paper describes them
//! (Algorithm 1 RSM + Algorithm 2), kept to reproduce the paper's comparison. Their
//! guarantee is [`Guarantee::PaperClaimed`] and their mechanism record carries
//! [`PAPER_FAITHFUL`]: the proof does not cover this code (DESIGN 2.1), because
//!
//! - U is learned by non-private PMF on the same (sampled) ratings and then treated as a
//!   constant;
//! - eta is resampled at every gradient iteration (a composition of `k2` mechanisms, not
//!   the one analysed), and the output is a gradient-descent iterate, not the minimiser;
//! - `Delta = r_max - r_min` bounds a value replacement, not the add/remove change of a
//!   residual, and the Jacobian term is ignored.
//!
//! Deviation needed to run it at all: the paper's learning rate `gamma = 50` on summed
//! gradients diverges; each row's gradient is divided by its number of sampled ratings
//! (at least 1) and `lr` is a parameter.
//!
//! The charges are reported as the paper claims them (`min(eps_ij, t)` per rating); the
//! ledger never accepts them because the guarantee is not `Proven`.

use ndarray::{Array1, Array2};

use super::step::{invalid, rating_and_user_charges};
use super::{parse_threshold, preferences, random_unit_rows, threshold_name, PreferenceGroups};
use crate::train::{FactorModel, Fitted, Guarantee, Params, TrainData, TrainError, Trainer};
use dprec_dp::charges::{MechanismRecord, Neighbour, PrivacyUnit, ReleaseCharges, PAPER_FAITHFUL};
use dprec_dp::privacy::{self, Threshold};
use dprec_dp::rng::DpRng;

#[derive(Debug, Clone)]
pub struct PaperPmf {
    /// `false`: `paper-pdp-pmf`; `true`: `paper-dp-pmf`.
    pub uniform: bool,
    pub d: usize,
    pub lambda_u: f64,
    pub lambda_v: f64,
    /// Step size on per-row averaged gradients.
    pub lr: f64,
    /// Non-private PMF iterations (Algorithm 2, lines 2-13).
    pub k1: usize,
    /// Perturbed item iterations, eta resampled each (lines 15-21).
    pub k2: usize,
    pub threshold: Threshold,
    pub groups: PreferenceGroups,
    pub eps: Option<f64>,
}

impl PaperPmf {
    pub fn from_params(p: &Params, uniform: bool) -> Result<Self, TrainError> {
        let name = if uniform {
            "paper-dp-pmf"
        } else {
            "paper-pdp-pmf"
        };
        let mut t = Self {
            uniform,
            d: p.usize_in("d", 20, 1, 1024)?,
            lambda_u: p.non_negative("lambda_u", 0.01)?,
            lambda_v: p.non_negative("lambda_v", 0.01)?,
            lr: p.positive("lr", 0.05)?,
            k1: p.usize_in("k1", 50, 0, 100_000)?,
            k2: p.usize_in("k2", 50, 1, 100_000)?,
            threshold: Threshold::Mean,
            groups: PreferenceGroups::default(),
            eps: None,
        };
        if uniform {
            let eps = p.positive("eps", 0.1)?;
            t.eps = Some(eps);
            t.threshold = Threshold::Fixed(eps);
        } else {
            t.threshold = parse_threshold(p, Threshold::Mean)?;
            t.groups = PreferenceGroups::from_params(p)?;
            t.eps = match p.get_str("eps") {
                None => None,
                Some(_) => Some(p.positive("eps", 1.0)?),
            };
        }
        p.reject_unknown(name)?;
        Ok(t)
    }
}

/// One full-batch gradient step on the rows of `a` (`n x d`), gradient
/// `-sum e * b_other + reg * a_row`, divided by the row's count (at least 1).
fn row_step(a: &mut Array2<f64>, grad: &Array2<f64>, counts: &[usize], reg: f64, lr: f64) {
    for (i, (mut row, g)) in a.rows_mut().into_iter().zip(grad.rows()).enumerate() {
        let s = lr / counts[i].max(1) as f64;
        for (x, gx) in row.iter_mut().zip(g.iter()) {
            *x -= s * (gx + reg * *x);
        }
    }
}

impl Trainer for PaperPmf {
    fn name(&self) -> &'static str {
        if self.uniform {
            "paper-dp-pmf"
        } else {
            "paper-pdp-pmf"
        }
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::PaperClaimed
    }

    fn params(&self) -> serde_json::Value {
        let mut m = serde_json::json!({
            "d": self.d, "lambda_u": self.lambda_u, "lambda_v": self.lambda_v, "lr": self.lr,
            "k1": self.k1, "k2": self.k2, "eps": self.eps,
        });
        if !self.uniform {
            m["threshold"] = threshold_name(self.threshold);
            if let (Some(o), serde_json::Value::Object(g)) = (m.as_object_mut(), self.groups.json())
            {
                o.extend(g);
            }
        }
        m
    }

    fn fit(&self, data: &TrainData<'_>, rng: &mut DpRng) -> Result<Fitted, TrainError> {
        let r = data.ratings;
        if r.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let prefs = preferences(data, self.eps, &self.groups, rng)?;
        let eligible: Vec<f64> = match (self.uniform, self.eps) {
            (true, Some(eps)) => prefs
                .iter()
                .map(|&b| if b >= eps { eps } else { 0.0 })
                .collect(),
            _ => prefs,
        };
        let offered: Vec<f64> = eligible.iter().copied().filter(|&e| e > 0.0).collect();
        if offered.is_empty() {
            return Err(TrainError::EmptyData);
        }
        let t = self
            .threshold
            .compute(&offered)
            .map_err(|e| invalid("threshold", e.to_string()))?;
        // Algorithm 1: RSM.
        let mut kept = Vec::new();
        for (k, &e) in eligible.iter().enumerate() {
            if e > 0.0 && privacy::sample_in(e, t, rng)? {
                kept.push(k);
            }
        }
        let (nu, ni) = (data.matrix.n_users, data.matrix.n_items);
        let (u, vbar) = self.algorithm2(data, &kept, t, rng)?;
        let (ratings, users) = rating_and_user_charges(r, &eligible, t)?;
        let record = self.mechanism_record(t, data.scale.width());
        let model = FactorModel {
            global_mean: 0.0,
            user_bias: Array1::zeros(nu),
            item_bias: Array1::zeros(ni),
            user_factors: u,
            item_factors: vbar,
            scale: data.scale,
        };
        Ok(Fitted {
            model,
            charges: ReleaseCharges {
                mechanisms: vec![record],
                ratings,
                users,
                rating_rho: Default::default(),
            },
            guarantee: Guarantee::PaperClaimed,
            ranker: None,
        })
    }
}

impl PaperPmf {
    /// Algorithm 2 on the kept ratings (positions in `data.ratings`): random unit-norm
    /// U, V; `k1` non-private PMF gradient iterations; then V-bar from V with `k2`
    /// perturbed iterations at threshold `t`. Returns (U, V-bar).
    fn algorithm2(
        &self,
        data: &TrainData<'_>,
        kept: &[usize],
        t: f64,
        rng: &mut DpRng,
    ) -> Result<(Array2<f64>, Array2<f64>), TrainError> {
        let r = data.ratings;
        let (nu, ni, d) = (data.matrix.n_users, data.matrix.n_items, self.d);
        let mut nu_count = vec![0usize; nu];
        let mut ni_count = vec![0usize; ni];
        for &k in kept {
            nu_count[r.users[k] as usize] += 1;
            ni_count[r.items[k] as usize] += 1;
        }
        // Random unit-norm U, V; k1 non-private PMF gradient iterations.
        let mut u = random_unit_rows(nu, d, rng);
        let mut v = random_unit_rows(ni, d, rng);
        let grads =
            |u: &Array2<f64>, v: &Array2<f64>, gu: &mut Array2<f64>, gv: &mut Array2<f64>| {
                gu.fill(0.0);
                gv.fill(0.0);
                for &k in kept {
                    let (i, j) = (r.users[k] as usize, r.items[k] as usize);
                    let e = r.values[k] as f64 - u.row(i).dot(&v.row(j));
                    gu.row_mut(i).scaled_add(-e, &v.row(j));
                    gv.row_mut(j).scaled_add(-e, &u.row(i));
                }
            };
        let mut gu = Array2::zeros((nu, d));
        let mut gv = Array2::zeros((ni, d));
        for _ in 0..self.k1 {
            grads(&u, &v, &mut gu, &mut gv);
            row_step(&mut u, &gu, &nu_count, self.lambda_u, self.lr);
            row_step(&mut v, &gv, &ni_count, self.lambda_v, self.lr);
        }
        // Lines 14-21: V-bar from V, k2 perturbed iterations with eta resampled each time,
        // density exp(-t ||eta|| / Delta), Delta = r_max - r_min (paper, Remark 7).
        let delta = data.scale.width();
        let mut vbar = v;
        for _ in 0..self.k2 {
            grads(&u, &vbar, &mut gu, &mut gv);
            for mut row in gv.rows_mut() {
                let eta = privacy::objective_perturbation(d, t, delta, rng)?;
                for (g, e) in row.iter_mut().zip(eta) {
                    *g += e;
                }
            }
            row_step(&mut vbar, &gv, &ni_count, self.lambda_v, self.lr);
        }
        Ok((u, vbar))
    }

    /// What [`Trainer::fit`] records of its mechanism: the paper's claim, not a proof.
    fn mechanism_record(&self, t: f64, delta: f64) -> MechanismRecord {
        let d = self.d;
        MechanismRecord {
            name: if self.uniform {
                "paper-dp-pmf"
            } else {
                "paper-pdp-pmf"
            }
            .into(),
            params: serde_json::json!({
                "label": PAPER_FAITHFUL,
                "t": t,
                "threshold": threshold_name(self.threshold),
                // The paper's mean/max are read from the preferences present: private
                // under add/remove, so published only under the paper-faithful label.
                "threshold_public": matches!(self.threshold, Threshold::Fixed(_)),
                "sensitivity": delta,
                "d": d, "lambda_u": self.lambda_u, "lambda_v": self.lambda_v,
                "lr": self.lr, "k1": self.k1, "k2": self.k2,
                "claim": "paper Theorem 6: eps_ij-PDP per rating (not proven for this code)",
            }),
            unit: PrivacyUnit::Rating,
            neighbour: Neighbour::AddRemove,
        }
    }
}
