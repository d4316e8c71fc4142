//! `dprec eval`: k-fold cross validation of trainers, with a table on stdout, a JSON
//! report and an SVG plot.

use std::path::PathBuf;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::data::folds::{self, Fold};
use crate::data::movielens::{self, Format};
use crate::data::RatingScale;
use crate::eval::{self, plot, RunReport, SweepPoint};
use crate::train::{self, ParamError, Params, TrainError};

/// Which folds to evaluate on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FoldScheme {
    /// The predefined u1..u5 splits when the data directory has them, else random.
    Auto,
    /// The predefined MovieLens-100K splits u1.base/u1.test .. u5.base/u5.test.
    Predefined,
    /// Seeded random k-fold of the whole ratings file.
    Random,
}

/// Arguments of `dprec eval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// MovieLens directory (u.data, ratings.dat or ratings.csv, and u1..u5 splits) or a
    /// ratings file; a relative path is relative to the working directory.
    #[arg(
        long,
        env = "DPREC_ML100K_DIR",
        default_value = "../shared/datasets/ml-100k"
    )]
    pub data: PathBuf,
    /// Format of the ratings file [default: detected from name and first line].
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Fold scheme.
    #[arg(long, value_enum, default_value_t = FoldScheme::Auto)]
    pub folds: FoldScheme,
    /// Number of folds for --folds random.
    #[arg(long, default_value_t = 5)]
    pub k: usize,
    /// Evaluate only the first N folds (quick checks) [default: all].
    #[arg(long)]
    pub max_folds: Option<usize>,
    /// Seed of the fold split and of every training run (fold k uses a seed derived from it).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Trainer to evaluate, as NAME or NAME:key=value,key=value. Repeat to compare
    /// several. See --help for the names and their parameters.
    #[arg(long = "trainer", required = true, long_help = trainer_help())]
    pub trainers: Vec<String>,
    /// A key=value parameter given to every trainer (repeatable); unknown keys are errors.
    #[arg(long = "param")]
    pub params: Vec<String>,
    /// Sweep one parameter over values, as key=v1,v2,...; the plot puts it on the x axis.
    #[arg(long)]
    pub sweep: Option<String>,
    /// Shorthand for --sweep eps=v1,v2,... (privacy budgets of private trainers).
    #[arg(long, value_delimiter = ',')]
    pub eps: Vec<f64>,
    /// Write the full report (per fold, mean, sd) as JSON to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write an SVG plot: the --plot-metric against the swept parameter, or per fold
    /// without a sweep.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// The figure the plot shows.
    #[arg(long, value_enum, default_value_t = plot::Metric::Ndcg)]
    pub plot_metric: plot::Metric,
    /// Add the reference rankers to the run: most-popular (non-private), DP popularity
    /// (user-level eps 5 at delta 1e-6 in one release, the `dp-popularity` defaults) and
    /// EASE (non-private, lambda 300).
    #[arg(long)]
    pub references: bool,
    /// Skip the ranking metrics (RMSE/MAE only).
    #[arg(long)]
    pub no_ranking: bool,
    /// Rank at most this many test users per fold (an evenly spaced subset; for very
    /// large data) [default: all].
    #[arg(long)]
    pub rank_users: Option<usize>,
    /// Title of the SVG plot [default: "dprec eval on DATA"].
    #[arg(long)]
    pub title: Option<String>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

fn trainer_help() -> String {
    format!(
        "Trainer to evaluate, as NAME or NAME:key=value,key=value. Repeat to compare several.\n\n{}",
        train::describe()
    )
}

/// The reference rankers `--references` adds (DESIGN 6a).
pub const REFERENCES: &[&str] = &["popularity", "dp-popularity", "ease"];

/// The JSON report written by `--out`.
#[derive(Debug, Serialize)]
pub struct EvalReport {
    pub data: String,
    pub folds: FoldScheme,
    pub seed: u64,
    pub runs: Vec<RunReport>,
}

/// A trainer spec with its own parameters (`NAME:key=value,...`).
fn parse_trainer(spec: &str) -> (String, Vec<String>) {
    match spec.split_once(':') {
        Some((name, rest)) => (
            name.trim().to_owned(),
            rest.split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().to_owned())
                .collect(),
        ),
        None => (spec.trim().to_owned(), Vec::new()),
    }
}

fn parse_sweep(args: &EvalArgs) -> anyhow::Result<Option<(String, Vec<f64>)>> {
    match (&args.sweep, args.eps.is_empty()) {
        (Some(_), false) => bail!("--sweep and --eps cannot be combined"),
        (None, false) => Ok(Some(("eps".to_owned(), args.eps.clone()))),
        (None, true) => Ok(None),
        (Some(s), true) => {
            let (key, vals) = s
                .split_once('=')
                .with_context(|| format!("--sweep {s:?}: expected key=v1,v2,..."))?;
            let vals = vals
                .split(',')
                .map(|v| {
                    v.trim()
                        .parse::<f64>()
                        .ok()
                        .filter(|x| x.is_finite())
                        .with_context(|| format!("--sweep {key}: {v:?} is not a finite number"))
                })
                .collect::<anyhow::Result<Vec<f64>>>()?;
            Ok(Some((key.trim().to_owned(), vals)))
        }
    }
}

fn load_folds(args: &EvalArgs) -> anyhow::Result<(Vec<Fold>, RatingScale)> {
    let predefined = match args.folds {
        FoldScheme::Predefined => true,
        FoldScheme::Random => false,
        FoldScheme::Auto => args.data.is_dir() && movielens::has_predefined_folds(&args.data),
    };
    let (mut folds, scale) = if predefined {
        let f = folds::predefined_ml100k(&args.data)?;
        (f.folds, f.scale)
    } else {
        let file = movielens::ratings_file(&args.data)?;
        let ds = movielens::load(&file, args.format, None)?;
        (
            folds::random_kfold(&ds.ratings, args.k, args.seed)?,
            ds.scale,
        )
    };
    if let Some(m) = args.max_folds {
        folds.truncate(m.max(1));
    }
    Ok((folds, scale))
}

/// A trainer to cross-validate: its spec on the command line, the trainer, and the
/// sweep point it stands for.
type Job = (String, Box<dyn train::Trainer>, Option<SweepPoint>);

pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    super::require_input(&args.data, "--data (or DPREC_ML100K_DIR)")?;
    let sweep = parse_sweep(&args)?;
    // Build every trainer first, so a bad parameter fails before any work is done.
    let jobs = build_jobs(&args, &sweep)?;
    let (folds, scale) = load_folds(&args)?;
    let runs = run_jobs(&args, jobs, &folds, scale)?;
    print_table(&runs);
    let report = EvalReport {
        data: args.data.display().to_string(),
        folds: args.folds,
        seed: args.seed,
        runs,
    };
    write_outputs(&args, &report)
}

/// The trainers of `--trainer` (and `--references`), one per sweep point where the
/// trainer has the swept parameter.
fn build_jobs(args: &EvalArgs, sweep: &Option<(String, Vec<f64>)>) -> anyhow::Result<Vec<Job>> {
    let mut jobs = Vec::new();
    let mut specs = args.trainers.clone();
    if args.references {
        for r in REFERENCES {
            if !specs.iter().any(|s| s == r) {
                specs.push((*r).to_owned());
            }
        }
    }
    for (n, spec) in specs.iter().enumerate() {
        let (name, own) = parse_trainer(spec);
        // References added by --references run with their own defaults, once.
        let reference = n >= args.trainers.len();
        // The trainer's own parameters come last, so they override the shared ones.
        let shared: &[String] = if reference { &[] } else { &args.params };
        let base = Params::parse(&[shared, own.as_slice()].concat())?;
        let sweep = if reference { &None } else { sweep };
        let Some((key, values)) = sweep else {
            let trainer =
                train::build(&name, &base).with_context(|| format!("--trainer {spec}"))?;
            jobs.push((spec.clone(), trainer, None));
            continue;
        };
        for &v in values {
            let mut p = base.clone();
            p.set(key, &v.to_string());
            match train::build(&name, &p) {
                Ok(trainer) => jobs.push((
                    spec.clone(),
                    trainer,
                    Some(SweepPoint {
                        param: key.clone(),
                        value: v,
                    }),
                )),
                // A trainer without the swept parameter (e.g. a non-private baseline in an
                // eps sweep) runs once, as a reference line.
                Err(TrainError::Param(ParamError::Unknown { unknown, .. })) if unknown == *key => {
                    let trainer =
                        train::build(&name, &base).with_context(|| format!("--trainer {spec}"))?;
                    jobs.push((spec.clone(), trainer, None));
                    break;
                }
                Err(e) => return Err(e).with_context(|| format!("--trainer {spec}")),
            }
        }
    }
    Ok(jobs)
}

/// Cross-validates every job on `folds`, with a progress bar and a line per fold.
fn run_jobs(
    args: &EvalArgs,
    jobs: Vec<Job>,
    folds: &[Fold],
    scale: RatingScale,
) -> anyhow::Result<Vec<RunReport>> {
    let ranking = (!args.no_ranking).then(|| eval::RankingConfig {
        max_users: args.rank_users,
        ..eval::RankingConfig::default()
    });
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new((jobs.len() * folds.len()) as u64)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} folds  {msg}",
        )
        .expect("static template"),
    );
    let mut runs = Vec::with_capacity(jobs.len());
    for (spec, trainer, point) in jobs {
        let label = match &point {
            Some(s) => format!("{spec} {}={}", s.param, s.value),
            None => spec.clone(),
        };
        bar.set_message(label.clone());
        let report = eval::cross_validate(
            trainer.as_ref(),
            &spec,
            folds,
            scale,
            args.seed,
            point,
            ranking.as_ref(),
            |f| {
                bar.inc(1);
                let ndcg = f.ranking.map(|m| m.ndcg).unwrap_or(f64::NAN);
                let line = format!(
                    "{label:<28} {:<6} rmse {:.4}  mae {:.4}  ndcg@10 {:.4}  train {:.3}s",
                    f.fold, f.rmse, f.mae, ndcg, f.train_seconds
                );
                // Per-fold lines go above the bar on a terminal, else plainly to stderr.
                if !bar.is_hidden() {
                    bar.println(line);
                } else if !args.quiet {
                    eprintln!("{line}");
                }
            },
        )?;
        runs.push(report);
    }
    bar.finish_and_clear();
    Ok(runs)
}

/// The summary table on stdout, a line per run.
fn print_table(runs: &[RunReport]) {
    println!(
        "{:<40} {:>16} {:>16} {:>16} {:>8} {:>8} {:>7} {:>8} {:>16}",
        "trainer", "RMSE", "MAE", "NDCG@10", "P@10", "R@10", "cov", "pop", "train s/fold"
    );
    for r in runs {
        let label = match &r.sweep {
            Some(s) => format!("{} {}={}", r.label, s.param, s.value),
            None => r.label.clone(),
        };
        println!(
            "{:<40} {:>8.4} ±{:.4} {:>8.4} ±{:.4} {:>8.4} ±{:.4} {:>8.4} {:>8.4} {:>7.3} {:>8.1} {:>8.3} ±{:.3}",
            label,
            r.mean.rmse,
            r.std.rmse,
            r.mean.mae,
            r.std.mae,
            r.mean.ndcg,
            r.std.ndcg,
            r.mean.precision,
            r.mean.recall,
            r.mean.coverage,
            r.mean.mean_popularity,
            r.mean.train_seconds,
            r.std.train_seconds
        );
    }
}

/// The JSON report (`--out`) and the plot (`--plot`), when asked for.
fn write_outputs(args: &EvalArgs, report: &EvalReport) -> anyhow::Result<()> {
    if let Some(path) = &args.out {
        super::create_parent(path)?;
        let json = serde_json::to_string_pretty(report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let title = args
            .title
            .clone()
            .unwrap_or_else(|| format!("dprec eval on {}", args.data.display()));
        super::create_parent(path)?;
        plot::write_svg(&report.runs, &title, path, args.plot_metric)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
