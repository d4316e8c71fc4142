//! Times one training release of each trainer on the same data, side by side:
//! MovieLens-100K (all 100k ratings, if present) and a synthetic set of `--ratings` size
//! (default 1M, MovieLens-20M-like shape scaled down).
//!
//! ```text
//! cargo run --release --example train_bench -- [--ratings 1000000] [--data DIR] [--trainers dp-alt,als-mf,sgd-mf,baseline]
//! ```
//!
//! Each trainer runs `--repeats` times (default 3) on the same input; the median wall time
//! of `Trainer::fit` is printed, with the machine's thread count. Baselines in the same run
//! give the comparison that absolute times on a shared machine cannot.

use std::path::PathBuf;
use std::time::Instant;

use dprec::data::{movielens, Dataset, Interactions};
use dprec::train::{self, Params, TrainData};
use dprec_lab::synthetic::{self, SyntheticConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench(name: &str, ds: &Dataset, trainers: &[String], repeats: usize) -> anyhow::Result<()> {
    let m = Interactions::new(&ds.ratings);
    println!(
        "\n{name}: {} ratings, {} users, {} items",
        ds.ratings.len(),
        m.n_users,
        m.n_items
    );
    println!("{:<12} {:>12} {:>12}", "trainer", "median s", "min s");
    for t in trainers {
        let trainer = train::build(t, &Params::new())?;
        let mut times = Vec::with_capacity(repeats);
        for k in 0..repeats {
            let data = TrainData::new(&ds.ratings, &m, ds.scale);
            let start = Instant::now();
            let fitted = trainer.fit(&data, &mut dprec_dp::rng::seeded(k as u64))?;
            times.push(start.elapsed().as_secs_f64());
            std::hint::black_box(fitted);
        }
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        println!("{:<12} {:>12.3} {:>12.3}", t, median(times), min);
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut n_ratings = 1_000_000usize;
    let mut data_dir = PathBuf::from("../shared/datasets/ml-100k");
    let mut trainers = "dp-alt,als-mf,sgd-mf,baseline".to_owned();
    let mut repeats = 3usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))
        };
        match a.as_str() {
            "--ratings" => n_ratings = val()?.parse()?,
            "--data" => data_dir = PathBuf::from(val()?),
            "--trainers" => trainers = val()?,
            "--repeats" => repeats = val()?.parse::<usize>()?.max(1),
            other => anyhow::bail!(
                "unknown argument {other:?} (--ratings N, --data DIR, --trainers a,b, --repeats N)"
            ),
        }
    }
    let trainers: Vec<String> = trainers.split(',').map(|s| s.trim().to_owned()).collect();
    println!(
        "threads: {}, repeats: {repeats}",
        rayon::current_num_threads()
    );
    match movielens::ratings_file(&data_dir) {
        Ok(file) => bench(
            "MovieLens-100K",
            &movielens::load(&file, None, None)?,
            &trainers,
            repeats,
        )?,
        Err(e) => println!("MovieLens-100K skipped: {e}"),
    }
    let mut cfg = SyntheticConfig::movielens_20m_like().scaled(n_ratings);
    cfg.seed = 42;
    let ds = synthetic::generate(&cfg)?;
    bench(
        &format!("synthetic (ml20m-like, scaled to {n_ratings})"),
        &ds,
        &trainers,
        repeats,
    )
}
