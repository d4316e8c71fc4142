//! `dprec-lab eval`: k-fold cross validation of trainers, with a table on stdout, a JSON
//! report and an SVG plot.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::eval::{self, plot, RunReport, SweepPoint};
use crate::folds::{self, Fold};
use dprec::config::Settings;
use dprec::data::movielens::{self, Format};
use dprec::data::RatingScale;
use dprec::model::labels::ItemLabels;
use dprec::release::{steps, ReleaseConfig};
use dprec::train::{self, ParamError, Params, TrainError, Trainer};
use dprec_dp::accountant::PrivacyEvent;

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

/// Arguments of `dprec-lab eval`.
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
    /// (the `dp-popularity` defaults: the service's plan, as for `dp-topn`) and
    /// EASE (non-private, lambda 300).
    #[arg(long)]
    pub references: bool,
    /// Skip the ranking metrics (RMSE/MAE only).
    #[arg(long)]
    pub no_ranking: bool,
    /// Evaluate what the service serves after this many releases of an unchanged store:
    /// each trainer is fitted this many times per fold, every fit continuing the previous
    /// one's counts filter state (`dp-topn`, `dp-popularity`: docs/privacy/dp-topn.md
    /// section 3a); 1 is a first release.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub releases_seen: u64,
    /// Rank at most this many test users per fold (an evenly spaced subset; for very
    /// large data) [default: all].
    #[arg(long)]
    pub rank_users: Option<usize>,
    /// Title of the SVG plot [default: "dprec-lab eval on DATA"].
    #[arg(long)]
    pub title: Option<String>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Ignore the data set's public catalogue (titles, genres): trainers that use item
    /// labels (`dp-topn`) then run as on a catalogue without them. By default the labels
    /// of u.item (or movies.csv, movies.dat) beside the ratings are read, as `dprec
    /// import` registers them, so that eval measures what the service serves.
    #[arg(long)]
    pub no_labels: bool,
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

fn load_folds(args: &EvalArgs) -> anyhow::Result<(Vec<Fold>, RatingScale, dprec::data::IdMap)> {
    let predefined = match args.folds {
        FoldScheme::Predefined => true,
        FoldScheme::Random => false,
        FoldScheme::Auto => args.data.is_dir() && movielens::has_predefined_folds(&args.data),
    };
    let (mut folds, scale, items) = if predefined {
        let f = folds::predefined_ml100k(&args.data)?;
        (f.folds, f.scale, f.items)
    } else {
        let file = movielens::ratings_file(&args.data)?;
        let ds = movielens::load(&file, args.format, None)?;
        (
            folds::random_kfold(&ds.ratings, args.k, args.seed)?,
            ds.scale,
            ds.items,
        )
    };
    if let Some(m) = args.max_folds {
        folds.truncate(m.max(1));
    }
    Ok((folds, scale, items))
}

/// The public labels of the data set's catalogue by item index (the file `dprec import`
/// registers: u.item, movies.csv or movies.dat beside the ratings), when there is one and
/// its labels tell items apart; `None` with `--no-labels`.
fn catalogue_labels(
    args: &EvalArgs,
    items: &dprec::data::IdMap,
) -> anyhow::Result<Option<Arc<ItemLabels>>> {
    let dir = if args.data.is_dir() {
        args.data.clone()
    } else {
        args.data.parent().map(PathBuf::from).unwrap_or_default()
    };
    let Some(file) = ["u.item", "movies.csv", "movies.dat"]
        .iter()
        .map(|f| dir.join(f))
        .find(|p| p.is_file())
        .filter(|_| !args.no_labels)
    else {
        return Ok(None);
    };
    let info = dprec::cli::import::read_catalogue_info(&file)?;
    let by_id: std::collections::HashMap<&str, &[String]> = info
        .iter()
        .map(|i| (i.id.as_str(), i.labels.as_slice()))
        .collect();
    let labels = ItemLabels::from_names(
        (0..items.len() as u32).map(|j| items.external(j).and_then(|id| by_id.get(id).copied())),
    );
    if labels.informative() {
        println!(
            "catalogue: {} labels of {} items from {} (public; --no-labels ignores them)",
            labels.names.len(),
            labels.per_item.iter().filter(|l| !l.is_empty()).count(),
            file.display()
        );
    }
    Ok(labels.informative().then(|| Arc::new(labels)))
}

/// A trainer to cross-validate: its spec on the command line, the trainer, and the
/// sweep point it stands for.
type Job = (String, Arc<dyn Trainer>, Option<SweepPoint>);

pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    dprec::cli::require_input(&args.data, "--data (or DPREC_ML100K_DIR)")?;
    let sweep = parse_sweep(&args)?;
    // Build every trainer first, so a bad parameter fails before any work is done.
    build_jobs(&args, &sweep, None)?;
    let (folds, scale, items) = load_folds(&args)?;
    let labels = catalogue_labels(&args, &items)?;
    let jobs = build_jobs(&args, &sweep, labels)?;
    // The service calibrates for users with at most one rating per catalogue item.
    let m = folds.first().map_or(1, |f| f.train.n_items.max(1)) as u64;
    for (spec, trainer, point) in &jobs {
        let label = match point {
            Some(s) => format!("{spec} {}={}", s.param, s.value),
            None => spec.clone(),
        };
        if let Some(c) = calibration(trainer, m) {
            println!("calibration: {label}: {c}");
        }
    }
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
/// The trainer as served after `--releases-seen` releases ([`eval::AfterReleases`]).
fn seen(
    args: &EvalArgs,
    trainer: Box<dyn Trainer>,
    labels: &Option<Arc<ItemLabels>>,
) -> Arc<dyn Trainer> {
    let trainer = match labels {
        Some(l) => trainer.with_item_labels(l.clone()).unwrap_or(trainer),
        None => trainer,
    };
    eval::AfterReleases::served(Arc::from(trainer), args.releases_seen)
}

fn build_jobs(
    args: &EvalArgs,
    sweep: &Option<(String, Vec<f64>)>,
    labels: Option<Arc<ItemLabels>>,
) -> anyhow::Result<Vec<Job>> {
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
            jobs.push((spec.clone(), seen(args, trainer, &labels), None));
            continue;
        };
        for &v in values {
            let mut p = base.clone();
            p.set(key, &v.to_string());
            match train::build(&name, &p) {
                Ok(trainer) => jobs.push((
                    spec.clone(),
                    seen(args, trainer, &labels),
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
                    jobs.push((spec.clone(), seen(args, trainer, &labels), None));
                    break;
                }
                Err(e) => return Err(e).with_context(|| format!("--trainer {spec}")),
            }
        }
    }
    Ok(jobs)
}

/// How a private trainer runs in `dprec-lab eval` beside how the service would serve it at
/// its default configuration (`release::steps::calibrate`, the service's own path).
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// The plan keys of the trainer's parameters (`releases`, `eps`, `delta`, `eps_r`,
    /// `noise_factor`, where it has them), as `key=value`.
    pub plan: Vec<String>,
    /// The user-level event one release charges here.
    pub event: PrivacyEvent,
    /// The ledger's per-rating budget of a rating with the default eps_ij on its first
    /// release (what `eps_r` stands for here).
    pub first_share: Option<f64>,
    /// The service's calibration: the parameters it changes, `(key, here, served)`, and
    /// the user-level event it charges; `Err`: why it would not serve the trainer.
    pub served: Result<(Vec<(String, String)>, PrivacyEvent), String>,
}

/// The calibration of `trainer` (for users with at most `m` ratings); `None` for a
/// trainer without a user-level cost (non-private, rating-level or local-DP).
pub fn calibration(trainer: &Arc<dyn Trainer>, m: u64) -> Option<Calibration> {
    let event = trainer.user_level_event(m)?;
    let settings = Settings::default();
    let b = &settings.budget;
    let params = trainer.params();
    let plan = ["releases", "eps", "delta", "eps_r", "noise_factor"]
        .iter()
        .filter_map(|k| params.get(*k).map(|v| format!("{k}={v}")))
        .collect();
    let served = ReleaseConfig::from_settings(&settings)
        .map_err(|e| e.to_string())
        .and_then(|cfg| steps::calibrate(&cfg, trainer, m).map_err(|e| e.to_string()))
        .map(|(t, _, served_event)| {
            let theirs = t.params();
            let changed = params
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, v)| theirs.get(k.as_str()) != Some(*v))
                .map(|(k, v)| (k.clone(), format!("{v} -> {}", theirs[k.as_str()])))
                .collect();
            (changed, served_event)
        });
    Some(Calibration {
        plan,
        event,
        first_share: dprec_dp::ledger::release_share(
            b.share,
            b.default_rating_eps,
            0.0,
            b.min_release_eps,
        ),
        served,
    })
}

/// `Gaussian z = 4.9543` for one Gaussian step, else the event as it is.
fn describe(e: &PrivacyEvent) -> String {
    match e {
        PrivacyEvent::Gaussian {
            noise_multiplier,
            count: 1,
        } => format!("Gaussian z = {noise_multiplier:.4}"),
        PrivacyEvent::Composed { events } if events.len() == 1 => describe(&events[0]),
        other => format!("{other:?}"),
    }
}

impl std::fmt::Display for Calibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> user level per release {}",
            self.plan.join(" "),
            describe(&self.event)
        )?;
        if let Some(s) = self.first_share {
            write!(
                f,
                " (the ledger gives a default rating {s:.4} on its first release)"
            )?;
        }
        match &self.served {
            Ok((changed, _)) if changed.is_empty() => {
                write!(f, "; the service's default configuration serves it as is")
            }
            Ok((changed, served_event)) => {
                let keys: Vec<String> = changed.iter().map(|(k, v)| format!("{k} {v}")).collect();
                write!(
                    f,
                    "; the service's default configuration would serve it with {} ({})",
                    keys.join(", "),
                    describe(served_event)
                )
            }
            Err(e) => write!(f, "; the service would not serve it: {e}"),
        }
    }
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
                    "{label:<28} {:<6} rmse {}  mae {}  ndcg@10 {}  train {:.3}s",
                    f.fold,
                    figure(f.rmse, 4),
                    figure(f.mae, 4),
                    figure(ndcg, 4),
                    f.train_seconds
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
            "{:<40} {:>16} {:>16} {:>16} {:>8} {:>8} {:>7} {:>8} {:>8.3} ±{:.3}",
            label,
            with_sd(r.mean.rmse, r.std.rmse),
            with_sd(r.mean.mae, r.std.mae),
            with_sd(r.mean.ndcg, r.std.ndcg),
            figure(r.mean.precision, 4),
            figure(r.mean.recall, 4),
            figure(r.mean.coverage, 3),
            figure(r.mean.mean_popularity, 1),
            r.mean.train_seconds,
            r.std.train_seconds
        );
    }
}

/// A metric to `decimals` places, or `-` for one the trainer does not produce (a
/// ranking-only trainer has no RMSE, a rating predictor without a ranking no NDCG): NaN
/// in the JSON report.
fn figure(x: f64, decimals: usize) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.decimals$}")
    }
}

/// `mean ±sd` to 4 decimals, or `-` for a metric the trainer does not produce.
fn with_sd(mean: f64, sd: f64) -> String {
    if mean.is_nan() {
        "-".into()
    } else {
        format!("{mean:.4} ±{sd:.4}")
    }
}

/// The JSON report (`--out`) and the plot (`--plot`), when asked for.
fn write_outputs(args: &EvalArgs, report: &EvalReport) -> anyhow::Result<()> {
    if let Some(path) = &args.out {
        dprec::cli::create_parent(path)?;
        let json = serde_json::to_string_pretty(report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let title = args
            .title
            .clone()
            .unwrap_or_else(|| format!("dprec-lab eval on {}", args.data.display()));
        dprec::cli::create_parent(path)?;
        plot::write_svg(&report.runs, &title, path, args.plot_metric)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        eval: EvalArgs,
    }

    /// The trainers `dprec-lab eval` builds from these arguments.
    fn jobs(args: &[&str]) -> Vec<Job> {
        let cli = Cli::try_parse_from(std::iter::once("eval").chain(args.iter().copied())).unwrap();
        build_jobs(&cli.eval, &parse_sweep(&cli.eval).unwrap(), None).unwrap()
    }

    /// Issue 20 item 4: `dprec-lab eval --trainer NAME` with no parameters runs what the
    /// service serves when `trainer.name = NAME` and everything else is default: the
    /// service's own trainer build and calibration (`startup::trainer_from_settings`,
    /// `release::steps::calibrate`) change no parameter, charge exactly eval's per-release
    /// user-level event (and no separate popularity release), and eval's `eps_r` is the
    /// ledger's first-release share of a default rating.
    #[test]
    fn eval_defaults_are_the_served_calibration() {
        for name in ["dp-topn", "dp-popularity", "dp-alt"] {
            let (_, here, _) = jobs(&["--trainer", name]).remove(0);
            let mut s = Settings::default();
            s.trainer.name = name.into();
            let service = dprec::startup::trainer_from_settings(&s).unwrap();
            let cfg = ReleaseConfig::from_settings(&s).unwrap();
            for m in [1, 1682] {
                let (served, popularity_eps, event) = steps::calibrate(&cfg, &service, m).unwrap();
                assert_eq!(served.params(), here.params(), "{name}");
                assert_eq!(popularity_eps, 0.0, "{name}");
                let mine = here.user_level_event(m).unwrap();
                assert_eq!(served.user_level_event(m), Some(mine.clone()), "{name}");
                assert_eq!(
                    event,
                    PrivacyEvent::Composed { events: vec![mine] },
                    "{name}"
                );
            }
            let c = calibration(&here, 1682).unwrap();
            assert!(c.served.as_ref().unwrap().0.is_empty(), "{name}: {c}");
            let eps_r = here.params()["eps_r"].as_f64();
            assert_eq!(eps_r, c.first_share, "{name}");
            // 0.1 x 12 (in floating point 1.2000000000000002).
            assert!((eps_r.unwrap() - 1.2).abs() < 1e-12, "{name}: {eps_r:?}");
            // The plan's z: 52 releases of it fit eps_u 10 / delta_u 1e-6 (DESIGN 3).
            let z = match c.event {
                PrivacyEvent::Gaussian {
                    noise_multiplier, ..
                } => noise_multiplier,
                other => panic!("{other:?}"),
            };
            assert!((z - 4.9543).abs() < 1e-4, "{name}: {z}");
        }
    }

    /// One-release settings stay available, and eval says how the service would serve
    /// them instead (with more noise: the factor its plan needs).
    #[test]
    fn one_release_settings_show_the_services_factor() {
        let (_, t, _) = jobs(&["--trainer", "dp-topn:releases=1,eps=5,eps_r=none"]).remove(0);
        let c = calibration(&t, 1682).unwrap();
        assert_eq!(t.params()["eps_r"], serde_json::Value::Null);
        let (changed, _) = c.served.as_ref().unwrap();
        assert_eq!(changed.len(), 1, "{c}");
        assert_eq!(changed[0].0, "noise_factor");
        assert!(
            c.to_string()
                .contains("would serve it with noise_factor 1.0 -> "),
            "{c}"
        );
    }
}
