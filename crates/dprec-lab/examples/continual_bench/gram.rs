//! `--gram K`: would a continual Gram beat the independent releases' averaged Gram?
//!
//! Both arms split each release's user-level budget the same way (`COUNT_SHARE` to the
//! counts, the rest to the Gram) and serve EASE on their Gram estimate over a candidate
//! set frozen at period `t0 = ceil(T / F)` (`--gram-freeze F`, default 8) (the `K` largest of the arm's own DP counts
//! then), each user scored from all of their own earlier ratings (joint DP), ties and the
//! rest of the list by the arm's DP counts; before `t0` both serve their counts.
//! - **tree**: the arrival-capped counts ([`ArrivalCap`]) and a Gram of arrival-capped
//!   binary rows over the frozen set (a user's first `gram_cap` rated candidates, weight
//!   `1 / sqrt(gram_cap)`, so the lifetime term `w^2 b b^T` has Frobenius norm <= 1 and
//!   grows entrywise: the tree's condition), both by tree aggregation at the level
//!   multiplier `z_L` (per share);
//! - **independent**: the service rule's counts combined across releases and, from `t0`,
//!   one Gram a release of norm-clipped rows (`x_u = b_u / max(1, |b_u|)`, all the user's
//!   rated candidates so far), symmetric noise at `z_T` (per share), averaged over the
//!   releases since `t0` as `dp-topn:split=select` averages its Grams.
//!
//! EASE's ridge is `EDGES` noise edges of the estimate's entry sd. Offline, like the rest
//! of this example: no RSM, no filter calibration.

use dprec::train::topn::dp_topn::{add_symmetric_noise, ease_weights, noise_edge};
use dprec_dp::privacy::tree::{decomposition, ArrivalCap, TreeCounter};
use dprec_dp::rng::{seeded, split, DpRng};

use dprec::model::history::{drift_for, CountHistory};

use super::{next_periods, service_exact, Event, NextPeriod};

/// User-level share of each release given to the counts (the rest: the Gram).
const COUNT_SHARE: f64 = 0.3;
/// EASE's ridge in noise edges of the Gram estimate (`dp-topn:split=select`'s 4).
const EDGES: f64 = 4.0;

/// Per period, what an arm serves: its DP counts and, from `t0`, EASE weights over the
/// frozen candidates.
struct Served {
    counts: Vec<f64>,
    ease: Option<Vec<f64>>,
}

/// NDCG@10, mean over periods, of: each arm's lists (counts + Gram), the exact Gram's EASE
/// over the tree's frozen set (no noise), and each arm's counts alone (at `COUNT_SHARE`).
pub struct GramRow {
    pub tree: f64,
    pub independent: f64,
    pub exact: f64,
    pub exact_rechosen: f64,
    pub tree_counts_only: f64,
    pub independent_counts_only: f64,
}

/// The `K` largest entries of `counts` (ties to the smaller index).
fn top_k(counts: &[f64], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..counts.len() as u32).collect();
    idx.sort_by(|&a, &b| {
        counts[b as usize]
            .total_cmp(&counts[a as usize])
            .then(a.cmp(&b))
    });
    idx.truncate(k);
    idx
}

/// `(G + G^T) / 2` of a row-major `k x k` matrix.
fn symmetrised(g: &[f64], k: usize) -> Vec<f64> {
    let mut s = vec![0.0; k * k];
    for a in 0..k {
        for b in 0..k {
            s[a * k + b] = 0.5 * (g[a * k + b] + g[b * k + a]);
        }
    }
    s
}

/// Catalogue index -> position among the candidates.
fn positions(cand: &[u32], n_items: usize) -> Vec<Option<usize>> {
    let mut pos = vec![None; n_items];
    for (p, &j) in cand.iter().enumerate() {
        pos[j as usize] = Some(p);
    }
    pos
}

/// The exact Gram over the candidates (`pos`) of the users' rows clipped to norm 1 (binary
/// rows scaled by `1 / sqrt(m)`), as `dp-topn` sums it.
fn clipped_gram(rows: &[Vec<u32>], pos: &[Option<usize>], k: usize) -> Vec<f64> {
    let mut g = vec![0.0; k * k];
    for row in rows {
        let b: Vec<usize> = row.iter().filter_map(|&j| pos[j as usize]).collect();
        let w2 = 1.0 / (b.len() as f64).max(1.0);
        for &i in &b {
            for &j in &b {
                g[i * k + j] += w2;
            }
        }
    }
    g
}

/// The tree arm's lists, its frozen set, and per period the exact Gram's EASE weights
/// (empty before the freeze).
type TreeLists = (Vec<Served>, Vec<u32>, Vec<Vec<f64>>);

/// The tree arm over all periods (counts by [`ArrivalCap`], Gram of arrival-capped rows).
#[allow(clippy::too_many_arguments)]
fn tree_arm(
    periods: &[Vec<Event>],
    dims: (usize, usize),
    k: usize,
    t0: usize,
    z_l: f64,
    cap: usize,
    clip: f64,
    gram_cap: usize,
    rng: &mut DpRng,
) -> anyhow::Result<TreeLists> {
    let (n_users, n_items) = dims;
    let t_count = periods.len() as u64;
    let (mut r_counts, mut r_gram) = (split(rng), split(rng));
    let mut rule = ArrivalCap::new(cap, clip)?;
    let mut counts = TreeCounter::new(t_count, n_items, z_l * clip / COUNT_SHARE.sqrt())?;
    let sigma_g = z_l / (1.0 - COUNT_SHARE).sqrt();
    let horizon_g = t_count - t0 as u64 + 1;
    let mut gram = TreeCounter::new(horizon_g, k * k, sigma_g)?;
    let w2 = 1.0 / gram_cap as f64;
    let mut admitted: Vec<Vec<usize>> = vec![Vec::new(); n_users];
    let mut history: Vec<Event> = Vec::new();
    let (mut cand, mut pos) = (Vec::new(), Vec::new());
    let mut exact = vec![0.0; k * k];
    let (mut out, mut exact_out) = (Vec::new(), Vec::new());
    for (t, p) in periods.iter().enumerate() {
        let mut inc = vec![0.0; n_items];
        for e in p {
            inc[e.item as usize] += rule.admit(e.user, e.item);
        }
        let est = counts.step(&inc, &mut r_counts)?;
        if t < t0 {
            history.extend_from_slice(p);
        }
        if t + 1 < t0 {
            out.push(Served {
                counts: est,
                ease: None,
            });
            exact_out.push(Vec::new());
            continue;
        }
        // The Gram's increment: at t0 every earlier rating in arrival order, then the
        // period's own.
        let new: &[Event] = if t + 1 == t0 {
            cand = top_k(&est, k);
            pos = positions(&cand, n_items);
            &history
        } else {
            p
        };
        let mut g_inc = vec![0.0; k * k];
        for e in new {
            let (Some(j), b) = (pos[e.item as usize], &mut admitted[e.user as usize]) else {
                continue;
            };
            if b.len() >= gram_cap || b.contains(&j) {
                continue;
            }
            for &i in b.iter() {
                g_inc[i * k + j] += w2;
                g_inc[j * k + i] += w2;
            }
            g_inc[j * k + j] += w2;
            b.push(j);
        }
        exact.iter_mut().zip(&g_inc).for_each(|(x, d)| *x += d);
        let g = symmetrised(&gram.step(&g_inc, &mut r_gram)?, k);
        let nodes = decomposition(gram.period()).len() as f64;
        // Off the diagonal the symmetrised noise sd is sigma / sqrt 2; the edge uses sigma.
        let lambda = EDGES * noise_edge(sigma_g * nodes.sqrt(), k);
        out.push(Served {
            counts: est,
            ease: Some(ease_weights(&g, k, lambda)?),
        });
        exact_out.push(ease_weights(&exact, k, 1.0)?);
    }
    Ok((out, cand, exact_out))
}

/// The independent arm: combined service-rule counts, one averaged Gram a release.
fn independent_arm(
    periods: &[Vec<Event>],
    dims: (usize, usize),
    k: usize,
    t0: usize,
    z_t: f64,
    rng: &mut DpRng,
) -> anyhow::Result<(Vec<Served>, Vec<u32>)> {
    let (n_users, n_items) = dims;
    let t_count = periods.len() as u64;
    let (mut r_cap, mut r_counts, mut r_gram) = (split(rng), split(rng), split(rng));
    let sigma_c = z_t * 4.0 / COUNT_SHARE.sqrt();
    let sigma_g = z_t / (1.0 - COUNT_SHARE).sqrt();
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); n_users];
    let mut filter: Option<CountHistory> = None;
    let (mut cand, mut pos) = (Vec::new(), Vec::new());
    let (mut sum, mut grams) = (vec![0.0; k * k], 0.0);
    let mut out = Vec::new();
    for (t, p) in periods.iter().enumerate() {
        for e in p {
            rows[e.user as usize].push(e.item);
        }
        let exact = service_exact(&rows, n_items, &mut r_cap);
        let released = exact
            .iter()
            .map(|v| Ok(v + dprec_dp::privacy::gaussian(sigma_c, &mut r_counts)?))
            .collect::<anyhow::Result<Vec<f64>>>()?;
        // The counts filter's state after this release (as `combine`, one step a period).
        let next = CountHistory::update(
            filter.as_ref(),
            "service",
            &released,
            sigma_c,
            drift_for(t_count),
        )?;
        let served = next.mean.clone();
        filter = Some(next);
        if t + 1 < t0 {
            out.push(Served {
                counts: served,
                ease: None,
            });
            continue;
        }
        if t + 1 == t0 {
            cand = top_k(&served, k);
            pos = positions(&cand, n_items);
        }
        let mut g = clipped_gram(&rows, &pos, k);
        add_symmetric_noise(&mut g, k, sigma_g, &mut r_gram)?;
        sum.iter_mut().zip(&g).for_each(|(s, x)| *s += x);
        grams += 1.0;
        let avg: Vec<f64> = sum.iter().map(|s| s / grams).collect();
        let lambda = EDGES * noise_edge(sigma_g / grams.sqrt(), k);
        out.push(Served {
            counts: served,
            ease: Some(ease_weights(&avg, k, lambda)?),
        });
    }
    Ok((out, cand))
}

/// The noise-free reference without the frozen set: every period, EASE on the exact Gram
/// of norm-clipped rows over the `K` most rated items so far (re-chosen each period), the
/// rest of the list by the exact counts. Returns the lists and each period's candidates.
fn exact_rechosen(
    periods: &[Vec<Event>],
    dims: (usize, usize),
    k: usize,
) -> anyhow::Result<(Vec<Served>, Vec<Vec<u32>>)> {
    let (n_users, n_items) = dims;
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); n_users];
    let mut counts = vec![0.0; n_items];
    let (mut out, mut cands) = (Vec::new(), Vec::new());
    for p in periods {
        for e in p {
            rows[e.user as usize].push(e.item);
            counts[e.item as usize] += 1.0;
        }
        let cand = top_k(&counts, k);
        let pos = positions(&cand, n_items);
        let g = clipped_gram(&rows, &pos, k);
        out.push(Served {
            counts: counts.clone(),
            ease: Some(ease_weights(&g, k, 1.0)?),
        });
        cands.push(cand);
    }
    Ok((out, cands))
}

/// NDCG@10 of the served lists for the next period's users, mean over periods with users.
fn ranking(served: &[Served], cand: &[&[u32]], next: &[NextPeriod], k: usize) -> f64 {
    let (mut ndcg, mut n) = (0.0, 0usize);
    for ((s, c), np) in served.iter().zip(cand).zip(next) {
        if np.users.is_empty() {
            continue;
        }
        let mut by_count: Vec<usize> = (0..s.counts.len()).collect();
        by_count.sort_by(|&a, &b| s.counts[b].total_cmp(&s.counts[a]).then(a.cmp(&b)));
        let mut g = 0.0;
        for (rel, seen) in &np.users {
            let mut list: Vec<usize> = Vec::with_capacity(10);
            if let Some(b) = &s.ease {
                let own: Vec<usize> = (0..c.len()).filter(|&p| seen[c[p] as usize]).collect();
                let mut scored: Vec<(f64, f64, usize)> = (0..c.len())
                    .filter(|&p| !seen[c[p] as usize])
                    .map(|p| {
                        let score = own.iter().map(|&i| b[i * k + p]).sum::<f64>();
                        (score, s.counts[c[p] as usize], c[p] as usize)
                    })
                    .collect();
                scored.sort_by(|x, y| y.0.total_cmp(&x.0).then(y.1.total_cmp(&x.1)));
                if !own.is_empty() {
                    list.extend(scored.iter().take(10).map(|x| x.2));
                }
            }
            for &j in &by_count {
                if list.len() == 10 {
                    break;
                }
                if !seen[j] && !list.contains(&j) {
                    list.push(j);
                }
            }
            g += dprec_lab::eval::ranking::list_metrics(&list, rel, 10).2;
        }
        ndcg += g / np.users.len() as f64;
        n += 1;
    }
    ndcg / n.max(1) as f64
}

/// One seed of the comparison at `T = periods.len()`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    periods: &[Vec<Event>],
    dims: (usize, usize),
    k: usize,
    z: (f64, f64),
    cap: usize,
    clip: f64,
    gram_cap: usize,
    freeze: usize,
    seed: u64,
) -> anyhow::Result<GramRow> {
    let t0 = periods.len().div_ceil(freeze).max(1);
    let next = next_periods(periods, dims.0, dims.1);
    let mut root = seeded(seed);
    let (mut r_tree, mut r_ind) = (split(&mut root), split(&mut root));
    let (tree, cand, exact) =
        tree_arm(periods, dims, k, t0, z.1, cap, clip, gram_cap, &mut r_tree)?;
    let (ind, ind_cand) = independent_arm(periods, dims, k, t0, z.0, &mut r_ind)?;
    let none: &[u32] = &[];
    let tree_cand: Vec<&[u32]> = (0..periods.len())
        .map(|t| if t + 1 >= t0 { cand.as_slice() } else { none })
        .collect();
    let exact_served: Vec<Served> = tree
        .iter()
        .zip(exact)
        .map(|(s, e)| Served {
            counts: s.counts.clone(),
            ease: (!e.is_empty()).then_some(e),
        })
        .collect();
    let ind_cands: Vec<&[u32]> = (0..periods.len())
        .map(|t| {
            if t + 1 >= t0 {
                ind_cand.as_slice()
            } else {
                none
            }
        })
        .collect();
    let counts_only = |s: &[Served]| -> Vec<Served> {
        s.iter()
            .map(|x| Served {
                counts: x.counts.clone(),
                ease: None,
            })
            .collect()
    };
    let (rechosen, rechosen_cand) = exact_rechosen(periods, dims, k)?;
    let rechosen_cands: Vec<&[u32]> = rechosen_cand.iter().map(Vec::as_slice).collect();
    Ok(GramRow {
        exact_rechosen: ranking(&rechosen, &rechosen_cands, &next, k),
        tree: ranking(&tree, &tree_cand, &next, k),
        independent: ranking(&ind, &ind_cands, &next, k),
        exact: ranking(&exact_served, &tree_cand, &next, k),
        tree_counts_only: ranking(&counts_only(&tree), &tree_cand, &next, k),
        independent_counts_only: ranking(&counts_only(&ind), &ind_cands, &next, k),
    })
}
