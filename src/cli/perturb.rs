//! `dprec perturb`: the client side of local DP. Reads a MovieLens ratings file, perturbs
//! every rating with the bounded Laplace mechanism at a local eps ([`crate::ldp`]) and
//! writes the perturbed-rating JSON form, either one rating per line (`jsonl`) or one
//! `POST /v1/ratings` body per line (`batch`), with a progress bar on stderr.
//!
//! Noise comes from the OS-keyed CSPRNG unless `--seed` is given (reproducible runs for
//! tests and experiments only: a seeded perturbation is not private against anyone who
//! knows the seed).

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::data::movielens::{self, Format};
use crate::data::RatingScale;
use crate::ldp::{PerturbedRating, RatingPerturber};
use dprec_dp::rng;

/// Output layout of `dprec perturb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One perturbed rating (JSON object) per line.
    Jsonl,
    /// One `{"ratings": [...]}` body for `POST /v1/ratings` per line, `--batch` ratings each.
    Batch,
}

#[derive(Debug, Args)]
pub struct PerturbArgs {
    /// Local privacy loss eps of every perturbed rating.
    #[arg(long)]
    pub eps: f64,
    /// Lower end of the rating scale (must equal the service's).
    #[arg(long, default_value_t = 1.0)]
    pub lower: f64,
    /// Upper end of the rating scale (must equal the service's).
    #[arg(long, default_value_t = 5.0)]
    pub upper: f64,
    /// Output layout.
    #[arg(long, value_enum, default_value_t = Output::Jsonl)]
    pub output: Output,
    /// Ratings per body with `--output batch` (at most the service's `server.max_batch`).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Write to this file instead of stdout.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Seed the noise (tests and experiments only; default: the OS CSPRNG).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Format of the ratings file [default: detected].
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Stop after this many ratings.
    #[arg(long)]
    pub limit: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// MovieLens directory (100K, 1M or latest) or ratings file.
    pub path: PathBuf,
}

/// Perturbs every rating read from `input` (in `format`) and writes the chosen layout to
/// `out`; `on_progress` gets the bytes read so far. Returns the number of ratings.
#[allow(clippy::too_many_arguments)]
pub fn perturb_stream<R: BufRead, W: Write>(
    input: R,
    format: Format,
    perturber: &RatingPerturber,
    output: Output,
    batch: usize,
    limit: Option<usize>,
    rng: &mut rng::DpRng,
    out: &mut W,
    mut on_progress: impl FnMut(u64, usize),
) -> anyhow::Result<usize> {
    if batch == 0 {
        bail!("--batch must be >= 1");
    }
    let claim = perturber.claim();
    let mut n = 0usize;
    let mut read = 0u64;
    let mut pending: Vec<PerturbedRating> = Vec::new();
    let flush = |pending: &mut Vec<PerturbedRating>, out: &mut W| -> anyhow::Result<()> {
        if !pending.is_empty() {
            serde_json::to_writer(&mut *out, &serde_json::json!({ "ratings": pending }))?;
            out.write_all(b"\n")?;
            pending.clear();
        }
        Ok(())
    };
    for (k, line) in input.lines().enumerate() {
        if limit.is_some_and(|l| n >= l) {
            break;
        }
        let line = line?;
        read += line.len() as u64 + 1;
        let Some(r) = movielens::parse_line(format, &line)
            .map_err(|e| anyhow::anyhow!("line {}: {e}", k + 1))?
        else {
            continue;
        };
        let v = r.value as f64;
        if v < claim.lower || v > claim.upper {
            bail!(
                "line {}: rating {v} is outside the scale [{}, {}] (set --lower/--upper)",
                k + 1,
                claim.lower,
                claim.upper
            );
        }
        let p = perturber.perturb(r.user, r.item, v, rng)?;
        match output {
            Output::Jsonl => {
                serde_json::to_writer(&mut *out, &p)?;
                out.write_all(b"\n")?;
            }
            Output::Batch => {
                pending.push(p);
                if pending.len() == batch {
                    flush(&mut pending, out)?;
                }
            }
        }
        n += 1;
        if n.is_multiple_of(1000) {
            on_progress(read, n);
        }
    }
    flush(&mut pending, out)?;
    out.flush()?;
    on_progress(read, n);
    Ok(n)
}

pub fn run(args: PerturbArgs) -> anyhow::Result<()> {
    let scale = RatingScale::new(args.lower, args.upper, 0.0)?;
    let perturber = RatingPerturber::new(args.eps, scale).context("--eps")?;
    let file = if args.path.is_dir() {
        movielens::ratings_file(&args.path)?
    } else {
        args.path.clone()
    };
    let format = match args.format {
        Some(f) => f,
        None => Format::detect(&file)?,
    };
    let size = std::fs::metadata(&file)?.len();
    let input =
        BufReader::new(File::open(&file).with_context(|| format!("opening {}", file.display()))?);
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(size)
    };
    bar.set_style(ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {msg}",
    )?);
    let mut rng = rng::from_seed_or_os(args.seed);
    let started = Instant::now();
    let progress = |read: u64, n: usize| {
        bar.set_position(read.min(size));
        bar.set_message(format!("{n} ratings"));
    };
    let mut out: Box<dyn Write> = match &args.out {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).with_context(|| format!("creating {}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let n = perturb_stream(
        input,
        format,
        &perturber,
        args.output,
        args.batch,
        args.limit,
        &mut rng,
        &mut out,
        progress,
    )?;
    bar.finish_and_clear();
    eprintln!(
        "perturbed {n} ratings from {} at local eps {} (bounded Laplace, b = {}) in {:.1} s",
        file.display(),
        args.eps,
        perturber.claim().scale,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA: &str = "1\t10\t5\t881250949\n1\t20\t3\t881250949\n\n2\t10\t1\t881250949\n";

    fn run_on(data: &str, output: Output, batch: usize) -> anyhow::Result<(usize, String)> {
        let p = RatingPerturber::new(1.0, RatingScale::ONE_TO_FIVE).unwrap();
        let mut out = Vec::new();
        let n = perturb_stream(
            data.as_bytes(),
            Format::Ml100k,
            &p,
            output,
            batch,
            None,
            &mut rng::seeded(1),
            &mut out,
            |_, _| {},
        )?;
        Ok((n, String::from_utf8(out).unwrap()))
    }

    #[test]
    fn jsonl_lines_are_valid_perturbed_ratings() {
        let (n, text) = run_on(DATA, Output::Jsonl, 10).unwrap();
        assert_eq!(n, 3);
        let rows: Vec<PerturbedRating> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 3);
        assert_eq!((rows[2].user.as_str(), rows[2].item.as_str()), ("2", "10"));
        for r in &rows {
            r.ldp
                .validate(r.rating, RatingScale::ONE_TO_FIVE, 10.0)
                .unwrap();
        }
        // The values are perturbed, not the input ratings (5, 3, 1).
        let values: Vec<f64> = rows.iter().map(|r| r.rating).collect();
        assert_ne!(values, vec![5.0, 3.0, 1.0]);
    }

    #[test]
    fn batch_bodies_hold_at_most_batch_ratings() {
        let (n, text) = run_on(DATA, Output::Batch, 2).unwrap();
        assert_eq!(n, 3);
        let bodies: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(bodies.len(), 2);
        assert_eq!(bodies[0]["ratings"].as_array().unwrap().len(), 2);
        assert_eq!(bodies[1]["ratings"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn off_scale_and_malformed_lines_are_errors_with_line_numbers() {
        let e = run_on("1\t10\t7\t0\n", Output::Jsonl, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 1") && e.contains("outside"), "{e}");
        let e = run_on("1\t10\n", Output::Jsonl, 1).unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
        assert!(run_on(DATA, Output::Batch, 0).is_err());
    }
}
