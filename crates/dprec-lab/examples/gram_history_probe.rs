//! A probe, not a served path: what combining the DP Gram across releases (as the counts
//! are combined, `dprec::model::history`) could buy on MovieLens-100K. Each fold's
//! training set is released `N` times by `dp-topn` with the Gram forced (`split=gram`, the
//! service's calibration otherwise); the served counts are combined as the service does;
//! the Gram entries over a candidate set fixed from the combined counts are averaged over
//! the releases that had both items as candidates (post-processing of the N releases);
//! EASE on that average with a ridge of `edges` noise edges of the averaged noise. Beside
//! it: `dp-topn` and `dp-popularity` as served after N releases (counts combined), and the
//! combined counts of the Gram-forced releases ranked alone (what forcing the Gram costs a
//! counts list). Per run it also prints public statistics of the averaged Gram (trace and
//! leading eigenvalues in noise edges of the average) and an in-sample leave-one-out
//! comparison of the two lists (`loo_difference`, exact), and the last column simulates a
//! served rule that selects between the two lists by that difference, noised
//! (`rule_ranker`; `--select-share`, `--explore`, `--margin`; crates/dprec-lab/notes/eval-07-selecting-split-measured.md).
//!
//! ```text
//! cargo run --release --example gram_history_probe -- [--data ../shared/datasets/ml-100k]
//!     [--releases 10] [--seeds 2] [--folds 5] [--edges 2] [--preset NAME]
//!     [--select-share 0.05] [--explore 5] [--margin 1.5]
//! ```
//!
//! `--preset NAME`: a synthetic preset (`dprec-lab synth --preset`) instead of ML-100K, generated
//! with the seed, one random 80/20 fold per seed (`--folds` ignored; every rating takes
//! full part, `eps_r=none`, as in the suite's presets).

use std::path::PathBuf;
use std::sync::Arc;

use dprec::data::{Interactions, RatingScale};
use dprec::model::history::{drift_for, CountHistory};
use dprec::model::item_ranker::{ItemRanker, ItemScorer};
use dprec::numerics::sym_eigen::top_eigen;
use dprec::train::topn::dp_topn::{
    ease_weights, noise_edge, select_candidates, DpTopN, GramRelease,
};
use dprec::train::{self, Params, TrainData, Trainer};
use dprec_lab::eval::{ranking_metrics, AfterReleases, RankingConfig};
use dprec_lab::folds::{self, Fold};
use dprec_lab::synthetic::{self, SyntheticConfig};

fn main() -> anyhow::Result<()> {
    let (mut data, mut releases, mut seeds, mut n_folds, mut edges) = (
        PathBuf::from("../shared/datasets/ml-100k"),
        10u64,
        2u64,
        5usize,
        2.0f64,
    );
    let mut preset: Option<String> = None;
    let mut rule = Rule {
        share: 0.05,
        margin: 1.5,
        explore: 5,
    };
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
            "--select-share" => rule.share = v.parse()?,
            "--margin" => rule.margin = v.parse()?,
            "--explore" => rule.explore = v.parse()?,
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
        "rule (selection by LOO)",
    ];
    let mut sums = [0.0; 5];
    let mut n = 0.0;
    for (fold, seed) in &runs {
        let seed = *seed;
        let m = Interactions::new(&fold.train);
        let d = TrainData::new(&fold.train, &m, scale);
        {
            let mut out = [0.0; 5];
            for (k, name) in ["dp-topn", "dp-popularity"].iter().enumerate() {
                let t = AfterReleases {
                    inner: Arc::from(train::build(name, &Params::parse(&extra)?)?),
                    releases,
                    arrivals: false,
                };
                let fitted = t.fit(&d, &mut dprec_dp::rng::seeded(seed))?;
                let r = fitted.ranker.as_ref().expect("a ranker");
                out[k] = ranking_metrics(r.as_ref(), &m, &fold.test, &cfg).ndcg;
            }
            let (r, counts_only, spectrum) =
                averaged_gram_ranker(&gram_trainer, &d, seed, releases, edges)?;
            out[2] = ranking_metrics(&r, &m, &fold.test, &cfg).ndcg;
            out[3] = ranking_metrics(&counts_only, &m, &fold.test, &cfg).ndcg;
            let (users, diff) = loo_difference(&r, &counts_only, &m, seed);
            let (ruled, trail) = rule_ranker(&rule, &extra, &d, &m, seed, releases, edges)?;
            out[4] = ranking_metrics(&ruled, &m, &fold.test, &cfg).ndcg;
            println!(
                "{} seed {seed}: {:.4} {:.4} {:.4} {:.4} {:.4} | {spectrum} | loo users {users} \
                 hits(ease) - hits(counts) {diff} | rule {trail}",
                fold.name, out[0], out[1], out[2], out[3], out[4]
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
/// of the average (its leading eigenvalues and trace in noise edges of the average).
fn averaged_gram_ranker(
    t: &DpTopN,
    d: &TrainData<'_>,
    seed: u64,
    releases: u64,
    edges: f64,
) -> anyhow::Result<(ItemRanker, ItemRanker, String)> {
    let mut rng = dprec_dp::rng::seeded(seed);
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
    average_rankers(t, &rels, counts, edges)
}

/// EASE on the Gram of the Gram releases `rels` averaged over a candidate set fixed from
/// the combined `counts`, the counts list alone, and the average's spectrum statistics.
fn average_rankers(
    t: &DpTopN,
    rels: &[GramRelease],
    counts: Vec<f64>,
    edges: f64,
) -> anyhow::Result<(ItemRanker, ItemRanker, String)> {
    let sigma_count = rels[0].sigma_count;
    let cand = select_candidates(&counts, t.threshold * sigma_count, t.k);
    let k = cand.len();
    let n_items = counts.len();
    let mut pos = vec![usize::MAX; n_items];
    for (a, &j) in cand.iter().enumerate() {
        pos[j as usize] = a;
    }
    let (mut g, mut seen) = (vec![0.0; k * k], vec![0.0; k * k]);
    for rel in rels {
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
    let mut rng = dprec_dp::rng::seeded(seed ^ 0x5eed);
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

/// A served rule simulated: each release spends a `share` of its budget on the noisy
/// leave-one-out difference (sensitivity 1, Gaussian of multiplier `z / sqrt(share)`, the
/// rest of the release scaled down to `1 - share`), combined across releases by a plain
/// mean; the first release spends the rest on counts, the next alternate Gram and counts
/// until `explore` Gram releases are in, then the rest goes to the Gram while the combined
/// difference exceeds `margin` of its sd; the list served after the last release is EASE
/// on the averaged Gram under the same condition, else the counts.
struct Rule {
    share: f64,
    margin: f64,
    explore: u64,
}

fn rule_ranker(
    rule: &Rule,
    extra: &[&str],
    d: &TrainData<'_>,
    m: &Interactions,
    seed: u64,
    releases: u64,
    edges: f64,
) -> anyhow::Result<(ItemRanker, String)> {
    let z = DpTopN::from_params(&Params::parse(extra)?)?
        .multipliers()?
        .0;
    let factor = format!("noise_factor={}", 1.0 / (1.0 - rule.share).sqrt());
    let trainer = |split: &str| -> anyhow::Result<DpTopN> {
        let p = [&[split, factor.as_str()], extra].concat();
        Ok(DpTopN::from_params(&Params::parse(&p)?)?)
    };
    let (gram_t, counts_t) = (trainer("split=gram")?, trainer("split=counts")?);
    let sigma_sel = z / rule.share.sqrt();
    let mut rng = dprec_dp::rng::seeded(seed);
    let mut noise = dprec_dp::rng::seeded(seed ^ 0xd1ff);
    let mut state: Option<CountHistory> = None;
    let mut grams: Vec<GramRelease> = Vec::new();
    let (mut sel_sum, mut sel_n) = (0.0, 0.0f64);
    let favours = |sum: f64, n: f64| n > 0.0 && sum / n > rule.margin * sigma_sel / n.sqrt();
    let mut trail = String::new();
    for r in 0..releases {
        // The first release spends the rest on counts (a served list at once); then
        // Gram and counts releases alternate until `explore` Gram releases are in; then
        // the Gram only while the selection favours it.
        let exploring = (grams.len() as u64) < rule.explore;
        let gram = if r == 0 {
            false
        } else if exploring {
            trail.ends_with('c')
        } else {
            favours(sel_sum, sel_n)
        };
        let t = if gram { &gram_t } else { &counts_t };
        let rel = t.release(d, &mut rng)?;
        let h = CountHistory::update(
            state.as_ref(),
            "probe",
            &rel.noisy_counts,
            rel.sigma_count,
            drift_for(t.plan.releases),
        )?;
        trail.push(if gram { 'G' } else { 'c' });
        if gram {
            grams.push(rel);
        }
        if !grams.is_empty() {
            let (ease, counts_only, _) = average_rankers(&gram_t, &grams, h.mean.clone(), edges)?;
            let (_, diff) = loo_difference(&ease, &counts_only, m, seed + r);
            sel_sum += diff as f64 + sigma_sel * gaussian01(&mut noise);
            sel_n += 1.0;
        }
        state = Some(h);
    }
    let counts = state.expect("one release at least").mean;
    let serve_gram = !grams.is_empty() && favours(sel_sum, sel_n);
    trail.push_str(&format!(
        " diff {:.1} sd {:.1} -> {}",
        sel_sum / sel_n.max(1.0),
        sigma_sel / sel_n.max(1.0).sqrt(),
        if serve_gram { "ease" } else { "counts" }
    ));
    if serve_gram {
        let (ease, _, _) = average_rankers(&gram_t, &grams, counts, edges)?;
        return Ok((ease, trail));
    }
    let sigma = state_sigma(&grams, &counts_t)?;
    let cand = select_candidates(&counts, counts_t.threshold * sigma, counts_t.k);
    let pop: Vec<f64> = cand.iter().map(|&j| counts[j as usize]).collect();
    let n_items = counts.len();
    let list = ItemRanker::new(n_items, cand, pop, ItemScorer::Popularity, 0.0).with_fill(counts);
    Ok((list, trail))
}

/// The count noise sd used to pick candidates from the combined counts: the first count
/// part's (as a Gram release has it).
fn state_sigma(grams: &[GramRelease], t: &DpTopN) -> anyhow::Result<f64> {
    if let Some(g) = grams.first() {
        return Ok(g.sigma_count);
    }
    let (_, z_c, _) = t.multipliers()?;
    Ok(z_c * t.contribution.count_clip)
}

/// A standard normal draw (Box-Muller) from the probe's own generator.
fn gaussian01(rng: &mut impl rand::Rng) -> f64 {
    let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let v: f64 = rng.random::<f64>();
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}
