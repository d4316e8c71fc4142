//! The ratings a release uses: RSM participation and the per-user cap.

use super::*;

/// The ratings a release uses: per user, the sampled item indices, and for every rating
/// its RSM rate and charge.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Per user: the kept, capped items; the liked ones first (`liked`), then the others,
    /// each part in item order.
    pub rows: Vec<Vec<u32>>,
    /// Per user: how many of its row's items, at the front, are liked (rated at or above
    /// the threshold); the rest weigh `unliked_weight` in the counts. Empty when every
    /// kept rating is liked (the release counts every rating alike).
    pub liked: Vec<u32>,
    /// The pure eps charged to each RSM-sampled rating (by position; none for others).
    /// Lists, not one slot a rating: at 20M ratings two dense columns beside the
    /// trainer's charges were 320 MB at the release's peak (lab note bench-02).
    pub charges: Vec<RatingCharge>,
    /// The zCDP `rho` charged to each rating that takes full part (by position).
    pub rho: RatingRhos,
    /// Users with at least one offered rating (charged at user level).
    pub offered_users: Vec<bool>,
}

/// How one rating takes part: fully, charged the Gaussian `rho = 1 / (2 z_r^2)` when
/// its ledger can afford the increase of its converted loss
/// ([`dprec_dp::ledger::gaussian_eps`] from its current `rho`), else RSM-sampled at a pure
/// eps within its budget ([`rsm_rate`]). Returns `(rate, pure eps, rho)`.
pub fn participation(
    budget: f64,
    rho_so_far: f64,
    z_r: f64,
    delta_r: f64,
) -> Result<(f64, f64, f64), TrainError> {
    if budget.is_nan() || budget <= 0.0 {
        return Ok((0.0, 0.0, 0.0));
    }
    let rho_full = 1.0 / (2.0 * z_r * z_r);
    let g0 = dprec_dp::ledger::gaussian_eps(rho_so_far);
    let added = dprec_dp::ledger::gaussian_eps(rho_so_far + rho_full) - g0;
    // A margin against rounding in the ledger's own recomputation.
    if added <= budget * (1.0 - 1e-9) {
        return Ok((1.0, 0.0, rho_full));
    }
    let (q, eps) = rsm_rate(budget, z_r, delta_r)?;
    Ok((q, eps, 0.0))
}

/// The bit that marks a kept rating below the liked threshold inside [`sample_ratings`].
pub(super) const BELOW: u32 = 1 << 31;

/// Participation by the ratings' budgets ([`participation`]), then the per-user cap.
/// Both draws come from the release's secret subset key ([`SubsetKey`], not from a
/// generator's stream), so that any shard, or a database, computes the same rows: an
/// RSM-sampled rating of rate `q` is kept when its digest's [`coin`] is `< q`, and a user
/// over the cap keeps the `cap` kept ratings with the smallest digests (a uniformly random
/// subset when the keyed hash is a random function; docs/privacy/dp-topn.md, "Cap").
/// With `liked_min`, the kept ratings below it go to the back of their row
/// ([`Sample::liked`]; the count rows weigh them less, [`Contribution::unliked_weight`]).
pub fn sample_ratings(
    data: &TrainData<'_>,
    budgets: PerRating<'_>,
    z_r: f64,
    delta_r: f64,
    cap: usize,
    liked_min: Option<f64>,
    key: &SubsetKey,
) -> Result<Sample, TrainError> {
    let m = data.matrix;
    let liked_min = liked_min.unwrap_or(f64::NEG_INFINITY);
    let mut rates: HashMap<(u64, u64), (f64, f64, f64)> = HashMap::new();
    // Sized for every offered rating taking full part (the served default's case):
    // grown by doubling, the list held up to 2^25 slots at 20M ratings.
    let offered = budgets.iter().filter(|&b| b > 0.0).count();
    let (mut charges, mut rho) = (Vec::new(), RatingRhos::with_capacity(offered));
    let mut offered_users = vec![false; m.n_users];
    if m.n_items > BELOW as usize {
        return Err(invalid("n_items", "at most 2^31 items"));
    }
    // A kept rating below the liked threshold is its item index with the `BELOW` bit set
    // until the cap has run; then each row is split into liked and other items.
    let mut rows = vec![Vec::new(); m.n_users];
    for (u, row) in rows.iter_mut().enumerate() {
        let (items, values) = m.by_user.row(u);
        let src = m.by_user.row_source(u);
        let user = user_label(data, u);
        // At most the user's offered ratings: one allocation, not a doubling one.
        row.reserve_exact(items.len());
        for ((&j, &pos), &v) in items.iter().zip(src).zip(values) {
            let b = budgets.get(pos as usize);
            if b.is_nan() || b <= 0.0 {
                continue;
            }
            offered_users[u] = true;
            let r0 = data.rating_rho.map_or(0.0, |r| r.get(pos as usize));
            let k = (b.to_bits(), r0.to_bits());
            let (q, eps, r) = match rates.get(&k) {
                Some(&x) => x,
                None => {
                    let x = participation(b, r0, z_r, delta_r)?;
                    rates.insert(k, x);
                    x
                }
            };
            if eps > 0.0 {
                charges.push(RatingCharge { position: pos, eps });
            }
            if r > 0.0 {
                rho.push(RatingRho {
                    position: pos,
                    rho: r,
                });
            }
            if q >= 1.0 || (q > 0.0 && coin(&key.digest(&user, &item_label(data, j))) < q) {
                row.push(if (v as f64) < liked_min { j | BELOW } else { j });
            }
        }
    }
    let liked = cap_rows(data, &mut rows, cap, key);
    rho.shrink_to_fit();
    Ok(Sample {
        rows,
        liked,
        charges,
        rho,
        offered_users,
    })
}

/// The cap, per user in parallel (a user's digests are its own): a row over `cap` keeps
/// its `cap` items of smallest digests; then each row puts its liked items first (see
/// [`Sample::liked`]) and the counts of those are returned (empty when every kept
/// rating is liked).
pub(super) fn cap_rows(
    data: &TrainData<'_>,
    rows: &mut [Vec<u32>],
    cap: usize,
    key: &SubsetKey,
) -> Vec<u32> {
    let mut liked = vec![0u32; rows.len()];
    rows.par_iter_mut()
        .zip(&mut liked)
        .enumerate()
        .for_each(|(u, (row, n_liked))| {
            if row.len() > cap {
                let user = user_label(data, u);
                let mut by_digest: Vec<([u8; 32], u32)> = row
                    .iter()
                    .map(|&j| (key.digest(&user, &item_label(data, j & !BELOW)), j))
                    .collect();
                // The `cap` smallest digests (in any order: the row is sorted below).
                by_digest.select_nth_unstable(cap);
                // A new row of exactly `cap` items: collecting from `by_digest` by value
                // would keep its allocation, 36 bytes an item (at 20M ratings 320 MB of
                // capped rows held through the fit, lab note bench-02).
                *row = by_digest[..cap].iter().map(|&(_, j)| j).collect();
            } else {
                row.shrink_to_fit();
            }
            // Liked items first, each part in item order (the flag sorts last).
            row.sort_unstable();
            *n_liked = row.partition_point(|&j| j & BELOW == 0) as u32;
            row.iter_mut().for_each(|j| *j &= !BELOW);
        });
    if liked
        .iter()
        .zip(rows.iter())
        .all(|(&l, r)| l as usize == r.len())
    {
        // Every rating weighs 1: the plain count rows.
        liked = Vec::new();
    }
    liked
}

/// User `u`'s external id ([`TrainData::labels`]), else its decimal index.
pub fn user_label<'a>(data: &'a TrainData<'_>, u: usize) -> std::borrow::Cow<'a, str> {
    match data.labels {
        Some(l) => std::borrow::Cow::Borrowed(l.users[u].as_str()),
        None => std::borrow::Cow::Owned(u.to_string()),
    }
}

/// Item `j`'s external id ([`TrainData::labels`]), else its decimal index.
pub fn item_label<'a>(data: &'a TrainData<'_>, j: u32) -> std::borrow::Cow<'a, str> {
    match data.labels {
        Some(l) => std::borrow::Cow::Borrowed(l.items[j as usize].as_str()),
        None => std::borrow::Cow::Owned(j.to_string()),
    }
}
