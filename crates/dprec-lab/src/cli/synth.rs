//! `dprec-lab synth`: writes a seeded synthetic rating set as a MovieLens-style CSV.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};

use crate::synthetic::{self, SyntheticConfig};

/// Size presets of `dprec-lab synth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// MovieLens-100K sized: 943 users, 1682 items, 100,000 ratings, 1..5 stars.
    Ml100k,
    /// MovieLens-20M sized: 138,493 users, 26,744 items, 20,000,263 ratings, half stars.
    Ml20m,
    /// ml100k whose users rate within their taste groups (personal structure in which
    /// items are rated, calibrated to ML-100K's EASE / popularity ratio).
    Ml100kTaste,
    /// ml20m with the taste groups of ml100k-taste.
    Ml20mTaste,
    /// Few heavy raters over a large catalogue: 610 users, 9,742 items, 100,836 ratings
    /// (165 per user, heavy tail), half stars, taste groups with personal share 0.5.
    HeavyRaters,
    /// Many light raters: 20,000 users, 8,000 items, 20 ratings per user (at least 5).
    LightRaters,
    /// A wide catalogue: 3,000 users, 60,000 items, flat popularity, weak tastes.
    WideCatalogue,
    /// A small store: 500 users, 1,600 items, 50 ratings per user, strong tastes.
    SmallStore,
    /// Dense raters: 1,500 users, 4,000 items, 250 ratings per user (at least 50).
    DenseRaters,
    /// MovieLens-1M sized with taste groups: 6,040 users, 3,706 items, 1,000,209 ratings.
    Ml1mTaste,
}

/// Arguments of `dprec-lab synth`.
#[derive(Debug, clap::Args)]
pub struct SynthArgs {
    /// Size and model preset [default: ml100k].
    #[arg(long, value_enum, default_value_t = Preset::Ml100k, hide_default_value = true)]
    pub preset: Preset,
    /// Number of users [default: the preset's, or scaled with --ratings].
    #[arg(long)]
    pub users: Option<usize>,
    /// Number of items [default: the preset's, or scaled with --ratings].
    #[arg(long)]
    pub items: Option<usize>,
    /// Number of ratings; without --users/--items these scale with it [default: the
    /// preset's].
    #[arg(long)]
    pub ratings: Option<usize>,
    /// Rank of the latent factors [default: the preset's, 10].
    #[arg(long)]
    pub rank: Option<usize>,
    /// Standard deviation of the Gaussian rating noise [default: the preset's, 0.75 for
    /// ml100k and 0.7 for ml20m].
    #[arg(long)]
    pub noise: Option<f64>,
    /// Number of taste groups [default: the preset's: 0, or 20 for the *-taste presets].
    #[arg(long)]
    pub taste_groups: Option<usize>,
    /// Taste groups in each user's mix [default: the preset's].
    #[arg(long)]
    pub groups_per_user: Option<usize>,
    /// Share of a user's item draws from the user's taste groups, in [0, 1] (0: off)
    /// [default: the preset's].
    #[arg(long)]
    pub personal_share: Option<f64>,
    /// Also write the catalogue with public labels as movies.csv beside the output (one
    /// label per item, its taste group with this probability, a random group otherwise:
    /// 1 labels that explain the personal part of taste, 0 pure noise); needs taste
    /// groups.
    #[arg(long, value_name = "SIGNAL", value_parser = unit_interval)]
    pub labels: Option<f64>,
    /// Seed of the generator [default: 42].
    #[arg(long, default_value_t = 42, hide_default_value = true)]
    pub seed: u64,
    /// Output CSV file (userId,movieId,rating,timestamp) [required, no default].
    #[arg(long, value_name = "FILE.csv")]
    pub out: PathBuf,
}

impl SynthArgs {
    /// The generator configuration these arguments describe.
    pub fn config(&self) -> SyntheticConfig {
        let mut cfg = match self.preset {
            Preset::Ml100k => SyntheticConfig::movielens_100k_like(),
            Preset::Ml20m => SyntheticConfig::movielens_20m_like(),
            Preset::Ml100kTaste => SyntheticConfig::movielens_100k_taste(),
            Preset::Ml20mTaste => SyntheticConfig::movielens_20m_taste(),
            Preset::HeavyRaters => SyntheticConfig::heavy_raters(),
            Preset::LightRaters => SyntheticConfig::light_raters(),
            Preset::WideCatalogue => SyntheticConfig::wide_catalogue(),
            Preset::SmallStore => SyntheticConfig::small_store(),
            Preset::DenseRaters => SyntheticConfig::dense_raters(),
            Preset::Ml1mTaste => SyntheticConfig::movielens_1m_taste(),
        };
        if let Some(n) = self.ratings {
            cfg = cfg.scaled(n);
        }
        if let Some(n) = self.users {
            cfg.n_users = n;
        }
        if let Some(n) = self.items {
            cfg.n_items = n;
        }
        if let Some(d) = self.rank {
            cfg.rank = d;
        }
        if let Some(s) = self.noise {
            cfg.noise_sd = s;
        }
        let t = &mut cfg.taste;
        t.groups = self.taste_groups.unwrap_or(t.groups);
        t.groups_per_user = self.groups_per_user.unwrap_or(t.groups_per_user);
        t.personal_share = self.personal_share.unwrap_or(t.personal_share);
        cfg.seed = self.seed;
        cfg
    }
}

/// Progress bars are only worth drawing for sets this large.
const PROGRESS_FROM: usize = 1_000_000;

fn bar(len: usize, what: &str, show: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len as u64).with_message(what.to_owned());
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {human_pos}/{human_len} ({elapsed})")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// A value in [0, 1].
fn unit_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
        _ => Err(format!("{s:?} is not a number in [0, 1]")),
    }
}

pub fn run(args: SynthArgs) -> anyhow::Result<()> {
    let cfg = args.config();
    cfg.validate()?;
    let labels = match args.labels {
        Some(signal) => Some(synthetic::item_labels(&cfg, signal).ok_or_else(|| {
            anyhow::anyhow!("--labels needs taste groups (--taste-groups N, or a *-taste preset)")
        })?),
        None => None,
    };
    let show = cfg.n_ratings >= PROGRESS_FROM;

    let t = Instant::now();
    let pb = bar(cfg.n_users, "users", show);
    let data = synthetic::generate_with_progress(&cfg, &|k| pb.inc(k as u64))?;
    pb.finish_and_clear();
    let gen_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let pb = bar(data.ratings.len(), "rows", show);
    synthetic::write_csv_with_progress(&data, &args.out, &mut |k| pb.inc(k as u64))
        .with_context(|| format!("writing {}", args.out.display()))?;
    pb.finish_and_clear();
    let write_secs = t.elapsed().as_secs_f64();

    if let Some(labels) = &labels {
        let path = args.out.with_file_name("movies.csv");
        synthetic::write_catalogue_csv(labels, &path)
            .with_context(|| format!("writing {}", path.display()))?;
        println!(
            "synth: wrote {} ({} items with one public label each)",
            path.display(),
            labels.len()
        );
    }
    let r = &data.ratings;
    println!(
        "synth: {} ratings, {} users, {} items (density {:.4}%), mean {:.3}, seed {}",
        r.len(),
        r.n_users,
        r.n_items,
        100.0 * r.len() as f64 / (r.n_users as f64 * r.n_items as f64),
        r.mean(),
        cfg.seed
    );
    println!(
        "synth: generated in {gen_secs:.2} s, wrote {} in {write_secs:.2} s",
        args.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> SynthArgs {
        let argv = ["dprec", "synth"].iter().chain(args);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Synth(a) => a,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_are_the_ml100k_preset_with_seed_42() {
        let a = parse(&["--out", "x.csv"]);
        assert_eq!(a.preset, Preset::Ml100k);
        assert_eq!(a.config(), SyntheticConfig::movielens_100k_like());
        assert!(
            Cli::try_parse_from(["dprec", "synth"]).is_err(),
            "--out is required"
        );
    }

    #[test]
    fn flags_override_the_preset() {
        let a = parse(&[
            "--preset",
            "ml20m",
            "--ratings",
            "50000",
            "--items",
            "900",
            "--rank",
            "4",
            "--noise",
            "0.3",
            "--seed",
            "7",
            "--out",
            "x.csv",
        ]);
        let c = a.config();
        let scaled = SyntheticConfig::movielens_20m_like().scaled(50_000);
        assert_eq!(
            (c.n_users, c.n_items, c.n_ratings),
            (scaled.n_users, 900, 50_000)
        );
        assert_eq!((c.rank, c.noise_sd, c.seed), (4, 0.3, 7));
        assert_eq!(c.scale.step, 0.5);
        c.validate().unwrap();
    }

    #[test]
    fn every_preset_name_parses_to_its_config() {
        for name in SyntheticConfig::PRESETS {
            let a = parse(&["--preset", name, "--out", "x.csv"]);
            assert_eq!(Some(a.config()), SyntheticConfig::preset(name), "{name}");
        }
        let taste = parse(&["--preset", "ml20m-taste", "--out", "x.csv"]).config();
        assert!(taste.taste.is_on());
        assert_eq!(taste.n_ratings, 20_000_263);
    }
}
