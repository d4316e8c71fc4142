//! Times one simulated Private-GD / GD-DR round over every user of a synthetic preset:
//! every client fits its profile against the public item profiles and sends one bit,
//! the curator aggregates and updates the item profiles.
//!
//! ```text
//! cargo run --release --example private_gd_bench -- [--preset ml20m|ml100k|ml20m-taste|ml100k-taste] [--dim Q]
//!     [--rounds N] [--seed N]
//! ```
//!
//! Prints seconds for data generation, the one-off projection setup (Phi and the Cholesky
//! factor of Phi Phi^T, public and computed once per projection) and each round.

use std::time::Instant;

use dprec::data::Interactions;
use dprec::ldp::private_gd::{next_state, Recovery, RoundState};
use dprec::train::local::private_gd::{simulate_round, PrivateGd};
use dprec_lab::synthetic::{self, SyntheticConfig};
use rand::Rng;

fn main() -> anyhow::Result<()> {
    let mut preset = "ml20m".to_owned();
    let mut seed = 42u64;
    let mut dim = 2700usize;
    let mut rounds = 1usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_default();
        match a.as_str() {
            "--preset" => preset = val(),
            "--seed" => seed = val().parse()?,
            "--dim" => dim = val().parse()?,
            "--rounds" => rounds = val().parse()?,
            other => anyhow::bail!(
                "unknown argument {other:?} (use --preset ml20m|ml100k|ml20m-taste|ml100k-taste, --dim Q, --rounds N, --seed N)"
            ),
        }
    }
    let Some(mut cfg) = SyntheticConfig::preset(&preset) else {
        anyhow::bail!(
            "unknown preset {preset:?} (one of {:?})",
            SyntheticConfig::PRESETS
        )
    };
    cfg.seed = seed;
    let t = Instant::now();
    let data = synthetic::generate(&cfg)?;
    let m = Interactions::new(&data.ratings);
    println!(
        "preset {preset}: {} users, {} items, {} ratings; generated in {:.1} s; {} threads",
        m.n_users,
        m.n_items,
        m.nnz(),
        t.elapsed().as_secs_f64(),
        rayon::current_num_threads()
    );
    let trainer = PrivateGd {
        dim,
        rounds: rounds.max(1) as u32,
        ..PrivateGd::default()
    };
    let mut rng = dprec_dp::rng::seeded(seed);
    let offset = (data.scale.min + data.scale.max) / 2.0;
    let schedule = trainer.schedule(m.n_items, offset, rng.random());
    let t = Instant::now();
    let recovery = Recovery::new(&schedule, m.n_items)?;
    println!(
        "projection setup (q = {}, once per projection): {:.2} s",
        schedule.report_rows(m.n_items),
        t.elapsed().as_secs_f64()
    );
    let mut state = RoundState::initial(schedule, m.n_items, trainer.init_sd, &mut rng)?;
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        let agg = simulate_round(&state, &m, rng.random())?;
        let clients = t.elapsed().as_secs_f64();
        let t2 = Instant::now();
        let next = next_state(&state, &recovery, &agg)?;
        let server = t2.elapsed().as_secs_f64();
        println!(
            "round {}: {} reports; clients {:.2} s + curator update {:.2} s = {:.2} s",
            state.round,
            agg.n,
            clients,
            server,
            clients + server
        );
        state = next;
    }
    Ok(())
}
