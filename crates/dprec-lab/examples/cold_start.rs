//! Cold start: items with public labels but no ratings, as the served `dp-topn` lists
//! them after its first release or after `--releases N` (the counts and the Gram combined
//! over N releases, as `dprec-lab eval --releases-seen N`).
//!
//! ```text
//! cargo run --release -p dprec-lab --example cold_start -- --data /path/to/ml-100k
//!     [--hide 0.1] [--seeds 3] [--top 50] [--releases 1]
//! ```
//!
//! On each MovieLens-100K fold u1..u5 and noise seed, a seeded `--hide` share of the
//! catalogue is hidden: every training rating of those items is removed, while their
//! genres (u.item) stay known. Three ways of serving them are measured:
//! - **after the release**: the items were registered after the release, which does not
//!   hold them; the served label model ranks them by their labels' typical count and the
//!   user's own label lift (`LabelLift::cold_items`, what the service does); in a user's
//!   fused list (once the Gram is served) they hold the label half of the fusion
//!   (`ColdScale`);
//! - **in the release, unrated**: the release holds them with DP counts of zero ratings;
//! - **labels off**: as the previous, without the label model.
//!
//! For every test user, each hidden item they rated 4 or more in the test set is a pair; a
//! pair is found when the item is in the user's top `--top` list (the user's own training
//! items excluded). Printed: pairs found by each, and what random placement of the hidden
//! items would find (each pair `min(1, top / unrated)`, `unrated` the user's candidate
//! items), as totals over the folds and per seed, and how many of the items registered
//! after the release were found in fused lists.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use dprec::data::{Interactions, RatingScale, Ratings};
use dprec::model::labels::{ColdItems, ColdScale, ItemLabels, LabelledRanker};
use dprec::model::ranker::top_k;
use dprec::train::{self, Params, Ranker, TrainData, Trainer};
use dprec_lab::eval::ranking::own_ratings;
use dprec_lab::folds;
use rand::seq::SliceRandom;

struct Args {
    data: PathBuf,
    hide: f64,
    seeds: u64,
    top: usize,
    releases: u64,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        data: std::env::var("DPREC_ML100K_DIR")
            .unwrap_or_else(|_| "../shared/datasets/ml-100k".into())
            .into(),
        hide: 0.1,
        seeds: 3,
        top: 50,
        releases: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().with_context(|| format!("{k} needs a value"))?;
        match k.as_str() {
            "--data" => a.data = v.into(),
            "--hide" => a.hide = v.parse()?,
            "--seeds" => a.seeds = v.parse()?,
            "--top" => a.top = v.parse()?,
            "--releases" => a.releases = v.parse()?,
            other => anyhow::bail!("unknown argument {other:?}"),
        }
    }
    anyhow::ensure!(a.hide > 0.0 && a.hide < 1.0, "--hide must be in (0, 1)");
    anyhow::ensure!(a.releases >= 1, "--releases must be at least 1");
    Ok(a)
}

/// The catalogue's genres by item index of the folds (`None`: the item has none).
fn genres(
    dir: &std::path::Path,
    items: &dprec::data::IdMap,
) -> anyhow::Result<Vec<Option<Vec<String>>>> {
    let info = dprec::cli::import::read_catalogue_info(&dir.join("u.item"))?;
    let by_id: std::collections::HashMap<&str, &[String]> = info
        .iter()
        .map(|i| (i.id.as_str(), i.labels.as_slice()))
        .collect();
    Ok((0..items.len() as u32)
        .map(|j| {
            let id = items.external(j)?;
            by_id.get(id).map(|l| l.to_vec())
        })
        .collect())
}

/// Labels of the items `keep` (indices into `genres`), in that order.
fn labels_of(genres: &[Option<Vec<String>>], keep: &[usize]) -> Arc<ItemLabels> {
    Arc::new(ItemLabels::from_names(
        keep.iter()
            .map(|&j| genres.get(j).and_then(|g| g.as_deref())),
    ))
}

/// Pairs found by `ranker` among `pairs` (user, hidden relevant items), and what random
/// placement of the hidden items finds.
fn found(
    ranker: &dyn Ranker,
    train: &Interactions,
    pairs: &[(usize, Vec<usize>)],
    n_items: usize,
    top: usize,
) -> (usize, f64) {
    let mut scores = vec![0.0; ranker.n_items()];
    let mut excluded = vec![false; n_items];
    let (mut hits, mut random) = (0, 0.0);
    for (u, hidden) in pairs {
        let own = own_ratings(train, *u);
        own.iter().for_each(|&(j, _)| excluded[j] = true);
        ranker.score_items(Some(*u), &own, &mut scores);
        let list = top_k(&scores, &excluded, top);
        own.iter().for_each(|&(j, _)| excluded[j] = false);
        hits += hidden.iter().filter(|j| list.contains(j)).count();
        let unrated = (n_items - own.len()).max(1);
        random += hidden.len() as f64 * (top as f64 / unrated as f64).min(1.0);
    }
    (hits, random)
}

/// Pairs found when the hidden items were registered after the release: `ranker` holds
/// the kept items only (its item `k` is the fold's item `keep[k]`), and the hidden ones
/// are ranked as the cold items of its label model (`cold_fold[c]`: the fold's index of
/// cold item `c`) where the user's list is the label list or the fused list. Also how
/// many of those were found in fused lists.
fn found_after(
    ranker: &dyn Ranker,
    train: &Interactions,
    keep: &[usize],
    cold: &ColdItems,
    cold_fold: &[usize],
    pairs: &[(usize, Vec<usize>)],
    top: usize,
) -> (usize, usize) {
    let mut scores = vec![0.0; ranker.n_items()];
    let mut own_item = vec![false; ranker.n_items()];
    let (mut hits, mut fused) = (0, 0);
    for (u, hidden) in pairs {
        let own = own_ratings(train, *u);
        own.iter().for_each(|&(k, _)| own_item[k] = true);
        ranker.score_items(Some(*u), &own, &mut scores);
        let mut list: Vec<(f64, usize)> = scores
            .iter()
            .enumerate()
            .filter(|&(k, s)| !own_item[k] && *s > f64::NEG_INFINITY)
            .map(|(k, &s)| (s, keep[k]))
            .collect();
        own.iter().for_each(|&(k, _)| own_item[k] = false);
        let scale = LabelledRanker::of(ranker).and_then(|l| l.cold_scale(&own, cold));
        if let Some(scale) = &scale {
            list.extend((0..cold.ids.len()).map(|c| (scale.score(cold, c), cold_fold[c])));
        }
        list.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        list.truncate(top);
        let found = hidden
            .iter()
            .filter(|j| list.iter().any(|&(_, i)| i == **j))
            .count();
        hits += found;
        if matches!(scale, Some(ColdScale::Fused { .. })) {
            fused += found;
        }
    }
    (hits, fused)
}

fn fit(
    trainer: &dyn Trainer,
    train: &Ratings,
    scale: RatingScale,
    seed: u64,
) -> anyhow::Result<(Arc<dyn Ranker>, Interactions)> {
    let matrix = Interactions::new(train);
    let data = TrainData::new(train, &matrix, scale);
    let fitted = trainer.fit(&data, &mut dprec_dp::rng::seeded(seed))?;
    let ranker = fitted.ranker.context("dp-topn publishes a ranker")?;
    Ok((ranker, matrix))
}

/// One fold's hidden items registered after the release: the release fitted on the kept
/// items (re-indexed), its cold items, and the pairs it finds.
fn after_release(
    genres: &[Option<Vec<String>>],
    fold_train: &Ratings,
    hidden: &[bool],
    scale: RatingScale,
    seed: u64,
    pairs: &[(usize, Vec<usize>)],
    a: &Args,
) -> anyhow::Result<(usize, usize)> {
    let keep: Vec<usize> = (0..hidden.len()).filter(|&j| !hidden[j]).collect();
    let mut at = vec![usize::MAX; hidden.len()];
    keep.iter().enumerate().for_each(|(k, &j)| at[j] = k);
    let mut train = Ratings::with_dims(fold_train.n_users, keep.len());
    for i in 0..fold_train.len() {
        let j = fold_train.items[i] as usize;
        if !hidden[j] {
            train.push(fold_train.users[i], at[j] as u32, fold_train.values[i]);
        }
    }
    let trainer = train::AfterReleases::served(
        train::build("dp-topn", &Params::parse::<&str>(&[])?)?
            .with_item_labels(labels_of(genres, &keep))
            .context("dp-topn takes labels")?
            .into(),
        a.releases,
    );
    let (ranker, matrix) = fit(trainer.as_ref(), &train, scale, seed)?;
    let Some(lift) = LabelledRanker::of(ranker.as_ref()).and_then(|l| l.label_model()) else {
        return Ok((0, 0));
    };
    let ids: Vec<(String, &[String])> = (0..hidden.len())
        .filter(|&j| hidden[j])
        .filter_map(|j| Some((j.to_string(), genres.get(j)?.as_deref()?)))
        .collect();
    let cold = lift.cold_items(0, ids.iter().map(|(id, l)| (id.as_str(), *l)));
    let cold_fold: Vec<usize> = cold
        .ids
        .iter()
        .map(|i| i.parse().expect("an index"))
        .collect();
    Ok(found_after(
        ranker.as_ref(),
        &matrix,
        &keep,
        &cold,
        &cold_fold,
        pairs,
        a.top,
    ))
}

fn main() -> anyhow::Result<()> {
    let a = args()?;
    let f = folds::predefined_ml100k(&a.data)?;
    let genres = genres(&a.data, &f.items)?;
    let all: Vec<usize> = (0..f.items.len()).collect();
    let on = train::AfterReleases::served(
        train::build("dp-topn", &Params::parse::<&str>(&[])?)?
            .with_item_labels(labels_of(&genres, &all))
            .context("dp-topn takes labels")?
            .into(),
        a.releases,
    );
    let off = train::AfterReleases::served(
        train::build("dp-topn", &Params::parse(&["labels=off"])?)?.into(),
        a.releases,
    );
    println!(
        "releases {}, hidden share {}, top {}; pairs = (user, hidden item rated >= 4 in the test set)",
        a.releases, a.hide, a.top
    );
    println!("seed  pairs  after-release  in-release  labels-off  random");
    let (mut all_after, mut all_on, mut all_off, mut all_random, mut all_pairs) = (0, 0, 0, 0.0, 0);
    let mut all_fused = 0;
    for seed in 0..a.seeds {
        let (mut p_after, mut p_on, mut p_off, mut p_random, mut n_pairs) = (0, 0, 0, 0.0, 0);
        for (k, fold) in f.folds.iter().enumerate() {
            let n_items = fold.train.n_items.max(fold.test.n_items);
            let mut order: Vec<usize> = (0..n_items).collect();
            order.shuffle(&mut dprec_dp::rng::seeded(seed * 100 + k as u64));
            let mut hidden = vec![false; n_items];
            let count = (a.hide * n_items as f64).round() as usize;
            order[..count].iter().for_each(|&j| hidden[j] = true);
            let mut train = Ratings::with_dims(fold.train.n_users, n_items);
            for i in 0..fold.train.len() {
                let j = fold.train.items[i];
                if !hidden[j as usize] {
                    train.push(fold.train.users[i], j, fold.train.values[i]);
                }
            }
            let mut by_user: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
            for i in 0..fold.test.len() {
                let j = fold.test.items[i] as usize;
                if hidden[j] && fold.test.values[i] >= 4.0 {
                    by_user
                        .entry(fold.test.users[i] as usize)
                        .or_default()
                        .push(j);
                }
            }
            let pairs: Vec<(usize, Vec<usize>)> = by_user.into_iter().collect();
            n_pairs += pairs.iter().map(|(_, h)| h.len()).sum::<usize>();
            let fold_seed = seed * 1_000 + k as u64;
            let (r, m) = fit(on.as_ref(), &train, f.scale, fold_seed)?;
            let (hits, random) = found(r.as_ref(), &m, &pairs, n_items, a.top);
            let (r, m) = fit(off.as_ref(), &train, f.scale, fold_seed)?;
            let (after, fused) = after_release(
                &genres,
                &fold.train,
                &hidden,
                f.scale,
                fold_seed,
                &pairs,
                &a,
            )?;
            (p_after, all_fused) = (p_after + after, all_fused + fused);
            p_on += hits;
            p_off += found(r.as_ref(), &m, &pairs, n_items, a.top).0;
            p_random += random;
        }
        println!(
            "{seed:>4}  {n_pairs:>5}  {p_after:>13}  {p_on:>10}  {p_off:>10}  {p_random:>6.1}"
        );
        (all_after, all_on, all_off, all_random, all_pairs) = (
            all_after + p_after,
            all_on + p_on,
            all_off + p_off,
            all_random + p_random,
            all_pairs + n_pairs,
        );
    }
    let share = |x: f64| 100.0 * x / all_pairs.max(1) as f64;
    println!(
        "found in the top {}: registered after the release {:.1}%, in the release unrated {:.1}%, \
         labels off {:.1}%, random placement {:.1}% of {} pairs; of those found after the \
         release, {} in fused lists",
        a.top,
        share(all_after as f64),
        share(all_on as f64),
        share(all_off as f64),
        share(all_random),
        all_pairs,
        all_fused
    );
    Ok(())
}
