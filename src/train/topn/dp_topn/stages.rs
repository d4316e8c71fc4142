//! The release's steps: exact DP counts, candidates, the DP Gram, a second count release,
//! the trace test, and the charges they add up to.

use super::*;

/// Finest grid the count sums live on, `gamma = 2^-bits` with `bits <= 16`: a user's
/// clipped weight is floored to a multiple of `gamma`, and the discrete Gaussian's
/// `sigma / gamma <= 2^23` keeps its `sigma^2` inside the exact sampler's range.
///
/// Flooring keeps every bound the charges use (docs/privacy/dp-topn.md, "Exact
/// counts"): a floored row's norm is at most the clipped row's (user level), and adding
/// or removing one rating moves the floored row by at most `sqrt 2` (rating level) as long
/// as `sqrt(cap + 1) gamma <= 1 - 1/sqrt 2`, which is checked here from public values.
pub fn count_grid_bits(sigma: f64, cap: usize) -> Result<u32, TrainError> {
    if !(sigma.is_finite() && sigma > 0.0) {
        return Err(invalid(
            "sigma_count",
            format!("must be finite and > 0, got {sigma}"),
        ));
    }
    let mut bits = 16i32;
    while bits > 0 && sigma * 2f64.powi(bits) > 2f64.powi(23) {
        bits -= 1;
    }
    let gamma = 2f64.powi(-bits);
    if sigma / gamma > 2f64.powi(23) || sigma / gamma < 8.0 {
        return Err(invalid(
            "sigma_count",
            format!("{sigma} is outside the exact count sampler's range [2^-13, 2^23]"),
        ));
    }
    if ((cap as f64) + 1.0).sqrt() * gamma > 1.0 - std::f64::consts::FRAC_1_SQRT_2 {
        return Err(invalid(
            "cap",
            format!("{cap} is too large for the count grid 2^-{bits} at sigma {sigma}"),
        ));
    }
    Ok(bits as u32)
}

/// DP counts, released exactly (Canonne-Kamath-Steinke 2020): `sum_u clip(y_u)` over all
/// items (binary rows clipped to L2 norm `clip`, each weight floored to the grid of
/// [`count_grid_bits`]) in integer grid units, plus a discrete Gaussian of standard
/// deviation `sigma` (in count units) on every item; the published count is that integer
/// rounded to the nearest whole count (post-processing). Every count is an integer.
pub fn noisy_counts(
    rows: &[Vec<u32>],
    n_items: usize,
    clip: f64,
    cap: usize,
    sigma: f64,
    rng: &mut DpRng,
) -> Result<Vec<f64>, TrainError> {
    let bits = count_grid_bits(sigma, cap)?;
    counts_from_sums(&CountSums::of_rows(rows, n_items, clip, bits), sigma, rng)
}

/// The noise step of [`noisy_counts`] on merged count sums (from any shards, or from the
/// database): a discrete Gaussian of sd `sigma` (count units) on every item in grid units,
/// then the nearest whole count.
pub fn counts_from_sums(
    sums: &CountSums,
    sigma: f64,
    rng: &mut DpRng,
) -> Result<Vec<f64>, TrainError> {
    let unit = 1i64 << sums.bits;
    let s = sigma * unit as f64;
    let s2 = dprec_dp::privacy::Rational {
        num: (s * s).ceil() as u64 + 1,
        den: 1,
    };
    let mut counts = Vec::with_capacity(sums.units.len());
    for &x in &sums.units {
        let noisy = x + dprec_dp::privacy::discrete_gaussian(s2, rng).map_err(numerical)?;
        // Nearest whole count (halves up), in integer arithmetic.
        counts.push((noisy + unit / 2).div_euclid(unit) as f64);
    }
    Ok(counts)
}

/// Candidates: items with a noisy count `>= min_count`, the `k` largest (ties to the
/// smaller index), in descending order of noisy count.
pub fn select_candidates(noisy: &[f64], min_count: f64, k: usize) -> Vec<u32> {
    let mut c: Vec<u32> = (0..noisy.len() as u32)
        .filter(|&j| noisy[j as usize] >= min_count)
        .collect();
    c.sort_by(|&a, &b| {
        noisy[b as usize]
            .total_cmp(&noisy[a as usize])
            .then(a.cmp(&b))
    });
    c.truncate(k);
    c
}

/// The exact (noise-free) Gram `sum_u x_u x_u^T` over `candidates`, row-major `K x K`,
/// with `x_u` the user's binary row restricted to the candidates and clipped to L2 norm
/// `clip`.
pub fn gram(rows: &[Vec<u32>], n_items: usize, candidates: &[u32], clip: f64) -> Vec<f64> {
    let pos = candidate_positions(n_items, candidates);
    GramSums::of_rows(rows, &pos, candidates.len(), clip).symmetric()
}

/// Two independent noisy releases of the same counts pooled by inverse variance, and the
/// pooled noise sd (`1 / sqrt(1/a^2 + 1/b^2)`): post-processing of DP outputs.
pub fn pool_counts(a: &[f64], sigma_a: f64, b: &[f64], sigma_b: f64) -> (Vec<f64>, f64) {
    let (wa, wb) = (1.0 / (sigma_a * sigma_a), 1.0 / (sigma_b * sigma_b));
    let pooled = a
        .iter()
        .zip(b)
        .map(|(x, y)| (wa * x + wb * y) / (wa + wb))
        .collect();
    (pooled, 1.0 / (wa + wb).sqrt())
}

/// Adds symmetric Gaussian noise: N(0, sigma^2) on each upper-triangle entry (diagonal
/// included), mirrored below.
pub fn add_symmetric_noise(
    g: &mut [f64],
    k: usize,
    sigma: f64,
    rng: &mut DpRng,
) -> Result<(), TrainError> {
    for a in 0..k {
        for b in a..k {
            let e = gaussian(sigma, rng).map_err(numerical)?;
            g[a * k + b] += e;
            if a != b {
                g[b * k + a] += e;
            }
        }
    }
    Ok(())
}

/// A release's charges: its two mechanism records, the rating-level charges of the
/// sample (pure eps of RSM-sampled ratings, Gaussian rho of full participants) and the
/// planned user-level event for every user with an offered rating.
pub(super) fn release_charges(
    sample: Sample,
    params: serde_json::Value,
    user_event: &PrivacyEvent,
    name: &str,
) -> ReleaseCharges {
    ReleaseCharges {
        mechanisms: vec![
            MechanismRecord {
                name: name.into(),
                params: params.clone(),
                unit: PrivacyUnit::User,
                neighbour: Neighbour::AddRemove,
            },
            MechanismRecord {
                name: "dp-topn-rsm".into(),
                params,
                unit: PrivacyUnit::Rating,
                neighbour: Neighbour::AddRemove,
            },
        ],
        ratings: sample.charges,
        users: sample
            .offered_users
            .iter()
            .enumerate()
            .filter(|(_, &o)| o)
            .map(|(u, _)| UserCharge {
                user: u as u32,
                event: user_event.clone(),
            })
            .collect(),
        rating_rho: sample.rho,
    }
}

/// A release's source of sums and its subset key.
pub(super) struct Stats<'a> {
    pub(super) source: &'a dyn StatsSource,
    pub(super) key: &'a SubsetKey,
}

impl Stats<'_> {
    pub(super) fn counts(
        &self,
        c: &Contribution,
        bits: u32,
        n_items: usize,
    ) -> Result<CountSums, TrainError> {
        let sums = self.source.count_sums(self.key, c, bits)?;
        if sums.bits != bits || sums.units.len() != n_items {
            return Err(invalid(
                "counts",
                "the source's sums are on another grid or catalogue",
            ));
        }
        Ok(sums)
    }
}

impl DpTopN {
    /// The second count release of the counts branch (multiplier `z_g`, exact like the
    /// first), pooled with the first (`first`, at the count step's sd) and rounded to whole
    /// counts (adds 1/12 to the variance): the pooled counts and their noise sd.
    pub(super) fn second_counts(
        &self,
        stats: &Stats<'_>,
        first: &[f64],
        n_items: usize,
        z_g: f64,
        (noise, stages): (&mut DpRng, &mut Vec<GaussianStage>),
    ) -> Result<(Vec<f64>, f64), TrainError> {
        let c = &self.contribution;
        let (_, z_c, _) = self.multipliers()?;
        let sigma_second = z_g * c.count_clip;
        let bits = count_grid_bits(sigma_second, c.cap)?;
        let second = counts_from_sums(&stats.counts(c, bits, n_items)?, sigma_second, noise)?;
        stages.push(count_stage("second counts", sigma_second, c));
        let (mut pooled, sigma) = pool_counts(first, z_c * c.count_clip, &second, sigma_second);
        pooled.iter_mut().for_each(|x| *x = x.round());
        Ok((pooled, sigma))
    }

    /// Step 5: the DP Gram over the candidates and its entry noise sd.
    pub(super) fn noisy_gram(
        &self,
        stats: &Stats<'_>,
        candidates: &[u32],
        z_g: f64,
        (noise, stages): (&mut DpRng, &mut Vec<GaussianStage>),
    ) -> Result<(Vec<f64>, f64), TrainError> {
        let clip = self.contribution.gram_clip;
        let sigma_gram = z_g * clip * clip;
        let sums = stats
            .source
            .gram_sums(stats.key, &self.contribution, candidates)?;
        if sums.k != candidates.len() {
            return Err(invalid(
                "gram",
                "the source's Gram is over other candidates",
            ));
        }
        let mut g = sums.symmetric();
        add_symmetric_noise(&mut g, candidates.len(), sigma_gram, noise)?;
        stages.push(gram_stage(sigma_gram, &self.contribution));
        Ok((g, sigma_gram))
    }

    /// The trace test at multiplier `z_t`: the Gram when the noisy trace reaches `tau`
    /// noise edges of the Gram's noise (the Gram at multiplier `z_g`), else counts; and its
    /// public record.
    pub(super) fn trace_choice(
        &self,
        stats: &Stats<'_>,
        noisy: &[f64],
        candidates: &[u32],
        (tau, z_t, z_g): (f64, f64, f64),
        (noise, stages): (&mut DpRng, &mut Vec<GaussianStage>),
    ) -> Result<(Split, Option<serde_json::Value>), TrainError> {
        let g2 = self.contribution.gram_clip * self.contribution.gram_clip;
        let exact = stats
            .source
            .trace(stats.key, &self.contribution, candidates)?;
        let noisy_trace = exact + gaussian(z_t * g2, noise).map_err(numerical)?;
        stages.push(trace_stage(z_t * g2, &self.contribution));
        let edge = noise_edge(z_g * g2, candidates.len());
        // The DP count mass on the candidates per unit of trace: how much of a user's row
        // the candidates hold (post-processing; reported, not used).
        let mass: f64 = candidates.iter().map(|&j| noisy[j as usize]).sum();
        let record = serde_json::json!({
            "noisy_trace": noisy_trace, "sigma": z_t * g2, "edge": edge, "tau": tau,
            "count_mass": mass,
        });
        let gram = !candidates.is_empty() && noisy_trace >= tau * edge;
        Ok((if gram { Split::Gram } else { Split::Counts }, Some(record)))
    }
}
