//! The selecting rule (`split=select`): the prior state, the leave-one-out statistic and
//! the lists it chooses between.

use super::*;

/// EASE's list and its `P = (G + lambda I)^-1` (the selection scores users against `P`
/// corrected for their own rows).
pub(super) type EaseWithInverse = (ItemRanker, Vec<f64>);

impl DpTopN {
    /// The Gram state of the last release (`data.prior_counts`) when this release
    /// continues it: the same count basis and catalogue (as [`CountHistory::update`]).
    pub(super) fn prior_gram<'a>(&self, data: &TrainData<'a>) -> Option<&'a GramState> {
        if !matches!(self.split, Split::Select { .. }) {
            return None;
        }
        let basis = self.count_basis(data.scale);
        data.prior_counts
            .filter(|p| p.basis == basis && p.mean.len() == data.matrix.n_items)
            .and_then(|p| p.gram.as_deref())
    }

    /// The rest of a selecting release (public: from the prior state only,
    /// [`select_rest_is_gram`]): `Some(candidates)` for the Gram, over the held set when
    /// the state has one, else over the candidates of the counts combined with this
    /// release's (they become the held set); `None` for counts (also when there are no
    /// candidates).
    pub(super) fn select_rest(
        &self,
        data: &TrainData<'_>,
        prior: Option<&GramState>,
        noisy: &[f64],
        sigma_count: f64,
    ) -> Result<Option<Vec<u32>>, TrainError> {
        let Split::Select {
            explore, margin, ..
        } = self.split
        else {
            return Ok(None);
        };
        if !select_rest_is_gram(prior, explore, margin) {
            return Ok(None);
        }
        if let Some(g) = prior.filter(|g| !g.candidates.is_empty()) {
            return Ok(Some(g.candidates.clone()));
        }
        let combined = self.combined(data, noisy, sigma_count)?;
        let held = select_candidates(&combined.mean, self.threshold * sigma_count, self.k);
        Ok((!held.is_empty()).then_some(held))
    }

    /// Whether a selecting state's held candidates went stale (public: the state and this
    /// release's counts): fewer than `refresh` of them are among the candidates of the
    /// counts combined with this release's. The release then runs without the state (the
    /// trace test; a new state starts), as after a catalogue change.
    pub(super) fn held_is_stale(
        &self,
        data: &TrainData<'_>,
        g: &GramState,
        noisy: &[f64],
        sigma_count: f64,
    ) -> Result<bool, TrainError> {
        let Split::Select { refresh, .. } = self.split else {
            return Ok(false);
        };
        if refresh <= 0.0 || g.candidates.is_empty() {
            return Ok(false);
        }
        let combined = self.combined(data, noisy, sigma_count)?;
        let now: std::collections::HashSet<u32> =
            select_candidates(&combined.mean, self.threshold * sigma_count, self.k)
                .into_iter()
                .collect();
        let kept = g.candidates.iter().filter(|j| now.contains(j)).count();
        Ok((kept as f64) < refresh * g.candidates.len() as f64)
    }

    /// The counts `combine_counts` will serve after this release (post-processing).
    pub(super) fn combined(
        &self,
        data: &TrainData<'_>,
        counts: &[f64],
        sigma_count: f64,
    ) -> Result<CountHistory, TrainError> {
        Ok(CountHistory::update(
            data.prior_counts,
            &self.count_basis(data.scale),
            counts,
            sigma_count,
            drift_for(self.plan.releases),
        )?)
    }

    /// The selection statistic of a selecting release (after its counts and Gram): adds
    /// this release's Gram to the state, and draws `D = sum_u v_u + N(0, z_s^2)` from the
    /// noise stream with `v_u` from [`loo_values`] comparing EASE on the average with the
    /// combined counts. The first release of a state (no prior) draws no `D`: its
    /// steering share paid for the trace test. Later, before any Gram was released there
    /// is nothing to compare: `D` is still drawn (the share is spent whatever the data)
    /// but is pure noise and is not added to the state.
    pub(super) fn select_step(
        &self,
        data: &TrainData<'_>,
        step: &SelectStep<'_>,
        (noise, stages): (&mut DpRng, &mut Vec<GaussianStage>),
    ) -> Result<GramState, TrainError> {
        let z_s = self
            .select_multiplier()?
            .ok_or_else(|| invalid("split", "the selection step needs split=select"))?;
        let mut state = step.prior.cloned().unwrap_or_else(GramState::empty);
        let released = !step.gram.is_empty();
        if released {
            let k = step.candidates.len();
            if state.candidates.is_empty() {
                state.candidates = step.candidates.to_vec();
                state.sum = vec![0.0; k * k];
            }
            if state.candidates != step.candidates || step.gram.len() != k * k {
                return Err(invalid("gram", "the Gram is not over the held candidates"));
            }
            state
                .sum
                .iter_mut()
                .zip(step.gram)
                .for_each(|(s, x)| *s += x);
            state.grams += 1;
            state.noise_var += step.sigma_gram * step.sigma_gram;
        }
        state.last_was_gram = released;
        if step.prior.is_none() {
            // The first release of a state spent the steering share on the trace.
            return Ok(state);
        }
        let combined = self.combined(data, step.counts, step.sigma_count)?.mean;
        let lists = self.select_lists_with_inverse(&state, &combined, step.sigma_count)?;
        let sum: i64 = match &lists.0 {
            Some((ease, p)) => {
                let digest =
                    |u: usize, j: u32| step.key.digest(&user_label(data, u), &item_label(data, j));
                let ease = ListHits::leave_user_out(ease, p, self.contribution.gram_clip)?;
                loo_values(
                    &step.sample.rows,
                    &step.sample.liked,
                    digest,
                    &ease,
                    &ListHits::plain(&lists.1),
                )
                .iter()
                .map(|&v| v as i64)
                .sum()
            }
            None => 0,
        };
        let d = noised_difference(sum, z_s, noise)?;
        stages.push(select_stage(z_s));
        if lists.0.is_some() {
            state.select_sum += d;
            state.select_n += 1;
            state.select_var += z_s * z_s;
        }
        Ok(state)
    }

    /// The public record of the selection (never the noised sum itself): how many
    /// differences are combined, the sd of their mean, and the list it serves.
    pub(super) fn select_record(&self, state: &GramState) -> Result<serde_json::Value, TrainError> {
        let Split::Select { margin, .. } = self.split else {
            return Ok(serde_json::Value::Null);
        };
        let n = state.select_n;
        Ok(serde_json::json!({
            "n": n,
            "sigma": if n > 0 { state.select_var.sqrt() / n as f64 } else { 0.0 },
            "grams": state.grams,
            "decision": if state.serves_gram(margin) {
                "ease"
            } else {
                "counts"
            },
        }))
    }

    /// The two lists a selecting state chooses between, over `n` items: EASE on the
    /// averaged Gram (`None` before a Gram release), ridge `edges` noise edges of the
    /// average, and the combined counts' order.
    pub fn select_lists(
        &self,
        state: &GramState,
        combined: &[f64],
        sigma_count: f64,
    ) -> Result<(Option<ItemRanker>, ItemRanker), TrainError> {
        let (ease, counts) = self.select_lists_with_inverse(state, combined, sigma_count)?;
        Ok((ease.map(|(e, _)| e), counts))
    }

    /// [`DpTopN::select_lists`] with EASE's `P = (avg + ridge I)^-1` beside its list (the
    /// leave-user-out statistic corrects it per user).
    pub(super) fn select_lists_with_inverse(
        &self,
        state: &GramState,
        combined: &[f64],
        sigma_count: f64,
    ) -> Result<(Option<EaseWithInverse>, ItemRanker), TrainError> {
        let n = combined.len();
        let cand = select_candidates(combined, self.threshold * sigma_count, self.k);
        let pop: Vec<f64> = cand.iter().map(|&j| combined[j as usize]).collect();
        let counts = ItemRanker::new(n, cand, pop, ItemScorer::Popularity, self.pop_weight)
            .with_fill(combined.to_vec());
        let Split::Select { edges, .. } = self.split else {
            return Ok((None, counts));
        };
        let Some((avg, sd)) = state.average() else {
            return Ok((None, counts));
        };
        let held = state.candidates.clone();
        if held.iter().any(|&j| j as usize >= n) {
            return Err(invalid("gram", "a held candidate is outside the catalogue"));
        }
        let k = held.len();
        let p = ease_inverse(&avg, k, edges * noise_edge(sd, k))?;
        let b = ease_from_inverse(&p, k);
        let pop: Vec<f64> = held.iter().map(|&j| combined[j as usize]).collect();
        let ease = ItemRanker::new(n, held, pop, ItemScorer::ItemItem { b }, self.pop_weight)
            .with_fill(combined.to_vec())
            .with_neighbours(Neighbours::from_gram(&avg, k, NEIGHBOURS));
        Ok((Some((ease, p)), counts))
    }

    /// The share of a release without a selecting state that its trace test takes. The
    /// test's threshold is `tau` (160) noise edges of the Gram, at least `320 z_g C^2`, so
    /// its noise sd `z_t C^2` matters little even at this share (a relative sd of
    /// `sqrt(rest / share) / (320 sqrt K)`: under 4% at one candidate, 0.3% at 200); the
    /// rest of the steering share goes to the rest (docs/privacy/dp-topn.md 2b).
    pub const STATELESS_TRACE_SHARE: f64 = 0.005;

    /// `(z_t, z_rest)` of a selecting release without a state: the trace at
    /// [`Self::STATELESS_TRACE_SHARE`] (at most the steering share) and the rest at its
    /// share plus the steering share's remainder. Moving user-level share from the
    /// statistic (4 per unit at the rating level) to the rest (at most 4, 2 at the
    /// defaults) and to the trace (at most 1) never lowers the rating-level multiplier the
    /// charges are computed for ([`Self::rating_z`]); if it would (it cannot with the
    /// losses above), the release keeps the whole steering share on the trace.
    pub fn stateless_multipliers(&self) -> Result<(f64, f64), TrainError> {
        let s = self.split.select_share();
        let (_, rest) = self.shares();
        let (_, z_c, z_g) = self.multipliers()?;
        let whole = (self.share_multiplier(s)?.unwrap_or(f64::INFINITY), z_g);
        let t = Self::STATELESS_TRACE_SHARE.min(s);
        let (Some(z_t), Some(z_rest)) = (
            self.share_multiplier(t)?,
            self.share_multiplier(rest + s - t)?,
        ) else {
            return Ok(whole);
        };
        let g2 = self.contribution.gram_clip * self.contribution.gram_clip;
        let actual =
            steered_rating_multiplier(z_c, z_t * g2 / g2.min(1.0), z_rest, &self.contribution);
        Ok(if actual >= self.rating_z(true)? {
            (z_t, z_rest)
        } else {
            whole
        })
    }
}

/// What the selection statistic of a release reads: its sample and key, the prior
/// state, and what the release computed (served counts and their sd, the Gram's
/// candidates, the Gram, empty when none, and its entry sd).
pub(super) struct SelectStep<'a> {
    pub(super) sample: &'a Sample,
    pub(super) key: &'a SubsetKey,
    pub(super) prior: Option<&'a GramState>,
    pub(super) counts: &'a [f64],
    pub(super) sigma_count: f64,
    pub(super) candidates: &'a [u32],
    pub(super) gram: &'a [f64],
    pub(super) sigma_gram: f64,
}

impl DpTopN {
    /// Step 7 of a selecting release (post-processing of the state): EASE on the averaged
    /// Gram when the combined difference favours it, else the combined counts.
    pub(super) fn fit_select(
        &self,
        rel: GramRelease,
        history: Option<CountHistory>,
        margin: f64,
        data: &TrainData<'_>,
    ) -> Result<Fitted, TrainError> {
        let h = history
            .ok_or_else(|| invalid("combine_releases", "split=select needs the counts' state"))?;
        let state = h.gram.as_deref().cloned().unwrap_or_else(GramState::empty);
        let (ease, counts) = self.select_lists(&state, &h.mean, rel.sigma_count)?;
        let avg = state.average();
        let (ranker, served) = match (ease, avg) {
            (Some(e), Some(avg)) if state.serves_gram(margin) => (e, Some(avg)),
            _ => (counts, None),
        };
        let (gram, sigma_gram) = served.unwrap_or((Vec::new(), f64::INFINITY));
        let basis = GramRelease {
            noisy_counts: h.mean.clone(),
            candidates: ranker.candidates.clone(),
            gram,
            charges: ReleaseCharges::default(),
            sigma_count: rel.sigma_count,
            sigma_gram,
            select: None,
            labels: None,
        };
        let ranker = ranker.with_history(Some(h));
        let model = item_side_model(&ranker, &basis, data);
        Ok(Fitted {
            model,
            charges: rel.charges,
            guarantee: Guarantee::Proven,
            ranker: Some(self.labelled(ranker, rel.labels.as_ref(), rel.sigma_count)),
        })
    }
}
