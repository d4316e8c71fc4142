//! Times synthetic generation at MovieLens scale and the CSR/CSC build on top of it.
//!
//! ```text
//! cargo run --release --example synth_bench -- [--preset ml20m|ml100k|ml20m-taste|ml100k-taste] [--seed N]
//! ```
//!
//! Prints seconds per step and the peak resident memory (VmHWM).

use std::time::Instant;

use dprec::data::Interactions;
use dprec_lab::synthetic::{self, SyntheticConfig};

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
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--preset" => preset = args.next().unwrap_or_default(),
            "--seed" => seed = args.next().unwrap_or_default().parse()?,
            other => {
                anyhow::bail!("unknown argument {other:?} (use --preset ml20m|ml100k|ml20m-taste|ml100k-taste, --seed N)")
            }
        }
    }
    let Some(mut cfg) = SyntheticConfig::preset(&preset) else {
        anyhow::bail!(
            "unknown preset {preset:?} (one of {:?})",
            SyntheticConfig::PRESETS
        )
    };
    cfg.seed = seed;
    println!(
        "preset {preset}: {} users, {} items, {} ratings target, rank {}, seed {}, {} threads",
        cfg.n_users,
        cfg.n_items,
        cfg.n_ratings,
        cfg.rank,
        cfg.seed,
        rayon::current_num_threads()
    );

    let t = Instant::now();
    let data = synthetic::generate(&cfg)?;
    let gen = t.elapsed().as_secs_f64();
    let r = &data.ratings;
    let max_user = {
        let mut c = vec![0u32; r.n_users];
        for &u in &r.users {
            c[u as usize] += 1;
        }
        c.into_iter().max().unwrap_or(0)
    };
    println!(
        "generate:      {gen:8.2} s  ({} ratings, mean {:.3}, most active user {max_user}; peak RSS so far {})",
        r.len(),
        r.mean(),
        peak_rss()
    );

    let t = Instant::now();
    let m = Interactions::new(r);
    let build = t.elapsed().as_secs_f64();
    println!("fingerprint:   {:016x}", synthetic::fingerprint(r));
    println!(
        "interactions:  {build:8.2} s  ({} entries in CSR + CSC)",
        m.nnz()
    );
    println!("total:         {:8.2} s", gen + build);
    println!("peak RSS (VmHWM): {}", peak_rss());
    Ok(())
}
