//! Similar items of the served `dp-topn` model against exact item-item cosine.
//!
//! ```text
//! cargo run --release --example similar_bench -- --data /path/to/ml-100k [--top 100]
//!     [--seeds 3] [--param key=value ...]
//! ```
//!
//! Fits `dp-topn` (params as given) on ALL ratings of the data set, serves the release
//! (`serve::Published::similar`, the service's own answer) and compares, for the `--top`
//! most-rated items, the 10 served similar items with the 10 nearest by exact
//! (non-private) cosine of the binary rated/not-rated item columns: overlap@10 = shared
//! items / 10, averaged over the items. Printed for the served answer (`gram`: cosine
//! of the DP Gram's rows over the candidates) and for the answer without the stored
//! neighbours (`profiles`: cosine of the model's item factors, the answer before them).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use dprec::data::{movielens, Interactions};
use dprec::model::item_ranker::{ItemRanker, Neighbours};
use dprec::serve::{Published, ReleaseMeta};
use dprec::train::{self, Guarantee, Params, Ranker, StoredRanker, TrainData};

/// The 10 nearest items of every item in `items` by cosine of the binary columns.
fn exact_neighbours(m: &Interactions, items: &[usize], n_items: usize) -> Vec<Vec<usize>> {
    let col = |j: usize| -> HashSet<u32> { m.by_item().row(j).0.iter().copied().collect() };
    let cols: Vec<HashSet<u32>> = (0..n_items).map(col).collect();
    items
        .iter()
        .map(|&j| {
            let mut s: Vec<(usize, f64)> = (0..n_items)
                .filter(|&k| k != j && !cols[k].is_empty())
                .map(|k| {
                    let both = cols[j].intersection(&cols[k]).count() as f64;
                    (k, both / ((cols[j].len() * cols[k].len()) as f64).sqrt())
                })
                .collect();
            s.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            s.into_iter().take(10).map(|(k, _)| k).collect()
        })
        .collect()
}

fn overlap(p: &Published, ids: &[String], items: &[usize], exact: &[Vec<usize>]) -> (f64, f64) {
    let (mut sum, mut ties) = (0.0, 0.0);
    for (&j, want) in items.iter().zip(exact) {
        let got = p.similar(&ids[j], 10);
        let scores: Vec<f64> = got.items.iter().map(|s| s.score).collect();
        ties += f64::from(u8::from(scores.windows(2).take(2).any(|w| w[0] == w[1])));
        let want: HashSet<&str> = want.iter().map(|&k| ids[k].as_str()).collect();
        sum += got
            .items
            .iter()
            .filter(|s| want.contains(s.item.as_str()))
            .count() as f64
            / 10.0;
    }
    (sum / items.len() as f64, ties / items.len() as f64)
}

fn main() -> anyhow::Result<()> {
    let (mut data, mut top, mut seeds) = (PathBuf::new(), 100usize, 3u64);
    let mut params: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--data" => data = args.next().unwrap_or_default().into(),
            "--top" => top = args.next().unwrap_or_default().parse()?,
            "--seeds" => seeds = args.next().unwrap_or_default().parse()?,
            "--param" => params.push(args.next().unwrap_or_default()),
            other => anyhow::bail!("unknown argument {other:?} (--data, --top, --seeds, --param)"),
        }
    }
    let ds = movielens::load(&movielens::ratings_file(&data)?, None, None)?;
    let m = Interactions::new(&ds.ratings);
    let n_items = ds.ratings.n_items;
    let ids: Vec<String> = (0..n_items)
        .map(|j| ds.items.external(j as u32).unwrap_or_default().to_owned())
        .collect();
    let mut by_count: Vec<usize> = (0..n_items).collect();
    by_count.sort_by_key(|&j| std::cmp::Reverse(m.by_item().row(j).0.len()));
    by_count.truncate(top);
    let exact = exact_neighbours(&m, &by_count, n_items);
    let trainer = train::build("dp-topn", &Params::parse(&params)?)?;
    println!("dp-topn params: {}", trainer.params());
    println!("seed  gram overlap@10  ties(top3)  profiles overlap@10  ties(top3)");
    let (mut g_sum, mut p_sum) = (0.0, 0.0);
    for seed in 1..=seeds {
        let fitted = trainer.fit(
            &TrainData::new(&ds.ratings, &m, ds.scale),
            &mut dprec_dp::rng::seeded(seed),
        )?;
        let Some(StoredRanker::Item { model }) = fitted
            .ranker
            .as_ref()
            .and_then(|r| StoredRanker::of(r.as_ref()))
        else {
            anyhow::bail!("dp-topn publishes an item ranker");
        };
        let serve = |r: ItemRanker| -> anyhow::Result<Published> {
            let counts = r.popularity_counts().unwrap_or_default();
            let meta = ReleaseMeta {
                release_id: 1,
                trainer: "dp-topn".into(),
                guarantee: Guarantee::Proven,
                created_at: 0,
            };
            let pop = counts.iter().map(|&c| c as i64).collect();
            Published::new(meta, fitted.model.clone(), vec![], ids.clone(), pop)?
                .with_ranker(Some(Arc::new(r)))
        };
        let bare = model.clone().with_neighbours(Neighbours::default());
        let (g, gt) = overlap(&serve(model)?, &ids, &by_count, &exact);
        let (p, pt) = overlap(&serve(bare)?, &ids, &by_count, &exact);
        println!("{seed:4}  {g:17.3}  {gt:10.2}  {p:19.3}  {pt:10.2}");
        (g_sum, p_sum) = (g_sum + g, p_sum + p);
    }
    let n = seeds as f64;
    println!("mean  {:17.3}  {:10}  {:19.3}", g_sum / n, "", p_sum / n);
    Ok(())
}
