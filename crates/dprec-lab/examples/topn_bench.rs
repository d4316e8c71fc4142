//! One `dp-topn` release on a synthetic preset: speed (time, peak RSS) and, with
//! `--quality`, ranking quality against `dp-popularity` at the same plan.
//!
//! ```text
//! cargo run --release --example topn_bench -- --preset ml20m [--scale N] [--quality]
//!     [--releases 52] [--eps 10] [--param key=value ...] [--rank-users 5000] [--seed 42]
//!     [--releases-seen N] [--noise-seed N]
//! ```
//!
//! `--noise-seed N` (quality): the trainers' generator seed (default `--seed`), so that the
//! noise can be redrawn on the same data and split (the spread of a ratio over noise alone).
//!
//! `--releases-seen N` (quality): every DP trainer is fitted N times on the training split,
//! each fit continuing the previous one's counts filter state (`dprec_lab::eval::AfterReleases`:
//! what the service serves after N releases of an unchanged store). With `--arrivals` the
//! store grows instead: release r of N sees a random r/N of the training ratings.
//!
//! Speed: generate the preset, build the sparse views, then time `Trainer::fit` of
//! `dp-topn` (default plan unless overridden) on all ratings. Quality: a seeded 80/20
//! split of the ratings (every rating independently), `dp-topn` and `dp-popularity`
//! fitted on the 80% (and the non-private `popularity`, plus `ease` up to 2,000 items),
//! ranking metrics (`eval::ranking_metrics`, relevant = held-out
//! rating >= 4) on an evenly spaced subset of `--rank-users` test users.

use std::time::Instant;

use dprec::data::{Interactions, Ratings};
use dprec::train::{self, Params, Ranker, TrainData, Trainer};
use dprec_lab::eval::{ranking_metrics, RankingConfig};
use dprec_lab::synthetic::{self, SyntheticConfig};
use rand::Rng;

fn peak_rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l["VmHWM:".len()..].trim().to_owned())
        })
        .unwrap_or_else(|| "unavailable".into())
}

fn main() -> anyhow::Result<()> {
    let mut preset = "ml20m".to_owned();
    let mut seed = 42u64;
    let mut scale: Option<usize> = None;
    let mut quality = false;
    let mut params: Vec<String> = Vec::new();
    let mut rank_users = 5000usize;
    let mut releases_seen = 1u64;
    let mut arrivals = false;
    let mut noise_seed: Option<u64> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--preset" => preset = args.next().unwrap_or_default(),
            "--seed" => seed = args.next().unwrap_or_default().parse()?,
            "--scale" => scale = Some(args.next().unwrap_or_default().parse()?),
            "--quality" => quality = true,
            "--releases" => params.push(format!("releases={}", args.next().unwrap_or_default())),
            "--eps" => params.push(format!("eps={}", args.next().unwrap_or_default())),
            "--param" => params.push(args.next().unwrap_or_default()),
            "--rank-users" => rank_users = args.next().unwrap_or_default().parse()?,
            "--releases-seen" => releases_seen = args.next().unwrap_or_default().parse()?,
            "--arrivals" => arrivals = true,
            "--noise-seed" => noise_seed = Some(args.next().unwrap_or_default().parse()?),
            other => anyhow::bail!(
                "unknown argument {other:?} (--preset NAME, --scale N, --quality, \
                 --releases N, --eps X, --param k=v, --rank-users N, --seed N, \
                 --releases-seen N, --arrivals, --noise-seed N)"
            ),
        }
    }
    let Some(mut cfg) = SyntheticConfig::preset(&preset) else {
        anyhow::bail!(
            "unknown preset {preset:?} (one of {:?})",
            SyntheticConfig::PRESETS
        )
    };
    if let Some(n) = scale {
        cfg = cfg.scaled(n);
    }
    cfg.seed = seed;
    println!(
        "preset {preset}: {} users, {} items, {} ratings, seed {}, {} threads, params {:?}",
        cfg.n_users,
        cfg.n_items,
        cfg.n_ratings,
        cfg.seed,
        rayon::current_num_threads(),
        params
    );
    let t = Instant::now();
    let data = synthetic::generate(&cfg)?;
    println!("generate:      {:8.2} s", t.elapsed().as_secs_f64());
    let all = data.ratings;
    let p = Params::parse(&params)?;
    let trainer = train::build("dp-topn", &p)?;
    println!("dp-topn params: {}", trainer.params());

    if !quality {
        let t = Instant::now();
        let m = Interactions::new(&all);
        println!("interactions:  {:8.2} s", t.elapsed().as_secs_f64());
        let t = Instant::now();
        let fitted = trainer.fit(
            &TrainData::new(&all, &m, data.scale),
            &mut dprec_dp::rng::seeded(seed),
        )?;
        let secs = t.elapsed().as_secs_f64();
        let k = fitted
            .ranker
            .as_ref()
            .map(|r| {
                let mut s = vec![0.0; r.n_items()];
                r.score_items(None, &[], &mut s);
                s.iter().filter(|x| x.is_finite()).count()
            })
            .unwrap_or(0);
        println!(
            "dp-topn fit:   {secs:8.2} s  ({} ratings, {k} candidates, {} users charged)",
            all.len(),
            fitted.charges.users.len()
        );
        println!("peak RSS (VmHWM): {}", peak_rss());
        return Ok(());
    }

    // Seeded 80/20 split.
    let mut rng = dprec_dp::rng::seeded(seed ^ 0x5eed);
    let (mut train_r, mut test_r) = (
        Ratings::with_dims(all.n_users, all.n_items),
        Ratings::with_dims(all.n_users, all.n_items),
    );
    for k in 0..all.len() {
        let dst = if rng.random::<f64>() < 0.8 {
            &mut train_r
        } else {
            &mut test_r
        };
        dst.push(all.users[k], all.items[k], all.values[k]);
    }
    let all_items = all.n_items;
    drop(all);
    let m = Interactions::new(&train_r);
    let cfg_rank = RankingConfig {
        max_users: Some(rank_users),
        ..RankingConfig::default()
    };
    // dp-popularity at dp-topn's plan (both default to the service's).
    let pop_params: Vec<String> = params
        .iter()
        .filter(|s| {
            ["releases=", "eps=", "delta=", "eps_r=", "noise_factor="]
                .iter()
                .any(|k| s.starts_with(k))
        })
        .cloned()
        .collect();
    // Non-private references: popularity always, EASE where its dense item-item solve
    // is affordable.
    // DP popularity of the liked ratings only (`liked=top`, as dp-topn counts by default):
    // a reference that shows how much of dp-topn's lead is which ratings it counts.
    let mut liked_params = pop_params.clone();
    liked_params.push("liked=top".into());
    let mut runs = vec![
        ("dp-topn", "dp-topn", params.clone()),
        ("dp-popularity", "dp-popularity", pop_params),
        ("dp-pop-liked", "dp-popularity", liked_params),
        ("popularity", "popularity", Vec::new()),
    ];
    if all_items <= 2_000 {
        runs.push(("ease", "ease", Vec::new()));
    }
    for (name, trainer, tp) in runs {
        let t = dprec_lab::eval::AfterReleases {
            inner: std::sync::Arc::from(train::build(trainer, &Params::parse(&tp)?)?),
            releases: releases_seen,
            arrivals,
        };
        let start = Instant::now();
        let fitted = t.fit(
            &TrainData::new(&train_r, &m, data.scale),
            &mut dprec_dp::rng::seeded(noise_seed.unwrap_or(seed)),
        )?;
        let fit_s = start.elapsed().as_secs_f64();
        // What the release spent the rest of its budget on, and the trace that decided.
        if let Some(m) = fitted.charges.mechanisms.first() {
            if let Some(spent) = m.params.get("spent_on").and_then(|v| v.as_str()) {
                let tr = &m.params["trace"];
                match (tr["noisy_trace"].as_f64(), tr["edge"].as_f64()) {
                    (Some(t), Some(e)) if e > 0.0 => println!(
                        "{name}: spent on {spent}, count mass / trace {:.2}, trace {t:.0} / edge {e:.1} = {:.1}",
                        tr["count_mass"].as_f64().unwrap_or(f64::NAN) / t,
                        t / e
                    ),
                    _ => println!("{name}: spent on {spent}"),
                }
            }
        }
        if let Some(dprec::train::StoredRanker::Item { model }) = fitted
            .ranker
            .as_ref()
            .and_then(|r| dprec::train::StoredRanker::of(r.as_ref()))
        {
            let d = match &model.scorer {
                dprec::model::item_ranker::ItemScorer::Projection { d, .. } => *d,
                _ => 0,
            };
            println!("{name}: {} candidates, d {d}", model.candidates.len());
        }
        let ranker: &dyn Ranker = match &fitted.ranker {
            Some(r) => r.as_ref(),
            None => &fitted.model,
        };
        let start = Instant::now();
        let q = ranking_metrics(ranker, &m, &test_r, &cfg_rank);
        println!(
            "{name:<14} {tp:?}: NDCG@10 {:.4}  P@10 {:.4}  R@10 {:.4}  coverage {:.4}  mean pop {:.0}  ({} users; fit {fit_s:.2} s, rank {:.2} s)",
            q.ndcg,
            q.precision,
            q.recall,
            q.coverage,
            q.mean_popularity,
            q.users,
            start.elapsed().as_secs_f64()
        );
    }
    println!("peak RSS (VmHWM): {}", peak_rss());
    Ok(())
}
