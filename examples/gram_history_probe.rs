//! A probe, not a served path: what combining the DP Gram across releases (as the counts
//! are combined, `dprec::train::topn::history`) could buy on MovieLens-100K. Each fold's
//! training set is released `N` times by `dp-topn` with the Gram forced (`split=gram`, the
//! service's calibration otherwise); the served counts are combined as the service does;
//! the Gram entries over a candidate set fixed from the combined counts are averaged over
//! the releases that had both items as candidates (post-processing of the N releases);
//! EASE on that average with a ridge of `edges` noise edges of the averaged noise. Beside
//! it: `dp-topn` and `dp-popularity` as served after N releases (counts combined).
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
    ];
    let mut sums = [0.0; 3];
    let mut n = 0.0;
    for (fold, seed) in &runs {
        let seed = *seed;
        let m = Interactions::new(&fold.train);
        let d = TrainData::new(&fold.train, &m, scale);
        {
            let mut out = [0.0; 3];
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
            let r = averaged_gram_ranker(&gram_trainer, &d, seed, releases, edges)?;
            out[2] = ranking_metrics(&r, &m, &fold.test, &cfg).ndcg;
            println!(
                "{} seed {seed}: {:.4} {:.4} {:.4}",
                fold.name, out[0], out[1], out[2]
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
/// Gram averaged over a candidate set fixed from the combined counts.
fn averaged_gram_ranker(
    t: &DpTopN,
    d: &TrainData<'_>,
    seed: u64,
    releases: u64,
    edges: f64,
) -> anyhow::Result<ItemRanker> {
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
    let b = ease_weights(&g, k, edges * noise_edge(sigma, k))?;
    let pop: Vec<f64> = cand.iter().map(|&j| counts[j as usize]).collect();
    Ok(ItemRanker::new(n_items, cand, pop, ItemScorer::ItemItem { b }, 0.0).with_fill(counts))
}
