//! A probe, not a served path: what combining the DP Gram across releases (as the counts
//! are combined, `dprec::train::topn::history`) could buy on MovieLens-100K. Each fold's
//! training set is released `N` times by `dp-topn` with the Gram forced (`split=gram`, the
//! service's calibration otherwise); the served counts are combined as the service does;
//! the Gram entries over a candidate set fixed from the combined counts are averaged over
//! the releases that had both items as candidates (post-processing of the N releases);
//! EASE on that average with a ridge of `edges` noise edges of the averaged noise. Beside
//! it: `dp-topn` and `dp-popularity` as served after N releases (counts combined), and the
//! combined counts of the Gram-forced releases ranked alone (what forcing the Gram costs a
//! counts list). Per run it also prints public statistics of the averaged Gram (trace and
//! leading eigenvalues in noise edges of the average) and an in-sample leave-one-out
//! comparison of the two lists (`loo_difference`, exact: a candidate for a DP selection
//! statistic, not noised here).
//!
//! ```text
//! cargo run --release --example gram_history_probe -- [--data ../shared/datasets/ml-100k]
//!     [--releases 10] [--seeds 2] [--folds 5] [--edges 2] [--preset NAME]
//! ```
//!
//! `--preset NAME`: a synthetic preset (`dprec synth --preset`) instead of ML-100K, generated
//! with the seed, one random 80/20 fold per seed (`--folds` ignored; every rating takes
//! full part, `eps_r=none`, as in the suite's presets).

use std::path::PathBuf;
use std::sync::Arc;

use dprec::data::folds::{self, Fold};
use dprec::data::synthetic::{self, SyntheticConfig};
use dprec::data::{Interactions, RatingScale};
use dprec::eval::{ranking_metrics, AfterReleases, RankingConfig};
use dprec::numerics::sym_eigen::top_eigen;
use dprec::train::topn::dp_topn::{ease_weights, noise_edge, select_candidates, DpTopN};
use dprec::train::topn::history::{drift_for, CountHistory};
use dprec::train::topn::item_ranker::{ItemRanker, ItemScorer};
use dprec::train::{self, Params, TrainData, Trainer};

fn main() -> anyhow::Result<()> {
    let (mut data, mut releases, mut seeds, mut n_folds, mut edges) = (
        PathBuf::from("../shared/datasets/ml-100k"),
        10u64,
        2u64,
        5usize,
        2.0f64,
    );
    let mut preset: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--data" => data = v.into(),
            "--releases" => releases = v.parse()?,
            "--seeds" => seeds = v.parse()?,
            "--folds" => n_folds = v.parse()?,
            "--edges" => edges = v.parse()?,
            "--preset" => preset = Some(v),
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    // (fold, seed) runs, with the trainers' extra parameters.
    let (runs, scale, extra): (Vec<(Fold, u64)>, RatingScale, Vec<&str>) = match &preset {
        None => {
            let f = folds::predefined_ml100k(&data)?;
            let runs = f.folds.into_iter().take(n_folds);
            let runs = runs.flat_map(|fold| (1..=seeds).map(move |s| (fold.clone(), s)));
            (runs.collect(), f.scale, Vec::new())
        }
        Some(name) => {
            let mut runs = Vec::new();
            let mut scale = RatingScale::ONE_TO_FIVE;
            for s in 1..=seeds {
                let mut cfg = SyntheticConfig::preset(name)
                    .ok_or_else(|| anyhow::anyhow!("unknown preset {name:?}"))?;
                cfg.seed = s;
                let ds = synthetic::generate(&cfg)?;
                scale = ds.scale;
                let fold = folds::random_kfold(&ds.ratings, 5, s)?.remove(0);
                runs.push((fold, s));
            }
            (runs, scale, vec!["eps_r=none"])
        }
    };
    let cfg = RankingConfig {
        max_users: Some(3000),
        ..RankingConfig::default()
    };
    let gram_trainer =
        DpTopN::from_params(&Params::parse(&[&["split=gram"], &extra[..]].concat())?)?;
    let names = [
        "dp-topn (served)",
        "dp-popularity (served)",
        "Gram averaged, EASE",
        "counts of Gram releases",
    ];
    let mut sums = [0.0; 4];
    let mut n = 0.0;
    for (fold, seed) in &runs {
        let seed = *seed;
        let m = Interactions::new(&fold.train);
        let d = TrainData::new(&fold.train, &m, scale);
        {
            let mut out = [0.0; 4];
            for (k, name) in ["dp-topn", "dp-popularity"].iter().enumerate() {
                let t = AfterReleases {
                    inner: Arc::from(train::build(name, &Params::parse(&extra)?)?),
                    releases,
                    arrivals: false,
                };
                let fitted = t.fit(&d, &mut dprec::rng::seeded(seed))?;
                let r = fitted.ranker.as_ref().expect("a ranker");
                out[k] = ranking_metrics(r.as_ref(), &m, &fold.test, &cfg).ndcg;
            }
            let (r, counts_only, spectrum) =
                averaged_gram_ranker(&gram_trainer, &d, seed, releases, edges)?;
            out[2] = ranking_metrics(&r, &m, &fold.test, &cfg).ndcg;
            out[3] = ranking_metrics(&counts_only, &m, &fold.test, &cfg).ndcg;
            let (users, diff) = loo_difference(&r, &counts_only, &m, seed);
            println!(
                "{} seed {seed}: {:.4} {:.4} {:.4} {:.4} | {spectrum} | loo users {users} \
                 hits(ease) - hits(counts) {diff}",
                fold.name, out[0], out[1], out[2], out[3]
            );
            for (s, o) in sums.iter_mut().zip(out) {
                *s += o;
            }
            n += 1.0;
        }
    }
    for (name, s) in names.iter().zip(sums) {
        println!(
            "{name:<24} NDCG@10 {:.4}  ({:.2}x DP popularity)",
            s / n,
            s / sums[1]
        );
    }
    Ok(())
}

/// `releases` Gram-forced releases of the same data; counts combined by the filter, the
/// Gram averaged over a candidate set fixed from the combined counts. Returns the EASE
/// ranker on the average, the ranker of the combined counts alone, and public statistics
/// of the average (its leading eigenvalues and trace in noise edges of the average, and
/// the same for the Gram with the rank-one popularity part removed).
fn averaged_gram_ranker(
    t: &DpTopN,
    d: &TrainData<'_>,
    seed: u64,
    releases: u64,
    edges: f64,
) -> anyhow::Result<(ItemRanker, ItemRanker, String)> {
    let mut rng = dprec::rng::seeded(seed);
    let mut state: Option<CountHistory> = None;
    let mut rels = Vec::new();
    for _ in 0..releases {
        let rel = t.release(d, &mut rng)?;
        state = Some(CountHistory::update(
            state.as_ref(),
            "probe",
            &rel.noisy_counts,
            rel.sigma_count,
            drift_for(t.plan.releases),
        )?);
        rels.push(rel);
    }
    let counts = state.expect("one release at least").mean;
    let sigma_count = rels[0].sigma_count;
    let cand = select_candidates(&counts, t.threshold * sigma_count, t.k);
    let k = cand.len();
    let n_items = counts.len();
    let mut pos = vec![usize::MAX; n_items];
    for (a, &j) in cand.iter().enumerate() {
        pos[j as usize] = a;
    }
    let (mut g, mut seen) = (vec![0.0; k * k], vec![0.0; k * k]);
    for rel in &rels {
        let kr = rel.candidates.len();
        for (x, &i) in rel.candidates.iter().enumerate() {
            for (y, &j) in rel.candidates.iter().enumerate() {
                let (a, b) = (pos[i as usize], pos[j as usize]);
                if a != usize::MAX && b != usize::MAX {
                    g[a * k + b] += rel.gram[x * kr + y];
                    seen[a * k + b] += 1.0;
                }
            }
        }
    }
    let mut filled = 0.0;
    for (x, c) in g.iter_mut().zip(&seen) {
        if *c > 0.0 {
            *x /= c;
            filled += c;
        }
    }
    let mean_seen = filled / (k * k) as f64;
    let sigma = rels[0].sigma_gram / mean_seen.max(1.0).sqrt();
    let edge = noise_edge(sigma, k);
    let b = ease_weights(&g, k, edges * edge)?;
    let pop: Vec<f64> = cand.iter().map(|&j| counts[j as usize]).collect();
    let shift = sigma * (2.0 * (k as f64).sqrt() + 6.0);
    let (vals, _) = top_eigen(&g, k, 4, shift);
    let trace: f64 = (0..k).map(|i| g[i * k + i]).sum();
    let lam: Vec<String> = vals.iter().map(|l| format!("{:.1}", l / edge)).collect();
    let spectrum = format!(
        "k {k} trace/edge {:.1} lambda/edge {} l2/l1 {:.3}",
        trace / edge,
        lam.join(" "),
        vals.get(1).copied().unwrap_or(0.0) / vals[0]
    );
    let counts_only = ItemRanker::new(
        n_items,
        cand.clone(),
        pop.clone(),
        ItemScorer::Popularity,
        0.0,
    )
    .with_fill(counts.clone());
    let ease =
        ItemRanker::new(n_items, cand, pop, ItemScorer::ItemItem { b }, 0.0).with_fill(counts);
    Ok((ease, counts_only, spectrum))
}

/// In-sample leave-one-out on the training ratings: for each user with a liked rating
/// (>= 4) and at least two ratings, one liked rating (chosen by the seed) is hidden; each
/// ranker lists 10 items from the rest; a hit is the hidden item in the list. Returns the
/// users counted and hits(a) - hits(b): a sum of per-user values in {-1, 0, 1}.
fn loo_difference(a: &ItemRanker, b: &ItemRanker, m: &Interactions, seed: u64) -> (usize, i64) {
    use dprec::train::Ranker;
    use rand::Rng;
    let mut rng = dprec::rng::seeded(seed ^ 0x5eed);
    let n = m.n_items;
    let (mut sa, mut sb) = (vec![0.0; n], vec![0.0; n]);
    let (mut users, mut diff) = (0usize, 0i64);
    for u in 0..m.n_users {
        let (items, values) = m.by_user.row(u);
        let liked: Vec<usize> = (0..items.len()).filter(|&x| values[x] >= 4.0).collect();
        if liked.is_empty() || items.len() < 2 {
            continue;
        }
        let hide = liked[rng.random_range(0..liked.len())];
        let own: Vec<(usize, f64)> = (0..items.len())
            .filter(|&x| x != hide)
            .map(|x| (items[x] as usize, values[x] as f64))
            .collect();
        a.score_items(None, &own, &mut sa);
        b.score_items(None, &own, &mut sb);
        let target = items[hide] as usize;
        let mut mine = vec![false; n];
        own.iter().for_each(|&(i, _)| mine[i] = true);
        let hit = |s: &[f64]| {
            let t = s[target];
            (0..n)
                .filter(|&j| j != target && s[j] > t && !mine[j])
                .count()
                < 10
        };
        users += 1;
        diff += hit(&sa) as i64 - hit(&sb) as i64;
    }
    (users, diff)
}
