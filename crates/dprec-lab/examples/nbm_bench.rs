//! Times one `dpsgd-nbm` (or `dpps-nbm`, `nbm`) release on the MovieLens-20M-size
//! synthetic preset (138,493 users, 26,744 items, 20,000,263 ratings), for one
//! neighbourhood size K. Run it under `/usr/bin/time -v` for the peak RSS:
//!
//! ```text
//! cargo build --release --example nbm_bench
//! /usr/bin/time -v target/release/examples/nbm_bench --neighbours 500 [--trainer dpsgd-nbm] [--params steps=200,q=0.1] [--ratings N]
//! ```
//!
//! Prints the time to generate the data, to build the sparse views, and of `Trainer::fit`.

use std::time::Instant;

use dprec::data::Interactions;
use dprec::train::{self, Params, TrainData};
use dprec_lab::synthetic::{self, SyntheticConfig};

fn main() -> anyhow::Result<()> {
    let mut neighbours = 500usize;
    let mut trainer = "dpsgd-nbm".to_owned();
    let mut extra = String::new();
    let mut n_ratings: Option<usize> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))
        };
        match a.as_str() {
            "--neighbours" => neighbours = val()?.parse()?,
            "--trainer" => trainer = val()?,
            "--params" => extra = val()?,
            "--ratings" => n_ratings = Some(val()?.parse()?),
            other => anyhow::bail!(
                "unknown argument {other:?} (--neighbours K, --trainer NAME, --params k=v,.., --ratings N)"
            ),
        }
    }
    let mut cfg = SyntheticConfig::movielens_20m_like();
    if let Some(n) = n_ratings {
        cfg = cfg.scaled(n);
    }
    let start = Instant::now();
    let ds = synthetic::generate(&cfg)?;
    let gen = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let m = Interactions::new(&ds.ratings);
    let prep = start.elapsed().as_secs_f64();
    let mut kv: Vec<String> = vec![format!("neighbours={neighbours}")];
    kv.extend(
        extra
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(str::to_owned),
    );
    let t = train::build(&trainer, &Params::parse(&kv)?)?;
    let data = TrainData::new(&ds.ratings, &m, ds.scale);
    let start = Instant::now();
    let fitted = t.fit(&data, &mut dprec_dp::rng::seeded(1))?;
    let fit = start.elapsed().as_secs_f64();
    println!(
        "{trainer} {} | {} ratings, {} users, {} items, threads {} | generate {gen:.1} s, views {prep:.1} s, fit {fit:.1} s",
        kv.join(","),
        ds.ratings.len(),
        m.n_users,
        m.n_items,
        rayon::current_num_threads()
    );
    std::hint::black_box(fitted);
    Ok(())
}
